"""Procurement (MODEL.md §8): wait quantiles, λ* by bisection, request traces and length classes, the
choice and the mix, and what an infeasible study says."""

from __future__ import annotations

import heapq
import json
import math
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from click.testing import CliRunner

import slimjax
from slimjax.cli import main
from slimjax.config import float64_scope
from slimjax.inputs.requests import length_classes, load_requests
from slimjax.model import procurement as proc
from slimjax.model import queue
from slimjax.studies.procure import spec as procurefile

# ------------------------------------------------------------------------------ reference pieces


def wait_quantile_ref(m, S, lam, p):
    q = ref.mmc(m, S, lam)
    if not math.isfinite(q["wait_s"]):
        return math.inf
    if q["p_wait"] <= 1 - p:
        return 0.0
    return math.log(q["p_wait"] / (1 - p)) / (m / S - lam)


def meets_ref(w, m, ttft, itl, service, lam, slo, quantile):
    """The §8 SLOs at per-replica rate λ, by loops over classes, on the reference queue."""
    present = [k for k in range(len(w)) if w[k] > 0]
    S = sum(w[k] * service[k] for k in present)
    q = ref.mmc(m, S, lam)
    wp = wait_quantile_ref(m, S, lam, quantile)
    return all(
        itl[k] <= slo["itl_s"] and wp + ttft[k] <= slo["ttft_s"] and q["wait_s"] + service[k] <= slo["e2e_s"]
        for k in present
    )


def mmc_waits(m, S, lam, n, seed):
    """Waits of n customers of a FCFS M/M/c queue (seeded discrete-event simulation)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / lam, n))
    services = rng.exponential(S, n)
    free = [0.0] * m  # when each server is next free
    heapq.heapify(free)
    waits = np.empty(n)
    for i in range(n):
        t = heapq.heappop(free)
        start = max(t, arrivals[i])
        waits[i] = start - arrivals[i]
        heapq.heappush(free, start + services[i])
    return waits


# ------------------------------------------------------------------------------------ the queue


@pytest.mark.parametrize(
    "m,S,lam,p", [(1, 1.0, 0.7, 0.9), (4, 2.0, 1.6, 0.9), (16, 0.5, 28.0, 0.95), (8, 1.0, 1.0, 0.9)]
)
def test_wait_quantile_matches_the_formula_and_a_simulation(m, S, lam, p):
    with float64_scope():
        q = queue.mmc(jnp.float64(m), jnp.float64(S), jnp.float64(lam))
        wp = float(queue.wait_quantile(q["p_wait"], jnp.float64(m), jnp.float64(S), jnp.float64(lam), p))
    assert wp == pytest.approx(wait_quantile_ref(m, S, lam, p), rel=1e-9, abs=1e-12)
    waits = mmc_waits(m, S, lam, 200_000, seed=m)[20_000:]  # warm-up dropped
    batches = np.array([np.quantile(b, p) for b in np.array_split(waits, 20)])  # batch means: waits are correlated
    half = 2.861 * batches.std(ddof=1) / math.sqrt(len(batches))  # t(0.995, 19)
    assert abs(batches.mean() - wp) <= max(half, 1e-3 * S), (batches.mean(), wp, half)


def test_wait_quantile_is_unbounded_without_steady_state_and_zero_when_waiting_is_rare():
    with float64_scope():
        for m, lam in ((0.0, 1.0), (2.0, 2.0), (2.0, 5.0)):
            q = queue.mmc(jnp.float64(m), 1.0, jnp.float64(lam))
            assert float(queue.wait_quantile(q["p_wait"], m, 1.0, lam, 0.9)) == math.inf
        q = queue.mmc(jnp.float64(64.0), 1.0, jnp.float64(1.0))
        assert float(queue.wait_quantile(q["p_wait"], 64.0, 1.0, 1.0, 0.9)) == 0.0


# ------------------------------------------------------------------------------- λ* by bisection


@pytest.mark.parametrize("which", ["ttft", "itl", "e2e", "all"])
def test_max_rate_matches_a_brute_force_search(which):
    rng = np.random.default_rng({"ttft": 1, "itl": 2, "e2e": 3, "all": 4}[which])
    for _ in range(8):
        K = int(rng.integers(1, 4))
        w = rng.dirichlet(np.ones(K))
        m = float(rng.integers(1, 40))
        service = rng.uniform(2.0, 20.0, K)
        itl = rng.uniform(0.01, 0.06, K)
        ttft = rng.uniform(0.05, 1.0, K)
        slo = {"ttft_s": math.inf, "itl_s": math.inf, "e2e_s": math.inf}
        if which in ("ttft", "all"):
            slo["ttft_s"] = float(rng.uniform(0.5, 3.0))
        if which in ("itl", "all"):
            slo["itl_s"] = float(rng.uniform(0.02, 0.07))
        if which in ("e2e", "all"):
            slo["e2e_s"] = float(rng.uniform(10.0, 30.0))
        with float64_scope():
            lam = float(
                proc.max_rate_per_replica(
                    jnp.asarray(w),
                    jnp.float64(m),
                    jnp.float64(np.dot(w, service)),
                    jnp.asarray(ttft),
                    jnp.asarray(itl),
                    jnp.asarray(service),
                    slo["ttft_s"],
                    slo["itl_s"],
                    slo["e2e_s"],
                    0.9,
                )
            )
        capacity = m / np.dot(w, service)
        grid = np.linspace(0, capacity, 801)[1:-1]  # the check below is to one grid step, whatever the step
        ok = np.array([meets_ref(w, int(m), ttft, itl, service, x, slo, 0.9) for x in grid])
        assert lam < capacity
        if not ok.any():
            assert lam == 0.0 or lam < grid[0]
            continue
        assert ok[: np.flatnonzero(ok)[-1] + 1].all()  # the SLOs are monotone in λ: the rates that pass are a prefix
        best = grid[ok].max()
        assert best <= lam * (1 + 1e-9) and lam <= best + (grid[1] - grid[0]) * (1 + 1e-9), (which, lam, best)
        assert meets_ref(w, int(m), ttft, itl, service, lam * (1 - 1e-12), slo, 0.9)


def test_max_rate_is_zero_when_the_slos_fail_unloaded_or_nothing_fits():
    with float64_scope():
        args = dict(
            weights=jnp.ones(1),
            mean_service_s=jnp.float64(5.0),
            ttft_s=jnp.asarray([0.5]),
            itl_s=jnp.asarray([0.04]),
            service_s=jnp.asarray([5.0]),
            slo_e2e_s=np.inf,
            quantile=0.9,
        )
        assert float(proc.max_rate_per_replica(slots=jnp.float64(8), slo_ttft_s=0.4, slo_itl_s=1.0, **args)) == 0.0
        assert float(proc.max_rate_per_replica(slots=jnp.float64(8), slo_ttft_s=9.0, slo_itl_s=0.03, **args)) == 0.0
        assert float(proc.max_rate_per_replica(slots=jnp.float64(0), slo_ttft_s=9.0, slo_itl_s=1.0, **args)) == 0.0
        # ITL alone bounds nothing about the queue: λ* approaches the stability limit m/S̄ from below
        lam = float(proc.max_rate_per_replica(slots=jnp.float64(8), slo_ttft_s=np.inf, slo_itl_s=1.0, **args))
        assert 8 / 5.0 * (1 - 1e-9) < lam < 8 / 5.0


# ------------------------------------------------------------------------------ request traces

TRACES = [
    ("AzureLLMInferenceTrace_code.csv", "azure", 8819, True),
    ("AzureLLMInferenceTrace_conv.csv", "azure", 19366, True),
    ("mooncake_conversation_trace.jsonl", "mooncake", 12031, True),
    ("sharegpt_lengths_llama2_tokenizer.csv", "sharegpt", 30731, False),
]


@pytest.mark.parametrize("name,fmt,n,timed", TRACES)
def test_every_trace_reader_on_the_shared_files(shared_data, name, fmt, n, timed):
    trace = load_requests(shared_data / "traces" / name)  # format detected
    assert trace.format == fmt and trace.n_requests + trace.dropped == n
    assert (trace.input_len >= 1).all() and (trace.output_len >= 1).all()
    if timed:
        assert 3000 < trace.span_s <= 3600  # one hour of traffic
        assert trace.rate == pytest.approx(trace.n_requests / trace.span_s)
    else:
        assert trace.rate is None
    for k in (1, 4, 7):
        c = length_classes(trace.input_len, trace.output_len, k)
        assert c.count.sum() == trace.n_requests and c.count.max() - c.count.min() <= 1  # every request, equal counts
        order = np.argsort(trace.input_len + trace.output_len, kind="stable")
        for group, n_k, i_k, o_k in zip(np.array_split(order, k), c.count, c.input_len, c.output_len, strict=False):
            exact = (trace.input_len[group] + trace.output_len[group]).sum()
            assert abs(n_k * (i_k + o_k) - exact) <= n_k * 1.0  # each rounded mean is within 0.5 of its own
        assert np.all(np.diff(c.input_len + c.output_len) >= -1)  # sorted by I + O


def test_trace_rate_from_timestamps(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,prompt_tokens,completion_tokens\n0,10,5\n2.5,20,6\n4.0,30,7\n10.0,40,8\n")
    trace = load_requests(path)
    assert trace.format == "csv" and trace.span_s == 10.0 and trace.rate == pytest.approx(0.4)
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
        '{"timestamp": 2000, "input_length": 6, "output_length": 3}\n'
    )
    assert load_requests(jsonl).rate == pytest.approx(1.0)  # ms → s


@pytest.mark.parametrize(
    "text,where",
    [
        ("", "empty"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n", "at least two requests"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n2023-11-16 18:15:40,10,5\n", "row 3"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n2023-11-16 18:15:50,-3,5\n",
            "row 3, column 'ContextTokens'",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,five\n", "row 2, column 'GeneratedTokens'"),
        ("when,a,b\n1,2,3\n", "no input-token column"),
    ],
)
def test_bad_traces_are_clear_errors_naming_file_and_row(tmp_path, text, where):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(slimjax.SlimjaxError, match=str(path).replace(".", r"\.")) as e:
        load_requests(path)
    assert where in str(e.value)


# -------------------------------------------------------------------------------- whole studies

SMALL = dict(
    workloads=[dict(name="mixed", input_len=1500, output_len=300)],
    rates=[0.5, 3.0, 12.0],
    models=["Llama-3.1-8B", "Qwen3-32B"],
    gpus=["L40S", "H100-SXM", "A100-SXM-80GB"],
    tp=[1, 2, 4],
    batch=[1, 4, 16, 64],
    slo=dict(ttft_s=1.5, itl_s=0.04),
    sizing="screen",  # the §8 closed form; sizing by simulation is tests/test_sizing.py's
)


def _brute_choice(ds, w, r, m):
    """The §8 choice by enumeration: least cost, then fewer GPUs, smaller TP, smaller batch, earlier GPU."""
    best = None
    for gi, g in enumerate(ds.gpu.values):
        for n in ds.tp.values:
            for b in ds.batch.values:
                c = ds.sel(workload=w, rate=r, model=m, gpu=g, tp=n, batch=b)
                if not bool(c.feasible):
                    continue
                key = (float(c.cost_per_hour), float(c.gpus_total), int(n), int(b), gi)
                if best is None or key < best[0]:
                    best = (key, g, int(n), int(b), float(c.replicas))
    return best


@pytest.fixture(scope="module")
def small_study(shared_data):
    spec = dict(
        SMALL,
        workloads=[
            dict(name="conv", trace=str(shared_data / "traces" / "AzureLLMInferenceTrace_conv.csv"), classes=3),
            dict(name="fixed", input_len=1024, output_len=256),
        ],
        rate_scale=[1.0, 8.0],
    )
    return spec, slimjax.procure(spec)


def test_choice_matches_brute_force_enumeration(small_study):
    _, ds = small_study
    checked = 0
    for w in ds.workload.values:
        for r in ds.rate.values:
            if not np.isfinite(float(ds.total_rate.sel(workload=w, rate=r))):
                assert (ds.best_gpu.sel(workload=w, rate=r) == "").all()
                continue
            for m in ds.model.values:
                best = _brute_choice(ds, w, r, m)
                got = ds.sel(workload=w, rate=r, model=m)
                assert best is not None
                assert (str(got.best_gpu.values), int(got.best_tp), int(got.best_batch)) == best[1:4]
                assert float(got.best_replicas) == best[4] and float(got.best_cost_per_hour) == best[0][0]
                checked += 1
    assert checked == 5 * 2 + 3 * 2  # conv: 2 scaled + 3 absolute rates; fixed: 3 absolute; 2 models each


def test_sizing_follows_the_formulas(small_study):
    _, ds = small_study
    c = ds.sel(workload="conv", rate="8x")
    feas = c.feasible.values
    assert c.max_rate_per_replica.dims == c.feasible.dims
    lam = c.max_rate_per_replica.values
    total = float(c.total_rate)
    np.testing.assert_array_equal(c.replicas.values[feas], np.ceil(total / lam[feas]))
    prices = np.array([1.19, 2.99, 1.79])[None, :, None, None]
    n = ds.tp.values[None, None, :, None]
    np.testing.assert_allclose(
        c.cost_per_hour.values[feas], np.broadcast_to(c.replicas.values * n * prices, feas.shape)[feas]
    )
    tokens = float(
        (ds.class_weight.sel(workload="conv") * (ds.class_input_len + ds.class_output_len).sel(workload="conv")).sum()
    )
    np.testing.assert_allclose(
        c.cost_per_mtok.values[feas], c.cost_per_hour.values[feas] / (3600 * total * tokens / 1e6)
    )
    util = c.utilization.values[feas]
    assert (util > 0).all() and (util < 1).all()  # every sized replica has a steady state
    assert (c.ttft_p_s.values[feas] <= 1.5 + 1e-9).all() and (c.itl_s.values[feas] <= 0.04).all()
    assert np.isnan(c.cost_per_hour.values[~feas]).all()  # no number for what cannot serve the rate


def test_mix_equals_each_class_alone_as_its_own_study(small_study):
    spec, ds = small_study
    w = ds.sel(workload="conv")
    for r in ds.rate.values:
        total = float(w.total_rate.sel(rate=r))
        for k in ds["class"].values:
            weight = float(w.class_weight[k])
            if weight == 0:
                continue
            alone = slimjax.procure(
                dict(
                    spec,
                    workloads=[
                        dict(name="k", input_len=int(w.class_input_len[k]), output_len=int(w.class_output_len[k]))
                    ],
                    rates=[total * weight],
                    rate_scale=None,
                )
            )
            for m in ds.model.values:
                got, want = w.sel(rate=r, model=m, **{"class": k}), alone.sel(model=m).isel(workload=0, rate=0)
                assert float(got.mix_class_cost_per_hour) == pytest.approx(float(want.best_cost_per_hour), rel=1e-12)
                assert str(got.mix_gpu.values) == str(want.best_gpu.values) and int(got.mix_batch) == int(
                    want.best_batch
                )
        for m in ds.model.values:
            c = w.sel(rate=r, model=m)
            assert float(c.mix_cost_per_hour) == pytest.approx(float(c.mix_class_cost_per_hour.sum()))
            assert float(c.mix_saving_per_hour) == pytest.approx(
                float(c.best_cost_per_hour) - float(c.mix_cost_per_hour)
            )


def test_candidates_agree_with_the_scalar_capacity_path(small_study):
    """A fixed workload's candidate at its slots m has §4's ITL and S(m) from slimjax.capacity, and the
    study TTFT is the per-request screen t_pre + ITL (not the batch screen B·t_pre)."""
    _, ds = small_study
    for m, g, n, b in (
        ("Llama-3.1-8B", "H100-SXM", 1, 16),
        ("Qwen3-32B", "A100-SXM-80GB", 2, 64),
        ("Qwen3-32B", "L40S", 4, 4),
    ):
        c = ds.sel(workload="fixed", model=m, gpu=g, tp=n, batch=b)
        slots = int(c.slots)
        assert slots >= 1
        point = slimjax.capacity(
            m, g, 1024, 256, slots, serving=dict(n_gpu=n, efficiency="calibrated", kv_replication="auto")
        )
        assert float(c.itl_s) == pytest.approx(point["itl_s"], rel=1e-12)
        assert float(c.service_s) == pytest.approx(point["service_s"], rel=1e-12)
        assert float(c.ttft_unloaded_s) == pytest.approx(point["prefill_s"] + point["itl_s"], rel=1e-12)
        assert slots == min(b, int(point["max_seqs"]))
        # back of the envelope: one replica never serves more than m/S̄
        assert float(c.max_rate_per_replica) < slots / float(c.service_s)


def test_an_infeasible_study_says_why(tmp_path):
    # 1 ms per token: no GPU here decodes that fast; 405B needs more than three 80 GB GPUs without pipeline
    # stages (pp: 1, the default); 3 divides no head count
    study = dict(SMALL, models=["Llama-3.1-8B", "Llama-3.1-405B"], tp=[1, 2, 3], slo=dict(itl_s=0.001))
    ds = slimjax.procure(study)
    assert (ds.best_gpu == "").all() and np.isnan(ds.best_cost_per_hour).all() and not ds.feasible.any()
    assert (ds.binding_reason.sel(model="Llama-3.1-8B") == proc_reason("itl")).all()
    assert (ds.binding_reason.sel(model="Llama-3.1-405B") == proc_reason("memory")).all()
    reason = ds.infeasible_reason.isel(workload=0)
    assert (reason.sel(model="Llama-3.1-8B", tp=3) == proc_reason("tp_does_not_divide_heads")).all()
    assert (reason.sel(model="Llama-3.1-8B", gpu="H100-SXM", tp=1) == proc_reason("itl")).all()
    text = slimjax.procure_tables(ds, infeasible=9)
    assert (
        "no feasible candidate: binding reason itl" in text and "no feasible candidate: binding reason memory" in text
    )
    assert "ITL" in text and "> 1 ms SLO" in text and "GiB exceed the usable" in text and "does not divide" in text


def proc_reason(name):
    from slimjax.studies.procure.screen import REASONS

    return REASONS.index(name)


def test_measured_point_replaces_the_roofline_for_its_candidate():
    # the sweep file's measured block, by model then GPU for one pair, at the TP degree it was measured at
    measured = {"Llama-3.1-8B": {"H100-SXM": dict(tp=1, batch=32, request_rate=4.0, ttft_s=0.2, itl_s=0.03)}}
    ds = slimjax.procure(dict(SMALL, measured=measured))
    c = ds.sel(workload="mixed", model="Llama-3.1-8B", gpu="H100-SXM", tp=1)
    np.testing.assert_allclose(c.itl_s.values, 0.03)
    np.testing.assert_allclose(c.ttft_unloaded_s.values, 0.2)
    np.testing.assert_allclose(c.service_s.values, np.maximum(c.slots.values, 32) / 4.0)
    other = ds.sel(workload="mixed", model="Llama-3.1-8B", gpu="H100-SXM", tp=2)
    assert not np.allclose(other.itl_s.values, 0.03)
    elsewhere = ds.sel(workload="mixed", model="Llama-3.1-8B", gpu="A100-SXM-80GB", tp=1)
    assert not np.allclose(elsewhere.itl_s.values, 0.03)  # one pair, not every GPU of the model
    # a sweep reads the same block: the nested point is that pair's only
    sweep = slimjax.sweep(
        dict(models=SMALL["models"], gpus=SMALL["gpus"], batch=[32], input_len=[1500], output_len=[300], advisor=False,
             measured={"Llama-3.1-8B": {"H100-SXM": dict(batch=32, request_rate=4.0, ttft_s=0.2, itl_s=0.03)}}),
        quiet=True,
    )  # fmt: skip
    itl = sweep.itl_s.sel(batch=32, input_len=1500, output_len=300)
    assert float(itl.sel(model="Llama-3.1-8B", gpu="H100-SXM")) == pytest.approx(0.03)
    assert (
        np.isnan(itl.sel(model="Qwen3-32B", gpu="H100-SXM"))
        or float(itl.sel(model="Qwen3-32B", gpu="H100-SXM")) != 0.03
    )
    assert float(itl.sel(model="Llama-3.1-8B", gpu="A100-SXM-80GB")) != pytest.approx(0.03)


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(colour=1), "colour"),
        (dict(serving=dict(n_gpu=2)), "serving.n_gpu"),
        (dict(slo=dict(quantile=0.9)), "slo"),
        (dict(slo=dict(ttft_s=-1)), "slo.ttft_s"),
        (dict(rates=[0.0, 1.0]), "rates"),
        (dict(rates=None), "rates"),
        (dict(prices={"B200": 2.0}), "prices.B200"),
        (dict(gpus=[dict(name="mine", tflops=100, bandwidth_tbs=1, memory_gib=48)]), "prices.mine"),
        (dict(workloads=[dict(name="x", input_len=10)]), "workloads[0].output_len"),
        (dict(workloads=[dict(name="x", trace="nowhere.csv")]), "workloads[0].trace"),
        (
            dict(measured={"Llama-3.1-8B": {"H100-SXM": dict(tp=8, batch=1, request_rate=1, ttft_s=1, itl_s=1)}}),
            "measured.tp",
        ),
        (
            dict(measured={"Llama-3.1-8B": {"H100-SXM": dict(tp=1, batch=1, request_rate=1, ttft_s=1, itl=1)}}),
            "measured.Llama-3.1-8B.H100-SXM.itl",
        ),
    ],
)
def test_bad_study_input_names_the_field(change, field):
    with pytest.raises(slimjax.SlimjaxError) as e:
        procurefile.parse({**SMALL, **change})
    assert e.value.field.startswith(field), e.value


def test_rates_below_or_at_zero_get_one_message():
    """0 and −2 are refused alike (a rate axis of a study is positive), rates and rate_scale alike."""
    for key in ("rates", "rate_scale"):
        for bad in (0.0, -2.0):
            with pytest.raises(slimjax.SlimjaxError) as e:
                procurefile.parse({**SMALL, key: [bad]})
            assert str(e.value) == f"{key}[0]: must be positive, got {bad!r}"


def test_cli_prints_ranked_tables_and_writes_the_store(tmp_path):
    import yaml

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(dict(SMALL, prices={"H100-SXM": 2.5})))
    result = CliRunner().invoke(main, ["procure", str(path), "--out", str(tmp_path / "s.zarr"), "--top", "2"])
    assert result.exit_code == 0, result.output
    assert "illustrative" in result.output and "2026-10-27" in result.output and "H100-SXM 2.5" in result.output
    assert "== mixed at 3/s" in result.output
    import xarray as xr

    stored = xr.open_zarr(tmp_path / "s.zarr")
    assert stored.attrs["kind"] == "procurement" and stored["cost_per_hour"].attrs["price_date"] == "2026-10-27"
    # measured or not, per (GPU, TP) and in the store: L40S has no measured rows; H100 has rows at every degree,
    # A100-80GB at TP 2, 4, 8 (splitwise), so its TP 1 constants are the fit of its other degrees
    marks = json.loads(stored.attrs["constants"])
    assert marks["Qwen3-32B"] == {
        "L40S": dict.fromkeys(("1", "2", "4"), "pooled"),
        "H100-SXM": dict.fromkeys(("1", "2", "4"), "measured"),
        "A100-SXM-80GB": {"1": "measured, other TP", "2": "measured", "4": "measured"},
    }
    assert "constants: where each row's roofline constants come from" in result.output
    assert " measured" in result.output.split("== mixed at 3/s")[1].split("\n")[2]
    # the assumptions that move the answer end the tables and stay in the store
    said = json.loads(stored.attrs["assumptions"])
    assert [a.split(":")[0] for a in said] == ["prices", "roofline constants", "prefill (screen)", "streams"]
    assert "each prompt prefilled alone" in result.output.split("assumptions:")[1]
    assert "mixed: fixed lengths, a Poisson stream at each rate" in said[-1]
    again = CliRunner().invoke(main, ["procure", str(path), "--out", str(tmp_path / "s.zarr")])
    assert again.exit_code != 0 and "exists" in again.output  # nothing already written is lost


def test_shipped_example_is_bit_identical_to_its_golden_store_and_tables(shared_data):
    """sweeps/procure_azure.yaml as recorded by ``python bench/golden.py --write``: every array of the study's
    Dataset (sha256 of its bytes) and the printed ranked tables character for character."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from golden import GOLDEN, array_digests, screen_of

    study = procurefile.parse("sweeps/procure_azure.yaml")
    assert [w.name for w in study.workloads] == ["conversation", "code"]
    assert study.rate_labels == ["1x", "4x", "16x"] and len(study.gpus) == 6
    ds = slimjax.procure(screen_of(study))
    want = json.loads((GOLDEN / "procure.json").read_text())
    got = array_digests(ds)
    assert sorted(got) == sorted(want)
    assert not [k for k in want if got[k] != want[k]], "procurement arrays differ from tests/golden/procure.json"
    assert slimjax.procure_tables(ds) + "\n" == (GOLDEN / "procure_tables.txt").read_text()


def test_ties_go_to_fewer_gpus_then_smaller_tp_then_smaller_batch_then_the_first_gpu():
    twin = dict(tflops=989, bandwidth_tbs=3.35, memory_gib=80, price_per_hour=2.0)
    spec = dict(
        workloads=[dict(name="w", input_len=512, output_len=128)],
        rates=[0.2],
        models=["Llama-3.1-8B"],
        gpus=[dict(name="first", **twin), dict(name="second", **twin)],
        tp=[1, 2],
        batch=[4, 8, 16],
        slo=dict(itl_s=1.0),
        sizing="screen",
    )
    ds = slimjax.procure(spec).isel(workload=0, rate=0, model=0)
    # one replica of one GPU serves 0.2 requests/s at every batch: the cheapest cost is shared by six
    # candidates (2 GPUs × 3 batches at TP 1); the tie goes to the smallest batch on the first GPU
    cheapest = ds.cost_per_hour.where(ds.feasible).min()
    assert int((ds.cost_per_hour == cheapest).sum()) == 6
    assert (str(ds.best_gpu.values), int(ds.best_tp), int(ds.best_batch), int(ds.best_gpus)) == ("first", 1, 4, 1)


def test_a_trace_workload_takes_its_first_seconds(shared_data):
    from slimjax.inputs.requests import load_requests
    from slimjax.studies.procure import spec as procurefile

    path = shared_data / "traces" / "AzureLLMInferenceTrace_conv.csv"
    whole = load_requests(path, "azure")
    entry = dict(name="conv", trace=str(path), format="azure", classes=2, duration_s=60)
    study = procurefile.parse(dict(SMALL, workloads=[entry]))
    keep = whole.arrival_s - whole.arrival_s[0] < 60
    wl = study.workloads[0]
    assert (
        wl.requests == int(keep.sum()) < whole.n_requests
        and wl.trace.input_len.tolist() == whole.input_len[keep].tolist()
    )
    with pytest.raises(slimjax.SlimjaxError, match=r"workloads\[0\].duration_s"):
        procurefile.parse(dict(SMALL, workloads=[dict(name="x", input_len=10, output_len=5, duration_s=3)]))
