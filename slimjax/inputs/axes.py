"""Grid axes of a sweep file: a list, one value, or {start, stop, step} (stop inclusive)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..constants import TYPICAL_REQUEST
from ..errors import SlimjaxError
from .checks import finite_number

# A grid axis longer than this is refused before anything is allocated: the batch axis is held whole
# in every block (B_cap reduces over it) and every other axis multiplies the grid.
MAX_AXIS_VALUES = 1_000_000


def _too_long(field: str, n: int) -> SlimjaxError:
    return SlimjaxError(field, f"has {n:,} values; at most {MAX_AXIS_VALUES:,} per axis (sample it with a larger step)")


def parse_axis(value: Any, field: str, *, integer: bool = True, positive: bool | None = None) -> np.ndarray:
    """An axis: a list, one value, or {start, stop, step} with stop inclusive; strictly increasing.

    Integer axes (batch, lengths) are positive integers (step defaults to 1); the arrival-rate axis
    takes non-negative numbers; ``positive`` (default: ``integer``) asks for values above 0 (a study's rates).
    """
    positive = integer if positive is None else positive
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
                raise SlimjaxError(
                    f"{field}.{key}", f"must be {'an integer' if integer else 'a number'}, got {bounds[key]!r}"
                )
        start, stop, step = bounds["start"], bounds["stop"], bounds["step"]
        if step <= 0:
            raise SlimjaxError(f"{field}.step", f"must be positive, got {step!r}")
        for key in ("start", "stop", "step"):
            finite_number(bounds[key], f"{field}.{key}")
        count = int((stop - start) // step) + 1 if stop >= start else 0
        if count > MAX_AXIS_VALUES:
            raise _too_long(field, count)  # before any value exists
        values = list(range(start, stop + 1, step)) if integer else list(np.arange(start, stop + step * 1e-9, step))
        if not values:
            raise SlimjaxError(field, f"range {dict(value)!r} is empty")
    elif isinstance(value, (list, tuple)):
        values = list(value)
    elif isinstance(value, number) and not isinstance(value, bool):
        values = [value]
    else:
        raise SlimjaxError(
            field, f"must be a list of {'integers' if integer else 'numbers'} or {{start, stop, step}}, got {value!r}"
        )
    if not values:
        raise SlimjaxError(field, "is empty")
    if len(values) > MAX_AXIS_VALUES:
        raise _too_long(field, len(values))
    for i, v in enumerate(values):
        finite_number(v, f"{field}[{i}]")
        if integer and float(v) != int(v):
            raise SlimjaxError(f"{field}[{i}]", f"must be an integer, got {v!r}")
        if positive and v <= 0:
            raise SlimjaxError(f"{field}[{i}]", f"must be positive, got {v!r}")
        if v < 0:
            raise SlimjaxError(f"{field}[{i}]", f"must be non-negative, got {v!r}")
    arr = np.asarray(values, dtype=np.int64 if integer else np.float64)
    if np.any(np.diff(arr) <= 0):
        i = int(np.argmax(np.diff(arr) <= 0)) + 1
        raise SlimjaxError(f"{field}[{i}]", f"values must be strictly increasing, got {arr[i - 1]:g} then {arr[i]:g}")
    return arr


def on_grid_lengths(
    input_values, output_values, input_len: int | None = None, output_len: int | None = None, field: str | None = None
) -> tuple[int, int]:
    """The (I, O) a summary, card or figure shows: each given length checked on its grid axis, each missing
    one the axis value nearest (in log) to :data:`slimjax.constants.TYPICAL_REQUEST`. Errors name ``field``
    (e.g. ``--at``), else the axis."""
    out = []
    for axis, values, given, typical in (
        ("input_len", input_values, input_len, TYPICAL_REQUEST[0]),
        ("output_len", output_values, output_len, TYPICAL_REQUEST[1]),
    ):
        values = np.asarray(values)
        if given is None:
            out.append(int(values[np.argmin(np.abs(np.log(values) - np.log(typical)))]))
            continue
        if int(given) not in values:
            shown = ", ".join(str(int(x)) for x in values)
            raise SlimjaxError(field or axis, f"{axis} {given} is not on the grid ({shown})")
        out.append(int(given))
    return out[0], out[1]
