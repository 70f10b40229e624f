"""Benchmark harnesses (configs/harnesses.yaml, docs/engines.md): a measured row runs as its client ran. The shared
serving rows are recognised by their source, request lengths are drawn as vLLM's random dataset draws them, and the
forward model of an InferenceMAX row equals the simulate study's own closed loop over the same requests, every
request scored."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.fit import serving as serving_fit
from slimjax.inputs.harnesses import DEFAULT, harness_of, harnesses, request_lengths
from slimjax.studies import serving_check, simulate


def test_the_shared_rows_name_their_harness(shared_data):
    """InferenceMAX's nightly rows (a workflow run, a dated dump) run its harness; aiconfigurator's own collector's
    rows the default closed loop; every row one of the table's."""
    rows = slimjax.load_traces(shared_data / "measured" / "serving_silicon_h100_h200.csv")
    counts = rows.harness.value_counts()
    assert set(counts.index) <= set(harnesses()) and counts["inferencemax"] > 300 and counts[DEFAULT] > 200
    raw = pd.read_csv(shared_data / "measured" / "serving_silicon_h100_h200.csv")
    assert {harness_of(s) for s in raw.silicon_data_source if "gap-analysis" in s} == {DEFAULT}
    assert harness_of(None) == DEFAULT and harness_of(float("nan")) == DEFAULT


def test_request_lengths_are_vllm_random_lengths():
    """Uniform integers in [⌊r·L⌋, L] (vLLM benchmark_serving's random dataset, range ratio r), the same draws for
    every row of the same L, r and n; exactly L at r = 1."""
    got = request_lengths([1024, 1024, 100, 7], 400, [0.8, 0.8, 1.0, 0.5])
    assert got.shape == (4, 400) and np.array_equal(got[0], got[1])
    assert got[0].min() >= 819 and got[0].max() <= 1024 and np.all(got[0] == np.floor(got[0]))
    assert abs(got[0].mean() - (819 + 1024) / 2) < 10 and len(np.unique(got[0])) > 100
    assert np.all(got[2] == 100) and got[3].min() >= 3 and got[3].max() <= 7


def test_an_inferencemax_row_is_its_closed_loop_over_its_requests(shared_data):
    """One InferenceMAX row (vLLM, Llama-3.1-70B on H200): the forward model equals the simulate study's closed loop
    of C clients over the same 10·C requests (lengths drawn as the harness draws them), TTFT and TPOT averaged over
    every request, to 1e-9."""
    rows = slimjax.load_traces(shared_data / "measured" / "serving_silicon_h100_h200.csv")
    pick = rows[
        (rows.harness == "inferencemax")
        & rows.model.str.contains("70B")
        & (rows.gpu == "H200")
        & (rows.n_gpu == 2)
        & (rows.batch == 8)
        & (rows.input_len == 1024)
        & (rows.output_len == 1024)
        & rows.framework.str.startswith("vllm")
    ].head(1)
    assert len(pick) == 1
    r = serving_check.simulate_rows(pick.reset_index(drop=True)).iloc[0]
    C, h = int(r.batch), harnesses()["inferencemax"]
    n = C * h.requests_per_client
    serving = {"efficiency": "calibrated", "engine": r.framework.split()[0]}
    serving.update(weight_dtype_bytes=float(r.weight_dtype_bytes), kv_dtype_bytes=float(r.kv_dtype_bytes))
    spec = dict(
        models=[r.model],
        gpus=[r.gpu],
        tp=[int(r.n_gpu)],
        batch=[C],
        serving=serving,
        stream={"closed_loop": {"clients": [C], "input_len": 1024, "output_len": 1024, "requests_per_client": 10}},
        precision="float64",
    )
    sim = simulate.parse(spec)
    lengths = dict(
        input_len=request_lengths([r.input_len], n, h.range_ratio)[0],
        output_len=request_lengths([r.output_len], n, h.range_ratio)[0],
    )
    ds = simulate.run(dataclasses.replace(sim, stream=dataclasses.replace(sim.stream, **lengths))).squeeze()
    np.testing.assert_allclose(
        [r.sim_ttft_s - r.request_overhead_s, r.sim_tpot_s],
        [float(ds.ttft_s.mean()), float(ds.tpot_s.mean())],
        rtol=1e-9,
    )
    # a planner's check: the mean TTFT at least one prompt's prefill at 100 % of the pair's fp8 peak
    assert r.sim_ttft_s > 2 * 70.6e9 * 0.8 * 1024 / (2 * 1979e12)


def test_a_row_naming_an_unknown_harness_is_refused():
    rows = pd.DataFrame(
        [dict(model="Llama-3.1-8B", gpu="H100-SXM", n_gpu=1, batch=2, input_len=64, output_len=8, harness="mine")]
    ).assign(ttft_s=0.1, itl_s=0.01, e2e_s=1.0)
    with pytest.raises(SlimjaxError, match=r"traces\.harness: 'mine' is not a harness; add it to configs/harnesses"):
        serving_fit.predict_serving(rows, serving_fit.DEFAULT_START)
