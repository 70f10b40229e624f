"""Calibration of the capacity roofline's e_F, e_B and t_l (MODEL.md §0, §4) on measured ITL and TTFT,
with the same batched engine as SLIM's (:mod:`.solver`) — and on p90 TTFT at a known Poisson arrival
rate through §5's wait quantile: W_p(λ) + TTFT_k(m), §8's TTFT at quantile p, at m = min(cap, max_seqs)
slots of S(m)."""

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
from ..model import queue
from ..model.calculator import capacity_cell_terms, service_terms
from ..model.procurement import study_ttft
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


def _roofline_cell(compute_efficiency, bandwidth_efficiency, launch_overhead_s, feats):
    """The capacity calculator's cell terms (§3–§4) at the given e_F, e_B, t_l, the other serving settings at their
    defaults."""
    serving = default_serving(
        feats["model"],
        n_gpu=feats["n_gpu"],
        compute_efficiency=compute_efficiency,
        bandwidth_efficiency=bandwidth_efficiency,
        launch_overhead_s=launch_overhead_s,
    )
    return capacity_cell_terms(feats["model"], feats["gpu"], serving, feats["input_len"], feats["output_len"])


def roofline_service_at(compute_efficiency, bandwidth_efficiency, launch_overhead_s, feats):
    """The capacity roofline's service terms (MODEL.md §4) at the given e_F, e_B, t_l and the other
    serving settings at their defaults."""
    cell = _roofline_cell(compute_efficiency, bandwidth_efficiency, launch_overhead_s, feats)
    return service_terms(cell, None, feats["batch"], feats["input_len"], feats["output_len"])


def roofline_predict(z, feats):
    out = roofline_service_at(*roofline_coefficients(z), feats)
    return out["itl_s"], out["ttft_s"]


TTFT_QUANTILE = 0.9  # the quantile the ttft_p90_s column holds


def ttft_quantile_at(
    compute_efficiency,
    bandwidth_efficiency,
    launch_overhead_s,
    feats,
    arrival_rate,
    quantile=TTFT_QUANTILE,
    max_slots: int | None = None,
):
    """(TTFT at ``quantile``, utilization ρ) of a replica under Poisson arrivals at ``arrival_rate``:
    W_p(λ) + t_pre + ITL(m) (MODEL.md §5 wait quantile, §8 TTFT in a study) on m = min(feats["max_concurrency"]
    (no cap: NaN), max_seqs) slots of S(m); +inf without a steady state."""
    cell = _roofline_cell(compute_efficiency, bandwidth_efficiency, launch_overhead_s, feats)
    return _ttft_quantile(cell, feats, arrival_rate, quantile, max_slots)


def _ttft_quantile(cell, feats, arrival_rate, quantile, max_slots):
    I, O = feats["input_len"], feats["output_len"]
    cap = feats["max_concurrency"]
    slots = jnp.minimum(jnp.where(jnp.isnan(cap), jnp.inf, cap), cell["max_seqs"])
    at_m = service_terms(cell, None, jnp.maximum(slots, 1.0), I, O)
    q = queue.mmc(slots, at_m["service_s"], arrival_rate, max_slots)
    wait = queue.wait_quantile(q["p_wait"], slots, at_m["service_s"], arrival_rate, quantile)
    return wait + study_ttft(cell["prefill_s"], at_m["itl_s"]), q["utilization"]


def _roofline_residuals(z, feats, itl, ttft, mask_itl, mask_ttft, p90=None, rate=None, mask_p90=None, max_slots=None):
    cell = _roofline_cell(*roofline_coefficients(z), feats)  # one cell for the mean and the p90 residuals
    out = service_terms(cell, None, feats["batch"], feats["input_len"], feats["output_len"])
    r = [jnp.where(mask_itl, out["itl_s"] / itl - 1.0, 0.0), jnp.where(mask_ttft, out["ttft_s"] / ttft - 1.0, 0.0)]
    if p90 is not None:
        pred, rho = _ttft_quantile(cell, feats, rate, TTFT_QUANTILE, max_slots)
        # no steady state at these coefficients although the run had one: a finite penalty that falls with ρ
        r.append(jnp.where(mask_p90, jnp.where(jnp.isfinite(pred), pred / p90 - 1.0, 10.0 + rho), 0.0))
    return jnp.concatenate(r)


@functools.partial(jax.jit, static_argnames=("solver", "max_slots"))
def _fit_roofline_groups(
    z0, feats, itl, ttft, mask_itl, mask_ttft, p90=None, rate=None, mask_p90=None, *, solver, max_slots=None
):
    residuals = functools.partial(_roofline_residuals, max_slots=max_slots)
    return fit_batched(residuals, z0, (feats, itl, ttft, mask_itl, mask_ttft, p90, rate, mask_p90), solver)


@uses_float64
def roofline_errors(
    traces: pd.DataFrame, compute_efficiency=1.0, bandwidth_efficiency=1.0, launch_overhead_s=0.0
) -> pd.DataFrame:
    """Signed relative errors (pred/meas − 1) of the roofline ITL and TTFT on ``traces``' rows."""
    out = roofline_service_at(compute_efficiency, bandwidth_efficiency, launch_overhead_s, row_features(traces))
    itl, ttft = np.asarray(out["itl_s"]), np.asarray(out["ttft_s"])
    return pd.DataFrame(
        {
            "itl_error": itl / traces["itl_s"].to_numpy(float) - 1,
            "ttft_error": ttft / traces["ttft_s"].to_numpy(float) - 1,
        },
        index=traces.index,
    )


@uses_float64
def calibrate_roofline(
    traces: pd.DataFrame,
    group_by: Sequence[str] = ("model", "gpu", "n_gpu", "framework"),
    *,
    solver: str = "lm",
    iterations: int = 40,
) -> xr.Dataset:
    """Fit the capacity roofline's e_F, e_B and t_l (MODEL.md §0, §4) to measured ITL and TTFT per
    group, all groups in one batched solve (the same engine as :func:`calibrate`); residuals are
    the relative ITL and TTFT errors of every row that has them. The efficiencies are bounded to
    (0, 1) (a logistic parameter): a fit cannot report a GPU running above its datasheet peak.

    Rows with a ``ttft_p90_s`` at a known ``arrival_rate`` (a rate-driven benchmark run) are fitted on
    that percentile instead of the mean TTFT: the relative error of W_0.9(λ) + t_pre + ITL(m), MODEL.md §5's
    wait quantile on m = min(max_concurrency, max_seqs) slots (:func:`ttft_quantile_at`) — the mean
    TTFT of a queued run is not §4's batch screen. ``mape_ttft_p90`` reports that fit.
    """
    options = solver_options(solver, iterations)
    group_by = list(group_by)
    traces = traces.reset_index(drop=True)
    for col in ("ttft_p90_s", "arrival_rate", "max_concurrency"):
        if col not in traces:
            traces[col] = np.nan
    at_rate = (traces["ttft_p90_s"].notna() & (traces["arrival_rate"] > 0)).to_numpy()
    traces = traces[traces["itl_s"].notna() | traces["ttft_s"].notna() | at_rate].reset_index(drop=True)
    if traces.empty:
        raise SlimjaxError(
            "traces", "no rows with ttft_s, itl_s, or ttft_p90_s at an arrival_rate to fit the roofline to"
        )
    at_rate = (traces["ttft_p90_s"].notna() & (traces["arrival_rate"] > 0)).to_numpy()
    keys, index, valid = padded_groups(traces, group_by)
    rows = row_features(traces)
    rows["max_concurrency"] = traces["max_concurrency"].to_numpy(float)
    feats = jax.tree_util.tree_map(lambda x: np.asarray(x)[index], rows)
    itl, ttft = traces["itl_s"].to_numpy(float)[index], traces["ttft_s"].to_numpy(float)[index]
    m_p90 = valid & at_rate[index]
    m_itl, m_ttft = valid & np.isfinite(itl), valid & np.isfinite(ttft) & ~m_p90
    itl, ttft = np.where(m_itl, itl, 1.0), np.where(m_ttft, ttft, 1.0)
    queued = ()
    max_slots = None
    if at_rate.any():
        p90 = np.where(m_p90, traces["ttft_p90_s"].to_numpy(float)[index], 1.0)
        rate = np.where(m_p90, traces["arrival_rate"].to_numpy(float)[index], 0.0)
        cap = np.where(np.isnan(rows["max_concurrency"]), np.inf, rows["max_concurrency"])
        max_slots = queue.queue_bound(np.minimum(cap, rows["max_seqs"])[at_rate])  # m does not depend on e_F, e_B, t_l
        queued = (p90, rate, m_p90)
    z, cost, its, conv, J = map(
        np.asarray,
        sharded(
            _fit_roofline_groups,
            parameters_from(ROOFLINE_STARTS, ROOFLINE_PARAMS, ROOFLINE_BOUNDED),
            feats,
            itl,
            ttft,
            m_itl,
            m_ttft,
            *queued,
            solver=options,
            max_slots=max_slots,
        ),
    )
    n = m_itl.sum(axis=1) + m_ttft.sum(axis=1) + m_p90.sum(axis=1)
    theta = np.asarray(coefficients_from(z, ROOFLINE_PARAMS, ROOFLINE_BOUNDED))
    cov, identified, _ = gauss_newton(z, cost, J, n, coefficient_slopes(z, ROOFLINE_PARAMS, ROOFLINE_BOUNDED))
    p_itl, p_ttft = map(np.asarray, jax.vmap(roofline_predict)(jnp.asarray(z), feats))

    def mape(pred, meas, m):  # NaN for a group without such rows
        return (
            np.sum(np.where(m, np.abs(pred / meas - 1), 0.0), axis=1)
            / np.where(m.any(axis=1), m.sum(axis=1), np.nan)
            * 100
        )

    gdims = tuple(group_by)
    frame = pd.DataFrame([k if isinstance(k, tuple) else (k,) for k in keys], columns=group_by)
    ds = xr.Dataset(
        {
            "coefficients": (("group", "param"), theta),
            "standard_error": (("group", "param"), np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0))),
            "identified": (("group", "param"), identified),
            "converged": ("group", conv),
            "loss": ("group", cost),
            "n_points": ("group", n),
            "mape_itl": ("group", mape(p_itl, itl, m_itl), {"units": "%"}),
            "mape_ttft": ("group", mape(p_ttft, ttft, m_ttft), {"units": "%"}),
            **(
                {
                    "mape_ttft_p90": (
                        "group",
                        mape(
                            np.asarray(
                                jax.vmap(
                                    lambda zz, f, lam: ttft_quantile_at(
                                        *roofline_coefficients(zz), f, lam, max_slots=max_slots
                                    )[0]
                                )(jnp.asarray(z), feats, queued[1])
                            ),
                            queued[0],
                            m_p90,
                        ),
                        {"units": "%", "long_name": "MAPE of W_0.9(λ) + t_pre + ITL(m) against measured p90 TTFT"},
                    )
                }
                if queued
                else {}
            ),
        },
        coords={
            "group": np.arange(len(keys)),
            "param": list(ROOFLINE_PARAMS),
            **{c: ("group", frame[c].to_numpy()) for c in group_by},
        },
        attrs={
            "kind": "roofline_calibration",
            "solver": solver if isinstance(solver, str) else type(solver).__name__,
            "residual": "ITL_pred/ITL_meas - 1 and TTFT_pred/TTFT_meas - 1",
            "group_by": list(gdims),
        },
    )
    if len(gdims) == 1:  # one column: a plain index, nothing to unstack
        return ds.set_index(group=gdims[0]).rename(group=gdims[0])
    return ds.set_index(group=list(gdims)).unstack("group")
