"""Calibration of the capacity roofline's e_F, e_B and t_l (MODEL.md §0, §4) on measured ITL and TTFT,
with the same batched engine as SLIM's (:mod:`.solver`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr

from ..config import uses_float64
from ..errors import SlimjaxError
from ..inputs.serving import default_serving
from ..model.calculator import capacity_cell_terms, service_terms
from .features import padded_groups, row_features
from .solver import coefficient_slopes, coefficients_from, fit_batched, parameters_from, sharded, solver_options
from .uncertainty import gauss_newton

ROOFLINE_PARAMS = ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s")
ROOFLINE_STARTS = np.array([[0.5, 0.5, 1e-4], [0.9, 0.9, 1e-5], [0.3, 0.7, 1e-3]])
ROOFLINE_BOUNDED = ("compute_efficiency", "bandwidth_efficiency")  # no GPU runs above its peak


def roofline_coefficients(z):
    """(e_F, e_B, t_l) from the fit parameters: efficiencies σ(z) ∈ (0, 1), t_l = exp(z) > 0."""
    theta = coefficients_from(z, ROOFLINE_PARAMS, ROOFLINE_BOUNDED)
    return theta[..., 0], theta[..., 1], theta[..., 2]


def roofline_parameters(e_f, e_b, t_l):
    """The inverse of :func:`roofline_coefficients` (e_F, e_B in (0, 1), t_l > 0)."""
    return parameters_from(np.stack(np.broadcast_arrays(e_f, e_b, t_l), axis=-1), ROOFLINE_PARAMS, ROOFLINE_BOUNDED)


def roofline_service_at(compute_efficiency, bandwidth_efficiency, launch_overhead_s, feats):
    """The capacity roofline's service terms (MODEL.md §4) at the given e_F, e_B, t_l and the other
    serving settings at their defaults."""
    serving = default_serving(feats["model"], n_gpu=feats["n_gpu"], compute_efficiency=compute_efficiency,
                              bandwidth_efficiency=bandwidth_efficiency, launch_overhead_s=launch_overhead_s)
    cell = capacity_cell_terms(feats["model"], feats["gpu"], serving, feats["input_len"], feats["output_len"])
    return service_terms(cell, None, feats["batch"], feats["input_len"], feats["output_len"])


def roofline_predict(z, feats):
    out = roofline_service_at(*roofline_coefficients(z), feats)
    return out["itl_s"], out["ttft_s"]


def _roofline_residuals(z, feats, itl, ttft, mask_itl, mask_ttft):
    p_itl, p_ttft = roofline_predict(z, feats)
    return jnp.concatenate([jnp.where(mask_itl, p_itl / itl - 1.0, 0.0), jnp.where(mask_ttft, p_ttft / ttft - 1.0, 0.0)])


@functools.partial(jax.jit, static_argnames=("solver",))
def _fit_roofline_groups(z0, feats, itl, ttft, mask_itl, mask_ttft, *, solver):
    return fit_batched(_roofline_residuals, z0, (feats, itl, ttft, mask_itl, mask_ttft), solver)


@uses_float64
def roofline_errors(traces: pd.DataFrame, compute_efficiency=1.0, bandwidth_efficiency=1.0, launch_overhead_s=0.0) -> pd.DataFrame:
    """Signed relative errors (pred/meas − 1) of the roofline ITL and TTFT on ``traces``' rows."""
    out = roofline_service_at(compute_efficiency, bandwidth_efficiency, launch_overhead_s, row_features(traces))
    itl, ttft = np.asarray(out["itl_s"]), np.asarray(out["ttft_s"])
    return pd.DataFrame({"itl_error": itl / traces["itl_s"].to_numpy(float) - 1,
                         "ttft_error": ttft / traces["ttft_s"].to_numpy(float) - 1}, index=traces.index)


@uses_float64
def calibrate_roofline(traces: pd.DataFrame, group_by: Sequence[str] = ("model", "gpu", "n_gpu", "framework"), *,
                       solver: str = "lm", iterations: int = 40) -> xr.Dataset:
    """Fit the capacity roofline's e_F, e_B and t_l (MODEL.md §0, §4) to measured ITL and TTFT per
    group, all groups in one batched solve (the same engine as :func:`calibrate`); residuals are
    the relative ITL and TTFT errors of every row that has them. The efficiencies are bounded to
    (0, 1) (a logistic parameter): a fit cannot report a GPU running above its datasheet peak."""
    options = solver_options(solver, iterations)
    group_by = list(group_by)
    traces = traces[traces["itl_s"].notna() | traces["ttft_s"].notna()].reset_index(drop=True)
    if traces.empty:
        raise SlimjaxError("traces", "no rows with ttft_s or itl_s to fit the roofline to")
    keys, index, valid = padded_groups(traces, group_by)
    feats = jax.tree_util.tree_map(lambda x: np.asarray(x)[index], row_features(traces))
    itl, ttft = traces["itl_s"].to_numpy(float)[index], traces["ttft_s"].to_numpy(float)[index]
    m_itl, m_ttft = valid & np.isfinite(itl), valid & np.isfinite(ttft)
    itl, ttft = np.where(m_itl, itl, 1.0), np.where(m_ttft, ttft, 1.0)
    z, cost, its, conv, J = map(np.asarray, sharded(
        _fit_roofline_groups, parameters_from(ROOFLINE_STARTS, ROOFLINE_PARAMS, ROOFLINE_BOUNDED), feats, itl, ttft,
        m_itl, m_ttft, solver=options))
    n = m_itl.sum(axis=1) + m_ttft.sum(axis=1)
    theta = np.asarray(coefficients_from(z, ROOFLINE_PARAMS, ROOFLINE_BOUNDED))
    cov, identified, _ = gauss_newton(z, cost, J, n, coefficient_slopes(z, ROOFLINE_PARAMS, ROOFLINE_BOUNDED))
    p_itl, p_ttft = map(np.asarray, jax.vmap(roofline_predict)(jnp.asarray(z), feats))
    mape = lambda pred, meas, m: np.nanmean(np.where(m, np.abs(pred / meas - 1), np.nan), axis=1) * 100
    gdims = tuple(group_by)
    frame = pd.DataFrame([k if isinstance(k, tuple) else (k,) for k in keys], columns=group_by)
    ds = xr.Dataset(
        {
            "coefficients": (("group", "param"), theta),
            "standard_error": (("group", "param"), np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0))),
            "identified": (("group", "param"), identified),
            "converged": ("group", conv), "loss": ("group", cost), "n_points": ("group", n),
            "mape_itl": ("group", mape(p_itl, itl, m_itl), {"units": "%"}),
            "mape_ttft": ("group", mape(p_ttft, ttft, m_ttft), {"units": "%"}),
        },
        coords={"group": np.arange(len(keys)), "param": list(ROOFLINE_PARAMS), **{c: ("group", frame[c].to_numpy()) for c in group_by}},
        attrs={"solver": solver if isinstance(solver, str) else type(solver).__name__, "residual": "ITL_pred/ITL_meas - 1 and TTFT_pred/TTFT_meas - 1", "group_by": list(gdims)},
    )
    if len(gdims) == 1:  # one column: a plain index, nothing to unstack
        return ds.set_index(group=gdims[0]).rename(group=gdims[0])
    return ds.set_index(group=list(gdims)).unstack("group")
