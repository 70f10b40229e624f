"""Grid benchmark: SLIM + its physical floor + the fit mask + B_cap over a ≥ 5·10^7-point grid, slimjax vs plain
numpy doing the same work.

Both evaluate the same formulas (MODEL.md §1, §2, the floor of slimjax.model.floor, §3's fit mask) on the same grid
in the same process and must agree everywhere; speed is reported as points/s and as a ratio (these machines are noisy,
so the ratio is the figure to trust), and the engine's CPU time (every core's). Also reported: the bytes of results
written per point and this machine's measured memory write bandwidth, i.e. how far the engine is from the bandwidth
limit for what it must write.

    python bench/grid.py [--repeats 3]
    PYTHONPATH=<a worktree> python bench/grid.py --engine-only     # the engine's CPU time of another commit
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from common import Discard, cpu_timed, timed  # bench/common.py (the script folder is on sys.path)

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


def floor_terms(sw) -> dict:
    """Per (model, GPU) the physical floor's inputs, from slimjax's own roofline terms at 100 % of peak (model
    floor; these are (M, G) numbers, not the grid's work): P_act, M_W, K per token on full and sliding layers, the
    window, F and BW of the group, and the attention coefficients."""
    import jax

    from slimjax.model.floor import floor_inputs

    m = jax.tree_util.tree_map(lambda x: np.asarray(x)[:, None], sw.model)
    g = jax.tree_util.tree_map(lambda x: np.asarray(x)[None, :], sw.gpu)
    f = floor_inputs(m, g, sw.serving)
    r = f["roof"]
    return {
        k: np.broadcast_to(np.asarray(v, np.float64), sw.serving.n_gpu.shape)
        for k, v in dict(
            p_act=r.active_params, weights=r.weights, full=r.kv_per_token_full, sliding=r.kv_per_token_sliding,
            window=r.window, flops=r.flops, bandwidth=r.bandwidth, a_pre=f["a_pre"], a_dec=f["a_dec"],
        ).items()
    }  # fmt: skip


def _sum_of_max(a1, b1, a2, b2, lo, hi):
    """sum_{k=lo..hi} max(a1 + b1 k, a2 + b2 k) in numpy: the two lines cross once at most."""
    db = b1 - b2
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(db == 0, np.inf, (a2 - a1) / np.where(db == 0, 1, db))
    first_high = np.where(db == 0, a1 >= a2, db > 0)  # line 1 on top from the crossing on (or everywhere)
    split = np.where(db > 0, np.ceil(cross), np.floor(cross) + 1)
    split = np.where(db == 0, lo, np.clip(split, lo, np.maximum(hi + 1, lo)))

    def series(a, b, s, e):
        n = np.maximum(e - s + 1, 0)
        return np.where(n > 0, n * a + b * (s + e) * n / 2, 0)

    low = series(np.where(first_high, a2, a1), np.where(first_high, b2, b1), lo, split - 1)
    return low + series(np.where(first_high, a1, a2), np.where(first_high, b1, b2), split, hi)


def numpy_reference(sw, max_seqs):
    """SLIM + its physical floor + the fit mask + B_cap as plain numpy broadcasting over the full 5-D grid (float32
    arithmetic where the engine's is; the floor's (M, G) inputs from :func:`floor_terms`, and ``max_seqs`` (M, G, I,
    O), the KV pool's sequences, from the engine's store: memory is 4-D work, not the grid's)."""
    dt = np.float32
    m = {k: np.asarray(getattr(sw.model, k), dt).reshape(-1, 1, 1, 1, 1) for k in sw.model.__dataclass_fields__}
    g = {k: np.asarray(getattr(sw.gpu, k), dt).reshape(1, -1, 1, 1, 1) for k in sw.gpu.fields()}
    c = {
        k: np.asarray(getattr(sw.slim.coeffs, k), dt)[:, :, None, None, None]
        for k in sw.slim.coeffs.__dataclass_fields__
    }
    f = {k: v.astype(dt)[:, :, None, None, None] for k, v in floor_terms(sw).items()}
    B = sw.batch.astype(dt).reshape(1, 1, -1, 1, 1)
    I = sw.input_len.astype(dt).reshape(1, 1, 1, -1, 1)
    O = sw.output_len.astype(dt).reshape(1, 1, 1, 1, -1)
    n = np.asarray(sw.serving.n_gpu, dt)[:, :, None, None, None]
    D, L = m["hidden"], m["n_layers"]
    kv_width = m["n_kv_heads"] * m["head_dim"]
    flops = L * (B * I * (4 * D * D + 4 * D * kv_width + 2 * m["n_ffn"] * m["ffn_dim"] * D) + 4 * B * I * I * D)
    t_pre = flops / (c["eta_c"] * n * g["flops_per_s"])
    e_kv = np.where(
        m["mla"] > 0,
        (m["kv_lora_rank"] + m["rope_dim"]) * m["kv_dtype_bytes"],
        2 * m["n_kv_heads"] * m["head_dim"] * m["kv_dtype_bytes"],
    )
    m_dec = L * e_kv * (O * (I + 1) + O * (O - 1) / 2)
    t_d = c["alpha"] * O + c["gamma"] * L * (D / 1024) ** 2 * O
    t_dec = (B + c["B0"]) / c["eta_m"] * (t_d + m_dec / (n * g["bandwidth_bytes_per_s"]))
    # the floor (dense models): the batch's prompts as one pass; each decode step's weights and KV at peak
    pre_floor = np.maximum(
        B * (2 * f["p_act"] * I + f["a_pre"] * I * I / 2) / f["flops"], f["weights"] / f["bandwidth"]
    )
    a1, b1 = B * (2 * f["p_act"] + f["a_dec"] * I) / f["flops"], B * f["a_dec"] / f["flops"]
    per_token = f["full"] + f["sliding"]
    a2, b2 = (f["weights"] + B * per_token * I) / f["bandwidth"], B * per_token / f["bandwidth"]
    tail = f["sliding"] * np.where(f["sliding"] > 0, f["window"], 0)
    a3, b3 = (f["weights"] + B * (f["full"] * I + tail)) / f["bandwidth"], B * f["full"] / f["bandwidth"]
    steps, inside = O - 1, np.floor(f["window"] - I)  # steps j ≤ W − I read the whole context on sliding layers
    dec_floor = _sum_of_max(a1, b1, a2, b2, 1, np.minimum(steps, inside)) + _sum_of_max(
        a1, b1, a3, b3, np.clip(inside + 1, 1, np.maximum(steps + 1, 1)), steps
    )
    flag = (pre_floor > t_pre).astype(np.int8) + 2 * (dec_floor > t_dec).astype(np.int8)
    t_pre, t_dec = np.maximum(t_pre, pre_floor), np.maximum(t_dec, dec_floor)
    e2e = t_pre + t_dec + c["t_fixed"]
    tput = B * (I + O) / e2e
    fits = B <= max_seqs[:, :, None]
    t1 = tput[:, :, :1]
    ok = fits & (e2e <= sw.advisor.slo_s) & (tput / (B * t1) > sw.advisor.epsilon)
    masked = np.where(ok, tput, -np.inf)
    b_cap = np.where(ok.any(axis=2), sw.batch[masked.argmax(axis=2)], 0)
    return dict(
        slim_decode_s=np.where(fits, t_dec, np.nan),
        slim_e2e_s=np.where(fits, e2e, np.nan),
        slim_throughput=np.where(fits, tput, np.nan),
        slim_at_floor=np.where(fits, flag, 0),
        fits=fits,
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
    ap.add_argument("--engine-only", action="store_true", help="only the engine's CPU and wall time (any commit)")
    args = ap.parse_args()
    import jax

    sw = parse(SPEC)
    n = int(np.prod(sw.shape))
    t0 = time.perf_counter()
    slimjax.sweep(sw, quiet=True, memory_budget_bytes=args.budget)  # compile + first run
    first = time.perf_counter() - t0
    cpu_engine, t_engine = cpu_timed(lambda: grid.evaluate(sw, grid.plan(sw, args.budget), Discard()), args.repeats)
    if args.engine_only:
        print(json.dumps({"tree": slimjax.__file__, "points": n, "engine_cpu_s": cpu_engine, "engine_s": t_engine}))
        return
    t_sweep, ds = timed(lambda: slimjax.sweep(sw, quiet=True, memory_budget_bytes=args.budget), args.repeats)
    max_seqs = ds["max_seqs"].values
    t_numpy, ref = timed(lambda: numpy_reference(sw, max_seqs), max(1, args.repeats - 1))
    # the same work (SLIM, its floor, the fit mask, B_cap): equal everywhere, float32 tolerances
    for k in ("slim_decode_s", "slim_e2e_s", "slim_throughput"):
        np.testing.assert_allclose(ds[k].values, ref[k], rtol=1e-4)
    flags = float(np.mean(ds["slim_at_floor"].values == ref["slim_at_floor"]))  # ties at the floor may round apart
    assert np.array_equal(ds["fits"].values, ref["fits"]) and flags > 0.999, flags
    agree = float(np.mean(ds["b_cap"].values == ref["b_cap"]))  # float32 ties in the argmax may differ
    assert agree > 0.99, agree
    bytes_per_point = sum(ds[v].nbytes for v in ds.data_vars) / n
    bw = write_bandwidth()
    result = {
        "points": n,
        "devices": [str(d) for d in jax.local_devices()],
        "first_call_s_incl_compile": round(first, 3),
        "engine_s": round(t_engine, 3),
        "engine_cpu_s": round(cpu_engine, 3),
        "engine_points_per_s": n / t_engine,
        "sweep_in_memory_s": round(t_sweep, 3),
        "sweep_points_per_s": n / t_sweep,
        "numpy_s": round(t_numpy, 3),
        "numpy_points_per_s": n / t_numpy,
        "engine_vs_numpy": t_numpy / t_engine,
        "sweep_vs_numpy": t_numpy / t_sweep,
        "b_cap_equal_share": agree,
        "floor_flag_equal_share": flags,
        "result_bytes_per_point": bytes_per_point,
        "machine_write_bandwidth_GBps": bw / 1e9,
        "bandwidth_bound_points_per_s": bw / bytes_per_point,
        "engine_fraction_of_bandwidth_bound": (n / t_engine) / (bw / bytes_per_point),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
