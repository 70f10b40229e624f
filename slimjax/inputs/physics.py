"""Measured rows checked against physics: a row faster than its own configuration could run at 100 % of
the group's peak FLOP/s and bandwidth (:mod:`slimjax.model.floor`) cannot be a measurement of that
configuration (a mislabelled precision, GPU count or batch, a cached prompt, a broken benchmark) and is
kept out of every fit.

Per row, on n_gpu GPUs of its kind with its weights' bytes (the checkpoint's where the row does not say):

- throughput ≤ B·(I + O) / (prefill floor(B) + decode floor(B))   (a batch of B cannot finish sooner)
- E2E ≥ prefill floor(1) + decode floor(1)                          (one request alone, the least work a request is)
- TTFT ≥ prefill floor(1)                                           (one prompt's single pass)
- TTFT ≥ prefill floor(B) for an offline batch (column ``offline``)  (its B prompts start together)
- ITL ≥ decode floor(1) / (O − 1)                                   (one sequence's step reads the weights)

each by more than :data:`TOLERANCE` (datasheet peaks are rounded, boost clocks vary).
"""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd

from ..config import float64_scope
from ..model.floor import floor_inputs, floor_of
from ..model.specs import GPUSpec, ModelSpec, stack
from .catalog import resolve_gpu, resolve_model
from .serving import default_serving

TOLERANCE = 0.10  # a row is impossible when it beats the 100 %-of-peak bound by more than this fraction


def row_specs(traces: pd.DataFrame):
    """Per-row (ModelSpec, GPUSpec) (one catalog lookup per distinct name, gathered by integer codes), the
    model's bytes per weight and per KV element replaced by the row's ``weight_dtype_bytes`` and ``kv_dtype_bytes``
    where it has them (a quantized run)."""
    m_codes, m_names = pd.factorize(traces["model"])
    g_codes, g_names = pd.factorize(traces["gpu"])
    m = jax.tree_util.tree_map(
        lambda x: x[m_codes], stack(ModelSpec, [resolve_model(x, "traces.model")[1] for x in m_names])
    )
    g = jax.tree_util.tree_map(lambda x: x[g_codes], stack(GPUSpec, [resolve_gpu(x, "traces.gpu")[1] for x in g_names]))
    import equinox as eqx

    for column, field in (("weight_dtype_bytes", "bytes_per_weight"), ("kv_dtype_bytes", "kv_dtype_bytes")):
        if column in traces and traces[column].notna().any():
            given = traces[column].to_numpy(float)
            m = eqx.tree_at(lambda s, f=field: getattr(s, f), m, np.where(np.isfinite(given), given, getattr(m, field)))
    return m, g


def row_floors(traces: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per row, the 100 %-of-peak floors (seconds) of its configuration: ``prefill``/``decode`` of its batch B,
    ``prefill_1``/``decode_1`` of one request alone."""
    with float64_scope():
        m, g = row_specs(traces)
        n, B, I, O = (traces[c].to_numpy(float) for c in ("n_gpu", "batch", "input_len", "output_len"))
        # a group of D attention data-parallel ranks: all its n·D GPUs' peaks (each rank reads the dense part
        # again, so this floor is below the layout's own)
        n = n * (traces["dp"].fillna(1.0).to_numpy(float) if "dp" in traces else 1.0)
        floor = floor_of(floor_inputs(m, g, default_serving(m, n_gpu=n)), I, O)
        pre_b, dec_b = map(np.asarray, floor(B))
        pre_1, dec_1 = map(np.asarray, floor(np.ones_like(B)))
    return {"prefill": pre_b, "decode": dec_b, "prefill_1": pre_1, "decode_1": dec_1}


def impossible_rows(traces: pd.DataFrame) -> dict[str, np.ndarray]:
    """{cause: boolean mask of rows} for the rows faster than physics allows (see the module docstring)."""
    if traces.empty:
        return {}
    f = row_floors(traces)
    B, I, O = (traces[c].to_numpy(float) for c in ("batch", "input_len", "output_len"))
    pre_b, dec_b, pre_1, dec_1 = f["prefill"], f["decode"], f["prefill_1"], f["decode_1"]
    slack = 1.0 + TOLERANCE
    col = {
        c: traces[c].to_numpy(float) if c in traces else np.full(len(traces), np.nan)
        for c in ("throughput", "e2e_s", "ttft_s", "itl_s")
    }
    offline = traces["offline"].to_numpy(bool) if "offline" in traces else np.zeros(len(traces), bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        ceiling = B * (I + O) / (pre_b + dec_b)
        itl_floor = np.where(O > 1, dec_1 / np.maximum(O - 1.0, 1.0), 0.0)
        return {
            f"throughput above the 100 %-of-peak roofline of its configuration by over {TOLERANCE:.0%} (impossible as "
            "labelled: a quantized, cached or mislabelled run)": col["throughput"] > ceiling * slack,
            f"E2E below one request's 100 %-of-peak roofline time by over {TOLERANCE:.0%} (impossible)": col["e2e_s"]
            * slack
            < pre_1 + dec_1,
            f"TTFT below one prompt's 100 %-of-peak prefill by over {TOLERANCE:.0%} (impossible)": col["ttft_s"] * slack
            < pre_1,
            f"ITL below one sequence's 100 %-of-peak decode step by over {TOLERANCE:.0%} (impossible)": col["itl_s"]
            * slack
            < itl_floor,
            # an offline batch's TTFT is the prefill of all B prompts (they start together)
            f"TTFT of an offline batch below its B prompts' 100 %-of-peak prefill by over {TOLERANCE:.0%} "
            "(impossible)": offline & (col["ttft_s"] * slack < pre_b),
        }
