"""slimjax: LLM-serving capacity planning over dense labeled grids, in JAX."""

import jax as _jax

# float64 must be available for `precision: float64`; float32 sweeps cast their inputs explicitly.
_jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"

from .api import sweep  # noqa: E402
from .errors import SlimjaxError  # noqa: E402
from .specs import GPUSpec, ModelSpec, SlimCoeffs  # noqa: E402

__all__ = ["sweep", "SlimjaxError", "ModelSpec", "GPUSpec", "SlimCoeffs", "__version__"]
