"""Trace-driven continuous batching (MODEL.md §9, §10) as a typed engine, one module per concern:

- :mod:`.state`: what a lane carries between steps (registered NamedTuples: parameters, slots, records,
  routing, early-stop counts);
- :mod:`.step`: one engine step of one replica as small functions (release, admit, schedule, time, advance,
  compact);
- :mod:`.loop`: a lane's step and routing, and the jitted while loop over every lane at once;
- :mod:`.pool`: lanes packed on the compute devices, and the studies' candidates and jobs laid out as lanes;
- :mod:`.outputs`: the records' schema (:data:`~.outputs.RECORDS`) and the summaries drawn from them.

The names below are the engine's public face; the studies and the fits use nothing else.
"""

from .loop import run_lanes
from .outputs import (
    PER_REPLICA,
    RECORDS,
    SUMMARY_QUANTILES,
    SUMMARY_TIMES,
    counted_requests,
    gap_edges,
    gap_quantile,
    request_times,
    summaries,
    summary_name,
    time_summaries,
)
from .pool import (
    FIRST_SLOTS,
    engine_batch,
    engines_per_replica,
    round_robin_jobs,
    run_pool,
    simulate_candidates,
    simulate_round_robin,
)
from .state import GAP_BINS, GAP_RANGE_S, lane_parts, paged, plain, prompt_units, with_parts

__all__ = [
    "FIRST_SLOTS",
    "GAP_BINS",
    "GAP_RANGE_S",
    "PER_REPLICA",
    "RECORDS",
    "SUMMARY_QUANTILES",
    "SUMMARY_TIMES",
    "counted_requests",
    "engine_batch",
    "gap_edges",
    "gap_quantile",
    "lane_parts",
    "paged",
    "engines_per_replica",
    "plain",
    "prompt_units",
    "request_times",
    "round_robin_jobs",
    "run_lanes",
    "run_pool",
    "simulate_candidates",
    "simulate_round_robin",
    "summaries",
    "summary_name",
    "time_summaries",
    "with_parts",
]
