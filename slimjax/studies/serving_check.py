"""The §9 simulation scored against measured serving runs (benchmark-client style: C concurrent clients, each
sending its next request when the last completes): TTFT and TPOT MAPE and bias per GPU, TP degree, weight
precision and concurrency band.

Each measured row (model, GPU, TP n, concurrency C, prompt I, output O, mean TTFT, mean TPOT/ITL) becomes a
closed loop of C clients × ``requests_per_client`` requests of (I, O) on one replica of n GPUs with batch limit
B = C (the engine's max_num_seqs at that concurrency), the study's default serving (calibrated roofline
efficiencies); the simulated mean TTFT and mean TPOT, after the first C completions, are compared with the
measured means. Rows are grouped by (model, GPU, I, O, C, precision) so each group is one simulation over its TP
degrees.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import simulate

CONCURRENCY_BANDS = ((1, 4), (5, 16), (17, 64), (65, 256), (257, np.inf))
GROUP = ("model", "gpu", "n_gpu", "precision", "band")


def _band(c: float) -> str:
    for lo, hi in CONCURRENCY_BANDS:
        if lo <= c <= hi:
            return f"{lo}–{hi:g}" if np.isfinite(hi) else f"≥{lo}"
    return "?"


def _precision(b) -> str:
    return "fp16/bf16" if not np.isfinite(b) or b == 2 else {1: "fp8/int8", 0.5: "fp4/int4"}.get(b, f"{b:g} B")


def simulate_rows(rows: pd.DataFrame, requests_per_client: int = 4, serving: dict | None = None) -> pd.DataFrame:
    """``rows`` (a :func:`slimjax.load_traces` frame with ttft_s and itl_s) with sim_ttft_s, sim_tpot_s and
    their errors (sim/measured − 1) added; rows without both measured figures are left out."""
    need = rows.dropna(subset=["ttft_s", "itl_s"]).copy()
    need = need[(need.ttft_s > 0) & (need.itl_s > 0)]
    if "weight_dtype_bytes" not in need:
        need["weight_dtype_bytes"] = np.nan
    need["precision"] = need.weight_dtype_bytes.map(_precision)
    need["band"] = need.batch.map(_band)
    need["sim_ttft_s"] = np.nan
    need["sim_tpot_s"] = np.nan
    keys = ["model", "gpu", "input_len", "output_len", "batch", "weight_dtype_bytes"]
    for key, group in need.groupby(keys, dropna=False, sort=False):
        model, gpu, i_len, o_len, c, wbytes = key
        block = dict(serving or {"efficiency": "calibrated"})
        if np.isfinite(wbytes):
            block["bytes_per_weight"] = float(wbytes)
        tps = sorted({int(n) for n in group.n_gpu})
        sim = simulate.parse(
            dict(
                models=[model],
                gpus=[gpu],
                tp=tps,
                batch=[int(c)],
                serving=block,
                stream={
                    "closed_loop": {
                        "clients": [int(c)],
                        "input_len": int(i_len),
                        "output_len": int(o_len),
                        "requests_per_client": requests_per_client,
                    }
                },
            )
        )
        ds = simulate.run(sim).isel(model=0, gpu=0, pp=0, batch=0, replicas=0, clients=0)
        for idx, row in group.iterrows():
            at = ds.sel(tp=int(row.n_gpu))
            need.loc[idx, "sim_ttft_s"] = float(at.ttft_mean_s)
            need.loc[idx, "sim_tpot_s"] = float(at.tpot_mean_s)
    need["ttft_error"] = need.sim_ttft_s / need.ttft_s - 1
    need["tpot_error"] = need.sim_tpot_s / need.itl_s - 1
    return need


def error_table(scored: pd.DataFrame) -> pd.DataFrame:
    """MAPE and bias (mean signed error), %, of TTFT and TPOT per GPU, TP, precision and concurrency band; rows
    whose simulation did not run (the configuration does not fit) are counted apart as ``not_run``."""
    ran = scored.dropna(subset=["sim_ttft_s", "sim_tpot_s"])

    def stats(g):
        return pd.Series(
            {
                "rows": len(g),
                "ttft_mape_pct": 100 * g.ttft_error.abs().mean(),
                "ttft_bias_pct": 100 * g.ttft_error.mean(),
                "tpot_mape_pct": 100 * g.tpot_error.abs().mean(),
                "tpot_bias_pct": 100 * g.tpot_error.mean(),
            }
        )

    table = ran.groupby(list(GROUP), sort=True).apply(stats, include_groups=False).reset_index()
    total = stats(ran).to_frame().T.assign(model="all", gpu="all", n_gpu="all", precision="all", band="all")
    table = pd.concat([table, total[table.columns]], ignore_index=True)
    table["rows"] = table["rows"].astype(int)
    not_run = len(scored) - len(ran)
    table.attrs["not_run"] = not_run
    return table


def error_markdown(table: pd.DataFrame) -> str:
    """:func:`error_table` as Markdown (one row per group, the pooled row last)."""
    cols = [*GROUP, "rows", "ttft_mape_pct", "ttft_bias_pct", "tpot_mape_pct", "tpot_bias_pct"]
    head = (
        "| model | GPU | TP | precision | concurrency | rows | TTFT MAPE % | TTFT bias % | TPOT MAPE % | TPOT bias % |"
    )
    lines = [head, "|" + "---|" * 10]
    for _, r in table[cols].iterrows():
        figures = " | ".join(f"{r[c]:.1f}" for c in cols[6:])
        lines.append(f"| {r.model} | {r.gpu} | {r.n_gpu} | {r.precision} | {r.band} | {int(r.rows)} | {figures} |")
    if table.attrs.get("not_run"):
        lines.append(f"\nnot run: {table.attrs['not_run']} rows (the configuration does not fit)")
    return "\n".join(lines)
