"""Synthetic serving rows for the serving fit's tests: made by its own forward model at known constants."""

import pandas as pd

from slimjax.fit import serving as fit

TRUTH = dict(
    compute_efficiency=0.6,
    bandwidth_efficiency=0.55,
    launch_overhead_s=0.0,
    step_overhead_s=2e-3,  # a per-step floor
    link_efficiency=0.65,  # the link's achieved fraction
    allreduce_latency_s=3e-5,
)


def serving_rows(tps, clients, lengths, truth=TRUTH, offline=False, gpu="A100-SXM-80GB"):
    """Serving rows whose mean TTFT and TPOT (offline: TTFT, TPOT and the batch's latency) are the simulation's own
    at ``truth``, on a GPU whose link is §4c's line (an A100 node: no NCCL measurement in the catalog, so η_link and
    τ time its all-reduce)."""
    rows = pd.DataFrame(
        [
            dict(model="Llama-3.1-8B", gpu=gpu, n_gpu=n, batch=c, input_len=i, output_len=o, offline=offline)
            for n in tps
            for c in clients
            for i, o in lengths
        ]
    ).assign(ttft_s=1.0, itl_s=1.0, e2e_s=1.0)
    p = fit.predict_serving(rows, truth)
    return rows.assign(ttft_s=p.ttft_sim_s, itl_s=p.tpot_sim_s, e2e_s=p.e2e_sim_s)
