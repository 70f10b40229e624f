"""Figures from stores (MODEL.md §7 sweeps, §8 procurement, §6 agents, calibration stores, validate CSVs).

Each ``*_figures`` function takes what a store holds and returns a list of :class:`Figure` (title, matplotlib
figure, caption); a store without the variables a kind needs gives none. matplotlib's object API on the Agg
canvas (no pyplot state), the Okabe–Ito colour-blind-safe palette, units on every axis, log axes where the
data spans decades, legends outside the data. Numbers come from the store, never recomputed differently.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure as MplFigure

from ..inputs.axes import on_grid_lengths
from ..studies.present import MAX_PANELS, PALETTE, Figure, StudyKind, grid, register_study, spans_decades


def _pairs(ds: xr.Dataset) -> list[tuple[str, str]]:
    """The (model, GPU) panels: all of them up to MAX_PANELS, else an even spread — 4 models × 3 GPUs taken at
    even steps through the store's order — so a fleet-wide store shows its range, not its first rows."""
    models, gpus = [str(m) for m in ds["model"].values], [str(g) for g in ds["gpu"].values]
    if len(models) * len(gpus) > MAX_PANELS:
        pick = lambda labels, k: [labels[int(round(j))] for j in np.linspace(0, len(labels) - 1, min(k, len(labels)))]  # noqa: E731
        gpus = pick(gpus, 3)
        models = pick(models, MAX_PANELS // len(gpus))
    return [(m, g) for m in models for g in gpus]


def nearest_io(ds: xr.Dataset, at: tuple[int, int] | None) -> tuple[int, int]:
    """(I, O) on the grid: ``at`` if given, else the values nearest the typical request (the summary's rule)."""
    i, o = (None, None) if at is None else at
    return on_grid_lengths(ds["input_len"].values, ds["output_len"].values, i, o, field="at")


def _epsilon(ds: xr.Dataset) -> float:
    return float(ds["b_cap"].attrs.get("epsilon", 0.5)) if "b_cap" in ds else 0.5


# ------------------------------------------------------------------------------------- sweep stores


def throughput_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """SLIM throughput vs batch per model × GPU at (I, O): the linear-scaling line from B = 1, the knee
    (T/(B·T(1)) = ε), B_cap and max_seqs, and the 90 % band where the store has intervals."""
    if "slim_throughput" not in ds:
        return []
    i, o = nearest_io(ds, at)
    pairs = _pairs(ds)
    fig, axes = grid(len(pairs))
    eps = _epsilon(ds)
    batch = ds["batch"].values.astype(float)
    for ax, (m, g) in zip(axes, pairs, strict=False):
        c = ds.sel(model=m, gpu=g, input_len=i, output_len=o)
        t = c["slim_throughput"].values.astype(float)
        ax.plot(batch, t, color=PALETTE[0], lw=2, label="SLIM throughput")
        if "slim_throughput_lo" in c:
            ax.fill_between(
                batch,
                c["slim_throughput_lo"].values,
                c["slim_throughput_hi"].values,
                color=PALETTE[0],
                alpha=0.2,
                label="90 % interval",
            )
        if batch[0] == 1:
            ax.plot(batch, t[0] * batch, color="0.4", ls="--", lw=1, label="linear from B = 1")
            below = np.flatnonzero(t / (batch * t[0]) <= eps)
            if below.size:
                ax.axvline(batch[below[0]], color=PALETTE[3], ls=":", label=f"knee (T/(B·T(1)) = {eps:g})")
        if "b_cap" in c and int(c["b_cap"]) > 0:
            ax.axvline(int(c["b_cap"]), color=PALETTE[2], lw=2, label=f"B_cap = {int(c['b_cap'])}")
        if "max_seqs" in c:
            seqs = int(c["max_seqs"])
            if seqs < 1:
                ax.text(0.5, 0.5, "does not fit", transform=ax.transAxes, ha="center", color=PALETTE[3], fontsize=12)
            elif seqs <= batch[-1]:
                ax.axvline(seqs, color=PALETTE[4], ls="-.", label=f"max_seqs = {seqs}")
                # batches beyond the KV pool have no figure (NaN in the store): greyed, nothing drawn there
                ax.axvspan(seqs, batch[-1], color="0.88", zorder=0, label="does not fit (no figure)")
        ax.set_xscale("log", base=2)
        if spans_decades(t):
            ax.set_yscale("log")
        ax.set_title(f"{m} on {g}\nI = {i}, O = {o}", fontsize=9)
        ax.set_xlabel("batch B (sequences)")
        ax.set_ylabel("throughput (tokens/s)")
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=False):
            key = lab.split(" = ")[0]
            if key not in handles:
                handles[key] = h
                labels.append(lab if " = " not in lab else key)
    fig.legend(list(handles.values()), labels, loc="outside right upper", fontsize=8)
    return [
        Figure(
            "throughput_vs_batch",
            f"Throughput vs batch at I = {i}, O = {o}",
            fig,
            "Where batching stops paying: the curve leaves the linear line at the knee; B_cap is the advisor's batch.",
        )
    ]


def stored_specs(ds: xr.Dataset, model: str, gpu: str):
    """(ModelSpec, GPUSpec, ServingSpec) the store evaluated for one pair, rebuilt from its ``specs`` attr (an
    inline model or GPU as well as a catalog one); None for a store written before specs were recorded."""
    from ..model.specs import GPUSpec, ModelSpec, ServingSpec, stack

    specs = json.loads(ds.attrs.get("specs", "null"))
    if not specs or model not in specs["models"] or gpu not in specs["gpus"]:
        return None
    return (
        stack(ModelSpec, [specs["models"][model]]),
        stack(GPUSpec, [specs["gpus"][gpu]]),
        stack(ServingSpec, [specs["serving"][model][gpu]]),
    )


def roofline_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """Arithmetic intensity vs attained FLOP/s for prefill (one prompt) and decode (one step at B) at the store's
    input lengths, under each group's peak compute and bandwidth: the work from the model floor
    (:func:`slimjax.model.roofline.prefill_pass_work`, :func:`~slimjax.model.roofline.decode_step_work`) on
    the specs the store recorded, the times the store's prefill_s and itl_s."""
    if "itl_s" not in ds or "prefill_s" not in ds:
        return []
    from ..model.calculator import roofline_terms
    from ..model.roofline import decode_step_work, prefill_pass_work

    i_all = ds["input_len"].values.astype(float)
    _, o = nearest_io(ds, at)
    pairs = [p for p in _pairs(ds) if int(ds["max_seqs"].sel(model=p[0], gpu=p[1]).max()) >= 1]
    pairs = [p for p in pairs if stored_specs(ds, *p) is not None][:6]
    if not pairs:
        return []
    fig, axes = grid(len(pairs))
    for ax, (m, g) in zip(axes, pairs, strict=False):
        model, gpu, serving = stored_specs(ds, m, g)
        raw, a_pre, a_dec = roofline_terms(model, gpu, serving, at_peak=True)
        scalars = {k: v for k, v in raw._asdict().items() if k != "expert_comm"}  # (a tuple of lines, () at peak)
        roof = raw._replace(**{k: float(np.asarray(v).reshape(-1)[0]) for k, v in scalars.items()})
        a_pre, a_dec = (float(np.asarray(v).reshape(-1)[0]) for v in (a_pre, a_dec))
        kv_per_token = roof.kv_per_token_full + roof.kv_per_token_sliding
        n = float(serving.n_gpu[0])
        peak, bw = roof.flops, roof.bandwidth
        x = np.logspace(-1, 4, 200)
        ax.plot(x, np.minimum(peak, bw * x), color="0.3", lw=1.5, label="roofline (peak, bandwidth)")
        c = ds.sel(model=m, gpu=g, output_len=o)
        pre_ops, pre_bytes = prefill_pass_work(roof.active_params, a_pre, roof.weights, kv_per_token, i_all)
        pre_t = c["prefill_s"].values.astype(float)
        ax.scatter(
            np.asarray(pre_ops / pre_bytes),
            np.asarray(pre_ops / pre_t),
            color=PALETTE[1],
            marker="s",
            label="prefill (one prompt, I)",
            zorder=3,
        )
        b = float(ds["batch"].values[min(len(ds["batch"]) - 1, np.searchsorted(ds["batch"].values, 32))])
        dec_ops, dec_bytes = decode_step_work(b, roof.active_params, a_dec, roof.weights, kv_per_token, i_all + o / 2)
        dec_ops, dec_bytes = np.asarray(dec_ops), np.asarray(dec_bytes)
        itl = c["itl_s"].sel(batch=b).values.astype(float)
        ax.scatter(
            dec_ops / dec_bytes,
            dec_ops / itl,
            color=PALETTE[0],
            marker="o",
            label=f"decode step (B = {int(b)})",
            zorder=3,
        )
        for k, ctx_k in enumerate(i_all):
            if k in (0, len(i_all) - 1):
                ax.annotate(f"I={int(ctx_k)}", (dec_ops[k] / dec_bytes[k], dec_ops[k] / itl[k]), fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("attained (FLOP/s)")
        ax.set_title(f"{m} on {n:g} × {g}, O = {o}", fontsize=9)
    h, lab = axes[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside right upper", fontsize=8)
    return [
        Figure(
            "roofline",
            "Roofline: prefill and decode against the GPU's ceilings",
            fig,
            "Decode stays left of the ridge (memory-bound) as the context grows; prefill climbs toward the "
            "compute peak.",
        )
    ]


def _heatmap(ds: xr.Dataset, var: str, title: str, label: str, key: str) -> list[Figure]:
    if var not in ds:
        return []
    pairs = _pairs(ds)
    fig, axes = grid(len(pairs), 3.6, 3.0)
    import matplotlib.colors as mcolors

    values = ds[var].astype(float)
    positive = values.where(values > 0)
    shown_any = bool(positive.notnull().any())
    norm = mcolors.LogNorm(
        vmin=max(1.0, float(positive.min())) if shown_any else 1.0,
        vmax=max(float(positive.max()) if shown_any else 1.0, 2.0),
    )
    image = None
    for ax, (m, g) in zip(axes, pairs, strict=False):
        v = values.sel(model=m, gpu=g).transpose("input_len", "output_len").values
        fits = (
            ds["max_seqs"].sel(model=m, gpu=g).transpose("input_len", "output_len").values >= 1
            if "max_seqs" in ds
            else np.ones_like(v, bool)
        )
        shown = np.where(fits & (v > 0), v, np.nan)
        image = ax.imshow(shown, origin="lower", aspect="auto", cmap="viridis", norm=norm)
        ys, xs = np.nonzero(~fits)
        if ys.size:
            ax.scatter(xs, ys, marker="x", color="0.35", s=12, linewidths=0.8, label="does not fit")
        ax.set_xticks(
            range(len(ds["output_len"])), [str(int(x)) for x in ds["output_len"].values], rotation=90, fontsize=6
        )
        ax.set_yticks(range(len(ds["input_len"])), [str(int(x)) for x in ds["input_len"].values], fontsize=6)
        ax.set_xlabel("output length O (tokens)")
        ax.set_ylabel("input length I (tokens)")
        ax.set_title(f"{m} on {g}", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, label=label, location="right", shrink=0.8)
    return [
        Figure(key, title, fig, "Shared colour scale; × marks configurations that do not fit; blank: none qualifies.")
    ]


def bcap_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """B_cap and max_seqs over I × O per model × GPU (small multiples, shared colour scale, does-not-fit marked)."""
    return _heatmap(ds, "b_cap", "B_cap over input × output length", "B_cap (sequences)", "b_cap_heatmap") + _heatmap(
        ds, "max_seqs", "KV-cache capacity over input × output length", "max_seqs (sequences)", "max_seqs_heatmap"
    )


def queue_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """Mean and p90 queue wait vs arrival rate per configuration (at the summary's I, O and a few batches),
    the region without steady state shaded."""
    if "wait_p90_s" not in ds or "arrival_rate" not in ds.dims:
        return []
    i, o = nearest_io(ds, at)
    pairs = [p for p in _pairs(ds) if int(ds["max_seqs"].sel(model=p[0], gpu=p[1], input_len=i, output_len=o)) >= 1][:6]
    if not pairs:
        return []
    fig, axes = grid(len(pairs))
    rate = ds["arrival_rate"].values.astype(float)
    for ax, (m, g) in zip(axes, pairs, strict=False):
        c = ds.sel(model=m, gpu=g, input_len=i, output_len=o)
        seqs = int(c["max_seqs"])
        batches = [b for b in ds["batch"].values if b <= seqs]
        picks = batches[:: max(1, len(batches) // 3)][:3] or [ds["batch"].values[0]]
        first_unbounded = np.inf
        for k, b in enumerate(picks):
            q = c.sel(batch=b)
            wait = q["wait_s"].values.astype(float)
            p90 = q["wait_p90_s"].values.astype(float)
            ok = np.isfinite(wait)
            ax.plot(rate[ok], np.maximum(wait[ok], 1e-6), color=PALETTE[k], lw=2, label=f"mean wait, B = {int(b)}")
            ax.plot(
                rate[ok], np.maximum(p90[ok], 1e-6), color=PALETTE[k], lw=1, ls="--", label=f"p90 wait, B = {int(b)}"
            )
            if (~ok).any():
                first_unbounded = min(first_unbounded, rate[np.argmax(~ok)])
        if np.isfinite(first_unbounded):
            ax.axvspan(first_unbounded, rate.max() * 1.5, color="0.85", label="Unbounded (no steady state)")
        ax.set_xscale("log" if spans_decades(rate) else "linear")
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate λ (requests/s)")
        ax.set_ylabel("queue wait (s)")
        ax.set_title(f"{m} on {g}\nI = {i}, O = {o}", fontsize=9)
    h, lab = [], []
    for ax in axes:
        for hh, ll in zip(*ax.get_legend_handles_labels(), strict=False):
            if ll not in lab:
                h.append(hh)
                lab.append(ll)
    fig.legend(h, lab, loc="outside right upper", fontsize=7)
    return [
        Figure(
            "queue_wait",
            f"Queue wait vs arrival rate at I = {i}, O = {o}",
            fig,
            "M/M/c at m = min(B, max_seqs) slots (MODEL.md §5); shaded: the queue grows without bound.",
        )
    ]


def agent_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """Local vs API time and cost over I × O per agent graph (first model × GPU pairs), at the batch limit with
    the shortest local time; the API's winning region hatched."""
    if "agent_local_s" not in ds:
        return []
    out = []
    pairs = _pairs(ds)[:4]
    for agent in ds["agent"].values:
        fig, axes = grid(2 * len(pairs), 3.6, 3.0)
        for row, (m, g) in enumerate(pairs):
            c = ds.sel(model=m, gpu=g, agent=agent)
            local = c["agent_local_s"].min("batch")
            k = c["agent_local_s"].fillna(np.inf).argmin("batch")
            local_cost = c["agent_local_cost_usd"].isel(batch=k)
            for ax, (name, lv, av, unit) in zip(
                axes[2 * row : 2 * row + 2],
                (("time", local, c["agent_api_s"], "s"), ("cost", local_cost, c["agent_api_cost_usd"], "USD")),
                strict=False,
            ):
                ratio = np.log10((lv / av).transpose("input_len", "output_len").values.astype(float))
                ratio = np.where(np.isfinite(ratio), ratio, 3.0)  # does not fit locally: API
                image = ax.imshow(ratio, origin="lower", aspect="auto", cmap="RdBu_r", vmin=-2, vmax=2)
                ax.contourf(ratio > 0, levels=[0.5, 1.5], hatches=["//"], colors="none")
                ax.set_xticks(
                    range(len(ds["output_len"])),
                    [str(int(x)) for x in ds["output_len"].values],
                    rotation=90,
                    fontsize=6,
                )
                ax.set_yticks(range(len(ds["input_len"])), [str(int(x)) for x in ds["input_len"].values], fontsize=6)
                ax.set_xlabel("output length O (tokens)")
                ax.set_ylabel("input length I (tokens)")
                ax.set_title(f"{agent}: local / API {name}\n{m} on {g}", fontsize=8)
                fig.colorbar(image, ax=ax, label=f"log10(local / API {name}, {unit})", shrink=0.8)
        out.append(
            Figure(
                f"agent_{agent}",
                f"Agent graph {agent!s}: local replica vs API",
                fig,
                "Blue: local wins; red and hatched: the API wins (faster or cheaper). Prices illustrative, dated "
                f"{ds['agent_local_cost_usd'].attrs.get('price_date', '')}.",
            )
        )
    return out


# ---------------------------------------------------------------------------- calibration and validation


def calibration_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """A calibration store: in-sample MAPE per group, with the fitted coefficients in the page's table."""
    if "coefficients" not in ds or "mape_throughput" not in ds:
        return []
    groups = [d for d in ds["mape_throughput"].dims]
    frame = ds[["mape_throughput", "mape_e2e"]].to_dataframe().dropna(how="all").reset_index()
    if frame.empty:
        return []
    labels = frame[groups].astype(str).agg(" / ".join, axis=1)
    fig = MplFigure(figsize=(max(6, 0.5 * len(frame) + 3), 4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(frame))
    ax.bar(x - 0.2, frame["mape_throughput"], 0.4, color=PALETTE[0], label="throughput MAPE")
    ax.bar(x + 0.2, frame["mape_e2e"], 0.4, color=PALETTE[1], label="E2E MAPE")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("in-sample MAPE (%)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return [
        Figure(
            "calibration_mape",
            "Calibration: in-sample error per group",
            fig,
            "From the store's mape_throughput and mape_e2e.",
        )
    ]


def calibration_table(ds: xr.Dataset) -> pd.DataFrame:
    frame = ds["coefficients"].to_dataframe().reset_index()
    index = [d for d in ds["coefficients"].dims if d != "param"]
    return frame.pivot_table(index=index, columns="param", values="coefficients").reset_index()


VALIDATION_COLUMNS = ("method", "throughput", "pred_throughput", "batch", "input_len", "output_len")  # validate --out's


def validation_figures(pred: pd.DataFrame, at=None) -> list[Figure]:
    """``validate --out`` predictions: measured vs predicted throughput with the 90 % interval (the transfer
    interval where the CSV has one), relative residuals vs batch and vs I + O, per method."""
    if not set(VALIDATION_COLUMNS) <= set(pred.columns):
        return []
    methods = list(dict.fromkeys(pred["method"]))
    fig = MplFigure(figsize=(15, 4.2), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    for k, m in enumerate(methods):
        g = pred[pred["method"] == m]
        colour = PALETTE[k % len(PALETTE)]
        which = next(
            (
                w
                for w in ("_transfer", "")
                if f"pred_throughput{w}_lo" in g and g[f"pred_throughput{w}_lo"].notna().any()
            ),
            None,
        )
        if which is not None:
            lo, hi = g[f"pred_throughput{which}_lo"], g[f"pred_throughput{which}_hi"]
            ax1.errorbar(
                g["throughput"],
                g["pred_throughput"],
                yerr=[g["pred_throughput"] - lo, hi - g["pred_throughput"]],
                fmt="o",
                ms=3,
                color=colour,
                alpha=0.6,
                elinewidth=0.6,
                label=f"{m} (90 % {'transfer ' if which else ''}interval)",
            )
        else:
            ax1.scatter(g["throughput"], g["pred_throughput"], s=9, color=colour, alpha=0.6, label=m)
        resid = g["pred_throughput"] / g["throughput"] - 1
        ax2.scatter(g["batch"], resid * 100, s=9, color=colour, alpha=0.6)
        ax3.scatter(g["input_len"] + g["output_len"], resid * 100, s=9, color=colour, alpha=0.6)
    lim = [pred["throughput"].min() * 0.8, pred["throughput"].max() * 1.25]
    ax1.plot(lim, lim, color="0.4", lw=1)
    for ax in (ax1,):
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax1.set_xlabel("measured throughput (tokens/s)")
    ax1.set_ylabel("predicted throughput (tokens/s)")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("batch B (sequences)")
    ax3.set_xscale("log")
    ax3.set_xlabel("I + O (tokens)")
    for ax in (ax2, ax3):
        ax.axhline(0, color="0.4", lw=1)
        ax.set_ylabel("relative residual (%)")
    fig.legend(*ax1.get_legend_handles_labels(), loc="outside right upper", fontsize=7)
    return [Figure("validation", "Held-out predictions vs measurements", fig, "Every held-out row of every scenario.")]


def validation_table(pred: pd.DataFrame) -> pd.DataFrame:
    """Scenario × method MAPE of throughput (the held-out rows)."""
    p = pred.assign(ape=(pred["pred_throughput"] / pred["throughput"] - 1).abs() * 100)
    return p.pivot_table(index="scenario", columns="method", values="ape", aggfunc="mean").round(1).reset_index()


SWEEP_KINDS = (throughput_figures, roofline_figures, bcap_figures, queue_figures, agent_figures)


def _sweep_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    return [f for make in SWEEP_KINDS for f in make(ds, at)]


# the kinds the report draws itself (a study package registers its own: slimjax.studies.present.register_study)
register_study(StudyKind("sweep", _sweep_figures, lambda ds: []))
register_study(
    StudyKind("calibration", calibration_figures, lambda ds: [("Fitted coefficients", calibration_table(ds))])
)
register_study(
    StudyKind(
        "validation",
        validation_figures,
        lambda pred: [("Throughput MAPE (%) per scenario and method", validation_table(pred))],
    )
)
