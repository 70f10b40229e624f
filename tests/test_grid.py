"""The grid engine: every variable at every point against the loop reference, B_cap by
enumeration, grid-vs-point, block-size invariance, and the zarr round trip."""

import itertools
import json

import numpy as np
import pytest
import reference as ref
import xarray as xr

import slimjax
from slimjax.api import parse
from slimjax.engine.schema import VARIABLES
from slimjax.inputs.catalog import resolve_gpu, resolve_model


@pytest.fixture(scope="module")
def spec():
    return dict(
        models=["OPT-125m", "Llama-3.1-8B", "DeepSeek-V2", "gemma-2-9b"],
        gpus=["H100-SXM", "A100-SXM-40GB", "L40S"],
        batch=[1, 2, 3, 5, 8, 16, 32, 64, 128],
        input_len=[16, 128, 1000],
        output_len=[1, 7, 256],
        advisor={"epsilon": 0.5, "slo_factor": 4},
        precision="float64",
        slim_variant="slim",  # MODEL.md §1, against its loop reference (slim-kv has its own tests)
    )


@pytest.fixture(scope="module")
def ds(spec):
    return slimjax.sweep(spec, quiet=True)


def test_schema_dims_units_and_attrs(ds):
    assert tuple(ds.sizes) == ("model", "gpu", "batch", "input_len", "output_len")
    for name, var in VARIABLES.items():
        if var.group not in ("slim", "advisor") or var.needs:
            continue  # this sweep has no serving, queue or calibrated store
        dims, units, long_name = var.dims, var.units, var.long_name
        assert ds[name].dims == dims
        assert ds[name].attrs["units"] == units and ds[name].attrs["long_name"] == long_name
    for key in ("slimjax_version", "sweep_file", "slim_coefficients", "price_date", "precision"):
        assert key in ds.attrs
    assert ds.attrs["price_date"] == "2026-10-27"
    assert ds.b_cap.dtype == np.int32


def test_every_point_matches_loop_reference(ds, spec):
    sw = parse(spec)
    for m, g in itertools.product(spec["models"], spec["gpus"]):
        arch, gpu = resolve_model(m)[1], resolve_gpu(g)[1]
        theta = sw.slim.table[g]
        for B, I, O in itertools.product(spec["batch"], spec["input_len"], spec["output_len"]):
            want = ref.slim_floored(arch, gpu, theta, B, I, O)
            at = ds.sel(model=m, gpu=g, batch=B, input_len=I, output_len=O)
            for name, value in want.items():
                assert float(at[name]) == pytest.approx(value, rel=1e-12, nan_ok=True), (name, m, g, B, I, O)


def test_b_cap_matches_enumeration(ds, spec):
    sw = parse(spec)
    slo = json.loads(ds.b_cap.attrs["slo_s"])
    n_nonzero = 0
    for m, g in itertools.product(spec["models"], spec["gpus"]):
        arch, gpu = resolve_model(m)[1], resolve_gpu(g)[1]
        theta = sw.slim.table[g]
        ref_e2e = ref.slim_floored(arch, gpu, theta, 32, 2, 128, masked=False)["slim_e2e_s"]
        assert slo[m][g] == pytest.approx(4 * ref_e2e, rel=1e-12)
        for I, O in itertools.product(spec["input_len"], spec["output_len"]):
            want = ref.b_cap(arch, gpu, theta, spec["batch"], I, O, slo[m][g], 0.5)
            assert int(ds.b_cap.sel(model=m, gpu=g, input_len=I, output_len=O)) == want, (m, g, I, O)
            n_nonzero += want > 0
    assert n_nonzero > 10  # the check exercises real recommendations, not only zeros


def test_b_cap_is_masked_argmax_of_stored_arrays(ds):
    """B_cap agrees with a numpy masked argmax over the stored throughput and E2E."""
    t = ds.slim_throughput.values
    e = ds.slim_e2e_s.values
    b = ds.batch.values.reshape(1, 1, -1, 1, 1)
    slo = json.loads(ds.b_cap.attrs["slo_s"])
    slo = np.array([[slo[m][g] for g in ds.gpu.values] for m in ds.model.values])[:, :, None, None, None]
    t1 = ds.slim_throughput.isel(batch=0).where(ds.fits.isel(batch=0), np.inf).values[:, :, None]  # (NaN: unfit, 0)
    ok = (e <= slo) & (t / (b * t1) > 0.5) & ds.fits.values
    masked = np.where(ok, t, -np.inf)
    want = np.where(ok.any(axis=2), ds.batch.values[masked.argmax(axis=2)], 0)
    np.testing.assert_array_equal(ds.b_cap.values, want)


@pytest.mark.parametrize("precision, rtol", [("float64", 1e-15), ("float32", 1e-6)])
def test_sel_equals_scalar_call(spec, precision, rtol):
    grid = slimjax.sweep({**spec, "precision": precision}, quiet=True)
    for m, g, B, I, O in [
        ("Llama-3.1-8B", "H100-SXM", 16, 1000, 256),
        ("DeepSeek-V2", "L40S", 3, 16, 1),
        ("OPT-125m", "A100-SXM-40GB", 128, 128, 7),
    ]:
        one = slimjax.point(m, g, B, I, O, precision=precision, slim_variant="slim")
        at = grid.sel(model=m, gpu=g, batch=B, input_len=I, output_len=O)
        for k, v in one.items():
            np.testing.assert_allclose(float(at[k]), v, rtol=rtol, err_msg=k)


def test_float32_close_to_float64(spec, ds):
    f32 = slimjax.sweep({**spec, "precision": "float32"}, quiet=True)
    for name in ("slim_prefill_s", "slim_decode_s", "slim_e2e_s", "slim_throughput", "prefill_flops"):
        assert f32[name].dtype == np.float32
        np.testing.assert_allclose(f32[name].values, ds[name].values, rtol=2e-6)


def test_blocks_do_not_change_results(spec, ds):
    """A tiny memory budget cuts the grid into many padded blocks; results are identical."""
    small = slimjax.sweep(spec, quiet=True, memory_budget_bytes=40_000)
    xr.testing.assert_identical(small.drop_attrs(), ds.drop_attrs())


def test_cell_trees_dropped_with_their_calls_give_the_same_results(spec, ds, monkeypatch):
    """The recorded cell pytrees are bounded: past the bound they go with the compiled cell calls (traced again), and
    one dropped under a compiled call (another thread's clearing) is found by tracing its shape: same results."""
    from slimjax.engine import grid

    monkeypatch.setattr(grid, "MAX_CELL_TREES", 0)  # cleared before every block
    cleared = slimjax.sweep(spec, quiet=True, memory_budget_bytes=40_000)
    assert len(grid._CELL_TREES) <= 1
    xr.testing.assert_identical(cleared.drop_attrs(), ds.drop_attrs())
    monkeypatch.setattr(grid, "MAX_CELL_TREES", 256)
    real = grid._cell_block

    def forgetting(*args, **kwargs):  # the call compiled, its record gone before it is read
        out = real(*args, **kwargs)
        grid._CELL_TREES.clear()
        return out

    monkeypatch.setattr(grid, "_cell_block", forgetting)
    xr.testing.assert_identical(
        slimjax.sweep(spec, quiet=True, memory_budget_bytes=40_000).drop_attrs(), ds.drop_attrs()
    )


def test_memory_budget_too_small_is_a_clear_error(spec):
    with pytest.raises(slimjax.SlimjaxError, match="memory_budget"):
        slimjax.sweep(spec, quiet=True, memory_budget_bytes=100)


def test_zarr_round_trip(spec, ds, tmp_path):
    out = tmp_path / "s.zarr"
    back = slimjax.sweep(spec, out, quiet=True, memory_budget_bytes=40_000)
    reopened = xr.open_zarr(out)
    assert reopened.load().equals(ds)
    assert back.load().equals(ds)
    for name in ds.data_vars:
        assert reopened[name].attrs == {k: v for k, v in ds[name].attrs.items()}
    assert reopened.attrs["sweep_spec"] == ds.attrs["sweep_spec"]


def test_advisor_off_has_no_b_cap_and_allows_batch_without_1(spec):
    out = slimjax.sweep({**spec, "advisor": False, "batch": [4, 8]}, quiet=True)
    assert "b_cap" not in out
    assert list(out.batch.values) == [4, 8]


def test_absolute_slo_and_epsilon(spec):
    sw = parse({**spec, "advisor": {"slo_s": 5.0, "epsilon": 0.9}})
    out = slimjax.sweep(sw, quiet=True)
    m, g = "Llama-3.1-8B", "H100-SXM"
    arch, gpu = resolve_model(m)[1], resolve_gpu(g)[1]
    for I, O in itertools.product(spec["input_len"], spec["output_len"]):
        want = ref.b_cap(arch, gpu, sw.slim.table[g], spec["batch"], I, O, 5.0, 0.9)
        assert int(out.b_cap.sel(model=m, gpu=g, input_len=I, output_len=O)) == want


def test_slo_reference_off_grid_and_coefficients_per_gpu(spec):
    theta = dict(eta_c=0.5, eta_m=0.7, B0=2.0, alpha=1e-4, gamma=1e-6, t_fixed=0.2)
    s = {
        **spec,
        "advisor": {"slo_factor": 2, "slo_reference": {"input_len": 3, "output_len": 50, "batch": 7}},
        "slim": {"H100-SXM": theta, "default": {**theta, "eta_c": 0.25}},
    }
    out = slimjax.sweep(s, quiet=True)
    slo = json.loads(out.b_cap.attrs["slo_s"])
    arch = resolve_model("OPT-125m")[1]
    h100 = resolve_gpu("H100-SXM")[1]
    assert slo["OPT-125m"]["H100-SXM"] == pytest.approx(
        2 * ref.slim_floored(arch, h100, theta, 7, 3, 50)["slim_e2e_s"], rel=1e-12
    )
    l40s = {**theta, "eta_c": 0.25}
    want = ref.slim_floored(arch, resolve_gpu("L40S")[1], l40s, 5, 128, 7)["slim_prefill_s"]
    assert float(out.slim_prefill_s.sel(model="OPT-125m", gpu="L40S", batch=5, input_len=128)) == pytest.approx(
        want, rel=1e-12
    )
    assert json.loads(out.attrs["slim_coefficients"])["L40S"]["eta_c"] == 0.25
