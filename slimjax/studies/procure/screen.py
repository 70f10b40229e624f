"""Procurement (MODEL.md §8) as an engine group: every candidate (GPU, TP degree, batch limit) for every
workload, rate and model, then the cheapest feasible choice and the per-class mix, as reductions.

The grid is the Study's (:attr:`slimjax.inputs.procurefile.Study.coords`): ``[workload, rate, model, gpu,
tp, batch, class]``. The choice reduces over (gpu, tp, batch) and the mixture over class, so the plan
blocks only along workload and model. λ* does not depend on the total rate, so until the sizing the rate
axis carries the *mix* rows instead: row 0 is the workload's class mixture, row 1 + k serves class k alone
(the §8 mix), and one bisection gives λ* for both.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ..._version import __version__
from ...constants import PRICE_DATE
from ...engine.groups import Group, register_group
from ...engine.plan import BlockPlan
from ...engine.schema import Variable, register_kind
from ...model import memory
from ...model import procurement as proc
from ...model.calculator import capacity_cell_terms, group_gpus, replica_engines, service_terms
from ...model.queue import queue_bound

# Why a candidate is infeasible, checked in this order (the first failing check is reported).
REASONS = ("feasible", "tp_does_not_divide_heads", "memory", "itl", "ttft", "e2e", "unbounded_queue")
CANDIDATE = ("workload", "model", "gpu", "tp", "batch")
SIZED = ("workload", "rate", "model", "gpu", "tp", "batch")
CHOICE = ("workload", "rate", "model")
MIX = ("workload", "rate", "model", "class")
_P = "procurement"

PROCUREMENT: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable("total_rate", ("workload", "rate"), "requests/s", "total arrival rate Λ", _P),
        Variable("class_input_len", ("workload", "class"), "tokens", "class prompt length I_k (rounded mean)", _P),
        Variable("class_output_len", ("workload", "class"), "tokens", "class output length O_k (rounded mean)", _P),
        Variable("class_weight", ("workload", "class"), "1", "class weight w_k = n_k/N (0: no such class)", _P),
        Variable("weights_bytes", ("model", "gpu", "tp"), "bytes", "weights M_W of the group", _P),
        Variable(
            "pp",
            ("model", "gpu", "tp"),
            "stages",
            "pipeline stages of each candidate's group, tp GPUs each (MODEL.md §10: the smallest that fits)",
            _P,
        ),
        Variable("kv_pool_bytes", ("model", "gpu", "tp"), "bytes", "KV pool u·M − M_W − M_R of the group", _P),
        Variable(
            "fits",
            ("workload", "model", "gpu", "tp"),
            "1",
            "the group holds its weights and one mixture sequence (max_seqs ≥ 1, TP divides H_q)",
            _P,
            "bool",
        ),
        Variable("slots", CANDIDATE, "sequences", "slots m = min(B, ⌊pool / F̄⌋)", _P),
        Variable("service_s", CANDIDATE, "s", "mixture service time S̄ = Σ w_k S_k(m)", _P),
        Variable(
            "max_rate_per_replica",
            CANDIDATE,
            "requests/s",
            "λ*, the largest per-replica rate meeting every SLO (0: none)",
            _P,
        ),
        Variable("itl_s", CANDIDATE, "s", "ITL_k(m), worst class", _P),
        Variable("ttft_unloaded_s", CANDIDATE, "s", "TTFT_k(m) = t_pre,k + ITL_k(m) without queueing, worst class", _P),
        Variable("e2e_unloaded_s", CANDIDATE, "s", "S_k(m) without queueing, worst class", _P),
        Variable("infeasible_reason", CANDIDATE, "1", "first failing check (0: feasible)", _P, "int8", flags=REASONS),
        Variable("memory_headroom", CANDIDATE, "1", "1 − m·F̄/pool, the KV pool left unused", _P),
        Variable("feasible", SIZED, "1", "λ* > 0: the candidate serves the rate under the SLOs", _P, "bool"),
        Variable("replicas", SIZED, "replica groups", "R = ⌈Λ/λ*⌉", _P),
        Variable("gpus_total", SIZED, "GPUs", "R·n", _P),
        Variable("cost_per_hour", SIZED, "USD/hour", "R·n·price per GPU-hour (illustrative)", _P, priced=True),
        Variable(
            "cost_per_mtok",
            SIZED,
            "USD/Mtok",
            "cost per million prompt + output tokens (illustrative)",
            _P,
            priced=True,
        ),
        Variable("ttft_p_s", SIZED, "s", "W_p + TTFT_k(m) at Λ/R per replica, worst class", _P),
        Variable("e2e_mean_s", SIZED, "s", "W_q + S_k(m) at Λ/R per replica, worst class", _P),
        Variable("utilization", SIZED, "1", "ρ at Λ/R per replica", _P),
        Variable("best_gpu", CHOICE, "", "chosen GPU ('' when no candidate is feasible)", _P, "int32", label_of="gpu"),
        Variable("best_tp", CHOICE, "GPUs", "chosen TP degree (0: none)", _P),
        Variable("best_pp", CHOICE, "stages", "chosen pipeline stages (0: none; the group is tp·pp GPUs)", _P),
        Variable("best_batch", CHOICE, "sequences", "chosen concurrency limit (0: none)", _P),
        Variable("best_replicas", CHOICE, "replica groups", "replicas of the choice", _P),
        Variable("best_gpus", CHOICE, "GPUs", "GPUs of the choice", _P),
        Variable("best_cost_per_hour", CHOICE, "USD/hour", "cost of the choice (illustrative)", _P, priced=True),
        Variable(
            "best_cost_per_mtok",
            CHOICE,
            "USD/Mtok",
            "cost per million tokens of the choice (illustrative)",
            _P,
            priced=True,
        ),
        Variable(
            "binding_reason",
            CHOICE,
            "1",
            "0 when a candidate is feasible, else the check the furthest candidates fail",
            _P,
            "int8",
            flags=REASONS,
        ),
        Variable(
            "mix_cost_per_hour",
            CHOICE,
            "USD/hour",
            "each class on its own cheapest candidate at w_k·Λ, summed",
            _P,
            priced=True,
        ),
        Variable(
            "mix_saving_per_hour",
            CHOICE,
            "USD/hour",
            "best single choice − mix (negative: the mix costs more)",
            _P,
            priced=True,
        ),
        Variable("mix_gpu", MIX, "", "class k's own cheapest GPU", _P, "int32", label_of="gpu"),
        Variable("mix_tp", MIX, "GPUs", "class k's TP degree", _P),
        Variable("mix_batch", MIX, "sequences", "class k's concurrency limit", _P),
        Variable("mix_replicas", MIX, "replica groups", "class k's replicas", _P),
        Variable("mix_class_cost_per_hour", MIX, "USD/hour", "class k's cost (illustrative)", _P, priced=True),
    )
}

_REASON_CODE = {name: code for code, name in enumerate(REASONS)}


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


def _inputs(study) -> dict:
    class_in, class_out, weight = study.class_arrays()
    lead = ("model", "gpu", "tp")
    return {
        "model": (("model",), study.model),
        "gpu": (("gpu",), study.gpu),
        "serving": (lead, study.serving),
        "measured": (lead, study.measured),
        "tp": (("tp",), np.asarray(study.tp, np.float64)),
        "batch": (("batch",), np.asarray(study.batch, np.float64)),
        "class_input_len": (("workload", "class"), class_in),
        "class_output_len": (("workload", "class"), class_out),
        "class_weight": (("workload", "class"), weight),
        "total_rate": (("workload", "rate"), np.asarray(study.total_rate, np.float64)),
        "slo": ((), {k: np.float64(v) for k, v in study.slo.items()}),
    }


def _static(study) -> tuple:
    return (("bisection_steps", proc.BISECTION_STEPS), ("batch_buckets", batch_buckets(study.batch)))


class _Candidates(NamedTuple):
    """What the screen knows of every candidate per mix row (row 0 the mixture, row 1 + k class k alone)."""

    w: Any  # (W, X, 1, 1, 1, 1, K) the rows' class weights
    I: Any  # noqa: E741 (MODEL.md's symbol) class prompt lengths
    O: Any  # noqa: E741 class output lengths
    weight7: Any
    cell: dict
    pool: Any
    footprint: Any
    divides: Any
    slots: Any
    ttft: Any
    itl: Any
    service: Any
    mean_service: Any
    lam: Any  # λ* per candidate and row
    reason: Any
    itl_w: Any
    ttft_w: Any
    service_w: Any


def _screen_candidates(x: dict) -> _Candidates:
    """§8 per candidate: slots m, per-class ITL/TTFT/S, the SLO-limited rate λ* (bisection per batch bucket) and
    the first check that fails."""
    steps, buckets = x["static"]["bisection_steps"], x["static"]["batch_buckets"]
    model, gpu, serving, measured, slo = x["model"], x["gpu"], x["serving"], x["measured"], x["slo"]
    batch = x["batch"].reshape(-1)
    I, O, weight7 = x["class_input_len"], x["class_output_len"], x["class_weight"]  # (W, 1, 1, 1, 1, 1, K)
    K = weight7.shape[-1]
    # mix rows in the rate slot: row 0 the mixture, row 1 + k class k alone (where present)
    one_hot = jnp.eye(K, dtype=weight7.dtype)[None, :, None, None, None, None, :] * (weight7 > 0)
    w = jnp.concatenate([weight7, one_hot], axis=1)  # (W, X, 1, 1, 1, 1, K)
    B = batch.reshape(1, 1, 1, 1, 1, -1)

    cell = capacity_cell_terms(model, gpu, serving, I, O)
    pool = cell["kv_pool_bytes"][..., 0]  # (1, 1, M, G, N, 1)
    footprint = proc.mixture_mean(w, cell["seq_footprint_bytes"])  # F̄ (W, X, M, G, N, 1)
    divides = jnp.mod(model.n_heads, serving.n_gpu)[..., 0] == 0
    # each of the n_pp·D engines admits ⌊B/(n_pp·D)⌋ (§10, docs/layouts.md): a batch limit below them runs nothing
    staged = B >= replica_engines(serving)[..., 0]
    slots = jnp.where(divides & staged, proc.mixture_slots(B, pool, footprint), 0.0)  # (W, X, M, G, N, B)
    per_class = service_terms(cell, measured, jnp.maximum(slots, 1.0)[..., None], I, O)
    has_measured = ~jnp.isnan(measured.batch)
    ttft = jnp.where(has_measured, measured.ttft_s, proc.study_ttft(cell["prefill_s"], per_class["itl_s"]))
    itl, service = per_class["itl_s"], per_class["service_s"]
    mean_service = proc.mixture_mean(w, service)  # S̄
    lam = jnp.concatenate(  # slots ≤ B, so each batch bucket's queue runs to its own bound
        [
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

    itl_w, ttft_w, service_w = (proc.worst_class(w, v) for v in (itl, ttft, service))
    reason = jnp.select(
        [~divides, slots < 1, itl_w > slo["itl_s"], ttft_w > slo["ttft_s"], service_w > slo["e2e_s"], lam <= 0],
        [_REASON_CODE[r] for r in REASONS[1:]],
        0,
    )
    return _Candidates(
        w,
        I,
        O,
        weight7,
        cell,
        pool,
        footprint,
        divides,
        slots,
        ttft,
        itl,
        service,
        mean_service,
        lam,
        reason,
        itl_w,
        ttft_w,
        service_w,
    )


def _batch(x: dict, cells: dict, out: dict) -> dict:
    """Every §8 variable on one block, each shaped to the 7-d grid (size 1 along the dims it drops)."""
    c = _screen_candidates(x)
    w, I, O, weight7, cell, pool, footprint, divides = c.w, c.I, c.O, c.weight7, c.cell, c.pool, c.footprint, c.divides
    slots, ttft, service, mean_service, lam, reason = c.slots, c.ttft, c.service, c.mean_service, c.lam, c.reason
    itl_w, ttft_w, service_w = c.itl_w, c.ttft_w, c.service_w
    gpu, serving, slo = x["gpu"], x["serving"], x["slo"]
    tp, batch = x["tp"].reshape(-1), x["batch"].reshape(-1)
    N, n_batch = tp.shape[0], batch.shape[0]
    W, K = weight7.shape[0], weight7.shape[-1]
    max_batch = x["static"]["batch_buckets"][-1][2]

    def candidate(v):  # mix row 0 of a (W, X, M, G, N, B) term, as (W, 1, M, G, N, B, 1)
        return v[:, :1, ..., None]

    runs = slots[:, :1] >= 1

    # ---- the mixture (mix row 0) at each total rate: dims (W, R, M, G, N, B)
    rate = x["total_rate"][..., 0]  # (W, R, 1, 1, 1, 1)
    lam0, slots0, mean_s0 = lam[:, :1], slots[:, :1], mean_service[:, :1]
    # GPUs of one replica group: n_tp·n_pp·D (§10, docs/layouts.md)
    n_gpu = group_gpus(serving)[:, 0, ..., 0][:, None]  # (1, 1, M, G, N, 1)
    stages = serving.pipeline_stages[:, 0, ..., 0][:, None]
    price = gpu.price_per_hour[:, 0, ..., 0][:, None]  # (1, 1, 1, G, 1, 1)
    feasible = (lam0 > 0) & jnp.isfinite(rate)
    replicas = jnp.where(feasible, proc.replicas_needed(rate, lam0), jnp.nan)
    gpus_total = replicas * n_gpu
    cost = proc.cost_per_hour(replicas, n_gpu, price)
    weight = weight7.reshape(W, K)
    tokens = jnp.sum(weight * (I.reshape(W, K) + O.reshape(W, K)), axis=-1).reshape(W, 1, 1, 1, 1, 1)
    per_replica = jnp.where(feasible, rate / jnp.where(feasible, replicas, 1.0), jnp.nan)
    ttft_p, e2e_mean, utilization = proc.latency_at_rate(
        w[:, :1], slots0, mean_s0, ttft[:, :1], service[:, :1], per_replica, slo["quantile"], max_batch
    )
    cost_per_mtok = proc.cost_per_mtok(cost, rate, tokens)

    # ---- the choice per (W, R, M), and the mix: class k alone (mix row 1 + k) at w_k·Λ
    best, any_feasible = proc.cheapest_candidate(cost, gpus_total, feasible, tp, batch)
    lam_k = jnp.moveaxis(lam[:, 1:], 1, 2)[:, None]  # (W, 1, M, K, G, N, B)
    rate_k = (
        x["total_rate"][..., 0, 0, 0, 0, 0][:, :, None, None, None, None, None]
        * weight[:, None, None, :, None, None, None]
    )
    feasible_k = (lam_k > 0) & (rate_k > 0) & jnp.isfinite(rate_k)
    replicas_k = jnp.where(feasible_k, proc.replicas_needed(rate_k, lam_k), jnp.nan)
    n_k, price_k = n_gpu[:, :, :, None], price[:, :, :, None]
    cost_k = proc.cost_per_hour(replicas_k, n_k, price_k)
    best_k, any_k = proc.cheapest_candidate(cost_k, replicas_k * n_k, feasible_k, tp, batch)  # (W, R, M, K)
    present = weight[:, None, None, :] > 0
    mix_ok = any_k & present
    cost_k_best = jnp.where(mix_ok, proc.at_candidate(cost_k, best_k, best_k.shape), jnp.nan)
    mix_cost = jnp.where(
        jnp.all(any_k | ~present, axis=-1), jnp.nansum(jnp.where(present, cost_k_best, 0.0), axis=-1), jnp.nan
    )
    best_replicas = jnp.where(any_feasible, proc.at_candidate(replicas, best, best.shape), jnp.nan)
    best_cost = jnp.where(any_feasible, proc.at_candidate(cost, best, best.shape), jnp.nan)
    best_tp = jnp.where(any_feasible, tp[(best // n_batch) % N], 0.0)
    best_pp = jnp.where(any_feasible, proc.at_candidate(jnp.broadcast_to(stages, cost.shape), best, best.shape), 0.0)
    furthest = jnp.max(reason[:, 0], axis=(2, 3, 4))[:, None, :]  # (W, 1, M): the deepest check any candidate reached
    no_rate = jnp.isnan(x["total_rate"][..., 0, 0, 0, 0, 0])[:, :, None]  # (W, R, 1)

    def choice(v):  # (W, R, M) as (W, R, M, 1, 1, 1, 1)
        return v[..., None, None, None, None]

    def mix(v):  # (W, R, M, K) as (W, R, M, 1, 1, 1, K)
        return v[:, :, :, None, None, None, :]

    def gpu_of(index):
        return index // (N * n_batch)

    return dict(
        total_rate=x["total_rate"],
        class_input_len=I * (weight7 > 0),
        class_output_len=O * (weight7 > 0),
        class_weight=weight7,
        weights_bytes=jnp.broadcast_to(cell["weights_bytes"][:1, :1, :, :, :, :1, :1], pool[..., None].shape),
        kv_pool_bytes=pool[..., None],
        pp=jnp.broadcast_to(stages[..., None], pool[..., None].shape),
        fits=(divides & (memory.max_concurrent_seqs(pool, footprint[:, :1]) >= 1))[..., None],
        slots=candidate(slots),
        service_s=candidate(jnp.where(runs, mean_service[:, :1], jnp.nan)),
        max_rate_per_replica=candidate(lam),
        itl_s=candidate(jnp.where(runs, itl_w[:, :1], jnp.nan)),
        ttft_unloaded_s=candidate(jnp.where(runs, ttft_w[:, :1], jnp.nan)),
        e2e_unloaded_s=candidate(jnp.where(runs, service_w[:, :1], jnp.nan)),
        infeasible_reason=candidate(reason),
        memory_headroom=candidate(
            jnp.where(runs, proc.memory_headroom(slots[:, :1], footprint[:, :1], pool[:, :1]), jnp.nan)
        ),
        feasible=feasible[..., None],
        replicas=replicas[..., None],
        gpus_total=gpus_total[..., None],
        cost_per_hour=cost[..., None],
        cost_per_mtok=cost_per_mtok[..., None],
        ttft_p_s=jnp.where(feasible, ttft_p, jnp.nan)[..., None],
        e2e_mean_s=jnp.where(feasible, e2e_mean, jnp.nan)[..., None],
        utilization=jnp.where(feasible, utilization, jnp.nan)[..., None],
        best_gpu=choice(jnp.where(any_feasible, gpu_of(best), -1)),
        best_tp=choice(best_tp),
        best_batch=choice(jnp.where(any_feasible, batch[best % n_batch], 0.0)),
        best_replicas=choice(best_replicas),
        best_pp=choice(best_pp),
        best_gpus=choice(jnp.where(any_feasible, proc.at_candidate(gpus_total, best, best.shape), jnp.nan)),
        best_cost_per_hour=choice(best_cost),
        best_cost_per_mtok=choice(jnp.where(any_feasible, proc.at_candidate(cost_per_mtok, best, best.shape), jnp.nan)),
        binding_reason=choice(jnp.where(any_feasible, 0, jnp.where(no_rate, 0, furthest))),
        mix_cost_per_hour=choice(mix_cost),
        mix_saving_per_hour=choice(best_cost - mix_cost),
        mix_gpu=mix(jnp.where(mix_ok, gpu_of(best_k), -1)),
        mix_tp=mix(jnp.where(mix_ok, tp[(best_k // n_batch) % N], 0.0)),
        mix_batch=mix(jnp.where(mix_ok, batch[best_k % n_batch], 0.0)),
        mix_replicas=mix(jnp.where(mix_ok, proc.at_candidate(replicas_k, best_k, best_k.shape), jnp.nan)),
        mix_class_cost_per_hour=mix(cost_k_best),
    )


def study_hash(study, block_plan: BlockPlan) -> str:
    """SHA-256 of the resolved procurement study (coordinates, every spec leaf, serving and measured per
    candidate, classes, rates, SLOs), the block plan and the slimjax version: what a resumed run must match."""
    import hashlib

    import jax

    h = hashlib.sha256(f"{__version__} procurement".encode())
    for k, v in study.coords.items():
        h.update(k.encode())
        h.update(np.ascontiguousarray(v).astype(str if v.dtype.kind == "U" else v.dtype).tobytes())
    trees = (study.model, study.gpu, study.serving, study.measured, study.class_arrays(), study.total_rate)
    for leaf in jax.tree_util.tree_leaves(trees):
        h.update(np.ascontiguousarray(np.asarray(leaf, np.float64)).tobytes())
    h.update(repr((sorted(study.slo.items()), block_plan.dims, sorted(block_plan.block.items()))).encode())
    return h.hexdigest()


def study_assumptions(study) -> list[str]:
    """What moves a procurement's answer, short, as its tables end with it and its store keeps it (attrs)."""
    labels = {
        str(row["efficiency"]).split(" (", 1)[0] for by_gpu in study.serving_table.values() for row in by_gpu.values()
    }
    marks = sorted(
        {
            mark
            for by_gpu in study.serving_table.values()
            for row in by_gpu.values()
            for mark in (row["constants"].values() if isinstance(row["constants"], dict) else [row["constants"]])
        }
    )
    streams = []
    for w in study.workloads:
        if w.trace is None:
            streams.append(f"{w.name}: fixed lengths, a Poisson stream at each rate")
        else:
            # the file's name, not its path: the printed tables read the same wherever the study is run from
            streams.append(
                f"{w.name}: {Path(w.trace.source).name} ({w.trace.format}), {w.requests:,} requests, "
                "timestamps compressed by each rate scale"
            )
    return [
        f"prices: illustrative $/GPU-hour dated {PRICE_DATE} ({', '.join(sorted(set(study.price_source.values())))})",
        f"roofline constants: {', '.join(sorted(labels))}; sources {', '.join(marks)} (see constants)",
        "prefill (screen): each prompt prefilled alone, after at most one decode step (MODEL.md §8); an MoE prompt "
        "re-reads the experts its tokens route to",
        "streams: " + "; ".join(streams),
    ]


def study_attrs(study, block_plan: BlockPlan) -> dict:
    """A procurement Dataset's attrs: the study file, SLOs, workloads, serving, prices (dated), notes."""
    static = dict(_static(study))
    return {
        "slimjax_version": __version__,
        "kind": "procurement",
        "study_file": study.source,
        "slo": json.dumps({k: (None if np.isinf(v) else v) for k, v in study.slo.items()}),
        "workloads": json.dumps(
            {w.name: {"source": w.source, "requests": w.requests, "trace_rate": w.trace_rate} for w in study.workloads}
        ),
        "serving": json.dumps(study.serving_table, default=float),
        # where each (model, GPU)'s roofline constants come from (inputs.serving.CONSTANTS_SOURCES)
        "constants": json.dumps(
            {m: {g: row["constants"] for g, row in by_gpu.items()} for m, by_gpu in study.serving_table.items()}
        ),
        "price_date": PRICE_DATE,
        "prices": json.dumps(
            {
                g: {"usd_per_gpu_hour": float(study.gpu.price_per_hour[i]), "source": study.price_source[g]}
                for i, g in enumerate(study.gpus)
            }
        ),
        "prices_note": f"illustrative prices, dated {PRICE_DATE}; override per GPU under prices:",
        "ttft_note": "TTFT is MODEL.md §8's per-request screen t_pre,k + ITL_k(m) plus the wait quantile, "
        "not §4's batch screen",
        "assumptions": json.dumps(study_assumptions(study)),
        "bisection_steps": static["bisection_steps"],
        "block_plan": block_plan.to_attrs(),
        "sweep_hash": study_hash(study, block_plan),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


register_kind("procurement", PROCUREMENT, study_attrs)
register_group(
    Group(
        "procurement",
        active=lambda study: True,
        inputs=_inputs,
        batch=_batch,
        wide=True,
        kind="procurement",
        reduces=("gpu", "tp", "batch", "class"),
        static=_static,
    )
)
