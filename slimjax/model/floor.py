"""The physical floor under SLIM's times (slimjax's extension; issue 20): the least time the same work can
take on the replica group at 100 % of its peak FLOP/s and bandwidth, with no efficiency, launch or
communication cost. SLIM (§1) has no weight read in its decode term and its fitted α, γ stand in for it
only near the data they were fitted on; far from it a prediction can be faster than the weights can be
read. Every SLIM and slim-kv time is the larger of the model's and this floor: physics, not a fit.

Terms are MODEL.md §4/§4b's at F = n_gpu·F_max (the Tensor Core peak of the weights' precision) and
BW = n_gpu·BW_max (:func:`slimjax.model.calculator.roofline_terms` with ``at_peak``):

    prefill (the batch's B·I prompt tokens as one pass):
        max( B·(2·P_act·I + a_pre·I²/2) / F,  M_W(B·I) / BW )
    decode (the O − 1 steps after the first token, T_j = I + j, summed in closed form as §4 does):
        Σ_j max( B·(2·P_act + a_dec·T_j) / F,  (M_W(B) + B·K(T_j)) / BW )

§4's per-sequence prefills read the weights once per prompt; one pass over the whole batch reads them once,
so this is the lower bound. Seconds.
"""

from __future__ import annotations

import jax.numpy as jnp

from .calculator import roofline_terms
from .experts import weights_read_bytes
from .roofline import DecodeSteps, decode_itl_of, decode_steps

PREFILL_AT_FLOOR, DECODE_AT_FLOOR = 1, 2  # bits of the slim_at_floor flag
FLOOR_FLAGS = ("prefill_at_floor", "decode_at_floor")


def prefill_floor_s(batch, input_len, roof, attn_pre):
    """max(B·(2·P_act·I + a_pre·I²/2)/F, M_W(B·I)/BW), seconds: B prompts of I tokens as one pass at peak."""
    ops = batch * (2.0 * roof.active_params * input_len + attn_pre * input_len * input_len / 2.0)
    read = weights_read_bytes(
        batch * input_len, roof.weights, roof.routed_expert_bytes, roof.n_experts, roof.experts_per_token
    )
    return jnp.maximum(ops / roof.flops, read / roof.bandwidth)


def decode_floor_s(batch, input_len, output_len, roof, attn_dec):
    """Σ_{j=1..O−1} max(B·(2·P_act + a_dec·T_j)/F, (M_W(B) + B·K(T_j))/BW), seconds (0 when O = 1)."""
    return decode_floor_of(decode_steps(batch, input_len, roof, attn_dec), output_len)


def decode_floor_of(steps_of: DecodeSteps, output_len):
    """:func:`decode_floor_s` from the steps' terms at (B, I) (:func:`slimjax.model.roofline.decode_steps`), which
    do not depend on O: a grid computes them once per (B, I), not at every output length."""
    itl = decode_itl_of(steps_of, output_len)
    return jnp.where(output_len > 1, (output_len - 1.0) * jnp.where(output_len > 1, itl, 0.0), 0.0)


def floored(prefill_s, decode_s, prefill_floor, decode_floor):
    """(max(prefill, its floor), max(decode, its floor), flag): flag bit 1 where the prefill floor binds (the
    model's prefill is faster than physics), bit 2 where the decode floor does; 0 where neither."""
    pre_low, dec_low = prefill_floor > prefill_s, decode_floor > decode_s
    flag = jnp.where(pre_low, PREFILL_AT_FLOOR, 0) + jnp.where(dec_low, DECODE_AT_FLOOR, 0)
    return jnp.where(pre_low, prefill_floor, prefill_s), jnp.where(dec_low, decode_floor, decode_s), flag


def floor_inputs(model, gpu, serving) -> dict:
    """What the floor of a group needs: §4's roofline terms at 100 % of its peak (no launch or communication
    cost) and the attention FLOP coefficients (a_pre, a_dec)."""
    roof, a_pre, a_dec = roofline_terms(model, gpu, serving, at_peak=True)
    return dict(roof=roof, a_pre=a_pre, a_dec=a_dec)


def floor_of(inputs: dict, input_len, output_len):
    """``floor(B) -> (prefill floor, decode floor)`` at (I, O) from :func:`floor_inputs`: what
    :func:`slimjax.model.slim.slim_batch_terms` takes."""

    def floor(batch):
        return (
            prefill_floor_s(batch, input_len, inputs["roof"], inputs["a_pre"]),
            decode_floor_s(batch, input_len, output_len, inputs["roof"], inputs["a_dec"]),
        )

    return floor
