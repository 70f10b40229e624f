"""The ``slimjax`` command end to end (subprocess: real exit codes, real terminal-less output)."""

import subprocess
import sys

import pytest
import xarray as xr
import yaml

import slimjax

SMALL = dict(
    models=["OPT-1.3b", "Llama-3.1-8B"],
    gpus=["H100-SXM", "L40S"],
    batch={"start": 1, "stop": 64},
    input_len=[128, 1024],
    output_len=[64, 256],
    advisor={"slo_s": 30},
)


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "slimjax.cli", *args], capture_output=True, text=True, cwd=cwd)


def run_here(*args):
    """The same command in this process (click's runner: exit code and stderr kept), for checks that end before
    any evaluation — a fresh interpreter per error message costs seconds each."""
    from click.testing import CliRunner

    from slimjax.cli import main

    r = CliRunner().invoke(main, list(args))
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


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
    lines = r.stdout.splitlines()
    after = next(k for k, line in enumerate(lines) if line.startswith("B_cap"))  # (the GPU-count table comes first)
    row = next(line for line in lines[after:] if line.startswith("Llama-3.1-8B"))
    assert row.split()[2] == str(b_cap)
    # per GPU and per dollar beside the group's figure, by hand: tokens/s over tp·pp GPUs, and the group's $/hour
    # over the tokens of an hour (H100-SXM at the catalog's $2.99 per GPU-hour)
    tables = slimjax.summary(ds)
    at = ds.sel(model="Llama-3.1-8B", gpu="H100-SXM", input_len=1024, output_len=256)
    b = int(at.b_cap)
    tput, gpus = float(at.slim_throughput.sel(batch=b)), int(at.n_gpu) * int(at.pp)
    assert tables["throughput_per_gpu_at_b_cap"].loc["Llama-3.1-8B", "H100-SXM"] == pytest.approx(tput / gpus)
    want = 2.99 * gpus / (tput * 3600) * 1e6
    assert tables["cost_per_mtok_at_b_cap"].loc["Llama-3.1-8B", "H100-SXM"] == pytest.approx(want)
    assert "$ per million tokens" in r.stdout and f"{want:.3f}" in r.stdout


def test_refuses_existing_store_then_overwrites(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "s.zarr"
    assert run("sweep", str(spec), "--out", str(out), "--quiet").returncode == 0
    r = run_here("sweep", str(spec), "--out", str(out), "--quiet")
    assert r.returncode == 2 and "already exists" in r.stderr and "--overwrite" in r.stderr
    assert run_here("sweep", str(spec), "--out", str(out), "--quiet", "--overwrite").returncode == 0


def test_bad_input_exits_nonzero_with_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({**SMALL, "gpus": ["H100-SXM", "H1OO-PCIe"]}))
    out = tmp_path / "s.zarr"
    r = run("sweep", str(spec), "--out", str(out))
    assert r.returncode == 2
    assert "gpus[1]: unknown GPU 'H1OO-PCIe'; did you mean" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [spec]


def _in_a_fresh_interpreter(tmp_path, runs, modules) -> list[str]:
    """Each command line of ``runs`` through the CLI in one fresh interpreter: a line "EXIT_CODE STDERR" per run,
    then the sorted ``modules`` it had imported by the end."""
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom slimjax.cli import main\n"
        f"for args in {runs!r}:\n"
        "    r = CliRunner().invoke(main, args)\n"
        "    print(r.exit_code, r.stderr.strip())\n"
        f"print(sorted(m for m in {tuple(modules)!r} if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert len(r.stdout.splitlines()) == len(runs) + 1, r.stderr
    return r.stdout.splitlines()


def test_bad_file_answers_before_jax_loads(tmp_path):
    """A file's YAML and top-level keys are checked before JAX, xarray and zarr load: one line naming the file,
    line and column, from a fresh interpreter that never imported them (so it answers in a fraction of a second)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [OPT-125m\ngpus: [H100]\n")
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"workloads": [], "modles": ["x"]}))
    runs = [["sweep", str(bad), "--out", "x.zarr"], ["simulate", str(bad)], ["procure", str(typo)]]
    lines = _in_a_fresh_interpreter(tmp_path, runs, ("jax", "xarray", "zarr"))
    where = f"{bad}:2:5: not valid YAML: expected ',' or ']', but got ':'"
    assert lines[0].startswith(f"2 error: {where}") and lines[1].startswith(f"2 error: {where}")
    assert lines[2] == "2 error: modles: unknown top-level key; did you mean 'models'?"
    assert lines[3] == "[]" and len(lines) == 4


def test_bad_value_answers_before_the_store_libraries_load(tmp_path):
    """A bad value is found by reading the file in full with JAX alone (slimjax.read_spec), before xarray, zarr
    and the engine load (what kept such answers over 2 s); the command then runs on what was read."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({**SMALL, "batch": [-1, 2]}))
    study = tmp_path / "study.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "workloads": [{"name": "chat", "input_len": 512, "output_len": 128}],
                "rates": [-2],
                "models": ["Llama-3.1-8B"],
                "gpus": ["H100-SXM"],
                "slo": {"ttft_p90_s": 1.0},
            }
        )
    )
    runs = [["sweep", str(sweep), "--out", "x.zarr"], ["procure", str(study)]]
    lines = _in_a_fresh_interpreter(tmp_path, runs, ("xarray", "zarr", "slimjax.engine.grid", "slimjax.api"))
    assert lines[0] == "2 error: batch[0]: must be positive, got -1", lines
    assert lines[1].startswith("2 error: rates") and "-2" in lines[1], lines
    assert lines[2] == "[]" and len(lines) == 3
    assert not (tmp_path / "x.zarr").exists()
    from slimjax.inputs.files import FILE_KINDS
    from slimjax.studies.specs import SPEC_READERS

    assert set(SPEC_READERS) == set(FILE_KINDS)  # every kind of file the command line checks has its full reader


def test_memory_budget_and_at_options(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(SMALL))
    r = run("sweep", str(spec), "--out", str(tmp_path / "s.zarr"), "--memory-budget", "200KiB", "--at", "128,64")
    assert r.returncode == 0, r.stderr
    assert "input_len=128, output_len=64" in r.stdout
    r = run_here("sweep", str(spec), "--out", str(tmp_path / "t.zarr"), "--memory-budget", "lots")
    assert r.returncode != 0 and "memory-budget" in r.stderr
    r = run_here("sweep", str(spec), "--out", str(tmp_path / "u.zarr"), "--at", "100,64")
    assert r.returncode == 2 and "--at: input_len 100 is not on the grid" in r.stderr


def test_quickstart_file_is_valid_and_large():
    from pathlib import Path

    from slimjax.api import parse

    sw = parse(Path(__file__).resolve().parent.parent / "sweeps" / "quickstart.yaml")
    assert len(sw.models) >= 12 and len(sw.gpus) >= 6 and list(sw.batch) == list(range(1, 257))
    assert len(sw.input_len) >= 6 and len(sw.output_len) >= 6
    n = 1
    for s in sw.shape:
        n *= s
    assert n >= 10_000_000


def test_capacity_cards():
    r = run(
        "capacity",
        "--model",
        "Llama-3.1-70B",
        "--gpu",
        "H100-SXM",
        "--input-len",
        "2048",
        "--output-len",
        "512",
        "--batch",
        "64",
        "--arrival-rate",
        "3",
        "--n-gpu",
        "4",
        "--chunk-size",
        "512",
    )
    assert r.returncode == 0, r.stderr
    for label in (
        "Weights",
        "KV pool",
        "KV bytes per token",
        "Footprint per sequence",
        "Max concurrent sequences",
        "TTFT",
        "ITL",
        "ITL with an interleaved chunk",
        "Service time S(B)",
        "Request rate",
        "Token throughput",
        "Utilization",
        "P(wait)",
        "Wait",
        "Response",
        "In system",
    ):
        assert f"  {label} " in r.stdout, label
    want = slimjax.capacity(
        "Llama-3.1-70B", "H100-SXM", 2048, 512, 64, arrival_rate=3.0, serving={"n_gpu": 4, "chunk_size": 512}
    )
    assert f"Max concurrent sequences       {want['max_seqs']:,}" in r.stdout
    assert "KV bytes per token             320 KiB (327,680 bytes)" in r.stdout


def test_capacity_unbounded_and_errors():
    r = run(
        "capacity",
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "H100-SXM",
        "--input-len",
        "2048",
        "--output-len",
        "512",
        "--batch",
        "64",
        "--arrival-rate",
        "300",
    )
    assert r.returncode == 0 and "Wait                           Unbounded" in r.stdout
    # errors name the command line's flags, not the sweep file's fields
    for flags, message in (
        (("--chunk-size", "-3"), "--chunk-size: must be a non-negative integer"),
        (("--gpu-memory-utilization", "1.5"), "--gpu-memory-utilization: must be in (0, 1]"),
        (("--arrival-rate", "-1"), "--arrival-rate: must be non-negative"),
    ):
        r = run_here(
            "capacity",
            "--model",
            "Llama-3.1-8B",
            "--gpu",
            "H100-SXM",
            "--input-len",
            "20",
            "--output-len",
            "5",
            "--batch",
            "4",
            *flags,
        )
        assert r.returncode == 2 and message in r.stderr, flags


def test_capacity_card_of_stages_and_the_group_that_fits():
    """A pipeline group counts tp·pp GPUs and shows its KV pool per stage; a model no tensor-parallel group holds
    is told the fewest pipeline stages of the largest group in a node that do, checked by hand: Llama-3.1-405B's
    756 GiB of bf16 weights over 8 H100s leave no KV pool (8 × 72 GiB = 576 GiB); two stages of 8 hold 378 GiB
    each and keep 198 GiB per stage for the KV."""
    r = run_here(
        "capacity", "--model", "Llama-3.1-70B", "--gpu", "H100-SXM", "--n-gpu", "8", "--pp", "2",
        "--input-len", "1024", "--output-len", "256", "--batch", "32",
    )  # fmt: skip
    assert r.returncode == 0
    assert "GPUs in the group              16 (TP 8 × PP 2 × DP 1)" in r.stdout
    # one stage: 8 GPUs × 0.9 × 80 GiB less half of the 131.4 GiB of weights
    stage = 8 * 0.9 * 80 * 2**30 - 70_552_387_584
    assert f"KV pool per stage              510.3 GiB ({stage:,.0f} bytes) in each of 2 stages" in r.stdout
    for auto in ((), ("--n-gpu", "auto")):
        r = run_here(
            "capacity", "--model", "Llama-3.1-405B", "--gpu", "H100-SXM", *auto,
            "--input-len", "1024", "--output-len", "256", "--batch", "8",
        )  # fmt: skip
        assert "; --n-gpu 8 --pp 2 (16 GPUs in 2 pipeline stages) holds batch 8" in r.stdout, r.stdout
    r = run_here(
        "capacity", "--model", "Llama-3.1-405B", "--gpu", "L40S", "--n-gpu", "auto",
        "--input-len", "100000", "--output-len", "256", "--batch", "800",
    )  # fmt: skip
    assert "nor do 8 pipeline stages of the largest group in a node" in r.stdout


def test_summary_per_gpu_counts_attention_data_parallel_ranks():
    """A DP 8 × EP 8 group on one H200 node is 8 GPUs though its tensor-parallel degree is 1: per GPU and per dollar
    divide by n_tp·n_pp·D (the serving settings' dp), as the capacity card counts the group."""
    ds = slimjax.sweep(
        dict(
            models=["DeepSeek-V3"], gpus=["H200"], batch=[1, 8, 32], input_len=[1024], output_len=[256],
            serving={"n_gpu": 1, "dp": 8, "ep": 8}, advisor={"slo_s": 120},
        ),
        quiet=True,
    )  # fmt: skip
    tables = slimjax.summary(ds)
    tput = tables["throughput_at_b_cap"].iloc[0, 0]
    assert int(ds.n_gpu.values.item()) == 1
    assert tables["throughput_per_gpu_at_b_cap"].iloc[0, 0] == pytest.approx(tput / 8)
    assert tables["cost_per_mtok_at_b_cap"].iloc[0, 0] == pytest.approx(8 * 3.79 / (tput * 3600) * 1e6)
