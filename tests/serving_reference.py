"""A plain Python event loop of MODEL.md §9 (continuous batching), written from its text: the oracle the
jitted simulation is checked against per request. Nothing here imports slimjax.

``terms`` is a dict of the replica's scalar roofline inputs (see :func:`replica_terms`).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import NormalDist

import numpy as np
from reference import (
    allreduce_seconds,
    footprint,
    kv_bytes_per_layer_token,
    link_bytes_per_s,
    moe_weight_bytes,
    peak_flops,
)


def default_serving(arch: dict) -> dict:
    """The serving table's defaults as spec fields in base units (a field without one: the model's own)."""
    from slimjax.inputs.serving import SERVING

    return {r.field: r.to_base(r.default) if r.default is not None else arch[r.model_field] for r in SERVING.values()}


def efficiency(gpu, sv, base):
    """``sv[base]`` (compute_efficiency e_F or bandwidth_efficiency e_B), or its FP8 one (e_F8, e_B8) where 8-bit
    weights run at the GPU's FP8 peak and that is set (not NaN)."""
    e8 = sv.get(f"{base}_fp8", math.nan)
    fp8 = 0.6 < sv["bytes_per_weight"] <= 1.01 and gpu.get("flops_fp8_per_s", 0) > 0
    return e8 if fp8 and not math.isnan(e8) else sv[base]


def replica_terms(arch: dict, gpu: dict, sv: dict) -> dict:
    """The §3/§4/§4b/§4c scalars of one replica group, by the contract's own arithmetic (serving in base
    units, plus step_tokens and step_overhead_s)."""
    L, H = arch["n_layers"], arch["n_heads"]
    a = {**arch, "kv_dtype_bytes": sv["kv_dtype_bytes"]}
    P_e = arch["n_ffn"] * arch["hidden"] * arch["expert_ffn_dim"]
    if arch["mla"]:
        a_pre = 2 * L * H * (arch["qk_nope_dim"] + arch["rope_dim"] + arch["v_head_dim"])
        a_dec = 2 * L * H * (2 * arch["kv_lora_rank"] + arch["rope_dim"])
    else:
        a_pre = a_dec = 4 * L * H * arch["head_dim"]
    M_W = arch["n_params"] * sv["bytes_per_weight"]
    n = sv["n_gpu"]
    link = link_bytes_per_s(gpu, sv["n_gpu"])
    dp, ep = sv.get("dp_ranks", 1.0), sv.get("expert_ranks", 1.0)
    routed_params = arch["n_moe_layers"] * P_e
    dense = sv["bytes_per_weight"] * (arch["n_params"] - arch["n_experts"] * routed_params)
    # docs/layouts.md: the D ranks' n·D GPUs hold the dense part D times and the experts once; M_R per rank
    spec = speculation(arch, sv, M_W)
    # docs/speculative.md: the draft's own weights (one target layer, or the draft model's) once per rank
    resident = spec["share"] * M_W + sv.get("draft_weight_bytes", 0.0) if spec else 0.0
    pool = (
        sv["memory_utilization"] * n * dp * gpu["memory_bytes"]
        - M_W
        - (dp - 1) * dense
        - dp * resident
        - dp * sv["reserved_bytes"]
    ) / dp
    return dict(
        P_act=arch["n_params"] - arch["n_moe_layers"] * (arch["n_experts"] - arch["experts_per_token"]) * P_e,
        a_pre=a_pre,
        a_dec=a_dec,
        M_W=M_W,
        moe=dict(
            E=arch["n_experts"], k=arch["experts_per_token"], routed=sv["bytes_per_weight"] * arch["n_moe_layers"] * P_e
        ),
        e_kv=kv_bytes_per_layer_token(a),
        L=L,
        L_s=arch["n_sliding_layers"],
        W=arch["window"],
        r=sv["kv_replication"],
        o=sv["kv_overhead"],
        F=n * peak_flops(gpu, sv["bytes_per_weight"]) * efficiency(gpu, sv, "compute_efficiency"),
        BW=n * gpu["bandwidth_bytes_per_s"] * efficiency(gpu, sv, "bandwidth_efficiency"),
        t_l=sv["launch_overhead_s"],
        t_step=sv.get("step_overhead_s", 0.0),
        # docs/engines.md: every layer's fixed cost t_L and a routed-expert layer's further t_X, each pass
        t_layers=L * sv.get("layer_overhead_s", 0.0) + arch["n_moe_layers"] * sv.get("expert_layer_overhead_s", 0.0),
        tau_c=sv.get("engine_allreduce_latency_s", 0.0),
        n=n,
        D=arch["hidden"],
        link=link,
        tau=gpu.get("allreduce_latency_s", 0.0),
        gpu=gpu,
        pool=pool,
        layout=dict(
            dp=dp,
            ep=ep,
            skew=sv.get("expert_skew", 1.0),
            moe_tp=sv.get("expert_tp", 0.0) or n * dp / ep,
            dispatch=sv.get("dispatch_bytes", 2.0),
            routed_params=routed_params,
            L_moe=arch["n_moe_layers"],
            e_XF=sv.get("expert_compute_efficiency", 1.0),
            e_XB=sv.get("expert_bandwidth_efficiency", 1.0),
        ),
        block=int(sv["block_size"]),
        chunk=int(sv["chunk_size"]),
        step_tokens=int(sv.get("step_tokens", 2048)),
        arch=a,
        spec=spec,
    )


def speculation(arch: dict, sv: dict, M_W: float) -> dict | None:
    """docs/speculative.md's terms from the serving fields (None: k = 0): k, a, the target's share s (1/L for mtp
    and eagle, codes 1 and 2), λ = s + L_0/L, and P_0, W_0, α_0, κ_0 with a layer draft's LM head D·V."""
    k = sv.get("speculative_tokens", 0.0)
    if not k:
        return None
    L = arch["n_layers"]
    share = 1.0 / L if sv["speculative_method"] in (1.0, 2.0) else 0.0
    head = arch["hidden"] * arch["vocab"] if share else 0.0
    return dict(
        k=k,
        a=sv["acceptance_length"],
        share=share,
        lam=share + sv["draft_layers"] / L,
        P0=sv["draft_params"] + head,
        W0=sv["draft_weight_bytes"] + head * sv["bytes_per_weight"],
        alpha0=sv["draft_attention_flops"],
        kappa0=sv["draft_kv_bytes"],
    )


def stage_terms(arch: dict, gpu: dict, sv: dict, n_pp: int) -> dict:
    """MODEL.md §10: one virtual engine of a group of n_pp stages of n_tp = sv["n_gpu"] GPUs. A stage holds
    ⌈L/n_pp⌉ layers (L/n_pp where n_pp divides L; the largest stage binds otherwise): its share f of the
    weights, FLOPs, KV and all-reduces; its pool u·n_tp·M − f·M_W − M_R; each engine 1/n_pp of it."""
    t = replica_terms(arch, gpu, sv)
    L = arch["n_layers"]
    f = math.ceil(L / n_pp) / L
    stage_arch = {**t["arch"], "n_layers": f * L, "n_sliding_layers": f * arch["n_sliding_layers"]}
    stage = dict(
        t,
        P_act=f * t["P_act"],
        a_pre=f * t["a_pre"],
        a_dec=f * t["a_dec"],
        M_W=f * t["M_W"],
        moe=dict(t["moe"], routed=f * t["moe"]["routed"]),
        L=f * L,
        L_s=f * arch["n_sliding_layers"],
        t_layers=f * t["t_layers"],
        arch=stage_arch,
    )
    stage_pool = sv["memory_utilization"] * sv["n_gpu"] * gpu["memory_bytes"] - f * t["M_W"] - sv["reserved_bytes"]
    return dict(
        stage,
        stage=dict(stage),
        n_pp=n_pp,
        pool=stage_pool / n_pp,
        net_bw=gpu["network_bytes_per_s"],
        net_tau=gpu["network_latency_s"],
    )


def network_seconds(x, t):
    """t_net(x) = τ_net + x / BW_net (MODEL.md §10)."""
    return t["net_tau"] + x / t["net_bw"]


def K(T, t):
    return t["r"] * t["o"] * t["e_kv"] * ((t["L"] - t["L_s"]) * T + t["L_s"] * min(T, t["W"]))


def step_seconds(decode_contexts, chunks, t):
    """τ of one step: ``decode_contexts`` the T_j of the decoding requests, ``chunks`` (n_i, p_i) pairs. An engine
    of n_pp stages (:func:`stage_terms`): τ_pp = n_pp·τ_stage + (n_pp − 1)·t_net(n_tok·D·b_a) (MODEL.md §10)."""
    if t.get("n_pp", 1) > 1:
        n_tok = len(decode_contexts) + sum(n for n, _ in chunks)
        tau_stage = step_seconds(decode_contexts, chunks, t["stage"])
        return t["n_pp"] * tau_stage + (t["n_pp"] - 1) * network_seconds(n_tok * t["D"] * 2.0, t)
    spec = t.get("spec")
    k = int(spec["k"]) if spec else 0
    prompt = sum(n for n, _ in chunks)
    n_tok = len(decode_contexts) * (1 + k) + prompt
    P_act, byt, comm = pass_terms(n_tok, t)
    ops = 2 * P_act * n_tok
    for T in decode_contexts:  # a decode's 1 + k queries at T … T + k read its KV once
        ops += t["a_dec"] * sum(T + i for i in range(k + 1))
        byt += K(T, t)
    for n, p in chunks:
        ops += t["a_pre"] * (n * p + n * n / 2)
        byt += K(p, t)
    tau = max(ops / t["F"], byt / t["BW"]) + t["t_l"] + t["t_layers"] + t["t_step"] + comm
    if spec:
        C, KV = sum(decode_contexts), sum(K(T, t) for T in decode_contexts)
        tau += k * draft_pass(len(decode_contexts), C, KV, t) + draft_pass(prompt, 0.0, 0.0, t)
    return tau


def pass_terms(n_tok, t):
    """(P_act, weight bytes, communication) of the target's pass of n_tok tokens."""
    lay = t.get("layout") or {}
    if lay.get("dp", 1) > 1 or lay.get("ep", 1) > 1 or lay.get("e_XF", 1) != 1 or lay.get("e_XB", 1) != 1:
        return layout_pass(n_tok, t)
    byt = moe_weight_bytes(n_tok, t["M_W"], t["moe"])
    comm = 2 * t["L"] * allreduce_seconds(n_tok * t["D"] * 2.0, t["gpu"], t["n"], t["link"], t["tau"], t["tau_c"])
    return t["P_act"], byt, comm


def draft_pass(m, C, KV, t):
    """docs/speculative.md's δ(m, C, K): one draft pass over m tokens of contexts summing to C (target KV K)."""
    if m == 0:
        return 0.0
    sp = t["spec"]
    P_act, byt, comm = pass_terms(m, t)
    ops = 2 * (sp["share"] * P_act + sp["P0"]) * m + (sp["share"] * t["a_dec"] + sp["alpha0"]) * C
    read = sp["share"] * byt + sp["W0"] + sp["kappa0"] * C + sp["share"] * KV
    return max(ops / t["F"], read / t["BW"]) + sp["lam"] * (t["t_l"] + t["t_layers"] + comm)


def imbalance(N, E, k, ep, skew):
    """docs/layouts.md: the busiest of ep expert ranks' load over the mean for N tokens routed top-k over E experts:
    1 + c(ep)·σ/(μ·√N), c(ep) Blom's expected largest of ep standard normals, times the skew, at most ep·min(k,
    E/ep)/k; 1 without expert parallelism."""
    if ep <= 1 or E <= 1 or N <= 0:
        return 1.0
    mu = k / ep
    sd = math.sqrt(k * (1 / ep) * (1 - 1 / ep) * (E - k) / (E - 1))
    c = NormalDist().inv_cdf((ep - 0.375) / (ep + 0.25))
    return min(skew * (1 + c * sd / (mu * math.sqrt(N))), ep * min(k, E / ep) / k)


def alltoall_seconds(x, gpu, n):
    """One all-to-all of an x-byte buffer per GPU among n GPUs (docs/layouts.md): the measured NCCL lines at n where
    the GPU has them; else inside a node τ + (n − 1)/n·x/link, across nodes τ_net + (n − g)/n·x/BW_net."""
    key = f"alltoall_n{int(n)}_"
    if n <= 1:
        return 0.0
    if gpu.get(key + "small_bytes_per_s", 0.0) > 0:
        side = "small" if x < gpu[key + "switch_bytes"] else "large"
        return gpu[f"{key}{side}_latency_s"] + x / gpu[f"{key}{side}_bytes_per_s"]
    g = gpu.get("gpus_per_node", 8.0)
    if n <= g:
        link = link_bytes_per_s(gpu, n)
        return gpu.get("allreduce_latency_s", 0.0) + (n - 1) / n * x / link if link else 0.0
    bw = gpu.get("network_bytes_per_s", 0.0)
    return gpu.get("network_latency_s", 0.0) + (n - g) / n * x / bw if bw else 0.0


def layout_pass(n_tok, t):
    """(P_act, weight bytes, communication) of a rank's pass of n_tok tokens in a DP/EP layout (docs/layouts.md),
    every other rank taken to run as many; its routed experts at their kernels' efficiencies e_XF, e_XB."""
    lay, moe = t["layout"], t["moe"]
    dp, ep, L, L_moe, D = lay["dp"], lay["ep"], t["L"], lay["L_moe"], t["D"]
    E, k = moe["E"], moe["k"]
    iota = imbalance(dp * n_tok, E, k, ep, lay["skew"])
    # the experts' grouped GEMMs at e_XF of the dense FLOP/s and e_XB of their bandwidth
    P_act = t["P_act"] + (iota / lay["e_XF"] - 1) * k * lay["routed_params"]
    byt = t["M_W"]
    if E:
        byt -= (E - E * (1 - (1 - k / E) ** (dp * n_tok)) / (dp * lay["e_XB"])) * moe["routed"]
    tp, gpu = t["n"], t["gpu"]
    if dp > 1:
        group = tp * dp
        comm = (2 * L - L_moe) * allreduce_seconds(n_tok * D * 2.0, gpu, tp, t["link"], t["tau"], t["tau_c"])
        for b in (lay["dispatch"], 2.0):
            comm += L_moe * alltoall_seconds(n_tok * k * D * b / tp, gpu, group)
        moe_tp = lay["moe_tp"]
        x = n_tok * dp * k / ep * D * 2.0
        comm += L_moe * allreduce_seconds(x, gpu, moe_tp, link_bytes_per_s(gpu, moe_tp), t["tau"], t["tau_c"])
    else:
        comm = 2 * L * allreduce_seconds(n_tok * D * 2.0, gpu, tp, t["link"], t["tau"], t["tau_c"])
    return P_act, byt, comm


class _Replica:
    def __init__(self, pool):
        self.queue = deque()  # request ids, FCFS
        self.running = []  # dicts in admission order
        self.free = pool
        self.clock = 0.0
        self.busy = 0.0
        self.queue_peak = 0
        self.kv_peak = 0.0
        self.last_end = -math.inf
        self.last_done = 0


def simulate(
    t: dict,
    arrivals,
    inputs,
    outputs,
    batch,
    replicas=1,
    router="round_robin",
    clients=None,
    prefilled=False,
    policy="reserve",
    watermark=0.0,
    prefill_first=False,
    chains=None,
    block_tokens=None,
):
    """Per request (ttft, e2e, arrival, replica, preemptions) and per replica (busy, queue_peak, kv_peak), plus all
    token gaps. ``clients``: closed loop with that many clients (``arrivals`` ignored). ``policy``: ``reserve``
    (MODEL.md §9: footprint(I + O) at admission) or a paged cache (docs/engines.md) preempting by ``recompute``
    (the most recently admitted first) or ``retract`` (the fewest emitted tokens first), admitting while a
    ``watermark`` fraction of the pool's blocks stays free. ``prefill_first``: a step with prompt tokens left runs
    them alone and the decodes wait (docs/engines.md). ``chains`` (per request its prompt's block chain ids, blocks
    of ``block_tokens``): a prefix cache per replica under ``reserve`` (docs/engines.md, "Prefix caching"; router
    ``prefix_affinity`` too); per request ``prefix_hit_tokens``, per replica ``evicted`` (chain ids in eviction
    order)."""
    N = len(inputs)
    cached = chains is not None
    if cached:
        assert policy == "reserve" and not prefilled, "the reference's prefix cache runs under reserve"
        c_b = footprint(t["arch"], block_tokens, t["block"], t["r"], t["o"])  # a block: h tokens of every layer
        hit_tokens = [0] * N
    paged = policy != "reserve"
    fp = [footprint(t["arch"], inputs[i] + outputs[i], t["block"], t["r"], t["o"]) for i in range(N)]
    arch, beta = t["arch"], t["block"]
    L_s = arch["n_sliding_layers"]
    L_f = arch["n_layers"] - L_s

    def units(T):  # layer-blocks of a sequence of T tokens
        return L_f * math.ceil(T / beta) + L_s * math.ceil(min(T, arch["window"]) / beta)

    unit_bytes = t["r"] * t["o"] * kv_bytes_per_layer_token(arch) * beta
    U = math.floor(t["pool"] / unit_bytes)
    W_u = math.ceil(watermark * U)
    for i in range(N):
        if paged:
            assert units(inputs[i] + outputs[i]) <= U and units(inputs[i]) + W_u <= U, f"request {i} cannot fit"
        else:
            assert fp[i] <= t["pool"], f"request {i} cannot fit"
    reps = [_Replica(U if paged else t["pool"]) for _ in range(replicas)]
    for rep in reps:
        rep.parked = []  # preempted requests, waiting ahead of the queue
        rep.refs = {}  # prefix cache: chain id -> requests holding it (0: cached, free, in the LRU)
        rep.lru = []  # free cached chain ids, least recently freed first
        rep.evicted = []

    def matched(rep, i):  # leading reusable blocks of request i in rep's cache
        n, limit = 0, (inputs[i] - 1) // block_tokens
        while n < min(limit, len(chains[i])) and chains[i][n] in rep.refs:
            n += 1
        return n

    arr = [math.nan] * N
    if clients is None:
        pending = {i: arrivals[i] for i in range(N)}  # request -> arrival time
    else:
        pending = {i: 0.0 for i in range(min(clients, N))}
    first = [math.nan] * N
    end = [math.nan] * N
    where = [-1] * N
    preempted = [0] * N
    gaps = []
    steps = 0
    while True:
        nxt = min(pending.items(), key=lambda kv: (kv[1], kv[0])) if pending else None

        def start(rep):
            if rep.running or rep.parked:
                return rep.clock
            if rep.queue:
                return max(rep.clock, arr[rep.queue[0]])
            return math.inf

        starts = [start(rep) for rep in reps]
        s_min = min(starts)
        if nxt is None and s_min == math.inf:
            break
        if nxt is not None and nxt[1] <= s_min:
            i, a = nxt
            del pending[i]
            arr[i] = a
            if router == "round_robin":
                r = i % replicas
            elif router == "prefix_affinity" and max(matched(rep, i) for rep in reps) > 0:
                hits = [matched(rep, i) for rep in reps]
                best = max(hits)
                tied = [k for k in range(replicas) if hits[k] == best]
                r = min(tied, key=lambda k: (_load(reps[k], a), k))
            else:  # least loaded (and prefix_affinity without a match); completions after a have not happened yet
                loads = [_load(rep, a) for rep in reps]
                r = loads.index(min(loads))
            where[i] = r
            reps[r].queue.append(i)
            continue
        r = starts.index(s_min)
        rep = reps[r]
        now = s_min
        if not paged and cached:
            while rep.queue and len(rep.running) < batch:
                i = rep.queue[0]
                m = matched(rep, i)
                hits = chains[i][:m]
                need = fp[i] - m * c_b
                reclaimable = c_b * sum(1 for c in rep.lru if c not in hits)
                if need > rep.free + reclaimable:
                    break
                rep.queue.popleft()
                for c in hits:  # held now: out of the LRU
                    if rep.refs[c] == 0:
                        rep.lru.remove(c)
                    rep.refs[c] += 1
                while rep.free < need:  # evict the least recently freed
                    c = rep.lru.pop(0)
                    del rep.refs[c]
                    rep.evicted.append(c)
                    rep.free += c_b
                rep.free -= need
                hit_tokens[i] = m * block_tokens
                rep.running.append(dict(i=i, p=m * block_tokens, j=0, r=0, last=now, shared=m, own=need))
            rep.queue_peak = max(rep.queue_peak, len(rep.queue))
            rep.kv_peak = max(rep.kv_peak, t["pool"] - rep.free)
        elif not paged:
            while rep.queue and len(rep.running) < batch and fp[rep.queue[0]] <= rep.free:
                i = rep.queue.popleft()
                rep.free -= fp[i]
                if prefilled:  # MODEL.md §10's decode pool: decode-only steps from T = I + 1, j = 1
                    rep.running.append(dict(i=i, p=inputs[i], j=1, r=0, last=now))
                else:
                    rep.running.append(dict(i=i, p=0, j=0, r=0, last=now))
            rep.queue_peak = max(rep.queue_peak, len(rep.queue))
            rep.kv_peak = max(rep.kv_peak, t["pool"] - rep.free)
        else:
            _admit_paged(rep, inputs, units, W_u, batch, prefilled, now)
        alone = prefill_first and any(q["p"] < inputs[q["i"]] + q["r"] for q in rep.running)
        if paged:
            if not alone:  # a step of prompt tokens alone writes no decode's KV
                _grow(rep, inputs, units, policy, preempted)
            rep.queue_peak = max(rep.queue_peak, len(rep.queue) + len(rep.parked))
            rep.kv_peak = max(rep.kv_peak, (U - rep.free) * unit_bytes)
        decoding = [q for q in rep.running if q["p"] >= inputs[q["i"]] + q["r"] and not alone]
        per_decode = 1 + int(t["spec"]["k"]) if t.get("spec") else 1  # a verify pass's 1 + k tokens each
        budget = max(t["step_tokens"] - len(decoding) * per_decode, 0)
        chunks = []
        for q in rep.running:
            if q["p"] >= inputs[q["i"]] + q["r"]:
                continue
            n = min(inputs[q["i"]] + q["r"] - q["p"], t["chunk"] if t["chunk"] > 0 else math.inf, budget)
            budget -= n
            if n > 0:
                chunks.append((q, n))
        tau = step_seconds([inputs[q["i"]] + q["j"] for q in decoding], [(n, q["p"]) for q, n in chunks], t)
        fin = now + tau
        steps += 1
        rep.busy += tau
        spec = t.get("spec")
        for q in decoding:
            if spec:  # its m-th verify step emits ⌊m·a⌋ − ⌊(m − 1)·a⌋, paced evenly over the wait
                m = q.get("m", 0)
                got = min(math.floor((m + 1) * spec["a"]) - math.floor(m * spec["a"]), outputs[q["i"]] - q["j"])
                q["m"] = m + 1
                q["j"] += got
                gaps.extend([(fin - q["last"]) / got] * int(got))
            else:
                q["j"] += 1
                gaps.append(fin - q["last"])
            q["last"] = fin
        for q, n in chunks:
            q["p"] += n
            if q["p"] == inputs[q["i"]] + q["r"]:
                if cached:  # its full prompt blocks join the cache: adopted where cached meanwhile, else inserted
                    full, adopted = inputs[q["i"]] // block_tokens, 0
                    for c in chains[q["i"]][q["shared"] : full]:
                        if c in rep.refs:
                            if rep.refs[c] == 0:
                                rep.lru.remove(c)
                            rep.refs[c] += 1
                            adopted += 1
                        else:
                            rep.refs[c] = 1
                    rep.free += adopted * c_b  # the adopted blocks' own copies given back
                    q["own"] -= (full - q["shared"]) * c_b  # its blocks are the cache's now
                    q["shared"] = full
                if q["r"] == 0:
                    q["j"] = 1
                    first[q["i"]] = fin
                else:  # prefilled again over its prompt and r emitted tokens: token r + 1
                    q["j"] = q["r"] + 1
                    gaps.append(fin - q["last"])
                q["last"] = fin
        done = [q for q in rep.running if q["j"] >= outputs[q["i"]] and q["j"] > 0]
        for q in done:
            end[q["i"]] = fin
            if cached:  # its own KV back; its blocks released, deepest first (evicted before their parents)
                rep.free += q["own"]
                for c in reversed(chains[q["i"]][: q["shared"]]):
                    rep.refs[c] -= 1
                    if rep.refs[c] == 0:
                        rep.lru.append(c)
            else:
                rep.free += q["k"] if paged else fp[q["i"]]
            if clients is not None and q["i"] + clients < N:
                pending[q["i"] + clients] = fin
        rep.running = [q for q in rep.running if q not in done]
        rep.clock = fin
        rep.last_end = fin
        rep.last_done = len(done)
    ttft = [first[i] - arr[i] for i in range(N)]
    e2e = [end[i] - arr[i] for i in range(N)]
    return dict(
        ttft=ttft,
        e2e=e2e,
        arrival=arr,
        first=first,
        end=end,
        replica=where,
        preemptions=preempted,
        busy=[rep.busy for rep in reps],
        queue_peak=[rep.queue_peak for rep in reps],
        kv_peak=[rep.kv_peak for rep in reps],
        gaps=gaps,
        steps=steps,
        **({"prefix_hit_tokens": hit_tokens, "evicted": [rep.evicted for rep in reps]} if cached else {}),
    )


def _load(rep, a):
    """A replica's load as least_loaded counts it at time a: queued, running and parked requests (and those its
    last step completes after a, not yet gone)."""
    load = len(rep.queue) + len(rep.running) + len(rep.parked)
    if rep.last_end > a:
        load += rep.last_done
    return load


def _admit_paged(rep, inputs, units, W_u, batch, prefilled, now):
    """docs/engines.md, admission: preempted requests first, then the queue, while fewer than B are held and the
    prompt's blocks u(I + r) leave the watermark free."""
    while len(rep.running) < batch:
        if rep.parked:
            q = rep.parked[0]
            need = units(inputs[q["i"]] + q["r"])
            if need + W_u > rep.free:
                return
            rep.parked.pop(0)
        elif rep.queue:
            i = rep.queue[0]
            need = units(inputs[i])
            if need + W_u > rep.free:
                return
            rep.queue.popleft()
            q = dict(i=i, p=inputs[i], j=1, r=0, last=now) if prefilled else dict(i=i, p=0, j=0, r=0, last=now)
        else:
            return
        q["k"] = need
        rep.free -= need
        rep.running.append(q)


def _grow(rep, inputs, units, policy, preempted):
    """docs/engines.md, growth: each decoding request's block for its token; victims (not the oldest) by the
    policy's order while the free blocks fall short; they wait first, in admission order."""
    decoding = [q for q in rep.running if q["p"] >= inputs[q["i"]] + q["r"]]
    grow = {id(q): units(inputs[q["i"]] + q["j"]) - q["k"] for q in decoding}
    need = sum(grow.values())
    others = list(enumerate(rep.running))[1:]
    if policy == "recompute":
        order = [q for _, q in reversed(others)]
    else:  # retract: fewest emitted tokens, then the longest prompt, then the latest admitted
        order = [q for _, q in sorted(others, key=lambda pq: (pq[1]["j"], -inputs[pq[1]["i"]], -pq[0]))]
    victims = []
    for v in order:
        if need <= rep.free:
            break
        victims.append(v)
        rep.free += v["k"]
        need -= grow.pop(id(v), 0)
    assert need <= rep.free, "even alone the oldest request does not fit"
    for q in decoding:
        if id(q) in grow:
            q["k"] += grow[id(q)]
    rep.free -= need
    victims.sort(key=lambda v: rep.running.index(v))
    for v in victims:
        v.update(p=0, r=v["j"], k=0)
        preempted[v["i"]] += 1
    rep.running = [q for q in rep.running if all(q is not v for v in victims)]
    rep.parked = victims + rep.parked


def simulate_pipeline(t: dict, arrivals, inputs, outputs, batch, replicas=1, engines=None):
    """MODEL.md §10 on §9: R replicas under round robin (request i to replica i mod R), each n_pp independent §9
    engines of ⌊B/n_pp⌋ slots and 1/n_pp of the stage's pool, its arrivals dealt to them round robin; each
    engine's step is τ_pp (``t`` from :func:`stage_terms`). Per request ttft and e2e; engines' busy times.
    ``engines``: n_pp·D engines per replica where the group has D attention data-parallel ranks (docs/layouts.md;
    ``t`` one rank's, its pool that rank's)."""
    N, n_pp = len(inputs), engines or t.get("n_pp", 1)
    ttft, e2e, busy, steps = [math.nan] * N, [math.nan] * N, [], 0
    for r in range(replicas):
        mine = [i for i in range(N) if i % replicas == r]
        for e in range(n_pp):
            sub = mine[e::n_pp]
            if not sub:
                continue
            got = simulate(
                t,
                [arrivals[i] for i in sub],
                [inputs[i] for i in sub],
                [outputs[i] for i in sub],
                batch // n_pp,
            )
            for k, i in enumerate(sub):
                ttft[i], e2e[i] = got["ttft"][k], got["e2e"][k]
            busy += got["busy"]
            steps += got["steps"]
    return dict(ttft=ttft, e2e=e2e, busy=busy, steps=steps)


def simulate_prefill_pool(t: dict, arrivals, inputs, hold, replicas, batch=math.inf, engines=1):
    """MODEL.md §10's prefill pool: request i to replica i mod R, a replica's requests dealt to its ``engines``
    (n_pp·D) round robin; admitted FCFS while footprint(I_i) fits the free KV and, with a ``batch`` limit (per
    replica; ⌊batch/engines⌋ per engine), fewer requests are held, a completed prompt held until its transfer
    ends; steps hold only prefill chunks (budget step_tokens); its first token at the end of its last prefill step;
    its KV freed ``hold[i]`` (the transfer) later. Returns the first-token times."""
    N = len(inputs)
    fp = [footprint(t["arch"], inputs[i], t["block"], t["r"], t["o"]) for i in range(N)]
    first = [math.nan] * N
    limit = math.floor(batch / engines) if math.isfinite(batch) else math.inf
    for r, e in [(r, e) for r in range(replicas) for e in range(engines)]:
        queue = deque([i for i in range(N) if i % replicas == r][e::engines])
        free, clock, running, held = t["pool"], 0.0, [], []  # held: (release time, bytes)
        while queue or running:
            if running:
                now = clock
            else:
                now = max(clock, arrivals[queue[0]])
                if math.isinf(now):  # the rest never arrive
                    break
            for rel in [h for h in held if h[0] <= now]:
                free += rel[1]
                held.remove(rel)
            while queue and arrivals[queue[0]] <= now and fp[queue[0]] <= free and len(running) + len(held) < limit:
                i = queue.popleft()
                free -= fp[i]
                running.append(dict(i=i, p=0))
            if not running:  # the head waits for a transfer to free KV (or a slot)
                assert held, "a prompt that cannot fit an empty replica"
                clock = max(now, min(h[0] for h in held))
                continue
            budget, chunks = t["step_tokens"], []
            for q in running:
                n = min(inputs[q["i"]] - q["p"], t["chunk"] if t["chunk"] > 0 else math.inf, budget)
                budget -= n
                if n > 0:
                    chunks.append((q, n))
            fin = now + step_seconds([], [(n, q["p"]) for q, n in chunks], t)
            for q, n in chunks:
                q["p"] += n
                if q["p"] == inputs[q["i"]]:
                    first[q["i"]] = fin
                    if hold[q["i"]] > 0:
                        held.append((fin + hold[q["i"]], fp[q["i"]]))
                    else:
                        free += fp[q["i"]]
            running = [q for q in running if q["p"] < inputs[q["i"]]]
            clock = fin
    return first


def simulate_disaggregated(
    tp_: dict, td: dict, arrivals, inputs, outputs, R_p, R_d, batch_d, xfer, batch_p=math.inf, engines=(1, None)
):
    """MODEL.md §10: the prefill pool (``tp_``, ``batch_p`` per replica, ``engines[0]`` engines each), then each
    request's KV moved in ``xfer(i)`` seconds to decode replica k mod R_d, k its rank in arrival order at the decode
    pool (ties to the lower index); the decode pool (``td``) admits by B_d slots and footprint(I + O), its replica
    ``engines[1]`` engines (default its n_pp). Per request ttft, e2e."""
    N = len(inputs)
    hold = [xfer(i) if outputs[i] > 1 else 0.0 for i in range(N)]
    first = simulate_prefill_pool(tp_, arrivals, inputs, hold, R_p, batch_p, engines[0])
    ttft = [first[i] - arrivals[i] for i in range(N)]
    e2e = list(ttft)
    later = sorted((first[i] + hold[i], i) for i in range(N) if outputs[i] > 1)
    n_pp = engines[1] or td.get("n_pp", 1)
    for r in range(R_d):
        for e in range(n_pp):  # a pipelined decode replica: n_pp virtual engines dealt its arrivals round robin
            mine = [i for k, (_, i) in enumerate(later) if k % R_d == r][e::n_pp]
            if not mine:
                continue
            got = simulate(
                td,
                [first[i] + hold[i] for i in mine],
                [inputs[i] for i in mine],
                [outputs[i] for i in mine],
                batch_d // n_pp,
                prefilled=True,
            )
            for k, i in enumerate(mine):
                e2e[i] = got["end"][k] - arrivals[i]
    return dict(ttft=ttft, e2e=e2e, first=first)


def closed_loop_disaggregated(tp_, td, inputs, outputs, clients, R_p, R_d, batch_p, batch_d, xfer, engines=(1, 1)):
    """docs/layouts.md, disaggregated rows: ``clients`` closed-loop clients, request q client q mod C's (q div C)-th,
    sent when that client's previous request ends; the arrivals iterated to their fixed point over
    :func:`simulate_disaggregated` (each pass on the stream in arrival order, ties by index; unsent requests left
    out). Per request arrival, first-token and end times, and the passes."""
    N = len(inputs)
    arrivals = [0.0 if q < clients else math.inf for q in range(N)]
    for passes in range(1, 1000):
        sent = sorted((arrivals[q], q) for q in range(N) if math.isfinite(arrivals[q]))
        order = [q for _, q in sent]
        got = simulate_disaggregated(
            tp_,
            td,
            [arrivals[q] for q in order],
            [inputs[q] for q in order],
            [outputs[q] for q in order],
            R_p,
            R_d,
            batch_d,
            lambda k, order=order: xfer(order[k]),
            batch_p,
            engines,
        )
        first, end = [math.inf] * N, [math.inf] * N
        for k, q in enumerate(order):
            first[q] = got["first"][k]
            end[q] = got["e2e"][k] + arrivals[q]
        nxt = [0.0 if q < clients else end[q - clients] for q in range(N)]
        if nxt == arrivals:
            return dict(arrival=arrivals, first=first, end=end, passes=passes)
        arrivals = nxt
    raise AssertionError("the closed loop did not settle")


def study_gpu(sim, j: int = 0) -> dict:
    """GPU ``j`` of a parsed simulation study as the study resolved it (catalog fields, the calibrated link where its
    preset takes it; the plain roofline without the measured all-reduce), base units: the reference's GPU input."""
    return {k: float(np.asarray(v).reshape(-1)[j]) for k, v in sim.gpu.fields().items()}


def study_terms(sim, arch: dict) -> dict:
    """The replica terms of a parsed simulation study's first candidate: ``arch`` (its model's catalog fields) on its
    first GPU as the study resolved it, at its first serving settings."""
    sv = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in sim.serving.fields().items()}
    return replica_terms(arch, study_gpu(sim), sv)


def simulate_study(sim, arch: dict, clients=None, **options):
    """(:func:`simulate` of a parsed study's first candidate over its stream, at its first batch limit and replica
    count and its router, the terms): ``options`` as :func:`simulate` takes them (policy, prefill_first …)."""
    t = study_terms(sim, arch)
    st = sim.stream
    want = simulate(
        t,
        None if st.arrival_s is None else st.arrival_s.tolist(),
        [int(x) for x in st.input_len],
        [int(x) for x in st.output_len],
        int(sim.batch[0]),
        int(sim.replicas[0]),
        sim.router,
        clients,
        **options,
    )
    return want, t
