"""Trace-driven continuous batching (MODEL.md §9) as one jitted ``lax.while_loop`` over engine steps.

A *lane* is R replicas (static) serving one request stream; lanes are vmapped (candidates × replicas ×
streams), so nothing loops in Python per step or per request. Each outer iteration routes every arrival due
before the next step (``round_robin``: request i to replica i mod R; ``least_loaded``: fewest admitted + waiting
at the arrival instant, ties to the lowest index), then runs one step of the replica whose next step starts
first. Replica state lives in fixed-size slot arrays kept in admission order (a completed request's slot is
compacted away), so a step's token budget goes to prefilling requests in admission order by one cumsum.
Each replica's FCFS queue is a linked list through the requests (head, tail, next), so routing and admission
are O(1) each.

Streams: open (arrival times known; padding requests arrive at +inf and are never routed) or closed loop
(C clients; request i belongs to client i mod C and its successor i + C arrives when it completes).

Per request the loop records arrival, admission, first-token and completion times and its replica; per
replica its busy time, peak queue (requests still waiting after a step's admission) and peak KV in use; per
lane a histogram of every inter-token gap (log bins, for the token-gap quantile) and the step count.
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


def _lane(params, stream, *, replicas: int, slots: int, clients: int, closed: bool, router: str):
    """One lane: ``params`` the candidate's scalars (``roof`` dict, a_pre, a_dec, step_overhead_s, step_tokens,
    chunk_size, batch, pool) and its per-request ``footprint`` (N,); ``stream`` (arrival_s, input_len,
    output_len) of length N (closed loop: arrival_s is ignored)."""
    arrival, in_len, out_len = stream["arrival_s"], stream["input_len"], stream["output_len"]
    footprint = params["footprint"]  # footprint(I + O) of each request on this lane's candidate (§3)
    dt = arrival.dtype
    n = arrival.shape[0]
    R, S, C = replicas, slots, clients
    inf = jnp.asarray(jnp.inf, dt)
    roof, a_pre, a_dec = params["roof"], params["a_pre"], params["a_dec"]
    chunk = jnp.where(params["chunk_size"] > 0, params["chunk_size"], inf)
    batch, budget_tokens = params["batch"], params["step_tokens"]
    if closed:
        first = jnp.arange(C, dtype=jnp.int32)
        client_next = jnp.where(first < n, first, n)
        client_time = jnp.where(first < n, 0.0, inf).astype(dt)
    else:
        client_next = jnp.zeros(1, jnp.int32)
        client_time = arrival[:1]
    nan_n = jnp.full(n, jnp.nan, dt)
    state = dict(
        t_arr=jnp.full(n, inf, dt),
        t_admit=nan_n,
        t_first=nan_n,
        t_end=nan_n,
        route=jnp.full(n, -1, jnp.int32),
        nextq=jnp.full(n, -1, jnp.int32),
        client_next=client_next,
        client_time=client_time,
        head=jnp.full(R, -1, jnp.int32),
        tail=jnp.full(R, -1, jnp.int32),
        qlen=jnp.zeros(R, jnp.int32),
        clock=jnp.zeros(R, dt),
        busy=jnp.zeros(R, dt),
        in_system=jnp.zeros(R, jnp.int32),
        last_done=jnp.zeros(R, jnp.int32),
        free=jnp.full(R, params["pool"], dt),
        admitted=jnp.zeros(R, jnp.int32),
        slot_req=jnp.full((R, S), -1, jnp.int32),
        slot_p=jnp.zeros((R, S), dt),
        slot_j=jnp.zeros((R, S), dt),
        slot_last=jnp.zeros((R, S), dt),
        queue_peak=jnp.zeros(R, jnp.int32),
        kv_peak=jnp.zeros(R, dt),
        gaps=jnp.zeros(GAP_BINS, dt),
        steps=jnp.zeros((), jnp.int32),
        stuck=jnp.zeros((), bool),  # an empty replica whose queue head does not fit its pool: stop, never spin
    )

    def ready(st):
        """Each replica's next step start: its clock while it holds requests, else its queue head's arrival
        (not before its clock); +inf when it has nothing to do."""
        head_t = st["t_arr"][jnp.maximum(st["head"], 0)]
        return jnp.where(
            st["admitted"] > 0,
            st["clock"],
            jnp.where(st["head"] >= 0, jnp.maximum(st["clock"], head_t), inf),
        )

    def next_arrival(st):
        """(time, client) of the earliest pending arrival, ties to the lower request index."""
        t = jnp.min(st["client_time"])
        key = jnp.where(st["client_time"] == t, st["client_next"], n + 1)
        c = jnp.argmin(key)
        return t, c

    def route_one(st):
        t, c = next_arrival(st)
        i = st["client_next"][c]
        if router == "round_robin":
            r = jnp.mod(i, R).astype(jnp.int32)
        else:  # fewest admitted + waiting at t: the last step's completions count until its end
            load = st["in_system"] + jnp.where(st["clock"] > t, st["last_done"], 0)
            r = jnp.argmin(load).astype(jnp.int32)
        tail = st["tail"][r]
        st = dict(st)
        st["nextq"] = st["nextq"].at[jnp.where(tail >= 0, tail, n)].set(i, mode="drop")
        st["head"] = st["head"].at[r].set(jnp.where(tail >= 0, st["head"][r], i))
        st["tail"] = st["tail"].at[r].set(i)
        st["t_arr"] = st["t_arr"].at[i].set(t)
        st["route"] = st["route"].at[i].set(r)
        st["qlen"] = st["qlen"].at[r].add(1)
        st["in_system"] = st["in_system"].at[r].add(1)
        succ = i + C if closed else i + 1
        has = succ < n
        st["client_next"] = st["client_next"].at[c].set(jnp.where(has, succ, n))
        later = inf if closed else arrival[jnp.minimum(succ, n - 1)]
        st["client_time"] = st["client_time"].at[c].set(jnp.where(has, later, inf))
        return st

    def route_due(st):
        def due(st):
            t, _ = next_arrival(st)
            return jnp.isfinite(t) & (t <= jnp.min(ready(st)))

        return jax.lax.while_loop(due, route_one, st)

    def step(st):
        start = ready(st)
        r = jnp.argmin(start)
        t = start[r]
        req, p, j, last = st["slot_req"][r], st["slot_p"][r], st["slot_j"][r], st["slot_last"][r]

        def can_admit(carry):
            head, free, count, req = carry
            fp = footprint[jnp.maximum(head, 0)]
            return (count < batch) & (head >= 0) & (fp <= free)

        def admit(carry):
            head, free, count, req = carry
            return st["nextq"][head], free - footprint[head], count + 1, req.at[count].set(head)

        head0, free0, count0 = st["head"][r], st["free"][r], st["admitted"][r]
        head, free, count, req = jax.lax.while_loop(can_admit, admit, (head0, free0, count0, req))
        pos = jnp.arange(S, dtype=jnp.int32)
        newly = (pos >= count0) & (pos < count)
        p, j, last = jnp.where(newly, 0.0, p), jnp.where(newly, 0.0, j), jnp.where(newly, t, last)
        admitted_ids = jnp.where(newly, req, n)
        occ = pos < count
        rc = jnp.maximum(req, 0)
        i_len, o_len = in_len[rc], out_len[rc]
        dec = occ & (p >= i_len)
        pre = occ & (p < i_len)
        context = i_len + j
        d = jnp.sum(dec)
        budget = jnp.maximum(budget_tokens - d, 0.0)
        need = jnp.where(pre, jnp.minimum(i_len - p, chunk), 0.0)
        before = jnp.cumsum(need) - need
        new = jnp.where(pre, jnp.clip(budget - before, 0.0, need), 0.0)
        chunked = new > 0
        zero = jnp.zeros((), dt)
        n_tok = d + jnp.sum(new)
        tau = batching.step_time(
            n_tok,
            jnp.sum(jnp.where(dec, context, zero)),
            jnp.sum(jnp.where(dec, batching.context_kv_bytes(context, roof), zero)),
            jnp.sum(jnp.where(chunked, batching.chunk_attention_tokens(new, p), zero)),
            jnp.sum(jnp.where(chunked, batching.context_kv_bytes(p, roof), zero)),
            roof,
            a_pre,
            a_dec,
            params["step_overhead_s"],
        )
        end = t + tau
        p_new = p + new
        first = chunked & (p_new >= i_len)
        j_new = jnp.where(dec, j + 1.0, jnp.where(first, 1.0, j))
        gap_w = jnp.where(dec, 1.0, 0.0).astype(dt)
        gaps = st["gaps"].at[_gap_bin(end - last)].add(gap_w)
        last = jnp.where(dec | first, end, last)
        done = (dec | first) & (j_new >= o_len)
        keep = occ & ~done
        kept = jnp.sum(keep).astype(jnp.int32)
        dest = jnp.where(keep, jnp.cumsum(keep) - 1, S)

        st = dict(st)
        st["t_admit"] = st["t_admit"].at[admitted_ids].set(t, mode="drop")
        st["t_first"] = st["t_first"].at[jnp.where(first, req, n)].set(end, mode="drop")
        st["t_end"] = st["t_end"].at[jnp.where(done, req, n)].set(end, mode="drop")
        if closed:
            owner = jnp.where(done, jnp.mod(req, C), C)
            freed_time = st["client_time"].at[owner].set(end, mode="drop")
            st["client_time"] = jnp.where(st["client_next"] < n, freed_time, inf)
        n_done = jnp.sum(done).astype(jnp.int32)
        # one scatter for the four slot fields (XLA:CPU runs a batched scatter as a loop over lanes)
        fields = jnp.stack([req.astype(dt), p_new, j_new, last], axis=-1)
        packed = jnp.zeros_like(fields).at[:, 0].set(-1.0).at[dest].set(fields, mode="drop")
        st["slot_req"] = st["slot_req"].at[r].set(packed[:, 0].astype(jnp.int32))
        st["slot_p"] = st["slot_p"].at[r].set(packed[:, 1])
        st["slot_j"] = st["slot_j"].at[r].set(packed[:, 2])
        st["slot_last"] = st["slot_last"].at[r].set(packed[:, 3])
        st["head"] = st["head"].at[r].set(head)
        st["tail"] = st["tail"].at[r].set(jnp.where(head >= 0, st["tail"][r], -1))
        st["qlen"] = st["qlen"].at[r].add(-(count - count0).astype(jnp.int32))
        st["queue_peak"] = st["queue_peak"].at[r].max(st["qlen"][r])
        kv_in_use = params["pool"] - free
        st["kv_peak"] = st["kv_peak"].at[r].max(kv_in_use)
        st["free"] = st["free"].at[r].set(free + jnp.sum(jnp.where(done, footprint[rc], zero)))
        st["admitted"] = st["admitted"].at[r].set(kept)
        st["in_system"] = st["in_system"].at[r].add(-n_done)
        st["last_done"] = st["last_done"].at[r].set(n_done)
        st["clock"] = st["clock"].at[r].set(end)
        st["busy"] = st["busy"].at[r].add(tau)
        st["gaps"] = gaps
        st["steps"] = st["steps"] + 1
        st["stuck"] = count == 0
        return st

    def body(st):
        st = route_due(st)
        return jax.lax.cond(jnp.isfinite(jnp.min(ready(st))), step, lambda s: s, st)

    def more(st):
        t, _ = next_arrival(st)
        return (jnp.isfinite(t) | jnp.isfinite(jnp.min(ready(st)))) & ~st["stuck"]

    st = jax.lax.while_loop(more, body, state)
    return {
        "arrival_s": st["t_arr"],
        "admit_s": st["t_admit"],
        "first_token_s": st["t_first"],
        "end_s": st["t_end"],
        "replica": st["route"],
        "busy_s": st["busy"],
        "queue_peak": st["queue_peak"],
        "kv_peak_bytes": st["kv_peak"],
        "gaps": st["gaps"],
        "steps": st["steps"],
        "stuck": st["stuck"],
    }


@functools.partial(jax.jit, static_argnames=("replicas", "slots", "clients", "closed", "router", "shared_stream"))
def run_lanes(params, stream, *, replicas, slots, clients=1, closed=False, router="round_robin", shared_stream=True):
    """§9 over lanes: every leaf of ``params`` has a leading lane axis; ``stream``'s leaves are (N,) shared by
    every lane (``shared_stream``) or (lanes, N). Returns :func:`_lane`'s records with a leading lane axis."""
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    lane = functools.partial(_lane, replicas=replicas, slots=slots, clients=clients, closed=closed, router=router)
    return jax.vmap(lane, in_axes=(0, None if shared_stream else 0))(params, stream)


def run_dealt(params, stream, *, shared_stream=True, **static):
    """:func:`run_lanes` with the lanes dealt in equal chunks to every compute device (one core each on the CPU,
    :mod:`.dispatch`); the same records, per lane, as one call."""
    from .dispatch import compute_devices, pipelined

    lanes = len(np.asarray(params["batch"]))
    devices = compute_devices()
    d = max(1, min(len(devices), lanes))
    per = -(-lanes // d)
    index = np.minimum(np.arange(per * d), lanes - 1)  # the last lane repeated as padding, dropped below
    chunks = [index[k * per : (k + 1) * per] for k in range(d)]

    def run(chunk, device):
        sub = jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x)[chunk], device), params)
        take = (lambda x: np.asarray(x)) if shared_stream else (lambda x: np.asarray(x)[chunk])
        st = jax.tree_util.tree_map(lambda x: jax.device_put(take(x), device), stream)
        return run_lanes(sub, st, shared_stream=shared_stream, **static)

    parts = [jax.device_get(out) for _, out in pipelined(chunks, run, devices[:d])]
    return {key: np.concatenate([np.asarray(p[key]) for p in parts])[:lanes] for key in parts[0]}


def simulate_candidates(terms, batch, footprint, stream, *, replicas: int, router: str = "round_robin", clients=None):
    """§9 for K candidates at R replicas each: ``terms`` (:func:`slimjax.model.batching.replica_terms`, leaves
    (K,)), ``batch`` (K,), ``footprint`` (K, N), ``stream`` (arrival_s, input_len, output_len), (N,) each.

    A lane's slot arrays are as wide as its batch limit rounded up to a power of two (candidates are run in
    groups of equal width: every op of a step is over the slots, so a B = 8 lane must not pay for B = 512).
    Returns numpy records: per request (K, N) in stream order, per replica (K, R), per candidate (K, …)."""
    batch = np.asarray(batch)
    width = 2 ** np.ceil(np.log2(np.maximum(batch, 1))).astype(int)
    groups = [np.flatnonzero(width == w) for w in np.unique(width)]
    if len(groups) == 1:
        return _simulate_group(terms, batch, footprint, stream, replicas=replicas, router=router, clients=clients)
    parts = []
    for idx in groups:
        sub = jax.tree_util.tree_map(lambda x, idx=idx: np.asarray(x)[idx], terms)
        parts.append(
            _simulate_group(
                sub, batch[idx], np.asarray(footprint)[idx], stream, replicas=replicas, router=router, clients=clients
            )
        )
    order = np.argsort(np.concatenate(groups))
    return {key: np.concatenate([np.asarray(p[key]) for p in parts])[order] for key in parts[0]}


def _simulate_group(
    terms, batch, footprint, stream, *, replicas: int, router: str = "round_robin", clients: int | None = None
):
    """One group of :func:`simulate_candidates` (slots as wide as its largest batch limit, to a power of two).

    Round robin on an open stream makes the replicas independent (request i is replica i mod R's whatever the
    others do), so each replica is a lane of its own on its sub-stream: the same results as one lane of R
    replicas, with work proportional to N rather than to R·N. ``least_loaded`` and closed loops couple the
    replicas: one lane holds all R. Returns numpy records: per request (K, N) in stream order, per replica
    (K, R), per candidate (K, …)."""
    K, N = footprint.shape
    R = int(replicas)
    slots = int(2 ** np.ceil(np.log2(max(float(np.max(batch)), 1.0))))
    closed = clients is not None
    if router == "round_robin" and not closed and R > 1:
        M = -(-N // R)
        index = np.arange(R)[:, None] + R * np.arange(M)[None, :]  # (R, M): replica r's requests
        real = index < N
        safe = np.where(real, index, 0)
        lane_of = lambda x: np.repeat(np.asarray(x), R, axis=0)  # noqa: E731  (K,) → (K·R,)
        params = jax.tree_util.tree_map(lane_of, dict(terms, batch=batch))
        fp = np.where(real[None], np.asarray(footprint)[:, safe], 0.0).reshape(K * R, M)
        params["footprint"] = fp.astype(np.asarray(footprint).dtype)
        sub = {
            "arrival_s": np.where(real, np.asarray(stream["arrival_s"])[safe], np.inf),
            "input_len": np.where(real, np.asarray(stream["input_len"])[safe], 1.0),
            "output_len": np.where(real, np.asarray(stream["output_len"])[safe], 1.0),
        }
        sub = {k: np.tile(v.astype(np.asarray(stream[k]).dtype), (K, 1)) for k, v in sub.items()}
        out = run_dealt(params, sub, replicas=1, slots=slots, shared_stream=False)
        records = {}
        flat = index[real]
        for key in ("arrival_s", "admit_s", "first_token_s", "end_s"):
            full = np.full((K, N), np.nan, out[key].dtype)
            full[:, flat] = out[key].reshape(K, R, M)[:, real]
            records[key] = full
        records["replica"] = np.broadcast_to(np.arange(N) % R, (K, N)).copy()
        for key in ("busy_s", "queue_peak", "kv_peak_bytes"):
            records[key] = out[key].reshape(K, R)
        records["gaps"] = out["gaps"].reshape(K, R, -1).sum(axis=1)
        records["steps"] = out["steps"].reshape(K, R).sum(axis=1)
        records["stuck"] = out["stuck"].reshape(K, R).any(axis=1)
        return records
    per_candidate = dict(terms, batch=batch, footprint=footprint)
    return run_dealt(per_candidate, stream, replicas=R, slots=slots, clients=clients or 1, closed=closed, router=router)


SUMMARY_QUANTILES = (0.5, 0.9, 0.99)


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
    for name, x in (("ttft", ttft), ("tpot", tpot)):
        x = np.where(counted, x, np.nan)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[f"{name}_mean_s"] = np.nanmean(x, axis=-1)
            for q in SUMMARY_QUANTILES:
                out[f"{name}_p{round(q * 100)}_s"] = np.nanquantile(x, q, axis=-1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out["e2e_mean_s"] = np.nanmean(np.where(counted, e2e, np.nan), axis=-1)
        span = np.nanmax(records["end_s"], axis=-1) - np.nanmin(records["arrival_s"], axis=-1)
    out["token_gap_p90_s"] = gap_quantile(records["gaps"], 0.9)
    busy = records["busy_s"]
    out["utilization"] = np.sum(busy, axis=-1) / (busy.shape[-1] * span)
    out["queue_peak"] = np.max(records["queue_peak"], axis=-1).astype(float)
    out["kv_peak_bytes"] = np.max(records["kv_peak_bytes"], axis=-1)
    return out
