"""Grid benchmark: SLIM variables + B_cap over a ≥ 5·10^7-point grid, slimjax vs plain numpy.

Both evaluate the same formulas (MODEL.md §1, §2) on the same grid in the same process; speed is
reported as points/s and as a ratio (these machines are noisy, so the ratio is the figure to trust).
Also reported: the bytes of results written per point and this machine's measured memory write
bandwidth, i.e. how far the engine is from the bandwidth limit for what it must write.

    python bench/grid.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from common import Discard, timed  # bench/common.py (the script folder is on sys.path)

import slimjax
from slimjax.api import parse
from slimjax.engine import grid

slimjax.configure()

SPEC = dict(
    models=[
        "OPT-125m",
        "OPT-1.3b",
        "OPT-6.7b",
        "OPT-13b",
        "Llama-2-7b",
        "Llama-3.1-8B",
        "Llama-3.1-70B",
        "Mistral-7B-v0.1",
        "Qwen2-7B",
        "gemma-2-9b",
    ],
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
    batch={"start": 1, "stop": 512},
    input_len={"start": 128, "stop": 4096, "step": 128},
    output_len={"start": 128, "stop": 4096, "step": 128},
    advisor={"epsilon": 0.5, "slo_s": 120},
    precision="float32",
    slim_variant="slim",  # MODEL.md §1, the formulas the numpy reference broadcasts
)


def numpy_reference(sw):
    """The same formulas as plain numpy broadcasting over the full 5-D grid (float32)."""
    dt = np.float32
    m = {k: np.asarray(getattr(sw.model, k), dt).reshape(-1, 1, 1, 1, 1) for k in sw.model.__dataclass_fields__}
    g = {k: np.asarray(getattr(sw.gpu, k), dt).reshape(1, -1, 1, 1, 1) for k in sw.gpu.fields()}
    c = {
        k: np.asarray(getattr(sw.slim.coeffs, k), dt)[:, :, None, None, None]
        for k in sw.slim.coeffs.__dataclass_fields__
    }
    B = sw.batch.astype(dt).reshape(1, 1, -1, 1, 1)
    I = sw.input_len.astype(dt).reshape(1, 1, 1, -1, 1)
    O = sw.output_len.astype(dt).reshape(1, 1, 1, 1, -1)
    D, L = m["hidden"], m["n_layers"]
    kv_width = m["n_kv_heads"] * m["head_dim"]
    flops = L * (B * I * (4 * D * D + 4 * D * kv_width + 2 * m["n_ffn"] * m["ffn_dim"] * D) + 4 * B * I * I * D)
    t_pre = flops / (c["eta_c"] * g["flops_per_s"])
    e_kv = np.where(
        m["mla"] > 0,
        (m["kv_lora_rank"] + m["rope_dim"]) * m["kv_dtype_bytes"],
        2 * m["n_kv_heads"] * m["head_dim"] * m["kv_dtype_bytes"],
    )
    m_dec = L * e_kv * (O * (I + 1) + O * (O - 1) / 2)
    t_d = c["alpha"] * O + c["gamma"] * L * (D / 1024) ** 2 * O
    t_dec = (B + c["B0"]) / c["eta_m"] * (t_d + m_dec / g["bandwidth_bytes_per_s"])
    e2e = t_pre + t_dec + c["t_fixed"]
    tput = B * (I + O) / e2e
    t1 = tput[:, :, :1]
    ok = (e2e <= sw.advisor.slo_s) & (tput / (B * t1) > sw.advisor.epsilon)
    masked = np.where(ok, tput, -np.inf)
    b_cap = np.where(ok.any(axis=2), sw.batch[masked.argmax(axis=2)], 0)
    return dict(
        prefill_flops=flops,
        slim_prefill_s=t_pre,
        kv_traffic_bytes=m_dec,
        slim_decode_s=t_dec,
        slim_e2e_s=e2e,
        slim_throughput=tput,
        b_cap=b_cap,
    )


def write_bandwidth(nbytes: int = 1 << 28) -> float:
    buf = np.empty(nbytes // 4, np.float32)
    buf.fill(0.0)
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        buf.fill(1.0)
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=256 * 2**20, help="memory budget per block, bytes")
    args = ap.parse_args()
    import jax

    sw = parse(SPEC)
    n = int(np.prod(sw.shape))
    t0 = time.perf_counter()
    slimjax.sweep(sw, quiet=True, memory_budget_bytes=args.budget)  # compile + first run
    first = time.perf_counter() - t0
    t_engine, _ = timed(lambda: grid.evaluate(sw, grid.plan(sw, args.budget), Discard()), args.repeats)
    t_sweep, ds = timed(lambda: slimjax.sweep(sw, quiet=True, memory_budget_bytes=args.budget), args.repeats)
    t_numpy, ref = timed(lambda: numpy_reference(sw), max(1, args.repeats - 1))
    # since issue 20 the engine also evaluates memory (the fit mask) and the physical floor, which the numpy
    # reference does not: values agree where the batch fits and no floor binds, and B_cap is not compared
    own = ds["fits"].values & (ds["slim_at_floor"].values == 0)
    for k in ("slim_e2e_s", "slim_throughput"):
        np.testing.assert_allclose(ds[k].values[own], ref[k][own], rtol=2e-5)
    agree = float(np.mean(own))
    bytes_per_point = sum(ds[v].nbytes for v in ds.data_vars) / n
    bw = write_bandwidth()
    result = {
        "points": n,
        "devices": [str(d) for d in jax.local_devices()],
        "first_call_s_incl_compile": round(first, 3),
        "engine_s": round(t_engine, 3),
        "engine_points_per_s": n / t_engine,
        "sweep_in_memory_s": round(t_sweep, 3),
        "sweep_points_per_s": n / t_sweep,
        "numpy_s": round(t_numpy, 3),
        "numpy_points_per_s": n / t_numpy,
        "engine_vs_numpy": t_numpy / t_engine,
        "sweep_vs_numpy": t_numpy / t_sweep,
        "share_of_points_compared_with_numpy": agree,
        "result_bytes_per_point": bytes_per_point,
        "machine_write_bandwidth_GBps": bw / 1e9,
        "bandwidth_bound_points_per_s": bw / bytes_per_point,
        "engine_fraction_of_bandwidth_bound": (n / t_engine) / (bw / bytes_per_point),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
