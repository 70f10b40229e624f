"""The SLIM paper's generalization study (source 000, §VII-A, Table II) on measured data.

Five scenarios, each a set of folds (train rows, held-out rows) over one trace table:

* ``same-curve``: per GPU, fit the three smallest (pre-knee) batch sizes of every (model, length)
  curve, predict the rest of each curve.
* ``model-transfer``: per GPU and model, fit the other models on that GPU, predict the model.
* ``length-transfer``: per GPU, fit IL = OL ≤ 1024, predict the longest length (2048).
* ``gpu-transfer``: fit every row of one GPU (H100), predict every row of the other (A100) through
  its specs.
* ``combined``: per GPU and model, fit the other models at the shorter lengths, predict the model at
  the longest length (unseen in both model and length, as the paper's OPT-6.7B at OL = 512).

Methods: ``slim`` (MODEL.md §1, squared relative errors as the paper), ``slim-kv`` (the optional
variant of :mod:`slimjax.slim`, fitted with the robust Cauchy loss of :func:`slimjax.calibrate`),
``llmvisor-agg`` and ``imai-ood-lr`` (:mod:`slimjax.baselines`), and ``roofline`` (the capacity
calculator's plain roofline of MODEL.md §4, uncalibrated: e_F = e_B = 1, t_l = 0; the batch E2E is its
service time S(B)). Every SLIM fold of every scenario is one group of a single batched calibration.
Errors are MAPE of total-token throughput and of E2E over the pooled held-out rows of a scenario.
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

from ..config import uses_float64
from ..errors import SlimjaxError, suggest
from .baselines import BASELINES
from .features import row_features
from .roofline import roofline_service_at
from .slim import calibrate, predict

SCENARIOS = ("same-curve", "model-transfer", "length-transfer", "gpu-transfer", "combined")
METHODS = ("slim", "slim-kv", "llmvisor-agg", "imai-ood-lr", "roofline")
SOURCE_GPU, TARGET_GPU = "H100-SXM", "A100-SXM-40GB"
PRE_KNEE = 3  # batch sizes per curve the same-curve scenario fits
SLIM_FITS = {"slim": "squared", "slim-kv": "cauchy"}  # method → calibration loss


class Fold(NamedTuple):
    scenario: str
    name: str
    train: np.ndarray  # row positions
    test: np.ndarray


class Validation(NamedTuple):
    table: pd.DataFrame  # (scenario) × (metric, method)
    predictions: pd.DataFrame  # one row per held-out row × method
    folds: list[Fold]


def default_trace_paths() -> list[Path]:
    """llm_inference_bench.csv and its TTFT table under $SLIMJAX_DATA, else ../shared/data beside the
    working directory, else beside the repository slimjax runs from (so it works from any folder)."""
    if os.environ.get("SLIMJAX_DATA"):
        root = Path(os.environ["SLIMJAX_DATA"])
    else:
        here = Path("..") / "shared" / "data"
        beside_repo = Path(__file__).resolve().parents[3] / "shared" / "data"
        root = here if here.is_dir() or not beside_repo.is_dir() else beside_repo
    root = root / "measured"
    return [root / "llm_inference_bench.csv", root / "llm_inference_bench_ttft_e2e.csv"]


def study_rows(traces: pd.DataFrame) -> pd.DataFrame:
    """The paper's setting within ``traces``: vLLM, one GPU, H100 and A100 rows with an E2E and a
    throughput (scored and fitted), or a TTFT only (fitted: it identifies prefill), indexed 0..n−1."""
    rows = traces[(traces["framework"] == "vLLM") & (traces["n_gpu"] == 1) & traces["gpu"].isin([SOURCE_GPU, TARGET_GPU])]
    scored = rows["e2e_s"].notna() & rows["throughput"].notna()
    rows = rows[scored | rows["ttft_s"].notna()].reset_index(drop=True)
    if not (rows["e2e_s"].notna() & rows["throughput"].notna()).any():
        raise SlimjaxError("traces", f"no vLLM single-GPU rows on {SOURCE_GPU} or {TARGET_GPU} with e2e_s and throughput")
    return rows


def folds(rows: pd.DataFrame) -> list[Fold]:
    """Every scenario's folds over ``rows`` (see the module docstring); empty folds are skipped."""
    out: list[Fold] = []
    pos = np.arange(len(rows))
    ttft_only = (rows["e2e_s"].isna() | rows["throughput"].isna()).to_numpy()

    def add(scenario, name, train, test):
        test = test & ~ttft_only
        if train.any() and test.any():
            out.append(Fold(scenario, name, pos[train], pos[test]))

    longest = rows["input_len"].max()
    # models with a full curve set on a GPU are the ones worth holding out
    counts = rows[~ttft_only].groupby(["gpu", "model"]).size()
    held = [(g, m) for (g, m), n in counts.items() if n >= 8]
    for gpu in sorted(rows["gpu"].unique()):
        on = (rows["gpu"] == gpu).to_numpy()
        rank = rows[on].groupby(["model", "input_len", "output_len"])["batch"].rank(method="dense")
        small = np.zeros(len(rows), bool)
        small[pos[on]] = (rank <= PRE_KNEE).to_numpy()
        curve_size = rows[on].groupby(["model", "input_len", "output_len"])["batch"].transform("nunique")
        full = np.zeros(len(rows), bool)
        full[pos[on]] = (curve_size > PRE_KNEE).to_numpy()
        add("same-curve", gpu, on & ((small & full) | ttft_only), on & ~small & full)
        short = (rows["input_len"] < longest).to_numpy()
        add("length-transfer", gpu, on & short, on & ~short)
        for g, model in held:
            if g != gpu:
                continue
            this = (rows["model"] == model).to_numpy()
            add("model-transfer", f"{gpu}/{model}", on & ~this, on & this)
            add("combined", f"{gpu}/{model}", on & ~this & short, on & this & ~short)
    add("gpu-transfer", f"{SOURCE_GPU}->{TARGET_GPU}", (rows["gpu"] == SOURCE_GPU).to_numpy(), (rows["gpu"] == TARGET_GPU).to_numpy())
    return out


def _roofline_e2e(rows: pd.DataFrame) -> np.ndarray:
    return np.asarray(roofline_service_at(1.0, 1.0, 0.0, jax.tree_util.tree_map(jnp.asarray, row_features(rows)))["service_s"])


def _mape(pred, meas) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


@uses_float64
def validate(traces: pd.DataFrame, methods: Sequence[str] = METHODS, scenarios: Sequence[str] = SCENARIOS, *,
             iterations: int = 100, exclude: Sequence[str] = ()) -> Validation:
    """Run the generalization study on ``traces`` (canonical table, e.g. ``load_traces`` of
    llm_inference_bench.csv). Returns the MAPE table, the per-row held-out predictions and the folds.
    ``exclude``: pandas query strings over the trace columns; matching rows leave the study (neither
    fitted nor scored), e.g. to measure how much a suspect run weighs."""
    for field, values, allowed in (("methods", methods, METHODS), ("scenarios", scenarios, SCENARIOS)):
        for v in values:
            if v not in allowed:
                raise SlimjaxError(field, f"unknown {field[:-1]} {v!r}{suggest(str(v), list(allowed))}; one of {', '.join(allowed)}")
    rows = study_rows(traces)
    for query in exclude:
        try:
            hit = rows.eval(query)
        except Exception as e:  # pandas raises many types for a bad expression
            raise SlimjaxError("exclude", f"{query!r} is not a query over {', '.join(rows.columns)} ({e})") from None
        if getattr(hit, "dtype", None) != bool:
            raise SlimjaxError("exclude", f"{query!r} does not select rows (it must be a condition)")
        rows = rows[~hit].reset_index(drop=True)
    chosen = [f for f in folds(rows) if f.scenario in scenarios]
    if not chosen:
        raise SlimjaxError("traces", "no scenario has both training and held-out rows")
    tag = lambda f: f"{f.scenario}|{f.name}"  # noqa: E731
    test = pd.concat([rows.iloc[f.test].assign(fold=tag(f), scenario=f.scenario) for f in chosen], ignore_index=True)
    pred: dict[str, np.ndarray] = {}
    bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for method in methods:
        if method in SLIM_FITS:
            train = pd.concat([rows.iloc[f.train].assign(fold=tag(f)) for f in chosen], ignore_index=True)
            coeffs = calibrate(train, group_by=["fold"], variant=method, iterations=iterations, loss=SLIM_FITS[method])
            p = predict(coeffs, test)
            pred[method] = p["pred_e2e_s"].to_numpy()
            bounds[method] = (p["pred_throughput_lo"].to_numpy(), p["pred_throughput_hi"].to_numpy())
        elif method == "roofline":
            pred[method] = _roofline_e2e(test)
        else:
            fit, apply = BASELINES[method]
            pred[method] = np.concatenate([apply(fit(rows.iloc[f.train]), rows.iloc[f.test]) for f in chosen])
    tokens = (test["batch"] * (test["input_len"] + test["output_len"])).to_numpy(float)
    nan = np.full(len(test), np.nan)
    long = pd.concat([test.assign(method=m, pred_e2e_s=p, pred_throughput=tokens / p, pred_throughput_lo=bounds.get(m, (nan, nan))[0],
                                  pred_throughput_hi=bounds.get(m, (nan, nan))[1]) for m, p in pred.items()], ignore_index=True)
    records = []
    for (scenario, method), g in long.groupby(["scenario", "method"], sort=False):
        records.append({"scenario": scenario, "method": method, "n_folds": g["fold"].nunique(), "n_test": len(g),
                        "mape_throughput": _mape(g["pred_throughput"].to_numpy(), g["throughput"].to_numpy()),
                        "mape_e2e": _mape(g["pred_e2e_s"].to_numpy(), g["e2e_s"].to_numpy()),
                        "coverage_90": 100.0 * float(np.mean((g["throughput"] >= g["pred_throughput_lo"]) & (g["throughput"] <= g["pred_throughput_hi"])))
                        if g["pred_throughput_lo"].notna().all() else np.nan})
    metrics = ["mape_throughput", "mape_e2e", "coverage_90"]
    table = pd.DataFrame(records).pivot(index="scenario", columns="method", values=metrics)
    table = table.reindex(index=[s for s in SCENARIOS if s in scenarios and s in table.index],
                          columns=pd.MultiIndex.from_product([metrics, list(methods)]))
    sizes = pd.DataFrame(records).groupby("scenario")[["n_folds", "n_test"]].first()
    table[("n_folds", "")], table[("n_test", "")] = sizes["n_folds"], sizes["n_test"]
    return Validation(table, long, chosen)


def markdown_table(table: pd.DataFrame) -> str:
    """The validation table as Markdown: one row per scenario, MAPE throughput / E2E per method, and
    the held-out coverage of SLIM's 90 % throughput intervals."""
    methods = [m for m in table["mape_throughput"].columns]
    covered = [m for m in methods if table[("coverage_90", m)].notna().any()]
    head = ("| scenario | folds | held-out rows | " + " | ".join(f"{m} T / E2E" for m in methods)
            + "".join(f" | {m} 90 % cover" for m in covered) + " |")
    lines = [head, "|" + "---|" * (3 + len(methods) + len(covered))]
    for scenario, r in table.iterrows():
        cells = [f"{r[('mape_throughput', m)]:.1f} / {r[('mape_e2e', m)]:.1f}" for m in methods]
        cells += [f"{r[('coverage_90', m)]:.0f} %" for m in covered]
        lines.append(f"| {scenario} | {int(r[('n_folds', '')])} | {int(r[('n_test', '')])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
