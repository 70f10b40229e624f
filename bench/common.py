"""Helpers shared by the benchmarks."""

from __future__ import annotations

import math
import time


class Discard:
    """A sink that keeps nothing: the engine's own rate, results materialised block by block."""

    def write(self, name, region, values):
        pass


def timed(fn, repeats: int):
    """(best wall seconds over ``repeats`` calls, the last result)."""
    best, out = math.inf, None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out
