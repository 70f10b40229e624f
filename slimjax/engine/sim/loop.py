"""The lane loop (MODEL.md §9, §10): one jitted ``lax.while_loop`` over engine steps of every lane at once.

A *lane* is R replicas (static) serving one request stream; lanes are vmapped (candidates × replicas × streams)
inside the loop, so nothing loops in Python per step or per request, and the loop carries every lane at once (a
vmapped while loop would select every carried array, per-request ones included, on every step). Each iteration
either routes the earliest arrival due before the next step (``round_robin``: request i to replica i mod R;
``least_loaded``: fewest admitted + waiting at the arrival instant, ties to the lowest index) or runs one step of
the replica whose next step starts first (:mod:`.step`). A lane of one replica on an open stream (*contiguous*)
needs no routing: its queue is the stream from the next request to admit. Other lanes' FCFS queues are linked
lists through the requests (head, tail, next), so routing and admission are O(1) each.

Streams: open (arrival times known; padding requests arrive at +inf and are never routed) or closed loop
(C clients; request i belongs to client i mod C and its successor i + C arrives when it completes).

A contiguous lane takes a decode-only stretch (every held request decoding, none completing, no admission
possible) as up to :data:`COAST_STEPS` steps in one iteration: each step's τ from the same terms, its start the
previous one's end, so the results are those of one step at a time (to the order of a sum).

A step the slot width would stop an admission in is not taken: the lane stops with ``overflow`` set and its
state as before that step, so widening its slots and going on is a run as wide as B from the start.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ...constants import ROUTERS
from . import cache as prefix_cache
from . import step as one
from .outputs import gap_bin, no_completions, records, write_completions
from .state import (
    GAP_BINS,
    SLOT_COLUMN,
    LaneParams,
    LaneState,
    Routing,
    Slots,
    StopCounts,
    Stream,
    empty_rows,
    pack,
    row_width,
    unpack,
)

COAST_STEPS = 32  # decode-only steps one iteration may take at once (contiguous lanes)
STOP_MARGIN = 1e-5  # relative: a count the host's own arithmetic (another rounding) could not contradict
WINDOW = 8  # arrivals a pointer moves over per pass (a pass more while all of them qualify)


@dataclasses.dataclass(frozen=True)
class Lane:
    """A lane's static shape: R replicas of S slots, C clients of a closed loop (else an open stream), the
    router, and whether it counts late requests to stop early (contiguous lanes only)."""

    replicas: int
    slots: int
    clients: int = 1
    closed: bool = False
    router: str = "round_robin"
    stopping: bool = False
    log: int = 0  # the prefix cache's log of freed blocks (lanes with a cache; cache.lane_chains)
    events: int = 0  # the prefix cache's event queue: twice the widest slots a lane may reach

    def __post_init__(self):
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.stopping and not self.contiguous:
            raise ValueError("stopping counts need contiguous lanes (one replica on an open stream)")

    @property
    def contiguous(self) -> bool:
        return self.replicas == 1 and not self.closed


def pointer(ptr, arrival, due):
    """The first index from ``ptr`` on whose arrival is not ``due`` (``due`` monotone along the sorted
    stream, so the due ones are a run from ``ptr``), :data:`WINDOW` arrivals a pass."""
    n = arrival.shape[0]

    def scan(p):
        idx = p + jnp.arange(WINDOW, dtype=jnp.int32)
        ok = (idx < n) & due(arrival[jnp.minimum(idx, n - 1)])
        k = jnp.sum(jnp.cumprod(ok.astype(jnp.int32))).astype(jnp.int32)
        return (p + k).astype(jnp.int32), k == WINDOW

    return jax.lax.while_loop(lambda c: c[1], lambda c: scan(c[0]), scan(ptr))[0]


def init(lane: Lane, params: LaneParams, stream: Stream) -> LaneState:
    R, S, C = lane.replicas, lane.slots, lane.clients
    arrival = stream.arrival_s
    dt, n = arrival.dtype, arrival.shape[0]
    inf = jnp.asarray(jnp.inf, dt)
    routing = None
    if not lane.contiguous:
        if lane.closed:
            first = jnp.arange(C, dtype=jnp.int32)
            client_next = jnp.where(first < n, first, n)
            client_time = jnp.where(first < n, 0.0, inf).astype(dt)
        else:
            client_next = jnp.zeros(1, jnp.int32)
            client_time = arrival[:1]
        routing = Routing(
            arrival_s=jnp.full(n, inf, dt),
            replica=jnp.full(n, -1, jnp.int32),
            next_in_queue=jnp.full(n, -1, jnp.int32),
            client_next=client_next,
            client_time=client_time,
            tail=jnp.full(R, -1, jnp.int32),
            queued=jnp.zeros(R, jnp.int32),
            in_system=jnp.zeros(R, jnp.int32),
            last_done=jnp.zeros(R, jnp.int32),
        )
    stop = None
    if lane.stopping:
        zero = jnp.zeros((), jnp.int32)
        stop = StopCounts(zero, zero, zero, zero, jnp.zeros((), bool))
    return LaneState(
        done=no_completions(n, dt),
        head=jnp.zeros(R, jnp.int32) if lane.contiguous else jnp.full(R, -1, jnp.int32),
        clock=jnp.zeros(R, dt),
        busy_s=jnp.zeros(R, dt),
        free_kv=jnp.full(R, params.pool_bytes if params.paging is None else params.paging.pool_units, dt),
        admitted=jnp.zeros(R, jnp.int32),
        slots=empty_rows((R, S), dt, width=row_width(params)),
        queue_peak=jnp.zeros(R, jnp.int32),
        held_peak=jnp.zeros(R, jnp.int32),
        kv_peak_bytes=jnp.zeros(R, dt),
        gaps=jnp.zeros(GAP_BINS, dt),
        steps=jnp.zeros((), jnp.int32),
        stuck=jnp.zeros((), bool),
        overflow=jnp.zeros((), bool),
        arrived=jnp.zeros(R, jnp.int32) if lane.contiguous else None,
        routing=routing,
        stop=stop,
        cache=None if params.prefix is None else prefix_cache.init(R, lane.log, stream.prefix, lane.events),
    )


def ready(lane: Lane, stream: Stream, st: LaneState):
    """Each replica's next step start: its clock while it holds requests, else its queue head's arrival
    (not before its clock); +inf when it has nothing to do."""
    arrival = stream.arrival_s
    n = arrival.shape[0]
    inf = jnp.asarray(jnp.inf, arrival.dtype)
    if lane.contiguous:
        head_t = jnp.where(st.head < n, arrival[jnp.minimum(st.head, n - 1)], inf)
    else:
        head_t = jnp.where(st.head >= 0, st.routing.arrival_s[jnp.maximum(st.head, 0)], inf)
    held = st.admitted > 0
    if stream.hold_s is not None:  # rows whose KV waits for its transfer hold no work
        sl = unpack(st.slots)
        occ = jnp.arange(sl.request.shape[1])[None, :] < st.admitted[:, None]
        held = jnp.any(occ & (sl.decoded < sl.output_len), axis=-1)
    return jnp.where(held, st.clock, jnp.maximum(st.clock, head_t))


def next_arrival(stream: Stream, routing: Routing):
    """(time, client) of the earliest pending arrival, ties to the lower request index."""
    n = stream.arrival_s.shape[0]
    t = jnp.min(routing.client_time)
    c = jnp.argmin(jnp.where(routing.client_time == t, routing.client_next, n + 1))
    return t, c


def active(lane: Lane, stream: Stream, st: LaneState):
    busy = jnp.isfinite(jnp.min(ready(lane, stream, st)))
    if not lane.contiguous:
        busy = busy | jnp.isfinite(next_arrival(stream, st.routing)[0])
    if st.cache is not None:  # a step's cache events are applied before the lane stops
        busy = busy | prefix_cache.pending(st.cache)
    busy = busy & ~st.stuck & ~st.overflow
    return busy & ~st.stop.stopped if lane.stopping else busy


def route(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, go) -> LaneState:
    """Route the earliest pending arrival where ``go``; a no-op elsewhere. ``prefix_affinity``: the replica whose
    cache holds the longest prefix of the request, ties and no match to the least loaded (docs/simulation.md)."""
    R, C = lane.replicas, lane.clients
    arrival = stream.arrival_s
    n = arrival.shape[0]
    inf = jnp.asarray(jnp.inf, arrival.dtype)
    q = st.routing
    t, c = next_arrival(stream, q)
    i = q.client_next[c]
    if lane.router == "round_robin":
        r = jnp.mod(i, R).astype(jnp.int32)
    else:  # fewest admitted + waiting at t: the last step's completions count until its end
        load = q.in_system + jnp.where(st.clock > t, q.last_done, 0)
        if lane.router == "prefix_affinity" and params.prefix is not None:  # without a cache: least loaded
            at = jnp.clip(i, 0, n - 1)
            hits = prefix_cache.matched(st.cache, stream.prefix, params.prefix, stream.input_len[at], at)
            best = jnp.max(hits)
            load = jnp.where((best > 0) & (hits < best), jnp.iinfo(jnp.int32).max, load)
        r = jnp.argmin(load).astype(jnp.int32)
    tail = q.tail[r]
    at_r = go & (jnp.arange(R) == r)
    at_i = jnp.where(go, i, n)
    succ = i + C if lane.closed else i + 1
    has = succ < n
    later = inf if lane.closed else arrival[jnp.minimum(succ, n - 1)]
    at_c = go & (jnp.arange(q.client_time.shape[0]) == c)
    q = q._replace(
        next_in_queue=q.next_in_queue.at[jnp.where(go & (tail >= 0), tail, n)].set(i, mode="drop"),
        tail=jnp.where(at_r, i, q.tail),
        arrival_s=q.arrival_s.at[at_i].set(t, mode="drop"),
        replica=q.replica.at[at_i].set(r, mode="drop"),
        queued=q.queued + at_r,
        in_system=q.in_system + at_r,
        client_next=jnp.where(at_c, jnp.where(has, succ, n), q.client_next),
        client_time=jnp.where(at_c, jnp.where(has, later, inf), q.client_time),
    )
    return st._replace(head=jnp.where(at_r & (tail < 0), i, st.head), routing=q)


def queue_of(lane: Lane, stream: Stream, st: LaneState) -> one.Queue:
    arrival = stream.arrival_s
    n = arrival.shape[0]
    if lane.contiguous:
        return one.Queue(
            arrival_s=lambda h: arrival[h],
            next=lambda h: h + 1,
            waiting=lambda h, t: (h < n) & (arrival[jnp.minimum(h, n - 1)] <= t),
        )
    q = st.routing
    return one.Queue(arrival_s=lambda h: q.arrival_s[h], next=lambda h: q.next_in_queue[h], waiting=lambda h, t: h >= 0)


class Taken(NamedTuple):
    """One replica's step as taken (before the lane's bookkeeping)."""

    replica: Any  # r
    go: Any  # the step is taken
    start: Any  # t
    end: Any
    tau: Any  # the step's time (0 for a wait without a step)
    idle: Any  # no work: a wait for the next KV release (holding lanes), else False
    release: Any  # ... that release's time (+inf: none)
    head: Any  # the replica's queue head after admission
    free: Any  # its free KV after admission
    admitted: Any  # requests in its slots after admission (paged: preempted ones waiting included)
    held: Any  # ... held (admitted and not preempted) after the step's preemptions
    admitted_now: Any  # requests admitted from the queue at this step
    before: Slots  # the slots after admission
    plan: one.Plan
    advanced: one.Advanced
    keep: Any  # slots that stay after the step (not done, or done and holding KV for a transfer)
    freed: Any  # KV given back at the step's end
    stuck: Any  # the step cannot make room for its tokens' KV (paged): stop, never spin


def take_step(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, go):
    """(taken, overflow) of the replica whose next step starts first: admit (after the KV of finished transfers
    is back), schedule the token budget, time the step, advance its requests. ``overflow``: the slot width
    stopped an admission, so the step is not taken (the state stays as before it, to go on wider)."""
    dt = stream.arrival_s.dtype
    n = stream.arrival_s.shape[0]
    inf = jnp.asarray(jnp.inf, dt)
    start = ready(lane, stream, st)
    r = jnp.argmin(start)
    t = start[r]
    holding = stream.hold_s is not None
    head, free, count = st.head[r], st.free_kv[r], st.admitted[r]
    rows = st.slots[0 if lane.replicas == 1 else r]
    if holding:
        rows, free, count = one.release_transferred(rows, count, free, t)
    count0 = count
    queue = queue_of(lane, stream, st)
    if params.prefix is None:
        head, free, count, rows, blocked = one.admit(params, stream, queue, rows, head, free, count, t, go)
    else:  # admitted one per lane iteration beforehand (admit_cached)
        blocked = jnp.zeros((), bool)
    held, stuck = count, jnp.zeros((), bool)
    alone = one.prefill_only(params, rows, count, holding)
    if params.paging is not None:  # each decoding request's next block, preempting where there is none
        rows, free, stuck = one.preempt(params, rows, count, free, t, alone)
        held = one.held_count(rows, count)
    sl = unpack(rows)
    overflow = go & blocked
    go = go & ~blocked
    plan = one.schedule(params, sl, count, holding, alone)
    tau = one.step_time(params, sl, plan)
    idle, release = jnp.zeros((), bool), inf
    if holding:  # nothing to run: wait, without a step, for the next release (the head may then fit)
        idle = ~jnp.any(plan.decode | plan.prefill)
        release = jnp.min(jnp.where(plan.occupied & ~plan.live, sl.release_s, inf))
        tau = jnp.where(idle, 0.0, tau)
        end = jnp.where(idle, jnp.maximum(t, release), t + tau)
    else:
        end = t + tau
    adv = one.advance(params, sl, plan, end, go)
    if params.prefix is not None:  # its prompt's full blocks belong to the cache once prefilled (rule 2)
        full = stream.prefix.full[jnp.clip(sl.request, 0, n - 1)].astype(dt)
        own = sl.held_kv - (full - sl.hit_tokens / params.prefix.block_tokens) * params.prefix.block_bytes
        adv = adv._replace(slots=adv.slots._replace(held_kv=jnp.where(adv.first, own, sl.held_kv)))
    done = adv.done
    keep = plan.occupied & ~done
    gives_back = done
    if holding:  # a completed prefill keeps its KV until its transfer ends
        hold = stream.hold_s[jnp.clip(sl.request, 0, n - 1)]
        stays = done & (hold > 0)
        keep = keep | stays
        gives_back = done & ~stays
        adv = adv._replace(slots=adv.slots._replace(release_s=jnp.where(stays, end + hold, sl.release_s)))
    freed = jnp.sum(jnp.where(gives_back, adv.slots.held_kv, jnp.zeros((), dt)))
    admitted_now = (count - count0).astype(jnp.int32)
    stuck = go & stuck
    go = go & ~stuck
    adv = adv._replace(done=adv.done & ~stuck)
    taken = Taken(
        r, go, t, end, tau, idle, release, head, free, count, held, admitted_now, sl, plan, adv, keep, freed, stuck
    )
    return taken, overflow


def complete(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, k: Taken) -> LaneState:
    """The step's completions written out (records, the step's inter-token gaps, a closed loop's next
    arrivals) and the replica's slots compacted."""
    n, dt = stream.arrival_s.shape[0], stream.arrival_s.dtype
    done, req, go = k.advanced.done, k.before.request, k.go
    st = st._replace(done=write_completions(st.done, k.advanced.slots, k.end, jnp.where(done, req, n)))
    if params.speculation is not None:  # each decode's Δ tokens of the step paced over its wait: Δ gaps of wait/Δ
        decode = go & k.plan.decode
        tokens = k.advanced.slots.decoded - k.before.decoded
        wait = k.tau if params.prefill_first is None else k.end - k.before.last_token_s
        at = jnp.where(decode & (tokens > 0), gap_bin(wait / jnp.maximum(tokens, 1.0)), GAP_BINS)
        st = st._replace(gaps=st.gaps.at[at].add(tokens, mode="drop"))
    elif params.prefill_first is None:
        # every decoding request's last token came at this step's start (a replica holding requests steps back to
        # back), so all d gaps of the step are τ
        st = st._replace(
            gaps=st.gaps.at[jnp.where(go, gap_bin(k.tau), GAP_BINS)].add(k.plan.decodes.astype(dt), mode="drop")
        )
    else:  # decodes may have waited out steps that ran prompt tokens alone: each gap from its own last token
        gap = gap_bin(k.end - k.before.last_token_s)
        at = jnp.where(go & k.plan.decode, gap, GAP_BINS)
        st = st._replace(gaps=st.gaps.at[at].add(jnp.ones(at.shape, dt), mode="drop"))
    if k.advanced.again is not None:  # a token after a prefill again: its gap runs from the token before it
        again = go & k.advanced.again
        gap = gap_bin(k.end - k.before.last_token_s)
        st = st._replace(gaps=st.gaps.at[jnp.where(again, gap, GAP_BINS)].add(jnp.ones((), dt), mode="drop"))
    if params.prefix is not None:
        events = prefix_cache.queue_events(
            st.cache, stream.prefix, k.replica, req, k.before.hit_tokens, k.advanced.first, done, params.prefix, go
        )
        st = st._replace(cache=events)
    if lane.closed:
        routing = st.routing
        owner = jnp.where(done, jnp.mod(req, lane.clients), lane.clients)
        freed_time = routing.client_time.at[owner].set(k.end, mode="drop")
        inf = jnp.asarray(jnp.inf, dt)
        st = st._replace(routing=routing._replace(client_time=jnp.where(routing.client_next < n, freed_time, inf)))
    packed = one.compact(pack(k.advanced.slots, dt, st.slots.shape[-1]), k.keep)
    # a select over the replicas, not a scatter at r: vmapped over lanes, XLA:CPU runs a scatter as a loop over
    # the lanes that copies the whole (lanes, R, S, F) operand each time (measured: a third of an iteration)
    at_r = go & (jnp.arange(lane.replicas) == k.replica)
    return st._replace(slots=jnp.where(at_r[:, None, None], packed[None], st.slots))


def account(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, k: Taken) -> LaneState:
    """The replica's queue, KV, clock and peaks after the step; the lane's step count and whether it stuck."""
    go, r, head = k.go, k.replica, k.head
    at_r = go & (jnp.arange(lane.replicas) == r)
    n_done = jnp.sum(k.advanced.done).astype(jnp.int32)
    arrived, routing = st.arrived, st.routing
    if lane.contiguous:
        got = pointer(st.arrived[0], stream.arrival_s, lambda a: a <= k.start)
        arrived = jnp.where(go, got, st.arrived)
        qlen = got - head
    else:
        routing = routing._replace(
            tail=jnp.where(at_r & (head < 0), -1, routing.tail),
            queued=routing.queued - jnp.where(at_r, k.admitted_now, 0),
        )
        qlen = routing.queued[r]
        routing = routing._replace(
            in_system=routing.in_system - jnp.where(at_r, n_done, 0),
            last_done=jnp.where(at_r, n_done, routing.last_done),
        )
    if stream.hold_s is not None:
        steps = st.steps + (go & ~k.idle)
        stuck = st.stuck | (go & k.idle & ~jnp.isfinite(k.release)) | k.stuck
    else:
        steps = st.steps + go
        stuck = st.stuck | (go & (k.held == 0)) | k.stuck
    if params.paging is None:
        in_use = params.pool_bytes - k.free
    else:  # preempted requests wait too
        in_use = (params.paging.pool_units - k.free) * params.paging.unit_bytes
        qlen = qlen + (k.admitted - k.held)
    return st._replace(
        head=jnp.where(at_r, head, st.head),
        arrived=arrived,
        routing=routing,
        queue_peak=jnp.where(at_r, jnp.maximum(st.queue_peak, qlen), st.queue_peak),
        kv_peak_bytes=jnp.where(at_r, jnp.maximum(st.kv_peak_bytes, in_use), st.kv_peak_bytes),
        held_peak=jnp.where(at_r, jnp.maximum(st.held_peak, k.held), st.held_peak),
        free_kv=jnp.where(at_r, k.free + k.freed, st.free_kv),
        admitted=jnp.where(at_r, jnp.sum(k.keep).astype(jnp.int32), st.admitted),
        clock=jnp.where(at_r, k.end, st.clock),
        busy_s=jnp.where(at_r, st.busy_s + k.tau, st.busy_s),
        steps=steps,
        stuck=stuck,
    )


def step(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, go) -> LaneState:
    """One engine step of the replica whose next step starts first, where ``go``; a no-op elsewhere."""
    taken, overflow = take_step(lane, params, stream, st, go)
    st = account(lane, params, stream, complete(lane, params, stream, st, taken), taken)
    st = st._replace(overflow=st.overflow | overflow)
    if lane.stopping:
        st = st._replace(stop=count_late(params, stream, st.stop, taken))
    return st


def count_late(params: LaneParams, stream: Stream, c: StopCounts, k: Taken) -> StopCounts:
    """The lane's requests certain to miss a TTFT SLO (first token late, or none yet with the SLO already past
    at the step's end) and completed requests over a TPOT SLO, with a relative margin of :data:`STOP_MARGIN` so
    that rounding cannot count one the host would not."""
    margin = 1.0 + STOP_MARGIN
    late_slo = params.stop.ttft_slo_s * margin
    sl, adv, keep, head, end, go = k.before, k.advanced, k.keep, k.head, k.end, k.go
    arr = sl.arrival_s
    first, done = adv.first, adv.done
    j_new, t_first, o_len = adv.slots.decoded, adv.slots.first_token_s, sl.output_len
    late_first = jnp.sum(first & ((end - arr) > late_slo)).astype(jnp.int32)
    # admitted with no first token yet: it comes at a later step's end, after this one's
    waiting_late = jnp.sum(keep & ~first & (j_new == 0) & ((end - arr) > late_slo)).astype(jnp.int32)
    late_ptr = pointer(c.late_ptr, stream.arrival_s, lambda a: (end - a) > late_slo)
    queued_late = jnp.maximum(late_ptr - head, 0)  # not admitted, SLO past at this end
    ttft_first = c.ttft_first + jnp.where(go, late_first, 0)
    tpot = ((end - arr) - (t_first - arr)) / jnp.maximum(o_len - 1.0, 1.0)  # as request_times has it
    slow = done & (o_len > 1.0) & (tpot > params.stop.itl_slo_s * margin)
    return c._replace(
        ttft_first=ttft_first,
        late_ptr=jnp.where(go, late_ptr, c.late_ptr),
        ttft_late=jnp.where(go, ttft_first + waiting_late + queued_late, c.ttft_late),
        tpot_late=c.tpot_late + jnp.sum(slow).astype(jnp.int32),
    )


def coast(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, go, head_cost=None) -> LaneState:
    """Up to :data:`COAST_STEPS` decode-only steps at once where ``go`` and nothing else can happen in them: every
    held request decoding, none completing, no admission (the queue head not yet arrived at a step's start, or
    held back by the batch limit or the pool, which decode steps do not change). Each step's τ from the same
    terms as :func:`step`'s, its start the previous one's end (the same additions as one step at a time); the
    step after them is an ordinary one, so queue peaks and late counts are taken there."""
    arrival = stream.arrival_s
    dt, n = arrival.dtype, arrival.shape[0]
    inf = jnp.asarray(jnp.inf, dt)
    sl, count, head, free = unpack(st.slots[0]), st.admitted[0], st.head[0], st.free_kv[0]
    occ = jnp.arange(lane.slots, dtype=jnp.int32) < count
    j, o_len = sl.decoded, sl.output_len
    target = sl.input_len if params.paging is None else sl.input_len + sl.recompute
    dec = occ & (sl.prefilled >= target)
    d = jnp.sum(dec)
    ahead = jnp.arange(COAST_STEPS, dtype=dt)
    spec = params.speculation is not None
    through = one.coast_emitted(params, sl, dec, COAST_STEPS + 1)  # (slots, steps + 1): tokens before each step
    before, after = through[:, :-1], through[:, 1:]
    tau = one.coast_times(params, sl, dec, COAST_STEPS, before)
    ends, t = [], st.clock[0]
    for k in range(COAST_STEPS):  # sequential, as the steps add up one at a time
        t = t + tau[k]
        ends.append(t)
    ends = jnp.stack(ends)
    starts = jnp.concatenate([st.clock[:1], ends[:-1]])
    pg = params.paging
    held = count
    if pg is None:
        at = jnp.clip(head, 0, n - 1)
        if params.prefix is None:
            fits = params.footprint_bytes[at] <= free
        else:
            fits = head_cost.fits  # what admitting the head takes (a stretch changes neither the cache nor the pool)
        fits = (head < n) & (count < params.batch) & fits
        head_t = jnp.where(fits, arrival[jnp.minimum(head, n - 1)], inf)
    else:  # paged: no step may need more blocks than are free (no preemption in a stretch); the first waiting
        # request is a preempted one (there now: a stretch only while it cannot be admitted) or the queue head
        held = jnp.sum(occ & (sl.parked == 0)).astype(count.dtype)
        at = jnp.minimum(held, lane.slots - 1)
        parked = held < count
        tokens = jnp.where(parked, sl.input_len[at] + sl.recompute[at], stream.input_len[jnp.clip(head, 0, n - 1)])
        fits = (parked | (head < n)) & (held < params.batch) & (pg.units(tokens) + pg.watermark_units <= free)
        head_t = jnp.where(fits, jnp.where(parked, -inf, arrival[jnp.minimum(head, n - 1)]), inf)
        context = (sl.input_len + j)[:, None] + before  # (slots, steps): each decode's context at each step
        held_after = jnp.where(dec[:, None], pg.units(context), sl.held_kv[:, None])
        grown = jnp.sum(jnp.where(dec[:, None], held_after - sl.held_kv[:, None], 0.0), axis=0)  # (steps,)
    if spec:  # no request completes within a step of the stretch
        short = jnp.all(jnp.where(dec[:, None], j[:, None] + after < o_len[:, None], True), axis=0)
    else:
        left = jnp.min(jnp.where(dec, o_len - j, inf))  # tokens to the first completion
        short = ahead < left - 1.0
    ok = go & (held > 0) & (d == held) & short & (starts < head_t)
    if pg is not None:
        ok = ok & (grown <= free)
    tracked = pg is not None or params.prefill_first is not None  # lanes that keep each request's last token
    if params.prefill_first is not None:  # every gap of the stretch is a step's τ: each decode's last token now
        ok = ok & jnp.all(jnp.where(dec, sl.last_token_s == st.clock[0], True))
    take = jnp.cumprod(ok.astype(jnp.int32)).astype(bool)
    k = jnp.sum(take).astype(jnp.int32)
    zero = jnp.zeros((), dt)
    if spec:
        emitted = jnp.where(k > 0, after[:, jnp.maximum(k - 1, 0)], 0.0)
        slots = st.slots.at[0, :, SLOT_COLUMN["decoded"]].set(jnp.where(dec, j + emitted, j))
        slots = slots.at[0, :, SLOT_COLUMN["verified"]].set(jnp.where(dec, sl.verified + k.astype(dt), sl.verified))
    else:
        slots = st.slots.at[0, :, SLOT_COLUMN["decoded"]].set(jnp.where(dec, j + k.astype(dt), j))
    if tracked:
        last = jnp.where(k > 0, ends[jnp.maximum(k - 1, 0)], st.clock[0])
        slots = slots.at[0, :, SLOT_COLUMN["last_token_s"]].set(jnp.where(dec & (k > 0), last, sl.last_token_s))
    free_kv, kv_peak = st.free_kv, st.kv_peak_bytes
    if pg is not None:  # the blocks the stretch's tokens took (the most held at once: after its last step)
        last = jnp.maximum(k - 1, 0)
        slots = slots.at[0, :, SLOT_COLUMN["held_kv"]].set(jnp.where(k > 0, held_after[:, last], sl.held_kv))
        free_kv = free_kv.at[0].add(-jnp.where(k > 0, grown[last], zero))
        kv_peak = jnp.maximum(kv_peak, (pg.pool_units - free_kv) * pg.unit_bytes)
    return st._replace(
        slots=slots,
        free_kv=free_kv,
        kv_peak_bytes=kv_peak,
        clock=jnp.where(k > 0, ends[jnp.maximum(k - 1, 0)], st.clock),
        busy_s=st.busy_s.at[0].add(jnp.sum(jnp.where(take, tau, zero))),
        gaps=coast_gaps(st.gaps, take, tau, d, dec, *((after - before, params.speculation.acceptance) if spec else ())),
        steps=st.steps + k,
    )


def coast_gaps(gaps, take, tau, d, decode, tokens=None, acceptance=None):
    """A stretch's gaps added to the histogram: d of τ per step taken, or where the lane speculates each decode's
    ``tokens`` (slots, steps) of τ/Δ (docs/speculative.md). A step's Δ is ⌊a⌋ or ⌊a⌋ + 1 for every request (no cap
    applies in a stretch), so each step adds two bins, not one per request."""
    if tokens is None:
        return gaps.at[jnp.where(take, gap_bin(tau), GAP_BINS)].add(d.astype(gaps.dtype), mode="drop")
    low = jnp.floor(acceptance)
    zero = jnp.zeros((), gaps.dtype)
    for delta in (low, low + 1.0):
        count = jnp.sum(jnp.where(decode[:, None] & (tokens == delta), tokens, zero), axis=0)  # (steps,)
        at = jnp.where(take & (count > 0), gap_bin(tau / delta), GAP_BINS)
        gaps = gaps.at[at].add(count, mode="drop")
    return gaps


def cache_admission(params: LaneParams, stream: Stream, cache, r, i, free) -> prefix_cache.Admission:
    """What admitting request i at replica r would take with its prefix cache (rule 1)."""
    return prefix_cache.admission(
        cache, stream.prefix, params.prefix, r, i, stream.input_len[i], params.footprint_bytes[i], free
    )


class NextAdmission(NamedTuple):
    """The admission a cached lane would make next: the replica whose next step starts first (r, at t) and its queue
    head i, with what admitting it takes (rule 1)."""

    replica: Any
    start: Any
    request: Any
    cost: prefix_cache.Admission
    go: Any  # it is admitted (the batch limit, the pool and its cache allow, and a slot is free)
    blocked: Any  # ... but for the slot width: rerun wider


def next_admission(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, go, cost=None) -> NextAdmission:
    """``cost``: what admitting the queue head takes, where known (it depends on the cache, the pool and the head)."""
    n = stream.arrival_s.shape[0]
    start = ready(lane, stream, st)
    r = jnp.argmin(start)
    t = start[r]
    head, count = st.head[r], st.admitted[r]
    i = jnp.clip(head, 0, n - 1)
    a = cache_admission(params, stream, st.cache, r, i, st.free_kv[r]) if cost is None else cost
    can = go & queue_of(lane, stream, st).waiting(head, t) & (count < params.batch) & a.fits
    blocked = can & (count >= lane.slots)
    return NextAdmission(r, t, i, a, can & ~blocked, blocked)


def admit_cached(lane: Lane, params: LaneParams, stream: Stream, st: LaneState, nxt: NextAdmission) -> LaneState:
    """The state after ``nxt`` where it goes: one admission per lane iteration, so the cache's tables are never
    carried through an inner loop (which, vmapped over lanes, would copy them at every turn)."""
    r, t, i, a, go = nxt.replica, nxt.start, nxt.request, nxt.cost, nxt.go
    queue = queue_of(lane, stream, st)
    count = st.admitted[r]
    cache, free = prefix_cache.admit(st.cache, stream.prefix, params.prefix, r, i, a, st.free_kv[r], go)
    hit_tokens = (a.hits * params.prefix.block_tokens).astype(free.dtype)
    row = pack(one.new_row(stream, queue, i, a.need, t, hit_tokens), st.slots.dtype, st.slots.shape[-1])
    at_r = go & (jnp.arange(lane.replicas) == r)
    at_slot = at_r[:, None] & (jnp.arange(lane.slots) == count)[None, :]
    after = queue.next(i)
    routing = st.routing
    if not lane.contiguous:
        routing = routing._replace(queued=routing.queued - at_r, tail=jnp.where(at_r & (after < 0), -1, routing.tail))
    return st._replace(
        slots=jnp.where(at_slot[..., None], row, st.slots),
        head=jnp.where(at_r, after, st.head),
        admitted=st.admitted + at_r,
        free_kv=jnp.where(at_r, free, st.free_kv),
        clock=jnp.where(at_r, t, st.clock),  # its step starts at t
        routing=routing,
        cache=cache,
    )


def body(lane: Lane, params: LaneParams, stream: Stream, st: LaneState) -> LaneState:
    live = active(lane, stream, st)
    if params.prefix is None:
        if lane.contiguous:
            return step(lane, params, stream, coast(lane, params, stream, st, live), live)
        soonest = jnp.min(ready(lane, stream, st))
        t, _ = next_arrival(stream, st.routing)
        arriving = live & jnp.isfinite(t) & (t <= soonest)
        st = route(lane, params, stream, st, arriving)
        return step(lane, params, stream, st, live & ~arriving)
    # a prefix cache: the last step's cache events first (its end is one instant), one per iteration; once they are
    # applied, one admission; the step too where no other admission may come first
    applying = live & prefix_cache.pending(st.cache)
    r = st.cache.events.replica
    got, free = prefix_cache.apply_event(st.cache, stream.prefix, params.prefix, st.free_kv[r], applying)
    st = st._replace(cache=got, free_kv=jnp.where(jnp.arange(lane.replicas) == r, free, st.free_kv))
    live = live & active(lane, stream, st) & ~prefix_cache.pending(st.cache)  # work left once they are applied
    if lane.contiguous:
        head = jnp.clip(st.head[0], 0, stream.arrival_s.shape[0] - 1)
        cost = cache_admission(params, stream, st.cache, 0, head, st.free_kv[0])
        st = coast(lane, params, stream, st, live, cost)
        nxt = next_admission(lane, params, stream, st, live, cost)
    else:
        soonest = jnp.min(ready(lane, stream, st))
        t, _ = next_arrival(stream, st.routing)
        arriving = live & jnp.isfinite(t) & (t <= soonest)
        st = route(lane, params, stream, st, arriving)
        live = live & ~arriving
        nxt = next_admission(lane, params, stream, st, live)
    st = admit_cached(lane, params, stream, st, nxt)
    # an admission's replica keeps its start, and every arrival due by then was routed: only another admission may
    # come before its step
    again = next_admission(lane, params, stream, st, nxt.go)
    st = st._replace(overflow=st.overflow | nxt.blocked | again.blocked)
    return step(lane, params, stream, st, live & ~nxt.blocked & ~again.go & ~again.blocked)


STATIC = ("replicas", "slots", "clients", "closed", "router", "shared_stream", "log", "events")


def _lane(params, *, replicas, slots, clients, closed, router, log=0, events=0) -> Lane:
    stopping = "job" in params
    return Lane(replicas, slots, clients, closed, router, stopping, log, events)


def _axes(shared_stream):
    return (0, None if shared_stream else 0)


def _init(params, stream, *, shared_stream, **static):
    lane = _lane(params, **static)
    return jax.vmap(functools.partial(init, lane), in_axes=_axes(shared_stream))(
        LaneParams.of(params), Stream.of(stream)
    )


def _advance(params, stream, state, outside, min_live, *, shared_stream, **static):
    """Steps every lane until at most ``min_live`` lanes are live; (state, live). A stopping run stops every lane
    of a job once the late counts of its lanes here plus ``outside`` (its lanes elsewhere, as last known: a
    lower bound, counts only grow) reach the job's allowance (the count past which its quantile misses)."""
    lane = _lane(params, **static)
    params, stream = LaneParams.of(params), Stream.of(stream)
    axes = _axes(shared_stream)
    live = jax.vmap(lambda s, st: active(lane, s, st), in_axes=(axes[1], 0))
    advance = jax.vmap(functools.partial(body, lane), in_axes=(*axes, 0))

    def stop(st):
        if not lane.stopping:
            return st
        job = params.stop.job
        lanes = job.shape[0]

        def total(x):
            return jax.ops.segment_sum(x, job, num_segments=lanes)[job]

        c = st.stop
        late = (total(c.ttft_late) + outside["ttft"] >= params.stop.ttft_allowed) | (
            total(c.tpot_late) + outside["tpot"] >= params.stop.tpot_allowed
        )
        return st._replace(stop=c._replace(stopped=c.stopped | late))

    state = jax.lax.while_loop(
        lambda st: jnp.sum(live(stream, st)) > min_live, lambda st: stop(advance(params, stream, st)), stop(state)
    )
    return state, live(stream, state)


init_lanes = jax.jit(_init, static_argnames=STATIC)
advance_lanes = jax.jit(_advance, static_argnames=STATIC)


@functools.partial(jax.jit, static_argnames=STATIC)
def run_lanes(
    params,
    stream,
    *,
    replicas,
    slots,
    clients=1,
    closed=False,
    router="round_robin",
    shared_stream=True,
    log=0,
    events=0,
):
    """§9 over lanes, to the end, at one slot width: every leaf of ``params`` has a leading lane axis;
    ``stream``'s leaves are (N,) shared by every lane (``shared_stream``) or (lanes, N). Returns the records
    (:data:`slimjax.engine.sim.outputs.RECORDS`) with a leading lane axis."""
    static = dict(replicas=replicas, slots=slots, clients=clients, closed=closed, router=router, log=log, events=events)
    state = _init(params, stream, shared_stream=shared_stream, **static)
    lanes = params["batch"].shape[0]
    outside = {"ttft": jnp.zeros(lanes, jnp.int32), "tpot": jnp.zeros(lanes, jnp.int32)}
    state, _ = _advance(params, stream, state, outside, 0, shared_stream=shared_stream, **static)
    arrival = jnp.broadcast_to(stream["arrival_s"], state.done.shape[:-1])
    return records(arrival, state, replicas == 1 and not closed)
