"""Fit the shipped SLIM coefficients (configs/slim/default.yaml) with slimjax.calibrate.

Data: ../shared/data/measured/llm_inference_bench.csv and llm_inference_bench_ttft_e2e.csv
(argonne-lcf/LLM-Inference-Bench, BSD-3): rows Framework == vLLM, 1 GPU, on the H100 and the A100
(40 GB, see configs/hardware.yaml), models in the slimjax catalog. Model: MODEL.md §1 (what sweeps
evaluate), its objective Σ (T_pred/T_meas − 1)² plus the relative TTFT errors of T_pre where the TTFT
table has them (they identify η_c). One batched call fits one set per GPU (the `gpus` entries) and
one over both GPUs (`default`, for every other GPU: it then differs only through its specs).

The same for the slim-kv variant (Cauchy loss, as `slimjax validate` fits it) under `variants`, and
`recommended_variant`: the variant that errs least (mean of throughput and E2E MAPE) in most of
`slimjax validate`'s transfer scenarios (model, length, GPU, combined) on the default traces, with those
figures as its evidence — transfer, not in-sample fit, decides.

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
    theta = {p: float(f"{v:.6g}") for p, v in zip(SLIM_PARAMS, at.coefficients.values, strict=False)}
    se = at.standard_error.values
    info = {
        "rows": int(at.n_points),
        "converged": bool(at.converged),
        "in_sample": f"MAPE throughput {float(at.mape_throughput):.1f}%, E2E {float(at.mape_e2e):.1f}%, TTFT "
        f"{float(at.mape_ttft):.1f}%",
        "standard_error": {
            p: (float(f"{s:.3g}") if np.isfinite(s) else "not identified") for p, s in zip(SLIM_PARAMS, se, strict=True)
        },
    }
    return theta, info


TRANSFER = ("model-transfer", "length-transfer", "gpu-transfer", "combined")


def default_traces() -> pd.DataFrame:
    from slimjax.fit.validate import default_trace_paths

    return pd.concat([slimjax.load_traces(p) for p in default_trace_paths()], ignore_index=True)


def bandwidth_exponent() -> tuple[float, dict]:
    """slim-kv's β: the candidate whose GPU transfers (every framework and TP setting of the default traces,
    both directions) err least on E2E (Σ |log ratio|); with the error per candidate as evidence."""
    from slimjax.fit.folds import folds, study_rows
    from slimjax.fit.validate import transfer_exponent_errors

    rows, _ = study_rows(default_traces())
    total = transfer_exponent_errors(rows, folds(rows)).drop(columns="setting").sum()
    return float(total.idxmin()), {f"{b:g}": round(float(e), 1) for b, e in total.items()}


def recommendation() -> dict:
    """The transfer winner between slim and slim-kv on `slimjax validate`'s default traces, with its evidence."""
    from slimjax.fit.validate import validate

    table = validate(default_traces(), methods=["slim", "slim-kv"], scenarios=TRANSFER).table
    score = (table["mape_throughput"] + table["mape_e2e"]) / 2
    wins = score.idxmin(axis=1)
    winner = wins.value_counts().idxmax()
    return {
        "variant": winner,
        "by": "mean of throughput and E2E MAPE per transfer scenario of slimjax validate "
        "(default traces, every framework and TP setting)",
        "scenarios": {
            sc: {
                m: f"T {table.loc[sc, ('mape_throughput', m)]:.1f}% / E2E {table.loc[sc, ('mape_e2e', m)]:.1f}%"
                for m in ("slim", "slim-kv")
            }
            | {"winner": wins[sc]}
            for sc in table.index
        },
    }


def main() -> None:
    d = rows()
    per_gpu = slimjax.calibrate(d, group_by=["gpu"], iterations=100)
    pooled = slimjax.calibrate(d.assign(pool="all"), group_by=["pool"], iterations=100)
    theta, info = entry(pooled, pool="all")
    beta, beta_errors = bandwidth_exponent()
    kv_per_gpu = slimjax.calibrate(
        d, group_by=["gpu"], iterations=100, variant="slim-kv", loss="cauchy", bandwidth_exponent=beta
    )
    kv_pooled = slimjax.calibrate(
        d.assign(pool="all"),
        group_by=["pool"],
        iterations=100,
        variant="slim-kv",
        loss="cauchy",
        bandwidth_exponent=beta,
    )
    kv_theta, kv_info = entry(kv_pooled, pool="all")
    out = {
        "provenance": {
            "data": "llm_inference_bench.csv + llm_inference_bench_ttft_e2e.csv "
            "(argonne-lcf/LLM-Inference-Bench @4211f5d, BSD-3)",
            "rows": f"{len(d)} rows: vLLM, 1 GPU, {', '.join(GPUS)}, models {', '.join(sorted(d.model.unique()))}",
            "fitted": datetime.date.today().isoformat(),
            "method": "slimjax.calibrate (MODEL.md §1, squared relative throughput and TTFT errors, LM, 100 "
            "iterations)",
            "script": "bench/fit_default_slim.py",
            "default": info,
        },
        "default": theta,
        "gpus": {},
    }
    kv = {
        "provenance": {
            "method": f"slimjax.calibrate(variant='slim-kv', loss='cauchy', bandwidth_exponent={beta:g}), LM, "
            "100 iterations",
            "bandwidth_exponent": {
                "chosen_by": "least Σ |log(E2E_pred / E2E_meas)| over every GPU-transfer fold of the "
                "default validate traces (both directions, every framework and TP)",
                "error_per_candidate": beta_errors,
            },
            "default": kv_info,
        },
        "bandwidth_exponent": beta,
        "default": kv_theta,
        "gpus": {},
    }
    for g in GPUS:
        theta_g, info_g = entry(per_gpu, gpu=g)
        out["gpus"][g] = theta_g
        out["provenance"][g] = info_g
        kv["gpus"][g], kv["provenance"][g] = entry(kv_per_gpu, gpu=g)
    rec = recommendation()
    out["recommended_variant"] = rec.pop("variant")
    out["provenance"]["recommended_variant"] = rec
    out["variants"] = {"slim-kv": kv}
    text = yaml.safe_dump(out, sort_keys=False, allow_unicode=True)
    print(text)
    if "--write" in sys.argv:
        with open(OUT, "w") as f:
            f.write(
                "# Shipped SLIM coefficients (MODEL.md §1): `gpus` per GPU, `default` for every other GPU; the same\n"
                "# for the slim-kv variant under `variants`, and the variant transfer favours (`recommended_variant`,\n"
                "# what `slim_variant: recommended` means). Written by bench/fit_default_slim.py --write; see "
                "provenance.\n"
            )
            f.write(text)


if __name__ == "__main__":
    main()
