"""The grid layer: labeled 1-D axes in, one jitted block evaluation, bounded-memory blocks out.

The grid's dims are the evaluation's (:attr:`Sweep.coords`, :attr:`Study.coords`); the block plan cuts
it along the blockable ones no active group reduces over. Every block has the same shape (the last ones
are padded by repeating the edge) so the evaluation compiles once; blocks are dealt to the devices by
:func:`.dispatch.pipelined`. What is
computed is the active groups' business (:mod:`.groups`): this module only gathers inputs, runs the
groups' cell then batch terms, and shapes each variable to its own dims.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..inputs.sweepfile import Sweep
from .dispatch import compute_devices, pipelined
from .groups import GROUPS, active_groups, batch_phase, mask_unfit, variable_names
from .plan import BlockPlan, plan_blocks
from .schema import DIMS, SCHEMAS


class Layout(NamedTuple):
    """The static shape of one block evaluation (a jit static argument: one compile per sweep layout)."""

    grid: tuple[str, ...]  # the grid's dims, in order
    blocked: tuple[str, ...]
    extents: tuple[int, ...]  # block extent per blocked dim
    shape: tuple[int, ...]  # the block's extent along every grid dim
    input_dims: tuple[tuple[str, tuple[str, ...]], ...]
    groups: tuple[str, ...]
    dtypes: tuple[tuple[str, str], ...]  # variable -> dtype name
    dims: tuple[tuple[str, ...], ...]  # each variable's dims (same order as dtypes)
    masked: tuple[str, ...]  # the fit-masked variables (schema.Variable.fit_masked)
    static: tuple[tuple[str, Any], ...] = ()  # static facts groups may use (e.g. the largest batch)


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


def _with_batch_inputs(x, inputs, starts, layout) -> dict:
    """The cell phase's inputs with the batch phase's added (a batch-phase input may still run along a blocked dim:
    a study's serving per (model, gpu, tp))."""
    grid = layout.grid
    index = {d: s + jnp.arange(n) for d, s, n in zip(layout.blocked, starts, layout.extents, strict=True)}
    return {
        **x,
        **{k: _shape_input(inputs[k], dims, grid, index) for k, dims in layout.input_dims if batch_phase(dims)},
        "dims": grid,
        "static": dict(layout.static),
    }


def _cell_terms(inputs, starts, layout):
    """Each active group's batch-independent terms on one block, materialised by their own call (fused
    into the grid kernel, XLA would re-derive them at every grid point: several times slower). The
    block's indices are clipped at the edges (padding), so every block compiles alike."""
    index = {d: s + jnp.arange(n) for d, s, n in zip(layout.blocked, starts, layout.extents, strict=False)}
    x = {k: _shape_input(inputs[k], dims, layout.grid, index) for k, dims in layout.input_dims if not batch_phase(dims)}
    x["dims"], x["static"] = layout.grid, dict(layout.static)
    cells = {g: GROUPS[g].cell(x) for g in layout.groups if GROUPS[g].cell is not None}
    del x["dims"], x["static"]
    # batch-dependent terms several outputs share (Group.materialised), computed here so that they are materialised
    # as this call's outputs: inside the batch kernel XLA re-derives a shared elementwise term in every output's
    # fusion (the physical floor in five, 4x the engine's time; bench/RESULTS.md)
    shared = [g for g in layout.groups if GROUPS[g].materialised is not None]
    if shared:
        xb = _with_batch_inputs(x, inputs, starts, layout)
        cells = {
            g: {**c, "materialised": GROUPS[g].materialised(xb, cells)} if g in shared else c for g, c in cells.items()
        }
    return x, cells


# (layout, the inputs' pytree) -> the pytree of its cell terms, recorded when _cell_block traces (so a compiled call
# that is reused finds it without tracing again); dropped with _cell_block's compiled calls past MAX_CELL_TREES
_CELL_TREES: dict = {}
MAX_CELL_TREES = 256


@functools.partial(jax.jit, static_argnames=("layout", "inputs_tree"))
def _cell_block(input_leaves, starts, *, layout, inputs_tree):
    """:func:`_cell_terms` from and to flat lists of arrays: no pytree of specs is flattened or unflattened on the
    host at each call (milliseconds a block)."""
    inputs = jax.tree_util.tree_unflatten(inputs_tree, input_leaves)
    leaves, tree = jax.tree_util.tree_flatten(_cell_terms(inputs, starts, layout))
    _CELL_TREES[layout, inputs_tree] = tree
    return leaves


@functools.partial(jax.jit, static_argnames=("layout", "structure"))
def _batch_block(leaves, inputs, starts, *, layout, structure):
    grid = layout.grid
    x, cells = jax.tree_util.tree_unflatten(structure, leaves)
    x = _with_batch_inputs(x, inputs, starts, layout)
    out: dict = {}
    for g in layout.groups:
        out.update(GROUPS[g].batch(x, cells, out))
    out = mask_unfit(out, layout.masked)
    return {
        name: _to_dims(out[name], dims, grid, layout.shape).astype(dtype)
        for (name, dtype), dims in zip(layout.dtypes, layout.dims, strict=True)
    }


def evaluate_block(inputs: dict, starts, layout, flat=None):
    """Every active variable on one block: ``inputs`` holds the whole sweep's (small) arrays on one
    device, ``starts`` the block's first index along the blocked dims; ``flat`` (:func:`flat_inputs` of ``inputs``,
    found once per evaluation, not at every block: flattening the specs costs milliseconds)."""
    leaves, batch_inputs, tree = flat_inputs(inputs, layout) if flat is None else flat
    if len(_CELL_TREES) > MAX_CELL_TREES:  # a long-lived process meeting many layouts: start again
        _cell_block.clear_cache()
        _CELL_TREES.clear()
    cells = _cell_block(leaves, starts, layout=layout, inputs_tree=tree)
    structure = _CELL_TREES.get((layout, tree))
    if structure is None:  # dropped (by another thread) after the call had been compiled: traced for its shape
        shapes = jax.eval_shape(functools.partial(_cell_terms, layout=layout), inputs, starts)
        structure = jax.tree_util.tree_structure(shapes)
    return _batch_block(cells, batch_inputs, starts, layout=layout, structure=structure)


def flat_inputs(inputs: dict, layout) -> tuple:
    """(the leaves of ``inputs``, the batch phase's inputs, their pytree): what :func:`evaluate_block` calls with."""
    leaves, tree = jax.tree_util.tree_flatten(inputs)
    return leaves, {k: inputs[k] for k, dims in layout.input_dims if batch_phase(dims)}, tree


def schema(x) -> dict:
    """The variable table of ``x``'s kind (a Sweep's or a Study's)."""
    return SCHEMAS[x.kind]


def kernel_dtype(x, name: str) -> np.dtype:
    """The dtype a variable is computed in: "float" is the evaluation's precision."""
    kind = schema(x)[name].dtype
    return x.dtype if kind == "float" else np.dtype(kind)


def variable_dtype(x, name: str) -> np.dtype:
    """The dtype a variable is stored in: a label variable as its dim's labels, else as computed."""
    label = schema(x)[name].label_of
    return x.coords[label].dtype if label is not None else kernel_dtype(x, name)


def whole_dims(x) -> frozenset:
    """Dims the plan keeps whole: the schema's unblockable ones and any an active group reduces over."""
    return frozenset(d for d in x.coords if not DIMS[d].blockable) | {d for g in active_groups(x) for d in g.reduces}


def bytes_per_cell(x) -> float:
    """Working memory of one cell of the blocked dims: its outputs (8 bytes each where a group
    computes in float64) times a factor for temporaries and the block in flight."""
    sizes = {d: len(v) for d, v in x.coords.items()}
    wide = {g.name for g in active_groups(x) if g.wide}
    whole = whole_dims(x)
    per = 0
    for v in variable_names(x):
        var = schema(x)[v]
        item = 8 if var.group in wide else x.dtype.itemsize
        per += math.prod(sizes[d] for d in var.dims if d in whole) * item
    return per * _WORKING_FACTOR


def plan(x, memory_budget_bytes: float) -> BlockPlan:
    """The evaluation's block plan under ``memory_budget_bytes`` of working memory per block."""
    sizes = {d: len(v) for d, v in x.coords.items()}
    return plan_blocks(sizes, bytes_per_cell(x), memory_budget_bytes, whole=whole_dims(x))


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


def static_facts(x) -> tuple[tuple[str, Any], ...]:
    """What the active groups declare as compile-time constants (part of the compile key: e.g. the queue's
    bound on m from the largest batch, the slim-kv flag, the procurement bisection's steps)."""
    return tuple(fact for g in active_groups(x) if g.static is not None for fact in g.static(x))


def labelled(x, name: str, values: np.ndarray) -> np.ndarray:
    """A label variable's indices as its dim's labels ('' where -1); any other variable as it is."""
    label = schema(x)[name].label_of
    if label is None:
        return values
    labels = x.coords[label]
    return np.where(values >= 0, labels[np.clip(values, 0, len(labels) - 1)], np.asarray("", labels.dtype))


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
        tuple((n, kernel_dtype(sweep, n).name) for n in names),
        tuple(schema(sweep)[n].dims for n in names),
        tuple(n for n in names if schema(sweep)[n].fit_masked),
        static_facts(sweep),
    )
    wanted = set(indices)
    devices = compute_devices(host_callbacks=any(g.host_callbacks for g in groups), tasks=len(wanted))
    # the sweep's small input arrays go to each device once; blocks are picked out on the device
    on_device = [jax.device_put(host, d) for d in devices]
    slot = {d: k for k, d in enumerate(devices)}

    flat = [flat_inputs(x, layout) for x in on_device]  # once, not at every block

    def run(kb, device):
        starts = jax.device_put(np.asarray(kb[1].starts, np.int32), device)
        return evaluate_block(on_device[slot[device]], starts, layout, flat[slot[device]])

    todo = ((k, b) for k, b in enumerate(block_plan.blocks()) if k in wanted)
    for (k, b), result in pipelined(todo, run, devices):
        out = {}
        for name, value in result.items():
            dims = schema(sweep)[name].dims
            if any(b.slices[a].start != 0 for a in block_plan.blocked if a not in dims):
                continue
            valid = tuple(
                slice(0, b.slices[d].stop - b.slices[d].start) if d in b.slices else slice(None) for d in dims
            )
            out[name] = (b.region(dims), labelled(sweep, name, np.asarray(value)[valid]))
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
