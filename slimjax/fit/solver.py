"""A generic batched least-squares engine: solvers as frozen option objects, robust losses, and the
batched fit of many independent groups × restarts in one jitted, vmapped call, dealt out over the
devices.

A problem gives ``residuals(z, *data)`` for one group (z: unconstrained parameters); the engine fits
every group (leading axis of each ``data`` leaf) from every start and keeps each group's best end point.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import constants
from ..engine.dispatch import compute_devices, pipelined
from ..errors import SlimjaxError


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


@dataclasses.dataclass(frozen=True)
class LevenbergMarquardt:
    """Levenberg–Marquardt with Marquardt scaling, a fixed number of iterations (vmappable): the
    default. Converged: the last tenth of the iterations changed the cost by < 1e-9 relative."""

    iterations: int = 30

    def run(self, res, z0):
        """(z, cost, accepted steps, converged) from ``z0`` on residuals ``res(z)``."""
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
            return (
                jnp.where(better, z_new, z),
                jnp.where(better, lam / 3.0, lam * 4.0),
                jnp.where(better, cost_new, cost),
                accepted + better,
            ), (cost, lam)

        init = (z0, jnp.asarray(1e-2, z0.dtype), jnp.sum(res(z0) ** 2), jnp.asarray(0))
        (z, lam, cost, accepted), (costs, _) = jax.lax.scan(step, init, None, length=self.iterations)
        # converged: the last tenth of the iterations changed the cost by < 1e-9 relative
        tail = costs[-max(self.iterations // 10, 1)]
        converged = (tail - cost) <= 1e-9 * jnp.maximum(cost, 1e-30)
        return z, cost, accepted, converged


@dataclasses.dataclass(frozen=True)
class Adam:
    """The optax alternative: Adam on the same sum of squared residuals."""

    iterations: int = 30
    learning_rate: float = 0.05

    def run(self, res, z0):
        opt = optax.adam(self.learning_rate)

        def loss(z):
            return jnp.sum(res(z) ** 2)

        def step(carry, _):
            z, state = carry
            value, grad = jax.value_and_grad(loss)(z)
            updates, state = opt.update(grad, state, z)
            return (optax.apply_updates(z, updates), state), value

        (z, _), costs = jax.lax.scan(step, (z0, opt.init(z0)), None, length=self.iterations)
        cost = loss(z)
        converged = jnp.abs(costs[-max(self.iterations // 10, 1)] - cost) <= 1e-6 * jnp.maximum(cost, 1e-30)
        return z, cost, jnp.asarray(self.iterations), converged


# ------------------------------------------------------------- parameter transforms
# A problem fits unconstrained z: coefficients that are fractions of a peak as θ = σ(z) ∈ (0, 1), every
# other (positive) coefficient as θ = exp(z).


def coefficients_from(z, params, bounded):
    """θ from the fit parameters z (last axis): σ(z) for ``bounded`` coefficients, exp(z) for the others."""
    z = jnp.asarray(z)
    return jnp.stack(
        [jax.nn.sigmoid(z[..., i]) if p in bounded else jnp.exp(z[..., i]) for i, p in enumerate(params)], axis=-1
    )


def parameters_from(theta, params, bounded):
    """The inverse of :func:`coefficients_from` (numpy); a bounded start at 1 is taken as 0.95."""
    theta = np.asarray(theta, float)
    out = []
    for i, p in enumerate(params):
        t = theta[..., i]
        if p in bounded:
            t = np.clip(t, 1e-9, 0.95)
            out.append(np.log(t) - np.log1p(-t))
        else:
            out.append(np.log(t))
    return np.stack(out, axis=-1)


def coefficient_slopes(z, params, bounded):
    """dθ/dz per coefficient (numpy): θ(1 − θ) for ``bounded`` ones, θ for the others."""
    theta = np.asarray(coefficients_from(z, params, bounded))
    mask = np.array([p in bounded for p in params])
    return np.where(mask, theta * (1.0 - theta), theta)


SOLVERS = dict(zip(constants.SOLVER_NAMES, (LevenbergMarquardt, Adam), strict=True))


def solver_options(solver, iterations: int | None = None):
    """A solver option object from a name ("lm", "adam") and iteration count, or the object itself."""
    if isinstance(solver, (LevenbergMarquardt, Adam)):
        return solver if iterations is None else dataclasses.replace(solver, iterations=iterations)
    if solver not in SOLVERS:
        raise SlimjaxError("solver", f"must be 'lm' or 'adam', got {solver!r}")
    return SOLVERS[solver]() if iterations is None else SOLVERS[solver](iterations=iterations)


LOSSES = constants.LOSSES
CAUCHY_SCALE = 0.1  # relative error at which the Cauchy loss starts to discount a residual


def cauchy_residual(r, scale=CAUCHY_SCALE):
    """r̃ with r̃² = c²·log(1 + (r/c)²), the Cauchy (Lorentzian) loss as a residual, so a least-squares
    solver minimises Σ ρ(r): outliers (a run unlike its neighbours) weigh ~log|r| instead of r²."""
    u = (r / scale) ** 2
    safe = jnp.where(u > 1e-12, u, 1.0)
    return r * jnp.where(u > 1e-12, jnp.sqrt(jnp.log1p(safe) / safe), 1.0 - u / 4.0)


def fit_batched(residuals, z0, data, solver):
    """Fit every group (leading axis of each ``data`` leaf) from every start in ``z0`` (restarts ×
    params, or groups × restarts × params for per-group starts) with ``solver`` (an option object),
    keeping each group's best end point: z, cost, iterations, converged, Jacobian at z."""

    def one_group(starts, d):
        res = lambda z: residuals(z, *d)  # noqa: E731
        zs, costs, its, conv = jax.vmap(lambda z: solver.run(res, z))(starts)
        best = jnp.argmin(jnp.where(jnp.isfinite(costs), costs, jnp.inf))
        z = zs[best]
        return z, costs[best], its[best], conv[best], jax.jacfwd(res)(z)

    return jax.vmap(one_group, in_axes=(0 if z0.ndim == 3 else None, 0))(z0, data)


def sharded(fit, z0, *data, **options):
    """``fit(z0, *data, **options)`` with the groups (axis 0 of every ``data`` leaf, and of ``z0``
    when it has three dims) split into one equal chunk per local device (one per CPU core), each
    dispatched to its device asynchronously — the groups are independent. Chunks are padded by
    repeating the last group (one compiled shape); results are cut back to the real groups.
    (Explicit per-device dispatch through :func:`slimjax.engine.dispatch.pipelined`, as the grid:
    XLA:CPU SPMD sharding of this solve hung intermittently on two devices.)"""
    devices = compute_devices()
    groups = jax.tree_util.tree_leaves(data)[0].shape[0]
    if len(devices) == 1 or groups < 2 * len(devices):
        return fit(z0, *data, **options)
    size = -(-groups // len(devices))
    per_group_start = np.ndim(z0) == 3

    def chunk(x, k):
        x = np.asarray(x)[k * size : (k + 1) * size]
        return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)]) if len(x) < size else x

    def run(k, device):
        part = jax.device_put(jax.tree_util.tree_map(lambda x: chunk(x, k), data), device)
        start = jax.device_put(chunk(z0, k) if per_group_start else np.asarray(z0), device)
        return fit(start, *part, **options)

    outs = [o for _, o in pipelined(range(len(devices)), run, devices)]
    return tuple(np.concatenate([np.asarray(o[i]) for o in outs])[:groups] for i in range(len(outs[0])))
