"""Calibrated capacity roofline (e_F, e_B, t_l) against measured ITL/TTFT: held-out error before and after.

Data: serving_h100_trtllm_llama31_8b.csv (aiconfigurator) and splitwise_perf_model.csv, read from
../shared/data or $SLIMJAX_DATA. Split: rows with an even batch index (sorted batch values within
each group) train, the rest are held out. One fit per (model, GPU, TP).

    python bench/calibrate_roofline.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

import slimjax
from slimjax.fit.roofline import calibrate_roofline, roofline_errors
from slimjax.inputs.traces import load_traces

slimjax.configure()

DATA = Path(os.environ.get("SLIMJAX_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
GROUP = ["model", "gpu", "n_gpu"]


def held_out(traces: pd.DataFrame) -> dict:
    ranks = traces.groupby(GROUP)["batch"].rank(method="dense").astype(int)
    train, test = traces[ranks % 2 == 1], traces[ranks % 2 == 0]
    ds = calibrate_roofline(train, group_by=GROUP)
    before = roofline_errors(test)
    after = []
    for key, sub in test.groupby(GROUP):
        c = ds.coefficients.sel(dict(zip(GROUP, key, strict=False)))
        after.append(
            roofline_errors(
                sub,
                *[float(c.sel(param=p)) for p in ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s")],
            )
        )
    after = pd.concat(after)

    def summary(e):
        return {
            "n": int(e.notna().sum()),
            "mape": float(e.abs().mean() * 100),
            "median_signed": float(e.median() * 100),
        }

    return {
        "train_rows": len(train),
        "test_rows": len(test),
        "itl_before": summary(before.itl_error),
        "itl_after": summary(after.itl_error),
        "ttft_before": summary(before.ttft_error),
        "ttft_after": summary(after.ttft_error),
    }


if __name__ == "__main__":
    out = {
        "aiconfigurator_llama31_8b_h100": held_out(
            load_traces(DATA / "measured" / "serving_h100_trtllm_llama31_8b.csv")
        ),
        "splitwise_llama2_70b": held_out(load_traces(DATA / "measured" / "splitwise_perf_model.csv")),
    }
    print(json.dumps(out, indent=1))
