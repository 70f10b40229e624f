"""The optional "slim-kv" variant of SLIM (MODEL.md §1 is the contract and what sweeps evaluate unless
they ask for ``slim_variant: slim-kv``; `slimjax validate` measures what this variant buys).

Three departures the measured vLLM curves call for:

1. Eq. 9 multiplies the KV reads by (B + B0)/η_m, so at B = 1 one sequence's cache is charged 1 + B0
   times. Here each of the B sequences reads its own cache once per step, at η_m·BW_max; B0 stays
   with the dense term (the weights, read once per step whatever B is).
2. The dense decode step reads the weights, so it scales with their bytes P·b_w (Eq. 10's L·D²
   misses the FFN ratio and the vocabulary: Qwen2-7B decodes no faster than Llama-3-8B) and with
   the GPU's bandwidth, so coefficients transfer across GPUs: α and γ are seconds on a 1 TB/s device
   (per output token, and per output token per GB of weights). η_m no longer divides this term:
   α and γ absorb its efficiency.
3. A batch larger than the KV cache holds (§3 max_seqs at the serving defaults) runs at the
   concurrency that fits.

The dense term reads the weights at an effective bandwidth BW_eff = BW_max·(BW_max/10¹² B/s)^(β−1), so it
scales as BW_max^(−β). On one GPU β is absorbed by α and γ (any β fits the same); across GPUs it says how
much of a faster memory the weight reads actually get: β = 1 is the datasheet ratio; measured A100 ↔ H100
transfers speed up by less than the bandwidth ratio and want β < 1 (bench/gpu_transfer.py; the shipped
value is the ``bandwidth_exponent`` of the shipped slim-kv coefficients, configs/slim). The KV reads stay at
η_m·BW_max (η_m a
fraction of the peak).
"""

from __future__ import annotations

import jax.numpy as jnp

from .floor import floored
from .rates import token_throughput
from .slim import e2e_latency, free_parts, slim_cell_terms

REFERENCE_BANDWIDTH = 1e12  # bytes/s: slim-kv's α and γ are seconds on a device of this bandwidth


def kv_limited_concurrency(batch, max_seqs):
    """B_eff = min(B, max_seqs), sequences decoding at once when the cache holds max_seqs (§3).

    max_seqs < 1 (not even one sequence fits) is taken as 1 so the formula stays finite.
    """
    return jnp.minimum(batch, jnp.maximum(max_seqs, 1.0))


def kv_limited_e2e(batch, max_seqs, e2e_at_concurrency):
    """E2E(B) = (B / B_eff) · E2E(B_eff), seconds: a batch beyond the cache runs as B / B_eff
    back-to-back waves at the largest concurrency that fits (continuous batching refills slots as
    sequences finish, so the wave count is fractional)."""
    return batch / kv_limited_concurrency(batch, max_seqs) * e2e_at_concurrency


def effective_bandwidth(peak_bandwidth, exponent):
    """BW_eff = BW_max·(BW_max / 10¹² B/s)^(β − 1), bytes/s (exactly BW_max at β = 1)."""
    return peak_bandwidth * (peak_bandwidth / REFERENCE_BANDWIDTH) ** (exponent - 1.0)


def weight_read_time(alpha, gamma, weights, output_len, peak_bandwidth):
    """T_w = (α + γ·W/10⁹)·O·(10¹²/BW_max), seconds: the dense decode term of the slim-kv variant,
    for W bytes of weights (P·b_w) read once per step; α, γ are seconds on a 1 TB/s device."""
    return (alpha + gamma * weights / 1e9) * output_len * (REFERENCE_BANDWIDTH / peak_bandwidth)


def slim_kv_decode_time(batch, B0, eta_m, dense_s, kv_traffic, peak_bandwidth):
    """T_dec = (B + B0)·T_w + B·M_dec/(η_m·BW_max), seconds (slim-kv variant of Eq. 9)."""
    return (batch + B0) * dense_s + batch * kv_traffic / (eta_m * peak_bandwidth)


def slim_kv_cell_terms(
    model, gpu, coeffs, input_len, output_len, max_seqs, n_gpu=1.0, kv_dtype_bytes=None, bandwidth_exponent=1.0
):
    """The batch-independent slim-kv terms of each (model, GPU, I, O) cell: §1's f1, p1 and M_dec
    (:func:`slim_cell_terms`), the weight-read step T_w at the effective bandwidth (exponent β), the
    peak bandwidth the KV reads use, and max_seqs (§3, given: it depends on the serving settings)."""
    cell = slim_cell_terms(model, gpu, coeffs, input_len, output_len, n_gpu, kv_dtype_bytes)
    bandwidth = n_gpu * gpu.bandwidth_bytes_per_s
    weights_bandwidth = effective_bandwidth(bandwidth, bandwidth_exponent)
    t_w = weight_read_time(
        coeffs.alpha, coeffs.gamma, model.n_params * model.bytes_per_weight, output_len, weights_bandwidth
    )
    return dict(
        f1=cell["f1"],
        p1=cell["p1"],
        kv_traffic_bytes=cell["kv_traffic_bytes"],
        t_w=t_w,
        bandwidth=bandwidth,
        t_alpha=coeffs.alpha * output_len * (REFERENCE_BANDWIDTH / weights_bandwidth),
        max_seqs=max_seqs,
    )


def slim_kv_batch_terms(cell, coeffs, batch, input_len, output_len, floor=None):
    """slim-kv at batch B from :func:`slim_kv_cell_terms`: the B/B_eff waves' total prefill and decode
    times (slim_prefill_s = B·p1 whatever the waves), E2E and throughput. ``floor`` as in
    :func:`slimjax.model.slim.slim_batch_terms`: each wave's prefill and decode at least their floors at B_eff."""
    b_eff = kv_limited_concurrency(batch, cell["max_seqs"])
    waves = batch / b_eff
    t_pre = b_eff * cell["p1"]
    t_dec = slim_kv_decode_time(
        b_eff, coeffs.B0, coeffs.eta_m, cell["t_w"], cell["kv_traffic_bytes"], cell["bandwidth"]
    )
    all_pre = (
        batch * cell["p1"]
    )  # all waves' prefill: (B/B_eff)·B_eff·p1 = B·p1, computed so (its dims have no output length)
    flag = None
    if floor is not None:
        t_pre, t_dec, flag = floored(t_pre, t_dec, *floor(b_eff))
        all_pre = jnp.maximum(all_pre, floor(batch)[0])
    e2e = kv_limited_e2e(batch, cell["max_seqs"], e2e_latency(t_pre, t_dec, coeffs.t_fixed))
    out = dict(
        prefill_flops=batch * cell["f1"],
        slim_prefill_s=all_pre,
        slim_decode_s=waves * t_dec,
        slim_e2e_s=e2e,
        slim_throughput=token_throughput(batch, input_len, output_len, e2e),
        slim_waves=waves,
        _b_eff=b_eff,
        _round_prefill_s=t_pre,
    )
    if flag is not None:
        out["slim_at_floor"] = flag
    return out


def slim_kv_log_throughput_sensitivity(cell, coeffs, batch, terms):
    """∂ log T / ∂ log θ for θ = (η_c, η_m, B0, α, γ, t_fixed) of the slim-kv variant, on a trailing axis.

    E2E = w·[b·p1 + (b + B0)·T_w + b·M_dec/(η_m·BW) + t_fixed] with w = B/b, b = B_eff, p1 ∝ 1/η_c and
    T_w = (α + γ·W/10⁹)·O·(10¹²/BW): each entry is −θ_k·(∂E2E/∂θ_k)/E2E.
    """
    e2e, w, b = terms["slim_e2e_s"], terms["slim_waves"], terms["_b_eff"]
    slots = w * (b + coeffs.B0)
    pre, dec = free_parts(terms)
    parts = (
        pre * w * terms["_round_prefill_s"],
        dec * w * b * cell["kv_traffic_bytes"] / (coeffs.eta_m * cell["bandwidth"]),
        -dec * w * coeffs.B0 * cell["t_w"],
        -dec * slots * cell["t_alpha"],
        -dec * slots * (cell["t_w"] - cell["t_alpha"]),
        -w * coeffs.t_fixed,
    )
    return jnp.stack([jnp.broadcast_to(p, jnp.shape(e2e)) / e2e for p in parts], axis=-1)


def slim_kv_variables(
    model, gpu, coeffs, batch, input_len, output_len, max_seqs, n_gpu=1.0, bandwidth_exponent=1.0, floor=None
):
    """The slim-kv variant of SLIM (MODEL.md §1) at B_eff = min(B, max_seqs):

        T_pre = B_eff·F_pre,1 / (η_c·F_max)
        T_w   = (α + γ·P·b_w / 10⁹ B)·O · (10¹² B/s / BW_eff)
        T_dec = (B_eff + B0)·T_w + B_eff·M_dec / (η_m·BW_max)
        E2E   = (B / B_eff) · (T_pre + T_dec + t_fixed),   T = B·(I+O)/E2E

    with BW_eff = :func:`effective_bandwidth` (BW_max at β = 1).

    Returns slim_prefill_s (one round's prefill, s), slim_e2e_s (s) and slim_throughput (tokens/s); ``floor`` as in
    :func:`slimjax.model.slim.slim_variables`.
    """
    cell = slim_kv_cell_terms(
        model, gpu, coeffs, input_len, output_len, max_seqs, n_gpu, bandwidth_exponent=bandwidth_exponent
    )
    out = slim_kv_batch_terms(cell, coeffs, batch, input_len, output_len, floor)
    return {
        "slim_prefill_s": out["_round_prefill_s"],
        "slim_e2e_s": out["slim_e2e_s"],
        "slim_throughput": out["slim_throughput"],
    }
