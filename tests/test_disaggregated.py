"""MODEL.md §10, disaggregated prefill and decode: the simulation against the Python event loop of §10 per request
(float64, 1e-9), the lone-request limit against §4's closed forms, and the errors."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
import serving_reference as sref

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog
from slimjax.model import calculator
from slimjax.model.specs import GPUSpec, ModelSpec, stack
from slimjax.studies import simulate

RNG = np.random.default_rng(5)
N = 40
ARRIVALS = np.sort(RNG.uniform(0, 1.5, N)).round(4)
INPUTS = RNG.integers(1, 3000, N)
OUTPUTS = RNG.integers(1, 60, N)


def _spec(model, deployments, stream=None, **serving):
    requests = {"arrival_s": ARRIVALS.tolist(), "input_len": INPUTS.tolist(), "output_len": OUTPUTS.tolist()}
    return dict(
        models=[model],
        gpus=["H100-SXM"],
        batch=[8],
        precision="float64",
        serving=serving,
        stream=stream or {"requests": requests},
        disaggregated=deployments,
    )


def _pool_terms(pool, arch):
    sv = {k: float(np.asarray(v)[0]) for k, v in pool.serving.fields().items()}
    if pool.dp > 1:  # one attention rank of the pool's layout (docs/layouts.md; one stage)
        return sref.replica_terms(arch, pool.gpu_row, sv)
    return sref.stage_terms(arch, pool.gpu_row, sv, pool.pp)


def _xfer(dep, arch, sv_kv_bytes):
    """t_net(L·e_kv·I / min(n_p, n_d)) over the slower NIC, written from §10."""
    p, d = dep.prefill, dep.decode
    e_kv = sref.kv_bytes_per_layer_token({**arch, "kv_dtype_bytes": sv_kv_bytes})
    n = min(p.tp * p.pp, d.tp * d.pp)  # one attention rank's GPUs of each pool
    if dep.transfer == "nvlink":
        g = p.gpu_row
        return lambda i: (
            g["allreduce_latency_s"]
            + arch["n_layers"] * e_kv * INPUTS[i] / n / (g["link_efficiency"] * g["link_bytes_per_s"])
        )
    bw = min(p.gpu_row["network_bytes_per_s"], d.gpu_row["network_bytes_per_s"])
    tau = max(p.gpu_row["network_latency_s"], d.gpu_row["network_latency_s"])
    return lambda i: tau + arch["n_layers"] * e_kv * INPUTS[i] / n / bw


DEPLOYMENTS = {
    "kv_bound_prefill_two_replicas": (
        "Llama-3.1-70B",
        dict(
            prefill={"gpu": "A100-SXM-80GB", "tp": 2, "replicas": 2},
            decode={"gpu": "A100-SXM-80GB", "tp": 4, "batch": 16},
        ),
        dict(gpu_memory_utilization=0.86),  # a prefill group's pool holds a few prompts: transfers gate admission
    ),
    "mixed_gpus_chunked": (
        "Llama-3.1-8B",
        dict(
            prefill={"gpu": "H100-SXM", "tp": 1},
            decode={"gpu": "H200", "tp": 1, "batch": 6, "replicas": 2},
        ),
        dict(chunk_size=512, step_tokens=1024),
    ),
    "pipelined_decode_nvlink": (
        "Llama-3.1-70B",
        dict(
            prefill={"gpu": "H100-SXM", "tp": 4},
            decode={"gpu": "H100-SXM", "tp": 2, "pp": 2, "batch": 12},
            transfer="nvlink",
        ),
        dict(launch_overhead_s=1e-4, step_overhead_s=0.002),
    ),
    "gpt_oss_pools_with_their_own_layouts": (
        "gpt-oss-120b",
        dict(
            prefill={"gpu": "H200", "tp": 1, "dp": 2, "ep": 2, "replicas": 2},
            decode={"gpu": "H200", "tp": 1, "dp": 4, "ep": 4, "batch": 16},
        ),
        dict(step_overhead_s=0.001),
    ),
    "eagle_in_both_pools": (  # docs/speculative.md: the decode pool's verify steps, the draft's pass over prompts
        "Llama-3.1-8B",
        dict(
            prefill={"gpu": "H100-SXM", "tp": 1},
            decode={"gpu": "H200", "tp": 1, "batch": 8, "replicas": 2},
        ),
        dict(speculative={"method": "eagle", "tokens": 3, "acceptance_length": 2.2}, chunk_size=1024),
    ),
}


@pytest.mark.parametrize("case", list(DEPLOYMENTS))
def test_disaggregated_equals_the_event_loop(case):
    model, dep, serving = DEPLOYMENTS[case]
    sim = simulate.parse(_spec(model, [dep], **serving))
    ds = simulate.run(sim)
    d = sim.deployments[0]
    arch = catalog.resolve_model(model)[1]
    tp_, td = _pool_terms(d.prefill, arch), _pool_terms(d.decode, arch)
    xfer = _xfer(d, arch, float(np.asarray(d.prefill.serving.kv_dtype_bytes)[0]))
    want = sref.simulate_disaggregated(
        tp_,
        td,
        ARRIVALS.tolist(),
        INPUTS.tolist(),
        OUTPUTS.tolist(),
        d.prefill.replicas,
        d.decode.replicas,
        int(d.decode.batch),
        xfer,
        engines=(d.prefill.engines, d.decode.engines),
    )
    got = ds.isel(model=0, deployment=0)
    np.testing.assert_allclose(got.disagg_ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.disagg_e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    assert bool(got.disagg_fits)
    if case == "kv_bound_prefill_two_replicas":  # the prefill pool really was gated by KV held for transfers
        fp = [sref.footprint(tp_["arch"], int(i), 16) for i in INPUTS]
        assert tp_["pool"] < sum(fp[0::2])
    price = d.prefill.replicas * d.prefill.tp * d.prefill.pp * d.prefill.dp * d.prefill.gpu_row["price_per_hour"]
    price += d.decode.replicas * d.decode.tp * d.decode.pp * d.decode.dp * d.decode.gpu_row["price_per_hour"]
    np.testing.assert_allclose(float(got.disagg_cost_per_hour), price, rtol=1e-12)


def test_lone_request_with_free_transfer_is_the_closed_forms():
    """Zero-cost transfer, one request: TTFT = the prefill pool's t_pre, TPOT = the decode pool's ITL at batch 1."""
    free = {
        "name": "FreeNet",
        "tflops": 989,
        "bandwidth_tbs": 3.35,
        "memory_gib": 80,
        "interconnect_gbs": 450,
        "network_gbs": 1e12,
        "network_latency_us": 0,
    }
    slow = dict(free, name="SlowNet", tflops=312, bandwidth_tbs=2.0)
    stream = {"requests": {"arrival_s": [0.5], "input_len": [1800], "output_len": [50]}}
    dep = dict(prefill={"gpu": free, "tp": 2}, decode={"gpu": slow, "tp": 1, "batch": 4})
    spec = _spec("Llama-3.1-8B", [dep], stream=stream, chunk_size=700)
    sim = simulate.parse(spec)
    got = simulate.run(sim).isel(model=0, deployment=0)
    arch = stack(ModelSpec, [catalog.resolve_model("Llama-3.1-8B")[1]])
    I, O = jnp.asarray(1800.0), jnp.asarray(50.0)
    with slimjax.config.float64_scope():
        d = sim.deployments[0]
        pre = calculator.capacity_cell_terms(arch, stack(GPUSpec, [d.prefill.gpu_row]), d.prefill.serving, I, O)
        dec_cell = calculator.capacity_cell_terms(arch, stack(GPUSpec, [d.decode.gpu_row]), d.decode.serving, I, O)
        itl = calculator.service_terms(dec_cell, None, jnp.asarray(1.0), I, O)["itl_s"]
    np.testing.assert_allclose(float(got.disagg_ttft_s[0]), float(pre["prefill_s"][0]), rtol=1e-9)
    np.testing.assert_allclose(float(got.disagg_tpot_s[0]), float(itl[0]), rtol=1e-9)
    assert float(got.disagg_transfer_s[0]) < 1e-9 * float(itl[0]) * 1e3


def test_single_token_requests_are_done_at_the_prefill_pool():
    stream = {"requests": {"arrival_s": [0.0, 0.0, 0.1], "input_len": [500, 900, 40], "output_len": [1, 8, 1]}}
    dep = dict(prefill={"gpu": "H100-SXM"}, decode={"gpu": "H100-SXM", "batch": 2})
    got = simulate.run(simulate.parse(_spec("Llama-3.1-8B", [dep], stream=stream))).isel(model=0, deployment=0)
    e2e, ttft = got.disagg_e2e_s.values, got.disagg_ttft_s.values
    assert e2e[0] == ttft[0] and e2e[2] == ttft[2] and e2e[1] > ttft[1]
    assert math.isnan(float(got.disagg_tpot_s[0])) and float(got.disagg_transfer_s[0]) == 0


def test_disaggregated_errors_name_the_field():
    base = dict(prefill={"gpu": "H100-SXM"}, decode={"gpu": "H100-SXM", "batch": 8})
    with pytest.raises(SlimjaxError, match=r"disaggregated\[0\].decode.batch"):
        simulate.parse(_spec("Llama-3.1-8B", [dict(base, decode={"gpu": "H100-SXM"})]))
    with pytest.raises(SlimjaxError, match=r"disaggregated\[0\].transfer"):
        simulate.parse(_spec("Llama-3.1-8B", [dict(base, transfer="carrier pigeon")]))
    cross = dict(prefill={"gpu": "H100-SXM", "tp": 4}, decode={"gpu": "H200", "batch": 8}, transfer="nvlink")
    with pytest.raises(SlimjaxError, match="nvlink needs both pools in one node"):
        simulate.parse(_spec("Llama-3.1-8B", [cross]))
    lab = {"name": "LabGPU", "tflops": 300, "bandwidth_tbs": 2, "memory_gib": 80}
    with pytest.raises(SlimjaxError, match="LabGPU has no network_gbs.*configs/gpus.yaml"):
        simulate.parse(_spec("Llama-3.1-8B", [dict(base, decode={"gpu": lab, "batch": 8})]))


STUDY = dict(
    workloads=[dict(name="chat", input_len=1200, output_len=60)],
    rates=[40.0],
    models=["Llama-3.1-8B"],
    gpus=["H100-SXM"],
    tp=[1],
    batch=[32],
    slo=dict(ttft_s=0.08, itl_s=0.03),
    sizing=dict(method="simulation", requests=80, max_replicas=16),
)
SECTION = dict(
    prefill=[{"gpu": "H100-SXM"}],
    decode=[{"gpu": "H100-SXM", "batch": 8}, {"gpu": "L40S", "batch": 16}],
)


@pytest.fixture(scope="module")
def studies():
    return slimjax.procure(STUDY), slimjax.procure(dict(STUDY, disaggregated=SECTION))


@pytest.mark.heavy
def test_study_sizing_equals_the_brute_force(studies):
    """R_p the smallest meeting TTFT, then R_d the smallest meeting ITL and E2E at it: equal to trying every
    R_p, R_d ≤ 16."""
    from slimjax.studies import disaggregated as dis
    from slimjax.studies.candidates import workload_stream

    _, ds = studies
    study = simulatefile_free_study()
    stream = workload_stream(study.workloads[0], float(study.total_rate[0, 0]), study.sizing)
    q, slo = study.slo["quantile"], study.slo
    grew = False
    for d, dep in enumerate(study.deployments):
        inputs = dis.pool_inputs(study.models, study.model, dep, stream)
        firsts = {r: dis.prefill_phase(inputs, stream, np.array([r]))["first"] for r in range(1, 17)}
        ok_p = [r for r in firsts if np.quantile(firsts[r][0] - stream["arrival_s"], q) <= slo["ttft_s"]]
        r_p = min(ok_p)
        first = firsts[r_p]
        ok_d = []
        for r in range(1, 17):
            end = dis.decode_phase(inputs, stream, first, dep.decode.batch, np.array([r]))["end"]
            _, e2e, tpot = dis.request_times(first[0], end[0], stream)
            if np.quantile(tpot, q) <= slo["itl_s"] and np.mean(e2e) <= slo["e2e_s"]:
                ok_d.append(r)
        got = ds.isel(workload=0, rate=0, model=0, deployment=d)
        assert int(got.disagg_prefill_replicas) == r_p and int(got.disagg_decode_replicas) == min(ok_d)
        grew |= r_p > 1 and min(ok_d) > 1
        price = r_p * dep.prefill.gpu_row["price_per_hour"] + min(ok_d) * dep.decode.gpu_row["price_per_hour"]
        np.testing.assert_allclose(float(got.disagg_cost_per_hour), price, rtol=1e-12)
    assert grew  # the slice makes both searches leave one replica


def simulatefile_free_study():
    from slimjax.studies.procure import spec as procurefile

    return procurefile.parse(dict(STUDY, disaggregated=SECTION))


def test_a_disaggregated_section_leaves_the_aggregated_choice(studies):
    plain, both = studies
    for name in ("best_gpu", "best_tp", "best_batch", "best_replicas", "best_cost_per_hour", "replicas"):
        assert plain[name].equals(both[name]), name
    best = both.isel(workload=0, rate=0, model=0)
    np.testing.assert_allclose(
        float(best.disagg_saving_per_hour),
        float(best.best_cost_per_hour) - float(np.nanmin(best.disagg_cost_per_hour)),
    )
    text = slimjax.procure_tables(both)
    assert "disaggregated prefill/decode" in text and "vs the best aggregated" in text


def test_reports_show_both_fleets_and_both_distributions(studies, tmp_path):
    from slimjax.studies.procure import figures as procure_figures

    _, both = studies
    figs = procure_figures.disaggregated_figures(both)
    assert [f.key for f in figs] == ["disaggregated_chat"]
    table = procure_figures.disaggregated_table(both)
    assert len(table) == 1 and table["pools"][0] in both.deployment.values
    dep = dict(prefill={"gpu": "H100-SXM"}, decode={"gpu": "H200", "batch": 8})
    sim = simulate.run(simulate.parse(_spec("Llama-3.1-8B", [dep])))
    (fig,) = simulate.present.simulation_figures(sim)
    labels = [line.get_label() for line in fig.figure.axes[0].get_lines()]
    assert any(label.startswith("prefill 1×H100-SXM") for label in labels)


def test_several_models_each_equal_the_model_alone():
    """A simulation file with two models and a deployment: each model's per-request times equal its own run
    (each model's prefill and decode jobs read that model's footprints; main indexed past a one-row array)."""
    dep = [{"prefill": {"gpu": "H100-SXM", "tp": 2}, "decode": {"gpu": "H100-SXM", "tp": 2, "batch": 8}}]
    both = dict(_spec("Llama-3.1-8B", dep), models=["Llama-3.1-8B", "Qwen3-32B"])
    together = slimjax.simulate(both)
    for model in both["models"]:
        alone = slimjax.simulate(_spec(model, dep))
        for name in ("disagg_ttft_s", "disagg_e2e_s", "disagg_transfer_s"):
            np.testing.assert_array_equal(together[name].sel(model=model).values, alone[name].sel(model=model).values)
    assert np.isfinite(together.disagg_e2e_s.values).all()


# closed loops on two pools (docs/layouts.md, disaggregated rows): (model, deployment, serving, clients C,
# requests per client K, prefill batch per replica)
CLOSED = {
    "llama8b_prefill_batch_1_two_by_two": (
        "Llama-3.1-8B",
        dict(
            prefill={"gpu": "H100-SXM", "tp": 1, "replicas": 2},
            decode={"gpu": "H100-SXM", "tp": 1, "batch": 3, "replicas": 2},
        ),
        dict(chunk_size=512, step_tokens=1024),
        6,
        3,
        1,
    ),
    "gpt_oss_dp2_ep2_pools": (
        "gpt-oss-120b",
        dict(prefill={"gpu": "H200", "tp": 1}, decode={"gpu": "H200", "tp": 1, "batch": 8}),
        dict(dp=2, ep=2, step_overhead_s=1e-3),
        5,
        3,
        2,
    ),
}


@pytest.mark.parametrize("case", list(CLOSED))
def test_closed_loop_equals_the_event_loop(case):
    """§10's pools under C closed-loop clients (the disaggregated rows' forward model) against the plain event loop
    iterated to its own fixed point (tests/serving_reference.py) per request to 1e-9 in float64; every request after
    a client's first arrives exactly when that client's previous one ended."""
    from slimjax.studies import disaggregated as dis

    model, dep, serving, C, K, batch_p = CLOSED[case]
    sim = simulate.parse(_spec(model, [dep], **serving))
    d = sim.deployments[0]
    rng = np.random.default_rng(11)
    n = C * K
    stream = dict(input_len=rng.integers(200, 2500, n).astype(float), output_len=rng.integers(1, 40, n).astype(float))
    inputs = dis.pool_inputs([model], sim.model, d, dict(stream, arrival_s=np.zeros(n)))
    dp = int(np.asarray(d.prefill.serving.dp_ranks)[0])
    got = dis.closed_loop(
        inputs["terms_p"],
        np.array([float(batch_p)]),
        [d.prefill.replicas],
        inputs["terms_d"],
        np.array([d.decode.batch]),
        [d.decode.replicas],
        [stream],
        [inputs["fp_p"][0]],
        [inputs["fp_d"][0]],
        [inputs["xfer"][0]],
        [C],
    )[0]
    arch = catalog.resolve_model(model)[1]

    def rank_terms(pool):
        sv = {k: float(np.asarray(v)[0]) for k, v in pool.serving.fields().items()}
        return sref.replica_terms(arch, pool.gpu_row, sv)

    xfer = inputs["xfer"][0]
    want = sref.closed_loop_disaggregated(
        rank_terms(d.prefill),
        rank_terms(d.decode),
        stream["input_len"].astype(int).tolist(),
        stream["output_len"].astype(int).tolist(),
        C,
        d.prefill.replicas,
        d.decode.replicas,
        batch_p,
        int(d.decode.batch),
        lambda q: float(xfer[q]),
        engines=(dp, dp),
    )
    assert got["settled"]
    np.testing.assert_allclose(got["arrival_s"], want["arrival"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got["first_token_s"], want["first"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got["end_s"], want["end"], rtol=1e-9, atol=0)
    assert np.array_equal(got["arrival_s"][C:], got["end_s"][:-C])  # the loop is closed
    assert (got["arrival_s"][:C] == 0).all()


def test_one_client_sends_each_request_when_the_last_ends():
    """One client: its requests never meet, so each one's TTFT is the prefill pool's time for its prompt alone and
    its end its first token + transfer + its decode alone, whatever came before (the open pools on one request)."""
    from slimjax.studies import disaggregated as dis

    model, dep, serving, _, _, _ = CLOSED["llama8b_prefill_batch_1_two_by_two"]
    sim = simulate.parse(_spec(model, [dep], **serving))
    d = sim.deployments[0]
    stream = dict(input_len=np.array([900.0, 1500.0, 300.0]), output_len=np.array([20.0, 1.0, 7.0]))
    inputs = dis.pool_inputs([model], sim.model, d, dict(stream, arrival_s=np.zeros(3)))
    got = dis.closed_loop(
        inputs["terms_p"],
        np.array([1.0]),
        [2],
        inputs["terms_d"],
        np.array([3.0]),
        [2],
        [stream],
        [inputs["fp_p"][0]],
        [inputs["fp_d"][0]],
        [inputs["xfer"][0]],
        [1],
    )[0]
    assert got["settled"] and got["passes"] == 3  # each pass sends the next request, the third moves none
    for q in range(3):
        alone = {k: v[q : q + 1] for k, v in stream.items()}
        one = dis.pool_inputs([model], sim.model, d, dict(alone, arrival_s=np.zeros(1)))
        pre = dis.prefill_phase(one, dict(alone, arrival_s=np.zeros(1)), [1])
        dec = dis.decode_phase(one, dict(alone, arrival_s=np.zeros(1)), pre["first"], 3.0, [1])
        start = got["arrival_s"][q]
        assert got["first_token_s"][q] - start == pytest.approx(pre["first"][0, 0], rel=1e-12)
        assert got["end_s"][q] - start == pytest.approx(dec["end"][0, 0], rel=1e-12)
