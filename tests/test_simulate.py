"""MODEL.md §9, continuous batching: the jitted simulation against the plain Python event loop of
tests/serving_reference.py per request (float64, 1e-9), its limits against §4's closed forms, and its
summaries against numpy."""

import math

import numpy as np
import pytest
import reference as ref
import serving_reference as sref

import slimjax
from slimjax.engine import sim as engine
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog
from slimjax.studies import simulate

RNG = np.random.default_rng(7)
N = 24
ARRIVALS = np.sort(RNG.uniform(0, 3, N)).round(3)
INPUTS = RNG.integers(1, 3000, N)
OUTPUTS = RNG.integers(1, 120, N)


def _spec(model, gpu, batch, *, tp=1, replicas=1, router="round_robin", stream=None, **serving):
    stream = stream or {
        "requests": {"arrival_s": ARRIVALS.tolist(), "input_len": INPUTS.tolist(), "output_len": OUTPUTS.tolist()}
    }
    return dict(
        models=[model],
        gpus=[gpu],
        tp=[tp],
        batch=[batch],
        replicas=[replicas],
        router=router,
        precision="float64",
        serving=serving,
        stream=stream,
    )


def _compare(spec, clients=None):
    sim = simulate.parse(spec)
    ds = simulate.run(sim)
    replicas = int(sim.replicas[0])
    want, terms = sref.simulate_study(sim, catalog.resolve_model(sim.models[0])[1], clients)
    pick = dict(model=0, gpu=0, tp=0, pp=0, batch=0, replicas=0) | ({"clients": 0} if clients else {})
    got = ds.isel(pick)
    np.testing.assert_allclose(got.ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    assert ds.attrs["engine_steps"] == want["steps"]
    assert float(got.queue_peak) == max(want["queue_peak"])
    np.testing.assert_allclose(float(got.kv_peak_bytes), max(want["kv_peak"]), rtol=1e-12)
    span = np.nanmax(np.asarray(want["end"])) - np.nanmin(np.asarray(want["arrival"]))
    np.testing.assert_allclose(float(got.utilization), sum(want["busy"]) / (replicas * span), rtol=1e-9)
    if want["gaps"]:
        exact = float(np.quantile(want["gaps"], 0.9))
        assert abs(float(got.token_gap_p90_s) / exact - 1) < 0.012  # one histogram bin
    return ds, want, terms


CASES = {
    "dense": dict(model="Llama-3.1-8B", gpu="H100-SXM", batch=8),
    "dense_chunked_small_budget": dict(
        model="Llama-3.1-8B", gpu="H100-SXM", batch=8, chunk_size=512, step_tokens=300
    ),  # a budget smaller than most prompts
    "moe_mla_tp8": dict(model="DeepSeek-V3", gpu="H200", batch=16, tp=8),  # TP with an NVLink link
    "moe_sliding_tp2": dict(model="gpt-oss-120b", gpu="H100-SXM", batch=8, tp=2, chunk_size=256),
    "kv_bound": dict(  # 64 slots, but the pool holds only a few long requests: KV blocks admission
        model="Llama-3.1-70B", gpu="H100-SXM", batch=64, tp=2, gpu_memory_utilization=0.855
    ),
    "three_replicas_least_loaded": dict(
        model="Llama-3.1-8B", gpu="A100-SXM-80GB", batch=4, replicas=3, router="least_loaded"
    ),
    "three_replicas_round_robin": dict(model="Llama-3.1-8B", gpu="A100-SXM-80GB", batch=4, replicas=3),
    "step_overhead": dict(
        model="Qwen3-30B-A3B", gpu="H100-SXM", batch=8, step_overhead_s=0.004, launch_overhead_s=1e-4
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_simulation_equals_the_event_loop(case):
    kw = dict(CASES[case])
    ds, want, terms = _compare(_spec(kw.pop("model"), kw.pop("gpu"), kw.pop("batch"), **kw))
    if case == "kv_bound":  # admission blocked by KV, not by the 64 slots
        fp = [ref.footprint(terms["arch"], int(i + o), 16, terms["r"]) for i, o in zip(INPUTS, OUTPUTS, strict=True)]
        assert int(terms["pool"] // max(fp)) < 8 and float(ds.queue_peak.squeeze()) > 0
        assert float(ds.kv_peak_bytes.squeeze()) <= terms["pool"]


@pytest.mark.parametrize("case", ["dense", "three_replicas_least_loaded", "three_replicas_round_robin"])
def test_slots_widened_from_one_equal_the_event_loop(case, monkeypatch):
    """Lanes start one slot wide and double where the width, not B, stopped an admission: still exact."""
    monkeypatch.setattr(engine, "FIRST_SLOTS", 1)
    kw = dict(CASES[case])
    _compare(_spec(kw.pop("model"), kw.pop("gpu"), kw.pop("batch"), **kw))


def test_more_requests_at_once_than_the_first_width():
    """40 short requests at once under B = 64: the replica holds more than FIRST_SLOTS; the lane is widened."""
    n = 40
    stream = {"requests": {"arrival_s": [0.0] * n, "input_len": [50 + i for i in range(n)], "output_len": [20] * n}}
    ds, want, _ = _compare(_spec("Llama-3.1-8B", "H100-SXM", 64, stream=stream))
    assert engine.FIRST_SLOTS < n and float(ds.queue_peak.squeeze()) == 0


def test_head_of_line_simultaneous_arrivals_and_single_token_outputs():
    """Six requests at the same instant; a long prompt first holds those behind it (budget 512), O = 1 ones
    complete at their first token."""
    stream = {
        "requests": {
            "arrival_s": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5],
            "input_len": [4000, 10, 20, 30, 40, 50, 60],
            "output_len": [5, 1, 1, 30, 1, 2, 1],
        }
    }
    ds, want, _ = _compare(_spec("Llama-3.1-8B", "H100-SXM", 4, stream=stream, step_tokens=512))
    ttft = ds.ttft_s.squeeze().values
    assert np.all(ttft[1:4] > ttft[0] * 0.5)  # the short ones wait for the long prompt's chunks
    e2e = ds.e2e_s.squeeze().values
    assert e2e[1] == ttft[1] and np.isnan(ds.tpot_s.squeeze().values[1])


def test_closed_loop_equals_the_event_loop():
    stream = {"closed_loop": {"clients": [3], "input_len": 700, "output_len": 40, "requests_per_client": 4}}
    ds, want, _ = _compare(_spec("Llama-3.1-8B", "H100-SXM", 2, stream=stream), clients=3)
    assert ds.ttft_p90_s.dims == ("model", "gpu", "tp", "pp", "batch", "replicas", "clients")
    # what the run assumed, in the store and at the end of its table
    import json

    from slimjax.studies.simulate.present import simulation_table

    said = json.loads(ds.attrs["assumptions"])
    assert said[0].startswith("stream: ") and said[0].endswith("scored after the first C completions")
    assert "prompts share engine steps of 2048 tokens" in said[2] and "router round_robin" in said[2]
    assert said[1].startswith("engine: generic")
    assert simulation_table(ds).split("assumptions:")[1].strip().startswith("stream: ")


def test_round_robin_lanes_equal_one_lane_of_all_replicas():
    """Open-stream round robin runs each replica as its own lane; the same requests in one lane of R replicas
    give the same per-request times (to rounding: one-replica lanes take decode-only stretches at once, whose sums
    run in another order)."""
    sim = simulate.parse(_spec("Llama-3.1-8B", "H100-SXM", 4, replicas=3))
    model, gpu, serving, batch, _ = simulate.broadcast_candidates(sim)
    terms, fp, _ = simulate.candidate_inputs(model, gpu, serving, sim.stream, np.float64)
    stream = {k: getattr(sim.stream, k) for k in ("arrival_s", "input_len", "output_len")}
    with slimjax.config.float64_scope():
        split = engine.simulate_candidates(terms, batch, fp, stream, replicas=3)
        joint = dict(engine.run_lanes(dict(terms, batch=batch, footprint=fp), stream, replicas=3, slots=4))
    for key in ("first_token_s", "end_s"):
        np.testing.assert_allclose(split[key], np.asarray(joint[key]), rtol=1e-14, atol=0)


@pytest.mark.parametrize("kv_policy", ["reserve", "recompute"])
def test_lone_request_is_section_4(kv_policy):
    """One request alone: TTFT = §4's t_pre and TPOT = §4's ITL at batch 1 (chunked prefill, the budget above
    the chunk size), with KV reserved at admission or paged (docs/engines.md)."""
    stream = {"requests": {"arrival_s": [0.0], "input_len": [3000], "output_len": [200]}}
    for model, gpu, tp in (("Llama-3.1-70B", "H100-SXM", 2), ("DeepSeek-V3", "H200", 8)):
        spec = _spec(model, gpu, 4, tp=tp, stream=stream, chunk_size=1024, step_tokens=4096, kv_policy=kv_policy)
        sim = simulate.parse(spec)
        ds = simulate.run(sim).squeeze()
        arch, g = catalog.resolve_model(model)[1], sref.study_gpu(sim)
        sv = {k: float(np.asarray(v)[0, 0, 0, 0]) for k, v in sim.serving.fields().items()}
        point, _, _ = ref.capacity_point(arch, g, sv, 1, 3000, 200)
        np.testing.assert_allclose(float(ds.ttft_s), point["prefill_s"], rtol=1e-12)
        np.testing.assert_allclose(float(ds.tpot_s), point["itl_s"], rtol=1e-12)
        # back of the envelope: a dense model's decode step reads its weights at least once
        assert arch["n_experts"] > 0 or float(ds.tpot_s) >= arch["n_params"] * arch["bytes_per_weight"] / (
            tp * g["bandwidth_bytes_per_s"]
        )


def test_saturated_closed_loop_reaches_steady_decode_throughput():
    """C ≤ max_seqs clients with equal (I, O): output tokens/s = C / ITL(C) of §4, within the prefill share."""
    C, I, O = 16, 512, 256
    stream = {"closed_loop": {"clients": [C], "input_len": I, "output_len": O, "requests_per_client": 6}}
    sim = simulate.parse(_spec("Llama-3.1-8B", "H100-SXM", C, stream=stream))
    ds = simulate.run(sim).squeeze()
    arch, g = catalog.resolve_model("Llama-3.1-8B")[1], sref.study_gpu(sim)
    sv = {k: float(np.asarray(v)[0, 0, 0, 0]) for k, v in sim.serving.fields().items()}
    point, _, _ = ref.capacity_point(arch, g, sv, C, I, O)
    steady = C * O / (point["prefill_s"] + (O - 1) * point["itl_s"])  # each client: its prefill, then O − 1 steps
    end = ds.arrival_s.values + ds.e2e_s.values
    counted = engine.counted_requests({"end_s": end[None]}, C)[0]
    window = end.max() - np.sort(end)[C - 1]  # from the C-th completion to the last
    rate = counted.sum() * O / window
    assert 0.85 * steady <= rate <= 1.0001 * C / point["itl_s"]


def test_low_load_poisson_ttft_is_the_prefill():
    stream = {"poisson": 0.05, "input_len": 1500, "output_len": 20, "requests": 12, "seed": 3}
    sim = simulate.parse(_spec("Llama-3.1-8B", "H100-SXM", 8, stream=stream))
    ds = simulate.run(sim).squeeze()
    arch, g = catalog.resolve_model("Llama-3.1-8B")[1], sref.study_gpu(sim)
    sv = {k: float(np.asarray(v)[0, 0, 0, 0]) for k, v in sim.serving.fields().items()}
    point, _, _ = ref.capacity_point(arch, g, sv, 1, 1500, 20)
    np.testing.assert_allclose(float(ds.ttft_p50_s), point["prefill_s"], rtol=1e-9)


def test_summaries_are_numpy_quantiles_and_float32_close():
    spec = _spec("Llama-3.1-8B", "H100-SXM", 8)
    ds = simulate.run(simulate.parse(spec)).squeeze()
    for q in (50, 90, 99):
        np.testing.assert_allclose(float(ds[f"ttft_p{q}_s"]), np.quantile(ds.ttft_s.values, q / 100), rtol=1e-12)
        tp = ds.tpot_s.values
        np.testing.assert_allclose(float(ds[f"tpot_p{q}_s"]), np.quantile(tp[~np.isnan(tp)], q / 100), rtol=1e-12)
    # occupancy: the requests held (admission to last token) over the replica's batch slots through the run's span,
    # from the per-request times; busy is 1 whenever any step runs, however few requests it holds
    admit, end = ds.arrival_s.values + ds.wait_s.values, ds.arrival_s.values + ds.e2e_s.values
    held = np.sum(end - admit) / (end.max() - ds.arrival_s.values.min())
    np.testing.assert_allclose(float(ds.occupancy), held / 8, rtol=1e-12)
    assert float(ds.occupancy) <= float(ds.utilization) <= 1.0
    lone = {"requests": {"arrival_s": [0.0], "input_len": [500], "output_len": [50]}}
    alone = simulate.run(simulate.parse(_spec("Llama-3.1-8B", "H100-SXM", 8, stream=lone))).squeeze()
    assert float(alone.utilization) == pytest.approx(1.0) and float(alone.occupancy) == pytest.approx(1 / 8)
    low = simulate.run(simulate.parse({**spec, "precision": "float32"})).squeeze()
    assert low.ttft_s.dtype == np.float32
    np.testing.assert_allclose(low.ttft_s.values, ds.ttft_s.values, rtol=2e-4, atol=1e-5)
    for v in list(simulate.PER_REQUEST) + list(simulate.SUMMARIES):
        assert ds[v].attrs["units"] and ds[v].attrs["long_name"]


def test_a_request_larger_than_the_pool_is_named():
    stream = {"requests": {"arrival_s": [0.0, 1.0], "input_len": [100, 250000], "output_len": [10, 10]}}
    with pytest.raises(SlimjaxError, match=r"stream request 1.*exceeds the whole KV pool.*Llama-3.1-8B on L40S"):
        simulate.run(simulate.parse(_spec("Llama-3.1-8B", "L40S", 8, stream=stream)))


def test_a_configuration_that_does_not_fit_is_nan():
    ds = simulate.run(simulate.parse(_spec("Llama-3.1-70B", "L40S", 8))).squeeze()
    assert not bool(ds.fits) and math.isnan(float(ds.ttft_p90_s)) and np.isnan(ds.ttft_s.values).all()


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"router": "random"}, "router"),
        ({"stream": {"poisson": 1.0, "input_len": 10}}, "stream.output_len"),
        (
            {"stream": {"requests": {"arrival_s": [1.0, 0.5], "input_len": [1, 2], "output_len": [1, 1]}}},
            "stream.requests.arrival_s[1]",
        ),
        (
            {"stream": {"closed_loop": {"clients": [2], "input_len": 5, "output_len": 5}}},
            "stream.closed_loop.requests_per_client",
        ),
        ({"replica": [1]}, "replica"),
        ({"settings": [{"step_tokens": 256}, {"chunk": 64}]}, "settings[1].chunk"),
        ({"settings": [{"step_tokens": 0}]}, "settings[0].step_tokens"),
        ({"settings": [{"kv_policy": "evict"}]}, "settings[0].kv_policy"),
        ({"settings": [{"step_tokens": 256}, {"step_tokens": 256}]}, "settings[1]"),
        ({"settings": []}, "settings"),
        (
            {"settings": [{"step_tokens": 256}], "serving": {"Llama-3.1-8B": {"step_tokens": 512}}},
            "settings[0].step_tokens",
        ),
    ],
)
def test_bad_input_names_the_field(patch, field):
    with pytest.raises(SlimjaxError) as e:
        simulate.parse({**_spec("Llama-3.1-8B", "H100-SXM", 8), **patch})
    assert e.value.field == field


def test_cli_simulates_the_shipped_example_and_stores_it(tmp_path, shared_data):
    """``slimjax simulate sweeps/simulate_azure.yaml --out``: the table printed, the store read back equal."""
    import xarray as xr
    import yaml
    from click.testing import CliRunner

    from slimjax.cli import main

    spec = yaml.safe_load(open(simulate_example()))
    spec["stream"].update(trace=str(shared_data / "traces" / "AzureLLMInferenceTrace_conv.csv"), duration_s=20)
    spec.update(gpus=["H100-SXM"], batch=[16], replicas=[1, 2])
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sim.zarr"
    result = CliRunner().invoke(main, ["simulate", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "TTFT p90" in result.output and "replicas 2" in result.output
    # not a terminal: a line per finished run instead of a bar (its last line always), and --quiet silences it
    assert "slimjax simulate: 2/2 runs done" in result.stderr and "\r" not in result.stderr
    stored = xr.open_zarr(out)
    direct = slimjax.simulate(str(path))
    np.testing.assert_array_equal(stored.ttft_s.values, direct.ttft_s.values)
    again = CliRunner().invoke(main, ["simulate", str(path), "--out", str(out), "--quiet"])
    assert again.exit_code != 0 and "exists" in again.output  # nothing already written is lost
    quiet = CliRunner().invoke(main, ["simulate", str(path), "--quiet"])
    assert quiet.exit_code == 0 and "runs done" not in quiet.stderr


def simulate_example():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "sweeps" / "simulate_azure.yaml"


def test_every_record_row_is_returned_by_every_entry_point():
    """RECORDS is the one table of outputs: a lane run (run_lanes), the pool of lanes (least_loaded) and the
    round-robin jobs return exactly its rows (the stop flag where lanes can stop), beside arrival and replica."""
    sim = simulate.parse(_spec("Llama-3.1-8B", "H100-SXM", 4, replicas=2))
    model, gpu, serving, batch, _ = simulate.broadcast_candidates(sim)
    terms, fp, _ = simulate.candidate_inputs(model, gpu, serving, sim.stream, np.float64)
    stream = {k: getattr(sim.stream, k) for k in ("arrival_s", "input_len", "output_len")}
    names = {r.name for r in engine.RECORDS}
    with slimjax.config.float64_scope():
        lane = engine.run_lanes(dict(terms, batch=batch, footprint=fp), stream, replicas=2, slots=4)
        pooled = engine.simulate_candidates(terms, batch, fp, stream, replicas=2, router="least_loaded")
        jobs = engine.simulate_candidates(terms, batch, fp, stream, replicas=2)
    assert set(lane) == names - {"stopped"} | {"arrival_s", "replica"}
    assert set(pooled) == names - {"stopped"} | {"arrival_s", "replica", "replicas"}
    assert set(jobs) == names | {"arrival_s", "replica", "replicas"}
    for r in engine.RECORDS:
        if r.per == "replica":
            assert jobs[r.name].shape == (1, 2) and pooled[r.name].shape == (1, 2)
        if r.dtype != "float":
            assert jobs[r.name].dtype == np.dtype(r.dtype)
    assert np.isfinite(jobs["end_s"]).all() and np.isfinite(pooled["end_s"]).all()


def test_one_trace_reader_counts_duration_on_the_clock_it_is_served_at(tmp_path):
    """The simulation's stream and procurement's workloads read a trace entry through one reader
    (inputs.requests.read_trace_entry): duration_s keeps the first T seconds of the clock the entry is served at —
    the simulation's compressed by rate_scale, a workload's own (a study then serves it at each rate)."""
    from slimjax.inputs.requests import read_trace_entry
    from slimjax.studies.procure import spec as procurefile

    path = tmp_path / "t.csv"
    arrival = np.array([10.0, 11.0, 12.5, 14.0, 18.0, 30.0])
    lines = ["timestamp,input_len,output_len", *(f"{a},{100 + k},{5 + k}" for k, a in enumerate(arrival))]
    path.write_text("\n".join(lines) + "\n")
    entry = {"trace": str(path), "format": "csv", "duration_s": 4.5}
    assert read_trace_entry(entry, "stream", None).n_requests == 4  # 0, 1, 2.5, 4 s
    assert read_trace_entry(entry, "stream", None, rate_scale=2.0).n_requests == 5  # and 8 s / 2
    sim = simulate.parse({**_spec("Llama-3.1-8B", "H100-SXM", 4), "stream": {**entry, "rate_scale": 2.0}})
    np.testing.assert_array_equal(sim.stream.arrival_s, (arrival[:5] - 10.0) / 2.0)
    assert sim.stream.description.endswith("at rate_scale 2, first 4.5 s (5 requests)")
    study = procurefile.parse(
        {
            "workloads": [{"name": "t", **entry, "classes": 1}],
            "rates": [1.0],
            "models": ["Llama-3.1-8B"],
            "gpus": ["H100-SXM"],
            "slo": {"ttft_s": 1.0, "itl_s": 0.1},
        }
    )
    assert study.workloads[0].trace.n_requests == 4 and study.workloads[0].trace.source.endswith("first 4.5 s")
    with pytest.raises(slimjax.SlimjaxError, match=r"stream.trace: trace file .*nope.csv' not found"):
        read_trace_entry({"trace": str(tmp_path / "nope.csv")}, "stream", None)


def test_engine_settings_are_a_candidate_axis_equal_to_separate_runs():
    """``settings`` (issue 36, item 5): each engine configuration is a candidate along dim ``setting``, and its
    results equal a simulation whose serving block sets those keys, bit for bit, per request and summary; a run
    without settings has no such dim."""
    settings = [{"step_tokens": 2048}, {"step_tokens": 256, "chunk_size": 256}, {"kv_policy": "recompute"}]
    base = {
        **_spec("Llama-3.1-8B", "H100-SXM", 8),
        "batch": [4, 16],
        "stream": {"poisson": 6.0, "input_len": 1500, "output_len": 60, "requests": 60, "seed": 3},
    }
    swept = slimjax.simulate({**base, "settings": settings})
    labels = ["step_tokens 2048", "step_tokens 256, chunk_size 256", "kv_policy recompute"]
    assert list(swept.setting.values) == labels and "setting" in swept.ttft_s.dims
    assert "engine settings swept as candidates" in swept.attrs["assumptions"]
    for label, keys in zip(labels, settings, strict=True):
        alone = slimjax.simulate({**base, "serving": {**base.get("serving", {}), **keys}})
        assert "setting" not in alone.ttft_s.dims
        got = swept.sel(setting=label)
        for name in ("ttft_s", "tpot_s", "preemptions", "ttft_p90_s", "utilization", "fits"):
            np.testing.assert_array_equal(got[name].values, alone[name].values, err_msg=f"{label}: {name}")
    short = swept.sel(setting=labels[1]).ttft_p90_s.values
    assert not np.array_equal(short, swept.sel(setting=labels[0]).ttft_p90_s.values)  # the axis moves the answer
