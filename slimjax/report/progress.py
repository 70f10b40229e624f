"""How long work shows that it is moving: a tqdm bar on a terminal, and where the output is not a terminal (a log, a
CI job, a pipe) one line per finished part, at most one every ``every_s`` seconds and always the last, with the
time so far and, where the total is known, the time left at the rate so far. Both take the same calls (the subset
of tqdm's the engine and the studies use: ``update``, ``total``, ``set_description``, ``unit``, ``close``)."""

from __future__ import annotations

import sys
import time


class LineProgress:
    """tqdm's calls, written as lines: ``DESC: N/TOTAL UNITs done, T s so far, about L s left``."""

    def __init__(self, desc: str, unit: str, total: int | None = None, file=None, every_s: float = 10.0):
        self.desc, self.unit, self.total, self.n = desc, unit, total, 0
        self.file = sys.stderr if file is None else file
        self.every_s = every_s
        self.start = self.last = time.monotonic()

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every_s or (self.total is not None and self.n >= self.total):
            self.last = now
            self.file.write(self.line(now) + "\n")
            self.file.flush()

    def line(self, now: float) -> str:
        """The line for the work done so far at ``now`` (time.monotonic)."""
        spent = now - self.start
        done = f"{self.n:,}/{self.total:,}" if self.total else f"{self.n:,}"
        left = ""
        if self.total and 0 < self.n < self.total:
            left = f", about {spent * (self.total - self.n) / self.n:,.0f} s left"
        return f"{self.desc}: {done} {self.unit}{'s' if self.n != 1 else ''} done, {spent:,.0f} s so far{left}"

    def close(self) -> None:
        pass


def progress(quiet: bool | None, desc: str, unit: str, total: int | None = None):
    """What shows the work moving: None with ``quiet``; a tqdm bar (with an ETA where ``total`` is known) on a
    terminal; elsewhere lines (:class:`LineProgress`) when ``quiet`` is False, as the command line asks, and nothing
    when it is None, a library call's default."""
    if quiet:
        return None
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(desc=desc, unit=unit, total=total, file=sys.stderr)
    return LineProgress(desc, unit, total) if quiet is False else None
