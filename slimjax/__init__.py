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
from .api import (
    advise,
    agent,
    agent_cards,
    capacity,
    capacity_cards,
    make_report,
    parse,
    point,
    procure,
    procure_tables,
    summary,
    sweep,
)
from .config import configure
from .errors import SlimjaxError
from .fit.roofline import calibrate_roofline
from .fit.slim import calibrate, predict
from .inputs.traces import load_traces
from .model.specs import GPUSpec, ModelSpec, ServingSpec, SlimCoeffs

__all__ = [
    "configure",
    "calibrate",
    "calibrate_roofline",
    "predict",
    "load_traces",
    "sweep",
    "parse",
    "point",
    "summary",
    "capacity",
    "capacity_cards",
    "procure",
    "procure_tables",
    "advise",
    "agent",
    "agent_cards",
    "make_report",
    "SlimjaxError",
    "ModelSpec",
    "GPUSpec",
    "ServingSpec",
    "SlimCoeffs",
    "__version__",
]
