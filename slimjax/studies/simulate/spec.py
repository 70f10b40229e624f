"""Simulation files (MODEL.md §9): YAML (or a dict) in, a validated :class:`Simulation` out.

Keys: ``models``, ``gpus``, ``tp`` (default [1]), ``batch`` (max_num_seqs B, a list), ``replicas`` (default
[1]), ``router`` (``round_robin`` | ``least_loaded``), ``serving`` (the sweep file's block, with
``step_tokens`` and ``step_overhead_s``; kv_replication defaults to auto per TP degree), ``settings`` (optional: a
list of engine configurations, each a mapping of engine setting keys — step budget, chunk size, block size, KV policy
and watermark, prefill order — over the serving block; a candidate axis ``setting``), ``precision``
(float32 | float64) and ``stream``, one of::

    {requests: {arrival_s: [...], input_len: [...], output_len: [...]}}
    {trace: PATH, format: azure|mooncake|csv, rate_scale: s, duration_s: T (optional: the first T seconds)}
    {poisson: RATE, input_len: I, output_len: O, requests: N, seed: 0}
    {closed_loop: {clients: [C, ...], input_len: I, output_len: O, requests_per_client: k}}
    {conversations: {conversations: N, turns: T, rate: R, think_s: D, system_tokens: S, user_tokens: U,
                     output_len: O, shared_system: true, block_tokens: 512, seed: 0}}

An inline or trace stream may give each prompt's block hashes (``hash_ids``, with ``hash_block_tokens``; a Mooncake
trace's are read, 512-token blocks): what the prompts share is then said (docs/simulation.md).

Unknown keys are errors naming the field.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...constants import ROUTERS
from ...errors import SlimjaxError, suggest
from ...inputs.axes import parse_axis
from ...inputs.checks import checked_number, positive_number
from ...inputs.disaggregated import parse_deployments
from ...inputs.engines import engine_settings
from ...inputs.files import read_spec_file
from ...inputs.prefixes import (
    MOONCAKE_BLOCK_TOKENS,
    PrefixBlocks,
    chain_blocks,
    conversation_prompts,
    reuse_text,
    trace_prefix,
)
from ...inputs.requests import read_trace_entry
from ...inputs.serving import with_calibrated_links
from ...inputs.studyfile import models_and_gpus, serving_per_group, serving_per_setting, with_layouts
from ...model.specs import GPUSpec, ModelSpec, ServingSpec, stack

PRECISIONS = ("float32", "float64")
STREAM_KINDS = ("requests", "trace", "poisson", "closed_loop", "conversations")


@dataclasses.dataclass(frozen=True)
class Stream:
    """A request stream: arrival times (None for a closed loop), prompt and output tokens per request."""

    kind: str
    arrival_s: np.ndarray | None
    input_len: np.ndarray
    output_len: np.ndarray
    clients: tuple[int, ...] = ()  # closed loop: the client counts swept (dim ``clients``)
    requests_per_client: int = 0
    description: str = ""
    prefix: PrefixBlocks | None = None  # each prompt's block chain ids, where the stream gives them

    @property
    def n_requests(self) -> int:
        return len(self.input_len)


@dataclasses.dataclass(frozen=True, eq=False)
class Simulation:
    """A validated simulation: labels beside stacked specs (serving per (model, GPU, TP))."""

    kind: ClassVar[str] = "simulation"

    models: list[str]
    gpus: list[str]
    model: ModelSpec  # leaves (M,)
    gpu: GPUSpec  # leaves (G,)
    tp: np.ndarray
    pp: np.ndarray  # pipeline stages (MODEL.md §10)
    batch: np.ndarray
    replicas: np.ndarray
    router: str
    serving: ServingSpec  # leaves (M, G, N, P)
    serving_table: dict
    precision: str
    stream: Stream
    source: str
    spec: dict
    deployments: tuple = ()  # disaggregated prefill/decode candidates (MODEL.md §10)
    settings: tuple[str, ...] = ()  # engine settings swept (dim ``setting``; serving leaves (M, G, N, P, S))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.precision)


def _lengths(value: Any, field: str) -> np.ndarray:
    if not isinstance(value, (list, tuple)) or not value:
        raise SlimjaxError(field, f"must be a non-empty list, got {value!r}")
    return np.asarray([positive_number(v, f"{field}[{i}]", integer=True) for i, v in enumerate(value)], float)


def _only(block: Mapping, allowed: tuple, field: str) -> None:
    bad = [k for k in block if k not in allowed]
    if bad:
        raise SlimjaxError(f"{field}.{bad[0]}", f"unknown key{suggest(str(bad[0]), allowed)}")


def closed_loop_stream(clients, input_len, output_len, requests_per_client) -> Stream:
    """C clients × k requests of (I, O): request i belongs to client i mod C (the largest C sets the length)."""
    n = int(max(clients)) * int(requests_per_client)
    return Stream(
        "closed_loop",
        None,
        np.full(n, float(input_len)),
        np.full(n, float(output_len)),
        tuple(int(c) for c in clients),
        int(requests_per_client),
        f"closed loop of {list(clients)} clients × {requests_per_client} requests of ({input_len:g}, {output_len:g})",
    )


def poisson_stream(rate: float, input_len: float, output_len: float, requests: int, seed: int) -> Stream:
    """N requests of (I, O) arriving as a Poisson stream of ``rate``/s from t = 0 (exponential gaps, seeded)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, requests)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return Stream(
        "poisson",
        arrival,
        np.full(requests, float(input_len)),
        np.full(requests, float(output_len)),
        description=f"Poisson {rate:g}/s, {requests} requests of ({input_len:g}, {output_len:g}), seed {seed}",
    )


def _prefix(hash_ids, block_tokens, input_len, field: str) -> PrefixBlocks | None:
    if hash_ids is None:
        if block_tokens is not None and field.endswith("requests"):
            raise SlimjaxError(f"{field}.hash_block_tokens", "given without hash_ids")
        return None
    if block_tokens is None:
        raise SlimjaxError(f"{field}.hash_block_tokens", "missing: the block size, in tokens, of hash_ids")
    if not isinstance(hash_ids, (list, tuple)) or not all(isinstance(h, (list, tuple)) for h in hash_ids):
        raise SlimjaxError(f"{field}.hash_ids", "must be a list of lists of integer hashes, one list per request")
    return chain_blocks(hash_ids, input_len, block_tokens, field)


def _with_prefix(stream: Stream, prefix: PrefixBlocks | None) -> Stream:
    """``stream`` with its prompts' block chains, its description saying what they share."""
    if prefix is None:
        return stream
    text = f"{stream.description}; {reuse_text(prefix, stream.input_len)}"
    return dataclasses.replace(stream, prefix=prefix, description=text)


CONVERSATION_KEYS = {  # the conversations stream's keys: default (None: required)
    "conversations": None,
    "turns": None,
    "rate": None,
    "think_s": None,
    "system_tokens": 0,
    "user_tokens": None,
    "output_len": None,
    "shared_system": True,
    "block_tokens": MOONCAKE_BLOCK_TOKENS,
    "seed": 0,
}


def conversations_stream(block: Any, field: str) -> Stream:
    """Conversations that resend their history (:func:`slimjax.inputs.prefixes.conversation_prompts`): each starts
    at a Poisson arrival of ``rate`` conversations/s and sends its turns ``think_s`` apart (an open stream: a turn
    does not wait for the previous answer); a shared system prompt of ``system_tokens`` (``turns: 1``: requests that
    share only it). The block hashes follow the text, so the stream says what a prefix cache could reuse."""
    if not isinstance(block, Mapping):
        raise SlimjaxError(field, f"must be a mapping of {', '.join(CONVERSATION_KEYS)}, got {block!r}")
    _only(block, tuple(CONVERSATION_KEYS), field)
    got = {}
    for k, default in CONVERSATION_KEYS.items():
        if k not in block and default is None:
            raise SlimjaxError(f"{field}.{k}", "missing")
        got[k] = block.get(k, default)
    n = int(positive_number(got["conversations"], f"{field}.conversations", integer=True))
    turns = int(positive_number(got["turns"], f"{field}.turns", integer=True))
    rate = positive_number(got["rate"], f"{field}.rate")
    think = checked_number(got["think_s"], f"{field}.think_s", lambda x: x >= 0, "non-negative seconds")
    system = int(
        checked_number(
            got["system_tokens"], f"{field}.system_tokens", lambda x: x >= 0 and x == int(x), "a non-negative integer"
        )
    )
    user = int(positive_number(got["user_tokens"], f"{field}.user_tokens", integer=True))
    out = int(positive_number(got["output_len"], f"{field}.output_len", integer=True))
    size = int(positive_number(got["block_tokens"], f"{field}.block_tokens", integer=True))
    if not isinstance(got["shared_system"], bool):
        raise SlimjaxError(f"{field}.shared_system", f"must be true or false, got {got['shared_system']!r}")
    seed = got["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise SlimjaxError(f"{field}.seed", f"must be a non-negative integer, got {seed!r}")
    conv, turn, prompt, hashes = conversation_prompts(n, turns, system, user, out, size, got["shared_system"])
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    starts = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    arrival = starts[conv] + turn * think
    order = np.argsort(arrival, kind="stable")
    i_len = prompt[order]
    stream = Stream(
        "conversations",
        arrival[order],
        i_len,
        np.full(len(order), float(out)),
        description=(
            f"{n} conversations of {turns} turns ({rate:g}/s, turns {think:g} s apart; system prompt {system} tokens"
            f"{' shared' if got['shared_system'] else ''}, {user} user and {out} output tokens a turn), seed {seed}"
        ),
    )
    return _with_prefix(stream, chain_blocks([hashes[i] for i in order], i_len, size, field))


def _stream(value: Any, base_dir: Path | None) -> Stream:
    field = "stream"
    kinds = (
        [k for k in value if k in STREAM_KINDS and not (k == "requests" and "poisson" in value)]
        if isinstance(value, Mapping)
        else []
    )
    if len(kinds) != 1:
        raise SlimjaxError(field, f"must be a mapping with exactly one of {', '.join(STREAM_KINDS)}, got {value!r}")
    if "requests" in value and isinstance(value["requests"], Mapping):
        _only(value, ("requests",), field)
        block = value["requests"]
        _only(block, ("arrival_s", "input_len", "output_len", "hash_ids", "hash_block_tokens"), f"{field}.requests")
        for k in ("arrival_s", "input_len", "output_len"):
            if k not in block:
                raise SlimjaxError(f"{field}.requests.{k}", "missing")
        i_len = _lengths(block["input_len"], f"{field}.requests.input_len")
        o_len = _lengths(block["output_len"], f"{field}.requests.output_len")
        arrival = np.asarray(
            [
                checked_number(v, f"{field}.requests.arrival_s[{i}]", lambda x: x >= 0, "non-negative seconds")
                for i, v in enumerate(block["arrival_s"] or [])
            ],
            float,
        )
        if not (len(arrival) == len(i_len) == len(o_len)):
            raise SlimjaxError(
                f"{field}.requests",
                f"arrival_s, input_len and output_len must have one entry per request "
                f"(got {len(arrival)}, {len(i_len)}, {len(o_len)})",
            )
        back = np.diff(arrival) < 0
        if back.any():
            raise SlimjaxError(f"{field}.requests.arrival_s[{int(np.argmax(back)) + 1}]", "earlier than the one before")
        prefix = _prefix(block.get("hash_ids"), block.get("hash_block_tokens"), i_len, f"{field}.requests")
        return _with_prefix(
            Stream("requests", arrival, i_len, o_len, description=f"{len(arrival)} requests given inline"), prefix
        )
    if "trace" in value:
        _only(value, ("trace", "format", "rate_scale", "duration_s", "hash_block_tokens"), field)
        scale = positive_number(value.get("rate_scale", 1.0), f"{field}.rate_scale")
        if "duration_s" not in value:  # (a trace without timestamps is named below, with what to use instead)
            trace = read_trace_entry(value, field, base_dir)
        else:
            trace = read_trace_entry(value, field, base_dir, rate_scale=scale)
        if trace.arrival_s is None:
            raise SlimjaxError(
                f"{field}.trace", f"{trace.source} has no timestamps; use poisson or closed_loop for lengths"
            )
        arrival = (trace.arrival_s - trace.arrival_s[0]) / scale
        window = ""
        if value.get("duration_s") is not None:  # the stream's first seconds (after the compression)
            window = f", first {value['duration_s']:g} s ({len(arrival)} requests)"
        stream = Stream(
            "trace",
            arrival,
            trace.input_len.astype(float),
            trace.output_len.astype(float),
            description=f"{trace.source} ({trace.format}) at rate_scale {scale:g}{window}",
        )
        return _with_prefix(stream, trace_prefix(trace, value.get("hash_block_tokens"), field))
    if "conversations" in value:
        _only(value, ("conversations",), field)
        return conversations_stream(value["conversations"], f"{field}.conversations")
    if "poisson" in value:
        _only(value, ("poisson", "input_len", "output_len", "requests", "seed"), field)
        rate = positive_number(value["poisson"], f"{field}.poisson")
        for k in ("input_len", "output_len", "requests"):
            if k not in value:
                raise SlimjaxError(f"{field}.{k}", "missing (a Poisson stream needs input_len, output_len, requests)")
        seed = value.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise SlimjaxError(f"{field}.seed", f"must be a non-negative integer, got {seed!r}")
        return poisson_stream(
            rate,
            positive_number(value["input_len"], f"{field}.input_len", integer=True),
            positive_number(value["output_len"], f"{field}.output_len", integer=True),
            int(positive_number(value["requests"], f"{field}.requests", integer=True)),
            seed,
        )
    _only(value, ("closed_loop",), field)
    block = value["closed_loop"]
    where = f"{field}.closed_loop"
    if not isinstance(block, Mapping):
        raise SlimjaxError(
            where, f"must be a mapping of clients, input_len, output_len, requests_per_client, got {block!r}"
        )
    _only(block, ("clients", "input_len", "output_len", "requests_per_client"), where)
    for k in ("clients", "input_len", "output_len", "requests_per_client"):
        if k not in block:
            raise SlimjaxError(f"{where}.{k}", "missing")
    clients = parse_axis(block["clients"], f"{where}.clients")
    return closed_loop_stream(
        clients,
        positive_number(block["input_len"], f"{where}.input_len", integer=True),
        positive_number(block["output_len"], f"{where}.output_len", integer=True),
        int(positive_number(block["requests_per_client"], f"{where}.requests_per_client", integer=True)),
    )


def parse(spec: str | os.PathLike | Mapping) -> Simulation:
    """Validate a simulation file (path) or mapping into a :class:`Simulation`; errors name the field."""
    data, source, base_dir = read_spec_file(spec, "simulation")
    router = data.get("router", "round_robin")
    if router not in ROUTERS:
        raise SlimjaxError("router", f"must be one of {', '.join(ROUTERS)}, got {router!r}")
    precision = data.get("precision", "float32")
    if precision not in PRECISIONS:
        raise SlimjaxError("precision", f"must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    models, gpus = models_and_gpus(data, base_dir)
    # layouts (docs/layouts.md): the tp axis and the layout settings of every layout of its GPU counts
    tp_axis, settings, layouts = with_layouts(data, engine_settings(data.get("settings")), base_dir)
    tp = parse_axis(tp_axis or data.get("tp", [1]), "tp").astype(float)
    pp = parse_axis(data.get("pp", [1]), "pp").astype(float)
    if router != "round_robin" and np.any(pp > 1):
        raise SlimjaxError(
            "router",
            f"{router} with pipeline stages: a replica deals its arrivals to its pp virtual engines round robin "
            "(MODEL.md §10), which only router: round_robin composes with",
        )
    batch = parse_axis(data["batch"], "batch").astype(float)
    replicas = parse_axis(data.get("replicas", [1]), "replicas").astype(float)
    stream = _stream(data["stream"], base_dir)
    if router == "prefix_affinity" and stream.prefix is None:
        raise SlimjaxError(
            "router",
            "prefix_affinity routes by the prompts' cached blocks, and this stream gives no block hashes: give "
            "hash_ids (a Mooncake trace, a CSV column, or inline with hash_block_tokens), or router: least_loaded",
        )
    max_tokens = float(np.max(stream.input_len + stream.output_len))
    serving_value = dict(data.get("serving") or {})
    serving, table = serving_per_setting(
        serving_value, models, gpus, tp, pp, max_tokens, settings, calibrated=False, layouts=layouts
    )
    gpus = with_calibrated_links(gpus, data["gpus"], table)
    deployments = parse_deployments(
        data.get("disaggregated"),
        models,
        serving_value,
        max_tokens,
        lambda *a: serving_per_group(*a, calibrated=False),
    )
    if deployments and stream.kind == "closed_loop":
        raise SlimjaxError("disaggregated", "simulated on open streams (requests, trace, poisson), not a closed loop")
    return Simulation(
        models=[m for m, _ in models],
        gpus=[g for g, _ in gpus],
        model=stack(ModelSpec, [row for _, row in models]),
        gpu=stack(GPUSpec, [row for _, row in gpus]),
        tp=tp,
        pp=pp,
        batch=batch,
        replicas=replicas,
        router=router,
        serving=serving,
        serving_table=table,
        precision=precision,
        stream=stream,
        source=source,
        spec=data,
        deployments=tuple(deployments),
        settings=tuple(label for label, _ in settings),
    )
