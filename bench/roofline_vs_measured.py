"""The plain roofline (MODEL.md §4, e_F = e_B = 1, t_l = 0) against measured serving latency.

Data (read from ../shared/data or $SLIMJAX_DATA, never copied):
- serving_h100_trtllm_llama31_8b.csv (NVIDIA aiconfigurator, Apache-2.0): TensorRT-LLM online serving of
  Llama-3.1-8B on H100-SXM, TP 1–8: mean TTFT and TPOT at client concurrency B, ISL, OSL.
- splitwise_perf_model.csv (splitwise-sim, MIT): Llama-2-70B and BLOOM-176B on DGX-A100/H100, TP 2–8:
  prompt_time of a batch of B prompts and token_time per generated token.

Compared: ITL (roofline decode at concurrency B, context I … I+O) against TPOT / token_time; the
batch prefill B·t_pre (the TTFT screen's prefill term) against splitwise's prompt_time; the TTFT
screen against aiconfigurator's mean TTFT (an online mean, so a loose comparison). A figure, not a
pass/fail: signed error (pred/meas − 1) quantiles.

    python bench/roofline_vs_measured.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

import slimjax

slimjax.configure()

DATA = Path(os.environ.get("SLIMJAX_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
BLOOM = {"name": "BLOOM-176B", "model_type": "bloom", "num_hidden_layers": 70, "hidden_size": 14336,
         "num_attention_heads": 112, "intermediate_size": 57344, "vocab_size": 250880, "torch_dtype": "bfloat16"}
LLAMA2_70B = {"name": "Llama-2-70b", "model_type": "llama", "num_hidden_layers": 80, "hidden_size": 8192,
              "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32000,
              "tie_word_embeddings": False, "torch_dtype": "float16"}
HARDWARE = {"a100-80gb": "A100-SXM-80GB", "h100-80gb": "H100-SXM", "h100-80gb-pcap": "H100-SXM"}


def predict(model, gpu, n_gpu, batch, input_len, output_len) -> dict:
    return slimjax.capacity(model, gpu, int(input_len), int(output_len), int(batch), serving={"n_gpu": int(n_gpu)})


def quantiles(err: np.ndarray) -> dict:
    err = np.asarray(err, float)
    return {"n": int(err.size), "median": float(np.median(err)), "p10": float(np.quantile(err, 0.1)),
            "p90": float(np.quantile(err, 0.9)), "mape": float(np.mean(np.abs(err)))}


def aiconfigurator() -> dict:
    d = pd.read_csv(DATA / "measured" / "serving_h100_trtllm_llama31_8b.csv")
    itl_err, ttft_err = [], []
    for r in d.itertuples():
        p = predict("Llama-3.1-8B", "H100-SXM", r.tp_size, r.batch_size, r.isl, r.osl)
        itl_err.append(p["itl_s"] * 1e3 / r.silicon_tpot_ms - 1)
        ttft_err.append(p["ttft_s"] * 1e3 / r.silicon_ttft_ms - 1)
    return {"rows": len(d), "itl_vs_tpot": quantiles(itl_err), "ttft_screen_vs_mean_ttft": quantiles(ttft_err)}


def splitwise() -> dict:
    d = pd.read_csv(DATA / "measured" / "splitwise_perf_model.csv")
    d = d.groupby(["model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"], as_index=False)[
        ["prompt_time", "token_time"]].median()  # 5 repeats each
    out = {}
    for model, spec in (("llama2-70b", LLAMA2_70B), ("bloom-176b", BLOOM)):
        sub = d[d.model == model]
        itl_err, pre_err = [], []
        for r in sub.itertuples():
            p = predict(spec, HARDWARE[r.hardware], r.tensor_parallel, r.batch_size, r.prompt_size, max(r.token_size, 2))
            pre_err.append(r.batch_size * p["prefill_s"] * 1e3 / r.prompt_time - 1)
            itl_err.append(p["itl_s"] * 1e3 / r.token_time - 1)
        out[model] = {"rows": len(sub), "itl_vs_token_time": quantiles(itl_err), "batch_prefill_vs_prompt_time": quantiles(pre_err)}
    return out


if __name__ == "__main__":
    print(json.dumps({"aiconfigurator_llama31_8b_h100": aiconfigurator(), "splitwise": splitwise()}, indent=1))
