"""M/M/c surrogate queue at a fixed operating point (MODEL.md §5; source 001 "Queue").

Pure functions of broadcastable arrays, pure JAX (no host callback: queue sweeps run on every device,
GPUs included). Where the largest m is known and small (≤ ``RECURRENCE_LIMIT``, e.g. a sweep's largest
batch) Erlang B is the stable recurrence itself, run to that static bound with the steps beyond each
element's m masked (11× faster than the closed form on a CPU for m ≤ 256). Otherwise it comes from the closed form
E_m(A) = Poisson(m; A) / P(N ≤ m; A) = [e^{−A}·A^m/m!] / Q(m+1, A), Q the regularised upper incomplete
gamma function (``jax.scipy.special.gammaincc``), which equals the stable recurrence
E_k = A·E_{k−1}/(k + A·E_{k−1}) to 1e-9 relative in float64 for m up to 100 000 and ρ up to 0.999 (tests;
SciPy's gammaincc stays only as a test reference).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def regularized_upper_gamma(a, x):
    """Q(a, x) = Γ(a, x)/Γ(a), elementwise (float64 recommended)."""
    return jax.scipy.special.gammaincc(a, x)


RECURRENCE_LIMIT = 4096  # above this static bound the closed form is cheaper than the recurrence


def queue_bound(batch) -> int:
    """A static bound on m for ``batch`` values (host side): the next power of two ≥ the largest, so that
    evaluations whose largest batch differs share one compiled recurrence (at most 2× its steps)."""
    import numpy as np

    return int(2 ** np.ceil(np.log2(max(float(np.max(batch)), 1.0))))


def erlang_b_recurrence(servers, load, max_servers: int):
    """E_m(A) by E_0 = 1, E_k = A·E_{k−1}/(k + A·E_{k−1}), k = 1 … m, for every m ≤ ``max_servers`` (static)."""

    def step(k, e):
        k = k + 1.0
        return jnp.where(k <= servers, load * e / (k + load * e), e)

    return jax.lax.fori_loop(
        0, int(max_servers), step, jnp.ones(jnp.broadcast_shapes(jnp.shape(servers), jnp.shape(load)))
    )


def erlang_b(servers, load, max_servers: int | None = None):
    """Erlang B blocking probability E_m(A) for m ≥ 1 servers and offered load A ≥ 0 Erlangs; with
    ``max_servers`` (a static bound on m) ≤ RECURRENCE_LIMIT, by the recurrence."""
    if max_servers is not None and max_servers <= RECURRENCE_LIMIT:
        return erlang_b_recurrence(servers, load, max_servers)
    log_pmf = servers * jnp.log(load) - load - jax.scipy.special.gammaln(servers + 1.0)
    return jnp.where(load > 0, jnp.exp(log_pmf) / regularized_upper_gamma(servers + 1.0, load), 0.0)


def erlang_c(servers, load, utilization, max_servers: int | None = None):
    """Erlang C, P(wait) = E_m / (1 − ρ·(1 − E_m)), for a stable queue (ρ < 1)."""
    e = erlang_b(servers, load, max_servers)
    return e / (1.0 - utilization * (1.0 - e))


def mmc(servers, service_s, arrival_rate, max_servers: int | None = None):
    """M/M/c with m = ``servers`` slots of service time S at arrival rate λ (§5); ``max_servers`` a
    static bound on m where known (see :func:`erlang_b`).

    Returns utilization ρ = λS/m, p_wait, wait_s W_q = P_wait·S/(m(1−ρ)), response_s R = W_q + S and
    in_system L = λR. No steady state when m = 0 or ρ ≥ 1: P_wait = 1 and the times and L are +inf;
    ρ is then reported as is (+inf when m = 0).
    """
    load = arrival_rate * service_s
    load = jnp.where(servers > 0, load, 0.0)
    safe_m = jnp.where(servers > 0, servers, 1.0)
    rho = jnp.where(servers > 0, load / safe_m, jnp.inf)
    stable = (servers > 0) & (rho < 1.0)
    p_wait = erlang_c(safe_m, jnp.where(stable, load, 0.0), jnp.where(stable, rho, 0.0), max_servers)
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
