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
    bytes_per_weight: jax.Array  # b_w, bytes per weight (M_W = P·b_w is memory.weights_bytes)
    kv_dtype_bytes: jax.Array  # b_kv, bytes per KV element
    window: jax.Array  # W, sliding window in tokens (inf where none)
    n_sliding_layers: jax.Array  # L_s
    mla: jax.Array  # 1.0 for multi-head latent attention, else 0.0
    moe: jax.Array  # 1.0 for mixture-of-experts FFNs, else 0.0
    kv_lora_rank: jax.Array  # d_c (MLA)
    rope_dim: jax.Array  # d_R (MLA)
    qk_nope_dim: jax.Array  # d_nope (MLA, decompressed prefill)
    v_head_dim: jax.Array  # d_v (MLA)
    n_experts: jax.Array  # E routed experts per MoE layer (0: dense)
    experts_per_token: jax.Array  # k
    expert_ffn_dim: jax.Array  # D_e
    n_moe_layers: jax.Array  # L_moe
    max_context: jax.Array  # max_position_embeddings, tokens (inf where the config does not say)


class SlimCoeffs(eqx.Module):
    """SLIM's calibrated coefficients θ (MODEL.md §1)."""

    eta_c: jax.Array  # compute efficiency of prefill, (0, 1]
    eta_m: jax.Array  # decode efficiency
    B0: jax.Array  # batch offset, sequences
    alpha: jax.Array  # per-output-token overhead, s/token
    gamma: jax.Array  # dense decode scale, s per layer per (D/1024)^2 per token
    t_fixed: jax.Array  # batch-level fixed overhead, s


class FieldSpec:
    """A spec whose fields come from an input table rather than this class (so a row added to the table is
    a field here with no edit): ``spec.name`` for each field. Frozen; a pytree whose leaves are the fields in
    table order (``tree_map`` casts or stacks it like any spec); pickles through its constructor."""

    __slots__ = ("_fields",)

    def __init__(self, **fields):
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name):
        try:
            return object.__getattribute__(self, "_fields")[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in self._fields.items()) + ")"

    def fields(self) -> dict:
        """{field: value}, in table order."""
        return dict(self._fields)

    def __reduce__(self):  # Dask ships specs to workers
        return _field_spec, (type(self), dict(self._fields))

    def tree_flatten_with_keys(self):
        keys = tuple(self._fields)
        return [(jax.tree_util.GetAttrKey(k), self._fields[k]) for k in keys], keys

    @classmethod
    def tree_unflatten(cls, keys, values):
        return cls(**dict(zip(keys, values, strict=True)))


def _field_spec(cls, fields: dict) -> FieldSpec:
    return cls(**fields)


@jax.tree_util.register_pytree_with_keys_class
class GPUSpec(FieldSpec):
    """One accelerator (MODEL.md §0), in base units. Its fields are the GPU table's
    (:data:`slimjax.inputs.catalog.GPU_FIELDS`): ``flops_per_s`` (F_max, dense bf16 FLOP/s),
    ``bandwidth_bytes_per_s`` (BW_max), ``memory_bytes`` (M_VRAM), ``price_per_hour`` (illustrative
    $/GPU-hour), ``flops_fp8_per_s`` / ``flops_fp4_per_s`` (dense low-precision Tensor Core peaks, 0: none),
    ``link_bytes_per_s`` (one-direction tensor-parallel link: per GPU, or per peer link on a mesh; 0: no figure,
    no cost), ``link_mesh`` (1 on a full mesh, MODEL.md §4c), ``link_efficiency`` (η_link, achieved fraction),
    ``allreduce_latency_s`` (τ per all-reduce), and any field registered there."""

    __slots__ = ()


@jax.tree_util.register_pytree_with_keys_class
class ServingSpec(FieldSpec):
    """One balanced replica group's serving settings (MODEL.md §0), per (model, GPU), in base units.

    Its fields are the spec fields of the serving table (:data:`slimjax.inputs.serving.SERVING`), so
    a serving key added there is a field here with no edit to this class: ``spec.n_gpu``,
    ``spec.memory_utilization``, ``spec.reserved_bytes``, ``spec.bytes_per_weight`` …
    """

    __slots__ = ()


class MeasuredSpec(eqx.Module):
    """Measured mode (MODEL.md §4): one measured operating point per (model, GPU); NaN where none."""

    batch: jax.Array  # B_cal, the calibration concurrency
    request_rate: jax.Array  # R, completed requests/s at B_cal
    ttft_s: jax.Array
    itl_s: jax.Array


class AgentSpec(eqx.Module):
    """Fork-join agent graphs and the API each is compared with (MODEL.md §6); one entry per graph."""

    stages: jax.Array  # n_st
    calls: jax.Array  # n_call per stage
    parallelism: jax.Array  # p, calls requested at once (inf: no limit)
    tool_delay_s: jax.Array  # d between stages
    api_rpm: jax.Array  # requests per minute (inf: no limit)
    api_tpm: jax.Array  # tokens per minute (inf: no limit)
    api_service_s: jax.Array  # s_api, one call's service time (queue excluded)
    api_parallelism: jax.Array  # p_api, calls in flight (inf: no limit)
    api_price_in: jax.Array  # USD per million input tokens
    api_price_out: jax.Array  # USD per million output tokens


SLIM_PARAMS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SlimCoeffs))


def stack(cls, rows: Sequence[dict], dtype=np.float64):
    """Stack per-item dicts of floats into one spec with a leading axis (every field of a dataclass
    spec; every key of the first row for :class:`ServingSpec`)."""
    names = list(rows[0]) if issubclass(cls, FieldSpec) else [f.name for f in dataclasses.fields(cls)]
    return cls(**{n: np.asarray([r[n] for r in rows], dtype=dtype) for n in names})


def astype(spec, dtype):
    """Cast every leaf of a spec to ``dtype`` (numpy, host side)."""
    return jax.tree_util.tree_map(lambda x: np.asarray(x, dtype=dtype), spec)
