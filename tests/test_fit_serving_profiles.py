"""The serving fit recovers known constants with each engine's profile (slimjax.fit.serving): a file of its own, so
the test workers share the fits."""

import numpy as np
import pytest
from servingfit import TRUTH, serving_rows

from slimjax.fit import serving as fit


# one engine in the default run, all three with SLIMJAX_TESTS=all (tests/conftest.py)
@pytest.mark.parametrize(
    "engine", [pytest.param("vllm", marks=pytest.mark.heavy), pytest.param("sglang", marks=pytest.mark.heavy), "trtllm"]
)
def test_fit_recovers_known_constants_with_each_engine_profile(engine):
    """Rows a run of each engine would give (its profile: vLLM's paged cache and 8,192-token steps, SGLang's
    prefill-first steps and retract, TensorRT-LLM's reservation and 32-token blocks), made by the forward model at
    known constants, are recovered to 1e-3."""
    rows = serving_rows((1, 2), (4, 12), ((512, 160), (3000, 64))).assign(
        framework=engine, kv_dtype_bytes=np.nan, weight_dtype_bytes=np.nan
    )
    p = fit.predict_serving(rows, TRUTH)
    rows = rows.assign(ttft_s=p.ttft_sim_s, itl_s=p.tpot_sim_s, e2e_s=np.nan)
    profile = fit.row_profiles(rows)
    assert (profile.engine == engine).all()
    ds = fit.calibrate_serving(rows, iterations=15).sel(gpu="A100-SXM-80GB")
    for q in fit.DEFAULT_FREE:
        assert float(ds.coefficients.sel(param=q)) == pytest.approx(TRUTH[q], rel=1e-3), (engine, q)
    assert bool(ds.converged)
    assert "engine's profile" in ds.attrs["forward_model"]
