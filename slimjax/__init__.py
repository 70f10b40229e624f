"""slimjax: LLM-serving capacity planning over dense labeled grids, in JAX.

Importing slimjax changes no process-wide setting. Call :func:`slimjax.configure` once, before JAX
runs anything, to use one XLA CPU device per core and make float64 available process-wide (the
command line and the benchmarks do); the entry points enable float64 inside their own calls anyway.

Floors, each importing only those below it: ``model`` (MODEL.md's formulas and specs) < ``inputs``
(catalogs, sweep files, traces) < ``engine`` (schema, groups, block plan, dispatch, grid) < ``store``
(zarr) < ``fit`` (calibration, validation) < ``studies`` (procurement, the advisor evaluation) < ``report`` (figures,
the HTML page) < ``api`` / ``cli``.
"""

from ._version import __version__

# What ``slimjax.X`` resolves to, imported on first use: importing slimjax (or the JAX-free
# ``slimjax.constants`` the command line reads) loads no floor and starts no JAX.
_EXPORTS = {
    "configure": "config",
    "read_spec_file": "inputs.files",
    "read_spec": "studies.specs",
    "calibrate": "fit.slim",
    "calibrate_roofline": "fit.roofline",
    "calibrate_serving": "fit.serving",
    "predict": "fit.slim",
    "load_traces": "inputs.traces",
    "sweep": "api",
    "parse": "api",
    "point": "api",
    "summary": "api",
    "capacity": "api",
    "capacity_cards": "api",
    "procure": "api",
    "procure_tables": "api",
    "simulate": "api",
    "simulation_table": "api",
    "advise": "api",
    "agent": "api",
    "agent_cards": "api",
    "make_report": "api",
    "SlimjaxError": "errors",
    "ModelSpec": "model.specs",
    "GPUSpec": "model.specs",
    "ServingSpec": "model.specs",
    "SlimCoeffs": "model.specs",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    import importlib

    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    try:  # a floor or module: slimjax.api, slimjax.config, …
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
    return sorted([*globals(), *_EXPORTS])
