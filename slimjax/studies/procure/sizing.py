"""Procurement sized by simulation (MODEL.md §8 "Sizing by simulation"): R_sim per candidate, then cost, choice
and mix on it.

The screen (:mod:`slimjax.engine.procurement`) gives λ* and R_screen = ⌈Λ/λ*⌉. Here every candidate that fits is
simulated (§9, round robin) on the workload's own request stream at each total rate, and R_sim is the smallest R
for which the p-quantile TTFT, the p-quantile TPOT (the ITL SLO) and the mean E2E all meet the SLOs. The search
is vectorised across candidates, a host loop over rounds only: it starts at R_screen (the screen is a starting
point, not a bound), halves while the SLOs hold or doubles while they fail (up to ``max_replicas``), then bisects
between the largest failing and the smallest meeting R. It assumes what MODEL.md does (meeting is monotone in R up
to simulation ties) and no more. A candidate that fails at ``max_replicas`` is infeasible with the SLO that failed
there named. The mix (each length class alone at w_k·Λ) runs the same search on each class's own requests.
"""

from __future__ import annotations

import json
import warnings
from typing import NamedTuple

import numpy as np
import xarray as xr

from ...engine import sim as engine
from ...engine.grid import labelled
from ...engine.schema import Variable, base_attrs, table
from ...model import procurement as proc
from ...model.specs import ServingSpec
from ..candidates import (
    REASON_CODE,
    SIM_REASONS,
    candidate_inputs,
    flat_candidates,
    prefix_cache_text,
    workload_prefix,
    workload_stream,
)
from ..present import engine_assumptions

SIZED = ("workload", "rate", "model", "gpu", "tp", "batch")
CHOICE = ("workload", "rate", "model")

_S = "sizing"
# what sizing adds to (or replaces in) a procurement Dataset
SIZING = table(
    Variable("replicas_screen", SIZED, "replica groups", "the screen's R = ⌈Λ/λ*⌉ (MODEL.md §8)", _S),
    Variable("replicas", SIZED, "replica groups", "R_sim: the fewest replicas whose §9 simulation meets every SLO", _S),
    Variable("sim_ttft_p_s", SIZED, "s", "simulated p-quantile TTFT at R_sim", _S),
    Variable("sim_tpot_p_s", SIZED, "s", "simulated p-quantile TPOT at R_sim (the ITL SLO's figure)", _S),
    Variable("sim_e2e_mean_s", SIZED, "s", "simulated mean E2E at R_sim", _S),
    Variable("sim_utilization", SIZED, "1", "simulated busy time / (R_sim × span of the run)", _S),
    Variable(
        "sim_reason", SIZED, "1", "why no R ≤ max_replicas serves the stream (0: feasible)", _S, flags=SIM_REASONS
    ),
    Variable("best_replicas_screen", CHOICE, "replica groups", "the screen's R of the chosen candidate", _S),
    Variable("best_sim_ttft_p_s", CHOICE, "s", "simulated p-quantile TTFT of the choice", _S),
    Variable("best_sim_tpot_p_s", CHOICE, "s", "simulated p-quantile TPOT of the choice", _S),
    Variable(
        "binding_slo",
        CHOICE,
        "1",
        "0 when a candidate is feasible, else the SLO most candidates fail at max_replicas",
        _S,
        flags=SIM_REASONS,
    ),
)
JOBS_PER_CALL = 256  # candidates simulated together on one stream (their (K, N) per-request records)


def _metrics(records, output_len, quantile: float) -> dict:
    """p-quantile TTFT and TPOT, mean E2E, utilisation per candidate (numpy's linear quantiles, as §9's)."""
    ttft, e2e, tpot = engine.request_times(records, output_len)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        span = np.nanmax(records["end_s"], axis=-1) - np.nanmin(records["arrival_s"], axis=-1)
        return {
            "ttft": np.nanquantile(ttft, quantile, axis=-1),
            "tpot": np.nanquantile(tpot, quantile, axis=-1),
            "e2e": np.nanmean(e2e, axis=-1),
            "util": np.sum(records["busy_s"], axis=-1) / (records["replicas"] * span),
            "done": np.all(np.isfinite(records["end_s"]), axis=-1),
        }


def _reason(m: dict, slo: dict) -> np.ndarray:
    """0 where every SLO holds, else the first failing (TTFT, ITL on TPOT, mean E2E); NaN TPOT (all O = 1)
    holds."""
    fail_tpot = np.where(np.isnan(m["tpot"]), False, m["tpot"] > slo["itl_s"])
    return np.select(
        [~m["done"] | (m["ttft"] > slo["ttft_s"]), fail_tpot, m["e2e"] > slo["e2e_s"]],
        [REASON_CODE["ttft"], REASON_CODE["itl"], REASON_CODE["e2e"]],
        0,
    )


JOB_ELEMENTS = 1 << 24  # jobs × requests simulated in one call (their per-request records)


def _allowed(n, quantile: float):
    """The late count that settles a miss: with that many of n values over the SLO, numpy's linear p-quantile
    (from x[⌊q(n−1)⌋] up) is over it too (⌊·⌋ taken low, so rounding cannot make it one short)."""
    n = np.asarray(n, np.int64)
    return np.where(n > 0, n - np.floor(quantile * (n - 1) - 1e-9).astype(np.int64), np.iinfo(np.int32).max)


def _stops(streams, job_stream, replicas, slo, max_replicas):
    """What lets a job's simulation stop once it must miss the TTFT or TPOT SLO (:func:`engine.run_pool`): such
    a job fails whatever the rest of its stream does, and its incomplete records read as failing. The TPOT stop
    is off at ``max_replicas``, where the failing SLO is reported (a stopped run reads as a TTFT miss)."""
    n = np.array([len(st["arrival_s"]) for st in streams])[job_stream]
    n_tpot = np.array([np.sum(np.asarray(st["output_len"]) > 1) for st in streams])[job_stream]
    tpot = np.where(np.asarray(replicas) >= max_replicas, np.iinfo(np.int32).max, _allowed(n_tpot, slo["quantile"]))
    return {
        "ttft_slo_s": np.full(len(n), float(slo["ttft_s"])),
        "itl_slo_s": np.full(len(n), float(slo["itl_s"])),
        "ttft_allowed": _allowed(n, slo["quantile"]),
        "tpot_allowed": tpot,
    }


def _evaluate(
    terms,
    batch,
    footprints,
    streams,
    job_stream,
    job_candidate,
    replicas,
    slo,
    first_slots=None,
    max_replicas=None,
    prefixes=None,
):
    """Simulate jobs (stream, candidate, R) on their streams; (reason codes, metrics) per job, the metrics with
    ``held``: the most requests one replica held at once. With ``max_replicas`` a job stops as soon as it must
    miss (:func:`_stops`): its code is then a TTFT miss, exact at ``max_replicas`` and only "fails" below it."""
    J = len(job_stream)
    reason, metrics = np.zeros(J, np.int64), {}
    size = np.array([len(st["arrival_s"]) for st in streams])[job_stream]
    chunk = (np.cumsum(size) - size) // JOB_ELEMENTS  # consecutive jobs, about JOB_ELEMENTS requests per call
    for c in np.unique(chunk):
        part = np.flatnonzero(chunk == c)
        first = None if first_slots is None else np.asarray(first_slots)[part]
        stop = None
        if max_replicas is not None:
            stop = _stops(streams, job_stream[part], replicas[part], slo, max_replicas)
        jobs = (job_stream[part], job_candidate[part], replicas[part])
        records = engine.round_robin_jobs(terms, batch, footprints, streams, *jobs, first, stop, prefixes)
        for s, rec in enumerate(records):
            at = part[job_stream[part] == s]
            if at.size == 0:
                continue
            m = _metrics(rec, streams[s]["output_len"], slo["quantile"])
            m["held"] = np.max(rec["held_peak"], axis=-1)
            reason[at] = _reason(m, slo)
            for k, v in m.items():
                metrics.setdefault(k, np.zeros(J, v.dtype))[at] = v
    return reason, metrics


def search_replicas(
    terms,
    batch,
    footprints,
    streams,
    job_stream,
    job_candidate,
    start,
    slo,
    max_replicas: int,
    progress=None,
    held_guess=None,
    prefixes=None,
) -> dict:
    """R_sim for each job (stream, candidate): the smallest R in [1, max_replicas] whose simulation on the
    job's stream meets ``slo``, from ``start`` (R_screen; clipped into range) by halving or doubling, then
    bisection, every job's round in one run. Returns replicas (NaN where none meets), reason (0 or the SLO
    failing at max_replicas), and the metrics at R_sim. ``held_guess``: requests one replica may hold at once at
    ``start`` (a first slot width; the screen's busy slots ρ·m), refined by each run. ``prefixes``: per stream its
    prompts' chains for a prefix cache (:func:`slimjax.engine.sim.round_robin_jobs`)."""
    job_stream, job_candidate = np.asarray(job_stream, int), np.asarray(job_candidate, int)
    J = len(job_stream)
    lo = np.zeros(J, np.int64)  # the largest R known to fail (0: none)
    hi = np.zeros(J, np.int64)  # the smallest R known to meet (0: none)
    cur = np.clip(np.nan_to_num(np.asarray(start, float), nan=1.0), 1, max_replicas).astype(np.int64)
    reason = np.zeros(J, np.int64)
    found = {k: np.full(J, np.nan) for k in ("ttft", "tpot", "e2e", "util")}
    active = np.ones(J, bool)
    held = np.full(J, np.nan) if held_guess is None else np.asarray(held_guess, float).copy()
    tried = cur.astype(float)  # held is for R = tried
    while active.any():
        idx = np.flatnonzero(active)
        # first slot width: the last run's peak scaled to this R (a replica of R holds ~1/R of the stream)
        guess = np.where(np.isnan(held[idx]), engine.FIRST_SLOTS, held[idx] * tried[idx] / cur[idx] * 1.25)
        code, m = _evaluate(
            terms,
            batch,
            footprints,
            streams,
            job_stream[idx],
            job_candidate[idx],
            cur[idx],
            slo,
            np.maximum(guess, 4),
            max_replicas,
            prefixes,
        )
        held[idx], tried[idx] = m["held"], cur[idx]
        met = code == 0
        hi[idx[met]] = cur[idx[met]]
        for k in found:
            found[k][idx[met]] = m[k][met]
        lo[idx[~met]] = cur[idx[~met]]
        reason[idx[~met]] = code[~met]
        if progress is not None:
            progress(len(idx))
        # the next R to try: bisect a bracket, else halve (meets) or double (fails)
        both = (hi > 0) & (lo > 0)
        nxt = np.where(both, (lo + hi) // 2, np.where(hi > 0, hi // 2, np.minimum(2 * lo, max_replicas)))
        finished = (both & (hi - lo <= 1)) | ((hi == 1) & (lo == 0)) | ((hi == 0) & (lo >= max_replicas))
        active = ~finished
        cur = np.where(active, np.maximum(nxt, 1), cur)
    feasible = hi > 0
    return {
        "replicas": np.where(feasible, hi, np.nan),
        "reason": np.where(feasible, 0, reason),
        **{k: np.where(feasible, v, np.nan) for k, v in found.items()},
    }


def _candidates(study):
    """Flattened (model, GPU, TP, batch) candidates of a study: (terms builder inputs, batch (K,), shape)."""
    shape = (len(study.models), len(study.gpus), len(study.tp), len(study.batch))
    serving = ServingSpec(**{k: np.asarray(v, float) for k, v in study.serving.fields().items()})
    return flat_candidates(study.model, study.gpu, serving, study.batch, shape), shape


METRICS = ("ttft", "tpot", "e2e", "util")  # what a sized candidate's simulation reports at R_sim


def size_parts(study) -> list[tuple[int, int]]:
    """The parts a study is sized in, (workload, rate) pairs in order: each is searched, and kept, on its own."""
    return [(w, r) for w in range(len(study.workloads)) for r in range(len(study.rate_labels))]


def size(study, ds: xr.Dataset, progress=None, parts=None, part_done=None) -> xr.Dataset:
    """The screened procurement Dataset ``ds`` of ``study`` sized by simulation: R_sim for every candidate and
    rate (and each class alone, for the mix), then fleet, cost, choice and mix on it; the screen's R kept as
    ``replicas_screen``. Sized part by part (:func:`size_parts`); ``parts`` (:class:`slimjax.store.parts.
    PartsJournal`-like: ``done()``, ``record(part, arrays)``) keeps each finished part and gives back those a killed
    run had finished. ``progress(n)``: n more simulations run; ``part_done(1)``: a part finished (or found kept)."""
    inputs, shape = _candidates(study)  # (model, gpu, serving, batch) of the flattened candidates
    W, Rr, K, C = len(study.workloads), len(study.rate_labels), study.n_classes, int(np.prod(shape))
    slots = ds["slots"].transpose("workload", "model", "gpu", "tp", "batch").values  # (W, M, G, N, B)
    screen = ds["replicas"].transpose(*SIZED).values.reshape(W, Rr, C)
    weight = ds["class_weight"].transpose("workload", "class").values
    # the screen's busy slots ρ·m at R_screen: a first guess of what a replica holds (NaN: no guess)
    rho = ds["utilization"].transpose(*SIZED).values.reshape(W, Rr, C)
    busy = rho * slots.reshape(W, 1, C) * 1.25 + 4
    r_sim = np.full((W, Rr, C), np.nan)
    r_class = np.full((W, Rr, K, C), np.nan)
    reason = np.full((W, Rr, C), REASON_CODE["does_not_fit"], np.int64)
    metrics = {k: np.full((W, Rr, C), np.nan) for k in METRICS}
    done = parts.done() if parts is not None else {}
    for part, (w, r) in enumerate(size_parts(study)):
        got = done.get(part)
        if got is None:
            runs = slots[w].reshape(-1) >= 1
            got = _size_part(study, inputs, w, r, runs, screen[w, r], weight[w], busy[w, r], progress)
            if parts is not None:
                parts.record(part, got)
        if part_done is not None:
            part_done(1)
        r_sim[w, r], reason[w, r], r_class[w, r] = got["replicas"], got["reason"], got["replicas_by_class"]
        for k in METRICS:
            metrics[k][w, r] = got[k]
    return _sized_dataset(study, ds, r_sim, r_class, reason, metrics, shape)


def _size_part(study, inputs, w: int, r: int, runs, screen, weight, busy, progress) -> dict:
    """One part of :func:`size`: workload ``w`` at rate ``r``, every candidate that runs (``runs``) searched on the
    workload's stream and on each class's alone, every job's round in one run."""
    model, gpu, serving, batch = inputs
    K, C = study.n_classes, len(runs)
    out = {
        "replicas": np.full(C, np.nan),
        "reason": np.full(C, REASON_CODE["does_not_fit"], np.int64),
        "replicas_by_class": np.full((K, C), np.nan),
        **{k: np.full(C, np.nan) for k in METRICS},
    }
    wl, rate = study.workloads[w], float(study.total_rate[w, r])
    if not np.isfinite(rate):
        return out
    terms = None
    streams, footprints, prefixes, jobs = [], [], [], []  # jobs: (stream, candidate, start, class (-1: all), busy)
    classes = [k for k in range(K) if weight[k] > 0] if wl.trace is not None else []
    for k in [None, *classes]:
        members = None if k is None else np.flatnonzero(wl.class_of == k)
        stream, prefix = workload_stream(wl, rate, study.sizing, members), workload_prefix(wl, members)
        terms, footprint, _ = candidate_inputs(model, gpu, serving, _Lengths(stream, prefix), np.float64)
        fits = runs & np.all(footprint <= terms["pool"][:, None], axis=-1)
        if k is None:
            out["reason"][runs & ~fits] = REASON_CODE["request_too_large"]
        start = screen
        if k is not None:  # the screen's mixture R scaled by the class's share: only a starting point
            start = np.ceil(np.nan_to_num(start, nan=1.0) * weight[k])
        for c in np.flatnonzero(fits):
            jobs.append((len(streams), c, start[c], -1 if k is None else k, busy[c]))
        streams.append(stream)
        footprints.append(footprint)
        prefixes.append(prefix)
    if not jobs:
        return out
    got = search_replicas(
        terms,
        batch,
        footprints,
        streams,
        [j[0] for j in jobs],
        [j[1] for j in jobs],
        [j[2] for j in jobs],
        study.slo,
        study.sizing["max_replicas"],
        progress,
        [j[4] for j in jobs],
        prefixes,
    )
    for i, (_, c, _, k, _) in enumerate(jobs):
        if k < 0:
            out["replicas"][c], out["reason"][c] = got["replicas"][i], got["reason"][i]
            for name in METRICS:
                out[name][c] = got[name][i]
        else:
            out["replicas_by_class"][k, c] = got["replicas"][i]
    return out


class _Lengths:
    """The lengths :func:`candidate_inputs` reads from a stream, and its prompts' block size where they are hashed."""

    def __init__(self, stream, prefix=None):
        self.input_len, self.output_len = stream["input_len"], stream["output_len"]
        self.prefix = None if prefix is None else _Block(prefix[1])


class _Block(NamedTuple):
    block_tokens: int


def _sized_dataset(study, ds, r_sim, r_class, reason, metrics, shape) -> xr.Dataset:
    M, G, N, B = shape
    W, Rr, K = r_sim.shape[0], r_sim.shape[1], study.n_classes
    grid = (W, Rr, M, G, N, B)
    replicas = r_sim.reshape(grid)
    tp, batch = np.asarray(study.tp, float), np.asarray(study.batch, float)
    stages = np.asarray(study.serving.pipeline_stages, float).reshape(1, 1, M, G, N, 1)
    ranks = np.asarray(study.serving.dp_ranks, float).reshape(1, 1, M, G, N, 1)
    n_gpu = tp[None, None, None, None, :, None] * stages * ranks  # GPUs of one replica group, n_tp·n_pp·D
    price = np.asarray(study.gpu.price_per_hour, float)[None, None, None, :, None, None]
    rate = np.asarray(study.total_rate, float)[:, :, None, None, None, None]
    weight = ds["class_weight"].transpose("workload", "class").values
    tokens = np.sum(
        weight * (ds["class_input_len"].transpose("workload", "class").values + ds["class_output_len"].values), -1
    )[:, None, None, None, None, None]
    feasible = np.isfinite(replicas)
    cost = np.where(feasible, proc.cost_per_hour(replicas, n_gpu, price), np.nan)
    gpus_total = replicas * n_gpu
    best, any_ok = (np.asarray(v) for v in proc.cheapest_candidate(cost, gpus_total, feasible, tp, batch))
    choice_shape = best.shape

    def pick(x):
        return np.where(any_ok, np.asarray(proc.at_candidate(x, best, choice_shape)), np.nan)

    n_b = len(batch)
    out = ds.copy()
    sized = lambda v: xr.Variable(SIZED, v)  # noqa: E731
    out["replicas_screen"] = ds["replicas"].transpose(*SIZED)
    out["replicas"] = sized(replicas)
    out["feasible"] = sized(feasible)
    out["gpus_total"] = sized(gpus_total)
    out["cost_per_hour"] = sized(cost)
    out["cost_per_mtok"] = sized(np.asarray(proc.cost_per_mtok(cost, rate, tokens)))
    for k, name in (("ttft", "sim_ttft_p_s"), ("tpot", "sim_tpot_p_s"), ("e2e", "sim_e2e_mean_s")):
        out[name] = sized(metrics[k].reshape(grid))
    out["sim_utilization"] = sized(metrics["util"].reshape(grid))
    code = reason.reshape(grid)
    out["sim_reason"] = sized(code.astype(np.int8))
    choice = lambda v: xr.Variable(CHOICE, v)  # noqa: E731
    best_tp = np.where(any_ok, tp[(best // n_b) % N], 0.0)
    out["best_gpu"] = choice(labelled(study, "best_gpu", np.where(any_ok, best // (N * n_b), -1)))
    out["best_tp"] = choice(best_tp)
    best_stages = proc.at_candidate(np.broadcast_to(stages, cost.shape), best, choice_shape)
    best_pp = np.where(any_ok, np.asarray(best_stages), 0.0)
    out["best_pp"] = choice(best_pp)
    out["best_batch"] = choice(np.where(any_ok, batch[best % n_b], 0.0))
    out["best_replicas"] = choice(pick(replicas))
    out["best_replicas_screen"] = choice(pick(ds["replicas"].transpose(*SIZED).values))
    out["best_gpus"] = choice(pick(gpus_total))  # R·n_tp·n_pp·D
    best_cost = pick(cost)
    out["best_cost_per_hour"] = choice(best_cost)
    out["best_cost_per_mtok"] = choice(pick(out["cost_per_mtok"].values))
    out["best_sim_ttft_p_s"] = choice(pick(out["sim_ttft_p_s"].values))
    out["best_sim_tpot_p_s"] = choice(pick(out["sim_tpot_p_s"].values))
    fails = np.stack([np.sum(code == REASON_CODE[n], axis=(3, 4, 5)) for n in ("ttft", "itl", "e2e")], -1)
    no_rate = ~np.isfinite(np.asarray(study.total_rate, float))[:, :, None]
    binding = np.where(any_ok | no_rate, 0, np.where(fails.sum(-1) > 0, REASON_CODE["ttft"] + np.argmax(fails, -1), 1))
    out["binding_slo"] = choice(binding.astype(np.int8))
    # the mix: class k alone at w_k·Λ on its own cheapest candidate
    rk = np.moveaxis(r_class.reshape(W, Rr, K, M, G, N, B), 2, 3)  # (W, Rr, M, K, G, N, B)
    ok_k = np.isfinite(rk)
    cost_k = np.where(ok_k, proc.cost_per_hour(rk, n_gpu[:, :, :, None], price[:, :, :, None]), np.nan)
    best_k, any_k = (np.asarray(v) for v in proc.cheapest_candidate(cost_k, rk * n_gpu[:, :, :, None], ok_k, tp, batch))
    present = (weight > 0)[:, None, None, :]
    mix_ok = any_k & present
    cost_k_best = np.where(mix_ok, np.asarray(proc.at_candidate(cost_k, best_k, best_k.shape)), np.nan)
    mix_cost = np.where(np.all(any_k | ~present, -1), np.nansum(np.where(present, cost_k_best, 0.0), -1), np.nan)
    if "mix_cost_per_hour" in ds:
        mix = lambda v: xr.Variable((*CHOICE, "class"), v)  # noqa: E731
        out["mix_cost_per_hour"] = choice(mix_cost)
        out["mix_saving_per_hour"] = choice(best_cost - mix_cost)
        out["mix_gpu"] = mix(labelled(study, "mix_gpu", np.where(mix_ok, best_k // (N * n_b), -1)))
        out["mix_tp"] = mix(np.where(mix_ok, tp[(best_k // n_b) % N], 0.0))
        out["mix_batch"] = mix(np.where(mix_ok, batch[best_k % n_b], 0.0))
        out["mix_replicas"] = mix(np.where(mix_ok, np.asarray(proc.at_candidate(rk, best_k, best_k.shape)), np.nan))
        out["mix_class_cost_per_hour"] = mix(cost_k_best)
    for name, var in SIZING.items():
        out[name].attrs = base_attrs(var)
    replaced = [n for n in out.data_vars if n in ds and n not in SIZING and not out[n].attrs]  # same meaning, on R_sim
    for name in replaced:
        out[name].attrs = ds[name].attrs
    out["feasible"].attrs = {**ds["feasible"].attrs, "long_name": "R_sim exists: the simulated fleet meets the SLOs"}
    for name in ("ttft_p_s", "e2e_mean_s", "utilization"):
        out[name].attrs = {**ds[name].attrs, "long_name": "screen: " + ds[name].attrs["long_name"] + " at R_screen"}
    engine, scheduling = engine_assumptions(study.serving_table)
    said = [a for a in json.loads(ds.attrs.get("assumptions", "[]")) if not a.startswith("prefill (screen)")]
    said.append(engine)
    blocks = {wl.prefix.block_tokens for wl in study.workloads if wl.prefix is not None}
    if blocks:
        (model, _, serving, _), _ = _candidates(study)
        text = prefix_cache_text(model, serving, min(blocks))
        said.append(
            text if text.startswith("prefix cache: none") else f"{text}; sized with each workload's hashed prompts"
        )
    said.append(
        f"prefill (simulated): {scheduling} (MODEL.md §9), round robin over replicas; Poisson streams seeded "
        f"{study.sizing['seed']}, {study.sizing['requests']:,} requests"
    )
    out.attrs = {
        **ds.attrs,
        "assumptions": json.dumps(said),
        "sizing": "simulation",
        "max_replicas": study.sizing["max_replicas"],
        "sizing_note": "replicas is R_sim, the fewest replicas whose MODEL.md §9 simulation (round robin, the "
        "workload's own stream at each rate) meets every SLO; replicas_screen and ttft_p_s, e2e_mean_s, "
        "utilization are §8's screen",
    }
    return out
