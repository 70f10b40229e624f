"""What the simulation studies share: candidates flattened to lanes and their engine inputs, the request stream a
procurement workload sends at a rate, and the one table of why a simulated fleet has no size.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..config import float64_scope
from ..constants import KV_POLICIES
from ..engine import sim as engine
from ..errors import SlimjaxError
from ..model import batching as floor
from ..model.specs import GPUSpec, ModelSpec, ServingSpec

# why a candidate's simulated fleet is not feasible (checked in this order at max_replicas)
SIM_REASONS = ("feasible", "does_not_fit", "request_too_large", "ttft", "itl", "e2e")
REASON_CODE = {name: i for i, name in enumerate(SIM_REASONS)}


def flat_candidates(model: ModelSpec, gpu: GPUSpec, serving: ServingSpec, batch, shape):
    """Model (M,), GPU (G,) and serving (M, G, N[, P]) specs and batch limits (B,) broadcast to ``shape``
    ((M, G, N[, P], B)), then flattened to K candidates: (model, gpu, serving, batch) with leaves (K,)."""
    lead = len(shape) - 3  # the group axes after model and GPU

    def flat(x, index):
        return np.broadcast_to(np.asarray(x, float)[index], shape).reshape(-1)

    at_model = (slice(None), *(None,) * (len(shape) - 1))
    at_gpu = (None, slice(None), *(None,) * (len(shape) - 2))
    at_group, at_batch = (..., None), (*(None,) * (2 + lead), slice(None))
    model = ModelSpec(**{f.name: flat(getattr(model, f.name), at_model) for f in dataclasses.fields(ModelSpec)})
    gpu = GPUSpec(**{k: flat(v, at_gpu) for k, v in gpu.fields().items()})
    serving = ServingSpec(**{k: flat(v, at_group) for k, v in serving.fields().items()})
    return model, gpu, serving, flat(batch, at_batch)


def candidate_inputs(model, gpu, serving, stream, dtype):
    """(terms, footprint (K, N), fits (K,)) for flattened candidate specs on a stream's requests (its
    ``input_len`` and ``output_len``), in ``dtype``."""
    with float64_scope():
        terms = floor.replica_terms(model, gpu, serving)
        tokens = jnp.asarray(stream.input_len + stream.output_len, jnp.float64)
        footprint = np.asarray(
            floor.request_footprint_bytes(
                jax.tree_util.tree_map(lambda x: jnp.asarray(x)[:, None], model),
                jax.tree_util.tree_map(lambda x: jnp.asarray(x)[:, None], serving),
                tokens[None, :],
            )
        )
        terms = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), terms)
        prefix = getattr(stream, "prefix", None)
        if prefix is not None:
            terms.update(prefix_terms(model, serving, prefix.block_tokens))
    pool = terms["pool"]
    stages = np.asarray(serving.pipeline_stages)
    fits = (pool > 0) & (np.mod(np.asarray(model.n_heads), np.asarray(serving.n_gpu)) == 0)
    fits = fits & (stages <= np.asarray(model.n_layers))
    terms = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype), terms)
    return terms, footprint.astype(dtype), fits


def prefix_terms(model, serving, block_tokens: int) -> dict:
    """A prefix cache's lane terms (docs/simulation.md) for flattened candidates on a stream whose prompts' blocks are
    of ``block_tokens`` h tokens: ``prefix_block_tokens`` (h where the candidate caches, else 0) and
    ``prefix_block_bytes`` (footprint(h), every layer). A candidate caches where ``prefix_cache`` is 1, its KV is
    reserved at admission, its model has no sliding-window layers and its group one pipeline stage; the rules are
    written for these (:func:`prefix_cache_off` says why not elsewhere)."""
    on = np.asarray(serving.prefix_cache) > 0
    on = on & np.asarray(prefix_cache_off(model, serving) == "")
    block = np.asarray(serving.block_size, np.float64)
    bad = on & (np.mod(block_tokens, block) != 0)
    if bad.any():
        raise SlimjaxError(
            "serving.block_size",
            f"{block[bad][0]:g} tokens does not divide the stream's prompt block of {block_tokens} tokens "
            "(hash_block_tokens): the prefix cache keeps whole KV blocks; give a block size that divides it",
        )
    h = jnp.asarray(float(block_tokens), jnp.float64)
    nbytes = floor.request_footprint_bytes(model, serving, h)
    return {
        "prefix_block_tokens": np.where(on, float(block_tokens), 0.0),
        "prefix_block_bytes": np.broadcast_to(np.asarray(nbytes, np.float64), on.shape).copy(),
    }


def prefix_cache_off(model, serving) -> np.ndarray:
    """Per flattened candidate, why its prefix cache is not simulated ("" where it is): the cache's rules are written
    for KV reserved at admission, full-attention layers and one pipeline stage (docs/simulation.md)."""
    policy = np.asarray(serving.kv_policy)
    why = np.where(policy != list(KV_POLICIES).index("reserve"), "paged KV (the cache is simulated under reserve)", "")
    why = np.where(np.asarray(model.n_sliding_layers) > 0, "sliding-window layers", why)
    return np.where(np.asarray(serving.pipeline_stages) > 1, "pipeline stages", why)


def prefix_cache_text(model, serving, block_tokens: int) -> str:
    """One line saying how flattened candidates cache their stream's prompt prefixes, and which do not and why."""
    off = np.where(np.asarray(serving.prefix_cache) > 0, prefix_cache_off(model, serving), "prefix_cache: 0")
    text = (
        f"prefix cache: per replica, blocks of {block_tokens} prompt tokens, the least recently freed evicted first "
        "(docs/simulation.md)"
    )
    if (off == "").all():
        return text
    reasons = ", ".join(f"{why} ({int(np.sum(off == why))})" for why in np.unique(off[off != ""]))
    return f"{text}; candidates without it: {reasons}" if (off == "").any() else f"prefix cache: none ({reasons})"


def check_requests_fit(footprint, pool, fits, labels, stream, terms=None) -> None:
    """Every request fits an empty replica of every candidate that runs: footprint(I + O) ≤ pool, and under a paged
    KV policy (``terms``' kv_* entries, docs/engines.md) its prompt's blocks with the admission watermark too."""

    def refuse(where, why):
        if where.any():
            k, i = np.argwhere(where)[0]
            raise SlimjaxError(f"stream request {i}", f"{why(k, i)}: no replica can ever admit it ({labels(k)})")

    refuse(
        fits[:, None] & (footprint > pool[:, None]),
        lambda k, i: (
            f"its footprint for I + O = {stream.input_len[i] + stream.output_len[i]:g} tokens "
            f"({footprint[k, i] / 2**30:.3g} GiB) exceeds the whole KV pool ({pool[k] / 2**30:.3g} GiB); shorten "
            "it, or give more GPUs/memory"
        ),
    )
    if terms is not None and "kv_policy" in terms:
        units, watermark, pool_units = engine.prompt_units(terms, stream.input_len)
        refuse(
            (fits & engine.paged(terms))[:, None] & (units + watermark[:, None] > pool_units[:, None]),
            lambda k, i: (
                f"its prompt of {stream.input_len[i]:g} tokens needs {units[k, i]:g} KV layer-blocks and "
                f"the admission watermark (serving.kv_watermark) {watermark[k]:g} more, beyond the "
                f"{pool_units[k]:g} of the pool; lower the watermark, shorten it, or give more GPUs/memory"
            ),
        )


def workload_stream(workload, total_rate: float, sizing: dict, members=None) -> dict:
    """The request stream a workload sends at total rate Λ (seconds from 0, sorted): a trace's own timestamps
    time-compressed by Λ_tr/Λ; without timestamps a seeded Poisson stream at Λ over its lengths (a fixed-length
    workload: ``requests`` of them). ``members``: only those trace requests (a class alone), at the same
    compression (so at ≈ w_k·Λ)."""
    trace = workload.trace
    rng = np.random.default_rng(sizing["seed"])
    if trace is None:
        n = sizing["requests"]
        i_len = np.full(n, float(workload.classes.input_len[0]))
        o_len = np.full(n, float(workload.classes.output_len[0]))
        arrival = None
    else:
        keep = np.arange(trace.n_requests) if members is None else np.asarray(members)
        i_len, o_len = trace.input_len[keep].astype(float), trace.output_len[keep].astype(float)
        arrival = None if trace.arrival_s is None else trace.arrival_s[keep] * (workload.trace_rate / total_rate)
        if members is not None and arrival is None:
            total_rate = total_rate * len(keep) / trace.n_requests
    if arrival is None:
        gaps = rng.exponential(1.0 / total_rate, len(i_len))
        arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    arrival = arrival - arrival[0]
    return {"arrival_s": arrival, "input_len": i_len, "output_len": o_len}


def workload_prefix(workload, members=None):
    """(chain ids (n, H), h) of the prompts :func:`workload_stream` sends, in its order (``members``: a class's), or
    None where the workload's trace gives no block hashes."""
    if getattr(workload, "prefix", None) is None:
        return None
    chains = workload.prefix.padded()
    return (chains if members is None else chains[np.asarray(members)], workload.prefix.block_tokens)
