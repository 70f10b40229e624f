"""Measured collectives fitted (docs/collectives.md): per (GPU, NCCL version, collective, GPUs, dtype) the algorithm
bandwidth B and pipeline latency L of t(x) = (√(x/B) + √L)² (:mod:`slimjax.model.collectives`) on the measured
points of at least ``min_bytes``.

The fit is the minimax one on relative error, where it matters to a planner (no point further off than the
reported ``max_error``): √t = √x/√B + √L is linear in (1/√B, √L), so the least largest relative error of √t over
the points is a small linear program, solved exactly for every group; B > 0 and L ≥ 0 are its bounds (a group whose
L sits at 0 is latency-free in that range, reported as ``latency_at_bound``). The error of t itself is reported from
the fitted curve. Bus bandwidth = :data:`~slimjax.model.collectives.BUS_FACTOR` · B, NCCL's figure comparable across
GPU counts (in-switch reduction, NVLS, can take it above the link's per-direction bandwidth).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from ..model.collectives import BUS_FACTOR, pipelined_collective_s

GROUP = ("gpu", "nccl_version", "op", "n_gpu", "dtype")
MIN_BYTES = 2**20  # the range a tensor-parallel step's all-reduce lives in: 1 MiB is 64 decode tokens of D = 8192


def _minimax(x, t):
    """(1/√B, √L) minimising max |(√x/√B + √L)/√t − 1| (a linear program in those two and the bound z)."""
    s = np.sqrt(t)
    u, v, one = np.sqrt(x) / s, 1.0 / s, np.ones_like(x)
    a_ub = np.vstack([np.stack([u, v, -one], 1), np.stack([-u, -v, -one], 1)])
    b_ub = np.concatenate([one, -one])
    got = linprog([0.0, 0.0, 1.0], A_ub=a_ub, b_ub=b_ub, bounds=[(1e-12, None), (0.0, None), (0.0, None)])
    return got.x[0], got.x[1]


def fit_collectives(frame: pd.DataFrame, min_bytes: float = MIN_BYTES) -> pd.DataFrame:
    """One row per group (:data:`GROUP`) with ``bandwidth_gbs`` (B), ``bus_gbs``, ``latency_us`` (L),
    ``max_error`` (largest |t_fit/t − 1| over its points ≥ ``min_bytes``), a size where it is reached
    (``worst_bytes``: a minimax fit reaches it at several),
    ``points`` and ``latency_at_bound``. Groups with fewer than two such points are left out."""
    rows = []
    for key, g in frame[frame.message_bytes >= min_bytes].groupby(list(GROUP), sort=True):
        x, t = g.message_bytes.to_numpy(float), g.latency_s.to_numpy(float)
        if len(np.unique(x)) < 2:
            continue
        a, b = _minimax(x, t)
        bandwidth, latency = 1.0 / a**2, b**2
        err = np.asarray(pipelined_collective_s(x, bandwidth, latency)) / t - 1.0
        worst = int(np.argmax(np.abs(err)))
        op, n = key[2], key[3]
        rows.append(
            dict(
                zip(GROUP, key, strict=True),
                bandwidth_gbs=bandwidth / 1e9,
                bus_gbs=BUS_FACTOR[op](n) * bandwidth / 1e9 if op in BUS_FACTOR else np.nan,
                latency_us=latency * 1e6,
                max_error=float(np.abs(err[worst])),
                worst_bytes=float(x[worst]),
                points=len(x),
                latency_at_bound=bool(latency <= 1e-12),
            )
        )
    return pd.DataFrame(rows)


def collective_error(frame: pd.DataFrame, fitted: pd.DataFrame, min_bytes: float = MIN_BYTES) -> pd.DataFrame:
    """Each measured point ≥ ``min_bytes`` with its fitted time and relative error (``fit_s``, ``error``)."""
    at = frame[frame.message_bytes >= min_bytes].merge(fitted, on=list(GROUP))
    x, bandwidth, latency = (at[c].to_numpy(float) for c in ("message_bytes", "bandwidth_gbs", "latency_us"))
    fit = np.asarray(pipelined_collective_s(x, bandwidth * 1e9, latency * 1e-6))
    return at.assign(fit_s=fit, error=fit / at.latency_s - 1.0)


def collectives_markdown(fitted: pd.DataFrame) -> str:
    """The fitted table as Markdown (docs/collectives.md shows it; the tests check it against a fresh fit)."""
    lines = [
        "| GPU | NCCL | collective | n | dtype | B GB/s | bus GB/s | L µs | max error ≥ 1 MiB | points |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in fitted.iterrows():
        lines.append(
            f"| {r.gpu} | {r.nccl_version} | {r.op} | {r.n_gpu} | {r['dtype']} | {r.bandwidth_gbs:.0f} "
            f"| {r.bus_gbs:.0f} | {r.latency_us:.1f} | {100 * r.max_error:.1f} % | {r.points} |"
        )
    return "\n".join(lines)
