"""Agents (MODEL.md §6; source 001 "Agents"): layered fork-join graphs on a local replica vs an API.

Pure functions of broadcastable arrays. A graph has n_st stages of n_call identical calls each, a tool
delay d between stages and a requested parallelism p.

**The API schedule in closed form.** MODEL.md §6 launches call i at
t_i = max(t_{i−1} + δ, ready(stage of i), c_{i−p}) with c_j = t_j + s (s = s_api, p = p_api). Inside one
stage that starts launching at t_0 (every earlier call is done by then, so only calls of the same stage
bind through c_{i−p}), by induction on i:

    t_i = t_0 + ⌊i/p⌋·P + (i mod p)·δ,        P = max(s, p·δ).

Base: t_0. Step: if i mod p ≠ 0, c_{i−p} = t_0 + (⌊i/p⌋ − 1)·P + (i mod p)·δ + s ≤ t_{i−1} + δ (as s ≤ P),
so the spacing binds and t_i = t_{i−1} + δ. If i mod p = 0, t_{i−1} + δ = t_0 + (⌊i/p⌋ − 1)·P + p·δ and
c_{i−p} = t_0 + (⌊i/p⌋ − 1)·P + s, whose max is t_0 + ⌊i/p⌋·P. (With i < p there is no c_{i−p}: the
same formula.) So a stage of n calls lasts D = ⌊(n−1)/p⌋·P + ((n−1) mod p)·δ + s from its first launch
to its last completion, and its last launch is at D − s.

Across stages: stage k+1 is ready at (stage k's first launch) + D + d, and its first launch must also
wait δ after stage k's last launch, at (first launch) + D − s + δ. So stages start every
D + max(d, δ − s), and

    T_api = (n_st − 1)·(D + max(d, δ − s)) + D.

δ = 0 (no quota) and p = ∞ (no limit) are the limits of the same formula. ``api_binding_limit`` says
which of the three contributes most: the spacing, the parallelism waves, or the service time itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

API_LIMITS = ("spacing", "parallelism", "service")  # codes 0, 1, 2 of agent_api_limit
WINNERS = ("local", "api")  # codes 0, 1 of agent_faster / agent_cheaper


def wave_width(parallelism, slots):
    """w = max(1, min(p, m)): calls one local replica runs at once (m = min(B, max_seqs) slots)."""
    return jnp.maximum(1.0, jnp.minimum(parallelism, slots))


def local_time(stages, calls, tool_delay_s, width, service_at_width, slots):
    """T_local = n_st·⌈n_call/w⌉·S(w) + (n_st − 1)·d, seconds; +inf where no sequence fits (m = 0)."""
    t = stages * jnp.ceil(calls / width) * service_at_width + (stages - 1.0) * tool_delay_s
    return jnp.where(slots >= 1, t, jnp.inf)


def dependency_bound(stages, tool_delay_s, service_at_1, slots):
    """T_dep = n_st·S(1) + (n_st − 1)·d: no schedule on this replica is faster; +inf where m = 0."""
    return jnp.where(slots >= 1, stages * service_at_1 + (stages - 1.0) * tool_delay_s, jnp.inf)


def api_spacing(rpm, tpm, input_len, output_len):
    """δ = 60/q seconds between launches, q = min(RPM, TPM/(I + O)) calls per minute (0 when both are inf)."""
    q = jnp.minimum(rpm, tpm / (input_len + output_len))
    return jnp.where(jnp.isinf(q), 0.0, 60.0 / q)


def api_stage_time(calls, spacing_s, service_s, parallelism):
    """D: first launch to last completion of one stage of ``calls`` (see the module docstring)."""
    period = jnp.maximum(service_s, parallelism * spacing_s)
    waves = jnp.floor((calls - 1.0) / parallelism)
    rest = jnp.mod(calls - 1.0, parallelism)
    # p = inf: every call is in the first wave (inf·0 would be NaN)
    return jnp.where(jnp.isinf(parallelism), (calls - 1.0) * spacing_s, waves * period + rest * spacing_s) + service_s


def api_time(stages, calls, tool_delay_s, spacing_s, service_s, parallelism):
    """T_api = (n_st − 1)·(D + max(d, δ − s)) + D, seconds (MODEL.md §6 schedule, closed form)."""
    d = api_stage_time(calls, spacing_s, service_s, parallelism)
    return (stages - 1.0) * (d + jnp.maximum(tool_delay_s, spacing_s - service_s)) + d


def api_binding_limit(stages, calls, tool_delay_s, spacing_s, service_s, parallelism):
    """Which limit contributes most to a stage's time (per stage, with the wait between stages): 0 spacing
    (launch spacing δ, incl. waves of p paced by δ when p·δ ≥ s, and δ − s beyond d between stages),
    1 parallelism (waves of p calls waiting for a free slot, s > p·δ), 2 service (s itself); ties go to
    the later code (service, then parallelism)."""
    waves = jnp.where(jnp.isinf(parallelism), 0.0, jnp.floor((calls - 1.0) / parallelism))
    rest = jnp.where(jnp.isinf(parallelism), calls - 1.0, jnp.mod(calls - 1.0, parallelism))
    paced = parallelism * spacing_s >= service_s
    spacing_part = (
        rest * spacing_s
        + jnp.where(paced, waves * parallelism * spacing_s, 0.0)
        + jnp.where(stages > 1, jnp.maximum(0.0, spacing_s - service_s - tool_delay_s), 0.0)
    )
    parallelism_part = jnp.where(paced, 0.0, waves * service_s)
    return jnp.where(
        (service_s >= spacing_part) & (service_s >= parallelism_part),
        2,
        jnp.where(parallelism_part >= spacing_part, 1, 0),
    )


def rental_cost(price_per_gpu_hour, n_gpu, local_s):
    """price/GPU-hour · n_gpu · T_local / 3600, USD (+inf where the replica cannot run)."""
    return price_per_gpu_hour * n_gpu * local_s / 3600.0


def api_cost(stages, calls, input_len, output_len, price_in_per_mtok, price_out_per_mtok):
    """n_st·n_call·(I·p_in + O·p_out)/1e6, USD."""
    return stages * calls * (input_len * price_in_per_mtok + output_len * price_out_per_mtok) / 1e6


def break_even_price_per_mtok(stages, calls, input_len, output_len, local_cost_usd):
    """The blended API price per million tokens (input and output alike, over the graph's n_st·n_call·(I + O)
    tokens) at which the API costs what the local replica does: local cost · 1e6 / (n_st·n_call·(I + O)), USD.
    NaN where the replica cannot run (no price makes the two equal)."""
    tokens = stages * calls * (input_len + output_len)
    return jnp.where(jnp.isfinite(local_cost_usd), local_cost_usd * 1e6 / tokens, jnp.nan)


def blended_price_per_mtok(input_len, output_len, price_in_per_mtok, price_out_per_mtok):
    """(I·p_in + O·p_out) / (I + O): the API's price per million of the graph's tokens, USD."""
    return (input_len * price_in_per_mtok + output_len * price_out_per_mtok) / (input_len + output_len)


def break_even_rpm(stages, calls, tool_delay_s, service_s, parallelism, tpm, input_len, output_len, local_s, steps=200):
    """The smallest API requests-per-minute quota at which the graph runs no slower on the API than locally
    (T_api ≤ T_local), with the token quota, service time and parallelism as given. T_api is continuous and
    non-decreasing in the launch spacing δ = 60/RPM, so the largest δ with T_api(δ) ≤ T_local is found by
    bisection on [δ_min, (T_local − s)/(N − 1)] (N = n_st·n_call calls: their launches alone take (N − 1)·δ),
    δ_min = 60·(I + O)/TPM where the token quota caps the rate. 0 where any quota will do (one call, or the API
    as fast with no spacing at all, δ* unbounded); NaN where no quota makes the API as fast (the token quota,
    the service time or the parallelism binds) or the replica cannot run."""
    tokens = input_len + output_len
    floor = jnp.where(jnp.isinf(tpm), 0.0, 60.0 * tokens / tpm)

    def t_api(spacing):
        return api_time(stages, calls, tool_delay_s, spacing, service_s, parallelism)

    n = stages * calls
    top = jnp.maximum((local_s - service_s) / jnp.maximum(n - 1.0, 1.0), floor)
    feasible = jnp.isfinite(local_s) & (t_api(floor) <= local_s)
    unbounded = feasible & ((n <= 1.0) | (t_api(top * 2.0 + 1.0) <= local_s))

    def halve(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        ok = t_api(mid) <= local_s
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    args = (stages, calls, tool_delay_s, service_s, parallelism, tpm, input_len, output_len, local_s)
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in args))
    bounds = (jnp.broadcast_to(floor, shape), jnp.broadcast_to(top * (1.0 + 1e-12) + 1e-300, shape))
    lo, _ = jax.lax.fori_loop(0, steps, halve, bounds)
    rpm = jnp.where(lo > 0, 60.0 / jnp.where(lo > 0, lo, 1.0), jnp.inf)
    return jnp.where(feasible, jnp.where(unbounded, 0.0, rpm), jnp.nan)


def winner(local, api):
    """0 (local) where local ≤ api, else 1 (api): ties go to the replica you already have."""
    return jnp.where(local <= api, 0, 1)
