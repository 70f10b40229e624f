"""The grid layer: labeled 1-D axes in, one jitted block evaluation, bounded-memory blocks out.

The grid (model × GPU × batch × input_len × output_len) is cut into blocks along its leading
axes (batch stays whole: B_cap reduces over it). Every block has the same shape (the last ones
are padded by repeating the edge) so the evaluation compiles once; blocks are dispatched one
ahead so the device computes the next while the host stores the last.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from . import advisor as advisor_mod
from .errors import SlimjaxError
from .schema import DIMS, VARIABLES
from .slim import slim_batch_terms, slim_cell_terms, slim_variables
from .specs import astype
from .sweepfile import Sweep

BLOCK_AXES = ("model", "gpu", "input_len", "output_len")
# Peak working memory per output byte: the block's outputs, XLA temporaries, one block in flight.
_WORKING_FACTOR = 3.0


def variable_names(sweep: Sweep) -> list[str]:
    return [v for v in VARIABLES if v != "b_cap" or sweep.advisor is not None]


def _expand(spec, axes: tuple[int, ...]):
    """Give every leaf length-1 axes so that its own axes land at ``axes`` of the 5-D grid."""
    def f(x):
        shape = [1] * len(DIMS)
        for a, n in zip(axes, x.shape):
            shape[a] = n
        return x.reshape(shape)
    return jax.tree_util.tree_map(f, spec)


def _to_dims(x, dims: tuple[str, ...], shape5: tuple[int, ...]):
    """A 5-D-broadcastable array as the variable's own dims: dropped dims (size 1) are reshaped
    away, kept ones broadcast to the block's extent."""
    keep = [i for i, d in enumerate(DIMS) if d in dims]
    x = jnp.reshape(x, tuple(x.shape[i] for i in keep))
    return jnp.broadcast_to(x, tuple(shape5[i] for i in keep))


def _gather(spec, index, axis: int):
    return jax.tree_util.tree_map(lambda x: jnp.take(x, index, axis=axis, mode="clip"), spec)


@functools.partial(jax.jit, static_argnames=("block",))
def _cell_block(model, gpu, coeffs, input_len, output_len, starts, *, block: tuple[int, int, int, int]):
    """Batch-independent terms per (model, GPU, I, O) cell of one block, materialised by their own
    call: fused into the grid kernel, XLA would re-derive them at every grid point (several times
    slower). The block's indices are clipped at the edges (padding), so every block compiles alike."""
    im, ig, ii, io = (s + jnp.arange(n) for s, n in zip(starts, block))
    model, gpu = _gather(model, im, 0), _gather(gpu, ig, 0)
    coeffs = _gather(_gather(coeffs, im, 0), ig, 1)
    input_len = jnp.take(input_len, ii, mode="clip")
    output_len = jnp.take(output_len, io, mode="clip")
    cell = slim_cell_terms(
        _expand(model, (0,)), _expand(gpu, (1,)), _expand(coeffs, (0, 1)),
        input_len.reshape(1, 1, 1, -1, 1), output_len.reshape(1, 1, 1, 1, -1),
    )
    return cell, coeffs, input_len, output_len


@functools.partial(jax.jit, static_argnames=("block", "with_advisor"))
def _batch_block(cell, coeffs, slo_s, batch, input_len, output_len, epsilon, starts, *, block, with_advisor: bool):
    im, ig = (s + jnp.arange(n) for s, n in zip(starts[:2], block[:2]))
    slo_s = jnp.take(jnp.take(slo_s, im, axis=0, mode="clip"), ig, axis=1, mode="clip")
    c = _expand(coeffs, (0, 1))
    B = batch.reshape(1, 1, -1, 1, 1)
    I = input_len.reshape(1, 1, 1, -1, 1)
    O = output_len.reshape(1, 1, 1, 1, -1)
    shape5 = (block[0], block[1], B.shape[2], block[2], block[3])
    out = {"kv_traffic_bytes": cell["kv_traffic_bytes"], **slim_batch_terms(cell, c, B, I, O)}
    result = {k: _to_dims(v, VARIABLES[k][0], shape5) for k, v in out.items()}
    if with_advisor:
        t1 = slim_batch_terms(cell, c, jnp.ones((), B.dtype), I, O)["slim_throughput"]
        b_cap = advisor_mod.batch_capacity(
            result["slim_throughput"], result["slim_e2e_s"], B, t1, _expand(slo_s, (0, 1)), epsilon, axis=2
        )
        result["b_cap"] = jnp.broadcast_to(b_cap, tuple(shape5[DIMS.index(d)] for d in VARIABLES["b_cap"][0])).astype(jnp.int32)
    return result


def evaluate_block(inputs: dict, starts, block: tuple[int, int, int, int], *, with_advisor: bool):
    """All grid variables on one block: ``inputs`` holds the whole sweep's (small) arrays on one
    device; ``starts`` the block's first index along BLOCK_AXES; ``block`` its (padded) extents."""
    cell, coeffs, input_len, output_len = _cell_block(
        inputs["model"], inputs["gpu"], inputs["coeffs"], inputs["input_len"], inputs["output_len"], starts, block=block)
    return _batch_block(cell, coeffs, inputs["slo_s"], inputs["batch"], input_len, output_len, inputs["epsilon"],
                        starts, block=block, with_advisor=with_advisor)


def reference_e2e(sweep: Sweep) -> np.ndarray:
    """E2E at the advisor's SLO reference point for every (model, GPU), shape (M, G)."""
    ref = sweep.advisor.slo_reference
    dt = sweep.dtype
    m = jax.tree_util.tree_map(lambda x: x[:, None], astype(sweep.model, dt))
    g = jax.tree_util.tree_map(lambda x: x[None, :], astype(sweep.gpu, dt))
    out = jax.jit(slim_variables)(
        m, g, astype(sweep.coeffs, dt), dt.type(ref["batch"]), dt.type(ref["input_len"]), dt.type(ref["output_len"])
    )
    return np.asarray(out["slim_e2e_s"])


def slo_seconds(sweep: Sweep) -> np.ndarray | None:
    """The advisor's SLO per (model, GPU) in seconds, or None without an advisor."""
    if sweep.advisor is None:
        return None
    if sweep.advisor.slo_s is not None:
        return np.full((len(sweep.models), len(sweep.gpus)), sweep.advisor.slo_s, dtype=sweep.dtype)
    return (sweep.advisor.slo_factor * reference_e2e(sweep)).astype(sweep.dtype)


@dataclasses.dataclass(frozen=True)
class Block:
    """One block: index slices into the full grid along BLOCK_AXES (valid, unpadded extents)."""

    slices: dict[str, slice]

    def region(self, dims: tuple[str, ...]) -> tuple[slice, ...]:
        return tuple(self.slices.get(d, slice(None)) for d in dims)


def plan_blocks(sizes: dict[str, int], bytes_per_cell: float, budget_bytes: float) -> dict[str, int]:
    """Block extents along BLOCK_AXES so one block's working memory fits ``budget_bytes``.

    ``bytes_per_cell`` is the working memory of one (model, gpu, input_len, output_len) cell
    (its whole batch column included). Leading axes are cut first.
    """
    block = dict(sizes)
    total = lambda: math.prod(block.values()) * bytes_per_cell
    for axis in BLOCK_AXES:
        if total() <= budget_bytes:
            break
        rest = total() / block[axis]
        block[axis] = max(1, int(budget_bytes // rest))
        n_blocks = math.ceil(sizes[axis] / block[axis])
        block[axis] = math.ceil(sizes[axis] / n_blocks)  # even blocks, least padding
    if total() > budget_bytes:
        raise SlimjaxError(
            "memory_budget",
            f"{budget_bytes:.0f} bytes cannot hold one batch column of the grid ({bytes_per_cell:.0f} bytes needed)",
        )
    return block


def bytes_per_cell(sweep: Sweep) -> float:
    nb = len(sweep.batch)
    item = sweep.dtype.itemsize
    per = sum((nb if "batch" in VARIABLES[v][0] else 1) * item for v in variable_names(sweep))
    return per * _WORKING_FACTOR


def iter_blocks(sizes: dict[str, int], block: dict[str, int]) -> Iterator[Block]:
    starts = [range(0, sizes[a], block[a]) for a in BLOCK_AXES]
    for combo in itertools.product(*starts):
        yield Block({a: slice(s, min(s + block[a], sizes[a])) for a, s in zip(BLOCK_AXES, combo)})


def evaluate(sweep: Sweep, sink, *, memory_budget_bytes: float, progress=None) -> None:
    """Evaluate the whole grid block by block, handing each block's variables to ``sink.write``."""
    dt = sweep.dtype
    sizes = dict(model=len(sweep.models), gpu=len(sweep.gpus), input_len=len(sweep.input_len), output_len=len(sweep.output_len))
    block = plan_blocks(sizes, bytes_per_cell(sweep), memory_budget_bytes)
    slo = slo_seconds(sweep)
    slo = np.zeros((sizes["model"], sizes["gpu"]), dt) if slo is None else slo
    host = dict(
        model=astype(sweep.model, dt), gpu=astype(sweep.gpu, dt), coeffs=astype(sweep.coeffs, dt), slo_s=slo,
        batch=sweep.batch.astype(dt), input_len=sweep.input_len.astype(dt), output_len=sweep.output_len.astype(dt),
        epsilon=dt.type(sweep.advisor.epsilon if sweep.advisor else 0.0),
    )
    # One block in flight per local device (CPU: one per core, see slimjax/__init__.py); the
    # sweep's small input arrays go to each device once, blocks are picked out on the device.
    devices = jax.local_devices()
    inputs = [jax.device_put(host, d) for d in devices]
    extents = tuple(block[a] for a in BLOCK_AXES)

    def dispatch(b: Block, k: int):
        starts = jax.device_put(np.asarray([b.slices[a].start for a in BLOCK_AXES], np.int32), devices[k])
        return b, evaluate_block(inputs[k], starts, extents, with_advisor=sweep.advisor is not None)

    def store(b: Block, result) -> None:
        for name, value in result.items():
            dims = VARIABLES[name][0]
            if any(b.slices[a].start != 0 for a in BLOCK_AXES if a not in dims):
                continue  # a variable independent of a blocked axis is stored from its first block only
            valid = tuple(slice(0, b.slices[d].stop - b.slices[d].start) if d in b.slices else slice(None) for d in dims)
            sink.write(name, b.region(dims), np.asarray(value)[valid])
        if progress is not None:
            progress.update(1)

    pending: list = []
    blocks = list(iter_blocks(sizes, block))
    if progress is not None:
        progress.total = len(blocks)
    for k, b in enumerate(blocks):
        pending.append(dispatch(b, k % len(devices)))
        if len(pending) > len(devices):
            store(*pending.pop(0))
    for p in pending:
        store(*p)
