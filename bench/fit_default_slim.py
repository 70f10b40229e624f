"""Fit the shipped default SLIM coefficients (configs/slim/default.yaml) once, with scipy.

Data: ../shared/data/measured/llm_inference_bench.csv (argonne-lcf/LLM-Inference-Bench, BSD-3),
rows Framework == vLLM, 1 GPU, Nvidia H100/A100, models in the slimjax catalog. Objective: MODEL.md §1,
Σ (T_pred/T_meas − 1)² over throughput. One fit per GPU, and one over both (the `default` entry).
This is a stop-gap provenance script; the batched calibrator (slimjax.calibrate) supersedes it.

    python bench/fit_default_slim.py [--write]
"""

from __future__ import annotations

import datetime
import os
import sys

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

import slimjax  # noqa: F401  (enables float64)
from slimjax.catalog import resolve_gpu, resolve_model
from slimjax.slim import slim_variables
from slimjax.specs import SLIM_PARAMS, GPUSpec, ModelSpec, SlimCoeffs, stack

DATA = os.environ.get("SLIMJAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
CSV = os.path.join(DATA, "measured", "llm_inference_bench.csv")
MODELS = {"meta-llama/Llama-2-7b-hf": "Llama-2-7b", "meta-llama/Meta-Llama-3-8B": "Meta-Llama-3-8B",
          "mistralai/Mistral-7B-v0.1": "Mistral-7B-v0.1", "Qwen/Qwen2-7B": "Qwen2-7B"}
GPUS = {"Nvidia H100 GPU": "H100-SXM", "Nvidia A100 GPU": "A100-SXM-80GB"}


def rows() -> pd.DataFrame:
    df = pd.read_csv(CSV)
    d = df[(df.Framework == "vLLM") & (df["Num of Hardware"] == 1) & df.Hardware.isin(GPUS) & df.Model.isin(MODELS)]
    return d.assign(model=d.Model.map(MODELS), gpu=d.Hardware.map(GPUS))


def predict(theta, d):
    m = stack(ModelSpec, [resolve_model(n)[1] for n in d.model])
    g = stack(GPUSpec, [resolve_gpu(n)[1] for n in d.gpu])
    c = SlimCoeffs(**dict(zip(SLIM_PARAMS, theta)))
    il = d["Input Output Length"].to_numpy(float)
    out = slim_variables(m, g, c, d["Batch Size"].to_numpy(float), il, il)
    return np.asarray(out["slim_throughput"]), np.asarray(out["slim_e2e_s"])


def fit(d):
    # Bounded: efficiencies in (0, 1] (IL = OL data cannot pin prefill otherwise), B0 ≤ 256.
    # alpha, gamma, t_fixed are scaled to O(1) for the solver.
    scale = np.array([1, 1, 1, 1e-4, 1e-6, 0.1])
    lo, hi = np.array([0.01, 0.01, 0, 0, 0, 0]), np.array([1, 1, 256, 1e3, 1e3, 50])
    best = None
    for start in ([0.5, 0.5, 1.0, 1, 1, 0.5], [0.3, 0.9, 8.0, 0.1, 10, 2], [0.8, 0.2, 0.5, 10, 0.1, 0.1]):
        res = least_squares(lambda z: predict(z * scale, d)[0] / d.Throughput.to_numpy() - 1, start,
                            bounds=(lo, hi), method="trf")
        if best is None or res.cost < best.cost:
            best = res
    theta = best.x * scale
    t, e = predict(theta, d)
    mape_t = float(np.mean(np.abs(t / d.Throughput.to_numpy() - 1)) * 100)
    mape_e = float(np.mean(np.abs(e / d.Latency.to_numpy() - 1)) * 100)
    return {p: float(f"{v:.6g}") for p, v in zip(SLIM_PARAMS, theta)}, mape_t, mape_e


def main() -> None:
    d = rows()
    theta, mt, me = fit(d)
    out = {"provenance": {"data": "llm_inference_bench.csv (argonne-lcf/LLM-Inference-Bench @4211f5d, BSD-3)",
                          "rows": f"{len(d)} rows: vLLM, 1 GPU, Nvidia H100 / A100, models " + ", ".join(MODELS.values()),
                          "fitted": datetime.date.today().isoformat(), "script": "bench/fit_default_slim.py",
                          "in_sample": f"MAPE throughput {mt:.1f}%, E2E {me:.1f}%"},
           "default": theta,
           # One shared set: GPUs then differ only through their specs, so fleet comparisons stay
           # consistent. Per-GPU sets belong here once calibrated (slimjax calibrate).
           "gpus": {}}
    for hw, name in GPUS.items():
        sub = d[d.Hardware == hw]
        t, e = predict([theta[p] for p in SLIM_PARAMS], sub)
        out["provenance"][f"in_sample_{name}"] = (
            f"{len(sub)} rows; MAPE throughput {np.mean(np.abs(t / sub.Throughput.to_numpy() - 1)) * 100:.1f}%, "
            f"E2E {np.mean(np.abs(e / sub.Latency.to_numpy() - 1)) * 100:.1f}%")
    text = yaml.safe_dump(out, sort_keys=False)
    print(text)
    if "--write" in sys.argv:
        with open(os.path.join(os.path.dirname(__file__), "..", "configs", "slim", "default.yaml"), "w") as f:
            f.write("# Shipped SLIM coefficients (MODEL.md §1). Written by bench/fit_default_slim.py; see provenance.\n")
            f.write(text)


if __name__ == "__main__":
    main()
