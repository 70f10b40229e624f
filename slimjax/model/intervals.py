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

INTERVAL_LEVEL = 0.90  # the level sweeps, predict and validate report


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


# ------------------------------------------------------------------ transfer (model-form) intervals
# Under extrapolation the model's form errs by more than its coefficients' uncertainty. The transfer
# interval widens the log-scale half-width z·s in quadrature by a form term m:
#     h = √((z·s)² + m²),   interval y·exp(∓h).
# m is a split-conformal quantile (Vovk et al.; Lei et al. 2018) of held-out scores
#     m_i = √(max(r_i² − (z·s_i)², 0)),   r_i = log(y_meas,i / y_pred,i),
# the smallest m that puts row i inside its interval, so that with n exchangeable scores the
# ⌈(n + 1)·level⌉-th smallest covers a new row with probability ≥ level. Each kind of extrapolation has
# its own m (EXTRAPOLATION below); a prediction that is several kinds at once takes the largest.
EXTRAPOLATION = ("same-curve", "length", "model", "gpu", "combined")  # form-error kinds, in store order
LENGTH, MODEL, GPU = 1, 2, 4  # extrapolation bits of a prediction (0: inside the fit's lengths, models, GPUs)


def form_score(log_ratio, sd, level: float):
    """m_i = √(max(r² − (z·s)², 0)): the form term that just covers a held-out row."""
    z = normal_quantile(level)
    return jnp.sqrt(jnp.maximum(log_ratio**2 - (z * sd) ** 2, 0.0))


def conformal_quantile(scores, level: float):
    """The ⌈(n + 1)·level⌉-th smallest of the finite ``scores`` along the last axis (NaN: not a score):
    +inf when n is too small for that rank, NaN when n = 0."""
    scores = jnp.asarray(scores)
    n = jnp.sum(jnp.isfinite(scores), axis=-1)
    ordered = jnp.sort(jnp.where(jnp.isfinite(scores), scores, jnp.inf), axis=-1)  # non-scores last
    k = jnp.ceil((n + 1) * level).astype(jnp.int32)
    at = jnp.take_along_axis(ordered, jnp.clip(k - 1, 0, scores.shape[-1] - 1)[..., None], axis=-1)[..., 0]
    return jnp.where(n == 0, jnp.nan, jnp.where(k > n, jnp.inf, at))


def form_errors(scores, kinds, level: float, eligible=None):
    """Per kind of extrapolation (last axis, EXTRAPOLATION order) the conformal quantile of the scores
    whose ``kinds`` (indices into EXTRAPOLATION) are that kind; ``eligible`` (rows × scores, boolean)
    restricts the scores row by row, giving one set of form errors per row (else one set)."""
    scores = jnp.asarray(scores)
    eligible = jnp.ones((1, scores.shape[-1]), bool) if eligible is None else jnp.asarray(eligible)
    use = eligible[:, None, :] & (jnp.asarray(kinds)[None, :] == jnp.arange(len(EXTRAPOLATION))[:, None])[None]
    return conformal_quantile(jnp.where(use, scores, jnp.nan), level)


def extrapolation_form_error(bits, form):
    """m for predictions with extrapolation ``bits`` (LENGTH | MODEL | GPU) from the per-kind ``form``
    errors (trailing axis in EXTRAPOLATION order): the largest over the kinds that apply — same-curve
    always, combined when both model and length are new. NaN when a kind that applies has none."""
    form = jnp.asarray(form)
    bits = jnp.asarray(bits)
    applies = jnp.stack(
        [
            jnp.ones_like(bits, bool),
            (bits & LENGTH) > 0,
            (bits & MODEL) > 0,
            (bits & GPU) > 0,
            ((bits & LENGTH) > 0) & ((bits & MODEL) > 0),
        ],
        axis=-1,
    )
    # max that propagates NaN from an applicable kind (no estimate) but ignores inapplicable ones
    return jnp.max(jnp.where(applies, form, -jnp.inf), axis=-1)


def extrapolation_label(bits: int) -> str:
    """'same-curve', or the new things joined: 'length', 'model+length', 'gpu', …"""
    names = [name for bit, name in ((MODEL, "model"), (LENGTH, "length"), (GPU, "gpu")) if bits & bit]
    return "+".join(names) if names else "same-curve"


def widened_sd(sd, form, level: float):
    """The log-scale sd s' with z·s' = √((z·s)² + m²), so that log_interval(y, s') is the transfer
    interval; NaN where m is NaN (no estimate for that kind)."""
    return jnp.sqrt(sd**2 + (form / normal_quantile(level)) ** 2)


def transfer_interval(value, sd, form, level: float):
    """(lower, upper) = value·exp(∓√((z·s)² + m²))."""
    return log_interval(value, widened_sd(sd, form, level), level)
