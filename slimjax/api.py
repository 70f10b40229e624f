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
from .inputs.sweepfile import Sweep
from .store import coefficients as coefficient_store
from .store import sink as store
from .studies import procure as procurement

DEFAULT_MEMORY_BUDGET = 256 << 20  # bytes of working memory for one block


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


def sweep(spec: str | os.PathLike | Mapping | Sweep, out: str | os.PathLike | None = None, *, overwrite: bool = False,
          memory_budget_bytes: float = DEFAULT_MEMORY_BUDGET, quiet: bool | None = None) -> xr.Dataset:
    """Evaluate a sweep (file path, mapping or parsed :class:`Sweep`) over its dense grid.

    With ``out``, the Dataset is written to a zarr store (atomically; an existing store is replaced
    only with ``overwrite``) and returned opened lazily from it; without, it is built in memory.
    Working memory stays under ``memory_budget_bytes`` per block (plus the result itself in memory).
    """
    target = store.check_target(out, overwrite) if out is not None else None
    with float64_scope():
        sw = spec if isinstance(spec, Sweep) else parse(spec)
        names = variable_names(sw)
        block_plan = grid.plan(sw, memory_budget_bytes)
        attrs = dataset.dataset_attrs(sw, block_plan)
        var_attrs = {n: dataset.variable_attrs(sw, n) for n in names}
        progress = _progress(quiet)
        try:
            if target is None:
                sink = dataset.MemorySink(sw, names)
                grid.evaluate(sw, block_plan, sink, progress=progress)
                return dataset.in_memory_dataset(sw, sink.arrays, attrs, var_attrs)
            variables = {n: (VARIABLES[n].dims, grid.variable_dtype(sw, n), block_plan.chunks(VARIABLES[n].dims), var_attrs[n])
                         for n in names}
            with store.sigterm_as_exit():
                sink = store.ZarrSink(target, sw.coords, {d: DIMS[d].attrs for d in sw.coords}, variables, attrs)
                try:
                    grid.evaluate(sw, block_plan, sink, progress=progress)
                    sink.commit()
                except BaseException:
                    sink.abort()
                    raise
            return dataset.canonical(store.open_store(target))
        finally:
            if progress is not None:
                progress.close()


def procure(spec: str | os.PathLike | Mapping | procurefile.Study, out: str | os.PathLike | None = None, *,
            overwrite: bool = False) -> xr.Dataset:
    """A procurement study (MODEL.md §8) from a procurement file (path), mapping or parsed
    :class:`~slimjax.inputs.procurefile.Study`: every (GPU, TP, batch limit) candidate per workload,
    rate and model, the cheapest feasible choice and the per-class mix. With ``out`` the Dataset is
    also written to a zarr store (atomically; an existing one replaced only with ``overwrite``).
    Print it with :func:`procure_tables`."""
    target = store.check_target(out, overwrite) if out is not None else None
    with float64_scope():
        study = spec if isinstance(spec, procurefile.Study) else procurefile.parse(spec)
        ds = procurement.evaluate(study)
    if target is not None:
        store.write_dataset(ds, target)
    return ds


procure_tables = procurement.ranked_tables


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
    def nearest(axis: str, target: float) -> int:
        values = ds[axis].values
        return int(values[np.argmin(np.abs(np.log(values) - np.log(target)))])

    i = nearest("input_len", 1024) if input_len is None else int(input_len)
    o = nearest("output_len", 256) if output_len is None else int(output_len)
    for axis, v in (("input_len", i), ("output_len", o)):
        if v not in ds[axis].values:
            raise SlimjaxError(axis, f"{v} is not on the grid ({', '.join(map(str, ds[axis].values))})")
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
                notes.append(f"{m}: I + O = {i + o} tokens is beyond its context (max_position_embeddings); "
                             "its figures are extrapolated")
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
    out["notes"] = pd.DataFrame({"note": notes})
    return out


def point(model, gpu, batch: int, input_len: int, output_len: int, *, slim: Mapping | None = None,
          precision: str = "float64") -> dict[str, float]:
    """Every SLIM variable at one point, through the same jitted grid evaluation as :func:`sweep`.

    ``model`` and ``gpu`` are anything a sweep file accepts (catalog name, config path, mapping).
    """
    spec = dict(models=[model], gpus=[gpu], batch=[batch], input_len=[input_len], output_len=[output_len],
                advisor=False, precision=precision)
    if slim is not None:
        spec["slim"] = slim
    ds = sweep(spec, quiet=True)
    return {k: float(ds[k].values.reshape(-1)[0]) for k in ds.data_vars}


def capacity(model, gpu, input_len: int, output_len: int, batch: int, *, arrival_rate: float | None = None,
             serving: Mapping | None = None, measured: Mapping | None = None) -> dict[str, float]:
    """The capacity calculator at one point (float64), through the same jitted grid as :func:`sweep`.

    ``serving`` takes the sweep file's serving keys, ``measured`` its four measured keys. Returns every
    §3–§5 variable (queue variables only with ``arrival_rate``) and the SLIM ones.
    """
    spec = dict(models=[model], gpus=[gpu], batch=[batch], input_len=[input_len], output_len=[output_len],
                advisor=False, precision="float64", serving=dict(serving or {}))
    if arrival_rate is not None:
        spec["arrival_rate"] = [arrival_rate]
    if measured is not None:
        spec["measured"] = dict(measured)
    ds = sweep(spec, quiet=True)
    return {k: ds[k].values.reshape(-1)[0].item() for k in ds.data_vars}


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
        return f"{value * 1e3:,.4g} ms" if abs(value) < 1 else f"{value:,.4g} s"
    if unit == "1":
        return f"{value:.4g}" if value > 1 or 0 < value < 1e-4 else f"{value:.2%}"
    return f"{value:,.4g} {unit}"


CARDS = (
    ("n_gpu", "GPUs in the group"), ("weights_bytes", "Weights"), ("kv_pool_bytes", "KV pool"), ("kv_bytes_per_token", "KV bytes per token"),
    ("seq_footprint_bytes", "Footprint per sequence"), ("max_seqs", "Max concurrent sequences"),
    ("ttft_s", "TTFT"), ("itl_s", "ITL"), ("itl_chunk_s", "ITL with an interleaved chunk"),
    ("service_s", "Service time S(B)"), ("request_rate", "Request rate"), ("token_throughput", "Token throughput"),
    ("utilization", "Utilization"), ("p_wait", "P(wait)"), ("wait_s", "Wait"), ("response_s", "Response"),
    ("in_system", "In system"),
)


BATCH_CARDS = ("ttft_s", "itl_s", "itl_chunk_s", "service_s", "request_rate", "token_throughput")  # at B itself
QUEUE_CARDS = ("utilization", "p_wait", "wait_s", "response_s", "in_system")  # at m = min(B, max_seqs) slots


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
    n, need = int(result.get("n_gpu", 0)), int(result.get("n_gpu_to_fit", 0))
    fix = (f"the smallest --n-gpu that fits is {need}" if need else
           "no tensor-parallel group of 1, 2, 4 or 8 of these GPUs fits it")
    if config_fits:
        return (f"batch does not fit: the KV pool {_quantity(pool, 'bytes')} holds {seqs} sequence{'s' if seqs != 1 else ''} "
                f"of {input_len + output_len} tokens ({_quantity(result['seq_footprint_bytes'], 'bytes')} each); run at most "
                f"{seqs} at once (the queue below uses min(B, max_seqs) = {seqs} slots)")
    if not n:
        return (f"does not fit: no tensor-parallel group of 1, 2, 4 or 8 of these GPUs holds its weights "
                f"({_quantity(weights, 'bytes')}) and one sequence of {input_len + output_len} tokens (n_gpu: auto found none)")
    if pool <= 0:
        usable = pool + weights  # u·M − M_R
        why = (f"weights {_quantity(weights, 'bytes')} exceed usable memory {_quantity(usable, 'bytes')} "
               f"(u·M − M_R on {n} GPU{'s' if n > 1 else ''})")
    else:
        why = (f"the KV pool {_quantity(pool, 'bytes')} is smaller than one sequence of {input_len + output_len} tokens "
               f"({_quantity(result['seq_footprint_bytes'], 'bytes')})")
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
            else:
                text = _quantity(float(value), unit)
            if (not batch_fits and key in BATCH_CARDS) or (not config_fits and key in QUEUE_CARDS):
                text = "not runnable (does not fit)"  # no number for what cannot happen
            cards.append((label, text))
    return cards
