"""Engine profiles (configs/engines.yaml): the serving defaults in which vLLM, SGLang and TensorRT-LLM differ — KV
policy, block size, step budget, chunk size, whether prompt steps run alone — each value with where the engine sets
it. A study's serving key ``engine`` names one (``vllm``, ``SGLang``, ``tensorrt-llm@1.0.0rc3`` …); the settings it
leaves out come from the profile, for the GPU it runs on (some defaults depend on the GPU's memory). An engine the
catalog does not list runs as ``generic`` (MODEL.md §9's defaults), and its label says so.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping

from ..errors import SlimjaxError
from .catalog import config_yaml, normalised_hardware

GENERIC = "generic"
# the serving keys in which engines differ: what a profile sets and what a study's `settings` axis varies
ENGINE_SETTING_KEYS = (
    "step_tokens",
    "chunk_size",
    "block_size",
    "kv_policy",
    "kv_watermark",
    "prefill_first",
    "prefix_cache",
)
# what a study's `settings` axis may vary besides them: the group's layout (docs/layouts.md), as the engines' launch
# flags set it (SGLang --dp/--ep, vLLM --data-parallel-size/--enable-expert-parallel, TensorRT-LLM's moe_*_size)
LAYOUT_KEYS = ("dp", "ep", "moe_tp")  # a layout beyond its TP degree (one stage): the ranks and the experts' split
LAYOUT_SETTING_KEYS = (*LAYOUT_KEYS, "expert_imbalance", "dispatch_dtype")
# and speculative decoding (docs/speculative.md): a `speculative` block per candidate, on or off
SPECULATIVE_SETTING_KEYS = ("speculative",)
CANDIDATE_SETTING_KEYS = (*ENGINE_SETTING_KEYS, *LAYOUT_SETTING_KEYS, *SPECULATIVE_SETTING_KEYS)


def setting_text(value) -> str:
    """A candidate setting's value as a label reads it: a mapping as its values (``mtp 1 1.8``), off as ``off``."""
    if value is None or value is False:
        return "off"
    if isinstance(value, Mapping):
        return " ".join(str(v) for v in value.values())
    return str(value)


@functools.cache
def engine_catalog() -> dict[str, dict]:
    """configs/engines.yaml's engines, by catalog key."""
    return config_yaml("engines.yaml")["engines"]


def _normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def version_key(version: str | None) -> tuple[int, ...]:
    """A version's leading numbers for ordering (``1.0.0rc3`` → (1, 0, 0)); () for none."""
    return tuple(int(x) for x in re.findall(r"\d+", str(version or ""))[:3])


@dataclasses.dataclass(frozen=True)
class EngineProfile:
    """A resolved ``engine`` value: the catalog entry it names (``generic`` when none), the version given, and the
    name as given."""

    key: str
    given: str
    version: str | None = None

    @property
    def known(self) -> bool:
        return self.key != GENERIC or _normalised(self.given) == GENERIC

    @property
    def label(self) -> str:
        """What every output says about the engine."""
        entry = engine_catalog()[self.key]
        at = f" {self.version}" if self.version else ""
        if self.known:
            return f"{entry['name']}{at}"
        return f"{self.given}{at}: not in configs/engines.yaml, run with the generic defaults (MODEL.md §9)"

    def settings(self, gpu: str, gpu_fields: Mapping) -> dict[str, object]:
        """The profile's serving settings on GPU ``gpu`` (catalog fields ``gpu_fields``), in the keys' units."""
        memory_gib = float(gpu_fields.get("memory_bytes", 0.0)) / 2**30
        out = {}
        for key, setting in engine_catalog()[self.key]["settings"].items():
            out[key] = _value(setting, gpu, memory_gib, self.version)
        return out

    def sources(self) -> dict[str, str]:
        """Where the engine sets each value (the catalog's ``source`` per setting)."""
        settings = engine_catalog()[self.key]["settings"]
        return {k: s.get("source", "") if isinstance(s, Mapping) else "" for k, s in settings.items()}


def _value(setting, gpu: str, memory_gib: float, version: str | None):
    """One setting's value on a GPU of ``memory_gib`` (its thresholds, exceptions and ``since``)."""
    if not isinstance(setting, Mapping):
        return setting
    value = setting["value"]
    since = setting.get("since")
    if since is not None and version is not None and version_key(version) < version_key(since):
        return value
    name = normalised_hardware(gpu).replace(" ", "")
    if any(_normalised(x) in name for x in setting.get("except_gpus", ())):
        return value
    for threshold, v in sorted((float(t), v) for t, v in (setting.get("gpu_memory_gib") or {}).items()):
        if memory_gib >= threshold:
            value = v
    return value


def resolve_engine(value, field: str = "serving.engine") -> EngineProfile:
    """An ``engine`` value (a name, optionally ``name@version`` or ``name version``) as its profile: the catalog
    entry whose key or alias it names after normalising, else ``generic`` (labelled as unknown)."""
    if not isinstance(value, str) or not value.strip():
        raise SlimjaxError(field, f"must name an engine (one of {', '.join(engine_catalog())}), got {value!r}")
    name, *rest = re.split(r"[@\s]+", value.strip(), maxsplit=1)
    version = rest[0] if rest and rest[0] else None
    wanted = _normalised(name)
    for key, entry in engine_catalog().items():
        if wanted in {_normalised(key), *(_normalised(a) for a in entry.get("aliases", ()))}:
            return EngineProfile(key, name, version)
    return EngineProfile(GENERIC, name, version)


def engine_table_markdown() -> str:
    """configs/engines.yaml as a Markdown table (engine × setting, the value on an 80 GiB GPU), for docs/engines.md
    (checked by the tests, so it cannot go stale)."""
    keys = sorted({k for e in engine_catalog().values() for k in e["settings"]})
    lines = ["| engine | " + " | ".join(f"`{k}`" for k in keys) + " |", "|---|" + "---|" * len(keys)]
    for key, entry in engine_catalog().items():
        cells = []
        for k in keys:
            s = entry["settings"].get(k)
            if s is None:
                cells.append("—")
                continue
            base = s["value"] if isinstance(s, Mapping) else s
            steps = (s.get("gpu_memory_gib") or {}) if isinstance(s, Mapping) else {}
            text = f"{base}" + "".join(f"; ≥ {t} GiB: {v}" for t, v in steps.items())
            if isinstance(s, Mapping) and s.get("except_gpus"):
                text += f" (not {', '.join(s['except_gpus'])})"
            cells.append(text)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def engine_settings(value, field: str = "settings") -> tuple[tuple[str, dict], ...]:
    """A study's ``settings`` axis: a list of mappings of :data:`CANDIDATE_SETTING_KEYS` (each a candidate engine
    configuration applied over the study's serving block), as (label, settings) pairs; () where none is given. The
    label names the values (``step_tokens 256, chunk_size 256``); values are checked where the serving block is
    read (named ``settings[i].key``)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not value:
        raise SlimjaxError(field, f"must be a non-empty list of mappings of {', '.join(CANDIDATE_SETTING_KEYS)}")
    out, seen = [], {}
    for i, entry in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(entry, Mapping) or not entry:
            raise SlimjaxError(
                where, f"must be a non-empty mapping of {', '.join(CANDIDATE_SETTING_KEYS)}, got {entry!r}"
            )
        bad = [k for k in entry if k not in CANDIDATE_SETTING_KEYS]
        if bad:
            raise SlimjaxError(
                f"{where}.{bad[0]}", f"not an engine or layout setting; one of {', '.join(CANDIDATE_SETTING_KEYS)}"
            )
        label = ", ".join(f"{k} {setting_text(entry[k])}" for k in CANDIDATE_SETTING_KEYS if k in entry)
        if label in seen:
            raise SlimjaxError(where, f"repeats {field}[{seen[label]}] ({label})")
        seen[label] = i
        out.append((label, dict(entry)))
    return tuple(out)
