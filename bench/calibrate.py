"""Calibration benchmark: 10 000 independent synthetic SLIM fits in one batched call, against
scipy.optimize.least_squares in a loop on a subsample, in the same run.

Each problem: a catalog architecture on a catalog GPU, known coefficients, 20–40 points at varied
batch, input and output lengths, 2 % multiplicative noise on E2E. Reported: per-fit time ratio,
final-loss comparison on the subsample, recovery of the coefficients the design identifies,
compile time apart.

    python bench/calibrate.py [--problems 10000] [--subsample 100]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

import slimjax
from slimjax.fit.slim import STARTS, calibrate
from slimjax.inputs.catalog import resolve_gpu, resolve_model
from slimjax.model.specs import SLIM_PARAMS

slimjax.configure()  # one CPU device per core, float64, before JAX runs

MODELS = [
    "OPT-1.3b",
    "OPT-6.7b",
    "OPT-13b",
    "Llama-2-7b",
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "Qwen2-7B",
    "Mistral-7B-v0.1",
]
GPUS = ["A100-SXM-80GB", "H100-SXM", "H200", "L40S", "B200"]


def numpy_slim(theta, arch, gpu, B, I, O):
    """SLIM (MODEL.md §1) in plain numpy, for the scipy reference."""
    eta_c, eta_m, B0, alpha, gamma, t_fixed = theta
    D, L = arch["hidden"], arch["n_layers"]
    kvw = arch["n_kv_heads"] * arch["head_dim"]
    flops = L * (B * I * (4 * D * D + 4 * D * kvw + 2 * arch["n_ffn"] * arch["ffn_dim"] * D) + 4 * B * I * I * D)
    m_dec = L * 2 * kvw * arch["kv_dtype_bytes"] * (O * (I + 1) + O * (O - 1) / 2)
    t_d = alpha * O + gamma * L * (D / 1024) ** 2 * O
    e2e = (
        flops / (eta_c * gpu["flops_per_s"]) + (B + B0) / eta_m * (t_d + m_dec / gpu["bandwidth_bytes_per_s"]) + t_fixed
    )
    return B * (I + O) / e2e


def make_problems(n: int, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    archs = {m: resolve_model(m)[1] for m in MODELS}
    gpus = {g: resolve_gpu(g)[1] for g in GPUS}
    truth = np.column_stack(
        [
            rng.uniform(0.2, 0.9, n),
            rng.uniform(0.3, 1.0, n),
            rng.uniform(1, 40, n),
            rng.uniform(1e-5, 5e-4, n),
            rng.uniform(1e-7, 1e-5, n),
            rng.uniform(0.01, 1.0, n),
        ]
    )
    rows = []
    for k in range(n):
        m, g = MODELS[rng.integers(len(MODELS))], GPUS[rng.integers(len(GPUS))]
        npts = int(rng.integers(20, 41))
        B = rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256], npts).astype(float)
        I = rng.choice([32, 128, 512, 1024, 2048, 4096], npts).astype(float)
        O = rng.choice([16, 64, 128, 256, 512, 1024], npts).astype(float)
        t = numpy_slim(truth[k], archs[m], gpus[g], B, I, O) / (1 + 0.02 * rng.standard_normal(npts))
        rows.append(
            pd.DataFrame(
                dict(
                    problem=k,
                    model=m,
                    gpu=g,
                    n_gpu=1,
                    framework="synthetic",
                    batch=B.astype(int),
                    input_len=I.astype(int),
                    output_len=O.astype(int),
                    throughput=t,
                    e2e_s=B * (I + O) / t,
                    ttft_s=np.nan,
                    itl_s=np.nan,
                )
            )
        )
    return pd.concat(rows, ignore_index=True), truth


def scipy_fit(df: pd.DataFrame) -> tuple[np.ndarray, float]:
    arch, gpu = resolve_model(df.model.iloc[0])[1], resolve_gpu(df.gpu.iloc[0])[1]
    B, I, O, t = (df[c].to_numpy(float) for c in ("batch", "input_len", "output_len", "throughput"))

    def res(z):
        return numpy_slim(np.exp(z), arch, gpu, B, I, O) / t - 1

    best = None
    for start in STARTS:
        with np.errstate(all="ignore"):
            r = least_squares(res, np.log(start), method="lm", max_nfev=2000)
        if best is None or r.cost < best.cost:
            best = r
    return np.exp(best.x), float(2 * best.cost)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=10_000)
    ap.add_argument("--subsample", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    traces, truth = make_problems(args.problems)
    small = traces[traces.problem < 8]
    t0 = time.perf_counter()
    calibrate(
        small, group_by=("problem",), iterations=args.iterations
    )  # compile (shapes differ from the big call: its pad size)
    t_compile_small = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = calibrate(traces, group_by=("problem",), iterations=args.iterations)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = calibrate(traces, group_by=("problem",), iterations=args.iterations)
    t_jax = time.perf_counter() - t0

    rng = np.random.default_rng(1)
    sub = rng.choice(args.problems, args.subsample, replace=False)
    t0 = time.perf_counter()
    scipy_out = {k: scipy_fit(traces[traces.problem == k]) for k in sub}
    t_scipy = time.perf_counter() - t0

    loss = ds.loss.values
    not_worse = np.mean([loss[k] <= scipy_out[k][1] * (1 + 1e-6) + 1e-12 for k in sub])
    coef, ident = ds.coefficients.values, ds.identified.values
    rel = np.abs(coef / truth - 1)
    recovered = rel[ident] < 0.05
    print(
        json.dumps(
            {
                "problems": args.problems,
                "points": len(traces),
                "compile_s_small_call": round(t_compile_small, 2),
                "first_big_call_s_incl_compile": round(t_first, 2),
                "batched_s": round(t_jax, 2),
                "batched_per_fit_ms": 1e3 * t_jax / args.problems,
                "scipy_per_fit_ms": 1e3 * t_scipy / args.subsample,
                "per_fit_speedup": (t_scipy / args.subsample) / (t_jax / args.problems),
                "loss_not_worse_than_scipy_fraction": float(not_worse),
                "converged_fraction": float(ds.converged.mean()),
                "identified_fraction_by_param": dict(
                    zip(SLIM_PARAMS, ident.mean(axis=0).round(3).tolist(), strict=True)
                ),
                "recovered_within_5pct_of_identified": float(recovered.mean()),
                # are the standard errors honest? the truth within ±1.96 SE (nominal 95 %) of identified estimates
                "truth_within_1p96_se_of_identified": float(
                    (np.abs(coef - truth) <= 1.96 * ds.standard_error.values)[ident].mean()
                ),
                "recovered_within_5pct_by_param": {
                    p: float((rel[:, i][ident[:, i]] < 0.05).mean()) if ident[:, i].any() else None
                    for i, p in enumerate(SLIM_PARAMS)
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
