"""Zarr stores: the only module that imports zarr.

A store is written into a temporary sibling folder (``NAME.tmp-PID``) and renamed into place only when
complete. An existing store it replaces is first renamed aside (``NAME.old-PID``), the new one renamed in,
and only then the old one deleted, so a kill at any step leaves either the old store or the new one under
the target's name, never a half-deleted one. Siblings left by a run that was killed (its PID is gone) are
cleaned by the next run for the same target: temp stores removed, an old store put back if the target is
missing. SIGTERM is turned into an orderly exit while a store is written, like Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
import warnings
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
from zarr.codecs import ZstdCodec

from ..errors import SlimjaxError


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_siblings(path: Path) -> list[str]:
    """Remove ``NAME.tmp-PID`` and ``NAME.old-PID`` siblings of ``path`` whose process is gone (a killed
    run's leftovers), first putting an old store back where the target itself is missing. Returns what
    was done, one line each."""
    done = []
    if not path.parent.is_dir():
        return done
    pattern = re.compile(re.escape(path.name) + r"\.(tmp|old)-(\d+)$")
    for sibling in sorted(path.parent.iterdir()):
        m = pattern.match(sibling.name)
        if not m or int(m.group(2)) == os.getpid() or _alive(int(m.group(2))):
            continue
        if m.group(1) == "old" and not path.exists():
            os.replace(sibling, path)
            done.append(f"restored {path} from {sibling.name} (a replacement was interrupted)")
        else:
            shutil.rmtree(sibling, ignore_errors=True)
            done.append(f"removed {sibling} (left by a run that was killed)")
    return done


def replace_atomically(tmp: Path, out: Path) -> None:
    """Put the complete store ``tmp`` at ``out``: the old one aside, the new one in, then the old one deleted."""
    aside = out.with_name(f"{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, aside)
    os.replace(tmp, out)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def sigterm_as_exit():
    """While a store is written, SIGTERM (timeouts, Slurm, Kubernetes) raises SystemExit in the main
    thread so the temp store is removed, as on Ctrl-C. Elsewhere (a worker thread) it is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_target(out: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse, before any work, to replace an existing store without ``overwrite``; clean what a killed
    run left beside it (warning what was done)."""
    path = Path(out)
    for line in clean_stale_siblings(path):
        warnings.warn(line, RuntimeWarning, stacklevel=2)
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
        replace_atomically(self.tmp, self.out)

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
        with sigterm_as_exit(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(tmp, mode="w", zarr_format=3, consolidated=True)
            replace_atomically(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
