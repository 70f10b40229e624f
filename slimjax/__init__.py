"""slimjax: LLM-serving capacity planning over dense labeled grids, in JAX."""

import os as _os
import sys as _sys

# On the CPU, XLA runs one computation per device on one core. Unless the user chose otherwise
# (XLA_FLAGS, or SLIMJAX_CPU_DEVICES), expose one CPU device per core so the grid's blocks run in
# parallel. Only possible before jax is first imported; harmless on GPU hosts.
# XLA:CPU's YNNPACK reductions need their operand materialised; the loop emitter fuses B_cap's
# masked reductions with the grid arithmetic instead (about 3x faster here), so they are off too.
if "jax" not in _sys.modules:
    _flags = _os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        _n = _os.environ.get("SLIMJAX_CPU_DEVICES") or str(len(_os.sched_getaffinity(0)))
        _flags += f" --xla_force_host_platform_device_count={_n}"
    if "xla_cpu_experimental_ynn_fusion_type" not in _flags:
        _flags += " --xla_cpu_experimental_ynn_fusion_type="
    _os.environ["XLA_FLAGS"] = _flags.strip()

import jax as _jax  # noqa: E402

# float64 must be available for `precision: float64`; float32 sweeps cast their inputs explicitly.
_jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"

from .api import capacity, capacity_cards, point, summary, sweep  # noqa: E402
from .calibrate import calibrate, predict  # noqa: E402
from .errors import SlimjaxError  # noqa: E402
from .traces import load_traces  # noqa: E402
from .specs import GPUSpec, ModelSpec, SlimCoeffs  # noqa: E402

__all__ = ["calibrate", "predict", "load_traces", "sweep", "point", "summary", "capacity", "capacity_cards", "SlimjaxError", "ModelSpec", "GPUSpec", "SlimCoeffs", "__version__"]
