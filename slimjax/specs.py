"""Specs as pytrees: one model, one GPU, one SLIM coefficient set.

A catalog of N models is the same class with a leading axis of length N; names and labels stay
outside the pytree (they are lists beside it). All numbers are in base units (MODEL.md §0):
FLOP/s, bytes/s, bytes, tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import equinox as eqx
import jax
import numpy as np


class ModelSpec(eqx.Module):
    """A decoder architecture (MODEL.md §0). Every field is an array of the same shape."""

    n_layers: jax.Array  # L
    hidden: jax.Array  # D
    n_heads: jax.Array  # H_q
    n_kv_heads: jax.Array  # H_kv
    head_dim: jax.Array  # d_h
    ffn_dim: jax.Array  # D_ff (active width for MoE)
    n_ffn: jax.Array  # FFN matrices: 3 gated, 2 otherwise
    vocab: jax.Array  # V
    n_params: jax.Array  # P (total, for memory)
    weight_bytes: jax.Array  # b_w, bytes per weight
    kv_dtype_bytes: jax.Array  # b_kv, bytes per KV element
    window: jax.Array  # W, sliding window in tokens (inf where none)
    n_sliding_layers: jax.Array  # L_s
    mla: jax.Array  # 1.0 for multi-head latent attention, else 0.0
    moe: jax.Array  # 1.0 for mixture-of-experts FFNs, else 0.0
    kv_lora_rank: jax.Array  # d_c (MLA)
    rope_dim: jax.Array  # d_R (MLA)


class GPUSpec(eqx.Module):
    """One accelerator (MODEL.md §0)."""

    flops: jax.Array  # F_max, dense bf16 FLOP/s
    bandwidth: jax.Array  # BW_max, bytes/s
    memory_bytes: jax.Array  # M_VRAM, bytes
    price_per_hour: jax.Array  # illustrative $/GPU-hour


class SlimCoeffs(eqx.Module):
    """SLIM's calibrated coefficients θ (MODEL.md §1)."""

    eta_c: jax.Array  # compute efficiency of prefill, (0, 1]
    eta_m: jax.Array  # decode efficiency
    B0: jax.Array  # batch offset, sequences
    alpha: jax.Array  # per-output-token overhead, s/token
    gamma: jax.Array  # dense decode scale, s per layer per (D/1024)^2 per token
    t_fixed: jax.Array  # batch-level fixed overhead, s


class ServingSpec(eqx.Module):
    """One balanced replica group's serving settings (MODEL.md §0), per (model, GPU)."""

    n_gpu: jax.Array  # GPUs in the group (tensor parallel)
    memory_utilization: jax.Array  # u, fraction of VRAM the server may use
    reserved_bytes: jax.Array  # M_R, runtime memory reserved for the whole group
    kv_replication: jax.Array  # r ≥ 1
    kv_overhead: jax.Array  # o ≥ 1 (metadata, quantisation scales)
    block_size: jax.Array  # β tokens
    chunk_size: jax.Array  # s tokens; 0 = whole prompt in one chunk
    launch_overhead_s: jax.Array  # t_l per iteration or chunk
    compute_efficiency: jax.Array  # e_F
    bandwidth_efficiency: jax.Array  # e_B
    kv_dtype_bytes: jax.Array  # b_kv
    weight_bytes: jax.Array  # b_w


class MeasuredSpec(eqx.Module):
    """Measured mode (MODEL.md §4): one measured operating point per (model, GPU); NaN where none."""

    batch: jax.Array  # B_cal, the calibration concurrency
    request_rate: jax.Array  # R, completed requests/s at B_cal
    ttft_s: jax.Array
    itl_s: jax.Array


SLIM_PARAMS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SlimCoeffs))


def stack(cls, rows: Sequence[dict], dtype=np.float64):
    """Stack per-item dicts of floats into one spec with a leading axis."""
    names = [f.name for f in dataclasses.fields(cls)]
    return cls(**{n: np.asarray([r[n] for r in rows], dtype=dtype) for n in names})


def astype(spec, dtype):
    """Cast every leaf of a spec to ``dtype`` (numpy, host side)."""
    return jax.tree_util.tree_map(lambda x: np.asarray(x, dtype=dtype), spec)
