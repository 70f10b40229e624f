"""Every kind of spec file read and checked in full with JAX loaded but not xarray, zarr or the engine: what the
command line does before a command runs, so a bad value answers in under 2 s (the YAML and its keys were checked
before JAX loaded, :mod:`slimjax.inputs.files`). The command then runs on what was read: nothing is read twice."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ..inputs import sweepfile
from ..inputs.coefficients import StoredCoefficients, StoreRef
from .present import deferred


def stored_coefficients(ref: StoreRef, models: list[str], gpus: list[str]) -> StoredCoefficients:
    """A sweep's ``slim`` coefficients from a calibration store; the store floor (zarr) loads only when a sweep names
    one."""
    from ..store.coefficients import read_for_sweep

    return read_for_sweep(ref, models, gpus)


def read_sweep(spec: str | os.PathLike | Mapping) -> sweepfile.Sweep:
    """A sweep file (path) or mapping, validated, with its coefficient store read where ``slim`` names one."""
    return sweepfile.parse(spec, read_store=stored_coefficients)


# each kind of spec file (inputs.files.FILE_KINDS) and the reader that validates it in full
# (a study's reader loads with its package: a sweep's check does not load pandas for the traces it does not read)
SPEC_READERS: dict[str, Callable] = {
    "sweep": read_sweep,
    "simulation": deferred(f"{__package__}.simulate", "parse"),
    "study": deferred(f"{__package__}.procure", "parse"),
}


def read_spec(spec: str | os.PathLike | Mapping, kind: str):
    """The spec file ``spec`` of ``kind`` (a key of :data:`SPEC_READERS`) read and validated: a Sweep, a Simulation
    or a Study, as the command of that kind takes it."""
    return SPEC_READERS[kind](spec)
