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
    F, BW = n_gpu * gpu["flops_per_s"], n_gpu * gpu["bandwidth_bytes_per_s"]
    flops = prefill_flops(arch, B, I)
    t_pre = flops / (theta["eta_c"] * F)
    m_dec = arch["n_layers"] * kv_bytes_per_layer_token(arch) * context_sum(I, O)
    t_d = theta["alpha"] * O + theta["gamma"] * arch["n_layers"] * (arch["hidden"] / 1024) ** 2 * O
    t_dec = (B + theta["B0"]) / theta["eta_m"] * (t_d + m_dec / BW)
    e2e = t_pre + t_dec + theta["t_fixed"]
    return dict(
        prefill_flops=flops,
        kv_traffic_bytes=m_dec,
        slim_prefill_s=t_pre,
        slim_decode_s=t_dec,
        slim_e2e_s=e2e,
        slim_throughput=B * (I + O) / e2e,
    )


def _attention_coefficients(arch):
    L, H = arch["n_layers"], arch["n_heads"]
    if arch["mla"]:
        return (
            2 * L * H * (arch["qk_nope_dim"] + arch["rope_dim"] + arch["v_head_dim"]),
            2 * L * H * (2 * arch["kv_lora_rank"] + arch["rope_dim"]),
        )
    return 4 * L * H * arch["head_dim"], 4 * L * H * arch["head_dim"]


def peak_flops(gpu, b_w):
    """The Tensor Core peak for the weights' bytes: FP4 at ≤ 0.6 bytes, FP8 at ≤ 1.01, else bf16 (where the GPU has
    it)."""
    if b_w <= 0.6 and gpu.get("flops_fp4_per_s", 0) > 0:
        return gpu["flops_fp4_per_s"]
    if 0.6 < b_w <= 1.01 and gpu.get("flops_fp8_per_s", 0) > 0:
        return gpu["flops_fp8_per_s"]
    return gpu["flops_per_s"]


def physical_floor(arch, gpu, B, I, O, n_gpu=1, b_w=None, b_kv=None, r=1.0, o=1.0):
    """(prefill, decode) seconds at 100 % of the group's peak: the B·I prompt tokens as one pass, then the O − 1
    decode steps one by one (issue 20's floor, from its statement, by loops)."""
    b_w = arch["bytes_per_weight"] if b_w is None else b_w
    b_kv = arch["kv_dtype_bytes"] if b_kv is None else b_kv
    F, BW = n_gpu * peak_flops(gpu, b_w), n_gpu * gpu["bandwidth_bytes_per_s"]
    P_e = arch["n_ffn"] * arch["hidden"] * arch["expert_ffn_dim"]
    P_act = arch["n_params"] - arch["n_moe_layers"] * (arch["n_experts"] - arch["experts_per_token"]) * P_e
    a_pre, a_dec = _attention_coefficients(arch)
    M_W = arch["n_params"] * b_w
    moe = dict(E=arch["n_experts"], k=arch["experts_per_token"], routed=b_w * arch["n_moe_layers"] * P_e)
    e_kv = kv_bytes_per_layer_token({**arch, "kv_dtype_bytes": b_kv})
    pre = max(B * (2 * P_act * I + a_pre * I * I / 2) / F, moe_weight_bytes(B * I, M_W, moe) / BW)
    dec = 0.0
    w = moe_weight_bytes(B, M_W, moe)
    for j in range(1, O):
        T = I + j
        kv = kv_read(T, e_kv, arch["n_layers"], arch["n_sliding_layers"], arch["window"], r, o)
        dec += max(B * (2 * P_act + a_dec * T) / F, (w + B * kv) / BW)
    return pre, dec


def default_fit(arch, gpu, B, I, O, n_gpu=1):
    """(B sequences of I + O fit, B prompts of I fit) at the serving defaults (u = 0.9, β = 16, no reserve)."""
    pool = 0.9 * n_gpu * gpu["memory_bytes"] - arch["n_params"] * arch["bytes_per_weight"]
    if pool <= 0:
        return False, False
    return B * footprint(arch, I + O, 16) <= pool, B * footprint(arch, I, 16) <= pool


def slim_floored(arch, gpu, theta, B, I, O, n_gpu=1, masked=True):
    """:func:`slim` with each time at least its physical floor, and NaN where the batch does not fit (at the
    serving defaults) when ``masked``."""
    out = slim(arch, gpu, theta, B, I, O, n_gpu)
    pre_f, dec_f = physical_floor(arch, gpu, B, I, O, n_gpu)
    flag = (1 if pre_f > out["slim_prefill_s"] else 0) + (2 if dec_f > out["slim_decode_s"] else 0)
    pre, dec = max(out["slim_prefill_s"], pre_f), max(out["slim_decode_s"], dec_f)
    e2e = pre + dec + theta["t_fixed"]
    out.update(
        slim_prefill_s=pre, slim_decode_s=dec, slim_e2e_s=e2e, slim_throughput=B * (I + O) / e2e, slim_at_floor=flag
    )
    if masked:
        fits, prompts_fit = default_fit(arch, gpu, B, I, O, n_gpu)
        if not prompts_fit:
            out["slim_prefill_s"] = math.nan
        if not fits:  # (and the flag is 0: nothing runs)
            out.update(slim_decode_s=math.nan, slim_e2e_s=math.nan, slim_throughput=math.nan, slim_at_floor=0)
    return out


def b_cap(arch, gpu, theta, batches, I, O, slo_s, epsilon) -> int:
    """Eq. 13 by enumeration: best throughput among qualifying batches (those that fit), ties to the smaller B;
    SLIM with its physical floor."""
    t1 = slim_floored(arch, gpu, theta, 1, I, O, masked=False)["slim_throughput"]
    best, best_t = 0, -math.inf
    for B in sorted(batches):
        r = slim_floored(arch, gpu, theta, B, I, O)
        if r["slim_e2e_s"] <= slo_s and r["slim_throughput"] / (B * t1) > epsilon and r["slim_throughput"] > best_t:
            best, best_t = B, r["slim_throughput"]
    return best


# ------------------------------------------------------------------ capacity calculator (§3–§5)


def footprint(arch: dict, N: int, block: int, r: float = 1.0, o: float = 1.0) -> float:
    e_kv = kv_bytes_per_layer_token(arch)

    def rnd(n):
        return math.ceil(n / block) * block

    L_s = arch["n_sliding_layers"]
    L_f = arch["n_layers"] - L_s
    return r * o * e_kv * (L_f * rnd(N) + L_s * rnd(min(N, arch["window"])))


def max_seqs(pool: float, fp: float) -> int:
    if pool <= 0:
        return 0
    n = 0
    while (n + 1) * fp <= pool:  # the definition, counted (slow; small pools only)
        n += 1
    return n


def kv_read(T, e_kv, L, L_s, W, r=1.0, o=1.0):
    return r * o * e_kv * ((L - L_s) * T + L_s * min(T, W))


def moe_weight_bytes(n, M_W, ext):
    """M_W(n) (MODEL.md §4b) for ``ext`` = {E, k, routed}: routed = b_w·L_moe·P_e; M_W when dense."""
    if not ext or not ext.get("E"):
        return M_W
    E, k = ext["E"], ext["k"]
    distinct = E * (1 - (1 - k / E) ** n)
    return M_W - (E - distinct) * ext["routed"]


def link_bytes_per_s(gpu, n):
    """η_link·BW_link(n) of MODEL.md §4c's topologies: a mesh's n − 1 peer links, else the per-GPU figure."""
    links = max(n - 1, 1) if gpu.get("link_mesh", 0.0) else 1
    return gpu.get("link_efficiency", 1.0) * links * gpu.get("link_bytes_per_s", 0.0)


def allreduce_seconds(x, gpu, n, link, tau, tau_c=0.0):
    """t_ar of x bytes on n GPUs: the GPU's measured NCCL protocol lines at n where its entry has them
    (docs/collectives.md: τ_s + x/B_s below the switch S, τ_l + x/B_l from it), else MODEL.md §4c's line
    τ + 2(n − 1)/n·x/link; 0 on one GPU or without a link. ``tau_c`` > 0, the engine's own all-reduce kernel, where
    the n GPUs are in one NVLink domain (n ≤ gpus_per_node): its latency in place of τ_s (or of τ)."""
    own = tau_c > 0 and n <= gpu.get("gpus_per_node", 8)
    key = f"allreduce_n{int(n)}_"
    if n > 1 and gpu.get(key + "small_bytes_per_s", 0.0) > 0:
        side = "small" if x < gpu[key + "switch_bytes"] else "large"
        latency = tau_c if own and side == "small" else gpu[f"{key}{side}_latency_s"]
        return latency + x / gpu[f"{key}{side}_bytes_per_s"]
    if n <= 1 or not link:
        return 0.0
    return (tau_c if own else tau) + 2 * (n - 1) / n * x / link


def comm_seconds(tokens, ext):
    """2·L·t_ar(tokens·D·2) (MODEL.md §4c) for ``ext`` = {n, L, D, link, tau, gpu}; 0 without."""
    if not ext:
        return 0.0
    x = tokens * ext["D"] * 2.0
    return 2 * ext["L"] * allreduce_seconds(x, ext.get("gpu", {}), ext.get("n", 1), ext.get("link"), ext["tau"])


def prefill_chunks(I, s, P, a, M_W, e_kv, L, L_s, W, F, BW, t_l, r=1.0, o=1.0, moe=None, comm=None):
    """Chunk by chunk: (t_pre, t_chunk_max, K_c); P = P_act and a = a_pre for MoE/MLA (§4b), ``moe`` and
    ``comm`` the expert weight reads and the all-reduce (§4b, §4c)."""
    if s <= 0 or s >= I:
        s = I
    times = []
    p = 0
    while p < I:
        n = min(s, I - p)
        ops = 2 * P * n + a * (n * p + n * n / 2)
        byt = moe_weight_bytes(n, M_W, moe) + kv_read(p, e_kv, L, L_s, W, r, o)
        times.append(max(ops / F, byt / BW) + t_l + comm_seconds(n, comm))
        p += n
    return sum(times), max(times), len(times)


def decode_steps(B, I, O, P, a, M_W, e_kv, L, L_s, W, F, BW, t_l, r=1.0, o=1.0, moe=None, comm=None):
    """Step by step: ITL (NaN when O = 1); P = P_act and a = a_dec for MoE/MLA."""
    if O == 1:
        return math.nan
    total = 0.0
    w = moe_weight_bytes(B, M_W, moe)
    for j in range(1, O):
        T = I + j
        total += (
            max(B * (2 * P + a * T) / F, (w + B * kv_read(T, e_kv, L, L_s, W, r, o)) / BW) + t_l + comm_seconds(B, comm)
        )
    return total / (O - 1)


def erlang_b_recurrence(m: int, A: float) -> float:
    E = 1.0
    for k in range(1, m + 1):
        E = A * E / (k + A * E)
    return E


def mmc(m: int, S: float, lam: float) -> dict:
    A = lam * S
    if m == 0:
        return dict(utilization=math.inf, p_wait=1.0, wait_s=math.inf, response_s=math.inf, in_system=math.inf)
    rho = A / m
    if rho >= 1:
        return dict(utilization=rho, p_wait=1.0, wait_s=math.inf, response_s=math.inf, in_system=math.inf)
    E = erlang_b_recurrence(m, A)
    pw = E / (1 - rho * (1 - E))
    wq = pw * S / (m * (1 - rho))
    return dict(utilization=rho, p_wait=pw, wait_s=wq, response_s=wq + S, in_system=lam * (wq + S))


def capacity_point(arch, gpu, serving, B, I, O, measured=None):
    """Every §3–§4 variable at one point, from the loops above (serving in base units)."""
    sv = serving
    e_kv = kv_bytes_per_layer_token({**arch, "kv_dtype_bytes": sv["kv_dtype_bytes"]})
    M_W = arch["n_params"] * sv["bytes_per_weight"]
    pool = sv["memory_utilization"] * sv["n_gpu"] * gpu["memory_bytes"] - M_W - sv["reserved_bytes"]
    fp = footprint(
        {**arch, "kv_dtype_bytes": sv["kv_dtype_bytes"]},
        I + O,
        int(sv["block_size"]),
        sv["kv_replication"],
        sv["kv_overhead"],
    )
    seqs = 0 if pool <= 0 else math.floor(pool / fp)  # float quotient: 1.05 etc. are inexact in binary
    # §4b by the contract's own arithmetic (not slimjax's): P_act, a_pre / a_dec, expert reads
    L, H = arch["n_layers"], arch["n_heads"]
    P_e = arch["n_ffn"] * arch["hidden"] * arch["expert_ffn_dim"]
    P_act = arch["n_params"] - arch["n_moe_layers"] * (arch["n_experts"] - arch["experts_per_token"]) * P_e
    if arch["mla"]:
        a_pre = 2 * L * H * (arch["qk_nope_dim"] + arch["rope_dim"] + arch["v_head_dim"])
        a_dec = 2 * L * H * (2 * arch["kv_lora_rank"] + arch["rope_dim"])
    else:
        a_pre = a_dec = 4 * L * H * arch["head_dim"]
    moe = dict(
        E=arch["n_experts"], k=arch["experts_per_token"], routed=sv["bytes_per_weight"] * arch["n_moe_layers"] * P_e
    )
    comm = dict(
        n=sv["n_gpu"],
        L=L,
        D=arch["hidden"],
        link=link_bytes_per_s(gpu, sv["n_gpu"]),
        tau=gpu.get("allreduce_latency_s", 0.0),
        gpu=gpu,
    )
    rest = (
        M_W,
        e_kv,
        arch["n_layers"],
        arch["n_sliding_layers"],
        arch["window"],
        sv["n_gpu"] * gpu["flops_per_s"] * sv["compute_efficiency"],
        sv["n_gpu"] * gpu["bandwidth_bytes_per_s"] * sv["bandwidth_efficiency"],
        sv["launch_overhead_s"],
        sv["kv_replication"],
        sv["kv_overhead"],
    )
    pre = lambda s_: prefill_chunks(I, s_, P_act, a_pre, *rest, moe=moe, comm=comm)  # noqa: E731
    dec = lambda b: decode_steps(b, I, O, P_act, a_dec, *rest, moe=moe, comm=comm)  # noqa: E731

    def service(b):
        if measured is not None:
            S = max(b, measured["batch"]) / measured["request_rate"]
            return (measured["ttft_s"] if O > 1 else S), (measured["itl_s"] if O > 1 else math.nan), S
        t_pre, _, k_c = pre(int(sv["chunk_size"]))
        itl = dec(b)
        ttft = b * t_pre + ((k_c - 1) * itl if (b > 1 and O > 1) else 0.0)
        return ttft, itl, (ttft + (O - 1) * itl if O > 1 else ttft)

    t_pre, t_max, _ = pre(int(sv["chunk_size"]))
    ttft, itl, S = service(B)
    roof_itl = dec(B)
    out = dict(
        weights_bytes=M_W,
        kv_pool_bytes=pool,
        kv_bytes_per_token=arch["n_layers"] * e_kv,
        seq_footprint_bytes=fp,
        max_seqs=seqs,
        prefill_s=t_pre,
        chunk_max_s=t_max,
        itl_s=itl,
        itl_chunk_s=roof_itl + t_max,
        ttft_s=ttft,
        service_s=S,
        request_rate=B / S,
        token_throughput=B * (I + O) / S,
    )
    # no time for what cannot run: a batch beyond max_seqs; a prompt whose own KV does not fit
    fp_prompt = footprint(
        {**arch, "kv_dtype_bytes": sv["kv_dtype_bytes"]},
        I,
        int(sv["block_size"]),
        sv["kv_replication"],
        sv["kv_overhead"],
    )
    if pool <= 0 or fp_prompt > pool:
        out.update(prefill_s=math.nan, chunk_max_s=math.nan)
    if B > seqs:
        out.update(
            {k: math.nan for k in ("itl_s", "itl_chunk_s", "ttft_s", "service_s", "request_rate", "token_throughput")}
        )
    return out, seqs, service
