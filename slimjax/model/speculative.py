"""Speculative decoding (docs/speculative.md; slimjax's extension of §4 and §9): each decode step verifies k drafted
tokens per request in one pass of the target and emits, on average, the acceptance length a ∈ [1, 1 + k] of them;
the drafts cost k sequential passes of a draft (an MTP module or an EAGLE head, taken as one layer of the target
plus its LM head, or a separate draft model) over the decoding requests' tokens.

With d decoding requests at contexts T_j (ΣT = C, their target KV ΣK(T_j)) and n prompt tokens in the step:

    verify:  n_tok = d·(1 + k) + n tokens through the target's §9 step, the decodes' attention
             a_dec·Σ_j ((1 + k)·T_j + k(k + 1)/2) FLOPs, their KV read once (the 1 + k queries share one pass)
    draft:   τ_d = k·δ(d, C, ΣK) + [n > 0]·δ(n, 0, 0)
    δ(m, C, K) = max((2·P_d(m)·m + α_d·C)/F, (W_d(m) + κ_d·C + s·K)/BW) + λ·(t_l + comm(m))
             P_d(m) = s·P_act(m) + P_0,  W_d(m) = s·M_W(m) + W_0,  α_d = s·a_dec + α_0
    tokens:  a request's m-th verify step emits ⌊m·a⌋ − ⌊(m − 1)·a⌋ tokens (deterministic accrual: ⌊m·a⌋ after m
             steps, a per step in the long run), at most what is left of its output

s = 1/L for ``mtp`` and ``eagle`` (one layer's share of the target's pass; P_0 = D·V and W_0 = D·V·b_w its LM
head) and 0 for ``draft`` (P_0, W_0, α_0, κ_0 the draft model's active parameters, weight bytes, attention FLOPs and
KV bytes per context token); λ = s + L_0/L (L_0 the draft's own layers) scales the per-pass fixed cost t_l and the
all-reduces. Pure functions of broadcastable arrays: seconds, FLOP, bytes, tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from ..constants import SPECULATIVE_METHODS
from .roofline import comm_s, pass_active_params, pass_weights_bytes

# the methods whose draft is one layer of the target (its MTP module, an EAGLE head) with the target's LM head
LAYER_DRAFTS = ("mtp", "eagle")


class Speculation(NamedTuple):
    """A group's speculative decoding terms (docs/speculative.md), broadcastable arrays."""

    tokens: Any  # k, draft tokens verified per request and step
    acceptance: Any  # a, mean tokens emitted per verify step (the bonus token included)
    target_share: Any  # s: 1/L (mtp, eagle: one layer of the target), 0 (a draft model)
    layer_share: Any  # λ = L_d/L: the draft pass's share of t_l and of the all-reduces
    params: Any  # P_0, active parameters beyond the target's share (an LM head, a draft model)
    weight_bytes: Any  # W_0
    attention_flops: Any  # α_0, FLOPs per context token beyond the target's share
    kv_bytes: Any  # κ_0, KV bytes read per context token beyond the target's share


def target_share(method_code, n_layers):
    """s: 1/L where the method drafts with one layer of the target (:data:`LAYER_DRAFTS`), else 0; ``method_code``
    a method's place in :data:`slimjax.constants.SPECULATIVE_METHODS`."""
    codes = [float(list(SPECULATIVE_METHODS).index(m)) for m in LAYER_DRAFTS]
    layer = (method_code == codes[0]) | (method_code == codes[1])
    return jnp.where(layer, 1.0 / n_layers, 0.0)


def speculation(model, serving) -> Speculation:
    """The terms of a group's serving settings (``speculative_*``, ``acceptance_length``, ``draft_*``: what the
    draft adds beyond the target's share, docs/speculative.md): a layer draft's LM head D·V (b_w bytes each) joins
    P_0 and W_0."""
    share = target_share(serving.speculative_method, model.n_layers)
    head = jnp.where(share > 0, model.hidden * model.vocab, 0.0)
    return Speculation(
        tokens=serving.speculative_tokens,
        acceptance=serving.acceptance_length,
        target_share=share,
        layer_share=share + serving.draft_layers / model.n_layers,
        params=serving.draft_params + head,
        weight_bytes=serving.draft_weight_bytes + head * serving.bytes_per_weight,
        attention_flops=serving.draft_attention_flops,
        kv_bytes=serving.draft_kv_bytes,
    )


def verify_tokens(decodes, tokens):
    """d·(1 + k): the tokens a step's d decoding requests put through the target's pass."""
    return decodes * (1.0 + tokens)


def verify_context_sum(decodes, context_sum, tokens):
    """Σ_j ((1 + k)·T_j + k(k + 1)/2) = (1 + k)·C + d·k(k + 1)/2: the (query × context) token pairs of the verify
    pass's decode queries (a_dec times it is their attention FLOPs)."""
    return (1.0 + tokens) * context_sum + decodes * tokens * (tokens + 1.0) / 2.0


def draft_pass_s(spec: Speculation, roof, a_dec, tokens, context_sum, kv_bytes):
    """δ(m, C, K): one draft pass over ``tokens`` tokens whose contexts sum to ``context_sum`` (their target KV
    ``kv_bytes``), seconds; 0 where ``tokens`` is 0."""
    share = spec.target_share
    params = share * pass_active_params(roof, tokens) + spec.params
    ops = 2.0 * params * tokens + (share * a_dec + spec.attention_flops) * context_sum
    read = share * pass_weights_bytes(roof, tokens) + spec.weight_bytes + spec.kv_bytes * context_sum + share * kv_bytes
    fixed = spec.layer_share * (roof.launch_overhead_s + comm_s(roof, tokens))
    return jnp.where(tokens > 0, jnp.maximum(ops / roof.flops, read / roof.bandwidth) + fixed, 0.0)


def draft_s(spec: Speculation, roof, a_dec, decodes, context_sum, kv_bytes, prompt_tokens):
    """τ_d = k·δ(d, C, ΣK) + δ(n, 0, 0): a step's drafting for its d decoding requests and its n prompt tokens."""
    zero = 0.0 * context_sum
    return spec.tokens * draft_pass_s(spec, roof, a_dec, decodes, context_sum, kv_bytes) + draft_pass_s(
        spec, roof, a_dec, prompt_tokens, zero, zero
    )


def emitted_tokens(verify_steps, acceptance):
    """⌊m·a⌋: tokens a request's first m verify steps emit in all (after its first token)."""
    return jnp.floor(verify_steps * acceptance)


def resident_bytes(spec_tokens, target_share, target_weight_bytes, draft_weight_bytes):
    """What the draft keeps in memory beside the target: one layer's weights (mtp, eagle: s·M_W; the LM head is the
    target's own) or the draft model's W_0; 0 without speculation (k = 0), bytes."""
    return jnp.where(spec_tokens > 0, target_share * target_weight_bytes + draft_weight_bytes, 0.0)
