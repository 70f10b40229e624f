"""Batched calibration of SLIM's coefficients (MODEL.md §1) and prediction with uncertainty.

All groups are fitted at once: one jitted, vmapped Levenberg–Marquardt solve over groups × restarts
on the relative throughput residuals r_i = T_pred,i / T_meas,i − 1, with JAX autodiff Jacobians,
positivity by θ = exp(z), groups padded to the largest and masked. Standard errors and covariance
come from the Gauss–Newton approximation σ²(JᵀJ)⁻¹ at the optimum; directions the design cannot
identify (near-null eigenvectors of the normalised JᵀJ) are reported, not silently filled.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import xarray as xr

from .catalog import resolve_gpu, resolve_model
from .errors import SlimjaxError
from .calculator import capacity_cell_terms, kv_capacity, service_terms
from .slim import slim_kv_variables, slim_variables
from .specs import SLIM_PARAMS, GPUSpec, ModelSpec, ServingSpec, SlimCoeffs, stack
from .sweepfile import SERVING_DEFAULTS

# Deterministic starting points (η_c, η_m, B0, α, γ, t_fixed); the best end point wins.
STARTS = np.array([
    [0.5, 0.8, 4.0, 1e-4, 1e-6, 0.1],
    [0.3, 0.5, 32.0, 1e-5, 1e-5, 1.0],
    [0.9, 1.0, 1.0, 1e-3, 1e-7, 0.01],
])
_FLOOR = 1e-12  # θ = exp(z) never reaches 0; coefficients below this read as 0
# eigenvalue / largest of the normalised JᵀJ below which a direction is unidentified (and left out of
# the covariance). Sloppy directions below 1e-3 would put 10³–10⁸ σ² on any prediction with a sliver
# of gradient along them: at 1e-8 the held-out 90 % intervals were 147 % wide at 100 % coverage, at
# 1e-3 they are 38 % wide at 99 % (bench/predict_coverage.py).
_IDENT_TOL = 1e-3
_SENSITIVITY_TOL = 1e-3  # ‖∂r/∂log θ_i‖ / the largest one below which θ_i is unidentified


def _row_features(traces: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per-row model and GPU specs (catalog lookup once per distinct name) and workload."""
    # one catalog lookup and one spec row per distinct name, gathered by integer codes
    m_codes, m_names = pd.factorize(traces["model"])
    g_codes, g_names = pd.factorize(traces["gpu"])
    m = jax.tree_util.tree_map(lambda x: x[m_codes], stack(ModelSpec, [resolve_model(x, "traces.model")[1] for x in m_names]))
    g = jax.tree_util.tree_map(lambda x: x[g_codes], stack(GPUSpec, [resolve_gpu(x, "traces.gpu")[1] for x in g_names]))
    n_gpu, il, ol = (traces[c].to_numpy(float) for c in ("n_gpu", "input_len", "output_len"))
    return dict(model=m, gpu=g, n_gpu=n_gpu, batch=traces["batch"].to_numpy(float), input_len=il, output_len=ol,
                max_seqs=_default_max_seqs(m, g, n_gpu, il, ol))


def _default_serving(model, n_gpu, compute_efficiency=1.0, bandwidth_efficiency=1.0, launch_overhead_s=0.0):
    """A ServingSpec per row: ``n_gpu`` and the three roofline settings given, every other setting at
    the sweep file's defaults (MODEL.md §0), the model's own dtypes."""
    one = jnp.ones_like(jnp.asarray(n_gpu, float))
    d = SERVING_DEFAULTS
    return ServingSpec(
        n_gpu=n_gpu * one, memory_utilization=d["gpu_memory_utilization"] * one, reserved_bytes=d["reserved_gib"] * 2**30 * one,
        kv_replication=d["kv_replication"] * one, kv_overhead=d["kv_overhead"] * one, block_size=d["block_size"] * one,
        chunk_size=d["chunk_size"] * one, launch_overhead_s=launch_overhead_s * one, compute_efficiency=compute_efficiency * one,
        bandwidth_efficiency=bandwidth_efficiency * one, kv_dtype_bytes=model.kv_dtype_bytes, weight_bytes=model.weight_bytes,
    )


def _default_max_seqs(m, g, n_gpu, input_len, output_len):
    """max_seqs (MODEL.md §3) at the serving defaults: the concurrency the KV cache holds, used by
    the slim-kv variant."""
    return np.asarray(kv_capacity(m, g, _default_serving(m, n_gpu), input_len, output_len)["max_seqs"])


def _measured_throughput(traces: pd.DataFrame) -> np.ndarray:
    t = traces["throughput"].to_numpy(float)
    from_e2e = (traces["batch"] * (traces["input_len"] + traces["output_len"]) / traces["e2e_s"]).to_numpy(float)
    return np.where(np.isfinite(t), t, from_e2e)


def _slim(theta, f):
    out = slim_variables(f["model"], f["gpu"], SlimCoeffs(*theta), f["batch"], f["input_len"], f["output_len"], f["n_gpu"])
    return out["slim_throughput"], out["slim_e2e_s"], out["slim_prefill_s"]


def _slim_kv(theta, f):
    out = slim_kv_variables(f["model"], f["gpu"], SlimCoeffs(*theta), f["batch"], f["input_len"], f["output_len"],
                            f["max_seqs"], f["n_gpu"])
    return out["slim_throughput"], out["slim_e2e_s"], out["slim_prefill_s"]


class Variant(NamedTuple):
    """A calibratable throughput model: its coefficient names, restart points and (T, E2E, T_pre) predictor."""

    params: tuple[str, ...]
    starts: np.ndarray
    predict: Callable


VARIANTS = {
    "slim": Variant(SLIM_PARAMS, STARTS, _slim),
    # per-sequence KV reads and the KV-capacity limit (slim.slim_kv_variables); optional, not the contract
    "slim-kv": Variant(SLIM_PARAMS, np.vstack([STARTS, [[0.5, 0.5, 64.0, 3e-4, 1e-6, 0.01], [0.2, 0.9, 200.0, 1e-4, 1e-5, 0.1],
                                                    [0.7, 0.3, 10.0, 1e-3, 1e-6, 1e-4]]]), _slim_kv),
}


def _variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise SlimjaxError("variant", f"{name!r} is not one of {', '.join(VARIANTS)}")
    return VARIANTS[name]


def _predict(z, feats, variant="slim"):
    theta = [jnp.exp(z[i]) for i in range(len(VARIANTS[variant].params))]
    return VARIANTS[variant].predict(theta, feats)


LOSSES = ("squared", "cauchy")
CAUCHY_SCALE = 0.1  # relative error at which the Cauchy loss starts to discount a residual


def cauchy_residual(r, scale=CAUCHY_SCALE):
    """r̃ with r̃² = c²·log(1 + (r/c)²), the Cauchy (Lorentzian) loss as a residual, so a least-squares
    solver minimises Σ ρ(r): outliers (a run unlike its neighbours) weigh ~log|r| instead of r²."""
    u = (r / scale) ** 2
    safe = jnp.where(u > 1e-12, u, 1.0)
    return r * jnp.where(u > 1e-12, jnp.sqrt(jnp.log1p(safe) / safe), 1.0 - u / 4.0)


def _residuals(z, feats, t_meas, ttft, mask_t, mask_ttft, variant="slim", loss="squared", with_ttft=True):
    """Relative throughput errors, and relative TTFT errors of T_pre (the batch's prefill, which
    is what the first token waits for when the batch is prefilled together) where rows have a TTFT
    (``with_ttft`` False: no row has one, so that half is left out)."""
    t, _, t_pre = _predict(z, feats, variant)
    r = jnp.where(mask_t, t / t_meas - 1.0, 0.0)
    if with_ttft:
        r = jnp.concatenate([r, jnp.where(mask_ttft, t_pre / ttft - 1.0, 0.0)])
    return cauchy_residual(r) if loss == "cauchy" else r


def spd_solve(A, b):
    """x = A⁻¹b for a small symmetric positive-definite A (p × p, p static) by an unrolled Cholesky
    factorisation: plain arithmetic XLA fuses across the vmapped groups, where a LAPACK call per
    group is a loop of tiny library calls (and those calls hung when two CPU devices ran at once)."""
    p = A.shape[0]
    L = [[None] * p for _ in range(p)]
    for j in range(p):
        d = A[j, j] - sum((L[j][k] ** 2 for k in range(j)), jnp.zeros_like(A[j, j]))
        L[j][j] = jnp.sqrt(jnp.maximum(d, 1e-300))
        for i in range(j + 1, p):
            L[i][j] = (A[i, j] - sum((L[i][k] * L[j][k] for k in range(j)), jnp.zeros_like(A[i, j]))) / L[j][j]
    y = []
    for i in range(p):  # L y = b
        y.append((b[i] - sum((L[i][k] * y[k] for k in range(i)), jnp.zeros_like(b[i]))) / L[i][i])
    x = [None] * p
    for i in reversed(range(p)):  # Lᵀ x = y
        x[i] = (y[i] - sum((L[k][i] * x[k] for k in range(i + 1, p)), jnp.zeros_like(b[i]))) / L[i][i]
    return jnp.stack(x)


def _lm(res, z0, iterations):
    """Levenberg–Marquardt with Marquardt scaling on residuals ``res(z)``, a fixed number of
    iterations (vmappable)."""
    # one forward-mode pass gives the residuals (as aux) and their Jacobian
    jac = jax.jacfwd(lambda z: (res(z), res(z)), has_aux=True)
    p = z0.shape[0]

    def step(carry, _):
        z, lam, cost, accepted = carry
        J, r = jac(z)
        H, g = J.T @ J, J.T @ r
        D = jnp.diag(jnp.maximum(jnp.diag(H), 1e-12))
        dz = spd_solve(H + lam * D + 1e-14 * jnp.eye(p), -g)
        z_new = z + jnp.clip(dz, -5.0, 5.0)
        cost_new = jnp.sum(res(z_new) ** 2)
        better = jnp.isfinite(cost_new) & (cost_new < cost)
        return (jnp.where(better, z_new, z), jnp.where(better, lam / 3.0, lam * 4.0),
                jnp.where(better, cost_new, cost), accepted + better), (cost, lam)

    init = (z0, jnp.asarray(1e-2, z0.dtype), jnp.sum(res(z0) ** 2), jnp.asarray(0))
    (z, lam, cost, accepted), (costs, _) = jax.lax.scan(step, init, None, length=iterations)
    # converged: the last tenth of the iterations changed the cost by < 1e-9 relative
    tail = costs[-max(iterations // 10, 1)]
    converged = (tail - cost) <= 1e-9 * jnp.maximum(cost, 1e-30)
    return z, cost, accepted, converged


def _adam(res, z0, iterations, learning_rate=0.05):
    """The optax alternative: Adam on the same sum of squared residuals."""
    opt = optax.adam(learning_rate)
    loss = lambda z: jnp.sum(res(z) ** 2)

    def step(carry, _):
        z, state = carry
        value, grad = jax.value_and_grad(loss)(z)
        updates, state = opt.update(grad, state, z)
        return (optax.apply_updates(z, updates), state), value

    (z, _), costs = jax.lax.scan(step, (z0, opt.init(z0)), None, length=iterations)
    cost = loss(z)
    converged = jnp.abs(costs[-max(iterations // 10, 1)] - cost) <= 1e-6 * jnp.maximum(cost, 1e-30)
    return z, cost, jnp.asarray(iterations), converged


def _fit_batched(residuals, z0, data, iterations, solver):
    """Fit every group (leading axis of each ``data`` leaf) from every start in ``z0`` (restarts ×
    params, or groups × restarts × params for per-group starts), keeping each group's best end
    point: z, cost, iterations, converged, Jacobian at z."""
    fit = _lm if solver == "lm" else _adam

    def one_group(starts, d):
        res = lambda z: residuals(z, *d)
        zs, costs, its, conv = jax.vmap(lambda z: fit(res, z, iterations))(starts)
        best = jnp.argmin(jnp.where(jnp.isfinite(costs), costs, jnp.inf))
        z = zs[best]
        return z, costs[best], its[best], conv[best], jax.jacfwd(res)(z)

    return jax.vmap(one_group, in_axes=(0 if z0.ndim == 3 else None, 0))(z0, data)


@functools.partial(jax.jit, static_argnames=("iterations", "solver", "variant", "loss", "with_ttft"))
def fit_groups(z0, feats, t_meas, ttft, mask_t, mask_ttft, *, iterations: int = 30, solver: str = "lm",
               variant: str = "slim", loss: str = "squared", with_ttft: bool = True):
    """SLIM fits of every group at once (see :func:`_fit_batched`)."""
    residuals = functools.partial(_residuals, variant=variant, loss=loss, with_ttft=with_ttft)
    return _fit_batched(residuals, z0, (feats, t_meas, ttft, mask_t, mask_ttft), iterations, solver)


def _bootstrap(z, feats, t_meas, ttft, mask, mask_ttft, t_pred, pre_pred, n, replicates, seed, fit_options):
    """log-coefficients of ``replicates`` wild-bootstrap refits of every group: (replicates, groups, p)."""
    rng = np.random.default_rng(seed)
    G, p = z.shape
    inflate = np.sqrt(n / np.maximum(n - p, 1))[:, None]
    r_t = np.where(mask, t_pred / t_meas - 1.0, 0.0) * inflate
    r_f = np.where(mask_ttft, pre_pred / ttft - 1.0, 0.0) * inflate
    reps = []
    for _ in range(replicates):  # data only: the refits below are one batched solve
        s_t, s_f = rng.choice([-1.0, 1.0], size=r_t.shape), rng.choice([-1.0, 1.0], size=r_f.shape)
        reps.append((t_pred / np.maximum(1.0 + s_t * r_t, 0.05), pre_pred / np.maximum(1.0 + s_f * r_f, 0.05)))
    t_star = np.concatenate([r[0] for r in reps])
    f_star = np.concatenate([r[1] for r in reps])
    tile = lambda x: np.concatenate([np.asarray(x)] * replicates)  # noqa: E731
    z_boot = _sharded(fit_groups, tile(z)[:, None, :], jax.tree_util.tree_map(tile, feats), t_star,
                      np.where(tile(mask_ttft), f_star, 1.0), tile(mask), tile(mask_ttft), **fit_options)[0]
    return np.asarray(z_boot).reshape(replicates, G, p)


def _sharded(fit, z0, *data, **options):
    """``fit(z0, *data, **options)`` with the groups (axis 0 of every ``data`` leaf, and of ``z0``
    when it has three dims) split into one equal chunk per local device (one per CPU core), each
    dispatched to its device asynchronously — the groups are independent. Chunks are padded by
    repeating the last group (one compiled shape); results are cut back to the real groups.
    (Explicit per-device dispatch, as the grid does: XLA:CPU SPMD sharding of this solve hung
    intermittently on two devices.)"""
    devices = jax.local_devices()
    groups = jax.tree_util.tree_leaves(data)[0].shape[0]
    if len(devices) == 1 or groups < 2 * len(devices):
        return fit(z0, *data, **options)
    size = -(-groups // len(devices))
    per_group_start = np.ndim(z0) == 3

    def chunk(x, k):
        x = np.asarray(x)[k * size:(k + 1) * size]
        return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)]) if len(x) < size else x

    outs = []
    for k, device in enumerate(devices):
        part = jax.device_put(jax.tree_util.tree_map(lambda x: chunk(x, k), data), device)
        start = jax.device_put(chunk(z0, k) if per_group_start else np.asarray(z0), device)
        outs.append(fit(start, *part, **options))
    return tuple(np.concatenate([np.asarray(o[i]) for o in outs])[:groups] for i in range(len(outs[0])))


def _uncertainty(z, cost, J, n):
    """Gauss–Newton covariance of θ = exp(z) and the identifiable coefficients, per group (numpy, batched)."""
    G, p = z.shape
    H = np.einsum("gni,gnj->gij", J, J)
    scale = np.sqrt(np.maximum(np.diagonal(H, axis1=1, axis2=2), 1e-300))
    Hn = H / (scale[:, :, None] * scale[:, None, :])
    w, V = np.linalg.eigh(Hn)
    null = w < _IDENT_TOL * np.maximum(w.max(axis=1, keepdims=True), 1e-300)
    # unidentified: a coefficient the residuals barely feel, or one that loads a near-null direction
    loads_null = np.any((np.abs(V) > 0.3) & null[:, None, :], axis=2)
    sensitive = scale > _SENSITIVITY_TOL * scale.max(axis=1, keepdims=True)
    identified = ~loads_null & sensitive
    # directions the data cannot see spend no degrees of freedom
    dof = n - identified.sum(axis=1)
    sigma2 = np.where(dof > 0, cost / np.maximum(dof, 1), np.nan)
    inv = np.where(null, 0.0, 1.0 / np.where(null, 1.0, w))
    cov_z = sigma2[:, None, None] * np.einsum("gik,gk,gjk->gij", V, inv, V) / (scale[:, :, None] * scale[:, None, :])
    theta = np.exp(z)
    cov = cov_z * theta[:, :, None] * theta[:, None, :]
    bad = ~identified
    cov = np.where(bad[:, :, None] | bad[:, None, :], np.nan, cov)
    return cov, identified, sigma2


def _padded_groups(traces: pd.DataFrame, group_by: list[str]) -> tuple[list, np.ndarray, np.ndarray]:
    """Groups as rows of one padded index array: (keys, index (groups × largest), valid mask).
    Padding repeats a group's last real row and is masked out of every fit."""
    for col in group_by:
        if col not in traces.columns:
            raise SlimjaxError("group_by", f"{col!r} is not a trace column ({', '.join(traces.columns)})")
    if traces.empty:
        raise SlimjaxError("traces", "no rows to fit")
    groups = traces.groupby(group_by, sort=True).indices
    sizes = np.fromiter((len(v) for v in groups.values()), np.int64, len(groups))
    flat = np.concatenate(list(groups.values()))
    column = np.arange(sizes.max())[None, :]
    index = flat[(np.cumsum(sizes) - sizes)[:, None] + np.minimum(column, sizes[:, None] - 1)]
    return list(groups), index, column < sizes[:, None]


def calibrate(traces: pd.DataFrame, group_by: Sequence[str] = ("model", "gpu", "n_gpu", "framework"), *,
              solver: str = "lm", iterations: int = 30, variant: str = "slim", loss: str = "squared",
              bootstrap: int = 0, seed: int = 0) -> xr.Dataset:
    """Fit SLIM's six coefficients per group of ``traces`` (the canonical table), all groups at once.

    Residuals: T_pred/T_meas − 1 for rows with a throughput (or an E2E), and T_pre/TTFT − 1 for
    rows with a ``ttft_s`` (a batch's prefill time: it identifies η_c, which IL = OL throughput
    curves barely do).

    Returns a Dataset with dims (*group_by, param): ``coefficients``, ``standard_error``,
    ``covariance`` (param × param_), ``identified``, and per group ``converged``, ``iterations``,
    ``loss`` (Σ r²), ``mape_throughput``, ``mape_e2e``, ``n_points``. Groups absent from the data
    are NaN with n_points 0. ``variant`` "slim-kv" fits the optional variant of
    :func:`slimjax.slim.slim_kv_variables` (same six coefficients) instead of MODEL.md §1. ``loss``
    "cauchy" is the robust alternative to squared relative errors (:func:`cauchy_residual`): use it
    when a few runs are unlike the rest (``loss`` then holds Σ ρ(r), and the covariance is the
    Gauss–Newton one of the robust residuals). ``bootstrap`` = R > 1 replaces the Gauss–Newton
    covariance by that of R wild-bootstrap refits of every group (residuals at the optimum, inflated
    by √(n/(n−p)), with random signs; all R × groups refits in one batched solve, warm-started at
    the optimum, ``seed`` fixed): it follows the model's curvature where the linearisation of few,
    correlated coefficients is poor. Coefficients the design cannot identify stay NaN.
    """
    if bootstrap < 0 or bootstrap == 1:
        raise SlimjaxError("bootstrap", f"must be 0 (Gauss–Newton) or at least 2 replicates, got {bootstrap!r}")
    if solver not in ("lm", "adam"):
        raise SlimjaxError("solver", f"must be 'lm' or 'adam', got {solver!r}")
    if loss not in LOSSES:
        raise SlimjaxError("loss", f"must be one of {', '.join(LOSSES)}, got {loss!r}")
    spec = _variant(variant)
    group_by = list(group_by)
    traces = traces.reset_index(drop=True)
    keys, index, valid = _padded_groups(traces, group_by)
    feats_rows = _row_features(traces)
    t_all = _measured_throughput(traces)
    feats = jax.tree_util.tree_map(lambda x: np.asarray(x)[index], feats_rows)
    t_meas, ttft = t_all[index], traces["ttft_s"].to_numpy(float)[index]
    mask, mask_ttft = valid & np.isfinite(t_meas), valid & np.isfinite(ttft)
    t_meas, ttft = np.where(mask, t_meas, 1.0), np.where(mask_ttft, ttft, 1.0)
    options = dict(iterations=iterations, solver=solver, variant=variant, loss=loss, with_ttft=bool(mask_ttft.any()))
    z, cost, its, conv, J = map(np.asarray, _sharded(fit_groups, np.log(spec.starts), feats, t_meas, ttft, mask, mask_ttft, **options))
    n = mask.sum(axis=1) + mask_ttft.sum(axis=1)
    cov, identified, sigma2 = _uncertainty(z, cost, J, n)
    t_pred, e_pred, pre_pred = map(np.asarray, jax.vmap(functools.partial(_predict, variant=variant))(jnp.asarray(z), feats))
    if bootstrap:
        z_boot = _bootstrap(z, feats, t_meas, ttft, mask, mask_ttft, t_pred, pre_pred, n, bootstrap, seed, options)
        theta_hat = np.exp(z)
        cov_z = np.einsum("rgi,rgj->gij", z_boot - z_boot.mean(0), z_boot - z_boot.mean(0)) / (bootstrap - 1)
        cov = np.where(np.isnan(cov), np.nan, cov_z * theta_hat[:, :, None] * theta_hat[:, None, :])
    e_meas = np.where(np.isfinite(traces["e2e_s"].to_numpy(float)), traces["e2e_s"].to_numpy(float),
                      (traces["batch"] * (traces["input_len"] + traces["output_len"])).to_numpy(float) / t_all)[index]
    mape_t = np.nanmean(np.where(mask, np.abs(t_pred / t_meas - 1), np.nan), axis=1) * 100
    mape_e = np.nanmean(np.where(mask, np.abs(e_pred / e_meas - 1), np.nan), axis=1) * 100
    with np.errstate(all="ignore"):
        mape_ttft = np.sum(np.where(mask_ttft, np.abs(pre_pred / ttft - 1), 0.0), axis=1) / mask_ttft.sum(axis=1) * 100

    levels = {c: sorted(traces[c].unique().tolist()) for c in group_by}
    shape = tuple(len(levels[c]) for c in group_by)
    p = len(spec.params)

    position = {c: {v: i for i, v in enumerate(levels[c])} for c in group_by}
    where = tuple(np.array([position[c][(key if isinstance(key, tuple) else (key,))[j]] for key in keys])
                  for j, c in enumerate(group_by))

    def dense(values, tail=(), fill=np.nan, dtype=float):
        out = np.full(shape + tail, fill, dtype)
        out[where] = values
        return out

    theta = np.exp(z)
    theta = np.where(theta < _FLOOR, 0.0, theta)
    se = np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0.0))
    gdims = tuple(group_by)
    ds = xr.Dataset(
        {
            "coefficients": (gdims + ("param",), dense(theta, (p,)), {"long_name": "SLIM coefficients θ (MODEL.md §1)"}),
            "standard_error": (gdims + ("param",), dense(se, (p,)), {"long_name": "Gauss–Newton standard error of θ (NaN: not identified)"}),
            "covariance": (gdims + ("param", "param_"), dense(cov, (p, p)), {"long_name": "Gauss–Newton covariance of θ"}),
            "identified": (gdims + ("param",), dense(identified, (p,), False, bool), {"long_name": "the data identify this coefficient"}),
            "converged": (gdims, dense(conv, fill=False, dtype=bool)),
            "iterations": (gdims, dense(its, fill=0, dtype=np.int64), {"long_name": "accepted solver steps"}),
            "loss": (gdims, dense(cost), {"long_name": "sum of squared relative throughput residuals"}),
            "mape_throughput": (gdims, dense(mape_t), {"units": "%"}),
            "mape_e2e": (gdims, dense(mape_e), {"units": "%"}),
            "mape_ttft": (gdims, dense(mape_ttft), {"units": "%", "long_name": "MAPE of T_pre against measured TTFT (NaN: none)"}),
            "n_points": (gdims, dense(n, fill=0, dtype=np.int64), {"long_name": "residuals fitted (throughput and TTFT)"}),
            "residual_variance": (gdims, dense(sigma2), {"long_name": "σ² = loss / (n_points − identified coefficients)"}),
            "log_coefficients": (gdims + ("param",), dense(z, (p,)), {"long_name": "z = log θ at the optimum"}),
            **({"bootstrap_log_coefficients": (gdims + ("replicate", "param"), dense(np.moveaxis(z_boot, 0, 1), (bootstrap, p)),
                                               {"long_name": "z of the wild-bootstrap refits"})} if bootstrap else {}),
        },
        coords={**{c: levels[c] for c in group_by}, "param": list(spec.params), "param_": list(spec.params)},
        attrs={"variant": variant, "solver": solver, "loss": loss, "bootstrap": int(bootstrap), "iterations_max": iterations, "residual": "T_pred / T_meas - 1",
               "group_by": list(group_by), "source": traces.attrs.get("source", "")},
    )
    return ds


def predict(coeffs: xr.Dataset, points: pd.DataFrame, level: float = 0.90) -> pd.DataFrame:
    """``points`` (canonical columns model, gpu, n_gpu, batch, input_len, output_len) with
    pred_e2e_s, pred_throughput and their ``level`` intervals (_lo, _hi).

    Each point takes the coefficients of its group along the group dims ``coeffs`` has (so
    coefficients fitted per model on one GPU predict another GPU through its specs). Intervals: delta
    method on log T with the coefficient covariance plus the group's residual scatter (a prediction
    interval, not only a confidence interval).
    """
    from scipy.stats import norm

    dims = [d for d in coeffs["coefficients"].dims if d != "param"]
    missing = [d for d in dims if d not in points.columns]
    if missing:
        raise SlimjaxError("points", f"column {missing[0]!r} needed to look up the coefficients")
    sel = {d: xr.DataArray(points[d].to_numpy(), dims="point") for d in dims}
    try:
        z = coeffs["log_coefficients"].sel(sel).transpose("point", "param").values
        cov = coeffs["covariance"].sel(sel).transpose("point", "param", "param_").values
        scatter = coeffs["residual_variance"].sel(sel).values
    except KeyError as e:
        raise SlimjaxError("points", f"no coefficients for {e}") from None
    variant = coeffs.attrs.get("variant", "slim")
    _variant(variant)
    pred = functools.partial(_predict, variant=variant)
    feats = _row_features(points.assign(n_gpu=points.get("n_gpu", 1)))
    t, e, _ = map(np.asarray, jax.vmap(pred)(jnp.asarray(z), feats))
    if "bootstrap_log_coefficients" in coeffs:  # the spread of the refits' own predictions
        zb = coeffs["bootstrap_log_coefficients"].sel(sel).transpose("replicate", "point", "param").values
        tb, eb, _ = map(np.asarray, jax.vmap(lambda zr: jax.vmap(pred)(zr, feats))(jnp.asarray(zb)))
        var_t = np.var(np.log(tb), axis=0, ddof=1) + scatter
        var_e = np.var(np.log(eb), axis=0, ddof=1) + scatter
    else:
        # delta method: gradient of log T and log E2E with respect to z, per point
        glt = np.asarray(jax.vmap(jax.grad(lambda zz, f: jnp.log(pred(zz, f)[0])))(jnp.asarray(z), feats))
        gle = np.asarray(jax.vmap(jax.grad(lambda zz, f: jnp.log(pred(zz, f)[1])))(jnp.asarray(z), feats))
        theta = np.exp(z)
        cov_z = cov / np.einsum("pi,pj->pij", theta, theta)
        cov_z = np.where(np.isfinite(cov_z), cov_z, 0.0)
        var_t = np.einsum("pi,pij,pj->p", glt, cov_z, glt) + scatter
        var_e = np.einsum("pi,pij,pj->p", gle, cov_z, gle) + scatter
    q = norm.ppf(0.5 + level / 2)
    out = points.copy()
    out["pred_throughput"], out["pred_e2e_s"] = t, e
    out["pred_throughput_lo"], out["pred_throughput_hi"] = t * np.exp(-q * np.sqrt(var_t)), t * np.exp(q * np.sqrt(var_t))
    out["pred_e2e_s_lo"], out["pred_e2e_s_hi"] = e * np.exp(-q * np.sqrt(var_e)), e * np.exp(q * np.sqrt(var_e))
    return out


# ------------------------------------------------------------------ the capacity roofline (§0, §4)

ROOFLINE_PARAMS = ("compute_efficiency", "bandwidth_efficiency", "launch_overhead_s")
ROOFLINE_STARTS = np.array([[0.5, 0.5, 1e-4], [0.9, 0.9, 1e-5], [0.3, 0.7, 1e-3]])


def _roofline_service(z, feats):
    """The capacity roofline's service terms (MODEL.md §4) at e_F, e_B, t_l = exp(z) and the other
    serving settings at their defaults."""
    e_f, e_b, t_l = (jnp.exp(z[i]) for i in range(3))
    serving = _default_serving(feats["model"], feats["n_gpu"], e_f, e_b, t_l)
    cell = capacity_cell_terms(feats["model"], feats["gpu"], serving, feats["input_len"], feats["output_len"])
    return service_terms(cell, None, feats["batch"], feats["input_len"], feats["output_len"])


def _roofline_predict(z, feats):
    out = _roofline_service(z, feats)
    return out["itl_s"], out["ttft_s"]


def _roofline_residuals(z, feats, itl, ttft, mask_itl, mask_ttft):
    p_itl, p_ttft = _roofline_predict(z, feats)
    return jnp.concatenate([jnp.where(mask_itl, p_itl / itl - 1.0, 0.0), jnp.where(mask_ttft, p_ttft / ttft - 1.0, 0.0)])


@functools.partial(jax.jit, static_argnames=("iterations", "solver"))
def _fit_roofline_groups(z0, feats, itl, ttft, mask_itl, mask_ttft, *, iterations, solver):
    return _fit_batched(_roofline_residuals, z0, (feats, itl, ttft, mask_itl, mask_ttft), iterations, solver)


def roofline_errors(traces: pd.DataFrame, compute_efficiency=1.0, bandwidth_efficiency=1.0, launch_overhead_s=0.0) -> pd.DataFrame:
    """Signed relative errors (pred/meas − 1) of the roofline ITL and TTFT on ``traces``' rows."""
    feats = _row_features(traces)
    z = jnp.log(jnp.asarray([compute_efficiency, bandwidth_efficiency, max(launch_overhead_s, 1e-300)]))
    itl, ttft = map(np.asarray, _roofline_predict(z, feats))
    return pd.DataFrame({"itl_error": itl / traces["itl_s"].to_numpy(float) - 1,
                         "ttft_error": ttft / traces["ttft_s"].to_numpy(float) - 1}, index=traces.index)


def calibrate_roofline(traces: pd.DataFrame, group_by: Sequence[str] = ("model", "gpu", "n_gpu", "framework"), *,
                       solver: str = "lm", iterations: int = 40) -> xr.Dataset:
    """Fit the capacity roofline's e_F, e_B and t_l (MODEL.md §0, §4) to measured ITL and TTFT per
    group, all groups in one batched solve (the same engine as :func:`calibrate`); residuals are
    the relative ITL and TTFT errors of every row that has them."""
    if solver not in ("lm", "adam"):
        raise SlimjaxError("solver", f"must be 'lm' or 'adam', got {solver!r}")
    group_by = list(group_by)
    traces = traces[traces["itl_s"].notna() | traces["ttft_s"].notna()].reset_index(drop=True)
    if traces.empty:
        raise SlimjaxError("traces", "no rows with ttft_s or itl_s to fit the roofline to")
    keys, index, valid = _padded_groups(traces, group_by)
    feats = jax.tree_util.tree_map(lambda x: np.asarray(x)[index], _row_features(traces))
    itl, ttft = traces["itl_s"].to_numpy(float)[index], traces["ttft_s"].to_numpy(float)[index]
    m_itl, m_ttft = valid & np.isfinite(itl), valid & np.isfinite(ttft)
    itl, ttft = np.where(m_itl, itl, 1.0), np.where(m_ttft, ttft, 1.0)
    z, cost, its, conv, J = map(np.asarray, _sharded(
        _fit_roofline_groups, np.log(ROOFLINE_STARTS), feats, itl, ttft, m_itl, m_ttft, iterations=iterations, solver=solver))
    n = m_itl.sum(axis=1) + m_ttft.sum(axis=1)
    cov, identified, _ = _uncertainty(z, cost, J, n)
    p_itl, p_ttft = map(np.asarray, jax.vmap(_roofline_predict)(jnp.asarray(z), feats))
    mape = lambda pred, meas, m: np.nanmean(np.where(m, np.abs(pred / meas - 1), np.nan), axis=1) * 100
    gdims = tuple(group_by)
    frame = pd.DataFrame([k if isinstance(k, tuple) else (k,) for k in keys], columns=group_by)
    ds = xr.Dataset(
        {
            "coefficients": (("group", "param"), np.exp(z)),
            "standard_error": (("group", "param"), np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0))),
            "identified": (("group", "param"), identified),
            "converged": ("group", conv), "loss": ("group", cost), "n_points": ("group", n),
            "mape_itl": ("group", mape(p_itl, itl, m_itl), {"units": "%"}),
            "mape_ttft": ("group", mape(p_ttft, ttft, m_ttft), {"units": "%"}),
        },
        coords={"group": np.arange(len(keys)), "param": list(ROOFLINE_PARAMS), **{c: ("group", frame[c].to_numpy()) for c in group_by}},
        attrs={"solver": solver, "residual": "ITL_pred/ITL_meas - 1 and TTFT_pred/TTFT_meas - 1", "group_by": list(gdims)},
    )
    return ds.set_index(group=list(gdims)).unstack("group")
