"""Measured NCCL collectives (``../shared/data/measured/nccl/``: aiconfigurator's ``nccl_perf`` tables, one file
per system and NCCL version): one row per (collective, GPUs, dtype, message size) with its latency.

A file's GPU comes from its ``device`` column, else the system name its file name starts with (``h100_sxm_nccl_…``),
resolved like a trace's hardware (configs/hardware.yaml, then the GPU catalog's names, aliases and normalised
names); its NCCL version from the file name's tail, else its ``version`` column.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SlimjaxError
from .catalog import dtype_bytes, resolve_hardware
from .traces import hardware_table

COLUMNS = ("op_name", "num_gpus", "message_size", "nccl_dtype", "latency")


def read_collectives(paths) -> pd.DataFrame:
    """Rows gpu, nccl_version, op, n_gpu, dtype, message_bytes, latency_s from NCCL measurement CSVs; a file that is
    not one is an error naming it and what it lacks."""
    frames = []
    table = hardware_table()
    for path in map(Path, paths):
        try:
            raw = pd.read_csv(path)
        except (OSError, pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
            raise SlimjaxError(str(path), f"not a readable CSV ({e})") from None
        missing = [c for c in COLUMNS if c not in raw]
        if missing:
            raise SlimjaxError(f"{path}: column {missing[0]!r}", "missing for an NCCL measurement table")
        m = re.match(r"(.+?)_nccl_(.+)$", path.stem)
        system = str(raw["device"].iloc[0]) if "device" in raw and len(raw) else (m.group(1) if m else path.stem)
        gpu = resolve_hardware(system, table)
        if gpu is None:
            raise SlimjaxError(str(path), f"hardware {system!r} unknown (add it to configs/hardware.yaml)")
        # the file name's version names NCCL's own folder (…/comm/nccl/<version>/); a version column is the
        # collecting tool's and reads the same in files of different NCCL versions
        version = m.group(2) if m else (str(raw["version"].iloc[0]) if "version" in raw and len(raw) else "")
        width = {d: dtype_bytes(d, f"{path}: nccl_dtype") for d in raw["nccl_dtype"].astype(str).unique()}
        frames.append(
            pd.DataFrame(
                dict(
                    gpu=gpu,
                    nccl_version=version,
                    op=raw["op_name"].astype(str),
                    n_gpu=raw["num_gpus"].astype(int),
                    dtype=raw["nccl_dtype"].astype(str),
                    message_bytes=raw["message_size"].astype(float) * raw["nccl_dtype"].astype(str).map(width),
                    latency_s=raw["latency"].astype(float) * 1e-3,
                )
            )
        )
    if not frames:
        raise SlimjaxError("collectives", "no NCCL measurement files given")
    out = pd.concat(frames, ignore_index=True)
    return out[np.isfinite(out.latency_s) & (out.latency_s > 0) & (out.message_bytes > 0)].reset_index(drop=True)
