"""Roofline constants fitted through the §9 serving simulation (slimjax.fit.serving): synthetic serving rows made
by the simulation at known constants are recovered, and constants the rows cannot identify are reported so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from servingfit import TRUTH
from servingfit import serving_rows as _rows

from slimjax.config import float64_scope
from slimjax.errors import SlimjaxError
from slimjax.fit import serving as fit


@pytest.mark.heavy
def test_fit_recovers_known_constants_with_a_step_floor_and_a_link_fraction():
    """Closed-loop rows scored on TTFT and TPOT, offline batches on TTFT alone (a batch prefill, as splitwise's
    prompt_time) and on their latency alone (as LLM-Inference-Bench's)."""
    closed = _rows((1, 2, 4), (1, 8), ((512, 128), (2048, 256)))
    prefill = _rows((2,), (4,), ((1024, 64),), offline=True).assign(itl_s=np.nan)
    latency = _rows((4,), (4,), ((256, 256),), offline=True).assign(ttft_s=np.nan, itl_s=np.nan)
    rows = pd.concat([closed, prefill, latency], ignore_index=True)
    ds = fit.calibrate_serving(rows, iterations=15).sel(gpu="A100-SXM-80GB")
    assert int(ds.n_rows) == len(rows) and int(ds.n_residuals) == 2 * len(closed) + 2
    for p in fit.DEFAULT_FREE:
        assert float(ds.coefficients.sel(param=p)) == pytest.approx(TRUTH[p], rel=1e-3), p
        assert bool(ds.identified.sel(param=p)), p
    assert bool(ds.converged) and float(ds.mape_ttft) < 1e-6 and float(ds.mape_tpot) < 1e-6
    assert float(ds.mape_e2e) < 1e-6
    assert not bool(ds.free.sel(param="launch_overhead_s"))  # held: not reported as fitted
    assert not bool(ds.identified.sel(param="launch_overhead_s"))


def test_a_warm_start_per_group_starts_there():
    """``start_by_group`` starts a group at its own constants (a refit continued from the shipped ones): started at
    the truth, two iterations leave it there; a column that is no constant is refused by name."""
    rows = _rows((1, 2), (8,), ((512, 128),))
    warm = pd.DataFrame([TRUTH], index=["A100-SXM-80GB"]).reindex(columns=list(fit.SERVING_PARAMS))  # e_F8 NaN: e_F
    ds = fit.calibrate_serving(rows, iterations=2, start_by_group=warm).sel(gpu="A100-SXM-80GB")
    for p in fit.DEFAULT_FREE:
        assert float(ds.coefficients.sel(param=p)) == pytest.approx(TRUTH[p], rel=1e-6), p
    with pytest.raises(SlimjaxError, match="start_by_group: column 'e_F' is not a constant"):
        fit.calibrate_serving(rows, iterations=1, start_by_group=warm.rename(columns={"compute_efficiency": "e_F"}))


def test_constants_the_rows_cannot_see_are_reported_unidentified():
    """One GPU alone (TP 1) says nothing of the link; short prompts at low concurrency never reach the compute
    roof, so e_F is unidentified; freed together, t_l and t_step are one per-step cost to the simulation (and
    with weights-bound steps, e_B joins them: W/(e_B·BW) + t_l + t_step). The fit still matches the rows."""
    rows = _rows((1,), (1, 8), ((16, 64), (32, 128)), gpu="H100-SXM")
    ds = fit.calibrate_serving(rows, free=fit.SERVING_PARAMS, iterations=8).sel(gpu="H100-SXM")
    ident = dict(zip(ds.param.values, ds.identified.values, strict=True))
    assert not ident["link_efficiency"] and not ident["allreduce_latency_s"]
    assert not ident["compute_efficiency"]
    assert not ident["launch_overhead_s"] and not ident["step_overhead_s"]
    assert float(ds.mape_tpot) < 1.0
    with pytest.raises(SlimjaxError, match="free: 'e_F' is not a fitted constant"):
        fit.calibrate_serving(rows, free=("e_F",))


def test_an_offline_batch_is_one_prefill_pass_then_the_closed_form_decode():
    """An offline batch of B prompts (t_step = 0, TP 1) by hand: its TTFT is one pass over B·I prompt tokens,
    max(ops/F, M_W/BW) + t_l with ops = B·(2P·I + a·I²/2) (MODEL.md §9 step 3, no KV read yet); its TPOT is §4's
    closed-form ITL at batch B; its latency the two together (every request ends at the same step)."""
    import slimjax

    B, I, O = 4, 1024, 64
    consts = dict(TRUTH, step_overhead_s=0.0, launch_overhead_s=1e-3)
    row = pd.DataFrame([dict(model="Llama-3.1-8B", gpu="H100-SXM", n_gpu=1, batch=B, input_len=I, output_len=O)])
    p = fit.predict_serving(row.assign(offline=True, ttft_s=1.0, itl_s=1.0, e2e_s=1.0), consts).iloc[0]
    from slimjax.inputs.catalog import resolve_gpu, resolve_model

    arch, gpu = resolve_model("Llama-3.1-8B")[1], resolve_gpu("H100-SXM")[1]
    P, L, Hq, dh = arch["n_params"], arch["n_layers"], arch["n_heads"], arch["head_dim"]
    F = gpu["flops_per_s"] * consts["compute_efficiency"]
    BW = gpu["bandwidth_bytes_per_s"] * consts["bandwidth_efficiency"]
    ops = B * (2 * P * I + 4 * L * Hq * dh * I**2 / 2)
    ttft = max(ops / F, P * arch["bytes_per_weight"] / BW) + consts["launch_overhead_s"]
    assert p.ttft_sim_s == pytest.approx(ttft, rel=1e-9)
    with float64_scope():
        cap = slimjax.capacity(
            "Llama-3.1-8B",
            "H100-SXM",
            I,
            O,
            B,
            serving={k: consts[k] for k in ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s")},
        )
    itl = float(np.asarray(cap["itl_s"]).ravel()[0])
    assert p.tpot_sim_s == pytest.approx(itl, rel=1e-9)
    assert p.e2e_sim_s == pytest.approx(ttft + (O - 1) * itl, rel=1e-9)


def test_a_closed_loop_with_waiting_clients_equals_the_event_loop():
    """``waiting_clients`` k: C clients on a replica admitting C − k at once (as aiconfigurator's rows read with
    k = 1). Mean TTFT, TPOT and E2E of the requests after the first C completions equal the plain-Python §9 event
    loop's (tests/serving_reference.py) run with batch limit C − k; one request always waits, so TTFT exceeds the
    k = 0 loop's by about one inter-completion interval."""
    import serving_reference as sref

    from slimjax.inputs.catalog import resolve_gpu, resolve_model

    C, I, O, k, n = 4, 700, 40, 2, 2
    consts = dict(TRUTH, launch_overhead_s=1e-3)
    row = pd.DataFrame([dict(model="Llama-3.1-8B", gpu="H100-SXM", n_gpu=n, batch=C, input_len=I, output_len=O)])
    row = row.assign(ttft_s=1.0, itl_s=1.0)
    got = {w: fit.predict_serving(row, consts, requests_per_client=k, waiting_clients=w).iloc[0] for w in (0, 1)}
    arch = resolve_model("Llama-3.1-8B")[1]
    gpu = {**resolve_gpu("H100-SXM")[1], **{p: consts[p] for p in ("link_efficiency", "allreduce_latency_s")}}
    sv = sref.default_serving(arch)
    sv.update(n_gpu=n, kv_replication=1.0, **{p: consts[p] for p in fit.SERVING_PARAMS if p in sv and p in consts})
    terms = sref.replica_terms(arch, gpu, sv)
    want = sref.simulate(terms, None, [I] * (C * k), [O] * (C * k), C - 1, clients=C)
    ttft = np.mean(want["ttft"][C:])
    tpot = np.mean([(e - f) / (O - 1) for e, f in zip(want["end"][C:], want["first"][C:], strict=True)])
    assert got[1].ttft_sim_s == pytest.approx(ttft, rel=1e-9)
    assert got[1].tpot_sim_s == pytest.approx(tpot, rel=1e-9)
    assert got[1].e2e_sim_s == pytest.approx(np.mean(want["e2e"][C:]), rel=1e-9)
    interval = got[1].e2e_sim_s / (C - 1)  # a completion every S/(C − 1) on average
    assert got[1].ttft_sim_s - got[0].ttft_sim_s > 0.5 * interval


def test_request_overhead_is_the_closed_form_least_squares_and_stays_physical():
    """δ minimising Σ((s_i + δ)/m_i − 1)² in closed form equals a numerical minimiser's; a fit that wants a negative
    or an over-100-ms overhead is pinned at the bound and says so; rows missing a figure are left out."""
    from scipy.optimize import minimize_scalar

    rng = np.random.default_rng(1)
    m = rng.uniform(0.05, 2.0, 200)
    s = m * rng.uniform(0.6, 1.1, 200) - 0.02
    got, at_bound = fit.fit_request_overhead(s, m)
    want = minimize_scalar(lambda d: np.sum(((s + d) / m - 1) ** 2), bounds=(-1, 1), method="bounded").x
    assert got == pytest.approx(want, abs=1e-7) and 0 < got < 0.1 and not at_bound
    assert fit.fit_request_overhead(m * 1.5, m) == (0.0, True)  # the engine alone is already slower: no overhead
    assert fit.fit_request_overhead(m * 0.1, m + 1.0) == (0.1, True)  # would need over 100 ms
    assert fit.fit_request_overhead([np.nan, 0.1], [0.2, np.nan]) == (0.0, True)
    with_nan = fit.fit_request_overhead(np.append(s, np.nan), np.append(m, 1.0))
    assert with_nan[0] == pytest.approx(got, rel=1e-12)
