"""Procurement through the engine (MODEL.md §8 on the grid layer): blocks along workload and model agree with
one block (every choice and count exactly; times to rounding, since XLA fuses other shapes differently), the
journaled store equals the in-memory Dataset of the same plan bit for bit, a study killed with SIGKILL resumes
bit-identically and verifies, and a Dask cluster gives identical values."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import slimjax
from slimjax.cli import main
from slimjax.engine import grid
from slimjax.store.sink import verify
from slimjax.studies.procure import spec as procurefile

# two workloads × two models, so a small budget cuts it into four blocks
STUDY = dict(
    workloads=[dict(name="chat", input_len=512, output_len=128), dict(name="rag", input_len=3000, output_len=200)],
    rates=[0.5, 4.0],
    models=["Llama-3.1-8B", "Llama-3.1-70B"],
    gpus=["H100-SXM", "A100-SXM-80GB", "L40S"],
    tp=[1, 2, 4],
    batch=[2, 3, 4],  # one queue bucket: one bisection to compile
    slo=dict(ttft_s=2.0, itl_s=0.08),
    sizing="screen",  # the engine's own options (blocks, stores, resume, Dask) are the screen's
)
SMALL_BUDGET = 20e3  # bytes: one (workload, model) cell per block (17 kB each)


def same(a, b, rtol: float = 0.0) -> None:
    """Every variable and coordinate equal: labels, flags and counts exactly, floats to ``rtol`` (0: bit for bit)."""
    assert sorted(a.data_vars) == sorted(b.data_vars)
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        if x.dtype.kind in "UOT":
            assert x.tolist() == y.tolist(), name
        elif x.dtype.kind == "f" and rtol:
            np.testing.assert_allclose(x, y, rtol=rtol, atol=0, err_msg=name)
        else:
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    for name in a.coords:
        assert a[name].values.tolist() == b[name].values.tolist(), name


@pytest.fixture(scope="module")
def reference():
    """The study in memory under the small budget: the plan the store tests use."""
    return slimjax.procure(STUDY, memory_budget_bytes=SMALL_BUDGET)


def test_blocks_along_workload_and_model_equal_one_block_and_the_choice_dims_stay_whole(reference):
    study = procurefile.parse(STUDY)
    plan = grid.plan(study, SMALL_BUDGET)
    assert set(plan.blocked) == {"workload", "model"} and plan.n_blocks == 4
    one = grid.plan(study, 256 * 2**20)
    assert one.n_blocks == 1
    whole = slimjax.procure(STUDY)
    assert json.loads(whole.attrs["block_plan"])["n_blocks"] == 1
    assert json.loads(reference.attrs["block_plan"])["n_blocks"] == 4
    same(whole, reference, rtol=1e-13)
    assert reference["feasible"].any() and not reference["feasible"].all()  # a study with choices to make


def test_the_store_equals_memory_and_resumes_after_sigkill_bit_identically(tmp_path, reference):
    out = tmp_path / "p.zarr"
    # the study kills itself with SIGKILL once two blocks are journaled: no handler, no cleanup runs
    code = (
        "import json, os, signal, slimjax, slimjax.store.sink as sink; slimjax.configure(); "
        "real = sink.ZarrSink.block_done; n = [0]\n"
        "def done(self, k):\n"
        "    real(self, k); self._drain(); n[0] += 1\n"
        "    if n[0] == 2: os.kill(os.getpid(), signal.SIGKILL)\n"
        "sink.ZarrSink.block_done = done\n"
        f"slimjax.procure(json.loads({json.dumps(json.dumps(STUDY))}), {str(out)!r}, "
        f"memory_budget_bytes={SMALL_BUDGET})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    partial = tmp_path / "p.zarr.partial"
    assert partial.is_dir() and not out.exists()
    assert len(list((partial / "slimjax_blocks").glob("*.json"))) == 2
    assert not verify(partial)["ok"]  # blocks missing: the journal says which
    with pytest.raises(slimjax.SlimjaxError, match="different"):
        slimjax.procure(dict(STUDY, rates=[0.5, 5.0]), out, memory_budget_bytes=SMALL_BUDGET, resume=True)
    resumed = slimjax.procure(STUDY, out, memory_budget_bytes=SMALL_BUDGET, resume=True)
    same(resumed, reference)
    assert verify(out)["ok"] and resumed.attrs["kind"] == "procurement"
    assert slimjax.procure_tables(resumed) == slimjax.procure_tables(reference)
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 0 and "4 of 4 blocks" in r.output


@pytest.mark.heavy
def test_a_dask_cluster_gives_identical_values(tmp_path, reference):
    pytest.importorskip("dask.distributed") if os.environ.get("CI") != "true" else None
    out = tmp_path / "d.zarr"
    r = CliRunner().invoke(
        main,
        ["procure", _study_file(tmp_path), "--out", str(out), "--scheduler", "dask", "--workers", "2",
         "--memory-budget", f"{SMALL_BUDGET:.0f}"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    import xarray as xr

    same(xr.open_zarr(out), reference)
    assert verify(out)["ok"]


def _study_file(tmp_path) -> str:
    import yaml

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(STUDY))
    return str(path)


def test_engine_options_without_a_store_are_refused_in_cli_words(tmp_path):
    path = _study_file(tmp_path)
    for extra, words in ((["--resume"], "--resume"), (["--scheduler", "dask"], "--scheduler")):
        r = CliRunner().invoke(main, ["procure", path, *extra])
        assert r.exit_code == 2 and words in r.output and "--out" in r.output, r.output
