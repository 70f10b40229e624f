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

from ..errors import SlimjaxError
from ..inputs.engines import resolve_engine
from . import simulate

CONCURRENCY_BANDS = ((1, 4), (5, 16), (17, 64), (65, 256), (257, np.inf))
DIMENSIONS = ("engine", "model", "gpu", "n_gpu", "precision", "band", "output_len")  # the error table's cuts


def _band(c: float) -> str:
    for lo, hi in CONCURRENCY_BANDS:
        if lo <= c <= hi:
            return f"{lo}–{hi:g}" if np.isfinite(hi) else f"≥{lo}"
    return "?"


def _precision(b) -> str:
    return "fp16/bf16" if not np.isfinite(b) or b == 2 else {1: "fp8/int8", 0.5: "fp4/int4"}.get(b, f"{b:g} B")


def simulate_rows(rows: pd.DataFrame, requests_per_client: int = 4, serving: dict | None = None) -> pd.DataFrame:
    """``rows`` (a :func:`slimjax.load_traces` frame with ttft_s and itl_s) with sim_ttft_s, sim_tpot_s and
    their errors (sim/measured − 1) added; rows without both measured figures are left out. Each row runs with its
    engine's profile (its ``framework``, e.g. ``vllm 0.11.0``: configs/engines.yaml; generic where unknown). A
    group that cannot be simulated (its configuration cannot be built) keeps NaN and says why in ``not_run``."""
    need = rows.dropna(subset=["ttft_s", "itl_s"]).copy()
    need = need[(need.ttft_s > 0) & (need.itl_s > 0)]
    for col in ("weight_dtype_bytes", "kv_dtype_bytes"):
        if col not in need:
            need[col] = np.nan
    if "framework" not in need:
        need["framework"] = "generic"
    need["framework"] = need["framework"].fillna("generic").astype(str)
    need["precision"] = need.weight_dtype_bytes.map(_precision)
    need["band"] = need.batch.map(_band)
    need["sim_ttft_s"] = np.nan
    need["sim_tpot_s"] = np.nan
    need["not_run"] = ""
    keys = ["model", "gpu", "framework", "input_len", "output_len", "batch", "weight_dtype_bytes", "kv_dtype_bytes"]
    for key, group in need.groupby(keys, dropna=False, sort=False):
        model, gpu, framework, i_len, o_len, c, wbytes, kvbytes = key
        block = dict(serving or {"efficiency": "calibrated"})
        block.setdefault("engine", framework)
        for name, value in (("weight_dtype_bytes", wbytes), ("kv_dtype_bytes", kvbytes)):
            if np.isfinite(value):
                block.setdefault(name, float(value))
        tps = sorted({int(n) for n in group.n_gpu})
        try:
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
        except SlimjaxError as e:  # one configuration that cannot be built must not stop the others
            need.loc[group.index, "not_run"] = str(e)
            continue
        for idx, row in group.iterrows():
            at = ds.sel(tp=int(row.n_gpu))
            need.loc[idx, "sim_ttft_s"] = float(at.ttft_mean_s)
            need.loc[idx, "sim_tpot_s"] = float(at.tpot_mean_s)
    need["ttft_error"] = need.sim_ttft_s / need.ttft_s - 1
    need["tpot_error"] = need.sim_tpot_s / need.itl_s - 1
    return need


def error_table(scored: pd.DataFrame, by=DIMENSIONS) -> pd.DataFrame:
    """MAPE and bias (mean signed error), %, of TTFT and TPOT per value of each dimension in ``by`` (engine, GPU, TP,
    concurrency band, output length), then pooled (dimension ``all``). Rows whose simulation did not run are
    counted apart: ``attrs['not_run']`` {reason: rows}."""
    ran = scored.dropna(subset=["sim_ttft_s", "sim_tpot_s"]).copy()
    ran["engine"] = ran["framework"].map(lambda f: resolve_engine(str(f)).key) if "framework" in ran else "generic"

    def stats(g):
        return {
            "rows": len(g),
            "ttft_mape_pct": 100 * g.ttft_error.abs().mean(),
            "ttft_bias_pct": 100 * g.ttft_error.mean(),
            "tpot_mape_pct": 100 * g.tpot_error.abs().mean(),
            "tpot_bias_pct": 100 * g.tpot_error.mean(),
        }

    out = []
    for dim in by:
        for value, g in ran.groupby(dim, sort=True):
            out.append({"dimension": dim, "value": _shown(value), **stats(g)})
    out.append({"dimension": "all", "value": "all", **stats(ran)})
    table = pd.DataFrame(out)
    table["rows"] = table["rows"].astype(int)
    failed = scored.loc[scored.sim_ttft_s.isna() | scored.sim_tpot_s.isna()]
    cannot = "the configuration cannot run: its weights leave no KV pool, or its TP degree does not divide the heads"
    reasons = failed["not_run"].replace("", cannot) if "not_run" in failed else pd.Series(cannot, index=failed.index)
    table.attrs["not_run"] = {str(k): int(v) for k, v in pd.Series(reasons).value_counts().items()}
    return table


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float, np.integer, np.floating)) else str(value)


def error_markdown(table: pd.DataFrame) -> str:
    """:func:`error_table` as Markdown (one row per dimension value, the pooled row last), then the rows not run
    and why."""
    head = "| by | value | rows | TTFT MAPE % | TTFT bias % | TPOT MAPE % | TPOT bias % |"
    lines = [head, "|" + "---|" * 7]
    cols = ["ttft_mape_pct", "ttft_bias_pct", "tpot_mape_pct", "tpot_bias_pct"]
    for _, r in table.iterrows():
        figures = " | ".join(f"{r[c]:.1f}" for c in cols)
        lines.append(f"| {r.dimension} | {r.value} | {int(r.rows)} | {figures} |")
    for why, n in table.attrs.get("not_run", {}).items():
        lines.append(f"\nnot run: {n} rows: {why}")
    return "\n".join(lines)
