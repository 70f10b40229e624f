"""Measured collectives (slimjax's extension of MODEL.md §4c, docs/collectives.md): the time of one NCCL collective
of x bytes on n GPUs as NCCL's own cost model runs it.

NCCL times each (algorithm, protocol) pair as a latency plus the message over a bandwidth and runs the one it predicts
fastest (its tuner): the low-latency protocols (LL, LL128) for small messages, Simple for large ones, switching at a
size threshold. Measured times follow two such lines with a step at the switch S:

    t(x) = τ_s + x/B_s   (x < S),        t(x) = τ_l + x/B_l   (x ≥ S)

seconds (x bytes; τ the protocol's latency in s, B its algorithm bandwidth x/t in bytes/s). §4c's line
τ + 2(n − 1)/n·x/(η_link·BW_link) is the one-protocol case. Bus bandwidth, NCCL's figure comparable across n, is
``BUS_FACTOR``·B: 2(n − 1)/n for an all-reduce, (n − 1)/n for an all-gather, a reduce-scatter or an all-to-all.
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


def protocol_collective_s(
    message_bytes, small_latency_s, small_bytes_per_s, switch_bytes, large_latency_s, large_bytes_per_s
):
    """t(x) of a collective of ``message_bytes`` on two protocol lines switching at ``switch_bytes`` (module
    docstring), seconds."""
    small = small_latency_s + message_bytes / small_bytes_per_s
    large = large_latency_s + message_bytes / large_bytes_per_s
    return jnp.where(message_bytes < switch_bytes, small, large)
