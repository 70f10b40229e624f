"""Procurement (MODEL.md §8): a replica's class mixture, its SLO-limited rate, fleet size and cost.

Pure functions of broadcastable arrays. Length classes sit on the last axis (``…, K``) with weights
w_k = n_k/N; a class of weight 0 is padding (workloads with fewer classes) and is never checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import memory, queue

BISECTION_STEPS = 64  # the interval [0, m/S̄) shrinks by 2^-64: relative 1e-9 of λ* unless λ* < 1e-10·m/S̄


def mixture_mean(weights, per_class):
    """Σ_k w_k·x_k over the class axis (the last): F̄ of the footprints, S̄ of the service times."""
    return jnp.sum(weights * per_class, axis=-1)


def mixture_slots(batch, pool_bytes, mean_footprint_bytes):
    """m = min(B, max_seqs) with max_seqs = ⌊pool / F̄⌋ (0 where pool ≤ 0) (§8 "One candidate")."""
    return jnp.minimum(batch, memory.max_concurrent_seqs(pool_bytes, mean_footprint_bytes))


def study_ttft(prefill_s, itl_s):
    """TTFT_k(m) = t_pre,k + ITL_k(m): a request's own prefill after at most one running decode step
    (§8 "TTFT in a study"), not §4's batch screen B·t_pre."""
    return prefill_s + itl_s


def worst_class(weights, per_class):
    """max_k x_k over the classes present (w_k > 0); −inf when none is."""
    return jnp.max(jnp.where(weights > 0, per_class, -jnp.inf), axis=-1)


def static_slos_hold(weights, ttft_s, itl_s, service_s, slo_ttft_s, slo_itl_s, slo_e2e_s):
    """The SLOs at λ → 0 (no wait): ITL_k ≤ SLO_itl, TTFT_k ≤ SLO_ttft, S_k ≤ SLO_e2e for every class
    present. An absent SLO is +inf."""
    return (
        (worst_class(weights, itl_s) <= slo_itl_s)
        & (worst_class(weights, ttft_s) <= slo_ttft_s)
        & (worst_class(weights, service_s) <= slo_e2e_s)
    )


def latency_at_rate(
    weights, slots, mean_service_s, ttft_s, service_s, arrival_rate, quantile, max_slots: int | None = None
):
    """(TTFT at quantile p, mean E2E) of the worst class at per-replica rate λ (§8 "SLOs"):
    W_p(λ) + max_k TTFT_k(m) and W_q(λ) + max_k S_k(m), on the §5 queue with m slots of S̄."""
    q = queue.mmc(slots, mean_service_s, arrival_rate)
    wait_p = queue.wait_quantile(q["p_wait"], slots, mean_service_s, arrival_rate, quantile)
    return wait_p + worst_class(weights, ttft_s), q["wait_s"] + worst_class(weights, service_s), q["utilization"]


def max_rate_per_replica(
    weights,
    slots,
    mean_service_s,
    ttft_s,
    itl_s,
    service_s,
    slo_ttft_s,
    slo_itl_s,
    slo_e2e_s,
    quantile,
    steps: int = BISECTION_STEPS,
    max_slots: int | None = None,
):
    """λ*, the largest per-replica rate in [0, m/S̄) meeting every SLO (§8), by bisection.

    The SLOs are non-decreasing in λ, so the lower end of the bracket always meets them and the upper
    end never does (m/S̄ itself has no steady state); ``steps`` halvings, vectorised over every
    candidate (no loop over candidates). 0 where the SLOs fail even at λ → 0 or m = 0.
    """
    capacity = jnp.where(slots > 0, slots / mean_service_s, 0.0)

    def meets(rate):
        ttft_p, e2e, _ = latency_at_rate(weights, slots, mean_service_s, ttft_s, service_s, rate, quantile, max_slots)
        return (ttft_p <= slo_ttft_s) & (e2e <= slo_e2e_s) & (rate < capacity)  # a steady state even with no wait SLO

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        ok = meets(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, steps, halve, (jnp.zeros_like(capacity), capacity))
    ok = (slots > 0) & static_slos_hold(weights, ttft_s, itl_s, service_s, slo_ttft_s, slo_itl_s, slo_e2e_s)
    return jnp.where(ok & jnp.isfinite(capacity), lo, 0.0)


def replicas_needed(total_rate, max_rate):
    """R = ⌈Λ/λ*⌉ (traffic split evenly); NaN where λ* = 0 (no replica count serves it)."""
    return jnp.where(max_rate > 0, jnp.ceil(total_rate / jnp.where(max_rate > 0, max_rate, 1.0)), jnp.nan)


def cost_per_hour(replicas, n_gpu, price_per_gpu_hour):
    """GPUs·price: R·n GPUs at the (illustrative) $/GPU-hour."""
    return replicas * n_gpu * price_per_gpu_hour


def two_pool_cost_per_hour(prefill_replicas, prefill_gpus, prefill_price, decode_replicas, decode_gpus, decode_price):
    """R_p·n_p·price_p + R_d·n_d·price_d, $/hour (§10: a disaggregated deployment's two pools, each priced as
    :func:`cost_per_hour`)."""
    return cost_per_hour(prefill_replicas, prefill_gpus, prefill_price) + cost_per_hour(
        decode_replicas, decode_gpus, decode_price
    )


def cost_per_mtok(cost_per_hour_usd, total_rate, mean_tokens_per_request):
    """$/hour ÷ (3600·Λ·Σ w_k(I_k + O_k) / 1e6): dollars per million (prompt + output) tokens."""
    return cost_per_hour_usd / (3600.0 * total_rate * mean_tokens_per_request / 1e6)


def memory_headroom(slots, mean_footprint_bytes, pool_bytes):
    """1 − m·F̄/pool: the KV pool left unused at m slots."""
    return 1.0 - slots * mean_footprint_bytes / pool_bytes


def cheapest_candidate(cost, gpus, feasible, tp, batch):
    """Index into the flattened (G, N, B) candidates of the §8 choice (least cost, then fewer GPUs, smaller
    TP, smaller batch, earlier GPU), and whether any is feasible. ``cost`` etc. end in (G, N, B)."""
    lead, (G, N, B) = cost.shape[:-3], cost.shape[-3:]

    def flat(x):
        return jnp.broadcast_to(x, (*lead, G, N, B)).reshape(*lead, -1)

    tp_key = flat(jnp.broadcast_to(tp[:, None], (N, B)))
    b_key = flat(jnp.broadcast_to(batch[None, :], (N, B)))
    c = flat(jnp.where(feasible, cost, jnp.inf))
    g = flat(jnp.where(feasible, gpus, jnp.inf))
    order = jnp.lexsort((b_key, tp_key, g, c), axis=-1)
    return order[..., 0], jnp.any(flat(feasible), axis=-1)


def at_candidate(x, index, shape):
    """x (…, G, N, B) broadcast to ``shape`` + (G, N, B), at the flat candidate ``index`` (…)."""
    full = jnp.broadcast_to(x, (*shape, *x.shape[-3:]))
    return jnp.take_along_axis(full.reshape(*shape, -1), index[..., None], axis=-1)[..., 0]
