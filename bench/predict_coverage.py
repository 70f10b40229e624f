"""How honest are slimjax.predict's 90 % intervals? Coverage on held-out measured points.

Data: llm_inference_bench.csv (vLLM, TensorRT-LLM, DeepSpeed-MII; H100/A100; all TP degrees), read
from ../shared/data or $SLIMJAX_DATA. Per (model, GPU, TP, framework) group, the points of every
other input/output length are held out; coefficients are fitted on the rest and the held-out points
predicted with intervals.

    python bench/predict_coverage.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

import slimjax
from slimjax.fit.slim import calibrate, predict
from slimjax.inputs.traces import load_traces

slimjax.configure()

DATA = Path(os.environ.get("SLIMJAX_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
GROUP = ("model", "gpu", "n_gpu", "framework")


def coverage(train, test, bootstrap):
    coeffs = calibrate(train, group_by=GROUP, bootstrap=bootstrap)
    fitted = coeffs.n_points.to_dataframe().reset_index()
    fitted = fitted[fitted.n_points >= 8][list(GROUP)]
    p = predict(coeffs, test.merge(fitted, on=list(GROUP)))
    inside_t = (p.throughput >= p.pred_throughput_lo) & (p.throughput <= p.pred_throughput_hi)
    inside_e = (p.e2e_s >= p.pred_e2e_s_lo) & (p.e2e_s <= p.pred_e2e_s_hi)
    return {
        "uncertainty": f"bootstrap {bootstrap}" if bootstrap else "Gauss-Newton",
        "train_rows": len(train),
        "held_out_rows": len(p),
        "groups": len(fitted),
        "coverage_throughput_90": float(inside_t.mean()),
        "coverage_e2e_90": float(inside_e.mean()),
        "held_out_mape_throughput": float(np.mean(np.abs(p.pred_throughput / p.throughput - 1)) * 100),
        "held_out_mape_e2e": float(np.mean(np.abs(p.pred_e2e_s / p.e2e_s - 1)) * 100),
        "median_interval_width_throughput_rel": float(
            np.median((p.pred_throughput_hi - p.pred_throughput_lo) / p.pred_throughput)
        ),
    }


if __name__ == "__main__":
    df = load_traces(DATA / "measured" / "llm_inference_bench.csv")
    df = df[df.framework != "llama.cpp"]  # its Throughput and Latency columns disagree (see note)
    rank = df.groupby(list(GROUP))["input_len"].rank(method="dense").astype(int)
    train, test = df[rank % 2 == 1], df[rank % 2 == 0]
    for bootstrap in (0, 200):
        print(json.dumps(coverage(train, test, bootstrap), indent=1))
