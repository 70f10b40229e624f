"""Tensor-parallel communication (MODEL.md §4c; slimjax's extension).

A group of n GPUs runs tensor parallel: every layer ends its attention and its FFN with a ring
all-reduce of the activations of the tokens in the pass, x = tokens·D·b_a bytes (b_a = 2):
t_ar(x) = τ + 2·(n − 1)/n · x / (η_link·BW_link(n)) (0 when n = 1, and where the GPU has no link figure), with
BW_link(n) from the link topology: the per-GPU figure on a switch or PCIe, (n − 1)·link on a full mesh (each GPU
one link to each peer, the n − 1 of a group used by parallel rings), and η_link the achieved fraction. NCCL's
ring all-reduce moves 2·(n − 1)/n of the buffer per GPU over its link (its "bus bandwidth" relation
busbw = algbw·2(n − 1)/n). Not overlapped with compute (conservative). Seconds, bytes, bytes/s.

Where the GPU carries NCCL's measured all-reduce at the group's n (its ``allreduce_n{n}_*`` fields, from
the GPU catalog's ``allreduce`` block, docs/collectives.md), t_ar is that measurement's two protocol lines
(:func:`slimjax.model.collectives.protocol_collective_s`) instead of the line above: a pass of n_tok tokens costs
2·L·(τ_s + x/B_s) below the switch x < S and 2·L·(τ_l + x/B_l) from it, x = n_tok·D·b_a.
"""

from __future__ import annotations

import jax.numpy as jnp

ACTIVATION_BYTES = 2.0  # b_a, bf16 activations
MEASURED_LINK_DEGREES = (2, 4, 8)  # the group sizes a GPU entry may give NCCL's measured all-reduce for
# the measured all-reduce at one n: small protocol's latency and bandwidth, switch size, large protocol's
PROTOCOL_PARTS = ("small_latency_s", "small_bytes_per_s", "switch_bytes", "large_latency_s", "large_bytes_per_s")


MEASURED_COLLECTIVES = ("allreduce", "alltoall")  # the NCCL collectives a GPU entry may carry measured


def collective_field(op: str, n: int, part: str) -> str:
    """The GPUSpec field holding ``part`` (:data:`PROTOCOL_PARTS`) of the measured collective ``op``
    (:data:`MEASURED_COLLECTIVES`) on n GPUs."""
    return f"{op}_n{n}_{part}"


def allreduce_field(n: int, part: str) -> str:
    """The GPUSpec field holding ``part`` (:data:`PROTOCOL_PARTS`) of the measured all-reduce on n GPUs."""
    return collective_field("allreduce", n, part)


def measured_collective(gpu, n_gpu, op: str = "allreduce") -> dict:
    """{part: value} of ``gpu``'s measured ``op`` at ``n_gpu`` (:data:`PROTOCOL_PARTS`), shaped like their
    broadcast; ``small_bytes_per_s`` 0 where the GPU has none at that n."""
    out = {
        p: jnp.zeros(jnp.broadcast_shapes(jnp.shape(n_gpu), jnp.shape(gpu.link_bytes_per_s))) for p in PROTOCOL_PARTS
    }
    for n in MEASURED_LINK_DEGREES:
        for p in PROTOCOL_PARTS:
            out[p] = jnp.where(n_gpu == n, getattr(gpu, collective_field(op, n, p)), out[p])
    return out


def measured_allreduce(gpu, n_gpu) -> dict:
    """:func:`measured_collective` of the all-reduce."""
    return measured_collective(gpu, n_gpu, "allreduce")


def link_bandwidth(n_gpu, link_bytes_per_s, link_mesh, link_efficiency):
    """η_link·BW_link(n), bytes/s: ``link_bytes_per_s`` per GPU (switch, PCIe; ``link_mesh`` = 0) or per peer
    link (mesh, ``link_mesh`` = 1: n − 1 of them, at least one); 0 stays 0 (no figure)."""
    links = jnp.where(link_mesh > 0, jnp.maximum(n_gpu - 1.0, 1.0), 1.0)
    return link_efficiency * links * link_bytes_per_s


def allreduce_time(message_bytes, n_gpu, link_bytes_per_s, latency_s):
    """t_ar(x) = τ + 2·(n − 1)/n · x / BW; 0 when n ≤ 1 or without a link figure (BW = 0). ``link_bytes_per_s``
    is the group's achieved bandwidth, :func:`link_bandwidth`."""
    on = (n_gpu > 1) & (link_bytes_per_s > 0)
    safe_n = jnp.where(n_gpu > 0, n_gpu, 1.0)
    safe_link = jnp.where(link_bytes_per_s > 0, link_bytes_per_s, 1.0)
    return jnp.where(on, latency_s + 2.0 * (safe_n - 1.0) / safe_n * message_bytes / safe_link, 0.0)


def tp_comm_terms(n_layers, hidden, n_gpu, link_bytes_per_s, latency_s, passes=None):
    """(fixed, per_token) seconds with 2·L·t_ar(tokens·D·b_a) = fixed + per_token·tokens: the
    communication of one decode step (tokens = B) or one prefill chunk (tokens = n_k); ``link_bytes_per_s`` as
    :func:`allreduce_time`'s. ``passes``: all-reduces per pass (default 2·L), ``hidden``·b_a the bytes per token."""
    passes = 2.0 * n_layers if passes is None else passes
    on = (n_gpu > 1) & (link_bytes_per_s > 0)
    safe_n = jnp.where(n_gpu > 0, n_gpu, 1.0)
    safe_link = jnp.where(link_bytes_per_s > 0, link_bytes_per_s, 1.0)
    fixed = jnp.where(on, passes * latency_s, 0.0)
    per_token = jnp.where(on, passes * 2.0 * (safe_n - 1.0) / safe_n * hidden * ACTIVATION_BYTES / safe_link, 0.0)
    return fixed, per_token


def tp_comm_segments(n_layers, hidden, n_gpu, gpu, passes=None, engine_latency_s=0.0) -> tuple:
    """(fixed, per_token, switch_tokens, large_fixed, large_per_token) seconds: 2·L·t_ar(n_tok·D·b_a) =
    fixed + per_token·n_tok below ``switch_tokens`` and large_fixed + large_per_token·n_tok from it, with the
    GPU's measured all-reduce at n_gpu where it has one, else §4c's line at η_link·BW_link(n) and τ (then
    switch_tokens = ∞ and the large line is 0). ``passes`` all-reduces per pass (default 2·L) of ``hidden``·b_a
    bytes per token. ``engine_latency_s`` τ_c > 0: the engine's own all-reduce kernel (docs/collectives.md) sets
    the small messages' latency, τ_c in place of NCCL's τ_s (or of §4c's τ), where the n_gpu GPUs share one NVLink
    domain (n ≤ ``gpus_per_node``); its bandwidth terms stay the measured (or §4c's) ones."""
    passes = 2.0 * n_layers if passes is None else passes
    own = (engine_latency_s > 0) & (n_gpu <= gpu.gpus_per_node)
    line = tp_comm_terms(
        n_layers,
        hidden,
        n_gpu,
        link_bandwidth(n_gpu, gpu.link_bytes_per_s, gpu.link_mesh, gpu.link_efficiency),
        jnp.where(own, engine_latency_s, gpu.allreduce_latency_s),
        passes,
    )
    m = measured_allreduce(gpu, n_gpu)
    has = m["small_bytes_per_s"] > 0
    token_bytes = hidden * ACTIVATION_BYTES

    def per_token(bw):
        return passes * token_bytes / jnp.where(has, bw, 1.0)

    zero = 0.0 * line[0]
    return (
        jnp.where(has, passes * jnp.where(own, engine_latency_s, m["small_latency_s"]), line[0]),
        jnp.where(has, per_token(m["small_bytes_per_s"]), line[1]),
        jnp.where(has, m["switch_bytes"] / token_bytes, jnp.inf + zero),
        jnp.where(has, passes * m["large_latency_s"], zero),
        jnp.where(has, per_token(m["large_bytes_per_s"]), zero),
    )


def alltoall_segments(passes, token_bytes, n_gpu, gpu) -> tuple:
    """(fixed, per_token, switch_tokens, large_fixed, large_per_token) seconds of ``passes`` all-to-alls per pass
    among ``n_gpu`` GPUs, each GPU's buffer ``token_bytes`` per token of the pass (docs/layouts.md): NCCL's
    measured all-to-all at n_gpu where the GPU has one (its two protocol lines, x the buffer); else, inside one
    NVLink domain (n ≤ ``gpus_per_node``), τ + (n − 1)/n·x/(η_link·BW_link(n)); across nodes the share leaving
    the node over the scale-out NIC, τ_net + (n − g)/n·x/BW_net (g = ``gpus_per_node``; the NVLink share is
    faster and overlaps it). 0 where n ≤ 1, or without the figure the path needs."""
    m = measured_collective(gpu, n_gpu, "alltoall")
    has = m["small_bytes_per_s"] > 0
    safe_n = jnp.where(n_gpu > 0, n_gpu, 1.0)
    link = link_bandwidth(n_gpu, gpu.link_bytes_per_s, gpu.link_mesh, gpu.link_efficiency)
    inside = n_gpu <= gpu.gpus_per_node
    share = jnp.where(inside, (safe_n - 1.0) / safe_n, (safe_n - gpu.gpus_per_node) / safe_n)
    bandwidth = jnp.where(inside, link, gpu.network_bytes_per_s)
    latency = jnp.where(inside, gpu.allreduce_latency_s, gpu.network_latency_s)
    on = (n_gpu > 1) & (has | (bandwidth > 0))
    safe_bw = jnp.where(bandwidth > 0, bandwidth, 1.0)
    zero = 0.0 * safe_n

    def measured_per_token(bw):
        return passes * token_bytes / jnp.where(has, bw, 1.0)

    line = (passes * latency, passes * share * token_bytes / safe_bw)
    return (
        jnp.where(on, jnp.where(has, passes * m["small_latency_s"], line[0]), zero),
        jnp.where(on, jnp.where(has, measured_per_token(m["small_bytes_per_s"]), line[1]), zero),
        jnp.where(has, m["switch_bytes"] / jnp.where(token_bytes > 0, token_bytes, 1.0), jnp.inf + zero),
        jnp.where(has, passes * m["large_latency_s"], zero),
        jnp.where(has, measured_per_token(m["large_bytes_per_s"]), zero),
    )
