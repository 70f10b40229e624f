"""The capacity roofline against measured serving latency: plain, with and without MODEL.md §4c's
all-reduce, and calibrated (the shipped pooled default and per-GPU fits of configs/roofline/default.yaml),
plus a held-out tensor-parallel degree (fit on TP ≤ 4, predict TP 8).

Data (read from ../shared/data or $SLIMJAX_DATA, never copied):
- serving_h100_trtllm_llama31_8b.csv (NVIDIA aiconfigurator, Apache-2.0): TensorRT-LLM online serving of
  Llama-3.1-8B on H100-SXM, TP 1–8: mean TTFT and TPOT at client concurrency B, ISL, OSL.
- splitwise_perf_model.csv (splitwise-sim, MIT): Llama-2-70B on DGX-A100/H100, TP 2–8: prompt_time of a
  batch of B prompts (the TTFT screen's batch prefill) and token_time per generated token (its BLOOM rows are
  not in the catalog).

ITL is compared with TPOT / token_time everywhere; TTFT with splitwise's prompt_time only (aiconfigurator's
TTFT is an online mean under queueing, not the screen). MAPE in %.

    python bench/roofline_vs_measured.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_default_roofline as fit  # noqa: E402  (its traces() and held-out fits; it configures slimjax)

import slimjax.fit.features as features  # noqa: E402
from slimjax.fit.roofline import roofline_errors  # noqa: E402
from slimjax.inputs.catalog import configs_dir  # noqa: E402


def without_all_reduce():
    """Context: GPUs resolved with no link figure, i.e. the roofline before MODEL.md §4c."""
    import contextlib

    @contextlib.contextmanager
    def patched():
        original = features.resolve_gpu

        def no_link(name, field="gpu"):
            label, row = original(name, field)
            return label, {**row, "link_bytes_per_s": 0.0}

        features.resolve_gpu = no_link
        try:
            yield
        finally:
            features.resolve_gpu = original

    return patched()


def mape(e: pd.Series) -> float | None:
    return round(float(e.abs().mean() * 100), 1) if e.notna().any() else None


def table(t: pd.DataFrame) -> dict:
    doc = yaml.safe_load(open(configs_dir() / "roofline" / "default.yaml"))
    out = {}
    for (source, gpu), rows in t.groupby(["source", "gpu"]):
        key = f"{source.split('_')[0]} {gpu}"
        own = doc["gpus"].get(gpu, doc["default"])
        with without_all_reduce():
            before = roofline_errors(rows)
        plain = roofline_errors(rows)
        pooled = roofline_errors(rows, *(doc["default"][k] for k in fit.ROOFLINE_PARAMS))
        per_gpu = roofline_errors(rows, *(own[k] for k in fit.ROOFLINE_PARAMS))
        out[key] = {
            "rows": len(rows),
            **{
                f"{name} ITL / TTFT": (mape(e.itl_error), mape(e.ttft_error))
                for name, e in (
                    ("plain before §4c", before),
                    ("plain", plain),
                    ("calibrated default", pooled),
                    ("calibrated per GPU", per_gpu),
                )
            },
        }
    return out


def signed_by_tp(t: pd.DataFrame) -> dict:
    """Median signed ITL error (pred/meas − 1) of the per-GPU calibrated roofline, per source, GPU and TP."""
    doc = yaml.safe_load(open(configs_dir() / "roofline" / "default.yaml"))
    out = {}
    for (source, gpu, n), rows in t.groupby(["source", "gpu", "n_gpu"]):
        own = doc["gpus"].get(gpu, doc["default"])
        e = roofline_errors(rows, *(own[k] for k in fit.ROOFLINE_PARAMS)).itl_error
        out[f"{source.split('_')[0]} {gpu} TP{n}"] = round(float(e.median() * 100), 1)
    return out


if __name__ == "__main__":
    t = fit.traces()
    print(
        json.dumps(
            {
                "mape_by_source": table(t),
                "held_out_tp8_per_gpu_fit_on_tp_le_4": fit.held_out(t, t.n_gpu <= 4, t.n_gpu == 8),
                "calibrated_itl_median_signed_error_pct_by_tp": signed_by_tp(t),
            },
            indent=1,
        )
    )
