"""Agent graphs (MODEL.md §6): the closed-form API schedule against a call-by-call simulation, local
waves against a brute-force schedule, costs by hand, the grid against the scalar path, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import slimjax
from slimjax.config import float64_scope
from slimjax.constants import PRICE_DATE
from slimjax.inputs.agents import agents_block
from slimjax.model import agents as ag


def api_schedule_loop(n_st, n_call, d, rpm, tpm, I, O, s, p):
    """MODEL.md §6 call by call: launch at max(previous launch + δ, stage ready, completion of call i − p)."""
    q = min(rpm, tpm / (I + O))
    delta = 0.0 if math.isinf(q) else 60.0 / q
    launches, completions = [], []
    ready, last = 0.0, -math.inf
    for _ in range(n_st):
        stage_done = []
        for _ in range(n_call):
            t = max(last + delta, ready)
            i = len(launches)
            if not math.isinf(p) and i - int(p) >= 0:
                t = max(t, completions[i - int(p)])
            launches.append(t)
            completions.append(t + s)
            stage_done.append(t + s)
            last = t
        ready = max(stage_done) + d
    return max(completions)


def closed_form(n_st, n_call, d, rpm, tpm, I, O, s, p):
    with float64_scope():
        delta = ag.api_spacing(rpm, tpm, float(I), float(O))
        return float(ag.api_time(float(n_st), float(n_call), float(d), delta, float(s), float(p)))


CASES = {
    "spacing": (3, 20, 1.0, 60, math.inf, 100, 50, 0.5, 64),  # δ = 1 s ≫ s/p
    "parallelism": (2, 40, 0.5, 10_000, math.inf, 100, 50, 6.0, 4),  # waves of 4 calls of 6 s
    "service": (1, 8, 0.0, math.inf, math.inf, 100, 50, 3.0, 8),  # all at once
    "one call": (1, 1, 0.0, 30, 1e5, 100, 50, 2.0, 1),
    "one stage": (1, 17, 0.0, 120, 1e5, 300, 200, 1.5, 3),
    "no quota (δ = 0)": (4, 9, 2.0, math.inf, math.inf, 100, 50, 2.5, 2),
    "tpm binds": (2, 10, 0.1, 1000, 6000, 500, 100, 0.2, 8),
    "spacing across stages": (3, 2, 0.0, 2, math.inf, 10, 10, 1.0, 5),  # δ = 30 s > s + d
    "no parallelism limit": (2, 30, 1.0, 600, math.inf, 10, 10, 5.0, math.inf),
}


@pytest.mark.parametrize("case", list(CASES))
def test_api_closed_form_equals_the_call_by_call_schedule(case):
    args = CASES[case]
    assert closed_form(*args) == pytest.approx(api_schedule_loop(*args), rel=1e-12, abs=1e-12)


def test_api_closed_form_on_random_graphs():
    rng = np.random.default_rng(11)
    for _ in range(300):
        args = (
            int(rng.integers(1, 6)),
            int(rng.integers(1, 50)),
            float(rng.choice([0.0, rng.uniform(0, 5)])),
            float(rng.choice([math.inf, rng.uniform(5, 2000)])),
            float(rng.choice([math.inf, rng.uniform(1e3, 1e6)])),
            int(rng.integers(1, 4000)),
            int(rng.integers(1, 2000)),
            float(rng.uniform(0.1, 10)),
            float(rng.choice([math.inf, rng.integers(1, 20)])),
        )
        assert closed_form(*args) == pytest.approx(api_schedule_loop(*args), rel=1e-10), args


@pytest.mark.parametrize(
    "case,limit", [("spacing", 0), ("parallelism", 1), ("service", 2), ("one call", 2), ("spacing across stages", 0)]
)
def test_binding_limit_names_what_sets_the_api_time(case, limit):
    n_st, n_call, d, rpm, tpm, I, O, s, p = CASES[case]
    with float64_scope():
        delta = ag.api_spacing(rpm, tpm, float(I), float(O))
        assert int(ag.api_binding_limit(float(n_st), float(n_call), float(d), delta, s, float(p))) == limit


def local_waves_loop(n_st, n_call, d, p, m, service):
    if m == 0:
        return math.inf
    w = max(1, min(p, m))
    total = 0.0
    for _ in range(n_st):
        left = n_call
        while left > 0:  # one wave of up to w calls, each wave S(w)
            total += service(w)
            left -= w
    return total + (n_st - 1) * d


def test_local_time_matches_brute_force_waves():
    rng = np.random.default_rng(3)
    service = lambda w: 2.0 + 0.1 * w  # noqa: E731
    for _ in range(200):
        n_st, n_call, p, m = (
            int(rng.integers(1, 6)),
            int(rng.integers(1, 70)),
            int(rng.integers(1, 40)),
            int(rng.integers(0, 50)),
        )
        d = float(rng.uniform(0, 3))
        with float64_scope():
            w = float(ag.wave_width(float(p), float(m)))
            got = float(ag.local_time(float(n_st), float(n_call), d, w, service(w), float(m)))
        assert w == max(1, min(p, m))
        assert got == pytest.approx(local_waves_loop(n_st, n_call, d, p, m, service), rel=1e-12)


SWEEP = dict(
    models=["Llama-3.1-8B", "Llama-3.1-405B"],
    gpus=["H100-SXM", "L40S"],
    batch=[1, 4, 32, 1024],  # 1024: a limit the KV pool cannot hold
    input_len=[512, 2048],
    output_len=[128],
    serving=dict(n_gpu=1),
    precision="float64",
    agents=dict(
        api=dict(rpm=500, tpm=2_000_000, service_s=3.0, parallelism=8, price_in_per_mtok=2.0, price_out_per_mtok=10.0),
        research=dict(stages=4, calls_per_stage=16, tool_delay_s=2.0),
        coding=dict(stages=2, calls_per_stage=3, parallelism=2, rpm=20),
    ),
)


@pytest.fixture(scope="module")
def swept():
    return slimjax.sweep(SWEEP)


def test_grid_agrees_with_the_scalar_path_and_hand_costs(swept):
    ds = swept
    for model, gpu, b, i in (("Llama-3.1-8B", "H100-SXM", 4, 512), ("Llama-3.1-8B", "L40S", 32, 2048)):
        c = ds.sel(model=model, gpu=gpu, batch=b, input_len=i, output_len=128)
        m = min(b, int(c.max_seqs))
        for agent, (n_st, n_call, p, d) in (("research", (4, 16, 16, 2.0)), ("coding", (2, 3, 2, 0.0))):
            w = max(1, min(p, m))
            s_w = slimjax.capacity(model, gpu, i, 128, w, serving=dict(n_gpu=1))["service_s"]
            s_1 = slimjax.capacity(model, gpu, i, 128, 1, serving=dict(n_gpu=1))["service_s"]
            a = c.sel(agent=agent)
            assert float(a.agent_local_s) == pytest.approx(
                n_st * math.ceil(n_call / w) * s_w + (n_st - 1) * d, rel=1e-12
            )
            assert float(a.agent_dependency_bound_s) == pytest.approx(n_st * s_1 + (n_st - 1) * d, rel=1e-12)
            price = {"H100-SXM": 2.99, "L40S": 1.19}[gpu]
            assert float(a.agent_local_cost_usd) == pytest.approx(price * float(a.agent_local_s) / 3600, rel=1e-12)
            assert float(a.agent_api_cost_usd) == pytest.approx(n_st * n_call * (i * 2.0 + 128 * 10.0) / 1e6, rel=1e-12)
            rpm = 20 if agent == "coding" else 500
            want = api_schedule_loop(n_st, n_call, d, rpm, 2e6, i, 128, 3.0, 8)
            assert float(a.agent_api_s) == pytest.approx(want, rel=1e-12)
            assert int(a.agent_faster) == (0 if float(a.agent_local_s) <= want else 1)
    # no schedule beats the dependency bound (NaN: the batch limit does not fit, no local figure)
    assert ((ds.agent_local_s >= ds.agent_dependency_bound_s - 1e-12) | ds.agent_local_s.isnull()).all()


def test_what_does_not_fit_has_no_local_figure_and_the_api_wins(swept):
    big = swept.sel(model="Llama-3.1-405B")  # 810 GB of weights on one GPU
    assert np.isnan(big.agent_local_s).all() and np.isnan(big.agent_local_cost_usd).all()
    assert (big.agent_faster == 1).all() and (big.agent_cheaper == 1).all()
    # a local figure exactly where the batch limit fits the replica
    fits = swept.fits.broadcast_like(swept.agent_local_s)
    assert np.array_equal(np.isfinite(swept.agent_local_s.values), fits.values)


def test_attrs_carry_the_price_date_and_flag_meanings(swept):
    for name in ("agent_local_cost_usd", "agent_api_cost_usd", "agent_cheaper"):
        assert swept[name].attrs["price_date"] == PRICE_DATE == "2026-10-27"
    assert swept.agent_api_limit.attrs["flag_meanings"] == "spacing parallelism service"
    assert swept.agent_faster.attrs["flag_meanings"] == "local api"
    assert list(swept.agent_local_s.dims) == ["model", "gpu", "batch", "input_len", "output_len", "agent"]
    assert list(swept.agent.values) == ["research", "coding"]


@pytest.mark.parametrize(
    "block,field",
    [
        (dict(g=dict(stages=2, calls_per_stage=4, rpm=0)), "agents.g.rpm"),
        (dict(api=dict(tpm=-5), g=dict(stages=2, calls_per_stage=4)), "agents.api.tpm"),
        (dict(g=dict(stages=2, calls_per_stage=4, parallelism=0)), "agents.g.parallelism"),
        (dict(g=dict(stages=0, calls_per_stage=4)), "agents.g.stages"),
        (dict(g=dict(stages=2, calls_per_stage=4, tool_delay_s=-1)), "agents.g.tool_delay_s"),
        (dict(g=dict(stages=2)), "agents.g.calls_per_stage"),
        (dict(g=dict(stages=2, calls_per_stage=4, colour=1)), "agents.g.colour"),
        (dict(g=dict(stages=2, calls_per_stage=4, api=dict(parallelism=0.5))), "agents.g.api.parallelism"),
        (dict(api=dict(rpm=10)), "agents"),
    ],
)
def test_bad_agent_input_names_graph_field_and_value(block, field):
    with pytest.raises(slimjax.SlimjaxError) as e:
        agents_block(block)
    assert e.value.field == field, e.value


def test_one_graph_cards_and_where_the_winner_flips():
    result = slimjax.agent(
        "Llama-3.1-8B",
        "H100-SXM",
        1024,
        256,
        dict(stages=3, calls_per_stage=8, tool_delay_s=1.0),
        api=dict(rpm=60, service_s=2.0),
        serving=dict(n_gpu=1),
    )
    by_rpm = result["rpm"]
    faster = by_rpm["agent_faster"].to_numpy()
    flip = result["flips"]["faster_by_rpm"]
    # a tighter quota only slows the API: once it is faster it stays faster as RPM grows
    assert (np.diff(faster) >= 0).all()
    if flip is not None:
        lo, hi, side = flip
        assert side == "api" and by_rpm.loc[by_rpm.rpm == lo, "agent_faster"].item() == 0
        assert by_rpm.loc[by_rpm.rpm == hi, "agent_faster"].item() == 1
    at = result["at"]
    want = api_schedule_loop(3, 8, 1.0, 60, 2e6, 1024, 256, 2.0, 16)
    assert at["agent_api_s"] == pytest.approx(want, rel=1e-12)
    cards = dict(slimjax.agent_cards(result))
    assert "bound by" in cards["API time T_api"] and "2026-10-27" in cards["Prices"]
    big = dict(
        slimjax.agent_cards(
            slimjax.agent("Llama-3.1-405B", "L40S", 1024, 256, dict(stages=2, calls_per_stage=4), serving=dict(n_gpu=1))
        )
    )
    assert big["Local time T_local"] == "not runnable (does not fit)" and big["Faster"] == "api"


def test_cli_agents_and_the_sweep_table(tmp_path):
    from click.testing import CliRunner

    from slimjax.cli import main

    graph = ["agents", "--model", "Llama-3.1-8B", "--gpu", "H100-SXM", "--input-len", "1024", "--output-len", "256"]
    graph += ["--stages", "2", "--calls", "4"]
    out = CliRunner().invoke(main, [*graph, "--api-rpm", "0"])
    assert out.exit_code == 2 and "rpm" in out.output  # a bad quota names the field
    out = CliRunner().invoke(main, graph)
    assert out.exit_code == 0, out.output
    assert "API time T_api" in out.output and "Faster flips" in out.output
    import yaml

    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in SWEEP.items()}))
    out = CliRunner().invoke(main, ["sweep", str(path), "--out", str(tmp_path / "a.zarr")])
    assert out.exit_code == 0, out.output
    assert "Agent graphs at input_len" in out.output and "does not fit" in out.output  # 405B on one GPU


def test_break_even_price_and_rate_make_both_sides_equal(swept):
    """At the break-even blended price the API costs what the replica does (to 1e-9); at the break-even RPM the
    call-by-call API schedule takes T_local (to 1e-9), and a quota 0.1 % tighter is slower; where no quota can
    make the API as fast, or the replica does not run, there is no number."""
    graphs = {"research": (4, 16, 2.0, 3.0, 8), "coding": (2, 3, 0.0, 3.0, 8)}  # n_st, n_call, d, s, p_api
    checked = 0
    for agent, (n_st, n_call, d, s, p) in graphs.items():
        for model in swept.model.values:
            for gpu in swept.gpu.values:
                for b in swept.batch.values:
                    for i in swept.input_len.values:
                        c = swept.sel(model=model, gpu=gpu, batch=b, input_len=i, output_len=128, agent=agent)
                        local, cost = float(c.agent_local_s), float(c.agent_local_cost_usd)
                        price, rpm = float(c.agent_break_even_price_per_mtok), float(c.agent_break_even_rpm)
                        if not np.isfinite(local):
                            assert np.isnan(price) and np.isnan(rpm)
                            continue
                        assert n_st * n_call * (i + 128) * price / 1e6 == pytest.approx(cost, rel=1e-9)
                        blended = (i * 2.0 + 128 * 10.0) / (i + 128)
                        assert float(c.agent_api_price_per_mtok) == pytest.approx(blended, rel=1e-12)
                        assert int(c.agent_cheaper) == (0 if blended >= price else 1)
                        fastest = api_schedule_loop(n_st, n_call, d, math.inf, 2e6, i, 128, s, p)
                        if np.isnan(rpm):
                            assert fastest > local  # the token quota or the service time keeps the API slower
                            continue
                        assert rpm > 0
                        at = api_schedule_loop(n_st, n_call, d, rpm, 2e6, i, 128, s, p)
                        assert at == pytest.approx(local, rel=1e-9)
                        assert api_schedule_loop(n_st, n_call, d, rpm * 0.999, 2e6, i, 128, s, p) > local
                        checked += 1
    assert checked >= 8
    assert swept.agent_break_even_price_per_mtok.attrs["price_date"] == PRICE_DATE
    # every agent variable keeps what the answer assumed; the sweep's agent table ends with it
    import json

    said = json.loads(swept.agent_cheaper.attrs["assumptions"])
    assert said[0].startswith(f"prices: illustrative GPU $/hour and API $/Mtok, dated {PRICE_DATE}")
    assert any(a.startswith("local: a dedicated replica") for a in said)
    from slimjax.report.cards import summary

    tables = summary(swept, 512, 128)
    assert tables["agent_assumptions"] == said
    # the table's batch limit is the shortest local time among those that run (a masked, NaN limit is skipped)
    mixed = 0
    for row in tables["agents"].itertuples():
        local = swept.agent_local_s.sel(model=row.model, gpu=row.gpu, agent=row.agent, input_len=512, output_len=128)
        finite = local.where(np.isfinite(local), drop=True)
        if finite.size:
            assert row.batch == int(finite.batch[int(np.argmin(finite.values))])
            mixed += finite.size < local.size
    assert mixed  # some graph's largest limit does not run where a smaller one does


def test_break_even_rate_edges():
    """One call: any quota will do where the API's service time is no longer than local (0), none where it is
    (NaN); a token quota that caps the rate below what it takes: none."""
    with float64_scope():
        one = [float(ag.break_even_rpm(1.0, 1.0, 0.0, 2.0, 8.0, math.inf, 100.0, 50.0, t)) for t in (3.0, 1.0)]
        capped = float(ag.break_even_rpm(1.0, 10.0, 0.0, 1.0, 8.0, 1500.0, 100.0, 50.0, 5.0))
    assert one[0] == 0.0 and np.isnan(one[1])
    assert np.isnan(capped)  # 1,500 tokens/min: 10 calls of 150 tokens take 54 s of spacing alone
