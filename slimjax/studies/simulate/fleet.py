"""What a real stream does to each candidate replica fleet (MODEL.md §9), as an xarray Dataset.

Candidates are (model, GPU, TP degree, pipeline stages, [engine setting,] batch limit B) × replicas (× clients for a
closed loop); every candidate runs the same request stream through :func:`slimjax.engine.sim.simulate_candidates`. Per
request: TTFT, E2E, TPOT (dim ``request``, stream order); per candidate the §9 summaries.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import xarray as xr

from ..._version import __version__
from ...engine import sim as engine
from ...engine.dataset import declared
from ...engine.schema import Variable, table
from ...model.calculator import replica_engines
from ..candidates import candidate_inputs, check_requests_fit, flat_candidates, prefix_cache_text
from ..present import engine_assumptions
from .spec import Simulation

CANDIDATE = ("model", "gpu", "tp", "pp", "setting", "batch")  # a run without engine settings has no setting dim
RUN = (*CANDIDATE, "replicas", "clients")  # an open stream's runs have no clients dim
DEPLOYMENT = ("model", "deployment")
_SIM = "simulation"


def _per_request(name, long):
    return Variable(name, (*RUN, "request"), "s", long, _SIM)


def _summaries(dims, prefix=""):
    return (
        *(
            Variable(
                prefix + engine.summary_name(time, stat),
                dims,
                "s",
                f"{'mean' if stat == 'mean' else f'p{round(stat * 100)}'} {time.upper()}",
                _SIM,
            )
            for time in engine.SUMMARY_TIMES
            for stat in ("mean", *engine.SUMMARY_QUANTILES)
        ),
        Variable(prefix + "e2e_mean_s", dims, "s", "mean end-to-end latency", _SIM),
    )


_TTFT = "time to first token of each request (arrival to the end of the step holding its last prompt token)"
_E2E = "end-to-end latency of each request (arrival to its last token)"
_TPOT = "time per output token of each request, (E2E − TTFT)/(O − 1) (NaN where O = 1)"

# the one table of what a simulation writes (MODEL.md §9, §10), in Dataset order
SIMULATION = table(
    _per_request("arrival_s", "arrival time of each request (a closed loop's: its client's previous completion)"),
    _per_request("wait_s", "time each request waited in its replica's queue (arrival to admission)"),
    _per_request("ttft_s", _TTFT),
    _per_request("e2e_s", _E2E),
    _per_request("tpot_s", _TPOT),
    Variable(
        "preemptions",
        (*RUN, "request"),
        "1",
        "times each request was preempted and prefilled again (paged KV, docs/engines.md; 0 under reserve)",
        _SIM,
    ),
    Variable(
        "replica",
        (*RUN, "request"),
        "1",
        "the replica that served each request, numbered from 0 (round robin: the i-th request's is i mod replicas)",
        _SIM,
    ),
    Variable(
        "prefix_hit_tokens",
        (*RUN, "request"),
        "tokens",
        "prompt tokens each request found in its replica's prefix cache and did not prefill (docs/simulation.md; 0 "
        "without a cache)",
        _SIM,
    ),
    *_summaries(RUN),
    Variable(
        "prefix_hit_rate",
        RUN,
        "1",
        "prompt tokens found in the prefix cache / prompt tokens, over the counted requests (0 without a cache)",
        _SIM,
    ),
    Variable(
        "prefill_tokens_saved",
        RUN,
        "tokens",
        "prompt tokens the counted requests did not prefill: found in the prefix cache",
        _SIM,
    ),
    Variable("token_gap_p90_s", RUN, "s", "p90 of every inter-token gap (histogram of 1.1 % log bins)", _SIM),
    Variable(
        "utilization", RUN, "1", "busy: time in steps / (replicas × span of the run), whatever the steps hold", _SIM
    ),
    Variable(
        "occupancy",
        RUN,
        "1",
        "slots held: the mean requests in service (admission to last token) / (replicas × batch)",
        _SIM,
    ),
    Variable("queue_peak", RUN, "requests", "most requests left waiting after a step's admission, worst replica", _SIM),
    Variable("kv_peak_bytes", RUN, "bytes", "most KV reserved at once, worst replica", _SIM),
    Variable("preemptions_mean", RUN, "1", "preemptions per counted request (paged KV; 0 under reserve)", _SIM),
    Variable(
        "acceptance_length",
        CANDIDATE,
        "tokens",
        "tokens a decode step emits per request: the speculative acceptance length a (docs/speculative.md), 1 without",
        _SIM,
    ),
    Variable(
        "fits",
        CANDIDATE,
        "1",
        "the configuration runs: weights and runtime leave a KV pool on each stage, TP divides H_q, and each of the "
        "pp virtual engines admits at least one request (B ≥ pp)",
        _SIM,
        "bool",
    ),
    # disaggregated deployments (§10), beside the aggregated candidates
    Variable("disagg_ttft_s", (*DEPLOYMENT, "request"), "s", _TTFT, _SIM),
    Variable("disagg_e2e_s", (*DEPLOYMENT, "request"), "s", _E2E, _SIM),
    Variable("disagg_tpot_s", (*DEPLOYMENT, "request"), "s", _TPOT, _SIM),
    Variable(
        "disagg_transfer_s",
        (*DEPLOYMENT, "request"),
        "s",
        "KV transfer of each request from its prefill to its decode replica (§10)",
        _SIM,
    ),
    *_summaries(DEPLOYMENT, "disagg_"),
    Variable("disagg_prefill_utilization", DEPLOYMENT, "1", "prefill pool busy time / (engines × span)", _SIM),
    Variable("disagg_decode_utilization", DEPLOYMENT, "1", "decode pool busy time / (engines × span)", _SIM),
    Variable("disagg_gpus", DEPLOYMENT, "GPUs", "GPUs of the deployment, R_p·n_p + R_d·n_d", _SIM),
    Variable(
        "disagg_cost_per_hour",
        DEPLOYMENT,
        "USD/h",
        "R_p·n_p·price_p + R_d·n_d·price_d (illustrative prices)",
        _SIM,
    ),
    Variable("disagg_fits", DEPLOYMENT, None, "the deployment runs", _SIM, "bool"),
)
PER_REQUEST = tuple(v.name for v in SIMULATION.values() if v.dims == (*RUN, "request"))
SUMMARIES = tuple(v.name for v in SIMULATION.values() if v.dims == RUN)


def broadcast_candidates(sim: Simulation):
    """The simulation's candidates flattened (:func:`flat_candidates`), and their (M, G, N, P[, S], B) shape (S: its
    engine settings, where it sweeps them)."""
    settings = (len(sim.settings),) if sim.settings else ()
    shape = (len(sim.models), len(sim.gpus), len(sim.tp), len(sim.pp), *settings, len(sim.batch))
    return (*flat_candidates(sim.model, sim.gpu, sim.serving, sim.batch, shape), shape)


def run(sim: Simulation, progress=None) -> xr.Dataset:
    """Simulate every candidate of ``sim``; the Dataset of §9's outputs (NaN where a candidate does not fit).
    ``progress`` (tqdm's ``total`` and ``update``): told the runs, one per replica count × client count (every
    candidate at once) and one per disaggregated deployment, as each finishes."""
    dtype = sim.dtype
    model, gpu, serving, batch, shape = broadcast_candidates(sim)
    stream = sim.stream
    terms, footprint, fits = candidate_inputs(model, gpu, serving, stream, dtype)

    def labels(k):
        m, g, n, p, *s, b = np.unravel_index(k, shape)
        setting = f", {sim.settings[s[0]]}" if s else ""
        return f"{sim.models[m]} on {sim.gpus[g]} (tp {sim.tp[n]:g}, pp {sim.pp[p]:g}{setting}, batch {sim.batch[b]:g})"

    # a virtual engine admits ⌊B/(n_pp·D)⌋ requests (§10, docs/layouts.md): a batch limit below the engines runs nothing
    fits = fits & (batch >= np.asarray(replica_engines(serving)))

    check_requests_fit(footprint.astype(np.float64), terms["pool"].astype(np.float64), fits, labels, stream, terms)
    K, n_req = footprint.shape
    closed = stream.kind == "closed_loop"
    client_axis = list(stream.clients) if closed else [None]
    per_request = {v: np.full((K, len(sim.replicas), len(client_axis), n_req), np.nan, dtype) for v in PER_REQUEST}
    summary = {v: np.full((K, len(sim.replicas), len(client_axis)), np.nan, dtype) for v in SUMMARIES}
    steps = 0
    if progress is not None:
        progress.total = len(client_axis) * len(sim.replicas) + len(sim.deployments)
    with jax.enable_x64(dtype == np.float64):
        for c_i, clients in enumerate(client_axis):
            n = n_req if clients is None else clients * stream.requests_per_client
            arrival = np.zeros(n) if stream.arrival_s is None else stream.arrival_s[:n]
            sub = {
                "arrival_s": arrival.astype(dtype),
                "input_len": stream.input_len[:n].astype(dtype),
                "output_len": stream.output_len[:n].astype(dtype),
            }
            for r_i, replicas in enumerate(sim.replicas):
                records = engine.simulate_candidates(
                    terms,
                    batch.astype(dtype),
                    footprint[:, :n],
                    sub,
                    replicas=int(replicas),
                    router=sim.router,
                    clients=clients,
                    prefix=None if stream.prefix is None else (stream.prefix.padded()[:n], stream.prefix.block_tokens),
                )
                steps += int(np.sum(records["steps"]))
                if progress is not None:
                    progress.update(1)
                ttft, e2e, tpot = engine.request_times(records, stream.output_len[:n])
                wait = records["admit_s"] - records["arrival_s"]
                times = (
                    ("arrival_s", records["arrival_s"]),
                    ("wait_s", wait),
                    ("ttft_s", ttft),
                    ("e2e_s", e2e),
                    ("tpot_s", tpot),
                    ("preemptions", np.where(np.isfinite(e2e), records["preemptions"], np.nan)),
                    ("replica", np.where(np.isfinite(e2e), records["replica"], np.nan)),
                    ("prefix_hit_tokens", np.where(np.isfinite(e2e), records["prefix_hit_tokens"], np.nan)),
                )
                for name, x in times:
                    per_request[name][:, r_i, c_i, :n] = x
                got = engine.summaries(records, stream.output_len[:n], clients, batch * replicas, stream.input_len[:n])
                for name, x in got.items():
                    summary[name][:, r_i, c_i] = x
    full = (*shape, len(sim.replicas), len(client_axis))

    def shaped(x, tail=()):
        x = x.reshape(*full, *tail)
        x = np.where(fits.reshape(*shape, *(1,) * (x.ndim - len(shape))), x, np.nan)
        return x if closed else np.take(x, 0, axis=len(shape) + 1)  # an open stream: no clients axis

    without = (*(() if closed else ("clients",)), *(() if sim.settings else ("setting",)))
    data = {name: declared(SIMULATION[name], shaped(per_request[name], (n_req,)), without) for name in PER_REQUEST}
    data.update({name: declared(SIMULATION[name], shaped(summary[name]), without) for name in SUMMARIES})
    data["fits"] = declared(SIMULATION["fits"], fits.reshape(shape), without)
    accepted = np.where(np.asarray(serving.speculative_tokens) > 0, np.asarray(serving.acceptance_length), 1.0)
    data["acceptance_length"] = declared(SIMULATION["acceptance_length"], accepted.reshape(shape), without)
    coords = {
        "model": np.asarray(sim.models, dtype=str),
        "gpu": np.asarray(sim.gpus, dtype=str),
        "tp": sim.tp.astype(np.int64),
        "pp": sim.pp.astype(np.int64),
        "batch": sim.batch.astype(np.int64),
        **({"setting": np.asarray(sim.settings, dtype=str)} if sim.settings else {}),
        "replicas": sim.replicas.astype(np.int64),
        "request": np.arange(n_req),
        "input_len": ("request", stream.input_len.astype(np.int64)),
        "output_len": ("request", stream.output_len.astype(np.int64)),
    }
    if closed:
        coords["clients"] = np.asarray(stream.clients, np.int64)
    attrs = {
        "kind": "simulation",
        "slimjax_version": __version__,
        "source": sim.source,
        "stream": stream.description,
        "router": sim.router,
        "precision": sim.precision,
        "serving": json.dumps(sim.serving_table, default=float),
        "engine_steps": steps,
        "model_contract": "MODEL.md §9 (continuous batching, FCFS, token budget); KV per kv_policy (docs/engines.md)",
    }
    if closed:
        attrs["warmup"] = "statistics after the first C completions of each closed loop (MODEL.md §9)"
    attrs["assumptions"] = json.dumps(simulation_assumptions(sim, closed))
    if sim.deployments:
        steps_d = _disaggregated(sim, data, coords, progress)
        attrs["engine_steps"] = steps + steps_d
        attrs["disaggregated"] = (
            "MODEL.md §10: prefill pool (prompt-only steps, KV held until its transfer ends), KV moved over the "
            "network (or NVLink), decode pool (decode-only steps from T = I + 1); TPOT includes transfer and queue"
        )
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _disaggregated(sim: Simulation, data: dict, coords: dict, progress=None) -> int:
    """The deployments' per-request times and summaries as ``disagg_*`` variables (dims model, deployment)."""
    from .. import disaggregated

    st = sim.stream
    stream = {
        "arrival_s": st.arrival_s - 0.0,
        "input_len": st.input_len.astype(float),
        "output_len": st.output_len.astype(float),
    }
    runs = []
    for d in sim.deployments:
        runs.append(disaggregated.run_deployment(sim.models, sim.model, d, stream, sim.dtype))
        if progress is not None:
            progress.update(1)
    summ = [disaggregated.summaries(g, d, st.arrival_s) for g, d in zip(runs, sim.deployments, strict=True)]
    for name in ("ttft_s", "e2e_s", "tpot_s", "transfer_s"):
        data[f"disagg_{name}"] = declared(SIMULATION[f"disagg_{name}"], np.stack([g[name] for g in runs], axis=1))
    for var in SIMULATION.values():
        name = var.name.removeprefix("disagg_")
        if var.dims == DEPLOYMENT and name in summ[0]:
            data[var.name] = declared(var, np.stack([s[name] for s in summ], axis=1))
    data["disagg_fits"] = declared(SIMULATION["disagg_fits"], np.stack([g["fits"] for g in runs], axis=1))
    coords["deployment"] = np.asarray([d.label() for d in sim.deployments], dtype=str)
    return sum(g["steps"] for g in runs)


def simulation_assumptions(sim, closed: bool) -> list[str]:
    """What moves a simulation's answer, short: its table ends with it and its store keeps it."""
    rows = [r for by_gpu in sim.serving_table.values() for r in by_gpu.values()]
    labels = sorted({str(r["efficiency"]).split(" (", 1)[0] for r in rows})
    engine, scheduling = engine_assumptions(sim.serving_table)
    out = [
        f"stream: {sim.stream.description}" + ("; scored after the first C completions" if closed else ""),
        engine,
        f"scheduling: FCFS, {scheduling}; router {sim.router}",
        f"roofline constants: {', '.join(labels)}",
    ]
    if sim.stream.prefix is not None:
        model, _, serving, _, _ = broadcast_candidates(sim)
        out.append(prefix_cache_text(model, serving, sim.stream.prefix.block_tokens))
    return out
