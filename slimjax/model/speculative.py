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
from . import roofline
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


def verify_steps(output_len, acceptance):
    """n_v = ⌈(O − 1)/a⌉: the verify steps that emit a request's O − 1 tokens after its first (⌊m·a⌋ ≥ O − 1)."""
    return jnp.ceil((output_len - 1.0) / acceptance)


def _stepped(line_u, line_v, c0, a):
    """A line u + v·T in the step m, at T_m = c0 + a·m: (u + v·c0, v·a)."""
    return line_u + line_v * c0, line_v * a


def _summed(ops, reads, c0, a, m_window, steps, roof):
    """Σ_{m=1..n} max(ops(T_m)/F, read(T_m)/BW) in closed form (F, BW the ``roof``'s): ``ops`` = (u, v) a line in T,
    ``reads`` = ((u, v) inside the window, (u, v) past it), split at ``m_window`` (T_m ≤ W ⟺ m ≤ m_window)."""
    flops, bandwidth = roof.flops, roof.bandwidth
    a1, b1 = _stepped(ops[0] / flops, ops[1] / flops, c0, a)
    (ui, vi), (uo, vo) = reads
    inside = roofline.max_of_lines(a1, b1, *_stepped(ui / bandwidth, vi / bandwidth, c0, a))
    past = roofline.max_of_lines(a1, b1, *_stepped(uo / bandwidth, vo / bandwidth, c0, a))
    return roofline.sum_max_of_lines(inside, 1.0, jnp.minimum(steps, m_window)) + roofline.sum_max_of_lines(
        past, jnp.clip(m_window + 1.0, 1.0, jnp.maximum(steps + 1.0, 1.0)), steps
    )


def decode_itl(spec: Speculation, batch, input_len, output_len, roof, attn):
    """§4's ITL of B speculating sequences with I-token prompts (``attn`` = a_dec), seconds per token; NaN when O = 1.
    The n_v = ⌈(O − 1)/a⌉ verify steps take their contexts at T_m = I + 1 + (m − 1)·a (the mean of the
    simulation's ⌊(m − 1)·a⌋), each a pass of B·(1 + k) tokens plus k draft passes over the B sequences, the sum in
    closed form on both sides of the window crossover, over the O − 1 tokens (docs/speculative.md)."""
    k, a, share = spec.tokens, spec.acceptance, spec.target_share
    n = batch * (1.0 + k)
    full, sliding, window = roof.kv_per_token_full, roof.kv_per_token_sliding, roof.window
    tail = jnp.where(sliding > 0, sliding * window, 0.0)
    c0 = input_len + 1.0 - a
    steps = verify_steps(output_len, a)
    m_window = jnp.floor((window - c0) / a)

    def reads(fixed, per_kv, per_token):  # (inside, past) lines of fixed + per_kv·B·K(T) + per_token·B·T
        inside = (fixed, batch * (per_kv * (full + sliding) + per_token))
        return inside, (fixed + batch * per_kv * tail, batch * (per_kv * full + per_token))

    verify_ops = (
        2.0 * pass_active_params(roof, n) * n + attn * batch * k * (k + 1.0) / 2.0,
        attn * batch * (1.0 + k),
    )
    verify = _summed(verify_ops, reads(pass_weights_bytes(roof, n), 1.0, 0.0), c0, a, m_window, steps, roof)
    draft_ops = (
        2.0 * (share * pass_active_params(roof, batch) + spec.params) * batch,
        (share * attn + spec.attention_flops) * batch,
    )
    draft_read = reads(share * pass_weights_bytes(roof, batch) + spec.weight_bytes, share, spec.kv_bytes)
    drafts = _summed(draft_ops, draft_read, c0, a, m_window, steps, roof)
    fixed = (
        roof.launch_overhead_s + comm_s(roof, n) + k * spec.layer_share * (roof.launch_overhead_s + comm_s(roof, batch))
    )
    total = verify + k * drafts + steps * fixed
    return jnp.where(output_len > 1, total / jnp.where(output_len > 1, output_len - 1.0, 1.0), jnp.nan)


def prefill_drafts_s(spec: Speculation, roof, attn, input_len, chunk_size):
    """(the draft's passes over a prompt's chunks, one full chunk's): δ(s, 0, 0) per full chunk and δ(n) for the
    last (:func:`slimjax.model.roofline.chunk_count`), seconds; what §4's prefill adds where it speculates."""
    chunks, size = roofline.chunk_count(input_len, chunk_size)
    last = input_len - (chunks - 1.0) * size
    zero = 0.0 * input_len
    one = draft_pass_s(spec, roof, attn, size, zero, zero)
    return (chunks - 1.0) * one + draft_pass_s(spec, roof, attn, last, zero, zero), one
