"""GPU transfer, both ways: fit every row of one GPU, predict every row of the other through its specs,
per (framework, TP degree) setting, for the paper's SLIM and the slim-kv variant (issue 14, item 2).

Reports per direction and variant: MAPE of throughput and E2E, the median signed E2E error (bias:
a form that scales wrongly with the GPU's specs errs one way), and the held-out coverage and median
width of the fit's own 90 % intervals and of the transfer intervals (whose GPU form error comes from
the other settings' GPU-transfer folds only, never from the rows judged); slim-kv's bandwidth exponent β
per direction (chosen on the other settings' transfers), and the pooled E2E error of every candidate β.

    python bench/gpu_transfer.py [TRACES…]      # default: LLM-Inference-Bench under ../shared/data
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

import slimjax
from slimjax.fit.folds import folds, study_rows
from slimjax.fit.validate import default_trace_paths, transfer_exponent_errors, validate

slimjax.configure()


def per_direction(predictions: pd.DataFrame, exponents: dict) -> pd.DataFrame:
    p = predictions[(predictions.scenario == "gpu-transfer") & predictions.method.isin(["slim", "slim-kv"])].copy()
    p["direction"] = p.fold.str.split("|").str[1]
    p["beta"] = p.fold.map(exponents).where(p.method == "slim-kv")

    def summary(g):
        inside = (g.throughput >= g.pred_throughput_lo) & (g.throughput <= g.pred_throughput_hi)
        inside_t = (g.throughput >= g.pred_throughput_transfer_lo) & (g.throughput <= g.pred_throughput_transfer_hi)
        return pd.Series(
            {
                "rows": len(g),
                "β": g.beta.iloc[0],
                "MAPE T %": 100 * np.mean(np.abs(g.pred_throughput / g.throughput - 1)),
                "MAPE E2E %": 100 * np.mean(np.abs(g.pred_e2e_s / g.e2e_s - 1)),
                "bias E2E %": 100 * np.median(g.pred_e2e_s / g.e2e_s - 1),
                "fit cover %": 100 * inside.mean(),
                "transfer cover %": 100 * inside_t.mean(),
                "transfer width %": 100
                * np.median((g.pred_throughput_transfer_hi - g.pred_throughput_transfer_lo) / g.pred_throughput),
            }
        )

    return p.groupby(["direction", "method"]).apply(summary, include_groups=False).round(1)


def main(paths) -> None:
    traces = pd.concat([slimjax.load_traces(p) for p in paths], ignore_index=True)
    v = validate(traces)
    table = per_direction(v.predictions, v.bandwidth_exponents)
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(table.to_string())
    wins = table.reset_index().pivot(index="direction", columns="method", values="MAPE E2E %")
    print(
        f"\nslim-kv errs less on E2E in {int((wins['slim-kv'] < wins['slim']).sum())} of {len(wins)} directions; "
        f"pooled E2E MAPE slim {v.table.loc['gpu-transfer', ('mape_e2e', 'slim')]:.1f} %, "
        f"slim-kv {v.table.loc['gpu-transfer', ('mape_e2e', 'slim-kv')]:.1f} %"
    )
    rows, _ = study_rows(traces)
    fs = folds(rows)
    errors = transfer_exponent_errors(rows, fs).drop(columns="setting")
    n = sum(len(fs[k].test) for k in errors.index)
    print("slim-kv GPU transfer, mean |log(E2E_pred / E2E_meas)| over every direction at each β (1 = datasheet ratio):")
    print("  " + ", ".join(f"β {b:g}: {e / n:.3f}" for b, e in errors.sum().items()))


if __name__ == "__main__":
    main(sys.argv[1:] or default_trace_paths())
