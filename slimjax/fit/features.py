"""Fit features: per-row model and GPU specs and workload from the canonical trace table, the serving
defaults calibration assumes, and groups as one padded index array."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import SlimjaxError
from ..inputs.physics import row_specs
from ..inputs.serving import default_serving
from ..model.calculator import max_seqs


def row_features(traces: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per-row model and GPU specs (catalog lookup once per distinct name) and workload."""
    m, g = row_specs(traces)
    n_gpu, il, ol = (traces[c].to_numpy(float) for c in ("n_gpu", "input_len", "output_len"))
    return dict(
        model=m,
        gpu=g,
        n_gpu=n_gpu,
        batch=traces["batch"].to_numpy(float),
        input_len=il,
        output_len=ol,
        max_seqs=default_max_seqs(m, g, n_gpu, il, ol),
    )


def default_max_seqs(m, g, n_gpu, input_len, output_len):
    """max_seqs (MODEL.md §3, :func:`slimjax.model.calculator.max_seqs`) per row at the serving defaults with the
    row's ``n_gpu``: the concurrency the slim-kv variant takes where a calibration has no serving settings."""
    return np.asarray(max_seqs(m, g, default_serving(m, n_gpu=n_gpu), input_len, output_len))


def workload_tokens(traces: pd.DataFrame) -> np.ndarray:
    """B·(I + O) per row: the tokens a batch's E2E covers."""
    return (traces["batch"] * (traces["input_len"] + traces["output_len"])).to_numpy(float)


def measured_throughput(traces: pd.DataFrame) -> np.ndarray:
    """The measured throughput, or B·(I + O)/E2E where a row has only its E2E."""
    t = traces["throughput"].to_numpy(float)
    return np.where(np.isfinite(t), t, workload_tokens(traces) / traces["e2e_s"].to_numpy(float))


def measured_e2e(traces: pd.DataFrame) -> np.ndarray:
    """The measured E2E, or B·(I + O)/throughput where a row has only its throughput."""
    e = traces["e2e_s"].to_numpy(float)
    return np.where(np.isfinite(e), e, workload_tokens(traces) / traces["throughput"].to_numpy(float))


def padded_groups(traces: pd.DataFrame, group_by: list[str]) -> tuple[list, np.ndarray, np.ndarray]:
    """Groups as rows of one padded index array: (keys, index (groups × largest), valid mask).
    Padding repeats a group's last real row and is masked out of every fit."""
    for col in group_by:
        if col not in traces.columns:
            raise SlimjaxError("group_by", f"{col!r} is not a trace column ({', '.join(traces.columns)})")
    if traces.empty:
        dropped = traces.attrs.get("dropped") or {}
        why = "; ".join(f"{n} dropped: {reason}" for reason, n in dropped.items())
        raise SlimjaxError("traces", "no rows to fit" + (f" ({why})" if why else ""))
    groups = traces.groupby(group_by, sort=True).indices
    sizes = np.fromiter((len(v) for v in groups.values()), np.int64, len(groups))
    flat = np.concatenate(list(groups.values()))
    column = np.arange(sizes.max())[None, :]
    index = flat[(np.cumsum(sizes) - sizes)[:, None] + np.minimum(column, sizes[:, None] - 1)]
    return list(groups), index, column < sizes[:, None]
