"""The SLIM paper's generalization study (source 000, §VII-A, Table II) on measured data.

The five scenarios are :mod:`.folds`' (same-curve, model-transfer, length-transfer, gpu-transfer between
every pair of GPUs, combined), within every (framework, TP degree) setting the traces hold.

Methods: ``slim`` (MODEL.md §1, squared relative errors as the paper), ``slim-kv`` (the optional
variant of :mod:`slimjax.slim`, fitted with the robust Cauchy loss of :func:`slimjax.calibrate`),
``llmvisor-agg`` and ``imai-ood-lr`` (:mod:`slimjax.baselines`), and ``roofline`` (the capacity
calculator's plain roofline of MODEL.md §4, uncalibrated: e_F = e_B = 1, t_l = 0; the batch E2E is its
service time S(B)). Every SLIM fold of every scenario is one group of a single batched calibration.
Errors are MAPE of total-token throughput and of E2E over the pooled held-out rows of a scenario.

SLIM's intervals are scored twice: the fit's own 90 % intervals (coefficient covariance and residual
scatter), and the transfer intervals of :mod:`.transfer`, whose form term for a fold comes from the
held-out scores of the *other* folds of the matching kind that neither fitted nor held out any of its
held-out rows — the interval never sees the rows it is judged on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from .. import constants
from ..config import uses_float64
from ..errors import SlimjaxError, suggest
from ..model.intervals import (
    INTERVAL_LEVEL,
    extrapolation_form_error,
    extrapolation_label,
    form_errors,
    transfer_interval,
)
from .baselines import BASELINES
from .features import measured_e2e, measured_throughput, row_features, workload_tokens
from .folds import SCENARIOS, SETTING, Fold, folds, setting_name, study_rows
from .roofline import roofline_service_at
from .slim import calibrate, predict
from .transfer import fold_bits, held_out_scores, kind_codes

METHODS = constants.VALIDATION_METHODS
SLIM_FITS = {"slim": "squared", "slim-kv": "cauchy"}  # method → calibration loss
METRICS = ("mape_throughput", "mape_e2e", "coverage_90", "coverage_transfer", "width_transfer")
BANDWIDTH_EXPONENTS = (
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    1.0,
)  # slim-kv's β candidates for GPU transfer (0.2 and 1.2 were never chosen)


class Validation(NamedTuple):
    table: pd.DataFrame  # (scenario) × (metric, method), plus n_folds, n_test and the winner
    predictions: pd.DataFrame  # one row per held-out row × method
    folds: list[Fold]
    dropped: dict  # rows left out of the study, by cause
    bandwidth_exponents: dict  # slim-kv's β per GPU-transfer fold, chosen on the other settings' transfers


def _measured_root() -> Path:
    """measured/ under $SLIMJAX_DATA, else ../shared/data beside the working directory, else beside the
    repository slimjax runs from (so it works from any folder)."""
    if os.environ.get("SLIMJAX_DATA"):
        root = Path(os.environ["SLIMJAX_DATA"])
    else:
        here = Path("..") / "shared" / "data"
        beside_repo = Path(__file__).resolve().parents[3] / "shared" / "data"
        root = here if here.is_dir() or not beside_repo.is_dir() else beside_repo
    return root / "measured"


def default_trace_paths() -> list[Path]:
    """llm_inference_bench.csv and its TTFT table (:func:`_measured_root`)."""
    root = _measured_root()
    return [root / "llm_inference_bench.csv", root / "llm_inference_bench_ttft_e2e.csv"]


def default_serving_paths() -> list[Path]:
    """The measured serving runs ``validate --serving`` scores by default: aiconfigurator's silicon runs of vLLM,
    SGLang and TensorRT-LLM on H100 and H200 and Splitwise's perf model (:func:`_measured_root`)."""
    root = _measured_root()
    return [root / "serving_silicon_h100_h200.csv", root / "splitwise_perf_model.csv"]


def _roofline_e2e(rows: pd.DataFrame) -> np.ndarray:
    return np.asarray(
        roofline_service_at(1.0, 1.0, 0.0, jax.tree_util.tree_map(jnp.asarray, row_features(rows)))["service_s"]
    )


def _mape(pred, meas) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


@uses_float64
def validate(
    traces: pd.DataFrame,
    methods: Sequence[str] = METHODS,
    scenarios: Sequence[str] = SCENARIOS,
    *,
    iterations: int = 100,
    exclude: Sequence[str] = (),
) -> Validation:
    """Run the generalization study on ``traces`` (canonical table, e.g. ``load_traces`` of
    llm_inference_bench.csv). Returns the MAPE table, the per-row held-out predictions and the folds.
    ``exclude``: pandas query strings over the trace columns; matching rows leave the study (neither
    fitted nor scored), e.g. to measure how much a suspect run weighs."""
    for field, values, allowed in (("methods", methods, METHODS), ("scenarios", scenarios, SCENARIOS)):
        for v in values:
            if v not in allowed:
                raise SlimjaxError(
                    field, f"unknown {field[:-1]} {v!r}{suggest(str(v), list(allowed))}; one of {', '.join(allowed)}"
                )
    rows, dropped = study_rows(traces)
    for query in exclude:
        try:
            hit = rows.eval(query)
        except Exception as e:  # pandas raises many types for a bad expression
            raise SlimjaxError("exclude", f"{query!r} is not a query over {', '.join(rows.columns)} ({e})") from None
        if getattr(hit, "dtype", None) is None or hit.dtype.kind != "b":
            raise SlimjaxError("exclude", f"{query!r} does not select rows (it must be a condition)")
        if hit.any():
            dropped[f"excluded by {query!r}"] = int(hit.sum())
        rows = rows[~hit].reset_index(drop=True)
    every = folds(rows)
    chosen = [f for f in every if f.scenario in scenarios]
    if not chosen:
        raise SlimjaxError("traces", "no scenario has both training and held-out rows")
    # transfer intervals draw each fold's form term from other folds of every kind: SLIM scores them all
    scored = every if any(m in SLIM_FITS for m in methods) else chosen
    tag = lambda f: f"{f.scenario}|{f.name}"  # noqa: E731
    test = pd.concat([rows.iloc[f.test].assign(fold=tag(f), scenario=f.scenario) for f in scored], ignore_index=True)
    fold_of = np.repeat(np.arange(len(scored)), [len(f.test) for f in scored])
    bits = np.concatenate([fold_bits(rows, f) for f in scored])
    eligible = _calibrating_rows(scored, len(rows))[:, fold_of]
    pred: dict[str, np.ndarray] = {}
    extra: dict[str, dict] = {}
    exponents = {}
    for method in methods:
        if method in SLIM_FITS:
            p, exponents = _slim_predictions(rows, scored, test, method, iterations)
            form = np.asarray(
                form_errors(held_out_scores(p, INTERVAL_LEVEL), kind_codes(test["scenario"]), INTERVAL_LEVEL, eligible)
            )
            m = np.asarray(extrapolation_form_error(bits, form[fold_of]))
            lo, hi = map(
                np.asarray,
                transfer_interval(
                    p["pred_throughput"].to_numpy(), p["pred_throughput_log_sd"].to_numpy(), m, INTERVAL_LEVEL
                ),
            )
            pred[method] = p["pred_e2e_s"].to_numpy()
            extra[method] = dict(
                pred_throughput_lo=p["pred_throughput_lo"].to_numpy(),
                pred_throughput_hi=p["pred_throughput_hi"].to_numpy(),
                pred_throughput_transfer_lo=lo,
                pred_throughput_transfer_hi=hi,
                form_error=m,
            )
        elif method == "roofline":
            pred[method] = _roofline_e2e(test)
        else:
            fit, apply = BASELINES[method]
            pred[method] = np.concatenate([apply(fit(rows.iloc[f.train]), rows.iloc[f.test]) for f in scored])
    tokens = workload_tokens(test)
    test = test.assign(interval_kind=[extrapolation_label(int(b)) for b in bits])
    nan = np.full(len(test), np.nan)
    columns = (
        "pred_throughput_lo",
        "pred_throughput_hi",
        "pred_throughput_transfer_lo",
        "pred_throughput_transfer_hi",
        "form_error",
    )
    long = pd.concat(
        [
            test.assign(
                method=m, pred_e2e_s=p, pred_throughput=tokens / p, **{c: extra.get(m, {}).get(c, nan) for c in columns}
            )
            for m, p in pred.items()
        ],
        ignore_index=True,
    )
    long = long[long["scenario"].isin(scenarios)].reset_index(drop=True)
    long = long.assign(throughput=measured_throughput(long), e2e_s=measured_e2e(long))
    records = []
    for (scenario, method), g in long.groupby(["scenario", "method"], sort=False):
        records.append(
            {
                "scenario": scenario,
                "method": method,
                "n_folds": g["fold"].nunique(),
                "n_test": len(g),
                "mape_throughput": _mape(g["pred_throughput"].to_numpy(), g["throughput"].to_numpy()),
                "mape_e2e": _mape(g["pred_e2e_s"].to_numpy(), g["e2e_s"].to_numpy()),
                "coverage_90": _coverage(g, ""),
                "coverage_transfer": _coverage(g, "_transfer"),
                "width_transfer": _width(g, "_transfer"),
            }
        )
    table = pd.DataFrame(records).pivot(index="scenario", columns="method", values=list(METRICS))
    table = table.reindex(
        index=[s for s in SCENARIOS if s in scenarios and s in table.index],
        columns=pd.MultiIndex.from_product([list(METRICS), list(methods)]),
    )
    sizes = pd.DataFrame(records).groupby("scenario")[["n_folds", "n_test"]].first()
    table[("n_folds", "")], table[("n_test", "")] = sizes["n_folds"], sizes["n_test"]
    score = (table["mape_throughput"] + table["mape_e2e"]) / 2  # the winner errs least on T and E2E together
    table[("winner", "")] = score.idxmin(axis=1)
    variants = [m for m in methods if m in SLIM_FITS]
    if variants:
        table[("winning_variant", "")] = score[variants].idxmin(axis=1)
    return Validation(table, long, chosen, dropped, {tag(scored[k]): b for k, b in exponents.items()})


def _calibrating_rows(scored: list[Fold], n_rows: int) -> np.ndarray:
    """(fold f, fold g): g may calibrate f's transfer interval — g neither fitted nor held out a row f holds out."""
    used = np.zeros((len(scored), n_rows), np.int32)
    held = np.zeros((len(scored), n_rows), np.int32)
    for k, f in enumerate(scored):
        used[k, f.train] = used[k, f.test] = 1
        held[k, f.test] = 1
    return (held @ used.T) == 0


def _candidate_fits(rows: pd.DataFrame, scored: list[Fold], method: str, iterations: int) -> pd.DataFrame:
    """Every fold's held-out predictions from one batched calibration: at β = 1 (any β gives the same fit on one
    GPU), and slim-kv's GPU-transfer folds at every candidate β. Columns ``_k`` (fold position), ``_b`` (β)."""
    cands = {
        k: (BANDWIDTH_EXPONENTS if method == "slim-kv" and f.scenario == "gpu-transfer" else (1.0,))
        for k, f in enumerate(scored)
    }
    train = pd.concat(
        [rows.iloc[scored[k].train].assign(_g=f"{k}|{b}", bandwidth_exponent=b) for k, bs in cands.items() for b in bs],
        ignore_index=True,
    )
    test = pd.concat(
        [
            rows.iloc[scored[k].test].assign(_g=f"{k}|{b}", _k=k, _b=b, bandwidth_exponent=b)
            for k, bs in cands.items()
            for b in bs
        ],
        ignore_index=True,
    )
    fits = calibrate(train, group_by=["_g"], variant=method, iterations=iterations, loss=SLIM_FITS[method])
    return predict(fits, test)


def transfer_exponent_errors(
    rows: pd.DataFrame, scored: list[Fold], iterations: int = 100, candidates: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Σ |log(E2E_pred / E2E_meas)| of slim-kv over each GPU-transfer fold's held-out rows (index: fold
    position in ``scored``) at each candidate β (columns), plus the fold's ``setting``."""
    p = _candidate_fits(rows, scored, "slim-kv", iterations) if candidates is None else candidates
    p = p[p["_k"].map(lambda k: scored[k].scenario == "gpu-transfer")]
    if p.empty:
        return pd.DataFrame(columns=[*BANDWIDTH_EXPONENTS, "setting"])
    error = (
        p.assign(err=np.abs(np.log(p["pred_e2e_s"] / measured_e2e(p)))).groupby(["_k", "_b"])["err"].sum().unstack("_b")
    )
    return error.assign(setting=[setting_name(*rows.iloc[scored[k].test[0]][list(SETTING)]) for k in error.index])


def _slim_predictions(rows, scored, test, method, iterations) -> tuple[pd.DataFrame, dict[int, float]]:
    """A SLIM method's held-out predictions in ``test``'s order, and slim-kv's β per GPU-transfer fold: the
    candidate whose GPU transfers in the *other* (framework, TP) settings err least, so a fold's β never
    sees its own setting's rows; 1 (the datasheet ratio) where no other setting has a GPU pair."""
    p = _candidate_fits(rows, scored, method, iterations)
    chosen = {}
    if method == "slim-kv":
        error = transfer_exponent_errors(rows, scored, candidates=p)
        for k, setting in error["setting"].items():
            others = error[error["setting"] != setting].drop(columns="setting")
            chosen[k] = float(others.sum().idxmin()) if len(others) else 1.0
    keep = p["_b"] == p["_k"].map(lambda k: chosen.get(k, 1.0))
    p = p[keep].reset_index(drop=True)  # fold order, rows in fold order: test's order
    assert len(p) == len(test)
    return p.drop(columns=["_g", "_k", "_b"]).set_axis(test.index), chosen


def _coverage(g: pd.DataFrame, which: str) -> float:
    lo, hi = g[f"pred_throughput{which}_lo"], g[f"pred_throughput{which}_hi"]
    if not lo.notna().any():
        return np.nan
    has = lo.notna() & hi.notna()
    return 100.0 * float(np.mean((g["throughput"][has] >= lo[has]) & (g["throughput"][has] <= hi[has])))


def _width(g: pd.DataFrame, which: str) -> float:
    """Median relative width (hi − lo) / prediction, %."""
    lo, hi = g[f"pred_throughput{which}_lo"], g[f"pred_throughput{which}_hi"]
    if not lo.notna().any():
        return np.nan
    return 100.0 * float(np.median(((hi - lo) / g["pred_throughput"])[lo.notna()]))


def markdown_table(table: pd.DataFrame) -> str:
    """The validation table as Markdown: one row per scenario, MAPE throughput / E2E per method, the
    winner, and for SLIM the held-out coverage of the fit's 90 % throughput intervals and of the
    transfer intervals with their median width."""
    methods = [m for m in table["mape_throughput"].columns]
    covered = [m for m in methods if table[("coverage_90", m)].notna().any()]
    head = (
        "| scenario | folds | held-out rows | "
        + " | ".join(f"{m} T / E2E" for m in methods)
        + " | winner"
        + "".join(f" | {m} fit 90 % cover | {m} transfer cover (width)" for m in covered)
        + " |"
    )
    lines = [head, "|" + "---|" * (4 + len(methods) + 2 * len(covered))]
    for scenario, r in table.iterrows():
        cells = [f"{r[('mape_throughput', m)]:.1f} / {r[('mape_e2e', m)]:.1f}" for m in methods] + [
            str(r[("winner", "")])
        ]
        for m in covered:
            transfer = r[("coverage_transfer", m)]
            cells += [
                f"{r[('coverage_90', m)]:.0f} %",
                f"{transfer:.0f} % ({r[('width_transfer', m)]:.0f} %)"
                if np.isfinite(transfer)
                else "— (no fold of this kind left to calibrate on)",
            ]
        lines.append(
            f"| {scenario} | {int(r[('n_folds', '')])} | {int(r[('n_test', '')])} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)
