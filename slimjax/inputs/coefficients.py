"""SLIM coefficients of a sweep (MODEL.md §1): the shipped defaults (configs/slim/default.yaml), the
sweep file's ``slim`` block (one set, sets keyed by GPU, ``shared``), or a calibrated store — whose
layout only :mod:`slimjax.store` reads: a sweep parsed with a store reference is handed that reader."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .. import constants
from ..errors import SlimjaxError, suggest
from ..model.specs import SLIM_PARAMS, SlimCoeffs
from .catalog import configs_dir
from .checks import nonnegative


@dataclasses.dataclass(frozen=True)
class StoreRef:
    """``slim: PATH`` or ``slim: {coefficients: PATH, select: {dim: value}}``: a calibrated store to read."""

    path: str
    select: dict
    field: str  # where the path was given, for errors


@dataclasses.dataclass(frozen=True)
class StoredCoefficients:
    """What a store holds for the swept pairs: {(model, gpu): coefficients}, and where the store has
    them, {(model, gpu): (covariance of log θ (6 × 6), residual variance)}."""

    pairs: dict
    uncertainty: dict
    source: str
    notes: dict = dataclasses.field(default_factory=dict)  # {(model, gpu): what is wrong with its fit}
    ranges: dict = dataclasses.field(default_factory=dict)  # {(model, gpu): {axis: (min, max) fitted}}
    n_gpu: float | None = None  # the tensor-parallel degree the coefficients were fitted at
    # transfer intervals: {(model, gpu): (form error inside the fitted lengths, beyond them, kind label inside)}
    form: dict = dataclasses.field(default_factory=dict)
    variant: str = "slim"  # the model the store's coefficients belong to
    bandwidth_exponent: float | None = None  # slim-kv's β the store was fitted with


@dataclasses.dataclass(frozen=True, eq=False)
class SweepCoefficients:
    """Coefficients per (model, GPU) and, from a calibrated store, their uncertainty."""

    coeffs: SlimCoeffs  # leaves (M, G)
    table: dict  # GPU label -> coefficients (or model -> coefficients), for attrs
    source: str
    log_cov: np.ndarray | None  # (M, G, 6, 6) covariance of log θ
    scatter: np.ndarray | None  # (M, G) residual variance of the fit (relative², per point)
    stored: StoredCoefficients | None = None  # what a calibrated store said about its fits
    # (M, G, 6) transfer intervals: form error inside / beyond the fitted lengths, then the fitted input_len
    # min, max and output_len min, max; None: the fit's own intervals
    form: np.ndarray | None = None
    variant: str = "slim"  # "slim" (MODEL.md §1) or "slim-kv" (the optional variant)
    bandwidth_exponent: float = 1.0  # slim-kv's β (1 for §1, which has none)
    notes: dict = dataclasses.field(default_factory=dict)  # "model/gpu" -> what is wrong with the fit a sweep uses

    @property
    def interval_kind(self) -> dict | None:
        """ "model/gpu" -> the kind of extrapolation inside the fitted lengths (transfer intervals only)."""
        if self.form is None:
            return None
        return {f"{m}/{g}": v[2] for (m, g), v in self.stored.form.items()}


StoreReader = Callable[[StoreRef, list, list], StoredCoefficients]


def check_coefficients(values: Mapping, field: str, base: Mapping | None = None) -> dict[str, float]:
    """Six SLIM coefficients from a mapping (missing ones from ``base``): all ≥ 0, η_c, η_m > 0."""
    if not isinstance(values, Mapping):
        raise SlimjaxError(field, f"must be a mapping of {', '.join(SLIM_PARAMS)}, got {values!r}")
    unknown = [k for k in values if k not in SLIM_PARAMS]
    if unknown:
        raise SlimjaxError(f"{field}.{unknown[0]}", f"unknown coefficient{suggest(str(unknown[0]), SLIM_PARAMS)}")
    out = {}
    for name in SLIM_PARAMS:
        if name in values:
            out[name] = nonnegative(values[name], f"{field}.{name}", strictly=name in ("eta_c", "eta_m"))
        elif base is not None:
            out[name] = float(base[name])
        else:
            raise SlimjaxError(f"{field}.{name}", "missing")
    return out


@functools.cache
def default_coefficients() -> dict:
    """The shipped SLIM coefficients (configs/slim/default.yaml): {'default': {...}, 'gpus': {...}}."""
    with open(configs_dir() / "slim" / "default.yaml") as f:
        return yaml.safe_load(f)


def shipped_sets(variant: str = "slim") -> tuple[dict, dict]:
    """(pooled default, {GPU: set}) shipped for ``variant``: §1's at the top of configs/slim/default.yaml,
    another variant's under ``variants``."""
    shipped = default_coefficients()
    where = "configs/slim/default.yaml"
    if variant != "slim":
        if variant not in (shipped.get("variants") or {}):
            raise SlimjaxError(
                "slim_variant",
                f"no shipped {variant!r} coefficients in {where} (run bench/fit_default_slim.py --write)",
            )
        shipped, where = shipped["variants"][variant], f"{where}: variants.{variant}"
    base = check_coefficients(shipped["default"], f"{where}: default")
    return base, {g: check_coefficients(v, f"{where}: gpus.{g}", base) for g, v in (shipped.get("gpus") or {}).items()}


def _per_gpu(value: Any, gpus: list[str], variant: str = "slim") -> tuple[dict[str, dict[str, float]], str]:
    base, per_gpu = shipped_sets(variant)
    label = "configs/slim/default.yaml" + ("" if variant == "slim" else f" ({variant})")
    if value is None or value == "shared":  # one set for every GPU, so GPUs differ only through their specs
        return {g: base for g in gpus}, f"{label} (shared default)"
    if value == "per-gpu":  # fitted per GPU where available: better near their data, not comparable across GPUs
        return (
            {g: per_gpu.get(g, base) for g in gpus},
            f"{label} (per-GPU sets where fitted; GPUs are not comparable far from their data)",
        )
    if not isinstance(value, Mapping):
        raise SlimjaxError("slim", f"must be a mapping of coefficients (optionally keyed by GPU), got {value!r}")
    if all(k in SLIM_PARAMS for k in value):
        one = check_coefficients(value, "slim", base)
        return {g: one for g in gpus}, "sweep file"
    unknown = [k for k in value if k not in gpus and k != "default"]
    if unknown:
        raise SlimjaxError(
            f"slim.{unknown[0]}",
            f"not a coefficient nor a swept GPU{suggest(str(unknown[0]), list(SLIM_PARAMS) + gpus)}",
        )
    fallback = check_coefficients(value["default"], "slim.default", base) if "default" in value else None
    table = {}
    for g in gpus:
        if g in value:
            table[g] = check_coefficients(value[g], f"slim.{g}", base)
        elif fallback is not None:
            table[g] = fallback
        else:
            raise SlimjaxError(f"slim.{g}", "no coefficients for this GPU (give them, or a 'default' entry)")
    return table, "sweep file"


def store_ref(value: Any) -> StoreRef | None:
    """The store a ``slim`` value names, or None (coefficients given inline, ``shared`` or omitted)."""
    if isinstance(value, str) and value not in ("shared", "per-gpu"):
        return StoreRef(value, {}, "slim")
    if isinstance(value, Mapping) and "coefficients" in value:
        path, select = value.get("coefficients"), value.get("select") or {}
        if not isinstance(path, str):
            raise SlimjaxError("slim.coefficients", f"must be a path to a coefficient store, got {path!r}")
        if not isinstance(select, Mapping):
            raise SlimjaxError("slim.select", f"must be a mapping of dim: value, got {select!r}")
        return StoreRef(path, dict(select), "slim.coefficients")
    return None


VARIANTS = constants.SLIM_VARIANTS  # MODEL.md §1, and the optional variant of slimjax.model.slim_kv


def shipped_bandwidth_exponent(variant: str) -> float:
    """β of the variant's effective bandwidth as shipped (configs/slim/default.yaml; 1 where none is)."""
    if variant == "slim":
        return 1.0
    return float((default_coefficients().get("variants") or {}).get(variant, {}).get("bandwidth_exponent", 1.0))


def resolve_variant(variant: str | None, field: str = "slim_variant") -> str | None:
    """A variant name, or ``recommended``: the one configs/slim/default.yaml names as the transfer winner."""
    if variant == "recommended":
        variant = default_coefficients().get("recommended_variant", "slim")
    if variant is not None and variant not in VARIANTS:
        raise SlimjaxError(
            field,
            f"{variant!r} is not one of {', '.join(VARIANTS)} or recommended{suggest(str(variant), list(VARIANTS))}",
        )
    return variant


def coefficients_block(
    value: Any, models: list[str], gpus: list[str], read_store: StoreReader | None = None, variant: str | None = None
) -> SweepCoefficients:
    """The sweep's coefficients per (model, GPU) from its ``slim`` value (see :mod:`this module <.>`), for the
    ``slim_variant`` asked (default: a store's own variant, else ``recommended``: the variant
    configs/slim/default.yaml names, today slim-kv; MODEL.md §1's ``slim`` stays selectable)."""
    variant = resolve_variant(variant)
    ref = store_ref(value)
    if ref is not None:
        if not Path(ref.path).exists():
            raise SlimjaxError(ref.field, f"coefficient store {ref.path!r} not found")
        if read_store is None:
            raise SlimjaxError(
                ref.field,
                "a coefficient store is read by slimjax.api.parse / slimjax.sweep, not by the inputs floor alone",
            )
        stored = read_store(ref, models, gpus)
        if variant is not None and variant != stored.variant:
            raise SlimjaxError(
                "slim_variant",
                f"{variant!r}, but {ref.path} holds {stored.variant!r} coefficients "
                f"(calibrate with --variant {variant}, or drop slim_variant)",
            )
        pairs, unc = stored.pairs, stored.uncertainty
        table = {g: {m: pairs[(m, g)] for m in models} for g in gpus}
        log_cov = scatter = None
        if unc:
            log_cov = np.stack([np.stack([unc[(m, g)][0] for g in gpus]) for m in models])
            scatter = np.array([[unc[(m, g)][1] for g in gpus] for m in models])
        coeffs = SlimCoeffs(**{p: np.asarray([[pairs[(m, g)][p] for g in gpus] for m in models]) for p in SLIM_PARAMS})
        form = None
        if stored.form:
            form = np.array(
                [
                    [
                        [
                            *stored.form[(m, g)][:2],
                            *stored.ranges[(m, g)]["input_len"],
                            *stored.ranges[(m, g)]["output_len"],
                        ]
                        for g in gpus
                    ]
                    for m in models
                ],
                float,
            )
        beta = (
            stored.bandwidth_exponent
            if stored.bandwidth_exponent is not None
            else shipped_bandwidth_exponent(stored.variant)
        )
        return SweepCoefficients(coeffs, table, stored.source, log_cov, scatter, stored, form, stored.variant, beta)
    variant = variant or resolve_variant("recommended")  # the default: the variant that reads the weights (issue 20)
    table, source = _per_gpu(value, gpus, variant)
    coeffs = SlimCoeffs(
        **{
            p: np.broadcast_to(np.asarray([table[g][p] for g in gpus]), (len(models), len(gpus))).copy()
            for p in SLIM_PARAMS
        }
    )
    return SweepCoefficients(
        coeffs, table, source, None, None, variant=variant, bandwidth_exponent=shipped_bandwidth_exponent(variant)
    )
