"""MODEL.md §4b (MoE and MLA on the roofline) and §4c (tensor-parallel communication): closed forms
against chunk-by-chunk and step-by-step loops, E_t against a routing simulation, the all-reduce against
NCCL's bus-bandwidth relation, published parameter counts, and finite timing for every shared config."""

import math

import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog
from slimjax.inputs.catalog import resolve_model
from slimjax.model import experts, parallel, roofline


@st.composite
def configs(draw):
    L = draw(st.integers(1, 64))
    moe = draw(st.booleans())
    E = float(draw(st.sampled_from([8, 64, 256]))) if moe else 0.0
    k = float(draw(st.integers(1, 8))) if moe else 0.0
    sliding = draw(st.booleans())
    n = draw(st.sampled_from([1, 2, 8]))
    return dict(
        L=L,
        D=float(draw(st.sampled_from([1024, 4096, 7168]))),
        P_act=draw(st.floats(1e8, 4e10)),
        a_pre=draw(st.floats(1e4, 1e7)),
        a_dec=draw(st.floats(1e4, 1e7)),
        M_W=draw(st.floats(1e9, 1e12)),
        E=E,
        k=k,
        routed=draw(st.floats(1e6, 1e9)) if moe else 0.0,
        e_kv=float(draw(st.sampled_from([576, 4096, 65536]))),
        L_s=draw(st.integers(0, L)) if sliding else 0,
        W=float(draw(st.sampled_from([128, 4096]))) if sliding else math.inf,
        F=draw(st.floats(1e14, 8e15)),
        BW=draw(st.floats(1e12, 3e13)),
        t_l=draw(st.sampled_from([0.0, 2e-5])),
        n=n,
        link=float(draw(st.sampled_from([0.0, 32e9, 450e9]))),
        tau=draw(st.sampled_from([0.0, 1e-5])),
    )


def _closed_args(x):
    fixed, per_token = parallel.tp_comm_terms(x["L"], x["D"], x["n"], x["link"], x["tau"])
    return roofline.Roof(
        active_params=x["P_act"],
        weights=x["M_W"],
        routed_expert_bytes=x["routed"],
        n_experts=x["E"],
        experts_per_token=x["k"],
        kv_per_token_full=x["e_kv"] * (x["L"] - x["L_s"]),
        kv_per_token_sliding=x["e_kv"] * x["L_s"],
        window=x["W"],
        flops=x["F"],
        bandwidth=x["BW"],
        launch_overhead_s=x["t_l"],
        comm_fixed_s=fixed,
        comm_per_token_s=per_token,
    )


def _loop_args(x, attn):
    return (
        (x["P_act"], attn, x["M_W"], x["e_kv"], x["L"], x["L_s"], x["W"], x["F"], x["BW"], x["t_l"]),
        dict(
            moe=dict(E=x["E"], k=x["k"], routed=x["routed"]),
            comm=dict(n=x["n"], L=x["L"], D=x["D"], link=x["link"], tau=x["tau"]),
        ),
    )


@settings(max_examples=120, deadline=None)
@given(configs(), st.integers(1, 3000), st.sampled_from([1, 7, 512]))
def test_prefill_closed_form_equals_chunk_loop_with_experts_mla_and_tp(x, I, s):
    t_pre, t_max, k_c = roofline.prefill_time(float(I), float(s), _closed_args(x), x["a_pre"])
    args, kw = _loop_args(x, x["a_pre"])
    want = ref.prefill_chunks(I, s, *args, **kw)
    assert float(t_pre) == pytest.approx(want[0], rel=1e-9)
    assert float(t_max) == pytest.approx(want[1], rel=1e-9)
    assert int(k_c) == want[2]


@settings(max_examples=120, deadline=None)
@given(configs(), st.integers(1, 256), st.integers(1, 3000), st.integers(1, 800))
def test_decode_closed_form_equals_step_loop_with_experts_mla_and_tp(x, B, I, O):
    itl = float(roofline.decode_itl(float(B), float(I), float(O), _closed_args(x), x["a_dec"]))
    args, kw = _loop_args(x, x["a_dec"])
    want = ref.decode_steps(B, I, O, *args, **kw)
    if O == 1:
        assert math.isnan(itl) and math.isnan(want)
    else:
        assert itl == pytest.approx(want, rel=1e-9)


def test_distinct_experts_match_a_routing_simulation():
    """E_t(n): mean distinct experts that n tokens pick under uniform top-k routing, against a seeded
    simulation (each token draws k distinct experts uniformly), within the 99.9 % interval of the mean."""
    rng = np.random.default_rng(7)
    for E, k, n in ((8, 2, 1), (8, 2, 5), (64, 6, 16), (256, 8, 32), (128, 4, 300)):
        reps = 4000
        counts = np.empty(reps)
        for r in range(reps):
            picks = np.argsort(rng.random((n, E)), axis=1)[:, :k]
            counts[r] = len(np.unique(picks))
        half = 3.29 * counts.std(ddof=1) / math.sqrt(reps)
        want = float(experts.distinct_experts(float(n), float(E), float(k)))
        assert abs(counts.mean() - want) <= max(half, 1e-9), (E, k, n, counts.mean(), want)
    assert float(experts.distinct_experts(3.0, 0.0, 0.0)) == 0.0  # dense


def test_allreduce_matches_nccl_bus_bandwidth_relation():
    """NCCL's all-reduce: busbw = algbw · 2(n − 1)/n, algbw = S / t. At zero latency our ring all-reduce
    of S bytes must run at a bus bandwidth equal to the link's."""
    link, S = 450e9, 256 * 2**20
    for n in (2, 4, 8):
        t = float(parallel.allreduce_time(S, float(n), link, 0.0))
        assert (S / t) * 2 * (n - 1) / n == pytest.approx(link, rel=1e-12)
    assert float(parallel.allreduce_time(S, 1.0, link, 1e-5)) == 0.0  # one GPU: nothing to reduce
    assert float(parallel.allreduce_time(S, 8.0, 0.0, 1e-5)) == 0.0  # no link figure: no cost (attr says so)
    fixed, per_token = parallel.tp_comm_terms(80, 8192, 8.0, link, 1e-5)
    assert float(fixed + 512 * per_token) == pytest.approx(
        2 * 80 * float(parallel.allreduce_time(512 * 8192 * 2, 8.0, link, 1e-5))
    )


@pytest.mark.parametrize(
    "gpu, n, hand_s",
    [
        # x = 512 tokens · 8192 · 2 bytes = 8 MiB; t_ar = 10 µs + 2(n − 1)/n · x / BW_link(n)
        ("H100-SXM", 8, 1e-5 + 2 * 7 / 8 * 8388608 / 450e9),  # NVSwitch: 450 GB/s whatever n
        ("H100-SXM", 2, 1e-5 + 2 * 1 / 2 * 8388608 / 450e9),
        ("MI300X", 2, 1e-5 + 2 * 1 / 2 * 8388608 / 64e9),  # xGMI mesh: one 64 GB/s link to the peer
        ("MI300X", 8, 1e-5 + 2 * 7 / 8 * 8388608 / 448e9),  # seven links in parallel rings
        ("L40S", 4, 1e-5 + 2 * 3 / 4 * 8388608 / 32e9),  # PCIe 4.0 x16 through the host
    ],
)
def test_link_topology_against_hand_numbers(gpu, n, hand_s):
    """§4c's BW_link(n) per topology, from the catalog entry, against hand arithmetic."""
    g = catalog.resolve_gpu(gpu)[1]
    bw = parallel.link_bandwidth(float(n), g["link_bytes_per_s"], g["link_mesh"], g["link_efficiency"])
    assert float(parallel.allreduce_time(512 * 8192 * 2.0, float(n), bw, g["allreduce_latency_s"])) == pytest.approx(
        hand_s, rel=1e-12
    )


def test_link_topology_and_efficiency_are_checked_and_scale_the_link():
    """A mesh needs its per-peer link; a per-GPU figure on a mesh, a bad topology or η outside (0, 1] is an error
    naming the key; η_link scales the bandwidth."""
    base = {"name": "X", "tflops": 100, "bandwidth_tbs": 1, "memory_gib": 80}
    for bad, key in (
        ({"link_topology": "mesh"}, "link_gbs"),
        ({"link_topology": "mesh", "interconnect_gbs": 448}, "interconnect_gbs"),
        ({"link_topology": "ring"}, "link_topology"),
        ({"interconnect_gbs": 450, "link_gbs": 64}, "link_gbs"),
        ({"interconnect_gbs": 450, "link_efficiency": 1.5}, "link_efficiency"),
    ):
        with pytest.raises(SlimjaxError, match=key):
            catalog.resolve_gpu({**base, **bad})
    g = catalog.resolve_gpu({**base, "interconnect_gbs": 450, "link_efficiency": 0.6})[1]
    assert float(parallel.link_bandwidth(8.0, g["link_bytes_per_s"], g["link_mesh"], g["link_efficiency"])) == (
        pytest.approx(0.6 * 450e9, rel=1e-15)
    )


def test_tp_all_reduce_slows_decode_per_gpu():
    """TP 8 no longer looks as good as TP 1 per GPU: the all-reduce adds time to every step."""
    no_link = {"name": "H100-no-link", "tflops": 989, "bandwidth_tbs": 3.35, "memory_gib": 80}
    spec = dict(
        models=["Llama-3.1-70B"],
        gpus=["H100-SXM", "L40S", no_link],
        batch=[32],
        input_len=[1024],
        output_len=[256],
        advisor=False,
        precision="float64",
    )
    one = slimjax.sweep({**spec, "serving": {"n_gpu": 4}}, quiet=True)
    eight = slimjax.sweep({**spec, "serving": {"n_gpu": 8}}, quiet=True)
    ratio = eight.itl_s / one.itl_s  # twice the GPUs: without communication this would be ~0.5
    h100, l40s, free = (ratio.sel(gpu=g).item() for g in ("H100-SXM", "L40S", "H100-no-link"))
    assert h100 > 0.55 and l40s > 0.55 and free == pytest.approx(0.5, abs=0.02)  # the all-reduce is the difference


# Published totals / active (billions). gpt-oss counts active parameters without the input embedding
# table (a lookup, no FLOPs): OpenAI's 5.1 B is P_act − V·D; MODEL.md's P_act keeps it.
PUBLISHED = {
    "deepseek-ai--DeepSeek-V3_config.json": (671, 37, False),
    "Qwen--Qwen3-235B-A22B_config.json": (235, 22, False),
    "openai--gpt-oss-120b_config.json": (117, 5.1, True),
    "mistralai--Mixtral-8x7B-v0.1_config.json": (46.7, 12.9, False),
    # models/serving (MiniMax: "230 B total, 10 B activated", rounded to 10 B: within 5 %; Kimi: "1 T, 32 B")
    "serving/MiniMaxAI--MiniMax-M2.5_config.json": (230, 10, True, 0.05),
    "serving/moonshotai--Kimi-K2.5_config.json": (1000, 32, False),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(shared_data, name):
    m = resolve_model(str(shared_data / "models" / name))[1]
    total, active, no_embedding, *rel = PUBLISHED[name]
    p_e = m["n_ffn"] * m["hidden"] * m["expert_ffn_dim"]
    p_act = m["n_params"] - m["n_moe_layers"] * (m["n_experts"] - m["experts_per_token"]) * p_e
    if no_embedding:
        p_act -= m["vocab"] * m["hidden"]
    assert m["n_params"] / 1e9 == pytest.approx(total, rel=0.03)
    assert p_act / 1e9 == pytest.approx(active, rel=rel[0] if rel else 0.03)


def test_every_shared_config_gets_finite_roofline_timing(shared_data):
    paths = sorted(str(p) for p in (shared_data / "models").glob("*_config.json"))
    assert len(paths) >= 15
    ds = slimjax.sweep(
        dict(
            models=paths,
            gpus=["H200"],
            batch=[1, 16],
            input_len=[512, 4096],
            output_len=[1, 128],
            serving={"n_gpu": 8, "chunk_size": 1024},
            advisor=False,
            precision="float64",
        ),
        quiet=True,
    )
    for v in ("prefill_s", "chunk_max_s", "ttft_s", "service_s", "token_throughput"):
        assert np.isfinite(ds[v].values).all(), v
    assert np.isfinite(ds.itl_s.sel(output_len=128).values).all()
    variants = __import__("json").loads(ds.itl_s.attrs["roofline_variant"])
    assert variants["deepseek-ai--DeepSeek-V3"] == "moe+mla" and variants["openai--gpt-oss-120b"] == "moe"


# ------------------------------------------------------------------------------ fit and n_gpu: auto (§4c)


def _fits_by_hand(arch, gpu, n, tokens, r=1.0, u=0.9, block=16):
    """MODEL.md §3/§4c with the loop reference's footprint: pool > 0 and max_seqs ≥ 1."""
    pool = u * n * gpu["memory_bytes"] - arch["n_params"] * arch["bytes_per_weight"]
    return pool > 0 and ref.max_seqs(pool, ref.footprint(arch, tokens, block, r)) >= 1 if pool < 1e15 else False


def test_n_gpu_auto_and_fits_against_brute_force():
    from slimjax.inputs.catalog import resolve_gpu

    models = ["Llama-3.1-8B", "Llama-3.1-70B", "Mixtral-8x7B", "DeepSeek-V2", "OPT-13b"]
    gpus = ["A100-SXM-40GB", "L40S", "H200"]
    batch, I, O = [1, 4, 16, 64, 256], [512, 4096], [128, 2048]
    for kv_auto in (False, True):
        serving = {"n_gpu": "auto", **({"kv_replication": "auto"} if kv_auto else {})}
        ds = slimjax.sweep(
            dict(
                models=models,
                gpus=gpus,
                batch=batch,
                input_len=I,
                output_len=O,
                serving=serving,
                advisor=False,
                precision="float64",
            ),
            quiet=True,
        )
        for m in models:
            arch = resolve_model(m)[1]
            for g in gpus:
                gpu = resolve_gpu(g)[1]

                def r(n, arch=arch, kv_auto=kv_auto):  # MLA: the latent on every rank
                    return (n if arch.get("mla") else max(1.0, n / arch["n_kv_heads"])) if kv_auto else 1.0

                want = next(
                    (
                        n
                        for n in (1, 2, 4, 8)
                        if arch["n_heads"] % n == 0 and _fits_by_hand(arch, gpu, n, I[-1] + O[-1], r(n))
                    ),
                    0,
                )
                assert int(ds.n_gpu.sel(model=m, gpu=g)) == want, (m, g, kv_auto)
                assert int(ds.n_gpu_to_fit.sel(model=m, gpu=g)) == want
                seqs = ds.max_seqs.sel(model=m, gpu=g)
                fits = ds.fits.sel(model=m, gpu=g)
                assert (fits == (ds.batch <= seqs)).all()
                if want == 0:  # a result, not an error: nothing runs, nothing is timed
                    assert int(seqs.max()) == 0 and not bool(fits.any())
                    assert np.isnan(ds.slim_throughput.sel(model=m, gpu=g)).all()
                    assert np.isnan(ds.itl_s.sel(model=m, gpu=g)).all()


def test_mla_latent_is_held_whole_on_every_tensor_parallel_rank():
    """By hand: DeepSeek-V3 (MLA: d_c 512 + d_R 64 per layer, 61 layers) at TP 8 on H200 with fp8 weights and KV.
    Every head reads the whole compressed latent, so each rank holds every sequence's whole latent: `kv_replication:
    auto` is 8 (not max(1, 8 / 128) = 1), a 2,048-token sequence takes 8 · 2,048 · 576 · 61 bytes of the group's pool
    0.9 · 8 · M_GPU − weights, and each step reads its latent on every rank; a GQA model keeps max(1, n / H_kv)."""
    from slimjax.inputs.catalog import resolve_gpu

    memory = resolve_gpu("H200")[1]["memory_bytes"]
    fp8 = dict(n_gpu=8, weight_dtype_bytes="fp8", kv_dtype_bytes="fp8")
    auto = slimjax.point("DeepSeek-V3", "H200", 4, 1024, 1024, serving=dict(fp8, kv_replication="auto"))
    split = slimjax.point("DeepSeek-V3", "H200", 4, 1024, 1024, serving=dict(fp8, kv_replication=1))
    per_token = 576 * 61
    assert auto["kv_bytes_per_token"] == per_token
    pool = 0.9 * 8 * memory - auto["weights_bytes"]
    assert auto["kv_pool_bytes"] == pytest.approx(pool, rel=1e-12)
    assert auto["max_seqs"] == np.floor(pool / (8 * 2048 * per_token))
    assert split["max_seqs"] == np.floor(pool / (2048 * per_token))
    assert auto["itl_s"] > split["itl_s"]  # the decode reads the latent on every rank
    gqa = slimjax.point("Llama-3.1-70B", "H200", 4, 1024, 1024, serving=dict(n_gpu=8, kv_replication="auto"))
    one = slimjax.point("Llama-3.1-70B", "H200", 4, 1024, 1024, serving=dict(n_gpu=8, kv_replication=1))
    assert gqa["max_seqs"] == one["max_seqs"]  # 8 KV heads over 8 GPUs: split, not replicated


def test_tp_degree_must_divide_the_query_heads():
    with pytest.raises(
        slimjax.SlimjaxError,
        match=r"serving.Llama-3.1-8B.n_gpu: Llama-3.1-8B: a tensor-parallel degree of 3 "
        r"does not divide its 32 query heads",
    ):
        slimjax.parse(
            dict(
                models=["Llama-3.1-8B"],
                gpus=["H100-SXM"],
                batch=[1],
                input_len=[8],
                output_len=[8],
                serving={"Llama-3.1-8B": {"n_gpu": 3}},
            )
        )


def test_capacity_says_first_that_a_configuration_does_not_fit():
    from click.testing import CliRunner

    from slimjax.cli import main

    args = [
        "capacity",
        "--model",
        "Llama-3.1-70B",
        "--gpu",
        "A100-SXM-40GB",
        "--input-len",
        "1024",
        "--output-len",
        "256",
        "--batch",
        "8",
        "--arrival-rate",
        "1",
    ]
    out = CliRunner().invoke(main, args).output
    lines = out.splitlines()
    assert "does not fit: weights 131.4 GiB" in lines[1] and "the smallest --n-gpu that fits batch 8 is 4" in lines[1]
    timing = [
        ln for ln in lines if ln.strip().startswith(("TTFT", "ITL", "Service", "Token throughput", "Wait", "P(wait)"))
    ]
    assert timing and all("not runnable" in ln for ln in timing)
    assert not any(ch.isdigit() for ln in timing for ch in ln.split("not runnable")[1])
    ok = CliRunner().invoke(main, args + ["--n-gpu", "auto"]).output
    assert "does not fit" not in ok and "GPUs in the group              4" in ok and "not runnable" not in ok


# ------------------------------------------------------------------- calibrated roofline defaults (item 5)


def test_calibrated_efficiency_preset_uses_the_shipped_fit_and_explicit_values_win():
    import json

    import yaml

    from slimjax.fit.serving import SERVING_PARAMS
    from slimjax.inputs.catalog import configs_dir

    doc = yaml.safe_load(open(configs_dir() / "roofline" / "default.yaml"))
    for row in [doc["default"], *doc["gpus"].values()]:
        assert (
            0 < row["compute_efficiency"] <= 1
            and 0 < row["bandwidth_efficiency"] <= 1
            and row["launch_overhead_s"] >= 0
        )
    held = doc["provenance"]["held_out"]
    assert set(held) == {"leave_one_tp_out", "leave_one_gpu_out"} and doc["provenance"]["data"]
    for row in doc["gpus"].values():  # what the fit could and could not tell, per GPU, and at which degrees
        assert 0 < row["link_efficiency"] <= 1 and row["allreduce_latency_s"] > 0 and row["tp_rows"]
        assert set(row["identified"]) | set(row["at_bound"]) <= set(SERVING_PARAMS)
    spec = dict(
        models=["Llama-3.1-8B"],
        gpus=["H100-SXM", "L40S"],
        batch=[8],
        input_len=[512],
        output_len=[64],
        advisor=False,
        precision="float64",
    )
    plain = slimjax.sweep({**spec, "serving": {}}, quiet=True)
    cal = slimjax.sweep(
        {**spec, "serving": {"efficiency": "calibrated", "L40S": {"bandwidth_efficiency": 0.5}}}, quiet=True
    )
    settings = json.loads(cal.attrs["serving"])["Llama-3.1-8B"]
    h100 = doc["gpus"]["H100-SXM"]
    assert settings["H100-SXM"]["bandwidth_efficiency"] == h100["bandwidth_efficiency"]
    assert settings["L40S"]["bandwidth_efficiency"] == 0.5  # given beats the preset
    assert settings["L40S"]["compute_efficiency"] == doc["default"]["compute_efficiency"]  # no L40S fit: the pooled one
    assert plain.itl_s.attrs["efficiency"].startswith("plain roofline")
    # the link's fitted η_link and τ come with the preset (GPU fields, MODEL.md §4c), unless the GPU entry sets them
    from slimjax.inputs import sweepfile

    tp4 = {
        **spec,
        "gpus": [
            "A100-SXM-80GB",
            dict(name="mine", tflops=989, bandwidth_tbs=3.35, memory_gib=80, interconnect_gbs=450, link_efficiency=0.5),
            "H100-SXM",
        ],
    }
    cal4 = sweepfile.parse({**tp4, "serving": {"efficiency": "calibrated", "n_gpu": 4}})
    plain4 = sweepfile.parse({**tp4, "serving": {"n_gpu": 4}})
    from slimjax.inputs.serving import calibrated_link

    a100_fit = calibrated_link("A100-SXM-80GB")  # its own fit where its rows identified a constant, else the default's
    assert float(cal4.gpu.link_efficiency[0]) == a100_fit["link_efficiency"]
    assert float(cal4.gpu.allreduce_latency_s[0]) == a100_fit["allreduce_latency_s"]
    assert float(cal4.gpu.link_efficiency[1]) == 0.5  # given beats the preset
    assert float(plain4.gpu.link_efficiency[0]) == 1.0  # plain: MODEL.md's default
    assert cal4.serving_table["Llama-3.1-8B"]["A100-SXM-80GB"]["link"].startswith("fitted: link_efficiency")
    # an H100 node has NCCL's measured all-reduce at 4 GPUs (configs/gpus.yaml): that times its link, no fitted η, τ
    assert cal4.serving_table["Llama-3.1-8B"]["H100-SXM"]["link"].startswith("measured: NCCL all-reduce at 4 GPUs")
    assert float(cal4.gpu.link_efficiency[2]) == 1.0
    # where each (GPU, TP)'s constants come from
    from slimjax.inputs.serving import constants_source

    a100 = doc["gpus"]["A100-SXM-80GB"]
    assert 1 not in {int(n) for n in a100["tp_rows"]}
    assert constants_source("A100-SXM-80GB", tp=1)[0] == "measured, other TP"
    assert "TP 1 not measured" in constants_source("A100-SXM-80GB", tp=1)[1]
    assert constants_source("A100-SXM-80GB", tp=2)[0] == "measured"
    # what its rows did not identify (a flat direction, or at a bound) is the pooled default's, and said
    from slimjax.inputs.serving import calibrated_efficiency, calibrated_link, unidentified_constants

    for gpu, entry in doc["gpus"].items():
        held = unidentified_constants(entry)
        assert held == [
            k
            for k in ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s", "link_efficiency")
            + ("allreduce_latency_s",)
            if k not in entry["identified"] or k in entry["at_bound"]
        ]
        values, where = calibrated_efficiency(gpu)
        values.update(calibrated_link(gpu))
        for k in ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s", "link_efficiency"):
            assert values[k] == (doc["default"][k] if k in held else entry[k])
        assert (
            values["allreduce_latency_s"]
            == (doc["default"] if "allreduce_latency_s" in held else entry)["allreduce_latency_s"]
        )
        assert ("not identified" in constants_source(gpu, tp=2)[1]) == bool(held)
        assert ("did not converge" in constants_source(gpu, tp=2)[1]) == (not entry["converged"])
        assert (f"its {', '.join(held)} the default's" in where) == bool(held)
    assert unidentified_constants(a100)  # 56 rows of one model: e_B pinned at 1, t_l and τ unidentified
    assert "configs/roofline/default.yaml: H100-SXM" in cal.itl_s.attrs["efficiency"]
    assert (cal.itl_s > plain.itl_s).all()  # e_B < 1 and t_l > 0 only slow it down
    with pytest.raises(slimjax.SlimjaxError, match="serving.efficiency: must be one of plain, calibrated, got 'fast'"):
        slimjax.parse({**spec, "serving": {"efficiency": "fast"}})
    from click.testing import CliRunner

    from slimjax.cli import main

    args = [
        "capacity",
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "H100-SXM",
        "--input-len",
        "512",
        "--output-len",
        "64",
        "--batch",
        "8",
    ]
    plain_out, cal_out = (CliRunner().invoke(main, args + extra).output for extra in ([], ["--calibrated"]))
    itl = lambda out: next(ln for ln in out.splitlines() if ln.strip().startswith("ITL "))  # noqa: E731
    assert itl(plain_out) != itl(cal_out)
