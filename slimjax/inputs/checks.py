"""The checks every input block shares: a finite number that is not a bool, with a rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SlimjaxError

_NUMBER = (int, float, np.integer, np.floating)


def finite_number(value: Any, field: str, what: str = "a number") -> float:
    """``value`` as a float; SlimjaxError(field, 'must be {what}, got …') for a bool, a non-number,
    NaN or ±inf."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _NUMBER) or not np.isfinite(value):
        raise SlimjaxError(field, f"must be {what}, got {value!r}")
    return float(value)


def checked_number(value: Any, field: str, ok: Callable[[float], bool], what: str, *, kind: str = "a number") -> float:
    """A finite number (else 'must be {kind}') that satisfies ``ok`` (else 'must be {what}')."""
    v = finite_number(value, field, kind)
    if not ok(v):
        raise SlimjaxError(field, f"must be {what}, got {value!r}")
    return v


def is_integer(v: float) -> bool:
    return float(v) == int(v)


def nonnegative(value: Any, field: str, *, strictly: bool = False) -> float:
    """A number ≥ 0 (> 0 with ``strictly``)."""
    return checked_number(
        value, field, (lambda v: v > 0) if strictly else (lambda v: v >= 0), "positive" if strictly else "non-negative"
    )


def positive_number(value: Any, field: str, *, integer: bool = False) -> float:
    """A number > 0 ('must be a positive number'), optionally an integer ('must be an integer')."""
    v = checked_number(value, field, lambda v: v > 0, "a positive number", kind="a positive number")
    if integer and not is_integer(v):
        raise SlimjaxError(field, f"must be an integer, got {value!r}")
    return v


def split_keyed_block(
    value: Any, field: str, fields: tuple[str, ...], models: list[str], gpus: list[str], nested: bool = False
) -> tuple[dict, dict, dict]:
    """A block of ``fields`` given at the top level and/or under swept model or GPU names: returns
    (top-level settings, {model: settings}, {gpu: settings}). ``nested``: a model's block may hold GPU names
    too, for one (model, GPU) pair, returned under the model's settings as ``"_by_gpu": {gpu: settings}``."""
    from collections.abc import Mapping

    from ..errors import suggest

    if not isinstance(value, Mapping):
        raise SlimjaxError(field, f"must be a mapping, got {value!r}")
    top, by_model, by_gpu = {}, {}, {}
    for key, v in value.items():
        if key in fields:
            top[key] = v
        elif key in models or key in gpus:
            if not isinstance(v, Mapping):
                raise SlimjaxError(f"{field}.{key}", f"must be a mapping of {field} settings, got {v!r}")
            inner = gpus if nested and key in models else []
            bad = [k for k in v if k not in fields and k not in inner]
            if bad:
                raise SlimjaxError(
                    f"{field}.{key}.{bad[0]}", f"unknown key{suggest(str(bad[0]), list(fields) + inner)}"
                )
            settings = {k: x for k, x in v.items() if k not in inner}
            pairs = {}
            for g in (k for k in v if k in inner):
                if not isinstance(v[g], Mapping):
                    raise SlimjaxError(f"{field}.{key}.{g}", f"must be a mapping of {field} settings, got {v[g]!r}")
                wrong = [k for k in v[g] if k not in fields]
                if wrong:
                    raise SlimjaxError(f"{field}.{key}.{g}.{wrong[0]}", f"unknown key{suggest(str(wrong[0]), fields)}")
                pairs[g] = dict(v[g])
            if pairs:
                settings["_by_gpu"] = pairs
            (by_model if key in models else by_gpu)[key] = settings
        else:
            raise SlimjaxError(
                f"{field}.{key}",
                f"not a {field} setting nor a swept model or GPU{suggest(str(key), list(fields) + models + gpus)}",
            )
    return top, by_model, by_gpu
