"""Fit the client-side request overhead of each engine's serving API (configs/roofline/default.yaml
``request_overhead_s``) on the serving check's rows, and measure it held out.

    slimjax validate --serving --out /tmp/scored.csv          # the serving check's per-row figures (~10 min here)
    python bench/fit_request_overhead.py /tmp/scored.csv          # tables: before / in sample / leave one model out
    python bench/fit_request_overhead.py /tmp/scored.csv --write  # and the YAML block

A measured TTFT is what the benchmark client saw: the engine's TTFT (the §9 simulation's, ``sim_ttft_s`` less the
``request_overhead_s`` it carried) plus what every request spends outside the engine (HTTP, tokenisation,
scheduling, streaming back). That overhead δ is linear in TTFT and invisible to the engine, so its least-squares fit
on relative error is closed form (slimjax.fit.serving.fit_request_overhead), bounded to [0, 100 ms]. Fitted per
engine profile (vLLM, SGLang, TensorRT-LLM: each its own API server) on the closed-loop rows of a documented client
(the harnesses of bench/fit_engine_constants.py) and dense models (a MoE row's TTFT misses the expert GEMMs'
prefill until the expert-parallel issue lands: it would be read as client time); ``default`` pools them (an engine
without such rows takes it). Held out: leave one model out (each model's rows predicted with δ fitted on the
engine's other models, else on every engine's other models, else with none) and leave one engine out (each engine's
rows with the others' pooled δ).
"""

from __future__ import annotations

import argparse
import datetime

import numpy as np
import pandas as pd
from common import FIT_HARNESSES, write_roofline_block

from slimjax.fit.serving import fit_request_overhead
from slimjax.inputs.catalog import resolve_model
from slimjax.inputs.engines import resolve_engine


def rows(path: str) -> pd.DataFrame:
    """The scored rows the overhead is fitted on: closed loops of a documented client on dense models."""
    t = pd.read_csv(path)
    dense = t.model.map(lambda m: resolve_model(m)[1].get("n_experts", 0) == 0)
    keep = ~t["offline"].astype(bool) & t.sim_ttft_s.notna() & (t.ttft_s > 0) & t.harness.isin(FIT_HARNESSES)
    t = t[keep & dense].copy()
    t["engine"] = [resolve_engine(str(f)).key for f in t.framework.fillna("generic")]
    t["engine_ttft_s"] = t.sim_ttft_s - t.request_overhead_s.fillna(0.0)
    return t


def overhead_on(rows: pd.DataFrame) -> float:
    """δ fitted on ``rows`` (0, no overhead, where there are none)."""
    return fit_request_overhead(rows.engine_ttft_s, rows.ttft_s)[0] if len(rows) else 0.0


def scores(t: pd.DataFrame, delta: pd.Series) -> pd.DataFrame:
    err = (t.engine_ttft_s + delta) / t.ttft_s - 1.0
    g = err.groupby(t.engine)
    out = pd.DataFrame({"rows": g.size(), "mape": 100 * g.apply(lambda e: e.abs().mean()), "bias": 100 * g.mean()})
    out.loc["all"] = [len(err), 100 * err.abs().mean(), 100 * err.mean()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scored")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    t = rows(a.scored)
    fitted = {e: fit_request_overhead(g.engine_ttft_s, g.ttft_s) for e, g in t.groupby("engine")}
    pooled = fit_request_overhead(t.engine_ttft_s, t.ttft_s)
    held = pd.Series(np.nan, index=t.index)
    for (e, m), g in t.groupby(["engine", "model"]):
        rest = t[(t.engine == e) & (t.model != m)]
        # the engine's other models, else every engine's other models, else none: no overhead
        held[g.index] = overhead_on(rest if len(rest) else t[t.model != m])
    others = pd.Series(np.nan, index=t.index)
    for e, g in t.groupby("engine"):
        others[g.index] = overhead_on(t[t.engine != e])
    before = scores(t, pd.Series(0.0, index=t.index))
    inside = scores(t, t.engine.map(lambda e: fitted[e][0]))
    lomo = scores(t, held)
    loeo = scores(t, others)
    table = pd.concat(
        {
            "no overhead": before,
            "fitted, in sample": inside,
            "leave one model out": lomo,
            "leave one engine out": loeo,
        },
        axis=1,
    )
    print("request overhead per engine (ms):", {e: round(1e3 * d, 1) for e, (d, _) in fitted.items()})
    print("pooled (ms):", round(1e3 * pooled[0], 1))
    print(table.round(1).to_string())
    if a.write:
        write_roofline_block(
            "request_overhead_s",
            {
                "method": "bench/fit_request_overhead.py: per engine profile, the closed-form least-squares (relative "
                "error) overhead every request's measured TTFT carries beyond the §9 simulation's, bounded [0, 0.1 s], "
                "at the shipped roofline constants",
                "data": "slimjax validate --serving (the shared serving runs' closed-loop rows of dense models and a "
                f"documented client ({', '.join(FIT_HARNESSES)}), each run as its harness ran)",
                "fitted": datetime.date.today().isoformat(),
                "engines": {e: float(f"{d:.4g}") for e, (d, _) in sorted(fitted.items())},
                "at_bound": sorted(e for e, (_, b) in fitted.items() if b),
                "default": float(f"{pooled[0]:.4g}"),
                **{
                    f"ttft_{name}": {
                        k: {"rows": int(r.rows), "mape": round(float(r.mape), 1), "bias": round(float(r.bias), 1)}
                        for k, r in part.iterrows()
                    }
                    for name, part in (
                        ("in_sample", inside),
                        ("leave_one_model_out", lomo),
                        ("leave_one_engine_out", loeo),
                    )
                },
            },
        )


if __name__ == "__main__":
    main()
