"""What the simulation writes out (MODEL.md §9 Outputs), declared once: :data:`RECORDS`, one row per output,
says where its value lives in the lane state, what it is per (request, replica or lane) and how sub-lanes of one
job merge into it (:func:`slimjax.engine.sim.pool.round_robin_jobs`). The per-request records a lane writes at
each completion are packed rows, one column per per-request row of the table (:class:`Completed`: their view).

Adding an output: a field of the lane state (:mod:`.state`; per request, a :class:`~.state.Slots` field) and one
row here. The summaries (TTFT/TPOT quantiles, utilisation, token-gap quantile) follow from the records.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from .state import GAP_BINS, GAP_RANGE_S, LaneState


@dataclasses.dataclass(frozen=True)
class Record:
    name: str  # the records' key
    per: str  # "request" (N,), "replica" (R,) or "lane" (() or ``bins``)
    source: str  # per request: the Slots field written at completion ("": the completing step's end); per
    # replica / lane: the LaneState field ("a.b": field b of its part a, a record only where the lane has a)
    dtype: str = "float"  # "float": the stream's; else a numpy dtype of the merged records
    merge: str = "set"  # how sub-lanes of one job combine: "set" (each its own entries), "add", "any"
    bins: int = 0  # a lane record's length (0: a scalar)
    doc: str = ""


RECORDS: tuple[Record, ...] = (
    Record("admit_s", "request", "admit_s", doc="admission time"),
    Record("first_token_s", "request", "first_token_s", doc="end of the step holding the last prompt token"),
    Record("end_s", "request", "", doc="end of the step producing the last output token"),
    Record("preemptions", "request", "preemptions", "int32", doc="times it was preempted (paged KV)"),
    Record("prefix_hit_tokens", "request", "hit_tokens", doc="prompt tokens found in the prefix cache at admission"),
    Record("busy_s", "replica", "busy_s", doc="time in steps"),
    Record("queue_peak", "replica", "queue_peak", "int32", doc="most requests left waiting after an admission"),
    Record("held_peak", "replica", "held_peak", "int32", doc="most requests held at once"),
    Record("kv_peak_bytes", "replica", "kv_peak_bytes", doc="most KV reserved at once"),
    Record("gaps", "lane", "gaps", merge="add", bins=GAP_BINS, doc="histogram of every inter-token gap (log bins)"),
    Record("steps", "lane", "steps", "int64", "add", doc="engine steps taken"),
    Record("stuck", "lane", "stuck", "bool", "any", doc="a replica's queue head never fits its pool"),
    Record("overflow", "lane", "overflow", "bool", "any", doc="the slot width stopped an admission"),
    Record("stopped", "lane", "stop.stopped", "bool", "any", doc="stopped early: certain to miss an SLO"),
)
REQUEST_RECORDS = tuple(r for r in RECORDS if r.per == "request")
PER_REQUEST = tuple(r.name for r in REQUEST_RECORDS)
PER_REPLICA = tuple(r.name for r in RECORDS if r.per == "replica")  # per engine under PP


Completed = NamedTuple("Completed", [(name, object) for name in PER_REQUEST])  # noqa: UP014 (made from the table)
Completed.__doc__ = "Per-request records (N,) each, NaN until the request completes (RECORDS' per-request rows)."


def record_dtype(record: Record, float_dtype):
    """A record's dtype: the stream's float dtype for a float record, else its own."""
    return float_dtype if record.dtype == "float" else np.dtype(record.dtype)


def unset_fill(record: Record) -> float:
    """What a record holds before it is written: NaN for a per-request time (a request not yet completed),
    else 0."""
    return np.nan if record.per == "request" and record.dtype == "float" else 0


# A lane keeps its per-request records packed, one row per request and one column per REQUEST_RECORDS entry, in the
# stream's float dtype (counts are small integers, exact in it): a step's completions are then written with one
# scatter of rows, where a record per array took one scatter each (vmapped, XLA:CPU runs a scatter as a loop over
# its updates; writing the records measured a fifth of a step's time at 32 slots).


def no_completions(n: int, dtype):
    """Packed per-request records (n, P) before any completion (:func:`unset_fill`), in the float ``dtype``."""
    fill = jnp.asarray([unset_fill(r) for r in REQUEST_RECORDS], dtype)
    return jnp.broadcast_to(fill, (n, len(REQUEST_RECORDS)))


def completed(rows) -> Completed:
    """The :class:`Completed` view (…, N) of packed per-request records (…, N, P), each in its record's dtype."""
    return Completed(*(rows[..., i].astype(record_dtype(r, rows.dtype)) for i, r in enumerate(REQUEST_RECORDS)))


def write_completions(done, slots, end, at):
    """Packed records ``done`` (N, P) with the completing slots' rows written at their requests (``at``: each slot's
    request where it completes, N elsewhere: dropped); ``slots`` as the step left them, ``end`` the step's end."""
    rows = jnp.stack(
        [
            jnp.broadcast_to(getattr(slots, r.source) if r.source else end, at.shape).astype(done.dtype)
            for r in REQUEST_RECORDS
        ],
        axis=-1,
    )
    return done.at[at].set(rows, mode="drop")


def records(arrival, state: LaneState, contiguous: bool, xp=jnp) -> dict:
    """The records of lanes (leading lane axis) from their state; ``arrival``: each lane's (lanes, N)."""
    done = completed(state.done)
    out = {
        "arrival_s": arrival if contiguous else state.routing.arrival_s,
        **done._asdict(),
        "replica": xp.zeros(done.end_s.shape, xp.int32) if contiguous else state.routing.replica,
    }
    for r in RECORDS:
        if r.per != "request" and (value := state_field(state, r.source)) is not None:
            out[r.name] = value
    return out


def state_field(state, path: str):
    """A LaneState field by its dotted path (None where the lane has no such part)."""
    for name in path.split("."):
        if state is None:
            return None
        state = getattr(state, name)
    return state


def gap_edges():
    """The histogram's bin edges, seconds (GAP_BINS + 1 of them; host side)."""
    lo, hi = GAP_RANGE_S
    return np.logspace(np.log10(lo), np.log10(hi), GAP_BINS + 1)


def gap_bin(gap):
    """The histogram bin of an inter-token gap (traced)."""
    lo, hi = GAP_RANGE_S
    x = (jnp.log(jnp.maximum(gap, lo)) - jnp.log(lo)) / (jnp.log(hi) - jnp.log(lo)) * GAP_BINS
    return jnp.clip(jnp.floor(x), 0, GAP_BINS - 1).astype(jnp.int32)


SUMMARY_QUANTILES = (0.5, 0.9, 0.99)
SUMMARY_TIMES = ("ttft", "tpot")  # per-request times summarised by mean and SUMMARY_QUANTILES


def summary_name(time: str, stat: str | float) -> str:
    """The summary variable of a per-request time: ``ttft_mean_s``, ``tpot_p90_s`` (q = 0.9), …"""
    return f"{time}_{stat}_s" if isinstance(stat, str) else f"{time}_p{round(stat * 100)}_s"


def gap_quantile(gaps, q: float):
    """The q-quantile of every inter-token gap from the lane histogram (log-interpolated inside a bin, so
    within one bin width, 1.1 %, of the exact order statistic); NaN where no gap was recorded."""
    edges = gap_edges()
    counts = np.asarray(gaps, np.float64)
    cum = np.cumsum(counts, axis=-1)
    total = cum[..., -1:]
    target = q * total
    b = np.minimum(np.sum(cum < target, axis=-1), GAP_BINS - 1)
    below = np.where(b > 0, np.take_along_axis(cum, np.maximum(b - 1, 0)[..., None], -1)[..., 0], 0.0)
    inside = np.take_along_axis(counts, b[..., None], -1)[..., 0]
    frac = np.clip((target[..., 0] - below) / np.where(inside > 0, inside, 1.0), 0.0, 1.0)
    value = edges[b] * (edges[b + 1] / edges[b]) ** frac
    return np.where(total[..., 0] > 0, value, np.nan)


def request_times(records, output_len):
    """(TTFT_i, E2E_i, TPOT_i) per request (§9 Outputs), seconds; TPOT NaN where O_i = 1."""
    ttft = records["first_token_s"] - records["arrival_s"]
    e2e = records["end_s"] - records["arrival_s"]
    steps = np.asarray(output_len) - 1.0
    tpot = np.where(steps > 0, (e2e - ttft) / np.where(steps > 0, steps, 1.0), np.nan)
    return ttft, e2e, tpot


def counted_requests(records, clients: int | None):
    """Which requests the statistics count: all of an open stream; after the first C completions (by
    completion time, then index) of a closed loop."""
    end = records["end_s"]
    if clients is None:
        return np.isfinite(end)
    order = np.argsort(np.where(np.isfinite(end), end, np.inf), axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(end.shape[-1])[None].repeat(end.shape[0], 0), -1)
    return np.isfinite(end) & (rank >= clients)


def time_summaries(ttft, tpot, e2e) -> dict:
    """TTFT and TPOT mean and :data:`SUMMARY_QUANTILES` (numpy's linear quantiles) and mean E2E over the last axis,
    NaN (not counted, or no TPOT) left out."""
    out = {}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, x in zip(SUMMARY_TIMES, (ttft, tpot), strict=True):
            out[summary_name(name, "mean")] = np.nanmean(x, axis=-1)
            for q in SUMMARY_QUANTILES:
                out[summary_name(name, q)] = np.nanquantile(x, q, axis=-1)
        out["e2e_mean_s"] = np.nanmean(e2e, axis=-1)
    return out


def summaries(records, output_len, clients: int | None = None, slots=None, input_len=None) -> dict:
    """Per candidate: TTFT and TPOT mean and p50/p90/p99 (numpy's linear quantiles), mean E2E, token-gap p90,
    busy time (time in steps / (R·span): 1 whenever a step runs, however few requests it holds), peak queue and
    peak KV in use (§9 Outputs); with ``slots`` (R·B per candidate) the slots' occupancy, the mean requests held
    (admission to last token) / slots: how full the batches ran; with ``input_len`` the prompt tokens the counted
    requests found in the prefix cache (``prefill_tokens_saved``) and their share of the prompt tokens
    (``prefix_hit_rate``)."""
    ttft, e2e, tpot = request_times(records, output_len)
    counted = counted_requests(records, clients)
    out = time_summaries(*(np.where(counted, x, np.nan) for x in (ttft, tpot, e2e)))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        span = np.nanmax(records["end_s"], axis=-1) - np.nanmin(records["arrival_s"], axis=-1)
    out["token_gap_p90_s"] = gap_quantile(records["gaps"], 0.9)
    busy = records["busy_s"]
    replicas = records.get("replicas", busy.shape[-1])
    out["utilization"] = np.sum(busy, axis=-1) / (replicas * span)
    if slots is not None:
        held = np.nansum(records["end_s"] - records["admit_s"], axis=-1)
        out["occupancy"] = held / (np.asarray(slots, float) * span)
    out["queue_peak"] = np.max(records["queue_peak"], axis=-1).astype(float)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out["preemptions_mean"] = np.nanmean(np.where(counted, records["preemptions"], np.nan), axis=-1)
    out["kv_peak_bytes"] = np.max(records["kv_peak_bytes"], axis=-1)
    if input_len is not None:
        saved = np.sum(np.where(counted, records["prefix_hit_tokens"], 0.0), axis=-1)
        out["prefill_tokens_saved"] = saved
        out["prefix_hit_rate"] = saved / np.sum(np.where(counted, np.asarray(input_len, float), 0.0), axis=-1)
    return out


def records_markdown() -> str:
    """:data:`RECORDS` as the Markdown table docs/architecture.md shows (checked by the tests, so it cannot go
    stale)."""
    lines = ["| record | per | from the lane state | dtype | sub-lanes merge by | what |", "|---|---|---|---|---|---|"]
    for r in RECORDS:
        if r.per == "request":
            source = f"`Slots.{r.source}`" if r.source else "the completing step's end"
        else:
            source = f"`LaneState.{r.source}`"
        per = f"{r.per} ({r.bins} bins)" if r.bins else r.per
        lines.append(f"| `{r.name}` | {per} | {source} | {r.dtype} | {r.merge} | {r.doc} |")
    return "\n".join(lines)
