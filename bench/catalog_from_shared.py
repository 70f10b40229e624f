"""Write catalog entries (configs/models.yaml) for the Hugging Face configs in ../shared/data/models.

    python bench/catalog_from_shared.py > /tmp/entries.yaml     # then review and paste

Keeps the config keys slimjax reads (MODEL.md §0, §4b) verbatim and adds num_parameters as counted by
slimjax's reader (MODEL.md §0, extended to experts and MLA), so memory does not depend on the reader's
defaults changing later. Published totals are checked in tests/test_moe_tp.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

import slimjax
from slimjax.inputs.catalog import model_from_hf

KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "top_k_experts",
    "n_shared_experts",
    "first_k_dense_replace",
    "interleave_moe_layer_step",
    "decoder_sparse_step",
    "enable_moe_block",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "sliding_window",
    "use_sliding_window",
    "sliding_window_pattern",
    "layer_types",
    "torch_dtype",
    "dtype",
    "hidden_act",
    "hidden_activation",
    "quantization_config",
)
NAMES = {  # catalog label per config file stem
    "deepseek-ai--DeepSeek-V3": "DeepSeek-V3",
    "deepseek-ai--DeepSeek-R1": "DeepSeek-R1",
    "Qwen--Qwen3-8B": "Qwen3-8B",
    "Qwen--Qwen3-32B": "Qwen3-32B",
    "Qwen--Qwen3-30B-A3B": "Qwen3-30B-A3B",
    "Qwen--Qwen3-235B-A22B": "Qwen3-235B-A22B",
    "openai--gpt-oss-20b": "gpt-oss-20b",
    "openai--gpt-oss-120b": "gpt-oss-120b",
    "mistralai--Mixtral-8x22B-v0.1": "Mixtral-8x22B",
    "meta-llama--Meta-Llama-3.1-405B": "Llama-3.1-405B",
    "meta-llama--Llama-4-Scout-17B-16E-Instruct": "Llama-4-Scout-17B-16E",
    "google--gemma-4-26B-A4B": "gemma-4-26B-A4B",
    # architectures of the measured serving runs (models/serving/, aiconfigurator's model_configs)
    "serving/MiniMaxAI--MiniMax-M2.5": "MiniMax-M2.5",
    "serving/moonshotai--Kimi-K2.5": "Kimi-K2.5",
}


def main() -> None:
    slimjax.configure()
    root = Path(os.environ.get("SLIMJAX_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "models"
    out = {}
    for stem, label in NAMES.items():
        raw = json.loads((root / f"{stem}_config.json").read_text())
        cfg = raw.get("text_config", raw)
        entry = {"aliases": [stem.split("/")[-1].replace("--", "/")]}
        entry.update({k: cfg[k] for k in KEYS if cfg.get(k) is not None})
        entry["num_parameters"] = int(model_from_hf(cfg)["n_params"])
        entry["source"] = f"models/{stem}_config.json (verbatim HF keys); num_parameters counted by slimjax's reader"
        out[label] = entry
    yaml.safe_dump(out, sys.stdout, sort_keys=False, default_flow_style=None, width=200)


if __name__ == "__main__":
    main()
