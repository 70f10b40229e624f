"""Layout sweep benchmark (docs/layouts.md): every valid layout of 8–64 GPUs (tp, dp, ep, moe_tp; one stage) for the
catalog's MoE models on H200 and GB200, each a capacity sweep over batch × prompt × output, against the TP-only
layouts' sweeps in the same run (points/s: the cost of the layout terms — imbalance, all-to-all — per point).

    python bench/layouts.py [--gpus 8,16,32,64]

Also printed: per (model, GPU, GPU count), the layout with the most token throughput per GPU at I = O = 768 (the
batch that fits and gives the most), beside the best TP-only one (what a planner asks first; the roofline's figure
at the calibrated constants, no SLO).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import slimjax
from slimjax.inputs import catalog
from slimjax.inputs.layouts import valid_layouts

MODELS = ("DeepSeek-V3", "Kimi-K2.5", "MiniMax-M2.5", "gpt-oss-120b", "Qwen3-235B-A22B")
GPUS = ("H200", "GB200")
GRID = dict(
    batch={"start": 1, "stop": 512},
    input_len={"start": 256, "stop": 8192, "step": 512},
    output_len={"start": 256, "stop": 8192, "step": 512},
)


def sweep_layout(model: str, gpu: str, layout) -> tuple[float, int, float]:
    """(wall seconds, points, the most tokens/s per GPU over the batches that fit at I = O ≈ 1,024 (NaN: none))."""
    serving = {**layout.serving(), "kv_replication": "auto", "efficiency": "calibrated"}
    spec = dict(models=[model], gpus=[gpu], serving=serving, advisor=False, precision="float32", **GRID)
    t0 = time.perf_counter()
    ds = slimjax.sweep(spec, quiet=True)
    wall = time.perf_counter() - t0
    points = int(np.prod([ds.sizes[d] for d in ("model", "gpu", "batch", "input_len", "output_len")]))
    at = ds.sel(input_len=768, output_len=768).squeeze()  # (the grid's point nearest 1,024 from below)
    fits = at.batch <= at.max_seqs  # the group's D ranks together
    best = float(at.token_throughput.where(fits).max())
    return wall, points, best / layout.gpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="8,16,32,64")
    a = ap.parse_args()
    slimjax.configure()
    counts = [int(n) for n in a.gpus.split(",")]
    totals = {"layouts": [0.0, 0], "TP only": [0.0, 0]}
    sweep_layout(MODELS[0], GPUS[0], valid_layouts(8, 128, 256, 61, 8)[0])  # compile once, outside the timing
    for model in MODELS:
        arch = catalog.resolve_model(model)[1]
        for gpu in GPUS:
            node = int(catalog.resolve_gpu(gpu)[1]["gpus_per_node"])
            for n in counts:
                lays = [
                    x
                    for x in valid_layouts(
                        n, int(arch["n_heads"]), int(arch["n_experts"]), int(arch["n_layers"]), node, max_pp=1
                    )
                ]
                best, best_tp = (None, -1.0), (None, -1.0)
                for lay in lays:
                    wall, points, per_gpu = sweep_layout(model, gpu, lay)
                    kind = "TP only" if lay.dp == lay.ep == 1 else "layouts"
                    totals[kind][0] += wall
                    totals[kind][1] += points
                    if np.isfinite(per_gpu) and per_gpu > best[1]:
                        best = (lay, per_gpu)
                    if kind == "TP only" and np.isfinite(per_gpu) and per_gpu > best_tp[1]:
                        best_tp = (lay, per_gpu)
                print(
                    f"{model} on {n} {gpu}: {len(lays)} layouts; best {best[0]} {best[1]:.0f} tok/s/GPU; "
                    f"TP only {best_tp[0]} {best_tp[1]:.0f}",
                    flush=True,
                )
    for kind, (wall, points) in totals.items():
        print(f"{kind}: {points:,} points in {wall:.1f} s = {points / max(wall, 1e-9):,.0f} points/s")
    lw, lp = totals["layouts"]
    tw, tp = totals["TP only"]
    print(f"layout sweeps' points/s over TP-only sweeps' (same run): {(lp / lw) / (tp / tw):.2f}")


if __name__ == "__main__":
    main()
