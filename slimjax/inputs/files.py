"""Spec files (sweep, simulation, procurement study) read and checked before anything heavy loads: the YAML, its
top-level keys, the required ones and the lists that must not be empty. Imports only the standard library, PyYAML
and :mod:`slimjax.errors`, so the command line answers a bad file before JAX, xarray and zarr load (each command
checks its file first, then starts the library, which reads it again through :func:`read_spec_file`).

A YAML syntax error is one line, ``FILE:LINE:COLUMN: not valid YAML: what (while …, begun at LINE:COLUMN)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import yaml

from ..errors import SlimjaxError, suggest


class FileKind(NamedTuple):
    """One kind of spec file: what the messages call it, its top-level keys, those it needs (``needs`` says so in
    words) and the lists among them that must not be empty."""

    what: str
    keys: tuple[str, ...]
    required: tuple[str, ...]
    needs: str
    lists: tuple[str, ...] = ("models", "gpus")


SWEEP_REQUIRED = ("models", "gpus", "batch", "input_len", "output_len")
SWEEP_OPTIONAL = ("slim", "slim_variant", "advisor", "precision", "serving", "arrival_rate", "measured", "agents")
# what a simulation and a procurement study both take: the candidates' models, GPUs, layouts, batches and engine
CANDIDATE_KEYS = ("models", "gpus", "tp", "layouts", "pp", "batch", "serving", "settings", "disaggregated")
SIMULATION_REQUIRED = ("models", "gpus", "batch", "stream")
STUDY_REQUIRED = ("workloads", "models", "gpus", "slo")

# every kind of spec file, by the name its reader and the command line use
FILE_KINDS = {
    "sweep": FileKind(
        "sweep file", (*SWEEP_REQUIRED, *SWEEP_OPTIONAL), SWEEP_REQUIRED, f"a sweep needs {', '.join(SWEEP_REQUIRED)}"
    ),
    "simulation": FileKind(
        "simulation file",
        (*CANDIDATE_KEYS, "replicas", "router", "precision", "stream"),
        SIMULATION_REQUIRED,
        f"a simulation needs {', '.join(SIMULATION_REQUIRED)}",
    ),
    "study": FileKind(
        "study file",
        ("workloads", "rates", "rate_scale", *CANDIDATE_KEYS, "slo", "measured", "prices", "sizing"),
        STUDY_REQUIRED,
        f"a study needs {', '.join(STUDY_REQUIRED)} and rates and/or rate_scale",
        ("workloads", "models", "gpus"),
    ),
}


def _yaml_error(path: Path, e: yaml.YAMLError) -> SlimjaxError:
    """One line naming the file, line and column (1-based) of a YAML syntax error."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, begun = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and begun is not None and begun is not mark:
        problem += f" ({context}, begun at {begun.line + 1}:{begun.column + 1})"
    return SlimjaxError(where, f"not valid YAML: {problem}")


def load_spec(spec, kind: str = "sweep") -> tuple[dict, str, Path | None]:
    """(the spec mapping, its source label, the folder its relative paths are read from) of a path or a mapping;
    unreadable files, bad YAML and anything but a mapping are one-line errors naming the file."""
    what = FILE_KINDS[kind]
    if isinstance(spec, Mapping):
        return dict(spec), "<dict>", None
    path = Path(spec)
    try:
        text = path.read_text()
    except OSError as e:
        raise SlimjaxError(what.what, f"cannot read {str(path)!r} ({e.strerror})") from None
    except UnicodeDecodeError:
        raise SlimjaxError(what.what, f"{str(path)!r} is not a text file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None
    if not isinstance(data, Mapping):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SlimjaxError(what.what, f"{str(path)!r} must hold a mapping of {', '.join(what.required)}, got {got}")
    return dict(data), str(path), path.parent


def read_spec_file(spec, kind: str) -> tuple[dict, str, Path | None]:
    """:func:`load_spec` with the kind's top-level keys checked (:data:`FILE_KINDS`): an unknown key, a missing
    required one or an empty list is an error naming the key."""
    what = FILE_KINDS[kind]
    data, source, base_dir = load_spec(spec, kind)
    unknown = [k for k in data if k not in what.keys]
    if unknown:
        raise SlimjaxError(str(unknown[0]), f"unknown top-level key{suggest(str(unknown[0]), what.keys)}")
    for key in what.required:
        if data.get(key) is None:
            raise SlimjaxError(key, f"missing ({what.needs})")
    for key in what.lists:
        if not isinstance(data[key], list) or not data[key]:
            raise SlimjaxError(key, f"must be a non-empty list, got {data[key]!r}")
    return data, source, base_dir
