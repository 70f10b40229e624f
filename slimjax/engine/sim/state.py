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


class LaneParams(NamedTuple):
    """One lane's candidate: the engine step's roofline terms (:func:`slimjax.model.batching.replica_terms`), its
    batch limit and every request's KV footprint on it."""

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

    @classmethod
    def of(cls, params: dict) -> LaneParams:
        """From the terms mapping (``replica_terms`` with ``batch``, ``footprint`` and, to stop early, the
        :class:`StopParams` fields)."""
        stop = StopParams(*(params[k] for k in StopParams._fields)) if "job" in params else None
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
        )


class Stream(NamedTuple):
    """A lane's requests in arrival order, (N,) each; ``prefilled`` (1: the prompt was prefilled elsewhere)
    and ``hold_s`` (how long a completed prefill keeps its KV: its transfer, §10) only where a stream has them."""

    arrival_s: Any
    input_len: Any
    output_len: Any
    prefilled: Any = None
    hold_s: Any = None

    @classmethod
    def of(cls, stream: dict) -> Stream:
        return cls(**{k: stream[k] for k in cls._fields if k in stream})


class Slots(NamedTuple):
    """A replica's admitted requests, one entry per slot in admission order (a completed request's entry is
    compacted away, so the held ones are the first ``admitted``); arrays (..., S)."""

    request: Any  # int32: index into the stream (-1: empty)
    prefilled: Any  # p: prompt tokens prefilled
    decoded: Any  # j: output tokens produced
    input_len: Any
    output_len: Any
    footprint_bytes: Any
    admit_s: Any
    first_token_s: Any
    arrival_s: Any
    release_s: Any  # when a completed request's KV is released (disaggregated prefill: its transfer's end)


SLOT_EMPTY = {"request": -1}  # an empty slot's value per field; 0 for fields not named
SLOT_DTYPES = {"request": np.int32}  # a field's dtype in the Slots view; the stream's float dtype if not named
SLOT_COLUMN = {f: i for i, f in enumerate(Slots._fields)}  # each field's column in the packed slot rows


# The lane state keeps its slots packed, one float row per slot and one column per Slots field (SLOT_COLUMN names
# them): admitting writes one row and compacting is one scatter of rows, where a struct of arrays would take one
# update per field (measured 15–25 % slower). Every step reads and writes them through the Slots view.


def pack(slots: Slots, dtype):
    """Slot rows (…, S, F) of the Slots view, in the stream's float ``dtype``."""
    return jnp.stack([jnp.asarray(a).astype(dtype) for a in slots], axis=-1)


def unpack(rows) -> Slots:
    """The Slots view (…, S) of slot rows (…, S, F)."""
    return Slots(*(rows[..., i].astype(SLOT_DTYPES.get(f, rows.dtype)) for f, i in SLOT_COLUMN.items()))


def empty_rows(shape, dtype, xp=jnp):
    """Empty slot rows of ``shape`` (…, S) + (F,)."""
    fill = xp.asarray([SLOT_EMPTY.get(f, 0) for f in Slots._fields], dtype)
    return xp.broadcast_to(fill, (*shape, len(Slots._fields)))


def widen_rows(rows, width: int):
    """Host-side slot rows (…, s, F) with empty ones appended up to ``width``."""
    extra = empty_rows((*rows.shape[:-2], width - rows.shape[-2]), rows.dtype, xp=np)
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

    done: Any  # Completed (slimjax.engine.sim.outputs): per-request records, written at completion
    head: Any  # (R,) int32 next request to admit (contiguous: index into the stream; else its queue's head, -1)
    clock: Any  # (R,) the end of each replica's last step
    busy_s: Any  # (R,) time spent in steps
    free_bytes: Any  # (R,) KV pool not reserved
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
