"""Issue 20: no impossible number. SLIM under a physical floor, the fit check everywhere, measurements checked
against physics, the advisor's SLO on the pair's own group, and bad input refused before any work."""

import json

import numpy as np
import pandas as pd
import pytest
import reference as ref
import yaml
from test_cli import run_here

import slimjax
from slimjax import SlimjaxError
from slimjax.inputs.catalog import gpu_catalog, model_catalog, resolve_gpu, resolve_model


def step_sum_floor(arch, gpu, B, I, O, n_gpu):
    """The floor by an explicit sum over every decode step (numpy, independent of slimjax's closed form)."""
    b_w = arch["bytes_per_weight"]
    F, BW = n_gpu * ref.peak_flops(gpu, b_w), n_gpu * gpu["bandwidth_bytes_per_s"]
    P_e = arch["n_ffn"] * arch["hidden"] * arch["expert_ffn_dim"]
    P_act = arch["n_params"] - arch["n_moe_layers"] * (arch["n_experts"] - arch["experts_per_token"]) * P_e
    a_pre, a_dec = ref._attention_coefficients(arch)
    moe = dict(E=arch["n_experts"], k=arch["experts_per_token"], routed=b_w * arch["n_moe_layers"] * P_e)
    M_W = arch["n_params"] * b_w
    pre = max(B * (2 * P_act * I + a_pre * I * I / 2) / F, ref.moe_weight_bytes(B * I, M_W, moe) / BW)
    T = I + np.arange(1, O, dtype=float)
    e_kv = ref.kv_bytes_per_layer_token(arch)
    L, L_s = arch["n_layers"], arch["n_sliding_layers"]
    kv = e_kv * ((L - L_s) * T + L_s * np.minimum(T, arch["window"]))
    dec = np.maximum(B * (2 * P_act + a_dec * T) / F, (ref.moe_weight_bytes(B, M_W, moe) + B * kv) / BW).sum()
    return pre, float(dec)


@pytest.fixture(scope="module")
def catalog_sweeps():
    """Every catalog model × GPU at B ∈ {1, 64}, I, O ∈ {128, 2048}, on the smallest group that holds it, in both
    variants (float64)."""
    spec = dict(
        models=list(model_catalog()),
        gpus=list(gpu_catalog()),
        batch=[1, 64],
        input_len=[128, 2048],
        output_len=[128, 2048],
        serving={"n_gpu": "auto"},
        advisor=False,
        precision="float64",
    )
    return {v: slimjax.sweep({**spec, "slim_variant": v}, quiet=True) for v in ("slim", "slim-kv")}


@pytest.mark.parametrize("variant", ["slim", "slim-kv"])
def test_every_time_is_at_least_the_peak_roofline_and_equal_where_flagged(catalog_sweeps, variant):
    ds = catalog_sweeps[variant]
    archs = {m: resolve_model(m)[1] for m in ds.model.values}
    gpus = {g: resolve_gpu(g)[1] for g in ds.gpu.values}
    checked = flagged = 0
    for m in ds.model.values:
        for g in ds.gpu.values:
            pair = ds.sel(model=m, gpu=g)
            n = float(pair.n_gpu)
            if n == 0:
                assert np.isnan(pair.slim_e2e_s).all()  # no group holds it: no figure
                continue
            for B in (1, 64):
                for I in (128, 2048):
                    for O in (128, 2048):
                        c = pair.sel(batch=B, input_len=I, output_len=O)
                        if not bool(c.fits):
                            assert np.isnan(float(c.slim_e2e_s)) and np.isnan(float(c.slim_throughput))
                            continue
                        pre_f, dec_f = step_sum_floor(archs[m], gpus[g], B, I, O, n)
                        pre, dec, e2e = float(c.slim_prefill_s), float(c.slim_decode_s), float(c.slim_e2e_s)
                        assert pre >= pre_f * (1 - 1e-12) and dec >= dec_f * (1 - 1e-12), (m, g, B, I, O)
                        assert e2e >= (pre_f + dec_f) * (1 - 1e-12)
                        assert float(c.slim_throughput) <= B * (I + O) / (pre_f + dec_f) * (1 + 1e-12)
                        flag = int(c.slim_at_floor)
                        if flag & 1:
                            assert pre == pytest.approx(pre_f, rel=1e-10), (m, g, B, I, O)
                        if flag & 2:
                            assert dec == pytest.approx(dec_f, rel=1e-10), (m, g, B, I, O)
                        flagged += flag > 0
                        checked += 1
    assert checked > 1500 and flagged > 0
    assert ds.slim_at_floor.attrs["flag_meanings"] == "prefill_at_floor decode_at_floor"
    assert ds.slim_at_floor.attrs["nonzero"] == int((ds.slim_at_floor > 0).sum())


def test_hand_case_qwen2_7b_on_l40s_decodes_no_faster_than_its_weights_stream():
    # 15.2 GB of bf16 weights read 255 times at 864 GB/s: ≥ 4.49 s, whatever SLIM's α, γ say (it said 2.10 s)
    p = slimjax.point("Qwen2-7B", "L40S", 1, 1024, 256, slim="shared", slim_variant="slim")
    weights, bw = p["weights_bytes"], resolve_gpu("L40S")[1]["bandwidth_bytes_per_s"]
    assert weights == pytest.approx(15.23e9, rel=1e-3) and bw == 864e9
    assert p["slim_decode_s"] >= 255 * weights / bw
    assert p["slim_at_floor"] == 2 and p["fits"] == 1
    assert p["slim_throughput"] < 1280 / (255 * weights / bw)  # below the weights-only bound (~280 tokens/s)


def test_prefill_floor_is_flops_over_peak():
    # one 8192-token prompt of Llama-3.1-8B: 2·P·I + attention over peak bf16 FLOP/s (989 TFLOP/s on H100)
    arch = resolve_model("Llama-3.1-8B")[1]
    p = slimjax.point("Llama-3.1-8B", "H100-SXM", 1, 8192, 1, slim={"eta_c": 1.0}, slim_variant="slim")
    ops = 2 * arch["n_params"] * 8192 + 4 * arch["n_layers"] * arch["n_heads"] * arch["head_dim"] * 8192**2 / 2
    assert p["slim_prefill_s"] >= ops / 989e12 * (1 - 1e-9)


def test_nan_wherever_the_batch_does_not_fit_with_and_without_serving():
    base = dict(
        models=["Llama-3.1-70B", "Llama-3.1-8B"],
        gpus=["H100-SXM", "L40S"],
        batch=[1, 8, 64, 512],
        input_len=[1024, 8192],
        output_len=[256, 4096],
        advisor={"slo_s": 100},
        precision="float64",
    )
    for spec in (base, {**base, "serving": {"n_gpu": 2}, "arrival_rate": [0.5, 4.0]}):
        ds = slimjax.sweep(spec, quiet=True)
        fits = ds.fits
        assert 0 < int(fits.sum()) < fits.size
        for name, var in ds.data_vars.items():
            if var.attrs.get("units") not in ("s", "tokens/s", "requests/s", "requests") and name not in (
                "utilization",
                "p_wait",
            ):
                continue
            if "batch" not in var.dims or "output_len" not in var.dims:
                continue
            unfit = ~fits.broadcast_like(var)
            assert bool(np.isnan(var.where(unfit)).where(unfit, True).all()), name
            assert bool(np.isfinite(var.where(~unfit)).where(~unfit, True).all()) or name in (
                "wait_s",
                "wait_p90_s",
                "response_s",
                "in_system",
            ), name
        assert (ds.b_cap <= ds.max_seqs).all()
    # no serving block: memory at the serving defaults, said in attrs; 70B does not fit one GPU
    ds = slimjax.sweep(base, quiet=True)
    assert "defaults" in ds.max_seqs.attrs["serving"] and int(ds.max_seqs.sel(model="Llama-3.1-70B").max()) == 0
    assert (
        np.isnan(ds.slim_throughput.sel(model="Llama-3.1-70B")).all()
        and (ds.b_cap.sel(model="Llama-3.1-70B") == 0).all()
    )


def test_point_and_capacity_say_fits_and_give_no_number_for_what_cannot_run():
    p = slimjax.point("Llama-3.1-70B", "H100-SXM", 64, 1024, 256)  # 141 GB of weights on one 80 GB GPU
    assert p["fits"] == 0 and np.isnan(p["slim_throughput"]) and np.isnan(p["slim_e2e_s"])
    c = slimjax.capacity("Llama-3.1-70B", "H100-SXM", 4096, 4096, 64, arrival_rate=1.0)
    assert c["fits"] == 0 and all(
        np.isnan(c[k]) for k in ("ttft_s", "itl_s", "service_s", "wait_s", "utilization", "p_wait")
    )
    # the smallest TP degree that holds this batch, by brute force over the degrees
    need = next(
        n
        for n in (1, 2, 4, 8)
        if slimjax.capacity("Llama-3.1-70B", "H100-SXM", 4096, 4096, 64, serving={"n_gpu": n})["fits"]
    )
    assert c["n_gpu_to_fit_batch"] == need and need > c["n_gpu_to_fit"]  # one sequence fits on fewer
    verdict = slimjax.api.capacity_verdict(c, 4096, 4096)
    assert f"the smallest --n-gpu that fits batch 64 is {need}" in verdict and "exceed usable memory" in verdict
    cards = dict(slimjax.capacity_cards(c))
    assert cards["KV pool"].startswith("none: weights exceed usable memory by 59.41 GiB")
    assert all(
        cards[k] == "not runnable (does not fit)"
        for k in ("Wait", "Utilization", "P(wait)", "TTFT", "Token throughput")
    )
    assert not any(ch == "-" for v in cards.values() for ch in v[:1])  # no negative size


def test_report_draws_nothing_beyond_the_kv_pool():
    from slimjax.report.figures import throughput_figures

    ds = slimjax.sweep(
        dict(
            models=["Llama-3.1-8B"],
            gpus=["L40S"],
            batch=[1, 16, 64, 256, 1024],
            input_len=[8192],
            output_len=[4096],
            advisor=False,
        ),
        quiet=True,
    )
    seqs = int(ds.max_seqs.squeeze())
    assert seqs < 1024
    fig = throughput_figures(ds, (8192, 4096))[0].figure
    line = next(ln for ln in fig.axes[0].lines if ln.get_label() == "SLIM throughput")
    x, y = line.get_xdata(), line.get_ydata()
    assert np.isnan(y[x > seqs]).all() and np.isfinite(y[x <= seqs]).all()


def test_the_reader_drops_rows_faster_than_physics(shared_data):
    df = slimjax.load_traces(shared_data / "measured" / "llm_inference_bench.csv")
    dropped = df.attrs["dropped"]
    cause = next(k for k in dropped if k.startswith("throughput above the 100 %-of-peak roofline"))
    assert dropped[cause] == 15
    # the example: Qwen2-7B, H100, TensorRT-LLM, B 32, I = O = 2048 at 77,270 tokens/s (8x the roofline)
    gone = df[
        (df.model == "Qwen2-7B")
        & (df.framework == "TensorRT-LLM")
        & (df.batch == 32)
        & (df.input_len == 2048)
        & (df.n_gpu == 1)
    ]
    assert gone.empty
    # every kept row is within the tolerance of its own 100 %-of-peak roofline
    from slimjax.inputs.physics import TOLERANCE, row_floors

    f = row_floors(df)
    ceiling = df.batch * (df.input_len + df.output_len) / (f["prefill"] + f["decode"])
    assert (df.throughput <= ceiling * (1 + TOLERANCE)).all()
    # and the command line prints the count
    r = run_here(
        "validate",
        str(shared_data / "measured" / "llm_inference_bench.csv"),
        "--methods",
        "roofline",
        "--scenarios",
        "same-curve",
        "--exclude",
        "model != 'OPT-6.7b'",
    )
    assert "dropped 15 (throughput above the 100 %-of-peak roofline" in r.stdout


def test_an_offline_batch_whose_prefill_beats_peak_is_dropped(shared_data):
    """splitwise's Llama-2-70B batch of 64 × 512 prompts at TP 2 reports a 0.79 s prompt_time on A100 (and 0.36 s on
    H100): B·2P·I / (2 GPUs × peak) alone is 7.3 s (2.3 s): not a batch prefill of that size. Dropped, counted, the
    rest kept; the floor is the batch's own (every kept offline TTFT is at least B prompts' peak prefill)."""
    from slimjax.inputs.physics import TOLERANCE, row_floors

    df = slimjax.load_traces(shared_data / "measured" / "splitwise_perf_model.csv")
    cause = next(k for k in df.attrs["dropped"] if k.startswith("TTFT of an offline batch below"))
    assert df.attrs["dropped"][cause] == 15  # three configurations × 5 repeats
    big = df[(df.batch == 64) & (df.n_gpu == 2) & (df.model == "Llama-2-70b")]
    assert big.empty
    assert len(df[(df.batch == 64) & (df.n_gpu == 4)]) > 0
    pre_b = row_floors(df)["prefill"]
    assert (df.ttft_s * (1 + TOLERANCE) >= pre_b).all()
    P, B, I = 68.98e9, 64, 512  # Llama-2-70B, by hand: its prefill FLOPs over two A100s' dense peak
    assert 2 * P * B * I / (2 * 312e12) > 7.0 > 0.79


def test_calibration_on_cleaned_data_reports_no_absurd_fit_as_converged(shared_data):
    from slimjax.fit.slim import ABSURD_B0, calibrate

    df = slimjax.load_traces(shared_data / "measured" / "llm_inference_bench.csv")
    ds = calibrate(df, group_by=["model"], variant="recommended")
    b0 = ds.coefficients.sel(param="B0")
    absurd = b0 > ABSURD_B0 * ds.batch_max
    assert bool(absurd.any())  # pooled over GPUs and TP, the decode term runs off along B0·α = const
    assert not bool((ds.converged & absurd).any())
    assert not bool(ds.converged.sel(model="Qwen2-7B"))


def test_a_store_pooled_over_tp_degrees_is_refused_for_one_degree(tmp_path):
    from fitmodel import slim_model
    from test_calibrate import TRUE

    from slimjax.fit.slim import calibrate
    from slimjax.store import write_dataset

    rows = [
        dict(
            model="Llama-3.1-8B",
            gpu="H100-SXM",
            n_gpu=n,
            framework="x",
            batch=b,
            input_len=i,
            output_len=128,
            e2e_s=slim_model("Llama-3.1-8B", "H100-SXM", b, i, 128, TRUE, n)["slim_e2e_s"],
            throughput=np.nan,
            ttft_s=np.nan,
            itl_s=np.nan,
        )
        for n in (1, 2, 4)
        for b in (1, 8, 32)
        for i in (128, 1024)
    ]
    ds = calibrate(pd.DataFrame(rows), group_by=["model", "gpu"])
    path = tmp_path / "pooled.zarr"
    write_dataset(ds, path)
    spec = dict(
        models=["Llama-3.1-8B"], gpus=["H100-SXM"], batch=[1, 8], input_len=[128], output_len=[128], slim=str(path)
    )
    with pytest.raises(SlimjaxError, match=r"pooled over n_gpu 1–4, but the sweep runs n_gpu = 1"):
        slimjax.parse(spec)
    # fitted at one degree (not a group dim): a sweep at another is refused, at the same one it runs
    one = calibrate(pd.DataFrame([r for r in rows if r["n_gpu"] == 2]), group_by=["model", "gpu"])
    path2 = tmp_path / "tp2.zarr"
    write_dataset(one, path2)
    with pytest.raises(SlimjaxError, match="fitted at n_gpu = 2"):
        slimjax.parse({**spec, "slim": str(path2)})
    assert slimjax.parse({**spec, "slim": str(path2), "serving": {"n_gpu": 2}}).serving.n_gpu[0, 0] == 2


@pytest.mark.parametrize("variant", ["slim", "slim-kv"])
def test_the_slo_reference_is_computed_on_the_pairs_own_group(variant):
    spec = dict(
        models=["Llama-3.1-70B"],
        gpus=["H100-SXM"],
        batch=[1, 8, 32],
        input_len=[1024],
        output_len=[256],
        serving={"n_gpu": 2},
        slim_variant=variant,
        precision="float64",
    )
    ds = slimjax.sweep(spec, quiet=True)
    slo = json.loads(ds.b_cap.attrs["slo_s"])["Llama-3.1-70B"]["H100-SXM"]
    at_ref = slimjax.point("Llama-3.1-70B", "H100-SXM", 32, 2, 128, slim_variant=variant, serving={"n_gpu": 2})
    assert slo == pytest.approx(4 * at_ref["slim_e2e_s"], rel=1e-12)
    one_gpu = slimjax.point("Llama-3.1-70B", "H100-SXM", 32, 2, 128, slim_variant=variant, serving={"n_gpu": 1})
    assert np.isnan(one_gpu["slim_e2e_s"])  # (the weights do not fit one GPU: no reference there at all)
    # B_cap meets that SLO
    b = int(ds.b_cap.squeeze())
    assert b == 0 or float(ds.slim_e2e_s.sel(batch=b).squeeze()) <= slo


def test_predict_is_floored_and_checks_its_points():
    from fitmodel import slim_model
    from test_calibrate import TRUE

    from slimjax.fit.slim import calibrate, predict

    rows = pd.DataFrame(
        [
            dict(model="Llama-3.1-8B", gpu="H100-SXM", n_gpu=1, framework="x", batch=b, input_len=i, output_len=o)
            for b in (1, 4, 16, 64)
            for i in (128, 2048)
            for o in (32, 256)
        ]
    )
    rows["e2e_s"] = [
        slim_model("Llama-3.1-8B", "H100-SXM", r.batch, r.input_len, r.output_len, TRUE)["slim_e2e_s"]
        for r in rows.itertuples()
    ]
    rows["throughput"] = rows.batch * (rows.input_len + rows.output_len) / rows.e2e_s
    rows["ttft_s"] = rows["itl_s"] = np.nan
    ds = calibrate(rows, group_by=["model", "gpu"])
    p = predict(ds, rows)
    floor = p.assign(w=resolve_model("Llama-3.1-8B")[1]["n_params"] * 2)
    # decode reads the weights at least once per step at 3.35 TB/s
    assert (p.pred_e2e_s >= (floor.output_len - 1) * floor.w / 3.35e12 * (1 - 1e-9)).all()
    assert p.pred_at_floor.any() and (p.pred_throughput_hi >= p.pred_throughput).all()
    with pytest.raises(SlimjaxError, match=r"points.batch: must be a positive integer, got -3"):
        predict(ds, rows.assign(batch=-3))
    with pytest.raises(SlimjaxError, match=r"points.model: 'Qwen2-7B' has no coefficients in the store"):
        predict(ds, rows.assign(model="Qwen2-7B"))


SMALL = dict(models=["Llama-3.1-8B"], gpus=["H100-SXM"], batch=[1, 8], input_len=[128], output_len=[64], advisor=False)


def _bad_inputs(tmp, data):
    """(name, argv, path that must not exist afterwards) for every bad input of issue 20's item 5."""
    good = tmp / "good.yaml"
    good.write_text(yaml.safe_dump(SMALL))
    cfg = tmp / "cfg.json"
    cfg.write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 2,
                "intermediate_size": 128,
                "vocab_size": 100,
            }
        )
    )

    def spec(name, **change):
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**SMALL, **change}))
        return str(path)

    unrelated = tmp / "unrelated.csv"
    unrelated.write_text("a,b\n1,2\n")
    one_row = tmp / "one.csv"
    one_row.write_text("model,gpu,batch,input_len,output_len,e2e_s\nLlama-3.1-8B,H100-SXM,1,128,64,1.5\n")
    study = tmp / "study.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                workloads=[{"name": "w", "input_len": 512, "output_len": 128}],
                rates=[1.0],
                models=["Llama-3.1-8B"],
                gpus=["H100-SXM"],
                slo={"itl_s": 0.05},
            )
        )
    )
    store = tmp / "s.zarr"
    return [
        ("procure unwritable --out", ["procure", str(study), "--out", "/proc/p.zarr"], "/proc/p.zarr"),
        ("report unwritable --out", ["report", str(store), "--out", "/proc/r"], "/proc/r"),
        (
            "validate unwritable --out",
            ["validate", str(data / "measured" / "llm_inference_bench_ttft_e2e.csv"), "--out", "/proc/v.csv"],
            "/proc/v.csv",
        ),
        ("advise unwritable --out", ["advise", "--data", str(data), "--out", "/proc/a.csv"], "/proc/a.csv"),
        (
            "unreachable --dask-address",
            [
                "sweep",
                str(good),
                "--out",
                str(tmp / "d1.zarr"),
                "--scheduler",
                "dask",
                "--dask-address",
                "tcp://127.0.0.1:9",
            ],
            str(tmp / "d1.zarr.partial"),
        ),
        (
            "malformed --dask-address",
            [
                "sweep",
                str(good),
                "--out",
                str(tmp / "d2.zarr"),
                "--scheduler",
                "dask",
                "--dask-address",
                "not an address",
            ],
            str(tmp / "d2.zarr.partial"),
        ),
        (
            "serving key in a model mapping",
            [
                "sweep",
                spec("m1", models=[{"name": "x", "config": str(cfg), "weight_dtype_bytes": 1}]),
                "--out",
                str(tmp / "m1.zarr"),
            ],
            str(tmp / "m1.zarr"),
        ),
        (
            "unknown key in a model mapping",
            [
                "sweep",
                spec("m2", models=[{"name": "x", "config": str(cfg), "bogus_key": 1}]),
                "--out",
                str(tmp / "m2.zarr"),
            ],
            str(tmp / "m2.zarr"),
        ),
        (
            "advisor epsilon 2",
            ["sweep", spec("e", advisor={"epsilon": 2}), "--out", str(tmp / "e.zarr")],
            str(tmp / "e.zarr"),
        ),
        ("report on an unrelated CSV", ["report", str(unrelated), "--out", str(tmp / "rep")], str(tmp / "rep")),
        (
            "calibrate on a one-row trace",
            ["calibrate", str(one_row), "--format", "canonical", "--out", str(tmp / "c.zarr")],
            str(tmp / "c.zarr"),
        ),
        (
            "capacity negative batch",
            [
                "capacity",
                "--model",
                "Llama-3.1-8B",
                "--gpu",
                "H100-SXM",
                "--input-len",
                "10",
                "--output-len",
                "5",
                "--batch",
                "-3",
            ],
            None,
        ),
        (
            "sweep --report unwritable",
            ["sweep", str(good), "--out", str(tmp / "r.zarr"), "--report", "/proc/rr"],
            str(tmp / "r.zarr"),
        ),
    ]


def test_every_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, shared_data):
    expect = {
        "procure unwritable --out": "out: cannot write a store in '/proc'",
        "report unwritable --out": "--out: cannot write the report in '/proc'",
        "validate unwritable --out": "--out: cannot write the file in '/proc'",
        "advise unwritable --out": "--out: cannot write the file in '/proc'",
        "unreachable --dask-address": "--dask-address: no Dask scheduler answers at 'tcp://127.0.0.1:9'",
        "malformed --dask-address": "--dask-address: 'not an address' is not a scheduler address",
        "serving key in a model mapping": "models[0].weight_dtype_bytes: 'weight_dtype_bytes' is a serving key",
        "unknown key in a model mapping": "models[0].bogus_key: unknown key beside config",
        "advisor epsilon 2": "advisor.epsilon: must be in [0, 1), got 2",
        "report on an unrelated CSV": "not a `slimjax validate --out` CSV: no column 'method'",
        "calibrate on a one-row trace": "traces: no group has enough rows to fit 6 coefficients",
        "capacity negative batch": "--batch: must be positive, got -3",
        "sweep --report unwritable": "--report: cannot write the report in '/proc'",
    }
    cases = _bad_inputs(tmp_path, shared_data)
    assert {c[0] for c in cases} == set(expect)
    for name, argv, path in cases:
        r = run_here(*argv)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2, (name, r.stdout, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and expect[name] in lines[0], (name, r.stderr)
        assert "Traceback" not in r.stdout + r.stderr, name
        # nothing printed but the error (calibrate says first what it read: a line per trace file)
        assert all("rows kept of" in ln for ln in r.stdout.splitlines() if ln.strip()), (name, r.stdout)
        if path is not None:
            from pathlib import Path

            assert not Path(path).exists(), (name, path)


def test_number_formats_are_plain():
    from slimjax.report.cards import _quantity

    assert _quantity(1e-21, "s") == "< 1 ns" and _quantity(0.0, "s") == "0 s"
    assert _quantity(0.0123, "s") == "12.3 ms" and _quantity(123456.7, "s") == "123,457 s"
    assert _quantity(12345678.9, "tokens/s") == "12,345,679 tokens/s" and "e" not in _quantity(3.2e-5, "s")
