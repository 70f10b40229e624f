"""Sweep files: YAML (or a dict) in, a validated :class:`Sweep` out. Each block is checked by its own
module (axes, serving, measured, coefficients, advisor); this one composes them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import jax
import numpy as np

from ..config import float64_scope
from ..errors import SlimjaxError
from ..model.calculator import largest_node_tp
from ..model.specs import GPUSpec, MeasuredSpec, ModelSpec, ServingSpec, stack
from . import catalog
from .advisor import Advisor, advisor_block
from .agents import Agents, agents_block
from .axes import parse_axis
from .coefficients import StoreReader, SweepCoefficients, coefficients_block
from .files import read_spec_file
from .measured import measured_block
from .serving import fitting_pp, fitting_tp, resolve_study_model, serving_block, with_calibrated_links

AXES = ("batch", "input_len", "output_len")
PRECISIONS = ("float32", "float64")


@dataclasses.dataclass(frozen=True, eq=False)
class Sweep:
    """A validated sweep: labels beside stacked spec pytrees, coefficients per (model, GPU)."""

    kind: ClassVar[str] = "sweep"  # the engine's kind of evaluation (engine.schema.SCHEMAS)

    models: list[str]
    gpus: list[str]
    model: ModelSpec  # leaves (M,)
    gpu: GPUSpec  # leaves (G,)
    slim: SweepCoefficients  # SLIM coefficients per (model, GPU), their variant, source and uncertainty
    batch: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    advisor: Advisor | None
    precision: str
    serving: ServingSpec  # leaves (M, G); the serving defaults where the sweep has no serving block
    serving_table: dict  # model -> GPU -> settings as given units, for attrs
    tp_to_fit: np.ndarray  # (M, G) smallest TP degree in {1, 2, 4, 8} that fits the longest I + O; 0: none
    roofline: (
        bool  # the roofline timing of the calculator (§4) is on (serving, measured, arrival_rate or agents given);
    )
    # memory (§3) and the fit check are always on
    measured: MeasuredSpec | None  # leaves (M, G), NaN where a pair has no measurement
    arrival_rate: np.ndarray | None  # requests/s; None: no queue variables
    agents: Agents | None  # fork-join graphs (MODEL.md §6); None: no agent variables
    source: str  # the sweep file path, or "<dict>"
    spec: dict  # the spec as given (for provenance)

    @property
    def coords(self) -> dict[str, np.ndarray]:
        """The grid's dims and their labels, in order: model, gpu, batch, input_len, output_len, then
        agent and arrival_rate when the sweep has them."""
        out = {
            "model": np.asarray(self.models, dtype=str),
            "gpu": np.asarray(self.gpus, dtype=str),
            "batch": self.batch,
            "input_len": self.input_len,
            "output_len": self.output_len,
        }
        if self.agents is not None:
            out["agent"] = np.asarray(self.agents.names, dtype=str)
        if self.arrival_rate is not None:
            out["arrival_rate"] = self.arrival_rate
        return out

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.coords.values())

    @property
    def dtype(self):
        return np.dtype(self.precision)


def _labels(items: list[tuple[str, dict]], field: str) -> None:
    seen = set()
    for i, (label, _) in enumerate(items):
        if label in seen:
            raise SlimjaxError(f"{field}[{i}]", f"{label!r} appears twice")
        seen.add(label)


def _check_stored(coefficients, serving, models, gpus, axes, value) -> dict:
    """What a sweep from a calibrated store must say or refuse: coefficients fitted at another n_gpu than
    the sweep runs (an error), and groups that did not converge, left coefficients unidentified or were
    fitted on a narrower range than the sweep asks for (a warning, recorded in attrs)."""
    import warnings

    stored = coefficients.stored
    if stored is None:
        return {}
    field = "slim.select.n_gpu" if isinstance(value, Mapping) and "n_gpu" in (value.get("select") or {}) else "slim"
    notes = {}
    for i, m in enumerate(models):
        for j, g in enumerate(gpus):
            runs = float(serving.n_gpu[i, j])
            lo, hi = stored.ranges.get((m, g), {}).get("n_gpu", (np.nan, np.nan))
            if lo < hi and (stored.n_gpu is None or not np.isfinite(stored.n_gpu)):
                raise SlimjaxError(
                    field,
                    f"the coefficients for {m} on {g} were fitted on rows pooled over n_gpu "
                    f"{lo:g}–{hi:g}, but the sweep runs n_gpu = {runs:g}: calibrate with --group-by "
                    f"including n_gpu and select the degree the sweep runs",
                )
            fitted_at = stored.n_gpu if stored.n_gpu is not None else (lo if lo == hi else None)
            if fitted_at is not None and runs != fitted_at and not np.isnan(runs):
                raise SlimjaxError(
                    field,
                    f"the coefficients were fitted at n_gpu = {fitted_at:g}, but the sweep runs {m} on "
                    f"{g} with n_gpu = {runs:g}; set serving n_gpu to {fitted_at:g} or select the "
                    f"n_gpu the sweep runs",
                )
            problems = [stored.notes[(m, g)]] if (m, g) in stored.notes else []
            for a, (lo, hi) in stored.ranges.get((m, g), {}).items():
                if a in axes and (axes[a][0] < lo or axes[a][-1] > hi):
                    problems.append(f"extrapolates {a} {axes[a][0]:g}–{axes[a][-1]:g} beyond the fitted {lo:g}–{hi:g}")
            if problems:
                notes[f"{m}/{g}"] = "; ".join(problems)
    for pair, text in notes.items():
        warnings.warn(f"slim: the calibrated fit for {pair} {text}", RuntimeWarning, stacklevel=4)
    return notes


def _smallest_tp(model, gpu, serving, serving_table, tokens: float, batch: float) -> np.ndarray:
    auto_r = np.array(
        [[("kv_replication" in serving_table[m][g].get("auto", ())) for g in serving_table[m]] for m in serving_table]
    )
    with float64_scope():
        return np.asarray(
            fitting_tp(
                jax.tree_util.tree_map(lambda x: x[:, None], model),
                jax.tree_util.tree_map(lambda x: x[None, :], gpu),
                serving,
                tokens,
                auto_r,
                batch,
            )
        )


def smallest_stages_for_batch(sweep: "Sweep", tokens: float, batch: float) -> tuple[np.ndarray, np.ndarray]:
    """(M, G) each: the largest TP degree inside a node (dividing H_q) and the fewest pipeline stages of 1, 2, 4, 8
    with which such a group holds ``batch`` sequences of ``tokens`` (§10), the other serving settings as the sweep
    has them; pp 0 where none does. What a model too large for every tensor-parallel group needs."""
    model = jax.tree_util.tree_map(lambda x: x[:, None], sweep.model)
    gpu = jax.tree_util.tree_map(lambda x: x[None, :], sweep.gpu)
    with float64_scope():
        tp = largest_node_tp(model, gpu)
        serving = ServingSpec(**{**sweep.serving.fields(), "n_gpu": np.zeros(np.shape(sweep.serving.n_gpu)) + tp})
        pp = np.asarray(fitting_pp(model, gpu, serving, tokens, batch))
    return np.broadcast_to(np.asarray(tp), pp.shape), pp


def smallest_tp_for_batch(sweep: "Sweep", tokens: float, batch: float) -> np.ndarray:
    """(M, G): the smallest TP degree in {1, 2, 4, 8} dividing H_q whose group holds ``batch`` sequences of
    ``tokens`` at once, the other serving settings as the sweep has them; 0 where none does."""
    return _smallest_tp(sweep.model, sweep.gpu, sweep.serving, sweep.serving_table, tokens, batch)


def parse(spec: str | Path | Mapping, *, read_store: StoreReader | None = None) -> Sweep:
    """Validate a sweep file (path) or mapping into a :class:`Sweep`; raises SlimjaxError naming the field.

    ``read_store`` reads a calibrated coefficient store when ``slim`` names one (the store floor's
    reader; :func:`slimjax.api.parse` passes it)."""
    data, source, base_dir = read_spec_file(spec, "sweep")
    models = [resolve_study_model(m, f"models[{i}]", base_dir) for i, m in enumerate(data["models"])]
    gpus = [catalog.resolve_gpu(g, f"gpus[{i}]") for i, g in enumerate(data["gpus"])]
    _labels(models, "models")
    _labels(gpus, "gpus")
    axes = {a: parse_axis(data[a], a) for a in AXES}
    precision = data.get("precision", "float32")
    if precision not in PRECISIONS:
        raise SlimjaxError("precision", f"must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    gpu_names = [g for g, _ in gpus]
    model_names = [m for m, _ in models]
    coefficients = coefficients_block(data.get("slim"), model_names, gpu_names, read_store, data.get("slim_variant"))
    roofline = any(k in data for k in ("serving", "arrival_rate", "measured", "agents"))
    max_tokens = float(axes["input_len"][-1] + axes["output_len"][-1])
    # memory is always checked: without a serving block, at the serving defaults (MODEL.md §0)
    serving, serving_table = serving_block(data.get("serving"), models, gpus, max_tokens)
    gpus = with_calibrated_links(gpus, data["gpus"], serving_table)
    measured = measured_block(data["measured"], model_names, gpu_names)[0] if data.get("measured") is not None else None
    coefficient_notes = _check_stored(
        coefficients, serving, model_names, gpu_names, {a: axes[a] for a in AXES}, data.get("slim")
    )
    model = stack(ModelSpec, [row for _, row in models])
    gpu = stack(GPUSpec, [row for _, row in gpus])
    tp_to_fit = _smallest_tp(model, gpu, serving, serving_table, max_tokens, 1.0)
    return Sweep(
        roofline=roofline,
        slim=dataclasses.replace(coefficients, notes=coefficient_notes),
        tp_to_fit=tp_to_fit,
        serving=serving,
        serving_table=serving_table,
        measured=measured,
        agents=agents_block(data["agents"]) if data.get("agents") is not None else None,
        arrival_rate=parse_axis(data["arrival_rate"], "arrival_rate", integer=False)
        if data.get("arrival_rate") is not None
        else None,
        models=model_names,
        gpus=gpu_names,
        model=model,
        gpu=gpu,
        advisor=advisor_block(data.get("advisor"), axes["batch"]),
        precision=precision,
        source=source,
        spec=data,
        **axes,
    )
