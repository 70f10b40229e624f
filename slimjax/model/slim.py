"""The SLIM performance model (MODEL.md §1; source 000, Eqs. 4–12).

Pure functions of broadcastable arrays. Units: tokens, FLOP, FLOP/s, bytes, bytes/s, seconds.
"""

from __future__ import annotations

import jax.numpy as jnp

from .floor import DECODE_AT_FLOOR, PREFILL_AT_FLOOR, floored
from .memory import kv_bytes_per_token, model_kv_bytes_per_layer_token
from .rates import token_throughput


def prefill_flops(n_layers, hidden, kv_width, ffn_dim, n_ffn, batch, input_len):
    """F_pre, FLOP of the prefill of B prompts of I tokens (Eq. 8, generalised to n_ffn).

    F_pre = L·[B·I·(4D² + 4·D·D_kv + 2·n_ffn·r_ff·D²) + 4·B·I²·D], r_ff = D_ff/D, so the FFN
    term is 2·n_ffn·D_ff·D (n_ffn = 2 gives the paper's 4·r_ff·D²).
    """
    per_token = 4.0 * hidden * hidden + 4.0 * hidden * kv_width + 2.0 * n_ffn * ffn_dim * hidden
    bi = batch * input_len
    return n_layers * (bi * per_token + 4.0 * bi * input_len * hidden)


def slim_prefill_time(flops, eta_c, peak_flops):
    """T_pre = F_pre / (η_c·F_max), seconds (Eq. 7)."""
    return flops / (eta_c * peak_flops)


def decode_context_sum(input_len, output_len):
    """C(I, O) = Σ_{j=1..O} (I + j) = O·(I+1) + O·(O−1)/2, token-positions read in decode (Eq. 12)."""
    return output_len * (input_len + 1.0) + output_len * (output_len - 1.0) / 2.0


def kv_traffic_bytes(kv_bytes_per_token, input_len, output_len):
    """M_dec = L·e_kv·C(I, O), KV-cache bytes read while decoding one request (Eq. 11)."""
    return kv_bytes_per_token * decode_context_sum(input_len, output_len)


def dense_decode_time(alpha, gamma, n_layers, hidden, output_len):
    """T_d = α·O + γ·L·(D/1024)²·O, seconds (Eq. 10)."""
    scale = hidden / 1024.0
    return (alpha + gamma * n_layers * scale * scale) * output_len


def slim_decode_time(batch, B0, eta_m, dense_s, kv_traffic, peak_bandwidth):
    """T_dec = (B + B0)/η_m · [T_d + M_dec/BW_max], seconds (Eq. 9)."""
    return (batch + B0) / eta_m * (dense_s + kv_traffic / peak_bandwidth)


def e2e_latency(prefill_s, decode_s, t_fixed):
    """E2E = T_pre + T_dec + t_fixed, seconds (Eq. 5)."""
    return prefill_s + decode_s + t_fixed


def slim_cell_terms(model, gpu, coeffs, input_len, output_len, n_gpu=1.0, kv_dtype_bytes=None):
    """The batch-independent SLIM terms of each (model, GPU, I, O) cell (MODEL.md §1).

    F_pre, T_pre and T_dec are linear in B (Eqs. 7–9), so a grid evaluates these once per cell and
    scales by B: prefill_flops = B·f1, T_pre = B·p1, T_dec = (B + B0)·d1. With ``n_gpu`` > 1
    (tensor parallel) n_gpu·F_max and n_gpu·BW_max are used; ``kv_dtype_bytes`` overrides the model's
    b_kv (e.g. an fp8 cache). Returns f1 (FLOP of one prompt),
    p1 (s per prompt), d1 (decode s per sequence slot: [T_d + M_dec/BW_max]/η_m), kv_traffic_bytes.
    """
    kv_width = model.n_kv_heads * model.head_dim
    f1 = prefill_flops(model.n_layers, model.hidden, kv_width, model.ffn_dim, model.n_ffn, 1.0, input_len)
    e_kv = model_kv_bytes_per_layer_token(model, kv_dtype_bytes)
    m_dec = kv_traffic_bytes(kv_bytes_per_token(model.n_layers, e_kv), input_len, output_len)
    t_d = dense_decode_time(coeffs.alpha, coeffs.gamma, model.n_layers, model.hidden, output_len)
    return dict(
        f1=f1,
        d_alpha=coeffs.alpha * output_len / coeffs.eta_m,  # parts of d1, for sensitivities
        d_gamma=(t_d - coeffs.alpha * output_len) / coeffs.eta_m,
        p1=slim_prefill_time(f1, coeffs.eta_c, n_gpu * gpu.flops_per_s),
        d1=slim_decode_time(1.0, 0.0, coeffs.eta_m, t_d, m_dec, n_gpu * gpu.bandwidth_bytes_per_s),
        kv_traffic_bytes=m_dec,
    )


def slim_batch_terms(cell, coeffs, batch, input_len, output_len, floor=None):
    """SLIM at batch B from the cell terms of :func:`slim_cell_terms` (Eqs. 5–9).

    ``floor`` (optional): ``floor(B) -> (prefill floor, decode floor)`` in seconds (:mod:`.floor`); each time is
    then the larger of Eq. 7/9's and its floor, E2E their sum with t_fixed, and ``slim_at_floor`` flags which
    floor binds."""
    t_pre = batch * cell["p1"]
    t_dec = (batch + coeffs.B0) * cell["d1"]
    flag = None
    if floor is not None:
        t_pre, t_dec, flag = floored(t_pre, t_dec, *floor(batch))
    e2e = e2e_latency(t_pre, t_dec, coeffs.t_fixed)
    out = dict(
        prefill_flops=batch * cell["f1"],
        slim_prefill_s=t_pre,
        slim_decode_s=t_dec,
        slim_e2e_s=e2e,
        slim_throughput=token_throughput(batch, input_len, output_len, e2e),  # Eq. 6
    )
    if flag is not None:
        out["slim_at_floor"] = flag
    return out


def free_parts(terms):
    """(prefill, decode) masks: 1 where the model's own term sets the time, 0 where its floor does (then no
    coefficient moves it)."""
    flag = terms.get("slim_at_floor")
    if flag is None:
        return 1.0, 1.0
    return jnp.where(flag & PREFILL_AT_FLOOR, 0.0, 1.0), jnp.where(flag & DECODE_AT_FLOOR, 0.0, 1.0)


def slim_variables(model, gpu, coeffs, batch, input_len, output_len, n_gpu=1.0, floor=None):
    """Every SLIM quantity for broadcastable specs and workload arrays (MODEL.md §1).

    ``model``, ``gpu`` and ``coeffs`` are spec pytrees whose leaves broadcast against the
    workload arrays. Returns prefill_flops, kv_traffic_bytes (per request), slim_prefill_s,
    slim_decode_s, slim_e2e_s, slim_throughput; with ``floor`` (:func:`slimjax.model.floor.floor_of`) each time
    at least its physical floor, and slim_at_floor.
    """
    cell = slim_cell_terms(model, gpu, coeffs, input_len, output_len, n_gpu)
    return {
        "kv_traffic_bytes": cell["kv_traffic_bytes"],
        **slim_batch_terms(cell, coeffs, batch, input_len, output_len, floor),
    }


def log_throughput_sensitivity(cell, coeffs, batch, terms):
    """∂ log T / ∂ log θ for θ = (η_c, η_m, B0, α, γ, t_fixed), stacked on a trailing axis.

    From E2E = B·p1 + (B + B0)·d1 + t_fixed with p1 ∝ 1/η_c and d1 ∝ 1/η_m: log T = log(B(I+O)) −
    log E2E, so each entry is −θ_k·(∂E2E/∂θ_k)/E2E. ``terms`` are :func:`slim_batch_terms`' outputs; where a
    floor binds, the coefficients of that term do not move the time (their entries are 0).
    """
    e2e = terms["slim_e2e_s"]
    slots = batch + coeffs.B0
    pre, dec = free_parts(terms)
    parts = (
        pre * terms["slim_prefill_s"],
        dec * terms["slim_decode_s"],
        -dec * coeffs.B0 * cell["d1"],
        -dec * slots * cell["d_alpha"],
        -dec * slots * cell["d_gamma"],
        -coeffs.t_fixed,
    )
    return jnp.stack([jnp.broadcast_to(p, jnp.shape(e2e)) / e2e for p in parts], axis=-1)
