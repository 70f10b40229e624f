"""Roofline constants fitted through the §9 serving simulation (slimjax.fit.serving): synthetic serving rows made
by the simulation at known constants are recovered, and constants the rows cannot identify are reported so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from slimjax.config import float64_scope
from slimjax.errors import SlimjaxError
from slimjax.fit import serving as fit

TRUTH = dict(
    compute_efficiency=0.6,
    bandwidth_efficiency=0.55,
    launch_overhead_s=0.0,
    step_overhead_s=2e-3,  # a per-step floor
    link_efficiency=0.65,  # the link's achieved fraction
    allreduce_latency_s=3e-5,
)


def _rows(tps, clients, lengths, truth=TRUTH):
    """Serving rows whose mean TTFT and TPOT are the simulation's own at ``truth``."""
    rows = pd.DataFrame(
        [
            dict(model="Llama-3.1-8B", gpu="H100-SXM", n_gpu=n, batch=c, input_len=i, output_len=o)
            for n in tps
            for c in clients
            for i, o in lengths
        ]
    )
    with float64_scope():
        z = np.asarray(
            fit.parameters_from(
                np.array([max(truth[p], 1e-13) for p in fit.SERVING_PARAMS]), fit.SERVING_PARAMS, fit.SERVING_BOUNDED
            )
        )
        buckets = {c: np.flatnonzero(rows.batch.to_numpy() == c) for c in np.unique(rows.batch)}
        v, _ = fit._simulate(np.tile(z, (len(rows), 1)), fit._lane_inputs(rows), buckets, 4, (0,))
    return rows.assign(ttft_s=v[:, 0], itl_s=v[:, 1])


def test_fit_recovers_known_constants_with_a_step_floor_and_a_link_fraction():
    rows = _rows((1, 2, 4), (1, 8), ((512, 128), (2048, 256)))
    ds = fit.calibrate_serving(rows, iterations=15).sel(gpu="H100-SXM")
    for p in fit.DEFAULT_FREE:
        assert float(ds.coefficients.sel(param=p)) == pytest.approx(TRUTH[p], rel=1e-3), p
        assert bool(ds.identified.sel(param=p)), p
    assert bool(ds.converged) and float(ds.mape_ttft) < 1e-6 and float(ds.mape_tpot) < 1e-6
    assert not bool(ds.free.sel(param="launch_overhead_s"))  # held: not reported as fitted
    assert not bool(ds.identified.sel(param="launch_overhead_s"))


def test_constants_the_rows_cannot_see_are_reported_unidentified():
    """One GPU alone (TP 1) says nothing of the link; short prompts at low concurrency never reach the compute
    roof, so e_F is unidentified; freed together, t_l and t_step are one per-step cost to the simulation (and
    with weights-bound steps, e_B joins them: W/(e_B·BW) + t_l + t_step). The fit still matches the rows."""
    rows = _rows((1,), (1, 8), ((16, 64), (32, 128)))
    ds = fit.calibrate_serving(rows, free=fit.SERVING_PARAMS, iterations=8).sel(gpu="H100-SXM")
    ident = dict(zip(ds.param.values, ds.identified.values, strict=True))
    assert not ident["link_efficiency"] and not ident["allreduce_latency_s"]
    assert not ident["compute_efficiency"]
    assert not ident["launch_overhead_s"] and not ident["step_overhead_s"]
    assert float(ds.mape_tpot) < 1.0
    with pytest.raises(SlimjaxError, match="free: 'e_F' is not a fitted constant"):
        fit.calibrate_serving(rows, free=("e_F",))
