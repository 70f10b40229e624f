"""Benchmark harnesses (configs/harnesses.yaml): how a measured serving row's client ran, so that the serving check and
the serving fit run the row as it was measured (docs/engines.md, "Benchmark harnesses")."""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

from ..errors import SlimjaxError
from .catalog import config_yaml
from .checks import checked_number, positive_number

DEFAULT = "closed_loop"
SCORED = {"all": "every request", "after_first_wave": "the requests after the first C completions"}


@dataclasses.dataclass(frozen=True)
class Harness:
    """One harness: ``requests_per_client`` k, ``range_ratio`` r (lengths uniform integers in [⌊r·L⌋, L]),
    ``score_all`` (mean over every request, else after the first C completions), the ``match`` patterns a row's
    source is recognised by, and ``source`` (where the settings come from)."""

    key: str
    name: str
    requests_per_client: int
    range_ratio: float
    score_all: bool
    match: tuple[str, ...]
    source: str


@functools.cache
def harnesses() -> dict[str, Harness]:
    """The harness table, checked: one line naming the entry and field for a bad value."""
    out = {}
    for key, row in config_yaml("harnesses.yaml")["harnesses"].items():
        field = f"configs/harnesses.yaml: harnesses.{key}"
        scored = row.get("scored", "all")
        if scored not in SCORED:
            raise SlimjaxError(f"{field}.scored", f"must be one of {', '.join(SCORED)}, got {scored!r}")
        patterns = tuple(str(p) for p in row.get("match", ()))
        for i, p in enumerate(patterns):
            try:
                re.compile(p)
            except re.error as e:
                raise SlimjaxError(f"{field}.match[{i}]", f"not a regular expression ({e}): {p!r}") from None
        out[key] = Harness(
            key=key,
            name=str(row.get("name", key)),
            requests_per_client=int(
                positive_number(row["requests_per_client"], f"{field}.requests_per_client", integer=True)
            ),
            range_ratio=checked_number(row["range_ratio"], f"{field}.range_ratio", lambda v: 0 < v <= 1, "in (0, 1]"),
            score_all=scored == "all",
            match=patterns,
            source=str(row.get("source", "")),
        )
    if DEFAULT not in out:
        raise SlimjaxError("configs/harnesses.yaml: harnesses", f"needs the default harness {DEFAULT!r}")
    return out


def harness_of(source) -> str:
    """The key of the first harness one of whose patterns is found in a row's ``source`` text; the default where
    none is (or the row has no source)."""
    text = "" if source is None or (isinstance(source, float) and np.isnan(source)) else str(source)
    for key, h in harnesses().items():
        if any(re.search(p, text) for p in h.match):
            return key
    return DEFAULT


def request_lengths(length, n: int, range_ratio, seed: int = 0) -> np.ndarray:
    """(rows, n) request lengths: per row, n uniform integers in [⌊r·L⌋, L] (vLLM benchmark_serving's random dataset),
    from one seeded generator per row (the same draws for every row of the same L, r and n); exactly L where r = 1."""
    length, ratio = np.broadcast_arrays(np.asarray(length, float), np.asarray(range_ratio, float))
    out = np.empty((len(length), int(n)))
    for i, (L, r) in enumerate(zip(length, ratio, strict=True)):
        if r >= 1.0:
            out[i] = L
        else:
            out[i] = np.random.default_rng(seed).integers(int(np.floor(r * L)), int(L) + 1, int(n))
    return np.maximum(out, 1.0)


def harness_table_markdown() -> str:
    """The harness table as Markdown (docs/engines.md shows it; tests/test_engines.py checks it)."""
    lines = [
        "| harness | requests per client | lengths | scored | recognised by | source |",
        "|---|---|---|---|---|---|",
    ]
    for h in harnesses().values():
        lengths = "(I, O) each" if h.range_ratio >= 1 else f"uniform in [⌊{h.range_ratio:g}·L⌋, L]"
        match = ", ".join(f"`{p}`" for p in h.match) or "(the default)"
        scored = SCORED["all" if h.score_all else "after_first_wave"]
        lines.append(
            f"| `{h.key}` {h.name} | {h.requests_per_client} | {lengths} | {scored} | {match} "
            f"| {' '.join(h.source.split())} |"
        )
    return "\n".join(lines)
