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
from .specs import SLIM_PARAMS, GPUSpec, MeasuredSpec, ModelSpec, ServingSpec, SlimCoeffs, stack

REQUIRED_KEYS = ("models", "gpus", "batch", "input_len", "output_len")
OPTIONAL_KEYS = ("slim", "advisor", "precision", "serving", "arrival_rate", "measured")
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
    coeffs_log_cov: np.ndarray | None  # (M, G, 6, 6) covariance of log θ from a calibrated store
    coeffs_scatter: np.ndarray | None  # (M, G) residual variance of the fit (relative², per point)
    batch: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    advisor: Advisor | None
    precision: str
    serving: ServingSpec | None  # leaves (M, G); None: the capacity calculator is off
    serving_table: dict | None  # model -> GPU -> settings as given units, for attrs
    measured: MeasuredSpec | None  # leaves (M, G), NaN where a pair has no measurement
    arrival_rate: np.ndarray | None  # requests/s; None: no queue variables
    source: str  # the sweep file path, or "<dict>"
    spec: dict  # the spec as given (for provenance)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.models), len(self.gpus), len(self.batch), len(self.input_len), len(self.output_len))

    @property
    def dtype(self):
        return np.dtype(self.precision)


def _parse_axis(value: Any, field: str, *, integer: bool = True) -> np.ndarray:
    """An axis: a list, one value, or {start, stop, step} with stop inclusive; strictly increasing.

    Integer axes (batch, lengths) are positive integers (step defaults to 1); the arrival-rate axis
    takes non-negative numbers.
    """
    number = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, Mapping):
        unknown = set(value) - {"start", "stop", "step"}
        if unknown:
            raise SlimjaxError(f"{field}.{sorted(unknown)[0]}", "unknown key; a range has start, stop, step")
        for key in ("start", "stop") if integer else ("start", "stop", "step"):
            if key not in value:
                raise SlimjaxError(f"{field}.{key}", "missing from the range")
        bounds = {"step": 1, **value}
        for key in ("start", "stop", "step"):
            if isinstance(bounds[key], bool) or not isinstance(bounds[key], number):
                raise SlimjaxError(f"{field}.{key}", f"must be {'an integer' if integer else 'a number'}, got {bounds[key]!r}")
        start, stop, step = bounds["start"], bounds["stop"], bounds["step"]
        if step <= 0:
            raise SlimjaxError(f"{field}.step", f"must be positive, got {step!r}")
        values = list(range(start, stop + 1, step)) if integer else list(np.arange(start, stop + step * 1e-9, step))
        if not values:
            raise SlimjaxError(field, f"range {dict(value)!r} is empty")
    elif isinstance(value, (list, tuple)):
        values = list(value)
    elif isinstance(value, number) and not isinstance(value, bool):
        values = [value]
    else:
        raise SlimjaxError(field, f"must be a list of {'integers' if integer else 'numbers'} or {{start, stop, step}}, got {value!r}")
    if not values:
        raise SlimjaxError(field, "is empty")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
            raise SlimjaxError(f"{field}[{i}]", f"must be a number, got {v!r}")
        if integer and float(v) != int(v):
            raise SlimjaxError(f"{field}[{i}]", f"must be an integer, got {v!r}")
        if integer and v <= 0:
            raise SlimjaxError(f"{field}[{i}]", f"must be positive, got {v!r}")
        if v < 0:
            raise SlimjaxError(f"{field}[{i}]", f"must be non-negative, got {v!r}")
    arr = np.asarray(values, dtype=np.int64 if integer else np.float64)
    if np.any(np.diff(arr) <= 0):
        i = int(np.argmax(np.diff(arr) <= 0)) + 1
        raise SlimjaxError(f"{field}[{i}]", f"values must be strictly increasing, got {arr[i - 1]:g} then {arr[i]:g}")
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


def _stored_coefficients(value: Any, models: list[str], gpus: list[str]) -> tuple[dict, str]:
    """Coefficients per (model, GPU) from a ``slimjax calibrate`` store: ``PATH`` or
    ``{coefficients: PATH, select: {dim: value}}`` for dims beyond model and GPU (framework, n_gpu)."""
    from .store import open_store

    path, select = (value, {}) if isinstance(value, str) else (value.get("coefficients"), dict(value.get("select") or {}))
    if not isinstance(path, str) or not Path(path).exists():
        raise SlimjaxError("slim.coefficients" if isinstance(value, Mapping) else "slim", f"coefficient store {path!r} not found")
    stored = open_store(path)
    variant = stored.attrs.get("variant", "slim")
    if variant != "slim":
        raise SlimjaxError("slim", f"{path} holds {variant!r} coefficients; sweeps evaluate MODEL.md §1 SLIM "
                                   "(calibrate with --variant slim), the variant is for predict and validate")
    coeffs = stored["coefficients"]
    cov = stored["covariance"] if "covariance" in stored else None
    scatter = stored["residual_variance"] if "residual_variance" in stored else None
    for dim, v in select.items():
        if dim not in coeffs.dims or v not in coeffs[dim].values:
            raise SlimjaxError(f"slim.select.{dim}", f"{v!r} not in the store ({dim}: {list(coeffs[dim].values) if dim in coeffs.dims else 'no such dim'})")
        coeffs = coeffs.sel({dim: v})
        cov = None if cov is None else cov.sel({dim: v})
        scatter = None if scatter is None else scatter.sel({dim: v})
    extra = [d for d in coeffs.dims if d not in ("model", "gpu", "param")]
    for d in extra:
        if coeffs.sizes[d] != 1:
            raise SlimjaxError("slim.select", f"the store has {coeffs.sizes[d]} values of {d!r}; choose one with select: {{{d}: …}}")
        coeffs = coeffs.isel({d: 0})
        cov = None if cov is None else cov.isel({d: 0})
        scatter = None if scatter is None else scatter.isel({d: 0})
    table, uncertainty = {}, {}
    for m in models:
        for g in gpus:
            at = coeffs
            for dim, label in (("model", m), ("gpu", g)):
                if dim in at.dims:
                    if label not in at[dim].values:
                        raise SlimjaxError("slim", f"the coefficient store has no {dim} {label!r}")
                    at = at.sel({dim: label})
            values = dict(zip(at["param"].values.tolist(), at.values.tolist()))
            if any(not np.isfinite(v) for v in values.values()):
                raise SlimjaxError("slim", f"the coefficient store has no fit for {m} on {g}")
            table[(m, g)] = check_coefficients(values, f"slim ({path}: {m}, {g})")
            if cov is not None and scatter is not None:
                c, sc = cov, scatter
                for dim, label in (("model", m), ("gpu", g)):
                    c = c.sel({dim: label}) if dim in c.dims else c
                    sc = sc.sel({dim: label}) if dim in sc.dims else sc
                theta = np.array([table[(m, g)][p] for p in SLIM_PARAMS])
                safe = np.where(theta > 0, theta, 1.0)
                c = np.asarray(c.transpose("param", "param_").values, float) / np.outer(safe, safe)
                uncertainty[(m, g)] = (np.where(np.isfinite(c), c, 0.0), float(sc))
    return (table, uncertainty), f"calibrated store {path}"


def _coefficients(value: Any, gpus: list[str]) -> tuple[dict[str, dict[str, float]], str]:
    shipped = default_coefficients()
    base = check_coefficients(shipped["default"], "configs/slim/default.yaml: default")
    per_gpu = {
        g: check_coefficients(v, f"configs/slim/default.yaml: gpus.{g}", base)
        for g, v in (shipped.get("gpus") or {}).items()
    }
    if value is None:
        return {g: per_gpu.get(g, base) for g in gpus}, "configs/slim/default.yaml"
    if value == "shared":  # one set for every GPU, so GPUs differ only through their specs
        return {g: base for g in gpus}, "configs/slim/default.yaml (shared default)"
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


# serving key -> (default, check, spec field, converter to base units)
SERVING_DEFAULTS = {
    "n_gpu": 1, "gpu_memory_utilization": 0.9, "reserved_gib": 0.0, "kv_replication": 1.0, "kv_overhead": 1.0,
    "block_size": 16, "chunk_size": 0, "launch_overhead_s": 0.0, "compute_efficiency": 1.0,
    "bandwidth_efficiency": 1.0, "kv_dtype_bytes": None, "weight_dtype_bytes": None,
}
MEASURED_KEYS = ("batch", "request_rate", "ttft_s", "itl_s")


def _check_serving_value(key: str, value: Any, field: str) -> float:
    if key in ("kv_dtype_bytes", "weight_dtype_bytes"):
        return catalog._dtype_bytes(value, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise SlimjaxError(field, f"must be a number, got {value!r}")
    rules = {
        "n_gpu": (lambda v: v >= 1 and float(v) == int(v), "a positive integer"),
        "gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
        "reserved_gib": (lambda v: v >= 0, "non-negative"),
        "kv_replication": (lambda v: v >= 1, "at least 1"),
        "kv_overhead": (lambda v: v >= 1, "at least 1"),
        "block_size": (lambda v: v >= 1 and float(v) == int(v), "a positive integer"),
        "chunk_size": (lambda v: v >= 0 and float(v) == int(v), "a non-negative integer (0 = whole prompt)"),
        "launch_overhead_s": (lambda v: v >= 0, "non-negative"),
        "compute_efficiency": (lambda v: 0 < v <= 1, "in (0, 1]"),
        "bandwidth_efficiency": (lambda v: 0 < v <= 1, "in (0, 1]"),
    }
    ok, what = rules[key]
    if not ok(value):
        raise SlimjaxError(field, f"must be {what}, got {value!r}")
    return float(value)


def _keyed(value: Any, field: str, fields: tuple[str, ...], models: list[str], gpus: list[str]) -> tuple[dict, dict, dict]:
    """Split a block into its top-level fields and per-model / per-GPU override mappings."""
    if not isinstance(value, Mapping):
        raise SlimjaxError(field, f"must be a mapping, got {value!r}")
    top, by_model, by_gpu = {}, {}, {}
    for key, v in value.items():
        if key in fields:
            top[key] = v
        elif key in models or key in gpus:
            if not isinstance(v, Mapping):
                raise SlimjaxError(f"{field}.{key}", f"must be a mapping of {field} settings, got {v!r}")
            bad = [k for k in v if k not in fields]
            if bad:
                raise SlimjaxError(f"{field}.{key}.{bad[0]}", f"unknown key{suggest(str(bad[0]), fields)}")
            (by_model if key in models else by_gpu)[key] = dict(v)
        else:
            raise SlimjaxError(f"{field}.{key}", f"not a {field} setting nor a swept model or GPU{suggest(str(key), list(fields) + models + gpus)}")
    return top, by_model, by_gpu


def _serving(value: Any, models: list[tuple[str, dict]], gpus: list[str]) -> tuple[ServingSpec, dict]:
    """Per (model, GPU) settings: defaults < top level < GPU entry < model entry."""
    names = [m for m, _ in models]
    top, by_model, by_gpu = _keyed(value or {}, "serving", tuple(SERVING_DEFAULTS), names, gpus)
    rows, table = [], {}
    for m, arch in models:
        table[m] = {}
        for g in gpus:
            merged, where = {}, {}
            for source, block in (("serving", top), (f"serving.{g}", by_gpu.get(g, {})), (f"serving.{m}", by_model.get(m, {}))):
                for k, v in block.items():
                    merged[k], where[k] = v, f"{source}.{k}"
            checked = {}
            for k, default in SERVING_DEFAULTS.items():
                if k in merged:
                    checked[k] = _check_serving_value(k, merged[k], where[k])
                else:
                    checked[k] = default
            checked["kv_dtype_bytes"] = checked["kv_dtype_bytes"] or arch["kv_dtype_bytes"]
            checked["weight_dtype_bytes"] = checked["weight_dtype_bytes"] or arch["weight_bytes"]
            table[m][g] = checked
            rows.append(dict(
                n_gpu=checked["n_gpu"], memory_utilization=checked["gpu_memory_utilization"],
                reserved_bytes=checked["reserved_gib"] * 2.0**30, kv_replication=checked["kv_replication"],
                kv_overhead=checked["kv_overhead"], block_size=checked["block_size"], chunk_size=checked["chunk_size"],
                launch_overhead_s=checked["launch_overhead_s"], compute_efficiency=checked["compute_efficiency"],
                bandwidth_efficiency=checked["bandwidth_efficiency"], kv_dtype_bytes=checked["kv_dtype_bytes"],
                weight_bytes=checked["weight_dtype_bytes"],
            ))
    spec = stack(ServingSpec, rows)
    shaped = ServingSpec(**{k: v.reshape(len(models), len(gpus)) for k, v in dataclasses.asdict(spec).items()})
    return shaped, table


def _check_measured(block: Mapping, field: str) -> dict[str, float]:
    missing = [k for k in MEASURED_KEYS if k not in block]
    if missing:
        raise SlimjaxError(f"{field}.{missing[0]}", f"missing: a measured block needs all of {', '.join(MEASURED_KEYS)}")
    out = {}
    for k in MEASURED_KEYS:
        v = block[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
            raise SlimjaxError(f"{field}.{k}", f"must be a positive number, got {v!r}")
        if k == "batch" and float(v) != int(v):
            raise SlimjaxError(f"{field}.{k}", f"must be an integer, got {v!r}")
        out[k] = float(v)
    return out


def _measured(value: Any, models: list[str], gpus: list[str]) -> tuple[MeasuredSpec, dict]:
    """One measured operating point per (model, GPU): the top-level block, or keyed by model or GPU."""
    top, by_model, by_gpu = _keyed(value, "measured", MEASURED_KEYS, models, gpus)
    table: dict = {}
    arr = {k: np.full((len(models), len(gpus)), np.nan) for k in MEASURED_KEYS}
    for i, m in enumerate(models):
        for j, g in enumerate(gpus):
            if m in by_model:
                point, field = by_model[m], f"measured.{m}"
            elif g in by_gpu:
                point, field = by_gpu[g], f"measured.{g}"
            elif top:
                point, field = top, "measured"
            else:
                continue
            checked = _check_measured(point, field)
            table.setdefault(m, {})[g] = checked
            for k in MEASURED_KEYS:
                arr[k][i, j] = checked[k]
    return MeasuredSpec(batch=arr["batch"], request_rate=arr["request_rate"], ttft_s=arr["ttft_s"], itl_s=arr["itl_s"]), table


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
    model_names = [m for m, _ in models]
    slim_value = data.get("slim")
    log_cov = scatter = None  # coefficient uncertainty, from a calibrated store only
    if (isinstance(slim_value, str) and slim_value != "shared") or (isinstance(slim_value, Mapping) and "coefficients" in slim_value):
        (pairs, uncertainty), coeffs_source = _stored_coefficients(slim_value, model_names, gpu_names)
        table = {g: {m: pairs[(m, g)] for m in model_names} for g in gpu_names}
        if uncertainty:
            log_cov = np.stack([np.stack([uncertainty[(m, g)][0] for g in gpu_names]) for m in model_names])
            scatter = np.array([[uncertainty[(m, g)][1] for g in gpu_names] for m in model_names])
        coeffs = SlimCoeffs(**{p: np.asarray([[pairs[(m, g)][p] for g in gpu_names] for m in model_names]) for p in SLIM_PARAMS})
    else:
        table, coeffs_source = _coefficients(slim_value, gpu_names)
        coeffs = SlimCoeffs(**{
            p: np.broadcast_to(np.asarray([table[g][p] for g in gpu_names]), (len(models), len(gpus))).copy()
            for p in SLIM_PARAMS
        })
    capacity = any(k in data for k in ("serving", "arrival_rate", "measured"))
    serving, serving_table = _serving(data.get("serving"), models, gpu_names) if capacity else (None, None)
    measured = _measured(data["measured"], [m for m, _ in models], gpu_names)[0] if data.get("measured") is not None else None
    return Sweep(
        coeffs_log_cov=log_cov,
        coeffs_scatter=scatter,
        serving=serving,
        serving_table=serving_table,
        measured=measured,
        arrival_rate=_parse_axis(data["arrival_rate"], "arrival_rate", integer=False) if data.get("arrival_rate") is not None else None,
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
