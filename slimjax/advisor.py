"""Batch-capacity advisor, B_cap (MODEL.md §2; source 000, Eq. 13)."""

from __future__ import annotations

import jax.numpy as jnp


def batching_efficiency(throughput, throughput_at_1, batch):
    """T(I,O,B) / (B·T(I,O,1)): throughput relative to linear scaling from B = 1 (dimensionless)."""
    return throughput / (batch * throughput_at_1)


def batch_capacity(throughput, e2e_s, batch, throughput_at_1, slo_s, epsilon, axis, allowed=None):
    """B_cap = argmax_B T  s.t.  E2E ≤ SLO  and  T/(B·T(1)) > ε  (and ``allowed``, e.g. B ≤ max_seqs).

    ``batch`` holds the batch values broadcast along ``axis`` (a length-1 axis elsewhere); the
    other arguments broadcast against ``throughput``. Masked argmax over ``axis``: ties go to the
    first (smallest, the axis being increasing) batch; 0 where no batch qualifies.
    """
    ok = (e2e_s <= slo_s) & (batching_efficiency(throughput, throughput_at_1, batch) > epsilon)
    if allowed is not None:
        ok = ok & allowed
    masked = jnp.where(ok, throughput, -jnp.inf)
    best = jnp.argmax(masked, axis=axis, keepdims=True)
    batch_full = jnp.broadcast_to(batch, masked.shape)
    chosen = jnp.take_along_axis(batch_full, best, axis=axis)
    return jnp.squeeze(jnp.where(jnp.any(ok, axis=axis, keepdims=True), chosen, 0), axis=axis)
