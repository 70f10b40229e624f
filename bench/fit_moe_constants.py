"""Fit the routed experts' kernel efficiencies — e_XF and e_XB, the fractions of the dense GEMMs' achieved FLOP/s and
bandwidth the experts' grouped GEMMs reach (docs/layouts.md) — through the MODEL.md §9 serving simulation on the
shared serving runs' MoE rows, and measure them leaving one model out (configs/roofline/default.yaml block
``expert_efficiency``).

    python bench/fit_moe_constants.py --jobs shipped --parts /tmp/fit_moe      # fit, predict every MoE row
    python bench/fit_moe_constants.py --jobs lomo --parts /tmp/fit_moe         # leave one model out (another core)
    python bench/fit_moe_constants.py --jobs report --parts /tmp/fit_moe --write

Why: with the dense constants (fitted on Llama rows) every MoE row's prefill runs 2–3× faster than measured, and
its decode 25–40 % faster (DeepSeek-V3/R1 under SGLang and TensorRT-LLM, gpt-oss-120b under TensorRT-LLM): per
prompt token gpt-oss-120b on one H200 takes 45 µs where 2·P_act at the dense efficiency gives 19; DeepSeek-R1 on 8
H200 26 µs where it gives 14.5. Both need the routed experts' FLOPs at about a third of the dense GEMMs' rate: the
experts run as grouped GEMMs of n·k/E tokens each (and MXFP4 experts on Hopper dequantise to bf16), which reach a
smaller fraction of the peak than a dense GEMM of n tokens. Both constants are fractions in (0, 1].

Rows: ../shared/data/measured/serving_silicon_h100_h200.csv, MoE models the studies can run (every layout), each run
as its harness ran it with its engine's profile and the shipped calibrated constants of its GPU and engine. Fitted
on the rows of a documented client (InferenceMAX's) with C ≤ 32 clients and outputs ≤ 2,048 tokens, scored on TTFT
and TPOT; predicted on every MoE row. One value of each for every MoE model and engine (the kernels are the
engines' MoE kernels: per engine where rows allow is the next step). Held out: leave one model out (DeepSeek-V3 and
R1 are one architecture: left out together).
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from common import fitted_value, job_arguments, write_roofline_block

FIT_MAX_CLIENTS = 32
FIT_MAX_OUTPUT = 2048
FIT_HARNESSES = ("inferencemax",)
ITERATIONS = int(os.environ.get("FIT_ITERATIONS", 8))
FREE = {"expert_compute_efficiency": "experts", "expert_bandwidth_efficiency": "experts"}
START = {"expert_compute_efficiency": 0.5, "expert_bandwidth_efficiency": 0.8}
SAMPLE = int(os.environ.get("FIT_SAMPLE", 12))  # fit rows per (model, engine, layout kind): the fit's cost


def moe_rows() -> pd.DataFrame:
    """The shared serving runs' MoE rows the studies can run, with their engine, model family and layout kind."""
    from slimjax.fit import serving as fit
    from slimjax.fit import validate as study
    from slimjax.inputs.layouts import layout_kind
    from slimjax.inputs.traces import load_many
    from slimjax.studies.serving_check import cannot_run

    frame, _ = load_many(study.default_serving_paths(), None, None)
    t = fit.measured_targets(frame.dropna(subset=["ttft_s", "itl_s"]))
    t = t[~fit.offline_rows(t)].reset_index(drop=True)
    x = fit.lane_inputs(t)
    t = t[np.asarray(x["model"].n_experts) > 0].reset_index(drop=True)
    t = t[cannot_run(t) == ""].reset_index(drop=True)
    t["engine"] = fit.row_profiles(t)["engine"]
    t["family"] = t.model.str.replace("-R1", "-V3")  # one architecture
    t["kind"] = [layout_kind(a, b, c) for a, b, c in zip(t.n_gpu, t.dp, t.ep, strict=True)]
    t["experts"] = "all"
    return t


def held_constants(t: pd.DataFrame) -> pd.DataFrame:
    """Per row, the calibrated constants of its GPU and engine as the studies take them."""
    from slimjax.studies.serving_check import calibrated_constants

    each = {pair: calibrated_constants(*pair) for pair in set(zip(t.gpu, t.engine, strict=True))}
    return pd.DataFrame([each[p] for p in zip(t.gpu, t.engine, strict=True)], index=t.index)


def fit_rows(t: pd.DataFrame) -> pd.DataFrame:
    rows = t[(t.batch <= FIT_MAX_CLIENTS) & (t.output_len <= FIT_MAX_OUTPUT) & t.harness.isin(FIT_HARNESSES)]
    rows = rows.sample(frac=1.0, random_state=0).groupby(["model", "engine", "kind"]).head(SAMPLE)
    return rows.sort_index().reset_index(drop=True)


def fit_experts(t: pd.DataFrame) -> dict:
    """e_XF and e_XB on ``t``'s fit rows: {param: fit}."""
    from slimjax.fit import serving as fit

    rows = fit_rows(t)
    print(f"fitting on {len(rows)} rows", flush=True)
    ds = fit.calibrate_serving_by(rows, held_constants(rows), FREE, start=START, iterations=ITERATIONS)
    out = {}
    for v in range(ds.sizes["value"]):
        one = ds.isel(value=v)
        p = str(one.param.values)
        out[p] = fitted_value(one)
        print(f"  {p}: {out[p]['value']:.4g} ± {out[p]['standard_error']:.2g}", flush=True)
    out["mape_in_sample"] = {"ttft": round(float(ds.mape_ttft), 2), "tpot": round(float(ds.mape_tpot), 2)}
    return out


def predict(t: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    from slimjax.fit import serving as fit

    c = held_constants(t)
    for p in FREE:
        if fits is not None and fits[p]["identified"]:
            c[p] = fits[p]["value"]
    got = fit.predict_serving(t, c)
    overhead = [_overhead(e) for e in t.engine]  # the client's, as the serving check adds it
    got["ttft_sim_s"] = got["ttft_sim_s"] + overhead
    got["ttft_error"] = got["ttft_sim_s"] / got["ttft_s"] - 1
    return got


def _overhead(engine: str) -> float:
    from slimjax.inputs.serving import calibrated_request_overhead

    return calibrated_request_overhead(engine)


def job(name: str, t: pd.DataFrame, parts: Path) -> None:
    if name == "shipped":
        fits = fit_experts(t)
        (parts / "fits.yaml").write_text(yaml.safe_dump(fits))
        pd.concat(
            [predict(t, None).assign(variant="before (1, 1)"), predict(t, fits).assign(variant="fitted, in sample")]
        ).to_csv(parts / "shipped.csv", index=False)
    elif name == "lomo":
        out = []
        for m in sorted(t.family.unique()):
            rest = t[t.family != m].reset_index(drop=True)
            print(f"leave {m} out: {len(rest)} rows", flush=True)
            fits = fit_experts(rest)
            part = t[t.family == m].reset_index(drop=True)
            out.append(predict(part, fits).assign(variant="leave one model out"))
        pd.concat(out, ignore_index=True).to_csv(parts / "lomo.csv", index=False)
    else:
        raise SystemExit(f"unknown job {name!r}: shipped, lomo or report")


def errors(p: pd.DataFrame, by) -> pd.DataFrame:
    g = p.groupby(["variant", *([by] if isinstance(by, str) else by)])
    return g.agg(
        rows=("ttft_error", "size"),
        ttft_mape=("ttft_error", lambda e: 100 * e.abs().mean()),
        ttft_bias=("ttft_error", lambda e: 100 * e.mean()),
        tpot_mape=("tpot_error", lambda e: 100 * e.abs().mean()),
        tpot_bias=("tpot_error", lambda e: 100 * e.mean()),
    ).round(1)


def report(parts: Path, write: bool) -> None:
    fits = yaml.safe_load((parts / "fits.yaml").read_text())
    p = pd.concat([pd.read_csv(parts / f) for f in ("shipped.csv", "lomo.csv") if (parts / f).exists()])
    p["all"] = "all"
    for by in ("all", "family", "engine", "kind", ["family", "engine"]):
        print(errors(p, by).to_string(), "\n")
    if write:
        block = {
            p: {
                "value": float(f"{fits[p]['value']:.4g}"),
                "standard_error": float(f"{fits[p]['standard_error']:.2g}"),
                "identified": fits[p]["identified"],
                "rows": fits[p]["rows"],
                "converged": fits[p]["converged"],
            }
            for p in FREE
        }
        block["fitted"] = str(datetime.date.today())
        block["source"] = "bench/fit_moe_constants.py (MoE InferenceMAX rows of the shared serving runs)"
        write_roofline_block("expert_efficiency", block)


def main() -> None:
    args, parts = job_arguments("shipped", "/tmp/fit_moe", write=True)
    for name in args.jobs.split(","):
        if name == "report":
            report(parts, args.write)
        else:
            job(name, moe_rows(), parts)


if __name__ == "__main__":
    main()
