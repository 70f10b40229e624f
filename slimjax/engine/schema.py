"""Output schema (MODEL.md §7): every variable's dims, units, dtype, long name and group, in one table,
and the grid's dims.

Dims a variable does not depend on are dropped (MODEL.md §7 allows it; it saves grid bytes). ``dtype``
"float" is the evaluation's precision. A variable's ``group`` (see :mod:`.groups`) computes it; ``needs``
names other groups that must be active too; ``fit_masked`` ones are NaN wherever what they time cannot run
(:func:`.groups.mask_unfit`: the batch, or for prefill-only figures the batch's prompts, does not fit memory).

One table per kind of evaluation (:data:`SCHEMAS`): ``sweep`` (MODEL.md §1–§7, :data:`VARIABLES`, here) and
each study registered with :func:`register_kind` (``procurement``, §8: :mod:`slimjax.studies.procure.screen`). A kind's
Dataset has that table's variables, in its order.
"""

from __future__ import annotations

import dataclasses

from ..constants import PRICE_DATE


@dataclasses.dataclass(frozen=True)
class Dim:
    name: str
    attrs: dict
    blockable: bool  # the grid may cut it into blocks (False: a reduction runs along it, or it is a queue axis)


# Order is the Dataset's dim order; an evaluation has a subset of these (Sweep.coords, Study.coords).
DIMS: dict[str, Dim] = {
    d.name: d
    for d in (
        Dim("workload", {"long_name": "workload (fixed lengths or a request trace cut into length classes)"}, True),
        Dim("rate", {"long_name": "total arrival rate Λ (absolute, or a multiple of the trace's own rate)"}, False),
        Dim("model", {"long_name": "model"}, True),
        Dim("gpu", {"long_name": "GPU"}, True),
        Dim("tp", {"units": "GPUs", "long_name": "tensor-parallel degree of the replica group"}, False),
        Dim("batch", {"units": "sequences", "long_name": "batch size / concurrency B"}, False),  # B_cap reduces over it
        Dim("input_len", {"units": "tokens", "long_name": "input (prompt) length I"}, True),
        Dim("output_len", {"units": "tokens", "long_name": "output length O"}, True),
        Dim("agent", {"long_name": "agent graph (MODEL.md §6)"}, True),
        Dim("arrival_rate", {"units": "requests/s", "long_name": "Poisson arrival rate λ"}, False),
        Dim("class", {"long_name": "length class k of the workload (MODEL.md §8)"}, False),
        # the simulation's (MODEL.md §9, §10): not blocked, a simulation is not a grid
        Dim("pp", {"units": "stages", "long_name": "pipeline stages n_pp of the replica group"}, False),
        Dim("setting", {"long_name": "engine setting: step budget, chunk size, KV policy … (docs/engines.md)"}, False),
        Dim("replicas", {"units": "replica groups", "long_name": "replicas R of the fleet"}, False),
        Dim("clients", {"long_name": "clients C of a closed loop"}, False),
        Dim("deployment", {"long_name": "a disaggregated deployment (prefill and decode pools, MODEL.md §10)"}, False),
        Dim("request", {"long_name": "a request of the stream, in stream order"}, False),
    )
}


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    dims: tuple[str, ...]
    units: str | None  # None: a count or index without units (no units attr)
    long_name: str
    group: str
    dtype: str = "float"
    needs: tuple[str, ...] = ()
    fit_masked: bool = False  # a time, rate or throughput: NaN where the batch (or the prompt) does not fit memory
    priced: bool = False  # computed from the illustrative prices: attrs carry their date
    flags: tuple[str, ...] = ()  # a coded variable's meanings (flag_values 0, 1, …)
    label_of: str | None = None  # an index into this dim's labels, stored as the label ('' where -1)


ALL5 = ("model", "gpu", "batch", "input_len", "output_len")
PAIR = ("model", "gpu")
PAIR_LENS = ("model", "gpu", "input_len", "output_len")
QUEUE = (*ALL5, "arrival_rate")
AGENT = (*ALL5, "agent")
AGENT_API = ("input_len", "output_len", "agent")
_CAP = "batch size (0 = none)"

VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable(
            "prefill_flops",
            ("model", "batch", "input_len"),
            "FLOP",
            "SLIM prefill FLOPs of the batch, F_pre (Eq. 8)",
            "slim",
        ),
        Variable(
            "kv_traffic_bytes",
            PAIR_LENS,
            "bytes",
            "SLIM KV-cache bytes read in decode per request, M_dec (Eq. 11)",
            "slim",
        ),
        Variable(
            "slim_prefill_s",
            ("model", "gpu", "batch", "input_len"),
            "s",
            "SLIM prefill time T_pre (Eq. 7)",
            "slim",
            fit_masked=True,
        ),
        Variable("slim_decode_s", ALL5, "s", "SLIM decode time T_dec (Eq. 9)", "slim", fit_masked=True),
        Variable("slim_e2e_s", ALL5, "s", "SLIM end-to-end batch latency E2E (Eq. 5)", "slim", fit_masked=True),
        Variable(
            "slim_throughput",
            ALL5,
            "tokens/s",
            "SLIM total-token throughput B(I+O)/E2E (Eq. 6)",
            "slim",
            fit_masked=True,
        ),
        Variable(
            "slim_at_floor",
            ALL5,
            "1",
            "where SLIM's time is its physical floor (100 % of peak on the group): bit 1 "
            "prefill, bit 2 decode; 0 where the model's own time is above it",
            "slim",
            "int8",
        ),
        Variable(
            "within_context",
            ("model", "input_len", "output_len"),
            "1",
            "I + O within the model's context (max_position_embeddings); False: the figures are extrapolated",
            "slim",
            "bool",
        ),
        Variable("b_cap", PAIR_LENS, _CAP, "batch-capacity advisor recommendation B_cap (Eq. 13)", "advisor", "int32"),
        # With coefficients from a calibrated store (covariance known): 90 % prediction intervals.
        Variable(
            "slim_throughput_lo",
            ALL5,
            "tokens/s",
            "lower end of the 90 % prediction interval of slim_throughput",
            "intervals",
            fit_masked=True,
        ),
        Variable(
            "slim_throughput_hi",
            ALL5,
            "tokens/s",
            "upper end of the 90 % prediction interval of slim_throughput",
            "intervals",
            fit_masked=True,
        ),
        Variable(
            "b_cap_lo",
            PAIR_LENS,
            _CAP,
            "B_cap with throughput and E2E at the pessimistic ends of their 90 % intervals",
            "advisor",
            "int32",
            ("intervals",),
        ),
        Variable(
            "b_cap_hi",
            PAIR_LENS,
            _CAP,
            "B_cap with throughput and E2E at the optimistic ends of their 90 % intervals",
            "advisor",
            "int32",
            ("intervals",),
        ),
        # The capacity calculator (MODEL.md §3–§4): memory and the fit check always (at the serving defaults where a
        # sweep has no serving block), the roofline timing when a sweep has serving, measured, arrival_rate or agents.
        Variable(
            "n_gpu",
            PAIR,
            "GPUs",
            "GPUs of one tensor-parallel group, a stage when pp > 1 (0: no degree in {1, 2, 4, 8} fits)",
            "capacity",
            "int32",
        ),
        Variable(
            "pp",
            PAIR,
            "stages",
            "pipeline stages n_pp of the replica group, n_gpu GPUs each (MODEL.md §10; 0: none fits)",
            "capacity",
            "int32",
        ),
        Variable(
            "n_gpu_to_fit",
            PAIR,
            "GPUs",
            "smallest tensor-parallel degree in {1, 2, 4, 8} dividing H_q that fits the sweep's "
            "longest I + O, other settings as given (0: none)",
            "capacity",
            "int32",
        ),
        Variable("weights_bytes", PAIR, "bytes", "resident weights of the replica group, M_W = P·b_w", "capacity"),
        Variable(
            "kv_pool_bytes",
            PAIR,
            "bytes",
            "KV-cache pool u·M − M_W − M_R (per stage when pp > 1: u·n_gpu·M − f·M_W − M_R; negative: "
            "weights do not fit)",
            "capacity",
        ),
        Variable("kv_bytes_per_token", PAIR, "bytes", "raw KV-cache bytes per token, L·e_kv", "capacity"),
        Variable(
            "seq_footprint_bytes",
            PAIR_LENS,
            "bytes",
            "KV bytes reserved per sequence of I + O tokens (blocks, window, factors; on one stage when pp > 1)",
            "capacity",
        ),
        Variable(
            "max_seqs",
            PAIR_LENS,
            "sequences",
            "concurrent sequences that fit the KV pool, floor(pool / footprint)",
            "capacity",
            "int64",
        ),
        Variable("fits", ALL5, "1", "the batch fits in memory: B ≤ max_seqs (MODEL.md §4c)", "capacity", "bool"),
        Variable(
            "prefill_s",
            ("model", "gpu", "input_len"),
            "s",
            "roofline prefill time of one prompt, chunked",
            "capacity",
            needs=("roofline",),
            fit_masked=True,
        ),
        Variable(
            "chunk_max_s",
            ("model", "gpu", "input_len"),
            "s",
            "longest prefill chunk",
            "capacity",
            needs=("roofline",),
            fit_masked=True,
        ),
        Variable(
            "itl_s", ALL5, "s", "inter-token latency at concurrency B", "capacity", needs=("roofline",), fit_masked=True
        ),
        Variable(
            "itl_chunk_s",
            ALL5,
            "s",
            "inter-token latency of a step that waits for one prefill chunk (roofline)",
            "capacity",
            needs=("roofline",),
            fit_masked=True,
        ),
        Variable(
            "ttft_s",
            ALL5,
            "s",
            "time to first token of the batch (service proxy)",
            "capacity",
            needs=("roofline",),
            fit_masked=True,
        ),
        Variable(
            "service_s", ALL5, "s", "service time S(B) of the batch", "capacity", needs=("roofline",), fit_masked=True
        ),
        Variable(
            "request_rate",
            ALL5,
            "requests/s",
            "completed requests per second, B / S(B)",
            "capacity",
            needs=("roofline",),
            fit_masked=True,
        ),
        Variable(
            "token_throughput",
            ALL5,
            "tokens/s",
            "prompt + output tokens per second, B·(I + O) / S(B)",
            "capacity",
            needs=("roofline",),
            fit_masked=True,
        ),
        # The M/M/c queue (MODEL.md §5), present when a sweep has arrival_rate.
        Variable(
            "utilization", QUEUE, "1", "server utilisation ρ = λ·S(m)/m, m = min(B, max_seqs)", "queue", fit_masked=True
        ),
        Variable(
            "p_wait",
            QUEUE,
            "1",
            "probability an arrival waits (Erlang C); 1 without steady state",
            "queue",
            fit_masked=True,
        ),
        Variable("wait_s", QUEUE, "s", "mean queueing delay W_q (+inf: unbounded)", "queue", fit_masked=True),
        Variable(
            "wait_p90_s",
            QUEUE,
            "s",
            "p90 queueing delay, ln(P_wait/0.1)/(m/S − λ) (0 where P_wait ≤ 0.1; +inf: unbounded)",
            "queue",
            fit_masked=True,
        ),
        Variable("response_s", QUEUE, "s", "mean response time W_q + S (+inf: unbounded)", "queue", fit_masked=True),
        Variable(
            "in_system", QUEUE, "requests", "mean requests in system, λ·R (+inf: unbounded)", "queue", fit_masked=True
        ),
        # Agent graphs (MODEL.md §6), present when a sweep has agents; batch is the local replica's slot limit.
        Variable(
            "agent_local_s",
            AGENT,
            "s",
            "graph time on one local replica, T_local (+inf: does not fit)",
            "agents",
            fit_masked=True,
        ),
        Variable(
            "agent_dependency_bound_s",
            AGENT,
            "s",
            "dependency bound n_st·S(1) + (n_st − 1)·d (+inf: does not fit)",
            "agents",
            fit_masked=True,
        ),
        Variable("agent_api_s", AGENT_API, "s", "graph time on the API, T_api (MODEL.md §6 schedule)", "agents"),
        Variable(
            "agent_local_cost_usd",
            AGENT,
            "USD",
            "rental cost of T_local on the replica group (illustrative prices)",
            "agents",
            fit_masked=True,
        ),
        Variable(
            "agent_api_cost_usd", AGENT_API, "USD", "API cost of the graph's tokens (illustrative prices)", "agents"
        ),
        Variable("agent_api_limit", AGENT_API, "1", "which limit sets T_api", "agents", "int8"),
        Variable("agent_faster", AGENT, "1", "faster side (ties: local)", "agents", "int8"),
        Variable("agent_cheaper", AGENT, "1", "cheaper side (ties: local)", "agents", "int8"),
        Variable(
            "agent_api_price_per_mtok",
            AGENT_API,
            "USD/Mtok",
            "the API's price blended over the graph's tokens, (I·p_in + O·p_out)/(I + O) (illustrative)",
            "agents",
        ),
        Variable(
            "agent_break_even_price_per_mtok",
            AGENT,
            "USD/Mtok",
            "blended API price at which the API costs what the local replica does (NaN: does not fit)",
            "agents",
            fit_masked=True,
        ),
        Variable(
            "agent_break_even_rpm",
            AGENT,
            "requests/min",
            "smallest API RPM quota at which T_api ≤ T_local (0: any; NaN: none, or does not fit)",
            "agents",
            fit_masked=True,
        ),
    )
}

SCHEMAS: dict[str, dict[str, Variable]] = {"sweep": VARIABLES}  # kind -> its variables, in Dataset order
KIND_ATTRS: dict = {}  # kind -> (parsed input, block plan) -> the Dataset's attrs


def register_kind(kind: str, variables: dict[str, Variable], attrs) -> None:
    """A new kind of evaluation (a study): its variable table and its Dataset attrs. Its groups register with
    ``kind=`` in :mod:`.groups`; the parsed input carries ``kind``, ``coords`` and ``dtype``."""
    if kind in KIND_ATTRS:
        raise ValueError(f"kind {kind!r} is already registered")
    unknown = sorted({d for v in variables.values() for d in v.dims if d not in DIMS})
    if unknown:
        raise ValueError(f"kind {kind!r}: unknown dim {unknown[0]!r} (register it in DIMS)")
    SCHEMAS[kind] = variables
    KIND_ATTRS[kind] = attrs


def base_attrs(var: Variable) -> dict:
    """A variable's attrs from its row: units (where it has them) and long name, the price date of what prices
    make, a coded variable's flags."""
    attrs = {} if var.units is None else {"units": var.units}
    attrs["long_name"] = var.long_name
    if var.priced:
        attrs["price_date"] = PRICE_DATE
    if var.flags:
        attrs.update(flag_values=list(range(len(var.flags))), flag_meanings=" ".join(var.flags))
    return attrs


def check_dims(variable: Variable) -> Variable:
    """The variable, its dims checked against :data:`DIMS`."""
    unknown = [d for d in variable.dims if d not in DIMS]
    if unknown:
        raise ValueError(f"variable {variable.name!r}: unknown dim {unknown[0]!r} (register it in DIMS)")
    return variable


def table(*rows: Variable) -> dict[str, Variable]:
    """A kind's variable table from its rows, each dim checked against :data:`DIMS`."""
    return {v.name: check_dims(v) for v in rows}


ROOFLINE_ONLY = ("prefill_s", "chunk_max_s", "itl_chunk_s")
SERVICE = ("itl_s", "ttft_s", "service_s", "request_rate", "token_throughput")


def register_variable(variable: Variable, kind: str = "sweep") -> Variable:
    """Add a variable to a kind's schema (a new group's outputs)."""
    rows = SCHEMAS[kind]
    if variable.name in rows:
        raise ValueError(f"variable {variable.name!r} is already in the schema")
    rows[variable.name] = check_dims(variable)
    return variable
