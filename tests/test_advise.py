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
    s = result.summary[result.summary["curves_subset"] == "all"].set_index(["slo", "method"])
    for (slo, method), g in pc.groupby(["slo", "method"]):
        assert s.loc[(slo, method), "exact_match"] == pytest.approx((g["recommended"] == g["truth"]).mean())
        assert 0 <= s.loc[(slo, method), "profiling_effort"] <= 1
    both = pc[(pc["recommended"] > 0) & (pc["truth"] > 0)]
    assert np.allclose(both["kv_saving"], 1 - both["recommended"] / both["max_seqs"])
    assert np.allclose(both["truth_kv_saving"], 1 - both["truth"] / both["max_seqs"])
    assert (pc.loc[pc["exact"], "throughput_change"].fillna(0) == 0).all()
    # the dense and sparse subsets partition the curves
    by = result.summary.set_index(["curves_subset", "slo", "method"])["curves"]
    key = ("tight", "global slim (in sample)")
    assert by[("dense", *key)] + by[("sparse", *key)] == by[("all", *key)]
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


def test_constant_rules_score_as_a_hand_count(shared_data, result):
    """ "Always B = 32" is exact where the truth is 32 (every curve has a B = 32 run, and no max_seqs below 32 here);
    the best constant in sample is the rule with the most exact matches, and the leave-one-curve-out choice on
    each curve is the best of the others."""
    curves = advise.measured_curves(shared_data)
    pc = result.per_curve
    for slo_name, factor in advise.SLO_FACTORS.items():
        truths, hits = {}, []
        for i, c in curves.groupby("curve"):
            b, t, e = (c[x].to_numpy(float) for x in ("batch", "throughput", "e2e_s"))
            limit = float(c["max_seqs"].iloc[0])
            truths[i] = b_cap_loop(b, t, e, factor * e[b == 32][0], 0.5, limit)
            allowed = [x for x in b if x <= min(32.0, limit)]
            hits.append(truths[i] == (max(allowed) if allowed else 0))
        hand = np.mean(hits)
        rows = pc[(pc.slo == slo_name) & (pc.method == "always B = 32")]
        assert rows["exact"].mean() == pytest.approx(hand) and len(rows) == len(truths)
        rules = [m for m in pc.method.unique() if m.startswith("always B = ")]
        scores = {m: pc[(pc.slo == slo_name) & (pc.method == m)]["exact"].sum() for m in rules}
        best = max(scores.values())
        first = min((float(m.split("= ")[1]) for m in rules if scores[m] == best))
        assert any(m == f"best constant (in sample: B = {first:g})" for m in pc.method.unique())
        loco = pc[(pc.slo == slo_name) & (pc.method == "best constant (leave-one-curve-out)")]
        assert len(loco) == len(truths) and set(loco["chosen_b"]) <= {float(m.split("= ")[1]) for m in rules}


@pytest.mark.heavy
def test_leave_one_curve_out_equals_separate_calibrations(shared_data):
    """The batched leave-one-curve-out calibration (one group per left-out curve) predicts each curve as a
    calibration without that curve, run on its own, does (a sample of curves)."""
    from slimjax.fit.slim import calibrate, predict

    curves = advise.measured_curves(shared_data)
    batched = advise._global_predictions(curves, "slim", loco=True)
    for i in (0, 57, int(curves["curve"].max())):
        src = curves.loc[curves["curve"] == i, "source"].iloc[0]
        train = curves[(curves["source"] == src) & (curves["curve"] != i)]
        alone = predict(calibrate(train, group_by=("source",), variant="slim"), curves[curves["curve"] == i])
        np.testing.assert_allclose(batched[i][0], alone["pred_throughput"].to_numpy(), rtol=1e-6)


def _curve(batch, e2e, I=128, O=128):
    import pandas as pd

    b = np.asarray(batch, float)
    return pd.DataFrame(
        dict(
            source="synthetic",
            model="m",
            gpu="g",
            n_gpu=1,
            input_len=I,
            output_len=O,
            batch=b,
            e2e_s=e2e,
            throughput=b * (I + O) / np.asarray(e2e, float),
            max_seqs=np.inf,
            curve=0,
        )
    )


def test_effort_counts_the_reference_run_and_change_has_a_sign():
    """On a three-point curve {1, 16, 32}, two profiled points are all three runs (the SLO's B = 32 reference is
    the third) and a global calibration needs that one run; a recommendation past the truth in the plateau is a
    gain (+), one short of it a loss (−)."""
    b = np.array([1.0, 16.0, 32.0])
    assert advise.runs_needed(b, 2) == 1.0 and advise.runs_needed(b, 3) == 1.0
    assert advise.runs_needed(b, 0) == pytest.approx(1 / 3)
    assert advise.runs_needed(np.array([1.0, 2, 4, 8, 16, 32, 64]), 2) == pytest.approx(3 / 7)
    c = _curve([1, 16, 32], [1.0, 1.5, 2.4])  # T(1) = 256, T(16) ≈ 2731, T(32) ≈ 3413 tokens/s
    t, e = c["throughput"].to_numpy(), c["e2e_s"].to_numpy()
    slo = 2.0  # B = 32 breaks it: the truth is 16
    assert advise.b_cap(b, t, e, slo, 0.5) == 16
    gain = advise._score(b, t, e, slo, 0.5, np.inf, 16, 32, 0.0)
    loss = advise._score(b, t, e, slo, 0.5, np.inf, 16, 1, 0.0)
    assert gain["throughput_change"] == pytest.approx(t[2] / t[1] - 1) and gain["throughput_change"] > 0
    assert gain["slo_violated"]
    assert loss["throughput_change"] == pytest.approx(t[0] / t[1] - 1) and loss["throughput_change"] < 0
    assert gain["one_step_change"] == pytest.approx(t[0] / t[1] - 1)  # what one grid step below costs
    assert advise.constant_rule(8.0, b, np.inf) == 1 and advise.constant_rule(64.0, b, 20.0) == 16
