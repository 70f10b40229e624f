"""Fit the routed experts' kernel efficiencies per engine — e_XF and e_XB, the fractions of the dense GEMMs' achieved
FLOP/s and bandwidth the experts' grouped GEMMs reach (docs/layouts.md) — through the MODEL.md §9 serving simulation
on the shared serving runs' MoE rows, and measure them leaving one model out (configs/roofline/default.yaml block
``expert_efficiency``).

e_XF from how TTFT grows with the prompt: rows measured at 1,024 and 8,192 prompt tokens with everything else equal
(at most 8 clients), whose TTFT difference is the longer prompt's extra prefill and carries none of what every
request pays whatever its prompt; e_XF is where the simulated difference equals the measured one (median over the
engine's pairs). Fitting it on TTFT itself would absorb those constant parts (DeepSeek's rows under SGLang and
TensorRT-LLM carry 0.2–0.45 s at 4 clients that no prefill of 1,024 tokens explains: a global fit on TTFT and TPOT
put e_XF at 0.16, a third of what the slopes say). Then e_XB per engine by the serving fit on TPOT alone.

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
as its harness ran it with its engine's profile and the shipped calibrated constants of its GPU and engine; fitted on
the rows of a documented client (InferenceMAX's), TPOT on C ≤ 32 clients and outputs ≤ 2,048 tokens; predicted on
every MoE row. One value of each per engine (the kernels are the engines' MoE kernels: vLLM's fused MoE, SGLang's,
TensorRT-LLM's); an engine without MoE rows takes the engines' row-weighted mean. Held out: leave one model out
(DeepSeek-V3 and R1 are one architecture: left out together).
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
    error_table,
    fit_job,
    fitted_value,
    held_constants,
    job_arguments,
    row_weighted_mean,
    servable_rows,
    tpot_fit_rows,
    write_roofline_block,
)

ITERATIONS = int(os.environ.get("FIT_ITERATIONS", 8))
SAMPLE = int(os.environ.get("FIT_SAMPLE", 12))  # TPOT fit rows per (model, engine, layout kind): the fit's cost
SLOPE_MAX_CLIENTS = 8  # TTFT's growth with the prompt is a prefill's where few requests queue
SLOPE_PROMPTS = (1024, 8192)
# e_XF values the prefill slope is simulated at (1/e_XF evenly spaced: the slope is near linear in it)
SLOPE_GRID = (1.0, 0.5, 1 / 3, 0.25, 0.2, 1 / 6, 1 / 7, 0.125)


def moe_rows() -> pd.DataFrame:
    """The shared serving runs' MoE rows the studies can run, with their engine, model family and layout kind."""
    t = servable_rows()
    return t[t.moe].reset_index(drop=True).assign(experts="all")


def slope_pairs(t: pd.DataFrame) -> pd.DataFrame:
    """Rows measured at both prompts of :data:`SLOPE_PROMPTS` with everything else equal (documented client, at most
    :data:`SLOPE_MAX_CLIENTS` clients): their TTFT difference is the longer prompt's extra prefill, free of what every
    request pays whatever its prompt (client, queue for a step, the first token's own step)."""
    key = ["model", "engine", "gpu", "n_gpu", "dp", "ep", "batch", "output_len"]
    rows = t[(t.harness.isin(FIT_HARNESSES)) & (t.batch <= SLOPE_MAX_CLIENTS) & t.input_len.isin(SLOPE_PROMPTS)]
    both = rows.groupby(key).input_len.transform("nunique") == 2
    return rows[both].drop_duplicates(subset=[*key, "input_len"]).reset_index(drop=True)


def slope_ratios(pairs: pd.DataFrame, e_xb: dict) -> pd.DataFrame:
    """Per pair and e_XF of :data:`SLOPE_GRID`: simulated over measured TTFT difference (e_XB per engine held)."""
    from slimjax.fit import serving as fit

    key = ["model", "engine", "gpu", "n_gpu", "dp", "ep", "batch", "output_len"]
    out = []
    for xf in SLOPE_GRID:
        c = held_constants(pairs)
        c["expert_compute_efficiency"] = xf
        c["expert_bandwidth_efficiency"] = pairs.engine.map(e_xb).fillna(1.0).to_numpy(float)
        p = fit.predict_serving(pairs, c).set_index([*key, "input_len"])
        lo, hi = (p.xs(n, level="input_len") for n in SLOPE_PROMPTS)
        ratio = (hi.ttft_sim_s - lo.ttft_sim_s) / (hi.ttft_s - lo.ttft_s)
        out.append(ratio.rename("ratio").reset_index().assign(e_xf=xf))
        print(f"  e_XF {xf:.3g}: median slope ratio {float(ratio.median()):.3g}", flush=True)
    return pd.concat(out, ignore_index=True)


def compute_efficiency_from_slopes(ratios: pd.DataFrame) -> dict:
    """Per engine, e_XF where the median simulated/measured prefill slope crosses 1 (interpolated in 1/e_XF, where
    the slope is near linear; the grid's end where it does not cross: at_bound)."""
    out = {}
    for engine, g in ratios.groupby("engine"):
        med = g.groupby("e_xf").ratio.median().sort_index(ascending=False)  # e_XF falling: the ratio rising
        inv, r = 1.0 / med.index.to_numpy(float), med.to_numpy(float)
        crossing = np.interp(1.0, r, inv) if r[0] <= 1.0 <= r[-1] else np.nan
        value = 1.0 / crossing if np.isfinite(crossing) else float(med.index[-1] if r[-1] < 1 else med.index[0])
        pairs = int(g.groupby("e_xf").size().iloc[0])
        out[engine] = dict(
            value=float(value),
            identified=bool(np.isfinite(crossing)),
            at_bound=not np.isfinite(crossing),
            rows=2 * pairs,
        )
        print(f"  e_XF {engine}: {value:.3g} ({pairs} prompt pairs)", flush=True)
    return out


def bandwidth_efficiency_from_tpot(t: pd.DataFrame, e_xf: dict) -> dict:
    """Per engine, e_XB by the serving fit on TPOT alone (TTFT left out: it carries what the slope leaves out), e_XF
    held at its slope fit."""
    from slimjax.fit import serving as fit

    rows = tpot_fit_rows(t, SAMPLE)
    held = held_constants(rows)
    held["expert_compute_efficiency"] = rows.engine.map({k: f["value"] for k, f in e_xf.items()}).fillna(1.0)
    print(f"fitting e_XB on the TPOT of {len(rows)} rows", flush=True)
    free = {"expert_bandwidth_efficiency": "engine"}
    ds = fit.calibrate_serving_by(rows, held, free, start={"expert_bandwidth_efficiency": 0.8}, iterations=ITERATIONS)
    out = {}
    for v in range(ds.sizes["value"]):
        one = ds.isel(value=v)
        out[str(one.level.values)] = fitted_value(one)
        print(f"  e_XB {one.level.values}: {float(one.coefficient):.4g} ± {float(one.standard_error):.2g}", flush=True)
    return out


def fit_experts(t: pd.DataFrame) -> dict:
    """e_XF per engine from the prefill slopes, then e_XB per engine from TPOT: {param: {engine: fit}}."""
    pairs = slope_pairs(t)
    print(f"e_XF from {len(pairs)} rows' prefill slopes", flush=True)
    e_xf = compute_efficiency_from_slopes(slope_ratios(pairs, {}))
    e_xb = bandwidth_efficiency_from_tpot(t, e_xf)
    return {"expert_compute_efficiency": e_xf, "expert_bandwidth_efficiency": e_xb}


def constants_for(t: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    """Per row, the held constants and, where ``fits`` has its engine's, e_XF and e_XB (an engine without: the
    others' row-weighted mean; None: both 1)."""
    c = held_constants(t)
    if fits is None:
        return c
    for p, by_engine in fits.items():
        ok = {e: f for e, f in by_engine.items() if f.get("identified", True)}
        mean = row_weighted_mean(by_engine)
        c[p] = t.engine.map({e: f["value"] for e, f in ok.items()}).fillna(mean if ok else 1.0).to_numpy(float)
    return c


def predict(t: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    from slimjax.fit import serving as fit

    got = fit.predict_serving(t, constants_for(t, fits))
    overhead = [_overhead(e) for e in t.engine]  # the client's, as the serving check adds it
    got["ttft_sim_s"] = got["ttft_sim_s"] + overhead
    got["ttft_error"] = got["ttft_sim_s"] / got["ttft_s"] - 1
    return got


def _overhead(engine: str) -> float:
    from slimjax.inputs.serving import calibrated_request_overhead

    return calibrated_request_overhead(engine)


def report(parts: Path, write: bool) -> None:
    fits = yaml.safe_load((parts / "fits.yaml").read_text())
    p = pd.concat([pd.read_csv(parts / f) for f in ("shipped.csv", "lomo.csv") if (parts / f).exists()])
    p["all"] = "all"
    for by in ("all", "family", "engine", "kind", ["family", "engine"]):
        print(error_table(p, by).to_string(), "\n")
    print(yaml.safe_dump(fits))
    if write:
        block = {}
        for p, by_engine in fits.items():
            mean = row_weighted_mean(by_engine)
            if np.isnan(mean):
                raise SystemExit(f"not written: no engine's {p} is identified")
            block[p] = {
                "default": float(f"{mean:.4g}"),  # an engine without MoE rows: the engines' row-weighted mean
                "engines": {
                    e: {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in f.items()}
                    for e, f in sorted(by_engine.items())
                },
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
            fit_job(name, moe_rows(), parts, fit_experts, predict, "before (1, 1)")


if __name__ == "__main__":
    main()
