"""Batch-capacity advisor, B_cap (MODEL.md §2; source 000, Eq. 13)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

BATCHES_PER_STEP = 8  # batches one step of B_cap's loop reduces (4–16 measured alike; past 32 XLA:CPU splits it)


def batching_efficiency(throughput, throughput_at_1, batch):
    """T(I,O,B) / (B·T(I,O,1)): throughput relative to linear scaling from B = 1 (dimensionless)."""
    return throughput / (batch * throughput_at_1)


def batch_capacity(throughput, e2e_s, batch, throughput_at_1, slo_s, epsilon, axis, allowed=None):
    """B_cap = argmax_B T  s.t.  E2E ≤ SLO  and  T/(B·T(1)) > ε  (and ``allowed``, e.g. B ≤ max_seqs).

    ``batch`` holds the batch values broadcast along ``axis`` (length 1 elsewhere); the other
    arguments broadcast against ``throughput``. A masked argmax over ``axis``, ties to the smallest
    qualifying batch; 0 where none qualifies. The batch axis is removed.

    Written as a loop over the batches, k at a time (``BATCHES_PER_STEP``), that keeps the best (T, B) so far: as
    reductions over the whole axis (a max, then a min for the ties) XLA:CPU materialises their masked operands and
    splits each reduction in two passes, which took a third of a sweep's engine time; the loop reads each point once
    (bench/RESULTS.md).
    """
    args = [throughput, e2e_s, batch, throughput_at_1, slo_s] + ([] if allowed is None else [allowed])
    full = jnp.broadcast_shapes(*(jnp.shape(a) for a in args))
    axis = axis % len(full)
    n = full[axis]
    k = max(d for d in range(1, min(n, BATCHES_PER_STEP) + 1) if n % d == 0)

    def at(a, i):  # batches i·k … i·k + k − 1 of ``a`` (``a`` broadcast along the batch axis where it has length 1)
        a = jnp.asarray(a)
        a = jnp.expand_dims(a, tuple(range(len(full) - a.ndim)))
        return jax.lax.dynamic_slice_in_dim(a, i * k, k, axis) if a.shape[axis] > 1 else a

    def step(i, best):
        t_best, b_best = best
        t, b = at(throughput, i), at(batch, i)
        ok = (at(e2e_s, i) <= at(slo_s, i)) & (batching_efficiency(t, at(throughput_at_1, i), b) > epsilon)
        if allowed is not None:
            ok = ok & at(allowed, i)
        t = jnp.broadcast_to(t, ok.shape)
        t_step = jnp.max(jnp.where(ok, t, -jnp.inf), axis=axis)
        b_step = jnp.min(jnp.where(ok & (t == jnp.expand_dims(t_step, axis)), b, jnp.inf), axis=axis)
        better = (t_step > t_best) | ((t_step == t_best) & (b_step < b_best))
        return jnp.where(better, t_step, t_best), jnp.where(better, b_step, b_best)

    out_shape = full[:axis] + full[axis + 1 :]
    dtype = jnp.result_type(throughput, batch)
    start = (jnp.full(out_shape, -jnp.inf, dtype), jnp.full(out_shape, jnp.inf, dtype))
    t_best, b_best = jax.lax.fori_loop(0, n // k, step, start)
    return jnp.where(jnp.isfinite(t_best), b_best, 0)
