"""Agent benchmark (MODEL.md §6): 10^7 (grid point × graph) agent evaluations through the jitted grid,
against the call-by-call reference on a random sample of them, in one run.

Reference per sampled (point, graph): the loop-reference service times S(w), S(1) (tests/reference.py, which
takes the bf16 peak: the models here are bf16 — a 4-bit checkpoint would use the FP4 peak in slimjax;
prefill chunk by chunk, decode step by step), T_local by a brute-force wave schedule, T_api by the
§6 schedule call by call, and both costs. Reported: evaluations/s both ways, the ratio per evaluation,
and the largest relative difference over the sample.

    python bench/agents.py [--sample 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np
from common import Discard, timed  # bench/common.py

import slimjax
from slimjax.api import DEFAULT_MEMORY_BUDGET, parse
from slimjax.engine import grid

slimjax.configure()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference as ref  # noqa: E402
from test_agents import api_schedule_loop, local_waves_loop  # noqa: E402

RNG = np.random.default_rng(0)
GRAPHS = {
    f"g{k}": dict(
        stages=int(RNG.integers(1, 7)),
        calls_per_stage=int(RNG.integers(1, 65)),
        parallelism=int(RNG.integers(1, 33)),
        tool_delay_s=float(np.round(RNG.uniform(0, 5), 2)),
        api=dict(rpm=float(RNG.choice([60, 500, 5000])), parallelism=float(RNG.integers(1, 33))),
    )
    for k in range(100)
}
SPEC = dict(
    models=["Llama-3.1-8B", "Qwen3-32B", "Llama-3.1-70B", "Mistral-7B-v0.1", "Mixtral-8x7B"],
    gpus=[
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
    ],
    batch=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512],
    input_len=[128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192],
    output_len=[32, 64, 128, 192, 256, 384, 512, 768, 1024, 2048],
    serving=dict(n_gpu="auto"),
    advisor=False,
    precision="float64",
    agents=dict(api=dict(tpm=2_000_000, service_s=4.0), **GRAPHS),
)


def reference_point(sw, ds_values, i, j, b, k, o, a):
    """The agent variables at one (point, graph) by the loops."""
    arch = {f.name: float(getattr(sw.model, f.name)[i]) for f in dataclasses.fields(sw.model)}
    gpu = {k: float(v[j]) for k, v in sw.gpu.fields().items()}
    serving = {name: float(v[i, j]) for name, v in sw.serving.fields().items()}
    B, I, O = int(sw.batch[b]), int(sw.input_len[k]), int(sw.output_len[o])
    g = sw.agents.table[sw.agents.names[a]]
    _, seqs, service = ref.capacity_point(arch, gpu, serving, 1, I, O)
    m = min(B, seqs)
    local = local_waves_loop(
        int(g["stages"]),
        int(g["calls_per_stage"]),
        g["tool_delay_s"],
        int(g["parallelism"]),
        m,
        lambda w: service(w)[2],
    )
    api = api_schedule_loop(
        int(g["stages"]),
        int(g["calls_per_stage"]),
        g["tool_delay_s"],
        g["api"]["rpm"],
        g["api"]["tpm"],
        I,
        O,
        g["api"]["service_s"],
        g["api"]["parallelism"],
    )
    return local, api


class Keep:
    """Keep the agent variables of the grid (for the comparison)."""

    def __init__(self, sw):
        self.arrays = {}
        self.sw = sw

    def write(self, name, region, values):
        if name in ("agent_local_s", "agent_api_s"):
            dims = [d for d in ("model", "gpu", "batch", "input_len", "output_len", "agent")]
            shape = (
                [len(self.sw.coords[d]) for d in dims]
                if name == "agent_local_s"
                else [len(self.sw.coords[d]) for d in ("input_len", "output_len", "agent")]
            )
            arr = self.arrays.setdefault(name, np.full(shape, np.nan))
            arr[region] = values


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    sw = parse(SPEC)
    evaluations = math.prod(len(v) for v in sw.coords.values())
    block_plan = grid.plan(sw, DEFAULT_MEMORY_BUDGET)
    with slimjax.config.float64_scope():
        grid.evaluate(sw, block_plan, Discard())  # compile
        seconds, _ = timed(lambda: grid.evaluate(sw, block_plan, Discard()), args.repeats)
        keep = Keep(sw)
        grid.evaluate(sw, block_plan, keep)
    shape = [len(v) for v in sw.coords.values()]
    idx = [tuple(int(RNG.integers(0, n)) for n in shape) for _ in range(args.sample)]
    start = time.perf_counter()
    refs = [reference_point(sw, None, *p) for p in idx]
    per_ref = (time.perf_counter() - start) / args.sample
    worst_local = worst_api = 0.0
    infinite_agree = 0
    for (i, j, b, k, o, a), (local, api) in zip(idx, refs, strict=False):
        got_local = keep.arrays["agent_local_s"][i, j, b, k, o, a]
        got_api = keep.arrays["agent_api_s"][k, o, a]
        if math.isinf(local) or math.isinf(got_local):
            infinite_agree += math.isinf(local) and math.isinf(got_local)
        else:
            worst_local = max(worst_local, abs(got_local / local - 1))
            infinite_agree += 1
        worst_api = max(worst_api, abs(got_api / api - 1))
    per_grid = seconds / evaluations
    print(
        f"grid: {evaluations:,} (point × graph) evaluations with every capacity variable in {seconds:.2f} s "
        f"({evaluations / seconds:,.0f} evaluations/s)"
    )
    print(
        f"call-by-call reference: {per_ref * 1e3:,.2f} ms per evaluation on {args.sample} sampled "
        f"({1 / per_ref:,.0f}/s)"
    )
    print(
        f"ratio: {per_ref / per_grid:,.0f}× per evaluation; fits agree {infinite_agree}/{args.sample}; "
        f"max relative difference T_local {worst_local:.1e}, T_api {worst_api:.1e}"
    )


if __name__ == "__main__":
    main()
