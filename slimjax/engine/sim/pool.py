"""Lanes run as a pool on every compute device (:func:`run_pool`), and the candidates and jobs of the studies
laid out as lanes: :func:`simulate_candidates` (any router, open or closed streams, pipeline stages as virtual
engines, §10) and :func:`round_robin_jobs` (round robin's independent replicas, one lane each, over several
streams at once). Host side: numpy in, numpy records out (:data:`slimjax.engine.sim.outputs.RECORDS`).
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from ...model.pipeline import engine_batch_limit
from ..dispatch import compute_devices
from .cache import STREAM_KEYS, lane_chains, stacked_lanes
from .loop import advance_lanes, init_lanes
from .outputs import PER_REPLICA, RECORDS, record_dtype, records, unset_fill
from .state import OPTIONAL_PARTS, lane_parts, widen_rows, with_parts

# compiled loop shapes kept between pool runs: each holds ~250 of the process's memory maps (65,530 by default),
# so a long study's shapes are dropped, and compiled again if met again, rather than run the kernel out of maps
MAX_COMPILED = 64
FIRST_SLOTS = 16  # slot width a lane starts at (at most its batch limit to a power of two), doubled as needed
PACKET_LANES = 128  # lanes a device steps together: past this the per-lane work dominates the per-step cost
SMALLEST_PACKET = 8
# a group that is all the work left, of at least SPLIT_LANES lanes and SPLIT_WORK lanes × requests, is dealt to every
# device (an hour's trace × 1,000 candidates: 211 → 155 s); others are not: each packet size is a compile, which only
# a long run repays (the test suite: 17 min 38 s of CPU with every such group dealt, 16 min 19 s with none), and two
# devices stepping small packets at once measured slower than one
SPLIT_LANES = 64
SPLIT_WORK = 1 << 16
LANE_ELEMENTS = 1 << 22  # requests × lanes in one pool of the sub-lane runs (their per-request arrays)
LONG_LANE = 4096  # sub-lanes longer than this are padded to a power of 2, shorter ones to a power of 4
POOL_LANES = 8192  # lanes in one pool at most (each carries a gap histogram)
# what stopping early needs (StopParams): per lane its job's SLOs, per job the late counts it allows
LANE_STOP = ("ttft_slo_s", "itl_slo_s")
JOB_STOP = ("ttft_allowed", "tpot_allowed")


def _bound_compiled() -> None:
    sizes = [getattr(f, "_cache_size", lambda: 0)() for f in (init_lanes, advance_lanes)]
    if sum(sizes) > MAX_COMPILED:
        init_lanes.clear_cache()
        advance_lanes.clear_cache()


def _pow2(x):
    return 2 ** np.ceil(np.log2(np.maximum(x, 1))).astype(int)


def _take(tree, idx):
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], tree)


def _marked(params, job):
    """``params`` with the stop keys' ``job`` where stopping (the init needs its counters)."""
    return params if job is None else dict(params, job=np.zeros(len(job), np.int32))


def run_pool(params, stream, *, first=None, shared_stream=True, stop=None, **static):
    """§9 over lanes to the end, on every compute device, in packets (:data:`PACKET_LANES` lanes) that devices
    take from one pool, each lane at the slot width it needs: it starts ``first`` wide (default
    :data:`FIRST_SLOTS`; at most its batch limit, to a power of two) and goes on twice as wide from where the
    width would have stopped an admission (the same results as slots as wide as B). A packet runs until a
    quarter of its lanes are live; those go back to the pool, so the lanes still running are packed densely
    and none waits for the longest. ``stop`` (contiguous lanes): per lane ``job``, ``ttft_slo_s``, ``itl_slo_s``
    and per job ``ttft_allowed``, ``tpot_allowed``: a job's lanes stop once its late count reaches either
    (:func:`slimjax.engine.sim.loop._advance`). Returns numpy records per lane, as
    :func:`slimjax.engine.sim.loop.run_lanes` (``stopped`` too, when stopping)."""
    _bound_compiled()
    static = {"clients": 1, "closed": False, "router": "round_robin", **static}
    params = jax.tree_util.tree_map(np.asarray, params)
    stream = {k: np.asarray(v) for k, v in stream.items()}
    parts = lane_parts(params)  # lanes with other optional parts run as loops of their own
    kinds, kind_of = np.unique(parts, axis=0, return_inverse=True)
    if len(kinds) > 1:
        groups = [np.flatnonzero(kind_of.reshape(-1) == k) for k in range(len(kinds))]
        got = []
        for at in groups:
            args, keywords = _lanes_of(params, stream, first, stop, at, shared_stream)
            got.append(run_pool(*args, **keywords, **static))
        return {k: _merged([g[k] for g in got], groups) for k in got[0]}
    params = with_parts(params, kinds[0])
    lanes = len(params["batch"])
    need = _pow2(params["batch"])
    requests = np.shape(stream["arrival_s"])[-1]
    if kinds[0][list(OPTIONAL_PARTS).index("prefix")]:  # the cache's log and event queue, at their longest
        tracked = np.asarray(stream[STREAM_KEYS["tracked"]], np.int64).reshape(-1, requests)
        static.update(
            log=int(tracked.sum(axis=1).max()) + requests + 1, events=2 * int(_pow2(min(need.max(), requests)))
        )
    else:
        stream = {k: v for k, v in stream.items() if k not in STREAM_KEYS.values()}
    width = np.minimum(need, _pow2(FIRST_SLOTS if first is None else first)).astype(int)
    contiguous = static["replicas"] == 1 and not static["closed"]
    per_lane = dict(params)
    job = None
    if stop is not None:
        job = np.asarray(stop["job"], np.int64)
        for k in LANE_STOP:
            per_lane[k] = np.asarray(stop[k], params["batch"].dtype)
        for k in JOB_STOP:
            per_lane[k] = np.asarray(stop[k], np.int64)[job].astype(np.int32)
    state = jax.device_get(init_lanes(_marked(per_lane, job), stream, slots=1, shared_stream=shared_stream, **static))
    state = jax.tree_util.tree_map(np.array, state)
    # each lane's slots at its own width; the rest of the state lane by lane
    rows = [widen_rows(state.slots[k], int(width[k])) for k in range(lanes)]
    state = state._replace(slots=None)
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
                    share = len(q)
                    alone = busy[0] == 0 and len(groups) == 1
                    if alone and share >= SPLIT_LANES and share * requests >= SPLIT_WORK:
                        share = -(-share // len(devices))  # the only work there is: a share for every device
                    got = [q.popleft() for _ in range(min(PACKET_LANES, share))]
                    busy[0] += 1
                    return w, np.array(got)
                if busy[0] == 0:
                    return None
                lock.wait()

    def packet(w, got, device):
        size = max(SMALLEST_PACKET, int(_pow2(len(got))))
        idx = np.concatenate([got, np.full(size - len(got), got[-1])])
        sub = _take(per_lane, idx)
        pad = np.arange(size) >= len(got)
        sub_state = _take(state, idx)
        sub_state = sub_state._replace(
            slots=np.stack([rows[i] for i in idx]),
            stuck=sub_state.stuck | pad,  # padding lanes never step
        )
        outside = {"ttft": np.zeros(size, np.int32), "tpot": np.zeros(size, np.int32)}
        if job is not None:
            local = np.unique(job[got], return_inverse=True)[1].reshape(-1)
            sub["job"] = np.concatenate([local, np.full(size - len(got), size - 1)]).astype(np.int32)
            for name, late in (("ttft", "ttft_late"), ("tpot", "tpot_late")):
                with lock:
                    counts = getattr(state.stop, late)
                    known = np.bincount(job, weights=counts, minlength=job.max() + 1)
                    mine = np.bincount(job[got], weights=counts[got], minlength=job.max() + 1)
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

            def put_back(dst, src):
                dst[got] = src[:n]

            jax.tree_util.tree_map(put_back, state, out._replace(slots=None))
            stopped = out.stop.stopped if out.stop is not None else np.zeros(size, bool)
            for i, lane in enumerate(got):
                rows[lane] = out.slots[i]
                if live[i]:
                    pending.setdefault(w, deque()).append(lane)
                elif out.overflow[i] and not out.stuck[i] and not stopped[i]:
                    state.overflow[lane] = False  # the step it stopped at is taken again, wider
                    rows[lane] = widen_rows(rows[lane], 2 * w)
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
    arrival = np.broadcast_to(stream["arrival_s"], state.done.shape[:-1])
    return records(arrival, state, contiguous, xp=np)


def _lanes_of(params, stream, first, stop, at, shared_stream) -> tuple[tuple, dict]:
    """(args, keywords) of :func:`run_pool` for lanes ``at`` only (a job's lanes share a candidate, so its optional
    parts: they are all in or all out)."""
    sub = _take(params, at)
    lane_stream = stream if shared_stream else {k: v[at] for k, v in stream.items()}
    lane_first = first if first is None or np.ndim(first) == 0 else np.asarray(first)[at]
    lane_stop = None
    if stop is not None:
        jobs, local = np.unique(np.asarray(stop["job"])[at], return_inverse=True)
        lane_stop = {k: np.asarray(stop[k])[at] for k in LANE_STOP}
        lane_stop.update(job=local.reshape(-1), **{k: np.asarray(stop[k])[jobs] for k in JOB_STOP})
    return (sub, lane_stream), dict(first=lane_first, shared_stream=shared_stream, stop=lane_stop)


def _merged(parts, lanes_of):
    """Records of lane subsets (``parts[i]`` for lanes ``lanes_of[i]``) in lane order."""
    lanes = sum(len(at) for at in lanes_of)
    out = np.empty((lanes, *np.shape(parts[0])[1:]), np.asarray(parts[0]).dtype)
    for part, at in zip(parts, lanes_of, strict=True):
        out[at] = part
    return out


def simulate_candidates(
    terms, batch, footprint, stream, *, replicas: int, router: str = "round_robin", clients=None, prefix=None
):
    """§9 for K candidates at R replicas each: ``terms`` (:func:`slimjax.model.batching.replica_terms`, leaves
    (K,)), ``batch`` (K,), ``footprint`` (K, N), ``stream`` (arrival_s, input_len, output_len), (N,) each.
    ``prefix``: (chain ids (N, H), h) of the stream's prompts, for candidates whose terms have a prefix cache
    (``prefix_block_tokens`` > 0; docs/simulation.md).

    Every op of a step is over a lane's slots, so slots are as wide as the requests a replica actually holds
    at once, not as its batch limit (:func:`run_pool`): the results are those of slots as wide as B.
    Returns numpy records: per request (K, N) in stream order, per replica (K, R), per candidate (K, …)."""
    batch = np.asarray(batch)
    if router == "round_robin" and clients is None:
        return simulate_round_robin(terms, batch, footprint, stream, np.full(len(batch), int(replicas)), prefix)
    if prefix is not None:
        stream = {**stream, **lane_chains(prefix[0][: len(stream["input_len"])], stream["input_len"], prefix[1])}

    # one lane holds all R replicas: least_loaded and closed loops couple them. A replica of n_pp stages is n_pp
    # virtual engines dealt arrivals round robin (§10): under round robin, R·n_pp engines (request i to engine
    # i mod R·n_pp: replica i mod R, its (i div R) mod n_pp-th engine)
    stages = engines_per_replica(terms, len(batch))
    if router != "round_robin" and np.any(stages > 1):
        raise ValueError(
            f"router {router!r} with pipeline stages or data-parallel ranks: a replica deals its arrivals to its "
            "n_pp·D engines round robin (MODEL.md §10, docs/layouts.md), which only the round_robin router composes "
            "with; use router: round_robin"
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


def engines_per_replica(terms: dict, candidates: int) -> np.ndarray:
    """Engines per replica per candidate, n_pp·D (integers; :func:`slimjax.model.calculator.replica_engines`; n_pp
    where the terms predate data-parallel ranks, 1 where they predate §10)."""
    engines = terms.get("engines", terms.get("pipeline_stages", np.ones(candidates)))
    return np.asarray(engines, np.float64).reshape(candidates).astype(int)


def engine_batch(batch, stages):
    """:func:`slimjax.model.pipeline.engine_batch_limit` on the host, in the batch's dtype."""
    batch = np.asarray(batch)
    return np.asarray(engine_batch_limit(batch, np.asarray(stages, batch.dtype))).astype(batch.dtype)


def simulate_round_robin(terms, batch, footprint, stream, replicas, prefix=None):
    """§9 for K candidates on one open stream under round robin, candidate k at ``replicas[k]`` replicas:
    :func:`round_robin_jobs` with one stream (``prefix``: its prompts' chains, :func:`simulate_candidates`).
    Returns numpy records: per request (K, N) in stream order, per replica (K, max R; zero past a candidate's R,
    whose count is ``records["replicas"]``), per candidate (K, …)."""
    K = len(np.asarray(batch))
    jobs = (np.zeros(K, int), np.arange(K), replicas)
    return round_robin_jobs(terms, batch, [footprint], [stream], *jobs, prefixes=[prefix])[0]


def padded_length(n):
    """Requests a sub-lane of n is padded to (with requests at +inf): a power of 4 up to :data:`LONG_LANE`, then of 2.
    Padding costs memory, not steps, and each length is a compile: few lengths where lanes are short, little memory
    where they are long (an hour's trace of 19,366 requests: 32,768, not 65,536)."""
    n = np.maximum(np.asarray(n), 1)
    short = 4 ** np.ceil(np.log(n) / np.log(4)).astype(int)
    return np.where(n > LONG_LANE, 2 ** np.ceil(np.log2(n)).astype(int), short)


def _job_records(jobs: int, n: int, r_max: int, dt) -> dict:
    """Empty merged records of ``jobs`` jobs on a stream of n requests, at most ``r_max`` engines each."""
    out = {}
    for r in RECORDS:
        shape = {"request": (jobs, n), "replica": (jobs, r_max), "lane": (jobs, r.bins) if r.bins else (jobs,)}
        out[r.name] = np.full(shape[r.per], unset_fill(r), record_dtype(r, dt))  # as a lane's own records start
    return out


def round_robin_jobs(
    terms,
    batch,
    footprints,
    streams,
    job_stream,
    job_candidate,
    job_replicas,
    first_slots=None,
    stop=None,
    prefixes=None,
):
    """§9 under round robin for jobs (stream s, candidate c, R replicas) over several open streams at once.

    Round robin makes the replicas independent (request i is replica i mod R's whatever the others do), so each
    replica is a lane of its own on its sub-stream: the same results as one lane of R replicas, with work
    proportional to N rather than to R·N, and jobs of any R and stream in one run (few calls, few shapes to
    compile). Sub-lanes are grouped by length (:func:`padded_length`, padded with requests at +inf) and run
    ``LANE_ELEMENTS`` at a time. ``terms``, ``batch``: per candidate (leaves (C,)); ``footprints[s]`` (C, N_s);
    ``streams[s]``: arrival_s, input_len, output_len (N_s,); ``first_slots`` (J,): each job's first slot width
    (default ``FIRST_SLOTS``; a good guess, such as the requests a replica held in an earlier run, saves reruns).
    Returns per stream the records of its jobs, in job order: per request (J_s, N_s), per replica (J_s, max R),
    per job (J_s, …); ``replicas`` the R of each. ``prefixes[s]``: stream s's (chain ids, h) or None
    (:func:`simulate_candidates`); each sub-lane's cache tracks the chains of its own sub-stream. ``stop``: per
    job ``ttft_slo_s``, ``itl_slo_s``, ``ttft_allowed``, ``tpot_allowed`` (:func:`run_pool`): a job's sub-lanes stop
    once it is certain to miss (its records are then incomplete and ``stopped`` is set)."""
    job_stream, job_candidate = np.asarray(job_stream, int), np.asarray(job_candidate, int)
    replicas = np.asarray(job_replicas, dtype=np.int64).reshape(len(job_stream))
    # a replica of n_pp stages is n_pp virtual engines dealt arrivals round robin (§10): R·n_pp round-robin
    # engines, each admitting ⌊B/n_pp⌋ (request i to engine i mod R·n_pp: replica i mod R)
    stages = engines_per_replica(terms, len(np.asarray(batch)))
    R = replicas * stages[job_candidate]
    batch = engine_batch(batch, stages)
    dt = np.asarray(streams[0]["arrival_s"]).dtype
    n_of = np.array([len(st["arrival_s"]) for st in streams])[job_stream]
    lane_job = np.repeat(np.arange(len(R)), R)
    lane_rep = np.arange(len(lane_job)) - np.repeat(np.cumsum(R) - R, R)
    lane_len = -(-(n_of[lane_job] - lane_rep) // R[lane_job])  # requests r, r + R, … below N
    bucket = padded_length(lane_len)
    row = np.zeros(len(R), int)  # each job's row among its stream's jobs
    chains_of = {}  # (stream, its requests' first index, stride): a sub-stream's lane_chains
    out = []
    for s, st in enumerate(streams):
        mine = np.flatnonzero(job_stream == s)
        row[mine] = np.arange(len(mine))
        n, r_max = len(st["arrival_s"]), int(R[mine].max()) if len(mine) else 1
        rec = _job_records(len(mine), n, r_max, dt)
        rec["arrival_s"] = np.broadcast_to(np.asarray(st["arrival_s"], dt), (len(mine), n)).copy()
        rec["replica"] = np.arange(n)[None] % replicas[mine][:, None]
        rec["replicas"] = R[mine]
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
            if prefixes is not None and any(p is not None for p in prefixes):
                sub.update(_sub_lane_chains(streams, prefixes, s_of, index, real, m, chains_of))
            first = None if first_slots is None else np.asarray(first_slots)[j]
            lane_stop = None
            if stop is not None:
                lane_stop = {k: np.asarray(stop[k])[j] for k in LANE_STOP}
                jobs, local = np.unique(j, return_inverse=True)
                lane_stop.update(job=local.reshape(-1), **{k: np.asarray(stop[k])[jobs] for k in JOB_STOP})
            got = run_pool(params, sub, first=first, shared_stream=False, stop=lane_stop, replicas=1)
            for s in np.unique(s_of):
                at = np.flatnonzero(s_of == s)
                rec, rows = out[s], row[j[at]]
                ok = real[at]
                rr, cols = np.broadcast_to(rows[:, None], ok.shape)[ok], index[at][ok]
                for record in RECORDS:
                    if record.name not in got:
                        continue
                    if record.per == "request":
                        rec[record.name][rr, cols] = got[record.name][at][ok]
                    elif record.per == "replica":
                        rec[record.name][rows, r[at]] = got[record.name][at, 0]
                    elif record.merge == "add":
                        np.add.at(rec[record.name], rows, got[record.name][at])
                    else:
                        np.logical_or.at(rec[record.name], rows, got[record.name][at])
    return out


def _sub_lane_chains(streams, prefixes, s_of, index, real, m, memo) -> dict:
    """The :func:`slimjax.engine.sim.cache.lane_chains` of each sub-lane's sub-stream (requests ``index[k]`` where
    ``real``), stacked and padded to m requests (a stream without chains: no blocks)."""
    lanes = []
    for k in range(len(s_of)):
        s, at = int(s_of[k]), index[k][real[k]]
        key = (s, int(at[0]) if len(at) else -1, int(at[1] - at[0]) if len(at) > 1 else 0, len(at))
        if key not in memo:
            chains, h = prefixes[s] if prefixes[s] is not None else (np.full((len(streams[s]["input_len"]), 0), -1), 1)
            memo[key] = lane_chains(np.asarray(chains)[at], np.asarray(streams[s]["input_len"])[at], h)
        lanes.append(memo[key])
    return stacked_lanes(lanes, m)
