"""Measured collectives fitted (docs/collectives.md): per (GPU, NCCL version, collective, GPUs, dtype) NCCL's two
protocol lines and the size it switches at (:func:`slimjax.model.collectives.protocol_collective_s`) on the measured
points of at least ``min_bytes``.

Each line is the minimax one on relative error, where it matters to a planner (no point further off than the
reported ``max_error``): t/t_i = τ/t_i + x_i/(B·t_i) is linear in (τ, 1/B), so the least largest relative error is a
small linear program solved exactly; τ ≥ 0 and B ≤ 10 TB/s bound it. The switch is the measured size (two sizes at
least on each side, or none: one line) whose two fits have the least largest error. Bus bandwidth =
:data:`~slimjax.model.collectives.BUS_FACTOR` · B_l, NCCL's figure comparable across GPU counts (in-switch reduction,
NVLS, can take it above the link's per-direction bandwidth).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from ..model.collectives import BUS_FACTOR, protocol_collective_s

GROUP = ("gpu", "nccl_version", "op", "n_gpu", "dtype")
MIN_BYTES = 2**13  # a tensor-parallel step's smallest all-reduce: one decode token of a 4,096-wide model in bf16
LINK_DEGREES = (2, 4, 8)  # the GPU counts a node's tensor-parallel group has, measured in ../shared/data
MAX_BANDWIDTH = 10e12  # bytes/s, the bound of the fit (no NVLink carries more)
# an MoE layer's smallest all-to-all: one token's top-8 dispatch of a 4,096-wide model in bf16 (below it the measured
# all-to-all follows no two lines: fitted from here, every shipped point within 12.4 %, docs/collectives.md)
ALLTOALL_MIN_BYTES = 2**16
# the catalog block each fitted collective fills (configs/gpus.yaml): NCCL op name -> (block, dtype, fitted from)
CATALOG_COLLECTIVES = {
    "all_reduce": ("allreduce", "half", MIN_BYTES),
    "alltoall": ("alltoall", "half", ALLTOALL_MIN_BYTES),
}


def _minimax_line(x, t):
    """(τ, B, largest relative error) of the line τ + x/B minimising max |(τ + x/B)/t − 1| (solved in µs and MiB,
    where the program is well scaled)."""
    t_us, x_mib = t * 1e6, x / 2**20
    one = np.ones_like(x)
    a = np.stack([one / t_us, x_mib / t_us], 1)
    a_ub = np.vstack([np.hstack([a, -one[:, None]]), np.hstack([-a, -one[:, None]])])
    got = linprog(
        [0.0, 0.0, 1.0],
        A_ub=a_ub,
        b_ub=np.concatenate([one, -one]),
        bounds=[(0.0, None), (2**20 * 1e6 / MAX_BANDWIDTH, None), (0.0, None)],
    )
    return got.x[0] * 1e-6, 2**20 * 1e6 / got.x[1], got.x[2]


def protocol_fit(x, t) -> dict:
    """The two protocol lines and the switch with the least largest relative error over points (x bytes, t s)."""
    sizes = np.unique(x)
    best = None
    for switch in (*sizes[2:-1], np.inf):  # two sizes at least below, two at or above; inf: one protocol
        small, large = x < switch, x >= switch
        lines = [_minimax_line(x[m], t[m]) for m in (small, large) if m.any()]
        err = max(e for *_, e in lines)
        if best is None or err < best[0] - 1e-12:
            (ts, bs, _), (tl, bl, _) = lines[0], lines[-1]
            best = (
                err,
                dict(
                    small_latency_s=ts,
                    small_bytes_per_s=bs,
                    switch_bytes=switch,
                    large_latency_s=tl,
                    large_bytes_per_s=bl,
                ),
            )
    return best[1]


def fit_collectives(frame: pd.DataFrame, min_bytes: float = MIN_BYTES) -> pd.DataFrame:
    """One row per group (:data:`GROUP`) with the protocol lines (``small_latency_us``, ``small_gbs``,
    ``switch_mib``, ``large_latency_us``, ``large_gbs``, ``large_bus_gbs``), ``max_error`` (largest |t_fit/t − 1|
    over its points ≥ ``min_bytes``), a size where it is reached (``worst_bytes``) and ``points``. Groups with
    fewer than four distinct sizes are left out."""
    rows = []
    for key, g in frame[frame.message_bytes >= min_bytes].groupby(list(GROUP), sort=True):
        x, t = g.message_bytes.to_numpy(float), g.latency_s.to_numpy(float)
        if len(np.unique(x)) < 4:
            continue
        p = protocol_fit(x, t)
        err = np.asarray(protocol_collective_s(x, *p.values())) / t - 1.0
        worst = int(np.argmax(np.abs(err)))
        op, n = key[2], key[3]
        rows.append(
            dict(
                zip(GROUP, key, strict=True),
                small_latency_us=p["small_latency_s"] * 1e6,
                small_gbs=p["small_bytes_per_s"] / 1e9,
                switch_mib=p["switch_bytes"] / 2**20,
                large_latency_us=p["large_latency_s"] * 1e6,
                large_gbs=p["large_bytes_per_s"] / 1e9,
                large_bus_gbs=BUS_FACTOR[op](n) * p["large_bytes_per_s"] / 1e9 if op in BUS_FACTOR else np.nan,
                max_error=float(np.abs(err[worst])),
                worst_bytes=float(x[worst]),
                points=len(x),
            )
        )
    return pd.DataFrame(rows)


def fitted_seconds(fitted_row, message_bytes):
    """t(x) of one fitted row (:func:`fit_collectives`) at ``message_bytes``, seconds."""

    def col(c):
        return np.asarray(fitted_row[c], float)

    return np.asarray(
        protocol_collective_s(
            np.asarray(message_bytes, float),
            col("small_latency_us") * 1e-6,
            col("small_gbs") * 1e9,
            col("switch_mib") * 2**20,
            col("large_latency_us") * 1e-6,
            col("large_gbs") * 1e9,
        )
    )


def collective_error(frame: pd.DataFrame, fitted: pd.DataFrame, min_bytes: float = MIN_BYTES) -> pd.DataFrame:
    """Each measured point ≥ ``min_bytes`` with its fitted time and relative error (``fit_s``, ``error``)."""
    at = frame[frame.message_bytes >= min_bytes].merge(fitted, on=list(GROUP))
    fit = fitted_seconds(at, at.message_bytes.to_numpy(float))
    return at.assign(fit_s=fit, error=fit / at.latency_s - 1.0)


def _version(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in str(v).split("."))


def catalog_fit(frame: pd.DataFrame, op: str) -> pd.DataFrame:
    """:func:`fit_collectives` of the measured ``op`` (a :data:`CATALOG_COLLECTIVES` key) from the size its catalog
    block is fitted from."""
    return fit_collectives(frame[frame.op == op], min_bytes=CATALOG_COLLECTIVES[op][2])


def link_catalog(fitted: pd.DataFrame, op: str = "all_reduce") -> dict:
    """{GPU: {n: the bf16 ``op``'s protocol lines at NCCL's newest measured version, catalog units}, with
    ``nccl``}: what configs/gpus.yaml's ``allreduce`` (``alltoall``) blocks hold (tests/test_collectives.py checks
    them; ``fitted`` from :func:`catalog_fit`)."""
    dtype = CATALOG_COLLECTIVES[op][1]
    ar = fitted[(fitted.op == op) & (fitted.dtype == dtype) & fitted.n_gpu.isin(LINK_DEGREES)]
    out = {}
    for gpu, g in ar.groupby("gpu", sort=True):
        newest = max(g.nccl_version, key=_version)
        at = g[g.nccl_version == newest]
        block = {"nccl": str(newest)}
        for _, r in at.sort_values("n_gpu").iterrows():
            block[int(r.n_gpu)] = {
                "small_us": round(float(r.small_latency_us), 2),
                "small_gbs": round(float(r.small_gbs), 1),
                "switch_mib": round(float(r.switch_mib), 4),
                "large_us": round(float(r.large_latency_us), 2),
                "large_gbs": round(float(r.large_gbs), 1),
            }
        out[str(gpu)] = block
    return out


def collectives_markdown(fitted: pd.DataFrame) -> str:
    """The fitted table as Markdown (docs/collectives.md shows it; the tests check it against a fresh fit)."""
    lines = [
        "| GPU | NCCL | collective | n | dtype | small τ µs | small B GB/s | switch MiB | large τ µs | large B GB/s "
        "| large bus GB/s | max error ≥ 8 KiB | points |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in fitted.iterrows():
        lines.append(
            f"| {r.gpu} | {r.nccl_version} | {r.op} | {r.n_gpu} | {r['dtype']} | {r.small_latency_us:.1f} "
            f"| {r.small_gbs:.0f} | {r.switch_mib:g} | {r.large_latency_us:.1f} | {r.large_gbs:.0f} "
            f"| {r.large_bus_gbs:.0f} | {100 * r.max_error:.1f} % | {r.points} |"
        )
    return "\n".join(lines)
