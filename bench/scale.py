"""Scale benchmark (issue 12): sweeps of 10^7, 10^8 and 10^9 points to zarr — wall time (after the one
compile, as the engine's rate is), points/s, bytes written, peak RSS (each in a fresh subprocess) — against the
in-memory engine (a sink that keeps nothing)
and a dd-style sequential write of the same number of bytes, measured in the same run; a queue sweep with
the pure-JAX Erlang B against the SciPy host callback it replaced; Dask LocalCluster (2 workers) against
in-process.

    python bench/scale.py [--sizes 7,8,9] [--compression zstd,none] [--skip-dask] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import Discard, timed  # bench/common.py

import slimjax
from slimjax.api import DEFAULT_MEMORY_BUDGET, parse
from slimjax.engine import grid

MODELS = [
    "OPT-125m",
    "OPT-1.3b",
    "OPT-6.7b",
    "Llama-2-7b",
    "Meta-Llama-3-8B",
    "Llama-3.1-8B",
    "Mistral-7B-v0.1",
    "Qwen2-7B",
    "gemma-2-9b",
    "OPT-13b",
    "Llama-3.1-70B",
    "Qwen3-32B",
    "Qwen3-8B",
    "OPT-2.7b",
    "OPT-350m",
    "Mixtral-8x7B",
]
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


def spec_of(points: float) -> dict:
    """A SLIM + B_cap sweep of about ``points`` grid points (batch 1…256, models × GPUs × I × O grown to fit)."""
    n_io = max(1, int(round(math.sqrt(points / (256 * 16 * 10)))))
    return dict(
        models=MODELS,
        gpus=GPUS,
        batch={"start": 1, "stop": 256},
        input_len={"start": 16, "stop": 16 * n_io, "step": 16},
        output_len={"start": 8, "stop": 8 * n_io, "step": 8},
        slim="shared",
        precision="float32",
    )


CHILD = """
import json, resource, sys, time
import slimjax
from slimjax.api import DEFAULT_MEMORY_BUDGET
from slimjax.engine import grid
slimjax.configure()
spec, out, compression = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
sw = slimjax.parse(spec)
plan = grid.plan(sw, DEFAULT_MEMORY_BUDGET)
class Discard:
    def write(self, *a): pass
with slimjax.config.float64_scope():  # compile first (one block), as the engine's rate is measured warm
    grid.evaluate(sw, plan, Discard(), skip=set(range(1, plan.n_blocks)))
t = time.perf_counter()
slimjax.sweep(sw, out, quiet=True, compression=compression)
print(json.dumps({"seconds": time.perf_counter() - t, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
* 1024}))
"""


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def dd(path: Path, n_bytes: int, block: int = 64 << 20) -> float:
    """Seconds to write ``n_bytes`` sequentially (random data, 64 MiB writes) and fsync."""
    buf = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8).tobytes()
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = n_bytes
        while left > 0:
            f.write(buf[: min(block, left)])
            left -= block
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t
    path.unlink()
    return seconds


def engine_rate(spec: dict) -> tuple[float, float]:
    sw = parse(spec)
    plan = grid.plan(sw, DEFAULT_MEMORY_BUDGET)
    points = math.prod(len(v) for v in sw.coords.values())
    with slimjax.config.float64_scope():
        grid.evaluate(sw, plan, Discard())
        seconds, _ = timed(lambda: grid.evaluate(sw, plan, Discard()), 1)
    return points, seconds


def to_zarr(spec: dict, folder: Path, compression: str) -> dict:
    out = folder / "scale.zarr"
    shutil.rmtree(out, ignore_errors=True)
    run = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec), str(out), compression], capture_output=True, text=True
    )
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["bytes"] = folder_bytes(out)
    shutil.rmtree(out, ignore_errors=True)
    return result


def queue_rates() -> dict:
    """A queue sweep with the pure-JAX Erlang B (every device) vs the SciPy host callback (one device)."""
    import jax
    import jax.numpy as jnp
    from scipy.special import gammaincc

    import slimjax.engine.groups as groups
    import slimjax.model.queue as queue

    spec = dict(
        models=["Llama-3.1-8B", "Qwen3-32B", "Llama-3.1-70B", "Mistral-7B-v0.1"],
        gpus=["H100-SXM", "H200", "A100-SXM-80GB", "L40S", "B200"],
        batch={"start": 1, "stop": 256},
        input_len=[128, 512, 1024, 2048, 4096, 8192],
        output_len=[64, 128, 256, 512, 1024],
        arrival_rate=[0.1, 0.5, 1, 2, 5, 10, 20, 50],
        serving=dict(n_gpu="auto"),
        advisor=False,
        precision="float32",
    )
    points, pure = engine_rate(spec)

    def scipy_erlang_b(servers, load, max_servers=None):
        log_pmf = servers * jnp.log(load) - load - jax.scipy.special.gammaln(servers + 1.0)
        shape = jnp.broadcast_shapes(jnp.shape(servers), jnp.shape(load))
        q = jax.pure_callback(
            lambda a, x: np.asarray(gammaincc(a, x)),
            jax.ShapeDtypeStruct(shape, jnp.float64),
            jnp.broadcast_to(servers + 1.0, shape),
            jnp.broadcast_to(load, shape),
            vmap_method="broadcast_all",
        )
        return jnp.where(load > 0, jnp.exp(log_pmf) / q, 0.0)

    real_b, real_group = queue.erlang_b, groups.GROUPS["queue"]
    queue.erlang_b = scipy_erlang_b
    groups.GROUPS["queue"] = groups.dataclasses.replace(real_group, host_callbacks=True)  # callbacks ran on one device
    jax.clear_caches()
    try:
        _, callback = engine_rate(spec)
    finally:
        queue.erlang_b, groups.GROUPS["queue"] = real_b, real_group
        jax.clear_caches()
    return {"points": points, "pure_jax_s": pure, "scipy_callback_s": callback}


def dask_vs_local(folder: Path) -> dict:
    spec = spec_of(2e7)
    out = {}
    for name, kwargs in (("in-process", {}), ("dask 2 workers", {"scheduler": "dask", "workers": 2})):
        target = folder / f"{name.split()[0]}.zarr"
        shutil.rmtree(target, ignore_errors=True)
        t = time.perf_counter()
        slimjax.sweep(spec, target, quiet=True, **kwargs)
        out[name] = time.perf_counter() - t
        shutil.rmtree(target, ignore_errors=True)
    sw = parse(spec)
    out["points"] = math.prod(len(v) for v in sw.coords.values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="7,8,9")
    parser.add_argument("--compression", default="zstd,none")
    parser.add_argument("--skip-dask", action="store_true")
    parser.add_argument("--skip-queue", action="store_true")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    slimjax.configure()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="slimjax-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for exp in (int(x) for x in args.sizes.split(",")):
        spec = spec_of(10.0**exp)
        points, engine_s = engine_rate(spec)
        for compression in args.compression.split(","):
            z = to_zarr(spec, folder, compression)
            disk_s = dd(folder / "dd.bin", z["bytes"])
            rows.append(
                dict(
                    points=points,
                    compression=compression,
                    engine_pts_s=points / engine_s,
                    zarr_s=z["seconds"],
                    zarr_pts_s=points / z["seconds"],
                    bytes=z["bytes"],
                    disk_mb_s=z["bytes"] / disk_s / 1e6,
                    zarr_mb_s=z["bytes"] / z["seconds"] / 1e6,
                    peak_rss_mb=z["peak_rss"] / 1e6,
                )
            )
            r = rows[-1]
            goal = min(0.6 * r["engine_pts_s"] / r["zarr_pts_s"], 0.7 * r["disk_mb_s"] / r["zarr_mb_s"])
            print(
                f"{points:>14,} pts {compression:>4}: zarr {r['zarr_s']:7.1f} s = {r['zarr_pts_s']:12,.0f} pts/s "
                f"({r['zarr_pts_s'] / r['engine_pts_s']:.0%} of the engine's {r['engine_pts_s']:,.0f}); "
                f"{r['bytes'] / 1e9:6.2f} GB at {r['zarr_mb_s']:6.0f} MB/s "
                f"({r['zarr_mb_s'] / r['disk_mb_s']:.0%} of dd's "
                f"{r['disk_mb_s']:.0f} MB/s); peak RSS {r['peak_rss_mb']:,.0f} MB; goal "
                f"{'met' if goal <= 1 else 'not met'}",
                flush=True,
            )
    if not args.skip_queue:
        q = queue_rates()
        print(
            f"queue sweep {q['points']:,} pts: pure JAX {q['points'] / q['pure_jax_s']:,.0f} pts/s (every device), "
            f"SciPy callback {q['points'] / q['scipy_callback_s']:,.0f} pts/s (one device)",
            flush=True,
        )
    if not args.skip_dask:
        d = dask_vs_local(folder)
        print(
            f"dask vs in-process, {d['points']:,} pts to zarr: in-process {d['in-process']:.1f} s, "
            f"dask LocalCluster 2 workers {d['dask 2 workers']:.1f} s (incl. cluster start)",
            flush=True,
        )
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
