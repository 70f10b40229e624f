"""The ``slimjax`` command end to end (subprocess: real exit codes, real terminal-less output)."""

import subprocess
import sys

import xarray as xr
import yaml

import slimjax

SMALL = dict(models=["OPT-1.3b", "Llama-3.1-8B"], gpus=["H100-SXM", "L40S"], batch={"start": 1, "stop": 64},
             input_len=[128, 1024], output_len=[64, 256], advisor={"slo_s": 30})


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "slimjax.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_sweep_writes_store_and_prints_table(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "small.zarr"
    r = run("sweep", str(spec), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "1,024 grid points" in r.stdout
    assert "B_cap" in r.stdout and "Plateau throughput" in r.stdout and "Llama-3.1-8B" in r.stdout
    assert "\r" not in r.stderr  # no progress bar when not a terminal
    ds = xr.open_zarr(out)
    ref = slimjax.sweep(str(spec), quiet=True)
    assert ds.load().equals(ref)
    # the table's numbers are the store's
    b_cap = int(ds.b_cap.sel(model="Llama-3.1-8B", gpu="L40S", input_len=1024, output_len=256))
    row = next(line for line in r.stdout.splitlines() if line.startswith("Llama-3.1-8B"))
    assert row.split()[2] == str(b_cap)


def test_refuses_existing_store_then_overwrites(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "s.zarr"
    assert run("sweep", str(spec), "--out", str(out), "--quiet").returncode == 0
    r = run("sweep", str(spec), "--out", str(out), "--quiet")
    assert r.returncode == 2 and "already exists" in r.stderr and "--overwrite" in r.stderr
    assert run("sweep", str(spec), "--out", str(out), "--quiet", "--overwrite").returncode == 0


def test_bad_input_exits_nonzero_with_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({**SMALL, "gpus": ["H100-SXM", "H1OO-PCIe"]}))
    out = tmp_path / "s.zarr"
    r = run("sweep", str(spec), "--out", str(out))
    assert r.returncode == 2
    assert "gpus[1]: unknown GPU 'H1OO-PCIe'; did you mean" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [spec]


def test_memory_budget_and_at_options(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(SMALL))
    r = run("sweep", str(spec), "--out", str(tmp_path / "s.zarr"), "--memory-budget", "200KiB", "--at", "128,64")
    assert r.returncode == 0, r.stderr
    assert "input_len=128, output_len=64" in r.stdout
    r = run("sweep", str(spec), "--out", str(tmp_path / "t.zarr"), "--memory-budget", "lots")
    assert r.returncode != 0 and "memory-budget" in r.stderr
    r = run("sweep", str(spec), "--out", str(tmp_path / "u.zarr"), "--at", "100,64")
    assert r.returncode == 2 and "input_len: 100 is not on the grid" in r.stderr


def test_quickstart_file_is_valid_and_large():
    from pathlib import Path

    from slimjax.sweepfile import parse

    sw = parse(Path(__file__).resolve().parent.parent / "sweeps" / "quickstart.yaml")
    assert len(sw.models) >= 12 and len(sw.gpus) >= 6 and list(sw.batch) == list(range(1, 257))
    assert len(sw.input_len) >= 6 and len(sw.output_len) >= 6
    n = 1
    for s in sw.shape:
        n *= s
    assert n >= 10_000_000
