"""What a lane of the §9/§10 simulation carries from one engine step to the next, as registered pytrees
(NamedTuples of arrays): the lane's parameters, its replicas' slots (viewed as a struct of arrays, one entry per
admitted request; kept packed as rows), the per-request records written at completion, and the routing and
early-stop bookkeeping that only some lanes have (``None`` where a lane has none: an empty subtree).

Adding a per-request quantity is one :class:`Slots` field (its empty value in :data:`SLOT_EMPTY` when not 0);
writing it out at completion is one row of :data:`slimjax.engine.sim.outputs.RECORDS`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ...constants import KV_POLICIES
from ...model import memory
from ...model.batching import SPECULATION_TERMS
from ...model.speculative import Speculation
from .cache import PREFIX_TERMS, STREAM_KEYS, PrefixCache, PrefixParams, PrefixStream

GAP_BINS = 2048  # log-spaced inter-token gap bins from GAP_RANGE_S[0] to [1]: 1.1 % wide
GAP_RANGE_S = (1e-6, 1e4)


class StopParams(NamedTuple):
    """Per lane: its job's index and SLOs, and the job's allowance (the late count past which its quantile
    misses), to stop a job's lanes once it is certain to miss (:func:`slimjax.engine.sim.pool.run_pool`)."""

    job: Any  # int32: the lane's job among the lanes stepped together
    ttft_slo_s: Any
    itl_slo_s: Any
    ttft_allowed: Any  # int32
    tpot_allowed: Any  # int32


class Paging(NamedTuple):
    """A paged KV cache (docs/engines.md), per lane: blocks allocated as tokens are written, in layer-blocks
    u(T) = L_f·⌈T/β⌉ + L_s·⌈min(T, W)/β⌉; preemption by recomputation when a step cannot get the blocks it needs."""

    retract: Any  # victims by fewest emitted tokens (SGLang), else the most recently admitted first (vLLM)
    block_size: Any  # β, tokens
    full_layers: Any  # L_f
    sliding_layers: Any  # L_s
    window: Any  # W, tokens (inf: none)
    unit_bytes: Any  # one layer-block's bytes (r·o·e_kv·β, times f on a pipeline stage)
    pool_units: Any  # U: the engine's pool in layer-blocks
    watermark_units: Any  # what an admission must leave free

    def units(self, tokens):
        """u(T) of sequences holding ``tokens``."""
        return memory.kv_block_units(tokens, self.block_size, self.full_layers, self.sliding_layers, self.window)


PAGING_TERMS = {  # Paging field: its replica_terms key (slimjax.model.batching.replica_terms)
    "block_size": "kv_block_size",
    "full_layers": "kv_full_layers",
    "sliding_layers": "kv_sliding_layers",
    "window": "kv_window",
    "unit_bytes": "kv_unit_bytes",
    "pool_units": "kv_pool_units",
    "watermark_units": "kv_watermark_units",
}


def prompt_units(params: dict, input_len):
    """(u(I) (lanes, N), watermark (lanes,), pool (lanes,)) in layer-blocks, host side: what admitting each prompt
    into an empty paged replica needs and has (docs/engines.md)."""
    terms = {f: np.asarray(params[k], np.float64) for f, k in PAGING_TERMS.items()}
    units = memory.kv_block_units(
        np.asarray(input_len, np.float64)[None, :],
        *(terms[f][:, None] for f in ("block_size", "full_layers", "sliding_layers", "window")),
    )
    return np.asarray(units), terms["watermark_units"], terms["pool_units"]


# a lane's optional parts (docs/engines.md): the terms key that turns each on (> 0) and the terms only it reads; a
# lane without a part runs the loop of before, so lanes are run in groups of the parts they have
OPTIONAL_PARTS = {
    "paging": ("kv_policy", tuple(PAGING_TERMS.values())),
    "prefill_first": ("prefill_first", ()),
    "speculative": ("speculative_tokens", tuple(k for k in SPECULATION_TERMS.values() if k != "speculative_tokens")),
    "prefix": (PREFIX_TERMS["block_tokens"], (PREFIX_TERMS["block_bytes"],)),
}


def lane_parts(params: dict) -> np.ndarray:
    """(lanes, parts) bool: which of :data:`OPTIONAL_PARTS` each lane of a params mapping has."""
    lanes = np.shape(params["pool"])  # every lane's (replica_terms)
    return np.stack(
        [np.asarray(params[key]) > 0 if key in params else np.zeros(lanes, bool) for key, _ in OPTIONAL_PARTS.values()],
        axis=-1,
    )


def with_parts(params: dict, parts) -> dict:
    """A params mapping of lanes that all have ``parts`` (one bool per :data:`OPTIONAL_PARTS`), without the terms of
    the parts they lack."""
    drop = {k for on, (key, terms) in zip(parts, OPTIONAL_PARTS.values(), strict=True) if not on for k in (key, *terms)}
    return {k: v for k, v in params.items() if k not in drop}


def plain(params: dict) -> dict:
    """A params mapping without any optional part: §9 as written (KV reserved at admission, mixed steps)."""
    return with_parts(params, [False] * len(OPTIONAL_PARTS))


def paged(params: dict):
    """Per lane of a params mapping: whether its KV policy is paged (False where the terms have no policy)."""
    return lane_parts(params)[..., list(OPTIONAL_PARTS).index("paging")]


class LaneParams(NamedTuple):
    """One lane's candidate: the engine step's roofline terms (:func:`slimjax.model.batching.replica_terms`), its
    batch limit and every request's KV footprint on it; ``paging`` where its KV is paged (None: reserved at
    admission, §9 as written)."""

    roof: Any  # slimjax.model.roofline.Roof (slimjax.model.calculator.roofline_terms)
    a_pre: Any
    a_dec: Any
    step_overhead_s: Any
    step_tokens: Any  # N_tok: a step's token budget
    chunk_size: Any  # s: prefill chunk (0: none)
    pool_bytes: Any  # one engine's KV pool
    batch: Any  # the engine's batch limit
    footprint_bytes: Any  # (N,) footprint(I + O) of each request (§3)
    stop: StopParams | None = None
    paging: Paging | None = None
    prefill_first: Any = None  # a step with prompt tokens to prefill runs them alone (docs/engines.md; None: mixed)
    speculation: Speculation | None = None  # speculative decoding (docs/speculative.md; None: none)
    prefix: PrefixParams | None = None  # a prefix cache per replica (docs/simulation.md; None: none)

    @classmethod
    def of(cls, params: dict) -> LaneParams:
        """From the terms mapping (``replica_terms`` with ``batch``, ``footprint`` and, to stop early, the
        :class:`StopParams` fields); paged where it has the paged policy's terms (:func:`reserving` drops them)."""
        stop = StopParams(*(params[k] for k in StopParams._fields)) if "job" in params else None
        paging = None
        if "kv_policy" in params:
            retract = params["kv_policy"] == list(KV_POLICIES).index("retract")
            paging = Paging(retract, *(params[PAGING_TERMS[f]] for f in Paging._fields[1:]))
        return cls(
            params["roof"],
            params["a_pre"],
            params["a_dec"],
            params["step_overhead_s"],
            params["step_tokens"],
            params["chunk_size"],
            params["pool"],
            params["batch"],
            params["footprint"],
            stop,
            paging,
            params.get("prefill_first"),
            Speculation(**{f: params[k] for f, k in SPECULATION_TERMS.items()})
            if "speculative_tokens" in params
            else None,
            PrefixParams(**{f: params[k] for f, k in PREFIX_TERMS.items()})
            if PREFIX_TERMS["block_tokens"] in params
            else None,
        )


class Stream(NamedTuple):
    """A lane's requests in arrival order, (N,) each; ``prefilled`` (1: the prompt was prefilled elsewhere)
    and ``hold_s`` (how long a completed prefill keeps its KV: its transfer, §10) only where a stream has them."""

    arrival_s: Any
    input_len: Any
    output_len: Any
    prefilled: Any = None
    hold_s: Any = None
    prefix: PrefixStream | None = None  # each request's blocks as the prefix cache sees them (docs/simulation.md)

    @classmethod
    def of(cls, stream: dict) -> Stream:
        prefix = None
        if STREAM_KEYS["chain"] in stream:
            prefix = PrefixStream(**{f: stream[k] for f, k in STREAM_KEYS.items()})
        return cls(**{k: stream[k] for k in cls._fields if k in stream}, prefix=prefix)


class Slots(NamedTuple):
    """A replica's admitted requests, one entry per slot in admission order (a completed request's entry is
    compacted away, so the held ones are the first ``admitted``); arrays (..., S)."""

    request: Any  # int32: index into the stream (-1: empty)
    prefilled: Any  # p: prompt tokens prefilled
    decoded: Any  # j: output tokens produced
    input_len: Any
    output_len: Any
    held_kv: Any  # KV it holds: footprint(I + O) bytes (reserve), or layer-blocks (paged)
    admit_s: Any
    first_token_s: Any
    arrival_s: Any
    release_s: Any  # when a completed request's KV is released (disaggregated prefill: its transfer's end)
    parked: Any  # 1: preempted, waiting to be admitted again (paged)
    recompute: Any  # r: emitted tokens prefilled again with its prompt after a preemption (paged)
    preemptions: Any  # times it was preempted
    last_token_s: Any  # when its last token came (paged or prefill-first lanes)
    verified: Any  # m: verify steps it has taken (speculative lanes: its tokens so far are ⌊m·a⌋ after the first)
    hit_tokens: Any  # prompt tokens found in the prefix cache at admission (prefilled from there)


SLOT_EMPTY = {"request": -1, "last_token_s": np.nan}  # an empty slot's value per field; 0 for fields not named
SLOT_DTYPES = {"request": np.int32}  # a field's dtype in the Slots view; the stream's float dtype if not named
SLOT_COLUMN = {f: i for i, f in enumerate(Slots._fields)}  # each field's column in the packed slot rows
# a lane without optional parts (LaneParams.paging, .prefill_first, .speculation) keeps only the columns before
# "parked": the others stay at their empty value there (fewer columns to admit and compact: measured 6 % at 64
# candidates)
PLAIN_COLUMNS = SLOT_COLUMN["parked"]


# The lane state keeps its slots packed, one float row per slot and one column per Slots field (SLOT_COLUMN names
# them): admitting writes one row and compacting is one scatter of rows, where a struct of arrays would take one
# update per field (measured 15–25 % slower). Every step reads and writes them through the Slots view.


def row_width(params: LaneParams) -> int:
    """Columns of a lane's slot rows: every field where the lane has an optional part, else the plain ones."""
    plain = params.paging is None and params.prefill_first is None and params.speculation is None
    plain = plain and params.prefix is None
    return PLAIN_COLUMNS if plain else len(Slots._fields)


def pack(slots: Slots, dtype, width: int = len(Slots._fields)):
    """Slot rows (…, S, width) of the Slots view's first ``width`` fields, in the stream's float ``dtype``."""
    return jnp.stack([jnp.asarray(a).astype(dtype) for a in slots[:width]], axis=-1)


def unpack(rows) -> Slots:
    """The Slots view (…, S) of slot rows (…, S, F); a field past the rows' columns at its empty value."""
    width = rows.shape[-1]

    def field(f, i):
        dtype = SLOT_DTYPES.get(f, rows.dtype)
        if i < width:
            return rows[..., i].astype(dtype)
        return jnp.full(rows.shape[:-1], SLOT_EMPTY.get(f, 0), dtype)

    return Slots(*(field(f, i) for f, i in SLOT_COLUMN.items()))


def empty_rows(shape, dtype, xp=jnp, width: int = len(Slots._fields)):
    """Empty slot rows of ``shape`` (…, S) + (width,)."""
    fill = xp.asarray([SLOT_EMPTY.get(f, 0) for f in Slots._fields[:width]], dtype)
    return xp.broadcast_to(fill, (*shape, width))


def widen_rows(rows, width: int):
    """Host-side slot rows (…, s, F) with empty ones appended up to ``width``."""
    extra = empty_rows((*rows.shape[:-2], width - rows.shape[-2]), rows.dtype, xp=np, width=rows.shape[-1])
    return np.concatenate([rows, extra], axis=-2)


class Routing(NamedTuple):
    """Per-replica FCFS queues as linked lists through the requests, and the stream's pending arrivals (lanes
    that route: several replicas, or a closed loop)."""

    arrival_s: Any  # (N,) when each request was routed (+inf: not yet); a closed loop's arrival is set then
    replica: Any  # (N,) int32 the replica it went to (-1: not yet)
    next_in_queue: Any  # (N,) int32 the request behind it in its replica's queue (-1: none)
    client_next: Any  # (C,) int32 each client's (or the open stream's) next request (N: none)
    client_time: Any  # (C,) when it arrives (+inf: none)
    tail: Any  # (R,) int32 the last request queued at each replica (-1: empty)
    queued: Any  # (R,) int32 requests waiting at each replica
    in_system: Any  # (R,) int32 admitted + waiting
    last_done: Any  # (R,) int32 completions of each replica's last step


class StopCounts(NamedTuple):
    """Requests certain to miss the lane's SLOs (contiguous lanes that stop early)."""

    late_ptr: Any  # requests whose TTFT SLO passed by the last step's end
    ttft_first: Any  # first tokens over the TTFT SLO
    ttft_late: Any  # requests certain to miss it, as of the last step
    tpot_late: Any  # completed requests over the TPOT SLO
    stopped: Any  # bool


class LaneState(NamedTuple):
    """Everything a lane carries between steps: per request (N,), per replica (R,), per lane ()."""

    done: Any  # (N, P) per-request records, packed (outputs.completed: their view), written at completion
    head: Any  # (R,) int32 next request to admit (contiguous: index into the stream; else its queue's head, -1)
    clock: Any  # (R,) the end of each replica's last step
    busy_s: Any  # (R,) time spent in steps
    free_kv: Any  # (R,) KV not held: bytes (reserve) or layer-blocks (paged)
    admitted: Any  # (R,) int32 requests each replica holds
    slots: Any  # (R, S, F) slot rows (pack/unpack: the Slots view)
    queue_peak: Any  # (R,) int32 most requests left waiting after a step's admission
    held_peak: Any  # (R,) int32 most requests held at once
    kv_peak_bytes: Any  # (R,) most KV reserved at once
    gaps: Any  # (GAP_BINS,) histogram of every inter-token gap
    steps: Any  # () int32
    stuck: Any  # () bool: an empty replica whose queue head does not fit its pool: stop, never spin
    overflow: Any  # () bool: the slot width stopped an admission (rerun wider)
    arrived: Any = None  # (R,) int32 requests arrived by the replica's last step start (contiguous lanes)
    routing: Routing | None = None
    stop: StopCounts | None = None
    cache: PrefixCache | None = None
