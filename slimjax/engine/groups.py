"""Variable groups: each knows its variables (by ``group`` in the schema), the sweep inputs it needs,
its batch-independent cell terms and its batch terms. The grid evaluates whichever groups a sweep
activates, in registration order, with no knowledge of any of them.

A group's ``inputs(sweep)`` returns {name: (dims, host pytree)}: leaves with leading axes ``dims`` (in
grid order; trailing axes ride along). The grid gathers each input for the block and shapes it to the
grid's rank. ``cell(x)`` computes per-cell terms from the gathered inputs that have no batch-phase dim
(materialised once per block: fused into the grid kernel XLA would re-derive them at every point);
``batch(x, cells, out)`` returns its variables (and private ``_terms`` later groups may read) from all
inputs, every group's cell terms, and what earlier groups returned. ``x["dims"]`` is the grid's dims,
``x["static"]`` compile-time facts (``grid.static_facts``: the largest batch).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..inputs.sweepfile import Sweep
from ..model import advisor as advisor_mod
from ..model import agents as agents_mod
from ..model.calculator import capacity_cell_terms, group_gpus, kv_capacity, queue_terms, service_terms
from ..model.floor import FLOOR_FLAGS, decode_floor_of, floor_inputs, floor_of, prefill_floor_s
from ..model.intervals import INTERVAL_LEVEL, log_interval, log_sd, widened_sd
from ..model.queue import queue_bound
from ..model.rates import token_throughput
from ..model.roofline import decode_steps
from ..model.slim import log_throughput_sensitivity, slim_batch_terms, slim_cell_terms
from ..model.slim_kv import slim_kv_batch_terms, slim_kv_cell_terms, slim_kv_log_throughput_sensitivity
from ..model.specs import astype
from .schema import DIMS, ROOFLINE_ONLY, SCHEMAS, SERVICE, VARIABLES

F64 = jnp.float64  # capacity and queue arithmetic: exact max_seqs, accurate Erlang B


@dataclasses.dataclass(frozen=True)
class Group:
    name: str
    active: Callable[[Sweep], bool]
    inputs: Callable[[Sweep], dict[str, tuple[tuple[str, ...], Any]]]
    batch: Callable[[dict, dict, dict], dict]
    cell: Callable[[dict], dict] | None = None
    attrs: Callable[[Sweep, str], dict] | None = None
    wide: bool = False  # its outputs are budgeted at 8 bytes (float64 arithmetic or temporaries)
    host_callbacks: bool = False  # calls back into the host (run on one device, see dispatch)
    kind: str = "sweep"  # the kind of evaluation it belongs to (schema.SCHEMAS): a Sweep's or a Study's
    reduces: tuple[str, ...] = ()  # dims its batch terms reduce over: the block plan keeps them whole
    static: Callable[[Any], tuple] | None = None  # compile-time facts ((name, value), …) from the parsed input
    # batch-dependent terms several of its batch outputs share, computed by their own call and handed to ``batch``
    # as ``cells[name]["materialised"]`` (XLA would re-derive them inside every consumer's fusion)
    materialised: Callable[[dict, dict], dict] | None = None


GROUPS: dict[str, Group] = {}


def register_group(group: Group) -> Group:
    """Add a group; the grid evaluates registered groups in registration order."""
    if group.name in GROUPS:
        raise ValueError(f"group {group.name!r} is already registered")
    GROUPS[group.name] = group
    return group


def active_groups(x) -> list[Group]:
    """The groups of ``x``'s kind (a Sweep's, a Study's) that ``x`` turns on, in registration order."""
    return [g for g in GROUPS.values() if g.kind == x.kind and g.active(x)]


def variable_names(x) -> list[str]:
    """The evaluation's variables, in its schema's order."""
    active = {g.name for g in active_groups(x)}
    return [v.name for v in SCHEMAS[x.kind].values() if v.group in active and all(n in active for n in v.needs)]


def batch_phase(dims: tuple[str, ...]) -> bool:
    """Inputs along a dim the grid does not block (batch, arrival_rate) are not cell terms."""
    return any(not DIMS[d].blockable for d in dims)


# ------------------------------------------------------------------------------------------ SLIM (§1)


def _coordinates(sweep: Sweep) -> dict:
    dt = sweep.dtype
    return {
        "batch": (("batch",), sweep.batch.astype(dt)),
        "input_len": (("input_len",), sweep.input_len.astype(dt)),
        "output_len": (("output_len",), sweep.output_len.astype(dt)),
    }


def _slim_inputs(sweep: Sweep) -> dict:
    dt = sweep.dtype
    out = {
        "model": (("model",), astype(sweep.model, dt)),
        "gpu": (("gpu",), astype(sweep.gpu, dt)),
        "coeffs": (("model", "gpu"), astype(sweep.slim.coeffs, dt)),
        **_coordinates(sweep),
        # tensor parallel, the KV dtype and the physical floor's group come from the serving settings
        "serving": (("model", "gpu"), astype(sweep.serving, np.float64)),
    }
    if sweep.slim.variant == "slim-kv":
        out["bandwidth_exponent"] = ((), np.asarray(sweep.slim.bandwidth_exponent, dt))
    return out


def _slim_kv(x: dict) -> bool:
    return x["static"].get("slim_kv", 0) == 1


def slim_cell(model, gpu, coeffs, serving, I, O, slim_kv: bool, bandwidth_exponent=None) -> dict:
    """§1's (or slim-kv's) batch-independent terms on the group ``serving`` describes, and the inputs of its
    physical floor (:mod:`slimjax.model.floor`) at 100 % of that group's peak."""
    dt = I.dtype
    # SLIM scales with the group's GPUs (§1 is calibrated per group): all n_tp·n_pp·D of a pipelined one (§10)
    group = group_gpus(serving)
    tp = dict(n_gpu=group.astype(dt), kv_dtype_bytes=serving.kv_dtype_bytes.astype(dt))
    if not slim_kv:
        cell = slim_cell_terms(model, gpu, coeffs, I, O, **tp)
    else:  # the variant's KV-capacity limit: §3 max_seqs at the sweep's serving settings
        model64, gpu64 = (jax.tree_util.tree_map(lambda v: v.astype(F64), spec) for spec in (model, gpu))
        seqs = kv_capacity(model64, gpu64, serving, I.astype(F64), O.astype(F64))["max_seqs"].astype(dt)
        cell = slim_kv_cell_terms(model, gpu, coeffs, I, O, seqs, **tp, bandwidth_exponent=bandwidth_exponent)
    return {**cell, "floor": floor_inputs(model, gpu, jax.tree_util.tree_map(lambda v: v.astype(dt), serving))}


def slim_terms(cell: dict, coeffs, batch, I, O, slim_kv: bool, floor_at_batch=None) -> dict:
    """§1's (or slim-kv's) batch terms, each time at least its physical floor (flagged in ``slim_at_floor``).
    ``floor_at_batch``: the floor at ``batch`` already computed (the grid's, materialised by its own call so that the
    decode, E2E, throughput, flag and B_cap fusions read it rather than each re-deriving its closed form)."""
    closed_form = floor_of(cell["floor"], I, O)
    at_batch = closed_form(batch) if floor_at_batch is None else floor_at_batch

    def floor(b):
        return at_batch if b is batch else closed_form(b)  # slim-kv also floors its waves at B_eff

    terms = slim_kv_batch_terms if slim_kv else slim_batch_terms
    out = terms(cell, coeffs, batch, I, O, floor=floor)
    pre, dec = at_batch
    out["_throughput_ceiling"] = token_throughput(batch, I, O, pre + dec)  # no prediction or interval end above it
    return out


def _slim_floor(x: dict, cells: dict) -> dict:
    """The physical floor (prefill, decode) at every batch of the block: what ``_slim_batch`` floors at. The decode
    floor's terms at (batch, input_len) are computed apart (:func:`held`): fused into the full-size floor, XLA
    evaluates them at every output length too."""
    f, B, I = cells["slim"]["floor"], x["batch"], x["input_len"]
    steps_of = held(decode_steps(B, I, f["roof"], f["a_dec"]), B)
    return {"floor": (prefill_floor_s(B, I, f["roof"], f["a_pre"]), decode_floor_of(steps_of, x["output_len"]))}


def held(tree, batch):
    """``tree`` computed where it stands, not re-derived inside each consumer's fusion: XLA fuses an elementwise
    producer into its consumers (at their shape, so a (batch, input_len) term at every output length) and
    ``lax.optimization_barrier`` does not stop it on the CPU; a conditional is a fusion boundary. Its predicate,
    every batch ≥ 1, holds for every sweep (the file's check) but is known only at run time; were it false the terms
    would be NaN, not wrong numbers (XLA inlines a conditional whose branches are the same)."""
    return jax.lax.cond(
        jnp.all(batch >= 1), lambda t: t, lambda t: jax.tree_util.tree_map(lambda a: jnp.full_like(a, jnp.nan), t), tree
    )


def _slim_cell(x: dict) -> dict:
    return slim_cell(
        x["model"],
        x["gpu"],
        x["coeffs"],
        x["serving"],
        x["input_len"],
        x["output_len"],
        _slim_kv(x),
        x.get("bandwidth_exponent"),
    )


def _slim_batch(x: dict, cells: dict, out: dict) -> dict:
    I, O, cell = x["input_len"], x["output_len"], cells["slim"]

    def at(batch, floor=None):
        return slim_terms(cell, x["coeffs"], batch, I, O, _slim_kv(x), floor)

    terms = at(x["batch"], cell["materialised"]["floor"])
    return {
        "kv_traffic_bytes": cell["kv_traffic_bytes"],
        **terms,
        "slim_at_floor": terms["slim_at_floor"].astype(jnp.int8),
        "within_context": I + O <= x["model"].max_context,
        # at B = 1, for the advisor's ε and the intervals (XLA drops it if unused)
        "_slim_at_1": at(jnp.ones((), x["batch"].dtype)),
    }


def _slim_attrs(sweep: Sweep, name: str) -> dict:
    if name == "slim_at_floor":
        return {
            "flag_masks": [1, 2],
            "flag_meanings": " ".join(FLOOR_FLAGS),
            "unfit": "0 where the batch does not fit",
            "floor": "100 % of the group's peak FLOP/s and bandwidth, no efficiency, launch or communication cost: "
            "the batch's prefill as one pass, each decode step's weight and KV reads (slimjax.model.floor)",
        }
    if name in ("slim_prefill_s", "slim_decode_s", "slim_e2e_s", "slim_throughput"):
        return {
            "slim_variant": sweep.slim.variant,
            "physical_floor": "each time is at least the 100 %-of-peak roofline "
            "of its group (slim_at_floor says where it binds)",
        }
    return {}


register_group(
    Group(
        "slim",
        active=lambda sw: True,
        inputs=_slim_inputs,
        cell=_slim_cell,
        batch=_slim_batch,
        attrs=_slim_attrs,
        static=lambda sw: (("slim_kv", 1),) if sw.slim.variant == "slim-kv" else (),
        materialised=_slim_floor,
    )
)

# ------------------------------------------------------------------------- the capacity calculator (§3–§4)


def _roofline_attrs(sweep: Sweep) -> dict:
    """What a roofline-timed variable should say about how it was computed (MODEL.md §4b, §4c)."""
    attrs = {}
    variants = {
        m: "+".join(n for n, on in (("moe", moe), ("mla", mla)) if on)
        for m, moe, mla in zip(sweep.models, sweep.model.moe, sweep.model.mla, strict=False)
    }
    variants = {m: v for m, v in variants.items() if v}
    if variants:
        attrs["roofline_variant"] = json.dumps(variants)
    if sweep.serving is not None:
        no_link = [
            f"{m}/{g}"
            for i, m in enumerate(sweep.models)
            for j, g in enumerate(sweep.gpus)
            if sweep.serving.n_gpu[i, j] > 1 and not sweep.gpu.link_bytes_per_s[j] > 0
        ]
        if no_link:
            attrs["tp_communication"] = (
                f"n_gpu > 1 without a link figure (interconnect_gbs), so no all-reduce time: {', '.join(no_link)}"
            )
    return attrs


def _capacity_inputs(sweep: Sweep) -> dict:
    # capacity inputs stay float64 (see capacity_cell_terms)
    out = {
        "serving": (("model", "gpu"), astype(sweep.serving, np.float64)),
        "model64": (("model",), astype(sweep.model, np.float64)),
        "gpu64": (("gpu",), astype(sweep.gpu, np.float64)),
        **_coordinates(sweep),
    }
    if sweep.measured is not None:
        out["measured"] = (("model", "gpu"), astype(sweep.measured, np.float64))
    out["n_gpu_to_fit"] = (("model", "gpu"), np.asarray(sweep.tp_to_fit, np.float64))
    return out


def _capacity_cell(x: dict) -> dict:
    return capacity_cell_terms(
        x["model64"],
        x["gpu64"],
        x["serving"],
        x["input_len"].astype(F64),
        x["output_len"].astype(F64),
        speculating=x["static"].get("speculative", 0) == 1,
    )


def _capacity_static(sweep: Sweep) -> tuple:
    """("speculative", 1) where some group of the sweep speculates (docs/speculative.md): only then is the
    speculative decode computed."""
    k = np.asarray(sweep.serving.speculative_tokens) if sweep.serving is not None else np.zeros(1)
    return (("speculative", 1),) if np.any(k > 0) else ()


def _capacity_batch(x: dict, cells: dict, out: dict) -> dict:
    cap = cells["capacity"]
    B64, I64, O64 = (x[k].astype(F64) for k in ("batch", "input_len", "output_len"))
    result = {k: cap[k] for k in VARIABLES if VARIABLES[k].group == "capacity" and k in cap}
    result.update(service_terms(cap, x.get("measured"), B64, I64, O64))
    result["fits"] = B64 <= cap["max_seqs"]  # the advisor recommends only batches that fit
    # what mask_unfit applies, by the dims a variable has: the batch of I + O tokens, the batch's prompts alone,
    # one prompt alone
    result["_fit_masks"] = {
        "batch": result["fits"],
        "sequence": cap["max_seqs"] >= 1,
        "prompts": B64 <= cap["prompt_max_seqs"],
        "prompt": cap["prompt_max_seqs"] >= 1,
    }
    n = x["serving"].n_gpu
    result["n_gpu"] = jnp.where(jnp.isnan(n), 0.0, n)
    stages = x["serving"].pipeline_stages
    result["pp"] = jnp.where(jnp.isnan(n) | jnp.isnan(stages), 0.0, stages)
    result["n_gpu_to_fit"] = x["n_gpu_to_fit"]
    return result


def _capacity_attrs(sweep: Sweep, name: str) -> dict:
    attrs = {}
    if name in ROOFLINE_ONLY:
        attrs["mode"] = "roofline only (not measured mode, not used for the queue)"
    if name in ROOFLINE_ONLY or name in SERVICE:
        attrs.update(_roofline_attrs(sweep))
        labels = {f"{m}/{g}": sweep.serving_table[m][g]["efficiency"] for m in sweep.models for g in sweep.gpus}
        attrs["efficiency"] = next(iter(labels.values())) if len(set(labels.values())) == 1 else json.dumps(labels)
    if name in SERVICE and sweep.measured is not None:
        pairs = [
            f"{m}/{g}"
            for i, m in enumerate(sweep.models)
            for j, g in enumerate(sweep.gpus)
            if not np.isnan(sweep.measured.batch[i, j])
        ]
        attrs["measured_mode"] = ", ".join(pairs)
    return attrs


def _memory_attrs(sweep: Sweep, name: str) -> dict:
    attrs = {} if sweep.roofline else {"serving": "defaults (MODEL.md §0: the sweep has no serving block)"}
    return {**attrs, **_capacity_attrs(sweep, name)}


register_group(
    Group(
        "capacity",
        active=lambda sw: True,
        inputs=_capacity_inputs,
        cell=_capacity_cell,
        batch=_capacity_batch,
        attrs=_memory_attrs,
        wide=True,
        static=_capacity_static,
    )
)
# the roofline timing variables of the calculator (their group is "capacity"; they need this one active too)
register_group(Group("roofline", active=lambda sw: sw.roofline, inputs=lambda sw: {}, batch=lambda x, cells, out: {}))


def mask_unfit(out: dict, names) -> dict:
    """Every ``fit_masked`` variable NaN where what it times cannot run: a variable with batch and output_len
    where the batch does not fit (B > max_seqs), one with batch but no output_len (the batch's prefill) where
    the B prompts alone do not, one with output_len but no batch where one sequence does not, one with neither
    where one prompt does not."""
    if "_fit_masks" not in out:  # nothing timed by the sweep's memory check (another kind of evaluation)
        return out
    masks = out["_fit_masks"]
    for name in names:  # the fit-masked ones
        var = VARIABLES[name]
        key = (
            ("batch" if "output_len" in var.dims else "prompts")
            if "batch" in var.dims
            else ("sequence" if "output_len" in var.dims else "prompt")
        )
        out[name] = jnp.where(masks[key], out[name], jnp.nan)
    if "slim_at_floor" in out:  # a flag has no NaN: 0 where nothing runs
        out["slim_at_floor"] = jnp.where(masks["batch"], out["slim_at_floor"], 0).astype(jnp.int8)
    return out


# ------------------------------------------------------------------------------------------- queue (§5)


def _queue_batch(x: dict, cells: dict, out: dict) -> dict:
    B64, I64, O64 = (x[k].astype(F64) for k in ("batch", "input_len", "output_len"))
    return queue_terms(
        cells["capacity"], x.get("measured"), B64, I64, O64, x["arrival_rate"], x["static"].get("max_batch")
    )


register_group(
    Group(
        "queue",
        active=lambda sw: sw.arrival_rate is not None,
        inputs=lambda sw: {"arrival_rate": (("arrival_rate",), np.asarray(sw.arrival_rate, np.float64))},
        batch=_queue_batch,
        attrs=lambda sw, name: _roofline_attrs(sw),
        wide=True,
        # a bound on the queue's m from the largest batch (a compile-time constant of the recurrence)
        static=lambda sw: (("max_batch", queue_bound(sw.batch)),),
    )
)

# -------------------------------------------------------------- prediction intervals (calibrated store)


def _interval_inputs(sweep: Sweep) -> dict:
    dt = sweep.dtype
    out = {
        "log_cov": (("model", "gpu"), sweep.slim.log_cov.astype(dt)),  # (M, G, 6, 6)
        "scatter": (("model", "gpu"), sweep.slim.scatter.astype(dt)),
    }
    if sweep.slim.form is not None:  # transfer intervals: (M, G, 6)
        out["form"] = (("model", "gpu"), sweep.slim.form.astype(dt))
    return out


def _transfer_sd(x: dict, sd):
    """The fit's log sd widened by the pair's form error, the beyond-lengths one where I or O leaves
    the fitted range (MODEL.md has no intervals: slimjax's extension, :mod:`slimjax.model.intervals`)."""
    f, I, O = x["form"], x["input_len"], x["output_len"]
    beyond = (I < f[..., 2]) | (I > f[..., 3]) | (O < f[..., 4]) | (O > f[..., 5])
    return widened_sd(sd, jnp.where(beyond, f[..., 1], f[..., 0]), INTERVAL_LEVEL)


def _interval_attrs(sweep: Sweep, name: str) -> dict:
    if sweep.slim.interval_kind is None:
        return {"intervals": "fit (coefficient covariance and residual scatter)"}
    return {
        "intervals": "transfer (widened by the form error of each prediction's kind of extrapolation; +length "
        "where input_len or output_len leaves the fitted range; NaN where the store has no form error "
        "for the kind)",
        "interval_kind": json.dumps(sweep.slim.interval_kind),
    }


def _interval_batch(x: dict, cells: dict, out: dict) -> dict:
    dt = x["input_len"].dtype
    c, cell, B = x["coeffs"], cells["slim"], x["batch"]
    cov = x["log_cov"].astype(dt)

    sensitivity = slim_kv_log_throughput_sensitivity if _slim_kv(x) else log_throughput_sensitivity

    def sd(batch, terms):
        s = log_sd(sensitivity(cell, c, batch, terms), cov, x["scatter"].astype(dt))
        return _transfer_sd(x, s) if "form" in x else s

    sd_b, sd_1 = sd(B, out), sd(jnp.ones((), B.dtype), out["_slim_at_1"])
    lo, hi = log_interval(out["slim_throughput"], sd_b, INTERVAL_LEVEL)
    hi = jnp.minimum(hi, out["_throughput_ceiling"])  # physics caps the optimistic end too
    return {"slim_throughput_lo": lo, "slim_throughput_hi": hi, "_log_sd": sd_b, "_log_sd_at_1": sd_1}


register_group(
    Group(
        "intervals",
        active=lambda sw: sw.slim.log_cov is not None,
        inputs=_interval_inputs,
        batch=_interval_batch,
        attrs=_interval_attrs,
        wide=True,
    )
)

# ------------------------------------------------------------------------------------------ B_cap (§2)


def reference_e2e(sweep: Sweep) -> np.ndarray:
    """E2E at the advisor's SLO reference point for every (model, GPU), shape (M, G): the model the cells use
    (variant, floor) on each pair's own group (its n_gpu and serving settings)."""
    ref = sweep.advisor.slo_reference
    dt = sweep.dtype
    m = jax.tree_util.tree_map(lambda x: x[:, None], astype(sweep.model, dt))
    g = jax.tree_util.tree_map(lambda x: x[None, :], astype(sweep.gpu, dt))
    B, I, O = (np.asarray(ref[k], dt) for k in ("batch", "input_len", "output_len"))
    slim_kv = sweep.slim.variant == "slim-kv"

    def e2e(m, g, c, serving, beta):
        cell = slim_cell(m, g, c, serving, I, O, slim_kv, beta)
        return slim_terms(cell, c, B, I, O, slim_kv)["slim_e2e_s"]

    out = jax.jit(e2e)(
        m,
        g,
        astype(sweep.slim.coeffs, dt),
        astype(sweep.serving, np.float64),
        np.asarray(sweep.slim.bandwidth_exponent, dt),
    )
    return np.asarray(out)


def slo_seconds(sweep: Sweep) -> np.ndarray | None:
    """The advisor's SLO per (model, GPU) in seconds, or None without an advisor (NaN where the pair's group
    does not run at all)."""
    if sweep.advisor is None:
        return None
    if sweep.advisor.slo_s is not None:
        return np.full((len(sweep.models), len(sweep.gpus)), sweep.advisor.slo_s, dtype=sweep.dtype)
    return (sweep.advisor.slo_factor * reference_e2e(sweep)).astype(sweep.dtype)


def _advisor_batch(x: dict, cells: dict, out: dict) -> dict:
    axis = x["dims"].index("batch")
    B, slo, eps = x["batch"], x["slo_s"], x["epsilon"]
    allowed = out.get("fits")
    t, e2e, t1 = out["slim_throughput"], out["slim_e2e_s"], out["_slim_at_1"]["slim_throughput"]
    if allowed is not None:  # as mask_unfit writes them (the same ops, merged by XLA): B_cap reads the outputs
        t, e2e = jnp.where(allowed, t, jnp.nan), jnp.where(allowed, e2e, jnp.nan)

    def b_cap(tput, latency, tput1):
        chosen = advisor_mod.batch_capacity(tput, latency, B, tput1, slo, eps, axis=axis, allowed=allowed)
        return jnp.expand_dims(chosen, axis)  # the grid drops the (size-1) batch axis

    result = {"b_cap": b_cap(t, e2e, t1)}
    if "_log_sd" in out:  # pessimistic: T low and E2E high together; optimistic the reverse
        t_lo, t_hi = log_interval(t, out["_log_sd"], INTERVAL_LEVEL)
        e_lo, e_hi = log_interval(e2e, out["_log_sd"], INTERVAL_LEVEL)
        t1_lo, t1_hi = log_interval(t1, out["_log_sd_at_1"], INTERVAL_LEVEL)
        # −1: no interval (a transfer store without a form error for this kind of extrapolation)
        none = jnp.isnan(jnp.sum(out["_log_sd"], axis=axis, keepdims=True) + out["_log_sd_at_1"])
        result["b_cap_lo"] = jnp.where(none, -1, b_cap(t_lo, e_hi, t1_lo))
        result["b_cap_hi"] = jnp.where(none, -1, b_cap(t_hi, e_lo, t1_hi))
    return result


def _advisor_inputs(sweep: Sweep) -> dict:
    dt = sweep.dtype
    return {
        "slo_s": (("model", "gpu"), slo_seconds(sweep)),
        "epsilon": ((), dt.type(sweep.advisor.epsilon)),
        **_coordinates(sweep),
    }


def _advisor_attrs(sweep: Sweep, name: str) -> dict:
    if name != "b_cap":
        return {}
    slo = slo_seconds(sweep)
    adv = sweep.advisor
    attrs = {
        "epsilon": adv.epsilon,
        "slo_s": json.dumps(
            {m: {g: float(slo[i, j]) for j, g in enumerate(sweep.gpus)} for i, m in enumerate(sweep.models)}
        ),
    }
    if adv.slo_factor is not None:
        ref = adv.slo_reference
        attrs["slo_rule"] = f"{adv.slo_factor:g} x E2E(I={ref['input_len']}, O={ref['output_len']}, B={ref['batch']})"
    else:
        attrs["slo_rule"] = f"absolute {adv.slo_s:g} s"
    return attrs


register_group(
    Group(
        "advisor",
        active=lambda sw: sw.advisor is not None,
        inputs=_advisor_inputs,
        batch=_advisor_batch,
        attrs=_advisor_attrs,
    )
)

# ------------------------------------------------------------------------------------------ agents (§6)


def _agent_inputs(sweep: Sweep) -> dict:
    return {"agents": (("agent",), astype(sweep.agents.spec, np.float64))}


def _agent_batch(x: dict, cells: dict, out: dict) -> dict:
    cap, a = cells["capacity"], x["agents"]
    B64, I64, O64 = (x[k].astype(F64) for k in ("batch", "input_len", "output_len"))
    slots = jnp.minimum(B64, cap["max_seqs"])
    width = agents_mod.wave_width(a.parallelism, slots)
    at_width = service_terms(cap, x.get("measured"), width, I64, O64)["service_s"]
    at_one = service_terms(cap, x.get("measured"), jnp.ones((), F64), I64, O64)["service_s"]
    # a batch limit the KV pool cannot hold is not a replica that runs (+inf: the API wins; NaN once masked)
    local = jnp.where(
        B64 <= cap["max_seqs"],
        agents_mod.local_time(a.stages, a.calls, a.tool_delay_s, width, at_width, slots),
        jnp.inf,
    )
    spacing = agents_mod.api_spacing(a.api_rpm, a.api_tpm, I64, O64)
    api = agents_mod.api_time(a.stages, a.calls, a.tool_delay_s, spacing, a.api_service_s, a.api_parallelism)
    n_gpu, price = x["serving"].n_gpu, x["gpu64"].price_per_hour
    local_cost = jnp.where(slots >= 1, agents_mod.rental_cost(price, n_gpu, local), jnp.inf)
    api_cost = agents_mod.api_cost(a.stages, a.calls, I64, O64, a.api_price_in, a.api_price_out)
    return {
        "agent_local_s": local,
        "agent_dependency_bound_s": agents_mod.dependency_bound(a.stages, a.tool_delay_s, at_one, slots),
        "agent_api_s": api,
        "agent_local_cost_usd": local_cost,
        "agent_api_cost_usd": api_cost,
        "agent_api_limit": agents_mod.api_binding_limit(
            a.stages, a.calls, a.tool_delay_s, spacing, a.api_service_s, a.api_parallelism
        ),
        "agent_faster": agents_mod.winner(local, api),
        "agent_cheaper": agents_mod.winner(local_cost, api_cost),
        "agent_api_price_per_mtok": agents_mod.blended_price_per_mtok(I64, O64, a.api_price_in, a.api_price_out),
        "agent_break_even_price_per_mtok": agents_mod.break_even_price_per_mtok(
            a.stages, a.calls, I64, O64, local_cost
        ),
        "agent_break_even_rpm": agents_mod.break_even_rpm(
            a.stages, a.calls, a.tool_delay_s, a.api_service_s, a.api_parallelism, a.api_tpm, I64, O64, local
        ),
    }


def _agent_assumptions(sweep: Sweep) -> list[str]:
    """What moves a local-vs-API answer, short: its tables end with it and every agent variable keeps it."""
    from ..constants import PRICE_DATE

    labels = sorted(
        {str(r["efficiency"]).split(" (", 1)[0] for by_gpu in sweep.serving_table.values() for r in by_gpu.values()}
    )
    return [
        f"prices: illustrative GPU $/hour and API $/Mtok, dated {PRICE_DATE}; the break-even price says where the "
        "cheaper side flips",
        f"roofline constants: {', '.join(labels)}",
        "local: a dedicated replica, no background traffic; calls in waves of min(parallelism, slots) (MODEL.md §6)",
        "API: constant service time, its queue excluded; launches spaced by min(RPM, TPM/(I + O))",
    ]


def _agent_attrs(sweep: Sweep, name: str) -> dict:
    from ..constants import PRICE_DATE

    attrs = {}
    if name == "agent_api_limit":
        attrs.update(flag_values=list(range(len(agents_mod.API_LIMITS))), flag_meanings=" ".join(agents_mod.API_LIMITS))
    if name in ("agent_faster", "agent_cheaper"):
        attrs.update(flag_values=list(range(len(agents_mod.WINNERS))), flag_meanings=" ".join(agents_mod.WINNERS))
    if name in (
        "agent_local_cost_usd",
        "agent_api_cost_usd",
        "agent_cheaper",
        "agent_api_price_per_mtok",
        "agent_break_even_price_per_mtok",
    ):
        attrs["price_date"] = PRICE_DATE
        attrs["prices"] = "illustrative, editable (GPU catalog / agents.api)"
    if name in ("agent_api_s", "agent_api_cost_usd", "agent_api_limit", "agent_break_even_rpm"):
        attrs["agents"] = json.dumps(sweep.agents.table, default=float)
    if name in (
        "agent_local_s",
        "agent_dependency_bound_s",
        "agent_local_cost_usd",
        "agent_break_even_price_per_mtok",
        "agent_break_even_rpm",
    ):
        attrs.update(_roofline_attrs(sweep))
    attrs["assumptions"] = json.dumps(_agent_assumptions(sweep))
    return attrs


register_group(
    Group(
        "agents",
        active=lambda sw: sw.agents is not None,
        inputs=_agent_inputs,
        batch=_agent_batch,
        attrs=_agent_attrs,
        wide=True,
    )
)
