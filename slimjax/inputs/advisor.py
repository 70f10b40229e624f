"""The sweep file's ``advisor`` block (MODEL.md §2): ε and the SLO, absolute or as a factor of E2E at a
reference point."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SlimjaxError, suggest
from .checks import checked_number, is_integer, nonnegative

DEFAULT_SLO_REFERENCE = {"input_len": 2, "output_len": 128, "batch": 32}
DEFAULT_EPSILON = 0.5
DEFAULT_SLO_FACTOR = 4.0  # the paper's loose SLO


@dataclasses.dataclass(frozen=True)
class Advisor:
    epsilon: float
    slo_s: float | None  # absolute SLO, or None for factor × E2E(reference)
    slo_factor: float | None
    slo_reference: dict[str, int]


def advisor_block(value: Any, batch: np.ndarray) -> Advisor | None:
    if value is False:
        return None
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise SlimjaxError(
            "advisor", f"must be a mapping (epsilon, slo_s or slo_factor, slo_reference) or false, got {value!r}"
        )
    unknown = set(value) - {"epsilon", "slo_s", "slo_factor", "slo_reference"}
    if unknown:
        name = sorted(unknown)[0]
        raise SlimjaxError(
            f"advisor.{name}", f"unknown key{suggest(name, ['epsilon', 'slo_s', 'slo_factor', 'slo_reference'])}"
        )
    # T(B)/(B·T(1)) ≤ 1 always (batching never more than multiplies one sequence's rate), so ε ≥ 1 admits no batch
    epsilon = checked_number(
        value.get("epsilon", DEFAULT_EPSILON), "advisor.epsilon", lambda x: 0 <= x < 1, "in [0, 1)"
    )
    if "slo_s" in value and ("slo_factor" in value or "slo_reference" in value):
        raise SlimjaxError("advisor.slo_s", "give either slo_s or slo_factor (+ slo_reference), not both")
    slo_s = nonnegative(value["slo_s"], "advisor.slo_s", strictly=True) if "slo_s" in value else None
    factor = (
        None
        if slo_s is not None
        else nonnegative(value.get("slo_factor", DEFAULT_SLO_FACTOR), "advisor.slo_factor", strictly=True)
    )
    ref = dict(DEFAULT_SLO_REFERENCE)
    given = value.get("slo_reference") or {}
    if not isinstance(given, Mapping):
        raise SlimjaxError("advisor.slo_reference", f"must be a mapping of input_len, output_len, batch, got {given!r}")
    for key, v in given.items():
        if key not in ref:
            raise SlimjaxError(f"advisor.slo_reference.{key}", f"unknown key{suggest(str(key), list(ref))}")
        ref[key] = int(
            checked_number(
                v,
                f"advisor.slo_reference.{key}",
                lambda x: x >= 1 and is_integer(x),
                "a positive integer",
                kind="a positive integer",
            )
        )
    if batch[0] != 1:
        raise SlimjaxError(
            "batch", f"must contain 1 when the advisor is on (T(I,O,1) anchors ε); it starts at {int(batch[0])}"
        )
    return Advisor(epsilon=epsilon, slo_s=slo_s, slo_factor=factor, slo_reference=ref)
