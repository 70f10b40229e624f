"""Pipeline stages across nodes and the scale-out network (MODEL.md §10; slimjax's extension).

A group is n = n_tp · n_pp GPUs: tensor parallel over n_tp GPUs inside a node (§4c), n_pp stages of the layers.
vLLM splits L layers into n_pp stages of ⌊L/n_pp⌋ or ⌈L/n_pp⌉; §10 states the case n_pp | L. Where n_pp does
not divide L (DeepSeek-V3's 61 layers) the largest stage, ⌈L/n_pp⌉ layers, binds: its memory sets the KV pool and
its step sets the pipeline's cycle, so each stage is taken as that one (a fraction f = ⌈L/n_pp⌉/L of every
per-layer quantity; f = 1/n_pp exactly when n_pp | L, where everything below is §10 to the letter).

Memory per stage (§3 on a stage): weights f·M_W on n_tp GPUs, KV pool u·n_tp·M_VRAM − f·M_W − M_R holding the
stage's layers' KV, footprint f·footprint.

Timing (virtual engines): one step of one engine takes τ_pp = n_pp·τ_stage + (n_pp − 1)·t_net(n_tok·D·b_a), τ_stage
being §9's step time for f·L layers on n_tp GPUs with f·M_W(n_tok) weight bytes:

    n_pp·τ_stage = g·max(ops/F, bytes/BW) + n_pp·(t_l + t_step) + g·2·L·t_ar(n_tok·D·b_a),   g = n_pp·f

(ops and bytes those of the whole model on the n_tp GPUs; g = 1 when n_pp | L). So a pipelined group's step
is §9's step with F and BW divided by g, t_l and t_step multiplied by n_pp, the all-reduce by g, and the p2p
hops added: what :func:`pipeline_roof` does to the roofline terms, for the closed forms (§4) and the simulation.

Network: t_net(x) = τ_net + x / BW_net (per-GPU scale-out NIC, one direction). Seconds, bytes, bytes/s.
"""

from __future__ import annotations

import jax.numpy as jnp

from .parallel import ACTIVATION_BYTES

PP_DEGREES = (1.0, 2.0, 4.0, 8.0)  # the pipeline degrees `pp: auto` considers (§10)


def stage_layers(n_layers, pipeline_stages):
    """Layers of the largest stage, ⌈L/n_pp⌉ (L/n_pp when n_pp divides L)."""
    return jnp.ceil(n_layers / pipeline_stages)


def stage_fraction(n_layers, pipeline_stages):
    """f = ⌈L/n_pp⌉/L: the share of every per-layer quantity the largest stage holds (1 when n_pp = 1)."""
    return stage_layers(n_layers, pipeline_stages) / n_layers


def cycle_factor(n_layers, pipeline_stages):
    """g = n_pp·f: how much longer n_pp largest stages take than the whole model once (1 when n_pp | L)."""
    return pipeline_stages * stage_fraction(n_layers, pipeline_stages)


def network_time(message_bytes, network_bytes_per_s, network_latency_s):
    """t_net(x) = τ_net + x / BW_net, seconds (§10): one point-to-point transfer over the scale-out NIC."""
    return network_latency_s + message_bytes / network_bytes_per_s


def kv_transfer_time(kv_bytes, lanes, bandwidth_bytes_per_s, latency_s):
    """t_xfer = τ + (KV / lanes) / BW, seconds (§10 disaggregated serving): a prompt's KV moved from its prefill
    replica to its decode replica over ``lanes`` = min(n_p, n_d) GPU pairs at once, each at ``bandwidth_bytes_per_s``
    (the slower NIC of the two, or η_link·BW_link over NVLink) after the larger latency. Plain arithmetic:
    numpy in, numpy out."""
    return network_time(kv_bytes / lanes, bandwidth_bytes_per_s, latency_s)


def p2p_terms(hidden, pipeline_stages, network_bytes_per_s, network_latency_s):
    """(fixed, per_token) seconds with (n_pp − 1)·t_net(n_tok·D·b_a) = fixed + per_token·n_tok: the hops of one
    pass between consecutive stages (0 when n_pp = 1)."""
    hops = pipeline_stages - 1.0
    on = hops > 0
    safe_bw = jnp.where(network_bytes_per_s > 0, network_bytes_per_s, 1.0)
    fixed = jnp.where(on, hops * network_latency_s, 0.0)
    per_token = jnp.where(on, hops * hidden * ACTIVATION_BYTES / safe_bw, 0.0)
    return fixed, per_token


def pipeline_roof(roof, n_layers, hidden, pipeline_stages, network_bytes_per_s, network_latency_s):
    """The roofline terms (a :class:`slimjax.model.roofline.Roof`) of one engine step of a pipelined group from
    those of its n_tp-GPU tensor-parallel group (:func:`slimjax.model.calculator.roofline_terms`): F/g, BW/g,
    n_pp·t_l, g·(all-reduce) plus the p2p hops (module docstring). The identity when n_pp = 1."""
    g = cycle_factor(n_layers, pipeline_stages)
    fixed, per_token = p2p_terms(hidden, pipeline_stages, network_bytes_per_s, network_latency_s)
    return roof._replace(
        flops=roof.flops / g,
        bandwidth=roof.bandwidth / g,
        launch_overhead_s=pipeline_stages * roof.launch_overhead_s,
        comm_fixed_s=g * roof.comm_fixed_s + fixed,
        comm_per_token_s=g * roof.comm_per_token_s + per_token,
        comm_large_fixed_s=g * roof.comm_large_fixed_s + fixed,
        comm_large_per_token_s=g * roof.comm_large_per_token_s + per_token,
        expert_comm=tuple(
            line._replace(
                fixed_s=g * line.fixed_s,
                per_token_s=g * line.per_token_s,
                large_fixed_s=g * line.large_fixed_s,
                large_per_token_s=g * line.large_per_token_s,
            )
            for line in roof.expert_comm
        ),
    )


def engine_batch(batch, pipeline_stages):
    """Sequences one virtual engine holds at batch limit B in the closed forms: B/n_pp (§4 at the engine's batch;
    :func:`engine_batch_limit` in the simulation, which admits whole requests)."""
    return batch / pipeline_stages


def engine_batch_limit(batch, pipeline_stages):
    """⌊B/n_pp⌋: the requests one virtual engine admits at batch limit B (§10)."""
    return jnp.floor(batch / pipeline_stages)
