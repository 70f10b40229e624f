"""The advisor evaluated as the SLIM paper does (source 000 §VII-B; MODEL.md §2) on the shared curves."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import slimjax
from slimjax.cli import main
from slimjax.studies import advise


def b_cap_loop(batch, t, e, slo, eps, limit):
    best_b, best_t = 0, -1.0
    t1 = [t[i] for i in range(len(batch)) if batch[i] == 1][0]
    for i in range(len(batch)):
        if e[i] <= slo and t[i] / (batch[i] * t1) > eps and batch[i] <= limit and t[i] > best_t:
            best_b, best_t = int(batch[i]), t[i]
    return best_b


@pytest.fixture(scope="module")
def result(shared_data):
    return advise.evaluate(shared_data)


def test_ground_truth_matches_a_brute_force_search(shared_data, result):
    curves = advise.measured_curves(shared_data)
    assert curves["curve"].nunique() == result.summary["curves"].iloc[0] >= 100
    pc = result.per_curve.set_index([*advise.CURVE_KEYS, "slo", "method"]).sort_index()
    for _, c in curves.groupby("curve"):
        b, t, e = (c[x].to_numpy(float) for x in ("batch", "throughput", "e2e_s"))
        limit = float(c["max_seqs"].iloc[0])
        for slo_name, factor in advise.SLO_FACTORS.items():
            slo = factor * e[b == 32][0]
            want = b_cap_loop(b, t, e, slo, 0.5, limit)
            assert advise.b_cap(b, t, e, slo, 0.5, limit) == want
            key = tuple(c.iloc[0][k] for k in advise.CURVE_KEYS)
            assert (pc.loc[(*key, slo_name), "truth"] == want).all()


def test_recommendations_respect_memory_and_the_summary_adds_up(result):
    pc = result.per_curve
    assert (pc["recommended"] <= pc["max_seqs"]).all() and (pc["truth"] <= pc["max_seqs"]).all()
    s = result.summary.set_index(["slo", "method"])
    for (slo, method), g in pc.groupby(["slo", "method"]):
        assert s.loc[(slo, method), "exact_match"] == pytest.approx((g["recommended"] == g["truth"]).mean())
        assert 0 <= s.loc[(slo, method), "profiling_effort"] <= 1
    both = pc[(pc["recommended"] > 0) & (pc["truth"] > 0)]
    assert np.allclose(both["kv_saving"], 1 - both["recommended"] / both["max_seqs"])
    assert (pc.loc[pc["exact"], "throughput_lost"].fillna(0) == 0).all()
    # back of the envelope: the paper's claim holds here — a few profiled points recover most B_caps
    assert s.loc[("loose", "profiled k=2 (slim = slim-kv)"), "within_one_step"] >= 0.9


def test_two_profiled_points_are_fitted_exactly(shared_data):
    curves = advise.measured_curves(shared_data)
    sample = [c.reset_index(drop=True) for _, c in list(curves.groupby("curve"))[:12]]
    ab = advise._affine_fit(sample, 2)
    for (a, s), c in zip(ab, sample, strict=False):
        b, e = c["batch"].to_numpy(float)[:2], c["e2e_s"].to_numpy(float)[:2]
        if e[1] > e[0]:  # an increasing pair is an exact affine fit with a, b ≥ 0 whenever the intercept is ≥ 0
            slope = (e[1] - e[0]) / (b[1] - b[0])
            if e[0] - slope * b[0] > 0:
                np.testing.assert_allclose(a + s * b, e, rtol=1e-6)


def test_knee_interpolates_in_log_batch():
    b = np.array([1.0, 2.0, 4.0, 8.0])
    t = np.array([10.0, 18.0, 28.0, 32.0])  # ratio 1, 0.9, 0.7, 0.4
    k = advise.knee(b, t, 0.5)
    assert 4 < k < 8 and k == pytest.approx(np.exp(np.log(4) + (0.7 - 0.5) / (0.7 - 0.4) * np.log(2)))
    assert np.isnan(advise.knee(b, t, 0.3))  # the knee lies beyond the batches measured


def test_cli_prints_the_study(result, monkeypatch, tmp_path):
    monkeypatch.setattr(slimjax, "advise", lambda data_dir=None, epsilon=0.5: result)
    out = CliRunner().invoke(main, ["advise", "--out", str(tmp_path / "a.csv")])
    assert out.exit_code == 0, out.output
    assert "profiled k=2" in out.output and "global slim-kv" in out.output and "knee" in out.output
    assert len((tmp_path / "a.csv").read_text().splitlines()) == len(result.per_curve) + 1


def test_bad_epsilon_is_an_error():
    with pytest.raises(slimjax.SlimjaxError, match="epsilon"):
        slimjax.advise(epsilon=1.5)
