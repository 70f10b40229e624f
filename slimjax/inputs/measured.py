"""Measured mode (MODEL.md §4): one measured operating point per (model, GPU), from the ``measured`` block of a
sweep or procurement file (top level, keyed by a model or GPU name, or by model then GPU for one pair)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import constants
from ..errors import SlimjaxError
from ..model.specs import MeasuredSpec
from .checks import positive_number, split_keyed_block

MEASURED_KEYS = constants.MEASURED_KEYS


def _check_measured(block: Mapping, field: str, extra: tuple[str, ...] = ()) -> dict[str, float]:
    missing = [k for k in MEASURED_KEYS if k not in block]
    if missing:
        raise SlimjaxError(
            f"{field}.{missing[0]}", f"missing: a measured block needs all of {', '.join(MEASURED_KEYS)}"
        )
    keys = (*MEASURED_KEYS, *(k for k in extra if k in block))
    return {k: positive_number(block[k], f"{field}.{k}", integer=k in ("batch", "tp")) for k in keys}


def measured_block(
    value: Any, models: list[str], gpus: list[str], extra: tuple[str, ...] = ()
) -> tuple[MeasuredSpec, dict]:
    """One measured operating point per (model, GPU): the top-level block, keyed by model or GPU, or by model
    then GPU (most specific wins). ``extra``: further keys a point may carry (a study's ``tp``), kept in the
    table."""
    fields = (*MEASURED_KEYS, *extra)
    top, by_model, by_gpu = split_keyed_block(value, "measured", fields, models, gpus, nested=True)
    table: dict = {}
    arr = {k: np.full((len(models), len(gpus)), np.nan) for k in MEASURED_KEYS}
    for i, m in enumerate(models):
        for j, g in enumerate(gpus):
            if g in by_model.get(m, {}).get("_by_gpu", {}):
                point, field = by_model[m]["_by_gpu"][g], f"measured.{m}.{g}"
            elif m in by_model and any(k in by_model[m] for k in MEASURED_KEYS):
                point, field = by_model[m], f"measured.{m}"
            elif g in by_gpu:
                point, field = by_gpu[g], f"measured.{g}"
            elif top:
                point, field = top, "measured"
            else:
                continue
            checked = _check_measured(point, field, extra)
            table.setdefault(m, {})[g] = checked
            for k in MEASURED_KEYS:
                arr[k][i, j] = checked[k]
    return MeasuredSpec(
        batch=arr["batch"], request_rate=arr["request_rate"], ttft_s=arr["ttft_s"], itl_s=arr["itl_s"]
    ), table
