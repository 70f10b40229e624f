"""How a simulation store is shown (MODEL.md §9, §10): the text `slimjax simulate` prints, the report page's
figures (TTFT and TPOT distributions, the queue over time) and its table of candidates."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from ..present import MAX_PANELS, PALETTE, Figure, assumption_lines, deployment_header, grid, ms


def _candidates(ds: xr.Dataset):
    """(label, per-candidate Dataset) of a simulation store's runs that fit, the first MAX_PANELS."""
    dims = list(ds["ttft_p90_s"].dims)
    stacked = ds.stack(candidate=dims)
    out = []
    for i in range(stacked.sizes["candidate"]):
        c = stacked.isel(candidate=i)
        if not np.isfinite(c["ttft_p90_s"].values):
            continue
        label = " ".join(f"{d} {c[d].values}" for d in dims if ds.sizes[d] > 1) or "the candidate"
        out.append((label, c))
    return out[:MAX_PANELS]


def distribution(ax, values, **style) -> None:
    """The empirical distribution (fraction of requests at or below each value) of the finite ``values`` as a step
    line on ``ax``; nothing where none is finite."""
    x = np.sort(np.ravel(values)[np.isfinite(np.ravel(values))])
    if x.size:
        ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", **style)


def simulation_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """A §9 simulation store: TTFT and TPOT distributions per candidate, and each candidate's queue length
    (requests routed but not yet admitted, all replicas) over the stream."""
    runs = _candidates(ds)
    if not runs:
        return []
    fig, axes = grid(3, 4.8, 3.4)
    a_ttft, a_tpot, a_queue = axes[:3]
    for k, (label, c) in enumerate(runs):
        color = PALETTE[k % len(PALETTE)]
        for ax, var in ((a_ttft, "ttft_s"), (a_tpot, "tpot_s")):
            distribution(ax, c[var].values, color=color, lw=1, label=label)
        arrival, wait = c["arrival_s"].values, c["wait_s"].values
        ok = np.isfinite(arrival) & np.isfinite(wait)
        events = np.concatenate([arrival[ok], arrival[ok] + wait[ok]])
        step = np.concatenate([np.ones(ok.sum()), -np.ones(ok.sum())])
        order = np.lexsort((-step, events))  # an arrival before an admission at the same instant
        a_queue.step(events[order], np.cumsum(step[order]), where="post", color=color, lw=0.8, label=label)
    for ax, what in ((a_ttft, "TTFT (s)"), (a_tpot, "TPOT (s per token)")):
        ax.set_xscale("log")
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests (1)")
        ax.axhline(0.9, color="0.6", lw=0.6, ls=":")
    if "deployment" in ds.dims:  # disaggregated deployments (MODEL.md §10), dashed
        for k, m in enumerate(ds["model"].values):
            for j, d in enumerate(ds["deployment"].values[:MAX_PANELS]):
                color = PALETTE[(len(runs) + k * ds.sizes["deployment"] + j) % len(PALETTE)]
                for ax, var in ((a_ttft, "disagg_ttft_s"), (a_tpot, "disagg_tpot_s")):
                    distribution(ax, ds[var].sel(model=m, deployment=d).values, color=color, lw=1, ls="--", label=d)
    a_queue.set_xlabel("time in the stream (s)")
    a_queue.set_ylabel("requests waiting (all replicas)")
    a_ttft.legend(fontsize=6, loc="lower right")
    return [
        Figure(
            "simulation",
            "Serving simulation (MODEL.md §9): TTFT and TPOT distributions, queue over time",
            fig,
            f"{ds.attrs.get('stream', '')}; router {ds.attrs.get('router', '')}. The dotted line is p90.",
        ),
        *acceptance_figures(ds),
        *prefix_figures(ds),
    ]


HIT_BINS = 24  # time bins of the hit-rate figure


def prefix_figures(ds: xr.Dataset) -> list[Figure]:
    """Where runs cached prompt prefixes (docs/simulation.md): the hit rate (hit tokens / prompt tokens of the
    requests arriving in each of :data:`HIT_BINS` spans of the stream) per replica of the run that saved the most
    prefill tokens, and TTFT's distribution of every run, solid where it cached, dashed where not."""
    if "prefix_hit_tokens" not in ds or not np.nansum(ds["prefix_hit_tokens"].values) > 0:
        return []
    runs = _candidates(ds)
    saved = [float(np.nansum(c["prefix_hit_tokens"].values)) for _, c in runs]
    label, best = runs[int(np.argmax(saved))]
    fig, axes = grid(2, 4.8, 3.4)
    a_hit, a_ttft = axes[:2]
    arrival, hits = best["arrival_s"].values, best["prefix_hit_tokens"].values
    replica, prompt = best["replica"].values, best["input_len"].values.astype(float)
    ok = np.isfinite(arrival) & np.isfinite(hits)
    edges = np.linspace(np.min(arrival[ok]), np.max(arrival[ok]), HIT_BINS + 1)
    middle = (edges[1:] + edges[:-1]) / 2
    for k, r in enumerate(np.unique(replica[ok]).astype(int)[:MAX_PANELS]):
        mine = ok & (replica == r)
        at = np.clip(np.digitize(arrival[mine], edges) - 1, 0, HIT_BINS - 1)
        got = np.bincount(at, hits[mine], HIT_BINS)
        total = np.bincount(at, prompt[mine], HIT_BINS)
        with np.errstate(invalid="ignore", divide="ignore"):
            a_hit.plot(middle, got / total, color=PALETTE[k % len(PALETTE)], lw=1, label=f"replica {r}")
    a_hit.set_xlabel("arrival time in the stream (s)")
    a_hit.set_ylabel("prompt tokens found cached (1)")
    a_hit.set_ylim(0, 1)
    a_hit.legend(fontsize=6)
    for k, (name, c) in enumerate(runs):
        cached = float(np.nansum(c["prefix_hit_tokens"].values)) > 0
        style = dict(ls="-" if cached else "--", label=f"{name} ({'cache' if cached else 'no cache'})")
        distribution(a_ttft, c["ttft_s"].values, color=PALETTE[k % len(PALETTE)], lw=1, **style)
    a_ttft.set_xscale("log")
    a_ttft.set_xlabel("TTFT (s)")
    a_ttft.set_ylabel("fraction of requests (1)")
    a_ttft.legend(fontsize=6, loc="lower right")
    return [
        Figure(
            "prefix_cache",
            "Prefix caching: hit rate over the stream per replica, TTFT with and without the cache",
            fig,
            f"Hit rate of {label} (the run that saved the most prefill tokens); TTFT of every run, dashed where "
            "nothing was found cached (docs/simulation.md).",
        )
    ]


def acceptance_figures(ds: xr.Dataset, at=None) -> list[Figure]:
    """Where a simulation's candidates differ in speculative decoding (docs/speculative.md): mean and p90 TPOT
    against the acceptance length a (1: none), one line per candidate that differs only in it."""
    if "acceptance_length" not in ds or np.unique(ds["acceptance_length"].values).size < 2:
        return []
    dims = [d for d in ds["tpot_mean_s"].dims if d not in ("setting", "request")]
    stacked = ds[["tpot_mean_s", "tpot_p90_s"]].stack(candidate=dims)
    accepted = ds["acceptance_length"].broadcast_like(ds["tpot_mean_s"]).stack(candidate=dims)
    fig, axes = grid(1, 4.8, 3.4)
    ax = axes[0]
    for k in range(min(stacked.sizes["candidate"], MAX_PANELS)):
        a = np.ravel(accepted.isel(candidate=k).values)
        order = np.argsort(a)
        key = stacked.candidate.values[k]
        label = " ".join(f"{d} {v}" for d, v in zip(dims, key, strict=True) if ds.sizes[d] > 1) or "the candidate"
        color = PALETTE[k % len(PALETTE)]
        for var, style in (("tpot_mean_s", "-"), ("tpot_p90_s", ":")):
            y = np.ravel(stacked[var].isel(candidate=k).values)
            ax.plot(a[order], y[order], style, marker="o", ms=3, color=color, label=label if style == "-" else None)
    ax.set_xlabel("acceptance length a (tokens per verify step; 1: none)")
    ax.set_ylabel("TPOT (s per token): mean —, p90 ···")
    ax.legend(fontsize=6)
    return [
        Figure(
            "speculative",
            "Speculative decoding: TPOT against the acceptance length (docs/speculative.md)",
            fig,
            "each point a speculative setting of the candidate; a draft's own cost and its 1 + k token verify pass "
            "are in every step",
        )
    ]


def simulation_summary(ds: xr.Dataset) -> pd.DataFrame:
    """One row per simulated candidate: its §9 summaries."""
    rows = []
    for label, c in _candidates(ds):
        rows.append(
            {
                "candidate": label,
                "TTFT p50 (s)": f"{float(c['ttft_p50_s']):.3g}",
                "TTFT p90 (s)": f"{float(c['ttft_p90_s']):.3g}",
                "TPOT p90 (s)": f"{float(c['tpot_p90_s']):.3g}",
                "E2E mean (s)": f"{float(c['e2e_mean_s']):.3g}",
                "utilisation": f"{float(c['utilization']):.0%}",
                "peak queue": int(c["queue_peak"]),
                **({"prompt tokens cached": f"{float(c['prefix_hit_rate']):.1%}"} if "prefix_hit_rate" in c else {}),
            }
        )
    return pd.DataFrame(rows)


def simulation_table(ds: xr.Dataset) -> str:
    """One line per simulated candidate (MODEL.md §9): p50/p90 TTFT, p90 TPOT, mean E2E, busy time (a step
    running, however full), the slots' occupancy (how full: requests held / (replicas × batch)), the peak
    queue and, where a run found prompt tokens in its prefix cache, their share (``cached``); "does not fit" where
    the configuration cannot run."""
    dims = list(ds.ttft_p90_s.dims)
    columns = ("TTFT p50", "TTFT p90", "TPOT p90", "E2E mean")
    cached = "prefix_hit_rate" in ds and bool(np.nanmax(ds.prefix_hit_rate.values, initial=0.0) > 0)
    header = f"{'candidate':<58} " + " ".join(f"{c:>10}" for c in columns) + f" {'busy':>6} {'slots':>6} {'queue':>6}"
    header += f" {'cached':>6}" if cached else ""
    lines = [
        f"serving simulation (MODEL.md §9): {ds.attrs.get('stream', '')}, router {ds.attrs.get('router', '')}",
        header,
    ]
    shown = ["ttft_p50_s", "ttft_p90_s", "tpot_p90_s", "e2e_mean_s", "utilization", "occupancy", "queue_peak"]
    shown += ["prefix_hit_rate"] if cached else []
    stacked = ds[[v for v in shown if v in ds]].stack(candidate=dims)  # a store written before occupancy: —
    fits = ds.fits.broadcast_like(ds.ttft_p90_s).stack(candidate=dims).values
    for i, key in enumerate(stacked.candidate.values):
        label = ", ".join(f"{d} {v}" for d, v in zip(dims, key, strict=True))
        row = {v: float(stacked[v].values[i]) for v in stacked.data_vars}
        if not fits[i]:
            lines.append(f"{label:<58} does not fit (no KV pool, or TP does not divide the query heads)")
            continue
        lines.append(
            f"{label:<58} {ms(row['ttft_p50_s']):>10} {ms(row['ttft_p90_s']):>10} {ms(row['tpot_p90_s']):>10} "
            f"{ms(row['e2e_mean_s']):>10} {row['utilization']:>6.0%} "
            f"{format(row['occupancy'], '>6.0%') if 'occupancy' in row else '—':>6} {row['queue_peak']:>6.0f}"
            + (f" {row['prefix_hit_rate']:>6.1%}" if cached else "")
        )
    if "deployment" in ds.dims:
        lines += ["", "disaggregated prefill/decode (MODEL.md §10):", deployment_header()]
        for m in ds.model.values:
            for d in ds.deployment.values:
                at = ds.sel(model=m, deployment=d)
                label = f"{m}: {d}"
                if not bool(at.disagg_fits):
                    lines.append(f"{label} — does not fit (no KV pool in a pool, or TP does not divide the heads)")
                    continue
                times = " ".join(
                    f"{ms(float(at[f'disagg_{v}'])):>10}"
                    for v in ("ttft_p50_s", "ttft_p90_s", "tpot_p90_s", "e2e_mean_s")
                )
                lines.append(
                    f"{label}\n{'':<58} {times} {float(at.disagg_prefill_utilization):>6.0%} "
                    f"{float(at.disagg_decode_utilization):>6.0%} {float(at.disagg_cost_per_hour):>8.2f}"
                )
    lines += assumption_lines(ds)
    return "\n".join(lines)


def report_tables(ds: xr.Dataset) -> list[tuple[str, pd.DataFrame]]:
    return [("Simulated candidates", simulation_summary(ds))]
