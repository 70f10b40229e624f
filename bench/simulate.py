"""The §9 serving simulation against the plain Python event loop of tests/serving_reference.py, per candidate,
in the same process (ratios, not timings: these machines are noisy), and the engine's steps/s on a slice of
Azure's conversation trace.

    python bench/simulate.py [--candidates 1,64,1024] [--bursty 64,1024] [--requests 200] [--trace-seconds 120]
                             [--hour 1000]

Candidates are Llama-3.1-8B on an H100 at batch limits spread over 8 … 256 (the reference is timed on a few of
them and scaled per candidate: it is a loop per candidate by construction). Streams: Poisson of fixed lengths, a
bursty mixed-length one (:func:`bursty_stream`, at 1 and 3 replicas), Azure's conversation trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import serving_reference as sref  # noqa: E402

import slimjax  # noqa: E402
from slimjax.inputs import catalog  # noqa: E402
from slimjax.studies import simulate  # noqa: E402

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def _spec(batches, stream, **serving):
    return dict(
        models=["Llama-3.1-8B"], gpus=["H100-SXM"], batch=batches, stream=stream, precision="float64", serving=serving
    )


def _with_batches(sim, batches):
    """``sim`` with its candidates' batch limits replaced (repeated limits welcome: each is its own lane)."""
    return dataclasses.replace(sim, batch=np.asarray(batches, float))


def _reference_seconds(sim, batches, repeats=3, **policy):
    arch, gpu = catalog.resolve_model("Llama-3.1-8B")[1], catalog.resolve_gpu("H100-SXM")[1]
    sv = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in sim.serving.fields().items()}
    terms = sref.replica_terms(arch, gpu, sv)
    st = sim.stream
    I, O = [int(x) for x in st.input_len], [int(x) for x in st.output_len]
    picks = batches[:: max(1, len(batches) // repeats)][:repeats]
    t = time.perf_counter()
    for b in picks:
        sref.simulate(terms, st.arrival_s.tolist(), I, O, int(b), **policy)
    return (time.perf_counter() - t) / len(picks)


def _timed(sim):
    t = time.perf_counter()
    ds = simulate.run(sim)
    return ds, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", default="1,64,1024")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--trace-seconds", type=float, default=120.0)
    ap.add_argument("--hour", type=int, default=0, help="candidates through the whole one-hour conversation trace")
    ap.add_argument("--staged", type=int, default=32, help="pipeline and disaggregated candidates (MODEL.md §10)")
    ap.add_argument("--paged", type=int, default=64, help="candidates with paged KV that preempt (docs/engines.md)")
    ap.add_argument("--bursty", default="64", help="candidate counts on the bursty mixed-length stream (0: none)")
    ap.add_argument("--speculative", type=int, default=64, help="candidates with speculative decoding, against none")
    ap.add_argument("--prefix", type=int, default=64, help="candidates on the Mooncake trace with its prefix cache")
    ap.add_argument("--prefix-seconds", type=float, default=300.0, help="... its first seconds (0: the whole hour)")
    args = ap.parse_args()
    slimjax.configure()
    stream = dict(poisson=6.0, input_len=1000, output_len=200, requests=args.requests, seed=0)
    print(f"stream: Poisson 6/s, {args.requests} requests of (1000, 200); Llama-3.1-8B on H100-SXM")
    for k in (int(x) for x in args.candidates.split(",") if int(x)):
        batches = list(np.unique(np.round(np.geomspace(8, 256, k)).astype(int)))
        while len(batches) < k:  # repeat limits: still k candidates, each its own lane
            batches = batches + batches
        batches = sorted(batches[:k])
        sim = simulate.parse(_spec([int(b) for b in range(1, k + 1)], stream))
        sim = _with_batches(sim, batches)
        simulate.run(sim)  # compiles; packets' shapes depend on timing, so the best of three runs
        ds, wall = min((_timed(sim) for _ in range(3)), key=lambda got: got[1])
        jitted = wall / k
        ref = _reference_seconds(sim, batches)
        steps = ds.attrs["engine_steps"]
        print(
            f"{k:>5} candidates: jitted {jitted * 1e3:8.2f} ms/candidate, reference {ref * 1e3:8.2f} ms/candidate, "
            f"ratio {ref / jitted:6.1f}x, {steps / (jitted * k):,.0f} lane-steps/s"
        )
    for k in (int(x) for x in args.bursty.split(",") if int(x)):
        _bursty(k)
    if args.staged:
        _pipelines_and_pools(stream, args.staged)
    if args.paged:
        _paged(dict(stream, poisson=12.0, output_len=600), args.paged)
    if args.speculative:
        _speculative(stream, args.speculative)
    if args.prefix:
        _prefix(args.prefix, args.prefix_seconds)
    trace = DATA / "traces" / "AzureLLMInferenceTrace_conv.csv"
    if args.trace_seconds and trace.is_file():
        spec = _spec(
            [16, 32, 64, 128],
            dict(trace=str(trace), format="azure", rate_scale=1, duration_s=args.trace_seconds),
        )
        sim = simulate.parse({**spec, "precision": "float32"})
        simulate.run(sim)
        ds, wall = _timed(sim)
        print(
            f"Azure conversation, first {args.trace_seconds:g} s ({sim.stream.n_requests} requests) x 4 candidates, "
            f"float32: {wall:.2f} s, {ds.attrs['engine_steps'] / wall:,.0f} lane-steps/s"
        )

    if args.hour and trace.is_file():
        k = args.hour
        batches = np.round(np.geomspace(8, 256, k)).astype(float)
        spec = _spec([8], dict(trace=str(trace), format="azure", rate_scale=1))
        sim = simulate.parse({**spec, "precision": "float32"})
        sim = _with_batches(sim, batches)
        ds, wall = _timed(sim)
        print(
            f"Azure conversation, whole hour ({sim.stream.n_requests} requests) x {k} candidates (B 8 … 256), "
            f"float32: {wall:.1f} s with compiles, {ds.attrs['engine_steps'] / wall:,.0f} lane-steps/s"
        )


def bursty_stream(requests: int = 400, burst: int = 10, seed: int = 0) -> dict:
    """A bursty, mixed-length stream (issue 38): bursts of ``burst`` simultaneous arrivals one second apart on
    average (Poisson), prompts log-uniform over 16 … 5,000 tokens, outputs log-uniform over 1 … 700 (many short)."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(burst / 10.0, requests // burst))
    arrival = np.repeat(starts, burst)[:requests]
    i_len = np.round(np.exp(rng.uniform(np.log(16), np.log(5000), requests)))
    o_len = np.round(np.exp(rng.uniform(np.log(1), np.log(700), requests)))
    return dict(requests=dict(arrival_s=arrival.tolist(), input_len=i_len.tolist(), output_len=o_len.tolist()))


def _bursty(k: int) -> None:
    """The bursty mixed-length stream through k candidates (batch limits 8 … 256) at 1 and 3 replicas (round robin),
    per candidate against the event loop on the same stream, warm."""
    batches = sorted(int(b) for b in np.round(np.geomspace(8, 256, k)))
    for replicas in (1, 3):
        sim = simulate.parse({**_spec([8], bursty_stream()), "replicas": [replicas]})
        sim = _with_batches(sim, batches)
        simulate.run(sim)  # compiles; packets' shapes depend on timing, so the best of three runs
        ds, wall = min((_timed(sim) for _ in range(3)), key=lambda got: got[1])
        ref = _reference_seconds(sim, batches, replicas=replicas)
        jitted = wall / len(batches)
        print(
            f"bursty, {len(batches)} candidates x {replicas} replica(s), busy {float(ds.utilization.mean()):.0%}: "
            f"jitted {jitted * 1e3:8.2f} ms/candidate, reference {ref * 1e3:8.2f} ms/candidate, "
            f"ratio {ref / jitted:6.1f}x, {ds.attrs['engine_steps'] / wall:,.0f} lane-steps/s"
        )


def _paged(stream, k: int) -> None:
    """Paged KV under recompute on a pool of ~8,000 tokens (reserved memory eats the rest), Poisson 12/s of
    (1000, 600), where outputs outgrow it and requests are preempted: per candidate against the event loop with the
    same rules."""
    batches = sorted(int(b) for b in np.round(np.geomspace(8, 256, k)))
    sim = simulate.parse(_spec([8], stream, kv_policy="recompute", reserved_gib=56.0))
    sim = _with_batches(sim, batches)  # repeated limits welcome
    simulate.run(sim)  # compile
    ds, wall = _timed(sim)
    ref = _reference_seconds(sim, batches, policy="recompute")
    jitted = wall / len(batches)
    print(
        f"paged (recompute), {len(batches)} candidates, {float(ds.preemptions_mean.mean()):.2f} preemptions per "
        f"request: jitted {jitted * 1e3:8.2f} ms/candidate, reference {ref * 1e3:8.2f} ms/candidate, "
        f"ratio {ref / jitted:6.1f}x"
    )


def _speculative(stream, k: int) -> None:
    """docs/speculative.md: k candidates (batch limits 8 … 256) speculating with EAGLE (k = 3, a = 2.4) against the
    same candidates without it, warm, best of three each, and against the event loop with the same rules."""
    batches = sorted(int(b) for b in np.round(np.geomspace(8, 256, k)))
    walls, steps = {}, {}
    for label, serving in (
        ("off", {}),
        ("eagle", {"speculative": dict(method="eagle", tokens=3, acceptance_length=2.4)}),
    ):
        sim = _with_batches(simulate.parse(_spec([8], stream, **serving)), batches)
        simulate.run(sim)  # compiles
        ds, walls[label] = min((_timed(sim) for _ in range(3)), key=lambda got: got[1])
        steps[label] = ds.attrs["engine_steps"]
    ref = _reference_seconds(sim, batches)
    jitted = walls["eagle"] / len(batches)
    print(
        f"speculative (EAGLE k 3, a 2.4), {len(batches)} candidates: {walls['eagle'] / walls['off']:.2f}x the wall of "
        f"the same candidates without it ({steps['eagle']:,} lane-steps against {steps['off']:,}); jitted "
        f"{jitted * 1e3:8.2f} ms/candidate, reference {ref * 1e3:8.2f} ms/candidate, ratio {ref / jitted:6.1f}x"
    )


def _prefix(k: int, seconds: float) -> None:
    """docs/simulation.md, prefix caching: k candidates (batch limits 8 … 256, Llama-3.1-8B on H100, KV reserved) on
    the Mooncake conversation trace (its first ``seconds``, or the hour) with the cache against the same candidates
    without it, each run once after a compiling run on 8 candidates."""
    trace = DATA / "traces" / "mooncake_conversation_trace.jsonl"
    if not trace.is_file():
        print(f"prefix cache: skipped, {trace} absent")
        return
    batches = np.round(np.geomspace(8, 256, k)).astype(float)
    block = dict(trace=str(trace), format="mooncake", **({"duration_s": seconds} if seconds else {}))
    walls, steps, hit = {}, {}, 0.0
    for cache in (0, 1):
        sim = simulate.parse({**_spec([8], block, prefix_cache=cache), "precision": "float32"})
        simulate.run(_with_batches(sim, batches[:: max(1, k // 8)]))  # compiles most shapes
        ds, walls[cache] = _timed(_with_batches(sim, batches))
        steps[cache] = ds.attrs["engine_steps"]
        hit = float(ds.prefix_hit_rate.mean()) if cache else hit
    n = sim.stream.n_requests
    span = f"first {seconds:g} s" if seconds else "the hour"
    print(
        f"prefix cache, Mooncake {span} ({n} requests) x {k} candidates, float32: {walls[1]:.1f} s with the cache, "
        f"{walls[0]:.1f} s without ({walls[1] / walls[0]:.2f}x; {steps[1]:,} lane-steps against {steps[0]:,}; "
        f"{walls[1] / steps[1] * 1e6:.2f} against {walls[0] / steps[0] * 1e6:.2f} µs a lane-step); mean hit rate "
        f"{hit:.1%}"
    )


def _pipelines_and_pools(stream, k: int) -> None:
    """MODEL.md §10: k pipelined candidates (Llama-3.1-70B, H100 TP 2 × PP 2, batch limits 8 … 256) and k
    disaggregated deployments (prefill H100 TP 2, decode H200 TP 2 at batch limits 8 … 256), each against the
    Python event loop of §10 in the same run."""
    arch, h100, h200 = (
        catalog.resolve_model("Llama-3.1-70B")[1],
        catalog.resolve_gpu("H100-SXM")[1],
        catalog.resolve_gpu("H200")[1],
    )
    batches = [int(b) for b in np.round(np.geomspace(8, 256, k))]
    spec = dict(models=["Llama-3.1-70B"], gpus=["H100-SXM"], tp=[2], pp=[2], batch=batches, stream=stream)
    sim = simulate.parse({**spec, "precision": "float64"})
    for _ in range(2):  # compiles: the second run meets slot widths the first one's guesses skipped
        simulate.run(sim)
    t = time.perf_counter()
    simulate.run(sim)
    jitted = (time.perf_counter() - t) / len(batches)
    sv = {key: float(np.asarray(v).reshape(-1)[0]) for key, v in sim.serving.fields().items()}
    terms = sref.stage_terms(arch, h100, sv, 2)
    st = sim.stream
    I, O, A = [int(x) for x in st.input_len], [int(x) for x in st.output_len], st.arrival_s.tolist()
    t = time.perf_counter()
    for b in batches[:3]:
        sref.simulate_pipeline(terms, A, I, O, b)
    ref = (time.perf_counter() - t) / 3
    print(f"{k:>5} pipelined (TP 2 × PP 2) candidates: ratio {ref / jitted:6.1f}x ({jitted * 1e3:.1f} ms/candidate)")

    deps = [dict(prefill={"gpu": "H100-SXM", "tp": 2}, decode={"gpu": "H200", "tp": 2, "batch": b}) for b in batches]
    sim = simulate.parse({**spec, "pp": [1], "batch": [8], "disaggregated": deps, "precision": "float64"})
    for _ in range(2):
        simulate.run(sim)
    t = time.perf_counter()
    simulate.run(sim)
    jitted = (time.perf_counter() - t) / len(deps)  # (the one aggregated candidate rides along)
    d = sim.deployments[0]
    tp_ = sref.stage_terms(
        arch, h100, {key: float(np.asarray(v)[0]) for key, v in d.prefill.serving.fields().items()}, 1
    )
    td = sref.stage_terms(arch, h200, {key: float(np.asarray(v)[0]) for key, v in d.decode.serving.fields().items()}, 1)
    from slimjax.studies.disaggregated import transfer_seconds

    kv = arch["n_layers"] * sref.kv_bytes_per_layer_token(arch)
    t = time.perf_counter()
    for dep in sim.deployments[:3]:
        sref.simulate_disaggregated(
            tp_, td, A, I, O, 1, 1, int(dep.decode.batch), lambda i, dep=dep: float(transfer_seconds(kv * I[i], dep))
        )
    ref = (time.perf_counter() - t) / 3
    print(f"{k:>5} disaggregated deployments: ratio {ref / jitted:6.1f}x ({jitted * 1e3:.1f} ms/deployment)")


if __name__ == "__main__":
    main()
