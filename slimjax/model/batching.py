"""One engine step of continuous batching (MODEL.md §9; slimjax's extension): the time of a pass that
decodes one token for each running request and prefills chunks of the admitted prompts, from the same
roofline terms as §4/§4b/§4c's decode steps and prefill chunks.

A step holding d decode tokens (contexts T_j) and prefill chunks of n_i new tokens after p_i earlier ones,
n_tok = d + Σ n_i tokens in all:

    ops   = 2·P_act·n_tok + a_dec·Σ_decode T_j + a_pre·Σ_chunks (n_i·p_i + n_i²/2)
    bytes = M_W(n_tok) + Σ_decode K(T_j) + Σ_chunks K(p_i)
    τ     = max(ops/F, bytes/BW) + t_l + t_step + 2·L·t_ar(n_tok·D·b_a)

With t_step = 0 a decode-only step of B requests at context T is §4's t_j and a one-request prefill step is
§4's chunk t_k (the same terms, so the two models cannot drift apart). Pure functions of broadcastable
arrays; seconds, FLOP, bytes, tokens.
"""

from __future__ import annotations

import jax.numpy as jnp

from .calculator import kv_capacity, replica_engines, roofline_terms
from .memory import kv_read_bytes, model_kv_bytes_per_layer_token, seq_footprint_bytes
from .pipeline import stage_fraction
from .roofline import comm_s, pass_active_params, pass_weights_bytes
from .speculative import speculation

# Speculation's fields (slimjax.model.speculative): the replica_terms key of each
SPECULATION_TERMS = {
    "tokens": "speculative_tokens",
    "acceptance": "acceptance_length",
    "target_share": "draft_target_share",
    "layer_share": "draft_layer_share",
    "params": "draft_params",
    "weight_bytes": "draft_weight_bytes",
    "attention_flops": "draft_attention_flops",
    "kv_bytes": "draft_kv_bytes",
}


def step_work(
    n_tokens, decode_context_sum, decode_kv_bytes, chunk_attention_tokens, chunk_kv_bytes, roof, a_pre, a_dec
):
    """(FLOPs, bytes read) of one engine step: 2·P_act·n_tok + a_dec·ΣT_j + a_pre·Σ(n_i·p_i + n_i²/2) and
    M_W(n_tok) + ΣK(T_j) + ΣK(p_i). ``roof``: :class:`slimjax.model.roofline.Roof`."""
    ops = (
        2.0 * pass_active_params(roof, n_tokens) * n_tokens
        + a_dec * decode_context_sum
        + a_pre * chunk_attention_tokens
    )
    return ops, pass_weights_bytes(roof, n_tokens) + decode_kv_bytes + chunk_kv_bytes


def step_time(
    n_tokens,
    decode_context_sum,
    decode_kv_bytes,
    chunk_attention_tokens,
    chunk_kv_bytes,
    roof,
    a_pre,
    a_dec,
    step_overhead_s=0.0,
):
    """τ = max(ops/F, bytes/BW) + t_l + t_step + 2·L·t_ar(n_tok·D·b_a), seconds (§9 step 3)."""
    ops, read = step_work(
        n_tokens, decode_context_sum, decode_kv_bytes, chunk_attention_tokens, chunk_kv_bytes, roof, a_pre, a_dec
    )
    comm = comm_s(roof, n_tokens)
    return jnp.maximum(ops / roof.flops, read / roof.bandwidth) + roof.launch_overhead_s + step_overhead_s + comm


def context_kv_bytes(tokens, roof):
    """K(T) of one sequence holding T tokens, from the roofline's per-token rates (§4)."""
    return kv_read_bytes(tokens, roof.kv_per_token_full, roof.kv_per_token_sliding, roof.window)


def chunk_attention_tokens(new_tokens, earlier_tokens):
    """n·p + n²/2: the (query × context) token pairs of a chunk of n new tokens after p earlier ones."""
    return new_tokens * earlier_tokens + new_tokens * new_tokens / 2.0


def replica_terms(model, gpu, serving) -> dict:
    """What one engine's steps need (§9 on §3/§4/§4b/§4c): the roofline record (:class:`slimjax.model.roofline.Roof`:
    serving efficiencies, t_l and the all-reduce), a_pre, a_dec, t_step, N_tok, s and the KV pool, shaped like the
    specs. A group of n_pp pipeline stages runs n_pp virtual engines (§10): each step is τ_pp (the roofline record
    of :func:`slimjax.model.pipeline.pipeline_roof`, n_pp·t_step), each engine holds 1/n_pp of the stage's KV
    pool, and ``engines`` says how many engines a replica has, n_pp·D with D attention data-parallel ranks
    (docs/layouts.md; its batch limit is ⌊B/(n_pp·D)⌋ each).

    The KV policy's terms (docs/engines.md): ``kv_policy`` (its code in :data:`slimjax.constants.KV_POLICIES`),
    and for a paged cache the layer-block u(T) = L_f·⌈T/β⌉ + L_s·⌈min(T, W)/β⌉ (``kv_block_size`` β,
    ``kv_full_layers``, ``kv_sliding_layers``, ``kv_window``), its bytes f·r·o·e_kv·β (``kv_unit_bytes``), the
    engine's pool in them U = ⌊pool/unit⌋ (``kv_pool_units``) and the admission watermark ⌈w·U⌉
    (``kv_watermark_units``); ``prefill_first`` (1: a step with prompt tokens runs them alone). Speculative
    decoding's terms (docs/speculative.md): :data:`SPECULATION_TERMS` (``speculative_tokens`` k, 0: none)."""
    roof, a_pre, a_dec = roofline_terms(model, gpu, serving)
    stages = serving.pipeline_stages
    pool = kv_capacity(model, gpu, serving, 1.0, 0.0)["pool"]
    unit = (
        stage_fraction(model.n_layers, stages)
        * serving.kv_replication
        * serving.kv_overhead
        * model_kv_bytes_per_layer_token(model, serving.kv_dtype_bytes)
        * serving.block_size
    )
    pool_units = jnp.maximum(jnp.floor(pool / stages / unit), 0.0)
    return dict(
        roof=roof,
        a_pre=a_pre,
        a_dec=a_dec,
        step_overhead_s=stages * serving.step_overhead_s,
        step_tokens=serving.step_tokens,
        chunk_size=serving.chunk_size,
        pool=pool / stages,
        pipeline_stages=stages,
        engines=replica_engines(serving),
        prefill_first=serving.prefill_first,
        kv_policy=serving.kv_policy,
        kv_block_size=serving.block_size,
        kv_full_layers=model.n_layers - model.n_sliding_layers,
        kv_sliding_layers=model.n_sliding_layers,
        kv_window=model.window,
        kv_unit_bytes=unit,
        kv_pool_units=pool_units,
        kv_watermark_units=jnp.ceil(serving.kv_watermark * pool_units),
        **{SPECULATION_TERMS[f]: v for f, v in speculation(model, serving)._asdict().items()},
    )


def request_footprint_bytes(model, serving, tokens):
    """footprint(I + O) of §3 reserved at admission for a request of ``tokens`` = I + O (broadcasts), on the
    largest stage's layers when the group has n_pp stages (§10: f·footprint, f = ⌈L/n_pp⌉/L)."""
    e_kv = model_kv_bytes_per_layer_token(model, serving.kv_dtype_bytes)
    return stage_fraction(model.n_layers, serving.pipeline_stages) * seq_footprint_bytes(
        e_kv,
        model.n_layers,
        model.n_sliding_layers,
        model.window,
        tokens,
        serving.block_size,
        serving.kv_replication,
        serving.kv_overhead,
    )
