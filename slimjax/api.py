"""The library entry points: ``sweep`` (grid → Dataset/zarr), ``point`` (one scalar evaluation), ``summary``,
``procure`` (a procurement study, MODEL.md §8)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import xarray as xr

from .config import float64_scope
from .engine import dataset, grid
from .engine.groups import variable_names
from .engine.schema import DIMS
from .errors import SlimjaxError, option
from .inputs import sweepfile
from .inputs.sweepfile import Sweep
from .report.cards import (  # noqa: F401  (entry points: the text of results lives on the report floor)
    agent_cards,
    agent_flips,
    agent_table,
    capacity_cards,
    capacity_verdict,
    summary,
)
from .report.progress import progress as report_progress
from .store import sink as store
from .studies import procure as procurement
from .studies import specs
from .studies.procure import screen as procurement_screen  # noqa: F401  (registers the procurement kind with the engine)

DEFAULT_MEMORY_BUDGET = 256 << 20  # bytes of working memory for one block
COUNTED = ("slim_at_floor",)  # flags whose set cells a sweep counts into the variable's attrs (nonzero, cells)


def parse(spec: str | os.PathLike | Mapping | Sweep) -> Sweep:
    """Validate a sweep file (path) or mapping into a :class:`Sweep`, reading a calibrated coefficient
    store where ``slim`` names one (a Sweep already read is returned as it is)."""
    return spec if isinstance(spec, Sweep) else specs.read_sweep(spec)


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
                f"write it to a store ({option('out')}) or sample the axes",
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


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How an evaluation runs through the engine (:func:`sweep`, :func:`procure`): the store (``overwrite``,
    ``resume``, ``compression``), working memory per block, progress (``quiet``: None shows a bar on a terminal,
    False also lines elsewhere, :func:`slimjax.report.progress.progress`),
    and the scheduler (``local``, or ``dask`` on ``workers`` local processes or the cluster at
    ``dask_address``)."""

    overwrite: bool = False
    memory_budget_bytes: float = DEFAULT_MEMORY_BUDGET
    quiet: bool | None = None
    resume: bool = False
    compression: str = "none"
    scheduler: str = "local"
    workers: int | None = None
    dask_address: str | None = None

    @classmethod
    def of(cls, given: dict, **defaults) -> EngineOptions:
        """From an entry point's keyword arguments (``defaults`` its own defaults); an unknown one is named."""
        names = {f.name for f in dataclasses.fields(cls)}
        for k in given:
            if k not in names:
                raise SlimjaxError(k, f"not an engine option (one of {', '.join(sorted(names))})")
        return cls(**{**defaults, **given})

    def check(self, out) -> None:
        """The options that contradict each other or the target, named before any work."""
        if self.scheduler not in ("local", "dask"):
            raise SlimjaxError("scheduler", f"must be 'local' or 'dask', got {self.scheduler!r}")
        if self.scheduler == "dask" and out is None:
            raise SlimjaxError("scheduler", f"a Dask sweep writes to a store: give {option('out')}")
        if self.resume and out is None:
            raise SlimjaxError("resume", f"continues an interrupted store: give its {option('out')}")
        if self.dask_address is not None and self.scheduler != "dask":
            raise SlimjaxError("--dask-address", "is for --scheduler dask")


def sweep(spec: str | os.PathLike | Mapping | Sweep, out: str | os.PathLike | None = None, **engine) -> xr.Dataset:
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
    ``engine``: the :class:`EngineOptions` fields.
    """
    given = spec if isinstance(spec, Sweep) else None
    return _evaluate(given, lambda: parse(spec), out, EngineOptions.of(engine))


def _evaluate(given, parse_it, out, options: EngineOptions) -> xr.Dataset:
    """Any kind of evaluation (a Sweep, a procurement Study) through the engine: the block plan under the
    memory budget, in memory or to a journaled store (resume, verify), locally or on Dask; one Dataset
    builder and one attrs path. ``given`` is the parsed input, or None to ``parse_it()`` (inside float64)."""
    options.check(out)
    if options.dask_address is not None:
        from .store.distributed import check_address

        check_address(options.dask_address)  # before any store is made: a failed connect leaves nothing behind
    memory_budget_bytes, quiet, resume = options.memory_budget_bytes, options.quiet, options.resume
    compression, scheduler, workers = options.compression, options.scheduler, options.workers
    target = store.check_target(out, options.overwrite, resume) if out is not None else None
    with float64_scope():
        sw = given if given is not None else parse_it()
        _check_room(sw, target)
        names = variable_names(sw)
        block_plan = grid.plan(sw, memory_budget_bytes)
        attrs = dataset.dataset_attrs(sw, block_plan)
        var_attrs = {n: dataset.variable_attrs(sw, n) for n in names}
        # a procurement's screen runs on the same block engine: named as what the user ran
        progress = report_progress(quiet, "slimjax sweep" if sw.kind == "sweep" else "slimjax screen", "block")
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

                        evaluate_on_dask(
                            sw, block_plan, sink, workers=workers, address=options.dask_address, progress=progress
                        )
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
    spec: str | os.PathLike | Mapping | procurement.Study, out: str | os.PathLike | None = None, **engine
) -> xr.Dataset:
    """A procurement study (MODEL.md §8) from a procurement file (path), mapping or parsed
    :class:`~slimjax.studies.procure.Study`: every (GPU, TP, batch limit) candidate per workload,
    rate and model, the cheapest feasible choice and the per-class mix. It runs through the same engine
    as :func:`sweep` — block plan under ``memory_budget_bytes``, a journaled store at ``out`` (atomic,
    ``resume`` after an interruption, ``slimjax verify``), ``scheduler="dask"`` — with the same options.
    Print it with :func:`procure_tables`.

    The fleet is sized by simulation (MODEL.md §8 "Sizing by simulation", the study's ``sizing``): the screen
    runs in memory, then every candidate's R_sim is searched on the workload's own stream and the Dataset (cost,
    choice, mix on R_sim; the screen's R as ``replicas_screen``) is written to ``out`` at the end, atomically.
    Sized, it is kept part by part (workload × rate, and engine setting) as each finishes, so ``resume`` computes
    only the parts a killed run had not; Dask applies to ``sizing: screen``, the closed form alone. With ``settings``
    (engine configurations, docs/engines.md) the study runs once per setting, its variables along dim ``setting``
    with ``best_setting``.
    ``engine``: the :class:`EngineOptions` fields (``quiet`` defaults to True here)."""
    options = EngineOptions.of(engine, quiet=True)
    if out is not None:  # before any work, the study's own checks included
        store.check_target(out, options.overwrite, options.resume)
    with float64_scope():
        study = spec if isinstance(spec, procurement.Study) else procurement.parse(spec)
    if not study.variants:
        return _procured(study, out, options)
    # engine settings as candidates (docs/engines.md): the study once per setting, along dim ``setting``
    from .studies.procure import variants

    labels, studies = [label for label, _ in study.variants], [v for _, v in study.variants]
    if study.sizing["method"] == "screen":
        _journal_options_refused(options, "a study without engine settings, or one sized by simulation")
        target = store.check_target(out, options.overwrite) if out is not None else None
        ds = variants.combine([_procured(v, None, options) for v in studies], labels)
        if target is not None:
            store.write_dataset(ds, target)
        return ds
    return _sized_studies(studies, out, options, lambda parts: variants.combine(parts, labels))


def _procured(study, out, options) -> xr.Dataset:
    """One procurement study (no engine settings to sweep) run and, where ``out`` is given, stored."""
    if study.sizing["method"] == "screen":
        return _evaluate(study, None, out, options)
    return _sized_studies([study], out, options, lambda parts: parts[0])


def _sized_studies(studies, out, options, combine) -> xr.Dataset:
    """Studies sized by simulation (one, or one per engine setting), ``combine``d and, where ``out`` is given, stored:
    every study's screen in memory, then each (study, workload, rate) part sized and kept as it finishes in one journal
    (:class:`slimjax.store.parts.PartsJournal`), so ``resume`` computes only the parts a killed run had not finished;
    the progress counts those parts."""
    options.check(out)
    # a sized study resumes from its parts' journal (store.parts), but the Dask scheduler runs the screen's blocks only
    _journal_options_refused(options, "the screen alone: give sizing: screen, or run sized without it", ("scheduler",))
    from .store.parts import STORED_PARTS, PartsJournal, PartsSection
    from .studies.procure import sizing

    target = store.check_target(out, options.overwrite, options.resume) if out is not None else None
    screens = [_evaluate(s, None, None, dataclasses.replace(options, resume=False)) for s in studies]
    counts = [len(sizing.size_parts(s)) for s in studies]
    journal = None
    if target is not None:  # each part kept as it finishes: --resume computes only the rest
        hashes = " ".join(screen.attrs["sweep_hash"] for screen in screens)
        key = f"{hashes} {json.dumps(studies[0].sizing, sort_keys=True, default=str)}"
        journal = PartsJournal(target, key, sum(counts), options.resume)
    progress = report_progress(options.quiet, "slimjax sizing", "part", total=sum(counts))
    simulations = [0]

    def simulated(n: int) -> None:  # within a part: the simulations run so far, in the description
        simulations[0] += n
        progress.set_description(f"slimjax sizing ({simulations[0]:,} simulations)")
        progress.update(0)

    sized = []
    try:
        with float64_scope():
            for k, (study, screen) in enumerate(zip(studies, screens, strict=True)):
                section = None if journal is None else PartsSection(journal, sum(counts[:k]), counts[k])
                ds = sizing.size(
                    study,
                    screen,
                    None if progress is None else simulated,
                    section,
                    None if progress is None else progress.update,
                )
                if study.deployments:  # disaggregated prefill/decode pairs beside the aggregated fleet (MODEL.md §10)
                    from .studies import disaggregated

                    ds = disaggregated.size_study(study, ds)
                sized.append(ds)
    finally:
        if progress is not None:
            progress.close()
    ds = combine(sized)
    if target is not None:
        store.write_dataset(ds.assign_attrs({STORED_PARTS: sum(counts)}), target)
        journal.close()
    return ds


def _journal_options_refused(options, applies_to: str, flags=("resume", "scheduler")) -> None:
    """``resume`` and the Dask scheduler need the block engine's journal: refused (naming the flag) elsewhere; ``flags``
    the ones refused here."""
    given = {"resume": options.resume, "scheduler": options.scheduler == "dask"}
    for flag in flags:
        if given[flag]:
            raise SlimjaxError(flag, f"applies to {applies_to}")


def simulate(
    spec, out: str | os.PathLike | None = None, *, overwrite: bool = False, quiet: bool | None = None
) -> xr.Dataset:
    """Trace-driven continuous batching (MODEL.md §9) from a simulation file (path) or mapping (keys in
    :mod:`slimjax.studies.simulate.spec`): every (model, GPU, TP, [engine setting,] batch limit) candidate × replicas
    (× clients of a closed loop) serves the stream; per-request TTFT, E2E, TPOT and the §9 summaries. ``out``: a zarr
    store, written atomically (an existing one is kept unless ``overwrite``). Progress as :func:`sweep`'s (one
    part per replica count and client count, every candidate at once)."""
    from .studies import simulate as simulation

    target = store.check_target(out, overwrite) if out is not None else None
    sim = spec if isinstance(spec, simulation.Simulation) else simulation.parse(spec)
    progress = report_progress(quiet, "slimjax simulate", "run")
    try:
        ds = simulation.run(sim, progress)
    finally:
        if progress is not None:
            progress.close()
    if target is not None:
        store.write_dataset(ds, target)
    return ds


def simulation_table(ds: xr.Dataset) -> str:
    """One line per simulated candidate: p50/p90 TTFT, p90 TPOT, mean E2E, utilisation, peak queue (the
    ``simulation`` study's text, :mod:`slimjax.studies.simulate.present`)."""
    return study_text(ds)


def study_text(ds: xr.Dataset) -> str:
    """The text the command line prints for a study's Dataset, looked up by its ``kind`` attr (the studies'
    registry directly: printing a table draws nothing, so the report and matplotlib are not imported)."""
    from .studies.present import study_kinds

    kind = study_kinds().get(ds.attrs.get("kind"))
    if kind is None or kind.text is None:
        raise SlimjaxError("kind", f"no study prints a Dataset of kind {ds.attrs.get('kind')!r}")
    return kind.text(ds)


def procure_tables(ds: xr.Dataset, top: int = 5, infeasible: int = 3) -> str:
    """The study's ranked tables as text (:func:`slimjax.studies.procure.tables.ranked_tables`)."""
    return procurement.tables.ranked_tables(ds, top=top, infeasible=infeasible)


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
        if not result["n_gpu_to_fit_batch"]:  # no tensor-parallel group: the fewest pipeline stages of node-wide ones
            tp, pp = sweepfile.smallest_stages_for_batch(sw, input_len + output_len, batch)
            result["tp_pp_to_fit_batch"] = (float(tp[0, 0]), float(pp[0, 0]))
        table = sw.serving_table[sw.models[0]][sw.gpus[0]]
        result["efficiency"] = table["efficiency"]  # with its constants' source
        result["dp"] = float(table.get("dp", 1))  # the group is n_tp·n_pp·D GPUs (docs/layouts.md)
        if float(table.get("speculative_tokens", 0)) > 0:  # docs/speculative.md: said beside the times it moves
            result["speculative"] = (
                f"{table['speculative_method']}, {int(table['speculative_tokens'])} draft tokens, "
                f"{float(table['acceptance_length']):g} accepted a step"
            )
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
    sw = parse(spec)
    ds = sweep(sw, quiet=True).isel(model=0, gpu=0, batch=0, input_len=0, output_len=0)
    at, by_calls, by_rpm, flips = agent_flips(ds, calls, rpms)
    at["slots"] = min(limit, at["max_seqs"])
    efficiency = sw.serving_table[sw.models[0]][sw.gpus[0]]["efficiency"]
    return {
        "at": at,
        "calls": by_calls,
        "rpm": by_rpm,
        "flips": flips,
        "settings": settings,
        "batch": limit,
        "efficiency": efficiency,
        "assumptions": json.loads(ds["agent_local_s"].attrs.get("assumptions", "[]")),
    }


class Calibrated(NamedTuple):
    """What :func:`calibrate_files` did: the coefficients' Dataset (written to its store), a line per trace file
    read, the fitted groups' table, and the transfer intervals' form errors (None unless asked for)."""

    dataset: xr.Dataset
    read: list[str]
    groups: object  # pandas DataFrame: n_points, MAPE and convergence per fitted group
    transfer: object | None


def calibrate_files(
    traces: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    format: str | None = None,
    overwrite: bool = False,
    intervals: str = "fit",
    said=None,
    **fit,
) -> Calibrated:
    """Fit SLIM's coefficients per group of the measured ``traces`` (files, merged) in one batched solve and
    write them to the store ``out``; ``fit``: :func:`slimjax.fit.slim.calibrate`'s options (group_by, solver,
    variant, loss, bootstrap). The target is checked before anything is read; ``said`` is given each file's read
    line as it is read."""
    from .fit.slim import calibrate
    from .fit.transfer import form_error_table
    from .inputs.traces import load_many

    target = store.check_target(out, overwrite)
    frame, read = load_many(traces, format, said)
    ds = calibrate(frame, intervals=intervals, **fit)
    store.write_dataset(ds, target)
    groups = ds[["n_points", "mape_throughput", "mape_e2e", "converged"]].to_dataframe()
    groups = groups[groups.n_points > 0]
    return Calibrated(ds, read, groups, form_error_table(ds) if intervals == "transfer" else None)


class Validation(NamedTuple):
    """What :func:`validate` measured: a line per trace file read, the error table (a DataFrame) and it as
    Markdown, every scored or held-out row (a DataFrame), and the rows left out with why."""

    read: list[str]
    table: object
    markdown: str
    rows: object
    dropped: dict


def validate(
    traces: Sequence[str | os.PathLike] = (),
    *,
    format: str | None = None,
    serving: bool = False,
    methods: Sequence[str] | None = None,
    scenarios: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    requests_per_client: int | None = None,
    said=None,
) -> Validation:
    """The SLIM paper's generalization study on measured ``traces`` (default: LLM-Inference-Bench and its TTFT
    table under $SLIMJAX_DATA or ../shared/data): held-out MAPE of throughput / E2E per scenario and method.
    ``serving``: the §9 simulation (a closed loop at each row's concurrency; a disaggregated row's through §10's two
    pools) scored against measured TTFT and TPOT instead, with its MAPE and bias per engine, model, layout kind, GPU,
    TP, precision and concurrency band (default: the shared serving runs). ``said`` is given each file's read line
    as it is read."""
    from .fit import validate as study
    from .inputs.traces import load_many

    paths = list(traces) or (study.default_serving_paths() if serving else study.default_trace_paths())
    for p in paths:
        if not os.path.exists(p):
            raise SlimjaxError("traces", f"{p} not found (give a trace file, or set SLIMJAX_DATA)")
    frame, read = load_many(paths, format, said)
    if serving:
        import pandas as pd

        from .inputs.traces import AGGREGATED_REASON, load_traces, read_line
        from .studies.serving_check import error_markdown, error_table, simulate_disaggregated_rows, simulate_rows

        # the disaggregated deployments the same files hold run through §10's closed loop (docs/layouts.md); a file
        # that holds none says nothing more
        apart = pd.DataFrame()
        for p in paths:
            got = load_traces(p, format=format, disaggregated=True)
            if len(got) or set(got.attrs["dropped"]) - {AGGREGATED_REASON}:
                read.append(f"{read_line(p, got)} (disaggregated)")
                if said is not None:
                    said(read[-1])
                apart = pd.concat([apart, got], ignore_index=True) if len(apart) else got
        parts = [
            score(rows, requests_per_client=requests_per_client)
            for rows, score in ((frame, simulate_rows), (apart, simulate_disaggregated_rows))
            if len(rows)
        ]
        if not parts:
            raise SlimjaxError("traces", f"no row of {', '.join(map(str, paths))} can be scored (see what was dropped)")
        scored = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        table = error_table(scored)
        return Validation(read, table, error_markdown(table), scored, {})
    options = {k: v for k, v in (("methods", methods), ("scenarios", scenarios)) if v is not None}
    result = study.validate(frame, exclude=exclude, **options)
    return Validation(read, result.table, study.markdown_table(result.table), result.predictions, result.dropped)


def verify_store(path: str | os.PathLike) -> dict:
    """A sweep store (or its .partial) checked against its block journal: blocks recorded and missing,
    chunks whose CRC32 differs (:func:`slimjax.store.sink.verify`); a procurement sized by simulation and
    interrupted, its parts counted (:func:`slimjax.store.parts.verify_parts`, ``unit`` "parts")."""
    from .store.parts import verify_parts

    counted = verify_parts(path)
    return store.verify(path) if counted is None else counted


def check_output_file(path: str | os.PathLike, field: str = "out") -> None:
    """That a file can be written at ``path`` (before any work), else a SlimjaxError naming ``field``."""
    store.check_output_file(path, field)


def check_output_dir(path: str | os.PathLike, field: str = "out") -> None:
    """That a folder can be written at ``path`` (before any work), else a SlimjaxError naming ``field``."""
    store.check_output_dir(path, field)


def check_at(sw: Sweep, at: tuple[int, int] | None, field: str = "at") -> None:
    """That the (input_len, output_len) pair ``at`` lies on the sweep's grid (before any work)."""
    if at is not None:
        from .inputs.axes import on_grid_lengths

        on_grid_lengths(sw.input_len, sw.output_len, *at, field=field)


def serving_keys() -> dict:
    """The serving table (:data:`slimjax.inputs.serving.SERVING`): key -> row (flag, type, help, auto)."""
    from .inputs.serving import SERVING

    return SERVING
