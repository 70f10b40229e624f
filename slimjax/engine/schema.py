"""Output schema (MODEL.md §7): every variable's dims, units, dtype, long name and group, in one table,
and the grid's dims.

Dims a variable does not depend on are dropped (MODEL.md §7 allows it; it saves grid bytes). ``dtype``
"float" is the evaluation's precision. A variable's ``group`` (see :mod:`.groups`) computes it; ``needs``
names other groups that must be active too; ``fit_masked`` ones are NaN wherever what they time cannot run
(:func:`.groups.mask_unfit`: the batch, or for prefill-only figures the batch's prompts, does not fit memory).

One table per kind of evaluation (:data:`SCHEMAS`): ``sweep`` (MODEL.md §1–§7, :data:`VARIABLES`) and
``procurement`` (§8, :data:`PROCUREMENT`). A kind's Dataset has that table's variables, in its order.
"""

from __future__ import annotations

import dataclasses


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
    )
}


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    dims: tuple[str, ...]
    units: str
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
            "GPUs in the replica group (tensor-parallel degree; 0: no degree in {1, 2, 4, 8} fits)",
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
            "kv_pool_bytes", PAIR, "bytes", "KV-cache pool u·M − M_W − M_R (negative: weights do not fit)", "capacity"
        ),
        Variable("kv_bytes_per_token", PAIR, "bytes", "raw KV-cache bytes per token, L·e_kv", "capacity"),
        Variable(
            "seq_footprint_bytes",
            PAIR_LENS,
            "bytes",
            "KV bytes reserved per sequence of I + O tokens (blocks, window, factors)",
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
    )
}

# ----------------------------------------------------------------------------- procurement (MODEL.md §8)

# Why a candidate is infeasible, checked in this order (the first failing check is reported).
REASONS = ("feasible", "tp_does_not_divide_heads", "memory", "itl", "ttft", "e2e", "unbounded_queue")
CANDIDATE = ("workload", "model", "gpu", "tp", "batch")
SIZED = ("workload", "rate", "model", "gpu", "tp", "batch")
CHOICE = ("workload", "rate", "model")
MIX = ("workload", "rate", "model", "class")
_P = "procurement"

PROCUREMENT: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable("total_rate", ("workload", "rate"), "requests/s", "total arrival rate Λ", _P),
        Variable("class_input_len", ("workload", "class"), "tokens", "class prompt length I_k (rounded mean)", _P),
        Variable("class_output_len", ("workload", "class"), "tokens", "class output length O_k (rounded mean)", _P),
        Variable("class_weight", ("workload", "class"), "1", "class weight w_k = n_k/N (0: no such class)", _P),
        Variable("weights_bytes", ("model", "gpu", "tp"), "bytes", "weights M_W of the group", _P),
        Variable("kv_pool_bytes", ("model", "gpu", "tp"), "bytes", "KV pool u·M − M_W − M_R of the group", _P),
        Variable(
            "fits",
            ("workload", "model", "gpu", "tp"),
            "1",
            "the group holds its weights and one mixture sequence (max_seqs ≥ 1, TP divides H_q)",
            _P,
            "bool",
        ),
        Variable("slots", CANDIDATE, "sequences", "slots m = min(B, ⌊pool / F̄⌋)", _P),
        Variable("service_s", CANDIDATE, "s", "mixture service time S̄ = Σ w_k S_k(m)", _P),
        Variable(
            "max_rate_per_replica",
            CANDIDATE,
            "requests/s",
            "λ*, the largest per-replica rate meeting every SLO (0: none)",
            _P,
        ),
        Variable("itl_s", CANDIDATE, "s", "ITL_k(m), worst class", _P),
        Variable("ttft_unloaded_s", CANDIDATE, "s", "TTFT_k(m) = t_pre,k + ITL_k(m) without queueing, worst class", _P),
        Variable("e2e_unloaded_s", CANDIDATE, "s", "S_k(m) without queueing, worst class", _P),
        Variable("infeasible_reason", CANDIDATE, "1", "first failing check (0: feasible)", _P, "int8", flags=REASONS),
        Variable("memory_headroom", CANDIDATE, "1", "1 − m·F̄/pool, the KV pool left unused", _P),
        Variable("feasible", SIZED, "1", "λ* > 0: the candidate serves the rate under the SLOs", _P, "bool"),
        Variable("replicas", SIZED, "replica groups", "R = ⌈Λ/λ*⌉", _P),
        Variable("gpus_total", SIZED, "GPUs", "R·n", _P),
        Variable("cost_per_hour", SIZED, "USD/hour", "R·n·price per GPU-hour (illustrative)", _P, priced=True),
        Variable(
            "cost_per_mtok",
            SIZED,
            "USD/Mtok",
            "cost per million prompt + output tokens (illustrative)",
            _P,
            priced=True,
        ),
        Variable("ttft_p_s", SIZED, "s", "W_p + TTFT_k(m) at Λ/R per replica, worst class", _P),
        Variable("e2e_mean_s", SIZED, "s", "W_q + S_k(m) at Λ/R per replica, worst class", _P),
        Variable("utilization", SIZED, "1", "ρ at Λ/R per replica", _P),
        Variable("best_gpu", CHOICE, "", "chosen GPU ('' when no candidate is feasible)", _P, "int32", label_of="gpu"),
        Variable("best_tp", CHOICE, "GPUs", "chosen TP degree (0: none)", _P),
        Variable("best_batch", CHOICE, "sequences", "chosen concurrency limit (0: none)", _P),
        Variable("best_replicas", CHOICE, "replica groups", "replicas of the choice", _P),
        Variable("best_gpus", CHOICE, "GPUs", "GPUs of the choice", _P),
        Variable("best_cost_per_hour", CHOICE, "USD/hour", "cost of the choice (illustrative)", _P, priced=True),
        Variable(
            "best_cost_per_mtok",
            CHOICE,
            "USD/Mtok",
            "cost per million tokens of the choice (illustrative)",
            _P,
            priced=True,
        ),
        Variable(
            "binding_reason",
            CHOICE,
            "1",
            "0 when a candidate is feasible, else the check the furthest candidates fail",
            _P,
            "int8",
            flags=REASONS,
        ),
        Variable(
            "mix_cost_per_hour",
            CHOICE,
            "USD/hour",
            "each class on its own cheapest candidate at w_k·Λ, summed",
            _P,
            priced=True,
        ),
        Variable(
            "mix_saving_per_hour",
            CHOICE,
            "USD/hour",
            "best single choice − mix (negative: the mix costs more)",
            _P,
            priced=True,
        ),
        Variable("mix_gpu", MIX, "", "class k's own cheapest GPU", _P, "int32", label_of="gpu"),
        Variable("mix_tp", MIX, "GPUs", "class k's TP degree", _P),
        Variable("mix_batch", MIX, "sequences", "class k's concurrency limit", _P),
        Variable("mix_replicas", MIX, "replica groups", "class k's replicas", _P),
        Variable("mix_class_cost_per_hour", MIX, "USD/hour", "class k's cost (illustrative)", _P, priced=True),
    )
}

SCHEMAS: dict[str, dict[str, Variable]] = {"sweep": VARIABLES, "procurement": PROCUREMENT}

ROOFLINE_ONLY = ("prefill_s", "chunk_max_s", "itl_chunk_s")
SERVICE = ("itl_s", "ttft_s", "service_s", "request_rate", "token_throughput")


def register_variable(variable: Variable, kind: str = "sweep") -> Variable:
    """Add a variable to a kind's schema (a new group's outputs)."""
    table = SCHEMAS[kind]
    if variable.name in table:
        raise ValueError(f"variable {variable.name!r} is already in the schema")
    unknown = [d for d in variable.dims if d not in DIMS]
    if unknown:
        raise ValueError(f"variable {variable.name!r}: unknown dim {unknown[0]!r} (register it in DIMS)")
    table[variable.name] = variable
    return variable
