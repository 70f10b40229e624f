"""Sweep files: YAML (or a dict) in, a validated :class:`Sweep` out. All input checking lives here."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from . import catalog
from .errors import SlimjaxError, suggest
from .specs import SLIM_PARAMS, GPUSpec, ModelSpec, SlimCoeffs, stack

REQUIRED_KEYS = ("models", "gpus", "batch", "input_len", "output_len")
OPTIONAL_KEYS = ("slim", "advisor", "precision")
AXES = ("batch", "input_len", "output_len")
PRECISIONS = ("float32", "float64")
DEFAULT_SLO_REFERENCE = {"input_len": 2, "output_len": 128, "batch": 32}
DEFAULT_EPSILON = 0.5
DEFAULT_SLO_FACTOR = 4.0  # the paper's loose SLO


@dataclasses.dataclass(frozen=True)
class Advisor:
    epsilon: float
    slo_s: float | None  # absolute SLO, or None for factor × E2E(reference)
    slo_factor: float | None
    slo_reference: dict[str, int]


@dataclasses.dataclass(frozen=True, eq=False)
class Sweep:
    """A validated sweep: labels beside stacked spec pytrees, coefficients per (model, GPU)."""

    models: list[str]
    gpus: list[str]
    model: ModelSpec  # leaves (M,)
    gpu: GPUSpec  # leaves (G,)
    coeffs: SlimCoeffs  # leaves (M, G)
    coeffs_table: dict[str, dict[str, float]]  # GPU label -> coefficients, for attrs
    coeffs_source: str
    batch: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    advisor: Advisor | None
    precision: str
    source: str  # the sweep file path, or "<dict>"
    spec: dict  # the spec as given (for provenance)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.models), len(self.gpus), len(self.batch), len(self.input_len), len(self.output_len))

    @property
    def dtype(self):
        return np.dtype(self.precision)


def _parse_axis(value: Any, field: str) -> np.ndarray:
    if isinstance(value, Mapping):
        unknown = set(value) - {"start", "stop", "step"}
        if unknown:
            raise SlimjaxError(f"{field}.{sorted(unknown)[0]}", "unknown key; a range has start, stop, step")
        for key in ("start", "stop"):
            if key not in value:
                raise SlimjaxError(f"{field}.{key}", "missing from the range")
        step = value.get("step", 1)
        for key, v in (("start", value["start"]), ("stop", value["stop"]), ("step", step)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise SlimjaxError(f"{field}.{key}", f"must be an integer, got {v!r}")
        if step <= 0:
            raise SlimjaxError(f"{field}.step", f"must be positive, got {step!r}")
        values = list(range(value["start"], value["stop"] + 1, step))
        if not values:
            raise SlimjaxError(field, f"range {dict(value)!r} is empty")
    elif isinstance(value, (list, tuple)):
        values = list(value)
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        values = [int(value)]
    else:
        raise SlimjaxError(field, f"must be a list of integers or {{start, stop, step}}, got {value!r}")
    if not values:
        raise SlimjaxError(field, "is empty")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or float(v) != int(v):
            raise SlimjaxError(f"{field}[{i}]", f"must be an integer, got {v!r}")
        if v <= 0:
            raise SlimjaxError(f"{field}[{i}]", f"must be positive, got {v!r}")
    arr = np.asarray(values, dtype=np.int64)
    if np.any(np.diff(arr) <= 0):
        i = int(np.argmax(np.diff(arr) <= 0)) + 1
        raise SlimjaxError(f"{field}[{i}]", f"values must be strictly increasing, got {int(arr[i - 1])} then {int(arr[i])}")
    return arr


def _nonneg(value: Any, field: str, *, strictly: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise SlimjaxError(field, f"must be a number, got {value!r}")
    if value < 0 or (strictly and value == 0):
        raise SlimjaxError(field, f"must be {'positive' if strictly else 'non-negative'}, got {value!r}")
    return float(value)


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
            out[name] = _nonneg(values[name], f"{field}.{name}", strictly=name in ("eta_c", "eta_m"))
        elif base is not None:
            out[name] = float(base[name])
        else:
            raise SlimjaxError(f"{field}.{name}", "missing")
    return out


@functools.cache
def default_coefficients() -> dict:
    """The shipped SLIM coefficients (configs/slim/default.yaml): {'default': {...}, 'gpus': {...}}."""
    with open(catalog.configs_dir() / "slim" / "default.yaml") as f:
        return yaml.safe_load(f)


def _coefficients(value: Any, gpus: list[str]) -> tuple[dict[str, dict[str, float]], str]:
    shipped = default_coefficients()
    base = check_coefficients(shipped["default"], "configs/slim/default.yaml: default")
    per_gpu = {
        g: check_coefficients(v, f"configs/slim/default.yaml: gpus.{g}", base)
        for g, v in (shipped.get("gpus") or {}).items()
    }
    if value is None:
        return {g: per_gpu.get(g, base) for g in gpus}, "configs/slim/default.yaml"
    if not isinstance(value, Mapping):
        raise SlimjaxError("slim", f"must be a mapping of coefficients (optionally keyed by GPU), got {value!r}")
    if all(k in SLIM_PARAMS for k in value):
        one = check_coefficients(value, "slim", base)
        return {g: one for g in gpus}, "sweep file"
    unknown = [k for k in value if k not in gpus and k != "default"]
    if unknown:
        raise SlimjaxError(f"slim.{unknown[0]}", f"not a coefficient nor a swept GPU{suggest(str(unknown[0]), list(SLIM_PARAMS) + gpus)}")
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


def _advisor(value: Any, batch: np.ndarray) -> Advisor | None:
    if value is False:
        return None
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise SlimjaxError("advisor", f"must be a mapping (epsilon, slo_s or slo_factor, slo_reference) or false, got {value!r}")
    unknown = set(value) - {"epsilon", "slo_s", "slo_factor", "slo_reference"}
    if unknown:
        name = sorted(unknown)[0]
        raise SlimjaxError(f"advisor.{name}", f"unknown key{suggest(name, ['epsilon', 'slo_s', 'slo_factor', 'slo_reference'])}")
    epsilon = _nonneg(value.get("epsilon", DEFAULT_EPSILON), "advisor.epsilon")
    if "slo_s" in value and ("slo_factor" in value or "slo_reference" in value):
        raise SlimjaxError("advisor.slo_s", "give either slo_s or slo_factor (+ slo_reference), not both")
    slo_s = _nonneg(value["slo_s"], "advisor.slo_s", strictly=True) if "slo_s" in value else None
    factor = None if slo_s is not None else _nonneg(value.get("slo_factor", DEFAULT_SLO_FACTOR), "advisor.slo_factor", strictly=True)
    ref = dict(DEFAULT_SLO_REFERENCE)
    given = value.get("slo_reference") or {}
    if not isinstance(given, Mapping):
        raise SlimjaxError("advisor.slo_reference", f"must be a mapping of input_len, output_len, batch, got {given!r}")
    for key, v in given.items():
        if key not in ref:
            raise SlimjaxError(f"advisor.slo_reference.{key}", f"unknown key{suggest(str(key), list(ref))}")
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SlimjaxError(f"advisor.slo_reference.{key}", f"must be a positive integer, got {v!r}")
        ref[key] = v
    if batch[0] != 1:
        raise SlimjaxError("batch", f"must contain 1 when the advisor is on (T(I,O,1) anchors ε); it starts at {int(batch[0])}")
    return Advisor(epsilon=epsilon, slo_s=slo_s, slo_factor=factor, slo_reference=ref)


def load_spec(spec: str | Path | Mapping) -> tuple[dict, str, Path | None]:
    """The spec mapping, its source label, and the folder relative paths are read from."""
    if isinstance(spec, Mapping):
        return dict(spec), "<dict>", None
    path = Path(spec)
    try:
        text = path.read_text()
    except OSError as e:
        raise SlimjaxError("sweep file", f"cannot read {str(path)!r} ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SlimjaxError("sweep file", f"{str(path)!r} is not valid YAML: {e}") from None
    if not isinstance(data, Mapping):
        raise SlimjaxError("sweep file", f"{str(path)!r} must hold a mapping of {', '.join(REQUIRED_KEYS)}, got {type(data).__name__}")
    return dict(data), str(path), path.parent


def _labels(items: list[tuple[str, dict]], field: str) -> None:
    seen = set()
    for i, (label, _) in enumerate(items):
        if label in seen:
            raise SlimjaxError(f"{field}[{i}]", f"{label!r} appears twice")
        seen.add(label)


def parse(spec: str | Path | Mapping) -> Sweep:
    """Validate a sweep file (path) or mapping into a :class:`Sweep`; raises SlimjaxError naming the field."""
    data, source, base_dir = load_spec(spec)
    unknown = [k for k in data if k not in REQUIRED_KEYS + OPTIONAL_KEYS]
    if unknown:
        raise SlimjaxError(str(unknown[0]), f"unknown top-level key{suggest(str(unknown[0]), REQUIRED_KEYS + OPTIONAL_KEYS)}")
    for key in REQUIRED_KEYS:
        if key not in data or data[key] is None:
            raise SlimjaxError(key, "missing (a sweep needs models, gpus, batch, input_len, output_len)")
    for key in ("models", "gpus"):
        if not isinstance(data[key], list) or not data[key]:
            raise SlimjaxError(key, f"must be a non-empty list, got {data[key]!r}")
    models = [catalog.resolve_model(m, f"models[{i}]", base_dir) for i, m in enumerate(data["models"])]
    gpus = [catalog.resolve_gpu(g, f"gpus[{i}]") for i, g in enumerate(data["gpus"])]
    _labels(models, "models")
    _labels(gpus, "gpus")
    axes = {a: _parse_axis(data[a], a) for a in AXES}
    precision = data.get("precision", "float32")
    if precision not in PRECISIONS:
        raise SlimjaxError("precision", f"must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    gpu_names = [g for g, _ in gpus]
    table, coeffs_source = _coefficients(data.get("slim"), gpu_names)
    coeffs = SlimCoeffs(**{
        p: np.broadcast_to(np.asarray([table[g][p] for g in gpu_names]), (len(models), len(gpus))).copy()
        for p in SLIM_PARAMS
    })
    return Sweep(
        models=[m for m, _ in models],
        gpus=gpu_names,
        model=stack(ModelSpec, [row for _, row in models]),
        gpu=stack(GPUSpec, [row for _, row in gpus]),
        coeffs=coeffs,
        coeffs_table=table,
        coeffs_source=coeffs_source,
        advisor=_advisor(data.get("advisor"), axes["batch"]),
        precision=precision,
        source=source,
        spec=data,
        **axes,
    )
