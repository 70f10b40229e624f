"""The SLIM paper's generalization scenarios (source 000, §VII-A, Table II) as folds over any trace table.

A *setting* is one (framework, n_gpu): rows measured with one serving stack at one tensor-parallel
degree. Within each setting and GPU:

* ``same-curve``: fit the three smallest (pre-knee) batch sizes of every (model, length) curve,
  predict the rest of each curve.
* ``model-transfer``: per model with a full curve set (≥ 8 scored rows), fit the other models, predict it.
* ``length-transfer``: fit the shorter inputs, predict the longest input length.
* ``combined``: per such model, fit the other models at the shorter lengths, predict the model at the
  longest length (unseen in both model and length, as the paper's OPT-6.7B at OL = 512).

And within each setting, ``gpu-transfer`` between every ordered pair of GPUs it holds: fit every row of
one GPU, predict every row of the other through its specs.

Used by ``slimjax validate`` (:mod:`.validate`) and by ``calibrate(..., intervals="transfer")``, which
estimates each kind's model-form error from these folds' held-out residuals on its own training data.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from .. import constants
from ..errors import SlimjaxError
from ..inputs.catalog import resolve_gpu, resolve_model

SCENARIOS = constants.SCENARIOS
SETTING = ("framework", "n_gpu")
PRE_KNEE = 3  # batch sizes per curve the same-curve scenario fits
FULL_CURVES = 8  # scored rows a (setting, GPU, model) needs to be held out as a model


class Fold(NamedTuple):
    scenario: str
    name: str
    train: np.ndarray  # row positions
    test: np.ndarray


def _resolvable(names, resolve) -> dict:
    """{name: None if the catalog resolves it, else the reason}; one lookup per distinct name."""
    out = {}
    for name in names:
        try:
            resolve(name)
            out[name] = None
        except SlimjaxError as e:
            out[name] = str(e)
    return out


def study_rows(traces: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows the scenarios can use, indexed 0..n−1, and the dropped ones counted by cause.

    A row is used when its model and GPU resolve in the catalog and it has a positive batch and lengths,
    and an E2E or throughput (scored and fitted) or a TTFT (fitted only: it identifies prefill). Rows
    without a framework form the setting ``unknown``; without ``n_gpu`` they count as one GPU."""
    rows = traces.reset_index(drop=True).copy()
    if "framework" not in rows:
        rows["framework"] = "unknown"
    rows["framework"] = rows["framework"].astype(object).where(rows["framework"].notna(), "unknown")
    if "n_gpu" not in rows:
        rows["n_gpu"] = 1
    rows["n_gpu"] = rows["n_gpu"].fillna(1)
    dropped: dict[str, int] = {}
    keep = np.ones(len(rows), bool)

    def drop(mask, reason):
        mask = np.asarray(mask, bool) & keep
        if mask.any():
            dropped[reason] = dropped.get(reason, 0) + int(mask.sum())
            keep[mask] = False

    for col, resolve in (("model", resolve_model), ("gpu", resolve_gpu)):
        for name, why in _resolvable(rows[col].dropna().unique(), resolve).items():
            if why:
                drop(rows[col] == name, f"{col} {name!r} not in the catalog ({why})")
        drop(rows[col].isna(), f"no {col}")
    workload = rows[["batch", "input_len", "output_len"]].to_numpy(float)
    drop(
        ~(np.isfinite(workload).all(axis=1) & (workload > 0).all(axis=1)),
        "batch, input_len or output_len missing or not positive",
    )
    scored = (rows["e2e_s"].notna() | rows["throughput"].notna()).to_numpy()
    drop(~scored & rows["ttft_s"].isna().to_numpy(), "no e2e_s, throughput or ttft_s")
    rows = rows[keep].reset_index(drop=True)
    if not (rows["e2e_s"].notna() | rows["throughput"].notna()).any():
        why = "; ".join(f"{n} rows: {r}" for r, n in dropped.items())
        raise SlimjaxError(
            "traces",
            "no row with a model and GPU in the catalog and an e2e_s or throughput" + (f" ({why})" if why else ""),
        )
    return rows, dropped


def setting_name(framework, n_gpu) -> str:
    return f"{framework}/TP{int(n_gpu)}"


def folds(rows: pd.DataFrame) -> list[Fold]:
    """Every scenario's folds over ``rows`` (see the module docstring); folds with no training or no
    scored held-out row are skipped."""
    out: list[Fold] = []
    pos = np.arange(len(rows))
    scored = (rows["e2e_s"].notna() | rows["throughput"].notna()).to_numpy()

    def add(scenario, name, train, test):
        test = test & scored
        if train.any() and test.any():
            out.append(Fold(scenario, name, pos[train], pos[test]))

    for (framework, n_gpu), at in rows.groupby(list(SETTING), sort=True):
        setting = np.zeros(len(rows), bool)
        setting[at.index] = True
        prefix = setting_name(framework, n_gpu)
        gpus = sorted(at["gpu"].unique())
        for gpu in gpus:
            on = setting & (rows["gpu"] == gpu).to_numpy()
            here = rows[on]
            curve = ["model", "input_len", "output_len"]
            small, full = np.zeros(len(rows), bool), np.zeros(len(rows), bool)
            small[pos[on]] = (here.groupby(curve)["batch"].rank(method="dense") <= PRE_KNEE).to_numpy()
            full[pos[on]] = (here.groupby(curve)["batch"].transform("nunique") > PRE_KNEE).to_numpy()
            add("same-curve", f"{prefix}/{gpu}", on & ((small & full) | ~scored), on & ~small & full)
            short = (rows["input_len"] < here["input_len"].max()).to_numpy()
            add("length-transfer", f"{prefix}/{gpu}", on & short, on & ~short)
            counts = here[scored[on]].groupby("model").size()
            for model in counts[counts >= FULL_CURVES].index:
                this = (rows["model"] == model).to_numpy()
                add("model-transfer", f"{prefix}/{gpu}/{model}", on & ~this, on & this)
                add("combined", f"{prefix}/{gpu}/{model}", on & ~this & short, on & this & ~short)
        for source in gpus:
            for target in gpus:
                if source != target:
                    add(
                        "gpu-transfer",
                        f"{prefix}/{source}->{target}",
                        setting & (rows["gpu"] == source).to_numpy(),
                        setting & (rows["gpu"] == target).to_numpy(),
                    )
    return out
