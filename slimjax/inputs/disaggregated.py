"""Disaggregated deployments (MODEL.md §10): a prefill pool and a decode pool, each a replica group of its own GPU,
TP and pipeline degree, the KV moved between them over the network (or NVLink inside one node).

A file's ``disaggregated`` block is a list of candidates::

    disaggregated:
      - prefill: {gpu: H100-SXM, tp: 2, pp: 1, replicas: 2}
        decode: {gpu: H200, tp: 1, dp: 8, ep: 8, batch: 256, replicas: 1}
        transfer: network          # or nvlink (both pools inside one node of the same GPU)

Each pool's serving settings are the file's ``serving`` block resolved for its (model, GPU), with n_gpu = tp and
pp as given (:func:`slimjax.inputs.studyfile.serving_per_group`), and its own layout (docs/layouts.md: ``dp``,
``ep``, ``moe_tp`` over the block's; a replica group is tp·pp·dp GPUs, its batch dealt over its pp·dp engines).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SlimjaxError, suggest
from ..model.specs import ServingSpec
from . import catalog
from .checks import positive_number
from .engines import LAYOUT_KEYS
from .serving import with_calibrated_links
from .studyfile import setting_blocks

TRANSFERS = ("network", "nvlink")
POOLS = {
    "prefill": ("gpu", "tp", "pp", "replicas", *LAYOUT_KEYS),  # a pool's own layout over the serving block's
    "decode": ("gpu", "tp", "pp", "batch", "replicas", *LAYOUT_KEYS),
}


@dataclasses.dataclass(frozen=True, eq=False)
class Pool:
    """One pool of a deployment: its GPU (label, spec fields), TP and pipeline degrees, replicas, batch limit
    (decode; +inf for prefill, which admits by KV alone), and serving per model (leaves (M,))."""

    gpu: str
    gpu_row: dict
    tp: int
    pp: int
    replicas: int
    batch: float
    serving: ServingSpec
    serving_table: dict
    layout: tuple = ()  # the pool's own layout keys, (key, value) pairs

    @property
    def dp(self) -> int:
        """Attention data-parallel ranks of a replica group (docs/layouts.md)."""
        return int(dict(self.layout).get("dp", 1))

    @property
    def gpus(self) -> int:
        """GPUs of one replica group, n = n_tp · n_pp · D."""
        return self.tp * self.pp * self.dp

    @property
    def rank_gpus(self) -> int:
        """GPUs of one attention rank, n_tp · n_pp: where a request's KV lives."""
        return self.tp * self.pp

    @property
    def engines(self) -> int:
        """Engines of a replica group, n_pp · D (its arrivals dealt round robin over them)."""
        return self.pp * self.dp

    def label(self, sized: bool = False) -> str:
        """``2×H100-SXM tp2 B64``; without the replica count where a study sizes it."""
        shape = f"tp{self.tp}" + (f"×pp{self.pp}" if self.pp > 1 else "")
        shape += "".join(f" {k}{v:g}" for k, v in self.layout)
        batch = f" B{int(self.batch)}" if np.isfinite(self.batch) else ""
        return f"{'' if sized else f'{self.replicas}×'}{self.gpu} {shape}{batch}"


@dataclasses.dataclass(frozen=True, eq=False)
class Deployment:
    prefill: Pool
    decode: Pool
    transfer: str

    def label(self, sized: bool = False) -> str:
        return f"prefill {self.prefill.label(sized)} | decode {self.decode.label(sized)} | {self.transfer}"


def _pool(value: Any, kind: str, field: str, models, serving_value, max_tokens, per_group) -> Pool:
    if not isinstance(value, Mapping):
        raise SlimjaxError(field, f"must be a mapping of {', '.join(POOLS[kind])}, got {value!r}")
    bad = [k for k in value if k not in POOLS[kind]]
    if bad:
        raise SlimjaxError(f"{field}.{bad[0]}", f"unknown key{suggest(str(bad[0]), POOLS[kind])}")
    if "gpu" not in value:
        raise SlimjaxError(f"{field}.gpu", "missing")
    if kind == "decode" and "batch" not in value:
        raise SlimjaxError(f"{field}.batch", "missing: the decode pool's batch limit B_d")
    gpu = catalog.resolve_gpu(value["gpu"], f"{field}.gpu")
    tp = int(positive_number(value.get("tp", 1), f"{field}.tp", integer=True))
    pp = int(positive_number(value.get("pp", 1), f"{field}.pp", integer=True))
    replicas = int(positive_number(value.get("replicas", 1), f"{field}.replicas", integer=True))
    batch = positive_number(value["batch"], f"{field}.batch", integer=True) if kind == "decode" else np.inf
    layout = tuple((k, value[k]) for k in LAYOUT_KEYS if k in value)
    names = [*(m for m, _ in models), gpu[0]]
    block = setting_blocks(serving_value, ((field, dict(layout)),), names, field)[0] if layout else serving_value
    serving, table = per_group(block, models, [gpu], np.array([float(tp)]), np.array([float(pp)]), max_tokens)
    gpus = with_calibrated_links([gpu], [value["gpu"]], table)
    flat = ServingSpec(**{k: np.asarray(v, float).reshape(len(models)) for k, v in serving.fields().items()})
    return Pool(gpus[0][0], gpus[0][1], tp, pp, replicas, float(batch), flat, table, layout)


def parse_deployments(value: Any, models, serving_value, max_tokens: float, per_group) -> list[Deployment]:
    """The ``disaggregated`` list: each candidate's pools resolved (``per_group``: how the file resolves serving
    per (model, GPU, tp, pp)); errors name the field."""
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise SlimjaxError("disaggregated", f"must be a non-empty list of deployments, got {value!r}")
    out = []
    for i, block in enumerate(value):
        field = f"disaggregated[{i}]"
        if not isinstance(block, Mapping):
            raise SlimjaxError(field, f"must be a mapping of prefill, decode, transfer, got {block!r}")
        bad = [k for k in block if k not in ("prefill", "decode", "transfer")]
        if bad:
            raise SlimjaxError(
                f"{field}.{bad[0]}", f"unknown key{suggest(str(bad[0]), ('prefill', 'decode', 'transfer'))}"
            )
        for kind in POOLS:
            if kind not in block:
                raise SlimjaxError(f"{field}.{kind}", "missing")
        pools = {
            kind: _pool(block[kind], kind, f"{field}.{kind}", models, serving_value, max_tokens, per_group)
            for kind in POOLS
        }
        transfer = block.get("transfer", "network")
        if transfer not in TRANSFERS:
            raise SlimjaxError(f"{field}.transfer", f"must be one of {', '.join(TRANSFERS)}, got {transfer!r}")
        p, d = pools["prefill"], pools["decode"]
        if transfer == "nvlink":
            node = p.gpu_row["gpus_per_node"]
            if p.gpu != d.gpu or p.gpus + d.gpus > node or not p.gpu_row["link_bytes_per_s"] > 0:
                raise SlimjaxError(
                    f"{field}.transfer",
                    f"nvlink needs both pools in one node of one GPU with a link figure: {p.gpus} + {d.gpus} GPUs of "
                    f"{p.gpu} and {d.gpu} (a node holds {node:g}); use transfer: network",
                )
        else:
            for pool, kind in ((p, "prefill"), (d, "decode")):
                catalog.require_network(pool.gpu, pool.gpu_row, f"{field}.{kind}.gpu", "the KV moves")
        out.append(Deployment(p, d, transfer))
    return out


def parse_study_section(value: Any, models, serving_value, max_tokens: float, per_group) -> list[Deployment]:
    """A procurement study's ``disaggregated`` section: candidate pools ``prefill: [{gpu, tp, pp}, …]`` and
    ``decode: [{gpu, tp, pp, batch}, …]`` and one ``transfer``; every (prefill, decode) pair is a deployment
    whose replicas the study sizes (MODEL.md §10), so a pool gives no ``replicas``."""
    if value is None:
        return []
    field = "disaggregated"
    if not isinstance(value, Mapping):
        raise SlimjaxError(field, f"must be a mapping of prefill, decode (lists of pools) and transfer, got {value!r}")
    bad = [k for k in value if k not in ("prefill", "decode", "transfer")]
    if bad:
        raise SlimjaxError(f"{field}.{bad[0]}", f"unknown key{suggest(str(bad[0]), ('prefill', 'decode', 'transfer'))}")
    pools = {}
    for kind in POOLS:
        items = value.get(kind)
        if not isinstance(items, list) or not items:
            raise SlimjaxError(f"{field}.{kind}", f"must be a non-empty list of {kind} pools, got {items!r}")
        for i, item in enumerate(items):
            if isinstance(item, Mapping) and "replicas" in item:
                raise SlimjaxError(f"{field}.{kind}[{i}].replicas", "a study sizes the replicas: leave it out")
        pools[kind] = [
            _pool(item, kind, f"{field}.{kind}[{i}]", models, serving_value, max_tokens, per_group)
            for i, item in enumerate(items)
        ]
    transfer = value.get("transfer", "network")
    blocks = [{"prefill": p, "decode": d, "transfer": transfer} for p in value["prefill"] for d in value["decode"]]
    return parse_deployments(blocks, models, serving_value, max_tokens, per_group)
