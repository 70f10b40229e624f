"""Mixture of experts and MLA on the roofline (MODEL.md §4b; slimjax's extension beyond source 001).

E routed experts per MoE layer, k per token, D_e expert FFN width, L_moe MoE layers; one routed expert
holds P_e = n_ffn·D·D_e weights. Dense models (E = 0) reduce every formula to §4's exactly.
Pure functions of broadcastable arrays; weights, bytes, FLOP.
"""

from __future__ import annotations

import jax.numpy as jnp


def expert_params(n_ffn, hidden, expert_ffn_dim):
    """P_e = n_ffn·D·D_e, weights of one routed expert in one layer."""
    return n_ffn * hidden * expert_ffn_dim


def active_params(n_params, n_moe_layers, n_experts, experts_per_token, expert_param_count):
    """P_act = P − L_moe·(E − k)·P_e, the weights one token uses (= P when E = 0)."""
    return n_params - n_moe_layers * (n_experts - experts_per_token) * expert_param_count


def distinct_experts(n_tokens, n_experts, experts_per_token):
    """E_t(n) = E·(1 − (1 − k/E)^n), expected distinct experts per layer that n tokens route to under
    uniform top-k routing (0 when E = 0)."""
    safe = jnp.where(n_experts > 0, n_experts, 1.0)
    return jnp.where(n_experts > 0, n_experts * (1.0 - (1.0 - experts_per_token / safe) ** n_tokens), 0.0)


def weights_read_bytes(n_tokens, weights, routed_expert_bytes, n_experts, experts_per_token):
    """M_W(n) = b_w·[P − L_moe·(E − E_t(n))·P_e] = M_W − (E − E_t(n))·b_w·L_moe·P_e: weight bytes a pass
    over n tokens reads (``routed_expert_bytes`` = b_w·L_moe·P_e, one expert across the MoE layers;
    = M_W for dense)."""
    return weights - (n_experts - distinct_experts(n_tokens, n_experts, experts_per_token)) * routed_expert_bytes


def attention_flops_coefficients(n_layers, n_heads, head_dim, mla, kv_lora_rank, rope_dim, qk_nope_dim, v_head_dim):
    """(a_pre, a_dec): attention FLOPs per (query token × context token) in prefill and in decode.

    Conventional attention: a = 4·L·H_q·d_h for both (§4). MLA with weights absorbed in decode:
    a_dec = 2·L·H_q·(2·d_c + d_R); prefill decompressed: a_pre = 2·L·H_q·(d_nope + d_R + d_v) (§4b).
    """
    dense = 4.0 * n_layers * n_heads * head_dim
    a_pre = jnp.where(mla > 0, 2.0 * n_layers * n_heads * (qk_nope_dim + rope_dim + v_head_dim), dense)
    a_dec = jnp.where(mla > 0, 2.0 * n_layers * n_heads * (2.0 * kv_lora_rank + rope_dim), dense)
    return a_pre, a_dec
