"""Procurement studies (MODEL.md §8): every candidate (GPU, TP degree, batch limit) for every workload,
rate and model in one jitted evaluation, then the cheapest feasible choice and the per-class mix.

Layout inside the evaluation: ``[workload, mix, model, gpu, tp, batch, class]``. Mix row 0 is the
workload's class mixture; row 1 + k serves class k alone (the §8 mix), so one bisection gives λ* for
both. λ* does not depend on the total rate, so rates only enter the sizing.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from .._version import __version__
from ..config import float64_scope
from ..inputs.catalog import PRICE_DATE
from ..inputs.procurefile import Study
from ..model import memory
from ..model import procurement as proc
from ..model.calculator import capacity_cell_terms, service_terms
from ..model.queue import queue_bound

# Why a candidate is infeasible, checked in this order (the first failing check is reported).
REASONS = ("feasible", "tp_does_not_divide_heads", "memory", "itl", "ttft", "e2e", "unbounded_queue")
REASON_TEXT = {
    "tp_does_not_divide_heads": "TP degree does not divide the query heads",
    "memory": "does not fit: weights plus one sequence exceed the group's memory",
    "itl": "ITL above the SLO",
    "ttft": "TTFT above the SLO even unloaded",
    "e2e": "E2E above the SLO even unloaded",
    "unbounded_queue": "no positive rate keeps the queue within the SLOs",
}


def _axes(x, *positions, ndim=7):
    """Reshape an array whose axes are the layout positions ``positions`` to broadcast in the 7-d layout."""
    shape = [1] * ndim
    for p, n in zip(positions, np.shape(x), strict=False):
        shape[p] = n
    return jnp.reshape(x, shape)


def batch_buckets(batch) -> tuple[tuple[int, int, int], ...]:
    """(start, stop, static bound on m) over the sorted batch axis, one bucket per power-of-four bound:
    the queue's recurrence runs to each bucket's own bound, not the largest batch's."""
    out, start = [], 0
    bounds = [queue_bound(b) for b in batch]
    bounds = [max(4, int(4 ** np.ceil(np.log(b) / np.log(4)))) for b in bounds]
    for i in range(1, len(batch) + 1):
        if i == len(batch) or bounds[i] != bounds[start]:
            out.append((start, i, bounds[start]))
            start = i
    return tuple(out)


@functools.partial(jax.jit, static_argnames=("steps", "buckets"))
def _evaluate(
    model, gpu, serving, measured, tp, batch, class_in, class_out, mix_weight, total_rate, slo, steps, buckets
):
    """The candidate grid. Shapes: model leaves (M,), gpu (G,), serving and measured (M, G, N), tp (N,),
    batch (B,), class_in/out (W, K), mix_weight (W, X, K), total_rate (W, R)."""
    G, N = gpu.flops_per_s.shape[0], tp.shape[0]
    model7 = jax.tree_util.tree_map(lambda x: _axes(x, 2), model)
    gpu7 = jax.tree_util.tree_map(lambda x: _axes(x, 3), gpu)
    serving7 = jax.tree_util.tree_map(lambda x: _axes(x, 2, 3, 4), serving)
    measured7 = jax.tree_util.tree_map(lambda x: _axes(x, 2, 3, 4), measured)
    I, O = _axes(class_in, 0, 6), _axes(class_out, 0, 6)
    w = _axes(mix_weight, 0, 1, 6)
    B = _axes(batch, 5)[..., 0]  # (1, 1, 1, 1, 1, B)

    cell = capacity_cell_terms(model7, gpu7, serving7, I, O)
    pool = cell["kv_pool_bytes"][..., 0]  # (1, 1, M, G, N, 1)
    footprint = proc.mixture_mean(w, cell["seq_footprint_bytes"])  # F̄ (W, X, M, G, N, 1)
    divides = jnp.mod(model7.n_heads, serving7.n_gpu)[..., 0] == 0
    slots = jnp.where(divides, proc.mixture_slots(B, pool, footprint), 0.0)  # (W, X, M, G, N, B)
    per_class = service_terms(cell, measured7, jnp.maximum(slots, 1.0)[..., None], I, O)
    has_measured = ~jnp.isnan(measured7.batch)
    ttft = jnp.where(has_measured, measured7.ttft_s, proc.study_ttft(cell["prefill_s"], per_class["itl_s"]))
    itl, service = per_class["itl_s"], per_class["service_s"]
    mean_service = proc.mixture_mean(w, service)  # S̄
    max_batch = buckets[-1][2]
    lam = jnp.concatenate(
        [  # slots ≤ B, so each batch bucket's queue runs to its own bound
            proc.max_rate_per_replica(
                w,
                slots[..., a:b],
                mean_service[..., a:b],
                ttft[..., a:b, :],
                itl[..., a:b, :],
                service[..., a:b, :],
                slo["ttft_s"],
                slo["itl_s"],
                slo["e2e_s"],
                slo["quantile"],
                steps,
                bound,
            )
            for a, b, bound in buckets
        ],
        axis=-1,
    )

    itl_w, ttft_w, service_w = (proc.worst_class(w, x) for x in (itl, ttft, service))
    reason = jnp.select(
        [~divides, slots < 1, itl_w > slo["itl_s"], ttft_w > slo["ttft_s"], service_w > slo["e2e_s"], lam <= 0],
        [1, 2, 3, 4, 5, 6],
        0,
    )

    # ---- the mixture (mix row 0) at each total rate: dims (W, R, M, G, N, B)
    def row0(x):
        return x[:, 0][:, None]

    rate = total_rate[:, :, None, None, None, None]
    lam0, slots0, mean_s0 = row0(lam), row0(slots), row0(mean_service)
    n_gpu = serving7.n_gpu[:, 0, ..., 0]  # (1, M, G, N) -> broadcast below
    n_gpu = n_gpu[:, None]  # (1, 1, M, G, N, 1)
    price = gpu7.price_per_hour[:, 0, ..., 0][:, None]
    feasible = (lam0 > 0) & jnp.isfinite(rate)
    replicas = jnp.where(feasible, proc.replicas_needed(rate, lam0), jnp.nan)
    gpus_total = replicas * n_gpu
    cost = proc.cost_per_hour(replicas, n_gpu, price)
    tokens = jnp.sum(mix_weight[:, 0] * (class_in + class_out), axis=-1)[:, None, None, None, None, None]
    per_replica = jnp.where(feasible, rate / jnp.where(feasible, replicas, 1.0), jnp.nan)
    w0 = w[:, 0][:, None]
    ttft_p, e2e_mean, utilization = proc.latency_at_rate(
        w0, slots0, mean_s0, row0(ttft), row0(service), per_replica, slo["quantile"], max_batch
    )
    out = dict(
        slots=slots[:, 0],
        service_s=jnp.where(slots[:, 0] >= 1, mean_service[:, 0], jnp.nan),
        max_rate_per_replica=lam[:, 0],
        itl_s=jnp.where(slots[:, 0] >= 1, itl_w[:, 0], jnp.nan),
        ttft_unloaded_s=jnp.where(slots[:, 0] >= 1, ttft_w[:, 0], jnp.nan),
        e2e_unloaded_s=jnp.where(slots[:, 0] >= 1, service_w[:, 0], jnp.nan),
        infeasible_reason=reason[:, 0],
        weights_bytes=jnp.broadcast_to(cell["weights_bytes"][0, 0, ..., 0, 0], pool.shape[2:5]),
        kv_pool_bytes=pool[0, 0, ..., 0],
        fits=divides[:, 0, ..., 0] & (memory.max_concurrent_seqs(pool[:, 0, ..., 0], footprint[:, 0, ..., 0]) >= 1),
        memory_headroom=jnp.where(
            slots[:, 0] >= 1, proc.memory_headroom(slots[:, 0], footprint[:, 0], pool[:, 0]), jnp.nan
        ),
        feasible=feasible,
        replicas=replicas,
        gpus_total=gpus_total,
        cost_per_hour=cost,
        cost_per_mtok=proc.cost_per_mtok(cost, rate, tokens),
        ttft_p_s=jnp.where(feasible, ttft_p, jnp.nan),
        e2e_mean_s=jnp.where(feasible, e2e_mean, jnp.nan),
        utilization=jnp.where(feasible, utilization, jnp.nan),
    )

    # ---- choice per (W, R, M): least cost, then fewer GPUs, smaller TP, smaller batch, earlier GPU
    def choose(cost_, gpus_, feasible_):
        """Index into the flattened (G, N, B) candidates of the §8 choice, and whether any is feasible."""
        lead = cost_.shape[:-3]
        flat = lambda x: jnp.broadcast_to(x, (*lead, G, N, batch.shape[0])).reshape(*lead, -1)  # noqa: E731
        tp_key = flat(jnp.broadcast_to(tp[:, None], (N, batch.shape[0])))
        b_key = flat(jnp.broadcast_to(batch[None, :], (N, batch.shape[0])))
        c = flat(jnp.where(feasible_, cost_, jnp.inf))
        g = flat(jnp.where(feasible_, gpus_, jnp.inf))
        order = jnp.lexsort((b_key, tp_key, g, c), axis=-1)
        return order[..., 0], jnp.any(flat(feasible_), axis=-1)

    best, any_feasible = choose(cost, gpus_total, feasible)

    # ---- the mix: class k alone (mix row 1 + k) at w_k·Λ
    lam_k = jnp.moveaxis(lam[:, 1:], 1, 2)[:, None]  # (W, 1, M, K, G, N, B)
    weight_k = mix_weight[:, 0]  # (W, K)
    rate_k = total_rate[:, :, None, None, None, None, None] * weight_k[:, None, None, :, None, None, None]
    feasible_k = (lam_k > 0) & (rate_k > 0) & jnp.isfinite(rate_k)
    replicas_k = jnp.where(feasible_k, proc.replicas_needed(rate_k, lam_k), jnp.nan)
    n_k, price_k = n_gpu[:, :, :, None], price[:, :, :, None]
    cost_k = proc.cost_per_hour(replicas_k, n_k, price_k)
    best_k, any_k = choose(cost_k, replicas_k * n_k, feasible_k)  # (W, R, M, K)
    present = weight_k[:, None, None, :] > 0
    pick = lambda x, idx: jnp.take_along_axis(x.reshape(*x.shape[:-3], -1), idx[..., None], axis=-1)[..., 0]  # noqa: E731
    cost_k_best = jnp.where(
        any_k & present, pick(jnp.broadcast_to(cost_k, (*best_k.shape, G, N, batch.shape[0])), best_k), jnp.nan
    )
    mix_ok = jnp.all(any_k | ~present, axis=-1)
    mix_cost = jnp.where(mix_ok, jnp.nansum(jnp.where(present, cost_k_best, 0.0), axis=-1), jnp.nan)
    full = lambda x: jnp.broadcast_to(x, (*best.shape, G, N, batch.shape[0]))  # noqa: E731
    out.update(
        choice_index=best,
        choice_any=any_feasible,
        best_replicas=jnp.where(any_feasible, pick(full(replicas), best), jnp.nan),
        best_cost_per_hour=jnp.where(any_feasible, pick(full(cost), best), jnp.nan),
        best_cost_per_mtok=jnp.where(any_feasible, pick(full(out["cost_per_mtok"]), best), jnp.nan),
        mix_index=best_k,
        mix_any=any_k & present,
        mix_replicas=jnp.where(
            any_k & present, pick(jnp.broadcast_to(replicas_k, (*best_k.shape, G, N, batch.shape[0])), best_k), jnp.nan
        ),
        mix_class_cost_per_hour=cost_k_best,
        mix_cost_per_hour=mix_cost,
        reason_first=reason[:, 0, :, :, :, 0],  # at the smallest batch: what stops each (GPU, TP)
    )
    return out


# ------------------------------------------------------------------------------------ the Dataset

_CANDIDATE = ("workload", "model", "gpu", "tp", "batch")
_SIZED = ("workload", "rate", "model", "gpu", "tp", "batch")
_CHOICE = ("workload", "rate", "model")
_MIX = ("workload", "rate", "model", "class")
# name -> (dims, units, long_name): the study's variables (MODEL.md §8)
VARIABLES = {
    "total_rate": (("workload", "rate"), "requests/s", "total arrival rate Λ"),
    "class_input_len": (("workload", "class"), "tokens", "class prompt length I_k (rounded mean)"),
    "class_output_len": (("workload", "class"), "tokens", "class output length O_k (rounded mean)"),
    "class_weight": (("workload", "class"), "1", "class weight w_k = n_k/N (0: no such class)"),
    "weights_bytes": (("model", "gpu", "tp"), "bytes", "weights M_W of the group"),
    "kv_pool_bytes": (("model", "gpu", "tp"), "bytes", "KV pool u·M − M_W − M_R of the group"),
    "fits": (
        ("workload", "model", "gpu", "tp"),
        "1",
        "the group holds its weights and one mixture sequence (max_seqs ≥ 1, TP divides H_q)",
    ),
    "slots": (_CANDIDATE, "sequences", "slots m = min(B, ⌊pool / F̄⌋)"),
    "service_s": (_CANDIDATE, "s", "mixture service time S̄ = Σ w_k S_k(m)"),
    "max_rate_per_replica": (_CANDIDATE, "requests/s", "λ*, the largest per-replica rate meeting every SLO (0: none)"),
    "itl_s": (_CANDIDATE, "s", "ITL_k(m), worst class"),
    "ttft_unloaded_s": (_CANDIDATE, "s", "TTFT_k(m) = t_pre,k + ITL_k(m) without queueing, worst class"),
    "e2e_unloaded_s": (_CANDIDATE, "s", "S_k(m) without queueing, worst class"),
    "infeasible_reason": (_CANDIDATE, "1", "first failing check (0: feasible)"),
    "memory_headroom": (_CANDIDATE, "1", "1 − m·F̄/pool, the KV pool left unused"),
    "feasible": (_SIZED, "1", "λ* > 0: the candidate serves the rate under the SLOs"),
    "replicas": (_SIZED, "replica groups", "R = ⌈Λ/λ*⌉"),
    "gpus_total": (_SIZED, "GPUs", "R·n"),
    "cost_per_hour": (_SIZED, "USD/hour", "R·n·price per GPU-hour (illustrative)"),
    "cost_per_mtok": (_SIZED, "USD/Mtok", "cost per million prompt + output tokens (illustrative)"),
    "ttft_p_s": (_SIZED, "s", "W_p + TTFT_k(m) at Λ/R per replica, worst class"),
    "e2e_mean_s": (_SIZED, "s", "W_q + S_k(m) at Λ/R per replica, worst class"),
    "utilization": (_SIZED, "1", "ρ at Λ/R per replica"),
    "best_gpu": (_CHOICE, "", "chosen GPU ('' when no candidate is feasible)"),
    "best_tp": (_CHOICE, "GPUs", "chosen TP degree (0: none)"),
    "best_batch": (_CHOICE, "sequences", "chosen concurrency limit (0: none)"),
    "best_replicas": (_CHOICE, "replica groups", "replicas of the choice"),
    "best_gpus": (_CHOICE, "GPUs", "GPUs of the choice"),
    "best_cost_per_hour": (_CHOICE, "USD/hour", "cost of the choice (illustrative)"),
    "best_cost_per_mtok": (_CHOICE, "USD/Mtok", "cost per million tokens of the choice (illustrative)"),
    "binding_reason": (_CHOICE, "1", "0 when a candidate is feasible, else the check the furthest candidates fail"),
    "mix_cost_per_hour": (_CHOICE, "USD/hour", "each class on its own cheapest candidate at w_k·Λ, summed"),
    "mix_saving_per_hour": (_CHOICE, "USD/hour", "best single choice − mix (negative: the mix costs more)"),
    "mix_gpu": (_MIX, "", "class k's own cheapest GPU"),
    "mix_tp": (_MIX, "GPUs", "class k's TP degree"),
    "mix_batch": (_MIX, "sequences", "class k's concurrency limit"),
    "mix_replicas": (_MIX, "replica groups", "class k's replicas"),
    "mix_class_cost_per_hour": (_MIX, "USD/hour", "class k's cost (illustrative)"),
}
_PRICED = {
    "cost_per_hour",
    "cost_per_mtok",
    "best_cost_per_hour",
    "best_cost_per_mtok",
    "mix_cost_per_hour",
    "mix_saving_per_hour",
    "mix_class_cost_per_hour",
}
_REASON_CODED = {"infeasible_reason", "binding_reason"}


def _inputs(study: Study):
    K, W = study.n_classes, len(study.workloads)
    class_in, class_out, weight = np.ones((W, K)), np.ones((W, K)), np.zeros((W, K))
    for i, wl in enumerate(study.workloads):
        k = len(wl.classes.count)
        class_in[i, :k], class_out[i, :k], weight[i, :k] = (
            wl.classes.input_len,
            wl.classes.output_len,
            wl.classes.weight,
        )
    mix = np.zeros((W, K + 1, K))
    mix[:, 0] = weight
    for k in range(K):
        mix[:, 1 + k, k] = (weight[:, k] > 0).astype(float)
    slo = {k: np.float64(v) for k, v in study.slo.items()}
    return class_in, class_out, weight, mix, slo


def evaluate(study: Study, steps: int = proc.BISECTION_STEPS) -> xr.Dataset:
    """The study's Dataset (dims workload, rate, model, gpu, tp, batch, class; float64)."""
    class_in, class_out, weight, mix, slo = _inputs(study)
    with float64_scope():
        raw = _evaluate(
            study.model,
            study.gpu,
            study.serving,
            study.measured,
            study.tp,
            study.batch,
            class_in,
            class_out,
            mix,
            study.total_rate,
            slo,
            steps,
            batch_buckets(study.batch),
        )
        raw = {k: np.asarray(v) for k, v in raw.items()}
    N, B = len(study.tp), len(study.batch)
    gpu_of = lambda i: np.asarray(study.gpus)[i // (N * B)]  # noqa: E731
    tp_of = lambda i: study.tp[(i // B) % N]  # noqa: E731
    b_of = lambda i: study.batch[i % B]  # noqa: E731
    ok, mix_ok = raw["choice_any"], raw["mix_any"]
    n_choice = np.where(ok, tp_of(raw["choice_index"]), 0.0)
    furthest = raw["infeasible_reason"].max(axis=(2, 3, 4))  # (W, M): the deepest check any candidate reached
    data = dict(
        total_rate=study.total_rate,
        class_input_len=class_in * (weight > 0),
        class_output_len=class_out * (weight > 0),
        class_weight=weight,
        **{
            k: raw[k]
            for k in (
                "weights_bytes",
                "kv_pool_bytes",
                "fits",
                "slots",
                "service_s",
                "max_rate_per_replica",
                "itl_s",
                "ttft_unloaded_s",
                "e2e_unloaded_s",
                "infeasible_reason",
                "memory_headroom",
                "feasible",
                "replicas",
                "gpus_total",
                "cost_per_hour",
                "cost_per_mtok",
                "ttft_p_s",
                "e2e_mean_s",
                "utilization",
            )
        },
        best_gpu=np.where(ok, gpu_of(raw["choice_index"]), ""),
        best_tp=n_choice,
        best_batch=np.where(ok, b_of(raw["choice_index"]), 0.0),
        best_replicas=raw["best_replicas"],
        best_gpus=raw["best_replicas"] * n_choice,
        best_cost_per_hour=raw["best_cost_per_hour"],
        best_cost_per_mtok=raw["best_cost_per_mtok"],
        binding_reason=np.where(ok, 0, np.where(np.isnan(study.total_rate)[:, :, None], 0, furthest[:, None, :])),
        mix_cost_per_hour=raw["mix_cost_per_hour"],
        mix_saving_per_hour=raw["best_cost_per_hour"] - raw["mix_cost_per_hour"],
        mix_gpu=np.where(mix_ok, gpu_of(raw["mix_index"]), ""),
        mix_tp=np.where(mix_ok, tp_of(raw["mix_index"]), 0.0),
        mix_batch=np.where(mix_ok, b_of(raw["mix_index"]), 0.0),
        mix_replicas=raw["mix_replicas"],
        mix_class_cost_per_hour=raw["mix_class_cost_per_hour"],
    )
    variables = {}
    for name, (dims, units, long_name) in VARIABLES.items():
        attrs = {"units": units, "long_name": long_name}
        if name in _PRICED:
            attrs["price_date"] = PRICE_DATE
        if name in _REASON_CODED:
            attrs.update(flag_values=list(range(len(REASONS))), flag_meanings=" ".join(REASONS))
        value = data[name]
        if name in ("fits", "feasible"):
            value = value.astype(bool)
        elif name in _REASON_CODED:
            value = value.astype(np.int8)
        variables[name] = xr.Variable(dims, value, attrs)
    coords = dict(
        workload=[w.name for w in study.workloads],
        rate=study.rate_labels,
        model=study.models,
        gpu=study.gpus,
        tp=study.tp.astype(np.int64),
        batch=study.batch.astype(np.int64),
        **{"class": np.arange(study.n_classes)},
    )
    attrs = {
        "slimjax_version": __version__,
        "kind": "procurement",
        "study_file": study.source,
        "slo": json.dumps({k: (None if np.isinf(v) else v) for k, v in study.slo.items()}),
        "workloads": json.dumps(
            {w.name: {"source": w.source, "requests": w.requests, "trace_rate": w.trace_rate} for w in study.workloads}
        ),
        "serving": json.dumps(study.serving_table, default=float),
        "price_date": PRICE_DATE,
        "prices": json.dumps(
            {
                g: {"usd_per_gpu_hour": float(study.gpu.price_per_hour[i]), "source": study.price_source[g]}
                for i, g in enumerate(study.gpus)
            }
        ),
        "prices_note": f"illustrative prices, dated {PRICE_DATE}; override per GPU under prices:",
        "ttft_note": "TTFT is MODEL.md §8's per-request screen t_pre,k + ITL_k(m) plus the wait quantile, not "
        "§4's batch screen",
        "bisection_steps": steps,
    }
    return xr.Dataset(variables, coords=coords, attrs=attrs)


# ----------------------------------------------------------------------------------- the tables


def _money(x: float) -> str:
    return f"${x:,.2f}" if x < 1000 else f"${x:,.0f}"


def _ms(x: float) -> str:
    return "n/a" if not np.isfinite(x) else (f"{x * 1e3:,.0f} ms" if x < 10 else f"{x:,.1f} s")


def _why(ds: xr.Dataset, at: xr.Dataset, slo: dict) -> str:
    """Why no batch of one (GPU, TP) works, from its furthest-reaching batch, in words and figures."""
    reasons = at["infeasible_reason"].values
    code = int(reasons.max())
    name = REASONS[code]
    if name == "itl":
        return f"ITL {_ms(float(np.nanmin(at['itl_s'])))} at best > {_ms(slo['itl_s'])} SLO"
    if name == "ttft":
        return f"TTFT {_ms(float(np.nanmin(at['ttft_unloaded_s'])))} unloaded at best > {_ms(slo['ttft_s'])} SLO"
    if name == "e2e":
        return f"E2E {_ms(float(np.nanmin(at['e2e_unloaded_s'])))} unloaded at best > {_ms(slo['e2e_s'])} SLO"
    if name == "memory":
        pool, weights = float(at["kv_pool_bytes"]), float(at["weights_bytes"])
        if pool <= 0:
            usable = (pool + weights) / 2**30
            return f"does not fit: weights {weights / 2**30:,.0f} GiB exceed the usable {usable:,.0f} GiB"
        return f"does not fit: the KV pool ({pool / 2**30:,.1f} GiB) holds no mixture sequence"
    return REASON_TEXT[name]


def ranked_tables(ds: xr.Dataset, top: int = 5, infeasible: int = 3) -> str:
    """One ranked table per workload, rate and model: the ``top`` cheapest feasible (GPU, TP) groups,
    each at its own cheapest batch limit (§8 tie order), then why the cheapest infeasible groups fail,
    then the per-class mix. Prices are marked illustrative with their date."""
    import pandas as pd

    slo = {k: (np.inf if v is None else v) for k, v in json.loads(ds.attrs["slo"]).items()}
    prices = json.loads(ds.attrs["prices"])
    lines = [
        f"Prices: illustrative $/GPU-hour, dated {ds.attrs['price_date']} — "
        + ", ".join(f"{g} {p['usd_per_gpu_hour']:g}" for g, p in prices.items()),
        "SLOs: "
        + ", ".join(f"{k} {_ms(v)}" for k, v in slo.items() if k != "quantile" and np.isfinite(v))
        + f" (TTFT at p{slo['quantile'] * 100:g}, per-request screen of MODEL.md §8)",
    ]
    q = f"TTFT p{slo['quantile'] * 100:g}"
    for wl in ds["workload"].values:
        w = ds.sel(workload=wl)
        present = w["class_weight"].values > 0
        classes = ", ".join(
            f"{int(i)}/{int(o)}"
            for i, o in zip(w["class_input_len"].values[present], w["class_output_len"].values[present], strict=False)
        )
        for rate in ds["rate"].values:
            total = float(w["total_rate"].sel(rate=rate))
            if not np.isfinite(total):
                continue
            for model in ds["model"].values:
                c = w.sel(rate=rate, model=model)
                lines.append("")
                lines.append(f"== {wl} at {rate} = {total:,.3g} requests/s (classes I/O {classes}) — {model}")
                rows = []
                for g in ds["gpu"].values:
                    for n in ds["tp"].values:
                        cand = c.sel(gpu=g, tp=n)
                        feas = cand["feasible"].values
                        if not feas.any():
                            continue
                        cost = np.where(feas, cand["cost_per_hour"].values, np.inf)
                        gpus = np.where(feas, cand["gpus_total"].values, np.inf)
                        i = int(np.lexsort((ds["batch"].values, gpus, cost))[0])
                        pick = cand.isel(batch=i)
                        rows.append(
                            {
                                "GPU": g,
                                "TP": int(n),
                                "batch": int(ds["batch"].values[i]),
                                "replicas": int(pick["replicas"]),
                                "GPUs": int(pick["gpus_total"]),
                                "$/hour": float(pick["cost_per_hour"]),
                                "$/Mtok": float(pick["cost_per_mtok"]),
                                q: _ms(float(pick["ttft_p_s"])),
                                "ITL": _ms(float(pick["itl_s"])),
                                "util": f"{float(pick['utilization']):.0%}",
                                "KV headroom": f"{float(pick['memory_headroom']):.0%}",
                            }
                        )
                if rows:
                    table = pd.DataFrame(rows).sort_values(["$/hour", "GPUs", "TP", "batch"], kind="stable").head(top)
                    table["$/hour"] = table["$/hour"].map(_money)
                    table["$/Mtok"] = table["$/Mtok"].map(lambda x: f"${x:,.3f}")
                    table.index = range(1, len(table) + 1)
                    lines.append(table.to_string())
                else:
                    reason = REASONS[int(c["binding_reason"])]
                    lines.append(f"no feasible candidate: binding reason {reason} ({REASON_TEXT[reason]})")
                failing = []
                for g in ds["gpu"].values:
                    for n in ds["tp"].values:
                        cand = c.sel(gpu=g, tp=n)
                        if cand["feasible"].values.any():
                            continue
                        failing.append(
                            (
                                int(n) * prices[g]["usd_per_gpu_hour"],
                                int(n),
                                g,
                                _why(ds, w.sel(model=model, gpu=g, tp=n), slo),
                            )
                        )
                if failing:
                    lines.append("cheapest infeasible:")
                    for per_group, n, g, why in sorted(failing)[:infeasible]:
                        lines.append(f"  {g} TP {n} ({_money(per_group)}/hour per group): {why}")
                mix = float(c["mix_cost_per_hour"])
                if np.isfinite(mix):
                    parts = []
                    for k in ds["class"].values:
                        if not present[k]:
                            continue
                        mk = c.sel({"class": k})
                        parts.append(
                            f"{int(w['class_input_len'][k])}/{int(w['class_output_len'][k])} → "
                            f"{str(mk['mix_gpu'].values)} "
                            f"TP {int(mk['mix_tp'])} B {int(mk['mix_batch'])} ×{int(mk['mix_replicas'])}"
                        )
                    if len(parts) > 1:
                        saving = float(c["mix_saving_per_hour"])
                        lines.append(
                            f"mix: {'; '.join(parts)} = {_money(mix)}/hour "
                            f"({'saves' if saving > 0 else 'costs'} {_money(abs(saving))}/hour vs the best "
                            f"single choice)"
                        )
    return "\n".join(lines)
