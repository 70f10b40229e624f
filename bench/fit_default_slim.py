"""Fit the shipped SLIM coefficients (configs/slim/default.yaml) with slimjax.calibrate.

Data: ../shared/data/measured/llm_inference_bench.csv and llm_inference_bench_ttft_e2e.csv
(argonne-lcf/LLM-Inference-Bench, BSD-3): rows Framework == vLLM, 1 GPU, on the H100 and the A100
(40 GB, see configs/hardware.yaml), models in the slimjax catalog. Model: MODEL.md §1 (what sweeps
evaluate), its objective Σ (T_pred/T_meas − 1)² plus the relative TTFT errors of T_pre where the TTFT
table has them (they identify η_c). One batched call fits one set per GPU (the `gpus` entries) and
one over both GPUs (`default`, for every other GPU: it then differs only through its specs).

    python bench/fit_default_slim.py [--write]
"""

from __future__ import annotations

import datetime
import os
import sys

import numpy as np
import pandas as pd
import yaml

import slimjax
from slimjax.model.specs import SLIM_PARAMS

slimjax.configure()

DATA = os.environ.get("SLIMJAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
FILES = ("llm_inference_bench.csv", "llm_inference_bench_ttft_e2e.csv")
GPUS = ("H100-SXM", "A100-SXM-40GB")
OUT = os.path.join(os.path.dirname(__file__), "..", "configs", "slim", "default.yaml")


def rows() -> pd.DataFrame:
    frames = [slimjax.load_traces(os.path.join(DATA, "measured", f)) for f in FILES]
    t = pd.concat(frames, ignore_index=True)
    return t[(t.framework == "vLLM") & (t.n_gpu == 1) & t.gpu.isin(GPUS)].reset_index(drop=True)


def entry(ds, **sel) -> tuple[dict, dict]:
    at = ds.sel(sel)
    theta = {p: float(f"{v:.6g}") for p, v in zip(SLIM_PARAMS, at.coefficients.values)}
    se = at.standard_error.values
    info = {
        "rows": int(at.n_points), "converged": bool(at.converged),
        "in_sample": f"MAPE throughput {float(at.mape_throughput):.1f}%, E2E {float(at.mape_e2e):.1f}%, TTFT {float(at.mape_ttft):.1f}%",
        "standard_error": {p: (float(f"{s:.3g}") if np.isfinite(s) else "not identified") for p, s in zip(SLIM_PARAMS, se)},
    }
    return theta, info


def main() -> None:
    d = rows()
    per_gpu = slimjax.calibrate(d, group_by=["gpu"], iterations=100)
    pooled = slimjax.calibrate(d.assign(pool="all"), group_by=["pool"], iterations=100)
    theta, info = entry(pooled, pool="all")
    out = {
        "provenance": {
            "data": "llm_inference_bench.csv + llm_inference_bench_ttft_e2e.csv (argonne-lcf/LLM-Inference-Bench @4211f5d, BSD-3)",
            "rows": f"{len(d)} rows: vLLM, 1 GPU, {', '.join(GPUS)}, models {', '.join(sorted(d.model.unique()))}",
            "fitted": datetime.date.today().isoformat(),
            "method": "slimjax.calibrate (MODEL.md §1, squared relative throughput and TTFT errors, LM, 100 iterations)",
            "script": "bench/fit_default_slim.py",
            "default": info,
        },
        "default": theta,
        "gpus": {},
    }
    for g in GPUS:
        theta_g, info_g = entry(per_gpu, gpu=g)
        out["gpus"][g] = theta_g
        out["provenance"][g] = info_g
    text = yaml.safe_dump(out, sort_keys=False, allow_unicode=True)
    print(text)
    if "--write" in sys.argv:
        with open(OUT, "w") as f:
            f.write("# Shipped SLIM coefficients (MODEL.md §1): `gpus` per GPU, `default` for every other GPU.\n"
                    "# Written by bench/fit_default_slim.py --write; see provenance.\n")
            f.write(text)


if __name__ == "__main__":
    main()
