"""The calibration's own forward model at one point: MODEL.md §1 (or slim-kv) as the fit evaluates it, with no
physical floor and no memory check (those belong to what slimjax reports, not to the curve a fit matches).
Synthetic traces that test the solver are generated from it."""

import numpy as np

from slimjax.config import float64_scope
from slimjax.inputs.catalog import resolve_gpu, resolve_model
from slimjax.model.slim import slim_variables
from slimjax.model.specs import GPUSpec, ModelSpec, SlimCoeffs, stack


def slim_model(model, gpu, batch, input_len, output_len, theta, n_gpu=1) -> dict:
    """§1's prefill, decode, E2E and throughput (floats) at one point, straight from the model floor."""
    m = stack(ModelSpec, [resolve_model(model)[1]])
    g = stack(GPUSpec, [resolve_gpu(gpu)[1]])
    c = SlimCoeffs(**{k: np.asarray([float(v)]) for k, v in theta.items()})
    with float64_scope():
        out = slim_variables(m, g, c, float(batch), float(input_len), float(output_len), float(n_gpu))
    return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in out.items()}


def slim_rows(points, theta):
    """§1's E2E (seconds) per row of a frame with model, gpu, n_gpu, batch, input_len, output_len: the fit's model."""
    from slimjax.fit.features import row_features

    f = row_features(points)
    c = SlimCoeffs(**{k: np.full(len(points), float(v)) for k, v in theta.items()})
    with float64_scope():
        out = slim_variables(f["model"], f["gpu"], c, f["batch"], f["input_len"], f["output_len"], f["n_gpu"])
    return np.asarray(out["slim_e2e_s"])
