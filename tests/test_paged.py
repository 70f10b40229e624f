"""Paged KV with preemption and prefill-first steps (docs/engines.md): the jitted simulation against the plain
Python event loop of tests/serving_reference.py per request (float64, 1e-9) under each policy, and its limits: a
pool no request outgrows gives every policy the same times, and `reserve` with mixed steps is §9 as written."""

import math

import numpy as np
import pytest
import reference as ref
import serving_reference as sref

from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog
from slimjax.studies import simulate

RNG = np.random.default_rng(11)
N = 40
ARRIVALS = np.sort(RNG.uniform(0, 2, N)).round(3)
INPUTS = RNG.integers(100, 1500, N)
OUTPUTS = RNG.integers(1, 400, N)
MODEL, GPU = "Llama-3.1-8B", "H100-SXM"


def _reserved_gib(pool_tokens: float, model=MODEL, gpu=GPU, tp=1) -> float:
    """The reserved memory that leaves a pool of ``pool_tokens`` tokens of KV (u = 0.9)."""
    arch, g = catalog.resolve_model(model)[1], catalog.resolve_gpu(gpu)[1]
    per_token = arch["n_layers"] * ref.kv_bytes_per_layer_token(arch)
    pool = pool_tokens * per_token
    return (0.9 * tp * g["memory_bytes"] - arch["n_params"] * arch["bytes_per_weight"] - pool) / 2**30


def _spec(policy, batch=32, *, replicas=1, router="round_robin", stream=None, pool_tokens=9000, **serving):
    stream = stream or {
        "requests": {"arrival_s": ARRIVALS.tolist(), "input_len": INPUTS.tolist(), "output_len": OUTPUTS.tolist()}
    }
    return dict(
        models=[MODEL],
        gpus=[GPU],
        tp=[1],
        batch=[batch],
        replicas=[replicas],
        router=router,
        precision="float64",
        serving=dict(kv_policy=policy, reserved_gib=_reserved_gib(pool_tokens), **serving),
        stream=stream,
    )


def _compare(spec, clients=None):
    sim = simulate.parse(spec)
    ds = simulate.run(sim)
    want, terms = sref.simulate_study(
        sim,
        catalog.resolve_model(MODEL)[1],
        clients,
        policy=spec["serving"]["kv_policy"],
        watermark=spec["serving"].get("kv_watermark", 0.0),
        prefill_first=bool(spec["serving"].get("prefill_first", 0)),
    )
    got = ds.isel(dict(model=0, gpu=0, tp=0, pp=0, batch=0, replicas=0) | ({"clients": 0} if clients else {}))
    np.testing.assert_allclose(got.ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    np.testing.assert_array_equal(got.preemptions.values, want["preemptions"])
    assert ds.attrs["engine_steps"] == want["steps"]
    assert float(got.queue_peak) == max(want["queue_peak"])
    np.testing.assert_allclose(float(got.kv_peak_bytes), max(want["kv_peak"]), rtol=1e-12)
    exact = float(np.quantile(want["gaps"], 0.9))
    assert abs(float(got.token_gap_p90_s) / exact - 1) < 0.012  # one histogram bin
    return ds, want, terms


@pytest.mark.parametrize("policy", ["recompute", "retract"])
@pytest.mark.parametrize(
    "case",
    [
        dict(),  # one replica: contiguous, decode stretches
        dict(chunk_size=256, step_tokens=700),  # prompts in chunks, preempted mid-prefill too
        dict(replicas=2, router="least_loaded"),
        dict(kv_watermark=0.01, pool_tokens=5000),
    ],
    ids=["one_replica", "chunked", "least_loaded", "watermark"],
)
def test_paged_simulation_equals_the_event_loop(policy, case):
    """Growth past the pool preempts (each policy its victims), a preempted request is prefilled again over its
    prompt and emitted tokens, and the engine equals the event loop per request."""
    ds, want, _ = _compare(_spec(policy, **case))
    assert sum(want["preemptions"]) > 0  # the pool is outgrown: the rules under test run
    assert float(ds.preemptions_mean.squeeze()) > 0


@pytest.mark.parametrize("policy", ["recompute", "retract"])
def test_paged_closed_loop_equals_the_event_loop(policy):
    """A benchmark's closed loop of identical requests whose outputs outgrow the pool (issue: 8,192-token outputs
    at many clients)."""
    stream = {"closed_loop": {"clients": [12], "input_len": 600, "output_len": 900, "requests_per_client": 3}}
    _, want, _ = _compare(_spec(policy, batch=12, stream=stream, pool_tokens=9000), clients=12)
    assert sum(want["preemptions"]) > 0


def test_policies_choose_different_victims():
    """recompute evicts the most recently admitted, retract the fewest emitted tokens: on a stream where the
    latest admitted is not the least advanced, the runs differ."""
    got = {p: simulate.run(simulate.parse(_spec(p))).squeeze() for p in ("recompute", "retract")}
    assert not np.allclose(got["recompute"].e2e_s.values, got["retract"].e2e_s.values)


def test_a_pool_nothing_outgrows_gives_every_policy_the_same_times():
    """Limits: with a pool no request mix outgrows and admission bound by the batch limit alone, reserve,
    recompute and retract are the same schedule."""
    runs = [simulate.run(simulate.parse(_spec(p, batch=8, pool_tokens=200_000))).squeeze() for p in KV]
    for other in runs[1:]:
        np.testing.assert_allclose(other.ttft_s.values, runs[0].ttft_s.values, rtol=1e-12)
        np.testing.assert_allclose(other.e2e_s.values, runs[0].e2e_s.values, rtol=1e-12)
        assert float(other.preemptions.sum()) == 0


KV = ("reserve", "recompute", "retract")


def test_paging_admits_what_reservation_queues():
    """The issue's case in small: outputs long enough that reserving I + O holds few requests, while blocks
    allocated as tokens come admit them all (and preempt late, if at all): TTFT falls by an order of magnitude."""
    stream = {"closed_loop": {"clients": [16], "input_len": 500, "output_len": 4000, "requests_per_client": 2}}
    reserve, paged = (
        simulate.run(simulate.parse(_spec(p, batch=16, stream=stream, pool_tokens=30_000))).squeeze()
        for p in ("reserve", "recompute")
    )
    assert float(reserve.ttft_mean_s) > 10 * float(paged.ttft_mean_s)
    assert float(reserve.queue_peak) > 0


def test_layer_blocks_are_the_footprint():
    """u(T)·unit bytes is §3's footprint(T) exactly, sliding layers included (gpt-oss)."""
    from slimjax.model import memory

    arch = catalog.resolve_model("gpt-oss-120b")[1]
    beta = 16
    unit = ref.kv_bytes_per_layer_token(arch) * beta
    L_s = arch["n_sliding_layers"]
    for T in (1, 15, 16, 17, 127, 128, 129, 5000):
        u = float(memory.kv_block_units(T, beta, arch["n_layers"] - L_s, L_s, arch["window"]))
        assert u * unit == ref.footprint(arch, T, beta)
        assert u == (arch["n_layers"] - L_s) * math.ceil(T / beta) + L_s * math.ceil(min(T, arch["window"]) / beta)


def test_kv_policy_is_checked():
    with pytest.raises(SlimjaxError, match=r"serving\.kv_policy: must be one of reserve, recompute, retract"):
        simulate.parse(_spec("evict-all"))
    with pytest.raises(SlimjaxError, match=r"serving\.kv_watermark: must be in \[0, 1\)"):
        simulate.parse(_spec("recompute", kv_watermark=1.5))


def test_watermark_holds_admissions_back():
    """An admission must leave w of the pool free: a larger watermark queues more."""
    peaks = [
        float(simulate.run(simulate.parse(_spec("recompute", kv_watermark=w, pool_tokens=5000))).queue_peak.squeeze())
        for w in (0.0, 0.3)
    ]
    assert peaks[1] > peaks[0]


def test_a_prompt_the_watermark_never_admits_is_named():
    stream = {"requests": {"arrival_s": [0.0, 0.1], "input_len": [100, 4000], "output_len": [10, 10]}}
    with pytest.raises(SlimjaxError, match=r"stream request 1: its prompt of 4000 tokens needs .* watermark"):
        simulate.run(simulate.parse(_spec("recompute", stream=stream, pool_tokens=5000, kv_watermark=0.3)))


@pytest.mark.parametrize("policy", KV)
@pytest.mark.parametrize(
    "case",
    [dict(), dict(chunk_size=300, step_tokens=800), dict(replicas=2, router="least_loaded")],
    ids=["one_replica", "chunked", "least_loaded"],
)
def test_prefill_first_equals_the_event_loop(policy, case):
    """A step with prompt tokens left runs them alone (SGLang's default): decodes wait, their token gaps span the
    prefill steps, and nothing grows in such a step; the engine equals the event loop per request and in gaps."""
    ds, want, _ = _compare(_spec(policy, prefill_first=1, **case))
    mixed = simulate.run(simulate.parse(_spec(policy, **case))).squeeze()
    assert not np.allclose(ds.e2e_s.squeeze().values, mixed.e2e_s.values)


def test_prefill_first_delays_decodes_and_speeds_first_tokens():
    """Prefill first trades TPOT for TTFT: on a burst of long prompts behind running decodes, first tokens come
    sooner and the tokens of the running requests later than with mixed steps."""
    n = 24
    stream = {
        "requests": {
            "arrival_s": [0.0] * 8 + [0.5] * (n - 8),
            "input_len": [200] * 8 + [3000] * (n - 8),
            "output_len": [300] * 8 + [20] * (n - 8),
        }
    }
    got = {
        p: simulate.run(simulate.parse(_spec("reserve", stream=stream, pool_tokens=200_000, prefill_first=p))).squeeze()
        for p in (0, 1)
    }
    late = slice(8, None)
    assert float(got[1].ttft_s[late].mean()) < float(got[0].ttft_s[late].mean())
    assert float(got[1].tpot_s[:8].mean()) > float(got[0].tpot_s[:8].mean())
