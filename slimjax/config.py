"""Explicit JAX set-up. Importing slimjax changes nothing; :func:`configure` is opt-in (the CLI, the
benchmarks and the tests call it), and the library's entry points enable float64 only inside their own
calls (:func:`float64_scope`), so a host program's JAX settings stay its own."""

from __future__ import annotations

import functools
import os
import warnings

import jax

# XLA:CPU's YNNPACK reductions need their operand materialised; the loop emitter fuses B_cap's masked
# reductions with the grid arithmetic instead (about 3x faster here, bench/RESULTS.md).
_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="
# One object per compiled module instead of one per kernel: the serving simulation's while loop is ~150
# kernels, each mapped apart (code, constants, data), so a study's few hundred loop shapes on two devices ran
# out of the kernel's 65,530 memory maps ("LLVM ERROR: Unable to allocate section memory"); this halves the maps
# per executable, at equal speed and bit-identical results (bench/RESULTS.md).
_COMPACT_CODEGEN = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
_DEVICE_COUNT_FLAG = "xla_force_host_platform_device_count"


def cpu_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _backends_initialized() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def configure(cpu_devices: int | None = None, x64: bool = True) -> dict:
    """Set up JAX for slimjax's workloads, once, before JAX first runs anything.

    ``cpu_devices``: XLA CPU devices to expose (default: $SLIMJAX_CPU_DEVICES, else one per core), so
    grid blocks and calibration groups run on every core; ``x64``: make float64 available process-wide
    (``precision: float64`` sweeps and the capacity arithmetic enable it inside their own calls anyway).
    Also turns XLA:CPU's YNNPACK fusions off and compiles each module as one object (see above) unless
    XLA_FLAGS already names those flags. The device
    count and flags only take effect before JAX creates its CPU backend: called later, they are left as
    they are and a warning says so. Returns the settings in force.
    """
    if cpu_devices is None:
        env = os.environ.get("SLIMJAX_CPU_DEVICES")
        cpu_devices = int(env) if env else cpu_cores()
    if isinstance(cpu_devices, bool) or not isinstance(cpu_devices, int) or cpu_devices < 1:
        from .errors import SlimjaxError

        raise SlimjaxError("cpu_devices", f"must be a positive integer, got {cpu_devices!r}")
    jax.config.update("jax_enable_x64", bool(x64))
    if _backends_initialized():
        if len(jax.devices("cpu")) != cpu_devices:
            warnings.warn(
                f"slimjax.configure(cpu_devices={cpu_devices}) came after JAX started its CPU backend "
                f"({len(jax.devices('cpu'))} device(s)); call it before any JAX computation",
                stacklevel=2,
            )
    else:
        flags = os.environ.get("XLA_FLAGS", "")
        extra = [] if "xla_cpu_experimental_ynn_fusion_type" in flags else [_YNN_OFF]
        extra += [f for f in _COMPACT_CODEGEN if f.split("=")[0] not in flags]  # the user's own XLA_FLAGS win
        os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()
        if _DEVICE_COUNT_FLAG not in flags:  # the user's own XLA_FLAGS win
            jax.config.update("jax_num_cpu_devices", cpu_devices)
    return {
        "cpu_devices": len(jax.devices("cpu")) if _backends_initialized() else cpu_devices,
        "x64": bool(jax.config.jax_enable_x64),
    }


def float64_scope():
    """Context in which float64 arrays are float64 (capacity arithmetic, calibration), whatever the
    process-wide setting; entry points wrap their work in it."""
    return jax.enable_x64(True)


def warn_if_one_cpu_device(devices) -> None:
    """A sweep on one CPU device of a multi-core machine uses one core: say how to use them all."""
    if len(devices) == 1 and devices[0].platform == "cpu" and cpu_cores() > 1 and len(jax.devices()) == 1:
        warnings.warn(
            f"slimjax runs on one CPU device of {cpu_cores()} cores; call slimjax.configure() before "
            "JAX starts (or set SLIMJAX_CPU_DEVICES) to use them all",
            RuntimeWarning,
            stacklevel=3,
        )


def uses_float64(fn):
    """Run ``fn`` inside :func:`float64_scope` (for entry points whose arithmetic is float64)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with float64_scope():
            return fn(*args, **kwargs)

    return wrapper
