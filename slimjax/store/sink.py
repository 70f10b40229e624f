"""Zarr stores: the only module that imports zarr.

A sweep is written into ``NAME.partial`` (kept on failure, so ``resume`` can continue it; a journal inside
records each block once its data is written) and renamed into place only when complete. Other stores are
written into a temporary sibling folder (``NAME.tmp-PID``) and renamed into place only when complete. An existing
store it replaces is first renamed aside (``NAME.old-PID``), the new one renamed in,
and only then the old one deleted, so a kill at any step leaves either the old store or the new one under
the target's name, never a half-deleted one. Siblings left by a run that was killed (its PID is gone) are
cleaned by the next run for the same target: temp stores removed, an old store put back if the target is
missing. SIGTERM is turned into an orderly exit while a store is written, like Ctrl-C.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import re
import shutil
import signal
import threading
import warnings
import zlib
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
from zarr.codecs import ZstdCodec

from ..errors import SlimjaxError, option


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


def check_target(out: str | os.PathLike, overwrite: bool, resume: bool = False) -> Path | str:
    """Refuse, before any work, to replace an existing store without ``overwrite``, or to start over an
    interrupted sweep's partial store without ``overwrite`` or ``resume``; clean what a killed run of an
    older version left beside it (warning what was done). An fsspec URL is built in place (object stores
    have no atomic rename): it is complete once its block journal is sealed (``slimjax_blocks.json``)."""
    if is_url(out):
        store = _Folder(out)
        complete = (store / f"{JOURNAL}.json").exists() or (
            (store / "zarr.json").exists() and not (store / JOURNAL).exists()
        )
        partial = (store / JOURNAL).exists() and not complete
        if partial and not resume and not overwrite:
            raise SlimjaxError(
                "out",
                f"an interrupted sweep's partial store {out!r} exists: pass {option('resume')} to "
                f"continue it, or {option('overwrite')} to discard it",
            )
        if complete and resume:
            raise SlimjaxError("resume", f"{out!r} is complete; there is nothing to resume")
        if complete and not overwrite:
            raise SlimjaxError("out", f"{out!r} already exists (pass {option('overwrite')} to replace it)")
        return out
    path = Path(out)
    for line in clean_stale_siblings(path):
        warnings.warn(line, RuntimeWarning, stacklevel=2)
    partial = partial_path(path)
    if partial.exists() and not resume and not overwrite:
        raise SlimjaxError(
            "out",
            f"an interrupted sweep's partial store {str(partial)!r} exists: pass {option('resume')} "
            f"to continue it, or {option('overwrite')} to discard it",
        )
    if resume and not partial.exists() and path.exists():
        raise SlimjaxError("resume", f"{str(path)!r} is complete; there is nothing to resume")
    if path.exists() and not overwrite and not resume:
        raise SlimjaxError("out", f"{str(path)!r} already exists (pass {option('overwrite')} to replace it)")
    if path.exists() and not (path / "zarr.json").exists() and not (path / ".zgroup").exists():
        raise SlimjaxError("out", f"{str(path)!r} exists and is not a zarr store; refusing to replace it")
    _writable_folder(path.parent, "out", "a store")
    return path


def _writable_folder(folder: Path, field: str, what: str) -> None:
    """Refuse, before any work, a folder that is not one or where this process cannot create a file."""
    import tempfile

    if not folder.exists():
        raise SlimjaxError(field, f"folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise SlimjaxError(field, f"{str(folder)!r} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise SlimjaxError(field, f"cannot write {what} in {str(folder)!r} ({e.strerror or e})") from None


def check_output_file(out: str | os.PathLike, field: str = "--out") -> Path:
    """A file slimjax will write at the end (a CSV): its folder must exist and take a file, and it must not be a
    folder — checked before the work, not after it."""
    path = Path(out)
    if path.is_dir():
        raise SlimjaxError(field, f"{str(path)!r} is a folder; give a file path")
    _writable_folder(path.parent if str(path.parent) else Path("."), field, "the file")
    return path


def check_output_dir(out: str | os.PathLike, field: str = "--out") -> Path:
    """A folder slimjax will fill (a report): an existing one must take files; a new one is made under the nearest
    existing ancestor, which must take it."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise SlimjaxError(field, f"{str(path)!r} exists and is not a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    _writable_folder(existing, field, "the report")
    return path


def is_url(out) -> bool:
    """A store given as an fsspec URL (``s3://…``, ``gs://…``, ``file://…``) rather than a local path."""
    return isinstance(out, str) and "://" in out


class _Folder:
    """A folder on the local filesystem or behind an fsspec URL: the few operations the journal needs
    (atomic small-file writes: rename locally, one PUT on object stores)."""

    def __init__(self, where):
        self.url = is_url(where)
        if self.url:
            import fsspec

            self.fs, self.path = fsspec.core.url_to_fs(where)
            self.where = where
        else:
            self.where = Path(where)

    def __truediv__(self, name: str) -> "_Folder":
        return _Folder(f"{self.where.rstrip('/')}/{name}" if self.url else self.where / name)

    def exists(self) -> bool:
        return self.fs.exists(self.path) if self.url else self.where.exists()

    def remove(self) -> None:
        if self.url:
            if self.fs.exists(self.path):
                self.fs.rm(self.path, recursive=True)
        else:
            shutil.rmtree(self.where, ignore_errors=True)

    def mkdir(self) -> None:
        if self.url:
            self.fs.makedirs(self.path, exist_ok=True)
        else:
            self.where.mkdir(parents=True, exist_ok=True)

    def write_json(self, name: str, payload: dict) -> None:
        if self.url:
            self.fs.pipe(f"{self.path.rstrip('/')}/{name}", json.dumps(payload).encode())
        else:
            _write_json_atomically(self.where / name, payload)

    def read_json(self, name: str) -> dict:
        if self.url:
            return json.loads(self.fs.cat(f"{self.path.rstrip('/')}/{name}"))
        with open(self.where / name) as f:
            return json.load(f)

    def json_names(self) -> list[str]:
        if self.url:
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.glob(f"{self.path.rstrip('/')}/*.json"))
        return sorted(p.name for p in self.where.glob("*.json"))

    def __str__(self) -> str:
        return str(self.where)


def open_group(where, mode: str):
    """``zarr.open_group`` on a path or an fsspec URL (local ``file://`` URLs get auto_mkdir, as zarr's own
    local store creates folders itself)."""
    options = None
    if is_url(where) and str(where).startswith(("file://", "local://")):
        options = {"auto_mkdir": True}
    return zarr.open_group(str(where), mode=mode, zarr_format=3, storage_options=options)


PARTIAL_SUFFIX = ".partial"
JOURNAL = "slimjax_blocks"  # inside a store: one JSON per completed block while partial, blocks.json once complete
COMPRESSIONS = ("none", "zstd")


def partial_path(out: Path) -> Path:
    """Where a sweep to ``out`` is built, kept on failure for ``resume``."""
    return out.with_name(out.name + PARTIAL_SUFFIX)


def _write_json_atomically(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def values_crc(values: np.ndarray) -> int:
    values = np.asarray(values)
    if values.dtype.kind in "UOT":  # labels: their text, however numpy or zarr holds the strings
        return zlib.crc32("\0".join(str(v) for v in values.ravel().tolist()).encode())
    return zlib.crc32(np.ascontiguousarray(values).view(np.uint8).reshape(-1))


class ZarrSink:
    """Creates every array up front (one shard per evaluation block, chunked for reads) in ``NAME.partial``, takes block
    writes on a pool of writer threads (evaluation, encoding and writing overlap; at most
    ``blocks_in_flight`` blocks are held), records each block in a journal once its writes have returned,
    and renames the store into place on :meth:`commit`. On failure the partial store stays for ``resume``."""

    def __init__(
        self,
        out: Path,
        coords: dict[str, np.ndarray],
        coord_attrs: dict[str, dict],
        variables: dict[str, tuple[tuple[str, ...], np.dtype, tuple[int, ...], dict]],
        attrs: dict,
        *,
        shards: dict[str, tuple[int, ...]] | None = None,
        compression: str = "none",
        resume: bool = False,
        writers: int = 4,
        blocks_in_flight: int = 4,
    ):
        if compression not in COMPRESSIONS:
            raise SlimjaxError("compression", f"must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        self.out = out
        self.tmp = out if is_url(out) else partial_path(out)  # a URL is built in place
        self.store = _Folder(self.tmp)
        self.journal = self.store / JOURNAL
        self.done: set[int] = set()
        if resume and self.journal.exists():
            self.group = open_group(self.tmp, "r+")
            theirs = self.group.attrs.get("sweep_hash")
            if theirs != attrs.get("sweep_hash"):
                raise SlimjaxError(
                    "resume",
                    f"{str(self.tmp)!r} was started by a different sweep (resolved sweep, block plan "
                    "or slimjax version differ); rerun that sweep with --resume, or start over "
                    "with --overwrite",
                )
            self.done = {int(n.removesuffix(".json")) for n in self.journal.json_names()}
            self.arrays = {name: self.group[name] for name in variables}
        else:
            self.store.remove()
            if is_url(self.tmp):
                self.store.mkdir()  # fsspec's local filesystem does not create parents
            self.group = open_group(self.tmp, "w-")  # already emptied
            self.group.attrs.update(attrs)
            for name, values in coords.items():
                arr = self.group.create_array(
                    name,
                    shape=values.shape,
                    dtype=str if values.dtype.kind == "U" else values.dtype,
                    dimension_names=(name,),
                    attributes=coord_attrs.get(name, {}),
                    fill_value=None if values.dtype.kind != "U" else "",
                )
                arr[:] = values
            self.arrays = {}
            for name, (dims, dtype, chunks, var_attrs) in variables.items():
                shape = tuple(len(coords[d]) for d in dims)
                kind = np.dtype(dtype).kind
                fill = np.nan if kind == "f" else ("" if kind == "U" else 0)
                shard = (shards or {}).get(name)
                self.arrays[name] = self.group.create_array(
                    name,
                    shape=shape,
                    chunks=chunks,
                    shards=shard if shard != chunks else None,
                    dtype=str if kind == "U" else dtype,  # labels as zarr's variable-length strings, like the coords
                    dimension_names=dims,
                    attributes=var_attrs,
                    fill_value=fill,
                    compressors=ZstdCodec(level=1) if compression == "zstd" else None,
                )
            self.journal.mkdir()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=writers, thread_name_prefix="slimjax-writer")
        self.limit = blocks_in_flight
        self.pending: list = []  # this block's (name, future of its CRC)
        self.blocks: list = []  # records of blocks in flight

    def write(self, name: str, region: tuple[slice, ...], values: np.ndarray) -> None:
        array = self.arrays[name]

        def job():
            array[region] = values
            return values_crc(values)

        self.pending.append((name, self.pool.submit(job)))

    def block_done(self, index: int) -> None:
        """Every write of block ``index`` is submitted: record it once they have returned (durable against
        the process being killed), holding at most ``blocks_in_flight`` blocks."""
        writes, self.pending = self.pending, []

        def record():
            crcs = {name: f.result() for name, f in writes}
            self.journal.write_json(f"{index}.json", {"block": index, "crc32": crcs})

        self.blocks.append(self.pool.submit(record))
        while len(self.blocks) >= self.limit:
            self.blocks.pop(0).result()

    def record(self, index: int, crcs: dict[str, int]) -> None:
        """Journal block ``index``, written elsewhere (a Dask worker) and returned."""
        self.journal.write_json(f"{index}.json", {"block": index, "crc32": crcs})
        self.done.add(index)

    def _drain(self) -> None:
        for f in self.blocks:
            f.result()
        self.blocks = []

    def commit(self, count_nonzero: tuple[str, ...] = ()) -> None:
        """Seal the store; each variable of ``count_nonzero`` (a flag) gets attrs ``nonzero``: how many of its cells
        are set, counted over every block (resumed ones too)."""
        self._drain()
        self.pool.shutdown()
        for name in count_nonzero:
            if name in self.arrays:
                array = self.arrays[name]
                step = max(1, array.chunks[0])
                total = sum(int(np.count_nonzero(array[i : i + step])) for i in range(0, array.shape[0], step))
                array.attrs.update({"nonzero": total, "cells": int(np.prod(array.shape))})
        names = sorted(self.journal.json_names(), key=lambda n: int(n.removesuffix(".json")))
        records = {n.removesuffix(".json"): self.journal.read_json(n)["crc32"] for n in names}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # consolidated metadata is not yet in the v3 spec
            zarr.consolidate_metadata(str(self.tmp))
        self.store.write_json(f"{JOURNAL}.json", {"blocks": records})  # seals a URL store: complete from here
        self.journal.remove()
        if not is_url(self.out):
            replace_atomically(self.tmp, self.out)

    def abort(self) -> Path:
        """Stop: finish the writes already submitted and record their blocks, keep the partial store for a
        resumed run; returns its path."""
        try:
            self._drain()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return self.tmp


def verify(path: str | os.PathLike) -> dict:
    """Check a store (complete, or a partial one) against its block journal: blocks never recorded
    (``missing``) and recorded blocks whose data no longer has the recorded CRC32 (``corrupt``: a chunk
    deleted, truncated or changed). Returns {"blocks", "recorded", "missing", "corrupt", "ok"}."""
    store = _Folder(path if is_url(path) else Path(path))
    if not store.exists():
        raise SlimjaxError(str(path), "not found")
    try:
        group = zarr.open_group(str(store), mode="r", zarr_format=3)
    except Exception as e:  # noqa: BLE001 - whatever zarr says about a folder that is not a store
        raise SlimjaxError(str(path), f"not a zarr store ({e})") from None
    if "block_plan" not in group.attrs:
        raise SlimjaxError(str(path), "has no block plan: not a slimjax sweep store")
    plan = json.loads(group.attrs["block_plan"])
    if (store / f"{JOURNAL}.json").exists():
        records = {int(k): v for k, v in store.read_json(f"{JOURNAL}.json")["blocks"].items()}
    else:
        journal = store / JOURNAL
        records = (
            {int(n.removesuffix(".json")): journal.read_json(n)["crc32"] for n in journal.json_names()}
            if journal.exists()
            else {}
        )
    blocked = list(plan["block"])
    starts = [range(0, plan["sizes"][d], plan["block"][d]) for d in blocked]
    missing, corrupt = [], []
    import itertools

    for k, combo in enumerate(itertools.product(*starts)):
        if k not in records:
            missing.append(k)
            continue
        pairs = zip(blocked, combo, strict=True)
        slices = {d: slice(s, min(s + plan["block"][d], plan["sizes"][d])) for d, s in pairs}
        for name, crc in records[k].items():
            array = group[name]
            dims = array.metadata.dimension_names
            values = array[tuple(slices.get(d, slice(None)) for d in dims)]
            if values_crc(np.asarray(values)) != crc:
                corrupt.append((k, name))
    n = math.prod(len(r) for r in starts)
    return {
        "blocks": n,
        "recorded": len(records),
        "missing": missing,
        "corrupt": corrupt,
        "ok": not missing and not corrupt,
    }


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
