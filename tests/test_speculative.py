"""Speculative decoding (docs/speculative.md): the jitted simulation against the plain Python event loop of
tests/serving_reference.py per request (float64, 1e-9) with MTP/EAGLE layer drafts and a draft model, on one and
several replicas, reserved and paged KV under pressure, prefill-first steps and a closed loop; its limits (k = 0 is no
speculation bit for bit, a = 1 with a free draft is no speculation, a lone request's TPOT is its verify step and
drafting over a, by hand); the draft's memory; and its settings checked, one line naming the field."""

import math

import numpy as np
import pytest
import reference as ref
import serving_reference as sref
from hypothesis import given, settings
from hypothesis import strategies as st

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog
from slimjax.inputs.serving import draft_model_terms
from slimjax.studies import simulate

RNG = np.random.default_rng(37)
N = 40
ARRIVALS = np.sort(RNG.uniform(0, 1.5, N)).round(3)
INPUTS = RNG.integers(50, 1500, N)
OUTPUTS = RNG.integers(1, 300, N)
MODEL, GPU = "Llama-3.1-8B", "H100-SXM"
EAGLE = dict(method="eagle", tokens=3, acceptance_length=2.3)


def _stream():
    return {"requests": {"arrival_s": ARRIVALS.tolist(), "input_len": INPUTS.tolist(), "output_len": OUTPUTS.tolist()}}


def _spec(model=MODEL, batch=16, *, tp=1, replicas=1, router="round_robin", stream=None, **serving):
    return dict(
        models=[model],
        gpus=[GPU],
        tp=[tp],
        batch=[batch],
        replicas=[replicas],
        router=router,
        precision="float64",
        serving=serving,
        stream=stream or _stream(),
    )


def _compare(spec, clients=None, policy="reserve"):
    sim = simulate.parse(spec)
    ds = simulate.run(sim)
    want, terms = sref.simulate_study(
        sim,
        catalog.resolve_model(spec["models"][0])[1],
        clients,
        policy=policy,
        prefill_first=bool(spec["serving"].get("prefill_first", 0)),
    )
    got = ds.isel(dict(model=0, gpu=0, tp=0, pp=0, batch=0, replicas=0) | ({"clients": 0} if clients else {}))
    np.testing.assert_allclose(got.ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    np.testing.assert_array_equal(got.preemptions.values, want["preemptions"])
    assert ds.attrs["engine_steps"] == want["steps"]
    np.testing.assert_allclose(float(got.kv_peak_bytes), max(want["kv_peak"]), rtol=1e-12)
    exact = float(np.quantile(want["gaps"], 0.9))
    assert abs(float(got.token_gap_p90_s) / exact - 1) < 0.012  # one histogram bin
    return ds, want, terms


def _pool_tokens_reserved_gib(tokens: float, model: str, spec_block: dict) -> float:
    """Reserved memory that leaves a pool of ``tokens`` tokens of KV beside the weights and the draft (u = 0.9)."""
    arch, g = catalog.resolve_model(model)[1], catalog.resolve_gpu(GPU)[1]
    weights = arch["n_params"] * arch["bytes_per_weight"]
    draft = weights / arch["n_layers"] if spec_block.get("method") in ("mtp", "eagle") else 0.0
    pool = tokens * arch["n_layers"] * ref.kv_bytes_per_layer_token(arch)
    return (0.9 * g["memory_bytes"] - weights - draft - pool) / 2**30


@pytest.mark.parametrize(
    "case",
    [
        dict(speculative=EAGLE),  # one replica: contiguous lanes, decode stretches
        dict(speculative=dict(method="mtp", tokens=1, acceptance_length=1.8), chunk_size=256, step_tokens=600),
        dict(speculative=EAGLE, replicas=2, router="least_loaded"),
        dict(speculative=EAGLE, prefill_first=1),
        dict(speculative=dict(method="eagle", tokens=4, acceptance_length=3.7), tp=2, batch=8),
    ],
    ids=["eagle", "mtp_chunked", "least_loaded", "prefill_first", "tp2"],
)
def test_speculation_equals_the_event_loop(case):
    """Each decode verifies 1 + k tokens and emits ⌊m·a⌋ − ⌊(m − 1)·a⌋ at its m-th step, the drafting costs k
    passes of one layer and the LM head, and the simulation equals the event loop per request."""
    case = dict(case)
    spec = _spec(
        tp=case.pop("tp", 1),
        batch=case.pop("batch", 16),
        replicas=case.pop("replicas", 1),
        router=case.pop("router", "round_robin"),
        **case,
    )
    ds, want, terms = _compare(spec)
    assert terms["spec"] is not None
    plain = simulate.run(simulate.parse({**spec, "serving": {k: v for k, v in case.items() if k != "speculative"}}))
    # the run speculated: fewer steps, and (a > 1, a small batch) shorter decodes
    assert ds.attrs["engine_steps"] < plain.attrs["engine_steps"]
    assert float(ds.tpot_mean_s.squeeze()) < float(plain.tpot_mean_s.squeeze())


def test_a_draft_model_equals_the_event_loop():
    """Llama-3.1-8B drafting for Llama-3.1-70B on four GPUs: its own passes, weights and KV reads."""
    block = dict(method="draft", tokens=4, acceptance_length=3.1, draft_model="Llama-3.1-8B")
    ds, _, terms = _compare(_spec("Llama-3.1-70B", batch=8, tp=4, speculative=block))
    assert terms["spec"]["share"] == 0 and terms["spec"]["P0"] > 7e9


@pytest.mark.parametrize("policy", ["recompute", "retract"])
def test_speculation_under_kv_pressure_equals_the_event_loop(policy):
    """Paged KV outgrown: speculating requests grow by their emitted tokens, are preempted and prefilled again."""
    reserved = _pool_tokens_reserved_gib(9000, MODEL, EAGLE)
    spec = _spec(batch=32, speculative=EAGLE, kv_policy=policy, reserved_gib=reserved)
    _, want, _ = _compare(spec, policy=policy)
    assert sum(want["preemptions"]) > 0


def test_a_closed_loop_speculating_equals_the_event_loop():
    stream = {"closed_loop": {"clients": [6], "input_len": 700, "output_len": 257, "requests_per_client": 3}}
    _compare(_spec(batch=6, stream=stream, speculative=dict(method="mtp", tokens=2, acceptance_length=2.6)), clients=6)


def test_no_draft_tokens_is_no_speculation_bit_for_bit():
    """k = 0 (method none) leaves every result as it was: the lane runs without the part."""
    base = simulate.run(simulate.parse(_spec(chunk_size=512)))
    off = simulate.run(simulate.parse(_spec(chunk_size=512, speculative=dict(method="none", tokens=0))))
    for name in ("ttft_s", "e2e_s", "tpot_mean_s", "kv_peak_bytes", "token_gap_p90_s"):
        np.testing.assert_array_equal(off[name].values, base[name].values)
    assert off.attrs["engine_steps"] == base.attrs["engine_steps"]


def test_one_token_accepted_from_a_free_draft_is_no_speculation():
    """a = 1 with a draft that costs nothing: a lone request's decode is memory-bound whatever 1 + k tokens it
    verifies, so its times are exactly those without speculation."""
    stream = {"requests": {"arrival_s": [0.0, 5.0], "input_len": [300, 900], "output_len": [120, 60]}}
    base = simulate.run(simulate.parse(_spec(stream=stream)))
    free = dict(speculative_method="draft", speculative_tokens=2, acceptance_length=1.0, draft_params=0.0)
    got = simulate.run(simulate.parse(_spec(stream=stream, **free)))
    np.testing.assert_array_equal(got.ttft_s.values, base.ttft_s.values)
    np.testing.assert_array_equal(got.e2e_s.values, base.e2e_s.values)


def test_a_lone_requests_tpot_is_its_verify_step_and_drafting_over_a():
    """By hand: one request of O = 1 + 2·n tokens at a = 2 takes n verify steps of 1 + k tokens; each is the
    roofline max(FLOPs/F, bytes/BW) + t_l of the target plus k EAGLE passes (one layer and the LM head), so its
    TPOT is their mean over a."""
    k, a, n, prompt = 3, 2.0, 40, 1000
    stream = {"requests": {"arrival_s": [0.0], "input_len": [prompt], "output_len": [1 + 2 * n]}}
    launch = 1e-3
    ds = simulate.run(
        simulate.parse(
            _spec(
                stream=stream, launch_overhead_s=launch, speculative=dict(method="eagle", tokens=k, acceptance_length=a)
            )
        )
    ).squeeze()
    arch, gpu = catalog.resolve_model(MODEL)[1], catalog.resolve_gpu(GPU)[1]
    L, D, V = arch["n_layers"], arch["hidden"], arch["vocab"]
    P, bw = arch["n_params"], arch["bytes_per_weight"]
    F, BW = gpu["flops_per_s"], gpu["bandwidth_bytes_per_s"]
    kv_token = L * ref.kv_bytes_per_layer_token(arch)  # bytes of KV per context token, every layer
    a_dec = 4 * L * arch["n_heads"] * arch["head_dim"]
    steps = []
    for m in range(n):
        T = prompt + 1 + 2 * m  # its context at the m-th verify step
        verify = max((2 * P * (1 + k) + a_dec * ((1 + k) * T + k * (k + 1) / 2)) / F, (P * bw + kv_token * T) / BW)
        draft_read = P * bw / L + D * V * bw + kv_token * T / L
        draft_ops = 2 * (P / L + D * V) + a_dec / L * T
        steps.append(verify + launch + k * (max(draft_ops / F, draft_read / BW) + launch / L))
    want = sum(steps) / (2 * n)
    assert math.isclose(float(ds.tpot_mean_s), want, rel_tol=1e-9)
    # the back of the envelope: about (weights + a 1/L share and the head k times) over the bandwidth, over a
    envelope = (P * bw * (1 + k / L) + k * D * V * bw) / BW / a
    assert 0.9 < float(ds.tpot_mean_s) / envelope < 1.4


def test_the_draft_model_terms_by_hand():
    """Llama-3.1-8B as a draft: 32 layers, its parameters, 4·L·H·d_h attention FLOPs and 2·L·H_kv·d_h·b_kv KV bytes
    per context token."""
    target = catalog.resolve_model("Llama-3.1-70B")[1]
    d = catalog.resolve_model("Llama-3.1-8B")[1]
    got = draft_model_terms("Llama-3.1-8B", target, "serving.speculative.draft_model")
    assert got["draft_layers"] == 32
    assert got["draft_params"] == d["n_params"]
    assert got["draft_weight_bytes"] == d["n_params"] * d["bytes_per_weight"]
    assert got["draft_attention_flops"] == 4 * 32 * 32 * 128
    assert got["draft_kv_bytes"] == 32 * 2 * 8 * 128 * d["kv_dtype_bytes"]


def test_the_draft_weights_leave_less_kv():
    """The pool is less by the draft's own weights: one layer of the target (EAGLE), or the draft model."""
    ds0 = simulate.parse(_spec())
    eagle = simulate.parse(_spec(speculative=EAGLE))
    arch = catalog.resolve_model(MODEL)[1]
    from slimjax.model.calculator import kv_capacity

    def pool(sim):
        return float(kv_capacity(sim.model, sim.gpu, sim.serving, 1.0, 1.0)["pool"][0, 0, 0, 0])

    layer = arch["n_params"] * arch["bytes_per_weight"] / arch["n_layers"]
    assert math.isclose(pool(ds0) - pool(eagle), layer, rel_tol=1e-12)


@pytest.mark.parametrize(
    "serving, field, words",
    [
        (
            dict(speculative=dict(method="eagle", tokens=2, acceptance_length=3.5)),
            "serving.speculative.acceptance_length",
            "1 ≤ acceptance_length ≤ 1 + k",
        ),
        (dict(speculative=dict(method="mtp", tokens=0)), "serving.speculative.tokens", "tokens ≥ 1"),
        (dict(speculative_tokens=2), "serving.speculative_method", "give a method"),
        (dict(speculative=dict(method="draft", tokens=2)), "serving.speculative.draft_model", "needs draft_model"),
        (
            dict(speculative=dict(method="eagle", tokens=2, draft_model="Llama-3.1-8B")),
            "serving.speculative.method",
            "give method draft",
        ),
        (
            dict(speculative=dict(method="draft", tokens=2, draft_model="Qwen3-8B")),
            "serving.speculative.draft_model",
            "vocabulary",
        ),
        (
            dict(speculative=dict(method="medusa", tokens=2)),
            "serving.speculative.method",
            "must be one of none, mtp, eagle, draft",
        ),
        (
            dict(speculative=dict(method="mtp", tokens=2, acceptance=1.5)),
            "serving.speculative.acceptance",
            "unknown key",
        ),
        (dict(speculative=dict(method="mtp", tokens=1.5)), "serving.speculative.tokens", "non-negative integer"),
        (dict(speculative=EAGLE, pp=[1, 2]), "pp", "pipeline stages is not modelled"),
        (dict(speculative_method="draft", speculative_tokens=2), "serving.speculative_method", "needs its draft"),
        (
            dict(speculative_method="eagle", speculative_tokens=2, draft_model="Llama-3.1-8B"),
            "serving.draft_model",
            "drafts for",
        ),
    ],
)
def test_bad_speculative_settings_name_the_field(serving, field, words):
    serving = dict(serving)
    study = {"pp": serving.pop("pp")} if "pp" in serving else {}
    with pytest.raises(SlimjaxError) as e:
        simulate.parse({**_spec(**serving), **study})
    text = str(e.value)
    assert text.startswith(field) and words in text and "\n" not in text


def _sweep(serving, models=(MODEL,), batch=(1, 8)):
    base = dict(models=list(models), gpus=[GPU], batch=list(batch), input_len=[1000], output_len=[81])
    return slimjax.sweep({**base, "precision": "float64", "serving": serving})


def test_the_closed_form_equals_a_lone_simulated_request():
    """§4's ITL at B = 1 with an integer a takes the simulation's own contexts: equal to its TPOT."""
    block = dict(method="eagle", tokens=3, acceptance_length=2.0)
    swept = _sweep({"launch_overhead_s": 1e-3, "speculative": block}).itl_s.sel(batch=1).squeeze()
    stream = {"requests": {"arrival_s": [0.0], "input_len": [1000], "output_len": [81]}}
    sim = simulate.run(simulate.parse(_spec(stream=stream, launch_overhead_s=1e-3, speculative=block))).squeeze()
    assert math.isclose(float(swept), float(sim.tpot_mean_s), rel_tol=1e-12)


def test_a_sweep_that_speculates_somewhere_leaves_the_rest_bit_for_bit():
    """A model that does not speculate in a sweep where another does: every figure as in a sweep without it."""
    models = (MODEL, "Qwen3-8B")
    plain = _sweep({}, models)
    mixed = _sweep({"Qwen3-8B": {"speculative": dict(method="mtp", tokens=2, acceptance_length=2.4)}}, models)
    for name in ("itl_s", "ttft_s", "service_s", "token_throughput", "kv_pool_bytes", "max_seqs"):
        np.testing.assert_array_equal(mixed[name].sel(model=MODEL).values, plain[name].sel(model=MODEL).values)
    on, off = (float(d.itl_s.sel(model="Qwen3-8B", batch=8).squeeze()) for d in (mixed, plain))
    assert on < off  # the speculating one decodes faster per token


def test_speculation_is_a_candidate_setting_of_simulate_and_procure():
    """``settings`` with ``speculative`` blocks: each setting equals the study whose serving block speculates so,
    bit for bit; procurement sizes each (a speculating replica decodes faster, so no more replicas are needed for an
    ITL-bound SLO) and says what it assumed; a bad block in a setting is named there."""
    from slimjax.studies.procure import spec as procurefile

    mtp = dict(method="eagle", tokens=3, acceptance_length=2.4)
    settings = [{"speculative": None}, {"speculative": mtp}]
    sim = simulate.run(simulate.parse({**_spec(batch=8), "settings": settings}))
    assert list(sim.setting.values) == ["speculative off", "speculative eagle 3 2.4"]
    for label, block in (("speculative off", {}), ("speculative eagle 3 2.4", {"speculative": mtp})):
        alone = simulate.run(simulate.parse(_spec(batch=8, **block)))
        np.testing.assert_array_equal(sim.sel(setting=label).e2e_s.values, alone.e2e_s.values)
    base = dict(
        workloads=[dict(name="chat", input_len=800, output_len=300)],
        rates=[4.0],
        models=[MODEL],
        gpus=[GPU],
        tp=[1],
        batch=[16],
        slo={"ttft_s": 2.0, "itl_s": 0.012},
        sizing={"requests": 80, "seed": 3, "max_replicas": 8},
    )
    ds = slimjax.procure({**base, "settings": settings})
    off, on = (int(ds.best_replicas.sel(setting=s).squeeze()) for s in ds.setting.values)
    assert on <= off
    assert "speculative decoding (eagle k 3 a 2.4" in slimjax.procure_tables(ds)
    with pytest.raises(SlimjaxError) as e:
        procurefile.parse({**base, "settings": [{"speculative": dict(method="eagle", tokens=2, acceptance_length=4)}]})
    assert e.value.field == "settings[0].speculative.acceptance_length"


def test_the_report_draws_tpot_against_the_acceptance_length():
    """A simulation whose settings differ in a: the store says each candidate's a (1 without speculation) and the
    report's figure plots TPOT against it, falling as a grows."""
    from slimjax.studies.simulate import present

    settings = [{"speculative": None}] + [
        {"speculative": dict(method="eagle", tokens=3, acceptance_length=a)} for a in (1.5, 2.5, 3.5)
    ]
    ds = simulate.run(simulate.parse({**_spec(batch=8), "settings": settings}))
    np.testing.assert_array_equal(ds.acceptance_length.squeeze().values, [1.0, 1.5, 2.5, 3.5])
    tpot = ds.tpot_mean_s.squeeze().values
    assert np.all(np.diff(tpot[1:]) < 0)  # more accepted a step, less time a token
    keys = [f.key for f in present.simulation_figures(ds)]
    assert "speculative" in keys
    assert "speculative" not in [f.key for f in present.simulation_figures(simulate.run(simulate.parse(_spec())))]


def test_the_capacity_card_says_it_speculates():
    """The card names speculation; ``capacity --draft-model`` beside the flat keys equals the speculative block."""
    from slimjax.report.cards import capacity_cards

    block = dict(method="eagle", tokens=3, acceptance_length=2.5)
    on = slimjax.capacity("Llama-3.1-70B", GPU, 1024, 256, 32, serving={"n_gpu": 4, "speculative": block})
    off = slimjax.capacity("Llama-3.1-70B", GPU, 1024, 256, 32, serving={"n_gpu": 4})
    assert on["itl_s"] < off["itl_s"] and on["kv_pool_bytes"] < off["kv_pool_bytes"]
    assert ("Speculative decoding", "eagle, 3 draft tokens, 2.5 accepted a step") in capacity_cards(on)
    assert "speculative" not in off
    flat = dict(n_gpu=4, speculative_method="draft", speculative_tokens=4, acceptance_length=3.0)
    by_flag = slimjax.capacity("Llama-3.1-70B", GPU, 1024, 256, 32, serving={**flat, "draft_model": "Llama-3.1-8B"})
    block = dict(method="draft", tokens=4, acceptance_length=3.0, draft_model="Llama-3.1-8B")
    by_block = slimjax.capacity("Llama-3.1-70B", GPU, 1024, 256, 32, serving={"n_gpu": 4, "speculative": block})
    assert by_flag["itl_s"] == by_block["itl_s"] and by_flag["kv_pool_bytes"] == by_block["kv_pool_bytes"]


def test_mtp_on_an_attention_data_parallel_expert_parallel_group_equals_the_event_loop():
    """DeepSeek-V3's MTP (k = 1) on an H200 node as DP 8 × EP 8: each rank's verify pass and its MTP layer's pass are
    the layout's (the experts at the busiest rank's load, the all-to-all), per request to 1e-9; the MTP layer's
    weights are held once per rank."""
    rng = np.random.default_rng(5)
    n = 30
    requests = {
        "arrival_s": np.sort(rng.uniform(0, 1.0, n)).round(3).tolist(),
        "input_len": rng.integers(50, 2500, n).tolist(),
        "output_len": rng.integers(2, 80, n).tolist(),
    }
    block = dict(method="mtp", tokens=1, acceptance_length=1.8)
    spec = dict(
        models=["DeepSeek-V3"],
        gpus=["H200"],
        tp=[1],
        batch=[32],
        precision="float64",
        serving=dict(dp=8, ep=8, launch_overhead_s=2e-4, speculative=block),
        stream={"requests": requests},
    )
    sim = simulate.parse(spec)
    ds = simulate.run(sim).squeeze()
    arch = catalog.resolve_model("DeepSeek-V3")[1]
    t = sref.study_terms(sim, arch)
    assert t["spec"]["share"] == 1 / arch["n_layers"]
    want = sref.simulate_pipeline(
        t, requests["arrival_s"], requests["input_len"], requests["output_len"], 32, 1, engines=8
    )
    np.testing.assert_allclose(ds.ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(ds.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)


def _closed_form_loop(t, B, I, O, spec):
    """§4's speculative ITL as a loop over the verify steps (docs/speculative.md), from the event loop's terms: step m
    at T_m = I + 1 + (m − 1)·a, a pass of B·(1 + k) tokens and k draft passes over B, over the O − 1 tokens."""
    k, a = int(spec["k"]), spec["a"]
    steps = math.ceil((O - 1) / a)
    n = B * (1 + k)
    P, W_n, comm_n = sref.pass_terms(n, t)
    P_b, W_b, comm_b = sref.pass_terms(B, t)
    fixed = t["t_l"] + t["t_layers"]
    total = 0.0
    for m in range(1, steps + 1):
        T = I + 1 + (m - 1) * a
        ops = 2 * P * n + t["a_dec"] * B * ((1 + k) * T + k * (k + 1) / 2)
        verify = max(ops / t["F"], (W_n + B * sref.K(T, t)) / t["BW"]) + fixed + comm_n
        s = spec["share"]
        d_ops = 2 * (s * P_b + spec["P0"]) * B + (s * t["a_dec"] + spec["alpha0"]) * B * T
        d_read = s * W_b + spec["W0"] + spec["kappa0"] * B * T + s * B * sref.K(T, t)
        draft = max(d_ops / t["F"], d_read / t["BW"]) + spec["lam"] * (fixed + comm_b)
        total += verify + k * draft
    return total / (O - 1)


@pytest.mark.parametrize(
    "model, tp, block",
    [
        ("gpt-oss-20b", 2, dict(method="eagle", tokens=3, acceptance_length=2.5)),  # MoE, a 128-token window
        ("gemma-2-9b", 1, dict(method="mtp", tokens=2, acceptance_length=2.2)),  # every other layer a 4,096 window
        ("Llama-3.1-70B", 4, dict(method="draft", tokens=4, acceptance_length=3.3, draft_model="Llama-3.1-8B")),
    ],
)
def test_the_closed_form_equals_a_loop_over_its_verify_steps(model, tp, block):
    """Grid against loop: §4's speculative ITL summed in closed form on both sides of the window equals the sum over
    its verify steps, at every (B, I, O) of a small grid (float64)."""
    grid = dict(batch=[1, 8, 64], input_len=[100, 3000, 9000], output_len=[17, 300])
    serving = {"n_gpu": tp, "launch_overhead_s": 1e-3, "layer_overhead_s": 2e-5, "speculative": block}
    ds = slimjax.sweep(dict(models=[model], gpus=["H200"], precision="float64", serving=serving, **grid))
    study = {k: v for k, v in serving.items() if k != "n_gpu"}
    sim = simulate.parse(dict(_spec(model), gpus=["H200"], tp=[tp], serving=study))
    t = sref.study_terms(sim, catalog.resolve_model(model)[1])
    compared = 0
    for B in grid["batch"]:
        for I in grid["input_len"]:
            for O in grid["output_len"]:
                got = float(ds.itl_s.sel(batch=B, input_len=I, output_len=O).squeeze())
                if not np.isfinite(got):  # does not fit (masked)
                    continue
                assert got == pytest.approx(_closed_form_loop(t, B, I, O, t["spec"]), rel=1e-9), (B, I, O)
                compared += 1
    assert compared >= 12


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(1, 4),
    share=st.floats(0.0, 1.0),
    batch=st.integers(1, 128),
    prompt=st.integers(1, 20_000),
    output=st.integers(2, 3_000),
    draft_gb=st.floats(0.0, 20.0),
)
def test_the_closed_form_is_bounded_and_monotone_in_the_draft(tokens, share, batch, prompt, output, draft_gb):
    """Properties of §4's speculative ITL (gpt-oss-20b, EAGLE on two H200s): every verify step reads the weights, so
    ITL ≥ n_v·M_W(B·(1 + k))/BW/(O − 1) (the back of the envelope); a heavier draft is never faster; and a = 1 with a
    free draft is never faster than no speculation."""
    from slimjax.config import float64_scope
    from slimjax.inputs.serving import default_serving
    from slimjax.model import calculator, roofline, speculative
    from slimjax.model.specs import GPUSpec, ModelSpec, stack

    a = 1.0 + share * tokens
    base = dict(n_gpu=2.0, launch_overhead_s=1e-3, speculative_method="eagle", speculative_tokens=float(tokens))
    with float64_scope():
        m = stack(ModelSpec, [catalog.resolve_model("gpt-oss-20b")[1]])
        g = stack(GPUSpec, [catalog.resolve_gpu("H200")[1]])
        roof, _, a_dec = calculator.roofline_terms(m, g, default_serving(m, **base))

        def itl(accepted, **override):
            spec = speculative.speculation(m, default_serving(m, **{**base, **override, "acceptance_length": accepted}))
            return float(speculative.decode_itl(spec, batch, prompt, output, roof, a_dec)[0])

        steps = math.ceil((output - 1) / a)
        reads = float(roofline.pass_weights_bytes(roof, batch * (1.0 + tokens))[0]) / float(roof.bandwidth[0])
        assert itl(a) >= steps * reads / (output - 1) * (1 - 1e-12)
        heavier = dict(draft_params=draft_gb * 5e8, draft_weight_bytes=draft_gb * 1e9)
        assert itl(a, **heavier) >= itl(a) * (1 - 1e-12)
        free = itl(1.0, speculative_method="draft")  # no layer share, no head: P_0 = W_0 = 0
        assert free >= float(roofline.decode_itl(batch, prompt, output, roof, a_dec)[0]) * (1 - 1e-12)
