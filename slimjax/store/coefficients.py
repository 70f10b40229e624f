"""The coefficient store's layout, for writing (``slimjax calibrate``) and reading (sweeps, ``predict``):
the one place that knows its variable names.

A store holds, over the calibration's group dims (e.g. model, gpu, n_gpu, framework) and ``param``:
``coefficients`` θ, ``standard_error``, ``covariance`` (param × param_), ``identified``,
``log_coefficients`` z = log θ, per group ``converged``, ``iterations``, ``loss``, ``mape_throughput``,
``mape_e2e``, ``mape_ttft``, ``n_points``, ``residual_variance``, and with a bootstrap
``bootstrap_log_coefficients`` (replicate × param); attrs ``variant``, ``solver``, ``loss``, …
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

from ..errors import SlimjaxError
from ..inputs.catalog import gpu_vendor
from ..inputs.coefficients import StoredCoefficients, StoreRef, check_coefficients
from ..model.intervals import (
    EXTRAPOLATION,
    GPU,
    INTERVAL_LEVEL,
    LENGTH,
    MODEL,
    extrapolation_form_error,
    extrapolation_label,
    form_errors,
    form_score,
)
from ..model.specs import SLIM_PARAMS
from .sink import open_store

COEFFICIENTS, COVARIANCE, LOG_COEFFICIENTS = "coefficients", "covariance", "log_coefficients"
RANGE_AXES = ("batch", "input_len", "output_len", "n_gpu")  # the fitted data's range per group: {axis}_min, {axis}_max
RESIDUAL_VARIANCE, BOOTSTRAP = "residual_variance", "bootstrap_log_coefficients"
TRANSFER_LOG_RATIO, TRANSFER_LOG_SD, TRANSFER_KIND = "transfer_log_ratio", "transfer_log_sd", "transfer_kind"


def coefficient_dataset(
    group_by: Sequence[str],
    levels: dict,
    params: Sequence[str],
    where: tuple,
    *,
    theta,
    se,
    cov,
    identified,
    converged,
    iterations,
    loss,
    mape_throughput,
    mape_e2e,
    mape_ttft,
    n_points,
    residual_variance,
    z,
    z_boot=None,
    ranges: dict | None = None,
    fitted_sets: dict | None = None,
    attrs: dict,
) -> xr.Dataset:
    """The store's Dataset from per-fitted-group arrays (leading axis: fitted groups, placed at
    ``where`` in the dense group grid; groups absent from the data are NaN with n_points 0)."""
    shape = tuple(len(levels[c]) for c in group_by)
    p = len(params)

    def dense(values, tail=(), fill=np.nan, dtype=float):
        out = np.full(shape + tail, fill, dtype)
        out[where] = values
        return out

    gdims = tuple(group_by)
    variables = {
        COEFFICIENTS: (gdims + ("param",), dense(theta, (p,)), {"long_name": "SLIM coefficients θ (MODEL.md §1)"}),
        "standard_error": (
            gdims + ("param",),
            dense(se, (p,)),
            {"long_name": "Gauss–Newton standard error of θ (NaN: not identified)"},
        ),
        COVARIANCE: (gdims + ("param", "param_"), dense(cov, (p, p)), {"long_name": "Gauss–Newton covariance of θ"}),
        "identified": (
            gdims + ("param",),
            dense(identified, (p,), False, bool),
            {"long_name": "the data identify this coefficient"},
        ),
        "converged": (gdims, dense(converged, fill=False, dtype=bool)),
        "iterations": (gdims, dense(iterations, fill=0, dtype=np.int64), {"long_name": "accepted solver steps"}),
        "loss": (gdims, dense(loss), {"long_name": "sum of squared relative throughput residuals"}),
        "mape_throughput": (gdims, dense(mape_throughput), {"units": "%"}),
        "mape_e2e": (gdims, dense(mape_e2e), {"units": "%"}),
        "mape_ttft": (
            gdims,
            dense(mape_ttft),
            {"units": "%", "long_name": "MAPE of T_pre against measured TTFT (NaN: none)"},
        ),
        "n_points": (
            gdims,
            dense(n_points, fill=0, dtype=np.int64),
            {"long_name": "residuals fitted (throughput and TTFT)"},
        ),
        RESIDUAL_VARIANCE: (
            gdims,
            dense(residual_variance),
            {"long_name": "σ² = loss / (n_points − identified coefficients)"},
        ),
        LOG_COEFFICIENTS: (
            gdims + ("param",),
            dense(z, (p,)),
            {"long_name": "fit parameters z at the optimum (θ = exp(z); η_c = σ(z), bounded to (0, 1))"},
        ),
    }
    for name, values in (ranges or {}).items():  # e.g. batch_min: the smallest batch the group was fitted on
        variables[name] = (gdims, dense(values), {"long_name": f"{name.replace('_', ' ')} of the fitted rows"})
    coords = {}
    for col, (names, member) in (fitted_sets or {}).items():  # which models / GPUs each group saw
        dim = f"fitted_{col}"
        variables[dim + "s"] = (
            gdims + (dim,),
            dense(member, (len(names),), False, bool),
            {"long_name": f"the group was fitted on rows of this {col}"},
        )
        coords[dim] = [str(n) for n in names]
    if z_boot is not None:
        replicates = z_boot.shape[0]
        variables[BOOTSTRAP] = (
            gdims + ("replicate", "param"),
            dense(np.moveaxis(z_boot, 0, 1), (replicates, p)),
            {"long_name": "z of the wild-bootstrap refits"},
        )
    return xr.Dataset(
        variables,
        coords={**{c: levels[c] for c in group_by}, "param": list(params), "param_": list(params), **coords},
        attrs=attrs,
    )


def transfer_variables(log_ratio, log_sd, kinds) -> dict:
    """The held-out residuals transfer intervals are calibrated from (``calibrate(intervals="transfer")``)."""
    dims = ("held_out",)
    return {
        TRANSFER_LOG_RATIO: (
            dims,
            np.asarray(log_ratio, float),
            {"long_name": "log(T_meas / T_pred) of a validation fold's held-out row"},
        ),
        TRANSFER_LOG_SD: (
            dims,
            np.asarray(log_sd, float),
            {"long_name": "the fold fit's log-scale sd of that prediction"},
        ),
        TRANSFER_KIND: (
            dims,
            np.asarray(kinds, np.int64),
            {
                "long_name": "kind of extrapolation of the fold",
                "flag_values": list(range(len(EXTRAPOLATION))),
                "flag_meanings": " ".join(EXTRAPOLATION),
            },
        ),
    }


def lookup(coeffs: xr.Dataset, points: pd.DataFrame) -> dict:
    """Per point, its group's z (point × param), covariance of θ, residual variance, bootstrap z
    (replicate × point × param, or None), looked up along the store's group dims."""
    dims = [d for d in coeffs[COEFFICIENTS].dims if d != "param"]
    missing = [d for d in dims if d not in points.columns]
    if missing:
        raise SlimjaxError("points", f"column {missing[0]!r} needed to look up the coefficients")
    for d in dims:  # name the value the store lacks (and what it has), not only that a lookup failed
        absent = sorted({str(v) for v in points[d].unique()} - {str(v) for v in coeffs[d].values})
        if absent:
            raise SlimjaxError(
                f"points.{d}",
                f"{absent[0]!r} has no coefficients in the store (its {d}: "
                f"{', '.join(map(str, coeffs[d].values))}); calibrate on rows of it or "
                f"group without {d}",
            )
    sel = {d: xr.DataArray(points[d].to_numpy(), dims="point") for d in dims}
    try:
        out = dict(
            z=coeffs[LOG_COEFFICIENTS].sel(sel).transpose("point", "param").values,
            cov=coeffs[COVARIANCE].sel(sel).transpose("point", "param", "param_").values,
            scatter=coeffs[RESIDUAL_VARIANCE].sel(sel).values,
        )
    except KeyError as e:
        raise SlimjaxError("points", f"no coefficients for {e}") from None
    out["z_boot"] = (
        coeffs[BOOTSTRAP].sel(sel).transpose("replicate", "point", "param").values if BOOTSTRAP in coeffs else None
    )
    out["transfer"] = TRANSFER_LOG_RATIO in coeffs
    if out["transfer"]:
        out["ranges"] = {
            f"{a}_{e}": coeffs[f"{a}_{e}"].sel(sel).values for a in ("input_len", "output_len") for e in ("min", "max")
        }
        for col in ("model", "gpu"):
            out[f"new_{col}"] = ~_member(coeffs[f"fitted_{col}s"].sel(sel), f"fitted_{col}", points[col].to_numpy())
        out["other_vendor"] = out["new_gpu"] & unmeasured_vendor(
            coeffs["fitted_gpus"].sel(sel), points["gpu"].to_numpy()
        )
    out["variant"] = coeffs.attrs.get("variant", "slim")
    return out


def _member(fitted: xr.DataArray, dim: str, labels) -> np.ndarray:
    """Per point (leading axis of ``fitted``), whether its label is among the fitted ones."""
    known = {str(v): k for k, v in enumerate(fitted[dim].values)}
    col = np.array([known.get(str(v), -1) for v in labels])
    values = fitted.transpose("point", dim).values
    return np.where(col >= 0, values[np.arange(len(col)), np.maximum(col, 0)], False)


def unmeasured_vendor(fitted: xr.DataArray, gpus) -> np.ndarray:
    """Per point (leading axis of ``fitted_gpus``), whether its GPU's vendor is none of its fitted GPUs' vendors:
    a transfer there has no held-out error to widen by (another vendor's say nothing of it)."""
    labels = np.asarray(fitted["fitted_gpu"].values).astype(str)
    values = fitted.transpose("point", "fitted_gpu").values
    return np.array(
        [
            gpu_vendor(g) not in {gpu_vendor(f) for f in labels[row]} - {None}
            for g, row in zip(gpus, values.astype(bool), strict=True)
        ]
    )


OTHER_VENDOR = "no interval: no measured rows of its vendor"


def read_for_sweep(ref: StoreRef, models: list[str], gpus: list[str]) -> StoredCoefficients:
    """Coefficients per swept (model, GPU) from a ``slimjax calibrate`` store; ``ref.select`` picks one
    value of every group dim beyond model and GPU (framework, n_gpu) that has several. Groups that did
    not converge, left coefficients unidentified, or were fitted on a narrower range than the sweep are
    noted (``notes``; the sweep warns and records them); the n_gpu they were fitted at is returned."""
    path, select = ref.path, ref.select
    stored = open_store(path)
    variant = stored.attrs.get("variant", "slim")
    coeffs = stored[COEFFICIENTS]
    for dim, v in select.items():
        if dim not in coeffs.dims or v not in coeffs[dim].values:
            raise SlimjaxError(
                f"slim.select.{dim}",
                f"{v!r} not in the store ({dim}: {list(coeffs[dim].values) if dim in coeffs.dims else 'no such dim'})",
            )
    extra = [d for d in coeffs.dims if d not in ("model", "gpu", "param") and d not in select]
    for d in extra:
        if coeffs.sizes[d] != 1:
            raise SlimjaxError(
                "slim.select", f"the store has {coeffs.sizes[d]} values of {d!r}; choose one with select: {{{d}: …}}"
            )
    n_gpu = (
        float(select["n_gpu"])
        if "n_gpu" in select
        else float(coeffs["n_gpu"].values[0])
        if "n_gpu" in coeffs.dims
        else None
    )

    def at(name: str, m: str, g: str):
        da = stored[name]
        for dim, v in select.items():
            da = da.sel({dim: v}) if dim in da.dims else da
        for d in extra:
            da = da.isel({d: 0}) if d in da.dims else da
        for dim, label in (("model", m), ("gpu", g)):
            if dim in da.dims:
                if label not in da[dim].values:
                    raise SlimjaxError("slim", f"the coefficient store has no {dim} {label!r}")
                da = da.sel({dim: label})
        return da

    table, uncertainty, notes, ranges, form = {}, {}, {}, {}, {}
    for m in models:
        for g in gpus:
            c = at(COEFFICIENTS, m, g)
            values = dict(zip(c["param"].values.tolist(), c.values.tolist(), strict=False))
            if any(not np.isfinite(v) for v in values.values()):
                raise SlimjaxError("slim", f"the coefficient store has no fit for {m} on {g}")
            table[(m, g)] = check_coefficients(values, f"slim ({path}: {m}, {g})")
            if COVARIANCE in stored and RESIDUAL_VARIANCE in stored:
                theta = np.array([table[(m, g)][p] for p in SLIM_PARAMS])
                safe = np.where(theta > 0, theta, 1.0)
                cv = np.asarray(at(COVARIANCE, m, g).transpose("param", "param_").values, float) / np.outer(safe, safe)
                uncertainty[(m, g)] = (np.where(np.isfinite(cv), cv, 0.0), float(at(RESIDUAL_VARIANCE, m, g)))
            problems = []
            if "converged" in stored and not bool(at("converged", m, g)):
                problems.append("did not converge")
            if "identified" in stored:
                ident = at("identified", m, g)
                pairs = zip(ident["param"].values.tolist(), ident.values.tolist(), strict=True)
                missing = [p for p, ok in pairs if not ok]
                if missing:
                    problems.append(f"left {', '.join(missing)} unidentified")
            if problems:
                notes[(m, g)] = " and ".join(problems)
            # (stores written before n_gpu ranges were recorded have batch and lengths only)
            have = [a for a in RANGE_AXES if f"{a}_min" in stored and f"{a}_max" in stored]
            if have:
                ranges[(m, g)] = {a: (float(at(f"{a}_min", m, g)), float(at(f"{a}_max", m, g))) for a in have}
            if TRANSFER_LOG_RATIO in stored:
                bits = 0
                for col, label, bit in (("model", m, MODEL), ("gpu", g, GPU)):
                    if not _member(at(f"fitted_{col}s", m, g).expand_dims("point"), f"fitted_{col}", [label])[0]:
                        bits |= bit
                inside, beyond = np.asarray(
                    extrapolation_form_error(np.array([bits, bits | LENGTH]), transfer_form(stored))
                )
                label = extrapolation_label(bits)
                if bits & GPU and unmeasured_vendor(at("fitted_gpus", m, g).expand_dims("point"), [g])[0]:
                    inside = beyond = np.nan
                    label = f"{label} ({OTHER_VENDOR})"
                form[(m, g)] = (float(inside), float(beyond), label)
    beta = stored.attrs.get("bandwidth_exponent")
    return StoredCoefficients(
        table,
        uncertainty,
        f"calibrated store {path}",
        notes,
        ranges,
        n_gpu,
        form,
        variant,
        None if beta is None else float(beta),
    )


def transfer_form(stored: xr.Dataset, level: float = INTERVAL_LEVEL) -> np.ndarray:
    """Per kind of extrapolation (EXTRAPOLATION order) the form error of a transfer store at ``level``."""
    scores = form_score(stored[TRANSFER_LOG_RATIO].values, stored[TRANSFER_LOG_SD].values, level)
    return np.asarray(form_errors(scores, stored[TRANSFER_KIND].values, level))[0]
