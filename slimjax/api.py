"""The library entry points: ``sweep`` (grid → Dataset/zarr), ``point`` (one scalar evaluation), ``summary``,
``procure`` (a procurement study, MODEL.md §8)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from .config import float64_scope
from .engine import dataset, grid
from .engine.groups import variable_names
from .engine.schema import DIMS, VARIABLES
from .errors import SlimjaxError
from .inputs import procurefile, sweepfile
from .inputs.axes import on_grid_lengths
from .inputs.sweepfile import Sweep
from .store import coefficients as coefficient_store
from .store import sink as store

DEFAULT_MEMORY_BUDGET = 256 << 20  # bytes of working memory for one block
COUNTED = ("slim_at_floor",)  # flags whose set cells a sweep counts into the variable's attrs (nonzero, cells)


def _progress(quiet: bool | None):
    show = not quiet and sys.stderr.isatty() if quiet is not None else sys.stderr.isatty()
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(desc="slimjax sweep", unit="block", file=sys.stderr)


def parse(spec: str | os.PathLike | Mapping) -> Sweep:
    """Validate a sweep file (path) or mapping into a :class:`Sweep`, reading a calibrated coefficient
    store where ``slim`` names one."""
    return sweepfile.parse(spec, read_store=coefficient_store.read_for_sweep)


def _available_memory_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def _size(n: float) -> str:
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def result_bytes(sw: Sweep) -> float:
    """Bytes of every variable of the sweep, uncompressed (what memory or a store without compression holds)."""
    sizes = {d: len(v) for d, v in sw.coords.items()}
    total = 0.0
    for n in variable_names(sw):
        dims = grid.schema(sw)[n].dims
        total += float(np.prod([sizes[d] for d in dims], dtype=float)) * grid.variable_dtype(sw, n).itemsize
    return total


def _check_room(sw: Sweep, target) -> None:
    """Refuse, before any work, a result that cannot fit where it goes, naming both sizes."""
    import shutil

    need = result_bytes(sw)
    if target is None:
        have = _available_memory_bytes()
        if need > have:
            raise SlimjaxError(
                "sweep",
                f"the result needs {_size(need)} of memory but {_size(have)} is available; "
                "write it to a store (out=… / --out) or sample the axes",
            )
        return
    if store.is_url(target):
        return  # an object store's free space is not ours to know
    free = shutil.disk_usage(target.parent).free
    if need > free:
        raise SlimjaxError(
            "out",
            f"the store needs up to {_size(need)} (uncompressed) but {str(target.parent)!r} has "
            f"{_size(free)} free; free space, write elsewhere, or sample the axes",
        )


def sweep(
    spec: str | os.PathLike | Mapping | Sweep,
    out: str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
    memory_budget_bytes: float = DEFAULT_MEMORY_BUDGET,
    quiet: bool | None = None,
    resume: bool = False,
    compression: str = "none",
    scheduler: str = "local",
    workers: int | None = None,
    dask_address: str | None = None,
) -> xr.Dataset:
    """Evaluate a sweep (file path, mapping or parsed :class:`Sweep`) over its dense grid.

    With ``out``, the Dataset is written to a zarr store and returned opened lazily from it; without, it
    is built in memory. The store is built in ``OUT.partial``: evaluation, encoding and writing overlap
    (a pool of writer threads), each finished block is journaled, and the store is renamed into place
    when complete. On failure (an error, Ctrl-C, SIGTERM, a kill) the partial store stays; ``resume``
    continues it, evaluating only the blocks not yet journaled, and gives a store bit-identical to an
    uninterrupted run (a different resolved sweep is refused). An existing store is replaced only with
    ``overwrite``. A result that would not fit the target's free disk (or, in memory, the available RAM)
    is refused before any work. ``compression``: "none" (the default: faster end to end here; float results
    barely compress, 1.19 vs 1.05 GB per 10^8 points) or "zstd" (level 1). Working memory stays under
    ``memory_budget_bytes`` per block (plus, in memory, the result itself).

    ``scheduler="dask"`` runs the blocks on a ``dask.distributed`` cluster — a LocalCluster of ``workers``
    processes, or the scheduler at ``dask_address`` — whose workers write their regions straight into the
    store (a path every worker can open); same store, same journal, same resume, identical values.
    """
    given = spec if isinstance(spec, Sweep) else None
    return _evaluate(given, lambda: parse(spec), out, **_engine_options(locals()))


_ENGINE_OPTIONS = (
    "overwrite",
    "memory_budget_bytes",
    "quiet",
    "resume",
    "compression",
    "scheduler",
    "workers",
    "dask_address",
)


def _engine_options(arguments: dict) -> dict:
    """An entry point's engine options (its keyword arguments of those names), for :func:`_evaluate`."""
    return {k: arguments[k] for k in _ENGINE_OPTIONS}


def _evaluate(
    given,
    parse_it,
    out,
    *,
    overwrite: bool,
    memory_budget_bytes: float,
    quiet: bool | None,
    resume: bool,
    compression: str,
    scheduler: str,
    workers: int | None,
    dask_address: str | None,
) -> xr.Dataset:
    """Any kind of evaluation (a Sweep, a procurement Study) through the engine: the block plan under the
    memory budget, in memory or to a journaled store (resume, verify), locally or on Dask; one Dataset
    builder and one attrs path. ``given`` is the parsed input, or None to ``parse_it()`` (inside float64)."""
    if scheduler not in ("local", "dask"):
        raise SlimjaxError("scheduler", f"must be 'local' or 'dask', got {scheduler!r}")
    if scheduler == "dask" and out is None:
        raise SlimjaxError("scheduler", "a Dask sweep writes to a store: give out=… / --out")
    if dask_address is not None:
        if scheduler != "dask":
            raise SlimjaxError("--dask-address", "is for --scheduler dask")
        from .store.distributed import check_address

        check_address(dask_address)  # before any store is made: a failed connect leaves nothing behind
    target = store.check_target(out, overwrite, resume) if out is not None else None
    with float64_scope():
        sw = given if given is not None else parse_it()
        _check_room(sw, target)
        names = variable_names(sw)
        block_plan = grid.plan(sw, memory_budget_bytes)
        attrs = dataset.dataset_attrs(sw, block_plan)
        var_attrs = {n: dataset.variable_attrs(sw, n) for n in names}
        progress = _progress(quiet)
        try:
            if target is None:
                sink = dataset.MemorySink(sw, names)
                grid.evaluate(sw, block_plan, sink, progress=progress)
                for name in COUNTED:  # where SLIM is at its physical floor, counted (the summary says it too)
                    if name in sink.arrays:
                        var_attrs[name] = {
                            **var_attrs[name],
                            "nonzero": int(np.count_nonzero(sink.arrays[name])),
                            "cells": int(sink.arrays[name].size),
                        }
                return dataset.in_memory_dataset(sw, sink.arrays, attrs, var_attrs)
            variables = {
                n: (
                    grid.schema(sw)[n].dims,
                    grid.variable_dtype(sw, n),
                    block_plan.chunks(grid.schema(sw)[n].dims),
                    var_attrs[n],
                )
                for n in names
            }
            with store.sigterm_as_exit():
                sink = store.ZarrSink(
                    target,
                    sw.coords,
                    {d: DIMS[d].attrs for d in sw.coords},
                    variables,
                    attrs,
                    compression=compression,
                    resume=resume,
                    shards={n: block_plan.shards(grid.schema(sw)[n].dims) for n in names},
                )
                try:
                    if scheduler == "dask":
                        from .store.distributed import evaluate_on_dask

                        evaluate_on_dask(sw, block_plan, sink, workers=workers, address=dask_address, progress=progress)
                    else:
                        grid.evaluate(sw, block_plan, sink, progress=progress, skip=frozenset(sink.done))
                    sink.commit(count_nonzero=COUNTED)
                except BaseException:
                    kept = sink.abort()
                    import warnings

                    warnings.warn(
                        f"{sw.kind} interrupted; its partial store {str(kept)!r} is kept: rerun with resume=True / "
                        "--resume to continue it",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    raise
            return dataset.canonical(store.open_store(str(target)))
        finally:
            if progress is not None:
                progress.close()


def procure(
    spec: str | os.PathLike | Mapping | procurefile.Study,
    out: str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
    memory_budget_bytes: float = DEFAULT_MEMORY_BUDGET,
    quiet: bool | None = True,
    resume: bool = False,
    compression: str = "none",
    scheduler: str = "local",
    workers: int | None = None,
    dask_address: str | None = None,
) -> xr.Dataset:
    """A procurement study (MODEL.md §8) from a procurement file (path), mapping or parsed
    :class:`~slimjax.inputs.procurefile.Study`: every (GPU, TP, batch limit) candidate per workload,
    rate and model, the cheapest feasible choice and the per-class mix. It runs through the same engine
    as :func:`sweep` — block plan under ``memory_budget_bytes``, a journaled store at ``out`` (atomic,
    ``resume`` after an interruption, ``slimjax verify``), ``scheduler="dask"`` — with the same options.
    Print it with :func:`procure_tables`."""
    given = spec if isinstance(spec, procurefile.Study) else None
    return _evaluate(given, lambda: procurefile.parse(spec), out, **_engine_options(locals()))


def procure_tables(ds: xr.Dataset, top: int = 5, infeasible: int = 3) -> str:
    """The study's ranked tables as text (:func:`slimjax.report.tables.ranked_tables`)."""
    from .report.tables import ranked_tables

    return ranked_tables(ds, top=top, infeasible=infeasible)


def make_report(paths, out_dir: str | os.PathLike, *, at: tuple[int, int] | None = None, quiet: bool | None = None):
    """PNGs and one self-contained ``index.html`` in ``out_dir`` for stores slimjax wrote (sweeps incl. queue and
    agents, procurement, calibration) and ``validate --out`` CSVs; returns the page's path."""
    from .report.page import write_report

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return write_report(list(paths), out_dir, at=at, quiet=quiet)


def advise(data_dir: str | os.PathLike | None = None, *, epsilon: float = 0.5):
    """The batch-capacity advisor evaluated as the SLIM paper does (source 000 §VII-B) on the shared
    measured curves in ``data_dir`` (default ``$SLIMJAX_DATA``, else ``../shared/data``): returns an
    :class:`~slimjax.studies.advise.AdviseResult` (per-curve rows, a summary per SLO and method, knees)."""
    from .studies import advise as advise_study

    if data_dir is None:
        data_dir = os.environ.get("SLIMJAX_DATA", os.path.join("..", "shared", "data"))
    if not (isinstance(epsilon, (int, float)) and 0 < epsilon < 1):
        raise SlimjaxError("epsilon", f"must be in (0, 1), got {epsilon!r}")
    return advise_study.evaluate(data_dir, epsilon)


def summary(ds: xr.Dataset, input_len: int | None = None, output_len: int | None = None) -> dict[str, pd.DataFrame]:
    """Per model × GPU at one (I, O): ``b_cap``, the throughput there, and the plateau throughput
    (the best SLIM throughput over the batches that fit). (I, O) default to the grid values closest
    (in log scale) to a typical chat request, I = 1024, O = 256. Returns DataFrames (rows model,
    columns GPU) keyed by what they hold, and the (I, O) used under ``"at"``. With the capacity
    calculator on, ``runs`` says which (model, GPU) hold at least one sequence of I + O tokens (the
    others are NaN in every table, never a number), ``n_gpu`` the group size, and ``notes`` one line per
    configuration that does not run, with the smallest TP degree that would fit it; ``notes`` also
    names each model whose context (max_position_embeddings) I + O exceeds.
    """

    i, o = on_grid_lengths(ds["input_len"].values, ds["output_len"].values, input_len, output_len)
    at = ds.sel(input_len=i, output_len=o)
    tput = at["slim_throughput"].load()
    models, gpus = list(ds["model"].values), list(ds["gpu"].values)
    frame = lambda a: pd.DataFrame(np.asarray(a), index=models, columns=gpus)  # noqa: E731
    runs = None
    if "fits" in ds:
        runs = at["max_seqs"].load() >= 1
        tput = tput.where(at["fits"].load())
    out = {"at": pd.DataFrame({"input_len": [i], "output_len": [o]}), "plateau_throughput": frame(tput.max("batch"))}
    if "b_cap" in ds:
        b_cap = at["b_cap"].load()
        out["b_cap"] = frame(b_cap if runs is None else b_cap.where(runs))
        chosen = tput.sel(batch=xr.where(b_cap > 0, b_cap, ds["batch"].values[0])).where(b_cap > 0)
        out["throughput_at_b_cap"] = frame(chosen)
    notes = []
    if "within_context" in ds:
        for m in models:
            if not bool(at["within_context"].sel(model=m)):
                notes.append(
                    f"{m}: I + O = {i + o} tokens is beyond its context (max_position_embeddings); "
                    "its figures are extrapolated"
                )
    if runs is not None:
        out["runs"] = frame(runs)
        out["n_gpu"] = frame(ds["n_gpu"])
        for m in models:
            for g in gpus:
                if bool(runs.sel(model=m, gpu=g)):
                    continue
                n = int(ds["n_gpu"].sel(model=m, gpu=g))
                need = int(ds["n_gpu_to_fit"].sel(model=m, gpu=g))
                group = f"{n} GPU{'s' if n > 1 else ''}" if n else "no TP degree up to 8"
                fix = f"the smallest TP degree that fits is {need}" if need else "no TP degree in 1, 2, 4, 8 fits it"
                notes.append(f"{m} on {g} ({group}): does not fit weights plus one sequence of {i + o} tokens; {fix}")
    if "slim_at_floor" in ds:
        flag = ds["slim_at_floor"]
        n_set = flag.attrs.get("nonzero")
        n_set = int((flag > 0).sum()) if n_set is None else int(n_set)
        n_fit = int(ds["fits"].sum()) if "fits" in ds else int(flag.size)
        if n_set:
            at_floor = int((at["slim_at_floor"] > 0).sum())
            notes.append(
                f"SLIM is at its physical floor (100 % of peak FLOP/s and bandwidth on the group) at {n_set:,} of the "
                f"{n_fit:,} points that fit ({at_floor:,} of them at I = {i}, O = {o}); slim_at_floor marks them"
            )
    out["notes"] = pd.DataFrame({"note": notes})
    if "agent_local_s" in ds:
        out["agents"] = agent_table(at)
    return out


def agent_table(at: xr.Dataset) -> pd.DataFrame:
    """Per model, GPU and agent graph at one (I, O): the local batch limit with the shortest T_local
    (ties: smaller), its time and cost, the API's time, binding limit and cost, and who is faster and
    cheaper there. A configuration that does not fit reads "does not fit", never a number."""
    rows = []
    for m in at["model"].values:
        for g in at["gpu"].values:
            for a in at["agent"].values:
                c = at.sel(model=m, gpu=g, agent=a)
                local = c["agent_local_s"].values
                fits = np.isfinite(local).any()
                k = int(np.argmin(local)) if fits else 0
                best = c.isel(batch=k)
                api_s = float(best["agent_api_s"])
                rows.append(
                    {
                        "model": m,
                        "gpu": g,
                        "agent": a,
                        "n_gpu": int(at["n_gpu"].sel(model=m, gpu=g)) if "n_gpu" in at else 1,
                        "batch": int(at["batch"].values[k]) if fits else "—",
                        "local": _quantity(float(best["agent_local_s"]), "s") if fits else "does not fit",
                        "dependency bound": _quantity(float(best["agent_dependency_bound_s"]), "s") if fits else "—",
                        "API": _quantity(api_s, "s"),
                        "API bound by": API_LIMIT_NAMES[int(best["agent_api_limit"])],
                        "local $": f"{float(best['agent_local_cost_usd']):.4f}" if fits else "—",
                        "API $": f"{float(best['agent_api_cost_usd']):.4f}",
                        "faster": WINNER_NAMES[int(best["agent_faster"])],
                        "cheaper": WINNER_NAMES[int(best["agent_cheaper"])],
                    }
                )
    return pd.DataFrame(rows)


def point(
    model,
    gpu,
    batch: int,
    input_len: int,
    output_len: int,
    *,
    slim: Mapping | str | None = None,
    slim_variant: str | None = None,
    serving: Mapping | None = None,
    precision: str = "float64",
) -> dict[str, float]:
    """Every SLIM variable at one point, through the same jitted grid evaluation as :func:`sweep`, with the
    memory check (``fits``; every time and throughput NaN where the batch does not fit, at the serving defaults
    unless ``serving`` is given).

    ``model`` and ``gpu`` are anything a sweep file accepts (catalog name, config path, mapping); ``slim`` and
    ``slim_variant`` as the sweep file's keys (default: the recommended variant).
    """
    spec = dict(
        models=[model],
        gpus=[gpu],
        batch=[batch],
        input_len=[input_len],
        output_len=[output_len],
        advisor=False,
        precision=precision,
    )
    for key, value in (("slim", slim), ("slim_variant", slim_variant), ("serving", serving)):
        if value is not None:
            spec[key] = value
    ds = sweep(spec, quiet=True)
    return {k: float(ds[k].values.reshape(-1)[0]) for k in ds.data_vars}


def capacity(
    model,
    gpu,
    input_len: int,
    output_len: int,
    batch: int,
    *,
    arrival_rate: float | None = None,
    serving: Mapping | None = None,
    measured: Mapping | None = None,
) -> dict[str, float]:
    """The capacity calculator at one point (float64), through the same jitted grid as :func:`sweep`.

    ``serving`` takes the sweep file's serving keys, ``measured`` its four measured keys. Returns every
    §3–§5 variable (queue variables only with ``arrival_rate``) and the SLIM ones.
    """
    spec = dict(
        models=[model],
        gpus=[gpu],
        batch=[batch],
        input_len=[input_len],
        output_len=[output_len],
        advisor=False,
        precision="float64",
        serving=dict(serving or {}),
    )
    if arrival_rate is not None:
        spec["arrival_rate"] = [arrival_rate]
    if measured is not None:
        spec["measured"] = dict(measured)
    with float64_scope():
        sw = parse(spec)
        ds = sweep(sw, quiet=True)
        result = {k: ds[k].values.reshape(-1)[0].item() for k in ds.data_vars}
        # the fix a user needs is the group that holds this batch, not only one sequence
        result["batch"] = float(batch)
        result["n_gpu_to_fit_batch"] = float(sweepfile.smallest_tp_for_batch(sw, input_len + output_len, batch)[0, 0])
    return result


def agent(
    model,
    gpu,
    input_len: int,
    output_len: int,
    graph: Mapping,
    *,
    api: Mapping | None = None,
    batch: int | None = None,
    serving: Mapping | None = None,
    measured: Mapping | None = None,
) -> dict:
    """One agent graph (MODEL.md §6) at one (model, GPU, I, O), through the same jitted grid as :func:`sweep`,
    with where the winner flips: the graph itself, then the same graph over calls per stage
    (1 … 8192) and over the API's RPM (1 … 10^6 and unlimited), all as one agent axis.

    ``graph`` takes the sweep file's graph keys (stages, calls_per_stage, parallelism, tool_delay_s, and
    API overrides), ``api`` the API keys, ``batch`` the local slot limit (default: the graph's
    parallelism). Returns {"at": {variable: value}, "calls": DataFrame, "rpm": DataFrame, "flips": {...}}.
    """
    from .inputs.agents import agents_block

    base = agents_block({"api": dict(api or {}), "g": dict(graph)})
    settings = base.table["g"]
    n, p = int(settings["calls_per_stage"]), settings["parallelism"]
    given_p = "parallelism" in graph
    calls = np.unique(np.concatenate([np.round(np.geomspace(1, 8192, 60)), [n]])).astype(int)
    rpms = np.concatenate([np.geomspace(1, 1e6, 61), [np.inf]])
    graphs = {"at": dict(graph)}
    for c in calls:
        graphs[f"calls={c}"] = {**graph, "calls_per_stage": int(c), **({} if given_p else {"parallelism": int(c)})}
    for r in rpms:
        graphs[f"rpm={r:g}"] = {**graph, "api": {**dict(graph.get("api") or {}), "rpm": float(r)}}
    limit = int(batch) if batch is not None else int(min(p, 1 << 20)) if np.isfinite(p) else n
    spec = dict(
        models=[model],
        gpus=[gpu],
        batch=[limit],
        input_len=[input_len],
        output_len=[output_len],
        advisor=False,
        precision="float64",
        serving=dict(serving or {}),
        agents={"api": dict(api or {}), **graphs},
    )
    if measured is not None:
        spec["measured"] = dict(measured)
    ds = sweep(spec, quiet=True).isel(model=0, gpu=0, batch=0, input_len=0, output_len=0)
    names = [v for v in ds.data_vars if v.startswith("agent_")]
    at = {k: ds[k].sel(agent="at").item() for k in names}
    at.update({k: ds[k].item() for k in ("n_gpu", "max_seqs", "weights_bytes", "kv_pool_bytes")})
    at["slots"] = min(limit, at["max_seqs"])

    def frame(prefix, values, column):
        labels = [f"{prefix}={v:g}" if prefix == "rpm" else f"{prefix}={v}" for v in values]
        sub = ds.sel(agent=labels)
        return pd.DataFrame({column: values, **{k: sub[k].values for k in names}})

    by_calls, by_rpm = frame("calls", calls, "calls_per_stage"), frame("rpm", rpms, "rpm")

    def flip(df, key, column):
        change = np.flatnonzero(np.diff(df[key].to_numpy()) != 0)
        return (
            None
            if not change.size
            else (
                df[column].iloc[change[0]],
                df[column].iloc[change[0] + 1],
                WINNER_NAMES[int(df[key].iloc[change[0] + 1])],
            )
        )

    flips = {
        "faster_by_calls": flip(by_calls, "agent_faster", "calls_per_stage"),
        "cheaper_by_calls": flip(by_calls, "agent_cheaper", "calls_per_stage"),
        "faster_by_rpm": flip(by_rpm, "agent_faster", "rpm"),
    }
    return {"at": at, "calls": by_calls, "rpm": by_rpm, "flips": flips, "settings": settings, "batch": limit}


WINNER_NAMES = ("local", "api")
API_LIMIT_NAMES = ("spacing", "parallelism", "service")


def agent_cards(result: Mapping) -> list[tuple[str, str]]:
    """(label, text) cards of :func:`agent`'s result (MODEL.md §6); +inf reads "does not fit"."""
    from .constants import PRICE_DATE

    at, flips = result["at"], result["flips"]
    local_fits = np.isfinite(at["agent_local_s"])
    cards = [
        (
            "Local replica",
            f"{int(at['n_gpu'])} GPU(s), {int(at['slots'])} slots (batch limit {result['batch']}, "
            f"max_seqs {int(at['max_seqs'])})"
            if local_fits
            else "does not fit (no slots)",
        ),
        ("Local time T_local", _quantity(at["agent_local_s"], "s") if local_fits else "not runnable (does not fit)"),
        (
            "Dependency bound",
            _quantity(at["agent_dependency_bound_s"], "s") if local_fits else "not runnable (does not fit)",
        ),
        (
            "API time T_api",
            f"{_quantity(at['agent_api_s'], 's')} (bound by {API_LIMIT_NAMES[int(at['agent_api_limit'])]})",
        ),
        ("Local cost", f"${at['agent_local_cost_usd']:,.4f}" if local_fits else "not runnable (does not fit)"),
        ("API cost", f"${at['agent_api_cost_usd']:,.4f}"),
        ("Faster", WINNER_NAMES[int(at["agent_faster"])]),
        ("Cheaper", WINNER_NAMES[int(at["agent_cheaper"])]),
    ]
    for key, label, unit in (
        ("faster_by_calls", "Faster flips", "calls per stage"),
        ("cheaper_by_calls", "Cheaper flips", "calls per stage"),
        ("faster_by_rpm", "Faster flips", "API RPM"),
    ):
        f = flips[key]
        cards.append(
            (
                f"{label} ({unit})",
                "never over the range searched"
                if f is None
                else f"between {f[0]:g} and {f[1]:g} {unit}: {f[2]} from there on",
            )
        )
    cards.append(("Prices", f"illustrative, dated {PRICE_DATE} (GPU catalog, API defaults; editable)"))
    return cards


def _quantity(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "n/a"
    if isinstance(value, float) and np.isinf(value):
        return "Unbounded"
    if unit == "bytes":
        for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{value / size:,.4g} {name} ({value:,.0f} bytes)"
        return f"{value:,.0f} bytes"
    if unit == "s":
        for name, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
            if abs(value) >= scale:
                return f"{_number(value / scale)} {name}"
        return "0 s" if value == 0 else "< 1 ns"
    if unit == "1":
        return _number(value) if value > 1 else "< 0.01%" if 0 < value < 1e-4 else f"{value:.2%}"
    return f"{_number(value)} {unit}"


def _number(value: float) -> str:
    """Four significant figures with thousands separators, never an exponent for the sizes cards show."""
    if value == 0 or not np.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    digits = max(0, 3 - int(np.floor(np.log10(abs(value)))))
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:,.0f}"


CARDS = (
    ("n_gpu", "GPUs in the group"),
    ("weights_bytes", "Weights"),
    ("kv_pool_bytes", "KV pool"),
    ("kv_bytes_per_token", "KV bytes per token"),
    ("seq_footprint_bytes", "Footprint per sequence"),
    ("max_seqs", "Max concurrent sequences"),
    ("ttft_s", "TTFT"),
    ("itl_s", "ITL"),
    ("itl_chunk_s", "ITL with an interleaved chunk"),
    ("service_s", "Service time S(B)"),
    ("request_rate", "Request rate"),
    ("token_throughput", "Token throughput"),
    ("utilization", "Utilization"),
    ("p_wait", "P(wait)"),
    ("wait_s", "Wait"),
    ("response_s", "Response"),
    ("in_system", "In system"),
)


BATCH_CARDS = ("ttft_s", "itl_s", "itl_chunk_s", "service_s", "request_rate", "token_throughput")  # at B itself
QUEUE_CARDS = ("utilization", "p_wait", "wait_s", "response_s", "in_system")  # of a batch limit that fits


def _runs(result: Mapping[str, float]) -> tuple[bool, bool]:
    """(the configuration fits: pool > 0 and max_seqs ≥ 1, the batch fits: B ≤ max_seqs) (MODEL.md §4c)."""
    if "fits" not in result:
        return True, True
    return result["max_seqs"] >= 1, bool(result["fits"])


def capacity_verdict(result: Mapping[str, float], input_len: int, output_len: int) -> str | None:
    """None when the configuration runs at its batch; else why not, in words: weights against usable
    memory and the smallest ``n_gpu`` that fits, or how many sequences the KV pool holds (MODEL.md §4c)."""
    config_fits, batch_fits = _runs(result)
    if batch_fits:
        return None
    weights, pool, seqs = result["weights_bytes"], result["kv_pool_bytes"], int(result["max_seqs"])
    n, need = int(result.get("n_gpu", 0)), int(result.get("n_gpu_to_fit_batch", result.get("n_gpu_to_fit", 0)))
    batch = result.get("batch")
    fix = (
        f"the smallest --n-gpu that fits {'this batch' if batch is None else f'batch {int(batch)}'} is {need}"
        if need
        else "no tensor-parallel group of 1, 2, 4 or 8 of these GPUs fits it"
    )
    if config_fits:
        return (
            f"batch does not fit: the KV pool {_quantity(pool, 'bytes')} holds {seqs:,} "
            f"sequence{'s' if seqs != 1 else ''} "
            f"of {input_len + output_len:,} tokens ({_quantity(result['seq_footprint_bytes'], 'bytes')} each); "
            f"run at most "
            f"{seqs:,} at once, or {fix}"
        )
    if not n:
        return (
            f"does not fit: no tensor-parallel group of 1, 2, 4 or 8 of these GPUs holds its weights "
            f"({_quantity(weights, 'bytes')}) and one sequence of {input_len + output_len} tokens (n_gpu: auto "
            f"found none)"
        )
    if pool <= 0:
        usable = pool + weights  # u·M − M_R
        why = (
            f"weights {_quantity(weights, 'bytes')} exceed usable memory {_quantity(usable, 'bytes')} "
            f"(u·M − M_R on {n} GPU{'s' if n > 1 else ''}) by {_quantity(-pool, 'bytes')}"
        )
    else:
        why = (
            f"the KV pool {_quantity(pool, 'bytes')} is smaller than one sequence of {input_len + output_len} tokens "
            f"({_quantity(result['seq_footprint_bytes'], 'bytes')})"
        )
    return f"does not fit: {why}; {fix}"


def capacity_cards(result: Mapping[str, float]) -> list[tuple[str, str]]:
    """(label, value with units) for each calculator card present in ``result``; +inf reads "Unbounded"."""
    cards = []
    config_fits, batch_fits = _runs(result)
    for key, label in CARDS:
        if key in result:
            unit = VARIABLES[key].units
            value = result[key]
            if key == "n_gpu":
                text = f"{int(value)}" if value else "none of 1, 2, 4, 8 fits"
            elif key == "max_seqs":
                text = f"{int(value):,}"
            elif key == "kv_pool_bytes" and value <= 0:  # no negative size: say what it means
                text = f"none: weights exceed usable memory by {_quantity(-float(value), unit)}"
            else:
                text = _quantity(float(value), unit)
            if not batch_fits and (key in BATCH_CARDS or key in QUEUE_CARDS):
                # no number for what cannot happen, nor a queue without its service time
                text = "not runnable (does not fit)"
            cards.append((label, text))
    return cards
