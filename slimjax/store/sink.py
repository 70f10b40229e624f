"""Zarr stores: the only module that imports zarr.

A store is written into a temporary sibling folder and renamed into place only when complete, so a
failed or interrupted sweep never leaves a half-written store and never touches an existing one.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
from zarr.codecs import ZstdCodec

from ..errors import SlimjaxError


def check_target(out: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse, before any work, to replace an existing store without ``overwrite``."""
    path = Path(out)
    if path.exists() and not overwrite:
        raise SlimjaxError("out", f"{str(path)!r} already exists (pass overwrite=True / --overwrite to replace it)")
    if path.exists() and not (path / "zarr.json").exists() and not (path / ".zgroup").exists():
        raise SlimjaxError("out", f"{str(path)!r} exists and is not a zarr store; refusing to replace it")
    if not path.parent.exists():
        raise SlimjaxError("out", f"folder {str(path.parent)!r} does not exist")
    return path


class ZarrSink:
    """Creates every array up front (chunked like the evaluation blocks), takes block writes."""

    def __init__(self, out: Path, coords: dict[str, np.ndarray], coord_attrs: dict[str, dict],
                 variables: dict[str, tuple[tuple[str, ...], np.dtype, tuple[int, ...], dict]], attrs: dict):
        self.out = out
        self.tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.group = zarr.open_group(self.tmp, mode="w", zarr_format=3)
        self.group.attrs.update(attrs)
        for name, values in coords.items():
            arr = self.group.create_array(
                name, shape=values.shape, dtype=str if values.dtype.kind == "U" else values.dtype,
                dimension_names=(name,), attributes=coord_attrs.get(name, {}), fill_value=None if values.dtype.kind != "U" else "",
            )
            arr[:] = values
        self.arrays = {}
        for name, (dims, dtype, chunks, var_attrs) in variables.items():
            shape = tuple(len(coords[d]) for d in dims)
            fill = np.nan if np.dtype(dtype).kind == "f" else 0
            self.arrays[name] = self.group.create_array(
                name, shape=shape, chunks=chunks, dtype=dtype, dimension_names=dims, attributes=var_attrs,
                fill_value=fill, compressors=ZstdCodec(level=1),
            )

    def write(self, name: str, region: tuple[slice, ...], values: np.ndarray) -> None:
        self.arrays[name][region] = values

    def commit(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # consolidated metadata is not yet in the v3 spec
            zarr.consolidate_metadata(self.tmp)
        if self.out.exists():
            shutil.rmtree(self.out)
        os.replace(self.tmp, self.out)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def open_store(path: str | os.PathLike) -> xr.Dataset:
    """Open a slimjax store lazily (no dask needed): ``ds.sel(...)`` reads only the chunks it touches."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(path, chunks=None)


def write_dataset(ds: xr.Dataset, out: Path) -> None:
    """Write a small Dataset (e.g. calibrated coefficients) atomically: temp sibling, then rename."""
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(tmp, mode="w", zarr_format=3, consolidated=True)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
