"""Measured NCCL collectives (docs/collectives.md): NCCL's two protocol lines and their switch fitted per GPU, NCCL
version and GPU count against every measured all-reduce point from 8 KiB, their physics bounded, the catalog's
``allreduce`` blocks equal to a fresh fit, the tensor-parallel step timed by them, and the linear link the serving
fit shipped shown against the measurements."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import slimjax
from slimjax.errors import SlimjaxError
from slimjax.fit.collectives import collective_error, collectives_markdown, fit_collectives, link_catalog
from slimjax.inputs.catalog import config_yaml, gpu_from_row, resolve_gpu, resolve_model
from slimjax.inputs.collectives import read_collectives
from slimjax.inputs.serving import calibrated_link, default_serving
from slimjax.model.calculator import roofline_terms
from slimjax.model.collectives import protocol_collective_s
from slimjax.model.roofline import comm_s
from slimjax.model.specs import GPUSpec, ModelSpec

DOCS = Path(__file__).resolve().parent.parent / "docs" / "collectives.md"


@pytest.fixture(scope="module")
def measured(shared_data):
    paths = sorted((shared_data / "measured" / "nccl").glob("*.csv"))
    frame = read_collectives(paths)
    return frame, fit_collectives(frame)


def _all_reduce(fitted):
    return fitted[(fitted.op == "all_reduce") & (fitted.dtype == "half")]


def test_the_catalog_link_is_within_10_percent_of_nccl_from_1_mib(measured):
    """The link the step uses (each GPU's newest NCCL in configs/gpus.yaml) against every measured all-reduce point of
    1 MiB and more at 2, 4 and 8 GPUs: within 10 %; from 8 KiB (a decode token) within 11 %. Every NCCL version
    measured, the newest or not, within 14 % from 1 MiB (NCCL 2.26.2 on 8 H200s switches at 2 MiB and is 13 % off)."""
    frame, fitted = measured
    ar = _all_reduce(fitted)
    assert set(ar.gpu) == {"H100-SXM", "H200"} and set(ar.n_gpu) == {2, 4, 8}
    err = collective_error(frame, ar)
    catalog = config_yaml("gpus.yaml")["gpus"]
    shipped = err[
        [str(v) == str(catalog[g]["allreduce"]["nccl"]) for g, v in zip(err.gpu, err.nccl_version, strict=True)]
    ]
    big = shipped[shipped.message_bytes >= 2**20]
    assert len(big) > 50 and np.abs(big.error).max() <= 0.10
    assert np.abs(shipped.error).max() <= 0.11
    assert np.abs(err[err.message_bytes >= 2**20].error).max() <= 0.14


def test_fitted_protocols_are_physical(measured):
    """The small-message protocol is the low-latency, low-bandwidth one; algorithm bandwidths stay below the NVLink
    figure per direction (NVLS reduces in the switch, so the bus figure may exceed the link, the algorithm one may
    not); latencies of microseconds; the switch between 256 KiB and 64 MiB."""
    _, fitted = measured
    for _, r in _all_reduce(fitted).iterrows():
        link = resolve_gpu(r.gpu)[1]["link_bytes_per_s"] / 1e9
        assert 1.0 < r.small_latency_us < r.large_latency_us < 100.0
        assert 0.1 * link < r.small_gbs < r.large_gbs < link
        assert 0.25 <= r.switch_mib <= 64


def test_the_fit_recovers_two_protocol_lines_exactly():
    """Points drawn from two lines with a switch are fitted back to 1e-6 (each linear program's optimum is its line,
    and the switch search finds the measured size the step is at)."""
    x = 2.0 ** np.arange(13, 30)
    t = np.asarray(protocol_collective_s(x, 7e-6, 130e9, 2**21, 21e-6, 300e9))
    frame = pd.DataFrame(
        dict(gpu="H100-SXM", nccl_version="x", op="all_reduce", n_gpu=8, dtype="half", message_bytes=x, latency_s=t)
    )
    got = fit_collectives(frame).iloc[0]
    assert got.switch_mib == 2 and got.max_error < 1e-6
    for k, want in (("small_latency_us", 7), ("small_gbs", 130), ("large_latency_us", 21), ("large_gbs", 300)):
        assert abs(got[k] / want - 1) < 1e-5, k


def test_the_catalog_blocks_are_the_fit(measured):
    """configs/gpus.yaml's ``allreduce`` blocks are link_catalog of a fresh fit of the shared measurements."""
    catalog = config_yaml("gpus.yaml")["gpus"]
    fresh = link_catalog(measured[1])
    assert fresh
    for gpu, block in fresh.items():
        assert {k: v for k, v in catalog[gpu]["allreduce"].items() if k != "source"} == block, gpu


def test_the_step_all_reduce_is_the_measured_one():
    """Back of the envelope: a Llama-3.1-70B decode step of B tokens on 8 H200s spends 2·L·t_ar(B·D·2) in
    all-reduce, t_ar NCCL's small protocol below 8 MiB and its large one above (τ and B from the catalog, by hand);
    with 3 GPUs (no measurement) §4c's line at η_link and τ."""
    slimjax.configure()
    _, m = resolve_model("meta-llama/Llama-3.1-70B")
    block = config_yaml("gpus.yaml")["gpus"]["H200"]["allreduce"][8]
    model, gpu = ModelSpec(**m), GPUSpec(**resolve_gpu("H200")[1])
    roof, _, _ = roofline_terms(model, gpu, default_serving(model, n_gpu=8.0))
    layers, hidden = m["n_layers"], m["hidden"]
    for tokens in (1.0, 64.0, 511.0, 512.0, 4096.0):
        x = tokens * hidden * 2.0
        small = x < block["switch_mib"] * 2**20
        lat, gbs = (block["small_us"], block["small_gbs"]) if small else (block["large_us"], block["large_gbs"])
        want = 2 * layers * (lat * 1e-6 + x / (gbs * 1e9))
        assert float(comm_s(roof, tokens)) == pytest.approx(want, rel=1e-12), tokens
    g = resolve_gpu("H200")[1]
    roof3, _, _ = roofline_terms(
        model,
        gpu,
        default_serving(model, n_gpu=4.0).__class__(**{**default_serving(model, n_gpu=4.0).fields(), "n_gpu": 3.0}),
    )
    line = g["allreduce_latency_s"] + 2 * 2 / 3 * 64 * hidden * 2 / (g["link_efficiency"] * g["link_bytes_per_s"])
    assert float(comm_s(roof3, 64.0)) == pytest.approx(2 * layers * line, rel=1e-12)


def test_the_shipped_linear_link_is_slower_than_nccl_measures(measured):
    """The issue's finding, kept as a measurement: the serving fit's η_link ≈ 0.25 and τ ≈ 28 µs make an 8-GPU
    all-reduce of 32 MiB and more 2× and more slower than NCCL measures (a constant that absorbed other error)."""
    frame, _ = measured
    link = calibrated_link("H100-SXM")
    at = frame[(frame.gpu == "H100-SXM") & (frame.op == "all_reduce") & (frame.n_gpu == 8) & (frame.dtype == "half")]
    big = at[at.message_bytes >= 32 * 2**20]
    n, bw = 8, resolve_gpu("H100-SXM")[1]["link_bytes_per_s"]
    linear = link["allreduce_latency_s"] + 2 * (n - 1) / n * big.message_bytes / (link["link_efficiency"] * bw)
    assert (linear / big.latency_s).min() > 2.0


def test_docs_show_the_fitted_table(measured):
    text = DOCS.read_text()
    table = text.split("<!-- collectives:begin")[1].split("\n", 1)[1].split("<!-- collectives:end -->")[0].strip()
    assert table == collectives_markdown(_all_reduce(measured[1]))


@pytest.mark.parametrize(
    "block, where",
    [
        ({2: {"small_us": 7, "small_gbs": 130, "switch_mib": 2, "large_us": 21}}, r"allreduce\.2\.large_gbs: missing"),
        ({3: {}}, r"allreduce\.3: GPU counts measured may be 2, 4, 8"),
        (
            {2: {"small_us": -1, "small_gbs": 1, "switch_mib": 2, "large_us": 2, "large_gbs": 3}},
            r"allreduce\.2\.small_us",
        ),
    ],
)
def test_a_bad_allreduce_block_is_named(block, where):
    row = yaml.safe_load(yaml.safe_dump({"tflops": 1, "bandwidth_tbs": 1, "memory_gib": 1, "allreduce": block}))
    with pytest.raises(SlimjaxError, match=where):
        gpu_from_row(row, "gpu")


def test_a_file_that_is_not_a_table_is_named(tmp_path):
    bad = tmp_path / "h100_sxm_nccl_9.9.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SlimjaxError, match=r"h100_sxm_nccl_9\.9\.csv: column 'op_name': missing"):
        read_collectives([bad])
