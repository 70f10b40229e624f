"""Grid results as xarray: coordinates, attrs, the in-memory sink and the Dataset built around its
arrays without copies."""

from __future__ import annotations

import datetime
import json

import numpy as np
import xarray as xr
import yaml

from .._version import __version__
from ..inputs.catalog import PRICE_DATE
from ..inputs.sweepfile import Sweep
from .grid import schema, variable_dtype
from .groups import GROUPS
from .plan import BlockPlan
from .schema import DIMS, KIND_ATTRS, SCHEMAS, Variable, base_attrs


def variable_attrs(sweep, name: str) -> dict:
    """A variable's attrs: units and long name, the price date of what prices make, a coded variable's
    flags, and whatever its group adds."""
    var = schema(sweep)[name]
    attrs = base_attrs(var)
    group = GROUPS[var.group]
    if group.attrs is not None:
        attrs.update(group.attrs(sweep, name))
    return attrs


def sweep_hash(sweep: Sweep, block_plan: BlockPlan) -> str:
    """SHA-256 of the resolved sweep (coordinates, every spec leaf, coefficients, serving, measured points,
    agents, advisor, precision), the block plan and the slimjax version: what a resumed run must match."""
    import hashlib

    import jax

    h = hashlib.sha256(__version__.encode())
    for k, v in sweep.coords.items():
        h.update(k.encode())
        h.update(np.ascontiguousarray(v).tobytes())
    trees = (
        sweep.model,
        sweep.gpu,
        sweep.slim.coeffs,
        sweep.serving,
        sweep.measured,
        sweep.arrival_rate,
        sweep.tp_to_fit,
        sweep.slim.log_cov,
        sweep.slim.scatter,
        sweep.slim.form,
        None if sweep.agents is None else sweep.agents.spec,
    )
    for leaf in jax.tree_util.tree_leaves(trees):
        h.update(np.ascontiguousarray(np.asarray(leaf, np.float64)).tobytes())
    advisor = (
        None
        if sweep.advisor is None
        else (
            sweep.advisor.epsilon,
            sweep.advisor.slo_s,
            sweep.advisor.slo_factor,
            sorted(sweep.advisor.slo_reference.items()),
        )
    )
    h.update(repr((advisor, sweep.precision, block_plan.dims, sorted(block_plan.block.items()))).encode())
    if sweep.slim.variant != "slim":  # (a §1 sweep keeps the hash it had before variants existed)
        h.update(f"{sweep.slim.variant} {sweep.slim.bandwidth_exponent!r}".encode())
    return h.hexdigest()


def resolved_specs(sweep: Sweep) -> dict:
    """The specs the sweep evaluated, per label, in base units: {"models": {label: ModelSpec fields}, "gpus":
    {label: GPUSpec fields}, "serving": {model: {gpu: ServingSpec fields}}}. A report recomputes what it draws
    from these (inline models and GPUs included), never from a catalog lookup by label."""

    def row(spec, index) -> dict:
        fields = spec.fields() if hasattr(spec, "fields") else {f: getattr(spec, f) for f in spec.__dataclass_fields__}
        return {f: float(np.asarray(v)[index]) for f, v in fields.items()}

    return {
        "models": {m: row(sweep.model, i) for i, m in enumerate(sweep.models)},
        "gpus": {g: row(sweep.gpu, j) for j, g in enumerate(sweep.gpus)},
        "serving": {
            m: {g: row(sweep.serving, (i, j)) for j, g in enumerate(sweep.gpus)} for i, m in enumerate(sweep.models)
        },
    }


def dataset_attrs(x, block_plan: BlockPlan) -> dict:
    """The Dataset's attrs for its kind of evaluation (a sweep's, or a registered study's)."""
    return KIND_ATTRS[x.kind](x, block_plan)


def sweep_attrs(sweep: Sweep, block_plan: BlockPlan) -> dict:
    advisor = (
        None
        if sweep.advisor is None
        else {
            "epsilon": sweep.advisor.epsilon,
            "slo_s": sweep.advisor.slo_s,
            "slo_factor": sweep.advisor.slo_factor,
            "slo_reference": sweep.advisor.slo_reference,
        }
    )
    measured = sweep.measured
    return {
        "slimjax_version": __version__,
        "kind": "sweep",
        "sweep_file": sweep.source,
        "sweep_spec": yaml.safe_dump(sweep.spec, sort_keys=False),
        "slim_coefficients": json.dumps(sweep.slim.table),
        "slim_coefficients_source": sweep.slim.source,
        "slim_variant": sweep.slim.variant,
        **({"slim_bandwidth_exponent": sweep.slim.bandwidth_exponent} if sweep.slim.variant != "slim" else {}),
        "slim_coefficients_warnings": json.dumps(sweep.slim.notes),
        "advisor": json.dumps(advisor),
        "serving": json.dumps(sweep.serving_table),
        "measured": json.dumps(
            None
            if measured is None
            else {
                m: {
                    g: {k: float(getattr(measured, k)[i, j]) for k in ("batch", "request_rate", "ttft_s", "itl_s")}
                    for j, g in enumerate(sweep.gpus)
                    if not np.isnan(measured.batch[i, j])
                }
                for i, m in enumerate(sweep.models)
                if not np.all(np.isnan(measured.batch[i]))
            }
        ),
        "precision": sweep.precision,
        "specs": json.dumps(resolved_specs(sweep)),
        "price_date": PRICE_DATE,
        "block_plan": block_plan.to_attrs(),
        "sweep_hash": sweep_hash(sweep, block_plan),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


KIND_ATTRS["sweep"] = sweep_attrs


_HUGE = 2 * 2**20  # bytes: from here a result array is worth a huge-page mapping


def result_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised result array. A large one is an anonymous mapping advised for transparent huge pages:
    the block copies into fresh memory fault once per 2 MiB instead of once per 4 KiB page, which on this
    kind of machine is the difference between ~0.4 and ~12 GB/s (bench/RESULTS.md, issue 21)."""
    import math
    import mmap

    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _HUGE or dtype.kind not in "biuf" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, dtype)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buffer.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages: plain pages, same result
        pass
    return np.frombuffer(buffer, dtype).reshape(shape)


class MemorySink:
    """Result arrays in memory, written block by block."""

    def __init__(self, x, names: list[str]):
        coords = x.coords
        self.arrays = {
            n: result_array(tuple(len(coords[d]) for d in schema(x)[n].dims), variable_dtype(x, n)) for n in names
        }

    def write(self, name, region, values):
        self.arrays[name][region] = values


def in_memory_dataset(x, arrays: dict, attrs: dict, var_attrs: dict) -> xr.Dataset:
    """The Dataset around the sink's arrays (no copies)."""
    ds = xr.Dataset(coords={k: (k, v, DIMS[k].attrs) for k, v in x.coords.items()}, attrs=attrs)
    return canonical(ds.assign({n: (schema(x)[n].dims, a, var_attrs[n]) for n, a in arrays.items()}))


def canonical(ds: xr.Dataset) -> xr.Dataset:
    """The same Dataset (no copies) with dims in MODEL.md §7 order and variables in schema order."""
    order = [d for d in DIMS if d in ds.dims]
    out = xr.Dataset(coords={d: ds[d] for d in order}, attrs=ds.attrs)
    out = out.assign_coords({k: v for k, v in ds.coords.items() if k not in order})
    table = SCHEMAS.get(ds.attrs.get("kind", "sweep"), {})
    names = [n for n in table if n in ds.data_vars] + [n for n in ds.data_vars if n not in table]
    return out.assign({n: ds[n] for n in names})


def declared(var: Variable, values, without: tuple[str, ...] = (), attrs: dict | None = None) -> xr.Variable:
    """``values`` as the variable its row declares (:class:`~.schema.Variable`): its dims (less ``without``,
    dims a run does not have) and attrs (:func:`~.schema.base_attrs`, updated by ``attrs``) — the one way every
    kind's Dataset variables are made."""
    dims = tuple(d for d in var.dims if d not in without)
    return xr.Variable(dims, values, {**base_attrs(var), **(attrs or {})})
