"""Measured NCCL collectives (docs/collectives.md): t(x) = (√(x/B) + √L)² fitted per GPU, NCCL version and GPU
count against every measured all-reduce point of 1 MiB and more, its physics bounded, and the linear link the
serving fit shipped shown against the measurements."""

import numpy as np
import pytest

from slimjax.errors import SlimjaxError
from slimjax.fit.collectives import collective_error, collectives_markdown, fit_collectives
from slimjax.inputs.catalog import resolve_gpu
from slimjax.inputs.collectives import read_collectives
from slimjax.inputs.serving import calibrated_link
from slimjax.model.collectives import pipelined_collective_s


@pytest.fixture(scope="module")
def measured(shared_data):
    paths = sorted((shared_data / "measured" / "nccl").glob("*.csv"))
    frame = read_collectives(paths)
    return frame, fit_collectives(frame)


def _all_reduce(fitted):
    return fitted[(fitted.op == "all_reduce") & (fitted.dtype == "half")]


def test_all_reduce_within_10_percent_at_4_and_8_gpus(measured):
    frame, fitted = measured
    ar = _all_reduce(fitted)
    assert set(ar.gpu) == {"H100-SXM", "H200"} and set(ar.n_gpu) == {2, 4, 8}
    err = collective_error(frame, ar)
    wide = err[err.n_gpu >= 4]
    assert len(wide) > 100 and np.abs(wide.error).max() <= 0.10
    # two GPUs: NCCL changes protocol between 1 and 2 MiB (1 MiB 14.7 µs, 2 MiB 27.9 µs, 4 MiB 33.1 µs on an
    # H100), a step no bandwidth-latency curve follows: within 18 %, said in docs/collectives.md
    assert np.abs(err[err.n_gpu == 2].error).max() <= 0.18


def test_fitted_constants_are_physical(measured):
    """Algorithm bandwidth below the NVLink figure per direction (NVLS reduces in the switch, so each GPU moves
    about x each way: the bus figure may exceed the link, the algorithm one may not); latency of microseconds."""
    _, fitted = measured
    ar = _all_reduce(fitted)
    for _, r in ar.iterrows():
        link = resolve_gpu(r.gpu)[1]["link_bytes_per_s"] / 1e9
        assert 0.4 * link < r.bandwidth_gbs < link
        assert 1.0 < r.latency_us < 30.0 and not r.latency_at_bound


def test_the_fit_is_minimax_exact_on_its_own_curve():
    """Points drawn from the curve itself are fitted back to 1e-6 (the linear program's optimum is the curve)."""
    x = np.geomspace(2**20, 2**29, 12)
    t = np.asarray(pipelined_collective_s(x, 300e9, 8e-6))
    import pandas as pd

    frame = pd.DataFrame(
        dict(gpu="H100-SXM", nccl_version="x", op="all_reduce", n_gpu=8, dtype="half", message_bytes=x, latency_s=t)
    )
    got = fit_collectives(frame).iloc[0]
    assert abs(got.bandwidth_gbs / 300 - 1) < 1e-6 and abs(got.latency_us / 8 - 1) < 1e-5 and got.max_error < 1e-6


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


def test_docs_show_the_fitted_table(measured, shared_data):
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "collectives.md").read_text()
    table = text.split("<!-- collectives:begin")[1].split("\n", 1)[1].split("<!-- collectives:end -->")[0].strip()
    assert table == collectives_markdown(_all_reduce(measured[1]))


def test_a_file_that_is_not_a_table_is_named(tmp_path):
    bad = tmp_path / "h100_sxm_nccl_9.9.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SlimjaxError, match=r"h100_sxm_nccl_9\.9\.csv: column 'op_name': missing"):
        read_collectives([bad])
