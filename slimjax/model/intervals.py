"""Prediction intervals on a log scale (slimjax's extension; used by sweeps from a calibrated store
and by :func:`slimjax.predict`: one definition for both).

A positive prediction y with log-scale standard deviation s has the two-sided interval
y·exp(∓z·s), z the standard normal quantile at (1 + level)/2. The delta method gives
s² = gᵀ·C·g + σ², g = ∂ log y / ∂ log θ, C the covariance of log θ and σ² the fit's residual scatter
(a prediction interval, not only a confidence interval).
"""

from __future__ import annotations

import jax.numpy as jnp
from scipy.special import ndtri


def normal_quantile(level: float) -> float:
    """z with P(|Z| ≤ z) = ``level`` for a standard normal Z (1.6449 at 0.90)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return float(ndtri(0.5 + level / 2.0))


def log_sd(grad, cov, scatter):
    """s = √(gᵀ·C·g + σ²) over the trailing parameter axis (g: (..., p), C: (..., p, p))."""
    return jnp.sqrt(jnp.einsum("...i,...ij,...j->...", grad, cov, grad) + scatter)


def log_interval(value, sd, level: float):
    """(lower, upper) = value·exp(∓z·sd) at two-sided ``level``."""
    z = normal_quantile(level)
    return value * jnp.exp(-z * sd), value * jnp.exp(z * sd)
