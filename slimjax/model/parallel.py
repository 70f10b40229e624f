"""Tensor-parallel communication (MODEL.md §4c; slimjax's extension).

A group of n GPUs runs tensor parallel: every layer ends its attention and its FFN with a ring
all-reduce of the activations of the tokens in the pass, x = tokens·D·b_a bytes (b_a = 2):
t_ar(x) = τ + 2·(n − 1)/n · x / (η_link·BW_link(n)) (0 when n = 1, and where the GPU has no link figure), with
BW_link(n) from the link topology: the per-GPU figure on a switch or PCIe, (n − 1)·link on a full mesh (each GPU
one link to each peer, the n − 1 of a group used by parallel rings), and η_link the achieved fraction. NCCL's
ring all-reduce moves 2·(n − 1)/n of the buffer per GPU over its link (its "bus bandwidth" relation
busbw = algbw·2(n − 1)/n). Not overlapped with compute (conservative). Seconds, bytes, bytes/s.
"""

from __future__ import annotations

import jax.numpy as jnp

ACTIVATION_BYTES = 2.0  # b_a, bf16 activations


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


def tp_comm_terms(n_layers, hidden, n_gpu, link_bytes_per_s, latency_s):
    """(fixed, per_token) seconds with 2·L·t_ar(tokens·D·b_a) = fixed + per_token·tokens: the
    communication of one decode step (tokens = B) or one prefill chunk (tokens = n_k); ``link_bytes_per_s`` as
    :func:`allreduce_time`'s."""
    on = (n_gpu > 1) & (link_bytes_per_s > 0)
    safe_n = jnp.where(n_gpu > 0, n_gpu, 1.0)
    safe_link = jnp.where(link_bytes_per_s > 0, link_bytes_per_s, 1.0)
    fixed = jnp.where(on, 2.0 * n_layers * latency_s, 0.0)
    per_token = jnp.where(
        on, 2.0 * n_layers * 2.0 * (safe_n - 1.0) / safe_n * hidden * ACTIVATION_BYTES / safe_link, 0.0
    )
    return fixed, per_token
