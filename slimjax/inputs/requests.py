"""Request traces in (MODEL.md §8 "Workload"): timestamps and prompt/output tokens per request, from the
formats production traces come in, then Λ_tr and K length classes.

Formats: ``azure`` (Azure LLM inference traces: TIMESTAMP, ContextTokens, GeneratedTokens), ``mooncake``
(JSON lines: timestamp in ms, input_length, output_length), ``sharegpt`` (length lists without timestamps:
num_prefill_tokens, num_decode_tokens) and ``csv`` (any CSV whose columns are recognised by their
normalised names: a timestamp in seconds or a date-time, prompt tokens, output tokens). The format is
detected from the columns when not given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SlimjaxError
from .checks import positive_number

TRACE_FORMATS = ("azure", "mooncake", "sharegpt", "csv")

# Normalised column names (lower case, letters and digits only) each role accepts, most specific first.
_ROLES = {
    "timestamp": (
        "timestamp",
        "timestamps",
        "timestampms",
        "timestamps",
        "arrivaltime",
        "arrivaltimes",
        "time",
        "arrival",
        "ts",
    ),
    "input": (
        "contexttokens",
        "inputlength",
        "inputlen",
        "inputtokens",
        "prompttokens",
        "promptlen",
        "numprefilltokens",
        "prefilltokens",
        "isl",
        "prompt",
    ),
    "output": (
        "generatedtokens",
        "outputlength",
        "outputlen",
        "outputtokens",
        "completiontokens",
        "numdecodetokens",
        "decodetokens",
        "osl",
        "generated",
    ),
}
_SIGNATURES = {  # the format a file's normalised columns say it is
    "azure": {"timestamp", "contexttokens", "generatedtokens"},
    "mooncake": {"timestamp", "inputlength", "outputlength"},
    "sharegpt": {"numprefilltokens", "numdecodetokens"},
}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@dataclasses.dataclass(frozen=True)
class RequestTrace:
    """One request stream: per-request prompt and output tokens, arrival times (s from the first) or None."""

    input_len: np.ndarray
    output_len: np.ndarray
    arrival_s: np.ndarray | None
    source: str
    format: str
    dropped: int = 0  # requests with zero prompt or output tokens (nothing to serve), not counted
    hash_ids: tuple[tuple[int, ...], ...] | None = None  # per request its prompt's block hashes (Mooncake's hash_ids)

    def taken(self, keep: np.ndarray) -> RequestTrace:
        """The requests where ``keep`` (a bool mask), hashes included."""
        hashes = None if self.hash_ids is None else tuple(h for h, k in zip(self.hash_ids, keep, strict=True) if k)
        return dataclasses.replace(
            self,
            input_len=self.input_len[keep],
            output_len=self.output_len[keep],
            arrival_s=None if self.arrival_s is None else self.arrival_s[keep],
            hash_ids=hashes,
        )

    @property
    def n_requests(self) -> int:
        return len(self.input_len)

    @property
    def span_s(self) -> float | None:
        """T_tr, last − first timestamp (None without timestamps)."""
        return None if self.arrival_s is None else float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def rate(self) -> float | None:
        """Λ_tr = N / T_tr, requests/s (None without timestamps)."""
        return None if self.arrival_s is None else self.n_requests / self.span_s


def _column(columns: list[str], role: str) -> str | None:
    by_norm = {_norm(c): c for c in columns}
    for name in _ROLES[role]:
        if name in by_norm:
            return by_norm[name]
    return None


def _read_table(path: Path, fmt: str | None) -> tuple[pd.DataFrame, str]:
    text_head = path.read_text(errors="replace")[:4096]
    if not text_head.strip():
        raise SlimjaxError(str(path), "empty trace file (no requests)")
    is_jsonl = fmt == "mooncake" or (fmt is None and text_head.lstrip().startswith("{"))
    if is_jsonl:
        rows = []
        with open(path) as f:
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SlimjaxError(f"{path}: line {i}", f"not valid JSON ({e.msg})") from None
                if not isinstance(rows[-1], dict):
                    raise SlimjaxError(f"{path}: line {i}", "must be a JSON object per line")
        df = pd.DataFrame(rows)
    else:
        try:
            df = pd.read_csv(path)
        except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
            raise SlimjaxError(str(path), f"not a readable CSV ({e})") from None
    if df.empty:
        raise SlimjaxError(str(path), "empty trace file (no requests)")
    if fmt is None:
        names = {_norm(c) for c in df.columns}
        fmt = next((f for f, sig in _SIGNATURES.items() if sig <= names), "csv")
    return df, fmt


def _numbers(series: pd.Series, path: Path, column: str, first_row: int) -> np.ndarray:
    values = pd.to_numeric(series, errors="coerce")
    bad = values.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raise SlimjaxError(f"{path}: row {row + first_row}, column {column!r}", f"not a number: {series.iloc[row]!r}")
    return values.to_numpy(dtype=np.float64)


def _timestamps_s(series: pd.Series, path: Path, column: str, first_row: int, fmt: str) -> np.ndarray:
    numeric = pd.to_numeric(series, errors="coerce")
    if numeric.notna().all():
        scale = 1e-3 if fmt == "mooncake" or _norm(column).endswith("ms") else 1.0
        return numeric.to_numpy(dtype=np.float64) * scale
    times = pd.to_datetime(series, errors="coerce")
    bad = times.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raise SlimjaxError(
            f"{path}: row {row + first_row}, column {column!r}", f"not a timestamp: {series.iloc[row]!r}"
        )
    return (times - times.iloc[0]).dt.total_seconds().to_numpy(dtype=np.float64)


def load_requests(path: str | os.PathLike, format: str | None = None) -> RequestTrace:
    """A :class:`RequestTrace` from ``path``. Errors name the file, row and column: an empty file, a
    value that is not a number, a negative length, timestamps out of order. Requests with zero prompt
    or output tokens are dropped (counted in ``dropped``)."""
    path = Path(path)
    if format is not None and format not in TRACE_FORMATS:
        raise SlimjaxError("format", f"unknown request-trace format {format!r}; one of {', '.join(TRACE_FORMATS)}")
    if not path.is_file():
        raise SlimjaxError(str(path), "trace file not found")
    df, fmt = _read_table(path, format)
    first_row = 1 if fmt == "mooncake" else 2  # a JSON-lines file has no header line
    columns = [str(c) for c in df.columns]
    found = {role: _column(columns, role) for role in _ROLES}
    for role in ("input", "output"):
        if found[role] is None:
            raise SlimjaxError(
                str(path), f"no {role}-token column among {columns}; name it one of {', '.join(_ROLES[role][:4])}"
            )
    if fmt == "sharegpt":
        found["timestamp"] = None  # length lists: the order is not an arrival order
    lengths = {}
    for role in ("input", "output"):
        values = _numbers(df[found[role]], path, found[role], first_row)
        bad = (values < 0) | (values != np.round(values))
        if bad.any():
            row = int(np.argmax(bad))
            raise SlimjaxError(
                f"{path}: row {row + first_row}, column {found[role]!r}",
                f"must be a non-negative whole number of tokens, got {values[row]:g}",
            )
        lengths[role] = values
    arrival = None
    if found["timestamp"] is not None:
        arrival = _timestamps_s(df[found["timestamp"]], path, found["timestamp"], first_row, fmt)
        back = np.diff(arrival) < 0
        if back.any():
            row = int(np.argmax(back)) + 1
            raise SlimjaxError(
                f"{path}: row {row + first_row}, column {found['timestamp']!r}",
                "timestamps out of order (earlier than the row before); sort the trace by arrival time",
            )
    keep = (lengths["input"] > 0) & (lengths["output"] > 0)
    if not keep.any():
        raise SlimjaxError(str(path), "no request with both prompt and output tokens")
    hash_column = next((c for c in columns if _norm(c) == "hashids"), None)
    trace = RequestTrace(
        input_len=lengths["input"].astype(np.int64),
        output_len=lengths["output"].astype(np.int64),
        arrival_s=arrival,
        source=str(path),
        format=fmt,
        dropped=int((~keep).sum()),
        hash_ids=None if hash_column is None else _hash_lists(df[hash_column], path, hash_column, first_row),
    ).taken(keep)
    if trace.arrival_s is not None and (trace.n_requests < 2 or trace.span_s <= 0):
        raise SlimjaxError(
            str(path),
            f"{trace.n_requests} request(s) over {trace.span_s:g} s: a trace rate Λ_tr = N / T_tr "
            "needs at least two requests at different times",
        )
    return trace


def _hash_lists(series: pd.Series, path: Path, column: str, first_row: int) -> tuple[tuple[int, ...], ...]:
    """Each request's block hashes: a JSON list (Mooncake) or, in a CSV, integers separated by spaces, commas or
    semicolons (docs/simulation.md)."""
    out = []
    for row, cell in enumerate(series):
        items = re.split(r"[\s,;\[\]]+", cell.strip()) if isinstance(cell, str) else cell
        try:
            values = tuple(int(x) for x in items if not (isinstance(x, str) and not x))
        except (TypeError, ValueError):
            raise SlimjaxError(
                f"{path}: row {row + first_row}, column {column!r}", f"not a list of integer hashes: {cell!r}"
            ) from None
        out.append(values)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class LengthClasses:
    """K length classes (§8): counts n_k, weights w_k = n_k/N, rounded mean prompt and output tokens."""

    count: np.ndarray
    weight: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray

    @property
    def mean_tokens(self) -> float:
        """Σ w_k (I_k + O_k), tokens per request."""
        return float(np.sum(self.weight * (self.input_len + self.output_len)))


def class_groups(input_len: np.ndarray, output_len: np.ndarray, k: int) -> list[np.ndarray]:
    """The request indices of each of ``k`` length classes (§8): sorted by I + O (stable), cut into groups of
    as equal count as possible; each group's indices in stream order."""
    order = np.argsort(np.asarray(input_len) + np.asarray(output_len), kind="stable")
    return [np.sort(g) for g in np.array_split(order, k)]


def length_classes(input_len: np.ndarray, output_len: np.ndarray, k: int, field: str = "classes") -> LengthClasses:
    """Sort requests by I + O (stable), cut into ``k`` groups of as equal count as possible (sizes differ
    by at most one), and represent each by its rounded mean I and O (at least one token each)."""
    n = len(input_len)
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise SlimjaxError(field, f"must be a positive integer, got {k!r}")
    if k > n:
        raise SlimjaxError(field, f"{k} classes from {n} request(s); give at most {n}")
    groups = class_groups(input_len, output_len, k)
    count = np.array([len(g) for g in groups], dtype=np.float64)
    mean_in = np.array([np.mean(input_len[g]) for g in groups])
    mean_out = np.array([np.mean(output_len[g]) for g in groups])
    return LengthClasses(
        count=count,
        weight=count / n,
        input_len=np.maximum(np.rint(mean_in), 1.0),
        output_len=np.maximum(np.rint(mean_out), 1.0),
    )


def read_trace_entry(entry: Mapping, field: str, base_dir: Path | None, *, rate_scale: float = 1.0) -> RequestTrace:
    """The one reader of a study file's request-trace entry (``trace: PATH``, ``format``, ``duration_s``), for the
    simulation's stream and procurement's workloads alike: the path (``~`` and ``$VARS`` expanded, relative to the
    file), the format checked, the trace loaded. ``duration_s`` keeps the requests of the stream's first T seconds
    on the clock the entry is served at — the trace's own divided by ``rate_scale`` (the simulation's; 1 for a
    workload, which a study then serves at each of its rates). Arrival times are the trace's
    (not shifted): each study sets its own clock."""
    fmt = entry.get("format")
    if fmt is not None and fmt not in TRACE_FORMATS:
        raise SlimjaxError(f"{field}.format", f"must be one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
    raw = entry["trace"]
    if not isinstance(raw, str) or not raw:
        raise SlimjaxError(f"{field}.trace", f"must be a file path, got {raw!r}")
    path = Path(os.path.expandvars(os.path.expanduser(raw)))
    path = path if path.is_absolute() or base_dir is None else base_dir / path
    if not path.is_file():
        raise SlimjaxError(f"{field}.trace", f"trace file {str(path)!r} not found")
    trace = load_requests(path, fmt)
    if "duration_s" not in entry:
        return trace
    if entry["duration_s"] is None:
        raise SlimjaxError(f"{field}.duration_s", "must be a positive number of seconds")
    if trace.arrival_s is None:
        raise SlimjaxError(f"{field}.duration_s", f"{path.name} has no timestamps to take seconds of")
    seconds = positive_number(entry["duration_s"], f"{field}.duration_s")
    keep = (trace.arrival_s - trace.arrival_s[0]) / rate_scale < seconds  # the first request always
    return trace.taken(keep)
