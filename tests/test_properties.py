"""Hypothesis properties over whole grids: monotone latency, positive throughput, B_cap on the axis."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import slimjax


@st.composite
def sweeps(draw):
    kv = draw(st.integers(1, 8))
    model = {
        "name": "m",
        "num_hidden_layers": draw(st.integers(1, 80)),
        "hidden_size": draw(st.integers(64, 8192)),
        "num_attention_heads": kv * draw(st.integers(1, 8)),
        "num_key_value_heads": kv,
        "head_dim": draw(st.sampled_from([64, 128])),
        "intermediate_size": draw(st.integers(64, 30000)),
        "vocab_size": 32000,
    }
    gpu = {
        "name": "g",
        "tflops": draw(st.floats(50, 3000)),
        "bandwidth_tbs": draw(st.floats(0.3, 10)),
        "memory_gib": 80,
    }
    theta = {
        "eta_c": draw(st.floats(0.05, 1)),
        "eta_m": draw(st.floats(0.05, 2)),
        "B0": draw(st.floats(0, 64)),
        "alpha": draw(st.floats(0, 1e-3)),
        "gamma": draw(st.floats(0, 1e-5)),
        "t_fixed": draw(st.floats(0, 1)),
    }

    def axis(n, hi):
        return sorted(draw(st.sets(st.integers(1, hi), min_size=n, max_size=n)))

    return dict(
        models=[model],
        gpus=[gpu],
        slim=theta,
        batch=sorted({1, *axis(7, 4096)}),
        input_len=axis(4, 32768),
        output_len=axis(4, 8192),
        advisor={"epsilon": draw(st.floats(0, 1, exclude_max=True)), "slo_s": draw(st.floats(0.01, 1000))},
        precision=draw(st.sampled_from(["float32", "float64"])),
    )


@settings(max_examples=40, deadline=None)
@given(sweeps())
def test_grid_properties(spec):
    ds = slimjax.sweep(spec, quiet=True)
    fits = ds.fits.values
    e2e = ds.slim_e2e_s.values
    for axis, what in ((2, "batch"), (3, "input length"), (4, "output length")):
        d = np.diff(e2e, axis=axis)  # the physical floor can hold E2E flat (weights read once a step), never lower it
        assert np.all(d[np.isfinite(d)] >= 0), f"E2E never decreases with {what}"
    for name in ("slim_throughput", "slim_decode_s", "slim_e2e_s"):
        v = ds[name].values
        assert np.array_equal(np.isnan(v), ~fits), f"{name} is NaN exactly where the batch does not fit"
        assert np.all(v[fits] > 0) and np.all(np.isfinite(v[fits])), name
    for name in ("prefill_flops", "kv_traffic_bytes"):
        assert np.all(np.isfinite(ds[name].values)) and np.all(ds[name].values > 0), name
    b_cap = ds.b_cap.values
    assert np.all(np.isin(b_cap, np.concatenate([[0], ds.batch.values])))
    # a recommendation meets its own constraints
    for idx in zip(*np.nonzero(b_cap), strict=False):
        m, g, i, o = idx
        at = ds.isel(model=m, gpu=g, input_len=i, output_len=o).sel(batch=b_cap[idx])
        assert float(at.slim_e2e_s) <= spec["advisor"]["slo_s"]
