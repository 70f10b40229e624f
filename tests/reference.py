"""Independent float64 reference implementations, written from MODEL.md with plain Python loops.

Nothing here imports slimjax: these are the oracles the engine is checked against.
"""

from __future__ import annotations

import math


def kv_bytes_per_layer_token(arch: dict) -> float:
    if arch["mla"]:
        return (arch["kv_lora_rank"] + arch["rope_dim"]) * arch["kv_dtype_bytes"]
    return 2 * arch["n_kv_heads"] * arch["head_dim"] * arch["kv_dtype_bytes"]


def prefill_flops(arch: dict, B: int, I: int) -> float:
    """Eq. 8 summed layer by layer and token by token."""
    D, Dkv = arch["hidden"], arch["n_kv_heads"] * arch["head_dim"]
    total = 0.0
    for _layer in range(int(arch["n_layers"])):
        proj = 4 * D * D + 4 * D * Dkv + 2 * arch["n_ffn"] * (arch["ffn_dim"] / D) * D * D
        total += B * I * proj + 4 * B * I * I * D
    return total


def context_sum(I: int, O: int) -> float:
    """Eq. 12 as its defining sum Σ_{j=1..O} (I + j)."""
    return float(sum(I + j for j in range(1, O + 1)))


def slim(arch: dict, gpu: dict, theta: dict, B: int, I: int, O: int, n_gpu: int = 1) -> dict:
    F, BW = n_gpu * gpu["flops"], n_gpu * gpu["bandwidth"]
    flops = prefill_flops(arch, B, I)
    t_pre = flops / (theta["eta_c"] * F)
    m_dec = arch["n_layers"] * kv_bytes_per_layer_token(arch) * context_sum(I, O)
    t_d = theta["alpha"] * O + theta["gamma"] * arch["n_layers"] * (arch["hidden"] / 1024) ** 2 * O
    t_dec = (B + theta["B0"]) / theta["eta_m"] * (t_d + m_dec / BW)
    e2e = t_pre + t_dec + theta["t_fixed"]
    return dict(prefill_flops=flops, kv_traffic_bytes=m_dec, slim_prefill_s=t_pre, slim_decode_s=t_dec,
                slim_e2e_s=e2e, slim_throughput=B * (I + O) / e2e)


def b_cap(arch, gpu, theta, batches, I, O, slo_s, epsilon) -> int:
    """Eq. 13 by enumeration: best throughput among qualifying batches, ties to the smaller B."""
    t1 = slim(arch, gpu, theta, 1, I, O)["slim_throughput"]
    best, best_t = 0, -math.inf
    for B in sorted(batches):
        r = slim(arch, gpu, theta, B, I, O)
        if r["slim_e2e_s"] <= slo_s and r["slim_throughput"] / (B * t1) > epsilon and r["slim_throughput"] > best_t:
            best, best_t = B, r["slim_throughput"]
    return best
