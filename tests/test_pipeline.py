"""MODEL.md §10, pipeline stages: the jitted simulation against the Python event loop of §10 (per request, float64,
1e-9), n_pp = 1 against §9, memory per stage by hand, the closed forms against the reference's steps, `auto`, and
the errors that name what to add."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
import serving_reference as sref

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog
from slimjax.inputs.serving import default_serving
from slimjax.model import calculator, pipeline
from slimjax.model.specs import GPUSpec, ModelSpec, stack
from slimjax.studies import simulate

RNG = np.random.default_rng(11)
N = 30
ARRIVALS = np.sort(RNG.uniform(0, 2, N)).round(3)
INPUTS = RNG.integers(1, 2500, N)
OUTPUTS = RNG.integers(1, 90, N)


def _spec(model, gpu, batch, *, tp=1, pp=1, replicas=1, **serving):
    requests = {"arrival_s": ARRIVALS.tolist(), "input_len": INPUTS.tolist(), "output_len": OUTPUTS.tolist()}
    stream = {"requests": requests}
    return dict(
        models=[model],
        gpus=[gpu],
        tp=[tp],
        pp=[pp],
        batch=[batch],
        replicas=[replicas],
        precision="float64",
        serving=serving,
        stream=stream,
    )


def _terms(sim, pp):
    arch = catalog.resolve_model(sim.models[0])[1]
    gpu = sref.study_gpu(sim)
    sv = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in sim.serving.fields().items()}
    return sref.stage_terms(arch, gpu, sv, pp), arch


PIPELINES = {
    "dense_pp2": dict(model="Llama-3.1-70B", gpu="H100-SXM", batch=8, tp=2, pp=2),
    "dense_pp4_two_replicas": dict(model="Llama-3.1-70B", gpu="H100-SXM", batch=12, tp=1, pp=4, replicas=2),
    "moe_mla_uneven_pp2": dict(  # 61 layers: stages of 31, the largest binds; its layers' fixed costs f·(L·t_L + …)
        model="DeepSeek-V3",
        gpu="H100-SXM",
        batch=16,
        tp=8,
        pp=2,
        launch_overhead_s=2e-4,
        step_overhead_s=0.003,
        layer_overhead_s=3e-5,
        expert_layer_overhead_s=7e-5,
        engine_allreduce_latency_s=6e-6,
    ),
    "sliding_chunked_pp4": dict(model="gpt-oss-120b", gpu="H100-SXM", batch=16, tp=2, pp=4, chunk_size=256),
    "kv_bound_pp2": dict(  # each engine's 1/n_pp of the stage's pool holds few long requests
        model="Llama-3.1-70B", gpu="A100-SXM-80GB", batch=32, tp=1, pp=2, gpu_memory_utilization=0.84
    ),
}


@pytest.mark.parametrize("case", list(PIPELINES))
def test_pipeline_simulation_equals_the_event_loop(case):
    kw = dict(PIPELINES[case])
    sim = simulate.parse(_spec(kw.pop("model"), kw.pop("gpu"), kw.pop("batch"), **kw))
    ds = simulate.run(sim)
    pp, batch, replicas = int(sim.pp[0]), int(sim.batch[0]), int(sim.replicas[0])
    t, _ = _terms(sim, pp)
    want = sref.simulate_pipeline(t, ARRIVALS.tolist(), INPUTS.tolist(), OUTPUTS.tolist(), batch, replicas)
    got = ds.squeeze()
    np.testing.assert_allclose(got.ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    assert ds.attrs["engine_steps"] == want["steps"]
    span = np.nanmax(ARRIVALS + np.asarray(want["e2e"])) - ARRIVALS.min()
    np.testing.assert_allclose(float(got.utilization), sum(want["busy"]) / (replicas * pp * span), rtol=1e-9)
    if case == "kv_bound_pp2":  # admission blocked by an engine's share of the KV, not by its ⌊B/n_pp⌋ slots
        fp = [sref.footprint(t["arch"], int(i + o), 16) for i, o in zip(INPUTS, OUTPUTS, strict=True)]
        assert t["pool"] // max(fp) < batch // pp and float(got.queue_peak) > 0


def test_one_stage_is_section_9_exactly():
    """n_pp = 1: the same records, bit for bit, as candidates whose terms predate §10."""
    sim = simulate.parse(_spec("Llama-3.1-8B", "H100-SXM", 8, launch_overhead_s=1e-4, step_overhead_s=0.002))
    model, gpu, serving, batch, _ = simulate.broadcast_candidates(sim)
    terms, footprint, _ = simulate.candidate_inputs(model, gpu, serving, sim.stream, np.float64)
    stream = {
        "arrival_s": sim.stream.arrival_s,
        "input_len": sim.stream.input_len.astype(float),
        "output_len": sim.stream.output_len.astype(float),
    }
    from slimjax.engine import sim as engine

    with slimjax.config.float64_scope():
        a = engine.simulate_candidates(terms, batch, footprint, stream, replicas=2)
        plain = {k: v for k, v in terms.items() if k not in ("pipeline_stages", "engines")}
        b = engine.simulate_candidates(plain, batch, footprint, stream, replicas=2)
    for k in ("first_token_s", "end_s", "busy_s"):
        np.testing.assert_array_equal(a[k], b[k])
    # and the roofline terms: the pipeline transform is the identity at one stage
    arch = stack(ModelSpec, [catalog.resolve_model("Llama-3.1-8B")[1]])
    g = stack(GPUSpec, [catalog.resolve_gpu("H100-SXM")[1]])
    roof1, _, _ = calculator.roofline_terms(arch, g, default_serving(arch, n_gpu=2, launch_overhead_s=1e-4))
    same = pipeline.pipeline_roof(roof1, arch.n_layers, arch.hidden, 1.0, 50e9, 1e-5)
    for k in ("flops", "bandwidth", "launch_overhead_s", "comm_fixed_s", "comm_per_token_s"):
        assert getattr(same, k).tolist() == getattr(roof1, k).tolist()


def _specs(model, gpu, **serving):
    arch = stack(ModelSpec, [catalog.resolve_model(model)[1]])
    g = stack(GPUSpec, [catalog.resolve_gpu(gpu)[1]])
    return arch, g, default_serving(arch, **serving)


def test_deepseek_v3_memory_per_stage_by_hand():
    """DeepSeek-V3 (fp8, 61 layers) on H100: 1 × 8 does not hold the weights; 2 × 8 does, with stages of 31 layers."""
    raw = catalog.resolve_model("DeepSeek-V3")[1]
    mem = 80 * 2**30
    weights = raw["n_params"] * raw["bytes_per_weight"]
    assert 0.9 * 8 * mem - weights < 0  # one node: no pool at all
    arch, g, one_node = _specs("DeepSeek-V3", "H100-SXM", n_gpu=8)
    assert float(calculator.kv_capacity(arch, g, one_node, 1024.0, 1024.0)["max_seqs"][0]) == 0
    stage_pool = 0.9 * 8 * mem - 31 / 61 * weights
    e_kv = (512 + 64) * raw["kv_dtype_bytes"]  # MLA: (d_c + d_R)·b_kv
    fp = 31 * e_kv * 2048  # a stage's 31 layers, 2048 tokens (whole blocks of 16)
    arch, g, two_nodes = _specs("DeepSeek-V3", "H100-SXM", n_gpu=8, pp=2)
    kv = calculator.kv_capacity(arch, g, two_nodes, 1024.0, 1024.0)
    np.testing.assert_allclose(float(kv["pool"][0]), stage_pool, rtol=1e-12)
    np.testing.assert_allclose(float(kv["footprint"][0]), fp, rtol=1e-12)
    assert float(kv["max_seqs"][0]) == math.floor(stage_pool / fp) > 1000


def test_pipeline_closed_forms_equal_the_reference_steps():
    """§4's ITL and TTFT of a pipelined group: one engine's at B/n_pp, each step τ_pp (the reference's steps)."""
    arch, g, serving = _specs("Llama-3.1-70B", "H100-SXM", n_gpu=2, pp=4, launch_overhead_s=1e-4, chunk_size=512)
    I, O, B = 1500.0, 40.0, 16.0
    with slimjax.config.float64_scope():
        cell = calculator.capacity_cell_terms(arch, g, serving, jnp.asarray(I), jnp.asarray(O))
        out = calculator.service_terms(cell, None, jnp.asarray(B), jnp.asarray(I), jnp.asarray(O))
    sv = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in serving.fields().items()}
    t = sref.stage_terms(catalog.resolve_model("Llama-3.1-70B")[1], catalog.resolve_gpu("H100-SXM")[1], sv, 4)
    b = int(B / 4)
    itl = sum(sref.step_seconds([I + j] * b, [], t) for j in range(1, int(O))) / (O - 1)
    chunks = [(min(512, I - p), p) for p in range(0, int(I), 512)]
    t_pre = sum(sref.step_seconds([], [c], t) for c in chunks)
    ttft = b * t_pre + (len(chunks) - 1) * itl
    np.testing.assert_allclose(float(out["itl_s"][0]), itl, rtol=1e-9)
    np.testing.assert_allclose(float(out["ttft_s"][0]), ttft, rtol=1e-9)
    np.testing.assert_allclose(float(out["request_rate"][0]), B / (ttft + (O - 1) * itl), rtol=1e-9)


def test_pipeline_decode_is_no_faster_than_the_weights_read_once():
    """Back of the envelope: a token still passes every stage, so ITL at batch 1 is at least the active weights
    read once on one stage's n_tp GPUs at peak bandwidth, plus the hops."""
    arch, g, serving = _specs("Llama-3.1-405B", "H100-SXM", n_gpu=8, pp=2)
    with slimjax.config.float64_scope():
        cell = calculator.capacity_cell_terms(arch, g, serving, jnp.asarray(512.0), jnp.asarray(64.0))
        itl = float(calculator.service_terms(cell, None, jnp.asarray(1.0), 512.0, 64.0)["itl_s"][0])
    raw = catalog.resolve_model("Llama-3.1-405B")[1]
    floor = raw["n_params"] * raw["bytes_per_weight"] / (8 * 3.35e12) + 10e-6
    assert floor < itl < 1.3 * floor + 2e-3


def test_auto_adds_stages_where_no_node_holds_the_model(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "models: [DeepSeek-V3, Llama-3.1-405B, Llama-3.1-70B]\ngpus: [H100-SXM]\nbatch: [1, 8]\n"
        "input_len: [1024]\noutput_len: [256]\nserving: {n_gpu: auto, pp: auto, kv_replication: auto}\n"
    )
    from slimjax.inputs import sweepfile

    table = sweepfile.parse(sweep).serving_table
    assert (table["DeepSeek-V3"]["H100-SXM"]["n_gpu"], table["DeepSeek-V3"]["H100-SXM"]["pp"]) == (8, 2)
    assert (table["Llama-3.1-405B"]["H100-SXM"]["n_gpu"], table["Llama-3.1-405B"]["H100-SXM"]["pp"]) == (8, 2)
    assert (table["Llama-3.1-70B"]["H100-SXM"]["n_gpu"], table["Llama-3.1-70B"]["H100-SXM"]["pp"]) == (2, 1)


def test_errors_name_what_to_add():
    with pytest.raises(SlimjaxError, match="tp.*gpus_per_node"):
        simulate.parse(_spec("Llama-3.1-70B", "H100-SXM", 8, tp=16))
    no_net = {"name": "LabGPU", "tflops": 300, "bandwidth_tbs": 2, "memory_gib": 80, "interconnect_gbs": 300}
    spec = _spec("Llama-3.1-70B", "H100-SXM", 8, tp=2, pp=2)
    spec["gpus"] = [no_net]
    with pytest.raises(SlimjaxError, match="pp.*LabGPU has no network_gbs.*configs/gpus.yaml"):
        simulate.parse(spec)
    with pytest.raises(SlimjaxError, match="router.*round_robin"):
        simulate.parse(dict(_spec("Llama-3.1-70B", "H100-SXM", 8, tp=2, pp=2), router="least_loaded"))


def test_procurement_plans_models_no_node_holds_on_stages():
    """pp: auto: DeepSeek-V3 and Llama-3.1-405B get H100 plans of two 8-GPU nodes (their GPUs and
    cost count every stage); pp: 1 leaves them without a fitting candidate at TP 8."""
    study = dict(
        workloads=[dict(name="chat", input_len=1000, output_len=200)],
        rates=[2.0],
        models=["DeepSeek-V3", "Llama-3.1-405B"],
        gpus=["H100-SXM"],
        tp=[8],
        batch=[16, 64],
        slo=dict(ttft_s=5.0, itl_s=0.2),
        sizing="screen",
        pp="auto",
    )
    ds = slimjax.procure(study)
    assert (ds.pp.sel(gpu="H100-SXM", tp=8) == 2).all()
    best = ds.isel(workload=0, rate=0)
    assert (best.best_pp == 2).all() and (best.best_tp == 8).all()
    np.testing.assert_array_equal(best.best_gpus.values, best.best_replicas.values * 16)
    np.testing.assert_allclose(best.best_cost_per_hour.values, best.best_gpus.values * 2.99)
    flat = slimjax.procure(dict(study, pp=1))
    assert not flat.fits.any() and np.isnan(flat.best_cost_per_hour).all()


def test_every_catalog_model_has_a_plan_on_h100_nodes():
    """n_gpu: auto, pp: auto: every model in configs/models.yaml fits on H100 nodes — one node where it holds the
    model, stages across nodes where it does not (DeepSeek-V3/R1 and Llama-3.1-405B: 8 × 2)."""
    models = list(catalog.model_catalog())
    spec = dict(
        models=models,
        gpus=["H100-SXM"],
        batch=[1],
        input_len=[2048],
        output_len=[512],
        serving=dict(n_gpu="auto", pp="auto", kv_replication="auto"),
    )
    at = slimjax.sweep(spec, quiet=True).isel(gpu=0, input_len=0, output_len=0, batch=0)
    assert (at.max_seqs >= 1).all() and (at.n_gpu >= 1).all()
    multi = sorted(str(m) for m in at.model.values[(at.pp > 1).values])
    assert multi == ["DeepSeek-R1", "DeepSeek-V3", "Llama-3.1-405B"]
    assert ((at.n_gpu * at.pp).sel(model=multi) == 16).all()
