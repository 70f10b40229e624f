"""The constants of FP8 kernels and of engines: e_B8 (serving key ``bandwidth_efficiency_fp8``: 8-bit weights at the
FP8 peak stream at their own fraction of the HBM bandwidth; unset, e_B bit for bit, tests/test_fp8_efficiency.py),
t_step per engine profile (the ``step_overhead_s`` block of configs/roofline/default.yaml, taken by the calibrated
preset under a named engine and by the serving check per row), and the joint fit that ties a constant to a column
of the rows (:func:`slimjax.fit.serving.calibrate_serving_by`)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.fit import serving as fit
from slimjax.inputs import serving as serving_keys

H200_BANDWIDTH = 4.8e12  # configs/gpus.yaml: one H200's HBM3e, bytes/s


def _itl_s(gpu, dtype, model="Llama-3.1-70B", **efficiency):
    return slimjax.point(model, gpu, 1, 128, 2, serving=dict(weight_dtype_bytes=dtype, **efficiency))


def test_fp8_weights_stream_at_their_own_bandwidth_efficiency():
    """Back of the envelope: one Llama-3.1-70B FP8 sequence of 128 tokens on one H200 decodes in weights ÷ (e_B8 ·
    4.8 TB/s) (its KV read is a rounding error); halving e_B8 doubles it and e_B no longer moves it."""
    at = _itl_s("H200", "fp8", bandwidth_efficiency=0.5, bandwidth_efficiency_fp8=0.8)
    assert at["itl_s"] == pytest.approx(at["weights_bytes"] / (0.8 * H200_BANDWIDTH), rel=0.01)
    half = _itl_s("H200", "fp8", bandwidth_efficiency=0.5, bandwidth_efficiency_fp8=0.4)
    assert half["itl_s"] == pytest.approx(2 * at["itl_s"], rel=1e-6)
    other = _itl_s("H200", "fp8", bandwidth_efficiency=0.9, bandwidth_efficiency_fp8=0.8)
    assert other["itl_s"] == at["itl_s"]


def _engine_rows(truth_by_gpu: dict, truth_by_engine: dict):
    """FP8 closed-loop rows of Llama-3.1-8B on the GPUs of ``truth_by_gpu`` (its e_B8) under the engines of
    ``truth_by_engine`` (its t_step) made by the forward model, and the constants held (the others)."""
    rows = pd.DataFrame(
        [
            dict(
                model="Llama-3.1-8B",
                gpu=g,
                n_gpu=1,
                batch=c,
                input_len=i,
                output_len=o,
                weight_dtype_bytes=1.0,
                framework=e,
            )
            for g in truth_by_gpu
            for e in truth_by_engine
            for c in (1, 8)
            for i, o in ((512, 64), (2000, 32))
        ]
    ).assign(ttft_s=1.0, itl_s=1.0, e2e_s=np.nan)
    held = pd.DataFrame(
        dict(compute_efficiency=0.7, bandwidth_efficiency=0.6, launch_overhead_s=1e-3), index=rows.index
    )
    truth = held.assign(
        bandwidth_efficiency_fp8=rows.gpu.map(truth_by_gpu),
        step_overhead_s=rows.framework.map(truth_by_engine),
    )
    p = fit.predict_serving(rows, truth)
    return rows.assign(ttft_s=p.ttft_sim_s.to_numpy(), itl_s=p.tpot_sim_s.to_numpy()), held


@pytest.mark.heavy
def test_a_joint_fit_recovers_constants_tied_to_gpus_and_engines():
    """Rows made at e_B8 per GPU and t_step per engine (H200 measured under both engines, H100 under vLLM alone: its
    t_step comes from H200's rows through the tie) are recovered to 1e-3, every value identified, each with the rows
    that take it."""
    by_gpu, by_engine = {"H100-SXM": 0.8, "H200": 0.75}, {"trtllm": 5e-4, "vllm": 2e-3}
    rows, held = _engine_rows(by_gpu, by_engine)
    keep = ~((rows.gpu == "H100-SXM") & (rows.framework == "trtllm")).to_numpy()
    rows, held = rows[keep].reset_index(drop=True), held[keep].reset_index(drop=True)
    free = {"bandwidth_efficiency_fp8": "gpu", "step_overhead_s": "engine"}
    ds = fit.calibrate_serving_by(rows, held, free, iterations=15)
    truth = {("bandwidth_efficiency_fp8", g): v for g, v in by_gpu.items()}
    truth |= {("step_overhead_s", e): v for e, v in by_engine.items()}
    assert len(ds.value) == len(truth) and bool(ds.converged)
    counts = rows.groupby("gpu").size().to_dict() | rows.groupby("framework").size().to_dict()
    for v in range(ds.sizes["value"]):
        one = ds.isel(value=v)
        key = (str(one.param.values), str(one.level.values))
        assert float(one.coefficient) == pytest.approx(truth[key], rel=1e-3), key
        assert bool(one.identified) and not bool(one.at_bound) and int(one.n_rows) == counts[key[1]], key
    assert float(ds.mape_tpot) < 1e-6 and float(ds.mape_ttft) < 1e-6


@pytest.mark.heavy
def test_a_per_step_cost_an_engine_shares_with_the_gpu_is_reported_unidentified():
    """t_l per GPU and t_step per engine on rows of one GPU under one engine are one per-step cost: neither is
    identified (the fit says so instead of splitting it)."""
    rows, held = _engine_rows({"H100-SXM": 0.8}, {"vllm": 2e-3})
    held = held.assign(bandwidth_efficiency_fp8=0.8)
    ds = fit.calibrate_serving_by(
        rows,
        held,
        {"launch_overhead_s": "gpu", "step_overhead_s": "engine"},
        start={"step_overhead_s": 1e-3},
        iterations=4,
    )
    assert not ds.identified.any()


def test_a_joint_fit_names_what_it_cannot_take():
    rows, held = _engine_rows({"H100-SXM": 0.8}, {"vllm": 2e-3})
    with pytest.raises(SlimjaxError, match="free: 'e_B8' is not a fitted constant"):
        fit.calibrate_serving_by(rows, held, {"e_B8": "gpu"})
    with pytest.raises(SlimjaxError, match="free: rows have no column 'node'"):
        fit.calibrate_serving_by(rows, held, {"bandwidth_efficiency_fp8": "node"})
    with pytest.raises(SlimjaxError, match="constants: 3 rows of constants for 4 rows"):
        fit.calibrate_serving_by(rows, held.iloc[:3], {"bandwidth_efficiency_fp8": "gpu"})


def _block(key):
    block = serving_keys.config_yaml("roofline/default.yaml").get(key)
    if not block:
        pytest.skip(f"no {key} fit shipped in configs/roofline/default.yaml")
    return block


def test_the_calibrated_preset_takes_the_fitted_e_b8_and_the_engine_step_overhead():
    """configs/roofline/default.yaml's ``bandwidth_efficiency_fp8`` block (per GPU, else its default) and
    ``step_overhead_s`` block (per engine profile; ``generic``, none): every value physical and converged; the preset
    under ``engine: vllm`` takes vLLM's t_step and says so; without an engine, none."""
    e_b8 = _block("bandwidth_efficiency_fp8")
    for gpu, entry in e_b8["gpus"].items():
        value, which = serving_keys.calibrated_fp8_efficiency(gpu, "bandwidth_efficiency_fp8")
        assert 0 < value < 1 and entry["converged"], gpu  # a fit still moving is not shipped
        if entry["identified"]:
            assert (value, which) == (entry["value"], gpu)
    assert 0 < e_b8["default"] < 1
    steps = _block("step_overhead_s")["engines"]
    assert steps and all(e["converged"] and 0 <= e["value"] < 0.02 for e in steps.values())  # host work: < 20 ms
    for e, entry in steps.items():  # at its bound (0): none charged (the other rules: tests/test_step_costs.py)
        if entry["identified"] or entry["at_bound"]:
            want = entry["value"] if entry["identified"] else 0.0
            assert serving_keys.calibrated_step_cost(e)[0] == want
    engine = next(k for k, e in steps.items() if e["identified"])
    values, label = serving_keys.calibrated_efficiency("H200", engine)
    assert values["step_overhead_s"] == steps[engine]["value"] and f"t_step {engine}" in label
    generic, label = serving_keys.calibrated_efficiency("H200")
    assert generic["step_overhead_s"] < 1e-9 and "t_step" not in label
    spec = dict(models=["Llama-3.1-8B"], gpus=["H200"], batch=[8], input_len=[512], output_len=[64], advisor=False)
    named = slimjax.sweep({**spec, "serving": {"efficiency": "calibrated", "engine": engine}}, quiet=True)
    settings = json.loads(named.attrs["serving"])["Llama-3.1-8B"]["H200"]
    assert settings["step_overhead_s"] == steps[engine]["value"]


def test_the_serving_check_runs_each_row_with_its_engine_step_overhead():
    """A two-row file, the same run under vLLM and TensorRT-LLM: each row is simulated with its own engine's
    fitted t_step (the difference of their TPOTs is the difference of their t_step where both are fitted)."""
    from slimjax.studies.serving_check import calibrated_constants, simulate_rows

    steps = _block("step_overhead_s")["engines"]
    rows = pd.DataFrame(
        [
            dict(model="Llama-3.1-8B", gpu="H200", n_gpu=1, batch=1, input_len=256, output_len=16, framework=f)
            for f in ("vllm 0.11.0", "trtllm")
        ]
    ).assign(ttft_s=0.1, itl_s=0.01, e2e_s=np.nan, weight_dtype_bytes=1.0)
    got = simulate_rows(rows, requests_per_client=2)
    for f, r in zip(("vllm", "trtllm"), got.itertuples(), strict=True):
        want = steps[f]["value"] if f in steps and steps[f]["identified"] else 0.0
        assert calibrated_constants("H200", f)["step_overhead_s"] == pytest.approx(want, abs=1e-12)
        assert np.isfinite(r.sim_tpot_s)
    t_v, t_t = (calibrated_constants("H200", f)["step_overhead_s"] for f in ("vllm", "trtllm"))
    # one request alone: a decode step is the same roofline under either profile, plus its engine's t_step
    assert got.sim_tpot_s.iloc[0] - got.sim_tpot_s.iloc[1] == pytest.approx(t_v - t_t, rel=1e-6, abs=1e-9)
