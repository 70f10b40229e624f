"""The house: floors that import only downward, nothing changed at import, one serving table that
feeds the sweep file, the spec, calibration and the CLI, and one interval function."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.stats import norm

import slimjax
from slimjax.cli import main
from slimjax.errors import SlimjaxError
from slimjax.fit.features import row_features
from slimjax.inputs.catalog import resolve_model
from slimjax.inputs.serving import SERVING, ServingKey, default_serving, number_rule, register_serving_key
from slimjax.model.intervals import log_interval, normal_quantile
from slimjax.model.specs import ModelSpec, stack

PACKAGE = Path(slimjax.__file__).parent
FLOORS = {"model": 0, "inputs": 1, "engine": 2, "store": 3, "fit": 4, "studies": 5, "report": 6, "api": 7, "cli": 7}
BASE = {"errors", "config", "_version", "__init__", "constants"}


def _floor(parts: list[str]) -> int | None:
    head = parts[0] if parts else "__init__"
    return None if head in BASE else FLOORS[head]


def _imports(path: Path):
    """(line, the slimjax module parts it imports) for every slimjax import in ``path``."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    package = list(rel[:-1]) if rel[-1] != "__init__" else list(rel[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = base + (node.module.split(".") if node.module else [])
                names = [target + [a.name] for a in node.names] if not node.module else [target]
            elif node.module and node.module.startswith("slimjax"):
                names = [node.module.split(".")[1:]]
            else:
                continue
            for n in names:
                yield node.lineno, n
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("slimjax."):
                    yield node.lineno, a.name.split(".")[1:]


def test_every_floor_imports_only_downward():
    offences = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("").parts
        if rel == ("__init__",):
            continue  # the package's front door re-exports every floor
        own = _floor(list(rel))
        for line, target in _imports(path):
            floor = _floor(target)
            if own is not None and floor is not None and floor > own:
                offences.append(f"{'/'.join(rel)}.py:{line} imports {'.'.join(target)}")
            if own is None and floor is not None and rel[0] != "__init__":
                offences.append(f"{'/'.join(rel)}.py:{line} (a base module) imports {'.'.join(target)}")
    assert not offences, "\n".join(offences)


def _module_graph() -> dict[str, set[str]]:
    """Every slimjax module -> the slimjax modules it imports (at the top or inside a function): a name
    imported from a package is the submodule of that name where there is one, else the package."""
    modules = {".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")}
    modules = {m.removesuffix(".__init__") if m != "__init__" else "" for m in modules}
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        edges = set()
        for _, target in _imports(path):
            dotted = ".".join(target)
            while dotted and dotted not in modules:
                dotted = dotted.rpartition(".")[0]
            if dotted != name:
                edges.add(dotted)
        graph[name] = edges
    return graph


def test_no_import_circle():
    """No two modules import each other, directly or through others (Tarjan's strongly connected components);
    a package's front door (``__init__``) re-exporting its own modules is not a circle."""
    graph = _module_graph()
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w.startswith(v + ".") or v == "":  # a package importing its own modules
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_no_private_name_is_imported_across_modules():
    offences = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("slimjax")):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        offences.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {a.name}")
    assert not offences, "\n".join(offences)


def test_the_command_line_only_parses_calling_the_api():
    """cli.py imports slimjax.api (or the package front door, whose names it uses resolve to api, to configure,
    to the JAX-free spec-file check a command runs before anything heavy loads, or to the full read of that file
    with JAX alone) and the base modules; no floor below."""
    cli = PACKAGE / "cli.py"
    allowed = {("api",), (), ("constants",), ("errors",)}
    offences = [f"cli.py:{line} imports {'.'.join(t)}" for line, t in _imports(cli) if tuple(t[:1]) not in allowed]
    assert not offences, "\n".join(offences)
    used = set()
    for node in ast.walk(ast.parse(cli.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "slimjax":
            used.add(node.attr)
    wrong = {
        n: slimjax._EXPORTS.get(n)
        for n in used
        if n != "api" and slimjax._EXPORTS.get(n) not in ("api", "config", "inputs.files", "studies.specs")
    }
    assert not wrong, f"cli.py uses slimjax names that are not api entry points: {wrong}"


def test_model_floor_has_no_jit_xarray_or_io():
    for path in (PACKAGE / "model").glob("*.py"):
        text = path.read_text()
        for word in ("jax.jit", "import xarray", "import zarr", "open(", "yaml"):
            assert word not in text, f"{path.name} uses {word}"


def test_only_the_store_floor_imports_zarr():
    users = {
        p.relative_to(PACKAGE).parts[0]
        for p in PACKAGE.rglob("*.py")
        if "import zarr" in p.read_text() or "from zarr" in p.read_text()
    }
    assert users == {"store"}


def _fresh_python(code: str, **env_overrides) -> list:
    """The JSON list ``code`` prints last, run in a new interpreter with no JAX/slimjax settings inherited."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64", "SLIMJAX_CPU_DEVICES")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, **env_overrides}, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_slimjax_changes_no_process_setting():
    code = (
        "import os, json; before = os.environ.get('XLA_FLAGS');"
        "import slimjax, slimjax.api, slimjax.cli, slimjax.fit.validate, jax;"
        "print(json.dumps([before, os.environ.get('XLA_FLAGS'), bool(jax.config.jax_enable_x64),"
        " jax.config.jax_num_cpu_devices]))"
    )
    before, after, x64, devices = _fresh_python(code)
    assert before is None and after is None and x64 is False and devices == -1
    assert _fresh_python(code, XLA_FLAGS="--xla_dump_to=/tmp/nowhere")[1] == "--xla_dump_to=/tmp/nowhere"


def test_the_command_line_offers_the_tables_own_choices_and_help_starts_no_jax():
    """Every choice and default the CLI shows is read from the table that owns it (slimjax.constants, which
    the owning floors import), so the CLI cannot drift from the library; and --help imports no JAX."""
    import click

    from slimjax import constants
    from slimjax.fit import solver, validate
    from slimjax.fit.folds import SCENARIOS
    from slimjax.inputs import agents, catalog, coefficients, measured

    def option(command, name):
        return next(p for p in main.commands[command].params if p.name == name)

    assert tuple(option("calibrate", "variant").type.choices) == (*coefficients.VARIANTS, "recommended")
    assert tuple(option("calibrate", "solver").type.choices) == tuple(solver.SOLVERS)
    assert tuple(option("calibrate", "loss").type.choices) == solver.LOSSES
    assert option("validate", "methods").default.split(",") == list(validate.METHODS)
    assert option("validate", "scenarios").default.split(",") == list(SCENARIOS)
    measured_flags = {
        p.name[len("measured_") :] for p in main.commands["capacity"].params if p.name.startswith("measured_")
    }
    assert measured_flags == set(measured.MEASURED_KEYS)
    for key, (default, _, _) in agents.API_KEYS.items():
        assert f"default {default:,g}" in option("agents", f"api_{key}").help
    assert catalog.PRICE_DATE == constants.PRICE_DATE
    assert isinstance(option("sweep", "compression").type, click.Choice)
    assert tuple(option("sweep", "compression").type.choices) == constants.COMPRESSIONS
    assert set(constants.API_DEFAULTS) == set(agents.API_KEYS)
    code = "import sys, json; import slimjax.cli; print(json.dumps([m for m in sys.modules if m.startswith('jax')]))"
    assert _fresh_python(code) == []
    help_text = subprocess.run([sys.executable, "-m", "slimjax.cli", "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0


def test_entry_points_work_without_configure_and_warn_on_one_device():
    """Without configure(): float64 results stay float64 (the entry points scope it); one point is one block and
    runs on one device whatever the count, so it warns of nothing (README's one-liners print no warning), while
    work of several pieces on a multi-core machine is told it runs on one CPU device."""
    code = (
        "import warnings, json, slimjax, jax;"
        "warnings.simplefilter('always');"
        "w = warnings.catch_warnings(record=True); rec = w.__enter__();"
        "r = slimjax.capacity('Llama-3.1-8B', 'H100-SXM', 1024, 256, 8);"
        "one = any('one CPU device' in str(x.message) for x in rec);"
        "from slimjax.engine.dispatch import compute_devices; compute_devices(tasks=2);"
        "many = any('one CPU device' in str(x.message) for x in rec);"
        "print(json.dumps([r['max_seqs'], r['kv_pool_bytes'], one, many, bool(jax.config.jax_enable_x64)]))"
    )
    seqs, pool, one_point_warned, warned, x64 = _fresh_python(code)
    want = slimjax.capacity("Llama-3.1-8B", "H100-SXM", 1024, 256, 8)
    assert seqs == want["max_seqs"] and pool == want["kv_pool_bytes"]  # exact: float64 in both
    assert x64 is False  # the scope did not leak
    assert one_point_warned is False
    assert warned == (len(os.sched_getaffinity(0)) > 1)


def test_configure_rejects_a_bad_device_count():
    with pytest.raises(SlimjaxError, match="cpu_devices: must be a positive integer, got 0"):
        slimjax.configure(cpu_devices=0)


@pytest.fixture
def extra_key():
    """A serving key added through the table's public hook, with an ``auto`` rule; removed after."""
    key = register_serving_key(
        ServingKey(
            "test_spare_fraction",
            "spare_fraction",
            0.25,
            number_rule(lambda v: 0 <= v < 1, "in [0, 1)"),
            "a test-only serving key",
            auto=lambda ctx: 0.5 if ctx.model_fields["n_params"] > 1e10 else 0.125,
        )
    )
    yield key
    del SERVING[key.key]


def test_a_serving_key_added_in_one_place_reaches_sweep_spec_cli_and_calibration(extra_key, tmp_path):
    base = dict(
        models=["Llama-3.1-8B", "Llama-3.1-70B"],
        gpus=["H100-SXM"],
        batch=[1, 8],
        input_len=[128],
        output_len=[64],
        advisor=False,
    )
    # sweep file and spec: given, defaulted, and auto (per model, from the table's rule)
    sw = slimjax.parse({**base, "serving": {"test_spare_fraction": 0.75}})
    assert np.all(sw.serving.spare_fraction == 0.75)
    assert sw.serving_table["Llama-3.1-8B"]["H100-SXM"]["test_spare_fraction"] == 0.75
    assert np.all(slimjax.parse({**base, "serving": {}}).serving.spare_fraction == 0.25)
    auto = slimjax.parse({**base, "serving": {"test_spare_fraction": "auto"}})
    assert auto.serving.spare_fraction[:, 0].tolist() == [0.125, 0.5]
    with pytest.raises(SlimjaxError, match=r"serving.test_spare_fraction: must be in \[0, 1\), got 2"):
        slimjax.parse({**base, "serving": {"test_spare_fraction": 2}})
    with pytest.raises(SlimjaxError, match="serving.chunk_size: chunk_size has no 'auto' setting"):
        slimjax.parse({**base, "serving": {"chunk_size": "auto"}})
    # the whole sweep still evaluates with the extra field in the spec
    assert slimjax.sweep({**base, "serving": {"test_spare_fraction": 0.5}}, quiet=True)["max_seqs"].notnull().all()
    # calibration's default serving
    model = stack(ModelSpec, [resolve_model("Llama-3.1-8B")[1]])
    assert float(default_serving(model, n_gpu=np.ones(1)).spare_fraction[0]) == 0.25
    import pandas as pd

    rows = pd.DataFrame(
        dict(model=["Llama-3.1-8B"], gpu=["H100-SXM"], n_gpu=[1], batch=[4], input_len=[128], output_len=[64])
    )
    assert row_features(rows)["max_seqs"][0] > 0
    # the command line
    runner = CliRunner()
    assert "--test-spare-fraction" in runner.invoke(main, ["capacity", "--help"]).output
    args = [
        "capacity",
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "H100-SXM",
        "--input-len",
        "128",
        "--output-len",
        "64",
        "--batch",
        "4",
    ]
    ok = runner.invoke(main, args + ["--test-spare-fraction", "auto"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(main, args + ["--test-spare-fraction", "3"])
    assert bad.exit_code == 2 and "--test-spare-fraction: must be in [0, 1), got 3" in bad.output


def test_registering_a_key_twice_is_refused(extra_key):
    with pytest.raises(SlimjaxError, match="already in the serving table"):
        register_serving_key(extra_key)


def test_one_interval_function_with_the_level_as_an_argument():
    assert normal_quantile(0.90) == norm.ppf(0.95)
    assert normal_quantile(0.50) == pytest.approx(norm.ppf(0.75), rel=1e-15)
    lo, hi = log_interval(np.float64(100.0), np.float64(0.1), 0.90)
    assert float(lo) == pytest.approx(100 * np.exp(-0.1 * norm.ppf(0.95))) and float(hi) == pytest.approx(
        100 * np.exp(0.1 * norm.ppf(0.95))
    )
    with pytest.raises(ValueError):
        normal_quantile(1.0)


def test_block_plan_is_recorded_in_the_store(tmp_path):
    spec = dict(
        models=["OPT-125m", "OPT-1.3b"],
        gpus=["H100-SXM", "A100-SXM-80GB"],
        batch=[1, 2, 4],
        input_len=[32, 64, 128],
        output_len=[16, 32],
    )
    ds = slimjax.sweep(spec, tmp_path / "s.zarr", memory_budget_bytes=4096)
    plan = json.loads(ds.attrs["block_plan"])
    assert plan["dims"] == ["model", "gpu", "batch", "input_len", "output_len"] and plan["n_blocks"] > 1
    assert plan["block"]["model"] == 1 and "batch" not in plan["block"]
    assert ds["slim_throughput"].encoding["chunks"][0] == 1


@pytest.fixture
def extra_gpu_field():
    """A GPU key added through the GPU table's public hook (an optional figure, 0 when absent); removed after."""
    from slimjax.inputs import catalog

    row = catalog.register_gpu_field(
        catalog.GPUField("test_sram_mib", "sram_bytes", 2.0**20, catalog.optional_positive, "on-chip SRAM, MiB")
    )
    yield row
    del catalog.GPU_FIELDS[row.key]


def test_a_gpu_field_added_in_one_place_reaches_the_catalog_the_sweep_and_the_cli(extra_gpu_field, tmp_path):
    import yaml

    from slimjax.inputs.catalog import resolve_gpu
    from slimjax.inputs.sweepfile import parse

    assert resolve_gpu("H100-SXM")[1]["sram_bytes"] == 0.0  # a catalog entry without it: the table's default
    lab = dict(name="lab-gpu", tflops=100.0, bandwidth_tbs=1.0, memory_gib=24, test_sram_mib=50)
    assert resolve_gpu(lab)[1]["sram_bytes"] == 50 * 2**20
    spec = dict(models=["Llama-3.1-8B"], gpus=["H100-SXM", lab], batch=[1, 4], input_len=[128], output_len=[16])
    sw = parse(spec)
    np.testing.assert_array_equal(sw.gpu.sram_bytes, [0.0, 50 * 2**20])
    assert json.loads(slimjax.sweep(sw, quiet=True).attrs["specs"])["gpus"]["lab-gpu"]["sram_bytes"] == 50 * 2**20
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(dict(spec, gpus=[dict(lab, test_sram_mib=-1)])))
    r = CliRunner().invoke(main, ["sweep", str(path), "--out", str(tmp_path / "s.zarr"), "--quiet"])
    assert r.exit_code == 2 and "gpus[0].test_sram_mib" in r.output  # checked by its row, named in CLI words


@pytest.fixture
def extra_trace_format():
    """A trace format registered through the readers' public hook: a CSV with its own column names."""
    import pandas as pd

    from slimjax.inputs import traces

    def read(path, defaults):
        df = pd.read_csv(path)
        return pd.DataFrame(
            dict(
                model=df["llm"], gpu=df["accelerator"], n_gpu=1, framework="lab", batch=df["concurrency"],
                input_len=df["isl"], output_len=df["osl"], e2e_s=df["latency_ms"] / 1e3,
            )
        )  # fmt: skip

    fmt = traces.register_trace_format(
        traces.TraceFormat(
            "test_lab_csv", read, frozenset({"llm", "accelerator", "concurrency", "isl", "osl", "latency_ms"})
        )
    )
    yield fmt
    del traces.READERS[fmt.name]


def test_a_trace_format_added_in_one_place_is_read_detected_and_taken_by_the_cli(extra_trace_format, tmp_path):
    from slimjax.inputs.traces import detect_format, formats, load_traces

    path = tmp_path / "lab.csv"
    rows = ["llm,accelerator,concurrency,isl,osl,latency_ms"]
    rows += [f"Llama-3.1-8B,H100 SXM,{b},512,128,{1000 * (0.6 + 0.02 * b):.1f}" for b in (1, 2, 4, 8, 16, 32)]
    path.write_text("\n".join(rows) + "\n")
    assert "test_lab_csv" in formats() and detect_format(path) == "test_lab_csv"
    df = load_traces(path)
    assert df.attrs["format"] == "test_lab_csv" and len(df) == 6 and set(df["gpu"]) == {"H100-SXM"}
    r = CliRunner().invoke(
        main, ["calibrate", str(path), "--format", "test_lab_csv", "--out", str(tmp_path / "c.zarr"), "--solver", "lm"]
    )
    assert r.exit_code == 0, r.output
    assert "6 rows kept of 6 read" in r.output
    unknown = CliRunner().invoke(main, ["calibrate", str(path), "--format", "nope", "--out", str(tmp_path / "d.zarr")])
    assert unknown.exit_code == 2 and "test_lab_csv" in unknown.output  # the error lists the registered formats


def test_architecture_page_shows_the_simulation_records_table():
    """docs/architecture.md's records table is the one RECORDS makes (so it cannot go stale)."""
    from slimjax.engine.sim.outputs import records_markdown

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    shown = page.split("<!-- records:begin", 1)[1].split("\n", 1)[1].split("<!-- records:end -->", 1)[0]
    assert shown.strip() == records_markdown().strip()


def test_a_study_kind_registered_once_is_found_by_the_report_and_the_api(tmp_path):
    """A study package registers its kind once (slimjax.studies.present.register_study); the report page draws
    its figures and tables and api.study_text prints its text, with no branch on the kind anywhere."""
    import xarray as xr

    from slimjax.api import study_text
    from slimjax.report.page import figures_for, study_kind
    from slimjax.studies.present import STUDIES, Figure, StudyKind, grid, register_study, study_kinds

    assert "simulation" in study_kinds()  # found by walking the studies packages, not by a list
    ds = xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"kind": "toy"})

    def draw(d, at=None):
        fig, (ax,) = grid(1)
        ax.plot(d.x.values)
        return [Figure("toy", "a toy study", fig)]

    register_study(StudyKind("toy", draw, lambda d: [("values", d.to_dataframe())], lambda d: f"toy: {len(d.x)}"))
    try:
        assert study_kind("toy") is STUDIES["toy"]
        figs, tables = figures_for("toy", ds)
        assert [f.key for f in figs] == ["toy"] and tables[0][1].x.tolist() == [0.0, 1.0, 2.0]
        assert study_text(ds) == "toy: 3"
        with pytest.raises(ValueError, match="already registered"):
            register_study(StudyKind("toy", draw, draw))
    finally:
        STUDIES.pop("toy")
    with pytest.raises(SlimjaxError, match="no study prints a Dataset of kind 'toy'"):
        study_text(ds)
