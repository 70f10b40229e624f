"""The ``slimjax`` command: parses arguments and calls the library; nothing else lives here."""

from __future__ import annotations

import functools
import math
import re
import sys

import click

from . import constants as C

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _bytes(ctx, param, value: str) -> float:
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"{value!r} is not a size like 512MiB or 2GiB")
    size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if size <= 0:
        raise click.BadParameter(f"{value!r} must be positive")
    return size


def _reports_errors(words=None, also: tuple = (), spec: tuple[str, str] | None = None):
    """Run a command; a SlimjaxError (or one of ``also``) is one line on stderr in the command line's words
    (``words``, default :func:`_cli_words`) and exit status 2. ``spec``: (argument, file kind) of a spec file the
    command reads, checked first (:func:`slimjax.inputs.files.read_spec_file`: the YAML and its keys), before JAX and
    the store libraries load; then JAX is set up (:func:`slimjax.configure`), the file is read in full with JAX alone
    (:func:`slimjax.read_spec`: its values) and the command runs on what was read, in place of the path."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            import slimjax  # the front door alone: nothing below it loads until a name is used

            from .errors import SlimjaxError

            try:
                if spec is not None:
                    slimjax.read_spec_file(kwargs[spec[0]], spec[1])  # JAX-free
                slimjax.configure()  # one XLA CPU device per core, float64 available
                if spec is not None:  # before xarray, zarr and the engine load
                    kwargs[spec[0]] = slimjax.read_spec(kwargs[spec[0]], spec[1])
                return fn(*args, **kwargs)
            except (SlimjaxError, *also) as e:
                click.echo(f"error: {(words or _cli_words)(e)}", err=True)
                sys.exit(2)

        return run

    return wrap


def _at(ctx, param, value: str | None):
    """``--at IL,OL`` → (IL, OL), or None."""
    if value is None:
        return None
    try:
        return C.parse_at(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--at") from None


_TYPICAL = ",".join(map(str, C.TYPICAL_REQUEST))


def _at_option(what: str):
    return click.option(
        "--at", "at", default=None, callback=_at, help=f"IL,OL of {what} (default: grid values nearest {_TYPICAL})."
    )


_ENGINE_OPTIONS = (
    click.option(
        "--memory-budget",
        default=C.DEFAULT_MEMORY_BUDGET,
        show_default=True,
        callback=_bytes,
        help="Working memory for one block of the grid (e.g. 512MiB, 4GiB).",
    ),
    click.option("--resume", is_flag=True, help="Continue an interrupted run from its OUT.partial store."),
    click.option(
        "--compression",
        type=click.Choice(C.COMPRESSIONS),
        default=C.COMPRESSIONS[0],
        show_default=True,
        help="Chunk compression of the store.",
    ),
    click.option(
        "--scheduler",
        type=click.Choice(C.SCHEDULERS),
        default=C.SCHEDULERS[0],
        show_default=True,
        help="Run blocks in this process, or on a Dask cluster whose workers write to the store.",
    ),
    click.option(
        "--workers", type=click.IntRange(1), default=None, help="Dask LocalCluster worker processes (default: cores)."
    ),
    click.option("--dask-address", default=None, help="An existing Dask scheduler, tcp://HOST:PORT."),
)


def _engine_options(fn):
    """The engine's options, shared by every command that runs an evaluation (sweep, procure)."""
    for option in reversed(_ENGINE_OPTIONS):
        fn = option(fn)
    return fn


@click.group()
@click.version_option(package_name="slimjax")
def main() -> None:
    """slimjax: LLM-serving capacity planning over dense grids (SLIM, B_cap)."""
    import warnings

    # JAX is set up by each command (_reports_errors), after its spec file is checked
    # a warning is one line for a user, not a source location and a line of slimjax's code
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"warning: {message}\n"


@main.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(), help="zarr store to write (STORE.zarr).")
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option("--quiet", is_flag=True, help="No progress bar and no summary table.")
@_at_option("the summary table")
@_engine_options
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Write the report (PNGs, index.html) here.",
)
@_reports_errors(spec=("sweep_file", "sweep"))
def sweep(
    sweep_file: str,
    out: str,
    overwrite: bool,
    quiet: bool,
    memory_budget: float,
    at: tuple[int, int] | None,
    resume: bool,
    compression: str,
    scheduler: str,
    workers: int | None,
    dask_address: str | None,
    report_dir: str | None,
) -> None:
    """Evaluate SWEEP_FILE over its grid and write the Dataset to --out."""
    import time

    import slimjax
    from slimjax.api import check_at, check_output_dir, summary

    il, ol = at if at is not None else (None, None)
    start = time.perf_counter()
    if report_dir is not None:
        check_output_dir(report_dir, "--report")
    sw = slimjax.parse(sweep_file)  # the Sweep the file check read
    check_at(sw, at, "--at")  # before any work, not after the store is written
    ds = slimjax.sweep(
        sw,
        out,
        overwrite=overwrite,
        memory_budget_bytes=memory_budget,
        quiet=quiet,  # False: a bar on a terminal, a line per finished part elsewhere
        resume=resume,
        compression=compression,
        scheduler=scheduler,
        workers=workers,
        dask_address=dask_address,
    )
    tables = summary(ds, il, ol)
    seconds = time.perf_counter() - start
    points = 1
    for d in ("model", "gpu", "batch", "input_len", "output_len"):
        points *= ds.sizes[d]
    click.echo(f"wrote {out}: {points:,} grid points in {seconds:.1f} s")
    if report_dir is not None:
        page = slimjax.make_report([out], report_dir, at=at, quiet=True if quiet else None)
        click.echo(f"wrote {page}")
    if quiet:
        return
    i, o = int(tables["at"].input_len[0]), int(tables["at"].output_len[0])
    with_pd_options(lambda: _print_tables(tables, i, o))


@main.command()
@click.argument("stores", nargs=-1, required=True, type=click.Path())
@click.option(
    "--out", "out", required=True, type=click.Path(file_okay=False), help="Folder for index.html and the PNGs."
)
@_at_option("the throughput and queue figures")
@_reports_errors(also=(KeyError,))
def report(stores: tuple[str, ...], out: str, at: str | None) -> None:
    """PNGs and one self-contained index.html for STORES (sweep, procurement, calibration stores; validate CSVs)."""
    import slimjax

    page = slimjax.make_report(list(stores), out, at=at)
    click.echo(f"wrote {page}")


@main.command()
@click.argument("store_path", type=click.Path())
@_reports_errors()
def verify(store_path: str) -> None:
    """Check a sweep store (or its .partial) against its block journal: missing blocks, changed data."""
    from slimjax.api import verify_store

    report = verify_store(store_path)
    unit = report.get("unit", "blocks")
    click.echo(f"{store_path}: {report['recorded']} of {report['blocks']} {unit} recorded")
    if report["missing"]:
        shown = ", ".join(map(str, report["missing"][:20])) + (" …" if len(report["missing"]) > 20 else "")
        click.echo(f"  missing {unit} ({len(report['missing'])}): {shown}")
    for k, name in report["corrupt"][:50]:
        click.echo(f"  block {k}: {name} differs from its recorded CRC32 (chunk missing or changed)")
    click.echo("  ok" if report["ok"] else "  NOT OK")
    sys.exit(0 if report["ok"] else 1)


@main.command()
@click.argument("simulation_file", type=click.Path(dir_okay=False))
@click.option("--out", "out", default=None, type=click.Path(), help="zarr store to write (SIM.zarr).")
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option("--quiet", is_flag=True, help="No progress (a bar on a terminal, else a line per finished run).")
@_reports_errors(spec=("simulation_file", "simulation"))
def simulate(simulation_file: str, out: str | None, overwrite: bool, quiet: bool) -> None:
    """Serve SIMULATION_FILE's request stream on each candidate replica fleet, step by step (MODEL.md §9)."""
    import slimjax

    ds = slimjax.simulate(simulation_file, out, overwrite=overwrite, quiet=quiet)
    click.echo(slimjax.simulation_table(ds))
    if out is not None:
        click.echo(f"\nwrote {out}")


@main.command()
@click.argument("study_file", type=click.Path(dir_okay=False))
@click.option("--out", "out", default=None, type=click.Path(), help="zarr store to write the study to (STUDY.zarr).")
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option(
    "--top", default=5, show_default=True, type=click.IntRange(1), help="Feasible (GPU, TP) groups per table."
)
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Write the report (PNGs, index.html) here.",
)
@click.option("--quiet", is_flag=True, help="No progress (a bar on a terminal, else a line per finished part).")
@_engine_options
@_reports_errors(spec=("study_file", "study"))
def procure(
    study_file: str,
    out: str | None,
    overwrite: bool,
    top: int,
    report_dir: str | None,
    quiet: bool,
    memory_budget: float,
    resume: bool,
    compression: str,
    scheduler: str,
    workers: int | None,
    dask_address: str | None,
) -> None:
    """Size and price a fleet for STUDY_FILE's workloads under its SLOs (MODEL.md §8)."""
    import slimjax

    if report_dir is not None and out is None:  # before any work
        click.echo("error: --report needs --out (the report is drawn from the store)", err=True)
        sys.exit(2)
    if report_dir is not None:
        slimjax.api.check_output_dir(report_dir, "--report")
    ds = slimjax.procure(
        study_file,
        out,
        overwrite=overwrite,
        quiet=quiet,
        memory_budget_bytes=memory_budget,
        resume=resume,
        compression=compression,
        scheduler=scheduler,
        workers=workers,
        dask_address=dask_address,
    )
    click.echo(slimjax.procure_tables(ds, top=top))
    if out is not None:
        click.echo(f"\nwrote {out}")
    if report_dir is not None:
        click.echo(f"wrote {slimjax.make_report([out], report_dir)}")


@main.command()
@click.option(
    "--data",
    "data_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Shared data folder (default: $SLIMJAX_DATA, else ../shared/data).",
)
@click.option("--epsilon", default=0.5, show_default=True, type=float, help="Plateau threshold ε of MODEL.md §2.")
@click.option(
    "--out",
    "out",
    default=None,
    type=click.Path(dir_okay=False),
    help="CSV of every curve's truth and recommendations.",
)
@_reports_errors()
def advise(data_dir: str | None, epsilon: float, out: str | None) -> None:
    """Evaluate the batch-capacity advisor on measured curves as the SLIM paper does (§VII-B)."""
    import slimjax

    if out is not None:
        slimjax.api.check_output_file(out, "--out")
    result = slimjax.advise(data_dir, epsilon=epsilon)
    s = result.summary
    percent = (
        "exact_match",
        "within_one_step",
        "slo_violations",
        "in_plateau",
        "profiling_effort",
        "kv_saving_mean",
        "truth_kv_saving_mean",
    )
    signed = ("one_step_change_mean", "throughput_change_mean", "throughput_loss_mean", "throughput_change_worst")
    table = s.assign(
        **{c: s[c].map(lambda v: f"{v:.0%}") for c in percent}, **{c: s[c].map(lambda v: f"{v:+.1%}") for c in signed}
    )
    for subset, what in (
        ("all", "every curve"),
        ("dense", f"curves with ≥ {result.dense_points} batch points"),
        ("sparse", f"curves with < {result.dense_points} batch points (one step: a 2× change of B)"),
    ):
        part = table[table["curves_subset"] == subset]
        if part.empty:
            continue
        n = int(part["curves"].iloc[0])
        click.echo(
            f"\nB_cap on {n} measured curves, {what} (ε = {epsilon:g}; SLO = factor × the curve's measured E2E at "
            "B = 32; throughput change: + a gain, − a loss against the truth)"
        )
        with_pd_options(lambda p=part: click.echo(p.drop(columns=["curves", "curves_subset"]).to_string(index=False)))
    click.echo("\nknee (T/(B·T(1)) = ε), predicted vs measured:")
    with_pd_options(lambda: click.echo(result.knee_table.to_string(index=False, float_format=lambda v: f"{v:.3g}")))
    click.echo("\nassumptions:")
    for line in result.assumptions:
        click.echo(f"  {line}")
    if out is not None:
        result.per_curve.to_csv(out, index=False)
        click.echo(f"\nwrote {out}")


# the agents command's API flags: API key -> (flag after --api-, what it sets); defaults from constants
_API_FLAGS = {
    "rpm": ("rpm", "API requests per minute"),
    "tpm": ("tpm", "API tokens per minute"),
    "service_s": ("service-s", "API service time per call, s"),
    "parallelism": ("parallelism", "API calls in flight"),
    "price_in_per_mtok": ("price-in", "API USD per million input tokens"),
    "price_out_per_mtok": ("price-out", "API USD per million output tokens"),
}


def _api_options(fn):
    for key, (flag, what) in reversed(_API_FLAGS.items()):
        help_text = f"{what} (default {C.API_DEFAULTS[key]:,g})."
        fn = click.option(f"--api-{flag}", f"api_{key}", type=float, default=None, help=help_text)(fn)
    return fn


_MEASURED_OPTIONS = tuple((k, int if k == "batch" else float) for k in C.MEASURED_KEYS)
_MEASURED_HELP = {
    "batch": "measured mode: the calibration concurrency B_cal",
    "request_rate": "measured completed requests/s at B_cal",
    "ttft_s": "measured time to first token, s",
    "itl_s": "measured inter-token latency, s",
}


def _options(options, prefix: str = ""):
    def wrap(fn):
        for name, kind in reversed(options):
            flag = "--" + (prefix + name).replace("_", "-")
            fn = click.option(flag, f"{prefix}{name}", type=kind, default=None, help=_MEASURED_HELP.get(name, name))(fn)
        return fn

    return wrap


class _AutoOr(click.ParamType):
    """``auto`` or a value of ``kind`` (for serving keys that resolve ``auto``)."""

    name = "auto|value"

    def __init__(self, kind):
        self.kind = click.types.convert_type(kind)

    def convert(self, value, param, ctx):
        return "auto" if value == "auto" else self.kind.convert(value, param, ctx)


class _ServingCommand(click.Command):
    """A command that also takes one option per row of the serving table, read when it runs (so a
    key added to the table is an option here with no edit)."""

    def get_params(self, ctx):
        from slimjax.api import serving_keys

        extra = [
            click.Option(
                [row.flag, row.key],
                type=_AutoOr(row.cli_type) if row.auto is not None else row.cli_type,
                default=None,
                help=row.help + (" (or auto)" if row.auto is not None else ""),
            )
            for row in serving_keys().values()
        ]
        return super().get_params(ctx)[:-1] + extra + super().get_params(ctx)[-1:]  # --help stays last


@main.command(cls=_ServingCommand)
@click.option("--model", required=True, help="Catalog name, config.json path.")
@click.option("--gpu", required=True, help="Catalog name.")
@click.option("--input-len", required=True, type=int)
@click.option("--output-len", required=True, type=int)
@click.option("--batch", required=True, type=int, help="Concurrency B.")
@click.option("--arrival-rate", type=float, default=None, help="Poisson arrivals, requests/s (adds the queue cards).")
@click.option(
    "--calibrated",
    is_flag=True,
    help="Roofline efficiencies fitted on measured serving data "
    "(configs/roofline/default.yaml) instead of the plain roofline.",
)
@click.option(
    "--draft-model",
    default=None,
    help="A catalog model drafting for --model (with --speculative-method draft; docs/speculative.md).",
)
@_options(_MEASURED_OPTIONS, prefix="measured_")
@_reports_errors(words=lambda e: _as_flags(e))
def capacity(model, gpu, input_len, output_len, batch, arrival_rate, calibrated, draft_model, **options) -> None:
    """The capacity calculator's cards at one operating point (same functions as the sweep)."""
    import slimjax

    serving = {k: options[k] for k in slimjax.api.serving_keys() if options.get(k) is not None}
    if calibrated:
        serving["efficiency"] = "calibrated"
    if draft_model is not None:
        serving["draft_model"] = draft_model
    measured = {k: options["measured_" + k] for k, _ in _MEASURED_OPTIONS if options["measured_" + k] is not None}
    result = slimjax.capacity(
        model, gpu, input_len, output_len, batch, arrival_rate=arrival_rate, serving=serving, measured=measured or None
    )
    click.echo(
        f"{model} on {gpu}: I={input_len}, O={output_len}, B={batch}"
        + (f", λ={arrival_rate:g} requests/s" if arrival_rate is not None else "")
    )
    verdict = slimjax.api.capacity_verdict(result, input_len, output_len)
    if verdict:
        click.echo(f"  {verdict}")
    for label, value in slimjax.capacity_cards(result):
        click.echo(f"  {label:<30} {value}")


@main.command(cls=_ServingCommand)
@click.option("--model", required=True, help="Catalog name, config.json path.")
@click.option("--gpu", required=True, help="Catalog name.")
@click.option("--input-len", required=True, type=int, help="Prompt tokens per call.")
@click.option("--output-len", required=True, type=int, help="Output tokens per call.")
@click.option("--stages", required=True, type=int, help="Stages of the fork-join graph.")
@click.option("--calls", "calls_per_stage", required=True, type=int, help="Calls per stage.")
@click.option("--parallelism", type=int, default=None, help="Calls requested at once (default: all of a stage).")
@click.option("--tool-delay-s", type=float, default=0.0, show_default=True, help="Tool delay between stages, s.")
@click.option("--batch", type=int, default=None, help="Local slot limit (default: the parallelism).")
@_api_options
@click.option("--calibrated", is_flag=True, help="Calibrated roofline efficiencies (configs/roofline/default.yaml).")
@_reports_errors(words=lambda e: _as_flags(e))
def agents(
    model,
    gpu,
    input_len,
    output_len,
    stages,
    calls_per_stage,
    parallelism,
    tool_delay_s,
    batch,
    calibrated,
    **options,
) -> None:
    """One agent graph on a local replica vs a rate-limited API (MODEL.md §6), with where the winner flips."""
    import slimjax

    serving = {k: options[k] for k in slimjax.api.serving_keys() if options.get(k) is not None}
    if calibrated:
        serving["efficiency"] = "calibrated"
    api = {k: options[f"api_{k}"] for k in _API_FLAGS if options.get(f"api_{k}") is not None}
    graph = {
        "stages": stages,
        "calls_per_stage": calls_per_stage,
        "tool_delay_s": tool_delay_s,
        **({"parallelism": parallelism} if parallelism is not None else {}),
    }
    result = slimjax.agent(model, gpu, input_len, output_len, graph, api=api, batch=batch, serving=serving)
    click.echo(f"{model} on {gpu}: {stages} stage(s) × {calls_per_stage} call(s), I={input_len}, O={output_len}")
    for label, value in slimjax.agent_cards(result):
        click.echo(f"  {label:<36} {value}")


@main.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", default=None, help="Trace format (default: detected).")
@click.option(
    "--group-by", default="model,gpu,n_gpu,framework", show_default=True, help="Comma-separated trace columns."
)
@click.option("--solver", type=click.Choice(C.SOLVER_NAMES), default=C.SOLVER_NAMES[0], show_default=True)
@click.option(
    "--variant",
    type=click.Choice(C.VARIANT_CHOICES),
    default=C.SLIM_VARIANTS[0],
    show_default=True,
    help="slim: MODEL.md §1 (the contract); slim-kv: the optional variant; recommended: the one "
    "configs/slim/default.yaml names from validate's transfer scenarios (slim-kv). Sweeps evaluate the store's.",
)
@click.option(
    "--loss",
    type=click.Choice(C.LOSSES),
    default=C.LOSSES[0],
    show_default=True,
    help="squared relative errors, or the robust Cauchy loss for traces with outlying runs.",
)
@click.option(
    "--bootstrap",
    type=int,
    default=0,
    show_default=True,
    help="Wild-bootstrap refits per group for the covariance and intervals (0: Gauss–Newton).",
)
@click.option(
    "--intervals",
    type=click.Choice(C.INTERVAL_KINDS),
    default=C.INTERVAL_KINDS[0],
    show_default=True,
    help="fit: the fit's own intervals; transfer: widened per kind of extrapolation (new length, model, GPU) "
    "by the validation scenarios' held-out errors on these traces.",
)
@click.option("--out", required=True, type=click.Path(), help="zarr store for the coefficients.")
@click.option("--overwrite", is_flag=True)
@_reports_errors()
def calibrate(traces, fmt, group_by, solver, variant, loss, bootstrap, intervals, out, overwrite) -> None:
    """Fit SLIM's coefficients per group of the measured TRACES, all groups in one batched solve."""
    import slimjax

    fit = slimjax.api.calibrate_files(
        traces,
        out,
        format=fmt,
        overwrite=overwrite,
        group_by=[g.strip() for g in group_by.split(",")],
        solver=solver,
        variant=variant,
        loss=loss,
        bootstrap=bootstrap,
        intervals=intervals,
        said=click.echo,
    )
    click.echo(f"wrote {out}: {len(fit.groups)} groups fitted")
    with_pd_options(lambda: click.echo(fit.groups.round(2).to_string()))
    if fit.transfer is not None:
        click.echo(
            "transfer intervals: 90 % form error per kind of extrapolation, from the held-out rows of these traces"
        )
        with_pd_options(lambda: click.echo(fit.transfer.to_string(index=False)))


@main.command()
@click.argument("traces", nargs=-1, type=click.Path(exists=True))
@click.option("--format", "fmt", default=None, help="Trace format (default: detected).")
@click.option("--methods", default=",".join(C.VALIDATION_METHODS), show_default=True)
@click.option(
    "--scenarios",
    default=",".join(C.SCENARIOS),
    show_default=True,
)
@click.option(
    "--exclude", multiple=True, help="Pandas query over trace columns; matching rows leave the study (repeatable)."
)
@click.option("--out", type=click.Path(), default=None, help="CSV of every held-out prediction.")
@click.option(
    "--serving",
    is_flag=True,
    help="Score the §9 serving simulation (closed loop at each row's concurrency) against measured TTFT and "
    "TPOT instead (default traces: the shared serving runs).",
)
@click.option(
    "--requests-per-client",
    default=None,
    type=int,
    help="With --serving: requests per client for every row (default: each row's harness, configs/harnesses.yaml).",
)
@_reports_errors()
def validate(traces, fmt, methods, scenarios, exclude, out, serving, requests_per_client) -> None:
    """The SLIM paper's generalization study on measured TRACES (default: llm_inference_bench.csv and
    its TTFT table under $SLIMJAX_DATA or ../shared/data): MAPE of throughput / E2E per scenario and method.
    With --serving: the serving simulation's TTFT and TPOT MAPE and bias per GPU, TP, precision and
    concurrency band."""
    import slimjax

    if out:
        slimjax.api.check_output_file(out, "--out")
    result = slimjax.api.validate(
        traces,
        format=fmt,
        serving=serving,
        methods=_list(methods),
        scenarios=_list(scenarios),
        exclude=exclude,
        requests_per_client=requests_per_client,
        said=click.echo,
    )
    if out:
        result.rows.to_csv(out, index=False)
    if serving:
        click.echo("TTFT / TPOT error %, closed-loop §9 simulation vs measured (bias: mean signed error):\n")
    else:
        paths = ", ".join(line.split(": ", 1)[0] for line in result.read)
        click.echo(
            f"MAPE % of throughput / E2E on held-out rows ({paths}"
            + (f"; excluding {' | '.join(exclude)}" if exclude else "")
            + "):\n"
        )
    click.echo(result.markdown)
    for cause, n in result.dropped.items():
        click.echo(f"left out: {n} rows: {cause}")
    if out:
        what = "scored rows" if serving else "held-out predictions"
        click.echo(f"\nwrote {out}: {len(result.rows)} {what}")


_OPTION_FIELDS = {
    "out": "--out",
    "resume": "--resume",
    "overwrite": "--overwrite",
    "scheduler": "--scheduler",
    "memory_budget": "--memory-budget",
    "group_by": "--group-by",
    "format": "--format",
    "epsilon": "--epsilon",
}


def _cli_words(error) -> str:
    """An error in the command line's words: the library's option names become the flags that set them."""
    words = getattr(error, "cli_words", None)
    return words(_OPTION_FIELDS) if words is not None else str(error)


def _as_flags(error) -> str:
    """A capacity error in the command line's words: sweep-file fields become the flags that set them."""
    from slimjax.api import serving_keys

    field, message = error.field, _cli_words(error).split(": ", 1)[1]
    names = {
        "models[0]": "--model",
        "gpus[0]": "--gpu",
        "batch": "--batch",
        "input_len": "--input-len",
        "output_len": "--output-len",
        "arrival_rate": "--arrival-rate",
        **{f"serving.{k}": row.flag for k, row in serving_keys().items()},
        "serving.draft_model": "--draft-model",
        **{f"measured.{k}": "--measured-" + k.replace("_", "-") for k in C.MEASURED_KEYS},
        # the agents command's graph "g" and its API block
        **{
            f"agents.g.{k}": f"--{flag}"
            for k, flag in (
                ("stages", "stages"),
                ("calls_per_stage", "calls"),
                ("parallelism", "parallelism"),
                ("tool_delay_s", "tool-delay-s"),
            )
        },
        **{f"agents.api.{k}": f"--api-{flag}" for k, (flag, _) in _API_FLAGS.items()},
    }
    for prefix in sorted(names, key=len, reverse=True):
        if field == prefix or field.startswith(prefix + "[") or field.startswith(prefix + "."):
            rest = field[len(prefix) :]
            return f"{names[prefix]}{'' if rest == '[0]' else rest}: {message}"  # one value per flag: no [0]
    return str(error)


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _cells(frame, runs, integer: bool = True):
    """A table for print: whole numbers, and "—" for a configuration that cannot run."""
    shown = frame.round(0).astype("Int64") if integer else frame
    shown = shown.astype(object)
    return shown if runs is None else shown.where(runs.astype(bool), "—")


def _print_tables(tables, i: int, o: int) -> None:
    runs = tables.get("runs")
    if "n_gpu" in tables:
        click.echo("\nGPUs per replica group (tensor-parallel degree; 0 = none fits):")
        click.echo(tables["n_gpu"].to_string())
    if "b_cap" in tables:
        click.echo(f"\nB_cap (batch to run; 0 = none qualifies; — = does not fit) at input_len={i}, output_len={o}:")
        click.echo(_cells(tables["b_cap"], runs).to_string())
        click.echo(f"\nSLIM throughput at B_cap, tokens/s, at input_len={i}, output_len={o}:")
        click.echo(_cells(tables["throughput_at_b_cap"].fillna(0), runs).to_string())
    if "throughput_per_gpu_at_b_cap" in tables:  # groups differ in size: per GPU and per dollar
        click.echo(f"\nThe same per GPU of the group, tokens/s per GPU, at input_len={i}, output_len={o}:")
        click.echo(_cells(tables["throughput_per_gpu_at_b_cap"].fillna(0), runs).to_string())
        click.echo(
            f"\n$ per million tokens (input + output) at B_cap, the group's GPUs at the catalog's illustrative "
            f"on-demand prices (dated {C.PRICE_DATE}; edit configs/gpus.yaml), at input_len={i}, output_len={o}:"
        )
        dollars = tables["cost_per_mtok_at_b_cap"].map(lambda x: f"{x:.3f}" if math.isfinite(x) else "n/a")
        click.echo(_cells(dollars, runs, integer=False).to_string())
    click.echo(f"\nPlateau throughput (best over the batches that fit), tokens/s, at input_len={i}, output_len={o}:")
    click.echo(_cells(tables["plateau_throughput"], runs).to_string())
    if "agents" in tables:
        click.echo(
            f"\nAgent graphs at input_len={i}, output_len={o} per call (local: the batch limit with the shortest time; "
            f"prices illustrative, dated {C.PRICE_DATE}):"
        )
        click.echo(tables["agents"].to_string(index=False))
        click.echo("assumptions:")
        for line in tables.get("agent_assumptions", []):
            click.echo(f"  {line}")
    notes = tables.get("notes")
    if notes is not None and len(notes):
        click.echo("\nNotes (— = does not fit):")
        for line in notes["note"]:
            click.echo(f"  {line}")


def with_pd_options(fn) -> None:
    import pandas as pd

    with pd.option_context("display.width", 250, "display.max_columns", 50, "display.max_rows", 200):
        fn()


if __name__ == "__main__":
    main()
