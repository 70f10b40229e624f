"""Disaggregated prefill and decode (MODEL.md §10) on a request stream: per deployment and model, the prefill pool
(§9 steps holding only prompt chunks, admission by footprint(I_i), a prompt's KV held until its transfer ends),
the transfer, and the decode pool (decode-only §9 steps from T = I_i + 1, admission by B_d and footprint(I_i + O_i)),
both through :func:`slimjax.engine.sim.round_robin_jobs` (round robin: request i to prefill replica i mod R_p;
the k-th arrival at the decode pool to decode replica k mod R_d).

Transfer (§10): t_xfer = t_net(kv_bytes_per_token·I_i / min(n_p, n_d)) (n: a pool's GPUs of one attention rank,
n_tp·n_pp) over the slower pool's NIC (BW_net the
smaller, τ_net the larger of the two), or, ``nvlink``, τ + x / (η_link·BW_link) of the shared node's link. A
request with O_i = 1 is done at its first token and moves nothing.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ..config import float64_scope
from ..engine import sim as engine
from ..engine.dataset import declared
from ..engine.schema import Variable, table
from ..errors import SlimjaxError
from ..inputs.disaggregated import Deployment, Pool
from ..model import batching as steps
from ..model import procurement as proc
from ..model.memory import model_kv_bytes_per_layer_token
from ..model.parallel import link_bandwidth
from ..model.pipeline import kv_transfer_time
from ..model.specs import GPUSpec, ModelSpec, stack
from .candidates import REASON_CODE, SIM_REASONS, workload_stream  # one table of why a fleet has no size

DEPLOYED = ("workload", "rate", "model", "deployment")
CHOICE = ("workload", "rate", "model")
_D = "disaggregated"
# what a procurement study's disaggregated section adds to its Dataset (MODEL.md §10)
DISAGGREGATED_SIZING = table(
    Variable(
        "disagg_prefill_replicas", DEPLOYED, "replica groups", "R_p: fewest prefill replicas meeting the TTFT SLO", _D
    ),
    Variable(
        "disagg_decode_replicas",
        DEPLOYED,
        "replica groups",
        "R_d: fewest decode replicas meeting ITL and E2E at R_p",
        _D,
    ),
    Variable("disagg_gpus", DEPLOYED, "GPUs", "R_p·n_p + R_d·n_d", _D),
    Variable("disagg_cost_per_hour", DEPLOYED, "USD/hour", "R_p·n_p·price_p + R_d·n_d·price_d (illustrative)", _D),
    Variable("disagg_cost_per_mtok", DEPLOYED, "USD/Mtok", "cost per million tokens served", _D),
    Variable("disagg_sim_ttft_p_s", DEPLOYED, "s", "simulated p-quantile TTFT at (R_p, R_d)", _D),
    Variable(
        "disagg_sim_tpot_p_s", DEPLOYED, "s", "simulated p-quantile TPOT (transfer and decode queue included)", _D
    ),
    Variable("disagg_sim_e2e_mean_s", DEPLOYED, "s", "simulated mean E2E", _D),
    Variable(
        "disagg_reason",
        DEPLOYED,
        None,
        "0: sized; else why no (R_p, R_d) up to max_replicas",
        _D,
        "int8",
        flags=SIM_REASONS,
    ),
    Variable(
        "disagg_decode_binding",
        DEPLOYED,
        None,
        "the SLO the decode pool missed one replica fewer",
        _D,
        "int8",
        flags=SIM_REASONS,
    ),
    Variable("best_disagg", CHOICE, None, "index of the cheapest deployment (-1: none)", _D, "int32"),
    Variable("best_disagg_cost_per_hour", CHOICE, "USD/hour", "cost of the cheapest deployment (illustrative)", _D),
    Variable("best_disagg_cost_per_mtok", CHOICE, "USD/Mtok", "cost per million tokens of the cheapest deployment", _D),
    Variable(
        "disagg_saving_per_hour",
        CHOICE,
        "USD/hour",
        "best aggregated − best disaggregated (positive: disaggregating pays)",
        _D,
    ),
)

PREFILL_BATCH = 1e9  # the prefill pool admits by KV alone (§10): no batch limit


def _specs(model: ModelSpec, pool: Pool):
    gpu = stack(GPUSpec, [pool.gpu_row] * len(np.asarray(model.n_layers)))
    return gpu, pool.serving


def transfer_seconds(kv_bytes, deployment: Deployment):
    """t_xfer of ``kv_bytes`` of a prompt's KV (§10, :func:`slimjax.model.pipeline.kv_transfer_time`), seconds;
    broadcasts. Over NVLink (both pools in one node) a GPU pair's achieved link, η_link·BW_link
    (:func:`slimjax.model.parallel.link_bandwidth` of two GPUs) after τ; over the network the slower NIC after the
    larger latency."""
    p, d = deployment.prefill, deployment.decode
    lanes = min(p.rank_gpus, d.rank_gpus)  # a request's KV lives on one attention rank's GPUs
    if deployment.transfer == "nvlink":
        row = p.gpu_row
        with float64_scope():
            link = float(link_bandwidth(2.0, row["link_bytes_per_s"], row["link_mesh"], row["link_efficiency"]))
        return kv_transfer_time(kv_bytes, lanes, link, row["allreduce_latency_s"])
    bw = min(p.gpu_row["network_bytes_per_s"], d.gpu_row["network_bytes_per_s"])
    return kv_transfer_time(kv_bytes, lanes, bw, max(p.gpu_row["network_latency_s"], d.gpu_row["network_latency_s"]))


def _pool_inputs(model, pool: Pool, tokens):
    """(terms, footprint (M, N), fits (M,)) of one pool for every model, float64."""
    gpu, serving = _specs(model, pool)
    with float64_scope():
        terms = steps.replica_terms(model, gpu, serving)
        footprint = steps.request_footprint_bytes(
            jax.tree_util.tree_map(lambda x: jnp.asarray(x)[:, None], model),
            jax.tree_util.tree_map(lambda x: jnp.asarray(x)[:, None], serving),
            jnp.asarray(tokens, jnp.float64),
        )
        terms = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), terms)
    n_heads, layers = np.asarray(model.n_heads), np.asarray(model.n_layers)
    fits = (terms["pool"] > 0) & (np.mod(n_heads, pool.tp) == 0) & (pool.pp <= layers)
    return terms, np.asarray(footprint), fits


def pool_inputs(models: list[str], model: ModelSpec, deployment: Deployment, stream: dict) -> dict:
    """What both phases need for every model: each pool's terms, footprints (prompt on the prefill pool, I + O
    on the decode pool), whether the deployment fits, and each request's transfer time (M, N). A request too
    large for an engine's whole pool is an error, named."""
    i_len, o_len = np.asarray(stream["input_len"], float), np.asarray(stream["output_len"], float)
    p, d = deployment.prefill, deployment.decode
    terms_p, fp_p, fits_p = _pool_inputs(model, p, i_len[None, :])
    terms_d, fp_d, fits_d = _pool_inputs(model, d, (i_len + o_len)[None, :])
    for name, fp, terms, ok, what in (
        ("prefill", fp_p, terms_p, fits_p, "prompt"),
        ("decode", np.where(o_len[None, :] > 1, fp_d, 0.0), terms_d, fits_d, "I + O"),
    ):
        over = ok[:, None] & (fp > terms["pool"][:, None])
        if over.any():
            m, i = np.argwhere(over)[0]
            raise SlimjaxError(
                f"stream request {i}",
                f"its {what} KV ({fp[m, i] / 2**30:.3g} GiB) exceeds one {name} engine's whole pool "
                f"({terms['pool'][m] / 2**30:.3g} GiB) for {models[m]} in {deployment.label()}",
            )
    with float64_scope():
        e_kv = np.asarray(model_kv_bytes_per_layer_token(model, p.serving.kv_dtype_bytes))
    kv_per_token = e_kv * np.asarray(model.n_layers)  # L·e_kv, raw (§3)
    xfer = np.where(o_len[None, :] > 1, transfer_seconds(kv_per_token[:, None] * i_len[None, :], deployment), 0.0)
    return dict(terms_p=terms_p, fp_p=fp_p, terms_d=terms_d, fp_d=fp_d, fits=fits_p & fits_d, xfer=xfer)


def _cast(tree, dtype):
    return jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype), tree)


def prefill_jobs(terms, batch, replicas, streams, footprints, hold, dtype=np.float64) -> dict:
    """The prefill pool (§10) of each job j, candidate j of ``terms`` and ``batch`` (leaves (J,)) at ``replicas[j]``
    replicas on its own stream ``streams[j]`` (arrival_s, input_len, …; (N_j,)), each request's KV footprint of its
    prompt ``footprints[j]`` held ``hold[j]`` (its transfer) past its first token; requests dealt round robin in
    arrival order (ties to the lower index). Returns per job its first-token times (N_j,) in its stream's order, and
    the pool's busy time and steps summed over jobs."""
    J = len(streams)
    subs, fps, orders = [], [], []
    for st, fp, h in zip(streams, footprints, hold, strict=True):
        a = np.asarray(st["arrival_s"])
        order = np.lexsort((np.arange(len(a)), a))
        orders.append(order)
        sub = {k: np.asarray(v)[order].astype(dtype) for k, v in st.items()}
        subs.append(dict(sub, output_len=np.ones(len(a), dtype), hold_s=np.asarray(h)[order].astype(dtype)))
        fps.append(np.broadcast_to(np.asarray(fp)[order].astype(dtype), (J, len(a))))  # candidate j reads row j
    jobs = np.arange(J)
    with jax.enable_x64(dtype == np.float64):
        rec = engine.round_robin_jobs(
            _cast(terms, dtype), np.asarray(batch).astype(dtype), fps, subs, jobs, jobs, np.asarray(replicas)
        )
    first = []
    for j, order in enumerate(orders):
        f = np.empty(len(order))
        f[order] = rec[j]["first_token_s"][0]
        first.append(f)
    return dict(
        first=first,
        busy=np.array([np.sum(rec[j]["busy_s"]) for j in range(J)]),
        steps=int(sum(np.sum(rec[j]["steps"]) for j in range(J))),
    )


def decode_jobs(terms, batch, replicas, streams, footprints, first, xfer, dtype=np.float64) -> dict:
    """The decode pool (§10) of each job j (as :func:`prefill_jobs`): each request with O > 1 arrives at its first
    token ``first[j]`` + transfer ``xfer[j]``, the k-th arrival (ties to the lower index) to replica k mod R_d, its KV
    of I + O ``footprints[j]``; completion times (N_j,) in stream order (the first token's where O = 1: done there)."""
    J = len(streams)
    subs, fps, orders = [], [], []
    for st, fp, f, x in zip(streams, footprints, first, xfer, strict=True):
        t_all = np.asarray(f) + np.asarray(x)
        go = np.flatnonzero(np.asarray(st["output_len"]) > 1)
        t = np.where(np.isfinite(t_all[go]), t_all[go], np.inf)
        order = go[np.lexsort((go, t))]
        orders.append(order)
        subs.append(
            {
                "arrival_s": np.where(np.isfinite(t_all[order]), t_all[order], np.inf).astype(dtype),
                "input_len": np.asarray(st["input_len"])[order].astype(dtype),
                "output_len": np.asarray(st["output_len"])[order].astype(dtype),
                "prefilled": np.ones(len(order), dtype),
            }
        )
        fps.append(np.broadcast_to(np.asarray(fp)[order].astype(dtype), (J, len(order))))
    end = [np.array(f, np.float64) for f in first]  # a request with O = 1 is done at its first token
    if not any(len(o) for o in orders):
        return dict(end=end, busy=np.zeros(J), steps=0)
    jobs = np.arange(J)
    with jax.enable_x64(dtype == np.float64):
        rec = engine.round_robin_jobs(
            _cast(terms, dtype), np.asarray(batch).astype(dtype), fps, subs, jobs, jobs, np.asarray(replicas)
        )
    for j, order in enumerate(orders):
        end[j][order] = rec[j]["end_s"][0]
    return dict(
        end=end,
        busy=np.array([np.sum(rec[j]["busy_s"]) for j in range(J)]),
        steps=int(sum(np.sum(rec[j]["steps"]) for j in range(J))),
    )


def prefill_phase(inputs: dict, stream: dict, replicas, dtype=np.float64) -> dict:
    """The prefill pool of each model at ``replicas[m]`` replicas: first-token times (M, N) and busy time, steps."""
    M = len(inputs["fits"])
    got = prefill_jobs(
        inputs["terms_p"],
        np.full(M, PREFILL_BATCH),
        replicas,
        [stream] * M,
        list(inputs["fp_p"]),  # stream m's job is candidate m: row m of every model's
        list(inputs["xfer"]),
        dtype,
    )
    return dict(first=np.stack(got["first"]).astype(np.float64), busy=got["busy"], steps=got["steps"])


def decode_phase(inputs: dict, stream: dict, first, batch: float, replicas, dtype=np.float64) -> dict:
    """The decode pool of each model at ``replicas[m]``: each request arrives at first token + transfer, the k-th
    arrival (ties to the lower index) to replica k mod R_d; completion times (M, N) (the first token's where O = 1)."""
    M = len(inputs["fits"])
    got = decode_jobs(
        inputs["terms_d"],
        np.full(M, batch),
        replicas,
        [stream] * M,
        list(inputs["fp_d"]),
        list(first),
        list(inputs["xfer"]),
        dtype,
    )
    return dict(end=np.stack(got["end"]), busy=got["busy"], steps=got["steps"])


def closed_loop(
    terms_p,
    batch_p,
    replicas_p,
    terms_d,
    batch_d,
    replicas_d,
    streams,
    fp_p,
    fp_d,
    xfer,
    clients,
    max_passes: int = 256,
    dtype=np.float64,
) -> list[dict]:
    """§10 under a closed loop of clients (docs/layouts.md, disaggregated rows): job j (candidate j of each pool's
    ``terms``/``batch``, at ``replicas_*[j]`` replicas) has ``clients[j]`` = C clients, each sending its next request
    when its last completes; request q of ``streams[j]`` (input_len, output_len, (N_j,), N_j a multiple of C) is
    client q mod C's (q div C)-th, with its prompt's footprint ``fp_p[j]``, its I + O footprint ``fp_d[j]`` and its
    transfer ``xfer[j]`` (N_j,).

    The arrivals are the fixed point of a(q) = 0 for q < C, a(q) = end(q − C) after, where end is the open pools'
    (:func:`prefill_jobs`, :func:`decode_jobs`) at those arrivals: iterated from every later request unsent (+inf)
    until a pass changes no arrival (exactly). Both pools are non-anticipating (a step depends only on what arrived
    before it), so a pass leaves every event before the first wrong arrival right, and that point moves by at least
    the shortest request's latency each pass: the iteration ends, and its fixed point is the closed loop's. Returns
    per job arrival_s, first_token_s, end_s (N_j,), passes and settled (False: ``max_passes`` ran out; its times are
    not the closed loop's)."""
    arrival = []
    for st, c in zip(streams, clients, strict=True):
        n = len(np.asarray(st["input_len"]))
        arrival.append(np.where(np.arange(n) < int(c), 0.0, np.inf))
    settled = np.zeros(len(streams), bool)
    passes = np.zeros(len(streams), int)
    for k in range(1, max_passes + 1):
        opened = [dict(st, arrival_s=a) for st, a in zip(streams, arrival, strict=True)]
        first = prefill_jobs(terms_p, batch_p, replicas_p, opened, fp_p, xfer, dtype)["first"]
        end = decode_jobs(terms_d, batch_d, replicas_d, opened, fp_d, first, xfer, dtype)["end"]
        passes[~settled] = k  # the pass that finds a job's arrivals unchanged is its last
        nxt = [
            np.concatenate([a[: int(c)], np.where(np.isfinite(e[: len(a) - int(c)]), e[: len(a) - int(c)], np.inf)])
            for a, e, c in zip(arrival, end, clients, strict=True)
        ]
        settled = np.array([np.array_equal(n, a) for n, a in zip(nxt, arrival, strict=True)])
        arrival = nxt
        if settled.all():
            break
    return [
        dict(arrival_s=a, first_token_s=f, end_s=e, passes=int(p), settled=bool(ok))
        for a, f, e, p, ok in zip(arrival, first, end, passes, settled, strict=True)
    ]


def request_times(first, end, stream: dict):
    """(TTFT, E2E, TPOT) per request (§10: TPOT includes the transfer and the decode queue)."""
    arrival, o_len = np.asarray(stream["arrival_s"], float), np.asarray(stream["output_len"], float)
    ttft, e2e = first - arrival, end - arrival
    with np.errstate(all="ignore"):
        tpot = np.where(o_len > 1, (e2e - ttft) / np.maximum(o_len - 1.0, 1.0), np.nan)
    return ttft, e2e, tpot


def run_deployment(models: list[str], model: ModelSpec, deployment: Deployment, stream: dict, dtype=np.float64):
    """Per request (M, N) TTFT, E2E, TPOT and transfer times; per model the pools' busy time, steps and whether the
    deployment fits, at the deployment's own R_p and R_d. ``stream``: arrival_s, input_len, output_len (N,), open."""
    M = len(models)
    inputs = pool_inputs(models, model, deployment, stream)
    pre = prefill_phase(inputs, stream, np.full(M, deployment.prefill.replicas), dtype)
    dec = decode_phase(
        inputs, stream, pre["first"], deployment.decode.batch, np.full(M, deployment.decode.replicas), dtype
    )
    ttft, e2e, tpot = request_times(pre["first"], dec["end"], stream)
    nan = ~inputs["fits"][:, None]
    return dict(
        ttft_s=np.where(nan, np.nan, ttft),
        e2e_s=np.where(nan, np.nan, e2e),
        tpot_s=np.where(nan, np.nan, tpot),
        transfer_s=np.where(nan, np.nan, inputs["xfer"]),
        prefill_busy_s=pre["busy"],
        decode_busy_s=dec["busy"],
        steps=pre["steps"] + dec["steps"],
        fits=inputs["fits"],
    )


def summaries(got: dict, deployment: Deployment, arrival) -> dict:
    """Per model: TTFT and TPOT mean and p50/p90/p99 (numpy's linear quantiles), mean E2E, each pool's
    utilisation (busy time / (engines × span)), GPUs and $/hour of the deployment."""
    out = engine.time_summaries(got["ttft_s"], got["tpot_s"], got["e2e_s"])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        span = np.nanmax(got["e2e_s"] + np.asarray(arrival)[None, :], axis=-1) - np.min(arrival)
    p, d = deployment.prefill, deployment.decode
    out["prefill_utilization"] = got["prefill_busy_s"] / (p.replicas * p.engines * span)
    out["decode_utilization"] = got["decode_busy_s"] / (d.replicas * d.engines * span)
    gpus = p.replicas * p.gpus + d.replicas * d.gpus
    cost = proc.two_pool_cost_per_hour(
        p.replicas, p.gpus, p.gpu_row["price_per_hour"], d.replicas, d.gpus, d.gpu_row["price_per_hour"]
    )
    fits = got["fits"]
    out["gpus"] = np.where(fits, float(gpus), np.nan)
    out["cost_per_hour"] = np.where(fits, cost, np.nan)
    return {k: np.where(fits, v, np.nan) for k, v in out.items()}


def _quantile(x, q):
    x = np.asarray(x, float)
    if np.any(np.isnan(x)):
        return np.inf  # a request that never finished: the SLO is not met
    return float(np.quantile(x, q)) if x.size else 0.0


def smallest_meeting(meets, max_replicas: int):
    """The smallest R in [1, max_replicas] with ``meets(R)`` true, by doubling from 1 then bisection (p-quantiles
    are non-increasing in R under round robin up to simulation ties, and nothing more is assumed: the bracket is
    searched, never extrapolated); None where max_replicas fails. ``meets(R)`` -> (ok, info); returns
    (R, info at R, info at the largest failing R tried below it or None)."""
    lo, lo_info, r = 0, None, 1
    while True:
        ok, info = meets(r)
        if ok:
            hi, hi_info = r, info
            break
        lo, lo_info = r, info
        if r >= max_replicas:
            return None, None, lo_info
        r = min(2 * r, max_replicas)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, info = meets(mid)
        if ok:
            hi, hi_info = mid, info
        else:
            lo, lo_info = mid, info
    return hi, hi_info, lo_info


def size_deployment(name: str, model: ModelSpec, deployment: Deployment, stream: dict, slo: dict, max_replicas: int):
    """MODEL.md §10 sizing of one deployment for one model (``model`` leaves (1,)) on ``stream``: R_p the smallest
    meeting the TTFT SLO (TTFT depends on the prefill pool alone), then R_d the smallest meeting the ITL (on the
    p-quantile TPOT) and E2E SLOs at that R_p (larger R_p is not searched). Returns R_p, R_d, the simulated
    p-quantile TTFT and TPOT and mean E2E, ``reason`` (SIM_REASONS: 0 feasible, else the pool that cannot meet its
    SLO at max_replicas) and ``binding`` (the SLO the decode pool failed with one replica fewer; 0: one sufficed)."""
    q = slo["quantile"]
    inputs = pool_inputs([name], model, deployment, stream)
    out = dict(prefill_replicas=np.nan, decode_replicas=np.nan, ttft=np.nan, tpot=np.nan, e2e=np.nan, binding=0)
    if not inputs["fits"][0]:
        return dict(out, reason=REASON_CODE["does_not_fit"])

    def prefill_meets(r):
        pre = prefill_phase(inputs, stream, np.array([r]))
        ttft = pre["first"][0] - np.asarray(stream["arrival_s"], float)
        return _quantile(ttft, q) <= slo["ttft_s"], pre["first"]

    r_p, first, _ = smallest_meeting(prefill_meets, max_replicas)
    if r_p is None:
        return dict(out, reason=REASON_CODE["ttft"])

    def decode_meets(r):
        dec = decode_phase(inputs, stream, first, deployment.decode.batch, np.array([r]))
        ttft, e2e, tpot = request_times(first[0], dec["end"][0], stream)
        many = np.asarray(stream["output_len"]) > 1  # O = 1 has no TPOT; an unfinished one fails (NaN)
        tpot_q = _quantile(tpot[many], q) if many.any() else 0.0
        e2e_mean = float(np.mean(e2e)) if np.all(np.isfinite(e2e)) else np.inf
        fails = "itl" if tpot_q > slo["itl_s"] else "e2e" if e2e_mean > slo["e2e_s"] else None
        return fails is None, dict(ttft=_quantile(ttft, q), tpot=tpot_q, e2e=e2e_mean, fails=fails)

    r_d, info, below = smallest_meeting(decode_meets, max_replicas)
    if r_d is None:
        return dict(out, prefill_replicas=r_p, reason=REASON_CODE[below["fails"]])
    binding = REASON_CODE[below["fails"]] if below is not None else 0
    return dict(
        prefill_replicas=r_p,
        decode_replicas=r_d,
        ttft=info["ttft"],
        tpot=info["tpot"],
        e2e=info["e2e"],
        binding=binding,
        reason=0,
    )


def size_study(study, ds):
    """Every disaggregated deployment of ``study`` sized (:func:`size_deployment`) per workload, rate and model on
    the workload's own stream, priced, and the cheapest beside the best aggregated fleet of ``ds`` (sized by
    simulation): ``disagg_*`` variables (dim ``deployment``), ``best_disagg_*`` and ``disagg_saving_per_hour``
    (aggregated − disaggregated: positive where disaggregating pays)."""

    deps = study.deployments
    W, Rr, M, D = len(study.workloads), len(study.rate_labels), len(study.models), len(deps)
    grid = (W, Rr, M, D)
    fields = ("prefill_replicas", "decode_replicas", "ttft", "tpot", "e2e", "binding", "reason")
    got = {k: np.full(grid, np.nan) for k in fields}
    got["reason"][:] = REASON_CODE["does_not_fit"]
    got["binding"][:] = 0
    for w, wl in enumerate(study.workloads):
        for r in range(Rr):
            rate = float(study.total_rate[w, r])
            if not np.isfinite(rate):
                continue
            stream = workload_stream(wl, rate, study.sizing)
            for m in range(M):
                one = jax.tree_util.tree_map(lambda x, m=m: np.asarray(x)[m : m + 1], study.model)
                for d, dep in enumerate(deps):
                    res = size_deployment(
                        study.models[m], one, _model_only(dep, m), stream, study.slo, study.sizing["max_replicas"]
                    )
                    for k in fields:
                        got[k][w, r, m, d] = res[k]
    n_p = np.array([dep.prefill.gpus for dep in deps], float)
    n_d = np.array([dep.decode.gpus for dep in deps], float)
    price_p = np.array([dep.prefill.gpu_row["price_per_hour"] for dep in deps])
    price_d = np.array([dep.decode.gpu_row["price_per_hour"] for dep in deps])
    r_p, r_d = got["prefill_replicas"], got["decode_replicas"]
    feasible = np.isfinite(r_d)
    gpus = np.where(feasible, r_p * n_p + r_d * n_d, np.nan)
    cost = np.where(feasible, proc.two_pool_cost_per_hour(r_p, n_p, price_p, r_d, n_d, price_d), np.nan)
    weight = ds["class_weight"].transpose("workload", "class").values
    lengths = ds["class_input_len"].transpose("workload", "class").values
    lengths = lengths + ds["class_output_len"].transpose("workload", "class").values
    tokens = np.sum(weight * lengths, -1)[:, None, None, None]
    rate = np.asarray(study.total_rate, float)[:, :, None, None]
    per_mtok = np.asarray(proc.cost_per_mtok(cost, rate, tokens))
    # the choice: least cost, then fewer GPUs, then the earlier deployment
    index = np.broadcast_to(np.arange(D), grid)
    order = np.lexsort((index, np.where(feasible, gpus, np.inf), np.where(feasible, cost, np.inf)), axis=-1)
    best = order[..., 0]
    any_ok = feasible.any(-1)

    def pick(x):
        return np.where(any_ok, np.take_along_axis(np.broadcast_to(x, grid), best[..., None], -1)[..., 0], np.nan)

    out = ds.copy()
    values = {
        "disagg_prefill_replicas": r_p,
        "disagg_decode_replicas": r_d,
        "disagg_gpus": gpus,
        "disagg_cost_per_hour": cost,
        "disagg_cost_per_mtok": per_mtok,
        "disagg_sim_ttft_p_s": got["ttft"],
        "disagg_sim_tpot_p_s": got["tpot"],
        "disagg_sim_e2e_mean_s": got["e2e"],
        "disagg_reason": got["reason"].astype(np.int8),
        "disagg_decode_binding": got["binding"].astype(np.int8),
        "best_disagg": np.where(any_ok, best, -1).astype(np.int32),
        "best_disagg_cost_per_hour": pick(cost),
        "best_disagg_cost_per_mtok": pick(per_mtok),
        "disagg_saving_per_hour": out["best_cost_per_hour"].transpose(*CHOICE).values - pick(cost),
    }
    for name, var in DISAGGREGATED_SIZING.items():
        out[name] = declared(var, values[name])
    out = out.assign_coords(deployment=np.asarray([dep.label(sized=True) for dep in deps], dtype=str))
    out.attrs["disaggregated"] = (
        "MODEL.md §10: R_p the smallest meeting TTFT, then R_d the smallest meeting ITL and E2E at that R_p (larger "
        "R_p not searched); KV moved over the network, held on the prefill replica until its transfer ends"
    )
    return out


def _model_only(dep: Deployment, m: int) -> Deployment:
    """The deployment with its pools' serving for model m alone (leaves (1,))."""
    import dataclasses

    def one(pool):
        serving = type(pool.serving)(**{k: np.asarray(v)[m : m + 1] for k, v in pool.serving.fields().items()})
        return dataclasses.replace(pool, serving=serving)

    return dataclasses.replace(dep, prefill=one(dep.prefill), decode=one(dep.decode))
