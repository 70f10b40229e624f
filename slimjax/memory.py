"""KV-cache and weight memory (MODEL.md §3; source 001 "Memory").

Pure functions of broadcastable arrays; bytes and tokens.
"""

from __future__ import annotations

import jax.numpy as jnp


def kv_bytes_per_layer_token(n_kv_heads, head_dim, kv_dtype_bytes, mla, kv_lora_rank, rope_dim):
    """e_kv, bytes per layer per token (§3).

    Conventional/GQA/MQA attention caches a key and a value vector per KV head:
    e_kv = 2·H_kv·d_h·b_kv. MLA caches the compressed latent and the decoupled RoPE key:
    e_kv = (d_c + d_R)·b_kv (DeepSeek-V2 report, §2.1).
    """
    conventional = 2.0 * n_kv_heads * head_dim * kv_dtype_bytes
    latent = (kv_lora_rank + rope_dim) * kv_dtype_bytes
    return jnp.where(mla > 0, latent, conventional)


def kv_bytes_per_token(n_layers, e_kv):
    """Raw KV bytes per token over all layers, L·e_kv, with no block or overhead factors (§3)."""
    return n_layers * e_kv


def model_kv_bytes_per_layer_token(model):
    """e_kv for a :class:`~slimjax.specs.ModelSpec`."""
    return kv_bytes_per_layer_token(
        model.n_kv_heads, model.head_dim, model.kv_dtype_bytes, model.mla, model.kv_lora_rank, model.rope_dim
    )
