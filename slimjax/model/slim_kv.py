"""The optional "slim-kv" variant of SLIM (MODEL.md §1 is the contract; sweeps always evaluate §1,
`slimjax validate` measures what this variant buys).

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
"""

from __future__ import annotations

import jax.numpy as jnp

from .rates import token_throughput
from .slim import e2e_latency, slim_cell_terms

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


def weight_read_time(alpha, gamma, weights, output_len, peak_bandwidth):
    """T_w = (α + γ·W/10⁹)·O·(10¹²/BW_max), seconds: the dense decode term of the slim-kv variant,
    for W bytes of weights (P·b_w) read once per step; α, γ are seconds on a 1 TB/s device."""
    return (alpha + gamma * weights / 1e9) * output_len * (REFERENCE_BANDWIDTH / peak_bandwidth)


def slim_kv_decode_time(batch, B0, eta_m, dense_s, kv_traffic, peak_bandwidth):
    """T_dec = (B + B0)·T_w + B·M_dec/(η_m·BW_max), seconds (slim-kv variant of Eq. 9)."""
    return (batch + B0) * dense_s + batch * kv_traffic / (eta_m * peak_bandwidth)


def slim_kv_variables(model, gpu, coeffs, batch, input_len, output_len, max_seqs, n_gpu=1.0):
    """The slim-kv variant of SLIM (MODEL.md §1) at B_eff = min(B, max_seqs):

        T_pre = B_eff·F_pre,1 / (η_c·F_max)
        T_w   = (α + γ·P·b_w / 10⁹ B)·O · (10¹² B/s / BW_max)
        T_dec = (B_eff + B0)·T_w + B_eff·M_dec / (η_m·BW_max)
        E2E   = (B / B_eff) · (T_pre + T_dec + t_fixed),   T = B·(I+O)/E2E

    Returns slim_prefill_s (one round's prefill, s), slim_e2e_s (s) and slim_throughput (tokens/s).
    """
    b_eff = kv_limited_concurrency(batch, max_seqs)
    cell = slim_cell_terms(model, gpu, coeffs, input_len, output_len, n_gpu)  # p1 and M_dec as in §1
    bandwidth = n_gpu * gpu.bandwidth_bytes_per_s
    t_w = weight_read_time(coeffs.alpha, coeffs.gamma, model.n_params * model.bytes_per_weight, output_len, bandwidth)
    t_pre = b_eff * cell["p1"]
    t_dec = slim_kv_decode_time(b_eff, coeffs.B0, coeffs.eta_m, t_w, cell["kv_traffic_bytes"], bandwidth)
    e2e = kv_limited_e2e(batch, max_seqs, e2e_latency(t_pre, t_dec, coeffs.t_fixed))
    return {"slim_prefill_s": t_pre, "slim_e2e_s": e2e, "slim_throughput": token_throughput(batch, input_len, output_len, e2e)}
