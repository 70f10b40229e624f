"""Batched calibration of SLIM's coefficients (MODEL.md §1) and prediction with uncertainty.

All groups are fitted at once: one jitted, vmapped Levenberg–Marquardt solve over groups × restarts
(:mod:`.solver`) on the relative throughput residuals r_i = T_pred,i / T_meas,i − 1, with JAX autodiff
Jacobians, positivity by θ = exp(z), groups padded to the largest and masked. Standard errors and
covariance come from the Gauss–Newton approximation σ²(JᵀJ)⁻¹ at the optimum (:mod:`.uncertainty`);
directions the design cannot identify are reported, not silently filled. The store's layout is
:mod:`slimjax.store.coefficients`'.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr

from ..config import float64_scope
from ..errors import SlimjaxError
from ..inputs.coefficients import VARIANTS as VARIANT_NAMES
from ..inputs.coefficients import resolve_variant, shipped_bandwidth_exponent
from ..inputs.serving import default_serving
from ..model.floor import floor_inputs, floor_of
from ..model.intervals import extrapolation_form_error, extrapolation_label, log_interval, log_sd, transfer_interval
from ..model.slim import slim_variables
from ..model.slim_kv import slim_kv_variables
from ..model.specs import SLIM_PARAMS, SlimCoeffs
from ..store import coefficients as layout
from .features import measured_e2e, measured_throughput, padded_groups, row_features
from .folds import folds, study_rows
from .solver import (
    LOSSES,
    cauchy_residual,
    coefficient_slopes,
    coefficients_from,
    fit_batched,
    parameters_from,
    sharded,
    solver_options,
)
from .transfer import extrapolation_bits, held_out_log_ratio, kind_codes
from .uncertainty import bootstrap_covariance, gauss_newton

# Deterministic starting points (η_c, η_m, B0, α, γ, t_fixed); the best end point wins.
STARTS = np.array(
    [
        [0.5, 0.8, 4.0, 1e-4, 1e-6, 0.1],
        [0.3, 0.5, 32.0, 1e-5, 1e-5, 1.0],
        [0.9, 1.0, 1.0, 1e-3, 1e-7, 0.01],
    ]
)
_FLOOR = 1e-12  # θ = exp(z) never reaches 0; coefficients below this read as 0
# Coefficients that are fractions of a peak are bounded to (0, 1) as θ = σ(z); the others are θ = exp(z).
# η_c is one in both variants (a prefill cannot beat the GPU's FLOP/s). η_m is one in slim-kv, where it
# divides the KV reads' bandwidth alone; in MODEL.md §1's Eq. 9 it scales (B + B0)·[T_d + M_dec/BW] together
# with B0 and the contract asks only η_m > 0 (bounding it there moved validate's E2E MAPE 27.5 → 39.4 %
# on length transfer, 43.7 → 55.3 % combined: it is a shape parameter, not a fraction of peak).


def _floor(f):
    """The physical floor of the rows where features carry its inputs (prediction; a fit matches the model's own
    curve)."""
    return floor_of(f["floor"], f["input_len"], f["output_len"]) if "floor" in f else None


def _slim(theta, f):
    out = slim_variables(
        f["model"], f["gpu"], SlimCoeffs(*theta), f["batch"], f["input_len"], f["output_len"], f["n_gpu"], _floor(f)
    )
    return out["slim_throughput"], out["slim_e2e_s"], out["slim_prefill_s"]


def _slim_kv(theta, f):
    out = slim_kv_variables(
        f["model"],
        f["gpu"],
        SlimCoeffs(*theta),
        f["batch"],
        f["input_len"],
        f["output_len"],
        f["max_seqs"],
        f["n_gpu"],
        f["bandwidth_exponent"],
        _floor(f),
    )
    return out["slim_throughput"], out["slim_e2e_s"], out["slim_prefill_s"]


class Variant(NamedTuple):
    """A calibratable throughput model: its coefficient names, restart points, (T, E2E, T_pre) predictor
    and the coefficients bounded to (0, 1)."""

    params: tuple[str, ...]
    starts: np.ndarray
    predict: Callable
    bounded: tuple[str, ...]


# keyed by the one list of variant names (slimjax.inputs.coefficients.VARIANTS), in its order
VARIANTS = dict(
    zip(
        VARIANT_NAMES,
        (
            Variant(SLIM_PARAMS, STARTS, _slim, ("eta_c",)),
            # per-sequence KV reads and the KV-capacity limit (slim.slim_kv_variables); optional, not the contract
            Variant(
                SLIM_PARAMS,
                np.vstack(
                    [
                        STARTS,
                        [
                            [0.5, 0.5, 64.0, 3e-4, 1e-6, 0.01],
                            [0.2, 0.9, 200.0, 1e-4, 1e-5, 0.1],
                            [0.7, 0.3, 10.0, 1e-3, 1e-6, 1e-4],
                        ],
                    ]
                ),
                _slim_kv,
                ("eta_c", "eta_m"),
            ),
        ),
        strict=True,
    )
)


def _variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise SlimjaxError("variant", f"{name!r} is not one of {', '.join(VARIANTS)}")
    return VARIANTS[name]


def _predict(z, feats, variant="slim"):
    spec = VARIANTS[variant]
    theta = coefficients_from(z, spec.params, spec.bounded)
    theta = [theta[i] for i in range(len(spec.params))]
    return VARIANTS[variant].predict(theta, feats)


def _residuals(z, feats, t_meas, ttft, mask_t, mask_ttft, variant="slim", loss="squared", with_ttft=True):
    """Relative throughput errors, and relative TTFT errors of T_pre (the batch's prefill, which
    is what the first token waits for when the batch is prefilled together) where rows have a TTFT
    (``with_ttft`` False: no row has one, so that half is left out)."""
    t, _, t_pre = _predict(z, feats, variant)
    r = jnp.where(mask_t, t / t_meas - 1.0, 0.0)
    if with_ttft:
        r = jnp.concatenate([r, jnp.where(mask_ttft, t_pre / ttft - 1.0, 0.0)])
    return cauchy_residual(r) if loss == "cauchy" else r


@functools.partial(jax.jit, static_argnames=("solver", "variant", "loss", "with_ttft"))
def fit_groups(
    z0,
    feats,
    t_meas,
    ttft,
    mask_t,
    mask_ttft,
    *,
    solver,
    variant: str = "slim",
    loss: str = "squared",
    with_ttft: bool = True,
):
    """SLIM fits of every group at once (see :func:`slimjax.fit.solver.fit_batched`)."""
    residuals = functools.partial(_residuals, variant=variant, loss=loss, with_ttft=with_ttft)
    return fit_batched(residuals, z0, (feats, t_meas, ttft, mask_t, mask_ttft), solver)


def _bootstrap(z, feats, t_meas, ttft, mask, mask_ttft, t_pred, pre_pred, n, replicates, seed, fit_options):
    """log-coefficients of ``replicates`` wild-bootstrap refits of every group: (replicates, groups, p)."""
    rng = np.random.default_rng(seed)
    G, p = z.shape
    inflate = np.sqrt(n / np.maximum(n - p, 1))[:, None]
    r_t = np.where(mask, t_pred / t_meas - 1.0, 0.0) * inflate
    r_f = np.where(mask_ttft, pre_pred / ttft - 1.0, 0.0) * inflate
    reps = []
    for _ in range(replicates):  # data only: the refits below are one batched solve
        s_t, s_f = rng.choice([-1.0, 1.0], size=r_t.shape), rng.choice([-1.0, 1.0], size=r_f.shape)
        reps.append((t_pred / np.maximum(1.0 + s_t * r_t, 0.05), pre_pred / np.maximum(1.0 + s_f * r_f, 0.05)))
    t_star = np.concatenate([r[0] for r in reps])
    f_star = np.concatenate([r[1] for r in reps])
    tile = lambda x: np.concatenate([np.asarray(x)] * replicates)  # noqa: E731
    z_boot = sharded(
        fit_groups,
        tile(z)[:, None, :],
        jax.tree_util.tree_map(tile, feats),
        t_star,
        np.where(tile(mask_ttft), f_star, 1.0),
        tile(mask),
        tile(mask_ttft),
        **fit_options,
    )[0]
    return np.asarray(z_boot).reshape(replicates, G, p)


def calibrate(
    traces: pd.DataFrame,
    group_by: Sequence[str] = ("model", "gpu", "n_gpu", "framework"),
    *,
    solver="lm",
    iterations: int = 30,
    variant: str = "slim",
    loss: str = "squared",
    bootstrap: int = 0,
    seed: int = 0,
    intervals: str = "fit",
    bandwidth_exponent: float | None = None,
) -> xr.Dataset:
    """Fit SLIM's six coefficients per group of ``traces`` (the canonical table), all groups at once.

    Residuals: T_pred/T_meas − 1 for rows with a throughput (or an E2E), and T_pre/TTFT − 1 for
    rows with a ``ttft_s`` (a batch's prefill time: it identifies η_c, which IL = OL throughput
    curves barely do).

    Returns a Dataset with dims (*group_by, param): ``coefficients``, ``standard_error``,
    ``covariance`` (param × param_), ``identified``, and per group ``converged``, ``iterations``,
    ``loss`` (Σ r²), ``mape_throughput``, ``mape_e2e``, ``n_points``. Groups absent from the data
    are NaN with n_points 0. ``variant`` "slim-kv" fits the optional variant of
    :func:`slimjax.slim.slim_kv_variables` (same six coefficients) instead of MODEL.md §1. ``loss``
    "cauchy" is the robust alternative to squared relative errors (:func:`cauchy_residual`): use it
    when a few runs are unlike the rest (``loss`` then holds Σ ρ(r), and the covariance is the
    Gauss–Newton one of the robust residuals). ``bootstrap`` = R > 1 replaces the Gauss–Newton
    covariance by that of R wild-bootstrap refits of every group (residuals at the optimum, inflated
    by √(n/(n−p)), with random signs; all R × groups refits in one batched solve, warm-started at
    the optimum, ``seed`` fixed): it follows the model's curvature where the linearisation of few,
    correlated coefficients is poor. Coefficients the design cannot identify stay NaN.

    ``intervals`` "fit" (default): prediction intervals from the coefficient covariance and the residual
    scatter — honest inside the fitted ranges. "transfer": also run the validation scenarios of
    :mod:`.folds` on ``traces`` (same curve, length, model, GPU, combined; one more batched solve), keep
    every held-out row's log-ratio residual and log-scale sd (``transfer_log_ratio``, ``transfer_log_sd``,
    ``transfer_kind`` over ``held_out``), and let ``predict`` and sweeps widen each interval by the
    split-conformal form error of the kind of extrapolation the prediction is
    (:mod:`slimjax.model.intervals`). A kind the data cannot exercise (one GPU: no GPU transfer) has no
    form error, and predictions of that kind get no interval (NaN) rather than an overconfident one.

    ``bandwidth_exponent`` β (slim-kv only; :mod:`slimjax.model.slim_kv`): decode time ∝ BW_max^(−β) across GPUs;
    default the shipped value, or a ``bandwidth_exponent`` column of ``traces`` per row. Recorded in the
    store's attrs for ``predict`` and sweeps.
    """
    variant = resolve_variant(variant, "variant")
    if intervals not in ("fit", "transfer"):
        raise SlimjaxError("intervals", f"must be 'fit' or 'transfer', got {intervals!r}")
    if bandwidth_exponent is not None and variant == "slim":
        raise SlimjaxError(
            "bandwidth_exponent", "only the slim-kv variant has one (MODEL.md §1 scales by L·D², not bandwidth)"
        )
    beta = shipped_bandwidth_exponent(variant) if bandwidth_exponent is None else float(bandwidth_exponent)
    if not 0.0 <= beta <= 2.0:
        raise SlimjaxError("bandwidth_exponent", f"must be in [0, 2], got {beta!r}")
    if "bandwidth_exponent" not in traces:
        traces = traces.assign(bandwidth_exponent=beta)
    if bootstrap < 0 or bootstrap == 1:
        raise SlimjaxError("bootstrap", f"must be 0 (Gauss–Newton) or at least 2 replicates, got {bootstrap!r}")
    options = solver_options(solver, iterations)
    if loss not in LOSSES:
        raise SlimjaxError("loss", f"must be one of {', '.join(LOSSES)}, got {loss!r}")
    spec = _variant(variant)
    with float64_scope():
        ds = _calibrate(
            traces,
            list(group_by),
            options,
            spec,
            variant,
            loss,
            bootstrap,
            seed,
            solver if isinstance(solver, str) else type(solver).__name__,
        )
        if intervals == "transfer":
            ds = ds.assign(layout.transfer_variables(*_transfer_residuals(traces, solver, iterations, variant, loss)))
            ds.attrs["intervals"] = "transfer"
        return ds


def _transfer_residuals(traces, solver, iterations, variant, loss):
    """Held-out log-ratio residuals, log-scale sds and scenario kinds of every validation fold over ``traces``."""
    rows, _ = study_rows(traces)
    every = folds(rows)
    if not every:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    train = pd.concat([rows.iloc[f.train].assign(_fold=k) for k, f in enumerate(every)], ignore_index=True)
    test = pd.concat([rows.iloc[f.test].assign(_fold=k) for k, f in enumerate(every)], ignore_index=True)
    fitted = calibrate(train, group_by=["_fold"], solver=solver, iterations=iterations, variant=variant, loss=loss)
    p = predict(fitted, test)
    return (
        held_out_log_ratio(p),
        p["pred_throughput_log_sd"].to_numpy(float),
        kind_codes([f.scenario for f in every for _ in f.test]),
    )


ABSURD_B0 = 1e4  # B0 beyond this many times the largest fitted batch: not converged


def _calibrate(traces, group_by, options, spec, variant, loss, bootstrap, seed, solver_name) -> xr.Dataset:
    traces = traces.reset_index(drop=True)
    keys, index, valid = padded_groups(traces, group_by)
    feats_rows = row_features(traces)
    feats_rows["bandwidth_exponent"] = traces["bandwidth_exponent"].to_numpy(float)
    t_all = measured_throughput(traces)
    feats = jax.tree_util.tree_map(lambda x: np.asarray(x)[index], feats_rows)
    t_meas, ttft = t_all[index], traces["ttft_s"].to_numpy(float)[index]
    mask, mask_ttft = valid & np.isfinite(t_meas), valid & np.isfinite(ttft)
    t_meas, ttft = np.where(mask, t_meas, 1.0), np.where(mask_ttft, ttft, 1.0)
    fit_options = dict(solver=options, variant=variant, loss=loss, with_ttft=bool(mask_ttft.any()))
    z, cost, its, conv, J = map(
        np.asarray,
        sharded(
            fit_groups,
            parameters_from(spec.starts, spec.params, spec.bounded),
            feats,
            t_meas,
            ttft,
            mask,
            mask_ttft,
            **fit_options,
        ),
    )
    n = mask.sum(axis=1) + mask_ttft.sum(axis=1)
    cov, identified, sigma2 = gauss_newton(z, cost, J, n, coefficient_slopes(z, spec.params, spec.bounded))
    # fewer residuals than coefficients: any curve fits them exactly, and that is not a calibration
    underdetermined = n < len(spec.params)
    if underdetermined.all():  # nothing was calibrated: an error, not a store of NaN
        raise SlimjaxError(
            "traces",
            f"no group has enough rows to fit {len(spec.params)} coefficients (the largest has "
            f"{int(n.max())} residuals over {len(traces)} rows); add measurements or group "
            f"coarser than {', '.join(group_by)}",
        )
    conv = np.where(underdetermined, False, conv)
    z = np.where(underdetermined[:, None], np.nan, z)
    cov = np.where(underdetermined[:, None, None], np.nan, cov)
    identified = identified & ~underdetermined[:, None]
    # an absurd scale is not a calibration: a batch offset far beyond the batches fitted (the decode term carried by
    # B0 alone, α and γ at 0) or beyond them along a direction the data cannot see
    b0 = np.asarray(coefficients_from(z, spec.params, spec.bounded))[:, list(spec.params).index("B0")]
    b_max = np.max(np.where(valid, traces["batch"].to_numpy(float)[index], 0.0), axis=1)
    absurd = (b0 > ABSURD_B0 * b_max) | (~identified[:, list(spec.params).index("B0")] & (b0 > b_max))
    conv = np.where(absurd, False, conv)
    t_pred, e_pred, pre_pred = map(
        np.asarray, jax.vmap(functools.partial(_predict, variant=variant))(jnp.asarray(z), feats)
    )
    z_boot = None
    if bootstrap:
        z_boot = _bootstrap(z, feats, t_meas, ttft, mask, mask_ttft, t_pred, pre_pred, n, bootstrap, seed, fit_options)
        cov = bootstrap_covariance(z_boot, z, cov, coefficient_slopes(z, spec.params, spec.bounded))
    e_meas = measured_e2e(traces)[index]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an underdetermined group has no MAPE, only NaN
        mape_t = np.nanmean(np.where(mask, np.abs(t_pred / t_meas - 1), np.nan), axis=1) * 100
        mape_e = np.nanmean(np.where(mask, np.abs(e_pred / e_meas - 1), np.nan), axis=1) * 100
        mape_ttft = np.sum(np.where(mask_ttft, np.abs(pre_pred / ttft - 1), 0.0), axis=1) / mask_ttft.sum(axis=1) * 100

    levels = {c: sorted(traces[c].unique().tolist()) for c in group_by}
    position = {c: {v: i for i, v in enumerate(levels[c])} for c in group_by}
    where = tuple(
        np.array([position[c][(key if isinstance(key, tuple) else (key,))[j]] for key in keys])
        for j, c in enumerate(group_by)
    )
    theta = np.asarray(coefficients_from(z, spec.params, spec.bounded))
    theta = np.where(theta < _FLOOR, 0.0, theta)
    se = np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0.0))
    return layout.coefficient_dataset(
        group_by,
        levels,
        spec.params,
        where,
        theta=theta,
        se=se,
        cov=cov,
        identified=identified,
        converged=conv,
        iterations=its,
        loss=cost,
        mape_throughput=mape_t,
        mape_e2e=mape_e,
        mape_ttft=mape_ttft,
        n_points=n,
        residual_variance=sigma2,
        z=z,
        z_boot=z_boot,
        ranges=_fitted_ranges(traces, index, valid),
        fitted_sets=_fitted_sets(traces, index, valid),
        attrs={
            "kind": "calibration",
            "variant": variant,
            "solver": solver_name,
            "loss": loss,
            "bootstrap": int(bootstrap),
            "iterations_max": options.iterations,
            "residual": "T_pred / T_meas - 1",
            "group_by": list(group_by),
            "source": traces.attrs.get("source", ""),
            **(
                {"bandwidth_exponent": float(np.unique(traces["bandwidth_exponent"])[0])}
                if variant != "slim" and traces["bandwidth_exponent"].nunique() == 1
                else {}
            ),
        },
    )


def _fitted_sets(traces, index, valid) -> dict:
    """Per group and model / GPU: was the group fitted on rows of it (what makes a prediction new in model or GPU)."""
    out = {}
    for col in ("model", "gpu"):
        codes, names = pd.factorize(traces[col])
        member = np.zeros((index.shape[0], len(names)), bool)
        g = np.repeat(np.arange(index.shape[0]), index.shape[1])
        member[g[valid.ravel()], codes[index].ravel()[valid.ravel()]] = True
        out[col] = (list(names), member)
    return out


def _fitted_ranges(traces, index, valid) -> dict:
    """Per group, the smallest and largest batch, input and output length it was fitted on."""
    out = {}
    for a in layout.RANGE_AXES:
        v = traces[a].to_numpy(float)[index]
        out[f"{a}_min"] = np.min(np.where(valid, v, np.inf), axis=1)
        out[f"{a}_max"] = np.max(np.where(valid, v, -np.inf), axis=1)
    return out


def _check_points(points: pd.DataFrame) -> None:
    """Sizes are positive integers (a batch of −3 has no throughput), named by column and row."""
    for col in ("batch", "input_len", "output_len", "n_gpu"):
        if col not in points:
            if col == "n_gpu":
                continue
            raise SlimjaxError("points", f"column {col!r} is missing")
        v = pd.to_numeric(points[col], errors="coerce").to_numpy(float)
        bad = ~(np.isfinite(v) & (v >= 1) & (v == np.round(v)))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise SlimjaxError(f"points.{col}", f"must be a positive integer, got {points[col].iloc[k]} (row {k})")


def predict(coeffs: xr.Dataset, points: pd.DataFrame, level: float = 0.90) -> pd.DataFrame:
    """``points`` (canonical columns model, gpu, n_gpu, batch, input_len, output_len) with
    pred_e2e_s, pred_throughput and their ``level`` intervals (_lo, _hi), none faster than the 100 %-of-peak
    roofline of the point's configuration (``pred_at_floor`` where that floor binds).

    Each point takes the coefficients of its group along the group dims ``coeffs`` has (so
    coefficients fitted per model on one GPU predict another GPU through its specs). Intervals: delta
    method on log T with the coefficient covariance plus the group's residual scatter (a prediction
    interval, not only a confidence interval; :mod:`slimjax.model.intervals`, as sweeps do). From a
    store calibrated with ``intervals="transfer"`` the intervals are widened by the form error of each
    point's kind of extrapolation, named in ``interval_kind`` (``form_error``: the log-scale term).
    Always: ``pred_throughput_log_sd`` and ``pred_e2e_s_log_sd``, the fit's log-scale sds.
    """
    _check_points(points)
    found = layout.lookup(coeffs, points)
    z, cov, scatter, zb, variant = found["z"], found["cov"], found["scatter"], found["z_boot"], found["variant"]
    _variant(variant)
    with float64_scope():
        pred = functools.partial(_predict, variant=variant)
        feats = row_features(points.assign(n_gpu=points.get("n_gpu", 1)))
        # no prediction faster than physics: each time at least the 100 %-of-peak roofline of the point's group, as a
        # sweep has it (slimjax.model.floor; at the serving defaults)
        feats["floor"] = floor_inputs(
            feats["model"], feats["gpu"], default_serving(feats["model"], n_gpu=feats["n_gpu"])
        )
        floor = floor_of(feats["floor"], feats["input_len"], feats["output_len"])
        pre_f, dec_f = map(np.asarray, floor(feats["batch"]))
        e_floor = pre_f + dec_f
        tokens = feats["batch"] * (feats["input_len"] + feats["output_len"])
        beta = float(coeffs.attrs.get("bandwidth_exponent", shipped_bandwidth_exponent(variant)))
        feats["bandwidth_exponent"] = (
            points["bandwidth_exponent"].to_numpy(float)
            if "bandwidth_exponent" in points
            else np.full(len(points), beta)
        )
        t, e, _ = map(np.asarray, jax.vmap(pred)(jnp.asarray(z), feats))
        model_e = np.asarray(jax.vmap(pred)(jnp.asarray(z), {k: v for k, v in feats.items() if k != "floor"})[1])
        if zb is not None:  # the spread of the refits' own predictions
            tb, eb, _ = map(np.asarray, jax.vmap(lambda zr: jax.vmap(pred)(zr, feats))(jnp.asarray(zb)))
            sd_t = np.sqrt(np.var(np.log(tb), axis=0, ddof=1) + scatter)
            sd_e = np.sqrt(np.var(np.log(eb), axis=0, ddof=1) + scatter)
        else:
            # delta method: gradient of log T and log E2E with respect to z, per point
            glt = np.asarray(jax.vmap(jax.grad(lambda zz, f: jnp.log(pred(zz, f)[0])))(jnp.asarray(z), feats))
            gle = np.asarray(jax.vmap(jax.grad(lambda zz, f: jnp.log(pred(zz, f)[1])))(jnp.asarray(z), feats))
            slope = coefficient_slopes(z, VARIANTS[variant].params, VARIANTS[variant].bounded)
            cov_z = cov / np.einsum("pi,pj->pij", slope, slope)
            cov_z = np.where(np.isfinite(cov_z), cov_z, 0.0)
            sd_t, sd_e = np.asarray(log_sd(glt, cov_z, scatter)), np.asarray(log_sd(gle, cov_z, scatter))
        t_lo, t_hi = map(np.asarray, log_interval(t, sd_t, level))
        e_lo, e_hi = map(np.asarray, log_interval(e, sd_e, level))
        transfer = found["transfer"]
        if transfer:
            bits = extrapolation_bits(points, found["new_model"], found["new_gpu"], found["ranges"])
            m = np.asarray(extrapolation_form_error(bits, layout.transfer_form(coeffs, level)))
            m = np.where(found["other_vendor"], np.nan, m)  # no other vendor's errors passed off as this one's
            t_lo, t_hi = map(np.asarray, transfer_interval(t, sd_t, m, level))
            e_lo, e_hi = map(np.asarray, transfer_interval(e, sd_e, m, level))
    # the optimistic ends are physics-capped too, as in sweeps
    t_hi, e_lo = np.minimum(t_hi, tokens / e_floor), np.maximum(e_lo, e_floor)
    out = points.copy()
    out["pred_at_floor"] = e > model_e  # the floor raised the model's own time
    out["pred_throughput_log_sd"], out["pred_e2e_s_log_sd"] = sd_t, sd_e
    if transfer:
        out["interval_kind"] = [
            extrapolation_label(int(b)) + (f" ({layout.OTHER_VENDOR})" if other else "")
            for b, other in zip(bits, found["other_vendor"], strict=True)
        ]
        out["form_error"] = m
    out["pred_throughput"], out["pred_e2e_s"] = t, e
    out["pred_throughput_lo"], out["pred_throughput_hi"] = t_lo, t_hi
    out["pred_e2e_s_lo"], out["pred_e2e_s_hi"] = e_lo, e_hi
    return out
