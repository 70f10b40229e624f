"""Measured mode (MODEL.md §4): one measured operating point per (model, GPU), from the sweep file's
``measured`` block (top level, or keyed by a swept model or GPU name)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import constants
from ..errors import SlimjaxError
from ..model.specs import MeasuredSpec
from .checks import positive_number, split_keyed_block

MEASURED_KEYS = constants.MEASURED_KEYS


def _check_measured(block: Mapping, field: str) -> dict[str, float]:
    missing = [k for k in MEASURED_KEYS if k not in block]
    if missing:
        raise SlimjaxError(
            f"{field}.{missing[0]}", f"missing: a measured block needs all of {', '.join(MEASURED_KEYS)}"
        )
    return {k: positive_number(block[k], f"{field}.{k}", integer=k == "batch") for k in MEASURED_KEYS}


def measured_block(value: Any, models: list[str], gpus: list[str]) -> tuple[MeasuredSpec, dict]:
    """One measured operating point per (model, GPU): the top-level block, or keyed by model or GPU."""
    top, by_model, by_gpu = split_keyed_block(value, "measured", MEASURED_KEYS, models, gpus)
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
    return MeasuredSpec(
        batch=arr["batch"], request_rate=arr["request_rate"], ttft_s=arr["ttft_s"], itl_s=arr["itl_s"]
    ), table
