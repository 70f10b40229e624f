"""Scale (issue 12): resume after kill -9 bit-identically, refuse a mismatched resume, verify, Dask and
forced multiple CPU devices equal the in-process run, flat peak memory, refusal of what cannot fit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from click.testing import CliRunner

import slimjax
from slimjax.cli import main
from slimjax.store.sink import verify

SPEC = dict(
    models=["OPT-125m", "Llama-3.1-8B"],
    gpus=["H100-SXM", "L40S"],
    batch={"start": 1, "stop": 128},
    input_len=[64, 128, 256, 512, 1024, 2048],
    output_len=[32, 64, 128, 256],
    serving={},
    arrival_rate=[0.5, 5.0],
)
BUDGET = 2**18  # small blocks: 48 of them


def same(a, b):
    for v in b.data_vars:
        assert np.array_equal(a[v].values, b[v].values, equal_nan=True), v
    assert set(a.data_vars) == set(b.data_vars)


@pytest.fixture(scope="module")
def reference():
    return slimjax.sweep(SPEC, memory_budget_bytes=BUDGET)


KILL = textwrap.dedent(
    """
    import os, signal, sys, json
    import slimjax
    slimjax.configure()
    import slimjax.store.sink as sink
    how, n, out, spec = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    count = {"n": 0}
    if how == "journal":  # killed right after the n-th block is recorded
        real = sink._write_json_atomically
        def journal(path, payload):
            real(path, payload)
            count["n"] += 1
            if count["n"] == n: os.kill(os.getpid(), signal.SIGKILL)
        sink._write_json_atomically = journal
    else:  # killed in the middle of writing a block: after its n-th array write, before the others
        import zarr
        real = zarr.Array.__setitem__
        def setitem(self, key, value):
            real(self, key, value)
            if "partial" in str(self.store_path):
                count["n"] += 1
                if count["n"] == n: os.kill(os.getpid(), signal.SIGKILL)
        zarr.Array.__setitem__ = setitem
    slimjax.sweep(spec, out, memory_budget_bytes=%d)
"""
    % BUDGET
)


@pytest.mark.parametrize("how,n", [("write", 150)])  # mid-write (after a recorded block: the next two tests)
def test_resume_after_kill_is_bit_identical(tmp_path, reference, how, n):
    out = tmp_path / "s.zarr"
    run = subprocess.run(
        [sys.executable, "-c", KILL, how, str(n), str(out), json.dumps(SPEC)], capture_output=True, text=True
    )
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    partial = tmp_path / "s.zarr.partial"
    report = verify(partial)
    assert 0 < report["blocks"] and report["recorded"] < report["blocks"] and not report["corrupt"]
    with pytest.raises(slimjax.SlimjaxError, match="--resume"):
        slimjax.sweep(SPEC, out, memory_budget_bytes=BUDGET)
    resumed = slimjax.sweep(SPEC, out, memory_budget_bytes=BUDGET, resume=True)
    same(resumed, reference)
    assert verify(out)["ok"] and not partial.exists()


@pytest.mark.heavy
def test_kill_minus_nine_from_outside_then_resume_and_verify(tmp_path, reference):
    out = tmp_path / "s.zarr"
    spec = json.dumps(json.dumps(SPEC))
    code = (
        "import slimjax, json; slimjax.configure(); "
        f"slimjax.sweep(json.loads({spec}), {str(out)!r}, memory_budget_bytes={BUDGET})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal = tmp_path / "s.zarr.partial" / "slimjax_blocks"
    deadline = time.time() + 120
    while not (journal.is_dir() and len(list(journal.glob("*.json"))) >= 3):
        assert proc.poll() is None and time.time() < deadline, "the sweep ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    other = dict(SPEC, output_len=[32, 64, 128, 512])
    with pytest.raises(slimjax.SlimjaxError, match="different sweep"):
        slimjax.sweep(other, out, memory_budget_bytes=BUDGET, resume=True)
    resumed = slimjax.sweep(SPEC, out, memory_budget_bytes=BUDGET, resume=True)
    same(resumed, reference)
    assert verify(out)["ok"]
    chunk = next(p for p in (out / "slim_throughput").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.unlink()
    report = verify(out)
    assert not report["ok"] and any(name == "slim_throughput" for _, name in report["corrupt"])
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 1 and "slim_throughput differs" in r.output and "NOT OK" in r.output


def test_dask_local_cluster_equals_in_process(tmp_path, reference):
    pytest.importorskip("dask.distributed") if os.environ.get("CI") != "true" else None
    out = "file://" + str(tmp_path / "d.zarr")  # an fsspec URL, as an object store would be given
    ds = slimjax.sweep(SPEC, out, memory_budget_bytes=BUDGET, scheduler="dask", workers=2)
    same(ds, reference)
    assert verify(out)["ok"]


def test_url_store_is_built_in_place_resumable_and_verified(tmp_path, reference, monkeypatch):
    import slimjax.store.sink as sink

    url = "file://" + str(tmp_path / "u.zarr")
    real = sink.ZarrSink.block_done
    calls = {"n": 0}

    def interrupted(self, index):
        real(self, index)
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(sink.ZarrSink, "block_done", interrupted)
    with pytest.raises(KeyboardInterrupt), pytest.warns(RuntimeWarning, match="--resume"):
        slimjax.sweep(SPEC, url, memory_budget_bytes=BUDGET)
    monkeypatch.setattr(sink.ZarrSink, "block_done", real)
    report = verify(url)
    assert 5 <= report["recorded"] < report["blocks"] and not report["corrupt"]
    with pytest.raises(slimjax.SlimjaxError, match="--resume"):
        slimjax.sweep(SPEC, url, memory_budget_bytes=BUDGET)
    same(slimjax.sweep(SPEC, url, memory_budget_bytes=BUDGET, resume=True), reference)
    assert verify(url)["ok"]
    with pytest.raises(slimjax.SlimjaxError, match="already exists"):
        slimjax.sweep(SPEC, url, memory_budget_bytes=BUDGET)


DEVICES = textwrap.dedent(
    """
    import sys, json, slimjax
    slimjax.configure(cpu_devices=4)
    import jax
    import slimjax.engine.grid as grid
    assert len(jax.local_devices()) == 4
    spec, out = json.loads(sys.argv[2]), sys.argv[1]
    slimjax.sweep(spec, out + "/4.zarr", memory_budget_bytes=%d)
    every = grid.compute_devices
    grid.compute_devices = lambda **k: every(**k)[:1]  # the same process on one of its devices
    slimjax.sweep(spec, out + "/1.zarr", memory_budget_bytes=%d)
"""
    % (BUDGET, BUDGET)
)


@pytest.mark.heavy
def test_four_forced_cpu_devices_equal_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SLIMJAX_CPU_DEVICES")}
    run = subprocess.run(
        [sys.executable, "-c", DEVICES, str(tmp_path), json.dumps(SPEC)], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    same(slimjax.store.open_store(tmp_path / "4.zarr"), slimjax.store.open_store(tmp_path / "1.zarr"))


RSS = textwrap.dedent("""
    import sys, json, resource, slimjax
    slimjax.configure()
    slimjax.sweep(json.loads(sys.argv[2]), sys.argv[1], memory_budget_bytes=2**22, quiet=True)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
""")


@pytest.mark.heavy
def test_peak_memory_does_not_grow_with_the_grid(tmp_path):
    small = dict(
        models=["OPT-125m", "Llama-3.1-8B"],
        gpus=["H100-SXM"],
        batch={"start": 1, "stop": 128},
        input_len={"start": 64, "stop": 4096, "step": 64},
        output_len={"start": 16, "stop": 1024, "step": 16},
    )
    big = dict(
        small,
        gpus=["H100-SXM", "H200", "A100-SXM-80GB", "L40S", "B200"],
        models=["OPT-125m", "Llama-3.1-8B", "Qwen2-7B", "Llama-3.1-70B"],
    )  # 10x: 10.5 M points, 114 MB
    peaks = []
    for i, spec in enumerate((small, big)):
        run = subprocess.run(
            [sys.executable, "-c", RSS, str(tmp_path / f"{i}.zarr"), json.dumps(spec)], capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr[-2000:]
        peaks.append(int(run.stdout.split()[-1]))
    assert peaks[1] <= 1.2 * peaks[0], peaks


def test_what_cannot_fit_is_refused_before_any_work(tmp_path):
    huge = dict(
        models=["OPT-125m"],
        gpus=["H100-SXM"],
        batch={"start": 1, "stop": 1000000},
        input_len={"start": 1, "stop": 1000000},
        output_len={"start": 1, "stop": 1000},
    )  # 10^15 points
    start = time.time()
    with pytest.raises(slimjax.SlimjaxError, match=r"memory but .* is available"):
        slimjax.sweep(huge)
    with pytest.raises(slimjax.SlimjaxError, match=r"the store needs up to .* free"):
        slimjax.sweep(huge, tmp_path / "h.zarr")
    assert time.time() - start < 30 and list(tmp_path.iterdir()) == []
