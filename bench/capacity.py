"""Capacity + queue benchmark: the jitted grid vs numpy running the very same closed forms, and
closed form vs a chunk-by-chunk / step-by-step loop.

numpy reference: slimjax's pure formula modules (memory, roofline, capacity, queue) executed with
``jnp`` rebound to numpy (and SciPy's incomplete gamma called directly), broadcasting over the full
6-D grid — the same code, no JAX. The slimjax side evaluates every sweep variable (SLIM included).

    python bench/capacity.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import types
from pathlib import Path

import jax
import numpy as np
from common import Discard, timed  # bench/common.py (the script folder is on sys.path)

import slimjax
from slimjax.api import DEFAULT_MEMORY_BUDGET, parse
from slimjax.engine import grid
from slimjax.model import calculator as capacity_mod
from slimjax.model import experts, memory, parallel, queue, roofline

slimjax.configure()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference as ref  # noqa: E402  (the loop references of the test-suite)

SPEC = dict(
    models=[
        "OPT-6.7b",
        "OPT-13b",
        "Llama-2-7b",
        "Llama-3.1-8B",
        "Llama-3.1-70B",
        "Mistral-7B-v0.1",
        "Qwen2-7B",
        "gemma-2-9b",
    ],
    gpus=["A100-SXM-80GB", "H100-SXM", "H200", "L40S", "B200"],
    batch={"start": 1, "stop": 64},
    input_len=[64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768],
    output_len=[16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192],
    serving={"chunk_size": 512, "launch_overhead_s": 2e-5, "Llama-3.1-70B": {"n_gpu": 4}},
    arrival_rate={"start": 0.25, "stop": 4.0, "step": 0.25},
    advisor=False,
    precision="float64",
)


@contextlib.contextmanager
def numpy_formulas():
    """Run the formula modules on numpy: rebind their ``jnp`` and the queue's special functions."""
    from scipy.special import gammaincc, gammaln

    saved = [(m, m.jnp) for m in (memory, roofline, capacity_mod, queue, experts, parallel)]
    saved_q = (queue.regularized_upper_gamma, queue.jax)
    try:
        for m, _ in saved:
            m.jnp = np
        queue.regularized_upper_gamma = gammaincc
        queue.jax = types.SimpleNamespace(scipy=types.SimpleNamespace(special=types.SimpleNamespace(gammaln=gammaln)))
        yield
    finally:
        for m, j in saved:
            m.jnp = j
        queue.regularized_upper_gamma, queue.jax = saved_q


def numpy_reference(sw):
    f = np.float64
    model = type(sw.model)(**{k: np.asarray(v, f).reshape(-1, 1, 1, 1, 1) for k, v in vars(sw.model).items()})
    gpu = type(sw.gpu)(**{k: np.asarray(v, f).reshape(1, -1, 1, 1, 1) for k, v in vars(sw.gpu).items()})
    serving = type(sw.serving)(**{k: np.asarray(v, f)[:, :, None, None, None] for k, v in sw.serving.fields().items()})
    B = sw.batch.astype(f).reshape(1, 1, -1, 1, 1)
    I = sw.input_len.astype(f).reshape(1, 1, 1, -1, 1)
    O = sw.output_len.astype(f).reshape(1, 1, 1, 1, -1)
    with numpy_formulas(), np.errstate(all="ignore"):
        cell = capacity_mod.capacity_cell_terms(model, gpu, serving, I, O)
        out = capacity_mod.service_terms(cell, None, B, I, O)
        last = lambda x: np.asarray(x)[..., None]  # noqa: E731  (arrival_rate gets the last axis)
        cell6 = jax.tree_util.tree_map(last, cell)
        out.update(capacity_mod.queue_terms(cell6, None, last(B), last(I), last(O), sw.arrival_rate))
    return out


def loop_vs_closed_form() -> dict:
    attn = 4.0 * 32 * 32 * 128
    roof = roofline.Roof(
        active_params=8.03e9,
        weights=1.606e10,
        routed_expert_bytes=0.0,
        n_experts=0.0,
        experts_per_token=0.0,
        kv_per_token_full=131072.0,
        kv_per_token_sliding=0.0,
        window=math.inf,
        flops=989e12,
        bandwidth=3.35e12,
        launch_overhead_s=2e-5,
    )
    args = (8.03e9, 4.0 * 32 * 32 * 128, 1.606e10, 4096.0, 32, 0, math.inf, 989e12, 3.35e12, 2e-5)
    import jax

    prefill = jax.jit(roofline.prefill_time)
    decode = jax.jit(roofline.decode_itl)
    jax.block_until_ready((prefill(100_000.0, 1.0, roof, attn), decode(64.0, 2048.0, 100_000.0, roof, attn)))  # compile
    t_closed, (closed, _, _) = timed(lambda: jax.block_until_ready(prefill(100_000.0, 1.0, roof, attn)), 20)
    t_loop, (loop, _, _) = timed(lambda: ref.prefill_chunks(100_000, 1, *args), 1)
    td_closed, d_closed = timed(lambda: jax.block_until_ready(decode(64.0, 2048.0, 100_000.0, roof, attn)), 20)
    td_loop, d_loop = timed(lambda: ref.decode_steps(64, 2048, 100_000, *args), 1)
    return {
        "prefill_I100000_chunk1": {
            "closed_s": t_closed,
            "loop_s": t_loop,
            "speedup": t_loop / t_closed,
            "rel_diff": abs(float(closed) / loop - 1),
        },
        "decode_O100000": {
            "closed_s": td_closed,
            "loop_s": td_loop,
            "speedup": td_loop / td_closed,
            "rel_diff": abs(float(d_closed) / d_loop - 1),
        },
    }


def main() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(float(__import__("os").environ.get("SLIMJAX_BENCH_WATCHDOG", "1e9")), exit=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sw = parse(SPEC)
    five = int(np.prod(sw.shape[:5]))  # model × GPU × batch × I × O
    points = five * len(sw.arrival_rate)
    t0 = time.perf_counter()
    ds = slimjax.sweep(sw, quiet=True)
    first = time.perf_counter() - t0
    t_engine, _ = timed(lambda: grid.evaluate(sw, grid.plan(sw, DEFAULT_MEMORY_BUDGET), Discard()), args.repeats)
    t_numpy, ref_out = timed(lambda: numpy_reference(sw), 1)
    for k in ("itl_s", "ttft_s", "service_s", "p_wait", "wait_s"):
        np.testing.assert_allclose(ds[k].values, np.broadcast_to(ref_out[k], ds[k].shape), rtol=1e-9, atol=1e-300)
    print(
        json.dumps(
            {
                "five_dim_points": five,
                "points_with_arrival_rate": points,
                "first_call_s_incl_compile": round(first, 2),
                "engine_s": round(t_engine, 3),
                "engine_points_per_s": points / t_engine,
                "numpy_s": round(t_numpy, 3),
                "numpy_points_per_s": points / t_numpy,
                "engine_vs_numpy": t_numpy / t_engine,
                "closed_form_vs_loop": loop_vs_closed_form(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
