"""The capacity calculator composed from its formulas (MODEL.md §3–§5), for broadcastable specs.

``capacity_cell_terms`` holds what does not depend on the batch (memory, prefill); ``service_terms``
gives the service proxy at any batch array (roofline, or measured mode where a measurement exists);
``queue_terms`` the M/M/c queue at m = min(B, max_seqs) slots. MoE and MLA models get §4b's roofline
(active parameters, expert weight reads, MLA attention FLOPs), groups of n > 1 GPUs §4c's all-reduce;
measured mode wins wherever given.
"""

from __future__ import annotations

import jax.numpy as jnp

from . import experts, memory, parallel, pipeline, queue, roofline, speculative
from .rates import request_rate, token_throughput
from .specs import ServingSpec


def roofline_variant(model) -> str:
    """'moe', 'mla', 'moe+mla' or '' (dense): how §4b extends §4 for this model (host side)."""
    return "+".join(name for name, on in (("moe", model["moe"]), ("mla", model["mla"])) if on)


def max_seqs(model, gpu, serving, input_len, output_len):
    """max_seqs = ⌊pool / footprint(I + O)⌋ (§3): the concurrent sequences of I + O tokens the KV pool holds
    (0 where the weights leave no pool)."""
    return kv_capacity(model, gpu, serving, input_len, output_len)["max_seqs"]


def kv_capacity(model, gpu, serving, input_len, output_len):
    """Memory (§3) of one stage of the group (§10; the whole group when n_pp = 1): e_kv, the model's weights M_W,
    the stage's KV pool u·n_tp·M − f·M_W − M_R (less a speculative draft's own weights), a sequence's footprint of
    I + O tokens on the stage's layers, max_seqs = ⌊pool / footprint⌋ (f = ⌈L/n_pp⌉/L, :mod:`.pipeline`)."""
    e_kv = memory.model_kv_bytes_per_layer_token(model, serving.kv_dtype_bytes)
    weights = memory.weights_bytes(model.n_params, serving.bytes_per_weight)
    share = pipeline.stage_fraction(model.n_layers, serving.pipeline_stages)
    # D attention data-parallel ranks (docs/layouts.md): the stage's D·n_tp GPUs hold the dense part once per rank
    # and the routed experts once, each rank M_R and 1/D of the pool (D = 1: §3 as written)
    ranks = serving.dp_ranks
    # a speculative draft's own weights beside the target's, once per rank (docs/speculative.md; 0 without one)
    draft = speculative.resident_bytes(
        serving.speculative_tokens,
        speculative.target_share(serving.speculative_method, model.n_layers),
        weights,
        serving.draft_weight_bytes,
    )
    stored = weights + (ranks - 1.0) * dense_weights_bytes(model, serving.bytes_per_weight) + ranks * draft
    pool = (
        memory.kv_pool_bytes(
            serving.memory_utilization,
            serving.n_gpu * ranks * gpu.memory_bytes,
            share * stored,
            ranks * serving.reserved_bytes,
        )
        / ranks
    )
    footprint = share * memory.seq_footprint_bytes(
        e_kv,
        model.n_layers,
        model.n_sliding_layers,
        model.window,
        input_len + output_len,
        serving.block_size,
        serving.kv_replication,
        serving.kv_overhead,
    )
    return dict(
        e_kv=e_kv, weights=weights, pool=pool, footprint=footprint, max_seqs=memory.max_concurrent_seqs(pool, footprint)
    )


def routed_expert_params(model):
    """L_moe·P_e: one routed expert's weights across the MoE layers (§4b; 0 for a dense model)."""
    return model.n_moe_layers * experts.expert_params(model.n_ffn, model.hidden, model.expert_ffn_dim)


def dense_weights_bytes(model, bytes_per_weight):
    """b_w·(P − E·L_moe·P_e): the weights besides the routed experts (attention, embeddings, dense and shared
    FFNs), what every attention data-parallel rank holds (docs/layouts.md), bytes."""
    return bytes_per_weight * (model.n_params - model.n_experts * routed_expert_params(model))


def runs_at_fp8_peak(gpu, bytes_per_weight):
    """Whether 8-bit weights (> 0.6 and ≤ 1.01 bytes with scales) run at the GPU's dense FP8 peak (it has one)."""
    return (bytes_per_weight > 0.6) & (bytes_per_weight <= 1.01) & (gpu.flops_fp8_per_s > 0)


def tensor_core_peak(gpu, bytes_per_weight):
    """F_max for the checkpoint's weights: the dense FP4 peak for 4-bit weights (≤ 0.6 bytes with
    scales) and the FP8 peak for 8-bit ones (≤ 1.01 bytes) where the GPU has that peak; the dense bf16
    peak otherwise (§0), as kernels that dequantize to bf16 do."""
    fp4 = (bytes_per_weight <= 0.6) & (gpu.flops_fp4_per_s > 0)
    fp8 = runs_at_fp8_peak(gpu, bytes_per_weight)
    return jnp.where(fp4, gpu.flops_fp4_per_s, jnp.where(fp8, gpu.flops_fp8_per_s, gpu.flops_per_s))


def achieved_flops_per_s(gpu, bytes_per_weight, e_f, e_f8):
    """F_max · e_F, FLOP/s of one GPU (§0), with its own efficiency e_F8 at the FP8 peak where 8-bit weights run
    there: FP8 GEMMs (and the bf16 attention and activation quantisation around them) reach a smaller fraction of
    their peak than bf16 ones of theirs. e_F8 NaN (unset): e_F, the same fraction of either peak."""
    return tensor_core_peak(gpu, bytes_per_weight) * fp8_or_base(gpu, bytes_per_weight, e_f, e_f8)


def achieved_bandwidth_bytes_per_s(gpu, bytes_per_weight, e_b, e_b8):
    """BW · e_B, bytes/s of one GPU (§0), with its own efficiency e_B8 where 8-bit weights run at the FP8 peak: the
    FP8 GEMM kernels that stream them (and the steps built around them) reach another fraction of the HBM bandwidth
    than bf16 ones. e_B8 NaN (unset): e_B."""
    return gpu.bandwidth_bytes_per_s * fp8_or_base(gpu, bytes_per_weight, e_b, e_b8)


def fp8_or_base(gpu, bytes_per_weight, base, fp8_value):
    """An FP8 efficiency where 8-bit weights run at the FP8 peak and it is set (not NaN), else its base one."""
    fp8 = runs_at_fp8_peak(gpu, bytes_per_weight) & ~jnp.isnan(fp8_value)
    return jnp.where(fp8, fp8_value, base)


TP_DEGREES = (1.0, 2.0, 4.0, 8.0)  # the tensor-parallel degrees `n_gpu: auto` considers (§4c)


def replicated_kv(n_gpu, n_kv_heads, mla=0.0):
    """r = max(1, n / H_kv): KV heads are replicated when the group has more GPUs than KV heads (§4c); r = n for MLA
    (§4b): the compressed latent c_KV is shared by every head, so each tensor-parallel rank holds all of it (why MLA
    models are served with attention data parallel)."""
    return jnp.where(jnp.asarray(mla) > 0, n_gpu, jnp.maximum(1.0, n_gpu / n_kv_heads))


def configuration_fits(model, gpu, serving, tokens, batch=1.0):
    """A configuration fits when its pool > 0 and max_seqs ≥ 1 for a sequence of ``tokens`` (§4c); with
    ``batch``, when it holds that many such sequences at once."""
    kv = kv_capacity(model, gpu, serving, tokens, 0.0)
    return (kv["pool"] > 0) & (kv["max_seqs"] >= jnp.maximum(batch, 1.0))


def smallest_fitting_tp(model, gpu, serving, tokens, kv_replication_auto=False, batch=1.0):
    """The smallest n in TP_DEGREES, at most the GPU's ``gpus_per_node`` (tensor parallel stays inside a node,
    §10), that divides H_q and with which the group fits a sequence of ``tokens`` (§4c ``n_gpu: auto``; with
    ``batch``, that many of them), the other settings as ``serving`` has them (r = max(1, n/H_kv) where
    ``kv_replication_auto``); 0 where none does."""
    best = jnp.zeros(
        jnp.broadcast_shapes(jnp.shape(model.n_heads), jnp.shape(gpu.memory_bytes), jnp.shape(serving.n_gpu))
    )
    for n in reversed(TP_DEGREES):
        r = jnp.where(kv_replication_auto, replicated_kv(n, model.n_kv_heads, model.mla), serving.kv_replication)
        trial = ServingSpec(**{**serving.fields(), "n_gpu": n + 0.0 * serving.n_gpu, "kv_replication": r})
        ok = (jnp.mod(model.n_heads, n) == 0) & (n <= gpu.gpus_per_node)
        ok = ok & configuration_fits(model, gpu, trial, tokens, batch)
        best = jnp.where(ok, n, best)
    return best


def largest_node_tp(model, gpu):
    """The largest n in TP_DEGREES within one node (``gpus_per_node``) that divides H_q; 0 where none: the TP
    degree pipeline stages are added to when no single group fits (§10 ``n_gpu: auto`` then ``pp: auto``)."""
    best = jnp.zeros(jnp.broadcast_shapes(jnp.shape(model.n_heads), jnp.shape(gpu.gpus_per_node)))
    for n in TP_DEGREES:
        best = jnp.where((jnp.mod(model.n_heads, n) == 0) & (n <= gpu.gpus_per_node), n, best)
    return best


def smallest_fitting_pp(model, gpu, serving, tokens, batch=1.0):
    """The smallest n_pp in PP_DEGREES (at most L) with which the group of ``serving.n_gpu``-GPU stages fits a
    sequence of ``tokens`` (§10 ``pp: auto``; with ``batch``, that many); 0 where none does."""
    best = jnp.zeros(
        jnp.broadcast_shapes(jnp.shape(model.n_layers), jnp.shape(gpu.memory_bytes), jnp.shape(serving.n_gpu))
    )
    for n in reversed(pipeline.PP_DEGREES):
        trial = ServingSpec(**{**serving.fields(), "pipeline_stages": n + 0.0 * serving.n_gpu})
        ok = (n <= model.n_layers) & configuration_fits(model, gpu, trial, tokens, batch)
        best = jnp.where(ok, n, best)
    return best


def roofline_terms(model, gpu, serving, *, at_peak=False):
    """The §4/§4b/§4c roofline's inputs for one group: active parameters, weight and KV read rates, the
    group's FLOP/s and bytes/s with the serving efficiencies, t_l and the all-reduce terms; and (a_pre, a_dec).

    ``at_peak``: 100 % of the group's peak FLOP/s and bandwidth, no launch or communication cost (the
    physical floor of :mod:`.floor`)."""
    e_kv = memory.model_kv_bytes_per_layer_token(model, serving.kv_dtype_bytes)
    weights = memory.weights_bytes(model.n_params, serving.bytes_per_weight)
    per_token = serving.kv_replication * serving.kv_overhead * e_kv
    p_e = experts.expert_params(model.n_ffn, model.hidden, model.expert_ffn_dim)
    a_pre, a_dec = experts.attention_flops_coefficients(
        model.n_layers,
        model.n_heads,
        model.head_dim,
        model.mla,
        model.kv_lora_rank,
        model.rope_dim,
        model.qk_nope_dim,
        model.v_head_dim,
    )
    if at_peak:  # (arrays shaped like the group's, so the terms vmap like any spec)
        zero = 0.0 * serving.n_gpu
        e_f, e_b, launch = 1.0 + zero, 1.0 + zero, zero
        e_f8, e_b8 = e_f, e_b
        comm = (zero, zero, jnp.inf + zero, zero, zero)
    else:
        zero = 0.0 * serving.n_gpu
        e_f, e_b = serving.compute_efficiency, serving.bandwidth_efficiency
        launch = serving.launch_overhead_s + layers_overhead_s(model, serving)
        e_f8, e_b8 = serving.compute_efficiency_fp8, serving.bandwidth_efficiency_fp8
        comm = parallel.tp_comm_segments(
            model.n_layers,
            model.hidden,
            serving.n_gpu,
            gpu,
            tp_passes(model, serving),
            serving.engine_allreduce_latency_s,
        )
    roof = roofline.Roof(
        active_params=experts.active_params(
            model.n_params, model.n_moe_layers, model.n_experts, model.experts_per_token, p_e
        ),
        weights=weights,
        routed_expert_bytes=serving.bytes_per_weight * model.n_moe_layers * p_e,
        n_experts=model.n_experts,
        experts_per_token=model.experts_per_token,
        kv_per_token_full=per_token * (model.n_layers - model.n_sliding_layers),
        kv_per_token_sliding=per_token * model.n_sliding_layers,
        window=model.window,
        flops=serving.n_gpu * achieved_flops_per_s(gpu, serving.bytes_per_weight, e_f, e_f8),
        bandwidth=serving.n_gpu * achieved_bandwidth_bytes_per_s(gpu, serving.bytes_per_weight, e_b, e_b8),
        launch_overhead_s=launch,
        comm_fixed_s=comm[0],
        comm_per_token_s=comm[1],
        comm_switch_tokens=comm[2],
        comm_large_fixed_s=comm[3],
        comm_large_per_token_s=comm[4],
        dp_ranks=serving.dp_ranks,
        expert_ranks=serving.expert_ranks,
        expert_skew=serving.expert_skew,
        routed_expert_params=routed_expert_params(model) + 0.0 * serving.n_gpu,
        expert_comm=() if at_peak else layout_comm_lines(model, gpu, serving),
        expert_compute_efficiency=1.0 + zero if at_peak else serving.expert_compute_efficiency,
        expert_bandwidth_efficiency=1.0 + zero if at_peak else serving.expert_bandwidth_efficiency,
        expert_max_normal=experts.expected_max_standard_normal(serving.expert_ranks),
    )
    if not at_peak:  # n_pp stages: one engine's pass goes through every stage and the p2p hops between them (§10)
        roof = pipeline.pipeline_roof(
            roof,
            model.n_layers,
            model.hidden,
            serving.pipeline_stages,
            gpu.network_bytes_per_s,
            gpu.network_latency_s,
        )
    return roof, a_pre, a_dec


def expert_tp(serving):
    """moe_tp, the GPUs one routed expert is split over: as given, or (0: derived) n_tp·D/ep, the stage's GPUs
    over the expert ranks (docs/layouts.md)."""
    return jnp.where(serving.expert_tp > 0, serving.expert_tp, serving.n_gpu * serving.dp_ranks / serving.expert_ranks)


def group_gpus(serving):
    """GPUs of one replica group, n_tp·n_pp·D: tensor-parallel GPUs × pipeline stages (§10) × attention data-parallel
    ranks (docs/layouts.md); what its price counts."""
    return serving.n_gpu * serving.pipeline_stages * serving.dp_ranks


def replica_engines(serving):
    """Engines one replica runs, n_pp·D: n_pp pipeline virtual engines (§10) on each of D attention data-parallel
    ranks (docs/layouts.md); each holds ⌊B/(n_pp·D)⌋ requests, its arrivals dealt round robin."""
    return serving.pipeline_stages * serving.dp_ranks


def layers_overhead_s(model, serving):
    """f·(L·t_L + L_moe·t_X): the per-layer fixed costs of one stage's pass (``layer_overhead_s`` t_L on every layer,
    ``expert_layer_overhead_s`` t_X more on each routed-expert layer; docs/engines.md), seconds, with f = ⌈L/n_pp⌉/L
    the largest stage's share (§10), so that a pipelined step's n_pp·t_l carries g·(L·t_L + L_moe·t_X). Part of the
    step's t_l (:func:`roofline_terms`): 0 where both are 0."""
    f = pipeline.stage_fraction(model.n_layers, serving.pipeline_stages)
    return f * (model.n_layers * serving.layer_overhead_s + model.n_moe_layers * serving.expert_layer_overhead_s)


def tp_passes(model, serving):
    """All-reduces per pass over a rank's n_tp GPUs: 2·L (§4c), or 2·L − L_moe where D > 1 attention data-parallel
    ranks send the MoE layers' tokens to their experts by all-to-all instead (docs/layouts.md)."""
    return jnp.where(serving.dp_ranks > 1, 2.0 * model.n_layers - model.n_moe_layers, 2.0 * model.n_layers)


def layout_comm_lines(model, gpu, serving) -> tuple:
    """The communication a data-parallel layout adds to a rank's pass of n tokens (docs/layouts.md), as CommLines:
    per MoE layer the dispatch and the combine all-to-all among the stage's D·n_tp GPUs (each GPU's buffer n/n_tp
    tokens × k copies × D_h × the dispatch's / bf16 bytes), and the all-reduce inside an expert's moe_tp GPUs of
    the D·n·k/ep tokens an expert rank gets; all 0 where D = 1 (the tokens are on every GPU of the group after
    attention's all-reduce, whose 2·L all-reduces then carry the MoE layers too, §4c)."""
    on = serving.dp_ranks > 1
    moe_layers = jnp.where(on, model.n_moe_layers, 0.0)
    group = serving.n_gpu * serving.dp_ranks
    copies = model.experts_per_token * model.hidden / serving.n_gpu
    lines = (
        parallel.alltoall_segments(moe_layers, copies * serving.dispatch_bytes, group, gpu),
        parallel.alltoall_segments(moe_layers, copies * parallel.ACTIVATION_BYTES, group, gpu),
        parallel.tp_comm_segments(
            model.n_layers,
            model.hidden * serving.dp_ranks * model.experts_per_token / serving.expert_ranks,
            expert_tp(serving),
            gpu,
            moe_layers,
            serving.engine_allreduce_latency_s,
        ),
    )
    return tuple(roofline.CommLine(*line) for line in lines)


def capacity_cell_terms(model, gpu, serving, input_len, output_len, speculating: bool = False):
    """Memory (§3) per (model, GPU, I, O) and chunked prefill (§4) per (model, GPU, I); a group of D data-parallel
    ranks reports its D pools and D·max_seqs (docs/layouts.md). ``speculating`` (static: some group of the grid
    speculates): where k > 0 each chunk adds the draft's pass over it and ``speculation`` holds the terms
    :func:`service_terms` times the decode with (docs/speculative.md)."""
    kv = kv_capacity(model, gpu, serving, input_len, output_len)
    e_kv, weights, pool, footprint = kv["e_kv"], kv["weights"], kv["pool"], kv["footprint"]
    roof, a_pre, a_dec = roofline_terms(model, gpu, serving)
    prefill_s, chunk_max_s, chunks = roofline.prefill_time(input_len, serving.chunk_size, roof, a_pre)
    extra = {}
    if speculating:
        spec = speculative.speculation(model, serving)
        drafts, one = speculative.prefill_drafts_s(spec, roof, a_dec, input_len, serving.chunk_size)
        on = spec.tokens > 0
        prefill_s = jnp.where(on, prefill_s + drafts, prefill_s)
        chunk_max_s = jnp.where(on, chunk_max_s + one, chunk_max_s)  # the longest chunk and a full chunk's draft
        extra["speculation"] = spec
    ranks = serving.dp_ranks  # the group's D data-parallel ranks each hold their own pool and sequences
    return dict(
        **extra,
        weights_bytes=weights,
        kv_pool_bytes=pool * ranks,
        kv_bytes_per_token=memory.kv_bytes_per_token(model.n_layers, e_kv),
        seq_footprint_bytes=footprint,
        max_seqs=kv["max_seqs"] * ranks,
        # a batch of B prompts alone (no output reserved) fits when B ≤ this: the fit check of prefill-only figures
        prompt_max_seqs=kv_capacity(model, gpu, serving, input_len, 0.0)["max_seqs"] * ranks,
        prefill_s=prefill_s,
        chunk_max_s=chunk_max_s,
        chunks=chunks,
        roofline=roof,
        attn_dec=a_dec,
        engines=replica_engines(serving),
    )


def service_terms(cell, measured, batch, input_len, output_len):
    """ITL, ITL with a chunk, TTFT, S(B), request rate and token throughput at ``batch`` (§4).

    Measured mode wherever ``measured.batch`` is not NaN; else the roofline proxy (NaN where the
    roofline does not apply, as ``cell['prefill_s']`` is then). A group of n_pp stages holds B sequences in n_pp
    virtual engines of B/n_pp each (§10), and D data-parallel ranks n_pp·D (docs/layouts.md): its ITL and TTFT are
    one engine's at B/(n_pp·D), its rates the replica's.
    """
    engine = pipeline.engine_batch(batch, cell.get("engines", 1.0))
    itl = roofline.decode_itl(engine, input_len, output_len, cell["roofline"], cell["attn_dec"])
    if "speculation" in cell:  # docs/speculative.md: verify steps of 1 + k tokens, k draft passes, a tokens each
        spec = cell["speculation"]
        spec_itl = speculative.decode_itl(spec, engine, input_len, output_len, cell["roofline"], cell["attn_dec"])
        itl = jnp.where(spec.tokens > 0, spec_itl, itl)
    # NaN wherever prefill is; this select also fixes how XLA fuses (and contracts into FMAs) the decode
    # sums, which keeps dense figures bit-identical to before §4b/§4c (tests/golden/capacity.json)
    itl = jnp.where(jnp.isnan(cell["prefill_s"]), jnp.nan, itl)
    ttft = roofline.time_to_first_token(engine, output_len, cell["prefill_s"], cell["chunks"], itl)
    service = roofline.service_time(output_len, ttft, itl)
    itl_chunk = roofline.itl_with_chunk(itl, cell["chunk_max_s"])
    if measured is not None:
        has = ~jnp.isnan(measured.batch)
        m_service = roofline.measured_service_time(batch, measured.batch, measured.request_rate)
        m_ttft, m_itl = roofline.measured_ttft_itl(output_len, m_service, measured.ttft_s, measured.itl_s)
        itl, ttft, service = (
            jnp.where(has, m_itl, itl),
            jnp.where(has, m_ttft, ttft),
            jnp.where(has, m_service, service),
        )
    return dict(
        itl_s=itl,
        itl_chunk_s=itl_chunk,
        ttft_s=ttft,
        service_s=service,
        request_rate=request_rate(batch, service),
        token_throughput=token_throughput(batch, input_len, output_len, service),
    )


def queue_terms(cell, measured, batch, input_len, output_len, arrival_rate, max_batch: int | None = None):
    """M/M/c at m = min(B, max_seqs) slots with S = S(m) (§5), and the p90 wait (§5 "Wait quantiles");
    ``arrival_rate`` broadcasts against the others (give it an axis of its own); ``max_batch`` a static bound on B
    where known (then m ≤ it)."""
    slots = jnp.minimum(batch, cell["max_seqs"])
    service = service_terms(cell, measured, jnp.maximum(slots, 1.0), input_len, output_len)["service_s"]
    out = queue.mmc(slots, service, arrival_rate, max_batch)
    out["wait_p90_s"] = queue.wait_quantile(out["p_wait"], slots, service, arrival_rate, 0.9)
    return out
