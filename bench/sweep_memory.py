"""The in-memory sweep's result arrays, cold and warm: the engine's points/s against ``slimjax.sweep`` with the
result arrays as huge-page mappings (engine.dataset.result_array) and as plain ``np.empty``, every sweep's
Dataset kept alive so each one writes fresh memory (the first rep; the second reuses freed memory).

    python bench/sweep_memory.py
"""

from __future__ import annotations

import time

import numpy as np
from common import Discard, timed  # bench/common.py
from grid import SPEC  # bench/grid.py

import slimjax
from slimjax.engine import dataset, grid
from slimjax.inputs.sweepfile import parse

BUDGET = 256 * 2**20


def plain(shape, dtype):
    return np.empty(shape, dtype)


def main() -> None:
    slimjax.configure()
    sw = parse(SPEC)
    n = int(np.prod(sw.shape))
    slimjax.sweep(sw, quiet=True, memory_budget_bytes=BUDGET)  # compile
    huge = dataset.result_array
    kept = []

    def sweeps(variant) -> float:
        dataset.result_array = variant
        best = np.inf
        try:
            for _ in range(3):
                t = time.perf_counter()
                kept.append(slimjax.sweep(sw, quiet=True, memory_budget_bytes=BUDGET))
                best = min(best, time.perf_counter() - t)
        finally:
            dataset.result_array = huge
        return best

    for rep in ("fresh memory", "memory freed by the first rep"):
        t_engine, _ = timed(lambda: grid.evaluate(sw, grid.plan(sw, BUDGET), Discard()), 3)
        t_huge, t_plain = sweeps(huge), sweeps(plain)
        print(
            f"{rep}: engine {n / t_engine:.3g} points/s; sweep with huge-page results {n / t_huge:.3g} "
            f"({t_engine / t_huge:.0%} of the engine), with np.empty {n / t_plain:.3g} ({t_engine / t_plain:.0%})"
        )
        kept.clear()


if __name__ == "__main__":
    main()
