"""Procurement benchmark (MODEL.md §8): one jitted study over 10 GPUs × 4 TP × 20 batch limits × 3
workloads (K = 4) × 50 rates × 3 models, against the same answers computed one candidate at a time
through the scalar path on a random sample of candidates.

Scalar path per candidate: ``slimjax.capacity`` (the calculator's own point entry) for each class's
footprint, prefill, ITL and S(m); the §8 mixture by hand; λ* by a Python bisection on the loop
reference M/M/c (tests/reference.py, Erlang B by recurrence); then R, GPUs, $/hour for every rate.
Reported: candidates/s both ways, their ratio, and the largest relative difference over the sample.

    python bench/procure.py [--sample 24] [--repeats 2]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from common import timed  # bench/common.py

import slimjax
from slimjax.studies.procure import spec as procurefile

slimjax.configure()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference as ref  # noqa: E402

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
GPUS = [
    "A100-SXM-40GB",
    "A100-SXM-80GB",
    "A100-PCIe-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "GH200",
    "L40S",
    "B200",
    "MI300X",
]
BATCH = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512]


def spec(data: Path) -> dict:
    traces = data / "traces"
    return dict(
        workloads=[
            dict(name="conversation", trace=str(traces / "AzureLLMInferenceTrace_conv.csv"), classes=4),
            dict(name="code", trace=str(traces / "AzureLLMInferenceTrace_code.csv"), classes=4),
            dict(name="mooncake", trace=str(traces / "mooncake_conversation_trace.jsonl"), classes=4),
        ],
        rate_scale=list(np.round(np.geomspace(0.25, 64, 50), 4)),
        models=["Llama-3.1-8B", "Qwen3-32B", "Llama-3.1-70B"],
        gpus=GPUS,
        tp=[1, 2, 4, 8],
        batch=BATCH,
        slo=dict(ttft_s=2.0, itl_s=0.05, e2e_s=60.0),
    )


def scalar_candidate(study, ds, w, m, g, n, b):
    """λ*, R, $/hour at every rate of one candidate, one call at a time."""
    wl = study.workloads[w]
    classes = wl.classes
    serving = dict(n_gpu=int(n), efficiency="calibrated", kv_replication="auto")
    model, gpu = study.models[m], study.gpus[g]
    first = [
        slimjax.capacity(model, gpu, int(i), int(o), 1, serving=serving)
        for i, o in zip(classes.input_len, classes.output_len, strict=False)
    ]
    pool = first[0]["kv_pool_bytes"]
    footprint = sum(wk * c["seq_footprint_bytes"] for wk, c in zip(classes.weight, first, strict=False))
    slots = min(b, ref.max_seqs(pool, footprint)) if pool > 0 else 0
    if slots < 1:
        return 0.0, None
    at = [
        slimjax.capacity(model, gpu, int(i), int(o), slots, serving=serving)
        for i, o in zip(classes.input_len, classes.output_len, strict=False)
    ]
    itl = [c["itl_s"] for c in at]
    ttft = [c["prefill_s"] + c["itl_s"] for c in at]
    service = [c["service_s"] for c in at]
    S = sum(wk * s for wk, s in zip(classes.weight, service, strict=False))
    slo = study.slo

    def meets(lam):
        q = ref.mmc(slots, S, lam)
        if not math.isfinite(q["wait_s"]):
            return False
        wp = (
            0.0
            if q["p_wait"] <= 1 - slo["quantile"]
            else math.log(q["p_wait"] / (1 - slo["quantile"])) / (slots / S - lam)
        )
        return all(
            itl[k] <= slo["itl_s"] and wp + ttft[k] <= slo["ttft_s"] and q["wait_s"] + service[k] <= slo["e2e_s"]
            for k in range(len(itl))
        )

    if not meets(0.0):
        return 0.0, None
    lo, hi = 0.0, slots / S
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    if lo <= 0:
        return 0.0, None
    rates = study.total_rate[w]
    replicas = np.ceil(rates / lo)
    return lo, replicas * n * float(study.gpu.price_per_hour[g])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--staged", action="store_true", help="only the §10 study: stages and disaggregated pools")
    args = parser.parse_args()
    if args.staged:
        return staged_study()
    study = procurefile.parse(spec(DATA))
    n_candidates = len(study.workloads) * len(study.models) * len(study.gpus) * len(study.tp) * len(study.batch)
    points = n_candidates * len(study.rate_labels)
    slimjax.procure(study)  # compile
    seconds, ds = timed(lambda: slimjax.procure(study), args.repeats)
    rng = np.random.default_rng(0)
    fits = ds["slots"].values >= 1
    idx = np.argwhere(fits)
    picks = idx[rng.choice(len(idx), size=args.sample, replace=False)]
    start = time.perf_counter()
    worst_lam = worst_cost = 0.0
    agree = 0
    for w, m, g, n_i, b_i in picks:
        n, b = study.tp[n_i], int(study.batch[b_i])
        lam, cost = scalar_candidate(study, ds, w, m, g, n, b)
        got = float(ds["max_rate_per_replica"].values[w, m, g, n_i, b_i])
        if lam > 0:
            worst_lam = max(worst_lam, abs(got / lam - 1))
            grid_cost = ds["cost_per_hour"].values[w, :, m, g, n_i, b_i]
            worst_cost = max(worst_cost, float(np.max(np.abs(grid_cost / cost - 1))))
        agree += (lam > 0) == (got > 0)
    scalar_per = (time.perf_counter() - start) / args.sample
    grid_per = seconds / n_candidates
    print(
        f"study: {n_candidates:,} candidates × {len(study.rate_labels)} rates = {points:,} sized points in "
        f"{seconds:.2f} s "
        f"({n_candidates / seconds:,.0f} candidates/s, {points / seconds:,.0f} sized points/s)"
    )
    print(
        f"scalar path: {scalar_per * 1e3:,.0f} ms per candidate on {args.sample} sampled candidates "
        f"({1 / scalar_per:,.2f} candidates/s)"
    )
    print(
        f"ratio: {scalar_per / grid_per:,.0f}× per candidate; feasibility agrees on {agree}/{args.sample}; "
        f"max relative difference λ* {worst_lam:.2e}, $/hour over all rates {worst_cost:.2e}"
    )


def staged_study() -> None:
    """MODEL.md §10: a study sized by simulation with pipeline stages (pp: auto) and a disaggregated section (2
    prefill × 2 decode pools), against the same study without the section in the same process: the section's
    extra time per (workload, rate, model, pair) and per simulation of one pool."""
    study = dict(
        workloads=[dict(name="chat", input_len=1500, output_len=200)],
        rates=[2.0, 8.0],
        models=["Llama-3.1-70B", "DeepSeek-V3"],
        gpus=["H100-SXM", "H200"],
        tp=[4, 8],
        pp="auto",
        batch=[32, 128],
        slo=dict(ttft_s=1.0, itl_s=0.05),
        sizing=dict(method="simulation", requests=400),
    )
    section = dict(
        prefill=[{"gpu": "H100-SXM", "tp": 8, "pp": 2}, {"gpu": "H200", "tp": 8}],
        decode=[{"gpu": "H200", "tp": 8, "batch": 128}, {"gpu": "H100-SXM", "tp": 8, "pp": 2, "batch": 128}],
    )
    slimjax.procure(study)  # compile
    t = time.perf_counter()
    plain = slimjax.procure(study)
    aggregated = time.perf_counter() - t
    t = time.perf_counter()
    both = slimjax.procure(dict(study, disaggregated=section))
    total = time.perf_counter() - t
    pairs = 2 * 2 * 4  # rates × models × pairs
    sized = int(np.isfinite(plain["replicas"].values).sum())
    print(f"aggregated (pp: auto): {aggregated:.1f} s for {sized} sized candidate×rate jobs")
    print(
        f"+ disaggregated section: {total - aggregated:.1f} s more for {pairs} (rate, model, pair) sizings, "
        f"{(total - aggregated) / pairs:.2f} s each; section/aggregated time {(total - aggregated) / aggregated:.2f}"
    )
    saving = both["disagg_saving_per_hour"].values.ravel()
    print("saving per hour (aggregated − disaggregated) by (rate, model):", np.round(saving, 2).tolist())


if __name__ == "__main__":
    main()
