"""Measured collectives (slimjax's extension of MODEL.md §4c, docs/collectives.md): the time of one NCCL collective
of x bytes on n GPUs as a pipelined transfer.

A collective that moves x bytes through S pipeline stages in chunks of c bytes, each stage costing a latency α plus
c/B, takes (x/c + S)·(α + c/B); the chunk that minimises it (c* = √(x·α·B/S), which NCCL's channel and chunk tuning
approaches) gives

    t(x) = (√(x/B) + √L)²,        L = S·α

seconds (x bytes, B the collective's algorithm bandwidth x/t as x → ∞ in bytes/s, L the pipeline latency in s).
It is latency-bound (t → L) for small x and bandwidth-bound (t → x/B) for large x, with the √x term between them
that a constant-bandwidth line τ + x/B cannot follow. Bus bandwidth, NCCL's figure comparable across n, is
``bus_factor``·B: 2(n − 1)/n for an all-reduce, (n − 1)/n for an all-gather, a reduce-scatter or an all-to-all.
Pure functions of broadcastable arrays.
"""

from __future__ import annotations

import jax.numpy as jnp

# NCCL's bus-bandwidth factor per collective (nccl-tests' PERFORMANCE.md): the bytes each GPU's link carries per
# byte of the message, as a function of the GPU count n
BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1.0) / n,
    "all_gather": lambda n: (n - 1.0) / n,
    "reduce_scatter": lambda n: (n - 1.0) / n,
    "alltoall": lambda n: (n - 1.0) / n,
}


def pipelined_collective_s(message_bytes, bandwidth_bytes_per_s, pipeline_latency_s):
    """t(x) = (√(x/B) + √L)², seconds, of a collective of ``message_bytes`` (docstring of this module)."""
    return (jnp.sqrt(message_bytes / bandwidth_bytes_per_s) + jnp.sqrt(pipeline_latency_s)) ** 2
