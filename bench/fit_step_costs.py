"""Fit the engines' fixed step costs — t_step (host work per step), t_L (each layer's small kernels), t_X (a routed-
expert layer's router, top-k, permutation and grouped-GEMM launches) and τ_c (the engine's own all-reduce kernel) —
per engine profile through the MODEL.md §9 serving simulation on the shared serving runs' dense and MoE rows, and
measure them leaving one model out (configs/roofline/default.yaml blocks ``step_overhead_s``, ``layer_overhead_s``,
``expert_layer_overhead_s``, ``engine_allreduce_latency_s``; docs/engines.md).

    python bench/fit_step_costs.py --jobs fit --parts /tmp/fit_steps        # the in-sample fit (25 min here)
    python bench/fit_step_costs.py --jobs shipped --parts /tmp/fit_steps    # fit, predict every row (hours here)
    python bench/fit_step_costs.py --jobs lomo --parts /tmp/fit_steps       # leave one MoE model out
    python bench/fit_step_costs.py --jobs report --parts /tmp/fit_steps --write

(JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 lets the processes share their
compiled loops.) Nothing it fitted is shipped yet: its first fit did not converge and could not tell t_step, t_L and
t_X apart within an engine (bench/RESULTS.md, "A step's fixed costs per layer"); ``--write`` is for a fit that does.

Why: a decode step's cost beyond its roofline, read off the measured rows (bench/RESULTS.md, "What the MoE rows say
about a decode step's fixed cost"), grows with the layers (vLLM at TP 1: 3.3 ms for gpt-oss-120b's 36 layers, 4.8 ms
for Llama-3.1-70B's 80), more for routed-expert layers (MiniMax-M2.5 and Kimi-K2.5: 7–10 ms at 61–62 layers), and is
flat in TP where NCCL's all-reduce (18 µs a call at 8 GPUs) would add 1.3–3 ms: the engines' own all-reduce kernels
cost a few µs. One per-step constant (t_step) cannot be right for 36 and 80 layers at once.

Rows: ../shared/data/measured/serving_silicon_h100_h200.csv, every model the studies can run (every layout), each run
as its harness ran it with its engine's profile and the shipped calibrated constants of its GPU and engine (e_XF,
e_XB included); fitted on TPOT (TTFT carries the client's overhead) of the rows of a documented client, C ≤ 32
clients and outputs ≤ 2,048 tokens, at most SAMPLE rows per (model, engine, layout kind); predicted on every row.
Each constant is a time > 0; a constant outside its physical range (:data:`PHYSICAL_S`) is reported, not shipped.
Held out: leave one model out (DeepSeek-V3 and R1 are one architecture: left out together); an engine that has no
rows left for a constant takes the engines' row-weighted mean.
"""

from __future__ import annotations

import datetime
import functools
import os
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from common import (
    FIT_HARNESSES,
    FIT_MAX_CLIENTS,
    FIT_MAX_OUTPUT,
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

ITERATIONS = int(os.environ.get("FIT_ITERATIONS", 10))
HELD_OUT = os.environ.get("HELD_OUT", "moe")  # the families left out in turn: the MoE models' (issue 39), or "all"
LOMO_ITERATIONS = int(os.environ.get("LOMO_ITERATIONS", 3))  # from the in-sample fit: near its optimum already
SAMPLE = int(os.environ.get("FIT_SAMPLE", 10))  # TPOT fit rows per (model, engine, layout kind): the fit's cost
FREE = ("step_overhead_s", "layer_overhead_s", "expert_layer_overhead_s", "engine_allreduce_latency_s")
START = dict(step_overhead_s=5e-4, layer_overhead_s=2e-5, expert_layer_overhead_s=3e-5, engine_allreduce_latency_s=6e-6)
# what each can physically be, seconds: host work per step; a layer's handful of small kernels at their few-µs floor;
# a routed layer's further dozen; a one-shot all-reduce over NVLink (the custom kernels publish 3–10 µs at 8 GPUs)
PHYSICAL_S = dict(
    step_overhead_s=(0.0, 0.02),
    layer_overhead_s=(0.0, 1e-4),
    expert_layer_overhead_s=(0.0, 3e-4),
    engine_allreduce_latency_s=(1e-6, 2e-5),
)


def fit_rows(t: pd.DataFrame) -> pd.DataFrame:
    return tpot_fit_rows(t, SAMPLE)


def fit_costs(t: pd.DataFrame, warm: dict | None = None, iterations: int = ITERATIONS) -> dict:
    """{param: {engine: fit}} by the serving fit on TPOT, every other constant held at the shipped ones; ``warm``: a
    fit ({param: {engine: fit}}) each engine starts from (its values, at least 1 ns), else :data:`START`."""
    from slimjax.fit import serving as fit

    rows = fit_rows(t)
    print(f"fitting {', '.join(FREE)} per engine on the TPOT of {len(rows)} rows", flush=True)
    print(rows.groupby(["engine", "family"]).size().to_string(), flush=True)
    held, start = held_constants(rows), START
    if warm is not None:  # each engine's level starts at its value in ``held`` (calibrate_serving_by's rule)
        for p in FREE:
            own = {e: max(f["value"], 1e-9) for e, f in warm[p].items()}
            held[p] = rows.engine.map(own).fillna(START[p]).to_numpy(float)
        start = None
    ds = fit.calibrate_serving_by(rows, held, {p: "engine" for p in FREE}, start=start, iterations=iterations)
    out = {p: {} for p in FREE}
    for v in range(ds.sizes["value"]):
        one = ds.isel(value=v)
        p, engine = str(one.param.values), str(one.level.values)
        f = fitted_value(one)
        lo, hi = PHYSICAL_S[p]
        f["physical"] = bool(lo <= f["value"] <= hi)
        out[p][engine] = f
        print(f"  {p} {engine}: {f['value']:.4g} ± {f['standard_error']:.2g} {f}", flush=True)
    return out


def _usable(f: dict) -> bool:
    return f.get("identified", True) and f.get("physical", True)


def _default(by_engine: dict) -> float:
    """The identified, physical engines' row-weighted mean; 0 where none is."""
    mean = row_weighted_mean(by_engine, _usable)
    return 0.0 if np.isnan(mean) else mean


def constants_for(t: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    """Per row, the held constants and the fitted costs as the studies take them (``calibrated_step_cost``): its
    engine's where identified and physical, 0 where its fit ended at the bound 0, else the identified engines'
    row-weighted mean; None: the shipped constants."""
    c = held_constants(t)
    if fits is None:
        return c
    for p, by_engine in fits.items():
        own = {e: (f["value"] if _usable(f) else 0.0) for e, f in by_engine.items() if _usable(f) or f["at_bound"]}
        c[p] = t.engine.map(own).fillna(_default(by_engine)).to_numpy(float)
    return c


def predict(t: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    from slimjax.fit import serving as fit
    from slimjax.inputs.serving import calibrated_request_overhead

    got = fit.predict_serving(t, constants_for(t, fits))
    got["ttft_sim_s"] = got["ttft_sim_s"] + [calibrated_request_overhead(e) for e in t.engine]
    got["ttft_error"] = got["ttft_sim_s"] / got["ttft_s"] - 1
    return got


def report(parts: Path, write: bool) -> None:
    fits = yaml.safe_load((parts / "fits.yaml").read_text())
    moving = [f"{k} {e}" for k, v in fits.items() for e, f in v.items() if _usable(f) and not f["converged"]]
    if write and moving:
        raise SystemExit(
            f"not written: the fit of {', '.join(moving)} did not converge (a fit still moving is not shipped)"
        )
    p = pd.concat([pd.read_csv(parts / f) for f in ("shipped.csv", "lomo.csv") if (parts / f).exists()])
    p["all"] = "all"
    p["class"] = np.where(p.moe, "MoE", "dense")
    for by in ("all", "class", ["class", "engine"], "family", ["family", "engine"], "kind"):
        print(error_table(p, by).to_string(), "\n")
    print(yaml.safe_dump(fits))
    moving = [f"{k} {e}" for k, v in fits.items() for e, f in v.items() if _usable(f) and not f["converged"]]
    if write and moving:
        raise SystemExit(
            f"not written: the fit of {', '.join(moving)} did not converge (a fit still moving is not shipped)"
        )
    if write:
        for key, by_engine in fits.items():
            block = {
                "method": "bench/fit_step_costs.py: slimjax.fit.serving.calibrate_serving_by, one joint fit of t_step, "
                "t_L, t_X and τ_c per engine profile (the MODEL.md §9 simulation as forward model, each row run as its "
                "harness ran it with its engine's profile, every other constant at its GPU's and engine's shipped one) "
                f"on the TPOT of rows of C <= {FIT_MAX_CLIENTS} and O <= {FIT_MAX_OUTPUT} of the harnesses "
                f"{', '.join(FIT_HARNESSES)}, dense and MoE models; an engine without rows has none (0)",
                "data": "../shared/data/measured/serving_silicon_h100_h200.csv",
                "fitted": str(datetime.date.today()),
                # an engine its rows cannot tell apart (or without rows): the identified engines' row-weighted mean
                "default": float(f"{_default(by_engine):.4g}"),
                "engines": {
                    e: {
                        k: (float(f"{v:.4g}") if isinstance(v, float) else v)
                        for k, v in {**f, "identified": f["identified"] and f["physical"]}.items()
                    }
                    for e, f in sorted(by_engine.items())
                },
            }
            write_roofline_block(key, block)


def main() -> None:
    """Jobs: ``fit`` (parts/fits.yaml alone; ``continue`` from it to parts/fits_continued.yaml), ``shipped`` and
    ``lomo`` (:func:`common.fit_job`; ``lomo`` starts each fit from parts/fits.yaml where ``fit`` or ``shipped`` wrote
    it, for :data:`LOMO_ITERATIONS`), ``report``."""
    args, parts = job_arguments("shipped", "/tmp/fit_steps", write=True)
    for name in args.jobs.split(","):
        if name == "report":
            report(parts, args.write)
            continue
        if name == "fit":  # the in-sample fit alone (predict later, row subsets in other processes)
            (parts / "fits.yaml").write_text(yaml.safe_dump(fit_costs(servable_rows())))
            continue
        if name == "continue":  # the in-sample fit continued from parts/fits.yaml until it converges
            warm = yaml.safe_load((parts / "fits.yaml").read_text())
            (parts / "fits_continued.yaml").write_text(yaml.safe_dump(fit_costs(servable_rows(), warm=warm)))
            continue
        fit = fit_costs
        if name == "lomo" and (parts / "fits.yaml").exists():
            warm = yaml.safe_load((parts / "fits.yaml").read_text())
            fit = functools.partial(fit_costs, warm=warm, iterations=LOMO_ITERATIONS)
        t = servable_rows()
        fit_job(name, t, parts, fit, predict, "shipped before", held_out=t.moe if HELD_OUT == "moe" else None)


if __name__ == "__main__":
    main()
