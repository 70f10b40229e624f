"""Names, choices, defaults and dates the package shares, each kept here once.

Standard library only: the command line builds its options and ``--help`` from these without importing
JAX (``import slimjax.constants`` loads nothing else, see the package's lazy ``__init__``). The floors
that own a concept import its table from here (``inputs.coefficients`` the variants, ``fit.validate`` the
methods, ``fit.folds`` the scenarios, …), so a new choice is one edit that the CLI follows.
"""

from __future__ import annotations

# Illustrative prices (configs/gpus.yaml's price_per_hour, the agents' API defaults) are as of this date.
PRICE_DATE = "2026-10-27"

# SLIM variants (MODEL.md §1 and the optional slim-kv form); "recommended" resolves to the one
# configs/slim/default.yaml names.
SLIM_VARIANTS = ("slim", "slim-kv")
RECOMMENDED = "recommended"
VARIANT_CHOICES = (*SLIM_VARIANTS, RECOMMENDED)

# Calibration: solvers, losses, interval kinds (fit.solver, fit.slim, fit.transfer).
SOLVER_NAMES = ("lm", "adam")
LOSSES = ("squared", "cauchy")
INTERVAL_KINDS = ("fit", "transfer")

# Validation (MODEL.md's generalisation study): methods scored and held-out scenarios.
VALIDATION_METHODS = ("slim", "slim-kv", "llmvisor-agg", "imai-ood-lr", "roofline")
SCENARIOS = ("same-curve", "model-transfer", "length-transfer", "gpu-transfer", "combined")

# Measured mode (MODEL.md §4): one operating point per (model, GPU).
MEASURED_KEYS = ("batch", "request_rate", "ttft_s", "itl_s")

# Agent graphs (MODEL.md §6): the API's default limits and prices (illustrative, dated PRICE_DATE).
API_DEFAULTS = {
    "rpm": 500.0,
    "tpm": 2_000_000.0,
    "service_s": 4.0,
    "parallelism": 16.0,
    "price_in_per_mtok": 3.0,
    "price_out_per_mtok": 15.0,
}

# Stores and schedulers.
COMPRESSIONS = ("none", "zstd")
SCHEDULERS = ("local", "dask")
# how a tensor-parallel group's GPUs are linked (MODEL.md §4c): switch (NVSwitch: the per-GPU figure whatever n),
# mesh (xGMI: one link of link_gbs to each peer, n − 1 of them in use), pcie (the host switch's per-GPU figure)
LINK_TOPOLOGIES = ("switch", "mesh", "pcie")
# how a §9 fleet deals arrivals to its replicas (prefix_affinity: where the longest cached prefix is)
ROUTERS = ("round_robin", "least_loaded", "prefix_affinity")
# what an engine does when its KV cache runs out (docs/engines.md), in code order (a policy's code is its place):
# reserve footprint(I + O) at admission (§9 as written; TensorRT-LLM's GUARANTEED_NO_EVICT), or allocate blocks as
# tokens are written and preempt by recomputation, the most recently admitted first (vLLM) or the fewest emitted
# tokens first (SGLang's retract)
KV_POLICIES = {
    "reserve": "KV reserved at admission, no preemption",
    "recompute": "paged KV, preemption by recomputation (latest admitted first)",
    "retract": "paged KV, preemption by recomputation (fewest emitted tokens first)",
}
# speculative decoding (docs/speculative.md), in code order (a method's code is its place): none, a DeepSeek-style
# multi-token-prediction module, an EAGLE head (each drafting with one layer of the target and its LM head), or a
# separate draft model
SPECULATIVE_METHODS = {
    "none": "no speculative decoding",
    "mtp": "multi-token prediction module (one layer of the target and its LM head)",
    "eagle": "EAGLE head (one layer of the target and its LM head)",
    "draft": "a separate draft model",
}
DEFAULT_MEMORY_BUDGET = "256MiB"

# The (I, O) summaries and figures show when none is asked for: the grid values nearest (in log) to a
# typical chat request.
TYPICAL_REQUEST = (1024, 256)


def parse_at(text: str) -> tuple[int, int]:
    """``"IL,OL"`` → (IL, OL); ValueError for anything else (the CLI's ``--at``)."""
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError(f"{text!r} is not IL,OL")
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"{text!r} is not IL,OL") from None
