"""The capacity calculator composed from its formulas (MODEL.md §3–§5), for broadcastable specs.

``capacity_cell_terms`` holds what does not depend on the batch (memory, prefill); ``service_terms``
gives the service proxy at any batch array (roofline, or measured mode where a measurement exists);
``queue_terms`` the M/M/c queue at m = min(B, max_seqs) slots. Roofline timing is not applicable to
MoE and MLA models (dense-decoder work estimates): it is NaN there, and measured mode is used when given.
"""

from __future__ import annotations

import jax.numpy as jnp

from . import memory, queue, roofline
from .rates import request_rate, token_throughput


def roofline_applicable(model):
    """Dense decoders only (source 001: 'Select measured mode for MoE and MLA')."""
    return (model.mla == 0) & (model.moe == 0)


def kv_capacity(model, gpu, serving, input_len, output_len):
    """Memory (§3): e_kv, weights, KV pool, per-sequence footprint of I + O tokens, max_seqs."""
    e_kv = memory.model_kv_bytes_per_layer_token(model, serving.kv_dtype_bytes)
    weights = memory.weights_bytes(model.n_params, serving.bytes_per_weight)
    pool = memory.kv_pool_bytes(serving.memory_utilization, serving.n_gpu * gpu.memory_bytes, weights, serving.reserved_bytes)
    footprint = memory.seq_footprint_bytes(
        e_kv, model.n_layers, model.n_sliding_layers, model.window, input_len + output_len,
        serving.block_size, serving.kv_replication, serving.kv_overhead,
    )
    return dict(e_kv=e_kv, weights=weights, pool=pool, footprint=footprint,
                max_seqs=memory.max_concurrent_seqs(pool, footprint))


def capacity_cell_terms(model, gpu, serving, input_len, output_len):
    """Memory (§3) per (model, GPU, I, O) and chunked prefill (§4) per (model, GPU, I)."""
    kv = kv_capacity(model, gpu, serving, input_len, output_len)
    e_kv, weights, pool, footprint = kv["e_kv"], kv["weights"], kv["pool"], kv["footprint"]
    per_token = serving.kv_replication * serving.kv_overhead * e_kv
    roof = dict(
        n_params=model.n_params,
        attn=roofline.attention_flops_coefficient(model.n_layers, model.n_heads, model.head_dim),
        weights=weights,
        kv_per_token_full=per_token * (model.n_layers - model.n_sliding_layers),
        kv_per_token_sliding=per_token * model.n_sliding_layers,
        window=model.window,
        flops=serving.n_gpu * gpu.flops_per_s * serving.compute_efficiency,
        bandwidth=serving.n_gpu * gpu.bandwidth_bytes_per_s * serving.bandwidth_efficiency,
        launch_overhead_s=serving.launch_overhead_s,
    )
    prefill_s, chunk_max_s, chunks = roofline.prefill_time(input_len, serving.chunk_size, **roof)
    ok = roofline_applicable(model)
    return dict(
        weights_bytes=weights,
        kv_pool_bytes=pool,
        kv_bytes_per_token=memory.kv_bytes_per_token(model.n_layers, e_kv),
        seq_footprint_bytes=footprint,
        max_seqs=kv["max_seqs"],
        prefill_s=jnp.where(ok, prefill_s, jnp.nan),
        chunk_max_s=jnp.where(ok, chunk_max_s, jnp.nan),
        chunks=chunks,
        roofline=roof,
    )


def service_terms(cell, measured, batch, input_len, output_len):
    """ITL, ITL with a chunk, TTFT, S(B), request rate and token throughput at ``batch`` (§4).

    Measured mode wherever ``measured.batch`` is not NaN; else the roofline proxy (NaN where the
    roofline does not apply, as ``cell['prefill_s']`` is then).
    """
    itl = roofline.decode_itl(batch, input_len, output_len, **cell["roofline"])
    itl = jnp.where(jnp.isnan(cell["prefill_s"]), jnp.nan, itl)
    ttft = roofline.time_to_first_token(batch, output_len, cell["prefill_s"], cell["chunks"], itl)
    service = roofline.service_time(output_len, ttft, itl)
    itl_chunk = roofline.itl_with_chunk(itl, cell["chunk_max_s"])
    if measured is not None:
        has = ~jnp.isnan(measured.batch)
        m_service = roofline.measured_service_time(batch, measured.batch, measured.request_rate)
        m_ttft, m_itl = roofline.measured_ttft_itl(output_len, m_service, measured.ttft_s, measured.itl_s)
        itl, ttft, service = jnp.where(has, m_itl, itl), jnp.where(has, m_ttft, ttft), jnp.where(has, m_service, service)
    return dict(
        itl_s=itl,
        itl_chunk_s=itl_chunk,
        ttft_s=ttft,
        service_s=service,
        request_rate=request_rate(batch, service),
        token_throughput=token_throughput(batch, input_len, output_len, service),
    )


def queue_terms(cell, measured, batch, input_len, output_len, arrival_rate):
    """M/M/c at m = min(B, max_seqs) slots with S = S(m) (§5); ``arrival_rate`` broadcasts against the
    others (give it an axis of its own)."""
    slots = jnp.minimum(batch, cell["max_seqs"])
    service = service_terms(cell, measured, jnp.maximum(slots, 1.0), input_len, output_len)["service_s"]
    return queue.mmc(slots, service, arrival_rate)
