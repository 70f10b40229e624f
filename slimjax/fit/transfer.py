"""Transfer-calibrated intervals: which kind of extrapolation a prediction is, and each kind's
model-form error from held-out residuals (the interval formulas are :mod:`slimjax.model.intervals`).

A prediction is *new in length* when its input or output length lies outside the lengths its group was
fitted on, *new in model* / *new in GPU* when the group never saw its model / GPU (coefficients fitted
per model on one GPU predict another through its specs); otherwise it is a same-curve prediction
(inside the fitted ranges or beyond them in batch only, which the same-curve scenario measures). The
form error of a kind is the split-conformal quantile of the scores of the held-out rows of the matching
validation scenario (:mod:`.folds`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model.intervals import EXTRAPOLATION, GPU, LENGTH, MODEL, form_score
from ..store.coefficients import TRANSFER_KIND, transfer_form
from .features import measured_throughput
from .folds import Fold

SCENARIO_KIND = {
    "same-curve": "same-curve",
    "length-transfer": "length",
    "model-transfer": "model",
    "gpu-transfer": "gpu",
    "combined": "combined",
}


def extrapolation_bits(points: pd.DataFrame, new_model, new_gpu, ranges: dict) -> np.ndarray:
    """LENGTH | MODEL | GPU per point: ``new_model``/``new_gpu`` booleans per point, ``ranges`` the
    fitted input_len/output_len _min/_max per point."""
    length = np.zeros(len(points), bool)
    for axis in ("input_len", "output_len"):
        v = points[axis].to_numpy(float)
        length |= (v < np.asarray(ranges[f"{axis}_min"], float)) | (v > np.asarray(ranges[f"{axis}_max"], float))
    return (length * LENGTH) | (np.asarray(new_model, bool) * MODEL) | (np.asarray(new_gpu, bool) * GPU)


def fold_bits(rows: pd.DataFrame, fold: Fold) -> np.ndarray:
    """Extrapolation bits of a fold's held-out rows against its training rows."""
    train, test = rows.iloc[fold.train], rows.iloc[fold.test]
    n = len(test)
    ranges = {
        f"{a}_{end}": np.full(n, getattr(train[a], end)())
        for a in ("input_len", "output_len")
        for end in ("min", "max")
    }
    return extrapolation_bits(
        test,
        ~test["model"].isin(set(train["model"])).to_numpy(),
        ~test["gpu"].isin(set(train["gpu"])).to_numpy(),
        ranges,
    )


def held_out_log_ratio(pred: pd.DataFrame) -> np.ndarray:
    """r_i = log(T_meas / T_pred) of predicted rows (``predict`` output with measured ``throughput`` or ``e2e_s``)."""
    return np.log(measured_throughput(pred) / pred["pred_throughput"].to_numpy(float))


def held_out_scores(pred: pd.DataFrame, level: float) -> np.ndarray:
    """Form scores m_i of predicted rows."""
    return np.asarray(form_score(held_out_log_ratio(pred), pred["pred_throughput_log_sd"].to_numpy(float), level))


def kind_codes(scenarios) -> np.ndarray:
    """Index into EXTRAPOLATION of each row's scenario."""
    return np.array([EXTRAPOLATION.index(SCENARIO_KIND[s]) for s in scenarios], np.int64)


def form_error_table(coeffs) -> pd.DataFrame:
    """A transfer store's form error per kind: log-scale m, the factor exp(m) an interval end moves by,
    the held-out rows behind it, or why there is none."""
    counts = np.bincount(coeffs[TRANSFER_KIND].values, minlength=len(EXTRAPOLATION))
    return pd.DataFrame({"kind": EXTRAPOLATION, "form_error": transfer_form(coeffs), "rows": counts}).assign(
        factor=lambda d: np.exp(d["form_error"]).round(3),
        note=lambda d: np.where(
            d["rows"] == 0, "no such scenario in the traces: predictions of this kind get no interval", ""
        ),
    )
