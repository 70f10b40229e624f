"""Reports (issue 13): every figure kind from small stores, a self-contained page whose images decode as PNG,
figures that follow the store's numbers, and the page opened in a real (headless) Chromium."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

import slimjax
from slimjax.cli import main
from slimjax.report import figures as F
from slimjax.studies.procure import figures as PF

SWEEP = dict(
    models=["OPT-1.3b", "Llama-3.1-8B", "Llama-3.1-405B"],
    gpus=["H100-SXM", "L40S"],
    batch=[1, 2, 4, 8, 16, 32, 64],
    input_len=[128, 1024, 4096],
    output_len=[64, 256],
    serving=dict(n_gpu=1),
    arrival_rate=[0.1, 1.0, 10.0],
    agents=dict(research=dict(stages=2, calls_per_stage=4)),
    precision="float64",
)
STUDY = dict(
    workloads=[dict(name="chat", input_len=1024, output_len=256)],
    rates=[1.0, 8.0],
    models=["Llama-3.1-8B"],
    gpus=["H100-SXM", "L40S"],
    tp=[1, 2],
    batch=[4, 16, 64],
    slo=dict(ttft_s=2.0, itl_s=0.05),
    sizing="screen",
)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("stores")
    slimjax.sweep(SWEEP, root / "sweep.zarr")
    slimjax.procure(STUDY, root / "study.zarr")
    traces = slimjax.load_traces(shared_data / "measured" / "llm_inference_bench.csv")
    traces = traces[(traces.framework == "vLLM") & (traces.n_gpu == 1)].head(60)
    coeffs = slimjax.calibrate(traces, group_by=("model", "gpu"))
    from slimjax.store import write_dataset

    write_dataset(coeffs, root / "coeffs.zarr")
    # a validate --out CSV in its documented columns (a few rows, two methods)
    rows = traces.head(12)
    pred = pd.concat(
        [
            rows.assign(
                method=m,
                scenario="same-curve",
                fold="x",
                pred_throughput=rows.throughput * f,
                pred_e2e_s=rows.e2e_s / f,
                pred_throughput_lo=rows.throughput * f * 0.8,
                pred_throughput_hi=rows.throughput * f * 1.2,
            )
            for m, f in (("slim", 1.1), ("slim-kv", 0.95))
        ]
    )
    pred.to_csv(root / "pred.csv", index=False)
    return root


def test_every_figure_kind_comes_from_a_store(stores):
    ds = slimjax.store.open_store(stores / "sweep.zarr")
    kinds = {f.key for make in F.SWEEP_KINDS for f in make(ds)}
    assert {
        "throughput_vs_batch",
        "roofline",
        "b_cap_heatmap",
        "max_seqs_heatmap",
        "queue_wait",
        "agent_research",
    } <= kinds
    study = slimjax.store.open_store(stores / "study.zarr")
    assert [f.key for f in PF.procurement_figures(study)] == ["procurement_chat"]
    assert len(PF.procurement_table(study)) == 2
    coeffs = slimjax.store.open_store(stores / "coeffs.zarr")
    assert [f.key for f in F.calibration_figures(coeffs)] == ["calibration_mape"]
    pred = pd.read_csv(stores / "pred.csv")
    assert [f.key for f in F.validation_figures(pred)] == ["validation"]
    assert set(F.validation_table(pred).columns) >= {"scenario", "slim", "slim-kv"}


@pytest.fixture(scope="module")
def report_dir(stores):
    out = stores / "report"
    r = CliRunner().invoke(
        main,
        [
            "report",
            str(stores / "sweep.zarr"),
            str(stores / "study.zarr"),
            str(stores / "coeffs.zarr"),
            str(stores / "pred.csv"),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    return out


def test_the_page_is_self_contained_and_every_image_is_a_png(stores, report_dir):
    out = report_dir
    page = (out / "index.html").read_text()
    assert "http" not in page and "<script" not in page.lower()
    sources = re.findall(r"src='([^']*)'", page) + re.findall(r'src="([^"]*)"', page)
    assert len(sources) >= 9 and all(s.startswith("data:image/png;base64,") for s in sources)
    for s in sources:
        image = imread(io.BytesIO(base64.b64decode(s.split(",", 1)[1])), format="png")
        assert image.ndim == 3 and image.shape[0] > 100
    assert len(list(out.glob("*.png"))) == len(sources)
    assert "Chosen fleet" in page and "Fitted coefficients" in page and "Throughput MAPE" in page
    bad = CliRunner().invoke(main, ["report", str(stores / "sweep.zarr"), "--out", str(out), "--at", "999,256"])
    assert bad.exit_code == 2 and "input_len 999 is not on the grid" in bad.output


def test_figures_follow_the_stored_numbers(stores):
    ds = slimjax.store.open_store(stores / "sweep.zarr").load()
    before = F.throughput_figures(ds, (1024, 256))[0].figure.axes[0].lines[0].get_ydata().copy()
    m, g = F._pairs(ds)[0]
    ds["slim_throughput"].loc[dict(model=m, gpu=g, input_len=1024, output_len=256, batch=8)] = 123.0
    after = F.throughput_figures(ds, (1024, 256))[0].figure.axes[0].lines[0].get_ydata()
    changed = np.flatnonzero(before != after)
    assert list(changed) == [list(ds.batch.values).index(8)] and after[changed[0]] == 123.0


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_a_real_browser_renders_the_page(report_dir, tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium not found; .ci/run installs Debian's chromium package")
        pytest.skip("Chromium not found (apt-get install chromium)")
    out = report_dir
    shot = tmp_path / "shot.png"
    run = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            "--window-size=1400,2400",
            f"file://{out / 'index.html'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), run.stderr[-2000:]
    console = [
        line for line in run.stderr.splitlines() if "CONSOLE" in line and ("ERROR" in line or "Uncaught" in line)
    ]
    assert not console, console
    pixels = imread(str(shot))
    assert pixels.std() > 0.05  # not blank: text and plots


def test_intervals_band_and_the_report_options_of_sweep_and_procure(stores, tmp_path):
    import yaml

    coeffs = slimjax.store.open_store(stores / "coeffs.zarr")
    pairs = coeffs["coefficients"].isel(param=0).to_dataframe().dropna().reset_index()[["model", "gpu"]].iloc[:1]
    m, g = pairs.iloc[0]
    spec = dict(
        models=[m],
        gpus=[g],
        batch=[1, 2, 4, 8, 16, 32],
        input_len=[128, 512],
        output_len=[128, 256],
        slim=str(stores / "coeffs.zarr"),
    )
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(
        main, ["sweep", str(path), "--out", str(tmp_path / "s.zarr"), "--report", str(tmp_path / "rep"), "--quiet"]
    )
    assert r.exit_code == 0, r.output
    ds = slimjax.store.open_store(tmp_path / "s.zarr")
    fig = F.throughput_figures(ds, (512, 256))[0].figure
    band = [c for c in fig.axes[0].collections if c.get_label() == "90 % interval"]
    assert band and (tmp_path / "rep" / "s_throughput_vs_batch.png").exists()
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    r = CliRunner().invoke(main, ["procure", str(study), "--report", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--report needs --out" in r.output and not (tmp_path / "x").exists()


def test_validation_figure_draws_the_transfer_interval_where_the_csv_has_one():
    rows = pd.DataFrame(
        dict(
            model="m",
            gpu="g",
            batch=[1, 8, 32],
            input_len=128,
            output_len=128,
            throughput=[100.0, 700.0, 2000.0],
            e2e_s=1.0,
            scenario="gpu-transfer",
            fold="f",
        )
    )
    fit = rows.assign(
        method="slim",
        pred_throughput=rows.throughput * 1.1,
        pred_throughput_lo=rows.throughput,
        pred_throughput_hi=rows.throughput * 1.2,
    )
    wide = fit.assign(
        method="slim-kv",
        pred_throughput_transfer_lo=rows.throughput * 0.5,
        pred_throughput_transfer_hi=rows.throughput * 2.0,
    )
    fig = F.validation_figures(pd.concat([fit, wide], ignore_index=True))[0].figure
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels == ["slim (90 % interval)", "slim-kv (90 % transfer interval)"]
    # the drawn bar is the transfer interval's
    bars = [c for c in fig.axes[0].containers if c.get_label() == "slim-kv (90 % transfer interval)"][0]
    segments = bars.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segments] == [(50.0, 200.0), (350.0, 1400.0), (1000.0, 4000.0)]


def test_figures_draw_inline_models_from_the_store_with_no_catalog_lookup():
    """A model and GPU given inline (no catalog entry) get their roofline panel: the points are the stored
    times against the work of a prefill pass and a decode step, 2·P·I + 4·L·H·d·I²/2 and B·(2·P + 4·L·H·d·T),
    on the specs the store recorded; and the report floor never imports the catalog."""
    import ast
    import json
    from pathlib import Path

    inline = dict(
        name="lab-model", num_hidden_layers=4, hidden_size=512, num_attention_heads=8, num_key_value_heads=8,
        head_dim=64, intermediate_size=1024, vocab_size=32000,
    )  # fmt: skip
    gpu = dict(name="lab-gpu", tflops=100.0, bandwidth_tbs=1.0, memory_gib=16)
    spec = dict(models=[inline], gpus=[gpu], batch=[1, 32], input_len=[128, 1024], output_len=[64], serving={})
    ds = slimjax.sweep(spec, quiet=True, memory_budget_bytes=2**24)
    figs = F.roofline_figures(ds)
    assert [f.key for f in figs] == ["roofline"]
    ax = figs[0].figure.axes[0]
    prefill, decode = (c.get_offsets() for c in ax.collections[:2])
    stored = json.loads(ds.attrs["specs"])["models"]["lab-model"]
    P, L, H, d = stored["n_params"], 4, 8, 64
    I = ds["input_len"].values.astype(float)
    c = ds.sel(model="lab-model", gpu="lab-gpu", output_len=64)
    np.testing.assert_allclose(prefill[:, 1], (2 * P * I + 4 * L * H * d * I**2 / 2) / c["prefill_s"].values, rtol=1e-6)
    T = I + 64 / 2
    np.testing.assert_allclose(
        decode[:, 1], 32 * (2 * P + 4 * L * H * d * T) / c["itl_s"].sel(batch=32).values, rtol=1e-6
    )
    drawing = [*Path(F.__file__).parent.glob("*.py"), *Path(PF.__file__).parent.parent.glob("*/figures.py")]
    drawing += [*Path(PF.__file__).parent.parent.glob("*/present.py")]
    for path in drawing:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "catalog" not in (node.module or "") and all(a.name != "catalog" for a in node.names), path


def test_line_progress_writes_a_line_per_part_with_the_time_left():
    """Off a terminal, progress is lines: one per finished part at most every ``every_s`` (here every part), the last
    always, with the time so far and the time left at the rate so far; nothing with ``quiet``; nothing from a library
    call's default (None) off a terminal."""
    import io

    from slimjax.report.progress import LineProgress, progress

    out = io.StringIO()
    bar = LineProgress("slimjax test", "part", total=4, file=out, every_s=0.0)
    bar.start = bar.last = bar.start - 8.0  # two parts took 8 s: 4 s each
    bar.update(2)
    bar.update(2)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("slimjax test: 2/4 parts done, 8 s so far, about 8 s left")
    assert lines[1].startswith("slimjax test: 4/4 parts done, 8 s so far") and "left" not in lines[1]
    slow = io.StringIO()
    throttled = LineProgress("slimjax test", "block", total=3, file=slow, every_s=3600.0)
    throttled.update(1)
    throttled.update(1)
    throttled.update(1)
    assert slow.getvalue().splitlines() == [slow.getvalue().splitlines()[-1]]  # only the last, at the total
    assert progress(True, "x", "y") is None and progress(None, "x", "y") is None  # pytest's stderr is no terminal
    assert isinstance(progress(False, "x", "y"), LineProgress)
