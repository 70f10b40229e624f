"""A procurement store's figures (MODEL.md §8, §10): cost and replicas against the rate per workload, what
sizing by simulation changed, aggregated against disaggregated serving, and the chosen fleets as tables."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import xarray as xr

from ..present import PALETTE, Figure, grid, spans_decades
from .variants import setting_view

REASON_WORDS = {1: "TP does not divide heads", 2: "does not fit", 3: "ITL", 4: "TTFT", 5: "E2E", 6: "unbounded queue"}


def procurement_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """$/Mtok vs total rate per GPU × TP (each at its cheapest batch limit) per workload and model; the cheapest
    feasible highlighted, infeasible groups greyed with their reason."""
    if ds.attrs.get("kind") != "procurement":
        return []
    if "setting" in ds.dims:  # engine settings as candidates: the settings compared, then each setting's figures
        return settings_figures(ds) + per_setting(ds, procurement_figures)
    out = []
    for wl, rates, ok_rates, fig, panels in rate_panels(ds):
        for ax, m, c in panels:
            cost = c["cost_per_mtok"].where(c["feasible"]).min("batch")  # (rate, gpu, tp)
            failing = []
            styles = ("-", "--", ":", "-.")
            for gi, g in enumerate(ds["gpu"].values):  # colour per GPU, line style per TP degree
                for ni, n in enumerate(ds["tp"].values):
                    y = cost.sel(gpu=g, tp=n).values[ok_rates]
                    if np.isfinite(y).any():
                        ax.plot(
                            rates[ok_rates],
                            y,
                            color=PALETTE[gi % len(PALETTE)],
                            ls=styles[ni % len(styles)],
                            lw=1,
                            marker=".",
                            label=f"{g} TP {int(n)}",
                        )
                    else:
                        reason = int(c["infeasible_reason"].sel(gpu=g, tp=n).max())
                        failing.append(f"{g} TP {int(n)}: {REASON_WORDS.get(reason, 'infeasible')}")
            best = c["best_cost_per_mtok"].values[ok_rates]
            ax.plot(rates[ok_rates], best, color="black", lw=3, alpha=0.35, label="cheapest feasible")
            if failing:
                ax.text(
                    1.02,
                    0.0,
                    "infeasible:\n" + "\n".join(failing[:8]) + ("\n…" if len(failing) > 8 else ""),
                    transform=ax.transAxes,
                    fontsize=6,
                    color="0.5",
                    va="bottom",
                )
            _cost_axes(ax, rates[ok_rates], f"{wl}: {m}", legend_size=6)
        out.append(
            Figure(
                f"procurement_{wl}",
                f"Cost per million tokens vs rate — {wl}",
                fig,
                f"Each GPU × TP at its cheapest batch limit; prices illustrative, dated "
                f"{ds.attrs.get('price_date', '')}.",
            )
        )
    return out + sizing_figures(ds) + disaggregated_figures(ds)


def rate_panels(ds: xr.Dataset):
    """Per workload of a procurement store: its name, total rates, the finite ones' indices in rate order, a figure
    of one panel per model, and (axis, model, the model's rows) per panel."""
    for wl in ds["workload"].values:
        w = ds.sel(workload=wl)
        rates = w["total_rate"].values.astype(float)
        order = np.argsort(rates)
        models = list(ds["model"].values)
        fig, axes = grid(len(models), 5.0, 3.6)
        panels = [(ax, m, w.sel(model=m)) for ax, m in zip(axes, models, strict=False)]
        yield wl, rates, order[np.isfinite(rates[order])], fig, panels


def _cost_axes(ax, rates, title: str, legend_size: float) -> None:
    """A cost-per-million-tokens panel's axes against the total rate, its title and its legend beside it."""
    ax.set_xscale("log" if spans_decades(rates) else "linear")
    ax.set_yscale("log")
    ax.set_xlabel("total rate Λ (requests/s)")
    ax.set_ylabel("cost (USD per million tokens)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=legend_size, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def disaggregated_figures(ds: xr.Dataset) -> list[Figure]:
    """Aggregated vs disaggregated (MODEL.md §10): per workload and model, the best aggregated fleet's $/Mtok and
    the best disaggregated deployment's against the total rate, each deployment's own curve behind them."""
    if "deployment" not in ds.dims:
        return []
    out = []
    for wl in ds["workload"].values:
        w = ds.sel(workload=wl)
        rates = w["total_rate"].values.astype(float)
        ok = np.flatnonzero(np.isfinite(rates))
        models = list(ds["model"].values)
        fig, axes = grid(len(models), 5.0, 3.6)
        for ax, m in zip(axes, models, strict=False):
            c = w.sel(model=m)
            for k, d in enumerate(ds["deployment"].values):
                y = c["disagg_cost_per_mtok"].sel(deployment=d).values[ok]
                if np.isfinite(y).any():
                    ax.plot(rates[ok], y, color=PALETTE[(k + 2) % len(PALETTE)], lw=0.8, ls=":", marker=".", label=d)
            ax.plot(
                rates[ok], c["best_cost_per_mtok"].values[ok], color="black", lw=2.5, marker="o", label="aggregated"
            )
            ax.plot(
                rates[ok],
                c["best_disagg_cost_per_mtok"].values[ok],
                color=PALETTE[1],
                lw=2.5,
                ls="--",
                marker="s",
                label="disaggregated (best)",
            )
            _cost_axes(ax, rates[ok], f"{wl}: {m}", legend_size=5)
        out.append(
            Figure(
                f"disaggregated_{wl}",
                f"Aggregated vs disaggregated prefill/decode — {wl}",
                fig,
                "Both sized by simulating the workload's own stream (MODEL.md §8–§10); R_p for TTFT, then R_d for ITL "
                "and E2E. Prices illustrative.",
            )
        )
    return out


def disaggregated_table(ds: xr.Dataset) -> pd.DataFrame:
    """The chosen pools per workload, rate and model, beside the best aggregated fleet's cost."""
    rows = []
    for wl, r, _, m, c in _choices(ds):
        best = int(c["best_disagg"])
        at = c.isel(deployment=best) if best >= 0 else None
        rows.append(
            {
                "workload": wl,
                "rate": str(r),
                "model": m,
                "pools": str(c["deployment"].values[best]) if at is not None else "none feasible",
                "R_p, R_d": f"{int(at['disagg_prefill_replicas'])}, {int(at['disagg_decode_replicas'])}"
                if at is not None
                else "—",
                "$/hour": f"{float(c['best_disagg_cost_per_hour']):,.2f}" if at is not None else "—",
                "aggregated $/hour": f"{float(c['best_cost_per_hour']):,.2f}",
                "saving $/hour": f"{float(c['disagg_saving_per_hour']):,.2f}" if at is not None else "—",
            }
        )
    return pd.DataFrame(rows)


def sizing_figures(ds: xr.Dataset) -> list[Figure]:
    """Replicas vs rate of a procurement sized by simulation: the choice's R_sim and R_screen, and every
    candidate's R_sim / R_screen (above 1: the screen was optimistic)."""
    if ds.attrs.get("sizing") != "simulation":
        return []
    out = []
    for wl in ds["workload"].values:
        w = ds.sel(workload=wl)
        rates = w["total_rate"].values.astype(float)
        ok = np.flatnonzero(np.isfinite(rates))
        models = list(ds["model"].values)
        fig, axes = grid(2 * len(models), 4.6, 3.4)
        for mi, m in enumerate(models):
            c = w.sel(model=m)
            ax = axes[2 * mi]
            ax.plot(rates[ok], c["best_replicas"].values[ok], color=PALETTE[0], marker="o", label="R_sim (simulated)")
            ax.plot(
                rates[ok], c["best_replicas_screen"].values[ok], color=PALETTE[1], ls="--", marker="s", label="R_screen"
            )
            ax.set_xscale("log" if spans_decades(rates[ok]) else "linear")
            ax.set_xlabel("total rate Λ (requests/s)")
            ax.set_ylabel("replicas of the choice")
            ax.set_title(f"{wl}: {m}", fontsize=9)
            ax.legend(fontsize=6)
            ax = axes[2 * mi + 1]
            ratio = (c["replicas"] / c["replicas_screen"]).transpose("rate", ...).values.reshape(len(rates), -1)
            for k, r in enumerate(ok):
                y = ratio[r][np.isfinite(ratio[r])]
                ax.scatter(np.full(y.shape, rates[r]), y, s=8, alpha=0.5, color=PALETTE[k % len(PALETTE)])
            ax.axhline(1.0, color="0.4", lw=0.8)
            ax.set_xscale("log" if spans_decades(rates[ok]) else "linear")
            ax.set_yscale("log")
            ax.set_xlabel("total rate Λ (requests/s)")
            ax.set_ylabel("R_sim / R_screen (1)")
            ax.set_title(f"{wl}: {m}, every candidate", fontsize=9)
        out.append(
            Figure(
                f"sizing_{wl}",
                f"Replicas by simulation vs the screen — {wl}",
                fig,
                "R_sim: the fewest replicas whose §9 simulation of the workload's own stream meets the SLOs; "
                "R_screen: §8's ⌈Λ/λ*⌉. Above 1 the screen was optimistic, below 1 pessimistic.",
            )
        )
    return out


def _choices(ds: xr.Dataset):
    """(workload, rate, total rate, model, the Dataset there) of every (workload, rate, model) with a rate."""
    for wl in ds["workload"].values:
        for r in ds["rate"].values:
            total = float(ds["total_rate"].sel(workload=wl, rate=r))
            if not np.isfinite(total):
                continue
            for m in ds["model"].values:
                yield wl, r, total, m, ds.sel(workload=wl, rate=r, model=m)


def procurement_table(ds: xr.Dataset) -> pd.DataFrame:
    """The chosen fleet per workload, rate and model."""
    rows = []
    for wl, r, total, m, c in _choices(ds):
        gpu = str(c["best_gpu"].values)
        rows.append(
            {
                "workload": wl,
                "rate": f"{r} ({total:.3g}/s)",
                "model": m,
                "choice": f"{int(c['best_gpus'])} × {gpu} (TP {int(c['best_tp'])}, B ≤ {int(c['best_batch'])})"
                if gpu
                else f"none feasible ({REASON_WORDS.get(int(c['binding_reason']), '')})",
                "$/hour": f"{float(c['best_cost_per_hour']):,.2f}" if gpu else "—",
                "$/Mtok": f"{float(c['best_cost_per_mtok']):,.3f}" if gpu else "—",
            }
        )
    return pd.DataFrame(rows)


def settings_figures(ds: xr.Dataset) -> list[Figure]:
    """Per workload, one panel per model: the cheapest choice's $/hour against the total rate, one line per engine
    setting (docs/engines.md), the winning setting's points filled."""
    out = []
    for wl, rates, ok, fig, panels in rate_panels(ds):
        for ax, m, c in panels:
            for i, s in enumerate(ds["setting"].values):
                cost = c["best_cost_per_hour"].sel(setting=s).values[ok]
                wins = c["best_setting"].values[ok] == s
                colour = PALETTE[i % len(PALETTE)]
                ax.plot(rates[ok], cost, "-", color=colour, label=str(s))
                ax.plot(rates[ok][wins], cost[wins], "o", color=colour)
                ax.plot(rates[ok][~wins], cost[~wins], "o", mfc="none", color=colour)
            ax.set_xscale("log" if spans_decades(rates[ok]) else "linear")
            ax.set_xlabel("total rate Λ (requests/s)")
            ax.set_ylabel("cheapest fleet (USD per hour)")
            ax.set_title(f"{wl}: {m}", fontsize=9)
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        out.append(
            Figure(
                f"settings_{wl}",
                f"{wl}: engine settings compared",
                fig,
                "the cheapest feasible fleet per engine setting against the total rate (illustrative prices); filled: "
                "the setting that wins at that rate",
            )
        )
    return out


def per_setting(ds: xr.Dataset, figures) -> list[Figure]:
    """``figures`` of each engine setting's study (dim ``setting``), keyed and titled by the setting."""
    out = []
    for i, s in enumerate(ds["setting"].values):
        for f in figures(setting_view(ds, s)):
            out.append(dataclasses.replace(f, key=f"{f.key}_setting{i}", title=f"{f.title} — engine setting {s}"))
    return out


def report_tables(ds: xr.Dataset) -> list[tuple[str, pd.DataFrame]]:
    if "setting" in ds.dims:
        return [
            (f"{title} — engine setting {s}", table)
            for s in ds["setting"].values
            for title, table in report_tables(setting_view(ds, s))
        ]
    tables = [("Chosen fleet", procurement_table(ds))]
    if "deployment" in ds.dims:
        tables.append(("Disaggregated pools beside the aggregated fleet", disaggregated_table(ds)))
    return tables
