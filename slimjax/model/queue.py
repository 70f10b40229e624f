"""M/M/c surrogate queue at a fixed operating point (MODEL.md §5; source 001 "Queue").

Pure functions of broadcastable arrays. Erlang B comes from the closed form
E_m(A) = Poisson(m; A) / P(N ≤ m; A) = [e^{−A}·A^m/m!] / Q(m+1, A), Q the regularised upper incomplete
gamma function, which equals the stable recurrence E_k = A·E_{k−1}/(k + A·E_{k−1}) (checked to 1e-9
relative in float64 for m up to 100 000 and ρ up to 0.999 in the tests). Q is SciPy's (cephes, with
Temme's uniform expansion where a ≈ x), called from the jitted graph: JAX's own ``gammaincc`` runs its
series to convergence for the whole array and is ~10× slower here.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np


_HOST_LOCK = threading.Lock()


def _gammaincc_host(a, x):
    from scipy.special import gammaincc

    with _HOST_LOCK:  # one at a time (see grid.evaluate: queue sweeps use one device)
        return np.asarray(gammaincc(np.asarray(a), np.asarray(x)), dtype=np.asarray(a).dtype)


def regularized_upper_gamma(a, x):
    """Q(a, x) = Γ(a, x)/Γ(a), elementwise (float64 recommended)."""
    a, x = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(x))
    shape = jax.ShapeDtypeStruct(a.shape, a.dtype)
    return jax.pure_callback(_gammaincc_host, shape, a, x, vmap_method="broadcast_all")


def erlang_b(servers, load):
    """Erlang B blocking probability E_m(A) for m ≥ 1 servers and offered load A ≥ 0 Erlangs."""
    log_pmf = servers * jnp.log(load) - load - jax.scipy.special.gammaln(servers + 1.0)
    return jnp.where(load > 0, jnp.exp(log_pmf) / regularized_upper_gamma(servers + 1.0, load), 0.0)


def erlang_c(servers, load, utilization):
    """Erlang C, P(wait) = E_m / (1 − ρ·(1 − E_m)), for a stable queue (ρ < 1)."""
    e = erlang_b(servers, load)
    return e / (1.0 - utilization * (1.0 - e))


def mmc(servers, service_s, arrival_rate):
    """M/M/c with m = ``servers`` slots of service time S at arrival rate λ (§5).

    Returns utilization ρ = λS/m, p_wait, wait_s W_q = P_wait·S/(m(1−ρ)), response_s R = W_q + S and
    in_system L = λR. No steady state when m = 0 or ρ ≥ 1: P_wait = 1 and the times and L are +inf;
    ρ is then reported as is (+inf when m = 0).
    """
    load = arrival_rate * service_s
    load = jnp.where(servers > 0, load, 0.0)
    safe_m = jnp.where(servers > 0, servers, 1.0)
    rho = jnp.where(servers > 0, load / safe_m, jnp.inf)
    stable = (servers > 0) & (rho < 1.0)
    p_wait = erlang_c(safe_m, jnp.where(stable, load, 0.0), jnp.where(stable, rho, 0.0))
    wait = p_wait * service_s / (safe_m * (1.0 - jnp.where(stable, rho, 0.0)))
    response = wait + service_s
    nan = jnp.isnan(load) & (servers > 0)  # no slots is unbounded whatever the service time
    return dict(
        utilization=rho,
        p_wait=jnp.where(stable, p_wait, jnp.where(nan, jnp.nan, 1.0)),
        wait_s=jnp.where(stable, wait, jnp.where(nan, jnp.nan, jnp.inf)),
        response_s=jnp.where(stable, response, jnp.where(nan, jnp.nan, jnp.inf)),
        in_system=jnp.where(stable, arrival_rate * response, jnp.where(nan, jnp.nan, jnp.inf)),
    )


def wait_quantile(p_wait, servers, service_s, arrival_rate, quantile):
    """The ``quantile``-th quantile of the M/M/c wait (MODEL.md §5, "Wait quantiles"), seconds.

    P(W_q > t) = P_wait·exp(−(m/S − λ)·t), so W_p = max(0, ln(P_wait/(1 − p)) / (m/S − λ)): 0 where
    P_wait ≤ 1 − p, +inf without a steady state (m = 0 or λ ≥ m/S).
    """
    safe_m = jnp.where(servers > 0, servers, 1.0)
    drain = safe_m / service_s - arrival_rate  # m/S − λ, 1/s
    stable = (servers > 0) & (drain > 0)
    ratio = jnp.where(stable & (p_wait > 0), p_wait / (1.0 - quantile), 1.0)
    wait = jnp.maximum(0.0, jnp.log(ratio) / jnp.where(stable, drain, 1.0))
    return jnp.where(stable, wait, jnp.where(jnp.isnan(service_s), jnp.nan, jnp.inf))
