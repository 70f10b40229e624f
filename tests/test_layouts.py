"""docs/layouts.md, attention data parallel and expert parallel: memory per GPU by hand (DeepSeek-V3 DP 8 × EP 8 on
H200, gpt-oss-120b TP 4 against EP 4), invalid layouts named, the all-to-all against NCCL's measured table, the
expert-load imbalance against a seeded Monte Carlo, the jitted simulation against the Python event loop per request
(float64, 1e-9), and the limits (D = ep = 1 as before, expert reads bounded by the experts the tokens touch)."""

import math
import re

import numpy as np
import pytest
import serving_reference as sref
from hypothesis import given, settings
from hypothesis import strategies as st

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog, layouts
from slimjax.inputs.collectives import read_collectives
from slimjax.inputs.serving import default_serving
from slimjax.model import batching, calculator, experts, roofline
from slimjax.model.collectives import protocol_collective_s
from slimjax.model.parallel import measured_collective
from slimjax.model.specs import GPUSpec, ModelSpec, stack
from slimjax.studies import simulate

GIB = 2.0**30


def _pair(model, gpu):
    return stack(ModelSpec, [catalog.resolve_model(model)[1]]), stack(GPUSpec, [catalog.resolve_gpu(gpu)[1]])


def _kv(model, gpu, tokens=2048.0, **serving):
    with slimjax.config.float64_scope():
        m, g = _pair(model, gpu)
        sv = default_serving(m, **serving)
        kv = calculator.kv_capacity(m, g, sv, tokens, 0.0)
        return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in kv.items()}, catalog.resolve_model(model)[1]


def test_deepseek_v3_dp8_ep8_memory_by_hand():
    """DeepSeek-V3 (FP8, 671 B) on 8 H200 as DP 8 × EP 8: each GPU holds the dense part whole (attention, embeddings,
    3 dense layers, the shared experts) and 256/8 routed experts of each of its 58 MoE layers; each rank its own
    pool, KV latent unreplicated (r = 1: TP 1); against TP 8, where each GPU holds 1/8 of everything but the latent
    is on all 8 ranks (r = 8), a rank holds 8× the sequences per byte of pool."""
    dp, tp8 = None, None
    dp, arch = _kv("DeepSeek-V3", "H200", n_gpu=1.0, dp=8.0, ep=8.0, kv_replication=1.0)
    tp8, _ = _kv("DeepSeek-V3", "H200", n_gpu=8.0, kv_replication=8.0)
    b_w = arch["bytes_per_weight"]
    routed = arch["n_moe_layers"] * 3 * arch["hidden"] * arch["expert_ffn_dim"]  # one expert over the MoE layers
    dense = b_w * (arch["n_params"] - arch["n_experts"] * routed)
    per_gpu = dense + b_w * arch["n_experts"] * routed / 8  # by hand: what one GPU of DP 8 × EP 8 holds
    assert 14 * GIB < dense < 18 * GIB  # ~16 B dense weights of DeepSeek-V3 at FP8
    mem = catalog.resolve_gpu("H200")[1]["memory_bytes"]
    assert dp["pool"] == pytest.approx(0.9 * mem - per_gpu, rel=1e-12)  # each rank: one GPU, its own pool
    assert tp8["pool"] == pytest.approx((0.9 * 8 * mem - arch["n_params"] * b_w), rel=1e-12)
    assert dp["pool"] * 8 < tp8["pool"]  # DP stores the dense part 8 times
    e_kv = (arch["kv_lora_rank"] + arch["rope_dim"]) * arch["kv_dtype_bytes"]
    seq = 2048 * arch["n_layers"] * e_kv  # 2,048 tokens of latent, blocks of 16 fill exactly
    assert dp["footprint"] == pytest.approx(seq, rel=1e-12)
    assert tp8["footprint"] == pytest.approx(8 * seq, rel=1e-12)
    assert dp["max_seqs"] == math.floor(dp["pool"] / seq)
    # the group's sequences: 8 ranks of their own against one TP group's latent on every rank
    assert 8 * dp["max_seqs"] > 5 * tp8["max_seqs"]


def test_gpt_oss_tp4_against_ep4_memory_by_hand():
    """gpt-oss-120b on 4 H200: TP 4 and EP 4 under TP-4 attention (moe_tp 1) hold the same bytes per GPU (a quarter of
    everything), so the same pool; DP 4 × EP 4 holds the dense part on every GPU: its four pools together are the TP
    group's less three dense copies."""
    tp4, arch = _kv("gpt-oss-120b", "H200", n_gpu=4.0)
    ep4, _ = _kv("gpt-oss-120b", "H200", n_gpu=4.0, ep=4.0, moe_tp=1.0)
    dep4, _ = _kv("gpt-oss-120b", "H200", n_gpu=1.0, dp=4.0, ep=4.0)
    assert ep4["pool"] == tp4["pool"] and ep4["footprint"] == tp4["footprint"]
    routed = arch["n_moe_layers"] * arch["n_ffn"] * arch["hidden"] * arch["expert_ffn_dim"]
    dense = arch["bytes_per_weight"] * (arch["n_params"] - arch["n_experts"] * routed)
    assert 4 * dep4["pool"] == pytest.approx(tp4["pool"] - 3 * dense, rel=1e-12)


def _block(model, gpu, **serving):
    from slimjax.inputs.serving import serving_block

    models = [catalog.resolve_model(model)]
    gpus = [catalog.resolve_gpu(gpu)]
    return serving_block(serving, models, gpus, 4096.0)


@pytest.mark.parametrize(
    "serving, field, words",
    [
        (dict(n_gpu=1, dp=8, ep=3), "serving.ep", "does not divide its 256 experts"),
        (dict(n_gpu=1, dp=8, ep=8, moe_tp=2), "serving.moe_tp", "moe_tp·ep = 2·8 = 16 GPUs"),
        (dict(n_gpu=2, dp=2, ep=8), "serving.ep", "ep = 8 does not divide the n_gpu·dp = 2·2 = 4 GPUs"),
    ],
)
def test_an_invalid_layout_is_one_line_naming_the_values(serving, field, words):
    with pytest.raises(SlimjaxError) as e:
        _block("DeepSeek-V3", "H200", **serving)
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value)


def test_expert_parallel_on_a_dense_model_is_named():
    with pytest.raises(SlimjaxError, match="it is a dense model") as e:
        _block("Llama-3.1-8B", "H100-SXM", ep=2, n_gpu=2)
    assert e.value.field == "serving.ep"


def test_the_all_to_all_is_within_15_percent_of_nccl_from_1_mib(shared_data):
    """The catalog's all-to-all lines (configs/gpus.yaml ``alltoall``, the newest NCCL measured) against every measured
    bf16 all-to-all point of 1 MiB and more on H100 and H200 at 2, 4 and 8 GPUs: within 15 % (x each GPU's buffer)."""
    frame = read_collectives(sorted((shared_data / "measured" / "nccl").glob("*.csv")))
    checked = 0
    for name in ("H100-SXM", "H200"):
        gpu = GPUSpec(**catalog.resolve_gpu(name)[1])
        newest = str(catalog.config_yaml("gpus.yaml")["gpus"][name]["alltoall"]["nccl"])
        for n in (2, 4, 8):
            at = frame[
                (frame.gpu == name)
                & (frame.op == "alltoall")
                & (frame.dtype == "half")
                & (frame.n_gpu == n)
                & (frame.nccl_version == newest)
                & (frame.message_bytes >= 2**20)
            ]
            m = measured_collective(gpu, float(n), "alltoall")
            fit = np.asarray(protocol_collective_s(at.message_bytes.to_numpy(), *(m[p] for p in m)))
            err = fit / at.latency_s.to_numpy() - 1
            assert len(at) >= 9 and np.abs(err).max() <= 0.15, (name, n, np.abs(err).max())
            checked += len(at)
    assert checked >= 50


def _monte_carlo_imbalance(n, E, k, ep, trials, rng):
    """Mean over trials of (busiest rank's routed load)/(n·k/ep): n tokens each choosing k distinct experts of E
    uniformly, experts dealt E/ep to each of ep ranks in order."""
    rank_of = np.arange(E) // (E // ep)
    worst = np.empty(trials)
    for t in range(trials):
        choice = np.argsort(rng.random((n, E)), axis=1)[:, :k]
        load = np.bincount(rank_of[choice].ravel(), minlength=ep)
        worst[t] = load.max()
    return worst.mean() / (n * k / ep)


@pytest.mark.parametrize(
    "n, E, k, ep", [(8, 256, 8, 8), (64, 256, 8, 8), (512, 256, 8, 8), (16, 128, 4, 4), (32, 8, 2, 2)]
)
def test_imbalance_against_a_seeded_monte_carlo(n, E, k, ep):
    """The closed form (docs/layouts.md) within 8 % of a seeded Monte Carlo of top-k routing; rising as tokens per
    expert fall; 1 without expert parallelism; bounded by every choice of every token on one rank."""
    rng = np.random.default_rng(7)
    with slimjax.config.float64_scope():
        closed = float(experts.expert_imbalance(float(n), float(E), float(k), float(ep)))
        assert float(experts.expert_imbalance(float(n), float(E), float(k), 1.0)) == 1.0
        fewer = float(experts.expert_imbalance(n / 4.0, float(E), float(k), float(ep)))
        bound = ep * min(k, E / ep) / k
        assert 1.0 < closed < fewer <= bound
        assert float(experts.expert_imbalance(1e9, float(E), float(k), float(ep))) == pytest.approx(1.0, abs=1e-3)
        assert float(experts.expert_imbalance(float(n), float(E), float(k), float(ep), 1e6)) == bound  # skew: bound
    mc = _monte_carlo_imbalance(n, E, k, ep, 400, rng)
    assert closed == pytest.approx(mc, rel=0.08)


def test_expert_reads_are_bounded_by_the_experts_the_tokens_touch():
    """A rank's pass of n tokens on a D-rank group reads the dense part and at most 1/D of min(E, D·n·k) experts;
    at D = 1 exactly §4b's M_W(n)."""
    with slimjax.config.float64_scope():
        m, g = _pair("DeepSeek-V3", "H200")
        for dp in (1.0, 2.0, 8.0):
            roof, _, _ = calculator.roofline_terms(m, g, default_serving(m, n_gpu=1.0, dp=dp, ep=8.0))
            dense = roof.weights - roof.n_experts * roof.routed_expert_bytes
            for n in (1.0, 3.0, 40.0, 4096.0):
                got = roofline.pass_weights_bytes(roof, n)
                touched = min(float(roof.n_experts[0]), dp * n * float(roof.experts_per_token[0]))
                bound = float(dense[0] + touched * roof.routed_expert_bytes[0] / dp)
                assert float(dense[0]) < float(got[0]) <= bound * (1 + 1e-12)
                if dp == 1.0:
                    want = experts.weights_read_bytes(
                        n, roof.weights, roof.routed_expert_bytes, roof.n_experts, roof.experts_per_token
                    )
                    assert float(got[0]) == float(want[0])


def test_without_a_layout_every_term_is_as_before():
    """D = ep = 1 given explicitly: the roofline record's step time equals the default spec's bit for bit, and every
    layout communication line is 0 (the goldens, tests/test_golden.py, hold the rest of the results)."""
    m, g = _pair("DeepSeek-V3", "H100-SXM")
    base, _, _ = calculator.roofline_terms(m, g, default_serving(m, n_gpu=8.0))
    given, _, _ = calculator.roofline_terms(m, g, default_serving(m, n_gpu=8.0, dp=1.0, ep=1.0, moe_tp=8.0))
    for n in (1.0, 17.0, 2048.0):
        assert float(roofline.comm_s(base, n)[0]) == float(roofline.comm_s(given, n)[0])
        assert float(roofline.pass_active_params(given, n)[0]) == float(base.active_params[0])
    for line in given.expert_comm:
        assert float(roofline.line_s(line, 64.0)[0]) == 0.0


RNG = np.random.default_rng(23)
N = 36
ARRIVALS = np.sort(RNG.uniform(0, 1.5, N)).round(3)
INPUTS = RNG.integers(1, 3000, N)
OUTPUTS = RNG.integers(1, 60, N)

LAYOUTS = {
    "deepseek_dp8_ep8_h200": dict(
        model="DeepSeek-V3", gpu="H200", batch=32, tp=1, dp=8, ep=8, launch_overhead_s=2e-4, step_overhead_s=1e-3
    ),
    "gpt_oss_dp2_tp2_ep4_fp8_dispatch": dict(
        model="gpt-oss-120b", gpu="H200", batch=12, tp=2, dp=2, ep=4, moe_tp=1, dispatch_dtype="fp8", chunk_size=256
    ),
    "deepseek_dp2_tp4_ep4_layer_costs_engine_allreduce": dict(  # moe_tp 2: the experts' all-reduce at τ_c too
        model="DeepSeek-V3",
        gpu="H200",
        batch=16,
        tp=4,
        dp=2,
        ep=4,
        layer_overhead_s=2.5e-5,
        expert_layer_overhead_s=8e-5,
        engine_allreduce_latency_s=5e-6,
    ),
    "mixtral_ep2_under_tp2_two_replicas": dict(model="Mixtral-8x7B", gpu="H100-SXM", batch=8, tp=2, ep=2, replicas=2),
    "gpt_oss_tp4_expert_kernels": dict(
        model="gpt-oss-120b",
        gpu="H100-SXM",
        batch=16,
        tp=4,
        expert_compute_efficiency=0.35,
        expert_bandwidth_efficiency=0.7,
        compute_efficiency=0.6,
        bandwidth_efficiency=0.8,
        layer_overhead_s=3e-5,
        expert_layer_overhead_s=5e-5,
        engine_allreduce_latency_s=7e-6,
    ),
    "deepseek_wide_ep16_over_two_nodes": dict(
        model="DeepSeek-V3", gpu="H200", batch=32, tp=1, dp=16, ep=16, expert_imbalance=1.3
    ),
}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_layout_simulation_equals_the_event_loop(case):
    """The jitted §9 simulation of DP/EP groups against the plain event loop (tests/serving_reference.py) per request
    to 1e-9 in float64: each replica's n_pp·D engines dealt arrivals round robin, each step timed by docs/layouts.md."""
    kw = dict(LAYOUTS[case])
    model, gpu, batch = kw.pop("model"), kw.pop("gpu"), kw.pop("batch")
    tp, replicas = kw.pop("tp"), kw.pop("replicas", 1)
    requests = {"arrival_s": ARRIVALS.tolist(), "input_len": INPUTS.tolist(), "output_len": OUTPUTS.tolist()}
    spec = dict(
        models=[model],
        gpus=[gpu],
        tp=[tp],
        batch=[batch],
        replicas=[replicas],
        precision="float64",
        serving=kw,
        stream={"requests": requests},
    )
    sim = simulate.parse(spec)
    ds = simulate.run(sim)
    t = sref.study_terms(sim, catalog.resolve_model(sim.models[0])[1])
    dp = int(t["layout"]["dp"])
    want = sref.simulate_pipeline(t, ARRIVALS.tolist(), INPUTS.tolist(), OUTPUTS.tolist(), batch, replicas, engines=dp)
    got = ds.squeeze()
    assert np.isfinite(got.ttft_s.values).all()
    np.testing.assert_allclose(got.ttft_s.values, want["ttft"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.e2e_s.values, want["e2e"], rtol=1e-9, atol=0)
    assert ds.attrs["engine_steps"] == want["steps"]


def test_a_rank_steps_as_if_every_rank_ran_its_step():
    """The balanced reading (docs/layouts.md): a rank's step of a DP 8 × EP 8 group (measured all-to-all of the H200
    catalog) equals the event loop's, whose expert stage serves the 8 ranks' tokens; a lone decode is charged the
    expert load and all-to-all of 8 (an upper bound where the other ranks idle, said in the docs)."""
    arch = catalog.resolve_model("DeepSeek-V3")[1]
    gpu = {k: float(v) for k, v in catalog.resolve_gpu("H200")[1].items()}
    with slimjax.config.float64_scope():
        m, g = _pair("DeepSeek-V3", "H200")
        serving = default_serving(m, n_gpu=1.0, dp=8.0, ep=8.0, launch_overhead_s=1e-4)
        roof, a_pre, a_dec = calculator.roofline_terms(m, g, serving)
        sv = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in serving.fields().items()}
        t = sref.replica_terms(arch, gpu, sv)
        for contexts, chunks in (([4000.0], []), ([300.0] * 7, [(512, 1024)]), ([], [(2048, 0)])):
            d = float(len(contexts))
            n_tok = d + sum(n for n, _ in chunks)
            got = batching.step_time(
                n_tok,
                sum(contexts),
                sum(float(batching.context_kv_bytes(c, roof)[0]) for c in contexts),
                sum(float(batching.chunk_attention_tokens(n, p)) for n, p in chunks),
                sum(float(batching.context_kv_bytes(float(p), roof)[0]) for _, p in chunks),
                roof,
                a_pre,
                a_dec,
            )
            assert float(got[0]) == pytest.approx(sref.step_seconds(contexts, chunks, t), rel=1e-12)
        lone = sref.layout_pass(1, t)
        assert lone[0] > float(roof.active_params[0])  # the busiest expert rank's load of 8 tokens, not 1


def test_every_layout_of_a_gpu_count():
    """layout: auto's enumeration: every (tp, pp, dp, ep, moe_tp) of N GPUs with N = tp·dp·pp, tp·dp = moe_tp·ep,
    powers of two, tp within the node and dividing the heads, ep dividing the experts; DP 8 × EP 8 and TP 8 among
    DeepSeek-V3's 8-GPU layouts; a dense model takes tensor and pipeline parallel only; wide EP beyond a node."""
    from slimjax.inputs.layouts import Layout, layout_kind, valid_layouts

    arch = catalog.resolve_model("DeepSeek-V3")[1]
    eight = valid_layouts(8, int(arch["n_heads"]), int(arch["n_experts"]), int(arch["n_layers"]), 8)
    assert Layout(1, 1, 8, 8, 1) in eight and Layout(8, 1, 1, 1, 8) in eight and Layout(8, 1, 1, 8, 1) in eight
    assert len(set(eight)) == len(eight)
    for lay in eight:
        assert lay.gpus == 8 and lay.tp * lay.dp == lay.moe_tp * lay.ep and lay.tp <= 8
        assert arch["n_experts"] % lay.ep == 0 and arch["n_heads"] % lay.tp == 0
    dense = catalog.resolve_model("Llama-3.1-70B")[1]
    plain = valid_layouts(8, int(dense["n_heads"]), 0, int(dense["n_layers"]), 8)
    assert {(x.tp, x.pp) for x in plain} == {(8, 1), (4, 2), (2, 4), (1, 8)} and all(x.dp == x.ep == 1 for x in plain)
    wide = valid_layouts(64, int(arch["n_heads"]), int(arch["n_experts"]), int(arch["n_layers"]), 8)
    assert Layout(1, 1, 64, 64, 1) in wide and layout_kind(1, 64, 64) == "wide-EP"
    assert layout_kind(8, 1, 8) == "TP+EP" and layout_kind(1, 8, 8) == "DP+EP" and layout_kind(8, 1, 1) == "TP"
    with pytest.raises(SlimjaxError, match="power of two GPUs, got 12"):
        valid_layouts(12, 128, 256, 61, 8)


# a screen-sized procurement of DeepSeek-V3 on H200 at TP 1 and 8 (the layout tests' candidates vary around it)
DEEPSEEK_STUDY = dict(
    workloads=[dict(name="chat", input_len=1024, output_len=256)],
    rates=[2.0],
    models=["DeepSeek-V3"],
    gpus=["H200"],
    tp=[1, 8],
    batch=[64],
    slo={"ttft_s": 5.0, "itl_s": 0.2},
    sizing="screen",
)


def test_layouts_are_procurement_candidates_priced_by_all_their_gpus():
    """A study's ``settings`` axis takes layouts (docs/layouts.md): DeepSeek-V3 on H200 at tp 1 and 8 under
    {dp 1} and {dp 8, ep 8} — TP 8 and DP 8 × EP 8 are 8-GPU groups, DP 8 × EP 8 over TP 8 a 64-GPU one — each
    candidate's cost counts its n_tp·n_pp·D GPUs (replicas × GPUs × price), one GPU (tp 1, dp 1) does not fit."""
    base = dict(DEEPSEEK_STUDY, serving={"efficiency": "calibrated", "kv_replication": "auto"})
    ds = slimjax.procure({**base, "settings": [{"dp": 1}, {"dp": 8, "ep": 8}]})
    price = catalog.resolve_gpu("H200")[1]["price_per_hour"]
    for label, tp, gpus in (("dp 1", 8, 8), ("dp 8, ep 8", 1, 8), ("dp 8, ep 8", 8, 64)):
        got = ds.sel(setting=label, tp=tp).squeeze()
        replicas = float(got.replicas)
        assert replicas >= 1 and float(got.gpus_total) == replicas * gpus, (label, tp)
        assert float(got.cost_per_hour) == pytest.approx(replicas * gpus * price, rel=1e-12)
    assert not np.isfinite(float(ds.sel(setting="dp 1", tp=1).replicas.squeeze()))
    best = ds.sel(setting="dp 8, ep 8").squeeze()  # the choice's GPUs count the ranks too
    assert float(best.best_gpus) == float(best.best_replicas) * int(best.best_tp) * 8


def test_expert_kernels_by_hand():
    """Back of the envelope: gpt-oss-120b on one H200, one token decoding at context 1 with the experts' kernels at
    e_XB = 0.5 reads the dense part and its k = 4 experts, those at twice the bytes: (M_dense + 4·R/0.5)/BW; a
    2,048-token prompt with e_XF = 0.25 spends its dense FLOPs at F and its routed ones at F/4 (t_l = 0)."""
    arch = catalog.resolve_model("gpt-oss-120b")[1]
    gpu = catalog.resolve_gpu("H200")[1]
    with slimjax.config.float64_scope():
        m, g = _pair("gpt-oss-120b", "H200")
        sv = default_serving(m, expert_compute_efficiency=0.25, expert_bandwidth_efficiency=0.5)
        roof, a_pre, a_dec = calculator.roofline_terms(m, g, sv)
        b_w = arch["bytes_per_weight"]
        routed = arch["n_moe_layers"] * arch["n_ffn"] * arch["hidden"] * arch["expert_ffn_dim"]
        dense = b_w * (arch["n_params"] - arch["n_experts"] * routed)
        kv = float(batching.context_kv_bytes(1.0, roof)[0])
        want = (dense + 4 * b_w * routed / 0.5 + kv) / gpu["bandwidth_bytes_per_s"]
        got = batching.step_time(1.0, 1.0, kv, 0.0, 0.0, roof, a_pre, a_dec)
        assert float(got[0]) == pytest.approx(want, rel=1e-9)
        n = 2048.0
        p_act = (
            arch["n_params"]
            - arch["n_moe_layers"] * (arch["n_experts"] - 4) * arch["n_ffn"] * arch["hidden"] * (arch["expert_ffn_dim"])
        )
        ops = 2 * (p_act + (1 / 0.25 - 1) * 4 * routed) * n + float(a_pre[0]) * n * n / 2
        peak = calculator.tensor_core_peak(g, b_w)
        prefill = batching.step_time(n, 0.0, 0.0, n * n / 2, 0.0, roof, a_pre, a_dec)
        assert float(prefill[0]) == pytest.approx(ops / float(peak[0]), rel=1e-9)  # compute-bound at 2,048 tokens


def test_a_tp_degree_a_layout_cannot_take_does_not_run():
    """On a study's tp axis, {ep: 8} cannot take tp 1 (ep 8 does not divide one GPU): that candidate does not run
    (no replicas, as a group that does not fit) while tp 8 does; a layout no degree can take is the error."""
    base = DEEPSEEK_STUDY
    ds = slimjax.procure({**base, "serving": {"ep": 8}})
    assert not np.isfinite(float(ds.sel(tp=1).replicas.squeeze())) and float(ds.sel(tp=8).replicas.squeeze()) >= 1
    with pytest.raises(SlimjaxError, match="ep = 16 does not divide"):
        slimjax.procure({**base, "serving": {"ep": 16}})


def test_the_calibrated_preset_takes_each_engines_expert_kernels():
    """configs/roofline/default.yaml's ``expert_efficiency`` (bench/fit_moe_constants.py): each engine's e_XF and e_XB
    where fitted, the block's default for an engine without MoE rows; fractions in (0, 1]; a study under
    ``efficiency: calibrated`` and an engine runs with its engine's."""
    from slimjax.inputs.serving import EXPERT_EFFICIENCIES, calibrated_expert_efficiency, serving_block

    block = catalog.config_yaml("roofline/default.yaml")["expert_efficiency"]
    for key in EXPERT_EFFICIENCIES:
        for engine, fit in block[key]["engines"].items():
            assert 0 < fit["value"] <= 1 and calibrated_expert_efficiency(engine)[key] == fit["value"]
        assert calibrated_expert_efficiency("generic")[key] == block[key]["default"]
    spec, table = serving_block(
        {"efficiency": "calibrated", "engine": "vllm"},
        [catalog.resolve_model("gpt-oss-120b")],
        [catalog.resolve_gpu("H200")],
        4096.0,
    )
    want = block["expert_compute_efficiency"]["engines"]["vllm"]["value"]
    assert float(spec.expert_compute_efficiency.reshape(-1)[0]) == want
    assert "e_XF, e_XB" in table["gpt-oss-120b"]["H200"]["efficiency"]


def test_the_capacity_card_counts_the_groups_gpus():
    """`slimjax capacity --n-gpu 1 --dp 8 --ep 8`: the card says the group is 8 GPUs (TP 1 × PP 1 × DP 8), its KV pool
    the 8 ranks' together, and its max_seqs theirs."""
    from click.testing import CliRunner

    from slimjax.cli import main

    args = ["capacity", "--model", "DeepSeek-V3", "--gpu", "H200", "--n-gpu", "1", "--dp", "8", "--ep", "8"]
    args += ["--kv-replication", "1", "--input-len", "1024", "--output-len", "256", "--batch", "64"]
    out = CliRunner().invoke(main, args).output
    assert "GPUs in the group              8 (TP 1 × PP 1 × DP 8)" in out, out
    kv, _ = _kv("DeepSeek-V3", "H200", 1280.0, n_gpu=1.0, dp=8.0, ep=8.0, kv_replication=1.0)
    seqs = [ln for ln in out.splitlines() if "Max concurrent sequences" in ln][0]
    assert int(seqs.split()[-1].replace(",", "")) == 8 * int(kv["max_seqs"])


LAYOUT_STUDY = dict(
    models=["DeepSeek-V3", "Llama-3.1-70B"],
    gpus=["H200"],
    layouts=[8],
    batch=[16],
    precision="float64",
    serving={"efficiency": "calibrated"},
    stream={"requests": {"arrival_s": [0.0, 0.1, 0.2], "input_len": [500, 800, 300], "output_len": [10, 5, 20]}},
)


def test_layouts_are_every_layout_of_their_gpu_counts_and_equal_the_point_runs():
    """`layouts: [8]`: the (tp, setting) candidates a model takes are exactly valid_layouts(8) (one stage: DeepSeek-
    V3's 16 on an H200 node, Llama-3.1-70B's TP 8 alone), every other pair does not run (NaN), and a candidate's
    results equal a simulation of that layout given by hand."""
    sim = simulate.parse(LAYOUT_STUDY)
    assert list(sim.tp) == [1, 2, 4, 8]
    settings = [dict(kv.split(" ") for kv in label.split(", ")) for label in sim.settings]
    n_gpu = np.asarray(sim.serving.n_gpu)  # (model, gpu, tp, pp, setting): NaN where the pair does not run
    for m, model in enumerate(sim.models):
        arch = catalog.resolve_model(model)[1]
        want = {
            (lay.tp, lay.dp, lay.ep, lay.moe_tp)
            for lay in layouts.valid_layouts(
                8, int(arch["n_heads"]), int(arch["n_experts"]), int(arch["n_layers"]), 8, 1
            )
        }
        takes = {
            (int(t), int(s["dp"]), int(s["ep"]), int(s["moe_tp"]))
            for i, t in enumerate(sim.tp)
            for j, s in enumerate(settings)
            if np.isfinite(n_gpu[m, 0, i, 0, j])
        }
        assert takes == want
        assert len(sim.serving_table[model]["H200"]["layouts"]) == len(want)
    assert len(takes) == 1  # a dense model: TP 8 only
    one = simulate.parse(dict(LAYOUT_STUDY, models=["DeepSeek-V3"]))
    ttft = simulate.run(one).ttft_s.isel(model=0).squeeze()
    runs = {(i, j) for i in range(len(one.tp)) for j in range(len(settings)) if np.isfinite(ttft[i, j].values).all()}
    assert len(runs) == 16  # what runs is what the serving spec lets run
    tp, dp, ep, moe_tp = 1, 8, 8, 1  # DP 8 × EP 8 by hand
    point = dict(LAYOUT_STUDY, models=["DeepSeek-V3"], tp=[tp])
    point.pop("layouts")
    point["serving"] = dict(LAYOUT_STUDY["serving"], dp=dp, ep=ep, moe_tp=moe_tp)
    alone = simulate.run(simulate.parse(point)).ttft_s.squeeze().values
    j = one.settings.index(f"dp {dp}, ep {ep}, moe_tp {moe_tp}")
    np.testing.assert_array_equal(ttft[list(one.tp).index(tp), j].values, alone)


@pytest.mark.parametrize(
    "change, field, words",
    [
        (dict(tp=[8]), "layouts", "give tp or layouts, not both"),
        (dict(settings=[{"dp": 2}]), "settings[0].dp", "layouts sets the layout keys"),
        (dict(layouts=[6]), "layouts[0]", "a power of two"),
    ],
)
def test_a_layouts_mistake_is_one_line(change, field, words):
    with pytest.raises(SlimjaxError, match=rf"^{re.escape(field)}: .*{words}"):
        simulate.parse(dict(LAYOUT_STUDY, **change))


def test_a_procurement_study_takes_layouts():
    """procure's file takes `layouts` too: its tp axis, one variant per layout (crossed with engine settings), a
    pair that is not one of a model's layouts not run."""
    from slimjax.studies.procure import spec as procurefile

    study = procurefile.parse(
        dict(
            workloads=[dict(name="chat", input_len=1000, output_len=200)],
            rates=[1.0],
            models=["DeepSeek-V3"],
            gpus=["H200"],
            layouts=[8],
            settings=[{"step_tokens": 2048}],
            slo=dict(ttft_s=2.0, itl_s=0.1),
        )
    )
    assert list(study.tp) == [1, 2, 4, 8] and len(study.variants) == 16
    label, v = next((label, v) for label, v in study.variants if label.endswith("dp 8, ep 8, moe_tp 1"))
    assert label.startswith("step_tokens 2048, ")
    n = np.asarray(v.serving.n_gpu).reshape(len(study.tp), -1)[:, 0]
    assert np.isfinite(n).tolist() == [True, False, False, False]


@given(
    counts=st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=1, max_size=3, unique=True),
    heads=st.sampled_from([8, 12, 32, 64, 128]),
    experts=st.sampled_from([0, 8, 60, 128, 256]),
    nodes=st.lists(st.sampled_from([4, 8, 72]), min_size=1, max_size=2),
)
@settings(max_examples=60, deadline=None)
def test_study_layouts_hold_only_layouts_of_the_counts_asked(counts, heads, experts, nodes):
    """Whatever the counts, model and GPUs: every candidate of `layouts` is a layout of one of the counts asked
    (tp·dp of them, experts and attention on the same GPUs, ep dividing the experts, tp dividing the heads and within
    the smallest node), the tp axis and settings axis together hold every candidate, and a dense model takes TP only."""
    arch = {"n_heads": heads, "n_experts": experts, "n_layers": 32}
    gpus = [(f"G{i}", {"gpus_per_node": n, "network_bytes_per_s": 5e10}) for i, n in enumerate(nodes)]
    try:
        got = layouts.study_layouts(counts, [("M", arch)], gpus)
    except SlimjaxError as e:  # no layout at all: said, naming the field
        assert str(e).startswith("layouts: no layout of")
        return
    pairs = {(t, s["dp"], s["ep"], s["moe_tp"]) for t in got.tp for _, s in got.settings}
    for valid in got.valid.values():
        assert valid <= pairs
        for tp, dp, ep, moe_tp in valid:
            assert tp * dp in counts and moe_tp * ep == tp * dp
            assert heads % tp == 0 and tp <= min(nodes)
            assert (ep == 1 and dp == 1) if experts == 0 else experts % ep == 0
