"""One way to run independent pieces of work on every local device: the grid's blocks and the
calibration's group chunks both go through :func:`pipelined`.

On the CPU, XLA runs one computation per device on one core, so ``slimjax.configure()`` exposes one
device per core and the work is dealt out round-robin. JAX dispatches asynchronously: a piece's
result is collected only once the next device has been given its own piece.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import jax

from ..config import warn_if_one_cpu_device

T = TypeVar("T")


def compute_devices(*, host_callbacks: bool = False, tasks: int | None = None) -> list:
    """The devices to deal work to. Work that calls back into the host runs on one (callbacks from two CPU
    devices at once hung on this machine); no group does since the queue became pure JAX, but a group
    registered with ``host_callbacks=True`` still gets that. ``tasks``: how many pieces the work has (one
    piece runs on one device whatever the count, so one device is said to be a waste only for more)."""
    devices = jax.local_devices()
    if tasks is None or tasks > 1:
        warn_if_one_cpu_device(devices)
    return devices[:1] if host_callbacks else devices


def pipelined(tasks: Iterable[T], run: Callable[[T, Any], Any], devices: list) -> Iterator[tuple[T, Any]]:
    """``run(task, device)`` for each task, devices taken round-robin, with one task per device in
    flight beyond the one being collected; yields (task, result) in task order."""
    pending: list = []
    for k, task in enumerate(tasks):
        pending.append((task, run(task, devices[k % len(devices)])))
        if len(pending) > len(devices):
            yield pending.pop(0)
    yield from pending
