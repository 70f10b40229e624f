"""The sweep file's ``agents`` block (MODEL.md §6): named fork-join graphs and the API they are compared
with. ``api`` sets the API for every graph; a graph may override any API key (flat, or under its own
``api``). API defaults are illustrative, editable and dated (:data:`slimjax.constants.PRICE_DATE`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import constants
from ..errors import SlimjaxError, suggest
from ..model.specs import AgentSpec
from .checks import is_integer

# name -> (default, rule, what the rule says); rpm/tpm/parallelism may be .inf (no limit)
_API = constants.API_DEFAULTS
API_KEYS = {
    "rpm": (_API["rpm"], lambda v: v > 0, "a positive number of requests per minute (.inf: no limit)"),
    "tpm": (_API["tpm"], lambda v: v > 0, "a positive number of tokens per minute (.inf: no limit)"),
    "service_s": (_API["service_s"], lambda v: v > 0 and np.isfinite(v), "a positive number of seconds"),
    "parallelism": (
        _API["parallelism"],
        lambda v: v >= 1 and (np.isinf(v) or is_integer(v)),
        "an integer ≥ 1 (.inf: no limit)",
    ),
    "price_in_per_mtok": (
        _API["price_in_per_mtok"],
        lambda v: v >= 0 and np.isfinite(v),
        "a non-negative USD per million input tokens",
    ),
    "price_out_per_mtok": (
        _API["price_out_per_mtok"],
        lambda v: v >= 0 and np.isfinite(v),
        "a non-negative USD per million output tokens",
    ),
}
GRAPH_KEYS = {
    "stages": (None, lambda v: v >= 1 and is_integer(v), "an integer ≥ 1"),
    "calls_per_stage": (None, lambda v: v >= 1 and is_integer(v), "an integer ≥ 1"),
    "parallelism": (
        None,
        lambda v: v >= 1 and (np.isinf(v) or is_integer(v)),
        "an integer ≥ 1 (.inf: all calls of a stage at once)",
    ),
    "tool_delay_s": (0.0, lambda v: v >= 0 and np.isfinite(v), "a non-negative number of seconds"),
}


@dataclasses.dataclass(frozen=True)
class Agents:
    names: list[str]
    spec: AgentSpec  # leaves (A,)
    table: dict  # graph -> its settings, for attrs


def _number(value: Any, field: str, rule, what: str) -> float:
    """A number (YAML's .inf allowed where the rule allows it) that satisfies ``rule``."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, float, np.integer, np.floating))
        or np.isnan(value)
    ):
        raise SlimjaxError(field, f"must be {what}, got {value!r}")
    if not rule(float(value)):
        raise SlimjaxError(field, f"must be {what}, got {value!r}")
    return float(value)


def _api(block: Any, field: str, base: dict) -> dict:
    if block is None:
        return dict(base)
    if not isinstance(block, Mapping):
        raise SlimjaxError(field, f"must be a mapping of {', '.join(API_KEYS)}, got {block!r}")
    bad = [k for k in block if k not in API_KEYS]
    if bad:
        raise SlimjaxError(f"{field}.{bad[0]}", f"unknown API key{suggest(str(bad[0]), list(API_KEYS))}")
    return {**base, **{k: _number(v, f"{field}.{k}", API_KEYS[k][1], API_KEYS[k][2]) for k, v in block.items()}}


def agents_block(value: Any) -> Agents:
    """The ``agents`` block: ``{api: {...}, NAME: {stages, calls_per_stage, parallelism, tool_delay_s, [API
    keys]}}``."""
    if not isinstance(value, Mapping) or not value:
        raise SlimjaxError("agents", f"must be a mapping of named graphs (and api), got {value!r}")
    api = _api(value.get("api"), "agents.api", {k: d for k, (d, _, _) in API_KEYS.items()})
    names, rows, table = [], [], {}
    for name, graph in value.items():
        if name == "api":
            continue
        field = f"agents.{name}"
        if not isinstance(graph, Mapping):
            raise SlimjaxError(field, f"must be a mapping of {', '.join(GRAPH_KEYS)}, got {graph!r}")
        own_api = dict(graph.get("api") or {})
        flat = {k: v for k, v in graph.items() if k in API_KEYS and k != "parallelism"}
        bad = [k for k in graph if k not in GRAPH_KEYS and k not in API_KEYS and k != "api"]
        if bad:
            raise SlimjaxError(
                f"{field}.{bad[0]}", f"unknown key{suggest(str(bad[0]), [*GRAPH_KEYS, *API_KEYS, 'api'])}"
            )
        settings = {}
        for key, (default, rule, what) in GRAPH_KEYS.items():
            if key not in graph:
                if key == "parallelism":
                    settings[key] = settings["calls_per_stage"]  # default: the whole stage at once
                    continue
                if default is None:
                    raise SlimjaxError(f"{field}.{key}", "missing: a graph needs stages and calls_per_stage")
                settings[key] = default
            else:
                settings[key] = _number(graph[key], f"{field}.{key}", rule, what)
        graph_api = _api({**flat, **own_api}, f"{field}.api" if own_api else field, api)
        names.append(str(name))
        table[str(name)] = {**settings, "api": graph_api}
        rows.append(
            dict(
                stages=settings["stages"],
                calls=settings["calls_per_stage"],
                parallelism=settings["parallelism"],
                tool_delay_s=settings["tool_delay_s"],
                api_rpm=graph_api["rpm"],
                api_tpm=graph_api["tpm"],
                api_service_s=graph_api["service_s"],
                api_parallelism=graph_api["parallelism"],
                api_price_in=graph_api["price_in_per_mtok"],
                api_price_out=graph_api["price_out_per_mtok"],
            )
        )
    if not names:
        raise SlimjaxError("agents", "names no graph (only api); add e.g. research: {stages: 4, calls_per_stage: 16}")
    spec = AgentSpec(**{k: np.asarray([r[k] for r in rows], np.float64) for k in rows[0]})
    return Agents(names, spec, table)
