"""The library entry points: ``sweep`` (grid → Dataset/zarr), ``point`` (one scalar evaluation), ``summary``."""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr
import yaml

from . import __version__, grid, store
from .catalog import PRICE_DATE
from .schema import ALL_VARIABLES, COORD_ATTRS, DIMS, ROOFLINE_ONLY
from .sweepfile import Sweep, parse

DEFAULT_MEMORY_BUDGET = 256 << 20  # bytes of working memory for one block


class _MemorySink:
    def __init__(self, sweep: Sweep, names: list[str]):
        coords = _coords(sweep)
        self.arrays = {
            n: np.empty(tuple(len(coords[d]) for d in ALL_VARIABLES[n][0]), dtype=_dtype(sweep, n)) for n in names
        }

    def write(self, name, region, values):
        self.arrays[name][region] = values


def _dtype(sweep: Sweep, name: str) -> np.dtype:
    return {"b_cap": np.dtype(np.int32), "b_cap_lo": np.dtype(np.int32), "b_cap_hi": np.dtype(np.int32),
            "max_seqs": np.dtype(np.int64)}.get(name, sweep.dtype)


def _coords(sweep: Sweep) -> dict[str, np.ndarray]:
    coords = {
        "model": np.asarray(sweep.models, dtype=str),
        "gpu": np.asarray(sweep.gpus, dtype=str),
        "batch": sweep.batch,
        "input_len": sweep.input_len,
        "output_len": sweep.output_len,
    }
    if sweep.arrival_rate is not None:
        coords["arrival_rate"] = sweep.arrival_rate
    return coords


def _var_attrs(sweep: Sweep, name: str, slo: np.ndarray | None) -> dict:
    dims, units, long_name = ALL_VARIABLES[name]
    attrs = {"units": units, "long_name": long_name}
    no_roofline = [m for m, mla, moe in zip(sweep.models, sweep.model.mla, sweep.model.moe) if mla or moe]
    if name in ROOFLINE_ONLY:
        attrs["mode"] = "roofline only (not measured mode, not used for the queue)"
    if no_roofline and (name in ROOFLINE_ONLY or name in ("itl_s", "ttft_s", "service_s", "request_rate", "token_throughput")
                        or (sweep.arrival_rate is not None and "arrival_rate" in dims)):
        attrs["nan_reason"] = (f"NaN for {', '.join(no_roofline)}: the roofline is a dense-decoder estimate, not "
                               "applicable to MoE or MLA models; give a measured block to use measured mode")
    if name in ("itl_s", "ttft_s", "service_s", "request_rate", "token_throughput") and sweep.measured is not None:
        pairs = [f"{m}/{g}" for i, m in enumerate(sweep.models) for j, g in enumerate(sweep.gpus)
                 if not np.isnan(sweep.measured.batch[i, j])]
        attrs["measured_mode"] = ", ".join(pairs)
    if name == "b_cap" and sweep.advisor is not None:
        attrs["epsilon"] = sweep.advisor.epsilon
        attrs["slo_s"] = json.dumps({m: {g: float(slo[i, j]) for j, g in enumerate(sweep.gpus)} for i, m in enumerate(sweep.models)})
        if sweep.advisor.slo_factor is not None:
            ref = sweep.advisor.slo_reference
            attrs["slo_rule"] = f"{sweep.advisor.slo_factor:g} x E2E(I={ref['input_len']}, O={ref['output_len']}, B={ref['batch']})"
        else:
            attrs["slo_rule"] = f"absolute {sweep.advisor.slo_s:g} s"
    return attrs


def _dataset_attrs(sweep: Sweep) -> dict:
    advisor = None if sweep.advisor is None else {
        "epsilon": sweep.advisor.epsilon, "slo_s": sweep.advisor.slo_s,
        "slo_factor": sweep.advisor.slo_factor, "slo_reference": sweep.advisor.slo_reference,
    }
    return {
        "slimjax_version": __version__,
        "sweep_file": sweep.source,
        "sweep_spec": yaml.safe_dump(sweep.spec, sort_keys=False),
        "slim_coefficients": json.dumps(sweep.coeffs_table),
        "slim_coefficients_source": sweep.coeffs_source,
        "advisor": json.dumps(advisor),
        "serving": json.dumps(sweep.serving_table),
        "measured": json.dumps(None if sweep.measured is None else {
            m: {g: {k: float(getattr(sweep.measured, k)[i, j]) for k in ("batch", "request_rate", "ttft_s", "itl_s")}
                for j, g in enumerate(sweep.gpus) if not np.isnan(sweep.measured.batch[i, j])}
            for i, m in enumerate(sweep.models) if not np.all(np.isnan(sweep.measured.batch[i]))}),
        "precision": sweep.precision,
        "price_date": PRICE_DATE,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _progress(quiet: bool | None):
    show = not quiet and sys.stderr.isatty() if quiet is not None else sys.stderr.isatty()
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(desc="slimjax sweep", unit="block", file=sys.stderr)


def sweep(spec: str | os.PathLike | Mapping | Sweep, out: str | os.PathLike | None = None, *, overwrite: bool = False,
          memory_budget_bytes: float = DEFAULT_MEMORY_BUDGET, quiet: bool | None = None) -> xr.Dataset:
    """Evaluate a sweep (file path, mapping or parsed :class:`Sweep`) over its dense grid.

    With ``out``, the Dataset is written to a zarr store (atomically; an existing store is replaced
    only with ``overwrite``) and returned opened lazily from it; without, it is built in memory.
    Working memory stays under ``memory_budget_bytes`` per block (plus the result itself in memory).
    """
    target = store.check_target(out, overwrite) if out is not None else None
    sw = spec if isinstance(spec, Sweep) else parse(spec)
    names = grid.variable_names(sw)
    slo = grid.slo_seconds(sw)
    attrs = _dataset_attrs(sw)
    coords = _coords(sw)
    var_attrs = {n: _var_attrs(sw, n, slo) for n in names}
    progress = _progress(quiet)
    try:
        if target is None:
            sink = _MemorySink(sw, names)
            grid.evaluate(sw, sink, memory_budget_bytes=memory_budget_bytes, progress=progress)
            ds = xr.Dataset(coords={k: (k, v, COORD_ATTRS[k]) for k, v in coords.items()}, attrs=attrs)
            return canonical(ds.assign({n: (ALL_VARIABLES[n][0], sink.arrays[n], var_attrs[n]) for n in names}))
        sizes = dict(model=len(sw.models), gpu=len(sw.gpus), input_len=len(sw.input_len), output_len=len(sw.output_len))
        block = grid.plan_blocks(sizes, grid.bytes_per_cell(sw), memory_budget_bytes)
        chunk = {"model": 1, "gpu": 1, "batch": len(sw.batch), "input_len": block["input_len"], "output_len": block["output_len"],
                 "arrival_rate": 0 if sw.arrival_rate is None else len(sw.arrival_rate)}
        variables = {n: (ALL_VARIABLES[n][0], _dtype(sw, n), tuple(chunk[d] for d in ALL_VARIABLES[n][0]), var_attrs[n]) for n in names}
        sink = store.ZarrSink(target, coords, COORD_ATTRS, variables, attrs)
        try:
            grid.evaluate(sw, sink, memory_budget_bytes=memory_budget_bytes, progress=progress)
            sink.commit()
        except BaseException:
            sink.abort()
            raise
        return canonical(store.open_store(target))
    finally:
        if progress is not None:
            progress.close()


def canonical(ds: xr.Dataset) -> xr.Dataset:
    """The same Dataset (no copies) with dims in MODEL.md §7 order and variables in schema order."""
    order = [d for d in (*DIMS, "arrival_rate") if d in ds.dims]
    out = xr.Dataset(coords={d: ds[d] for d in order}, attrs=ds.attrs)
    out = out.assign_coords({k: v for k, v in ds.coords.items() if k not in order})
    names = [n for n in ALL_VARIABLES if n in ds.data_vars] + [n for n in ds.data_vars if n not in ALL_VARIABLES]
    return out.assign({n: ds[n] for n in names})


def summary(ds: xr.Dataset, input_len: int | None = None, output_len: int | None = None) -> dict[str, pd.DataFrame]:
    """Per model × GPU at one (I, O): ``b_cap``, the throughput there, and the plateau throughput
    (the best SLIM throughput over the batch axis). (I, O) default to the grid values closest (in
    log scale) to a typical chat request, I = 1024, O = 256. Returns DataFrames (rows model,
    columns GPU) keyed by what they hold, and the (I, O) used under ``"at"``.
    """
    def nearest(axis: str, target: float) -> int:
        values = ds[axis].values
        return int(values[np.argmin(np.abs(np.log(values) - np.log(target)))])

    i = nearest("input_len", 1024) if input_len is None else int(input_len)
    o = nearest("output_len", 256) if output_len is None else int(output_len)
    for axis, v in (("input_len", i), ("output_len", o)):
        if v not in ds[axis].values:
            from .errors import SlimjaxError

            raise SlimjaxError(axis, f"{v} is not on the grid ({', '.join(map(str, ds[axis].values))})")
    at = ds.sel(input_len=i, output_len=o)
    tput = at["slim_throughput"].load()
    frame = lambda a: pd.DataFrame(np.asarray(a), index=list(ds["model"].values), columns=list(ds["gpu"].values))
    out = {"at": pd.DataFrame({"input_len": [i], "output_len": [o]}), "plateau_throughput": frame(tput.max("batch"))}
    if "b_cap" in ds:
        b_cap = at["b_cap"].load()
        out["b_cap"] = frame(b_cap)
        chosen = tput.sel(batch=xr.where(b_cap > 0, b_cap, ds["batch"].values[0])).where(b_cap > 0)
        out["throughput_at_b_cap"] = frame(chosen)
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
        return "n/a (roofline not applicable; give measured values)"
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
    ("weights_bytes", "Weights"), ("kv_pool_bytes", "KV pool"), ("kv_bytes_per_token", "KV bytes per token"),
    ("seq_footprint_bytes", "Footprint per sequence"), ("max_seqs", "Max concurrent sequences"),
    ("ttft_s", "TTFT"), ("itl_s", "ITL"), ("itl_chunk_s", "ITL with an interleaved chunk"),
    ("service_s", "Service time S(B)"), ("request_rate", "Request rate"), ("token_throughput", "Token throughput"),
    ("utilization", "Utilization"), ("p_wait", "P(wait)"), ("wait_s", "Wait"), ("response_s", "Response"),
    ("in_system", "In system"),
)


def capacity_cards(result: Mapping[str, float]) -> list[tuple[str, str]]:
    """(label, value with units) for each calculator card present in ``result``; +inf reads "Unbounded"."""
    from .schema import ALL_VARIABLES

    cards = []
    for key, label in CARDS:
        if key in result:
            unit = ALL_VARIABLES[key][1]
            value = result[key]
            cards.append((label, f"{int(value):,}" if key == "max_seqs" else _quantity(float(value), unit)))
    return cards
