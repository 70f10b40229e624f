"""Procurement files (MODEL.md §8): YAML (or a dict) in, a validated :class:`Study` out.

A study names workloads (fixed lengths or a request trace cut into length classes), total rates
(absolute and/or multiples of each trace's own rate), models, GPUs, tensor-parallel degrees, batch
(concurrency) limits, SLOs, serving settings (as in sweeps, default ``efficiency: calibrated`` and
``kv_replication: auto``), measured operating points and price overrides. Unknown keys are errors.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...errors import SlimjaxError, suggest
from ...inputs import catalog
from ...inputs.axes import parse_axis
from ...inputs.checks import checked_number, positive_number
from ...inputs.engines import engine_settings
from ...inputs.files import read_spec_file
from ...inputs.measured import MEASURED_KEYS, measured_block
from ...inputs.prefixes import PrefixBlocks, reuse_text, trace_prefix
from ...inputs.requests import (
    LengthClasses,
    RequestTrace,
    class_groups,
    length_classes,
    read_trace_entry,
)
from ...inputs.serving import (
    check_group_shape,
    fitting_pp,
    with_calibrated_links,
)
from ...inputs.studyfile import (
    models_and_gpus,
    serving_per_group,
    serving_per_tp,
    setting_blocks,
    with_layouts,
)
from ...model.calculator import TP_DEGREES
from ...model.specs import GPUSpec, MeasuredSpec, ModelSpec, ServingSpec, stack

SLO_KEYS = ("ttft_s", "quantile", "itl_s", "e2e_s")
DEFAULT_BATCH = tuple(sorted({2**k for k in range(10)} | {3 * 2**k for k in range(8)}))  # 1 … 512 and 3·2^k
DEFAULT_CLASSES = 4
DEFAULT_QUANTILE = 0.9
SIZING_METHODS = ("simulation", "screen")
# §8 sizing: by simulation of the workload's own stream up to max_replicas, or the screen's R = ⌈Λ/λ*⌉ alone;
# a workload without timestamps is simulated as a Poisson stream of `requests` requests (seeded)
DEFAULT_SIZING = {"method": "simulation", "max_replicas": 1024, "requests": 2000, "seed": 0}


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    name: str
    classes: LengthClasses
    trace_rate: float | None  # Λ_tr, requests/s (None: fixed lengths, or a trace without timestamps)
    source: str  # "fixed" or the trace file and its format
    requests: int  # requests in the trace (0 for fixed lengths)
    trace: RequestTrace | None = None  # the requests themselves (None for fixed lengths)
    class_of: np.ndarray | None = None  # each trace request's length class
    prefix: PrefixBlocks | None = None  # its prompts' block chains, where its trace gives hashes (docs/simulation.md)


@dataclasses.dataclass(frozen=True, eq=False)
class Study:
    """A validated procurement study: labels beside stacked specs (serving and measured per (model, GPU, TP))."""

    kind: ClassVar[str] = "procurement"  # the engine's kind of evaluation (engine.schema.SCHEMAS)
    precision: ClassVar[str] = "float64"  # λ* by bisection and the queue: exact arithmetic

    workloads: list[Workload]
    rate_labels: list[str]
    total_rate: np.ndarray  # (workload, rate) requests/s; NaN where a scale has no trace rate to multiply
    models: list[str]
    gpus: list[str]
    model: ModelSpec  # leaves (M,)
    gpu: GPUSpec  # leaves (G,), prices overridden
    tp: np.ndarray
    batch: np.ndarray
    slo: dict[str, float]  # ttft_s, itl_s, e2e_s (+inf where not set) and quantile
    serving: ServingSpec  # leaves (M, G, N)
    serving_table: dict
    measured: MeasuredSpec  # leaves (M, G, N), NaN where none
    price_source: dict[str, str]  # GPU -> where its price came from
    source: str
    spec: dict
    sizing: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_SIZING))
    deployments: tuple = ()  # disaggregated prefill/decode pairs (MODEL.md §10), sized by simulation
    # engine settings as candidates (docs/engines.md): one study per setting, its keys over the serving block, each
    # labelled; () without ``settings``
    variants: tuple = ()

    @property
    def n_classes(self) -> int:
        return max(len(w.classes.count) for w in self.workloads)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.precision)

    @property
    def coords(self) -> dict[str, np.ndarray]:
        """The study's grid: workload, rate, model, gpu, tp, batch, class (MODEL.md §8)."""
        return {
            "workload": np.asarray([w.name for w in self.workloads], dtype=str),
            "rate": np.asarray(self.rate_labels, dtype=str),
            "model": np.asarray(self.models, dtype=str),
            "gpu": np.asarray(self.gpus, dtype=str),
            "tp": np.asarray(self.tp).astype(np.int64),
            "batch": np.asarray(self.batch).astype(np.int64),
            "class": np.arange(self.n_classes),
        }

    def class_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(I_k, O_k, w_k) per (workload, class); a workload with fewer classes is padded with weight 0."""
        K, W = self.n_classes, len(self.workloads)
        class_in, class_out, weight = np.ones((W, K)), np.ones((W, K)), np.zeros((W, K))
        for i, wl in enumerate(self.workloads):
            k = len(wl.classes.count)
            class_in[i, :k], class_out[i, :k] = wl.classes.input_len, wl.classes.output_len
            weight[i, :k] = wl.classes.weight
        return class_in, class_out, weight


def _workload(entry: Any, i: int, base_dir: Path | None) -> Workload:
    field = f"workloads[{i}]"
    if not isinstance(entry, Mapping):
        raise SlimjaxError(field, f"must be a mapping with name and input_len/output_len or trace, got {entry!r}")
    allowed = ("name", "input_len", "output_len", "trace", "format", "classes", "duration_s", "hash_block_tokens")
    bad = [k for k in entry if k not in allowed]
    if bad:
        raise SlimjaxError(f"{field}.{bad[0]}", f"unknown key{suggest(str(bad[0]), allowed)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise SlimjaxError(f"{field}.name", f"must be a non-empty string, got {name!r}")
    if "trace" in entry:
        for k in ("input_len", "output_len"):
            if k in entry:
                raise SlimjaxError(f"{field}.{k}", "give either a trace or fixed input_len/output_len, not both")
        trace = read_trace_entry(entry, field, base_dir)  # duration_s: the trace's own first seconds
        label = f"{trace.source} ({trace.format})"
        if entry.get("duration_s") is not None:  # (a slice a study can afford to simulate)
            if trace.n_requests < 2:
                raise SlimjaxError(f"{field}.duration_s", f"{entry['duration_s']!r} s holds fewer than two requests")
            trace = dataclasses.replace(trace, source=f"{trace.source}, first {entry['duration_s']:g} s")
        prefix = trace_prefix(trace, entry.get("hash_block_tokens"), field)
        if prefix is not None:  # what its prompts share: the most a prefix cache could save it
            label = f"{label}; {reuse_text(prefix, trace.input_len)}"
        k = entry.get("classes", DEFAULT_CLASSES)
        classes = length_classes(trace.input_len, trace.output_len, k, f"{field}.classes")
        class_of = np.zeros(trace.n_requests, np.int64)
        for c, members in enumerate(class_groups(trace.input_len, trace.output_len, k)):
            class_of[members] = c
        return Workload(name, classes, trace.rate, label, trace.n_requests, trace, class_of, prefix)
    for k in ("input_len", "output_len"):
        if k not in entry:
            raise SlimjaxError(
                f"{field}.{k}", "missing: a workload is {name, input_len, output_len} or {name, trace, format, classes}"
            )
    for k in ("classes", "format", "duration_s"):
        if k in entry:
            raise SlimjaxError(f"{field}.{k}", "only a trace workload has classes, a format or duration_s")
    i_len = positive_number(entry["input_len"], f"{field}.input_len", integer=True)
    o_len = positive_number(entry["output_len"], f"{field}.output_len", integer=True)
    one = np.ones(1)
    return Workload(name, LengthClasses(one, one, one * i_len, one * o_len), None, "fixed", 0)


def _rates(data: Mapping, workloads: list[Workload]) -> tuple[list[str], np.ndarray]:
    absolute, scales = (
        parse_axis(data[k], k, integer=False, positive=True) if data.get(k) is not None else np.zeros(0)
        for k in ("rates", "rate_scale")
    )
    if absolute.size + scales.size == 0:
        raise SlimjaxError(
            "rates", "give absolute rates (requests/s) and/or rate_scale (multiples of each trace's rate)"
        )
    if scales.size and all(w.trace_rate is None for w in workloads):
        raise SlimjaxError("rate_scale", "no workload has a trace with timestamps to scale; give absolute rates")
    labels = [f"{s:g}x" for s in scales] + [f"{r:g}/s" for r in absolute]
    total = np.array(
        [[s * w.trace_rate if w.trace_rate is not None else np.nan for s in scales] + list(absolute) for w in workloads]
    )
    return labels, total


def _slo(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise SlimjaxError("slo", f"must be a mapping of {', '.join(SLO_KEYS)}, got {value!r}")
    bad = [k for k in value if k not in SLO_KEYS]
    if bad:
        raise SlimjaxError(f"slo.{bad[0]}", f"unknown key{suggest(str(bad[0]), SLO_KEYS)}")
    if not any(k in value for k in ("ttft_s", "itl_s", "e2e_s")):
        raise SlimjaxError("slo", "give at least one of ttft_s, itl_s, e2e_s (seconds)")
    out = {k: positive_number(value[k], f"slo.{k}") if k in value else np.inf for k in ("ttft_s", "itl_s", "e2e_s")}
    out["quantile"] = checked_number(
        value.get("quantile", DEFAULT_QUANTILE), "slo.quantile", lambda v: 0 < v < 1, "in (0, 1)"
    )
    return out


def _sizing(value: Any) -> dict:
    if value is None:
        return dict(DEFAULT_SIZING)
    if isinstance(value, str):
        value = {"method": value}
    if not isinstance(value, Mapping):
        raise SlimjaxError("sizing", f"must be 'simulation', 'screen' or a mapping of {', '.join(DEFAULT_SIZING)}")
    bad = [k for k in value if k not in DEFAULT_SIZING]
    if bad:
        raise SlimjaxError(f"sizing.{bad[0]}", f"unknown key{suggest(str(bad[0]), tuple(DEFAULT_SIZING))}")
    out = {**DEFAULT_SIZING, **value}
    if out["method"] not in SIZING_METHODS:
        raise SlimjaxError("sizing.method", f"must be one of {', '.join(SIZING_METHODS)}, got {out['method']!r}")
    for k in ("max_replicas", "requests"):
        out[k] = int(positive_number(out[k], f"sizing.{k}", integer=True))
    out["seed"] = int(checked_number(out["seed"], "sizing.seed", lambda v: v >= 0 and v == int(v), "an integer ≥ 0"))
    return out


def _prices(value: Any, gpus: list[str], entries: list) -> tuple[dict[str, float], dict[str, str]]:
    given = {} if value is None else value
    if not isinstance(given, Mapping):
        raise SlimjaxError("prices", f"must be a mapping of GPU name to $/GPU-hour, got {value!r}")
    for k in given:
        if k not in gpus:
            raise SlimjaxError(f"prices.{k}", f"not a GPU of this study{suggest(str(k), gpus)}")
    prices, where = {}, {}
    for g, entry in zip(gpus, entries, strict=False):
        if g in given:
            prices[g] = checked_number(given[g], f"prices.{g}", lambda v: v >= 0, "a non-negative $/GPU-hour")
            where[g] = "procurement file"
            continue
        row = entry if isinstance(entry, Mapping) else catalog._lookup(entry, catalog.gpu_catalog(), "gpus", "GPU")[1]
        if row.get("price_per_hour") is None:
            raise SlimjaxError(
                f"prices.{g}",
                f"{g} has no price: add price_per_hour to its entry in configs/gpus.yaml "
                f"or give prices: {{{g}: <$/GPU-hour>}} in the procurement file",
            )
        where[g] = (
            f"configs/gpus.yaml, illustrative, dated {catalog.PRICE_DATE}" if isinstance(entry, str) else "inline GPU"
        )
    return prices, where


def _measured(value: Any, models: list[str], gpus: list[str], tp: np.ndarray) -> MeasuredSpec:
    """The sweep file's ``measured`` block (top level, by model, by GPU, or by model then GPU), each point at
    the TP degree ``tp`` it was measured at (default 1), which must be one of the study's."""
    arr = {k: np.full((len(models), len(gpus), len(tp)), np.nan) for k in MEASURED_KEYS}
    if value is None:
        return MeasuredSpec(**arr)
    _, table = measured_block(value, models, gpus, extra=("tp",))
    for m, row in table.items():
        for g, point in row.items():
            n = point.get("tp", 1.0)
            if n not in tp:
                raise SlimjaxError("measured.tp", f"{n:g} ({m} on {g}) is not among the study's tp degrees {list(tp)}")
            for k in MEASURED_KEYS:
                arr[k][models.index(m), gpus.index(g), int(np.flatnonzero(tp == n)[0])] = point[k]
    return MeasuredSpec(**arr)


def parse(spec: str | os.PathLike | Mapping) -> Study:
    """Validate a procurement file (path) or mapping into a :class:`Study`; errors name the field. With
    ``settings`` (a list of engine configurations, docs/engines.md) the study holds one variant per setting, each
    the study with that setting's keys over its serving block (``variants``: (label, Study) pairs)."""
    data, source, base_dir = read_spec_file(spec, "study")
    # layouts (docs/layouts.md): the tp axis and the layout settings of every layout of its GPU counts
    tp_axis, settings, layouts = with_layouts(data, engine_settings(data.get("settings")), base_dir)
    study, serving_fields = _study(data, source, base_dir, tp_axis, layouts)
    if not settings:
        return study
    blocks = setting_blocks(data.get("serving"), settings, [*study.models, *study.gpus])
    variants = tuple(  # workloads, rates, prices and SLOs read once; what the serving block decides per setting
        (label, dataclasses.replace(study, spec={**data, "serving": block}, **serving_fields(block)))
        for (label, _), block in zip(settings, blocks, strict=True)
    )
    return dataclasses.replace(study, variants=variants)


def _study(
    data: dict, source: str, base_dir: Path | None, tp_axis=None, layouts=None
) -> tuple[Study, functools.partial]:
    """The study of a read file's ``data`` (its ``settings`` aside), and the function giving the Study fields a
    serving block decides (serving, its table, the GPUs' link constants, the deployments) for another block."""
    workloads = [_workload(w, i, base_dir) for i, w in enumerate(data["workloads"])]
    names = [w.name for w in workloads]
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise SlimjaxError(f"workloads[{i}].name", f"{n!r} appears twice")
    rate_labels, total_rate = _rates(data, workloads)
    models, gpus = models_and_gpus(data, base_dir)
    gpu_names = [g for g, _ in gpus]
    prices, price_source = _prices(data.get("prices"), gpu_names, data["gpus"])
    gpu_rows = [{**row, **({"price_per_hour": prices[g]} if g in prices else {})} for g, row in gpus]
    tp = parse_axis(tp_axis or data.get("tp", list(TP_DEGREES)), "tp").astype(float)
    batch = parse_axis(data.get("batch", list(DEFAULT_BATCH)), "batch").astype(float)
    max_tokens = max(float(np.max(w.classes.input_len + w.classes.output_len)) for w in workloads)
    sizing = _sizing(data.get("sizing"))
    serving_fields = functools.partial(
        _serving_fields, data, models, gpus, gpu_rows, tp, max_tokens, prices, sizing, layouts=layouts
    )
    decided = serving_fields(data.get("serving"))
    study = Study(
        workloads=workloads,
        rate_labels=rate_labels,
        total_rate=total_rate,
        models=[m for m, _ in models],
        gpus=gpu_names,
        model=stack(ModelSpec, [row for _, row in models]),
        tp=tp,
        batch=batch,
        slo=_slo(data["slo"]),
        measured=_measured(data.get("measured"), [m for m, _ in models], gpu_names, tp),
        price_source=price_source,
        source=source,
        spec=data,
        sizing=sizing,
        **decided,
    )
    return study, serving_fields


def _serving_fields(data, models, gpus, gpu_rows, tp, max_tokens, prices, sizing, block, layouts=None) -> dict:
    """The Study fields the serving block ``block`` decides: serving per (model, GPU, TP) with its stages and table,
    the GPUs with their link constants, and the disaggregated deployments (priced as the study prices its GPUs)."""
    from ...inputs.disaggregated import parse_study_section

    serving, serving_table = serving_per_tp(block, models, gpus, tp, max_tokens, layouts=layouts)
    serving = with_stages(serving, serving_table, data.get("pp", 1), models, gpus, tp, max_tokens)
    labelled = [(g, row) for (g, _), row in zip(gpus, gpu_rows, strict=True)]
    linked = [row for _, row in with_calibrated_links(labelled, data["gpus"], serving_table)]
    deployments = parse_study_section(data.get("disaggregated"), models, block, max_tokens, serving_per_group)
    if deployments and sizing["method"] != "simulation":
        raise SlimjaxError("disaggregated", "sized by simulation only (MODEL.md §10): remove sizing: screen")
    if deployments:
        for dep in deployments:  # the study's prices apply to the pools' GPUs too
            for pool in (dep.prefill, dep.decode):
                if pool.gpu in prices:
                    pool.gpu_row["price_per_hour"] = prices[pool.gpu]
                elif not pool.gpu_row["price_per_hour"] > 0:
                    raise SlimjaxError(
                        "disaggregated",
                        f"{pool.gpu} has no price: add price_per_hour to its entry in configs/gpus.yaml (or list it "
                        "under gpus and prices)",
                    )
    return dict(
        serving=serving,
        serving_table=serving_table,
        gpu=stack(GPUSpec, linked),
        deployments=tuple(deployments),
    )


def with_stages(serving: ServingSpec, table: dict, value: Any, models, gpus, tp, max_tokens: float) -> ServingSpec:
    """Pipeline stages per (model, GPU, TP) (MODEL.md §10): ``auto`` the smallest n_pp in {1, 2, 4, 8}
    whose stages of that TP degree hold the weights and a sequence of the longest I + O (1 where none does: the
    candidate does not fit, as the screen says; 1 on a GPU without ``network_gbs``, which stages would cross), or
    one positive integer for every candidate (default 1: no stages, as before §10). A replica group is tp·pp GPUs."""
    from ...config import float64_scope

    fields = {k: np.asarray(v, float) for k, v in serving.fields().items()}
    if value == "auto":
        with float64_scope():
            model = stack(ModelSpec, [row for _, row in models])
            gpu = stack(GPUSpec, [row for _, row in gpus])
            m = ModelSpec(
                **{f.name: np.asarray(getattr(model, f.name))[:, None, None] for f in dataclasses.fields(ModelSpec)}
            )
            g = GPUSpec(**{k: np.asarray(v)[None, :, None] for k, v in gpu.fields().items()})
            stages = np.asarray(fitting_pp(m, g, ServingSpec(**fields), max_tokens))
        networked = np.array([row["network_bytes_per_s"] > 0 for _, row in gpus])[None, :, None]
        stages = np.where((stages > 0) & networked, stages, 1.0)
    else:
        stages = np.full(fields["n_gpu"].shape, positive_number(value, "pp", integer=True))
        for name, row in gpus:
            check_group_shape(name, row, [], stages.flat[:1], "tp", "pp")
    fields["pipeline_stages"] = stages.astype(float)
    for i, (m_name, _) in enumerate(models):
        for j, (g_name, _) in enumerate(gpus):
            table[m_name][g_name]["pp"] = [int(x) for x in stages[i, j]]
    return ServingSpec(**fields)
