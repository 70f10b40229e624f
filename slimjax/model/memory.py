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


def model_kv_bytes_per_layer_token(model, kv_dtype_bytes=None):
    """e_kv for a :class:`~slimjax.specs.ModelSpec` (``kv_dtype_bytes`` overrides the model's)."""
    b_kv = model.kv_dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    return kv_bytes_per_layer_token(
        model.n_kv_heads, model.head_dim, b_kv, model.mla, model.kv_lora_rank, model.rope_dim
    )


def weights_bytes(n_params, bytes_per_weight):
    """M_W = P·b_w, resident weights of the whole group, bytes (§3); b_w = ``bytes_per_weight``."""
    return n_params * bytes_per_weight


def kv_pool_bytes(memory_utilization, group_memory_bytes, weights, reserved_bytes):
    """pool = u·M − M_W − M_R, bytes left for the KV cache (may be negative: weights do not fit)."""
    return memory_utilization * group_memory_bytes - weights - reserved_bytes


def round_to_blocks(n_tokens, block_size):
    """rnd(n) = ⌈n/β⌉·β, tokens held in whole cache blocks."""
    return jnp.ceil(n_tokens / block_size) * block_size


def kv_block_units(tokens, block_size, full_layers, sliding_layers, window):
    """u(T) = L_f·⌈T/β⌉ + L_s·⌈min(T, W)/β⌉: the layer-blocks a paged cache holds for a sequence of T tokens
    (docs/engines.md). One layer-block is β tokens of one layer's KV, r·o·e_kv·β bytes, so §3's footprint(T) is
    u(T) of them exactly."""
    return full_layers * jnp.ceil(tokens / block_size) + sliding_layers * jnp.ceil(
        jnp.minimum(tokens, window) / block_size
    )


def seq_footprint_bytes(e_kv, n_layers, n_sliding_layers, window, tokens, block_size, kv_replication, kv_overhead):
    """r·o·e_kv·[L_f·rnd(N) + L_s·rnd(min(N, W))], bytes reserved per sequence of N = I + O tokens (§3).

    Sliding layers keep an ideal rolling buffer of W tokens (Mistral 7B, §2).
    """
    full = n_layers - n_sliding_layers
    return (
        kv_replication
        * kv_overhead
        * e_kv
        * (
            full * round_to_blocks(tokens, block_size)
            + n_sliding_layers * round_to_blocks(jnp.minimum(tokens, window), block_size)
        )
    )


def max_concurrent_seqs(pool, footprint):
    """max_seqs = ⌊pool / footprint⌋ if pool > 0 else 0, exact (§3).

    The quotient is corrected by one either way so the result is exact even where rounding of the
    division lands on the wrong side of an integer (pool and footprint in float64).
    """
    q = jnp.floor(pool / footprint)
    q = jnp.where((q + 1.0) * footprint <= pool, q + 1.0, q)
    q = jnp.where(q * footprint > pool, q - 1.0, q)
    return jnp.where(pool > 0, jnp.maximum(q, 0.0), 0.0)


def kv_read_bytes(tokens, per_token_full, per_token_sliding, window):
    """K(T) = r·o·e_kv·[L_f·T + L_s·min(T, W)], KV bytes read for one sequence holding T tokens (§4),
    from its per-token rates ``per_token_full`` = r·o·e_kv·L_f and ``per_token_sliding`` = r·o·e_kv·L_s
    (the roofline's prefill chunks; its decode sums split K at the window in closed form)."""
    return per_token_full * tokens + per_token_sliding * jnp.minimum(tokens, window)
