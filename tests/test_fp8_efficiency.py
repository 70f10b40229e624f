"""The roofline's compute efficiency at the FP8 peak (serving key ``compute_efficiency_fp8``, e_F8): 8-bit weights
on a GPU with an FP8 peak are timed at e_F8 of that peak, everything else at e_F of its own; unset, e_F8 is e_F (the
results of before, bit for bit); the calibrated preset takes the fitted value; the serving fit recovers it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import slimjax
from slimjax.fit import serving as fit
from slimjax.inputs import serving as serving_keys
from slimjax.inputs.catalog import resolve_gpu

H200_FP8_FLOPS = 1979e12  # configs/gpus.yaml: dense FP8 peak of one H200


def _prefill_s(gpu, dtype, model="Llama-3.1-70B", **efficiency):
    return slimjax.point(model, gpu, 1, 4096, 2, serving=dict(weight_dtype_bytes=dtype, **efficiency))


def test_fp8_weights_take_their_own_efficiency_of_the_fp8_peak():
    """Back of the envelope: a 4,096-token prompt of Llama-3.1-70B in FP8 on one H200 is compute-bound, so its
    prefill takes FLOPs ÷ (e_F8 · 1,979 TFLOP/s); halving e_F8 doubles it, and e_F no longer moves it."""
    at = _prefill_s("H200", "fp8", compute_efficiency=0.8, compute_efficiency_fp8=0.4)
    flops = at["prefill_flops"]
    assert at["prefill_s"] == pytest.approx(flops / (0.4 * H200_FP8_FLOPS), rel=0.03)
    half = _prefill_s("H200", "fp8", compute_efficiency=0.8, compute_efficiency_fp8=0.2)
    assert half["prefill_s"] == pytest.approx(2 * at["prefill_s"], rel=0.02)
    other_e_f = _prefill_s("H200", "fp8", compute_efficiency=0.5, compute_efficiency_fp8=0.4)
    assert other_e_f["prefill_s"] == at["prefill_s"]


@pytest.mark.parametrize(
    "base, key, measure",
    [
        ("compute_efficiency", "compute_efficiency_fp8", "prefill_s"),
        ("bandwidth_efficiency", "bandwidth_efficiency_fp8", "itl_s"),
    ],
)
def test_unset_fp8_efficiency_is_its_base_and_bf16_or_no_fp8_peak_ignore_it(base, key, measure):
    """Unset (NaN), e_F8 is e_F and e_B8 is e_B exactly: the same fraction of either peak, as before the keys. bf16
    weights, and 8-bit weights on a GPU without an FP8 peak (A100: dequantised to bf16), never read them."""
    unset = _prefill_s("H200", "fp8", **{base: 0.6})
    same = _prefill_s("H200", "fp8", **{base: 0.6, key: 0.6})
    assert unset == same and np.isfinite(unset[measure])
    for gpu, dtype in (("H200", "bf16"), ("A100-SXM-80GB", "fp8")):
        a = _prefill_s(gpu, dtype, "Llama-3.1-8B", **{base: 0.6})
        b = _prefill_s(gpu, dtype, "Llama-3.1-8B", **{base: 0.6, key: 0.2})
        assert a == b and np.isfinite(a[measure]), (gpu, dtype)
    assert math.isnan(serving_keys.SERVING[key].default)


def test_the_calibrated_preset_takes_the_fitted_e_f8_and_says_so():
    """configs/roofline/default.yaml's ``compute_efficiency_fp8`` block: a GPU with its own identified fit takes
    it, another GPU the block's default; the constants' label names where e_F8 came from; the value is a
    fraction of the peak."""
    block = serving_keys.config_yaml("roofline/default.yaml").get("compute_efficiency_fp8")
    if not block:
        pytest.skip("no e_F8 fit shipped in configs/roofline/default.yaml")
    for gpu, entry in block["gpus"].items():
        value, which = serving_keys.calibrated_fp8_efficiency(gpu)
        assert 0 < value < 1
        if entry["identified"]:
            assert (value, which) == (entry["value"], gpu)
        values, label = serving_keys.calibrated_efficiency(gpu)
        assert values["compute_efficiency_fp8"] == value and f"e_F8 {which}" in label
    assert serving_keys.calibrated_fp8_efficiency("B200") == (block["default"], "default")
    assert 0 < block["default"] < 1


def _fp8_rows(truth):
    """bf16 and FP8 closed-loop rows of Llama-3.1-8B on one H100 made by the forward model at ``truth``."""
    rows = pd.DataFrame(
        [
            dict(
                model="Llama-3.1-8B", gpu="H100-SXM", n_gpu=1, batch=c, input_len=i, output_len=o, weight_dtype_bytes=b
            )
            for b in (2.0, 1.0)
            for c in (1, 8)
            for i, o in ((512, 128), (3000, 64))
        ]
    ).assign(ttft_s=1.0, itl_s=1.0, e2e_s=np.nan)
    p = fit.predict_serving(rows, truth)
    return rows.assign(ttft_s=p.ttft_sim_s, itl_s=p.tpot_sim_s)


@pytest.mark.heavy
def test_the_serving_fit_recovers_e_f8_beside_e_f():
    """bf16 and FP8 rows made at known e_F and e_F8 are recovered to 1e-3, both identified; on bf16 rows alone e_F8
    is reported unidentified (nothing the rows measure moves it)."""
    truth = dict(compute_efficiency=0.7, compute_efficiency_fp8=0.45, bandwidth_efficiency=0.6, step_overhead_s=1e-3)
    rows = _fp8_rows(truth)
    free = ("compute_efficiency", "compute_efficiency_fp8", "bandwidth_efficiency", "step_overhead_s")
    ds = fit.calibrate_serving(rows, free=free, iterations=15).sel(gpu="H100-SXM")
    for p in free:
        assert float(ds.coefficients.sel(param=p)) == pytest.approx(truth[p], rel=1e-3), p
        assert bool(ds.identified.sel(param=p)), p
    bf16 = fit.calibrate_serving(rows[rows.weight_dtype_bytes == 2], free=free, iterations=3).sel(gpu="H100-SXM")
    assert not bool(bf16.identified.sel(param="compute_efficiency_fp8"))


def test_predict_without_e_f8_runs_fp8_rows_at_e_f():
    """Constants that leave e_F8 out (or give NaN) time FP8 rows at e_F, as the roofline takes an unset e_F8."""
    truth = dict(compute_efficiency=0.7, bandwidth_efficiency=0.6)
    rows = _fp8_rows({**truth, "compute_efficiency_fp8": 0.7})
    a = fit.predict_serving(rows, truth)
    b = fit.predict_serving(rows, {**truth, "compute_efficiency_fp8": np.nan})
    c = fit.predict_serving(rows, {**truth, "compute_efficiency_fp8": 0.7})
    np.testing.assert_array_equal(a.ttft_sim_s, b.ttft_sim_s)
    np.testing.assert_array_equal(a.ttft_sim_s, c.ttft_sim_s)
    assert resolve_gpu("H100-SXM", "gpu")[1]["flops_fp8_per_s"] > 0  # the rows ran at the FP8 peak


def test_an_fp8_row_equals_the_event_loop_at_e_f8_and_e_b8():
    """An FP8 closed loop through the serving fit's forward model equals the plain-Python §9 event loop
    (tests/serving_reference.py, e_F8 and e_B8 applied by its own rules, with a step overhead) per summary to 1e-9."""
    import serving_reference as sref

    from slimjax.inputs.catalog import resolve_model

    C, I, O, k = 3, 1500, 30, 2
    consts = dict(
        compute_efficiency=0.8,
        compute_efficiency_fp8=0.35,
        bandwidth_efficiency=0.6,
        bandwidth_efficiency_fp8=0.85,
        step_overhead_s=1.5e-3,
    )
    row = pd.DataFrame(
        [
            dict(
                model="Llama-3.1-8B",
                gpu="H100-SXM",
                n_gpu=1,
                batch=C,
                input_len=I,
                output_len=O,
                weight_dtype_bytes=1.0,
            )
        ]
    ).assign(ttft_s=1.0, itl_s=1.0)
    got = fit.predict_serving(row, consts, requests_per_client=k).iloc[0]
    arch = resolve_model("Llama-3.1-8B")[1]
    gpu = resolve_gpu("H100-SXM")[1]
    sv = sref.default_serving(arch)
    sv.update(n_gpu=1, kv_replication=1.0, bytes_per_weight=1.0, launch_overhead_s=0.0, **consts)
    want = sref.simulate(sref.replica_terms(arch, gpu, sv), None, [I] * (C * k), [O] * (C * k), C, clients=C)
    assert got.ttft_sim_s == pytest.approx(np.mean(want["ttft"][C:]), rel=1e-9)
    tpot = np.mean([(e - f) / (O - 1) for e, f in zip(want["end"][C:], want["first"][C:], strict=True)])
    assert got.tpot_sim_s == pytest.approx(tpot, rel=1e-9)
    faster = sref.replica_terms(arch, gpu, {**sv, "compute_efficiency_fp8": math.nan})  # unset: e_F 0.8
    assert sref.simulate(faster, None, [I] * (C * k), [O] * (C * k), C, clients=C)["ttft"][C] < want["ttft"][C]
