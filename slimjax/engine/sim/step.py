"""One engine step of one replica (MODEL.md §9 steps 1–4, §10's held transfers), as small pure functions on its
slots: release the KV of finished transfers, admit from the queue, schedule the token budget, time the step,
advance the requests, and compact away the completed ones. :mod:`.loop` composes them into a lane's step and
does the lane's bookkeeping (records, peaks, routing); :func:`coast_times` times a stretch of decode-only steps.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ...model import batching
from .state import LaneParams, Slots, Stream, empty_rows, pack, unpack


class Queue(NamedTuple):
    """How a replica's FCFS queue is walked (static: a lane's kind picks it): ``arrival_s(h)`` of request h,
    ``next(h)`` the request behind it, ``waiting(h, t)`` whether h is a request waiting at t."""

    arrival_s: Callable
    next: Callable
    waiting: Callable


class Plan(NamedTuple):
    """What a step runs, per slot: which requests decode, which prefill and how many new prompt tokens."""

    occupied: Any  # slot holds a request
    live: Any  # ... that still has work (a held row's KV only waits for its transfer)
    decode: Any
    prefill: Any
    new_tokens: Any  # prompt tokens prefilled this step
    chunked: Any  # new_tokens > 0
    context: Any  # I + j
    decodes: Any  # d: decode tokens of the step


def compact(rows, keep):
    """Slot rows (S, F) with the kept ones moved to the front in their order and the rest emptied."""
    S = keep.shape[0]
    dest = jnp.where(keep, jnp.cumsum(keep) - 1, S)
    return empty_rows((S,), rows.dtype).at[dest].set(rows, mode="drop")


def release_transferred(rows, count, free, t):
    """(rows, free, count): completed prefills whose KV transfer ended by t give their KV back (§10)."""
    sl = unpack(rows)
    S = sl.request.shape[0]
    occ = jnp.arange(S, dtype=jnp.int32) < count
    gone = occ & (sl.decoded >= sl.output_len) & (sl.release_s <= t)
    free = free + jnp.sum(jnp.where(gone, sl.footprint_bytes, 0.0))
    stay = occ & ~gone
    return compact(rows, stay), free, jnp.sum(stay).astype(count.dtype)


def admit(params: LaneParams, stream: Stream, queue: Queue, rows, head, free, count, t, go):
    """Admit from the queue head while the batch limit, the slots and the pool allow (§9 step 1): (head, free,
    count, rows, blocked); ``blocked``: the slot width, not the batch limit, stopped an admission."""
    in_len, out_len = stream.input_len, stream.output_len
    footprint = params.footprint_bytes
    n, S, batch = stream.arrival_s.shape[0], rows.shape[0], params.batch

    def can_admit(carry):
        head, free, count, _ = carry
        fp = footprint[jnp.clip(head, 0, n - 1)]
        return go & (count < batch) & (count < S) & queue.waiting(head, t) & (fp <= free)

    def one(carry):
        head, free, count, rows = carry
        ready_made = stream.prefilled[head] if stream.prefilled is not None else 0.0  # prefilled elsewhere
        row = Slots(
            request=head,
            prefilled=ready_made * in_len[head],
            decoded=ready_made,
            input_len=in_len[head],
            output_len=out_len[head],
            footprint_bytes=footprint[head],
            admit_s=t,
            first_token_s=jnp.nan,
            arrival_s=queue.arrival_s(head),
            release_s=jnp.inf,
        )
        return queue.next(head), free - footprint[head], count + 1, rows.at[count].set(pack(row, rows.dtype))

    head, free, count, rows = jax.lax.while_loop(can_admit, one, (head, free, count, rows))
    fp = footprint[jnp.clip(head, 0, n - 1)]
    blocked = (count == S) & (count < batch) & queue.waiting(head, t) & (fp <= free)
    return head, free, count, rows, blocked


def schedule(params: LaneParams, sl: Slots, count, holding: bool) -> Plan:
    """The step's token budget (§9 step 2): every decoding request one token, then prefill chunks (at most s
    each) to the admitted prompts in admission order until N_tok tokens."""
    dt = sl.prefilled.dtype
    inf = jnp.asarray(jnp.inf, dt)
    chunk = jnp.where(params.chunk_size > 0, params.chunk_size, inf)
    S = sl.request.shape[0]
    occ = jnp.arange(S, dtype=jnp.int32) < count
    p, j, i_len, o_len = sl.prefilled, sl.decoded, sl.input_len, sl.output_len
    live = occ & (j < o_len) if holding else occ
    dec = live & (p >= i_len)
    pre = live & (p < i_len)
    d = jnp.sum(dec)
    budget = jnp.maximum(params.step_tokens - d, 0.0)
    need = jnp.where(pre, jnp.minimum(i_len - p, chunk), 0.0)
    before = jnp.cumsum(need) - need
    new = jnp.where(pre, jnp.clip(budget - before, 0.0, need), 0.0)
    return Plan(occ, live, dec, pre, new, new > 0, i_len + j, d)


def step_time(params: LaneParams, sl: Slots, plan: Plan):
    """τ of the planned step (§9 step 3, :func:`slimjax.model.batching.step_time`)."""
    roof = params.roof
    zero = jnp.zeros((), sl.prefilled.dtype)
    dec, chunked, new, p, context = plan.decode, plan.chunked, plan.new_tokens, sl.prefilled, plan.context
    return batching.step_time(
        plan.decodes + jnp.sum(new),
        jnp.sum(jnp.where(dec, context, zero)),
        jnp.sum(jnp.where(dec, batching.context_kv_bytes(context, roof), zero)),
        jnp.sum(jnp.where(chunked, batching.chunk_attention_tokens(new, p), zero)),
        jnp.sum(jnp.where(chunked, batching.context_kv_bytes(p, roof), zero)),
        roof,
        params.a_pre,
        params.a_dec,
        params.step_overhead_s,
    )


class Advanced(NamedTuple):
    slots: Slots  # p, j and first-token times after the step (before compaction)
    first: Any  # the step produced the request's first token
    done: Any  # ... its last


def advance(sl: Slots, plan: Plan, end, go) -> Advanced:
    """Each request's progress after the step ending at ``end`` (§9 step 4): prefill chunks added, one token
    per decoding request, the first token where the prompt completes; done where the last token came."""
    p_new = sl.prefilled + plan.new_tokens
    first = plan.chunked & (p_new >= sl.input_len)
    j_new = jnp.where(plan.decode, sl.decoded + 1.0, jnp.where(first, 1.0, sl.decoded))
    t_first = jnp.where(first, end, sl.first_token_s)
    done = go & (plan.decode | first) & (j_new >= sl.output_len)
    return Advanced(sl._replace(prefilled=p_new, decoded=j_new, first_token_s=t_first), first, done)


def coast_times(params: LaneParams, sl: Slots, decode, steps: int):
    """τ of ``steps`` decode-only steps from now (each decoding request one more token of context per step),
    from the same terms as :func:`step_time`; (steps,)."""
    roof = params.roof
    dt = sl.prefilled.dtype
    zero = jnp.zeros((), dt)
    d = jnp.sum(decode)
    ahead = jnp.arange(steps, dtype=dt)
    context = (sl.input_len + sl.decoded)[:, None] + ahead  # (slots, steps): each decode's context at each step
    return batching.step_time(
        jnp.broadcast_to(d.astype(dt), ahead.shape),
        jnp.sum(jnp.where(decode[:, None], context, zero), axis=0),
        jnp.sum(jnp.where(decode[:, None], batching.context_kv_bytes(context, roof), zero), axis=0),
        zero,
        zero,
        roof,
        params.a_pre,
        params.a_dec,
        params.step_overhead_s,
    )
