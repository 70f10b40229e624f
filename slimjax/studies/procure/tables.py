"""Procurement studies as text (MODEL.md §8): one ranked table per workload, rate and model, why the cheapest
infeasible groups fail, and the per-class mix — read from the study's Dataset (a store or in memory)."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from ...inputs.serving import CONSTANTS_SOURCES
from ..candidates import SIM_REASONS
from ..present import assumption_lines, ms
from .screen import REASONS
from .variants import setting_view

REASON_TEXT = {
    "tp_does_not_divide_heads": "TP degree does not divide the query heads",
    "memory": "does not fit: weights plus one sequence exceed the group's memory",
    "itl": "ITL above the SLO",
    "ttft": "TTFT above the SLO even unloaded",
    "e2e": "E2E above the SLO even unloaded",
    "unbounded_queue": "no positive rate keeps the queue within the SLOs",
}


SIM_REASON_TEXT = {
    "does_not_fit": "does not fit",
    "request_too_large": "a request's KV footprint exceeds the whole pool",
    "ttft": "simulated TTFT above the SLO",
    "itl": "simulated TPOT above the ITL SLO",
    "e2e": "simulated mean E2E above the SLO",
}


def _money(x: float) -> str:
    return f"${x:,.2f}" if x < 1000 else f"${x:,.0f}"


def _why(ds: xr.Dataset, at: xr.Dataset, slo: dict, sized: xr.Dataset | None = None) -> str:
    """Why no batch of one (GPU, TP) works, from its furthest-reaching batch, in words and figures; ``sized``
    (the group at one rate, sized by simulation): why its simulated fleets fail, where they ran."""
    if sized is not None:
        codes = sized["sim_reason"].values
        ran = codes[codes != SIM_REASONS.index("does_not_fit")]
        if ran.size:
            name = SIM_REASONS[int(np.bincount(ran).argmax())]
            return f"{SIM_REASON_TEXT[name]} at up to {ds.attrs['max_replicas']} replicas (simulated)"
    reasons = at["infeasible_reason"].values
    code = int(reasons.max())
    name = REASONS[code]
    if name == "itl":
        return f"ITL {ms(float(np.nanmin(at['itl_s'])))} at best > {ms(slo['itl_s'])} SLO"
    if name == "ttft":
        return f"TTFT {ms(float(np.nanmin(at['ttft_unloaded_s'])))} unloaded at best > {ms(slo['ttft_s'])} SLO"
    if name == "e2e":
        return f"E2E {ms(float(np.nanmin(at['e2e_unloaded_s'])))} unloaded at best > {ms(slo['e2e_s'])} SLO"
    if name == "memory":
        pool, weights = float(at["kv_pool_bytes"]), float(at["weights_bytes"])
        if pool <= 0:
            usable = (pool + weights) / 2**30
            return f"does not fit: weights {weights / 2**30:,.0f} GiB exceed the usable {usable:,.0f} GiB"
        return f"does not fit: the KV pool ({pool / 2**30:,.1f} GiB) holds no mixture sequence"
    return REASON_TEXT[name]


def ranked_tables(ds: xr.Dataset, top: int = 5, infeasible: int = 3) -> str:
    """One ranked table per workload, rate and model: the ``top`` cheapest feasible (GPU, TP) groups,
    each at its own cheapest batch limit (§8 tie order), then why the cheapest infeasible groups fail,
    then the per-class mix. Prices are marked illustrative with their date. A study of engine settings (dim
    ``setting``) prints each setting's tables, then the settings compared."""
    if "setting" in ds.dims:
        lines = []
        for s in ds["setting"].values:
            lines += ["", f"######## engine setting: {s}", _ranked(setting_view(ds, s), top, infeasible)]
        return "\n".join([*lines, *settings_compared(ds)])
    return _ranked(ds, top, infeasible)


def settings_compared(ds: xr.Dataset) -> list[str]:
    """Per (workload, rate, model): each engine setting's cheapest choice ($/hour, GPUs) and the one that wins."""
    labels = [str(s) for s in ds["setting"].values]
    width = max(len(s) for s in labels)
    lines = ["", "== engine settings compared: each setting's cheapest choice (illustrative $/hour)"]
    for wl in ds["workload"].values:
        for rate in ds["rate"].values:
            if not np.isfinite(float(ds["total_rate"].sel(workload=wl, rate=rate))):
                continue
            for model in ds["model"].values:
                at = ds.sel(workload=wl, rate=rate, model=model)
                lines.append(f"{wl} at {rate} — {model}:")
                for s in labels:
                    c = at.sel(setting=s)
                    cost = float(c["best_cost_per_hour"])
                    shown = "no feasible choice"
                    if np.isfinite(cost):
                        shown = (
                            f"{_money(cost)}/hour, {int(c['best_gpus'])} GPU{'s' * (int(c['best_gpus']) != 1)} "
                            f"({c['best_gpu'].item()} TP "
                            f"{int(c['best_tp'])}, batch {int(c['best_batch'])}, ×{int(c['best_replicas'])})"
                        )
                    mark = "  ← cheapest" if str(at["best_setting"].item()) == s else ""
                    lines.append(f"  {s:<{width}}  {shown}{mark}")
    return lines


def _ranked(ds: xr.Dataset, top: int, infeasible: int) -> str:
    import pandas as pd

    slo = {k: (np.inf if v is None else v) for k, v in json.loads(ds.attrs["slo"]).items()}
    prices = json.loads(ds.attrs["prices"])
    simulated = ds.attrs.get("sizing") == "simulation"
    p = f"p{slo['quantile'] * 100:g}"
    slos = "SLOs: " + ", ".join(f"{k} {ms(v)}" for k, v in slo.items() if k != "quantile" and np.isfinite(v))
    lines = [
        f"Prices: illustrative $/GPU-hour, dated {ds.attrs['price_date']} — "
        + ", ".join(f"{g} {price['usd_per_gpu_hour']:g}" for g, price in prices.items()),
    ]
    if simulated:
        lines += [
            slos,
            f"replicas: the fewest whose MODEL.md §9 simulation of the workload's own stream meets the SLOs (TTFT "
            f"and TPOT at {p}, simulated); screen: §8's R = ⌈Λ/λ*⌉ and its {p} TTFT, the closed form it replaces",
        ]
    else:
        lines.append(f"{slos} (TTFT at {p}, per-request screen of MODEL.md §8)")
    q = f"TTFT {p}"
    constants = json.loads(ds.attrs.get("constants", "{}"))
    shown: set = set()
    for wl in ds["workload"].values:
        w = ds.sel(workload=wl)
        present = w["class_weight"].values > 0
        classes = ", ".join(
            f"{int(i)}/{int(o)}"
            for i, o in zip(w["class_input_len"].values[present], w["class_output_len"].values[present], strict=False)
        )
        for rate in ds["rate"].values:
            total = float(w["total_rate"].sel(rate=rate))
            if not np.isfinite(total):
                continue
            for model in ds["model"].values:
                c = w.sel(rate=rate, model=model)
                lines.append("")
                lines.append(f"== {wl} at {rate} = {total:,.3g} requests/s (classes I/O {classes}) — {model}")
                staged = "pp" in ds and bool((ds["pp"].sel(model=model) > 1).any())
                rows = []
                for g in ds["gpu"].values:
                    for n in ds["tp"].values:
                        cand = c.sel(gpu=g, tp=n)
                        feas = cand["feasible"].values
                        if not feas.any():
                            continue
                        cost = np.where(feas, cand["cost_per_hour"].values, np.inf)
                        gpus = np.where(feas, cand["gpus_total"].values, np.inf)
                        i = int(np.lexsort((ds["batch"].values, gpus, cost))[0])
                        pick = cand.isel(batch=i)
                        row = {"GPU": g, "TP": int(n)}
                        if staged:  # pipeline stages (MODEL.md §10): the group is TP·PP GPUs
                            row["PP"] = int(w["pp"].sel(model=model, gpu=g, tp=n))
                        row["batch"] = int(ds["batch"].values[i])
                        row["replicas"] = int(pick["replicas"])
                        if simulated:
                            screen = float(pick["replicas_screen"])
                            row["screen"] = str(int(screen)) if np.isfinite(screen) else "none"
                        row.update({"GPUs": int(pick["gpus_total"]), "$/hour": float(pick["cost_per_hour"])})
                        row["$/Mtok"] = float(pick["cost_per_mtok"])
                        if simulated:
                            row[q] = ms(float(pick["sim_ttft_p_s"]))
                            row[f"screen {q}"] = ms(float(pick["ttft_p_s"]))
                            row[f"TPOT {p}"] = ms(float(pick["sim_tpot_p_s"]))
                            row["util"] = f"{float(pick['sim_utilization']):.0%}"
                        else:
                            row.update({q: ms(float(pick["ttft_p_s"])), "ITL": ms(float(pick["itl_s"]))})
                            row["util"] = f"{float(pick['utilization']):.0%}"
                        row["KV headroom"] = f"{float(pick['memory_headroom']):.0%}"
                        if constants:
                            mark = constants[str(model)][str(g)]
                            row["constants"] = mark.get(str(int(n)), "plain") if isinstance(mark, dict) else mark
                            shown.add(row["constants"])
                        rows.append(row)
                if rows:
                    table = pd.DataFrame(rows).sort_values(["$/hour", "GPUs", "TP", "batch"], kind="stable").head(top)
                    table["$/hour"] = table["$/hour"].map(_money)
                    table["$/Mtok"] = table["$/Mtok"].map(lambda x: f"${x:,.3f}")
                    table.index = range(1, len(table) + 1)
                    lines.append(table.to_string())
                elif simulated and int(c["binding_slo"]) > 0:
                    reason = SIM_REASONS[int(c["binding_slo"])]
                    lines.append(
                        f"no feasible candidate: {SIM_REASON_TEXT[reason]} at up to {ds.attrs['max_replicas']} "
                        "replicas (simulated)"
                    )
                else:
                    reason = REASONS[int(c["binding_reason"])]
                    lines.append(f"no feasible candidate: binding reason {reason} ({REASON_TEXT[reason]})")
                failing = []
                for g in ds["gpu"].values:
                    for n in ds["tp"].values:
                        cand = c.sel(gpu=g, tp=n)
                        if cand["feasible"].values.any():
                            continue
                        failing.append(
                            (
                                int(n) * prices[g]["usd_per_gpu_hour"],
                                int(n),
                                g,
                                _why(ds, w.sel(model=model, gpu=g, tp=n), slo, cand if simulated else None),
                            )
                        )
                if failing:
                    lines.append("cheapest infeasible:")
                    for per_group, n, g, why in sorted(failing)[:infeasible]:
                        lines.append(f"  {g} TP {n} ({_money(per_group)}/hour per group): {why}")
                mix = float(c["mix_cost_per_hour"])
                if np.isfinite(mix):
                    parts = []
                    for k in ds["class"].values:
                        if not present[k]:
                            continue
                        mk = c.sel({"class": k})
                        parts.append(
                            f"{int(w['class_input_len'][k])}/{int(w['class_output_len'][k])} → "
                            f"{str(mk['mix_gpu'].values)} "
                            f"TP {int(mk['mix_tp'])} B {int(mk['mix_batch'])} ×{int(mk['mix_replicas'])}"
                        )
                    if len(parts) > 1:
                        saving = float(c["mix_saving_per_hour"])
                        lines.append(
                            f"mix: {'; '.join(parts)} = {_money(mix)}/hour "
                            f"({'saves' if saving > 0 else 'costs'} {_money(abs(saving))}/hour vs the best "
                            f"single choice)"
                        )
                if "deployment" in ds.dims:
                    lines += disaggregated_lines(c, q, p, top)
    if shown:
        lines += ["", "constants: where each row's roofline constants come from"]
        lines += [f"  {mark}: {CONSTANTS_SOURCES[mark]}" for mark in CONSTANTS_SOURCES if mark in shown]
    lines += assumption_lines(ds)
    return "\n".join(lines)


DISAGG_REASONS = {
    "does_not_fit": "a pool does not fit (its weights leave no KV pool, or its TP does not divide the heads)",
    "ttft": "the prefill pool misses the TTFT SLO",
    "itl": "the decode pool misses the ITL SLO",
    "e2e": "the decode pool misses the E2E SLO",
}


def disaggregated_lines(c: xr.Dataset, q: str, p: str, top: int) -> list[str]:
    """The disaggregated deployments of one (workload, rate, model) (MODEL.md §10), cheapest first, and the best
    beside the best aggregated fleet: the saving or the extra cost, and which SLO bound each pool."""
    import pandas as pd

    rows, failing = [], []
    for d in c["deployment"].values:
        at = c.sel(deployment=d)
        reason = SIM_REASONS[int(at["disagg_reason"])]
        if reason != "feasible":
            when = "" if reason == "does_not_fit" else " at up to the study's max_replicas"
            failing.append(f"  {d}: {DISAGG_REASONS[reason]}{when}")
            continue
        binding = SIM_REASONS[int(at["disagg_decode_binding"])]
        rows.append(
            {
                "prefill | decode | transfer": d,
                "R_p": int(at["disagg_prefill_replicas"]),
                "R_d": int(at["disagg_decode_replicas"]),
                "GPUs": int(at["disagg_gpus"]),
                "$/hour": float(at["disagg_cost_per_hour"]),
                "$/Mtok": float(at["disagg_cost_per_mtok"]),
                q: ms(float(at["disagg_sim_ttft_p_s"])),
                f"TPOT {p}": ms(float(at["disagg_sim_tpot_p_s"])),
                "binds": "prefill: "
                + ("TTFT" if int(at["disagg_prefill_replicas"]) > 1 else "one replica suffices")
                + "; decode: "
                + ("one replica suffices" if binding == "feasible" else binding.upper()),
            }
        )
    lines = ["disaggregated prefill/decode (MODEL.md §10; R_p for TTFT, then R_d for ITL and E2E):"]
    if rows:
        table = pd.DataFrame(rows).sort_values(["$/hour", "GPUs"], kind="stable").head(top)
        table["$/hour"] = table["$/hour"].map(_money)
        table["$/Mtok"] = table["$/Mtok"].map(lambda x: f"${x:,.3f}")
        table.index = range(1, len(table) + 1)
        lines.append(table.to_string())
        saving = float(c["disagg_saving_per_hour"])
        if np.isfinite(saving):
            best, agg = float(c["best_disagg_cost_per_hour"]), float(c["best_cost_per_hour"])
            if saving == 0:
                lines.append(f"best disaggregated {_money(best)}/hour costs the same as the best aggregated")
            else:
                verdict = "saves" if saving > 0 else "costs"
                lines.append(
                    f"best disaggregated {_money(best)}/hour {verdict} {_money(abs(saving))}/hour vs the best "
                    f"aggregated {_money(agg)}/hour"
                )
        else:
            lines.append("no aggregated fleet to compare with: every aggregated candidate fails")
    else:
        lines.append("  no deployment meets the SLOs")
    return lines + failing[:3]
