"""The capacity calculator on the grid: every §3–§5 variable at every point against the loop
references (MoE, MLA and tensor-parallel communication included), measured mode, B_cap within max_seqs, and bad
input."""

import itertools
import json
import math

import numpy as np
import pytest
import reference as ref
import xarray as xr

import slimjax
from slimjax import SlimjaxError
from slimjax.api import parse
from slimjax.inputs.catalog import resolve_gpu, resolve_model

TINY_SLIDING = {
    "name": "tiny-sliding",
    "num_hidden_layers": 6,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "vocab_size": 5000,
    "sliding_window": 300,
    "layer_types": ["sliding_attention", "full_attention"] * 3,
}
MEASURED = {"batch": 16, "request_rate": 3.0, "ttft_s": 0.4, "itl_s": 0.025}
SPEC = dict(
    models=["Llama-3.1-8B", "Mistral-7B-v0.1", "gemma-2-9b", "DeepSeek-V2", "Mixtral-8x7B", TINY_SLIDING],
    gpus=["H100-SXM", "L40S", {"name": "small", "tflops": 100, "bandwidth_tbs": 0.5, "memory_gib": 24}],
    batch=[1, 2, 5, 16, 64],
    input_len=[1, 200, 700, 5000],
    output_len=[1, 2, 150, 400],
    serving={
        "chunk_size": 256,
        "launch_overhead_s": 2e-5,
        "block_size": 32,
        "reserved_gib": 1.5,
        "kv_overhead": 1.05,
        "L40S": {"kv_dtype_bytes": "fp8", "compute_efficiency": 0.7},
        "Llama-3.1-8B": {"n_gpu": 2, "kv_replication": 2},
        "Mixtral-8x7B": {"n_gpu": 2},
    },
    measured={"Mixtral-8x7B": MEASURED},
    arrival_rate=[0.0, 0.5, 4.0, 40.0],
    advisor={"slo_s": 60},
    precision="float64",
)


@pytest.fixture(scope="module")
def ds():
    return slimjax.sweep(SPEC, quiet=True)


def _serving(sw, i, j):
    return {k: float(v[i, j]) for k, v in sw.serving.fields().items()}


def test_every_capacity_and_queue_variable_matches_loops(ds):
    sw = parse(SPEC)
    checked_queue = 0
    for (i, m), (j, g) in itertools.product(enumerate(sw.models), enumerate(sw.gpus)):
        arch = {k: float(getattr(sw.model, k)[i]) for k in sw.model.__dataclass_fields__}
        gpu = {k: float(getattr(sw.gpu, k)[j]) for k in sw.gpu.fields()}
        measured = MEASURED if m == "Mixtral-8x7B" else None
        for B, I, O in itertools.product(SPEC["batch"], SPEC["input_len"], SPEC["output_len"]):
            want, seqs, service = ref.capacity_point(arch, gpu, _serving(sw, i, j), B, I, O, measured)
            at = ds.isel(model=i, gpu=j).sel(batch=B, input_len=I, output_len=O)
            for name, value in want.items():
                got = float(at[name])
                if math.isnan(value):
                    assert math.isnan(got), (name, m, g, B, I, O)
                else:
                    assert got == pytest.approx(value, rel=1e-9), (name, m, g, B, I, O)
            slots = min(B, seqs)
            S = service(max(slots, 1))[2]
            if B > seqs:  # a batch limit that does not fit has no queue figures
                assert np.isnan(
                    at[["utilization", "p_wait", "wait_s", "response_s", "in_system"]].to_array().values
                ).all()
                continue
            for lam in SPEC["arrival_rate"]:
                q = ref.mmc(slots, S, lam) if slots == 0 or not math.isnan(S) else None
                qa = at.sel(arrival_rate=lam)
                if q is None:
                    assert math.isnan(float(qa.p_wait))
                    continue
                for name, value in q.items():
                    got = float(qa[name])
                    if math.isinf(value):
                        assert got == value, (name, m, g, B, I, O, lam)
                    else:
                        assert got == pytest.approx(value, rel=1e-9, abs=1e-300), (name, m, g, B, I, O, lam)
                # p90 wait (§5 "Wait quantiles"): P(W_q > t) = P_wait·exp(−(m/S − λ)t) = 0.1
                drain = slots / S - lam if slots > 0 else -1.0
                p90 = max(0.0, math.log(q["p_wait"] / 0.1) / drain) if drain > 0 and q["p_wait"] > 0 else math.inf
                p90 = 0.0 if drain > 0 and q["p_wait"] == 0 else p90
                assert float(qa.wait_p90_s) == pytest.approx(p90, rel=1e-9, abs=1e-300), (m, g, B, I, O, lam)
                checked_queue += 1
    assert checked_queue > 1000


def test_published_memory_figures_through_the_grid():
    out = slimjax.sweep(
        dict(
            models=["OPT-13b", "Mistral-7B-v0.1"],
            gpus=["A100-SXM-40GB"],
            batch=[1],
            input_len=[1024, 16384],
            output_len=[1024, 16384],
            serving={},
            advisor=False,
            precision="float64",
        ),
        quiet=True,
    )
    assert float(out.kv_bytes_per_token.sel(model="OPT-13b", gpu="A100-SXM-40GB")) == 819_200
    assert (
        float(out.seq_footprint_bytes.sel(model="OPT-13b", gpu="A100-SXM-40GB", input_len=1024, output_len=1024))
        == 1.5625 * 2**30
    )
    mistral = out.seq_footprint_bytes.sel(
        model="Mistral-7B-v0.1", gpu="A100-SXM-40GB", input_len=16384, output_len=16384
    )
    assert float(mistral) == 0.5 * 2**30  # 4 GiB without the rolling buffer: 8x smaller
    # OPT-13B on an A100-40GB: weights ~65 % of memory (PagedAttention §3)
    share = float(out.weights_bytes.sel(model="OPT-13b", gpu="A100-SXM-40GB")) / (40 * 2**30)
    assert 0.55 < share < 0.65


def test_dtypes_and_roofline_attrs(ds):
    assert ds.max_seqs.dtype == np.int64
    assert tuple(ds.p_wait.dims) == ("model", "gpu", "batch", "input_len", "output_len", "arrival_rate")
    # MoE and MLA are on the roofline (MODEL.md §4b), and say how
    # (NaN only where a prompt's own KV does not fit: DeepSeek-V2's 236 B weights fit none of these single GPUs)
    for m in ("DeepSeek-V2", "Mixtral-8x7B"):
        pre, pool = ds.prefill_s.sel(model=m), ds.kv_pool_bytes.sel(model=m)
        assert np.array_equal(
            np.isfinite(pre).values, np.broadcast_to((pool > 0).values[:, None], pre.shape) & np.isfinite(pre).values
        )
    assert np.isfinite(ds.prefill_s.sel(model="Mixtral-8x7B", gpu="H100-SXM")).all()  # 2 × H100 hold its 93 GB
    variants = json.loads(ds.itl_s.attrs["roofline_variant"])
    assert variants == {"DeepSeek-V2": "moe+mla", "Mixtral-8x7B": "moe"}
    # n_gpu = 2 on an inline GPU without a link figure: no all-reduce time, and the attr says so
    assert (
        "Llama-3.1-8B/small" in ds.itl_s.attrs["tp_communication"]
        and "H100-SXM" not in ds.itl_s.attrs["tp_communication"]
    )
    assert "Mixtral-8x7B/H100-SXM" in ds.service_s.attrs["measured_mode"]
    assert ds.itl_chunk_s.attrs["mode"].startswith("roofline only")
    measured = ds.service_s.sel(model="Mixtral-8x7B", gpu="H100-SXM")
    assert np.array_equal(np.isnan(measured.values), ~ds.fits.sel(model="Mixtral-8x7B", gpu="H100-SXM").values)
    assert json.loads(ds.attrs["serving"])["Llama-3.1-8B"]["L40S"]["kv_dtype_bytes"] == 1.0
    p = ds.p_wait.values
    assert np.all((p[~np.isnan(p)] >= 0) & (p[~np.isnan(p)] <= 1))


def test_no_queue_figures_when_nothing_fits(ds):
    # DeepSeek-V2 (236B) does not fit one GPU: no slots, no service time, so no queue figure at all (not a number)
    d = ds.sel(model="DeepSeek-V2", gpu="H100-SXM")
    assert int(d.max_seqs.max()) == 0
    for name in ("wait_s", "utilization", "p_wait", "response_s", "in_system", "service_s", "ttft_s"):
        assert np.isnan(d[name]).all(), name
    # where the batch fits, a queue past saturation is still +inf (no steady state), never NaN
    fit = ds.sel(model="Llama-3.1-8B", gpu="H100-SXM", arrival_rate=40.0)
    assert np.isinf(fit.wait_s.where(fit.fits & (fit.utilization >= 1))).any()


def test_b_cap_never_exceeds_max_seqs(ds):
    b_cap, seqs = ds.b_cap.values, ds.max_seqs.values
    assert np.all(b_cap <= seqs)
    assert np.any(b_cap > 0)
    # without serving, memory is still checked, at the serving defaults (and the attrs say so)
    no_cap = slimjax.sweep(
        {k: v for k, v in SPEC.items() if k not in ("serving", "measured", "arrival_rate")}, quiet=True
    )
    assert np.all(no_cap.b_cap.values <= no_cap.max_seqs.values)
    assert "defaults" in no_cap.max_seqs.attrs["serving"]
    assert np.any(no_cap.max_seqs.values < SPEC["batch"][-1])  # the memory limit really binds somewhere
    assert np.isnan(no_cap.slim_throughput.where(~no_cap.fits)).all() and "itl_s" not in no_cap


def test_slim_uses_serving_n_gpu_and_kv_dtype():
    one = {k: v for k, v in SPEC.items() if k != "measured"}
    one["serving"] = {k: v for k, v in SPEC["serving"].items() if k != "Mixtral-8x7B"}
    one.update(
        models=["Llama-3.1-8B"], gpus=["L40S"], batch=[1, 16], input_len=[700], output_len=[150], slim_variant="slim"
    )
    theta = parse(one).slim.table["L40S"]
    arch = dict(resolve_model("Llama-3.1-8B")[1], kv_dtype_bytes=1.0)
    l40s = resolve_gpu("L40S")[1]
    want = ref.slim(arch, l40s, theta, 16, 700, 150, n_gpu=2)
    # its physical floor on the same group: 2 GPUs, fp8 KV replicated twice with 5 % overhead
    pre_f, dec_f = ref.physical_floor(arch, l40s, 16, 700, 150, n_gpu=2, r=2.0, o=1.05)
    want["slim_prefill_s"], want["slim_decode_s"] = (
        max(want["slim_prefill_s"], pre_f),
        max(want["slim_decode_s"], dec_f),
    )
    want["slim_e2e_s"] = want["slim_prefill_s"] + want["slim_decode_s"] + theta["t_fixed"]
    want["slim_throughput"] = 16 * 850 / want["slim_e2e_s"]
    at = slimjax.sweep(one, quiet=True).isel(model=0, gpu=0).sel(batch=16, input_len=700, output_len=150)
    for k, v in want.items():
        assert float(at[k]) == pytest.approx(v, rel=1e-12), k


def test_float32_capacity_close_to_float64(ds):
    f32 = slimjax.sweep({**SPEC, "precision": "float32"}, quiet=True)
    np.testing.assert_array_equal(f32.max_seqs.values, ds.max_seqs.values)
    for k in ("itl_s", "ttft_s", "service_s", "wait_s", "p_wait"):
        assert f32[k].dtype == np.float32
        np.testing.assert_allclose(f32[k].values, ds[k].values.astype(np.float32), rtol=1e-6, atol=1e-30)


def test_zarr_round_trip_with_queue(ds, tmp_path):
    back = slimjax.sweep(SPEC, tmp_path / "c.zarr", quiet=True, memory_budget_bytes=300_000)
    assert back.load().equals(ds)
    xr.testing.assert_equal(xr.open_zarr(tmp_path / "c.zarr").load(), ds)


BASE = dict(models=["Llama-3.1-8B"], gpus=["H100-SXM"], batch=[1, 4], input_len=[64], output_len=[16])


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(serving={"chunk_size": -1}), r"serving.chunk_size: must be a non-negative integer"),
        (dict(serving={"block_size": 0}), r"serving.block_size: must be a positive integer"),
        (dict(serving={"block_size": -16}), r"serving.block_size: must be a positive integer"),
        (
            dict(serving={"gpu_memory_utilization": 1.2}),
            r"serving.gpu_memory_utilization: must be in \(0, 1\], got 1.2",
        ),
        (dict(serving={"gpu_memory_utilization": 0}), r"serving.gpu_memory_utilization: must be in \(0, 1\]"),
        (dict(serving={"kv_replication": 0.5}), r"serving.kv_replication: must be at least 1, got 0.5"),
        (dict(serving={"H100-SXM": {"n_gpu": 1.5}}), r"serving.H100-SXM.n_gpu: must be a positive integer"),
        (dict(serving={"kv_dtype_bytes": "fp6"}), r"serving.kv_dtype_bytes: unknown dtype 'fp6'"),
        (dict(serving={"chunksize": 8}), r"serving.chunksize: not a serving setting.*did you mean 'chunk_size'"),
        (dict(serving={"Llama-3.1-8B": {"chunk": 8}}), r"serving.Llama-3.1-8B.chunk: unknown key"),
        (dict(arrival_rate=[1.0, -2.0]), r"arrival_rate\[1\]: must be non-negative, got -2.0"),
        (dict(arrival_rate=[2.0, 1.0]), r"arrival_rate\[1\]: values must be strictly increasing"),
        (
            dict(measured={"batch": 8, "request_rate": 2.0, "ttft_s": 0.1}),
            r"measured.itl_s: missing: a measured block needs all of",
        ),
        (
            dict(measured={"H100-SXM": {"batch": 8, "request_rate": 0, "ttft_s": 0.1, "itl_s": 0.01}}),
            r"measured.H100-SXM.request_rate: must be a positive number",
        ),
        (dict(output_len=[0]), r"output_len\[0\]: must be positive, got 0"),
        (
            dict(
                models=[
                    {
                        "name": "mla",
                        "num_hidden_layers": 2,
                        "hidden_size": 64,
                        "num_attention_heads": 4,
                        "intermediate_size": 128,
                        "vocab_size": 100,
                        "kv_lora_rank": 32,
                    }
                ]
            ),
            r"models\[0\].qk_rope_head_dim: missing",
        ),
    ],
)
def test_bad_capacity_input(change, match):
    with pytest.raises(SlimjaxError, match=match):
        slimjax.sweep({**BASE, **change}, quiet=True)


def test_serving_precedence_model_over_gpu_over_top():
    sw = parse(
        {
            **BASE,
            "gpus": ["H100-SXM", "L40S"],
            "serving": {"chunk_size": 64, "L40S": {"chunk_size": 128}, "Llama-3.1-8B": {"block_size": 8}},
        }
    )
    assert sw.serving_table["Llama-3.1-8B"]["H100-SXM"]["chunk_size"] == 64
    assert sw.serving_table["Llama-3.1-8B"]["L40S"]["chunk_size"] == 128
    assert sw.serving_table["Llama-3.1-8B"]["L40S"]["block_size"] == 8
