"""What every study file shares (procurement, simulation): reading the file with its keys checked, its models and
GPUs resolved through the catalogs, and serving per (model, GPU) swept over the study's TP degrees and pipeline
stages."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SlimjaxError
from ..model.calculator import replicated_kv
from ..model.specs import ServingSpec
from . import catalog
from .engines import LAYOUT_KEYS, SPECULATIVE_SETTING_KEYS
from .layouts import study_layouts
from .serving import (
    check_group_shape,
    check_serving_value,
    constants_source,
    layout_text,
    resolve_study_model,
    serving_block,
    speculative_block,
)

# a study's serving defaults where a sweep's differ: calibrated constants, KV replicated where TP exceeds H_kv
DEFAULT_SERVING = {"efficiency": "calibrated", "kv_replication": "auto"}


def models_and_gpus(data: Mapping, base_dir: Path | None) -> tuple[list, list]:
    """The file's models and GPUs resolved through the catalogs as (label, row) pairs; a label twice is an error."""
    models = [resolve_study_model(m, f"models[{i}]", base_dir) for i, m in enumerate(data["models"])]
    gpus = [catalog.resolve_gpu(g, f"gpus[{i}]") for i, g in enumerate(data["gpus"])]
    for field, items in (("models", models), ("gpus", gpus)):
        labels = [label for label, _ in items]
        for i, label in enumerate(labels):
            if labels.index(label) != i:
                raise SlimjaxError(f"{field}[{i}]", f"{label!r} appears twice")
    return models, gpus


def serving_per_tp(
    value: Any, models, gpus, tp: np.ndarray, max_tokens: float, calibrated: bool = True, layouts: dict | None = None
) -> tuple[ServingSpec, dict]:
    """Serving per (model, GPU) as sweeps read it (n_gpu is the study's tp axis), then per TP degree n:
    n_gpu = n and, where kv_replication is auto, r = max(1, n / H_kv) (§4c). ``layouts``: a study's candidate layouts
    (:func:`slimjax.inputs.serving.serving_block`); a degree whose layout is not one does not run."""
    block = dict(value or {})
    for key, axis in (("n_gpu", "tp"), ("pp", "pp")):
        if key in block or any(isinstance(v, Mapping) and key in v for v in block.values()):
            raise SlimjaxError(
                f"serving.{key}", f"a study sweeps the group size: list the degrees under {axis} instead"
            )
    if calibrated and not any(k in block for k in ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s")):
        block.setdefault("efficiency", DEFAULT_SERVING["efficiency"])
    block.setdefault("kv_replication", DEFAULT_SERVING["kv_replication"])
    for g, row in gpus:
        check_group_shape(g, row, tp, [], "tp", "pp")
    base, table = serving_block({**block, "n_gpu": 1}, models, gpus, max_tokens, tp_degrees=tp, layouts=layouts)
    fields = base.fields()
    n = tp[None, None, :]
    kv_auto = np.array([[["kv_replication" in table[m][g].get("auto", ())] for g, _ in gpus] for m, _ in models])
    n_kv = np.array([arch["n_kv_heads"] for _, arch in models])[:, None, None]
    mla = np.array([arch.get("mla", 0.0) for _, arch in models])[:, None, None]
    out = {
        k: np.broadcast_to(np.asarray(v)[..., None], (*np.shape(v), len(tp))).astype(float) for k, v in fields.items()
    }
    out["n_gpu"] = np.broadcast_to(n, out["n_gpu"].shape).astype(float)
    for i, (m, _) in enumerate(models):  # a TP degree the layout cannot take does not run (NaN, as no fit)
        for j, (g, _) in enumerate(gpus):
            bad = table[m][g].get("layout_invalid", {})
            out["n_gpu"][i, j] = np.where([str(int(x)) in bad for x in tp], np.nan, out["n_gpu"][i, j])
    out["kv_replication"] = np.where(kv_auto, np.asarray(replicated_kv(n, n_kv, mla)), out["kv_replication"])
    for m in table:
        for g in table[m]:
            table[m][g].pop("n_gpu", None)
            table[m][g]["tp"] = [int(x) for x in tp]
            preset = str(table[m][g]["efficiency"]).split(" ", 1)[0]  # where each (GPU, TP)'s constants come from
            table[m][g]["constants"] = {str(int(x)): constants_source(g, preset, x)[0] for x in tp}
    return ServingSpec(**out), table


def serving_per_group(
    value: Any,
    models,
    gpus,
    tp: np.ndarray,
    pp: np.ndarray,
    max_tokens: float,
    calibrated: bool = True,
    layouts: dict | None = None,
) -> tuple[ServingSpec, dict]:
    """:func:`serving_per_tp` with a pipeline axis: leaves (M, G, N, P), ``pipeline_stages`` = pp (MODEL.md §10).
    Stages pass activations over the network: a GPU without ``network_gbs`` cannot take pp > 1 (named)."""
    for g, row in gpus:
        check_group_shape(g, row, [], pp, "tp", "pp")
    base, table = serving_per_tp(value, models, gpus, tp, max_tokens, calibrated, layouts)
    if np.any(np.asarray(pp) > 1) and np.any(np.asarray(base.speculative_tokens) > 0):
        raise SlimjaxError(
            "pp",
            f"speculative decoding over {int(np.max(pp))} pipeline stages is not modelled (docs/speculative.md): pp 1 "
            "where the serving block speculates",
        )
    out = {k: np.repeat(np.asarray(v)[..., None], len(pp), axis=-1) for k, v in base.fields().items()}
    out["pipeline_stages"] = np.broadcast_to(np.asarray(pp, float), out["pipeline_stages"].shape).copy()
    for m in table:
        for g in table[m]:
            table[m][g]["pp"] = [int(x) for x in pp]
    return ServingSpec(**out), table


def serving_per_setting(
    value: Any,
    models,
    gpus,
    tp: np.ndarray,
    pp: np.ndarray,
    max_tokens: float,
    settings: tuple = (),
    calibrated: bool = True,
    layouts: dict | None = None,
) -> tuple[ServingSpec, dict]:
    """:func:`serving_per_group` once per engine setting (``settings``: (label, keys) pairs of
    :func:`slimjax.inputs.engines.engine_settings`), stacked on a last axis: leaves (M, G, N, P, S). A setting's keys
    replace the serving block's top-level ones; a key the block sets under a model or GPU name as well is an error
    (one place decides it). Without settings: :func:`serving_per_group`'s (M, G, N, P). The table is the serving
    block's own, with ``settings`` (the labels) per (model, GPU)."""
    if not settings:
        return serving_per_group(value, models, gpus, tp, pp, max_tokens, calibrated)
    block = dict(value or {})
    specs = []
    for merged in setting_blocks(block, settings, [label for label, _ in (*models, *gpus)]):
        spec, _ = serving_per_group(merged, models, gpus, tp, pp, max_tokens, calibrated, layouts)
        specs.append(spec.fields())
    _, table = serving_per_group(block, models, gpus, tp, pp, max_tokens, calibrated)
    for m in table:
        for g in table[m]:
            table[m][g]["settings"] = [label for label, _ in settings]
            if layouts is not None:
                table[m][g]["layouts"] = [layout_text(*shape) for shape in sorted(layouts[m, g])]
    stacked = {k: np.stack([np.asarray(s[k], float) for s in specs], axis=-1) for k in specs[0]}
    return ServingSpec(**stacked), table


def setting_blocks(value: Any, settings: tuple, names, field: str | None = None) -> list[dict]:
    """The serving block once per engine setting, the setting's keys over its top level; a key the block also sets
    under one of ``names`` (the study's models and GPUs) is refused, and values are checked, naming
    ``settings[i].key`` (``field.key`` where ``field`` is given: one block's own keys, such as a pool's layout)."""
    block = dict(value or {})
    out = []
    for i, (_, keys) in enumerate(settings):
        for key, v in keys.items():
            where = f"{field}.{key}" if field else f"settings[{i}].{key}"
            for name in names:
                if isinstance(block.get(name), Mapping) and key in block[name]:
                    raise SlimjaxError(where, f"serving.{name}.{key} sets it too: give it in one place")
            if key in SPECULATIVE_SETTING_KEYS:
                speculative_block(v, where)
            else:
                check_serving_value(key, v, where)
        out.append({**block, **keys})
    return out


def with_layouts(data: Mapping, settings: tuple, base_dir: Path | None) -> tuple[list | None, tuple, dict | None]:
    """A study file's ``layouts`` (GPU counts, docs/layouts.md): its tp axis and, crossed with its ``settings``
    (engine settings), its settings axis, with per (model, GPU) the layouts that are candidates
    (:func:`slimjax.inputs.layouts.study_layouts`); (None, ``settings``, None) where it gives none."""
    if data.get("layouts") is None:
        return None, settings, None
    if "tp" in data:
        raise SlimjaxError("layouts", "sets the tp axis itself: give tp or layouts, not both")
    for i, (_, keys) in enumerate(settings):
        taken = [k for k in keys if k in LAYOUT_KEYS]
        if taken:
            raise SlimjaxError(f"settings[{i}].{taken[0]}", "layouts sets the layout keys: give them in one place")
    models, gpus = models_and_gpus(data, base_dir)
    expanded = study_layouts(data["layouts"], models, gpus)
    crossed = tuple(
        (f"{label}, {lay}" if label else lay, {**keys, **lay_keys})
        for label, keys in (settings or (("", {}),))
        for lay, lay_keys in expanded.settings
    )
    return list(expanded.tp), crossed, expanded.valid
