"""The prefix cache in the §9 simulation (docs/simulation.md, "Prefix caching"): equal per request to the plain
event loop of tests/serving_reference.py to 1e-9 in float64 (reuse, LRU eviction under KV pressure, adoption,
affinity routing, round robin's sub-lanes, closed loops, prefill-first steps, speculative decoding); with the cache
off, bit for bit the simulation without it; with a cache that never evicts, each request's hits are the longest
prefix an earlier prompt filled (an independent oracle); the by-hand eviction order and affinity of
tests/test_prefixes.py, in the simulation."""

import json

import numpy as np
import pytest
import serving_reference as sref
from hypothesis import given, settings
from hypothesis import strategies as hs

from slimjax.engine import sim as engine
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog, prefixes
from slimjax.studies import simulate
from slimjax.studies.candidates import candidate_inputs
from slimjax.studies.simulate.fleet import broadcast_candidates

H = 512  # the streams' hash block, tokens


def _stream(seed: int, n: int = 60, span_s: float = 4.0, systems: int = 3, turns: int = 4, out_max: int = 80):
    """Prompts that start with one of a few system prompts (1–3 blocks) and go on with blocks of their own, the
    last one partial; arrivals uniform over ``span_s``."""
    rng = np.random.default_rng(seed)
    roots = [[1000 * s + b for b in range(1 + s % 3)] for s in range(systems)]
    hashes, inputs = [], []
    for i in range(n):
        own = [100_000 + 10 * i + k for k in range(int(rng.integers(0, turns)))]
        blocks = roots[int(rng.integers(systems))] + own
        hashes.append(blocks)
        inputs.append(H * len(blocks) - int(rng.integers(0, H - 1)))
    arrival = np.sort(rng.uniform(0, span_s, n)).round(3).tolist()
    outputs = rng.integers(1, out_max, n).tolist()
    return {
        "arrival_s": arrival,
        "input_len": inputs,
        "output_len": outputs,
        "hash_ids": hashes,
        "hash_block_tokens": H,
    }


def _spec(batch=8, replicas=1, router="round_robin", model="Llama-3.1-8B", stream=None, **serving):
    return dict(
        models=[model],
        gpus=["H100-SXM"],
        tp=[1],
        batch=[batch],
        replicas=[replicas],
        router=router,
        precision="float64",
        serving=serving,
        stream=stream or {"requests": _stream(0)},
    )


def _compare(spec, clients=None, **options):
    """The study against the event loop with the cache's chains, per request; (dataset point, reference)."""
    sim = simulate.parse(spec)
    ds = simulate.run(sim)
    chains = [list(c) for c in sim.stream.prefix.chains]
    arch = catalog.resolve_model(sim.models[0])[1]
    want, _ = sref.simulate_study(sim, arch, clients, chains=chains, block_tokens=H, **options)
    pick = dict(model=0, gpu=0, tp=0, pp=0, batch=0, replicas=0) | ({"clients": 0} if clients else {})
    got = ds.isel(pick)
    np.testing.assert_allclose(got.ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    np.testing.assert_array_equal(got.prefix_hit_tokens.values, want["prefix_hit_tokens"])
    assert ds.attrs["engine_steps"] == want["steps"]
    assert float(got.queue_peak) == max(want["queue_peak"])
    np.testing.assert_allclose(float(got.kv_peak_bytes), max(want["kv_peak"]), rtol=1e-12)
    hit = np.sum(want["prefix_hit_tokens"])
    assert float(got.prefill_tokens_saved) == hit
    np.testing.assert_allclose(float(got.prefix_hit_rate), hit / np.sum(sim.stream.input_len), rtol=1e-12)
    return got, want


CASES = {
    "one_replica": dict(),
    # a pool of a few requests: admissions evict the least recently freed blocks (checked below: evictions happen)
    "kv_pressure": dict(batch=64, gpu_memory_utilization=0.2),
    "chunked_small_budget": dict(chunk_size=512, step_tokens=700),
    "three_replicas_round_robin": dict(batch=64, replicas=3, gpu_memory_utilization=0.2),
    "three_replicas_least_loaded": dict(batch=4, replicas=3, router="least_loaded"),
    "three_replicas_affinity": dict(batch=4, replicas=3, router="prefix_affinity"),
    "two_replicas_affinity_kv_pressure": dict(
        batch=64, replicas=2, router="prefix_affinity", gpu_memory_utilization=0.2
    ),
    "prefill_first": dict(prefill_first=1, chunk_size=1024),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cache_equals_the_event_loop(case):
    got, want = _compare(_spec(**CASES[case]), prefill_first=bool(CASES[case].get("prefill_first")))
    assert np.sum(want["prefix_hit_tokens"]) > 0
    if "kv_pressure" in case:
        assert sum(len(e) for e in want["evicted"]) > 10


def test_cache_with_many_distinct_prefixes_evicts_and_equals_the_event_loop():
    """Twelve system prompts of 1–3 blocks, long own turns and a pool of a few requests: most admissions evict."""
    stream = _stream(3, n=80, span_s=2.0, systems=12, turns=6)
    got, want = _compare(_spec(batch=64, gpu_memory_utilization=0.2, stream={"requests": stream}))
    assert sum(len(e) for e in want["evicted"]) > 50


def test_closed_loop_with_the_cache_equals_the_event_loop():
    """Six clients on two least-loaded replicas, each sending its next request when the last completes."""
    stream = _stream(1, n=48)
    spec = _spec(batch=4, replicas=2, router="least_loaded", stream={"requests": stream})
    got = _engine(spec, 30.0, clients=6)
    sim = simulate.parse(spec)
    t = dict(sref.study_terms(sim, catalog.resolve_model("Llama-3.1-8B")[1]), pool=got["pool"])
    chains = [list(c) for c in sim.stream.prefix.chains]
    want = sref.simulate(
        t, None, stream["input_len"], stream["output_len"], 4, 2, "least_loaded", 6, chains=chains, block_tokens=H
    )
    np.testing.assert_allclose(got["end_s"][0], want["end"], rtol=1e-9, atol=0)
    np.testing.assert_array_equal(got["prefix_hit_tokens"][0], want["prefix_hit_tokens"])
    assert np.sum(want["prefix_hit_tokens"]) > 0


def test_speculative_decoding_with_the_cache_equals_the_event_loop():
    spec = _spec(speculative={"method": "eagle", "tokens": 3, "acceptance_length": 2.6})
    sim = simulate.parse(spec)
    ds = simulate.run(sim)
    arch = catalog.resolve_model(sim.models[0])[1]
    chains = [list(c) for c in sim.stream.prefix.chains]
    t = sref.study_terms(sim, arch)
    want = sref.simulate(
        t,
        sim.stream.arrival_s.tolist(),
        [int(x) for x in sim.stream.input_len],
        [int(x) for x in sim.stream.output_len],
        8,
        chains=chains,
        block_tokens=H,
    )
    got = ds.isel(model=0, gpu=0, tp=0, pp=0, batch=0, replicas=0)
    np.testing.assert_allclose(got.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    np.testing.assert_array_equal(got.prefix_hit_tokens.values, want["prefix_hit_tokens"])


def test_caching_off_is_the_simulation_without_hashes_bit_for_bit():
    """prefix_cache: 0 on a stream with hashes, and a stream without them: every variable equal, bit for bit."""
    stream = _stream(2)
    plain = {k: v for k, v in stream.items() if not k.startswith("hash")}
    for kw in (dict(), dict(replicas=3, router="least_loaded")):
        off = simulate.run(simulate.parse(_spec(stream={"requests": stream}, prefix_cache=0, **kw)))
        none = simulate.run(simulate.parse(_spec(stream={"requests": plain}, **kw)))
        for name in ("ttft_s", "e2e_s", "wait_s", "tpot_s", "kv_peak_bytes", "queue_peak", "token_gap_p90_s"):
            np.testing.assert_array_equal(off[name].values, none[name].values, err_msg=name)
        assert float(off.prefix_hit_rate.max()) == 0.0
        on = simulate.run(simulate.parse(_spec(stream={"requests": stream}, **kw)))
        assert float(on.ttft_s.mean()) < float(none.ttft_s.mean())
    # prefix_affinity without a cache routes as least_loaded
    affinity = simulate.run(simulate.parse(_spec(replicas=3, router="prefix_affinity", prefix_cache=0)))
    least = simulate.run(simulate.parse(_spec(replicas=3, router="least_loaded", prefix_cache=0)))
    np.testing.assert_array_equal(affinity.e2e_s.values, least.e2e_s.values)


@pytest.mark.parametrize("seed", [4, 5])
def test_a_cache_that_never_evicts_hits_the_longest_earlier_prefix(seed):
    """One replica, a pool far larger than the stream, each request done before the next arrives: its hits are the
    longest prefix of its blocks an earlier prompt filled, computed from the raw hashes alone."""
    stream = _stream(seed, n=40, turns=3, out_max=4)
    stream["arrival_s"] = [10.0 * i for i in range(40)]
    ds = simulate.run(simulate.parse(_spec(stream={"requests": stream})))
    got = ds.prefix_hit_tokens.values.reshape(-1)
    seen, want = set(), []
    for hashes, n_tokens in zip(stream["hash_ids"], stream["input_len"], strict=True):
        n = 0
        while n < min((n_tokens - 1) // H, len(hashes)) and tuple(hashes[: n + 1]) in seen:
            n += 1
        want.append(n * H)
        seen.update(tuple(hashes[: b + 1]) for b in range(n_tokens // H))
    np.testing.assert_array_equal(got, want)
    assert sum(want) > 0


def _engine(spec, pool_blocks: float, clients=None):
    """Records of the study's first candidate with its pool set to ``pool_blocks`` cache blocks (engine level;
    ``pool``: that pool, bytes)."""
    sim = simulate.parse(spec)
    model, gpu, serving, batch, _ = broadcast_candidates(sim)
    terms, footprint, _ = candidate_inputs(model, gpu, serving, sim.stream, np.float64)
    terms = dict(terms, pool=terms["prefix_block_bytes"] * pool_blocks)
    stream = {k: getattr(sim.stream, k).astype(np.float64) for k in ("arrival_s", "input_len", "output_len")}
    got = engine.simulate_candidates(
        terms,
        batch,
        footprint,
        stream,
        replicas=int(sim.replicas[0]),
        router=sim.router,
        clients=clients,
        prefix=(sim.stream.prefix.padded(), H),
    )
    return dict(got, pool=float(terms["pool"][0]))


def test_lru_eviction_by_hand_in_the_simulation():
    """tests/test_prefixes.py's constructed stream (a pool of six blocks; A, B, D, C, E): D evicts a2, C finds a1
    only and evicts b2, E finds a1 a2; the simulation's hits and C's prefill of only its last 513 tokens."""
    hashes = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 2, 10], [1, 2, 11]]
    requests = {"arrival_s": [0.0, 1.0, 2.0, 3.0, 4.0], "input_len": [1025] * 5, "output_len": [1] * 5}
    spec = _spec(batch=1, stream={"requests": {**requests, "hash_ids": hashes, "hash_block_tokens": H}})
    got = _engine(spec, 6.0)
    np.testing.assert_array_equal(got["prefix_hit_tokens"][0], [0, 0, 0, 512, 1024])
    sim = simulate.parse(spec)
    t = sref.study_terms(sim, catalog.resolve_model("Llama-3.1-8B")[1])
    ttft = got["first_token_s"][0] - got["arrival_s"][0]
    assert ttft[3] == pytest.approx(sref.step_seconds([], [(513, 512)], t), rel=1e-12)


def test_prefix_affinity_by_hand_in_the_simulation():
    """tests/test_prefixes.py's affinity case: B goes where A's blocks are (hits 1,024 tokens) though the other
    replica is empty; under least_loaded it goes to the empty one and finds nothing."""
    hashes = [[1, 2, 3], [1, 2, 4], [5, 6, 7]]
    requests = {"arrival_s": [0.0, 0.5, 0.6], "input_len": [1025] * 3, "output_len": [400, 10, 10]}
    stream = {"requests": {**requests, "hash_ids": hashes, "hash_block_tokens": H}}
    affinity = _engine(_spec(batch=8, replicas=2, router="prefix_affinity", stream=stream), 40.0)
    least = _engine(_spec(batch=8, replicas=2, router="least_loaded", stream=stream), 40.0)
    np.testing.assert_array_equal(affinity["replica"][0], [0, 0, 1])
    np.testing.assert_array_equal(affinity["prefix_hit_tokens"][0], [0, 1024, 0])
    np.testing.assert_array_equal(least["replica"][0], [0, 1, 1])
    np.testing.assert_array_equal(least["prefix_hit_tokens"][0], [0, 0, 0])


@settings(max_examples=12, deadline=None)
@given(
    seed=hs.integers(0, 10_000),
    pool_blocks=hs.floats(6.0, 60.0),  # a prompt: at most 5 blocks and its output
    replicas=hs.integers(1, 3),
    router=hs.sampled_from(["round_robin", "least_loaded", "prefix_affinity"]),
)
def test_hits_never_exceed_what_an_earlier_prompt_filled(seed, pool_blocks, replicas, router):
    """Whatever the pool, the replicas and the router: a request's hits are whole blocks, below its prompt, and at
    most the longest prefix an earlier prompt of the stream filled (what a cache that never evicts would find)."""
    stream = _stream(seed, n=24, span_s=1.0, turns=3)
    spec = _spec(batch=8, replicas=replicas, router=router, stream={"requests": stream})
    hits = _engine(spec, pool_blocks)["prefix_hit_tokens"][0]
    assert np.isfinite(hits).all()
    blocks = prefixes.chain_blocks(stream["hash_ids"], stream["input_len"], H, "stream")
    bound = prefixes.reused_blocks(blocks, stream["input_len"]) * H
    assert np.all(np.mod(hits, H) == 0) and np.all(hits < np.asarray(stream["input_len"]))
    assert np.all(hits <= bound)


def test_bad_cache_settings_are_named():
    with pytest.raises(SlimjaxError) as e:
        simulate.run(simulate.parse(_spec(block_size=48)))
    assert e.value.field == "serving.block_size"
    plain = {k: v for k, v in _stream(0).items() if not k.startswith("hash")}
    with pytest.raises(SlimjaxError) as e:
        simulate.parse(_spec(replicas=2, router="prefix_affinity", stream={"requests": plain}))
    assert e.value.field == "router"
    with pytest.raises(SlimjaxError) as e:
        simulate.parse(_spec(prefix_cache=2))
    assert e.value.field == "serving.prefix_cache"


def test_procurement_sizes_a_hashed_trace_with_its_cache(tmp_path):
    """A CSV trace whose prompts all begin with one 4,096-token system prompt (8 blocks): sized with each replica's
    prefix cache it needs fewer replicas than without (prefill dominates), and the assumptions say the fleet was
    sized with the cache. With the setting swept, each setting equals its own study."""
    import slimjax

    rng = np.random.default_rng(7)
    rows = ["timestamp,input_tokens,output_tokens,hash_ids"]
    for i in range(240):
        own = int(rng.integers(1, 500))
        hashes = " ".join([str(b) for b in range(1, 9)] + [str(1000 + i)])
        rows.append(f"{i * 0.05:.3f},{8 * H + own},{int(rng.integers(2, 20))},{hashes}")
    path = tmp_path / "system_prompt.csv"
    path.write_text("\n".join(rows) + "\n")
    spec = dict(
        workloads=[dict(name="chat", trace=str(path), format="csv", hash_block_tokens=H, classes=1)],
        rate_scale=[1.0],
        models=["Llama-3.1-8B"],
        gpus=["H100-SXM"],
        tp=[1],
        batch=[32],
        slo=dict(ttft_s=0.5, itl_s=0.05),
        serving=dict(engine="trtllm"),
        settings=[{"prefix_cache": 0}, {"prefix_cache": 1}],
    )
    ds = slimjax.procure(spec).isel(workload=0, rate=0, model=0)
    replicas = ds.replicas.sel(gpu="H100-SXM").squeeze().values
    assert np.all(np.isfinite(replicas)) and replicas[1] < replicas[0]
    alone = slimjax.procure({**spec, "settings": None, "serving": {"engine": "trtllm", "prefix_cache": 1}})
    assert float(alone.isel(workload=0, rate=0, model=0).replicas.squeeze()) == replicas[1]
    assert any("sized with each workload's hashed prompts" in a for a in json.loads(alone.attrs["assumptions"]))


def test_a_lane_tracks_the_chains_two_prompts_fill():
    """By hand: chains 0 1 (the second partial, so not filled) and 0 2 3: only chain 0 is in two prompts' full
    blocks; each request has one tracked block and ⌊I/512⌋ full ones. A lane of no requests has no tables."""
    from slimjax.engine.sim.cache import STREAM_KEYS, lane_chains

    got = lane_chains(np.array([[0, 1, -1], [0, 2, 3]]), [1100, 1600], H)
    np.testing.assert_array_equal(got[STREAM_KEYS["chain"]], [[0], [0]])
    np.testing.assert_array_equal(got[STREAM_KEYS["tracked"]], [1, 1])
    np.testing.assert_array_equal(got[STREAM_KEYS["full"]], [2, 3])
    assert got[STREAM_KEYS["tables"]].shape == (2,)  # chain 0 and the no-chain column
    empty = lane_chains(np.zeros((0, 5)), np.zeros(0), H)
    assert empty[STREAM_KEYS["chain"]].shape == (0, 1) and empty[STREAM_KEYS["tables"]].shape == (1,)


def test_the_report_shows_the_hit_rate_and_ttft_with_and_without_the_cache():
    from slimjax.studies.simulate import present

    spec = _spec(replicas=2, router="prefix_affinity")
    both = simulate.run(simulate.parse({**spec, "settings": [{"prefix_cache": 0}, {"prefix_cache": 1}]}))
    figures = {f.key: f for f in present.simulation_figures(both)}
    assert "prefix_cache" in figures
    hit_axis, ttft_axis = figures["prefix_cache"].figure.axes[:2]
    assert len(hit_axis.lines) == 2  # one line per replica
    assert {line.get_linestyle() for line in ttft_axis.lines} == {"-", "--"}  # with and without the cache
    assert "cached" in present.simulation_table(both)
    off = simulate.run(simulate.parse({**spec, "serving": {"prefix_cache": 0}}))
    assert "prefix_cache" not in [f.key for f in present.simulation_figures(off)]
    assert "cached" not in present.simulation_table(off).splitlines()[1]
