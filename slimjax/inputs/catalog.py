"""Model and GPU catalogs, and the Hugging Face ``config.json`` reader (MODEL.md §0).

Catalog conveniences (TFLOP/s, TB/s, GiB) are converted to base units here, once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .. import constants
from ..errors import SlimjaxError, suggest
from ..model.parallel import MEASURED_COLLECTIVES, MEASURED_LINK_DEGREES, collective_field
from .checks import checked_number, positive_number

PRICE_DATE = constants.PRICE_DATE

_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    # 4-bit formats, scales included: MXFP4 one 8-bit scale per 32, NVFP4 one FP8 scale per 16
    "int4": 0.5,
    "fp4": 0.5,
    "mxfp4": 0.53125,
    "nvfp4": 0.5625,
}
# Families whose FFN is two plain matrices (no gate); everything else is treated as gated (3).
_UNGATED_MODEL_TYPES = {"opt", "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "bloom", "falcon", "phi", "mpt"}
DEFAULT_ALLREDUCE_LATENCY_US = 10.0
DEFAULT_GPUS_PER_NODE = 8  # MODEL.md §10
DEFAULT_NETWORK_LATENCY_US = 10.0  # τ_net, MODEL.md §10
# Families whose MoE layers carry one always-on shared expert their config does not count.
_SHARED_EXPERTS_BY_TYPE = {"llama4_text": 1, "llama4": 1}


def configs_dir() -> Path:
    """The catalog folder: $SLIMJAX_CONFIGS, the copy inside an installed wheel, or the repo's."""
    env = os.environ.get("SLIMJAX_CONFIGS")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent
    packaged = package / "_configs"
    return packaged if packaged.is_dir() else package.parent / "configs"


@functools.cache
def config_yaml(name: str) -> dict:
    with open(configs_dir() / name) as f:
        return yaml.safe_load(f)


def model_catalog() -> dict[str, dict]:
    return config_yaml("models.yaml")["models"]


def gpu_catalog() -> dict[str, dict]:
    return config_yaml("gpus.yaml")["gpus"]


_VENDOR_WORDS = ("nvidia", "amd", "intel", "gpu", "gpus", "tesla", "instinct", "accelerator")


# form-factor and memory-type words that name a package, not another GPU: "b200_sxm", "H100 80GB HBM3", "GB200
# NVL72" (a bare "NVL" stays: H100 NVL is its own part; PCIe stays: it is another part)
_FORM_WORDS = (r"sxm\d*", r"hbm\d*e?", "hgx", r"nvl\d+", "superchip")


def normalised_hardware(name: str, *, drop_memory: bool = True, drop_form: bool = False) -> str:
    """A hardware name reduced for matching: lower case, vendor words ("Nvidia", "AMD", "GPU", …),
    punctuation and spaces removed, and (``drop_memory``) a memory size ("80GB", "141 GB"), (``drop_form``)
    form-factor words (SXM, HBM3, HGX, NVL72)."""
    import re

    text = re.sub(r"[_\-/]", " ", str(name).lower())
    for word in _VENDOR_WORDS:
        text = re.sub(rf"\b{word}\b", " ", text)
    if drop_memory:
        text = re.sub(r"(?<![a-z])\d+\s*(gb|gib|g)\b", " ", text)
    if drop_form:
        for word in _FORM_WORDS:
            text = re.sub(rf"(?<=[a-z0-9 ]){word}\b|\b{word}\b", " ", text)
    return re.sub(r"[^a-z0-9]", "", text)


def resolve_hardware(name: str, table: Mapping[str, str]) -> str | None:
    """The catalog GPU a trace's hardware name means: ``table`` (configs/hardware.yaml) first, then the
    GPU catalog's names and aliases (case-insensitive), then a normalised match (:func:`normalised_hardware`)
    against those and the table's names. None when nothing matches; an error naming the candidates when
    the normalised name matches several GPUs."""
    name = str(name)
    if name in table:
        return table[name]
    gpus = gpu_catalog()
    spellings = {g: [g, *row.get("aliases", [])] for g, row in gpus.items()}
    for g, names in spellings.items():
        if any(name.lower() == n.lower() for n in names):
            return g
    # "A100 40GB" is the 40 GB part before it is any A100; "b200_sxm" is B200 once its package word goes
    for drop_memory, drop_form in ((False, False), (True, False), (True, True)):
        key = normalised_hardware(name, drop_memory=drop_memory, drop_form=drop_form)
        if not key:
            return None

        def norm(n, drop_memory=drop_memory, drop_form=drop_form):
            return normalised_hardware(n, drop_memory=drop_memory, drop_form=drop_form)

        hits = {g for g, names in spellings.items() if any(norm(n) == key for n in names)}
        hits |= {g for n, g in table.items() if norm(n) == key}
        if len(hits) > 1:
            raise SlimjaxError(
                "traces.gpu",
                f"hardware {name!r} could mean {', '.join(sorted(hits))}; say which in configs/hardware.yaml",
            )
        if hits:
            return hits.pop()
    return None


def _lookup(name: str, table: Mapping[str, dict], field: str, kind: str) -> tuple[str, dict]:
    if name in table:
        return name, table[name]
    for key, row in table.items():
        aliases = [key, *row.get("aliases", [])]
        if any(name.lower() == a.lower() for a in aliases):
            return key, row
    import difflib

    # did-you-mean over names and aliases, answered with the catalog names they belong to
    canonical = {key.lower(): key for key in table}
    canonical.update(
        {a.lower(): key for key, row in table.items() for a in row.get("aliases", []) if a.lower() not in canonical}
    )
    close = difflib.get_close_matches(name.lower(), list(canonical), n=8, cutoff=0.5)
    close = close or [c for c in canonical if name.lower() in c]
    names = list(dict.fromkeys(canonical[c] for c in close))[:3]
    hint = f"; did you mean {', '.join(map(repr, names))}?" if names else ""
    where = "configs/gpus.yaml" if kind == "GPU" else "configs/models.yaml, or give a config.json path"
    raise SlimjaxError(field, f"unknown {kind} {name!r}{hint} (a new one goes in {where})")


# ---------------------------------------------------------------------------------------- models


def _positive(cfg: Mapping, key: str, field: str, *, integer: bool = True) -> float:
    value = cfg.get(key)
    if value is None:
        raise SlimjaxError(f"{field}.{key}", "missing (needed to build the model)")
    return positive_number(value, f"{field}.{key}", integer=integer)


def dtype_bytes(value: Any, field: str) -> float:
    """Bytes per element from a number (or a numeric string, as a command line gives it) or a dtype
    name such as ``bf16``, ``fp8``, ``torch.float16``; 2 (bf16) when ``None``."""
    if value is None:
        return 2.0
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value > 0 and math.isfinite(value):
            return float(value)
        raise SlimjaxError(
            field,
            f"must be a positive number of bytes per element or a dtype name "
            f"({', '.join(sorted(_DTYPE_BYTES))}), got {value!r}",
        )
    key = str(value).lower().replace("torch.", "")
    if key not in _DTYPE_BYTES:
        raise SlimjaxError(field, f"unknown dtype {value!r}{suggest(key, _DTYPE_BYTES)}")
    return float(_DTYPE_BYTES[key])


def _quantized_bytes_per_weight(
    qc: Mapping, P: float, embeddings: float, attention: float, base: float, field: str
) -> float:
    """Mean bytes per weight of a quantized checkpoint (HF ``quantization_config``): the quantized linear
    weights at their format's bytes (scales included), the embeddings and any module the config leaves
    unconverted (e.g. gpt-oss's attention) at the checkpoint's own dtype."""
    method = str(qc.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        block = qc.get("weight_block_size")
        q = 1.0 + (4.0 / (block[0] * block[1]) if block else 0.0)  # one float32 scale per block
    elif method in ("mxfp4", "nvfp4"):
        q = _DTYPE_BYTES[method]
    elif method in ("awq", "gptq"):
        bits, group = float(qc.get("bits", 4)), float(qc.get("group_size", 128) or 128)
        q = bits / 8.0 + 2.0 / group  # a float16 scale per group
    elif method == "bitsandbytes":
        q = 0.5 + 4.0 / 64.0 if qc.get("load_in_4bit") else 1.0
    elif method == "compressed-tensors":  # its first config group's weights (Kimi-K2.5: int4, groups of 32)
        groups = list((qc.get("config_groups") or {}).values())
        weights = (groups[0].get("weights") if groups and isinstance(groups[0], Mapping) else None) or {}
        if "num_bits" not in weights:
            raise SlimjaxError(f"{field}.config_groups", "a compressed-tensors config needs a group's weights.num_bits")
        group = float(weights.get("group_size") or 128)
        q = float(weights["num_bits"]) / 8.0 + 2.0 / group  # a bf16 scale per group
    else:
        raise SlimjaxError(
            f"{field}.quant_method",
            f"unknown quantization {method!r} (known: fp8, mxfp4, nvfp4, awq, gptq, "
            "bitsandbytes, compressed-tensors); set serving weight_dtype_bytes instead",
        )
    kept = embeddings
    if any("attn" in str(m) for m in (*(qc.get("modules_to_not_convert") or ()), *(qc.get("ignore") or ()))):
        kept += attention
    kept = min(kept, P)
    return ((P - kept) * q + kept * base) / P


# The Hugging Face config keys the reader uses (MODEL.md §0, §4b), by what they mean: the first name present
# wins. READ_KEYS (every accepted key; an inline key that is a near miss of one is a typo) derives from it.
HF_KEYS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "ffn": ("intermediate_size", "ffn_dim"),  # OPT calls it ffn_dim
    "vocab": ("vocab_size",),
    "model_type": ("model_type",),
    "activation": ("hidden_act", "activation_function"),
    "n_ffn": ("n_ffn",),  # slimjax's own: FFN matrices, 2 or 3
    "top_k": ("num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_topk"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "expert_ffn": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts", "num_shared_experts"),
    "parallel_dense": ("enable_moe_block",),  # gemma-4: a dense MLP beside the routed experts
    "dense_first": ("first_k_dense_replace",),  # DeepSeek: the first k layers dense
    "moe_step": ("interleave_moe_layer_step", "decoder_sparse_step"),
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "rope_dim": ("qk_rope_head_dim",),
    "nope_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "window": ("sliding_window",),
    "use_window": ("use_sliding_window",),
    "layer_types": ("layer_types",),
    "window_pattern": ("sliding_window_pattern",),
    "dtype": ("torch_dtype", "dtype"),
    "tied": ("tie_word_embeddings",),
    "context": ("max_position_embeddings",),
    "params": ("num_parameters",),  # slimjax's own: P, when the count is known
    "text_config": ("text_config",),
    "quantization": ("quantization_config",),
}
READ_KEYS = (*(k for names in HF_KEYS.values() for k in names), "config", "aliases", "source")


def _key(cfg: Mapping, concept: str) -> str:
    """The config key that gives ``concept``: the first of its names present, else its first name."""
    names = HF_KEYS[concept]
    return next((k for k in names if cfg.get(k) is not None), names[0])


def _hf(cfg: Mapping, concept: str, default=None):
    """The value of ``concept`` in ``cfg`` (its first name present), else ``default``."""
    value = cfg.get(_key(cfg, concept))
    return default if value is None else value


def _hf_positive(cfg: Mapping, concept: str, field: str) -> float:
    return _positive(cfg, _key(cfg, concept), field)


def _gated_ffn_matrices(cfg: Mapping, model_type: str, field: str) -> float:
    """n_ffn: 3 for a gated FFN, 2 for two plain matrices (given, or by family, or by activation)."""
    if _hf(cfg, "n_ffn") is not None:
        n_ffn = _hf_positive(cfg, "n_ffn", field)
        if n_ffn not in (2.0, 3.0):
            raise SlimjaxError(f"{field}.n_ffn", f"must be 2 or 3, got {cfg['n_ffn']!r}")
        return n_ffn
    if model_type in _UNGATED_MODEL_TYPES:
        return 2.0
    if not model_type and str(_hf(cfg, "activation", "")).lower() in {"relu", "gelu_new"}:
        return 2.0
    return 3.0


def _experts(cfg: Mapping, model_type: str, L: float, D_ff: float) -> dict:
    """Mixture of experts (§4b): whether, the active FFN width, expert counts and the MoE layer count."""
    top_k, n_experts = _hf(cfg, "top_k"), _hf(cfg, "experts")
    moe = top_k is not None and n_experts is not None
    d_expert = float(_hf(cfg, "expert_ffn") or D_ff)
    n_shared = float(_hf(cfg, "shared_experts") or _SHARED_EXPERTS_BY_TYPE.get(model_type, 0))
    parallel_dense = D_ff if moe and _hf(cfg, "parallel_dense") and _hf(cfg, "expert_ffn") else 0.0
    k_dense = float(_hf(cfg, "dense_first") or 0) if moe else 0.0
    step = float(_hf(cfg, "moe_step") or 1) if moe else 1.0
    L_moe = (len(range(0, int(L - k_dense), int(step))) if step > 1 else L - k_dense) if moe else 0.0
    active = float(top_k) * d_expert + n_shared * d_expert + parallel_dense if moe else D_ff
    return dict(
        moe=moe, top_k=top_k, n_experts=n_experts, d_expert=d_expert, n_shared=n_shared,
        parallel_dense=parallel_dense, L_moe=L_moe, active_ffn=active,
    )  # fmt: skip


def _sliding(cfg: Mapping, model_type: str, L: float, field: str) -> tuple[float, float]:
    """(W, L_s): the window and how many of the L layers use it (inf, 0 without one)."""
    window = _hf(cfg, "window")
    if not window or _hf(cfg, "use_window", True) is False:
        return math.inf, 0.0
    window = _hf_positive(cfg, "window", field)
    layer_types, pattern = _hf(cfg, "layer_types"), _hf(cfg, "window_pattern")
    if layer_types:
        if len(layer_types) != int(L):
            raise SlimjaxError(f"{field}.layer_types", f"has {len(layer_types)} entries for {int(L)} layers")
        return window, float(sum("sliding" in str(t) for t in layer_types))
    if pattern:
        return window, L - L // _hf_positive(cfg, "window_pattern", field)
    if model_type == "gemma2":
        return window, L - L // 2  # even layers are local in Gemma-2
    return window, L


def _attention_params(cfg: Mapping, D, H_q, H_kv, d_h, d_c, d_R, mla: bool) -> float:
    """Attention weights per layer: Q, K, V, O (MLA: the latent down/up projections and the rope part)."""
    if not mla:
        return 2 * D * H_q * d_h + 2 * D * H_kv * d_h
    nope = float(_hf(cfg, "nope_dim") or d_h)
    v_head = float(_hf(cfg, "v_head_dim") or d_h)
    q_rank = _hf(cfg, "q_lora_rank")
    q_proj = (D * q_rank + q_rank * H_q * (nope + d_R)) if q_rank else D * H_q * (nope + d_R)
    return q_proj + D * (d_c + d_R) + d_c * H_q * (nope + v_head) + H_q * v_head * D


def model_from_hf(config: Mapping, field: str = "model") -> dict:
    """ModelSpec fields (floats, base units) from a Hugging Face config dict (MODEL.md §0), read through
    :data:`HF_KEYS`.

    Multimodal configs are read from their ``text_config``. MoE: D_ff is the active width
    (experts per token × expert FFN size + shared experts). ``num_parameters`` and ``n_ffn``
    may be given beside the HF keys; without ``num_parameters`` P is derived (§0; for MoE
    and MLA configs by the same counting extended to all experts and the latent projections).
    """
    if not isinstance(config, Mapping):
        raise SlimjaxError(field, f"must be a mapping of Hugging Face config keys, got {config!r}")
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), Mapping):
        extra = {k: cfg[k] for k in ("num_parameters", "n_ffn") if k in cfg}
        cfg = {**cfg["text_config"], **extra}
    model_type = str(_hf(cfg, "model_type", "")).lower()

    L = _hf_positive(cfg, "layers", field)
    D = _hf_positive(cfg, "hidden", field)
    H_q = _hf_positive(cfg, "heads", field)
    H_kv = _hf_positive(cfg, "kv_heads", field) if _hf(cfg, "kv_heads") is not None else H_q
    if H_q % H_kv:
        raise SlimjaxError(
            f"{field}.num_key_value_heads",
            f"num_attention_heads ({int(H_q)}) must be divisible by num_key_value_heads ({int(H_kv)})",
        )
    if _hf(cfg, "head_dim") is None and D % H_q:
        raise SlimjaxError(
            f"{field}.num_attention_heads", f"{int(H_q)} heads do not divide hidden_size {int(D)}; give head_dim"
        )
    d_h = _hf_positive(cfg, "head_dim", field) if _hf(cfg, "head_dim") is not None else D / H_q
    if _hf(cfg, "ffn") is None:
        raise SlimjaxError(
            f"{field}.intermediate_size", "missing (OPT configs call it ffn_dim); needed to build the model"
        )
    D_ff = _hf_positive(cfg, "ffn", field)
    V = _hf_positive(cfg, "vocab", field)
    n_ffn = _gated_ffn_matrices(cfg, model_type, field)
    moe = _experts(cfg, model_type, L, D_ff)

    mla = _hf(cfg, "kv_lora_rank") is not None  # multi-head latent attention
    d_c = _hf_positive(cfg, "kv_lora_rank", field) if mla else 0.0
    d_R = _hf_positive(cfg, "rope_dim", field) if mla else 0.0
    window, L_s = _sliding(cfg, model_type, L, field)

    b_w = b_kv = dtype_bytes(_hf(cfg, "dtype"), f"{field}.torch_dtype")  # KV stays at the model's dtype
    tied = bool(cfg.get(_key(cfg, "tied"), True))  # HF's default when the key is absent
    attn = _attention_params(cfg, D, H_q, H_kv, d_h, d_c, d_R, mla)
    embeddings = V * D * (1 if tied else 2)
    if _hf(cfg, "params") is not None:
        P = _hf_positive(cfg, "params", field)
    else:
        if moe["moe"]:  # MoE layers: routed + shared experts (+ a parallel dense MLP); the other layers dense
            L_moe, experts = moe["L_moe"], (float(moe["n_experts"]) + moe["n_shared"]) * moe["d_expert"]
            ffn_total = n_ffn * D * (L_moe * (experts + moe["parallel_dense"]) + (L - L_moe) * D_ff)
        else:
            ffn_total = L * n_ffn * D * D_ff
        P = embeddings + L * attn + ffn_total
        if model_type == "opt":
            P += float(_hf(cfg, "context", 0)) * D  # learned positions
    if isinstance(_hf(cfg, "quantization"), Mapping):
        b_w = _quantized_bytes_per_weight(
            cfg["quantization_config"], P, embeddings, L * attn, b_w, f"{field}.quantization_config"
        )
    on = moe["moe"]
    return dict(
        n_layers=L,
        hidden=D,
        n_heads=H_q,
        n_kv_heads=H_kv,
        head_dim=d_h,
        ffn_dim=moe["active_ffn"],
        n_ffn=n_ffn,
        vocab=V,
        n_params=P,
        bytes_per_weight=b_w,
        kv_dtype_bytes=b_kv,
        window=float(window),
        n_sliding_layers=L_s,
        mla=1.0 if mla else 0.0,
        moe=1.0 if on else 0.0,
        kv_lora_rank=d_c,
        rope_dim=d_R,
        qk_nope_dim=float(_hf(cfg, "nope_dim") or d_h) if mla else 0.0,
        v_head_dim=float(_hf(cfg, "v_head_dim") or d_h) if mla else 0.0,
        n_experts=float(moe["n_experts"]) if on else 0.0,
        experts_per_token=float(moe["top_k"]) if on else 0.0,
        expert_ffn_dim=moe["d_expert"] if on else 0.0,
        n_moe_layers=float(moe["L_moe"]),
        max_context=float(cfg["max_position_embeddings"]) if _hf(cfg, "context") else math.inf,
    )


def _check_spelling(body: Mapping, field: str) -> None:
    import difflib

    for key in body:
        if key in READ_KEYS:
            continue
        close = difflib.get_close_matches(str(key), READ_KEYS, n=1, cutoff=0.85)
        if close:
            raise SlimjaxError(f"{field}.{key}", f"unknown key; did you mean {close[0]!r}?")


def _read_json(path: Path, field: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise SlimjaxError(field, f"{str(path)!r} is not valid JSON ({e})") from None
    except OSError as e:
        raise SlimjaxError(field, f"cannot read {str(path)!r} ({e.strerror})") from None


def resolve_model(entry: Any, field: str = "model", base_dir: Path | None = None) -> tuple[str, dict]:
    """(label, ModelSpec fields) for a catalog name, a config.json path, or an inline mapping.

    Inline: ``{name: LABEL, <HF keys>...}``; or ``{name: LABEL, config: PATH, <overrides>}``. (A study file's
    entries go through :func:`slimjax.inputs.serving.resolve_study_model`, which names serving keys given here.)
    """
    if isinstance(entry, str):
        path = Path(entry) if base_dir is None or Path(entry).is_absolute() else base_dir / entry
        if entry.endswith(".json") or (path.is_file()):
            if not path.is_file():
                raise SlimjaxError(field, f"config file {entry!r} not found")
            label = path.name.removesuffix(".json").removesuffix("_config").removesuffix("config").rstrip("_-") or entry
            return label, model_from_hf(_read_json(path, field), field)
        name, row = _lookup(entry, model_catalog(), field, "model")
        return name, model_from_hf(row, f"{field} ({name})")
    if isinstance(entry, Mapping):
        if not entry.get("name"):
            raise SlimjaxError(f"{field}.name", "an inline model needs a name")
        body = {k: v for k, v in entry.items() if k != "name"}
        if "config" in body:
            overrides = [k for k in body if k not in READ_KEYS]
            if overrides:  # beside a config file, every key is an override of a field the reader uses
                raise SlimjaxError(
                    f"{field}.{overrides[0]}",
                    "unknown key beside config: not a model field the reader "
                    f"uses{suggest(str(overrides[0]), READ_KEYS)}",
                )
            path = Path(body.pop("config"))
            if base_dir is not None and not path.is_absolute():
                path = base_dir / path
            if not path.is_file():
                raise SlimjaxError(f"{field}.config", f"config file {str(path)!r} not found")
            body = {**_read_json(path, f"{field}.config"), **body}
        _check_spelling(body, field)
        return str(entry["name"]), model_from_hf(body, field)
    raise SlimjaxError(field, f"must be a catalog name, a config.json path or a mapping, got {entry!r}")


# words that end a published checkpoint's id and say how it was quantized or tuned, not which architecture it is:
# a bit width (the weights' precision), a method (its usual width, unless a bit width is given too), or a variant
_PRECISION_WORDS = {"fp8": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "fp4": "fp4", "int8": "int8", "int4": "int4"}
_METHOD_WORDS = {"awq": "int4", "gptq": "int4", "bnb": "int4", "4bit": "int4", "8bit": "int8"}
_VARIANT_WORDS = ("instruct", "chat", "it", "hf", "base", "dynamic", "static", "block", "quantized", "kv")
_TUNING_WORDS = ("instruct", "chat", "hf")  # dropped wherever they stand ("Mixtral-8x7B-Instruct-v0.1")


def _checkpoint_words(name: str) -> tuple[str, str | None]:
    """(the id's architecture part, normalised; the weight precision its suffixes name, or None)."""
    import re

    words = [w for w in re.split(r"[-_\s]+|\.(?!\d)", str(name).rsplit("/", 1)[-1].lower()) if w]
    width = method = None
    while len(words) > 1:
        w = words[-1]
        if w in _PRECISION_WORDS or re.fullmatch(r"w\d+a\d+", w):
            width = width or _PRECISION_WORDS.get(w) or ("int4" if w.startswith("w4") else "int8")
        elif w in _METHOD_WORDS:
            method = method or _METHOD_WORDS[w]
        elif w not in _VARIANT_WORDS:
            break
        words.pop()
    words = [w for w in words if w not in _TUNING_WORDS] or words
    return re.sub(r"[^a-z0-9.]", "", "".join(words)), width or method


def resolve_checkpoint(name: str, field: str = "traces.model") -> tuple[str, str | None]:
    """(catalog model, weight precision label or None) for a checkpoint id as benchmark outputs write it: a catalog
    name or alias; else its organisation prefix and its quantization and variant suffixes dropped
    (``nvidia/Llama-3.1-8B-Instruct-FP8`` → Llama-3.1-8B at fp8; ``nvidia/Qwen3-32B-NVFP4`` → Qwen3-32B at nvfp4;
    ``…-AWQ``/``-GPTQ`` at int4 unless a width is given) and matched against the catalog's names and aliases reduced
    alike. An unknown id is an error with the nearest names and where to add it; one matching several, naming them."""
    table = model_catalog()
    try:
        return _lookup(str(name), table, field, "model")[0], _checkpoint_words(name)[1]
    except SlimjaxError as unknown:
        key, precision = _checkpoint_words(name)
        hits = {m for m, row in table.items() if key in {_checkpoint_words(a)[0] for a in [m, *row.get("aliases", [])]}}
        if len(hits) > 1:
            raise SlimjaxError(
                field,
                f"checkpoint {name!r} could mean {', '.join(sorted(hits))}; add it as an alias "
                "of one in configs/models.yaml",
            ) from None
        if not hits:
            raise unknown from None
        return hits.pop(), precision


# ------------------------------------------------------------------------------------------ GPUs


def required_positive(row: Mapping, key: str, field: str) -> float:
    """A GPU key every entry must give, > 0."""
    if row.get(key) is None:
        raise SlimjaxError(f"{field}.{key}", "missing")
    return checked_number(row[key], f"{field}.{key}", lambda v: v > 0, "a positive number", kind="a positive number")


def optional_positive(row: Mapping, key: str, field: str) -> float:
    """A GPU key an entry may leave out (or null): 0 (no such figure), else > 0."""
    return 0.0 if row.get(key) is None else positive_number(row[key], f"{field}.{key}")


def _price(row: Mapping, key: str, field: str) -> float:
    value = row.get(key, 0.0)  # no price: 0 (a study asks for one); a price may be 0 (owned hardware)
    if value is None:
        raise SlimjaxError(f"{field}.{key}", "missing")
    return checked_number(value, f"{field}.{key}", lambda v: v >= 0, "a positive number", kind="a positive number")


def _latency(row: Mapping, key: str, field: str) -> float:
    value = row.get(key, DEFAULT_ALLREDUCE_LATENCY_US)
    return checked_number(value, f"{field}.{key}", lambda v: v >= 0, "non-negative")


def require_network(name: str, row: Mapping, field: str, what: str = "pipeline stages pass activations") -> None:
    """Pipeline stages and disaggregated KV transfers cross the scale-out network (MODEL.md §10): a GPU without a
    ``network_gbs`` figure cannot take them, and the error says where to add it."""
    if not row["network_bytes_per_s"] > 0:
        raise SlimjaxError(
            field,
            f"{what} over the network, but {name} has no network_gbs; add it to its entry in configs/gpus.yaml "
            "(or the inline GPU)",
        )


def _gpus_per_node(row: Mapping, key: str, field: str) -> float:
    return positive_number(row.get(key, DEFAULT_GPUS_PER_NODE), f"{field}.{key}", integer=True)


def _network_latency(row: Mapping, key: str, field: str) -> float:
    value = row.get(key, DEFAULT_NETWORK_LATENCY_US)
    return checked_number(value, f"{field}.{key}", lambda v: v >= 0, "non-negative")


def _topology(row: Mapping, field: str) -> str:
    value = row.get("link_topology", "switch")
    if value not in constants.LINK_TOPOLOGIES:
        raise SlimjaxError(
            f"{field}.link_topology", f"must be one of {', '.join(constants.LINK_TOPOLOGIES)}, got {value!r}"
        )
    return value


def _link_figure(row: Mapping, key: str, field: str) -> float:
    """The link figure in GB/s: ``interconnect_gbs`` per GPU (switch, PCIe) or ``link_gbs`` per peer (mesh)."""
    if _topology(row, field) == "mesh":
        if row.get(key) is not None:
            raise SlimjaxError(
                f"{field}.{key}",
                "a mesh GPU gives its per-peer link as link_gbs (BW_link(n) = (n − 1)·link_gbs, MODEL.md §4c), "
                "not a per-GPU figure",
            )
        if row.get("link_gbs") is None:
            raise SlimjaxError(f"{field}.link_gbs", "link_topology: mesh needs link_gbs, one peer link's GB/s")
        return positive_number(row["link_gbs"], f"{field}.link_gbs")
    if row.get("link_gbs") is not None:
        raise SlimjaxError(
            f"{field}.link_gbs",
            f"link_gbs is a mesh's per-peer link; a {_topology(row, field)} GPU's figure is {key} (per GPU)",
        )
    return optional_positive(row, key, field)


def _is_mesh(row: Mapping, key: str, field: str) -> float:
    return float(_topology(row, field) == "mesh")


def _link_efficiency(row: Mapping, key: str, field: str) -> float:
    value = row.get(key, 1.0)
    return checked_number(value, f"{field}.{key}", lambda v: 0 < v <= 1, "in (0, 1]")


@dataclasses.dataclass(frozen=True)
class GPUField:
    """One row of the GPU table: a catalog key (catalog units) read into a GPUSpec field (base units)."""

    key: str  # in configs/gpus.yaml and inline GPU entries
    field: str  # on GPUSpec
    scale: float  # base units per catalog unit
    read: Callable[[Mapping, str, str], float]  # (row, key, where) -> value in catalog units, checked
    help: str


GPU_FIELDS: dict[str, GPUField] = {}


def register_gpu_field(row: GPUField) -> GPUField:
    """Add a GPU key: every catalog and inline GPU is read through it and GPUSpec gets ``row.field``."""
    if row.key in GPU_FIELDS or any(r.field == row.field for r in GPU_FIELDS.values()):
        raise ValueError(f"GPU key {row.key!r} (field {row.field!r}) is already in the table")
    GPU_FIELDS[row.key] = row
    return row


for _row in (
    GPUField("tflops", "flops_per_s", 1e12, required_positive, "dense bf16 peak F_max, TFLOP/s"),
    GPUField("bandwidth_tbs", "bandwidth_bytes_per_s", 1e12, required_positive, "memory bandwidth BW_max, TB/s"),
    GPUField("memory_gib", "memory_bytes", 2.0**30, required_positive, "memory M_VRAM, GiB"),
    GPUField("price_per_hour", "price_per_hour", 1.0, _price, "illustrative $/GPU-hour"),
    # low-precision dense Tensor Core peaks (checkpoints quantized to that precision; 0: none)
    GPUField("fp8_tflops", "flops_fp8_per_s", 1e12, optional_positive, "dense FP8 peak, TFLOP/s"),
    GPUField("fp4_tflops", "flops_fp4_per_s", 1e12, optional_positive, "dense FP4 peak, TFLOP/s"),
    # tensor-parallel link (MODEL.md §4c; 0: no figure, no cost)
    GPUField("interconnect_gbs", "link_bytes_per_s", 1e9, _link_figure, "link per direction, GB/s (mesh: link_gbs)"),
    GPUField("link_topology", "link_mesh", 1.0, _is_mesh, "switch | mesh | pcie (1: mesh)"),
    GPUField("link_efficiency", "link_efficiency", 1.0, _link_efficiency, "achieved fraction of nominal link η_link"),
    GPUField("allreduce_latency_us", "allreduce_latency_s", 1e-6, _latency, "latency τ per all-reduce, µs"),
    # nodes and the scale-out network (MODEL.md §10): pipeline stages across nodes, KV transfer between pools
    GPUField("gpus_per_node", "gpus_per_node", 1.0, _gpus_per_node, "GPUs per node (NVLink domain; default 8)"),
    GPUField("network_gbs", "network_bytes_per_s", 1e9, optional_positive, "scale-out NIC per GPU, GB/s"),
    GPUField("network_latency_us", "network_latency_s", 1e-6, _network_latency, "latency τ_net per transfer, µs"),
):
    register_gpu_field(_row)

# NCCL's measured collectives per group size (docs/collectives.md): an entry's ``allreduce`` and ``alltoall`` blocks,
# {n: {key: value}} with these keys (catalog units), read into GPUSpec's {op}_n{n}_* fields (0: not measured; the
# link or network line serves)
ALLREDUCE_KEYS = {
    "small_us": ("small_latency_s", 1e-6, "small-message protocol latency τ_s, µs"),
    "small_gbs": ("small_bytes_per_s", 1e9, "small-message protocol algorithm bandwidth B_s, GB/s"),
    "switch_mib": ("switch_bytes", 2.0**20, "message size S from which NCCL runs the large protocol, MiB"),
    "large_us": ("large_latency_s", 1e-6, "large-message protocol latency τ_l, µs"),
    "large_gbs": ("large_bytes_per_s", 1e9, "large-message protocol algorithm bandwidth B_l, GB/s"),
}
COLLECTIVE_WORDS = {"allreduce": "all-reduce", "alltoall": "all-to-all"}  # per MEASURED_COLLECTIVES entry


def _collective_block(row: Mapping, op: str, n: int, field: str) -> Mapping:
    block = row.get(op) or {}
    if not isinstance(block, Mapping):
        raise SlimjaxError(f"{field}.{op}", f"must be a mapping of GPU counts to protocol lines, got {block!r}")
    extra = [k for k in block if k not in ("nccl", "source") and str(k) not in map(str, MEASURED_LINK_DEGREES)]
    if extra:
        raise SlimjaxError(
            f"{field}.{op}.{extra[0]}",
            f"GPU counts measured may be {', '.join(map(str, MEASURED_LINK_DEGREES))} (besides nccl, source)",
        )
    at = block.get(n, block.get(str(n)))
    if at is None:
        return {}
    missing = [k for k in ALLREDUCE_KEYS if k not in at]
    unknown = [k for k in at if k not in ALLREDUCE_KEYS]
    if missing or unknown:
        bad = (missing or unknown)[0]
        raise SlimjaxError(
            f"{field}.{op}.{n}.{bad}",
            f"{'missing' if missing else 'unknown key'}; a measured {COLLECTIVE_WORDS[op]} gives "
            f"{', '.join(ALLREDUCE_KEYS)}",
        )
    return at


def _collective_reader(op: str, n: int, key: str) -> Callable[[Mapping, str, str], float]:
    def read(row: Mapping, _key: str, field: str) -> float:
        at = _collective_block(row, op, n, field)
        return positive_number(at[key], f"{field}.{op}.{n}.{key}") if at else 0.0

    return read


for _row in (
    GPUField(
        f"{op}.{n}.{key}",
        collective_field(op, n, part),
        scale,
        _collective_reader(op, n, key),
        f"measured {COLLECTIVE_WORDS[op]} on {n} GPUs: {words}",
    )
    for op in MEASURED_COLLECTIVES
    for n in MEASURED_LINK_DEGREES
    for key, (part, scale, words) in ALLREDUCE_KEYS.items()
):
    register_gpu_field(_row)
# keys of an entry that are not specs of their own (link_gbs: a mesh's link figure, read as interconnect_gbs' field;
# allreduce, alltoall: the nested blocks the {op}.* rows read)
_GPU_META = ("name", "aliases", "vendor", "source", "link_source", "link_gbs", "network_source", *MEASURED_COLLECTIVES)


def gpu_from_row(row: Mapping, field: str = "gpu") -> dict:
    """GPUSpec fields in base units from catalog units, through the GPU table (:data:`GPU_FIELDS`)."""
    unknown = set(row) - set(GPU_FIELDS) - set(_GPU_META)
    if unknown:
        raise SlimjaxError(
            f"{field}.{sorted(unknown)[0]}",
            f"unknown GPU key; expected {', '.join((*GPU_FIELDS, *_GPU_META))}",
        )
    return {r.field: r.read(row, r.key, field) * r.scale for r in GPU_FIELDS.values()}


def gpu_vendor(name: str) -> str | None:
    """A catalog GPU's ``vendor`` (None for a name the catalog lacks, or an entry without one)."""
    return gpu_catalog().get(str(name), {}).get("vendor")


def resolve_gpu(entry: Any, field: str = "gpu") -> tuple[str, dict]:
    if isinstance(entry, str):
        name, row = _lookup(entry, gpu_catalog(), field, "GPU")
        return name, gpu_from_row(row, f"{field} ({name})")
    if isinstance(entry, Mapping):
        if not entry.get("name"):
            raise SlimjaxError(f"{field}.name", "an inline GPU needs a name")
        return str(entry["name"]), gpu_from_row(entry, field)
    raise SlimjaxError(field, f"must be a catalog name or a mapping, got {entry!r}")
