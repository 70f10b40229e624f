"""The batch-capacity advisor evaluated as the SLIM paper does (source 000 §VII-B; MODEL.md §2).

On measured throughput curves (one per model, GPU, TP degree, I, O): the ground-truth B_cap from the
measured T and E2E, SLIM's recommendation from a few profiled points of the curve or from one fixed
global calibration, and how they compare — exact match, within one grid step, throughput lost,
profiling effort, KV-cache saving — under the paper's tight (2×) and loose (4×) SLOs.

**Profiled points and what they identify.** At fixed (I, O), MODEL.md §1 is affine in B:
E2E(B) = a + b·B with a = (B0/η_m)·X + t_fixed and b = F_pre,1/(η_c F) + X/η_m, X = T_d + M_dec/BW.
So points of one curve identify (a, b) and nothing more; fitting θ to them is fitting a, b ≥ 0. The
slim-kv variant is the same affine form up to max_seqs (then (B/B_eff)·E2E(B_eff), flat throughput),
and a recommendation never exceeds max_seqs, so on one curve both variants give the same profiled
recommendation. Each curve's (a, b) is fitted by Levenberg–Marquardt on relative throughput errors,
every curve at once (:func:`slimjax.fit.solver.fit_batched`).

**SLO.** The paper's SLO is factor × E2E(2, 128, 32). The measured curves hold no I = 2 run, so the
reference is each curve's own measured E2E at B = 32 (the paper's reference batch) — an absolute SLO
in seconds that both the truth and the recommendation are held to.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd

from .. import constants
from ..config import float64_scope
from ..errors import SlimjaxError
from ..fit.features import default_max_seqs
from ..fit.slim import calibrate, predict
from ..fit.solver import LevenbergMarquardt, fit_batched
from ..inputs.catalog import resolve_gpu, resolve_model
from ..inputs.traces import load_traces
from ..model.specs import GPUSpec, ModelSpec, stack

SLO_FACTORS = {"tight": 2.0, "loose": 4.0}
REFERENCE_BATCH = 32
DEFAULT_EPSILON = 0.5
PROFILED_K = (2, 3)
VARIANTS = constants.SLIM_VARIANTS
SOURCES = {  # measured file → which rows are curves of the study
    "llm_inference_bench.csv": lambda df: df[df["framework"].str.lower() == "vllm"],
    "splitwise_perf_model.csv": lambda df: df,
}
CURVE_KEYS = ["source", "model", "gpu", "n_gpu", "input_len", "output_len"]


def measured_curves(data_dir: str | Path) -> pd.DataFrame:
    """One row per (curve, batch): mean E2E over repeats, T = B·(I + O)/E2E, and max_seqs at the serving
    defaults (MODEL.md §3). Curves keep only if they have B = 1, the reference batch and ≥ 3 batch sizes."""
    frames = []
    for name, rows in SOURCES.items():
        path = Path(data_dir) / "measured" / name
        if not path.is_file():
            raise SlimjaxError(
                "data", f"{path} not found (the advisor study reads it; set SLIMJAX_DATA to the shared data folder)"
            )
        df = rows(load_traces(path))
        df = df.assign(source=name.removesuffix(".csv"))
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    df = df.groupby([*CURVE_KEYS, "batch"], as_index=False)["e2e_s"].mean()
    df["throughput"] = df["batch"] * (df["input_len"] + df["output_len"]) / df["e2e_s"]
    df["ttft_s"] = df["itl_s"] = np.nan  # the curves are fitted on throughput alone
    batches = df.groupby(CURVE_KEYS)["batch"].agg(lambda s: set(s))
    good = batches[batches.map(lambda b: 1 in b and REFERENCE_BATCH in b and len(b) >= 3)].index
    df = df.set_index(CURVE_KEYS).loc[good].reset_index().sort_values([*CURVE_KEYS, "batch"], ignore_index=True)
    df["curve"] = df.groupby(CURVE_KEYS, sort=False).ngroup()
    models = {m: resolve_model(m)[1] for m in df["model"].unique()}
    gpus = {g: resolve_gpu(g)[1] for g in df["gpu"].unique()}
    with float64_scope():
        m = stack(ModelSpec, [models[x] for x in df["model"]])
        g = stack(GPUSpec, [gpus[x] for x in df["gpu"]])
        df["max_seqs"] = default_max_seqs(
            m, g, df["n_gpu"].to_numpy(float), df["input_len"].to_numpy(float), df["output_len"].to_numpy(float)
        )
    return df


def b_cap(batch, throughput, e2e, slo_s, epsilon, limit=np.inf) -> int:
    """MODEL.md §2 on one curve: argmax T over B with E2E ≤ SLO, T/(B·T(1)) > ε and B ≤ ``limit``;
    ties to the smaller B; 0 where no batch qualifies."""
    t1 = throughput[batch == 1][0]
    ok = (e2e <= slo_s) & (throughput / (batch * t1) > epsilon) & (batch <= limit)
    if not ok.any():
        return 0
    t = np.where(ok, throughput, -np.inf)
    return int(batch[np.flatnonzero(t == t.max())[0]])


def knee(batch, throughput, epsilon) -> float:
    """Where T(B)/(B·T(1)) first falls to ε, interpolated linearly in log B; NaN when it stays above ε
    over the batches given (the knee lies beyond them)."""
    ratio = throughput / (batch * throughput[batch == 1][0])
    below = np.flatnonzero(ratio <= epsilon)
    if below.size == 0:
        return np.nan
    j = below[0]
    if j == 0:
        return float(batch[0])
    x0, x1, r0, r1 = np.log(batch[j - 1]), np.log(batch[j]), ratio[j - 1], ratio[j]
    return float(np.exp(x0 + (r0 - epsilon) / (r0 - r1) * (x1 - x0)))


def _affine_fit(curves: list[pd.DataFrame], k: int) -> np.ndarray:
    """(a, b) of E2E(B) = a + b·B per curve from its k smallest batches, all curves in one batched LM solve."""
    n = len(curves)
    batch = np.stack([c["batch"].to_numpy(float)[:k] for c in curves])
    e2e = np.stack([c["e2e_s"].to_numpy(float)[:k] for c in curves])
    slope = np.maximum((e2e[:, -1] - e2e[:, 0]) / (batch[:, -1] - batch[:, 0]), 1e-6 * e2e[:, 0])
    start = np.stack([np.log(np.maximum(e2e[:, 0] - slope * batch[:, 0], 1e-3 * e2e[:, 0])), np.log(slope)], axis=-1)

    def residuals(z, b, e):
        a, s = jnp.exp(z[0]), jnp.exp(z[1])
        return e / (a + s * b) - 1.0  # T_pred/T_meas − 1

    with float64_scope():
        z, *_ = fit_batched(
            residuals,
            jnp.asarray(start)[:, None, :],
            (jnp.asarray(batch), jnp.asarray(e2e)),
            LevenbergMarquardt(iterations=40),
        )
        return np.exp(np.asarray(z)).reshape(n, 2)


@dataclasses.dataclass(frozen=True)
class AdviseResult:
    per_curve: (
        pd.DataFrame
    )  # one row per (curve, SLO, method); plateau: the measured T/(B·T(1)) ≤ ε at the recommendation
    summary: pd.DataFrame  # one row per (SLO, method, curves subset)
    knees: pd.DataFrame  # one row per (curve, method): measured and predicted knee
    assumptions: tuple[str, ...] = ()  # what moves the answer, as the output ends with it

    @property
    def dense_points(self) -> int:
        """A curve with at least this many batch points is summarised as dense (:data:`DENSE_POINTS`)."""
        return DENSE_POINTS

    @property
    def knee_table(self) -> pd.DataFrame:
        """Where each method's knee lands against the measured one (:func:`knee_summary`)."""
        return knee_summary(self.knees)


DENSE_POINTS = 5  # a curve with fewer batch points is flagged: "within one step" says little on it
LOCO = "leave-one-curve-out"


def constant_rule(b: float, batch: np.ndarray, limit: float) -> int:
    """ "Always B = b" on one curve: b where measured, else the largest measured batch below it; never above
    max_seqs (as every recommendation); 0 where no measured batch qualifies."""
    ok = batch[(batch <= b) & (batch <= limit)]
    return int(ok.max()) if ok.size else 0


def runs_needed(batch: np.ndarray, profiled: int) -> float:
    """Fraction of a curve's points a method measures: its ``profiled`` smallest batches and the SLO's reference
    run at B = 32 (the SLO is factor × E2E(32): no method knows it without that run)."""
    runs = set(batch[:profiled].tolist()) | {float(REFERENCE_BATCH)}
    return len(runs) / len(batch)


def _global_predictions(df: pd.DataFrame, variant: str, loco: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per curve, (T, E2E) predicted by one calibration per data source: fitted on every curve (in sample) or,
    with ``loco``, on the source's other curves (one batched solve, a group per left-out curve)."""
    curve = df["curve"].to_numpy()
    if loco:
        folds = pd.concat(
            [df[(df["source"] == src) & (df["curve"] != i)].assign(fold=i) for i, src in _curve_sources(df).items()],
            ignore_index=True,
        )
        coeffs = calibrate(folds, group_by=("fold",), variant=variant)
        pred = predict(coeffs, df.assign(fold=curve))
    else:
        pred = predict(calibrate(df, group_by=("source",), variant=variant), df)
    t, e = pred["pred_throughput"].to_numpy(), pred["pred_e2e_s"].to_numpy()
    return [(t[curve == i], e[curve == i]) for i in range(int(curve.max()) + 1)]


def _curve_sources(df: pd.DataFrame) -> dict[int, str]:
    return df.groupby("curve", sort=True)["source"].first().to_dict()


def evaluate(data_dir: str | Path, epsilon: float = DEFAULT_EPSILON) -> AdviseResult:
    """The advisor study on the shared measured curves (see the module docstring)."""
    return evaluate_curves(measured_curves(data_dir), epsilon)


def evaluate_curves(df: pd.DataFrame, epsilon: float = DEFAULT_EPSILON) -> AdviseResult:
    """The advisor study on curves as :func:`measured_curves` gives them: SLIM's methods beside every constant
    rule "always B = b" and the best constant (chosen in sample, and for each curve on the other curves)."""
    curves = [c.reset_index(drop=True) for _, c in df.groupby("curve", sort=True)]
    predictions: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    effort: dict[str, list[float]] = {}
    for k in PROFILED_K:
        ab = _affine_fit(curves, k)
        method = f"profiled k={k} (slim = slim-kv)"
        predictions[method] = []
        for (a, s), c in zip(ab, curves, strict=False):
            b = c["batch"].to_numpy(float)
            e2e = a + s * b
            predictions[method].append((b * (c["input_len"].iloc[0] + c["output_len"].iloc[0]) / e2e, e2e))
        effort[method] = [runs_needed(c["batch"].to_numpy(float), k) for c in curves]
    for variant in VARIANTS:
        for loco in (False, True):
            method = f"global {variant} ({LOCO if loco else 'in sample'})"
            predictions[method] = _global_predictions(df, variant, loco)
            effort[method] = [runs_needed(c["batch"].to_numpy(float), 0) for c in curves]
    grid = np.unique(df["batch"].to_numpy(float))
    rules = {f"always B = {b:g}": b for b in grid}
    rows, knees = [], []
    for i, c in enumerate(curves):
        b, t, e = (c[x].to_numpy(float) for x in ("batch", "throughput", "e2e_s"))
        limit = float(c["max_seqs"].iloc[0])
        ref = e[b == REFERENCE_BATCH][0]
        key = {x: c[x].iloc[0] for x in CURVE_KEYS}
        measured_knee = knee(b, t, epsilon)
        for method, preds in predictions.items():
            knees.append(
                {
                    **key,
                    "method": method,
                    "knee_measured": measured_knee,
                    "knee_predicted": knee(b, preds[i][0], epsilon),
                }
            )
        for slo_name, factor in SLO_FACTORS.items():
            slo = factor * ref
            truth = b_cap(b, t, e, slo, epsilon, limit)
            recs = {m: (b_cap(b, p[i][0], p[i][1], slo, epsilon, limit), effort[m][i]) for m, p in predictions.items()}
            recs.update({m: (constant_rule(v, b, limit), 0.0) for m, v in rules.items()})
            for method, (rec, runs) in recs.items():
                rows.append(
                    {**key, "curve": i, "slo": slo_name, "method": method}
                    | _score(b, t, e, slo, epsilon, limit, truth, rec, runs)
                )
    per_curve = pd.DataFrame(rows)
    per_curve = pd.concat([per_curve, _best_constants(per_curve, rules)], ignore_index=True)
    return AdviseResult(
        per_curve.drop(columns="curve"),
        _summarise(per_curve),
        pd.DataFrame(knees),
        assumptions=(
            f"SLO: factor × each curve's own measured E2E at B = {REFERENCE_BATCH} (the paper's E2E(2, 128, 32) "
            "has no measured run); tight 2×, loose 4×",
            f"ε = {epsilon:g}; recommendations capped at max_seqs at the serving defaults (MODEL.md §3)",
            f"global calibrations: one per data source; '{LOCO}' refits without the curve it predicts",
            "constant rules pick the largest measured batch ≤ b; effort counts every run a method needs, the "
            f"B = {REFERENCE_BATCH} reference included",
            f"curves with fewer than {DENSE_POINTS} batch points are summarised apart ('sparse'): there one grid "
            "step is a 2× change of B",
        ),
    )


def _score(b, t, e, slo, epsilon, limit, truth, rec, runs) -> dict:
    """One recommendation scored against the truth on one curve."""

    def pos(x):
        return -1 if x == 0 else int(np.flatnonzero(b == x)[0])

    below = pos(truth) - 1 if truth else -1
    return {
        "points": len(b),
        "truth": truth,
        "recommended": rec,
        "exact": rec == truth,
        "within_one": abs(pos(rec) - pos(truth)) <= 1,
        # + a gain (the recommendation sits in the measured plateau past the truth), − a loss
        "throughput_change": (t[b == rec][0] / t[b == truth][0] - 1.0) if rec and truth else np.nan,
        # what one grid step costs on this curve: the next smaller measured batch against the truth
        "one_step_change": t[below] / t[b == truth][0] - 1.0 if below >= 0 else np.nan,
        "slo_violated": bool(rec and e[b == rec][0] > slo),
        "plateau": bool(rec and t[b == rec][0] / (rec * t[b == 1][0]) <= epsilon),
        "effort": runs,
        "max_seqs": limit,
        "kv_saving": 1.0 - rec / limit if rec and np.isfinite(limit) and limit > 0 else np.nan,
        "truth_kv_saving": 1.0 - truth / limit if truth and np.isfinite(limit) and limit > 0 else np.nan,
    }


def _best_constants(per_curve: pd.DataFrame, rules: dict) -> pd.DataFrame:
    """The constant rule with the most exact matches (ties: the smaller b), chosen on every curve (in sample) and,
    for each curve, on the other curves (leave one curve out), per SLO."""
    out = []
    const = per_curve[per_curve["method"].isin(rules)]
    for _, g in const.groupby("slo", sort=False):
        hits = g.pivot_table(index="curve", columns="method", values="exact", aggfunc="first").astype(float)
        order = sorted(hits.columns, key=lambda m: rules[m])
        hits = hits[order]
        total = hits.sum()
        in_sample = total.idxmax()  # first of the maxima: the smallest b
        for _, row in g[g["method"] == in_sample].iterrows():
            out.append(row.to_dict() | {"method": f"best constant (in sample: B = {rules[in_sample]:g})"})
        for i in hits.index:
            choice = (total - hits.loc[i]).idxmax()
            row = g[(g["curve"] == i) & (g["method"] == choice)].iloc[0].to_dict()
            out.append(row | {"method": f"best constant ({LOCO})", "chosen_b": rules[choice]})
    return pd.DataFrame(out)


def _summarise(per_curve: pd.DataFrame) -> pd.DataFrame:
    """Per (SLO, method) over every curve, and apart over the dense (≥ DENSE_POINTS points) and sparse ones."""
    subsets = {
        "all": per_curve,
        "dense": per_curve[per_curve["points"] >= DENSE_POINTS],
        "sparse": per_curve[per_curve["points"] < DENSE_POINTS],
    }
    frames = []
    for name, part in subsets.items():
        if part.empty:
            continue
        loss = np.minimum(part["throughput_change"], 0.0)  # a gain in the plateau is not a saving
        agg = (
            part.assign(loss=loss)
            .groupby(["slo", "method"], sort=False)
            .agg(
                curves=("exact", "size"),
                exact_match=("exact", "mean"),
                within_one_step=("within_one", "mean"),
                one_step_change_mean=("one_step_change", "mean"),
                throughput_change_mean=("throughput_change", "mean"),
                throughput_loss_mean=("loss", "mean"),
                throughput_change_worst=("throughput_change", "min"),
                slo_violations=("slo_violated", "mean"),
                in_plateau=("plateau", "mean"),
                profiling_effort=("effort", "mean"),
                kv_saving_mean=("kv_saving", "mean"),
                truth_kv_saving_mean=("truth_kv_saving", "mean"),
            )
            .reset_index()
        )
        frames.append(agg.assign(curves_subset=name))
    return pd.concat(frames, ignore_index=True)


def knee_summary(knees: pd.DataFrame) -> pd.DataFrame:
    """Per method: curves whose measured knee lies inside the batches, how many the method also places
    inside, and the median |log2(predicted / measured)| (in doublings of B) over those."""
    out = []
    for method, g in knees.groupby("method", sort=False):
        inside = g[np.isfinite(g["knee_measured"])]
        both = inside[np.isfinite(inside["knee_predicted"])]
        err = np.abs(np.log2(both["knee_predicted"] / both["knee_measured"]))
        out.append(
            {
                "method": method,
                "measured_knees": len(inside),
                "predicted_inside": len(both),
                "median_abs_log2_error": float(np.median(err)) if len(err) else np.nan,
                "within_2x": float(np.mean(err <= 1.0)) if len(err) else np.nan,
            }
        )
    return pd.DataFrame(out)
