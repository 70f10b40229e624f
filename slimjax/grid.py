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
from .schema import ALL_VARIABLES, CAPACITY_VARIABLES, DIMS, INTERVAL_VARIABLES, QUEUE_VARIABLES, VARIABLES
from .calculator import capacity_cell_terms, queue_terms, service_terms
from .slim import log_throughput_sensitivity, slim_batch_terms, slim_cell_terms, slim_variables
from .specs import astype
from .sweepfile import Sweep

BLOCK_AXES = ("model", "gpu", "input_len", "output_len")
# Peak working memory per output byte: the block's outputs, XLA temporaries, one block in flight.
_WORKING_FACTOR = 3.0


def variable_names(sweep: Sweep) -> list[str]:
    names = [v for v in VARIABLES if v != "b_cap" or sweep.advisor is not None]
    if sweep.coeffs_log_cov is not None:
        names += [v for v in INTERVAL_VARIABLES if not v.startswith("b_cap") or sweep.advisor is not None]
    if sweep.serving is not None:
        names += list(CAPACITY_VARIABLES)
    if sweep.arrival_rate is not None:
        names += list(QUEUE_VARIABLES)
    return names


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


F64 = jnp.float64  # capacity and queue arithmetic: exact max_seqs, accurate Erlang B


@functools.partial(jax.jit, static_argnames=("block",))
def _cell_block(inputs, starts, *, block: tuple[int, int, int, int]):
    """Batch-independent terms per (model, GPU, I, O) cell of one block, materialised by their own
    call: fused into the grid kernel, XLA would re-derive them at every grid point (several times
    slower). The block's indices are clipped at the edges (padding), so every block compiles alike."""
    im, ig, ii, io = (s + jnp.arange(n) for s, n in zip(starts, block))
    pair = lambda t: _expand(_gather(_gather(t, im, 0), ig, 1), (0, 1))
    model, gpu = _expand(_gather(inputs["model"], im, 0), (0,)), _expand(_gather(inputs["gpu"], ig, 0), (1,))
    I = jnp.take(inputs["input_len"], ii, mode="clip").reshape(1, 1, 1, -1, 1)
    O = jnp.take(inputs["output_len"], io, mode="clip").reshape(1, 1, 1, 1, -1)
    coeffs = pair(inputs["coeffs"])
    out = {"coeffs": coeffs, "slo_s": pair(inputs["slo_s"]), "I": I, "O": O}
    if "log_cov" in inputs:
        cov = _gather(_gather(inputs["log_cov"], im, 0), ig, 1)
        out["log_cov"] = cov[:, :, None, None, None]  # (bm, bg, 1, 1, 1, 6, 6)
        out["scatter"] = pair(inputs["scatter"])
    if "serving" in inputs:
        serving = pair(inputs["serving"])
        out["slim"] = slim_cell_terms(model, gpu, coeffs, I, O, n_gpu=serving.n_gpu.astype(I.dtype),
                                      kv_dtype_bytes=serving.kv_dtype_bytes.astype(I.dtype))
        model64 = _expand(_gather(inputs["model64"], im, 0), (0,))
        gpu64 = _expand(_gather(inputs["gpu64"], ig, 0), (1,))
        out["capacity"] = capacity_cell_terms(model64, gpu64, serving, I.astype(F64), O.astype(F64))
        if "measured" in inputs:
            out["measured"] = pair(inputs["measured"])
    else:
        out["slim"] = slim_cell_terms(model, gpu, coeffs, I, O)
    return out


@functools.partial(jax.jit, static_argnames=("block", "with_advisor"))
def _batch_block(cell, batch, arrival_rate, epsilon, *, block, with_advisor: bool):
    c, I, O = cell["coeffs"], cell["I"], cell["O"]
    B = batch.reshape(1, 1, -1, 1, 1)
    shape5 = (block[0], block[1], B.shape[2], block[2], block[3])
    dt = I.dtype
    out = {"kv_traffic_bytes": cell["slim"]["kv_traffic_bytes"], **slim_batch_terms(cell["slim"], c, B, I, O)}
    cap = cell.get("capacity")
    if cap is not None:
        measured = cell.get("measured")
        B64, I64, O64 = B.astype(F64), I.astype(F64), O.astype(F64)
        out.update({k: cap[k] for k in CAPACITY_VARIABLES if k in cap})
        out.update(service_terms(cap, measured, B64, I64, O64))
        if arrival_rate is not None:
            out.update(queue_terms(cap, measured, B64, I64, O64, arrival_rate.astype(F64)))
    result = {}
    for k, v in out.items():
        dims = ALL_VARIABLES[k][0]
        if "arrival_rate" in dims:
            result[k] = jnp.broadcast_to(v, (*shape5, arrival_rate.shape[0])).astype(dt)
        else:
            result[k] = _to_dims(v, dims, shape5).astype(jnp.int64 if k == "max_seqs" else dt)
    cap_dims = tuple(shape5[DIMS.index(d)] for d in VARIABLES["b_cap"][0])
    spread = spread1 = None
    terms1 = slim_batch_terms(cell["slim"], c, jnp.ones((), B.dtype), I, O)  # at B = 1 (XLA drops it if unused)
    if "log_cov" in cell:  # 90 % prediction interval on log T (delta method + the fit's scatter)
        z = 1.6448536269514722
        sd = lambda g: jnp.sqrt(jnp.einsum("...i,...ij,...j->...", g, cell["log_cov"].astype(dt), g) + cell["scatter"].astype(dt))
        spread = z * sd(log_throughput_sensitivity(cell["slim"], c, B, out))
        spread1 = z * sd(log_throughput_sensitivity(cell["slim"], c, jnp.ones((), B.dtype), terms1))
        result["slim_throughput_lo"] = (result["slim_throughput"] * jnp.exp(-spread)).astype(dt)
        result["slim_throughput_hi"] = (result["slim_throughput"] * jnp.exp(spread)).astype(dt)
    if with_advisor:
        t1 = terms1["slim_throughput"]
        allowed = None if cap is None else B.astype(F64) <= cap["max_seqs"]
        b_cap = advisor_mod.batch_capacity(
            result["slim_throughput"], result["slim_e2e_s"], B, t1, cell["slo_s"], epsilon, axis=2, allowed=allowed
        )
        result["b_cap"] = jnp.broadcast_to(b_cap, cap_dims).astype(jnp.int32)
        if spread is not None:  # pessimistic: T low and E2E high together; optimistic the reverse
            for name, sign in (("b_cap_lo", -1.0), ("b_cap_hi", 1.0)):
                bc = advisor_mod.batch_capacity(
                    result["slim_throughput"] * jnp.exp(sign * spread), result["slim_e2e_s"] * jnp.exp(-sign * spread),
                    B, t1 * jnp.exp(sign * spread1), cell["slo_s"], epsilon, axis=2, allowed=allowed,
                )
                result[name] = jnp.broadcast_to(bc, cap_dims).astype(jnp.int32)
    return result


def evaluate_block(inputs: dict, starts, block: tuple[int, int, int, int], *, with_advisor: bool):
    """All grid variables on one block: ``inputs`` holds the whole sweep's (small) arrays on one
    device; ``starts`` the block's first index along BLOCK_AXES; ``block`` its (padded) extents."""
    cell = _cell_block(inputs, starts, block=block)
    return _batch_block(cell, inputs["batch"], inputs.get("arrival_rate"), inputs["epsilon"], block=block,
                        with_advisor=with_advisor)


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
    """Working memory of one (model, GPU, I, O) cell: its outputs (float64 where capacity and queue
    are computed) times a factor for temporaries and the block in flight."""
    nb, nl = len(sweep.batch), 1 if sweep.arrival_rate is None else len(sweep.arrival_rate)
    per = 0
    for v in variable_names(sweep):
        dims = ALL_VARIABLES[v][0]
        item = sweep.dtype.itemsize if v in VARIABLES else 8
        per += (nb if "batch" in dims else 1) * (nl if "arrival_rate" in dims else 1) * item
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
    if sweep.serving is not None:  # capacity inputs stay float64 (see capacity_cell_terms)
        host["serving"] = astype(sweep.serving, np.float64)
        host["model64"], host["gpu64"] = astype(sweep.model, np.float64), astype(sweep.gpu, np.float64)
    if sweep.measured is not None:
        host["measured"] = astype(sweep.measured, np.float64)
    if sweep.coeffs_log_cov is not None:
        host["log_cov"], host["scatter"] = sweep.coeffs_log_cov.astype(dt), sweep.coeffs_scatter.astype(dt)
    if sweep.arrival_rate is not None:
        host["arrival_rate"] = sweep.arrival_rate
    # One block in flight per local device (CPU: one per core, see slimjax/__init__.py); the
    # sweep's small input arrays go to each device once, blocks are picked out on the device.
    devices = jax.local_devices()
    if sweep.arrival_rate is not None:
        # Erlang B calls SciPy from the graph (queue.py); callbacks from two CPU devices at once hung
        # on this machine, and SciPy runs one at a time anyway: one device for queue sweeps.
        devices = devices[:1]
    inputs = [jax.device_put(host, d) for d in devices]
    extents = tuple(block[a] for a in BLOCK_AXES)

    def dispatch(b: Block, k: int):
        starts = jax.device_put(np.asarray([b.slices[a].start for a in BLOCK_AXES], np.int32), devices[k])
        return b, evaluate_block(inputs[k], starts, extents, with_advisor=sweep.advisor is not None)

    def store(b: Block, result) -> None:
        for name, value in result.items():
            dims = ALL_VARIABLES[name][0]
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
