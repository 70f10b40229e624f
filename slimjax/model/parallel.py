"""Tensor-parallel communication (MODEL.md §4c; slimjax's extension).

A group of n GPUs runs tensor parallel: every layer ends its attention and its FFN with a ring
all-reduce of the activations of the tokens in the pass, x = tokens·D·b_a bytes (b_a = 2):
t_ar(x) = τ + 2·(n − 1)/n · x / BW_link (0 when n = 1, and where the GPU has no link figure). NCCL's
ring all-reduce moves 2·(n − 1)/n of the buffer per GPU over its link (its "bus bandwidth" relation
busbw = algbw·2(n − 1)/n). Not overlapped with compute (conservative). Seconds, bytes, bytes/s.
"""

from __future__ import annotations

import jax.numpy as jnp

ACTIVATION_BYTES = 2.0  # b_a, bf16 activations


def allreduce_time(message_bytes, n_gpu, link_bytes_per_s, latency_s):
    """t_ar(x) = τ + 2·(n − 1)/n · x / BW_link; 0 when n ≤ 1 or without a link figure (BW_link = 0)."""
    on = (n_gpu > 1) & (link_bytes_per_s > 0)
    safe_n = jnp.where(n_gpu > 0, n_gpu, 1.0)
    safe_link = jnp.where(link_bytes_per_s > 0, link_bytes_per_s, 1.0)
    return jnp.where(on, latency_s + 2.0 * (safe_n - 1.0) / safe_n * message_bytes / safe_link, 0.0)


def tp_comm_terms(n_layers, hidden, n_gpu, link_bytes_per_s, latency_s):
    """(fixed, per_token) seconds with 2·L·t_ar(tokens·D·b_a) = fixed + per_token·tokens: the
    communication of one decode step (tokens = B) or one prefill chunk (tokens = n_k)."""
    on = (n_gpu > 1) & (link_bytes_per_s > 0)
    safe_n = jnp.where(n_gpu > 0, n_gpu, 1.0)
    safe_link = jnp.where(link_bytes_per_s > 0, link_bytes_per_s, 1.0)
    fixed = jnp.where(on, 2.0 * n_layers * latency_s, 0.0)
    per_token = jnp.where(
        on, 2.0 * n_layers * 2.0 * (safe_n - 1.0) / safe_n * hidden * ACTIVATION_BYTES / safe_link, 0.0
    )
    return fixed, per_token
