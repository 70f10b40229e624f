"""Trace-driven continuous batching (MODEL.md §9) as one jitted ``lax.while_loop`` over engine steps.

A *lane* is R replicas (static) serving one request stream; lanes are vmapped (candidates × replicas ×
streams) inside the loop, so nothing loops in Python per step or per request, and the loop carries every lane
at once (a vmapped while loop would select every carried array, per-request ones included, on every step).
Each iteration either routes the earliest arrival due before the next step (``round_robin``: request i to
replica i mod R; ``least_loaded``: fewest admitted + waiting at the arrival instant, ties to the lowest index)
or runs one step of the replica whose next step starts first. A lane of one replica on an open stream needs no
routing: its queue is the stream from the next request to admit. Replica state lives in fixed-size slot rows
kept in admission order (a completed request's row is compacted away), so a step's token budget goes to
prefilling requests in admission order by one cumsum. Other lanes' FCFS queues are linked lists through the
requests (head, tail, next), so routing and admission are O(1) each.

Streams: open (arrival times known; padding requests arrive at +inf and are never routed) or closed loop
(C clients; request i belongs to client i mod C and its successor i + C arrives when it completes).

A one-replica open-stream lane takes a decode-only stretch (every held request decoding, none completing, no
admission possible) as up to ``_COAST_STEPS`` steps in one iteration: each step's τ from the same terms, its start
the previous one's end, so the results are those of one step at a time (to the order of a sum).

Per request the loop records arrival, admission, first-token and completion times (written once, at
completion) and its replica; per replica its busy time, peak queue (requests still waiting after a step's
admission) and peak KV in use; per lane a histogram of every inter-token gap (log bins, for the token-gap
quantile), the step count, and whether the slot width stopped an admission (``overflow``: run it wider).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ..constants import ROUTERS
from ..model import batching
from ..model.pipeline import engine_batch_limit

GAP_BINS = 2048  # log-spaced inter-token gap bins from GAP_RANGE_S[0] to [1]: 1.1 % wide
GAP_RANGE_S = (1e-6, 1e4)


def gap_edges():
    """The histogram's bin edges, seconds (GAP_BINS + 1 of them; host side)."""
    lo, hi = GAP_RANGE_S
    return np.logspace(np.log10(lo), np.log10(hi), GAP_BINS + 1)


def _gap_bin(gap):
    lo, hi = GAP_RANGE_S
    x = (jnp.log(jnp.maximum(gap, lo)) - jnp.log(lo)) / (jnp.log(hi) - jnp.log(lo)) * GAP_BINS
    return jnp.clip(jnp.floor(x), 0, GAP_BINS - 1).astype(jnp.int32)


# slot fields, one float row per admitted request (compacted in admission order)
_REQ, _P, _J, _IN, _OUT, _FP, _ADMIT, _FIRST, _ARR, _REL = range(10)
_FIELDS = 10  # _REL: when a completed request's KV is released (disaggregated prefill: its transfer's end)


_WINDOW = 8  # arrivals a pointer moves over per pass (a pass more while all of them qualify)


def _lane_fns(*, replicas: int, slots: int, clients: int, closed: bool, router: str, stopping: bool = False):
    """(init, active, body) of one lane, each a function of (params, stream[, state]); the while loop over steps
    lives outside the vmap over lanes (:func:`run_lanes`), so a step writes the per-request arrays only where it
    completes requests (a vmapped while loop would select every carried array, per-request ones included, on
    every iteration).

    ``contiguous`` lanes (one replica on an open stream) need no routing: the queue is the stream itself, from
    ``head`` (the next request to admit) to the last arrival due; others route one arrival per iteration
    through per-replica linked lists.

    A step the slot width would stop an admission in is not taken: the lane stops with ``overflow`` set and its
    state as before that step, so widening its slot rows (empty rows appended) and going on is a run as wide as
    B from the start.

    ``stopping`` (contiguous lanes; :func:`advance_lanes`): each step also counts the lane's requests certain to
    miss a TTFT SLO (first token late, or none yet with the SLO already past at the step's end) and completed
    requests over a TPOT SLO, with a relative margin of ``_STOP_MARGIN`` so that rounding cannot count one the
    host would not."""
    R, S, C = replicas, slots, clients
    contiguous = R == 1 and not closed
    if stopping and not contiguous:
        raise ValueError("stopping counts need contiguous lanes (one replica on an open stream)")

    def init(params, stream):
        arrival = stream["arrival_s"]
        dt, n = arrival.dtype, arrival.shape[0]
        inf = jnp.asarray(jnp.inf, dt)
        if closed:
            first = jnp.arange(C, dtype=jnp.int32)
            client_next = jnp.where(first < n, first, n)
            client_time = jnp.where(first < n, 0.0, inf).astype(dt)
        else:
            client_next = jnp.zeros(1, jnp.int32)
            client_time = arrival[:1]
        empty = jnp.zeros((S, _FIELDS), dt).at[:, _REQ].set(-1.0)
        st = dict(
            records=jnp.full((n, 4), jnp.nan, dt),  # arrival, admission, first token, end: written at completion
            head=jnp.zeros(R, jnp.int32) if contiguous else jnp.full(R, -1, jnp.int32),
            clock=jnp.zeros(R, dt),
            busy=jnp.zeros(R, dt),
            free=jnp.full(R, params["pool"], dt),
            admitted=jnp.zeros(R, jnp.int32),
            slots=jnp.broadcast_to(empty, (R, S, _FIELDS)),
            queue_peak=jnp.zeros(R, jnp.int32),
            held_peak=jnp.zeros(R, jnp.int32),
            kv_peak=jnp.zeros(R, dt),
            gaps=jnp.zeros(GAP_BINS, dt),
            steps=jnp.zeros((), jnp.int32),
            stuck=jnp.zeros((), bool),  # an empty replica whose queue head does not fit its pool: stop, never spin
            overflow=jnp.zeros((), bool),
        )
        if contiguous:
            st["arrived"] = jnp.zeros(R, jnp.int32)  # requests arrived by the replica's last step start
        if stopping:
            st.update(
                late_ptr=jnp.zeros((), jnp.int32),  # requests whose TTFT SLO passed by the last step's end
                ttft_first=jnp.zeros((), jnp.int32),  # first tokens over the TTFT SLO
                ttft_late=jnp.zeros((), jnp.int32),  # requests certain to miss it, as of the last step
                tpot_late=jnp.zeros((), jnp.int32),  # completed requests over the TPOT SLO
                stopped=jnp.zeros((), bool),
            )
        if not contiguous:
            st.update(
                t_arr=jnp.full(n, inf, dt),
                route=jnp.full(n, -1, jnp.int32),
                nextq=jnp.full(n, -1, jnp.int32),
                client_next=client_next,
                client_time=client_time,
                tail=jnp.full(R, -1, jnp.int32),
                qlen=jnp.zeros(R, jnp.int32),
                in_system=jnp.zeros(R, jnp.int32),
                last_done=jnp.zeros(R, jnp.int32),
            )
        return st

    def ready(stream, st):
        """Each replica's next step start: its clock while it holds requests, else its queue head's arrival
        (not before its clock); +inf when it has nothing to do."""
        arrival = stream["arrival_s"]
        n = arrival.shape[0]
        inf = jnp.asarray(jnp.inf, arrival.dtype)
        if contiguous:
            head_t = jnp.where(st["head"] < n, arrival[jnp.minimum(st["head"], n - 1)], inf)
        else:
            head_t = jnp.where(st["head"] >= 0, st["t_arr"][jnp.maximum(st["head"], 0)], inf)
        held = st["admitted"] > 0
        if "hold_s" in stream:  # rows whose KV waits for its transfer hold no work
            rows = st["slots"]
            occ = jnp.arange(rows.shape[1])[None, :] < st["admitted"][:, None]
            held = jnp.any(occ & (rows[..., _J] < rows[..., _OUT]), axis=-1)
        return jnp.where(held, st["clock"], jnp.maximum(st["clock"], head_t))

    def next_arrival(stream, st):
        """(time, client) of the earliest pending arrival, ties to the lower request index."""
        n = stream["arrival_s"].shape[0]
        t = jnp.min(st["client_time"])
        c = jnp.argmin(jnp.where(st["client_time"] == t, st["client_next"], n + 1))
        return t, c

    def active(params, stream, st):
        busy = jnp.isfinite(jnp.min(ready(stream, st)))
        if not contiguous:
            busy = busy | jnp.isfinite(next_arrival(stream, st)[0])
        busy = busy & ~st["stuck"] & ~st["overflow"]
        return busy & ~st["stopped"] if stopping else busy

    def route(stream, st, go):
        """Route the earliest pending arrival where ``go``; a no-op elsewhere."""
        arrival = stream["arrival_s"]
        n = arrival.shape[0]
        inf = jnp.asarray(jnp.inf, arrival.dtype)
        t, c = next_arrival(stream, st)
        i = st["client_next"][c]
        if router == "round_robin":
            r = jnp.mod(i, R).astype(jnp.int32)
        else:  # fewest admitted + waiting at t: the last step's completions count until its end
            load = st["in_system"] + jnp.where(st["clock"] > t, st["last_done"], 0)
            r = jnp.argmin(load).astype(jnp.int32)
        tail = st["tail"][r]
        at_r = go & (jnp.arange(R) == r)
        at_i = jnp.where(go, i, n)
        st = dict(st)
        st["nextq"] = st["nextq"].at[jnp.where(go & (tail >= 0), tail, n)].set(i, mode="drop")
        st["head"] = jnp.where(at_r & (tail < 0), i, st["head"])
        st["tail"] = jnp.where(at_r, i, st["tail"])
        st["t_arr"] = st["t_arr"].at[at_i].set(t, mode="drop")
        st["route"] = st["route"].at[at_i].set(r, mode="drop")
        st["qlen"] = st["qlen"] + at_r
        st["in_system"] = st["in_system"] + at_r
        succ = i + C if closed else i + 1
        has = succ < n
        later = inf if closed else arrival[jnp.minimum(succ, n - 1)]
        at_c = go & (jnp.arange(st["client_time"].shape[0]) == c)
        st["client_next"] = jnp.where(at_c, jnp.where(has, succ, n), st["client_next"])
        st["client_time"] = jnp.where(at_c, jnp.where(has, later, inf), st["client_time"])
        return st

    def step(params, stream, st, go):
        """One engine step of the replica whose next step starts first, where ``go``; a no-op elsewhere."""
        arrival, in_len, out_len = stream["arrival_s"], stream["input_len"], stream["output_len"]
        footprint = params["footprint"]  # footprint(I + O) of each request on this lane's candidate (§3)
        dt, n = arrival.dtype, arrival.shape[0]
        inf = jnp.asarray(jnp.inf, dt)
        roof = params["roof"]
        chunk = jnp.where(params["chunk_size"] > 0, params["chunk_size"], inf)
        batch = params["batch"]
        start = ready(stream, st)
        r = jnp.argmin(start)
        t = start[r]
        arr_of = (lambda h: arrival[h]) if contiguous else (lambda h: st["t_arr"][h])  # noqa: E731
        next_of = (lambda h: h + 1) if contiguous else (lambda h: st["nextq"][h])  # noqa: E731

        def waiting(h):
            if contiguous:
                return (h < n) & (arrival[jnp.minimum(h, n - 1)] <= t)
            return h >= 0

        def can_admit(carry):
            head, free, count, _ = carry
            fp = footprint[jnp.clip(head, 0, n - 1)]
            return go & (count < batch) & (count < S) & waiting(head) & (fp <= free)

        def admit(carry):
            head, free, count, sl = carry
            ready_made = stream["prefilled"][head] if "prefilled" in stream else 0.0  # its prompt prefilled elsewhere
            row = jnp.stack(
                [
                    head.astype(dt),
                    ready_made * in_len[head],
                    ready_made,
                    in_len[head],
                    out_len[head],
                    footprint[head],
                    t,
                    jnp.nan,
                    arr_of(head),
                    inf,
                ]
            )
            return next_of(head), free - footprint[head], count + 1, sl.at[count].set(row.astype(dt))

        head0, free0, count0 = st["head"][r], st["free"][r], st["admitted"][r]
        sl0 = st["slots"][r]
        holding = "hold_s" in stream
        if holding:  # KV whose transfer ended by t is free before admission (§10)
            occ0 = jnp.arange(S, dtype=jnp.int32) < count0
            gone = occ0 & (sl0[:, _J] >= sl0[:, _OUT]) & (sl0[:, _REL] <= t)
            free0 = free0 + jnp.sum(jnp.where(gone, sl0[:, _FP], 0.0))
            stay = occ0 & ~gone
            to = jnp.where(stay, jnp.cumsum(stay) - 1, S)
            sl0 = jnp.zeros_like(sl0).at[:, _REQ].set(-1.0).at[to].set(sl0, mode="drop")
            count0 = jnp.sum(stay).astype(count0.dtype)
        head, free, count, sl = jax.lax.while_loop(can_admit, admit, (head0, free0, count0, sl0))
        # the slot arrays, not the batch limit, stopped an admission: this lane's results are void (rerun wider)
        blocked = (count == S) & (count < batch) & waiting(head) & (footprint[jnp.clip(head, 0, n - 1)] <= free)
        stop_wide = go & blocked
        go = go & ~blocked  # the step is not taken: the state stays as before it, to go on wider
        pos = jnp.arange(S, dtype=jnp.int32)
        occ = pos < count
        p, j, i_len, o_len = sl[:, _P], sl[:, _J], sl[:, _IN], sl[:, _OUT]
        live = occ & (j < o_len) if holding else occ  # (a held row's KV only waits for its transfer)
        dec = live & (p >= i_len)
        pre = live & (p < i_len)
        context = i_len + j
        d = jnp.sum(dec)
        budget = jnp.maximum(params["step_tokens"] - d, 0.0)
        need = jnp.where(pre, jnp.minimum(i_len - p, chunk), 0.0)
        before = jnp.cumsum(need) - need
        new = jnp.where(pre, jnp.clip(budget - before, 0.0, need), 0.0)
        chunked = new > 0
        zero = jnp.zeros((), dt)
        tau = batching.step_time(
            d + jnp.sum(new),
            jnp.sum(jnp.where(dec, context, zero)),
            jnp.sum(jnp.where(dec, batching.context_kv_bytes(context, roof), zero)),
            jnp.sum(jnp.where(chunked, batching.chunk_attention_tokens(new, p), zero)),
            jnp.sum(jnp.where(chunked, batching.context_kv_bytes(p, roof), zero)),
            roof,
            params["a_pre"],
            params["a_dec"],
            params["step_overhead_s"],
        )
        if holding:  # nothing to run: wait, without a step, for the next release (the head may then fit)
            idle = ~jnp.any(dec | pre)
            release = jnp.min(jnp.where(occ & ~live, sl[:, _REL], inf))
            tau = jnp.where(idle, 0.0, tau)
            end = jnp.where(idle, jnp.maximum(t, release), t + tau)
        else:
            end = t + tau
        p_new = p + new
        first = chunked & (p_new >= i_len)
        j_new = jnp.where(dec, j + 1.0, jnp.where(first, 1.0, j))
        t_first = jnp.where(first, end, sl[:, _FIRST])
        done = go & (dec | first) & (j_new >= o_len)
        keep = occ & ~done
        if holding:  # a completed prefill keeps its KV until its transfer ends
            hold = stream["hold_s"][jnp.clip(sl[:, _REQ].astype(jnp.int32), 0, n - 1)]
            stays = done & (hold > 0)
            keep = keep | stays
            release_at = jnp.where(stays, end + hold, sl[:, _REL])
        req = sl[:, _REQ].astype(jnp.int32)
        rows = jnp.stack([sl[:, _ARR], sl[:, _ADMIT], t_first, jnp.broadcast_to(end, (S,))], axis=-1)

        st = dict(st)
        st["records"] = st["records"].at[jnp.where(done, req, n)].set(rows, mode="drop")
        # every decoding request's last token came at this step's start (a replica holding requests steps back to
        # back), so all d gaps of the step are τ
        st["gaps"] = st["gaps"].at[jnp.where(go, _gap_bin(tau), GAP_BINS)].add(d.astype(dt), mode="drop")
        if closed:
            owner = jnp.where(done, jnp.mod(req, C), C)
            freed_time = st["client_time"].at[owner].set(end, mode="drop")
            st["client_time"] = jnp.where(st["client_next"] < n, freed_time, inf)
        n_done = jnp.sum(done).astype(jnp.int32)
        dest = jnp.where(keep, jnp.cumsum(keep) - 1, S)
        fields = sl.at[:, _P].set(p_new).at[:, _J].set(j_new).at[:, _FIRST].set(t_first)
        if holding:
            fields = fields.at[:, _REL].set(release_at)
        packed = jnp.zeros_like(fields).at[:, _REQ].set(-1.0).at[dest].set(fields, mode="drop")
        at_r = go & (jnp.arange(R) == r)
        st["slots"] = st["slots"].at[r].set(jnp.where(go, packed, st["slots"][r]))
        st["head"] = jnp.where(at_r, head, st["head"])
        admitted_now = (count - count0).astype(jnp.int32)
        if contiguous:
            arrived = _pointer(st["arrived"][0], arrival, lambda a: a <= t)
            st["arrived"] = jnp.where(go, arrived, st["arrived"])
            qlen = arrived - head
        else:
            st["tail"] = jnp.where(at_r & (head < 0), -1, st["tail"])
            st["qlen"] = st["qlen"] - jnp.where(at_r, admitted_now, 0)
            qlen = st["qlen"][r]
            st["in_system"] = st["in_system"] - jnp.where(at_r, n_done, 0)
            st["last_done"] = jnp.where(at_r, n_done, st["last_done"])
        st["queue_peak"] = jnp.where(at_r, jnp.maximum(st["queue_peak"], qlen), st["queue_peak"])
        st["kv_peak"] = jnp.where(at_r, jnp.maximum(st["kv_peak"], params["pool"] - free), st["kv_peak"])
        st["held_peak"] = jnp.where(at_r, jnp.maximum(st["held_peak"], count), st["held_peak"])
        freed = jnp.sum(jnp.where(done & ~stays if holding else done, sl[:, _FP], zero))
        st["free"] = jnp.where(at_r, free + freed, st["free"])
        st["admitted"] = jnp.where(at_r, jnp.sum(keep).astype(jnp.int32), st["admitted"])
        st["clock"] = jnp.where(at_r, end, st["clock"])
        st["busy"] = jnp.where(at_r, st["busy"] + tau, st["busy"])
        if holding:
            st["steps"] = st["steps"] + (go & ~idle)
            st["stuck"] = st["stuck"] | (go & idle & ~jnp.isfinite(release))
        else:
            st["steps"] = st["steps"] + go
            st["stuck"] = st["stuck"] | (go & (count == 0))
        st["overflow"] = st["overflow"] | stop_wide
        if stopping:
            margin = 1.0 + _STOP_MARGIN
            late_slo = params["ttft_slo_s"] * margin
            arr = sl[:, _ARR]
            late_first = jnp.sum(first & ((end - arr) > late_slo)).astype(jnp.int32)
            # admitted with no first token yet: it comes at a later step's end, after this one's
            waiting_late = jnp.sum(keep & ~first & (j_new == 0) & ((end - arr) > late_slo)).astype(jnp.int32)
            late_ptr = _pointer(st["late_ptr"], arrival, lambda a: (end - a) > late_slo)
            queued_late = jnp.maximum(late_ptr - head, 0)  # not admitted, SLO past at this end
            ttft_first = st["ttft_first"] + jnp.where(go, late_first, 0)
            st["ttft_first"] = ttft_first
            st["late_ptr"] = jnp.where(go, late_ptr, st["late_ptr"])
            st["ttft_late"] = jnp.where(go, ttft_first + waiting_late + queued_late, st["ttft_late"])
            tpot = ((end - arr) - (t_first - arr)) / jnp.maximum(o_len - 1.0, 1.0)  # as request_times has it
            slow = done & (o_len > 1.0) & (tpot > params["itl_slo_s"] * margin)
            st["tpot_late"] = st["tpot_late"] + jnp.sum(slow).astype(jnp.int32)
        return st

    def coast(params, stream, st, go):
        """Up to ``_COAST_STEPS`` decode-only steps at once where ``go`` and nothing else can happen in them: every
        held request decoding, none completing, no admission (the queue head not yet arrived at a step's start,
        or held back by the batch limit or the pool, which decode steps do not change). Each step's τ from the
        same terms as :func:`step`'s, its start the previous one's end (the same additions as one step at a
        time); the step after them is an ordinary one, so queue peaks and late counts are taken there."""
        arrival = stream["arrival_s"]
        dt, n = arrival.dtype, arrival.shape[0]
        inf = jnp.asarray(jnp.inf, dt)
        roof = params["roof"]
        sl, count, head, free = st["slots"][0], st["admitted"][0], st["head"][0], st["free"][0]
        occ = jnp.arange(S, dtype=jnp.int32) < count
        p, j, i_len, o_len = sl[:, _P], sl[:, _J], sl[:, _IN], sl[:, _OUT]
        dec = occ & (p >= i_len)
        d = jnp.sum(dec)
        ahead = jnp.arange(_COAST_STEPS, dtype=dt)
        context = (i_len + j)[:, None] + ahead  # (slots, steps): each decode's context at each step
        zero = jnp.zeros((), dt)
        tau = batching.step_time(
            jnp.broadcast_to(d.astype(dt), ahead.shape),
            jnp.sum(jnp.where(dec[:, None], context, zero), axis=0),
            jnp.sum(jnp.where(dec[:, None], batching.context_kv_bytes(context, roof), zero), axis=0),
            zero,
            zero,
            roof,
            params["a_pre"],
            params["a_dec"],
            params["step_overhead_s"],
        )
        ends, t = [], st["clock"][0]
        for k in range(_COAST_STEPS):  # sequential, as the steps add up one at a time
            t = t + tau[k]
            ends.append(t)
        ends = jnp.stack(ends)
        starts = jnp.concatenate([st["clock"][:1], ends[:-1]])
        fits = (head < n) & (count < params["batch"]) & (params["footprint"][jnp.clip(head, 0, n - 1)] <= free)
        head_t = jnp.where(fits, arrival[jnp.minimum(head, n - 1)], inf)
        left = jnp.min(jnp.where(dec, o_len - j, inf))  # tokens to the first completion
        ok = go & (count > 0) & (d == count) & (ahead < left - 1.0) & (starts < head_t)
        take = jnp.cumprod(ok.astype(jnp.int32)).astype(bool)
        k = jnp.sum(take).astype(jnp.int32)
        st = dict(st)
        st["slots"] = st["slots"].at[0, :, _J].set(jnp.where(dec, j + k.astype(dt), j))
        st["clock"] = jnp.where(k > 0, ends[jnp.maximum(k - 1, 0)], st["clock"])
        st["busy"] = st["busy"].at[0].add(jnp.sum(jnp.where(take, tau, zero)))
        st["gaps"] = st["gaps"].at[jnp.where(take, _gap_bin(tau), GAP_BINS)].add(d.astype(dt), mode="drop")
        st["steps"] = st["steps"] + k
        return st

    def body(params, stream, st):
        live = active(params, stream, st)
        soonest = jnp.min(ready(stream, st))
        if contiguous:
            return step(params, stream, coast(params, stream, st, live), live)
        t, _ = next_arrival(stream, st)
        arriving = live & jnp.isfinite(t) & (t <= soonest)
        st = route(stream, st, arriving)
        return step(params, stream, st, live & ~arriving)

    return init, active, body


_COAST_STEPS = 32  # decode-only steps one iteration may take at once (contiguous lanes)
_STOP_MARGIN = 1e-5  # relative: a count the host's own arithmetic (another rounding) could not contradict


def _pointer(ptr, arrival, due):
    """The first index from ``ptr`` on whose arrival is not ``due`` (``due`` monotone along the sorted
    stream, so the due ones are a run from ``ptr``), ``_WINDOW`` arrivals a pass."""
    n = arrival.shape[0]

    def scan(p):
        idx = p + jnp.arange(_WINDOW, dtype=jnp.int32)
        ok = (idx < n) & due(arrival[jnp.minimum(idx, n - 1)])
        k = jnp.sum(jnp.cumprod(ok.astype(jnp.int32))).astype(jnp.int32)
        return (p + k).astype(jnp.int32), k == _WINDOW

    return jax.lax.while_loop(lambda c: c[1], lambda c: scan(c[0]), scan(ptr))[0]


def _records(arrival, st, contiguous: bool, xp=jnp):
    """The records of lanes (leading lane axis) from their state; ``arrival``: each lane's (lanes, N)."""
    rec = st["records"]
    out = {
        "arrival_s": arrival if contiguous else st["t_arr"],
        "admit_s": rec[..., 1],
        "first_token_s": rec[..., 2],
        "end_s": rec[..., 3],
        "replica": xp.zeros(rec.shape[:-1], xp.int32) if contiguous else st["route"],
        "busy_s": st["busy"],
        "queue_peak": st["queue_peak"],
        "held_peak": st["held_peak"],
        "kv_peak_bytes": st["kv_peak"],
        "gaps": st["gaps"],
        "steps": st["steps"],
        "stuck": st["stuck"],
        "overflow": st["overflow"],
    }
    if "stopped" in st:
        out["stopped"] = st["stopped"]
    return out


_STATIC = ("replicas", "slots", "clients", "closed", "router", "shared_stream")
# what a lane carries to be stopped early (its job's index, SLOs and the late counts that settle a miss)
STOP_KEYS = ("job", "ttft_slo_s", "itl_slo_s", "ttft_allowed", "tpot_allowed")


def _fns(params, *, replicas, slots, clients, closed, router):
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    stopping = "job" in params
    return _lane_fns(replicas=replicas, slots=slots, clients=clients, closed=closed, router=router, stopping=stopping)


def _axes(shared_stream):
    return (0, None if shared_stream else 0)


def _init(params, stream, *, shared_stream, **static):
    init, _, _ = _fns(params, **static)
    return jax.vmap(init, in_axes=_axes(shared_stream))(params, stream)


def _advance(params, stream, state, outside, min_live, *, shared_stream, **static):
    """Steps every lane until at most ``min_live`` lanes are live; (state, live). A stopping run stops every lane
    of a job once the late counts of its lanes here plus ``outside`` (its lanes elsewhere, as last known: a
    lower bound, counts only grow) reach the job's allowance (the count past which its quantile misses)."""
    _, active, body = _fns(params, **static)
    axes = _axes(shared_stream)
    live = jax.vmap(active, in_axes=(*axes, 0))
    step = jax.vmap(body, in_axes=(*axes, 0))

    def stop(st):
        if "job" not in params:
            return st
        job = params["job"]
        lanes = job.shape[0]

        def total(x):
            return jax.ops.segment_sum(x, job, num_segments=lanes)[job]

        late = (total(st["ttft_late"]) + outside["ttft"] >= params["ttft_allowed"]) | (
            total(st["tpot_late"]) + outside["tpot"] >= params["tpot_allowed"]
        )
        return dict(st, stopped=st["stopped"] | late)

    state = jax.lax.while_loop(
        lambda st: jnp.sum(live(params, stream, st)) > min_live, lambda st: stop(step(params, stream, st)), stop(state)
    )
    return state, live(params, stream, state)


init_lanes = jax.jit(_init, static_argnames=_STATIC)
advance_lanes = jax.jit(_advance, static_argnames=_STATIC)


@functools.partial(jax.jit, static_argnames=_STATIC)
def run_lanes(params, stream, *, replicas, slots, clients=1, closed=False, router="round_robin", shared_stream=True):
    """§9 over lanes, to the end, at one slot width: every leaf of ``params`` has a leading lane axis;
    ``stream``'s leaves are (N,) shared by every lane (``shared_stream``) or (lanes, N). Returns the records
    (per request arrival, admission, first token and end times and replica; per replica busy time, peak queue
    and peak KV in use; per lane the inter-token gap histogram, step count and whether it stuck or overflowed)
    with a leading lane axis."""
    static = dict(replicas=replicas, slots=slots, clients=clients, closed=closed, router=router)
    state = _init(params, stream, shared_stream=shared_stream, **static)
    lanes = params["batch"].shape[0]
    outside = {"ttft": jnp.zeros(lanes, jnp.int32), "tpot": jnp.zeros(lanes, jnp.int32)}
    state, _ = _advance(params, stream, state, outside, 0, shared_stream=shared_stream, **static)
    arrival = jnp.broadcast_to(stream["arrival_s"], state["records"].shape[:-1])
    return _records(arrival, state, replicas == 1 and not closed)


# compiled loop shapes kept between pool runs: each holds ~250 of the process's memory maps (65,530 by default),
# so a long study's shapes are dropped, and compiled again if met again, rather than run the kernel out of maps
MAX_COMPILED = 64


def _bound_compiled() -> None:
    sizes = [getattr(f, "_cache_size", lambda: 0)() for f in (init_lanes, advance_lanes)]
    if sum(sizes) > MAX_COMPILED:
        init_lanes.clear_cache()
        advance_lanes.clear_cache()


FIRST_SLOTS = 16  # slot width a lane starts at (at most its batch limit to a power of two), doubled as needed
PACKET_LANES = 128  # lanes a device steps together: past this the per-lane work dominates the per-step cost
SMALLEST_PACKET = 8


def _pow2(x):
    return 2 ** np.ceil(np.log2(np.maximum(x, 1))).astype(int)


def _widen(rows, width):
    """Slot rows (R, s, F) with empty rows appended up to ``width``."""
    extra = np.zeros((*rows.shape[:-2], width - rows.shape[-2], rows.shape[-1]), rows.dtype)
    extra[..., _REQ] = -1.0
    return np.concatenate([rows, extra], axis=-2)


def run_pool(params, stream, *, first=None, shared_stream=True, stop=None, **static):
    """§9 over lanes to the end, on every compute device, in packets (:data:`PACKET_LANES` lanes) that devices
    take from one pool, each lane at the slot width it needs: it starts ``first`` wide (default
    :data:`FIRST_SLOTS`; at most its batch limit, to a power of two) and goes on twice as wide from where the
    width would have stopped an admission (the same results as slots as wide as B). A packet runs until a
    quarter of its lanes are live; those go back to the pool, so the lanes still running are packed densely
    and none waits for the longest. ``stop`` (contiguous lanes): per lane ``job``, ``ttft_slo_s``, ``itl_slo_s``
    and per job ``ttft_allowed``, ``tpot_allowed``: a job's lanes stop once its late count reaches either
    (:func:`_advance`). Returns numpy records per lane, as :func:`run_lanes` (``stopped`` too, when stopping)."""
    import threading
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from .dispatch import compute_devices

    _bound_compiled()
    static = {"clients": 1, "closed": False, "router": "round_robin", **static}
    params = jax.tree_util.tree_map(np.asarray, params)
    stream = {k: np.asarray(v) for k, v in stream.items()}
    lanes = len(params["batch"])
    need = _pow2(params["batch"])
    width = np.minimum(need, _pow2(FIRST_SLOTS if first is None else first)).astype(int)
    contiguous = static["replicas"] == 1 and not static["closed"]
    per_lane = dict(params)
    job = None
    if stop is not None:
        job = np.asarray(stop["job"], np.int64)
        for k in ("ttft_slo_s", "itl_slo_s"):
            per_lane[k] = np.asarray(stop[k], params["batch"].dtype)
        for k in ("ttft_allowed", "tpot_allowed"):
            per_lane[k] = np.asarray(stop[k], np.int64)[job].astype(np.int32)
    state = jax.device_get(init_lanes(_marked(per_lane, job), stream, slots=1, shared_stream=shared_stream, **static))
    state = {k: np.array(v) for k, v in state.items()}
    rows = [_widen(state["slots"][k], width[k]) for k in range(lanes)]
    del state["slots"]
    pending = {}
    for k in range(lanes):
        pending.setdefault(int(width[k]), deque()).append(k)
    devices = compute_devices()
    lock = threading.Condition()
    busy = [0]

    def take():
        with lock:
            while True:
                groups = [w for w, q in pending.items() if q]
                if groups:
                    w = max(groups, key=lambda g: len(pending[g]))
                    q = pending[w]
                    got = [q.popleft() for _ in range(min(PACKET_LANES, len(q)))]
                    busy[0] += 1
                    return w, np.array(got)
                if busy[0] == 0:
                    return None
                lock.wait()

    def packet(w, got, device):
        size = max(SMALLEST_PACKET, int(_pow2(len(got))))
        idx = np.concatenate([got, np.full(size - len(got), got[-1])])
        sub = _take(per_lane, idx)
        sub_state = {k: v[idx] for k, v in state.items()}
        sub_state["slots"] = np.stack([rows[i] for i in idx])
        pad = np.arange(size) >= len(got)
        sub_state["stuck"] = sub_state["stuck"] | pad  # padding lanes never step
        outside = {"ttft": np.zeros(size, np.int32), "tpot": np.zeros(size, np.int32)}
        if job is not None:
            local = np.unique(job[got], return_inverse=True)[1].reshape(-1)
            sub["job"] = np.concatenate([local, np.full(size - len(got), size - 1)]).astype(np.int32)
            for name, key in (("ttft", "ttft_late"), ("tpot", "tpot_late")):
                with lock:
                    known = np.bincount(job, weights=state[key], minlength=job.max() + 1)
                    mine = np.bincount(job[got], weights=state[key][got], minlength=job.max() + 1)
                outside[name][: len(got)] = (known - mine)[job[got]]
        sub_stream = stream if shared_stream else {k: v[idx] for k, v in stream.items()}
        put = functools.partial(jax.device_put, device=device)
        out, live = advance_lanes(
            jax.tree_util.tree_map(put, sub),
            jax.tree_util.tree_map(put, sub_stream),
            jax.tree_util.tree_map(put, sub_state),
            jax.tree_util.tree_map(put, outside),
            size // 4 if size > SMALLEST_PACKET else 0,
            slots=w,
            shared_stream=shared_stream,
            **static,
        )
        out, live = jax.device_get((out, live))
        n = len(got)
        with lock:
            for k, v in out.items():
                if k != "slots":
                    state[k][got] = v[:n]
            for i, lane in enumerate(got):
                rows[lane] = out["slots"][i]
                if live[i]:
                    pending.setdefault(w, deque()).append(lane)
                elif out["overflow"][i] and not out["stuck"][i] and not out.get("stopped", np.zeros(n, bool))[i]:
                    state["overflow"][lane] = False  # the step it stopped at is taken again, wider
                    rows[lane] = _widen(rows[lane], 2 * w)
                    pending.setdefault(2 * w, deque()).append(lane)
            busy[0] -= 1
            lock.notify_all()

    def worker(device):
        while (task := take()) is not None:
            try:
                packet(*task, device)
            except BaseException:
                with lock:
                    busy[0] -= 1
                    pending.clear()
                    lock.notify_all()
                raise

    with ThreadPoolExecutor(len(devices)) as pool:
        for f in [pool.submit(worker, d) for d in devices]:
            f.result()
    arrival = np.broadcast_to(stream["arrival_s"], state["records"].shape[:-1])
    return _records(arrival, state, contiguous, xp=np)


def _take(tree, idx):
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], tree)


def _marked(params, job):
    """``params`` with the stop keys' ``job`` where stopping (the init needs its counters)."""
    return params if job is None else dict(params, job=np.zeros(len(job), np.int32))


def simulate_candidates(terms, batch, footprint, stream, *, replicas: int, router: str = "round_robin", clients=None):
    """§9 for K candidates at R replicas each: ``terms`` (:func:`slimjax.model.batching.replica_terms`, leaves
    (K,)), ``batch`` (K,), ``footprint`` (K, N), ``stream`` (arrival_s, input_len, output_len), (N,) each.

    Every op of a step is over a lane's slots, so slots are as wide as the requests a replica actually holds
    at once, not as its batch limit (:func:`run_pool`): the results are those of slots as wide as B.
    Returns numpy records: per request (K, N) in stream order, per replica (K, R), per candidate (K, …)."""
    batch = np.asarray(batch)
    if router == "round_robin" and clients is None:
        return simulate_round_robin(terms, batch, footprint, stream, np.full(len(batch), int(replicas)))

    # one lane holds all R replicas: least_loaded and closed loops couple them. A replica of n_pp stages is n_pp
    # virtual engines dealt arrivals round robin (§10): under round robin, R·n_pp engines (request i to engine
    # i mod R·n_pp: replica i mod R, its (i div R) mod n_pp-th engine)
    stages = pipeline_stages(terms, len(batch))
    if router != "round_robin" and np.any(stages > 1):
        raise ValueError(
            f"router {router!r} with pipeline stages: a replica deals its arrivals to its n_pp virtual engines round "
            "robin (MODEL.md §10), which only the round_robin router composes with; use router: round_robin"
        )
    footprint = np.asarray(footprint)
    out = None
    for n_pp in np.unique(stages):
        at = np.flatnonzero(stages == n_pp)
        got = run_pool(
            dict(_take(terms, at), batch=engine_batch(batch[at], n_pp), footprint=footprint[at]),
            stream,
            replicas=int(replicas) * int(n_pp),
            clients=clients or 1,
            closed=clients is not None,
            router=router,
        )
        got["replica"] = np.mod(got["replica"], int(replicas))
        got["replicas"] = np.full(len(at), int(replicas) * int(n_pp))
        if out is None:
            width = int(replicas) * int(stages.max())
            out = {  # every row is written below; per-replica columns past a group's R·n_pp stay 0
                k: np.zeros((len(batch), width) if k in PER_REPLICA else (len(batch), *v.shape[1:]), v.dtype)
                for k, v in got.items()
            }
        for k, v in got.items():
            if k in PER_REPLICA:
                out[k][at, : v.shape[1]] = v
            else:
                out[k][at] = v
    return out


PER_REPLICA = ("busy_s", "queue_peak", "held_peak", "kv_peak_bytes")  # records per replica (per engine under PP)


def pipeline_stages(terms: dict, candidates: int) -> np.ndarray:
    """n_pp per candidate (integers; 1 where the terms predate §10)."""
    return np.asarray(terms.get("pipeline_stages", np.ones(candidates)), np.float64).reshape(candidates).astype(int)


def engine_batch(batch, stages):
    """:func:`slimjax.model.pipeline.engine_batch_limit` on the host, in the batch's dtype."""
    batch = np.asarray(batch)
    return np.asarray(engine_batch_limit(batch, np.asarray(stages, batch.dtype))).astype(batch.dtype)


LANE_ELEMENTS = 1 << 22  # requests × lanes in one pool of the sub-lane runs (their per-request arrays)
POOL_LANES = 8192  # lanes in one pool at most (each carries a gap histogram)


def simulate_round_robin(terms, batch, footprint, stream, replicas):
    """§9 for K candidates on one open stream under round robin, candidate k at ``replicas[k]`` replicas:
    :func:`round_robin_jobs` with one stream. Returns numpy records: per request (K, N) in stream order, per
    replica (K, max R; zero past a candidate's R, whose count is ``records["replicas"]``), per candidate (K, …)."""
    K = len(np.asarray(batch))
    return round_robin_jobs(terms, batch, [footprint], [stream], np.zeros(K, int), np.arange(K), replicas)[0]


def round_robin_jobs(
    terms, batch, footprints, streams, job_stream, job_candidate, job_replicas, first_slots=None, stop=None
):
    """§9 under round robin for jobs (stream s, candidate c, R replicas) over several open streams at once.

    Round robin makes the replicas independent (request i is replica i mod R's whatever the others do), so each
    replica is a lane of its own on its sub-stream: the same results as one lane of R replicas, with work
    proportional to N rather than to R·N, and jobs of any R and stream in one run (few calls, few shapes to
    compile). Sub-lanes are grouped by length (to a power of four, padded with requests at +inf) and run
    ``LANE_ELEMENTS`` at a time. ``terms``, ``batch``: per candidate (leaves (C,)); ``footprints[s]`` (C, N_s);
    ``streams[s]``: arrival_s, input_len, output_len (N_s,); ``first_slots`` (J,): each job's first slot width
    (default ``FIRST_SLOTS``; a good guess, such as the requests a replica held in an earlier run, saves reruns).
    Returns per stream the records of its jobs, in job order: per request (J_s, N_s), per replica (J_s, max R),
    per job (J_s, …); ``replicas`` the R of each. ``stop``: per job ``ttft_slo_s``, ``itl_slo_s``, ``ttft_allowed``,
    ``tpot_allowed`` (:func:`run_pool`): a job's sub-lanes stop once it is certain to miss (its records are then
    incomplete and ``stopped`` is set)."""
    job_stream, job_candidate = np.asarray(job_stream, int), np.asarray(job_candidate, int)
    replicas = np.asarray(job_replicas, dtype=np.int64).reshape(len(job_stream))
    # a replica of n_pp stages is n_pp virtual engines dealt arrivals round robin (§10): R·n_pp round-robin
    # engines, each admitting ⌊B/n_pp⌋ (request i to engine i mod R·n_pp: replica i mod R)
    stages = pipeline_stages(terms, len(np.asarray(batch)))
    R = replicas * stages[job_candidate]
    batch = engine_batch(batch, stages)
    dt = np.asarray(streams[0]["arrival_s"]).dtype
    n_of = np.array([len(st["arrival_s"]) for st in streams])[job_stream]
    lane_job = np.repeat(np.arange(len(R)), R)
    lane_rep = np.arange(len(lane_job)) - np.repeat(np.cumsum(R) - R, R)
    lane_len = -(-(n_of[lane_job] - lane_rep) // R[lane_job])  # requests r, r + R, … below N
    # lengths to a power of 4: padding requests (at +inf) cost memory, not steps, and each shape is a compile
    bucket = 4 ** np.ceil(np.log(np.maximum(lane_len, 1)) / np.log(4)).astype(int)
    row = np.zeros(len(R), int)  # each job's row among its stream's jobs
    out = []
    for s, st in enumerate(streams):
        mine = np.flatnonzero(job_stream == s)
        row[mine] = np.arange(len(mine))
        n, r_max = len(st["arrival_s"]), int(R[mine].max()) if len(mine) else 1
        rec = {k: np.full((len(mine), n), np.nan, dt) for k in ("admit_s", "first_token_s", "end_s")}
        rec["arrival_s"] = np.broadcast_to(np.asarray(st["arrival_s"], dt), (len(mine), n)).copy()
        rec["replica"] = np.arange(n)[None] % replicas[mine][:, None]
        rec.update({k: np.zeros((len(mine), r_max), dt) for k in ("busy_s", "kv_peak_bytes")})
        rec["queue_peak"] = np.zeros((len(mine), r_max), np.int32)
        rec["held_peak"] = np.zeros((len(mine), r_max), np.int32)
        rec.update(gaps=np.zeros((len(mine), GAP_BINS), dt), steps=np.zeros(len(mine), np.int64))
        rec.update(stuck=np.zeros(len(mine), bool), overflow=np.zeros(len(mine), bool), replicas=R[mine])
        rec["stopped"] = np.zeros(len(mine), bool)
        out.append(rec)
    for m in np.unique(bucket):
        lanes = np.flatnonzero(bucket == m)
        per_call = max(1, min(POOL_LANES, LANE_ELEMENTS // m))
        for start in range(0, len(lanes), per_call):
            chunk = lanes[start : start + per_call]
            j, r = lane_job[chunk], lane_rep[chunk]
            s_of, c_of = job_stream[j], job_candidate[j]
            index = r[:, None] + R[j][:, None] * np.arange(m)[None, :]  # (L, m): each sub-lane's requests
            real = index < n_of[j][:, None]
            safe = np.where(real, index, 0)
            params = _take(dict(terms, batch=batch), c_of)
            fp = np.zeros(index.shape, dt)
            sub = {k: np.full(index.shape, np.inf if k == "arrival_s" else 1.0, dt) for k in streams[0]}
            for s in np.unique(s_of):
                at = s_of == s
                ok = real[at]
                fp[at] = np.where(ok, np.asarray(footprints[s])[c_of[at][:, None], safe[at]], 0.0)
                for k in sub:
                    sub[k][at] = np.where(ok, np.asarray(streams[s][k])[safe[at]], sub[k][at])
            params["footprint"] = fp
            first = None if first_slots is None else np.asarray(first_slots)[j]
            lane_stop = None
            if stop is not None:
                lane_stop = {k: np.asarray(stop[k])[j] for k in ("ttft_slo_s", "itl_slo_s")}
                jobs, local = np.unique(j, return_inverse=True)
                lane_stop.update(job=local.reshape(-1), **{k: np.asarray(stop[k])[jobs] for k in STOP_KEYS[3:]})
            got = run_pool(params, sub, first=first, shared_stream=False, stop=lane_stop, replicas=1)
            for s in np.unique(s_of):
                at = np.flatnonzero(s_of == s)
                rec, rows = out[s], row[j[at]]
                ok = real[at]
                rr, cols = np.broadcast_to(rows[:, None], ok.shape)[ok], index[at][ok]
                for key in ("admit_s", "first_token_s", "end_s"):
                    rec[key][rr, cols] = got[key][at][ok]
                for key in ("busy_s", "kv_peak_bytes", "queue_peak", "held_peak"):
                    rec[key][rows, r[at]] = got[key][at, 0]
                np.add.at(rec["gaps"], rows, got["gaps"][at])
                np.add.at(rec["steps"], rows, got["steps"][at])
                for key in ("stuck", "overflow", "stopped"):
                    if key in got:
                        np.logical_or.at(rec[key], rows, got[key][at])
    return out


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


def summaries(records, output_len, clients: int | None = None) -> dict:
    """Per candidate: TTFT and TPOT mean and p50/p90/p99 (numpy's linear quantiles), mean E2E, token-gap p90,
    utilisation (busy time / (R·span)), peak queue and peak KV in use (§9 Outputs)."""
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
    out["queue_peak"] = np.max(records["queue_peak"], axis=-1).astype(float)
    out["kv_peak_bytes"] = np.max(records["kv_peak_bytes"], axis=-1)
    return out
