"""One engine step of one replica (MODEL.md §9 steps 1–4, §10's held transfers), as small pure functions on its
slots: release the KV of finished transfers, admit from the queue, schedule the token budget, time the step,
advance the requests, and compact away the completed ones. :mod:`.loop` composes them into a lane's step and
does the lane's bookkeeping (records, peaks, routing); :func:`coast_times` times a stretch of decode-only steps.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ...model import batching, speculative
from .state import SLOT_COLUMN, LaneParams, Slots, Stream, empty_rows, pack, unpack


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
    return empty_rows((S,), rows.dtype, width=rows.shape[-1]).at[dest].set(rows, mode="drop")


def release_transferred(rows, count, free, t):
    """(rows, free, count): completed prefills whose KV transfer ended by t give their KV back (§10)."""
    sl = unpack(rows)
    S = sl.request.shape[0]
    occ = jnp.arange(S, dtype=jnp.int32) < count
    gone = occ & (sl.decoded >= sl.output_len) & (sl.release_s <= t)
    free = free + jnp.sum(jnp.where(gone, sl.held_kv, 0.0))
    stay = occ & ~gone
    return compact(rows, stay), free, jnp.sum(stay).astype(count.dtype)


def admit(params: LaneParams, stream: Stream, queue: Queue, rows, head, free, count, t, go):
    """Admit from the queue head while the batch limit, the slots and the pool allow (§9 step 1): (head, free,
    count, rows, blocked); ``blocked``: the slot width, not the batch limit, stopped an admission. A paged lane
    (:func:`admit_paged`) admits its preempted requests first."""
    if params.paging is not None:
        return admit_paged(params, stream, queue, rows, head, free, count, t, go)
    footprint = params.footprint_bytes
    n, S, batch = stream.arrival_s.shape[0], rows.shape[0], params.batch

    def can_admit(carry):
        head, free, count, _ = carry
        fp = footprint[jnp.clip(head, 0, n - 1)]
        return go & (count < batch) & (count < S) & queue.waiting(head, t) & (fp <= free)

    def one(carry):
        head, free, count, rows = carry
        row = new_row(stream, queue, head, footprint[head], t)
        return (
            queue.next(head),
            free - footprint[head],
            count + 1,
            rows.at[count].set(pack(row, rows.dtype, rows.shape[-1])),
        )

    head, free, count, rows = jax.lax.while_loop(can_admit, one, (head, free, count, rows))
    fp = footprint[jnp.clip(head, 0, n - 1)]
    blocked = (count == S) & (count < batch) & queue.waiting(head, t) & (fp <= free)
    return head, free, count, rows, blocked


def new_row(stream: Stream, queue: Queue, head, held_kv, t, hit_tokens=0.0) -> Slots:
    """The slot of request ``head`` admitted at t holding ``held_kv``, its first ``hit_tokens`` found in the prefix
    cache."""
    ready_made = stream.prefilled[head] if stream.prefilled is not None else 0.0  # prefilled elsewhere
    in_len = stream.input_len[head]
    return Slots(
        request=head,
        prefilled=ready_made * in_len + hit_tokens,
        decoded=ready_made,
        input_len=in_len,
        output_len=stream.output_len[head],
        held_kv=held_kv,
        admit_s=t,
        first_token_s=jnp.nan,
        arrival_s=queue.arrival_s(head),
        release_s=jnp.inf,
        parked=0.0,
        recompute=0.0,
        preemptions=0.0,
        last_token_s=jnp.where(ready_made > 0, t, jnp.nan),  # a prompt prefilled elsewhere brought its first token
        verified=0.0,
        hit_tokens=hit_tokens,
    )


def held_count(rows, count):
    """Requests held (admitted and not preempted): the first rows, before the preempted ones."""
    sl = unpack(rows)
    occ = jnp.arange(sl.request.shape[0], dtype=jnp.int32) < count
    return jnp.sum(occ & (sl.parked == 0)).astype(count.dtype)


def admit_paged(params: LaneParams, stream: Stream, queue: Queue, rows, head, free, count, t, go):
    """docs/engines.md, admission: the waiting requests are the preempted ones (the rows after the held ones, in
    their order) then the queue; the first is admitted while fewer than B are held and its prompt's blocks
    u(P) (P = I + r) leave the watermark free, taking u(P) (a request prefilled elsewhere brings u(I))."""
    pg = params.paging
    n, S, batch = stream.arrival_s.shape[0], rows.shape[0], params.batch
    column = SLOT_COLUMN

    def need(carry):
        head, _, count, rows, held = carry
        parked = held < count
        row = rows[jnp.minimum(held, S - 1)]
        tokens = jnp.where(
            parked, row[column["input_len"]] + row[column["recompute"]], stream.input_len[jnp.clip(head, 0, n - 1)]
        )
        return parked, pg.units(tokens)

    def can_admit(carry):
        head, free, count, _, held = carry
        parked, units = need(carry)
        ready = parked | ((count < S) & queue.waiting(head, t))
        return go & (held < batch) & ready & (units + pg.watermark_units <= free)

    def one(carry):
        head, free, count, rows, held = carry
        parked, units = need(carry)
        again = rows[jnp.minimum(held, S - 1)]
        again = again.at[column["parked"]].set(0.0).at[column["held_kv"]].set(units)
        fresh = pack(new_row(stream, queue, jnp.clip(head, 0, n - 1), units, t), rows.dtype, rows.shape[-1])
        rows = rows.at[jnp.where(parked, held, count)].set(jnp.where(parked, again, fresh))
        head = jnp.where(parked, head, queue.next(jnp.clip(head, 0, n - 1)))
        return head, free - units, count + jnp.where(parked, 0, 1), rows, held + 1

    held = held_count(rows, count)
    head, free, count, rows, held = jax.lax.while_loop(can_admit, one, (head, free, count, rows, held))
    parked, units = need((head, free, count, rows, held))
    blocked = ~parked & (count == S) & (held < batch) & queue.waiting(head, t) & (units + pg.watermark_units <= free)
    return head, free, count, rows, blocked


def prefill_only(params: LaneParams, rows, count, holding: bool):
    """Whether the step runs prompt tokens alone (docs/engines.md, prefill first): the lane prefills first and a held
    request has prompt tokens left; False for a lane that mixes them (its compiled step has no such test)."""
    if params.prefill_first is None:
        return jnp.zeros((), bool)
    sl = unpack(rows)
    occ = jnp.arange(sl.request.shape[0], dtype=jnp.int32) < count
    held = occ if params.paging is None else occ & (sl.parked == 0)
    live = held & (sl.decoded < sl.output_len) if holding else held
    target = sl.input_len if params.paging is None else sl.input_len + sl.recompute
    return (params.prefill_first > 0) & jnp.any(live & (sl.prefilled < target))


def preempt(params: LaneParams, rows, count, free, t, alone=False):
    """docs/engines.md, growth: each decoding request takes the layer-blocks its token needs, u(I + j) −
    u(I + j − 1); where they are more than the free ones, victims — held requests other than the oldest, the most
    recently admitted first (recompute) or the fewest emitted tokens first, then the longest prompt, then the
    latest (retract) — give theirs back and wait ahead of earlier-preempted requests, in admission order, to be
    prefilled again over I + j tokens. (rows, free, stuck): ``stuck`` where even every other request would not
    make room. ``alone``: the step runs prompt tokens alone (:func:`prefill_only`), so nothing grows."""
    pg = params.paging
    sl = unpack(rows)
    S = sl.request.shape[0]
    dt = sl.prefilled.dtype
    pos = jnp.arange(S, dtype=jnp.int32)
    occ = pos < count
    held = occ & (sl.parked == 0)
    live = held & (sl.decoded < sl.output_len)  # a completed prefill holding KV for its transfer does not grow
    dec = live & (sl.prefilled >= sl.input_len + sl.recompute) & ~alone
    context = sl.input_len + sl.decoded
    grow = jnp.where(dec, pg.units(context) - sl.held_kv, 0.0)
    short = jnp.sum(grow) - free  # > 0: blocks the step lacks
    can = live & (pos > 0)
    zero = jnp.zeros((), dt)
    order = jnp.lexsort(  # victims first; the last key is the primary one
        (
            -pos.astype(dt),
            jnp.where(pg.retract, -sl.input_len, zero),
            jnp.where(pg.retract, sl.decoded, zero),
            (~can).astype(dt),
        )
    )
    weight = jnp.where(can, grow + sl.held_kv, 0.0)[order]
    before = jnp.cumsum(weight) - weight
    victim = jnp.zeros(S, bool).at[order].set(can[order] & (before < short))
    stuck = short > jnp.sum(jnp.where(can, grow + sl.held_kv, 0.0))
    free = free + jnp.sum(jnp.where(victim, sl.held_kv, 0.0)) - jnp.sum(jnp.where(victim, 0.0, grow))
    sl = sl._replace(
        held_kv=jnp.where(victim, 0.0, sl.held_kv + grow),
        parked=jnp.where(victim, 1.0, sl.parked),
        prefilled=jnp.where(victim, 0.0, sl.prefilled),
        recompute=jnp.where(victim, sl.decoded, sl.recompute),
        preemptions=sl.preemptions + victim,
    )
    # held ones stay first in their order, then this step's victims, then those preempted before
    group = jnp.where(held & ~victim, 0, jnp.where(victim, 1, jnp.where(occ, 2, 3)))
    rank = jnp.zeros(S, jnp.int32)
    start = jnp.zeros((), jnp.int32)
    for g in range(3):
        mine = group == g
        rank = jnp.where(mine, start + jnp.cumsum(mine) - 1, rank)
        start = start + jnp.sum(mine)
    dest = jnp.where(group < 3, rank, S)
    width = rows.shape[-1]
    rows = empty_rows((S,), rows.dtype, width=width).at[dest].set(pack(sl, rows.dtype, width), mode="drop")
    return rows, free.astype(dt), stuck


def schedule(params: LaneParams, sl: Slots, count, holding: bool, alone=False) -> Plan:
    """The step's token budget (§9 step 2): every decoding request one token, then prefill chunks (at most s
    each) to the admitted prompts in admission order until N_tok tokens. A paged lane's preempted rows wait, and
    a request preempted after r tokens prefills I + r; where the step runs prompt tokens ``alone`` (a lane that
    prefills first, :func:`prefill_only`) the decodes wait (docs/engines.md)."""
    dt = sl.prefilled.dtype
    inf = jnp.asarray(jnp.inf, dt)
    chunk = jnp.where(params.chunk_size > 0, params.chunk_size, inf)
    S = sl.request.shape[0]
    occ = jnp.arange(S, dtype=jnp.int32) < count
    p, j, i_len, o_len = sl.prefilled, sl.decoded, sl.input_len, sl.output_len
    held, target = occ, i_len
    if params.paging is not None:
        held, target = occ & (sl.parked == 0), i_len + sl.recompute
    live = held & (j < o_len) if holding else held
    dec = live & (p >= target)
    if params.prefill_first is not None:
        dec = dec & ~alone
    pre = live & (p < target)
    d = jnp.sum(dec)
    # each decoding request's verify pass takes 1 + k tokens of the budget where it speculates
    taken = d if params.speculation is None else speculative.verify_tokens(d, params.speculation.tokens)
    budget = jnp.maximum(params.step_tokens - taken, 0.0)
    need = jnp.where(pre, jnp.minimum(target - p, chunk), 0.0)
    before = jnp.cumsum(need) - need
    new = jnp.where(pre, jnp.clip(budget - before, 0.0, need), 0.0)
    return Plan(occ, live, dec, pre, new, new > 0, i_len + j, d)


def step_time(params: LaneParams, sl: Slots, plan: Plan):
    """τ of the planned step (§9 step 3, :func:`slimjax.model.batching.step_time`); where the lane speculates, its
    decodes' verify pass and the drafting (:mod:`slimjax.model.speculative`)."""
    roof = params.roof
    zero = jnp.zeros((), sl.prefilled.dtype)
    dec, chunked, new, p, context = plan.decode, plan.chunked, plan.new_tokens, sl.prefilled, plan.context
    d = plan.decodes
    decode_context = jnp.sum(jnp.where(dec, context, zero))
    decode_kv = jnp.sum(jnp.where(dec, batching.context_kv_bytes(context, roof), zero))
    chunk_pairs = jnp.sum(jnp.where(chunked, batching.chunk_attention_tokens(new, p), zero))
    chunk_kv = jnp.sum(jnp.where(chunked, batching.context_kv_bytes(p, roof), zero))
    return timed_step(params, d, decode_context, decode_kv, jnp.sum(new), chunk_pairs, chunk_kv)


def timed_step(params: LaneParams, d, decode_context, decode_kv, prompt, chunk_pairs, chunk_kv):
    """τ of a step of ``d`` decodes (contexts summing to ``decode_context``, their KV ``decode_kv``) and ``prompt``
    prompt tokens in chunks (their (query × context) pairs ``chunk_pairs``, their earlier KV ``chunk_kv``)."""
    roof, spec = params.roof, params.speculation
    tokens, pairs = d, decode_context
    if spec is not None:
        tokens = speculative.verify_tokens(d, spec.tokens)
        pairs = speculative.verify_context_sum(d, decode_context, spec.tokens)
    tau = batching.step_time(
        tokens + prompt,
        pairs,
        decode_kv,
        chunk_pairs,
        chunk_kv,
        roof,
        params.a_pre,
        params.a_dec,
        params.step_overhead_s,
    )
    if spec is None:
        return tau
    return tau + speculative.draft_s(spec, roof, params.a_dec, d, decode_context, decode_kv, prompt)


class Advanced(NamedTuple):
    slots: Slots  # p, j and first-token times after the step (before compaction)
    first: Any  # the step produced the request's first token
    done: Any  # ... its last
    again: Any = None  # ... the token after a prefill over prompt + r emitted ones (paged lanes)


def advance(params: LaneParams, sl: Slots, plan: Plan, end, go) -> Advanced:
    """Each request's progress after the step ending at ``end`` (§9 step 4): prefill chunks added, one token
    per decoding request, the first token where the prompt completes; done where the last token came. A paged
    request prefilled again over I + r emits its token r + 1 where it completes (docs/engines.md)."""
    p_new = sl.prefilled + plan.new_tokens
    step_tokens, sl = emitted_now(params, sl, plan.decode)
    if params.paging is None and params.prefill_first is None:
        first = plan.chunked & (p_new >= sl.input_len)
        j_new = jnp.where(plan.decode, sl.decoded + step_tokens, jnp.where(first, 1.0, sl.decoded))
        t_first = jnp.where(first, end, sl.first_token_s)
        done = go & (plan.decode | first) & (j_new >= sl.output_len)
        return Advanced(sl._replace(prefilled=p_new, decoded=j_new, first_token_s=t_first), first, done)
    r = sl.recompute
    prompt_done = plan.chunked & (p_new >= sl.input_len + r)
    first, again = prompt_done & (r == 0), prompt_done & (r > 0)
    j_new = jnp.where(plan.decode, sl.decoded + step_tokens, jnp.where(prompt_done, r + 1.0, sl.decoded))
    t_first = jnp.where(first, end, sl.first_token_s)
    t_last = jnp.where(plan.decode | prompt_done, end, sl.last_token_s)  # a token's gap runs from the one before
    done = go & (plan.decode | prompt_done) & (j_new >= sl.output_len)
    advanced = sl._replace(prefilled=p_new, decoded=j_new, first_token_s=t_first, last_token_s=t_last)
    return Advanced(advanced, first, done, again)


def emitted_now(params: LaneParams, sl: Slots, decode):
    """(tokens, slots): what each decoding request emits at this step — 1, or where the lane speculates its m-th
    verify step's ⌊m·a⌋ − ⌊(m − 1)·a⌋, at most what is left of its output — and the slots with ``verified``
    counted (docs/speculative.md)."""
    if params.speculation is None:
        return 1.0, sl
    m = sl.verified
    a = params.speculation.acceptance
    tokens = speculative.emitted_tokens(m + 1.0, a) - speculative.emitted_tokens(m, a)
    tokens = jnp.minimum(tokens, sl.output_len - sl.decoded)
    return tokens, sl._replace(verified=jnp.where(decode, m + 1.0, m))


def coast_emitted(params: LaneParams, sl: Slots, decode, steps: int):
    """(slots, steps): tokens each request has emitted in a stretch of decode-only steps before each step (the
    stretch stops short of any completion, so no cap applies); ``ahead`` steps where one token a step."""
    dt = sl.prefilled.dtype
    ahead = jnp.arange(steps, dtype=dt)
    if params.speculation is None:
        return jnp.broadcast_to(ahead, (sl.decoded.shape[0], steps))
    a = params.speculation.acceptance
    m = sl.verified[:, None]
    return jnp.where(decode[:, None], speculative.emitted_tokens(m + ahead, a) - speculative.emitted_tokens(m, a), 0.0)


def coast_times(params: LaneParams, sl: Slots, decode, steps: int, before=None):
    """τ of ``steps`` decode-only steps from now (each decoding request's context grows by the tokens it emits,
    ``before``: :func:`coast_emitted`), from the same terms as :func:`step_time`; (steps,)."""
    roof = params.roof
    dt = sl.prefilled.dtype
    zero = jnp.zeros((), dt)
    d = jnp.sum(decode)
    before = coast_emitted(params, sl, decode, steps) if before is None else before
    context = (sl.input_len + sl.decoded)[:, None] + before  # (slots, steps): each decode's context at each step
    return timed_step(
        params,
        jnp.broadcast_to(d.astype(dt), (steps,)),
        jnp.sum(jnp.where(decode[:, None], context, zero), axis=0),
        jnp.sum(jnp.where(decode[:, None], batching.context_kv_bytes(context, roof), zero), axis=0),
        zero,
        zero,
        zero,
    )
