"""The grid layer: labeled 1-D axes in, one jitted block evaluation, bounded-memory blocks out.

The grid's dims are the sweep's (:attr:`Sweep.coords`); the block plan cuts it along the blockable
ones. Every block has the same shape (the last ones are padded by repeating the edge) so the
evaluation compiles once; blocks are dealt to the devices by :func:`.dispatch.pipelined`. What is
computed is the active groups' business (:mod:`.groups`): this module only gathers inputs, runs the
groups' cell then batch terms, and shapes each variable to its own dims.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..inputs.sweepfile import Sweep
from ..model.queue import queue_bound
from .dispatch import compute_devices, pipelined
from .groups import GROUPS, active_groups, batch_phase, mask_unfit, variable_names
from .plan import BlockPlan, plan_blocks
from .schema import DIMS, VARIABLES


class Layout(NamedTuple):
    """The static shape of one block evaluation (a jit static argument: one compile per sweep layout)."""

    grid: tuple[str, ...]  # the grid's dims, in order
    blocked: tuple[str, ...]
    extents: tuple[int, ...]  # block extent per blocked dim
    shape: tuple[int, ...]  # the block's extent along every grid dim
    input_dims: tuple[tuple[str, tuple[str, ...]], ...]
    groups: tuple[str, ...]
    dtypes: tuple[tuple[str, str], ...]  # variable -> dtype name
    static: tuple[tuple[str, int], ...] = ()  # static facts groups may use (e.g. the largest batch)


# Peak working memory per output byte: the block's outputs, XLA temporaries, one block in flight.
_WORKING_FACTOR = 3.0


def _shape_input(tree, dims: tuple[str, ...], grid: tuple[str, ...], index: dict):
    """Gather ``tree`` (leading axes ``dims``) at the block's ``index`` per blocked dim, then give it
    length-1 axes so its own axes land at their grid positions (trailing axes kept)."""
    if not dims:
        return tree

    def f(x):
        for a, d in enumerate(dims):
            if d in index:
                x = jnp.take(x, index[d], axis=a, mode="clip")
        lead = [1] * len(grid)
        for a, d in enumerate(dims):
            lead[grid.index(d)] = x.shape[a]
        return x.reshape(*lead, *x.shape[len(dims) :])

    return jax.tree_util.tree_map(f, tree)


def _to_dims(x, dims: tuple[str, ...], grid: tuple[str, ...], shape: tuple[int, ...]):
    """A grid-broadcastable array as the variable's own dims: dropped dims (size 1) are reshaped away,
    kept ones broadcast to the block's extent."""
    x = jnp.reshape(x, (1,) * (len(grid) - jnp.ndim(x)) + jnp.shape(x))
    keep = [i for i, d in enumerate(grid) if d in dims]
    x = jnp.reshape(x, tuple(x.shape[i] for i in keep))
    return jnp.broadcast_to(x, tuple(shape[i] for i in keep))


@functools.partial(jax.jit, static_argnames=("layout",))
def _cell_block(inputs, starts, *, layout):
    """Each active group's batch-independent terms on one block, materialised by their own call (fused
    into the grid kernel, XLA would re-derive them at every grid point: several times slower). The
    block's indices are clipped at the edges (padding), so every block compiles alike."""
    index = {d: s + jnp.arange(n) for d, s, n in zip(layout.blocked, starts, layout.extents, strict=False)}
    x = {k: _shape_input(inputs[k], dims, layout.grid, index) for k, dims in layout.input_dims if not batch_phase(dims)}
    x["dims"], x["static"] = layout.grid, dict(layout.static)
    cells = {g: GROUPS[g].cell(x) for g in layout.groups if GROUPS[g].cell is not None}
    del x["dims"], x["static"]
    return x, cells


@functools.partial(jax.jit, static_argnames=("layout",))
def _batch_block(x, cells, inputs, *, layout):
    grid = layout.grid
    x = {
        **x,
        **{k: _shape_input(inputs[k], dims, grid, {}) for k, dims in layout.input_dims if batch_phase(dims)},
        "dims": grid,
        "static": dict(layout.static),
    }
    out: dict = {}
    for g in layout.groups:
        out.update(GROUPS[g].batch(x, cells, out))
    out = mask_unfit(out, [name for name, _ in layout.dtypes])
    return {
        name: _to_dims(out[name], VARIABLES[name].dims, grid, layout.shape).astype(dtype)
        for name, dtype in layout.dtypes
    }


def evaluate_block(inputs: dict, starts, layout):
    """Every active variable on one block: ``inputs`` holds the whole sweep's (small) arrays on one
    device, ``starts`` the block's first index along the blocked dims."""
    x, cells = _cell_block(inputs, starts, layout=layout)
    batch_inputs = {k: inputs[k] for k, dims in layout.input_dims if batch_phase(dims)}
    return _batch_block(x, cells, batch_inputs, layout=layout)


def variable_dtype(sweep: Sweep, name: str) -> np.dtype:
    kind = VARIABLES[name].dtype
    return sweep.dtype if kind == "float" else np.dtype(kind)


def bytes_per_cell(sweep: Sweep) -> float:
    """Working memory of one cell of the blockable dims: its outputs (8 bytes each where a group
    computes in float64) times a factor for temporaries and the block in flight."""
    sizes = {d: len(v) for d, v in sweep.coords.items()}
    wide = {g.name for g in active_groups(sweep) if g.wide}
    per = 0
    for v in variable_names(sweep):
        var = VARIABLES[v]
        item = 8 if var.group in wide else sweep.dtype.itemsize
        per += math.prod(sizes[d] for d in var.dims if not DIMS[d].blockable) * item
    return per * _WORKING_FACTOR


def plan(sweep: Sweep, memory_budget_bytes: float) -> BlockPlan:
    """The sweep's block plan under ``memory_budget_bytes`` of working memory per block."""
    return plan_blocks({d: len(v) for d, v in sweep.coords.items()}, bytes_per_cell(sweep), memory_budget_bytes)


def host_inputs(sweep: Sweep) -> tuple[dict, tuple]:
    """Every active group's inputs, merged by name: (arrays, ((name, dims), …))."""
    arrays, dims = {}, {}
    for g in active_groups(sweep):
        for name, (d, tree) in g.inputs(sweep).items():
            if name in dims and dims[name] != tuple(d):
                raise ValueError(f"input {name!r} declared with dims {dims[name]} and {tuple(d)}")
            if any(k not in sweep.coords for k in d) or list(d) != [k for k in sweep.coords if k in d]:
                raise ValueError(f"input {name!r}: dims {d} are not in grid order {tuple(sweep.coords)}")
            arrays.setdefault(name, tree)
            dims[name] = tuple(d)
    return arrays, tuple(dims.items())


def static_facts(sweep: Sweep) -> tuple[tuple[str, int], ...]:
    """What the groups may use as compile-time constants: with a queue, a bound on its m from the largest
    batch (only then: it is part of the compile key); with the slim-kv variant, a flag."""
    facts = (("max_batch", queue_bound(sweep.batch)),) if sweep.arrival_rate is not None else ()
    return facts + ((("slim_kv", 1),) if sweep.slim.variant == "slim-kv" else ())


def evaluate_blocks(sweep: Sweep, block_plan: BlockPlan, indices):
    """Evaluate the blocks numbered ``indices`` (plan order) on every local device; yields
    (k, {variable: (region, values)}) per block, in order. A variable independent of a blocked dim is
    given from its first block along that dim only."""
    host, input_dims = host_inputs(sweep)
    groups = active_groups(sweep)
    names = variable_names(sweep)
    layout = Layout(
        block_plan.dims,
        block_plan.blocked,
        block_plan.extents,
        tuple(block_plan.block.get(d, block_plan.sizes[d]) for d in block_plan.dims),
        input_dims,
        tuple(g.name for g in groups),
        tuple((n, variable_dtype(sweep, n).name) for n in names),
        static_facts(sweep),
    )
    devices = compute_devices(host_callbacks=any(g.host_callbacks for g in groups))
    # the sweep's small input arrays go to each device once; blocks are picked out on the device
    on_device = [jax.device_put(host, d) for d in devices]
    slot = {d: k for k, d in enumerate(devices)}

    def run(kb, device):
        starts = jax.device_put(np.asarray(kb[1].starts, np.int32), device)
        return evaluate_block(on_device[slot[device]], starts, layout)

    wanted = set(indices)
    todo = ((k, b) for k, b in enumerate(block_plan.blocks()) if k in wanted)
    for (k, b), result in pipelined(todo, run, devices):
        out = {}
        for name, value in result.items():
            dims = VARIABLES[name].dims
            if any(b.slices[a].start != 0 for a in block_plan.blocked if a not in dims):
                continue
            valid = tuple(
                slice(0, b.slices[d].stop - b.slices[d].start) if d in b.slices else slice(None) for d in dims
            )
            out[name] = (b.region(dims), np.asarray(value)[valid])
        yield k, out


def evaluate(sweep: Sweep, block_plan: BlockPlan, sink, *, progress=None, skip=frozenset()) -> None:
    """Evaluate the grid block by block (blocks numbered in plan order; those in ``skip`` are not run),
    handing each block's variables to ``sink.write`` and then, where the sink has it, telling
    ``sink.block_done(k)``."""
    if progress is not None:
        progress.total = block_plan.n_blocks - len(skip)
    done = getattr(sink, "block_done", None)
    for k, variables in evaluate_blocks(sweep, block_plan, (k for k in range(block_plan.n_blocks) if k not in skip)):
        for name, (region, values) in variables.items():
            sink.write(name, region, values)
        if done is not None:
            done(k)
        if progress is not None:
            progress.update(1)
