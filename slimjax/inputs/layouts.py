"""The layouts a group of GPUs can be served in (docs/layouts.md): tensor parallel inside a node, pipeline stages,
attention data-parallel ranks and expert-parallel ranks, enumerated for ``layout: auto`` and the layout sweeps.

A layout of N GPUs is (tp, pp, dp, ep, moe_tp) with N = tp·dp·pp and tp·dp = moe_tp·ep per stage; every degree a
power of two (the shapes engines and NCCL's collectives are built for), tp dividing the query heads and within one
node (``gpus_per_node``), pp at most the layers, ep dividing the routed experts (1 for a dense model, whose data-
parallel ranks are replicas: dp 1). A stage wider than a node is wide EP: its all-to-all crosses the network.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import SlimjaxError


class Layout(NamedTuple):
    """One group's layout; its serving keys are ``n_gpu`` = tp, ``pp``, ``dp``, ``ep`` and ``moe_tp``."""

    tp: int
    pp: int
    dp: int
    ep: int
    moe_tp: int

    @property
    def gpus(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def kind(self) -> str:
        """'TP' (tensor parallel, pipeline stages included), 'TP+EP' (experts split over ranks under TP attention),
        'DP+EP' (attention data parallel inside a node) or 'wide-EP' (a stage beyond one node), as the validation
        tables cut them (the node is 8 GPUs there; :func:`layout_kind` takes the GPU's)."""
        return layout_kind(self.tp, self.dp, self.ep)

    def serving(self) -> dict:
        """The serving keys that set this layout."""
        return {"n_gpu": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "moe_tp": self.moe_tp}


def layout_kind(tp, dp, ep, gpus_per_node: float = 8) -> str:
    """'TP', 'TP+EP', 'DP+EP' or 'wide-EP' (a stage of tp·dp GPUs beyond one node) of one group."""
    if tp * dp > gpus_per_node and dp > 1:
        return "wide-EP"
    if dp > 1:
        return "DP+EP"
    return "TP+EP" if ep > 1 else "TP"


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(int(limit).bit_length()) if 1 << k <= limit]


def valid_layouts(
    n_gpus: int, n_heads: int, n_experts: int, n_layers: int, gpus_per_node: int, max_pp: int = 8
) -> list[Layout]:
    """Every layout of ``n_gpus`` GPUs (a power of two) for a model of ``n_heads`` query heads, ``n_experts`` routed
    experts (0: dense) and ``n_layers`` layers on nodes of ``gpus_per_node``, pipeline stages up to ``max_pp``; in
    order of pp, tp, ep (TP-only first)."""
    if n_gpus < 1 or n_gpus & (n_gpus - 1):
        raise SlimjaxError("layout", f"auto enumerates groups of a power of two GPUs, got {n_gpus}")
    out = []
    for pp in _powers_of_two(min(max_pp, n_gpus, n_layers)):
        stage = n_gpus // pp
        for tp in _powers_of_two(min(stage, gpus_per_node)):
            dp = stage // tp
            if n_heads % tp or (dp > 1 and n_experts == 0):  # a dense model's data-parallel ranks are replicas
                continue
            for ep in _powers_of_two(stage):
                if ep > 1 and (n_experts == 0 or n_experts % ep):
                    continue
                out.append(Layout(tp, pp, dp, ep, stage // ep))
    return out


class StudyLayouts(NamedTuple):
    """A study's ``layouts`` expanded (docs/layouts.md, layouts as candidates): the tp axis, the settings entries
    (label, {dp, ep, moe_tp}), and per (model, GPU) label the layouts (tp, dp, ep, moe_tp) that are candidates."""

    tp: tuple[int, ...]
    settings: tuple[tuple[str, dict], ...]
    valid: dict


def layout_label(dp: int, ep: int, moe_tp: int) -> str:
    """A settings entry's label, as :func:`slimjax.inputs.engines.engine_settings` labels the keys it sets."""
    return f"dp {dp}, ep {ep}, moe_tp {moe_tp}"


def study_layouts(value, models, gpus, field: str = "layouts") -> StudyLayouts:
    """``layouts: [8, 16]``: every one-stage layout of each GPU count (:func:`valid_layouts`, pp = 1) of every model
    on every GPU of the study, as a tp axis and a settings axis whose product holds them all; a (tp, setting) pair
    that is not one of a (model, GPU)'s layouts does not run there. Tensor parallel stays within the smallest node
    of the study's GPUs (one tp axis serves them all); a stage beyond a node needs the GPU's network. ``models``,
    ``gpus``: (label, catalog row) pairs."""
    counts = value if isinstance(value, (list, tuple)) else [value]
    if not counts:
        raise SlimjaxError(field, "must list GPU counts, e.g. [8, 16]")
    sizes = []
    for i, n in enumerate(counts):
        where = f"{field}[{i}]" if isinstance(value, (list, tuple)) else field
        if isinstance(n, bool) or not isinstance(n, (int, float)) or n != int(n) or n < 1 or int(n) & (int(n) - 1):
            raise SlimjaxError(where, f"must be a GPU count, a power of two (1, 2, 4, 8, …), got {n!r}")
        sizes.append(int(n))
    node = min(int(row["gpus_per_node"]) for _, row in gpus)
    valid = {}
    for m, arch in models:
        for g, row in gpus:
            networked = row.get("network_bytes_per_s", 0) > 0
            valid[m, g] = {
                (lay.tp, lay.dp, lay.ep, lay.moe_tp)
                for n in sizes
                for lay in valid_layouts(
                    n, int(arch["n_heads"]), int(arch["n_experts"]), int(arch["n_layers"]), node, max_pp=1
                )
                if networked or lay.tp * lay.dp <= row["gpus_per_node"]
            }
    every = set().union(*valid.values())
    if not every:
        raise SlimjaxError(field, f"no layout of {sizes} GPUs serves these models on these GPUs")
    tp = tuple(sorted({t for t, *_ in every}))
    entries = sorted({(dp, ep, moe_tp) for _, dp, ep, moe_tp in every})
    settings = tuple((layout_label(*e), {"dp": e[0], "ep": e[1], "moe_tp": e[2]}) for e in entries)
    return StudyLayouts(tp, settings, valid)
