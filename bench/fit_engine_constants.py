"""Fit the constants of FP8 kernels and of the engines — e_F8 and e_B8, the roofline's compute and bandwidth
efficiencies where 8-bit weights run at the FP8 peak (per GPU), and t_step, the fixed cost of one engine step beyond
the GPU's t_l (per engine profile) — in one joint fit through the MODEL.md §9 serving simulation on the shared
serving runs' dense FP8 rows, and measure them held out (configs/roofline/default.yaml blocks
``compute_efficiency_fp8``, ``bandwidth_efficiency_fp8``, ``step_overhead_s``).

    python bench/fit_engine_constants.py --jobs shipped --parts /tmp/fit_engines      # fit, predict every row
    python bench/fit_engine_constants.py --jobs loeo,logo --parts /tmp/fit_engines    # held out (another core)
    python bench/fit_engine_constants.py --jobs report --parts /tmp/fit_engines --write

Why: the shipped e_F, e_B and t_l (configs/roofline/default.yaml ``gpus``) are fitted on bf16 and fp16 runs of
engines taken together. FP8 GEMMs reach a smaller fraction of their (twice as high) peak than bf16 ones (every FP8
prompt ran ~1.7× faster than measured at e_F), and the FP8 kernels that stream 8-bit weights another fraction of the
HBM bandwidth; and the engines differ by a per-step cost the GPU's constants cannot hold: at 4 clients on one H200,
Llama-3.1-70B FP8 decodes 1.4–1.9 ms a step faster under TensorRT-LLM than under vLLM at every TP degree (20.1 vs
21.5 ms at TP 1, 6.3 vs 7.9 at TP 8), a difference no bandwidth or link constant makes (it does not scale with the
weights per GPU). All three are bounded: e_F8, e_B8 in (0, 1), t_step > 0.

Rows: ../shared/data/measured/serving_silicon_h100_h200.csv (and the aiconfigurator silicon rows), dense models
(MoE is the expert-parallel issue's) whose 8-bit weights run at the GPU's FP8 peak, that the studies can run; each
run as its harness ran it (configs/harnesses.yaml) with its engine's profile (configs/engines.yaml), every other
constant at the shipped calibrated values of its GPU. Fitted on the rows of a documented client (InferenceMAX's;
aiconfigurator's collector rows run as the default closed loop, which their TTFT does not follow: scored only) with
C ≤ 32 clients and outputs ≤ 2,048 tokens (TTFT there is a prefill and a step or two; longer outputs add steps of
the same kind), scored on TTFT and TPOT; predicted on every row. One fit: e_F8 and e_B8 per GPU and t_step per engine
together (slimjax.fit.serving.calibrate_serving_by), so a GPU measured under two engines separates what is the
GPU's from what is the engine's. ``default`` e_F8/e_B8 (GPUs with an FP8 peak and no FP8 rows) is the row-weighted
mean of the GPUs' fits; an engine without rows has no t_step (0: the GPU's t_l alone). Held out: leave one engine out
and leave one GPU out (a GPU left without rows takes the others' mean, an engine none); leave one model out cannot
be run while the documented dense FP8 rows hold one model.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from common import (
    FIT_HARNESSES,
    FIT_MAX_CLIENTS,
    FIT_MAX_OUTPUT,
    fit_eligible,
    fitted_value,
    job_arguments,
    row_weighted_mean,
    write_roofline_block,
)

ITERATIONS = int(os.environ.get("FIT_ITERATIONS", 10))
# each fitted constant and the row column it takes one value per
FREE = {"compute_efficiency_fp8": "gpu", "bandwidth_efficiency_fp8": "gpu", "step_overhead_s": "engine"}
START = {"compute_efficiency_fp8": 0.45, "bandwidth_efficiency_fp8": 0.75, "step_overhead_s": 5e-4}


def fp8_rows() -> pd.DataFrame:
    """The shared serving runs' dense FP8 rows the studies can run."""
    from slimjax.fit import serving as fit
    from slimjax.fit import validate as study
    from slimjax.inputs.traces import load_many
    from slimjax.model.calculator import runs_at_fp8_peak
    from slimjax.studies.serving_check import cannot_run

    frame, _ = load_many(study.default_serving_paths(), None, None)
    t = fit.measured_targets(frame.dropna(subset=["ttft_s", "itl_s"]))
    t = t[~fit.offline_rows(t)].reset_index(drop=True)
    x = fit.lane_inputs(t)
    fp8 = np.asarray(runs_at_fp8_peak(x["gpu"], t["weight_dtype_bytes"].fillna(2.0).to_numpy(float)))
    dense = np.asarray(x["model"].n_experts) == 0
    t = t[fp8 & dense].reset_index(drop=True)
    t = t[cannot_run(t) == ""].reset_index(drop=True)
    t["engine"] = fit.row_profiles(t)["engine"]
    return t


def held_constants(t: pd.DataFrame) -> pd.DataFrame:
    """Per row, the calibrated constants of its GPU as the studies take them, the fitted ones left out (the FP8
    efficiencies unset: e_F, e_B; t_step the GPU fit's)."""
    from slimjax.inputs.serving import FP8_EFFICIENCIES
    from slimjax.studies.serving_check import calibrated_constants

    out = {}
    for g in t.gpu.unique():  # no engine named: no engine's t_step
        out[g] = {k: v for k, v in calibrated_constants(g).items() if k not in FP8_EFFICIENCIES}
    return pd.DataFrame([out[g] for g in t.gpu], index=t.index)


def fit_joint(t: pd.DataFrame, start: dict | None = None) -> dict:
    """e_F8, e_B8 per GPU and t_step per engine on ``t``'s fit rows, jointly: {param: {level: fit}}; from
    :data:`START`, or ``start`` (a previous fit's, to continue it)."""
    from slimjax.fit import serving as fit

    rows = fit_eligible(t).reset_index(drop=True)
    if rows.empty:  # nothing left to identify them: unset
        return {p: {} for p in FREE}
    held = held_constants(rows)
    if start:  # a previous fit's values, level by level, as the held constants the fit starts from
        for p, by in FREE.items():
            held[p] = rows[by].map({k: f["value"] for k, f in start[p].items()}).to_numpy(float)
    ds = fit.calibrate_serving_by(rows, held, FREE, start=None if start else START, iterations=ITERATIONS)
    out = {p: {} for p in FREE}
    for v in range(ds.sizes["value"]):
        one = ds.isel(value=v)
        p, level = str(one.param.values), str(one.level.values)
        out[p][level] = fitted_value(one)
        print(f"  {p} {level}: {out[p][level]['value']:.4g} ± {out[p][level]['standard_error']:.2g}", flush=True)
    out["mape_in_sample"] = {"ttft": round(float(ds.mape_ttft), 2), "tpot": round(float(ds.mape_tpot), 2)}
    return out


def fitted_constants(t: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    """Per row of ``t``, the constants it is predicted at: the held ones and, where ``fits`` (None: before, every
    fitted constant unset) has them, its GPU's e_F8 and e_B8 (the GPUs' mean for a GPU without its own) and its
    engine's t_step (the held one for an engine without)."""
    c = held_constants(t)
    if fits is None:
        return c
    for p, by in FREE.items():
        own = {k: f["value"] for k, f in fits[p].items() if f["identified"]}
        if by == "gpu":
            c[p] = t[by].map(own).fillna(row_weighted_mean(fits[p])).to_numpy(float)
        else:
            c[p] = t[by].map(own).fillna(c[p]).to_numpy(float)
    return c


def predict(t: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    from slimjax.fit import serving as fit

    return fit.predict_serving(t, fitted_constants(t, fits))


def held_out(t: pd.DataFrame, by: str) -> pd.DataFrame:
    """Each value of ``by`` predicted with the constants fitted on the other values' rows."""
    out = []
    for v in sorted(t[by].unique()):
        rest = t[t[by] != v].reset_index(drop=True)
        print(f"leave {by} {v} out: {len(rest)} rows", flush=True)
        fits = fit_joint(rest)
        part = t[t[by] == v].reset_index(drop=True)
        out.append(predict(part, fits).assign(variant=f"leave one {by} out"))
    return pd.concat(out, ignore_index=True)


def job(name: str, t: pd.DataFrame, parts: Path) -> None:
    if name in ("shipped", "converge"):  # converge: the shipped fit continued from where its iterations ran out
        previous = yaml.safe_load((parts / "fits.yaml").read_text()) if name == "converge" else None
        fits = fit_joint(t, previous)
        (parts / "fits.yaml").write_text(yaml.safe_dump(fits))
        pd.concat(
            [predict(t, None).assign(variant="before (unset)"), predict(t, fits).assign(variant="fitted, in sample")]
        ).to_csv(parts / "shipped.csv", index=False)
    elif name == "loeo":
        held_out(t, "engine").to_csv(parts / "loeo.csv", index=False)
    elif name == "logo":
        held_out(t, "gpu").to_csv(parts / "logo.csv", index=False)
    else:
        raise SystemExit(f"unknown job {name!r}: shipped, converge, loeo, logo or report")


def errors(p: pd.DataFrame, by: str | list) -> pd.DataFrame:
    g = p.groupby(["variant", *([by] if isinstance(by, str) else by)])
    f = dict(
        rows=("ttft_error", "size"),
        ttft_mape=("ttft_error", lambda e: 100 * e.abs().mean()),
        ttft_bias=("ttft_error", lambda e: 100 * e.mean()),
        tpot_mape=("tpot_error", lambda e: 100 * e.abs().mean()),
        tpot_bias=("tpot_error", lambda e: 100 * e.mean()),
    )
    return g.agg(**f).round(1)


def _rounded(fits: dict) -> dict:
    return {
        level: {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in f.items()}
        for level, f in sorted(fits.items())
    }


def report(parts: Path, write: bool) -> None:
    fits = yaml.safe_load((parts / "fits.yaml").read_text())
    p = pd.concat([pd.read_csv(parts / f) for f in ("shipped.csv", "loeo.csv", "logo.csv") if (parts / f).exists()])
    p["all"] = "all"
    for by in ("all", "harness", "gpu", "model", "engine", "n_gpu", ["engine", "n_gpu"]):
        print(errors(p, by).to_string(), "\n")
    if not write:
        return
    by_harness = errors(p, "harness").reset_index()
    fitted = datetime.date.today().isoformat()
    method = (
        "bench/fit_engine_constants.py: slimjax.fit.serving.calibrate_serving_by, one joint fit of e_F8 and e_B8 "
        "per GPU and t_step per engine profile (the MODEL.md §9 simulation as forward model, each row run as its "
        "harness ran it with its engine's profile, every other constant at its GPU's shipped one), on rows of C <= "
        f"{FIT_MAX_CLIENTS} and O <= {FIT_MAX_OUTPUT} of the harnesses {', '.join(FIT_HARNESSES)}"
    )
    scored = {
        variant: {
            r.harness: {
                "rows": int(r.rows),
                "ttft": {"mape": float(r.ttft_mape), "bias": float(r.ttft_bias)},
                "tpot": {"mape": float(r.tpot_mape), "bias": float(r.tpot_bias)},
            }
            for r in rows.itertuples()
        }
        for variant, rows in by_harness.groupby("variant", sort=False)
    }
    data = (
        "../shared/data/measured/serving_silicon_h100_h200.csv (and the aiconfigurator silicon rows): dense models "
        "with 8-bit weights at the GPU's FP8 peak"
    )
    for key in ("compute_efficiency_fp8", "bandwidth_efficiency_fp8"):
        block = {
            "method": f"{method}; default: the GPUs' row-weighted mean",
            "data": data,
            "fitted": fitted,
            "gpus": _rounded(fits[key]),
            "default": float(f"{row_weighted_mean(fits[key]):.4g}"),
        }
        if key == "compute_efficiency_fp8":
            block["mape_in_sample"] = fits["mape_in_sample"]
            block["scored_every_c"] = scored
        write_roofline_block(key, block)
    write_roofline_block(
        "step_overhead_s",
        {
            "method": f"{method}; an engine without rows has none (0: the GPU's t_l alone, as for `generic`); "
            "scores under compute_efficiency_fp8",
            "data": data,
            "fitted": fitted,
            "engines": _rounded(fits["step_overhead_s"]),
        },
    )


def main() -> None:
    a, parts = job_arguments("shipped,loeo,logo,report", "/tmp/fit_engines", write=True)
    jobs = a.jobs.split(",")
    t = fp8_rows() if set(jobs) - {"report"} else None
    if t is not None:
        print(
            f"{len(t)} dense FP8 rows: " + ", ".join(f"{k} {v}" for k, v in t.groupby(["model", "gpu"]).size().items())
        )
    for name in jobs:
        if name == "report":
            report(parts, a.write)
        else:
            job(name, t, parts)


if __name__ == "__main__":
    main()
