"""Helpers shared by the benchmarks."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import yaml


class Discard:
    """A sink that keeps nothing: the engine's own rate, results materialised block by block."""

    def write(self, name, region, values):
        pass


def timed(fn, repeats: int):
    """(best wall seconds over ``repeats`` calls, the last result)."""
    best, out = math.inf, None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def cpu_timed(fn, repeats: int):
    """(best process CPU seconds over ``repeats`` calls, best wall seconds): the CPU time every core spent, which a
    machine of more or fewer cores does not change as much as the wall time."""
    cpu, wall = math.inf, math.inf
    for _ in range(repeats):
        c, t = time.process_time(), time.perf_counter()
        fn()
        cpu, wall = min(cpu, time.process_time() - c), min(wall, time.perf_counter() - t)
    return cpu, wall


ROOFLINE_YAML = Path(__file__).resolve().parent.parent / "configs" / "roofline" / "default.yaml"
# configs/roofline/default.yaml's blocks fitted apart from the per-GPU constants (each by its own bench script),
# kept when bench/fit_default_roofline.py rewrites the file
ROOFLINE_BLOCKS_APART = (
    "request_overhead_s",
    "compute_efficiency_fp8",
    "bandwidth_efficiency_fp8",
    "step_overhead_s",
    "expert_efficiency",
    "layer_overhead_s",
    "expert_layer_overhead_s",
    "engine_allreduce_latency_s",
)


def write_roofline_yaml(doc: dict, header: str | None = None) -> None:
    """configs/roofline/default.yaml as ``doc`` under ``header`` (its comment lines; None: the file's own)."""
    if header is None:
        header = "\n".join(line for line in ROOFLINE_YAML.read_text().split("\n")[:5] if line.startswith("#")) + "\n"
    with open(ROOFLINE_YAML, "w") as f:
        f.write(header)
        yaml.safe_dump(doc, f, sort_keys=False, width=200)
    print(f"wrote {ROOFLINE_YAML}")


def write_roofline_block(key: str, block: dict) -> None:
    """One of :data:`ROOFLINE_BLOCKS_APART` written into configs/roofline/default.yaml, the rest kept."""
    doc = yaml.safe_load(ROOFLINE_YAML.read_text())
    doc[key] = block
    write_roofline_yaml(doc)


def fitted_value(one) -> dict:
    """One fitted value of :func:`slimjax.fit.serving.calibrate_serving_by`'s Dataset (``ds.isel(value=v)``) as the
    bench scripts keep it: value, standard error, identified, at its bound, converged, rows."""
    return dict(
        value=float(one.coefficient),
        standard_error=float(one.standard_error),
        identified=bool(one.identified),
        at_bound=bool(one.at_bound),
        converged=bool(one.converged),
        rows=int(one.n_rows),
    )


def job_arguments(jobs: str, parts: str, write: bool = False) -> tuple[argparse.Namespace, Path]:
    """A fit script's command line (``--jobs`` comma-separated, ``--parts`` the folder its jobs share, ``--write``
    where it writes configs) with slimjax configured and the parts folder made."""
    import slimjax

    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default=jobs)
    ap.add_argument("--parts", default=parts)
    if write:
        ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    slimjax.configure()
    parts_dir = Path(a.parts)
    parts_dir.mkdir(parents=True, exist_ok=True)
    return a, parts_dir


def row_weighted_mean(fits: dict, keep=lambda f: f.get("identified", True)) -> float:
    """The row-weighted mean of the fits ``keep`` accepts ({level: {value, rows, …}}; identified ones by default):
    the default of a level without its own value. NaN where none is kept."""
    ok = [f for f in fits.values() if keep(f)]
    if not ok:
        return float("nan")
    return float(sum(f["value"] * f["rows"] for f in ok) / sum(f["rows"] for f in ok))


# the serving rows the per-engine fits take: ≤ 32 clients, outputs ≤ 2,048 tokens (an 8,192-token output adds steps,
# not prefills: its TTFT is the shorter rows' cost), and a documented client (configs/harnesses.yaml cites its source;
# aiconfigurator's collector rows take the default closed loop, which their TTFT does not follow: scored, not fitted)
FIT_MAX_CLIENTS = 32
FIT_MAX_OUTPUT = 2048
FIT_HARNESSES = ("inferencemax",)


def fit_eligible(t):
    """The rows of ``t`` a per-engine fit may take (:data:`FIT_MAX_CLIENTS`, :data:`FIT_MAX_OUTPUT`,
    :data:`FIT_HARNESSES`)."""
    return t[(t.batch <= FIT_MAX_CLIENTS) & (t.output_len <= FIT_MAX_OUTPUT) & t.harness.isin(FIT_HARNESSES)]


def tpot_fit_rows(t, per_group: int):
    """The eligible rows of ``t``, at most ``per_group`` per (model, engine, layout kind) drawn with a fixed seed (the
    fit's cost), in their order, TTFT unset (fitted on TPOT alone)."""
    import numpy as np

    rows = fit_eligible(t).sample(frac=1.0, random_state=0).groupby(["model", "engine", "kind"]).head(per_group)
    return rows.sort_index().reset_index(drop=True).assign(ttft_s=np.nan)


def servable_rows():
    """The shared serving runs' aggregated rows the studies can run (measured TTFT and TPOT, not offline, nothing
    :func:`slimjax.studies.serving_check.cannot_run` refuses), with ``moe``, ``engine`` (the row's profile key),
    ``family`` (DeepSeek-V3 and R1 are one architecture) and layout ``kind``."""
    import numpy as np

    from slimjax.fit import serving as fit
    from slimjax.fit import validate as study
    from slimjax.inputs.layouts import layout_kind
    from slimjax.inputs.traces import load_many
    from slimjax.studies.serving_check import cannot_run

    frame, _ = load_many(study.default_serving_paths(), None, None)
    t = fit.measured_targets(frame.dropna(subset=["ttft_s", "itl_s"]))
    t = t[~fit.offline_rows(t)].reset_index(drop=True)
    t = t[cannot_run(t) == ""].reset_index(drop=True)
    t["moe"] = np.asarray(fit.lane_inputs(t)["model"].n_experts) > 0
    t["engine"] = fit.row_profiles(t)["engine"]
    t["family"] = t.model.str.replace("-R1", "-V3")
    t["kind"] = [layout_kind(a, b, c) for a, b, c in zip(t.n_gpu, t.dp, t.ep, strict=True)]
    return t


def held_constants(t):
    """Per row of ``t`` (a frame with ``gpu`` and ``engine``), the calibrated constants of its GPU and engine as the
    studies take them (:func:`slimjax.studies.serving_check.calibrated_constants`)."""
    import pandas as pd

    from slimjax.studies.serving_check import calibrated_constants

    each = {pair: calibrated_constants(*pair) for pair in set(zip(t.gpu, t.engine, strict=True))}
    return pd.DataFrame([each[p] for p in zip(t.gpu, t.engine, strict=True)], index=t.index)


def error_table(p, by):
    """MAPE and bias (%) of TTFT and TPOT per ``variant`` and ``by`` of predictions ``p`` (``ttft_error``,
    ``tpot_error`` as simulated/measured − 1), with their row counts."""
    g = p.groupby(["variant", *([by] if isinstance(by, str) else by)])
    return g.agg(
        rows=("ttft_error", "size"),
        ttft_mape=("ttft_error", lambda e: 100 * e.abs().mean()),
        ttft_bias=("ttft_error", lambda e: 100 * e.mean()),
        tpot_mape=("tpot_error", lambda e: 100 * e.abs().mean()),
        tpot_bias=("tpot_error", lambda e: 100 * e.mean()),
    ).round(1)


def fit_job(name: str, t, parts: Path, fit, predict, before: str, held_out=None) -> None:
    """A per-engine fit script's job on rows ``t`` (with ``family``): ``shipped`` fits on every row (``fit(rows)`` ->
    {param: {engine: fit}}) and predicts every row before (``predict(rows, None)``, labelled ``before``) and after;
    ``lomo`` leaves each model family out in turn (those ``held_out`` selects of ``t``'s rows, default every one),
    fits on the rest and predicts it (written as it goes). Parts in ``parts``: fits.yaml, shipped.csv,
    fits_without_<family>.yaml, lomo.csv."""
    import pandas as pd

    if name == "shipped":
        fits = fit(t)
        (parts / "fits.yaml").write_text(yaml.safe_dump(fits))
        pd.concat(
            [predict(t, None).assign(variant=before), predict(t, fits).assign(variant="fitted, in sample")]
        ).to_csv(parts / "shipped.csv", index=False)
    elif name == "lomo":
        out = []
        for m in sorted(t.family[held_out if held_out is not None else slice(None)].unique()):
            rest = t[t.family != m].reset_index(drop=True)
            print(f"leave {m} out: {len(rest)} rows", flush=True)
            fits = fit(rest)
            (parts / f"fits_without_{m.replace('/', '_')}.yaml").write_text(yaml.safe_dump(fits))
            part = t[t.family == m].reset_index(drop=True)
            out.append(predict(part, fits).assign(variant="leave one model out"))
            pd.concat(out, ignore_index=True).to_csv(parts / "lomo.csv", index=False)  # as it goes
    else:
        raise SystemExit(f"unknown job {name!r}: shipped, lomo or report")
