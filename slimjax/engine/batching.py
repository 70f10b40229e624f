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
_REQ, _P, _J, _IN, _OUT, _FP, _ADMIT, _FIRST, _ARR = range(9)
_FIELDS = 9


def _lane_fns(*, replicas: int, slots: int, clients: int, closed: bool, router: str):
    """(init, active, body) of one lane, each a function of (params, stream[, state]); the while loop over steps
    lives outside the vmap over lanes (:func:`run_lanes`), so a step writes the per-request arrays only where it
    completes requests (a vmapped while loop would select every carried array, per-request ones included, on
    every iteration).

    ``contiguous`` lanes (one replica on an open stream) need no routing: the queue is the stream itself, from
    ``head`` (the next request to admit) to the last arrival due; others route one arrival per iteration
    through per-replica linked lists."""
    R, S, C = replicas, slots, clients
    contiguous = R == 1 and not closed

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
        return jnp.where(st["admitted"] > 0, st["clock"], jnp.maximum(st["clock"], head_t))

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
        return busy & ~st["stuck"] & ~st["overflow"]

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
            row = jnp.stack(
                [head.astype(dt), 0.0, 0.0, in_len[head], out_len[head], footprint[head], t, jnp.nan, arr_of(head)]
            )
            return next_of(head), free - footprint[head], count + 1, sl.at[count].set(row.astype(dt))

        head0, free0, count0 = st["head"][r], st["free"][r], st["admitted"][r]
        head, free, count, sl = jax.lax.while_loop(can_admit, admit, (head0, free0, count0, st["slots"][r]))
        # the slot arrays, not the batch limit, stopped an admission: this lane's results are void (rerun wider)
        blocked = (count == S) & (count < batch) & waiting(head) & (footprint[jnp.clip(head, 0, n - 1)] <= free)
        pos = jnp.arange(S, dtype=jnp.int32)
        occ = pos < count
        p, j, i_len, o_len = sl[:, _P], sl[:, _J], sl[:, _IN], sl[:, _OUT]
        dec = occ & (p >= i_len)
        pre = occ & (p < i_len)
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
        end = t + tau
        p_new = p + new
        first = chunked & (p_new >= i_len)
        j_new = jnp.where(dec, j + 1.0, jnp.where(first, 1.0, j))
        t_first = jnp.where(first, end, sl[:, _FIRST])
        done = go & (dec | first) & (j_new >= o_len)
        keep = occ & ~done
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
        packed = jnp.zeros_like(fields).at[:, _REQ].set(-1.0).at[dest].set(fields, mode="drop")
        at_r = go & (jnp.arange(R) == r)
        st["slots"] = st["slots"].at[r].set(jnp.where(go, packed, st["slots"][r]))
        st["head"] = jnp.where(at_r, head, st["head"])
        admitted_now = (count - count0).astype(jnp.int32)
        if contiguous:
            qlen = jnp.searchsorted(arrival, t, side="right").astype(jnp.int32) - head
        else:
            st["tail"] = jnp.where(at_r & (head < 0), -1, st["tail"])
            st["qlen"] = st["qlen"] - jnp.where(at_r, admitted_now, 0)
            qlen = st["qlen"][r]
            st["in_system"] = st["in_system"] - jnp.where(at_r, n_done, 0)
            st["last_done"] = jnp.where(at_r, n_done, st["last_done"])
        st["queue_peak"] = jnp.where(at_r, jnp.maximum(st["queue_peak"], qlen), st["queue_peak"])
        st["kv_peak"] = jnp.where(at_r, jnp.maximum(st["kv_peak"], params["pool"] - free), st["kv_peak"])
        st["held_peak"] = jnp.where(at_r, jnp.maximum(st["held_peak"], count), st["held_peak"])
        freed = jnp.sum(jnp.where(done, sl[:, _FP], zero))
        st["free"] = jnp.where(at_r, free + freed, st["free"])
        st["admitted"] = jnp.where(at_r, jnp.sum(keep).astype(jnp.int32), st["admitted"])
        st["clock"] = jnp.where(at_r, end, st["clock"])
        st["busy"] = jnp.where(at_r, st["busy"] + tau, st["busy"])
        st["steps"] = st["steps"] + go
        st["stuck"] = st["stuck"] | (go & (count == 0))
        st["overflow"] = st["overflow"] | (go & blocked)
        return st

    def body(params, stream, st):
        live = active(params, stream, st)
        soonest = jnp.min(ready(stream, st))
        if contiguous:
            return step(params, stream, st, live)
        t, _ = next_arrival(stream, st)
        arriving = live & jnp.isfinite(t) & (t <= soonest)
        st = route(stream, st, arriving)
        return step(params, stream, st, live & ~arriving)

    return init, active, body


def _records(stream, st, contiguous: bool):
    rec = st["records"]
    n = rec.shape[0]
    return {
        "arrival_s": stream["arrival_s"] if contiguous else st["t_arr"],
        "admit_s": rec[:, 1],
        "first_token_s": rec[:, 2],
        "end_s": rec[:, 3],
        "replica": jnp.zeros(n, jnp.int32) if contiguous else st["route"],
        "busy_s": st["busy"],
        "queue_peak": st["queue_peak"],
        "held_peak": st["held_peak"],
        "kv_peak_bytes": st["kv_peak"],
        "gaps": st["gaps"],
        "steps": st["steps"],
        "stuck": st["stuck"],
        "overflow": st["overflow"],
    }


@functools.partial(jax.jit, static_argnames=("replicas", "slots", "clients", "closed", "router", "shared_stream"))
def run_lanes(params, stream, *, replicas, slots, clients=1, closed=False, router="round_robin", shared_stream=True):
    """§9 over lanes: every leaf of ``params`` has a leading lane axis; ``stream``'s leaves are (N,) shared by
    every lane (``shared_stream``) or (lanes, N). Returns the records (per request arrival, admission, first
    token and end times and replica; per replica busy time, peak queue and peak KV in use; per lane the
    inter-token gap histogram, step count and whether it stuck) with a leading lane axis."""
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    init, active, body = _lane_fns(replicas=replicas, slots=slots, clients=clients, closed=closed, router=router)
    axes = (0, None if shared_stream else 0)
    state = jax.vmap(init, in_axes=axes)(params, stream)
    live = jax.vmap(active, in_axes=(*axes, 0))
    step = jax.vmap(body, in_axes=(*axes, 0))
    state = jax.lax.while_loop(lambda st: jnp.any(live(params, stream, st)), lambda st: step(params, stream, st), state)
    contiguous = replicas == 1 and not closed
    return jax.vmap(functools.partial(_records, contiguous=contiguous), in_axes=(axes[1], 0))(stream, state)


def run_dealt(params, stream, *, shared_stream=True, **static):
    """:func:`run_lanes` with the lanes dealt in equal chunks to every compute device (one core each on the CPU,
    :mod:`.dispatch`); the same records, per lane, as one call."""
    from .dispatch import compute_devices, pipelined

    lanes = len(np.asarray(params["batch"]))
    devices = compute_devices()
    d = max(1, min(len(devices), lanes))
    per = -(-lanes // d)
    per = 2 ** int(np.ceil(np.log2(per)))  # few distinct shapes to compile (each costs about a second)
    index = np.minimum(np.arange(per * d), lanes - 1)  # the last lane repeated as padding, dropped below
    chunks = [index[k * per : (k + 1) * per] for k in range(d)]

    def run(chunk, device):
        sub = jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x)[chunk], device), params)
        take = (lambda x: np.asarray(x)) if shared_stream else (lambda x: np.asarray(x)[chunk])
        st = jax.tree_util.tree_map(lambda x: jax.device_put(take(x), device), stream)
        return run_lanes(sub, st, shared_stream=shared_stream, **static)

    parts = [jax.device_get(out) for _, out in pipelined(chunks, run, devices[:d])]
    return {key: np.concatenate([np.asarray(p[key]) for p in parts])[:lanes] for key in parts[0]}


FIRST_SLOTS = 16  # slot width of a lane's first run; widened by doubling where the width, not B, stopped admission


def _take(tree, idx):
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], tree)


def simulate_candidates(terms, batch, footprint, stream, *, replicas: int, router: str = "round_robin", clients=None):
    """§9 for K candidates at R replicas each: ``terms`` (:func:`slimjax.model.batching.replica_terms`, leaves
    (K,)), ``batch`` (K,), ``footprint`` (K, N), ``stream`` (arrival_s, input_len, output_len), (N,) each.

    Every op of a step is over a lane's slots, so slots are as wide as the requests a replica actually holds
    at once, not as its batch limit: each candidate first runs at ``FIRST_SLOTS`` (or its batch limit rounded
    up to a power of two, if smaller); one whose admission the width stopped (``overflow``) runs again at twice
    the width, up to its limit. The results are those of slots as wide as B: a run that never filled its slots
    never met their bound. Candidates of equal width run as one group.
    Returns numpy records: per request (K, N) in stream order, per replica (K, R), per candidate (K, …)."""
    batch = np.asarray(batch)
    if router == "round_robin" and clients is None:
        return simulate_round_robin(terms, batch, footprint, stream, np.full(len(batch), int(replicas)))

    def run(idx, width):
        return _simulate_group(
            _take(terms, idx),
            batch[idx],
            np.asarray(footprint)[idx],
            stream,
            slots=width,
            replicas=replicas,
            router=router,
            clients=clients,
        )

    return _widened(run, batch)


def _simulate_group(
    terms, batch, footprint, stream, *, slots: int, replicas: int, router: str = "round_robin", clients=None
):
    """One group of :func:`simulate_candidates`, every lane ``slots`` wide: one lane holds all R replicas
    (``least_loaded`` and closed loops couple them). Round robin on an open stream goes to
    :func:`simulate_round_robin` instead."""
    per_candidate = dict(terms, batch=batch, footprint=footprint)
    closed = clients is not None
    return run_dealt(
        per_candidate, stream, replicas=int(replicas), slots=slots, clients=clients or 1, closed=closed, router=router
    )


LANE_ELEMENTS = 1 << 22  # requests × lanes per call of the sub-lane runs (their per-request arrays)


def _pow2(x):
    return 2 ** np.ceil(np.log2(np.maximum(x, 1))).astype(int)


def _widened(run, batch, first=None):
    """``run(idx, width)``'s records for lanes ``idx`` at slot width ``width``, every lane first ``first`` wide
    (default ``FIRST_SLOTS``; at most its batch limit, to a power of two) and rerun at twice the width where the
    width, not B, stopped an admission (``overflow``); lanes of equal width run together. Records per lane."""
    need = _pow2(batch)
    width = np.minimum(need, _pow2(FIRST_SLOTS if first is None else first))
    out, pending = None, np.arange(len(batch))
    while pending.size:
        retry = []
        for w in np.unique(width[pending]):
            idx = pending[width[pending] == w]
            got = run(idx, int(w))
            if out is None:
                out = {k: np.zeros((len(batch), *np.shape(v)[1:]), np.asarray(v).dtype) for k, v in got.items()}
            wider = np.asarray(got["overflow"]) & (w < need[idx])
            for k, v in got.items():
                out[k][idx[~wider]] = np.asarray(v)[~wider]
            width[idx[wider]] = 2 * w
            retry.append(idx[wider])
        pending = np.concatenate(retry)
    return out


def simulate_round_robin(terms, batch, footprint, stream, replicas):
    """§9 for K candidates on one open stream under round robin, candidate k at ``replicas[k]`` replicas:
    :func:`round_robin_jobs` with one stream. Returns numpy records: per request (K, N) in stream order, per
    replica (K, max R; zero past a candidate's R, whose count is ``records["replicas"]``), per candidate (K, …)."""
    K = len(np.asarray(batch))
    return round_robin_jobs(terms, batch, [footprint], [stream], np.zeros(K, int), np.arange(K), replicas)[0]


def round_robin_jobs(terms, batch, footprints, streams, job_stream, job_candidate, job_replicas, first_slots=None):
    """§9 under round robin for jobs (stream s, candidate c, R replicas) over several open streams at once.

    Round robin makes the replicas independent (request i is replica i mod R's whatever the others do), so each
    replica is a lane of its own on its sub-stream: the same results as one lane of R replicas, with work
    proportional to N rather than to R·N, and jobs of any R and stream in one run (few calls, few shapes to
    compile). Sub-lanes are grouped by length (to a power of four, padded with requests at +inf) and run
    ``LANE_ELEMENTS`` at a time. ``terms``, ``batch``: per candidate (leaves (C,)); ``footprints[s]`` (C, N_s);
    ``streams[s]``: arrival_s, input_len, output_len (N_s,); ``first_slots`` (J,): each job's first slot width
    (default ``FIRST_SLOTS``; a good guess, such as the requests a replica held in an earlier run, saves reruns).
    Returns per stream the records of its jobs, in job order: per request (J_s, N_s), per replica (J_s, max R),
    per job (J_s, …); ``replicas`` the R of each."""
    job_stream, job_candidate = np.asarray(job_stream, int), np.asarray(job_candidate, int)
    R = np.asarray(job_replicas, dtype=np.int64).reshape(len(job_stream))
    batch = np.asarray(batch)
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
        rec["replica"] = np.arange(n)[None] % R[mine][:, None]
        rec.update({k: np.zeros((len(mine), r_max), dt) for k in ("busy_s", "kv_peak_bytes")})
        rec["queue_peak"] = np.zeros((len(mine), r_max), np.int32)
        rec["held_peak"] = np.zeros((len(mine), r_max), np.int32)
        rec.update(gaps=np.zeros((len(mine), GAP_BINS), dt), steps=np.zeros(len(mine), np.int64))
        rec.update(stuck=np.zeros(len(mine), bool), overflow=np.zeros(len(mine), bool), replicas=R[mine])
        out.append(rec)
    for m in np.unique(bucket):
        lanes = np.flatnonzero(bucket == m)
        per_call = max(1, LANE_ELEMENTS // m)
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
            got = _widened(
                lambda idx, w, params=params, sub=sub: run_dealt(
                    _take(params, idx), _take(sub, idx), replicas=1, slots=w, shared_stream=False
                ),
                np.asarray(params["batch"]),
                first,
            )
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
                for key in ("stuck", "overflow"):
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


def summaries(records, output_len, clients: int | None = None) -> dict:
    """Per candidate: TTFT and TPOT mean and p50/p90/p99 (numpy's linear quantiles), mean E2E, token-gap p90,
    utilisation (busy time / (R·span)), peak queue and peak KV in use (§9 Outputs)."""
    ttft, e2e, tpot = request_times(records, output_len)
    counted = counted_requests(records, clients)
    out = {}
    for name, x in zip(SUMMARY_TIMES, (ttft, tpot), strict=True):
        x = np.where(counted, x, np.nan)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[summary_name(name, "mean")] = np.nanmean(x, axis=-1)
            for q in SUMMARY_QUANTILES:
                out[summary_name(name, q)] = np.nanquantile(x, q, axis=-1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out["e2e_mean_s"] = np.nanmean(np.where(counted, e2e, np.nan), axis=-1)
        span = np.nanmax(records["end_s"], axis=-1) - np.nanmin(records["arrival_s"], axis=-1)
    out["token_gap_p90_s"] = gap_quantile(records["gaps"], 0.9)
    busy = records["busy_s"]
    replicas = records.get("replicas", busy.shape[-1])
    out["utilization"] = np.sum(busy, axis=-1) / (replicas * span)
    out["queue_peak"] = np.max(records["queue_peak"], axis=-1).astype(float)
    out["kv_peak_bytes"] = np.max(records["kv_peak_bytes"], axis=-1)
    return out
