"""Capacity-calculator formulas (MODEL.md §3–§5) in float64 against loop references and published figures."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from slimjax.config import float64_scope
from slimjax.inputs.catalog import resolve_model
from slimjax.model import memory, queue, roofline
from slimjax.model.specs import ModelSpec, stack


def e_kv_of(name):
    arch = resolve_model(name)[1]
    return arch, float(memory.model_kv_bytes_per_layer_token(stack(ModelSpec, [arch]))[0])


def test_opt13b_request_is_1_5625_gib():
    """PagedAttention: 800 KiB/token, up to 1.6 GB (1.5625 GiB) for one 2048-token request."""
    arch, e_kv = e_kv_of("OPT-13b")
    fp = float(
        memory.seq_footprint_bytes(
            e_kv, arch["n_layers"], arch["n_sliding_layers"], arch["window"], 2048.0, 16.0, 1.0, 1.0
        )
    )
    assert fp == 1_677_721_600 == 1.5625 * 2**30


def test_mistral_rolling_buffer_8x_smaller_at_32k():
    arch, e_kv = e_kv_of("Mistral-7B-v0.1")
    assert e_kv * arch["n_layers"] == 131_072  # 128 KiB per token in bf16
    args = (e_kv, arch["n_layers"], arch["n_sliding_layers"], arch["window"], 32768.0, 16.0, 1.0, 1.0)
    rolling = float(memory.seq_footprint_bytes(*args))
    full = float(memory.seq_footprint_bytes(e_kv, arch["n_layers"], 0.0, math.inf, 32768.0, 16.0, 1.0, 1.0))
    assert full == 4 * 2**30 and rolling == 0.5 * 2**30 and full / rolling == 8


def test_deepseek_v2_footprint_uses_latent_width():
    arch, e_kv = e_kv_of("DeepSeek-V2")
    assert e_kv / 2 * arch["n_layers"] == 34_560
    fp = float(memory.seq_footprint_bytes(e_kv, arch["n_layers"], 0.0, math.inf, 1000.0, 16.0, 1.0, 1.0))
    assert fp == 34_560 * 2 * 1008


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 20000),
    st.integers(1, 256),
    st.sampled_from([math.inf, 128, 4096]),
    st.integers(0, 64),
    st.integers(1, 80),
    st.floats(1, 2),
    st.floats(1, 1.5),
    st.floats(1e8, 1e12),
    st.floats(0, 1e10),
)
def test_footprint_and_max_seqs_match_definition(N, block, W, L_s, L, r, o, fp_scale, pool_extra):
    L_s = min(L_s, L) if W != math.inf else 0
    arch = dict(n_kv_heads=8, head_dim=128, kv_dtype_bytes=2, mla=0, n_layers=L, n_sliding_layers=L_s, window=W)
    e_kv = ref.kv_bytes_per_layer_token(arch)
    got = float(memory.seq_footprint_bytes(e_kv, L, L_s, W, float(N), float(block), r, o))
    want = ref.footprint(arch, N, block, r, o)
    assert got == pytest.approx(want, rel=1e-14)
    pool = got * (pool_extra / fp_scale) if pool_extra else -1.0
    q = int(memory.max_concurrent_seqs(pool, got))
    if pool > 0 and pool / got < 5000:
        assert q == ref.max_seqs(pool, got)
    assert q >= 0 and (q == 0 or q * got <= pool) and (q + 1) * got > pool or pool <= 0


def test_max_seqs_exact_at_integer_boundaries():
    for fp in (819_200.0 * 2048, 3.0, 7.0 * 2**20, 1e9 + 7):
        for n in (1, 2, 3, 1000, 12345):
            assert int(memory.max_concurrent_seqs(n * fp, fp)) == n
            assert int(memory.max_concurrent_seqs(n * fp - 1e-3 * fp, fp)) == n - 1
    assert int(memory.max_concurrent_seqs(-5.0, 3.0)) == 0 and int(memory.max_concurrent_seqs(0.0, 3.0)) == 0


@st.composite
def rooflines(draw):
    L = draw(st.integers(1, 80))
    sliding = draw(st.booleans())
    W = float(draw(st.sampled_from([64, 512, 4096]))) if sliding else math.inf
    return dict(
        P=draw(st.floats(1e8, 1e11)),
        a=4.0 * L * draw(st.integers(1, 64)) * 128,
        M_W=draw(st.floats(1e8, 2e11)),
        e_kv=float(draw(st.sampled_from([512, 4096, 65536]))),
        L=L,
        L_s=draw(st.integers(0, L)) if sliding else 0,
        W=W,
        F=draw(st.floats(1e13, 5e15)),
        BW=draw(st.floats(1e11, 1e13)),
        t_l=draw(st.sampled_from([0.0, 1e-5, 3e-3])),
        r=draw(st.sampled_from([1.0, 2.0])),
        o=draw(st.sampled_from([1.0, 1.1])),
    )


def _roof_args(x):
    c = x["r"] * x["o"] * x["e_kv"]
    return roofline.Roof(
        active_params=x["P"],
        weights=x["M_W"],
        routed_expert_bytes=0.0,
        n_experts=0.0,
        experts_per_token=0.0,
        kv_per_token_full=c * (x["L"] - x["L_s"]),
        kv_per_token_sliding=c * x["L_s"],
        window=x["W"],
        flops=x["F"],
        bandwidth=x["BW"],
        launch_overhead_s=x["t_l"],
    )


def _ref_args(x):
    return (x["P"], x["a"], x["M_W"], x["e_kv"], x["L"], x["L_s"], x["W"], x["F"], x["BW"], x["t_l"], x["r"], x["o"])


@settings(max_examples=150, deadline=None)
@given(rooflines(), st.integers(1, 5000), st.sampled_from([0, 1, 7, 64, 512, 100000]))
def test_prefill_closed_form_equals_chunk_loop(x, I, s):
    t_pre, t_max, k_c = roofline.prefill_time(float(I), float(s), _roof_args(x), x["a"])
    want = ref.prefill_chunks(I, s, *_ref_args(x))
    assert float(t_pre) == pytest.approx(want[0], rel=1e-9)
    assert float(t_max) == pytest.approx(want[1], rel=1e-12)
    assert int(k_c) == want[2]


@settings(max_examples=150, deadline=None)
@given(rooflines(), st.integers(1, 512), st.integers(1, 6000), st.integers(1, 3000))
def test_decode_closed_form_equals_step_loop(x, B, I, O):
    itl = float(roofline.decode_itl(float(B), float(I), float(O), _roof_args(x), x["a"]))
    want = ref.decode_steps(B, I, O, *_ref_args(x))
    if O == 1:
        assert math.isnan(itl) and math.isnan(want)
    else:
        assert itl == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("s", [1, 7, 512])
def test_chunk_sizes_across_the_window(s):
    """Prompts that cross the sliding window, chunk sizes 1, 7, 512: closed form = loop."""
    arch, e_kv = e_kv_of("gemma-2-9b")
    x = dict(
        P=9.2e9,
        a=4.0 * arch["n_layers"] * arch["n_heads"] * arch["head_dim"],
        M_W=1.85e10,
        e_kv=e_kv,
        L=arch["n_layers"],
        L_s=arch["n_sliding_layers"],
        W=arch["window"],
        F=989e12,
        BW=3.35e12,
        t_l=2e-5,
        r=1.0,
        o=1.0,
    )
    for I in (4095, 4096, 4097, 6000, 9001):
        t_pre, t_max, k_c = roofline.prefill_time(float(I), float(s), _roof_args(x), x["a"])
        want = ref.prefill_chunks(I, s, *_ref_args(x))
        assert (float(t_pre), float(t_max), int(k_c)) == pytest.approx(want, rel=1e-9)


def test_long_prompt_one_token_chunks_cost_one_evaluation():
    """A 1-token chunk on a 100 000-token prompt, and O = 100 000, are single closed-form evaluations."""
    x = dict(
        P=8e9,
        a=4.0 * 32 * 32 * 128,
        M_W=1.6e10,
        e_kv=4096.0,
        L=32,
        L_s=0,
        W=math.inf,
        F=989e12,
        BW=3.35e12,
        t_l=0.0,
        r=1.0,
        o=1.0,
    )
    import time

    t = time.perf_counter()
    t_pre, _, k_c = roofline.prefill_time(100_000.0, 1.0, _roof_args(x), x["a"])
    itl = roofline.decode_itl(1.0, 100_000.0, 100_000.0, _roof_args(x), x["a"])
    assert time.perf_counter() - t < 1.0
    assert int(k_c) == 100_000
    assert float(t_pre) == pytest.approx(ref.prefill_chunks(100_000, 1, *_ref_args(x))[0], rel=1e-9)
    assert float(itl) == pytest.approx(ref.decode_steps(1, 100_000, 100_000, *_ref_args(x)), rel=1e-9)


def test_service_proxy_cases():
    # O = 1: TTFT and completion coincide, no interleaves
    assert float(roofline.time_to_first_token(8.0, 1.0, 0.5, 4.0, np.nan)) == 4.0
    assert float(roofline.service_time(1.0, 4.0, np.nan)) == 4.0
    # B = 1: no interleaves either
    assert float(roofline.time_to_first_token(1.0, 100.0, 0.5, 4.0, 0.01)) == 0.5
    ttft = float(roofline.time_to_first_token(8.0, 100.0, 0.5, 4.0, 0.01))
    assert ttft == pytest.approx(8 * 0.5 + 3 * 0.01)
    assert float(roofline.service_time(100.0, ttft, 0.01)) == pytest.approx(ttft + 99 * 0.01)
    # measured mode: occupancy held constant below B_cal
    assert float(roofline.measured_service_time(4.0, 16.0, 8.0)) == 2.0
    assert float(roofline.measured_service_time(32.0, 16.0, 8.0)) == 4.0
    ttft, itl = roofline.measured_ttft_itl(1.0, 2.0, 0.3, 0.02)
    assert float(ttft) == 2.0 and math.isnan(float(itl))


def test_erlang_c_exact_small_cases_and_call_centre():
    assert float(queue.erlang_c(2.0, 1.0, 0.5)) == pytest.approx(1 / 3, rel=1e-14)
    assert float(queue.erlang_c(3.0, 2.0, 2 / 3)) == pytest.approx(4 / 9, rel=1e-14)
    # 360 calls per half hour, 4 min handling, 55 agents: A = 48, P(wait) = 0.2387, ASA 8.18 s
    out = queue.mmc(55.0, 240.0, 360 / 1800)
    assert float(out["utilization"]) == pytest.approx(0.873, abs=5e-4)
    assert float(out["p_wait"]) == pytest.approx(0.2387, abs=5e-5)
    assert float(out["wait_s"]) == pytest.approx(8.18, abs=5e-3)


@pytest.mark.parametrize("m", [1, 2, 7, 55, 256, 1000, 10_000, 100_000])
@pytest.mark.parametrize("rho", [0.01, 0.3, 0.7, 0.9, 0.99, 0.999])
def test_erlang_b_closed_form_vs_recurrence(m, rho):
    A = rho * m
    want = ref.erlang_b_recurrence(m, A)
    got = float(queue.erlang_b(float(m), A))
    if want < 1e-250:
        assert got < 1e-250
    else:
        assert got == pytest.approx(want, rel=1e-9)


def test_erlang_b_static_recurrence_matches_the_reference_and_the_closed_form():
    """The pure-JAX recurrence run to a static bound (queue sweeps: the largest batch) on many m at once."""
    rng = np.random.default_rng(5)
    m = rng.integers(1, 513, 400).astype(float)
    A = m * rng.choice([0.01, 0.3, 0.7, 0.9, 0.99, 0.999], 400)
    with float64_scope():
        got = np.asarray(queue.erlang_b(jnp.asarray(m), jnp.asarray(A), max_servers=512))
        closed = np.asarray(queue.erlang_b(jnp.asarray(m), jnp.asarray(A)))
    want = np.array([ref.erlang_b_recurrence(int(k), a) for k, a in zip(m, A, strict=False)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)  # XLA flushes subnormals to 0
    np.testing.assert_allclose(closed, want, rtol=1e-9, atol=1e-300)
    assert queue.queue_bound([3, 200]) == 256 and queue.queue_bound([1]) == 1


def test_the_queue_calls_no_host_callback():
    """Pure JAX: no callback primitive in the M/M/c graph, either Erlang path (GPU-ready, every device)."""
    for bound in (None, 64):
        jaxpr = str(jax.make_jaxpr(lambda m, s, lam, bound=bound: queue.mmc(m, s, lam, bound))(4.0, 2.0, 1.0))
        assert "callback" not in jaxpr
    import pathlib

    source = "".join(p.read_text() for p in pathlib.Path(queue.__file__).parent.parent.rglob("*.py"))
    assert "pure_callback" not in source


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3000), st.floats(1e-3, 100), st.floats(0, 50))
def test_mmc_matches_reference(m, S, lam):
    got = {k: float(v) for k, v in queue.mmc(float(m), S, lam).items()}
    want = ref.mmc(m, S, lam)
    for k, v in want.items():
        if math.isinf(v):
            assert got[k] == v, k
        elif want["p_wait"] > 1e-250 or k in ("utilization", "response_s"):
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-300), k
    assert 0.0 <= got["p_wait"] <= 1.0


def _simulate_mmc(m, S, lam, n_customers, seed):
    """Seeded discrete-event M/M/c FCFS simulation: mean wait and fraction that waited."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / lam, n_customers))
    services = rng.exponential(S, n_customers)
    free_at = np.zeros(m)
    waits = np.empty(n_customers)
    for i, (t, s) in enumerate(zip(arrivals, services, strict=False)):
        k = int(np.argmin(free_at))
        start = max(t, free_at[k])
        waits[i] = start - t
        free_at[k] = start + s
    burn = n_customers // 10
    return waits[burn:]


@pytest.mark.parametrize("m, S, lam", [(1, 1.0, 0.7), (4, 2.0, 1.6), (16, 0.5, 28.0)])
def test_queue_against_discrete_event_simulation(m, S, lam):
    want = {k: float(v) for k, v in queue.mmc(float(m), S, lam).items()}
    batches = [_simulate_mmc(m, S, lam, 40_000, seed) for seed in range(8)]
    means = np.array([b.mean() for b in batches])
    pw = np.array([(b > 0).mean() for b in batches])
    half = 3.5 * means.std(ddof=1) / np.sqrt(len(means))  # ~99.9% interval over independent replications
    assert abs(means.mean() - want["wait_s"]) < half + 1e-9, (means.mean(), want["wait_s"], half)
    half_p = 3.5 * pw.std(ddof=1) / np.sqrt(len(pw))
    assert abs(pw.mean() - want["p_wait"]) < half_p + 1e-9, (pw.mean(), want["p_wait"], half_p)
