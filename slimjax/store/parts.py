"""A study computed in parts (a procurement sized by simulation: one part per workload × rate), each part's arrays
kept as it finishes, so that a killed run resumed with ``resume`` computes only the parts it had not finished.

The parts live in the target's partial folder (``NAME.partial``, as a sweep's partial store does, so the same
``resume`` / ``overwrite`` rules apply): ``slimjax_parts/study.json`` names the study (a key that a resumed run must
match) and its number of parts, and each finished part is ``part-K.npz``, written to a temporary name and renamed,
so a part is there whole or not at all. The folder goes once the complete store is in place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import zarr

from ..errors import SlimjaxError, option
from .sink import partial_path

PARTS = "slimjax_parts"
STORED_PARTS = "sized_parts"  # a complete store's attr: the parts it was sized in (all of them are in it)


class PartsJournal:
    """The finished parts of a study stored at ``out``: ``done`` (part -> its arrays), ``record``, ``close``."""

    def __init__(self, out: Path, key: str, n_parts: int, resume: bool):
        self.folder = partial_path(Path(out)) / PARTS
        self.n_parts = n_parts
        meta = {"key": key, "parts": n_parts}
        if self.folder.exists() and resume:
            given = json.loads((self.folder / "study.json").read_text())
            if given != meta:
                raise SlimjaxError(
                    "resume",
                    f"the interrupted run at {str(self.folder.parent)!r} was another study (or another slimjax); "
                    f"pass {option('overwrite')} to start over",
                )
        else:
            shutil.rmtree(self.folder.parent, ignore_errors=True)
            self.folder.mkdir(parents=True)
            (self.folder / "study.json").write_text(json.dumps(meta))

    def done(self) -> dict[int, dict[str, np.ndarray]]:
        """The parts already finished: part number -> its arrays."""
        out = {}
        for path in sorted(self.folder.glob("part-*.npz")):
            with np.load(path) as z:
                out[int(path.stem.removeprefix("part-"))] = {k: z[k] for k in z.files}
        return out

    def record(self, part: int, arrays: dict[str, np.ndarray]) -> None:
        """Keep a finished part's arrays (whole or not at all: a temporary name, then a rename)."""
        tmp = self.folder / f"part-{part}.tmp-{os.getpid()}.npz"
        np.savez(tmp, **arrays)
        tmp.replace(self.folder / f"part-{part}.npz")

    def close(self) -> None:
        """The study is stored: its parts go."""
        shutil.rmtree(self.folder.parent, ignore_errors=True)


class PartsSection:
    """Parts ``offset`` … ``offset + n − 1`` of a :class:`PartsJournal`, numbered from 0: one study's parts where
    several are sized into one store (one per engine setting)."""

    def __init__(self, journal: PartsJournal, offset: int, n: int):
        self.journal, self.offset, self.n = journal, offset, n

    def done(self) -> dict[int, dict[str, np.ndarray]]:
        return {k - self.offset: v for k, v in self.journal.done().items() if 0 <= k - self.offset < self.n}

    def record(self, part: int, arrays: dict[str, np.ndarray]) -> None:
        self.journal.record(self.offset + part, arrays)


def verify_parts(path: str | os.PathLike) -> dict | None:
    """A study run in parts at ``path`` (its partial folder), counted: {"blocks": parts, "recorded", "missing",
    "corrupt": [], "ok", "unit": "parts"}; None where ``path`` has no parts."""
    path = Path(path)
    folder = (path if path.name.endswith(".partial") else partial_path(path)) / PARTS
    if not (folder / "study.json").exists():
        return _stored_whole(path)
    n = json.loads((folder / "study.json").read_text())["parts"]
    have = {int(p.stem.removeprefix("part-")) for p in folder.glob("part-*.npz")}
    missing = [k for k in range(n) if k not in have]
    return {"blocks": n, "recorded": len(have), "missing": missing, "corrupt": [], "ok": not missing, "unit": "parts"}


def _stored_whole(path: Path) -> dict | None:
    """A complete study sized in parts (its :data:`STORED_PARTS` attr): every part in it (written whole, atomically,
    once the last finished; no chunk checksums to compare); None for any other path."""
    if path.name.endswith(".partial") or not (path / "zarr.json").exists():
        return None
    try:
        n = zarr.open_group(str(path), mode="r", zarr_format=3).attrs.get(STORED_PARTS)
    except Exception:  # noqa: BLE001 - not a store of ours: the block journal's check says what it is
        return None
    if n is None:
        return None
    return {"blocks": int(n), "recorded": int(n), "missing": [], "corrupt": [], "ok": True, "unit": "parts"}
