"""The two peer predictors SLIM is compared with in `slimjax validate`, as the SLIM paper adapts them
(source 000, §VII "We compare SLIM against two higher-level predictors").

Both are linear least squares on features of the workload (and, for IMAI, of the model), fitted to
the same relative-error objective as SLIM (each row divided by its measured E2E), so the comparison
is of model forms, not of loss functions. Neither sees the GPU's specs: fitted on one GPU, they
predict another as if it were the same one (this is how the paper's adaptations behave). numpy and
scipy only: these are small dense problems, fitted once per validation fold.

* **LLMVisor-Agg** (LLMVisor, ref. [10]): piecewise-linear prefill and decode latency functions of
  aggregate token counts. Prefill: a0 + a1·N + a2·(N − k_p)₊ + a3·B·I², with N = B·I prompt tokens.
  Decode, per generated token: c0 + c1·B + c2·B·ctx + c3·(B − k_d)₊, with ctx = I + (O+1)/2 the
  mean context. E2E = prefill + O·decode. The paper fits prefill to mean TTFT and decode to mean
  ITL; LLM-Inference-Bench has the batch E2E (and a TTFT for a few rows), so both functions are
  fitted jointly to E2E, and the prefill function also to the TTFT rows.
  Coefficients are non-negative (they are costs; scipy's NNLS); the knots k_p, k_d are chosen
  from the training data's quantiles by the training loss.
* **IMAI OOD-LR** (Imai et al., ref. [11]): ordinary least squares of E2E on batch size, input and
  output lengths, hidden size, layers, attention and KV heads, and their interactions
  (B·I, B·O, I·O, B·I·O, O·L·D², B·O·ctx·L·H_kv·d_h). Rank-deficient designs (models with near
  identical shapes) take the minimum-norm solution, as numpy's lstsq does.

Throughput is derived from the predicted latency: T = B·(I + O) / E2E.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from ..inputs.catalog import resolve_model


def _workload(rows: pd.DataFrame):
    return tuple(rows[c].to_numpy(float) for c in ("batch", "input_len", "output_len"))


def _llmvisor_features(rows: pd.DataFrame, knots: tuple[float, float], prefill_only=None) -> np.ndarray:
    """Prefill then per-token decode features; rows flagged ``prefill_only`` (TTFT targets) keep the
    prefill columns alone."""
    b, i, o = _workload(rows)
    n = b * i
    ctx = i + (o + 1.0) / 2.0
    k_p, k_d = knots
    decode = o[:, None] * np.stack([np.ones_like(b), b, b * ctx, np.maximum(b - k_d, 0.0)], axis=1)
    if prefill_only is not None:
        decode = np.where(prefill_only[:, None], 0.0, decode)
    return np.hstack([np.stack([np.ones_like(b), n, np.maximum(n - k_p, 0.0), b * i * i], axis=1), decode])


def _imai_features(rows: pd.DataFrame) -> np.ndarray:
    b, i, o = _workload(rows)
    specs = {m: resolve_model(m, "traces.model")[1] for m in rows["model"].unique()}
    arch = {
        k: rows["model"].map(lambda m, k=k: float(np.asarray(specs[m][k]))).to_numpy(float)
        for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim")
    }
    L, D = arch["n_layers"], arch["hidden"] / 1024.0
    kv = arch["n_kv_heads"] * arch["head_dim"] / 1024.0
    ctx = i + (o + 1.0) / 2.0
    return np.stack(
        [
            np.ones_like(b),
            b,
            i,
            o,
            D,
            L,
            arch["n_heads"],
            arch["n_kv_heads"],
            b * i,
            b * o,
            i * o,
            b * i * o,
            o * L * D * D,
            b * o * ctx * L * kv,
        ],
        axis=1,
    )


def _relative_system(x: np.ndarray, e2e: np.ndarray):
    """Rows scaled by 1/E2E_meas (relative errors) and columns by their norms (conditioning)."""
    a = x / e2e[:, None]
    norms = np.linalg.norm(a, axis=0)
    norms = np.where(norms > 0, norms, 1.0)
    return a / norms, norms


def fit_llmvisor_agg(rows: pd.DataFrame) -> dict:
    """Fit LLMVisor-Agg to ``rows`` (canonical traces: e2e_s, or ttft_s alone); returns its parameters."""
    ttft_only = rows["e2e_s"].isna().to_numpy() & rows["ttft_s"].notna().to_numpy()
    target = np.where(ttft_only, rows["ttft_s"].to_numpy(float), rows["e2e_s"].to_numpy(float))
    b, i, _ = _workload(rows)
    best = None
    for k_p in np.unique(np.quantile(b * i, [0.25, 0.5, 0.75])):
        for k_d in np.unique(np.quantile(b, [0.25, 0.5, 0.75])):
            a, norms = _relative_system(_llmvisor_features(rows, (k_p, k_d), ttft_only), target)
            w, resid = nnls(a, np.ones_like(target))
            if best is None or resid < best[0]:
                best = (resid, (float(k_p), float(k_d)), w / norms)
    return {"knots": best[1], "weights": best[2]}


def predict_llmvisor_agg(params: dict, rows: pd.DataFrame) -> np.ndarray:
    """Predicted E2E seconds of ``rows``."""
    return _llmvisor_features(rows, params["knots"]) @ params["weights"]


def fit_imai_ood_lr(rows: pd.DataFrame) -> dict:
    """Fit IMAI OOD-LR to ``rows`` (canonical traces; rows without e2e_s are left out: it models E2E only)."""
    rows = rows[rows["e2e_s"].notna()]
    e2e = rows["e2e_s"].to_numpy(float)
    a, norms = _relative_system(_imai_features(rows), e2e)
    w, *_ = np.linalg.lstsq(a, np.ones_like(e2e), rcond=None)
    return {"weights": w / norms}


def predict_imai_ood_lr(params: dict, rows: pd.DataFrame) -> np.ndarray:
    """Predicted E2E seconds of ``rows``."""
    return _imai_features(rows) @ params["weights"]


BASELINES = {
    "llmvisor-agg": (fit_llmvisor_agg, predict_llmvisor_agg),
    "imai-ood-lr": (fit_imai_ood_lr, predict_imai_ood_lr),
}
