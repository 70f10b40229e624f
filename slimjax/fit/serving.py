"""Roofline constants fitted through the serving simulation (MODEL.md §9 as the forward model): e_F, e_B, t_l, the
per-step floor t_step, and the link's achieved fraction η_link and latency τ (§4c), from measured serving rows.

A measured row (model, GPU, TP n, concurrency C, prompt I, output O, mean TTFT, mean TPOT) is a closed loop of C
clients × ``requests_per_client`` requests of (I, O) on one replica with batch limit C, scored after the first C
completions, as :mod:`slimjax.studies.serving_check` scores it. Residuals are sim/measured − 1 of TTFT and TPOT.
The Jacobian is forward-mode autodiff through the jitted loop itself (one tangent per constant, all rows' lanes at
once: each lane's constants are its group's, so a tangent moving one constant of every lane gives every lane's own
derivative). Levenberg–Marquardt runs per group on the host, every group's rows in each simulation.

Each constant is bounded to its physical range (efficiencies in (0, 1) by a logistic, times > 0 by exp). A
constant the rows cannot identify — a flat direction of the normalised JᵀJ (t_l and t_step are one per-step cost
to the simulation: free both and both are unidentified), one the residuals barely feel (the link at TP 1), or one
that ends at its bound — is reported as such (``identified``, ``at_bound``), not as fitted.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr

from ..config import uses_float64
from ..engine import sim as engine
from ..errors import SlimjaxError
from ..inputs.catalog import resolve_gpu
from ..inputs.engines import ENGINE_SETTING_KEYS, resolve_engine
from ..inputs.harnesses import DEFAULT as DEFAULT_HARNESS
from ..inputs.harnesses import harnesses, request_lengths
from ..inputs.physics import row_specs
from ..inputs.serving import SERVING, default_serving
from ..inputs.traces import LAYOUT_COLUMNS
from ..model import batching as floor
from ..model.calculator import replicated_kv
from .solver import coefficient_slopes, coefficients_from, parameters_from
from .uncertainty import gauss_newton

SERVING_PARAMS = (
    "compute_efficiency",
    "compute_efficiency_fp8",
    "bandwidth_efficiency",
    "bandwidth_efficiency_fp8",
    "launch_overhead_s",
    "step_overhead_s",
    "link_efficiency",
    "allreduce_latency_s",
    "expert_compute_efficiency",
    "expert_bandwidth_efficiency",
    "layer_overhead_s",
    "expert_layer_overhead_s",
    "engine_allreduce_latency_s",
)
SERVING_BOUNDED = (
    "compute_efficiency",
    "compute_efficiency_fp8",
    "bandwidth_efficiency",
    "bandwidth_efficiency_fp8",
    "link_efficiency",
    "expert_compute_efficiency",
    "expert_bandwidth_efficiency",
)  # of a peak
# t_l stays as the closed forms fitted it unless freed: to the simulation it is one per-step cost with t_step
DEFAULT_FREE = (
    "compute_efficiency",
    "bandwidth_efficiency",
    "step_overhead_s",
    "link_efficiency",
    "allreduce_latency_s",
)
DEFAULT_START = dict(
    compute_efficiency=0.7,
    compute_efficiency_fp8=0.7,  # a start or constants without it: compute_efficiency's (one fraction of either peak)
    bandwidth_efficiency=0.7,
    bandwidth_efficiency_fp8=0.7,  # likewise: bandwidth_efficiency's where left out
    launch_overhead_s=0.0,
    step_overhead_s=1e-3,
    link_efficiency=0.7,
    allreduce_latency_s=2e-5,
    # left out: the experts' grouped GEMMs as efficient as the dense ones (a fit of them starts where it is told)
    expert_compute_efficiency=1.0,
    expert_bandwidth_efficiency=1.0,
    # left out: no per-layer costs, NCCL's all-reduce (a fit of them starts where it is told)
    layer_overhead_s=0.0,
    expert_layer_overhead_s=0.0,
    engine_allreduce_latency_s=0.0,
)
# a time held at 0 is exp(−30) s in the fit's coordinates; these are exactly 0 below this (τ_c > 0 switches the
# all-reduce to the engine's kernel, and held at 0 every result stays what it was without them)
OFF_BELOW = ("layer_overhead_s", "expert_layer_overhead_s", "engine_allreduce_latency_s")
OFF_BELOW_S = 1e-12
AT_BOUND = 1e-3  # a fraction within this of 0 or 1 (a time below this many seconds × 1e-3) sits at its bound


MEASURED = ("ttft_s", "itl_s", "e2e_s")  # the summaries a row may be scored on (NaN: not measured)
# a request's client-side overhead (HTTP, tokenisation, scheduling, streaming back), seconds: its physical range
REQUEST_OVERHEAD_BOUNDS = (0.0, 0.1)


def fit_request_overhead(sim_ttft_s, measured_ttft_s) -> tuple[float, bool]:
    """(δ, at_bound): the client-side overhead δ every request's TTFT carries beyond the engine's (the simulation's
    TTFT), least squares on relative error, Σ((s_i + δ)/m_i − 1)², in closed form δ = Σ(1 − s_i/m_i)/m_i ÷ Σ1/m_i²
    (TTFT is linear in δ: the engine never sees it), clipped to :data:`REQUEST_OVERHEAD_BOUNDS` (``at_bound`` then).
    Rows with either figure missing are left out; none left: (0, True)."""
    s, m = np.asarray(sim_ttft_s, float), np.asarray(measured_ttft_s, float)
    ok = np.isfinite(s) & np.isfinite(m) & (m > 0)
    if not ok.any():
        return 0.0, True
    s, m = s[ok], m[ok]
    delta = float(np.sum((1.0 - s / m) / m) / np.sum(1.0 / m**2))
    lo, hi = REQUEST_OVERHEAD_BOUNDS
    return float(np.clip(delta, lo, hi)), not lo < delta < hi


# serving keys a row's engine profile sets (configs/engines.yaml), in the forward model's per-row inputs
PROFILE_KEYS = ENGINE_SETTING_KEYS


def row_profiles(rows: pd.DataFrame) -> pd.DataFrame:
    """Per row, the serving settings of its engine's profile on its GPU (its ``framework``, e.g. ``vllm 0.11.0``;
    ``generic`` where it names none or one the catalog lacks): one column per :data:`PROFILE_KEYS`, in the
    spec's units (a KV policy as its code), and ``engine``, the profile's catalog key."""
    framework = (
        rows["framework"].fillna("generic").astype(str)
        if "framework" in rows
        else pd.Series("generic", index=rows.index)
    )
    out = []
    cache = {}
    for f, g in zip(framework, rows["gpu"], strict=True):
        if (f, g) not in cache:
            profile = resolve_engine(f, "traces.framework")
            defaults = {k: SERVING[k].default for k in PROFILE_KEYS}  # what a profile leaves out: §9's
            settings = {**defaults, **profile.settings(g, resolve_gpu(g, "traces.gpu")[1])}
            cache[f, g] = {"engine": profile.key, **{k: SERVING[k].to_base(settings[k]) for k in PROFILE_KEYS}}
        out.append(cache[f, g])
    return pd.DataFrame(out, index=rows.index)


def row_harnesses(rows: pd.DataFrame, requests_per_client: int | None = None) -> pd.DataFrame:
    """Per row, how its client ran (its ``harness`` column, configs/harnesses.yaml; the default where it has none):
    ``requests_per_client`` (``requests_per_client``, where given, for every row), ``range_ratio`` and
    ``score_all``."""
    table = harnesses()
    given = rows["harness"] if "harness" in rows else pd.Series(DEFAULT_HARNESS, index=rows.index)
    keys = given.fillna(DEFAULT_HARNESS).astype(str)
    unknown = sorted(set(keys) - set(table))
    if unknown:
        raise SlimjaxError("traces.harness", f"{unknown[0]!r} is not a harness; add it to configs/harnesses.yaml")
    chosen = [table[k] for k in keys]
    return pd.DataFrame(
        dict(
            requests_per_client=[
                h.requests_per_client if requests_per_client is None else requests_per_client for h in chosen
            ],
            range_ratio=[h.range_ratio for h in chosen],
            score_all=[h.score_all for h in chosen],
        ),
        index=rows.index,
    )


def lane_inputs(rows: pd.DataFrame, step_tokens: float | None = None, requests_per_client: int | None = None) -> dict:
    """Per-row specs, serving settings and workload of the forward model (host arrays): the model and GPU specs
    (:func:`slimjax.inputs.physics.row_specs`), the row's engine profile (:func:`row_profiles`) and harness
    (:func:`row_harnesses`). An offline row's batch is prefilled in one pass (its B prompts together, as offline
    batched generation runs them); a closed-loop row's steps hold its engine's budget (``step_tokens``, where given,
    for every row)."""
    m, g = row_specs(rows)
    batch = rank_clients(rows).astype(float)
    I = rows["input_len"].to_numpy(float)
    profile = row_profiles(rows)
    budget = profile["step_tokens"].to_numpy(float) if step_tokens is None else np.full(len(rows), float(step_tokens))
    n = rows["n_gpu"].to_numpy(float)
    settings = {k: profile[k].to_numpy(float) for k in PROFILE_KEYS if k != "step_tokens"}
    offline = offline_rows(rows)
    for k in ("kv_policy", "prefill_first"):  # an offline batch is one prefill pass, as §9 runs it
        settings[k] = np.where(offline, 0.0, settings[k])
    return dict(
        model=m,
        gpu=g,
        n_gpu=n,
        clients=batch,
        **{
            k: rows[k].fillna(v).to_numpy(float) if k in rows else np.full(len(rows), v)
            for k, v in LAYOUT_COLUMNS.items()
        },
        input_len=I,
        output_len=rows["output_len"].to_numpy(float),
        step_tokens=np.where(offline, batch * I, budget),
        kv_replication=np.asarray(
            replicated_kv(n, np.asarray(m.n_kv_heads), np.asarray(m.mla))
        ),  # `auto`, as the studies run
        **settings,
        **{k: v.to_numpy() for k, v in row_harnesses(rows, requests_per_client).items()},
    )


def rank_clients(rows: pd.DataFrame) -> np.ndarray:
    """Clients per attention data-parallel rank, ⌈C/D⌉: a closed loop of C clients on a group of D ranks (its requests
    dealt round robin, docs/layouts.md) runs as D closed loops of C/D clients each, every rank's step timed as if every
    rank ran one (the forward model simulates one of them; C/D is whole for every such measured row)."""
    dp = rows["dp"].fillna(1.0).to_numpy(float) if "dp" in rows else np.ones(len(rows))
    return np.ceil(rows["batch"].to_numpy(float) / dp).astype(int)


def offline_rows(rows: pd.DataFrame) -> np.ndarray:
    """Per row, whether it is an offline batch (its ``offline`` column; none: every row is a client's)."""
    return rows["offline"].to_numpy(bool) if "offline" in rows else np.zeros(len(rows), bool)


@functools.partial(
    jax.jit, static_argnames=("clients", "per_client", "free", "offline", "waiting", "parts", "score_all", "follow")
)
def _bucket(
    z,
    x,
    *,
    clients: int,
    per_client: int,
    free: tuple[int, ...],
    offline: bool = False,
    waiting: int = 0,
    parts: tuple[bool, ...] | None = None,
    score_all: bool = False,
    follow: tuple[str, ...] = (),
):
    """(mean TTFT, mean TPOT, E2E) per lane and their Jacobian in the free z's: ``z`` (lanes, params) unconstrained
    constants (:data:`SERVING_PARAMS`), ``x`` the lanes' specs and their requests' lengths (``input_lens``,
    ``output_lens``: lanes × n). A closed loop of C clients × ``per_client`` requests on a replica admitting
    C − ``waiting`` of them at once is scored after its first C completions (``score_all``: over every request; E2E:
    their mean); an offline batch is its C requests at time 0, all scored (E2E: the batch's, its last completion).
    ``follow``: FP8 efficiencies that stand for their base constant as it moves (unset: :data:`FP8_OF`)."""
    n = clients if offline else clients * per_client
    lanes = z.shape[0]
    slots = int(2 ** np.ceil(np.log2(max(clients, 1))))

    def summaries(delta):
        theta = coefficients_from(z.at[:, list(free)].add(delta), SERVING_PARAMS, SERVING_BOUNDED)
        named = {p: theta[:, k] for k, p in enumerate(SERVING_PARAMS)}
        named.update({k: named[FP8_OF[k]] for k in follow})
        serving, terms = row_terms(x, named, parts)
        I, O = x["input_lens"], x["output_lens"]
        footprint = floor.request_footprint_bytes(
            jax.tree_util.tree_map(lambda a: a[:, None], x["model"]),
            jax.tree_util.tree_map(lambda a: a[:, None], serving),
            I + O,
        )
        limit = clients if offline else max(clients - waiting, 1)
        params = dict(terms, batch=jnp.full(lanes, float(limit)), footprint=footprint)
        stream = dict(arrival_s=jnp.zeros((lanes, n)), input_len=I, output_len=O)
        rec = engine.run_lanes(
            params, stream, replicas=1, slots=slots, clients=clients, closed=not offline, shared_stream=False
        )
        scored = slice(0, None) if offline or score_all else slice(clients, None)
        ttft = (rec["first_token_s"] - rec["arrival_s"])[:, scored]
        tpot = ((rec["end_s"] - rec["first_token_s"]) / jnp.maximum(O - 1.0, 1.0))[:, scored]
        end = (rec["end_s"] - rec["arrival_s"])[:, scored]
        e2e = end.max(axis=1) if offline else end.mean(axis=1)
        return jnp.stack([ttft.mean(axis=1), tpot.mean(axis=1), e2e], axis=-1)

    delta = jnp.zeros(len(free), z.dtype)
    jac = jax.jacfwd(lambda d: (summaries(d), summaries(d)), has_aux=True)
    J, value = jac(delta)  # (lanes, 3, free)
    return value, J


def row_terms(x: dict, named: dict, parts: tuple[bool, ...] | None = None):
    """(serving, replica terms) of lanes ``x`` (:func:`lane_inputs`, gathered per lane) at the constants ``named``
    (:data:`SERVING_PARAMS` name -> per-lane value; the link's two are GPU fields, the rest serving keys): the rows'
    engine, its optional lane parts ``parts`` (:func:`slimjax.engine.sim.with_parts`; None: none of them)."""
    named = dict(named)
    named.update({p: jnp.where(named[p] < OFF_BELOW_S, 0.0, named[p]) for p in OFF_BELOW if p in named})
    link = {p: named.pop(p) for p in ("link_efficiency", "allreduce_latency_s")}
    gpu = type(x["gpu"])(**{**x["gpu"].fields(), **link})
    serving = row_serving(x, **named)
    terms = floor.replica_terms(x["model"], gpu, serving)
    return serving, engine.plain(terms) if parts is None else engine.with_parts(terms, parts)


def row_serving(x: dict, **keys):
    """The ServingSpec of lanes ``x`` (:func:`lane_inputs`): each row's TP degree, engine profile, KV replication and
    layout, with ``keys`` (serving keys, per lane) over them and every other key at its default."""
    given = {k: x[k] for k in (*PROFILE_KEYS, "kv_replication", *LAYOUT_COLUMNS)}
    return default_serving(x["model"], n_gpu=x["n_gpu"], **given, **keys)


def _buckets(rows: pd.DataFrame, inputs: dict) -> dict[tuple, np.ndarray]:
    """Row indices per (concurrency, offline, optional lane parts, requests per client, scored over all): one
    compiled loop each."""
    batch, offline = rank_clients(rows), offline_rows(rows)
    parts = engine.lane_parts(
        {"pool": batch, "kv_policy": inputs["kv_policy"], "prefill_first": inputs["prefill_first"]}
    )
    keys = [
        (int(c), bool(o), tuple(bool(v) for v in p), int(k), bool(a))
        for c, o, p, k, a in zip(batch, offline, parts, inputs["requests_per_client"], inputs["score_all"], strict=True)
    ]
    return {k: np.flatnonzero([key == k for key in keys]) for k in sorted(set(keys))}


def _simulate(z_rows, inputs, buckets, free, waiting=0, follow=()):
    """(values (rows, 3), J (rows, 3, free)) over every bucket. A bucket's lanes are padded to a power of two
    (its last row repeated), so fits on other subsets of the same rows reuse the compiled loops; its requests'
    lengths are drawn as each row's harness draws them (:func:`slimjax.inputs.harnesses.request_lengths`)."""
    rows = z_rows.shape[0]
    values = np.full((rows, len(MEASURED)), np.nan)
    J = np.full((rows, len(MEASURED), len(free)), np.nan)
    lanewise = [k for k in inputs if k not in ("requests_per_client", "range_ratio", "score_all")]
    for (c, offline, parts, per_client, score_all), idx in buckets.items():
        padded = np.concatenate([idx, np.full(int(_pow2(len(idx))) - len(idx), idx[-1])])
        x = {k: jax.tree_util.tree_map(lambda a, p=padded: jnp.asarray(np.asarray(a)[p]), inputs[k]) for k in lanewise}
        n = c if offline else c * per_client
        ratio = np.where(offline, 1.0, inputs["range_ratio"][padded])  # an offline batch: its B requests of (I, O)
        x["input_lens"] = jnp.asarray(request_lengths(inputs["input_len"][padded], n, ratio))
        x["output_lens"] = jnp.asarray(request_lengths(inputs["output_len"][padded], n, ratio))
        v, j = _bucket(
            jnp.asarray(z_rows[padded]),
            x,
            clients=int(c),
            per_client=int(per_client),
            free=free,
            offline=offline,
            waiting=0 if offline else min(int(waiting), int(c) - 1),
            parts=parts,
            score_all=bool(score_all) and not offline,
            follow=tuple(follow),
        )
        values[idx], J[idx] = np.asarray(v)[: len(idx)], np.asarray(j)[: len(idx)]
    return values, J


def _pow2(n: int) -> int:
    """Lanes a bucket of n rows runs: a power of two up to 64, then a multiple of 64 (padding costs lanes)."""
    return max(8, 1 << (int(n) - 1).bit_length()) if n <= 64 else 64 * -(-int(n) // 64)


def measured_targets(traces: pd.DataFrame) -> pd.DataFrame:
    """The rows a serving fit can score and the values it scores them on: mean TTFT and TPOT where measured (> 0);
    the batch's latency (e2e_s) only for an offline row with neither (it would repeat them otherwise); NaN elsewhere.
    Rows with nothing to score, or no concurrency, are left out."""
    rows = traces[traces["batch"] >= 1].copy()
    for col in MEASURED:
        v = rows[col].astype(float) if col in rows else pd.Series(np.nan, index=rows.index)
        rows[col] = v.where(v > 0)
    latency_only = offline_rows(rows) & rows["ttft_s"].isna().to_numpy() & rows["itl_s"].isna().to_numpy()
    rows["e2e_s"] = rows["e2e_s"].where(latency_only)
    return rows[rows[list(MEASURED)].notna().any(axis=1)].reset_index(drop=True)


# the FP8 efficiencies and the constant each stands in for when unset (the roofline's rule)
FP8_OF = {"compute_efficiency_fp8": "compute_efficiency", "bandwidth_efficiency_fp8": "bandwidth_efficiency"}


def _with_fp8_efficiency(values: dict, given) -> dict:
    """``values`` with e_F8 = e_F and e_B8 = e_B where ``given`` (the caller's constants) leaves them out: one
    fraction of either peak, as the roofline takes an unset e_F8 or e_B8."""
    return {**values, **{k: values[base] for k, base in FP8_OF.items() if k not in given}}


def _unconstrained(values: dict) -> np.ndarray:
    """:data:`SERVING_PARAMS` at ``values`` in the fit's unconstrained coordinates (a time held at 0: exp(−30) s)."""
    with np.errstate(divide="ignore"):
        z = np.asarray(parameters_from(np.array([values[p] for p in SERVING_PARAMS]), SERVING_PARAMS, SERVING_BOUNDED))
    return np.where(np.isfinite(z), z, -30.0)


def _relative(v, J, meas):
    """Residuals sim/measured − 1 and their Jacobian (rows, 3, free) where a figure was measured, 0 elsewhere."""
    scored = np.isfinite(meas)
    m = np.where(scored, meas, 1.0)
    return np.where(scored, v / m - 1.0, 0.0), np.where(scored[:, :, None], J / m[:, :, None], 0.0)


def _at_bound(theta, bounded):
    """A fitted constant at its bound: a fraction within :data:`AT_BOUND` of 0 or 1, a time under 1e-6 s."""
    return np.where(bounded, (theta < AT_BOUND) | (theta > 1 - AT_BOUND), theta < 1e-6)


def _mape(r, scored, row_groups):
    """MAPE %, per group of rows (TTFT, TPOT, E2E), of the residuals where measured (NaN where none is)."""
    err = np.where(scored, np.abs(r), np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a measure no row of a group has: NaN
        return np.array([np.nanmean(err[idx], axis=0) * 100 for idx in row_groups])


def _levenberg_marquardt(residuals, z, free_idx, row_groups, iterations):
    """Levenberg–Marquardt on the host, every group at once: ``z`` (groups, constants) unconstrained, ``free_idx``
    the columns it moves, ``row_groups`` each group's row indices, ``residuals(z)`` → (r (rows, 3), J (rows, 3,
    free)) with each row at its group's z. Returns (z, r, J, cost per group, converged per group)."""
    G = z.shape[0]
    group_of = np.empty(sum(len(i) for i in row_groups), int)
    for g, idx in enumerate(row_groups):
        group_of[idx] = g

    def per_group(x):  # (rows, 3, …) -> [(3·n_g, …)] per group
        return [x[idx].reshape(-1, *x.shape[2:]) for idx in row_groups]

    r, J = residuals(z)
    cost = np.array([np.sum(a**2) for a in per_group(r)])
    lam = np.full(G, 1e-2)
    flat = np.zeros(G, int)
    history = [cost.copy()]
    for _ in range(iterations):
        step = np.zeros((G, len(free_idx)))
        for g, (rg, Jg) in enumerate(zip(per_group(r), per_group(J), strict=True)):
            H, grad = Jg.T @ Jg, Jg.T @ rg
            D = np.diag(np.maximum(np.diag(H), 1e-12))
            step[g] = np.clip(np.linalg.solve(H + lam[g] * D + 1e-14 * np.eye(len(free_idx)), -grad), -3.0, 3.0)
        trial = z.copy()
        trial[:, list(free_idx)] += step
        r_t, J_t = residuals(trial)
        cost_t = np.array([np.sum(a**2) for a in per_group(r_t)])
        better = np.isfinite(cost_t) & (cost_t < cost)
        z = np.where(better[:, None], trial, z)
        take = better[group_of]
        r = np.where(take[:, None], r_t, r)
        J = np.where(take[:, None, None], J_t, J)
        cost = np.where(better, cost_t, cost)
        lam = np.where(better, lam / 3.0, lam * 4.0)
        history.append(cost.copy())
        # a group is done once three accepted steps in a row gained nothing, or no step descends at any damping;
        # a rejected step only raises the damping (it is not convergence)
        # scipy.optimize.least_squares' ftol: a relative gain under 1e-8 is nothing
        gained = history[-2] - cost > np.maximum(1e-8 * cost, 1e-18)
        flat = np.where(better & ~gained, flat + 1, np.where(better, 0, flat))
        if np.all((flat >= 3) | (lam > 1e6)):
            break  # more would only be simulations
    converged = (flat >= 2) | (lam > 1e4)  # steps that gain nothing, or none that descends at any damping
    return z, r, J, cost, converged


@uses_float64
def calibrate_serving(
    traces: pd.DataFrame,
    group_by=("gpu",),
    *,
    free=DEFAULT_FREE,
    start: dict | None = None,
    requests_per_client: int | None = None,
    iterations: int = 20,
    step_tokens: int | None = None,
    waiting_clients: int = 0,
    start_by_group: pd.DataFrame | None = None,
) -> xr.Dataset:
    """Fit the roofline constants in ``free`` (of :data:`SERVING_PARAMS`; the others held at ``start``, default
    :data:`DEFAULT_START`) per group of measured rows with the §9 simulation as forward model: closed-loop
    serving rows (C clients, ``step_tokens`` per step) on their mean TTFT and TPOT; offline batches (column
    ``offline``: B requests at once, prefilled in one pass) on TTFT (the batch prefill) and TPOT where measured,
    else on the batch's latency (:func:`measured_targets`). ``waiting_clients`` k: the replica admits C − k of a
    closed loop's C clients at once, so k requests always wait for the next completion (aiconfigurator's silicon
    rows read so with k = 1: mean TTFT ≈ 60 ms + S/C at C ≤ 32, one inter-completion interval of waiting, where
    k = 0 gives a prefill and a step). ``start_by_group``: a frame indexed by group key (columns of
    :data:`SERVING_PARAMS`) whose rows start those groups instead of ``start``. Returns coefficients, standard
    errors, ``identified``, ``at_bound``, ``converged``, ``n_rows`` and the TTFT/TPOT/E2E MAPE per group."""
    unknown = [p for p in free if p not in SERVING_PARAMS]
    if unknown:
        raise SlimjaxError("free", f"{unknown[0]!r} is not a fitted constant; one of {', '.join(SERVING_PARAMS)}")
    odd = [c for c in (start_by_group.columns if start_by_group is not None else ()) if c not in SERVING_PARAMS]
    if odd:
        raise SlimjaxError("start_by_group", f"column {odd[0]!r} is not a constant; one of {', '.join(SERVING_PARAMS)}")
    start_given = start
    start = _with_fp8_efficiency({**DEFAULT_START, **(start or {})}, start or {})
    rows = measured_targets(traces)
    if rows.empty:
        raise SlimjaxError("traces", "no rows with a positive ttft_s, itl_s or (offline) e2e_s at a concurrency")
    group_by = list(group_by)
    groups = rows.groupby(group_by, sort=True).indices
    keys = list(groups)
    group_of = np.empty(len(rows), int)
    for k, idx in enumerate(groups.values()):
        group_of[idx] = k
    G = len(keys)
    free_idx = tuple(SERVING_PARAMS.index(p) for p in free)
    z = np.tile(_unconstrained(start), (G, 1))
    for g, key in enumerate(keys):  # a warm start per group (a refit from the constants shipped before)
        label = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        if start_by_group is not None and label in start_by_group.index:
            given = start_by_group.loc[label].astype(float).dropna().to_dict()
            z[g] = _unconstrained(_with_fp8_efficiency({**start, **given}, given))
    inputs = lane_inputs(rows, step_tokens, requests_per_client)
    buckets = _buckets(rows, inputs)
    given = {*(start_by_group.columns if start_by_group is not None else ()), *(start_given or {})}
    follow = tuple(k for k in FP8_OF if k not in free and k not in given)  # unset: its base, as that moves
    meas = rows[list(MEASURED)].to_numpy(float)
    scored = np.isfinite(meas)

    def residuals(z_groups):
        v, J = _simulate(z_groups[group_of], inputs, buckets, free_idx, waiting_clients, follow)
        return _relative(v, J, meas)

    def per_group(x):  # (rows, 3, …) -> [(3·n_g, …)] per group
        return [x[groups[key]].reshape(-1, *x.shape[2:]) for key in keys]

    z, r, J, cost, converged = _levenberg_marquardt(residuals, z, free_idx, [groups[key] for key in keys], iterations)
    theta = np.asarray(coefficients_from(jnp.asarray(z), SERVING_PARAMS, SERVING_BOUNDED))
    n = np.array([int(scored[groups[key]].sum()) for key in keys])  # residuals each group is scored on
    J_full = np.zeros((G, len(MEASURED) * max(len(i) for i in groups.values()), len(SERVING_PARAMS)))
    for g, Jg in enumerate(per_group(J)):
        J_full[g, : len(Jg)][:, list(free_idx)] = Jg
    slope = np.asarray(coefficient_slopes(jnp.asarray(z), SERVING_PARAMS, SERVING_BOUNDED))
    cov, identified, _ = gauss_newton(z, cost, J_full, n, slope)
    is_free = np.isin(np.arange(len(SERVING_PARAMS)), free_idx)
    bounded = np.isin(SERVING_PARAMS, SERVING_BOUNDED)
    at_bound = is_free & _at_bound(theta, bounded)
    identified = identified & is_free & ~at_bound
    mape = _mape(r, scored, [groups[key] for key in keys])  # the residuals at the accepted z: no simulation again
    frame = pd.DataFrame([key if isinstance(key, tuple) else (key,) for key in keys], columns=group_by)
    ds = xr.Dataset(
        {
            "coefficients": (("group", "param"), theta),
            "standard_error": (("group", "param"), np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0))),
            "free": ("param", is_free),
            "identified": (("group", "param"), identified),
            "at_bound": (("group", "param"), at_bound),
            "converged": ("group", converged),
            "loss": ("group", cost),
            "n_rows": ("group", np.array([len(groups[key]) for key in keys])),
            "n_residuals": ("group", n),
            "mape_ttft": ("group", mape[:, 0], {"units": "%"}),
            "mape_tpot": ("group", mape[:, 1], {"units": "%"}),
            "mape_e2e": ("group", mape[:, 2], {"units": "%", "long_name": "offline batches' latency"}),
        },
        coords={"group": np.arange(G), "param": list(SERVING_PARAMS), **{c: ("group", frame[c]) for c in group_by}},
        attrs={
            "kind": "serving_calibration",
            "forward_model": f"MODEL.md §9: closed loop, C clients × {k} requests, scored after the first C, "
            f"{step_tokens or 'the engine budget'} tokens per step (each row its engine's profile, "
            "configs/engines.yaml), "
            f"C − {waiting_clients} admitted at once; offline batch: B requests at 0, "
            "prefilled in one pass",
            "residual": "TTFT_sim/TTFT_meas - 1 and TPOT_sim/TPOT_meas - 1 (offline latency-only rows: E2E)",
            "group_by": group_by,
        },
    )
    if len(group_by) == 1:
        return ds.set_index(group=group_by[0]).rename(group=group_by[0])
    return ds.set_index(group=group_by).unstack("group")


def row_constants(rows: pd.DataFrame, constants: pd.DataFrame | dict) -> dict[str, np.ndarray]:
    """Per row, each of :data:`SERVING_PARAMS` from ``constants`` (one value per name, or a frame of them row by row;
    a name left out: :data:`DEFAULT_START`; e_F8 or e_B8 left out or NaN: e_F, e_B)."""
    given = pd.DataFrame(constants, index=rows.index) if isinstance(constants, dict) else constants
    columns = {
        p: given[p].to_numpy(float) if p in given else np.full(len(rows), DEFAULT_START[p]) for p in SERVING_PARAMS
    }
    for k, base in FP8_OF.items():  # unset (left out or NaN): e_F, e_B
        own = columns[k] if k in given else np.full(len(rows), np.nan)
        columns[k] = np.where(np.isnan(own), columns[base], own)
    return columns


def _row_parameters(rows: pd.DataFrame, constants: pd.DataFrame | dict) -> np.ndarray:
    """Per row, :data:`SERVING_PARAMS` in the fit's unconstrained coordinates (:func:`row_constants`), exact to 1e-12
    (a fraction of 1 included)."""
    columns = row_constants(rows, constants)
    theta = np.stack([columns[p] for p in SERVING_PARAMS], axis=1)
    bounded = np.isin(SERVING_PARAMS, SERVING_BOUNDED)
    t = np.where(bounded, np.clip(theta, 1e-12, 1 - 1e-12), np.maximum(theta, np.exp(-30.0)))
    return np.where(bounded, np.log(t) - np.log1p(-t), np.log(t))


@uses_float64
def calibrate_serving_by(
    traces: pd.DataFrame,
    constants: pd.DataFrame,
    free: dict[str, str],
    *,
    start: dict[str, float] | None = None,
    iterations: int = 20,
) -> xr.Dataset:
    """One joint fit of constants tied across rows by a column of theirs: ``free`` maps a constant of
    :data:`SERVING_PARAMS` to the column whose values each take one (``{"bandwidth_efficiency_fp8": "gpu",
    "step_overhead_s": "engine"}``: e_B8 per GPU and t_step per engine, every row scored at its GPU's and its
    engine's), every other constant held at ``constants`` (a frame row by row, as :func:`predict_serving` takes it;
    an FP8 efficiency it leaves unset and ``free`` does not name stands for its base). ``start``: a start per free
    constant (else its value in ``constants`` on the level's first row). The forward model, residuals, bounds and
    identification are :func:`calibrate_serving`'s; a column needs no group of its own (``engine``: the rows'
    profiles, :func:`row_profiles`). Returns, per fitted value (dim ``value``: its ``param`` and ``level``),
    coefficient, standard_error, identified, at_bound and n_rows (the rows that take it); converged, loss and the
    TTFT/TPOT MAPE of the fit."""
    unknown = [p for p in free if p not in SERVING_PARAMS]
    if unknown:
        raise SlimjaxError("free", f"{unknown[0]!r} is not a fitted constant; one of {', '.join(SERVING_PARAMS)}")
    if isinstance(constants, pd.DataFrame) and len(constants) != len(traces):
        raise SlimjaxError("constants", f"{len(constants)} rows of constants for {len(traces)} rows of traces")
    names = [p for p in (constants if isinstance(constants, pd.DataFrame) else constants) if p in SERVING_PARAMS]
    tagged = traces.assign(
        **{f"held {p}": np.broadcast_to(np.asarray(constants[p], float), len(traces)) for p in names}
    )
    rows = measured_targets(tagged)  # (the constants travel with their rows)
    if rows.empty:
        raise SlimjaxError("traces", "no rows with a positive ttft_s, itl_s or (offline) e2e_s at a concurrency")
    held = pd.DataFrame({p: rows.pop(f"held {p}").to_numpy(float) for p in names}, index=rows.index)
    base = _row_parameters(rows, held)
    if "engine" not in rows:
        rows = rows.assign(engine=row_profiles(rows)["engine"].to_numpy())
    missing = [c for c in free.values() if c not in rows]
    if missing:
        raise SlimjaxError("free", f"rows have no column {missing[0]!r} to tie a constant by")
    params = list(free)
    levels = [rows[free[p]].astype(str).to_numpy() for p in params]
    slots = [(p, lv) for p, lvs in zip(params, levels, strict=True) for lv in sorted(set(lvs))]
    col = [SERVING_PARAMS.index(p) for p in params]
    # (rows, free): the slot whose value each row takes of each free constant
    slot_of = np.stack([[slots.index((p, v)) for v in lv] for p, lv in zip(params, levels, strict=True)], axis=1)
    start = start or {}
    z0 = np.array(
        [
            _unconstrained({**DEFAULT_START, p: start[p]})[SERVING_PARAMS.index(p)]
            if p in start
            else base[slot_of[:, params.index(p)] == j, SERVING_PARAMS.index(p)][0]
            for j, (p, _) in enumerate(slots)
        ]
    )
    follow = tuple(k for k in FP8_OF if k not in free and (k not in held or held[k].isna().all()))
    inputs = lane_inputs(rows)
    buckets = _buckets(rows, inputs)
    meas = rows[list(MEASURED)].to_numpy(float)
    scored = np.isfinite(meas)
    free_idx = tuple(col)
    everyone = np.arange(len(rows))

    def residuals(u):
        z_rows = base.copy()
        z_rows[:, col] = u[0][slot_of]
        v, J_rows = _simulate(z_rows, inputs, buckets, free_idx, 0, follow)
        J = np.zeros((len(rows), len(MEASURED), len(slots)))
        for k in range(len(params)):
            J[everyone, :, slot_of[:, k]] += J_rows[:, :, k]
        return _relative(v, J, meas)

    u, r, J, cost, converged = _levenberg_marquardt(
        residuals, z0[None, :], tuple(range(len(slots))), [everyone], iterations
    )
    names = [p for p, _ in slots]  # each slot's constant, for its transform
    theta = np.asarray(coefficients_from(jnp.asarray(u[0]), names, SERVING_BOUNDED))
    slope = np.asarray(coefficient_slopes(jnp.asarray(u), names, SERVING_BOUNDED))
    n = int(scored.sum())
    cov, identified, _ = gauss_newton(u, cost, J.reshape(1, -1, len(slots)), np.array([n]), slope)
    at_bound = _at_bound(theta, np.isin(names, SERVING_BOUNDED))
    mape = _mape(r, scored, [everyone])[0]
    return xr.Dataset(
        {
            "coefficient": ("value", theta),
            "standard_error": ("value", np.sqrt(np.maximum(np.diagonal(cov[0]), 0))),
            "identified": ("value", identified[0] & ~at_bound),
            "at_bound": ("value", at_bound),
            "n_rows": (
                "value",
                np.array([int((slot_of[:, params.index(p)] == j).sum()) for j, (p, _) in enumerate(slots)]),
            ),
            "converged": bool(converged[0]),
            "loss": float(cost[0]),
            "mape_ttft": (mape[0]),
            "mape_tpot": (mape[1]),
        },
        coords={
            "param": ("value", [p for p, _ in slots]),
            "level": ("value", [lv for _, lv in slots]),
            "by": ("value", [free[p] for p, _ in slots]),
        },
        attrs={"kind": "serving_calibration_by", "rows": len(rows)},
    )


@uses_float64
def predict_serving(
    rows: pd.DataFrame,
    constants: pd.DataFrame | dict,
    *,
    requests_per_client: int | None = None,
    step_tokens: int | None = None,
    waiting_clients: int = 0,
) -> pd.DataFrame:
    """The §9 forward model of :func:`calibrate_serving` at given constants: ``rows`` (as :func:`measured_targets`
    keeps them) with ttft_sim_s, tpot_sim_s, e2e_sim_s and the relative errors ttft_error, tpot_error, e2e_error
    (sim/measured − 1; NaN where not measured). ``constants``: one value per :data:`SERVING_PARAMS` name, or a
    frame of them row by row (a name left out: :data:`DEFAULT_START`; e_F8 or e_B8 left out or NaN: e_F, e_B)."""
    rows = measured_targets(rows)
    z = _row_parameters(rows, constants)
    inputs = lane_inputs(rows, step_tokens, requests_per_client)
    v, _ = _simulate(z, inputs, _buckets(rows, inputs), (), waiting_clients)  # no tangent
    out = rows.copy()
    for k, (col, sim) in enumerate(zip(MEASURED, ("ttft_sim_s", "tpot_sim_s", "e2e_sim_s"), strict=True)):
        out[sim] = v[:, k]
        out[col.replace("_s", "_error").replace("itl", "tpot")] = v[:, k] / out[col] - 1.0
    return out
