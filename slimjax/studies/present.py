"""What every study's tables and figures share: the figure record, the Okabe–Ito palette, small multiples on
matplotlib's object API (Agg, no pyplot state), the axis rule for values spanning decades, how times print, the
assumptions a study's text ends with — and the registry by which the report, the api and the command line find
a kind of store's figures, tables and text (:func:`register_study`)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable

import numpy as np

from ..constants import KV_POLICIES

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MAX_PANELS = 12  # small multiples per figure (the first pairs; the page says which were left out)


@dataclasses.dataclass
class Figure:
    key: str  # file name stem
    title: str
    figure: object  # a matplotlib Figure (matplotlib is imported when a figure is drawn, not with this module)
    caption: str = ""


def grid(n: int, width: float = 4.2, height: float = 3.2) -> tuple[object, list]:
    """A matplotlib figure of n panels, three to a row (the rest hidden), and its axes."""
    from matplotlib.figure import Figure as MplFigure

    cols = min(n, 3)
    rows = int(np.ceil(n / cols))
    fig = MplFigure(figsize=(width * cols + 2.2, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, list(axes[:n])


def spans_decades(values) -> bool:
    """Whether the positive values span 30× or more (a log axis then)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    return v.size > 1 and v.max() / v.min() >= 30


def ms(x: float) -> str:
    """A time in seconds for a table: microseconds below 1 ms, milliseconds below 10 s, else seconds ("n/a" where
    there is none), so no time that is not zero reads "0"."""
    if not np.isfinite(x):
        return "n/a"
    return f"{x * 1e6:,.0f} µs" if x < 1e-3 else f"{x * 1e3:,.0f} ms" if x < 10 else f"{x:,.1f} s"


def assumption_lines(ds) -> list[str]:
    """The study's assumptions (its ``assumptions`` attr), as its tables end with them."""
    said = json.loads(ds.attrs.get("assumptions", "[]"))
    return ["", "assumptions:", *(f"  {a}" for a in said)] if said else []


def deployment_header() -> str:
    """The column header of disaggregated deployments' lines (simulation and procurement text)."""
    columns = ("TTFT p50", "TTFT p90", "TPOT p90", "E2E mean")
    return f"{'deployment':<58} " + " ".join(f"{c:>10}" for c in columns) + f" {'busy P':>6} {'busy D':>6} {'$/h':>8}"


@dataclasses.dataclass(frozen=True)
class StudyKind:
    """How a kind of store (its ``kind`` attr) is shown: its figures (Dataset, at) -> [Figure], its tables
    Dataset -> [(title, DataFrame)] for the report page, and the text the command line prints (or None)."""

    kind: str
    figures: Callable
    tables: Callable
    text: Callable | None = None


STUDIES: dict[str, StudyKind] = {}


def deferred(module: str, name: str) -> Callable:
    """``module``'s function ``name``, imported on its first call: a study package registers how its stores are
    shown without loading xarray and pandas, so reading its file stays light (the command line checks a file with
    only JAX loaded)."""

    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{module}.{name}, imported on first call."
    return call


def lazy_members(package: str, members: dict[str, str]) -> Callable:
    """A study package's module ``__getattr__``: each name in ``members`` is imported from the submodule it
    names (relative, e.g. ``".fleet"``) on first use, so importing the package loads only its file reader."""

    def getattr_(name: str):
        import importlib

        if name not in members:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(members[name], package)
        value = module if module.__name__.rsplit(".", 1)[-1] == name else getattr(module, name)
        setattr(importlib.import_module(package), name, value)  # found directly from now on
        return value

    return getattr_


def register_study(kind: StudyKind) -> StudyKind:
    """A kind of store the report, the api and the command line show (once per kind)."""
    if kind.kind in STUDIES:
        raise ValueError(f"study kind {kind.kind!r} is already registered")
    STUDIES[kind.kind] = kind
    return kind


def study_kinds() -> dict[str, StudyKind]:
    """Every registered kind: each study package under :mod:`slimjax.studies` imported (each registers its own
    kind when imported; a new study is its package, nothing listed here)."""
    _import_study_packages()
    return STUDIES


@functools.cache
def _import_study_packages() -> None:
    """Import every study package once (the folder is walked on the first lookup, not on each)."""
    import importlib
    import pkgutil

    from .. import studies

    for module in pkgutil.iter_modules(studies.__path__):
        if module.ispkg:
            importlib.import_module(f"{studies.__name__}.{module.name}")


def engine_assumptions(serving_table: dict) -> tuple[str, str]:
    """(engine line, scheduling words) of a study's serving table (per model and GPU): the engine profiles named
    (configs/engines.yaml) and how steps are scheduled — whether prompts share steps with the decodes or run before
    them (``prefill_first``), the step budgets and chunk sizes, and the KV policy (docs/engines.md)."""
    rows = [r for by_gpu in serving_table.values() for r in by_gpu.values()]
    engines = sorted({str(r.get("engine", "")) for r in rows} - {""})
    steps = sorted({int(r["step_tokens"]) for r in rows})
    chunks = sorted({int(r["chunk_size"]) for r in rows})
    alone = frozenset(int(r.get("prefill_first", 0)) for r in rows)
    budget = f"engine steps of {', '.join(map(str, steps))} tokens"
    how = {
        frozenset({0}): f"prompts share {budget} with the decodes",
        frozenset({1}): f"prompts run in {budget} of their own, before the decodes",
    }.get(alone, f"prompts share {budget} with the decodes, or run in steps of their own before them")
    kv = " / ".join(KV_POLICIES[p] for p in sorted({str(r.get("kv_policy", "reserve")) for r in rows}))
    scheduling = f"{how} (chunk size {', '.join(str(c) if c else 'whole prompt' for c in chunks)}), {kv}"
    drafts = sorted(
        {
            f"{r['speculative_method']} k {int(r['speculative_tokens'])} a {float(r['acceptance_length']):g}"
            for r in rows
            if float(r.get("speculative_tokens", 0)) > 0
        }
    )
    if drafts:  # docs/speculative.md
        scheduling += f"; speculative decoding ({', '.join(drafts)}: k draft tokens, a accepted a step)"
    swept = list(dict.fromkeys(s for r in rows for s in r.get("settings", ())))
    if swept:
        scheduling += f" in the serving block; engine settings swept as candidates (dim setting): {'; '.join(swept)}"
    return f"engine: {'; '.join(engines)} (configs/engines.yaml, docs/engines.md)", scheduling
