"""Nothing lost: replacing a store survives a kill at every step, a killed run's leftovers are cleaned by
the next one (issue 15, items 1–2); an interrupted sweep's partial store is kept for --resume (issue 12)."""

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import slimjax
from slimjax.store.sink import clean_stale_siblings

SPEC = dict(models=["OPT-125m"], gpus=["H100-SXM"], batch=[1, 2, 4], input_len=[8], output_len=[4])

KILLER = textwrap.dedent("""
    import os, signal, sys, shutil
    import slimjax
    import slimjax.store.sink as sink
    step, out = int(sys.argv[1]), sys.argv[2]
    calls = {"replace": 0}
    real_replace, real_rmtree = os.replace, shutil.rmtree
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    def replace(a, b):
        if not (str(b) == out or ".old-" in str(b)):  # zarr's own atomic file writes
            return real_replace(a, b)
        calls["replace"] += 1
        if step == 1 and calls["replace"] == 1: die()   # nothing moved yet
        real_replace(a, b)
        if step == 2 and calls["replace"] == 1: die()   # old store aside, new one not in
        if step == 3 and calls["replace"] == 2: die()   # new one in, old one not deleted
    def rmtree(p, ignore_errors=False):
        if step == 4 and ".old-" in str(p):             # killed half way through deleting the old store
            files = sorted(q for q in __import__("pathlib").Path(p).rglob("*") if q.is_file())
            for q in files[: len(files) // 2]: q.unlink()
            die()
        real_rmtree(p, ignore_errors=ignore_errors)
    sink.os.replace = replace
    sink.shutil.rmtree = rmtree
    slimjax.sweep(dict(models=["OPT-125m"], gpus=["H100-SXM"], batch=[1, 2, 4], input_len=[16], output_len=[4]),
                  out, overwrite=True)
""")


@pytest.mark.parametrize("step", [1, 2, 3, 4])
def test_overwrite_survives_a_kill_at_every_step(tmp_path, step):
    out = tmp_path / "s.zarr"
    slimjax.sweep(SPEC, out)
    old = slimjax.store.open_store(out)["slim_throughput"].values.copy()
    run = subprocess.run([sys.executable, "-c", KILLER, str(step), str(out)], capture_output=True, text=True)
    assert run.returncode == -signal.SIGKILL, run.stderr
    # what the next run for this target does first
    done = clean_stale_siblings(out)
    names = sorted(p.name for p in tmp_path.iterdir())
    # killed before the new store moved in: its complete partial store stays, for --resume
    assert names == (["s.zarr", "s.zarr.partial"] if step in (1, 2) else ["s.zarr"]), (names, done)
    ds = slimjax.store.open_store(out)
    if int(ds.input_len.values[0]) == 8:  # the old store, whole
        np.testing.assert_array_equal(ds["slim_throughput"].values, old)
        assert step in (1, 2)
    else:  # the new store, whole
        assert int(ds.input_len.values[0]) == 16 and step in (3, 4)
        assert np.isfinite(ds["slim_throughput"].values).all() and (ds["b_cap"].values > 0).all()
    if step == 2:
        assert any(line.startswith("restored") for line in done)


def test_sigterm_keeps_the_partial_store_for_resume_and_stale_temp_stores_are_cleaned(tmp_path):
    out = tmp_path / "big.zarr"
    code = textwrap.dedent(f"""
        import slimjax
        slimjax.configure()
        slimjax.sweep(dict(models=["OPT-125m", "OPT-1.3b", "OPT-13b"], gpus=["H100-SXM", "A100-SXM-80GB", "L40S"],
                           batch={{"start": 1, "stop": 512}}, input_len={{"start": 16, "stop": 4096, "step": 16}},
                           output_len={{"start": 16, "stop": 2048, "step": 16}}), {str(out)!r},
                      memory_budget_bytes=2**22)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    journal = tmp_path / "big.zarr.partial" / "slimjax_blocks"
    while not (journal.is_dir() and any(journal.glob("*.json"))):
        assert proc.poll() is None and time.time() < deadline, "the sweep ended before a block was recorded"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "big.zarr.partial" in err and "--resume" in err  # the kept store is named, with how to continue
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.zarr.partial"]
    with pytest.raises(slimjax.SlimjaxError, match="--resume"):
        slimjax.sweep(SPEC, out)  # a fresh run does not silently discard it
    slimjax.sweep(SPEC, out, overwrite=True)  # --overwrite discards it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.zarr"]
    # a SIGKILLed older run's temp store (its PID gone) is removed by the next run for that target
    stale = tmp_path / "big.zarr.tmp-999999999"
    (stale / "x").mkdir(parents=True)
    with pytest.warns(RuntimeWarning, match="removed .*big.zarr.tmp-999999999"):
        slimjax.sweep(SPEC, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.zarr"]


def test_checks_come_before_work(tmp_path):
    from click.testing import CliRunner

    from slimjax.cli import main

    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text("models: [OPT-125m]\ngpus: [H100-SXM]\nbatch: [1, 2]\ninput_len: [8, 16]\noutput_len: [4]\n")
    out = tmp_path / "s.zarr"
    r = CliRunner().invoke(main, ["sweep", str(sweep_file), "--out", str(out), "--at", "12,4"])
    assert r.exit_code == 2 and "--at: input_len 12 is not on the grid (8, 16)" in r.output
    assert not out.exists() and list(tmp_path.iterdir()) == [sweep_file]  # nothing written
    # a billion-value axis is refused before it is built (this process stays small)
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(slimjax.SlimjaxError, match=r"batch: has 1,000,000,000 values; at most 1,000,000 per axis"):
        slimjax.parse(dict(SPEC, batch={"start": 1, "stop": 10**9}))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB


def test_context_beyond_the_model_is_flagged_per_cell_and_in_the_summary():
    ds = slimjax.sweep(
        dict(
            models=["Llama-3.1-8B", "OPT-125m"],
            gpus=["H100-SXM"],
            batch=[1, 8],
            input_len=[1024, 200_000],
            output_len=[256, 1024],
        ),
        quiet=True,
    )
    w = ds.within_context
    assert bool(w.sel(model="Llama-3.1-8B", input_len=1024, output_len=1024))  # 131072 context
    assert not bool(w.sel(model="Llama-3.1-8B", input_len=200_000, output_len=256))
    assert bool(w.sel(model="OPT-125m", input_len=1024, output_len=1024))  # exactly its 2048-token context
    assert not bool(w.sel(model="OPT-125m", input_len=200_000, output_len=256))
    notes = slimjax.summary(ds, 200_000, 256)["notes"]["note"].tolist()
    assert any(n.startswith("Llama-3.1-8B: I + O = 200256 tokens is beyond its context") for n in notes)


BASE = dict(gpus=["H100-SXM"], batch=[1], input_len=[8], output_len=[4])


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            dict(
                BASE,
                models=["OPT-125m"],
                gpus=[{"name": "x", "tflops": 100, "bandwidth_tbs": 1, "memory_gib": float("inf")}],
            ),
            r"gpus\[0\].memory_gib: must be a positive number, got inf",
        ),
        (
            dict(
                BASE,
                models=[
                    {
                        "name": "m",
                        "num_hidden_layers": 2,
                        "hidden_size": 100,
                        "num_attention_heads": 3,
                        "intermediate_size": 64,
                        "vocab_size": 10,
                    }
                ],
            ),
            r"models\[0\].num_attention_heads: 3 heads do not divide hidden_size 100; give head_dim",
        ),
        (
            dict(
                BASE,
                models=[
                    {
                        "name": "m",
                        "num_hidden_layers": 2,
                        "hidden_size": 64,
                        "num_attention_heads": 4,
                        "intermediate_size": 64,
                        "vocab_size": 10,
                        "num_key_value_head": 2,
                    }
                ],
            ),
            r"models\[0\].num_key_value_head: unknown key; did you mean 'num_key_value_heads'\?",
        ),
        (
            dict(BASE, models=["OPT-125m"], serving={"kv_dtype_bytes": 0}),
            r"serving.kv_dtype_bytes: must be a positive number of bytes per element or a dtype name",
        ),
    ],
)
def test_small_holes_are_errors_naming_the_field(spec, message):
    with pytest.raises(slimjax.SlimjaxError, match=message):
        slimjax.parse(spec)


def test_cli_words_and_data_from_any_folder(tmp_path, monkeypatch, shared_data):
    from click.testing import CliRunner

    from slimjax.cli import main
    from slimjax.fit.validate import default_trace_paths

    r = CliRunner().invoke(
        main,
        [
            "capacity",
            "--model",
            "OPT-125m",
            "--gpu",
            "H100-SXM",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--batch",
            "1",
            "--block-size",
            "0",
        ],
    )
    assert (
        r.exit_code == 2 and "--block-size: must be a positive integer, got 0" in r.output
    )  # the flag, not serving.block_size
    monkeypatch.delenv("SLIMJAX_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    assert all(p.exists() for p in default_trace_paths())  # no SLIMJAX_DATA, not in the repo root
    bench = slimjax.load_traces(shared_data / "measured" / "llm_inference_bench.csv")
    assert bench.attrs["dropped"]["throughput differs from B·(I + O)/latency by over 5 % (inconsistent row)"] > 300
    assert (
        not (bench.framework == "llama.cpp").any()
        or (
            (bench.throughput * bench.e2e_s / (bench.batch * (bench.input_len + bench.output_len)) - 1).abs() < 0.05
        ).all()
    )
    canonical = tmp_path / "t.csv"
    canonical.write_text(
        "model,gpu,batch,input_len,output_len,e2e_s\nLlama-3.1-8B,H100-SXM,8,100,50,1.5\n"
        "Llama-3.1-8B,TPUv9,8,100,50,1.5\n"
    )
    out = (
        CliRunner()
        .invoke(main, ["calibrate", str(canonical), "--out", str(tmp_path / "c.zarr"), "--group-by", "model"])
        .output
    )
    assert "1 rows kept of 2 read; dropped 1 (hardware 'TPUv9' unknown" in out


def test_quantized_checkpoints_are_counted_at_their_bytes(shared_data):
    from slimjax.inputs.catalog import resolve_model

    v3 = resolve_model(str(shared_data / "models" / "deepseek-ai--DeepSeek-V3_config.json"))[1]
    oss = resolve_model(str(shared_data / "models" / "openai--gpt-oss-120b_config.json"))[1]
    # fp8 with one float32 scale per 128 x 128 block (embeddings bf16); MXFP4 experts, bf16 attention and embeddings
    assert 600 < v3["n_params"] * v3["bytes_per_weight"] / 2**30 < 640
    assert 55 < oss["n_params"] * oss["bytes_per_weight"] / 2**30 < 66  # ~61 GiB, not 217
    assert v3["kv_dtype_bytes"] == 2 and oss["kv_dtype_bytes"] == 2  # the cache stays at the activations' dtype
    assert resolve_model("gpt-oss-120b")[1]["bytes_per_weight"] == oss["bytes_per_weight"]  # the catalog agrees


@pytest.mark.parametrize("name, bytes_", [("int4", 0.5), ("fp4", 0.5), ("mxfp4", 0.53125), ("nvfp4", 0.5625)])
def test_four_bit_dtype_names(name, bytes_):
    sw = slimjax.parse(dict(BASE, models=["Llama-3.1-8B"], serving={"weight_dtype_bytes": name}))
    assert float(sw.serving.bytes_per_weight[0, 0]) == bytes_


def test_low_precision_tensor_core_peaks_where_the_gpu_has_them():
    spec = dict(
        models=["Llama-3.1-8B"],
        gpus=["H100-SXM", "A100-SXM-80GB"],
        batch=[1],
        input_len=[16384],
        output_len=[2],
        advisor=False,
        precision="float64",
    )
    bf16 = slimjax.sweep({**spec, "serving": {}}, quiet=True).prefill_s
    fp8 = slimjax.sweep({**spec, "serving": {"weight_dtype_bytes": "fp8"}}, quiet=True).prefill_s
    ratio = (fp8 / bf16).squeeze()
    assert 0.45 < float(ratio.sel(gpu="H100-SXM")) < 0.55  # compute-bound prefill at 1979 instead of 989 TFLOP/s
    assert float(ratio.sel(gpu="A100-SXM-80GB")) > 0.95  # no FP8 Tensor Cores: bf16 peak


def test_default_coefficients_keep_gpu_order_consistent_with_specs():
    """Across the catalog: a GPU with at least the compute and bandwidth of another is never predicted
    slower by the shipped defaults (SLIM throughput; roofline ITL where its link is no slower either).
    The per-GPU sets (slim: per-gpu) break this, which is why they are opt-in."""
    from slimjax.inputs.catalog import gpu_catalog, resolve_gpu

    gpus = list(gpu_catalog())
    ds = slimjax.sweep(
        dict(
            models=["Llama-3.1-8B", "Llama-3.1-70B", "OPT-125m"],
            gpus=gpus,
            batch=[1, 16, 64],
            input_len=[128, 2048],
            output_len=[64, 512],
            advisor=False,
            serving={"n_gpu": 4},
            precision="float64",
        ),
        quiet=True,
    )
    spec = {g: resolve_gpu(g)[1] for g in gpus}
    pairs = [
        (a, b)
        for a in gpus
        for b in gpus
        if a != b
        and spec[a]["flops_per_s"] >= spec[b]["flops_per_s"]
        and spec[a]["bandwidth_bytes_per_s"] >= spec[b]["bandwidth_bytes_per_s"]
    ]
    assert len(pairs) > 10
    for a, b in pairs:  # (where both run: memory differs too, and a batch that does not fit has no figure)
        t_a, t_b = ds.slim_throughput.sel(gpu=a), ds.slim_throughput.sel(gpu=b)
        assert ((t_a >= t_b * (1 - 1e-12)) | t_a.isnull() | t_b.isnull()).all(), (a, b)
        assert (t_a.notnull() | t_b.isnull() | (ds.max_seqs.sel(gpu=a) < ds.max_seqs.sel(gpu=b))).all(), (a, b)
        if spec[a]["link_bytes_per_s"] >= spec[b]["link_bytes_per_s"]:  # at TP 4 the link counts too (§4c)
            i_a, i_b = ds.itl_s.sel(gpu=a), ds.itl_s.sel(gpu=b)
            assert ((i_a <= i_b * (1 + 1e-12)) | i_a.isnull() | i_b.isnull()).all(), (a, b)


def test_per_gpu_sets_are_opt_in_and_break_gpu_order():
    spec = dict(
        models=["Llama-3.1-70B"],
        gpus=["H100-SXM", "H200"],
        batch=[1],
        input_len=[1024],
        output_len=[256],
        advisor=False,
        precision="float64",
        serving={"n_gpu": 2},
    )  # (141 GB of weights: two GPUs)
    shared = slimjax.sweep(spec, quiet=True).slim_throughput.squeeze()
    per_gpu = slimjax.sweep({**spec, "slim": "per-gpu"}, quiet=True)
    assert float(shared.sel(gpu="H200")) >= float(shared.sel(gpu="H100-SXM"))
    assert float(per_gpu.slim_throughput.squeeze().sel(gpu="H200")) < float(
        per_gpu.slim_throughput.squeeze().sel(gpu="H100-SXM")
    )
    assert "not comparable" in per_gpu.attrs["slim_coefficients_source"]


def test_coefficients_a_sweep_can_trust(tmp_path):
    import pandas as pd

    from slimjax import calibrate
    from slimjax.store import write_dataset

    rng = np.random.default_rng(0)
    rows = []
    for b in (1, 4, 16, 64):
        for il in (128, 512, 2048):
            rows.append(
                dict(
                    model="Llama-3.1-8B",
                    gpu="H100-SXM",
                    n_gpu=4,
                    framework="x",
                    batch=b,
                    input_len=il,
                    output_len=128,
                    e2e_s=0.5 + 0.01 * b * rng.uniform(0.9, 1.1),
                    throughput=np.nan,
                    ttft_s=np.nan,
                    itl_s=np.nan,
                )
            )
    rows.append(dict(rows[0], model="OPT-125m"))  # one point for six coefficients
    traces = pd.DataFrame(rows)
    ds = calibrate(traces, group_by=["model", "gpu", "n_gpu"])
    one = ds.sel(model="OPT-125m", gpu="H100-SXM", n_gpu=4)
    assert not bool(one.converged) and np.isnan(one.coefficients.values).all() and np.isnan(float(one.mape_throughput))
    path = tmp_path / "c.zarr"
    write_dataset(ds, path)
    spec = dict(models=["Llama-3.1-8B"], gpus=["H100-SXM"], batch=[1, 256], input_len=[128], output_len=[128])
    # fitted at n_gpu = 4: a sweep at n_gpu = 1 is refused, not silently 3.7x off
    with pytest.raises(
        slimjax.SlimjaxError,
        match=r"slim.select.n_gpu: the coefficients were fitted at n_gpu = 4, but the sweep "
        r"runs Llama-3.1-8B on H100-SXM with n_gpu = 1",
    ):
        slimjax.parse({**spec, "slim": {"coefficients": str(path), "select": {"n_gpu": 4}}})
    with pytest.warns(RuntimeWarning, match=r"Llama-3.1-8B/H100-SXM .*extrapolates batch 1–256 beyond the fitted 1–64"):
        out = slimjax.sweep(
            {**spec, "serving": {"n_gpu": 4}, "slim": {"coefficients": str(path), "select": {"n_gpu": 4}}}
        )
    assert (
        "extrapolates batch"
        in __import__("json").loads(out.attrs["slim_coefficients_warnings"])["Llama-3.1-8B/H100-SXM"]
    )
    with pytest.raises(slimjax.SlimjaxError, match="no fit for OPT-125m on H100-SXM"):
        slimjax.parse(dict(spec, models=["OPT-125m"], serving={"n_gpu": 4}, slim={"coefficients": str(path)}))
