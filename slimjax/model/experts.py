"""Mixture of experts and MLA on the roofline (MODEL.md §4b; slimjax's extension beyond source 001).

E routed experts per MoE layer, k per token, D_e expert FFN width, L_moe MoE layers; one routed expert
holds P_e = n_ffn·D·D_e weights. Dense models (E = 0) reduce every formula to §4's exactly.
Pure functions of broadcastable arrays; weights, bytes, FLOP.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import ndtri


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


def weights_read_bytes(
    n_tokens, weights, routed_expert_bytes, n_experts, experts_per_token, dp_ranks=1.0, expert_bandwidth_efficiency=1.0
):
    """M_W(n) = b_w·[P − L_moe·(E − E_t(n))·P_e] = M_W − (E − E_t(n))·b_w·L_moe·P_e: weight bytes a pass
    over n tokens reads (``routed_expert_bytes`` = b_w·L_moe·P_e, one expert across the MoE layers;
    = M_W for dense). On one of D attention data-parallel ranks (docs/layouts.md), in group units: the dense part
    whole and its 1/D share of the routed experts the D ranks' D·n tokens touch, E_t(D·n)·b_w·L_moe·P_e/D (every
    expert GPU reads its touched experts once for all ranks), at 1/e_XB where the experts' grouped GEMMs stream their
    weights at a fraction e_XB of the dense kernels' bandwidth (``expert_bandwidth_efficiency``); D = e_XB = 1: §4b."""
    touched = distinct_experts(dp_ranks * n_tokens, n_experts, experts_per_token) / (
        dp_ranks * expert_bandwidth_efficiency
    )
    return weights - (n_experts - touched) * routed_expert_bytes


def attention_flops_coefficients(n_layers, n_heads, head_dim, mla, kv_lora_rank, rope_dim, qk_nope_dim, v_head_dim):
    """(a_pre, a_dec): attention FLOPs per (query token × context token) in prefill and in decode.

    Conventional attention: a = 4·L·H_q·d_h for both (§4). MLA with weights absorbed in decode:
    a_dec = 2·L·H_q·(2·d_c + d_R); prefill decompressed: a_pre = 2·L·H_q·(d_nope + d_R + d_v) (§4b).
    """
    dense = 4.0 * n_layers * n_heads * head_dim
    a_pre = jnp.where(mla > 0, 2.0 * n_layers * n_heads * (qk_nope_dim + rope_dim + v_head_dim), dense)
    a_dec = jnp.where(mla > 0, 2.0 * n_layers * n_heads * (2.0 * kv_lora_rank + rope_dim), dense)
    return a_pre, a_dec


def expected_max_standard_normal(m):
    """E[max of m independent standard normals] by Blom's plotting position Φ⁻¹((m − 0.375)/(m + 0.25)): 0 at m = 1,
    0.589 at 2 (exact 0.564), 1.434 at 8 (1.423), 2.337 at 64 (2.343)."""
    m = jnp.maximum(m, 1.0)
    return jnp.where(m > 1, ndtri((m - 0.375) / (m + 0.25)), 0.0)


def expert_imbalance(n_tokens, n_experts, experts_per_token, expert_ranks, skew=1.0, max_normal=None):
    """ι ≥ 1: the busiest of ep expert ranks' routed-token load over the mean n·k/ep, for n tokens routed top-k over
    E experts held E/ep per rank (docs/layouts.md). Under uniform routing a token sends k/ep of its k choices to a
    rank on average, with variance σ² = k·(1/ep)(1 − 1/ep)(E − k)/(E − 1) (k draws without replacement); over n
    tokens the ep loads are near normal, so ι_u = 1 + c(ep)·σ/(μ·√n) with μ = k/ep and c(ep) the expected largest
    of ep standard normals (:func:`expected_max_standard_normal`). Routing that is not uniform multiplies it by
    ``skew`` ≥ 1 (a redundant-expert balancer brings it towards 1); bounded by ep·min(k, E/ep)/k, every choice of
    every token on one rank. 1 where ep = 1, for a dense model or no tokens. ``max_normal``: c(ep) computed once
    (:func:`expected_max_standard_normal` of ``expert_ranks``; the roofline record keeps it), not at every
    evaluation (a simulation's steps evaluate this per lane and per step)."""
    on = (expert_ranks > 1) & (n_experts > 1) & (n_tokens > 0)
    e = jnp.where(on, n_experts, 2.0)
    k = jnp.where(on, experts_per_token, 1.0)
    ep = jnp.where(on, expert_ranks, 2.0)
    n = jnp.where(on, n_tokens, 1.0)
    mean = k / ep
    sd = jnp.sqrt(k * (1.0 / ep) * (1.0 - 1.0 / ep) * (e - k) / (e - 1.0))
    c = expected_max_standard_normal(ep) if max_normal is None else max_normal
    uniform = 1.0 + c * sd / (mean * jnp.sqrt(n))
    bound = ep * jnp.minimum(k, e / ep) / k
    return jnp.where(on, jnp.minimum(skew * uniform, bound), 1.0)
