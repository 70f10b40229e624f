"""Serving settings (MODEL.md §0): the one table of serving keys, and everything generated from it.

Each row of :data:`SERVING` says, for one key, its default, its check, the :class:`ServingSpec` field
it fills, the conversion to base units, the command-line flag, and how ``auto`` resolves (if it may).
The sweep file's ``serving`` block, the spec, calibration's default serving and ``slimjax capacity``'s
options all come from this table: a key added with :func:`register_serving_key` (or a row below)
appears in all of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ..config import float64_scope
from ..constants import KV_POLICIES, SPECULATIVE_METHODS
from ..errors import SlimjaxError, suggest
from ..model import experts, memory
from ..model.calculator import (
    TP_DEGREES,
    largest_node_tp,
    replicated_kv,
    smallest_fitting_pp,
    smallest_fitting_tp,
)
from ..model.parallel import MEASURED_LINK_DEGREES, PROTOCOL_PARTS, allreduce_field
from ..model.pipeline import PP_DEGREES
from ..model.specs import GPUSpec, ModelSpec, ServingSpec, stack
from .catalog import config_yaml, dtype_bytes, gpu_catalog, require_network, resolve_model
from .checks import checked_number, is_integer, split_keyed_block
from .engines import GENERIC, LAYOUT_KEYS, LAYOUT_SETTING_KEYS, EngineProfile, resolve_engine

# `n_gpu: auto` and `pp: auto` resolve on the host once per (model, GPU) pair: compiled once per shape rather than
# run op by op (the quickstart's 150 pairs: 1.2 s op by op, 0.1 s compiled), so a file's checks answer quickly
fitting_tp = jax.jit(smallest_fitting_tp)
fitting_pp = jax.jit(smallest_fitting_pp)


@dataclasses.dataclass(frozen=True)
class AutoContext:
    """What an ``auto`` value may depend on: the model and GPU (spec fields, base units), the
    group's other settings as checked (the key's own units; autos resolved earlier in table order
    included), and the longest sequence the sweep evaluates (max I + O)."""

    model: str
    gpu: str
    model_fields: Mapping[str, float]
    gpu_fields: Mapping[str, float]
    settings: Mapping[str, float]
    max_tokens: float


def _same(value):
    return value


@dataclasses.dataclass(frozen=True)
class ServingKey:
    """One serving key. ``default`` is in the key's units (None: the model's ``model_field``);
    ``check(value, field)`` returns the value as a float in those units or raises SlimjaxError naming
    ``field``; ``to_base`` converts to the spec's base units; ``auto`` (optional) resolves the value
    ``auto`` from an :class:`AutoContext` (NaN when no value works); ``model_check`` (optional) says why
    a value cannot serve a model (its spec fields), or None."""

    key: str
    field: str
    default: float | str | None
    check: Callable[[Any, str], float]
    help: str
    to_base: Callable[[float], float] = _same
    model_field: str | None = None
    cli_type: type = float
    auto: Callable[[AutoContext], float] | None = None  # NaN: no value works (a result: the group cannot run)
    model_check: Callable[[float, Mapping], str | None] | None = None  # a reason the value cannot serve this model

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


def number_rule(ok: Callable[[float], bool], what: str) -> Callable[[Any, str], float]:
    """A check: a finite number, not a bool, for which ``ok`` holds ('must be {what}')."""
    return lambda value, field: checked_number(value, field, ok, what)


_positive_int = number_rule(lambda v: v >= 1 and is_integer(v), "a positive integer")


def _group_spec(ctx: AutoContext, **override) -> tuple:
    """The (model, GPU, serving) specs of one pair from an AutoContext (autos not yet resolved as 1)."""
    settings = {k: (1.0 if v == "auto" else v) for k, v in {**ctx.settings, **override}.items()}
    serving = ServingSpec(**{row.field: row.to_base(settings[row.key]) for row in SERVING.values()})
    return stack(ModelSpec, [ctx.model_fields]), stack(GPUSpec, [ctx.gpu_fields]), serving


def _auto_n_gpu(ctx: AutoContext) -> float:
    """MODEL.md §4c/§10: the smallest n in {1, 2, 4, 8} within a node dividing H_q that fits at the sweep's longest
    I + O (at the given pipeline degree); where none does and ``pp`` is auto, the largest such n (stages are then
    added by ``pp: auto``)."""
    with float64_scope():
        model, gpu, serving = _group_spec(ctx)
        n = float(fitting_tp(model, gpu, serving, ctx.max_tokens, ctx.settings.get("kv_replication") == "auto")[0])
        if n == 0 and ctx.settings.get("pp") == "auto":
            n = float(largest_node_tp(model, gpu)[0])
    return n if n > 0 else math.nan


def _auto_pp(ctx: AutoContext) -> float:
    """MODEL.md §10: the smallest n_pp in {1, 2, 4, 8} that fits at the sweep's longest I + O on stages of the
    resolved TP degree (1 where no TP degree is possible: the group does not run, said by n_gpu)."""
    if math.isnan(ctx.settings["n_gpu"]):
        return 1.0
    settings = dict(ctx.settings)
    if settings.get("kv_replication") == "auto":
        settings["kv_replication"] = float(
            replicated_kv(settings["n_gpu"], ctx.model_fields["n_kv_heads"], ctx.model_fields.get("mla", 0.0))
        )
    with float64_scope():
        model, gpu, serving = _group_spec(dataclasses.replace(ctx, settings=settings))
        n = float(fitting_pp(model, gpu, serving, ctx.max_tokens)[0])
    return n if n > 0 else math.nan


def _stages_within_layers(n: float, model: Mapping) -> str | None:
    layers = model["n_layers"]
    return None if n <= layers else f"{n:g} pipeline stages exceed its {layers:g} layers"


def _divides_heads(n: float, model: Mapping) -> str | None:
    heads = model["n_heads"]
    return None if heads % n == 0 else f"a tensor-parallel degree of {n:g} does not divide its {heads:g} query heads"


def _divides_experts(n: float, model: Mapping) -> str | None:
    experts = model.get("n_experts", 0.0)
    if experts == 0:
        return None if n == 1 else f"an expert-parallel degree of {n:g} needs routed experts; it is a dense model"
    return None if experts % n == 0 else f"an expert-parallel degree of {n:g} does not divide its {experts:g} experts"


def _auto_kv_replication(ctx: AutoContext) -> float:
    """r = max(1, n / H_kv) (§4c), n for MLA (§4b: the latent on every rank); 1 where no TP degree fits (the group
    does not run)."""
    n = ctx.settings["n_gpu"]
    fields = ctx.model_fields
    return 1.0 if math.isnan(n) else float(replicated_kv(n, fields["n_kv_heads"], fields.get("mla", 0.0)))


def _kv_policy(value, field: str) -> str:
    """A KV policy's name (:data:`slimjax.constants.KV_POLICIES`), normalised."""
    name = value.strip().lower().replace("-", "_") if isinstance(value, str) else None
    if name not in KV_POLICIES:
        raise SlimjaxError(field, f"must be one of {', '.join(KV_POLICIES)}, got {value!r}")
    return name


def kv_policy_code(value):
    """The spec's value of a KV policy: its place in :data:`slimjax.constants.KV_POLICIES` (a code, or an array of
    codes, passes as it is)."""
    return float(list(KV_POLICIES).index(value)) if isinstance(value, str) else value


def _speculative_method(value, field: str) -> str:
    """A speculative decoding method's name (:data:`slimjax.constants.SPECULATIVE_METHODS`), normalised."""
    name = value.strip().lower().replace("-", "_") if isinstance(value, str) else None
    if name not in SPECULATIVE_METHODS:
        raise SlimjaxError(field, f"must be one of {', '.join(SPECULATIVE_METHODS)}, got {value!r}")
    return name


def speculative_method_code(value):
    """The spec's value of a method: its place in :data:`slimjax.constants.SPECULATIVE_METHODS` (codes pass)."""
    return float(list(SPECULATIVE_METHODS).index(value)) if isinstance(value, str) else value


_unit = number_rule(lambda v: 0 < v <= 1, "in (0, 1]")
_nonneg = number_rule(lambda v: v >= 0, "non-negative")
_at_least_1 = number_rule(lambda v: v >= 1, "at least 1")

SERVING: dict[str, ServingKey] = {
    k.key: k
    for k in (
        ServingKey(
            "n_gpu",
            "n_gpu",
            1,
            _positive_int,
            "GPUs of one tensor-parallel group, inside a node (a stage when pp > 1; auto: smallest of "
            f"{', '.join(f'{n:g}' for n in TP_DEGREES)} that fits)",
            cli_type=int,
            auto=_auto_n_gpu,
            model_check=_divides_heads,
        ),
        ServingKey(
            "pp",
            "pipeline_stages",
            1,
            _positive_int,
            "pipeline stages n_pp of the replica group (n_gpu GPUs each; MODEL.md §10; auto: smallest of "
            f"{', '.join(f'{n:g}' for n in PP_DEGREES)} that fits)",
            cli_type=int,
            auto=_auto_pp,
            model_check=_stages_within_layers,
        ),
        ServingKey(
            "dp",
            "dp_ranks",
            1,
            _positive_int,
            "attention data-parallel ranks D of the group: each holds its own requests and KV on n_gpu GPUs, the "
            "stage's n_gpu·D GPUs share the routed experts (docs/layouts.md)",
            cli_type=int,
        ),
        ServingKey(
            "ep",
            "expert_ranks",
            1,
            _positive_int,
            "expert-parallel ranks ep the routed experts are split over (E/ep each; docs/layouts.md)",
            cli_type=int,
            model_check=_divides_experts,
        ),
        ServingKey(
            "moe_tp",
            "expert_tp",
            0,
            number_rule(lambda v: v >= 0 and is_integer(v), "a non-negative integer (0 = n_gpu·dp/ep)"),
            "GPUs one routed expert is split over (tensor parallel inside an expert; 0: n_gpu·dp/ep; n_gpu·dp = "
            "moe_tp·ep, docs/layouts.md)",
            cli_type=int,
        ),
        ServingKey(
            "expert_imbalance",
            "expert_skew",
            1.0,
            _at_least_1,
            "routing skew ι_0 ≥ 1 on the busiest expert rank's load beyond uniform top-k routing's (a redundant-"
            "expert balancer lowers it towards 1; docs/layouts.md)",
        ),
        ServingKey(
            "dispatch_dtype",
            "dispatch_bytes",
            2,
            dtype_bytes,
            "bytes per activation element an all-to-all dispatch sends (fp8 where the engine quantises it; the "
            "combine is bf16; docs/layouts.md)",
            cli_type=str,
        ),
        ServingKey("gpu_memory_utilization", "memory_utilization", 0.9, _unit, "fraction u of VRAM the server may use"),
        ServingKey(
            "reserved_gib",
            "reserved_bytes",
            0.0,
            _nonneg,
            "runtime memory M_R reserved for the group, GiB",
            to_base=lambda v: v * 2.0**30,
        ),
        ServingKey(
            "kv_replication",
            "kv_replication",
            1.0,
            _at_least_1,
            "KV replication factor r (auto: max(1, n_gpu / H_kv); n_gpu for MLA, the latent on every rank)",
            auto=_auto_kv_replication,
        ),
        ServingKey("kv_overhead", "kv_overhead", 1.0, _at_least_1, "KV overhead factor o (metadata, scales)"),
        ServingKey("block_size", "block_size", 16, _positive_int, "KV cache block size β, tokens", cli_type=int),
        ServingKey(
            "chunk_size",
            "chunk_size",
            0,
            number_rule(lambda v: v >= 0 and is_integer(v), "a non-negative integer (0 = whole prompt)"),
            "prefill chunk size s, tokens (0 = whole prompt)",
            cli_type=int,
        ),
        ServingKey(
            "kv_policy",
            "kv_policy",
            "reserve",
            _kv_policy,
            "what the engine does when KV runs out (docs/engines.md): reserve footprint(I + O) at admission, or "
            "allocate blocks as tokens are written and preempt by recompute (latest admitted first) or retract "
            "(fewest emitted tokens first)",
            to_base=kv_policy_code,
            cli_type=str,
        ),
        ServingKey(
            "kv_watermark",
            "kv_watermark",
            0.0,
            number_rule(lambda v: 0 <= v < 1, "in [0, 1)"),
            "paged KV: fraction of the pool's blocks a request's admission must leave free",
        ),
        ServingKey(
            "prefill_first",
            "prefill_first",
            0,
            number_rule(lambda v: v in (0, 1), "0 or 1"),
            "1: a step with prompt tokens to prefill runs them alone and decodes wait (SGLang's default, "
            "docs/engines.md); 0: prefill chunks share steps with the decodes (§9)",
            cli_type=int,
        ),
        ServingKey(
            "prefix_cache",
            "prefix_cache",
            1,
            number_rule(lambda v: v in (0, 1), "0 or 1"),
            "1: a prefix cache per replica reuses the KV of prompt blocks seen before, where the stream gives its "
            "prompts' block hashes (vLLM's automatic prefix caching, SGLang's radix cache, TensorRT-LLM's block reuse;"
            " the simulation, docs/simulation.md); 0: every prompt prefilled in full",
            cli_type=int,
        ),
        ServingKey(
            "launch_overhead_s", "launch_overhead_s", 0.0, _nonneg, "launch overhead t_l per iteration or chunk, s"
        ),
        ServingKey(
            "step_tokens",
            "step_tokens",
            2048,
            _positive_int,
            "token budget N_tok of one engine step (vLLM max_num_batched_tokens; the serving simulation, §9)",
            cli_type=int,
        ),
        ServingKey(
            "step_overhead_s",
            "step_overhead_s",
            0.0,
            _nonneg,
            "fixed cost t_step of one engine step (scheduling, sampling, host work; the serving simulation), s",
        ),
        ServingKey(
            "layer_overhead_s",
            "layer_overhead_s",
            0.0,
            _nonneg,
            "fixed cost t_L of each layer of a pass beyond its roofline (its small kernels' minimum latency: norms, "
            "rotary, attention launch), s (docs/engines.md)",
        ),
        ServingKey(
            "expert_layer_overhead_s",
            "expert_layer_overhead_s",
            0.0,
            _nonneg,
            "further fixed cost t_X of each routed-expert layer of a pass (router, top-k, token permutation, the "
            "grouped GEMMs' launches), s (docs/engines.md)",
        ),
        ServingKey(
            "engine_allreduce_latency_s",
            "engine_allreduce_latency_s",
            0.0,
            _nonneg,
            "latency τ_c of the engine's own all-reduce kernel for tensor parallel's small messages inside one "
            "NVLink domain (vLLM's and SGLang's custom all-reduce, TensorRT-LLM's one-shot), in place of NCCL's "
            "small-message latency; 0: NCCL's, s (docs/collectives.md)",
        ),
        ServingKey(
            "speculative_method",
            "speculative_method",
            "none",
            _speculative_method,
            "speculative decoding's draft (docs/speculative.md): none, mtp or eagle (one layer of the target and its "
            "LM head), or draft (a draft model: the `speculative` block's draft_model fills the draft_* keys)",
            to_base=speculative_method_code,
            cli_type=str,
        ),
        ServingKey(
            "speculative_tokens",
            "speculative_tokens",
            0,
            number_rule(lambda v: v >= 0 and is_integer(v), "a non-negative integer"),
            "draft tokens k verified per request in each decode step (0: no speculative decoding)",
            cli_type=int,
        ),
        ServingKey(
            "acceptance_length",
            "acceptance_length",
            1.0,
            _at_least_1,
            "mean acceptance length a, tokens a verify step emits per request, the bonus token included (1 ≤ a ≤ 1 + k;"
            " what engines report)",
        ),
        ServingKey(
            "draft_layers",
            "draft_layers",
            0.0,
            _nonneg,
            "layers L_0 of one draft pass beyond the target's share (a draft model's own; mtp and eagle: 0)",
        ),
        ServingKey(
            "draft_params",
            "draft_params",
            0.0,
            _nonneg,
            "active parameters P_0 of one draft pass beyond the target's share (a draft model's)",
        ),
        ServingKey(
            "draft_weight_bytes",
            "draft_weight_bytes",
            0.0,
            _nonneg,
            "weight bytes W_0 a draft pass reads and the draft keeps in memory beyond the target's (a draft model's)",
        ),
        ServingKey(
            "draft_attention_flops",
            "draft_attention_flops",
            0.0,
            _nonneg,
            "attention FLOPs α_0 of one draft pass per context token beyond the target's share (a draft model's)",
        ),
        ServingKey(
            "draft_kv_bytes",
            "draft_kv_bytes",
            0.0,
            _nonneg,
            "KV bytes κ_0 one draft pass reads per context token beyond the target's share (a draft model's)",
        ),
        ServingKey("compute_efficiency", "compute_efficiency", 1.0, _unit, "roofline compute efficiency e_F"),
        ServingKey("bandwidth_efficiency", "bandwidth_efficiency", 1.0, _unit, "roofline bandwidth efficiency e_B"),
        ServingKey(
            "compute_efficiency_fp8",
            "compute_efficiency_fp8",
            math.nan,  # unset: e_F (the same fraction of either peak)
            _unit,
            "roofline compute efficiency at the FP8 peak, where 8-bit weights run there (unset: compute_efficiency)",
        ),
        ServingKey(
            "bandwidth_efficiency_fp8",
            "bandwidth_efficiency_fp8",
            math.nan,  # unset: e_B
            _unit,
            "roofline bandwidth efficiency where 8-bit weights run at the FP8 peak (unset: bandwidth_efficiency)",
        ),
        ServingKey(
            "expert_compute_efficiency",
            "expert_compute_efficiency",
            1.0,
            _unit,
            "fraction e_XF of the dense GEMMs' achieved FLOP/s that the routed experts' grouped GEMMs reach "
            "(docs/layouts.md)",
        ),
        ServingKey(
            "expert_bandwidth_efficiency",
            "expert_bandwidth_efficiency",
            1.0,
            _unit,
            "fraction e_XB of the dense GEMMs' achieved bandwidth the routed experts' grouped GEMMs stream their "
            "weights at (docs/layouts.md)",
        ),
        ServingKey(
            "kv_dtype_bytes",
            "kv_dtype_bytes",
            None,
            dtype_bytes,
            "KV cache bytes per element or dtype (fp8 …)",
            model_field="kv_dtype_bytes",
            cli_type=str,
        ),
        ServingKey(
            "weight_dtype_bytes",
            "bytes_per_weight",
            None,
            dtype_bytes,
            "bytes per weight or dtype (fp8 …)",
            model_field="bytes_per_weight",
            cli_type=str,
        ),
    )
}


# `efficiency` picks a preset of the three roofline settings rather than one spec field; `engine` an engine's
# profile of scheduling and KV settings (configs/engines.yaml); `speculative` a block that fills the speculative_*,
# acceptance_length and draft_* keys, `draft_model` (beside speculative_method: draft) the draft_* keys alone
# (docs/speculative.md)
PRESET_KEYS = ("efficiency", "engine", "speculative", "draft_model")
EFFICIENCY_KEYS = ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s")
EFFICIENCY_PRESETS = ("plain", "calibrated")


# where a GPU's roofline constants come from, as every answer that ranks or times it says (one table)
CONSTANTS_SOURCES = {
    "measured": "fitted on measured serving rows of this GPU",
    "measured, other TP": "fitted on measured rows of this GPU at other TP degrees: this degree's link cost is the "
    "fitted link's extrapolation",
    "pooled": "no measurements of this GPU: the pooled default fit of other GPUs of its vendor",
    "other vendor": "no measurements of its vendor: datasheet transfer from another vendor's fit, the largest "
    "single error measured (MI300X runs 1.5–1.8× slower than H100 where its datasheet is faster)",
    "plain": "plain roofline: datasheet peaks, nothing fitted",
}
# GPU catalog fields the calibrated preset fills from the fit (MODEL.md §4c: η_link and τ are calibrated constants)
LINK_KEYS = {"link_efficiency": "link_efficiency", "allreduce_latency_s": "allreduce_latency_us"}


def _roofline_fit() -> dict:
    return config_yaml("roofline/default.yaml")  # read once, as the catalogs are


def constants_source(gpu: str, preset: str = "calibrated", tp: float | None = None) -> tuple[str, str]:
    """(mark, words) of where ``gpu``'s roofline constants come from (:data:`CONSTANTS_SOURCES`): ``measured: N
    rows`` where configs/roofline/default.yaml fitted it (``measured, other TP`` at a TP degree ``tp`` its rows do
    not have), ``pooled`` where it fitted other GPUs of the same vendor (GPU catalog ``vendor``), ``other vendor``
    otherwise (an inline GPU without a vendor included)."""
    if preset == "plain":
        return "plain", CONSTANTS_SOURCES["plain"]
    fitted = _roofline_fit().get("gpus") or {}
    if gpu in fitted:
        entry = fitted[gpu]
        degrees = sorted(int(n) for n in (entry.get("tp_rows") or {}))
        at = f" at TP {', '.join(map(str, degrees))}" if degrees else ""
        rows = f"{int(entry.get('rows', 0)):,} rows{at}"
        held = unidentified_constants(entry)
        if held:
            rows += f"; {', '.join(held)} not identified by them: the pooled default's"
        if entry.get("converged") is False:  # still moving when its iterations ran out: said, not hidden
            rows += "; its fit did not converge (see configs/roofline/default.yaml, moved_in_continuation)"
        if tp is not None and degrees and int(tp) not in degrees:
            words = f"{CONSTANTS_SOURCES['measured, other TP']} ({rows}; TP {int(tp)} not measured)"
            return "measured, other TP", words
        return "measured", f"{CONSTANTS_SOURCES['measured']} ({rows})"
    catalog = gpu_catalog()
    vendor = catalog.get(gpu, {}).get("vendor")
    measured = {catalog.get(g, {}).get("vendor") for g in fitted} - {None}
    if vendor is not None and vendor in measured:
        return "pooled", CONSTANTS_SOURCES["pooled"]
    return "other vendor", f"{CONSTANTS_SOURCES['other vendor']}; vendor {vendor or 'not given'}"


def unidentified_constants(entry: dict) -> list[str]:
    """The fitted constants of a configs/roofline/default.yaml entry its rows did not identify (a flat direction,
    or pinned at a bound): not shipped as fitted (an entry without the flags predates them: all taken as fitted)."""
    if "identified" not in entry:
        return []
    return [
        k
        for k in (*EFFICIENCY_KEYS, *LINK_KEYS)
        if k in entry and (k not in entry["identified"] or k in (entry.get("at_bound") or []))
    ]


def _fit_entry(gpu: str) -> tuple[dict, str]:
    """The constants for ``gpu``: its own fit where its rows identified them, the pooled default's where they did
    not (or where it has no fit), and which was used."""
    doc = _roofline_fit()
    if gpu not in (doc.get("gpus") or {}):
        return doc["default"], "default"
    entry = doc["gpus"][gpu]
    held = unidentified_constants(entry)
    if not held:
        return entry, gpu
    return {**entry, **{k: doc["default"][k] for k in held}}, f"{gpu}, its {', '.join(held)} the default's"


def calibrated_efficiency(gpu: str, engine: str = GENERIC) -> tuple[dict[str, float], str]:
    """The fitted e_F, e_B, t_l for ``gpu`` from configs/roofline/default.yaml (its own fit, else the pooled
    ``default``), the FP8 efficiencies e_F8 and e_B8 where fitted (:func:`calibrated_fp8_efficiency`), and t_step,
    the step overhead of ``engine``'s profile key where fitted (:func:`calibrated_step_overhead`); and where they
    came from."""
    row, which = _fit_entry(gpu)
    values = {k: float(row[k]) for k in EFFICIENCY_KEYS}
    values["step_overhead_s"] = float(row.get("step_overhead_s", 0.0))
    for key, short in FP8_EFFICIENCIES.items():
        fp8, fp8_which = calibrated_fp8_efficiency(gpu, key)
        if fp8_which:
            values[key] = fp8
            which = f"{which}; {short} {fp8_which}"
    for key, short in ENGINE_STEP_COSTS.items():
        value, fitted_for = calibrated_step_cost(engine, key)
        if fitted_for:
            values[key] = value
            which = f"{which}; {short} {fitted_for}"
    experts = calibrated_expert_efficiency(engine)
    if experts:
        values.update(experts)
        which = f"{which}; e_XF, e_XB fitted on MoE rows"
    return values, f"configs/roofline/default.yaml: {which}"


EXPERT_EFFICIENCIES = ("expert_compute_efficiency", "expert_bandwidth_efficiency")


def calibrated_expert_efficiency(engine: str = GENERIC) -> dict[str, float]:
    """e_XF and e_XB of ``engine``'s MoE kernels (its profile key), the fractions of the dense GEMMs' achieved FLOP/s
    and bandwidth the routed experts' grouped GEMMs reach (docs/layouts.md), from configs/roofline/default.yaml's
    ``expert_efficiency`` block (fitted on the measured MoE serving rows, bench/fit_moe_constants.py): the engine's
    own where identified, else the block's ``default``; {} where none is shipped (then 1)."""
    block = _roofline_fit().get("expert_efficiency") or {}
    out = {}
    for key in EXPERT_EFFICIENCIES:
        if key not in block:
            continue
        own = (block[key].get("engines") or {}).get(engine)
        out[key] = float(own["value"] if own is not None and own.get("identified", True) else block[key]["default"])
    return out


# the efficiencies of 8-bit weights at the FP8 peak (configs/roofline/default.yaml blocks of those names), as named
FP8_EFFICIENCIES = {"compute_efficiency_fp8": "e_F8", "bandwidth_efficiency_fp8": "e_B8"}


def calibrated_fp8_efficiency(gpu: str, key: str = "compute_efficiency_fp8") -> tuple[float, str]:
    """e_F8 (``key`` ``compute_efficiency_fp8``) or e_B8 (``bandwidth_efficiency_fp8``), the efficiency where 8-bit
    weights run at the FP8 peak, for ``gpu`` from configs/roofline/default.yaml's block of that name (fitted on
    measured FP8 serving rows, bench/fit_engine_constants.py): the GPU's own fit where its rows identified it, else
    the block's ``default``; (NaN, "") where no block is shipped (it is then e_F, e_B)."""
    block = _roofline_fit().get(key)
    if not block:
        return math.nan, ""
    own = (block.get("gpus") or {}).get(gpu)
    if own is not None and own.get("identified", True):
        return float(own["value"]), gpu
    return float(block["default"]), "default"


# an engine's fixed costs of a step (configs/roofline/default.yaml blocks of those names, per engine profile key),
# as named where a label lists them: t_step (host scheduling, sampling), t_L per layer, t_X per routed-expert layer,
# and τ_c, its own all-reduce kernel's latency (docs/engines.md)
ENGINE_STEP_COSTS = {
    "step_overhead_s": "t_step",
    "layer_overhead_s": "t_L",
    "expert_layer_overhead_s": "t_X",
    "engine_allreduce_latency_s": "τ_c",
}


def calibrated_step_cost(engine: str, key: str = "step_overhead_s") -> tuple[float, str]:
    """One of :data:`ENGINE_STEP_COSTS` of the engine profile ``engine`` (its catalog key) from
    configs/roofline/default.yaml's block of that name (fitted on measured serving rows, bench/fit_step_costs.py):
    (value, engine) where its rows identified it; (0, "") where its fit ended at the bound 0, for ``generic`` (§9's
    plain step: the GPU's t_l alone, NCCL's all-reduce) and where the block has no ``default``; else the block's
    ``default``, the fitted engines' row-weighted mean (an engine whose rows cannot tell it apart, or that has none:
    its kernels cost something too)."""
    block = _roofline_fit().get(key) or {}
    own = (block.get("engines") or {}).get(engine)
    if own is not None and own.get("identified", True):
        return float(own["value"]), engine
    if engine == GENERIC or (own is not None and own.get("at_bound")) or "default" not in block:
        return 0.0, ""
    return float(block["default"]), f"{engine}: the engines' mean"


def calibrated_link(gpu: str) -> dict[str, float]:
    """The fitted η_link and τ (GPU fields, base units) for ``gpu``: its own fit, else the pooled ``default``;
    empty where the fit has none."""
    row, _ = _fit_entry(gpu)
    return {field: float(row[field]) for field in LINK_KEYS if field in row}


def calibrated_request_overhead(engine: str) -> float:
    """The fitted client-side overhead of a request (seconds) of an engine's serving API (configs/roofline/default.yaml
    ``request_overhead_s``, by engine profile key; its ``default`` for another engine; 0 where none was fitted)."""
    fitted = _roofline_fit().get("request_overhead_s") or {}
    values = fitted.get("engines") or {}
    return float(values.get(engine, fitted.get("default", 0.0)))


def with_calibrated_links(gpus: list, entries: list, table: dict) -> list:
    """GPU rows (label, fields) with the fitted link constants where every model serves that GPU under the
    ``calibrated`` preset and the file's inline GPU entry (``entries`` as the file gave them) does not set them;
    ``table`` (serving_block's) records per (model, GPU) which link constants were used. A catalog entry's τ is
    the nominal figure the plain roofline uses, so the fit replaces it (a user's own measured τ goes inline). Where
    the GPU's ``allreduce`` block has NCCL's measured all-reduce at every group size the models use, that times the
    link under the ``calibrated`` preset (docs/collectives.md) and no fitted η_link or τ is applied; under any other
    preset the measurement is dropped (the plain roofline is the datasheet's: §4c's nominal line)."""
    out = []
    for (g, row), given in zip(gpus, entries, strict=True):
        raw = given if isinstance(given, Mapping) else {}
        presets = {str(table[m][g]["efficiency"]).split(" ", 1)[0] for m in table}
        fitted = calibrated_link(g) if presets == {"calibrated"} else {}
        fitted = {f: v for f, v in fitted.items() if LINK_KEYS[f] not in raw}
        sizes = [n for m in table for n in table[m][g].get("tp", [table[m][g].get("n_gpu", 1)])]  # a study's tp axis
        groups = sorted({int(n) for n in sizes if n > 1})  # (NaN: no group runs)
        if presets != {"calibrated"}:  # the plain roofline is the datasheet's: §4c's nominal line, no measurement
            row = {**row, **{allreduce_field(n, p): 0.0 for n in MEASURED_LINK_DEGREES for p in PROTOCOL_PARTS}}
        has = [n for n in MEASURED_LINK_DEGREES if row.get(allreduce_field(n, "small_bytes_per_s"), 0.0) > 0]
        measured = [n for n in groups if n in has]
        if measured == groups and (groups or has):  # NCCL's measurement times every group: η_link and τ time none
            fitted = {}
            at = ", ".join(map(str, groups or has))
            link = f"measured: NCCL all-reduce at {at} GPUs (configs/gpus.yaml allreduce)"
        else:
            link = (
                "fitted: " + ", ".join(f"{f} {v:.4g}" for f, v in fitted.items())
                if fitted
                else "catalog: " + ", ".join(f"{f} {row[f]:.4g}" for f in LINK_KEYS)
            )
            if measured:
                link += f"; NCCL's measured all-reduce at {', '.join(map(str, measured))} GPUs"
        for m in table:
            table[m][g]["link"] = link
            if fitted or link.startswith("measured"):  # said wherever the preset's label is shown (cards, attrs)
                table[m][g]["efficiency"] = f"{table[m][g]['efficiency']}; TP link {link}"
        out.append((g, {**row, **fitted}))
    return out


def _apply_efficiency(merged: dict, where: dict, gpu: str, engine: str = GENERIC) -> str:
    """Fill the roofline settings the user left out from the ``efficiency`` preset (the step overhead of
    ``engine``, a profile key, where fitted); returns its label."""
    preset = merged.pop("efficiency", "plain")
    field = where.pop("efficiency", "serving.efficiency")
    if preset not in EFFICIENCY_PRESETS:
        raise SlimjaxError(field, f"must be one of {', '.join(EFFICIENCY_PRESETS)}, got {preset!r}")
    if preset == "plain":
        return "plain roofline (e_F = e_B = 1, t_l = 0 unless given; MODEL.md §0)"
    values, source = calibrated_efficiency(gpu, engine)
    for k, v in values.items():
        if k not in merged:
            merged[k], where[k] = v, f"{field} ({source})"
    mark, words = constants_source(gpu)
    return f"calibrated ({source}; {mark}: {words})"


def _apply_engine(merged: dict, where: dict, gpu: str, gpu_fields: Mapping) -> EngineProfile:
    """Fill the serving keys the user left out from the ``engine`` profile (configs/engines.yaml, on this GPU);
    returns the profile (``generic`` where none is named)."""
    if "engine" not in merged:
        return resolve_engine(GENERIC)
    field = where.pop("engine")
    profile = resolve_engine(merged.pop("engine"), field)
    for k, v in profile.settings(gpu, gpu_fields).items():
        if k not in merged:
            merged[k], where[k] = v, f"{field} ({profile.key}'s {k}, configs/engines.yaml)"
    return profile


SPECULATIVE_BLOCK = {  # the `speculative` block's keys: the serving key each fills
    "method": "speculative_method",
    "tokens": "speculative_tokens",
    "acceptance_length": "acceptance_length",
}


def draft_model_terms(name: Any, target: Mapping, field: str) -> dict[str, float]:
    """The draft_* serving keys of a draft model (a catalog name, config path or inline model, as ``models``
    takes): its layers, active parameters, weight bytes, decode attention FLOPs and KV bytes (its full-attention
    layers at its own KV dtype) per context token. It must share the target's vocabulary (it proposes the target's
    tokens)."""
    label, d = resolve_model(name, field)
    if d["vocab"] != target["vocab"]:
        raise SlimjaxError(
            field,
            f"draft model {label}'s vocabulary ({d['vocab']:g} tokens) is not the target's ({target['vocab']:g}): a "
            "draft proposes the target's tokens",
        )
    p_e = experts.expert_params(d["n_ffn"], d["hidden"], d["expert_ffn_dim"])
    active = experts.active_params(d["n_params"], d["n_moe_layers"], d["n_experts"], d["experts_per_token"], p_e)
    _, a_dec = experts.attention_flops_coefficients(
        *(d[k] for k in ("n_layers", "n_heads", "head_dim", "mla", "kv_lora_rank", "rope_dim", "qk_nope_dim")),
        d["v_head_dim"],
    )
    e_kv = memory.kv_bytes_per_layer_token(
        d["n_kv_heads"], d["head_dim"], d["kv_dtype_bytes"], d["mla"], d["kv_lora_rank"], d["rope_dim"]
    )
    return dict(
        draft_layers=float(d["n_layers"]),
        draft_params=float(active),
        draft_weight_bytes=float(d["n_params"] * d["bytes_per_weight"]),
        draft_attention_flops=float(a_dec),
        draft_kv_bytes=float((d["n_layers"] - d["n_sliding_layers"]) * e_kv),
    )


def speculative_block(block: Any, field: str) -> dict:
    """A ``speculative`` block (method, tokens, acceptance_length, draft_model; docs/speculative.md) checked on its
    own: its serving keys' values (null or false: none) and ``draft_model`` as given."""
    keys = [*SPECULATIVE_BLOCK, "draft_model"]
    if block is None or block is False:
        block = {"method": "none", "tokens": 0}
    if not isinstance(block, Mapping):
        raise SlimjaxError(field, f"must be a mapping of {', '.join(keys)}, got {block!r}")
    for k in block:
        if k not in keys:
            raise SlimjaxError(f"{field}.{k}", f"unknown key{suggest(str(k), keys)}")
    method = _speculative_method(block.get("method", "none"), f"{field}.method")
    if (method == "draft") != ("draft_model" in block):
        raise SlimjaxError(
            f"{field}.draft_model" if method == "draft" else f"{field}.method",
            "method draft needs draft_model (a catalog model)"
            if method == "draft"
            else f"draft_model is a draft model's: give method draft, not {method}",
        )
    values = {"speculative_method": method}
    for k, key in SPECULATIVE_BLOCK.items():
        if k in block and key != "speculative_method":
            values[key] = check_serving_value(key, block[k], f"{field}.{k}")
    if "speculative_tokens" in values and "acceptance_length" in values:
        check_acceptance(values["acceptance_length"], values["speculative_tokens"], f"{field}.acceptance_length")
    if method == "draft":
        values["draft_model"] = block["draft_model"]
    return values


def _apply_speculative(merged: dict, where: dict, arch: Mapping) -> None:
    """Expand the ``speculative`` block into its serving keys (:func:`speculative_block`; a draft model's terms from
    the catalog), where the user did not give them directly; a ``draft_model`` given beside the flat keys fills the
    draft_* ones."""
    if "draft_model" in merged:
        field, name = where.pop("draft_model"), merged.pop("draft_model")
        method = merged.get("speculative_method", "none")
        if "speculative" in merged or _speculative_method(method, where.get("speculative_method", field)) != "draft":
            raise SlimjaxError(
                field, "a draft model drafts for speculative_method: draft (or give it inside the speculative block)"
            )
        for k, v in draft_model_terms(name, arch, field).items():
            if k not in merged:
                merged[k], where[k] = v, field
    if "speculative" not in merged:
        return
    field = where.pop("speculative")
    values = speculative_block(merged.pop("speculative"), field)
    if "draft_model" in values:
        values |= draft_model_terms(values.pop("draft_model"), arch, f"{field}.draft_model")
    named = {key: f"{field}.{k}" for k, key in SPECULATIVE_BLOCK.items()}  # how errors name the block's fields
    for k, v in values.items():
        if k not in merged:
            merged[k], where[k] = v, named.get(k, f"{field}.draft_model")


DRAFT_KEYS = ("draft_layers", "draft_params", "draft_weight_bytes", "draft_attention_flops", "draft_kv_bytes")


def check_acceptance(a: float, k: float, field: str, who: str = "") -> None:
    """1 ≤ a ≤ 1 + k: a verify step emits at most its k drafts and the bonus token (a ≥ 1 is the key's own rule)."""
    if a > 1 + k:
        raise SlimjaxError(
            field,
            f"{who}{a:g} tokens per step cannot be accepted from {k:g} draft tokens: 1 ≤ acceptance_length ≤ 1 + k",
        )


def check_speculative(checked: Mapping, where: Mapping, who: str = "") -> None:
    """Speculative decoding's settings agree (docs/speculative.md): a method with k ≥ 1 draft tokens, or none with
    k = 0; 1 ≤ a ≤ 1 + k; one pipeline stage (a draft spanning stages is not modelled)."""
    k, a, method = checked["speculative_tokens"], checked["acceptance_length"], checked["speculative_method"]
    at = where.get
    if (method == "none") != (k == 0):
        raise SlimjaxError(
            at("speculative_tokens", "serving.speculative_tokens")
            if method != "none"
            else at("speculative_method", "serving.speculative_method"),
            f"{who}method {method} with {k:g} draft tokens: give a method (mtp, eagle, draft) and tokens ≥ 1, "
            "or none and 0",
        )
    if method == "draft" and not any(key in where for key in DRAFT_KEYS):  # never a free draft by omission
        raise SlimjaxError(
            at("speculative_method", "serving.speculative_method"),
            f"{who}method draft needs its draft: draft_model (a catalog model) or the draft_* keys",
        )
    check_acceptance(a, k, at("acceptance_length", "serving.acceptance_length"), who)
    pp = checked.get("pp", 1)
    if k > 0 and isinstance(pp, float) and not math.isnan(pp) and pp > 1:
        raise SlimjaxError(
            at("pp", "serving.pp"),
            f"{who}speculative decoding over {pp:g} pipeline stages is not modelled (docs/speculative.md): pp 1",
        )


def register_serving_key(key: ServingKey) -> ServingKey:
    """Add a serving key to the table (the public hook): it is then accepted in sweep files, filled in
    every :class:`ServingSpec`, given its default in calibration and offered by ``slimjax capacity``."""
    if key.key in SERVING:
        raise SlimjaxError("serving", f"key {key.key!r} is already in the serving table")
    if any(k.field == key.field for k in SERVING.values()):
        raise SlimjaxError("serving", f"spec field {key.field!r} is already filled by another key")
    SERVING[key.key] = key
    return key


def check_serving_value(key: str, value: Any, field: str) -> float | str:
    """One value checked by its row (``'auto'`` kept as is where the key resolves it)."""
    row = SERVING[key]
    if isinstance(value, str) and value == "auto":
        if row.auto is None:
            raise SlimjaxError(field, f"{key} has no 'auto' setting; give a value")
        return "auto"
    return row.check(value, field)


def default_serving(model, **overrides) -> ServingSpec:
    """A ServingSpec broadcast like ``overrides`` (or the model's leaves): the given keys (key units;
    arrays or tracers welcome), every other key at its default, the model's dtypes where the table
    says so. Calibration's serving settings (MODEL.md §0 defaults)."""
    unknown = [k for k in overrides if k not in SERVING]
    if unknown:
        raise SlimjaxError(f"serving.{unknown[0]}", "unknown serving key")
    like = next(iter(overrides.values()), None)
    one = jnp.ones_like(jnp.asarray(like if like is not None else model.n_layers, float))
    fields = {}
    for row in SERVING.values():
        if row.key in overrides:
            fields[row.field] = row.to_base(overrides[row.key]) * one
        elif row.default is None:
            fields[row.field] = getattr(model, row.model_field)
        else:
            fields[row.field] = row.to_base(row.default) * one
    return ServingSpec(**fields)


def _resolve(merged: dict, where: dict, arch: Mapping, ctx: Callable[[dict], AutoContext]) -> dict[str, float]:
    checked, autos = {}, []
    for row in SERVING.values():
        if row.key in merged:
            value = check_serving_value(row.key, merged[row.key], where[row.key])
            if value == "auto":
                autos.append(row)
                checked[row.key] = "auto"
                continue
            checked[row.key] = value
        else:
            checked[row.key] = row.default if row.default is not None else arch[row.model_field]
    for row in autos:  # after every explicit value, in table order
        value = float(row.auto(ctx(checked)))
        checked[row.key] = value if math.isnan(value) else row.check(value, f"{where[row.key]} (auto)")
    return checked, [row.key for row in autos]


def check_group_shape(gpu: str, row: Mapping, tp, pp, tp_field: str, pp_field: str, who: str = "") -> None:
    """Tensor parallel stays inside a node and pipeline stages need the network they cross (MODEL.md §10): the TP
    degrees ``tp`` and stage counts ``pp`` (NaN: none resolved) on GPU ``gpu`` (catalog fields ``row``), errors
    naming ``tp_field`` / ``pp_field``."""
    over = [n for n in tp if not math.isnan(n) and n > row["gpus_per_node"]]
    if over:
        raise SlimjaxError(
            tp_field,
            f"{who}a tensor-parallel degree of {over[0]:g} spans more than one {gpu} node ({row['gpus_per_node']:g} "
            "GPUs, gpus_per_node); give pp > 1 for more GPUs (MODEL.md §10)",
        )
    if any(not math.isnan(n) and n > 1 for n in pp):
        require_network(gpu, row, pp_field, f"{who}pipeline stages on {gpu} pass activations")


def layout_text(tp: int, dp: int, ep: int, moe_tp: int) -> str:
    """A layout as a table reads it: ``tp 1 × dp 8, ep 8 (moe_tp 1)``."""
    return f"tp {tp} × dp {dp}, ep {ep} (moe_tp {moe_tp})"


def check_layout(gpu: str, row: Mapping, checked: Mapping, where: Mapping, who: str = "") -> None:
    """A group's attention and expert layouts cover the same GPUs per stage (docs/layouts.md): n_gpu·dp =
    moe_tp·ep (moe_tp given) or ep dividing n_gpu·dp (moe_tp derived), and a stage beyond one node needs the network
    its all-to-all crosses; errors name the keys and their values."""
    tp, dp, ep, moe_tp = (checked[k] for k in ("n_gpu", "dp", "ep", "moe_tp"))
    if math.isnan(tp):
        return
    gpus = tp * dp
    if moe_tp > 0 and moe_tp * ep != gpus:
        raise SlimjaxError(
            where.get("moe_tp", "serving.moe_tp"),
            f"{who}moe_tp·ep = {moe_tp:g}·{ep:g} = {moe_tp * ep:g} GPUs for the experts, but n_gpu·dp = {tp:g}·{dp:g} "
            f"= {gpus:g} for attention: a stage's experts and attention share its GPUs (docs/layouts.md)",
        )
    if moe_tp == 0 and gpus % ep:
        raise SlimjaxError(
            where.get("ep", "serving.ep"),
            f"{who}ep = {ep:g} does not divide the n_gpu·dp = {tp:g}·{dp:g} = {gpus:g} GPUs of a stage "
            "(docs/layouts.md)",
        )
    if dp > 1 and gpus > row["gpus_per_node"]:
        require_network(gpu, row, where.get("dp", "serving.dp"), f"{who}an all-to-all across {gpu} nodes")


def serving_block(
    value: Any,
    models: list[tuple[str, dict]],
    gpus: list[tuple[str, dict]],
    max_tokens: float,
    tp_degrees=None,
    layouts: dict | None = None,
) -> tuple[ServingSpec, dict]:
    """The sweep file's ``serving`` block: per (model, GPU) settings, defaults < top level < GPU entry
    < model entry; the layout checked at each of ``tp_degrees`` (a study's tp axis; default its own n_gpu): a degree
    it cannot take is recorded (``layout_invalid``: {degree: why}) and does not run; none it can take is the error.
    ``layouts`` (a study's ``layouts``, :func:`slimjax.inputs.layouts.study_layouts`: per (model, GPU) the candidate
    (tp, dp, ep, moe_tp)): a degree whose layout is not one of them does not run either, and a (model, GPU) none of
    whose degrees is one is recorded, not an error.
    Returns the ServingSpec (leaves (M, G), base units) and {model: {gpu: {key: value in the key's units, "auto":
    [keys resolved from auto]}}} for the Dataset's attrs (NaN n_gpu: no TP degree fits)."""
    names, gpu_names = [m for m, _ in models], [g for g, _ in gpus]
    top, by_model, by_gpu = split_keyed_block(value or {}, "serving", (*SERVING, *PRESET_KEYS), names, gpu_names)
    rows, table = [], {}
    for m, arch in models:
        table[m] = {}
        for g, gpu in gpus:
            merged, where = {}, {}
            for source, block in (
                ("serving", top),
                (f"serving.{g}", by_gpu.get(g, {})),
                (f"serving.{m}", by_model.get(m, {})),
            ):
                for k, v in block.items():
                    merged[k], where[k] = v, f"{source}.{k}"
            preset = merged.get("efficiency", "plain")
            profile = _apply_engine(merged, where, g, gpu)
            efficiency = _apply_efficiency(merged, where, g, profile.key)
            _apply_speculative(merged, where, arch)
            checked, autos = _resolve(
                merged,
                where,
                arch,
                lambda s, m=m, g=g, arch=arch, gpu=gpu: AutoContext(m, g, arch, gpu, dict(s), max_tokens),
            )
            unfit = ""  # with study layouts: why this model takes none of them
            for row in SERVING.values():
                problem = (
                    row.model_check(checked[row.key], arch)
                    if row.model_check and not math.isnan(checked[row.key])
                    else None
                )
                if problem and layouts is not None and row.key in LAYOUT_SETTING_KEYS:
                    unfit = f"{m}: {problem}"
                elif problem:
                    raise SlimjaxError(where.get(row.key, f"serving.{row.key}"), f"{m}: {problem}")
            check_speculative(checked, where, f"{m} on {g}: ")
            check_group_shape(
                g,
                gpu,
                [checked["n_gpu"]],
                [checked["pp"]],
                where.get("n_gpu", "serving.n_gpu"),
                where.get("pp", "serving.pp"),
                f"{m} on {g}: ",
            )
            invalid = {}
            for n in [checked["n_gpu"]] if tp_degrees is None else tp_degrees:
                shape = (n, *(checked[k] for k in LAYOUT_KEYS))
                if layouts is not None and (unfit or tuple(map(int, shape)) not in layouts[m, g]):
                    invalid[str(int(n))] = unfit or f"{m} on {g}: not one of the study's layouts (layouts)"
                    continue
                try:
                    check_layout(g, gpu, {**checked, "n_gpu": float(n)}, where, f"{m} on {g}: ")
                except SlimjaxError as e:  # on a study's tp axis, a degree the layout cannot take does not run
                    if tp_degrees is None or (layouts is None and len(invalid) + 1 == len(tp_degrees)):
                        raise
                    invalid[str(int(n))] = str(e)
            rows.append({row.field: row.to_base(checked[row.key]) for row in SERVING.values()})
            table[m][g] = {
                **checked,
                "engine": profile.label,
                "efficiency": efficiency,
                "constants": constants_source(g, preset)[0],  # (an unknown preset was refused above)
                **({"auto": autos} if autos else {}),
                **({"layout_invalid": invalid} if invalid else {}),
                **({"layouts": [layout_text(*shape) for shape in sorted(layouts[m, g])]} if layouts else {}),
            }
    spec = stack(ServingSpec, rows)
    return ServingSpec(**{k: v.reshape(len(models), len(gpus)) for k, v in spec.fields().items()}), table


def resolve_study_model(entry, field: str, base_dir=None) -> tuple[str, dict]:
    """:func:`slimjax.inputs.catalog.resolve_model` for a study file's ``models`` entry: a serving key given
    inside an inline model is named, with where it goes."""
    if isinstance(entry, Mapping) and entry.get("name"):
        keys = [k for k in entry if k != "name" and (k in SERVING or k in PRESET_KEYS)]
        if keys:
            k = keys[0]
            raise SlimjaxError(
                f"{field}.{k}",
                f"{k!r} is a serving key, not a model field: give it under "
                f"serving.{entry['name']}.{k} (or serving.{k} for every pair)",
            )
    return resolve_model(entry, field, base_dir)
