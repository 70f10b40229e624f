"""Fit e_F8, the roofline's compute efficiency at the FP8 peak (configs/roofline/default.yaml
``compute_efficiency_fp8``), through the MODEL.md §9 serving simulation on the shared serving runs' dense FP8 rows,
and measure it held out.

    python bench/fit_fp8_efficiency.py --jobs shipped --parts /tmp/fp8      # fit per GPU, predict every FP8 row
    python bench/fit_fp8_efficiency.py --jobs lomo,loeo --parts /tmp/fp8    # held out (another core)
    python bench/fit_fp8_efficiency.py --jobs report --parts /tmp/fp8 --write

Why: the shipped e_F (configs/roofline/default.yaml ``gpus``) is fitted on bf16 and fp16 runs only and the roofline
applied it to the FP8 peak too, so every FP8 prompt ran ~1.7× faster than measured (Llama-3.1-70B FP8 at 4
clients, every TP degree and engine: measured/simulated TTFT 1.7 at 1,024 prompt tokens and 1.5 at 8,192, while
TPOT was right within 5 %). FP8 GEMMs reach a smaller fraction of their (twice as high) peak than bf16 ones, and
attention, norms and activation quantisation around them still run in bf16: a constant of its own, bounded in
(0, 1) like e_F.

Rows: ../shared/data/measured/serving_silicon_h100_h200.csv (and the aiconfigurator silicon rows), dense models
(MoE is the expert-parallel issue's) whose 8-bit weights run at the GPU's FP8 peak, that the studies can run; each
run as its harness ran it (configs/harnesses.yaml) with its engine's profile (configs/engines.yaml), every other
constant at the shipped calibrated values of its GPU. Fitted on the rows of a documented client (InferenceMAX's;
aiconfigurator's collector rows run as the default closed loop, which their TTFT does not follow: scored only) with
C ≤ 32 clients and outputs ≤ 2,048 tokens (TTFT there is a prefill and a step or two: what e_F8 times; longer
outputs add steps, not prefills), scored on TTFT and TPOT; predicted on every row. Per GPU; ``default`` (GPUs
with an FP8 peak and no FP8 rows) is the row-weighted mean of the GPUs' fits. Held out: leave one model out and
leave one engine out and leave one GPU out (fits on the other models' / engines' / GPUs' rows, per GPU; a GPU left
without rows takes the others' row-weighted mean; where no other rows identify e_F8 it stays unset, e_F).
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from common import write_roofline_block

import slimjax

FIT_MAX_CLIENTS = 32
FIT_MAX_OUTPUT = 2048  # an 8,192-token output adds steps, not prefills: its TTFT is the shorter rows' (cost)
# rows whose client is documented (configs/harnesses.yaml cites its source); aiconfigurator's collector rows take
# the default closed loop, which their TTFT does not follow (it grows with the output length at a fixed prompt and
# concurrency): scored, not fitted
FIT_HARNESSES = ("inferencemax",)
ITERATIONS = int(os.environ.get("FIT_ITERATIONS", 10))
KEY = "compute_efficiency_fp8"


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


def shipped_constants(gpus) -> pd.DataFrame:
    """The calibrated constants of each GPU as the studies take them, e_F8 left out (unset: e_F)."""
    from slimjax.inputs.serving import calibrated_efficiency, calibrated_link

    out = {}
    for g in gpus:
        values, _ = calibrated_efficiency(g)
        values.pop(KEY, None)
        out[g] = {**values, **calibrated_link(g)}
    return pd.DataFrame(out).T


def fit_per_gpu(t: pd.DataFrame) -> dict:
    """e_F8 per GPU on ``t``'s rows of C ≤ FIT_MAX_CLIENTS (the GPU's other constants held at the shipped ones)."""
    from slimjax.fit import serving as fit

    rows = t[(t.batch <= FIT_MAX_CLIENTS) & (t.output_len <= FIT_MAX_OUTPUT) & t.harness.isin(FIT_HARNESSES)]
    if rows.empty:  # nothing left to identify it: unset (e_F)
        return {}
    start = shipped_constants(sorted(rows.gpu.unique()))
    start[KEY] = start["compute_efficiency"] * 0.7  # from below the bf16 fraction (FP8's is smaller)
    ds = fit.calibrate_serving(rows, group_by=("gpu",), free=(KEY,), iterations=ITERATIONS, start_by_group=start)
    out = {}
    for g in ds.gpu.values:
        one = ds.sel(gpu=g)
        out[str(g)] = dict(
            value=float(one.coefficients.sel(param=KEY)),
            standard_error=float(one.standard_error.sel(param=KEY)),
            identified=bool(one.identified.sel(param=KEY)),
            at_bound=bool(one.at_bound.sel(param=KEY)),
            converged=bool(one.converged),
            rows=int(one.n_rows),
            mape_in_sample={"ttft": round(float(one.mape_ttft), 2), "tpot": round(float(one.mape_tpot), 2)},
        )
        print(f"  {g}: e_F8 {out[str(g)]['value']:.4f} ± {out[str(g)]['standard_error']:.4f}", flush=True)
    return out


def pooled(fits: dict) -> float:
    """The row-weighted mean of the GPUs' identified fits (NaN, e_F8 then e_F, where none is)."""
    ok = {g: f for g, f in fits.items() if f["identified"]}
    if not ok:
        return float("nan")
    return float(sum(f["value"] * f["rows"] for f in ok.values()) / sum(f["rows"] for f in ok.values()))


def predict(t: pd.DataFrame, e_f8: pd.Series | None) -> pd.DataFrame:
    """``t``'s rows at the shipped constants and e_F8 per row (None: unset, e_F)."""
    from slimjax.fit import serving as fit

    c = shipped_constants(sorted(t.gpu.unique())).loc[t.gpu].reset_index(drop=True)
    c.index = t.index
    c[KEY] = np.nan if e_f8 is None else e_f8.to_numpy(float)
    return fit.predict_serving(t, c)


def held_out(t: pd.DataFrame, by: str) -> pd.DataFrame:
    """Each value of ``by`` predicted with e_F8 fitted on the other values' rows."""
    out = []
    for v in sorted(t[by].unique()):
        rest = t[t[by] != v]
        print(f"leave {by} {v} out: {len(rest)} rows", flush=True)
        fits = fit_per_gpu(rest) if len(rest) else {}
        default = pooled(fits) if fits else np.nan
        part = t[t[by] == v]
        own = {g: f["value"] for g, f in fits.items() if f["identified"]}
        e = part.gpu.map(own).fillna(default)
        out.append(predict(part, e).assign(variant=f"leave one {by} out"))
    return pd.concat(out, ignore_index=True)


def job(name: str, t: pd.DataFrame, parts: Path) -> None:
    if name == "shipped":
        fits = fit_per_gpu(t)
        (parts / "fits.yaml").write_text(yaml.safe_dump({"gpus": fits, "default": pooled(fits)}))
        e = t.gpu.map(lambda g: fits[g]["value"])
        pd.concat(
            [predict(t, None).assign(variant="e_F8 = e_F (before)"), predict(t, e).assign(variant="fitted, in sample")]
        ).to_csv(parts / "shipped.csv", index=False)
    elif name == "lomo":
        held_out(t, "model").to_csv(parts / "lomo.csv", index=False)
    elif name == "loeo":
        held_out(t, "engine").to_csv(parts / "loeo.csv", index=False)
    elif name == "logo":
        held_out(t, "gpu").to_csv(parts / "logo.csv", index=False)
    else:
        raise SystemExit(f"unknown job {name!r}: shipped, lomo, loeo, logo or report")


def errors(p: pd.DataFrame, by: str) -> pd.DataFrame:
    g = p.groupby(["variant", by])
    f = dict(
        rows=("ttft_error", "size"),
        ttft_mape=("ttft_error", lambda e: 100 * e.abs().mean()),
        ttft_bias=("ttft_error", lambda e: 100 * e.mean()),
        tpot_mape=("tpot_error", lambda e: 100 * e.abs().mean()),
        tpot_bias=("tpot_error", lambda e: 100 * e.mean()),
    )
    return g.agg(**f).round(1)


def report(parts: Path, write: bool) -> None:
    fits = yaml.safe_load((parts / "fits.yaml").read_text())
    p = pd.concat(
        [pd.read_csv(parts / f) for f in ("shipped.csv", "lomo.csv", "loeo.csv", "logo.csv") if (parts / f).exists()]
    )
    p["all"] = "all"
    for by in ("all", "harness", "gpu", "model", "engine", "n_gpu"):
        print(errors(p, by).to_string(), "\n")
    if not write:
        return
    by_harness = errors(p, "harness").reset_index()
    block = {
        "method": "bench/fit_fp8_efficiency.py: slimjax.calibrate_serving with e_F8 alone free per GPU (the "
        "MODEL.md §9 simulation as forward model, each row run as its harness ran it with its engine's profile, the "
        "GPU's other constants at the shipped ones), on rows of C <= "
        f"{FIT_MAX_CLIENTS} and O <= {FIT_MAX_OUTPUT} of the harnesses {', '.join(FIT_HARNESSES)}; default: the GPUs' "
        "row-weighted mean",
        "data": "../shared/data/measured/serving_silicon_h100_h200.csv (and the aiconfigurator silicon rows): dense "
        "models with 8-bit weights at the GPU's FP8 peak",
        "fitted": datetime.date.today().isoformat(),
        "gpus": {
            g: {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in f.items()}
            for g, f in sorted(fits["gpus"].items())
        },
        "default": float(f"{fits['default']:.4g}"),
        "scored_every_c": {
            variant: {
                r.harness: {
                    "rows": int(r.rows),
                    "ttft": {"mape": float(r.ttft_mape), "bias": float(r.ttft_bias)},
                    "tpot": {"mape": float(r.tpot_mape), "bias": float(r.tpot_bias)},
                }
                for r in rows.itertuples()
            }
            for variant, rows in by_harness.groupby("variant", sort=False)
        },
    }
    write_roofline_block(KEY, block)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="shipped,lomo,loeo,report")
    ap.add_argument("--parts", default="/tmp/fit_fp8")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    slimjax.configure()
    parts = Path(a.parts)
    parts.mkdir(parents=True, exist_ok=True)
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
