"""Batch-capacity advisor, B_cap (MODEL.md §2; source 000, Eq. 13)."""

from __future__ import annotations

import jax.numpy as jnp


def batching_efficiency(throughput, throughput_at_1, batch):
    """T(I,O,B) / (B·T(I,O,1)): throughput relative to linear scaling from B = 1 (dimensionless)."""
    return throughput / (batch * throughput_at_1)


def batch_capacity(throughput, e2e_s, batch, throughput_at_1, slo_s, epsilon, axis, allowed=None):
    """B_cap = argmax_B T  s.t.  E2E ≤ SLO  and  T/(B·T(1)) > ε  (and ``allowed``, e.g. B ≤ max_seqs).

    ``batch`` holds the batch values broadcast along ``axis`` (length 1 elsewhere); the other
    arguments broadcast against ``throughput``. A masked argmax over ``axis``, written as a max
    then a min (two plain reductions XLA fuses with their producers) so that ties go to the
    smallest qualifying batch; 0 where none qualifies. The batch axis is removed.
    """
    ok = (e2e_s <= slo_s) & (batching_efficiency(throughput, throughput_at_1, batch) > epsilon)
    if allowed is not None:
        ok = ok & allowed
    best = jnp.max(jnp.where(ok, throughput, -jnp.inf), axis=axis, keepdims=True)
    first = jnp.min(jnp.where(ok & (throughput == best), batch, jnp.inf), axis=axis)
    return jnp.where(jnp.isfinite(first), first, 0)
