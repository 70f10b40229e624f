"""Sweeps on a Dask cluster: workers evaluate blocks and write their regions straight into the store;
the submitting process journals each block when its task returns (MODEL.md §7 store layout unchanged).

``dask.distributed`` is imported only when a sweep asks for it (``pip install 'slimjax[dask]'``). The
store must be a path every worker can open (a local path for a LocalCluster; a shared filesystem path
for a multi-host cluster).
"""

from __future__ import annotations

import math
import os

from ..config import float64_scope
from ..engine.grid import evaluate_blocks
from ..engine.plan import BlockPlan
from ..errors import SlimjaxError
from ..inputs.sweepfile import Sweep
from .sink import ZarrSink, open_group, values_crc


def run_blocks(sweep: Sweep, block_plan: BlockPlan, indices: list[int], path: str) -> dict[int, dict[str, int]]:
    """On a worker: evaluate ``indices`` and write each block's regions into the store at ``path``;
    returns {block: {variable: CRC32}} once the writes have returned."""
    import warnings

    group = open_group(path, "r+")
    out = {}
    with float64_scope(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="slimjax runs on one CPU device")  # one process per core is the plan
        for k, variables in evaluate_blocks(sweep, block_plan, indices):
            crcs = {}
            for name, (region, values) in variables.items():
                group[name][region] = values
                crcs[name] = values_crc(values)
            out[k] = crcs
    return out


def check_address(address: str, timeout_s: float = 3.0) -> None:
    """Refuse, before any work, a Dask scheduler address that is malformed or that nothing answers at."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or port is None:
        raise SlimjaxError("--dask-address", f"{address!r} is not a scheduler address like tcp://HOST:PORT")
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        raise SlimjaxError(
            "--dask-address",
            f"no Dask scheduler answers at {address!r} ({e.strerror or e}); start one "
            "(dask scheduler) or leave --dask-address out for a local cluster",
        ) from None


def _client(workers: int | None, address: str | None):
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise SlimjaxError(
            "scheduler", "dask is not installed: pip install 'slimjax[dask]' (dask[distributed])"
        ) from None
    if address:
        return Client(address), None
    n = workers or max(1, (os.cpu_count() or 2))
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
    return Client(cluster), cluster


def evaluate_on_dask(
    sweep: Sweep,
    block_plan: BlockPlan,
    sink: ZarrSink,
    *,
    workers: int | None = None,
    address: str | None = None,
    progress=None,
    tasks_per_worker: int = 4,
) -> None:
    """Every block not yet journaled in ``sink``, as tasks of a few blocks each, on a Dask cluster."""
    from dask.distributed import as_completed

    client, cluster = _client(workers, address)
    try:
        n_workers = max(1, len(client.scheduler_info().get("workers", {})) or (workers or 1))
        todo = [k for k in range(block_plan.n_blocks) if k not in sink.done]
        per_task = max(1, math.ceil(len(todo) / (n_workers * tasks_per_worker)))
        groups = [todo[i : i + per_task] for i in range(0, len(todo), per_task)]
        if progress is not None:
            progress.total = len(todo)
        remote = client.scatter(sweep, broadcast=True)
        futures = [client.submit(run_blocks, remote, block_plan, g, str(sink.tmp), pure=False) for g in groups]
        for future in as_completed(futures):
            for k, crcs in future.result().items():
                sink.record(k, crcs)
                if progress is not None:
                    progress.update(1)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
