"""Roofline prefill and decode timing and the service proxy (MODEL.md §4; source 001 "Roofline").

Every sum over prefill chunks or decode steps is evaluated in closed form: each step's time is
max(compute, bandwidth) + t_l with both terms linear in the step index, piecewise at the sliding-window
crossover, so a sum is a few arithmetic series split where the two lines cross. A one-token chunk
size or O = 100 000 costs the same as one chunk. Pure functions of broadcastable arrays; seconds.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from .experts import expert_imbalance, weights_read_bytes
from .memory import kv_read_bytes


class Roof(NamedTuple):
    """What a roofline step time needs of one group (§4, §4b, §4c; :func:`slimjax.model.calculator.roofline_terms`
    makes it): active parameters P_act, the weight bytes M_W and the routed experts' share of them, the KV bytes
    per token of full and sliding layers (r·o·e_kv·L_f, r·o·e_kv·L_s) and the window W, the group's FLOP/s and
    bytes/s (efficiencies applied), t_l, and the all-reduce as fixed + per-token seconds. Broadcastable arrays."""

    active_params: Any
    weights: Any
    routed_expert_bytes: Any
    n_experts: Any
    experts_per_token: Any
    kv_per_token_full: Any
    kv_per_token_sliding: Any
    window: Any
    flops: Any
    bandwidth: Any
    launch_overhead_s: Any
    comm_fixed_s: Any = 0.0
    comm_per_token_s: Any = 0.0
    # a measured link's second protocol (slimjax.model.parallel.tp_comm_segments): from this many tokens on
    comm_switch_tokens: Any = float("inf")
    comm_large_fixed_s: Any = 0.0
    comm_large_per_token_s: Any = 0.0
    # attention data parallel and expert parallel (docs/layouts.md; D = ep = 1 leaves every formula as it was): the
    # group's D ranks (each a pass of its own tokens on n_tp GPUs), its ep expert ranks, the routing skew ι_0, the
    # routed experts' weights L_moe·P_e, and the layout's further communication lines of a pass (CommLine each)
    dp_ranks: Any = 1.0
    expert_ranks: Any = 1.0
    expert_skew: Any = 1.0
    routed_expert_params: Any = 0.0
    expert_comm: Any = ()
    # the experts' grouped GEMMs at a fraction of the dense GEMMs' achieved FLOP/s and bandwidth (docs/layouts.md)
    expert_compute_efficiency: Any = 1.0
    expert_bandwidth_efficiency: Any = 1.0
    # c(ep), the expected largest of ep standard normals (experts.expected_max_standard_normal), once per group
    # (None: computed where the imbalance is)
    expert_max_normal: Any = None


class CommLine(NamedTuple):
    """A pass's communication as fixed + per_token·tokens below ``switch_tokens`` and large_fixed +
    large_per_token·tokens from it (two protocols of a measured collective; one line: switch ∞), seconds."""

    fixed_s: Any
    per_token_s: Any
    switch_tokens: Any
    large_fixed_s: Any
    large_per_token_s: Any


def line_s(line: CommLine, tokens):
    """One :class:`CommLine` at ``tokens``, seconds."""
    return jnp.where(
        tokens < line.switch_tokens,
        line.fixed_s + line.per_token_s * tokens,
        line.large_fixed_s + line.large_per_token_s * tokens,
    )


def comm_s(roof: Roof, tokens):
    """2·L·t_ar(tokens·D·b_a) (+ a pipeline's hops) of one pass of ``tokens`` tokens, seconds: ``comm_fixed_s`` +
    ``comm_per_token_s``·tokens, or the large protocol's line from ``comm_switch_tokens`` on (§4c, measured link);
    plus a layout's own lines (``expert_comm``: the all-to-all and the experts' all-reduce, docs/layouts.md)."""
    base = jnp.where(
        tokens < roof.comm_switch_tokens,
        roof.comm_fixed_s + roof.comm_per_token_s * tokens,
        roof.comm_large_fixed_s + roof.comm_large_per_token_s * tokens,
    )
    for line in roof.expert_comm:
        base = base + line_s(line, tokens)
    return base


def pass_weights_bytes(roof: Roof, tokens):
    """M_W(n) of one pass of n tokens (§4b), on a rank of a data-parallel group its share of the experts all D ranks'
    tokens touch (:func:`slimjax.model.experts.weights_read_bytes`), bytes."""
    return weights_read_bytes(
        tokens,
        roof.weights,
        roof.routed_expert_bytes,
        roof.n_experts,
        roof.experts_per_token,
        roof.dp_ranks,
        roof.expert_bandwidth_efficiency,
    )


def pass_active_params(roof: Roof, tokens):
    """P_act of one pass of n tokens: §4b's, with the routed experts' k·L_moe·P_e at the busiest expert rank's load,
    ι(D·n) times the mean (:func:`slimjax.model.experts.expert_imbalance`; ι = 1 without expert parallelism), and at
    1/e_XF where the experts' grouped GEMMs reach a fraction e_XF of the dense GEMMs' FLOP/s
    (``expert_compute_efficiency``; docs/layouts.md)."""
    load = expert_imbalance(
        roof.dp_ranks * tokens,
        roof.n_experts,
        roof.experts_per_token,
        roof.expert_ranks,
        roof.expert_skew,
        roof.expert_max_normal,
    )
    scale = load / roof.expert_compute_efficiency
    return roof.active_params + (scale - 1.0) * roof.experts_per_token * roof.routed_expert_params


def _series(a, b, lo, hi):
    """Σ_{k=lo..hi} (a + b·k), 0 when hi < lo."""
    count = jnp.maximum(hi - lo + 1.0, 0.0)
    return jnp.where(count > 0, count * a + b * (lo + hi) * count / 2.0, 0.0)


class MaxOfLines(NamedTuple):
    """max(a1 + b1·k, a2 + b2·k) as its two pieces: the lower line before ``split`` (the first k at which the higher
    one leads, before any range clips it), the higher from there; ``flat``: the lines are parallel (one leads
    throughout). What does not depend on the range summed over."""

    low_a: Any
    low_b: Any
    high_a: Any
    high_b: Any
    split: Any
    flat: Any


def max_of_lines(a1, b1, a2, b2) -> MaxOfLines:
    """The pieces of max(a1 + b1·k, a2 + b2·k): two lines cross at most once."""
    da, db = a1 - a2, b1 - b2
    safe = jnp.where(db == 0, 1.0, db)
    cross = -da / safe
    rising = db > 0  # line 1 wins after the crossing
    split = jnp.where(rising, jnp.ceil(cross), jnp.floor(cross) + 1.0)
    line1_high = jnp.where(db == 0, da >= 0, rising)
    low_a, low_b = jnp.where(line1_high, a2, a1), jnp.where(line1_high, b2, b1)
    high_a, high_b = jnp.where(line1_high, a1, a2), jnp.where(line1_high, b1, b2)
    return MaxOfLines(low_a, low_b, high_a, high_b, split, db == 0)


def sum_max_of_lines(lines: MaxOfLines, lo, hi):
    """Σ_{k=lo..hi} of :func:`max_of_lines`' max in closed form (0 when hi < lo): one arithmetic series per piece."""
    split = jnp.where(lines.flat, lo, jnp.clip(lines.split, lo, jnp.maximum(hi + 1.0, lo)))
    return _series(lines.low_a, lines.low_b, lo, split - 1.0) + _series(lines.high_a, lines.high_b, split, hi)


def sum_max_linear(a1, b1, a2, b2, lo, hi):
    """Σ_{k=lo..hi} max(a1 + b1·k, a2 + b2·k) in closed form (0 when hi < lo).

    Two lines cross at most once, so the range splits at the crossing into one arithmetic series
    per line.
    """
    return sum_max_of_lines(max_of_lines(a1, b1, a2, b2), lo, hi)


def max_max_linear(a1, b1, a2, b2, lo, hi):
    """max_{k=lo..hi} max(a1 + b1·k, a2 + b2·k): convex, so at an end (−inf when hi < lo)."""
    ends = jnp.maximum(jnp.maximum(a1 + b1 * lo, a2 + b2 * lo), jnp.maximum(a1 + b1 * hi, a2 + b2 * hi))
    return jnp.where(hi >= lo, ends, -jnp.inf)


def attention_flops_coefficient(n_layers, n_heads, head_dim):
    """a = 4·L·H_q·d_h: attention FLOPs per (query token × context token), full context on every layer
    (conventional attention; MLA's are :func:`slimjax.model.experts.attention_flops_coefficients`)."""
    return 4.0 * n_layers * n_heads * head_dim


def prefill_pass_work(active_params, attn, weights, kv_per_token, input_len):
    """(FLOPs, bytes read) of one prompt's prefill as one pass: 2·P_act·I + a·I²/2 and M_W + K·I (§4), with
    ``attn`` = a_pre and ``kv_per_token`` the KV bytes one token writes over every layer."""
    return 2.0 * active_params * input_len + attn * input_len**2 / 2.0, weights + kv_per_token * input_len


def decode_step_work(batch, active_params, attn, weights, kv_per_token, context):
    """(FLOPs, bytes read) of one decode step at concurrency B and context T (§4): B·(2·P_act + a·T) and
    M_W + B·K·T, with ``attn`` = a_dec."""
    return batch * (2.0 * active_params + attn * context), weights + batch * kv_per_token * context


def chunk_count(input_len, chunk_size):
    """K_c = ⌈I/s⌉, one chunk when s = 0 or s ≥ I; and the effective chunk size."""
    s = jnp.where((chunk_size <= 0) | (chunk_size >= input_len), input_len, chunk_size)
    return jnp.ceil(input_len / s), s


def prefill_time(input_len, chunk_size, roof: Roof, attn):
    """Prefill of one prompt in chunks (§4, §4b, §4c): returns (t_pre, t_chunk_max, K_c), seconds.

    Chunk k has p_k = k·s earlier tokens and n_k = min(s, I − p_k) new ones;
    t_k = max((2·P_act·n_k + a·(n_k·p_k + n_k²/2))/F, (M_W(n_k) + K(p_k))/BW) + t_l + 2·L·t_ar(n_k·D·b_a),
    with ``attn`` = a_pre, M_W(n) the MoE weight read (:func:`weights_read_bytes`; = M_W for dense) and the
    all-reduce as ``comm_fixed_s`` + ``comm_per_token_s``·n_k (:class:`Roof`). ``kv_per_token_full`` = r·o·e_kv·L_f
    and ``kv_per_token_sliding`` = r·o·e_kv·L_s, so K(T) = full·T + sliding·min(T, W). Full chunks are summed in
    closed form on both sides of the window crossover; the last, shorter chunk is added apart.
    """
    flops, bandwidth = roof.flops, roof.bandwidth
    kv_per_token_full, kv_per_token_sliding, window = roof.kv_per_token_full, roof.kv_per_token_sliding, roof.window
    launch_overhead_s = roof.launch_overhead_s
    k_c, s = chunk_count(input_len, chunk_size)
    last = k_c - 1.0
    w_full = pass_weights_bytes(roof, s)
    # full chunks k = 0 … K_c − 2: compute a1 + b1·k; bandwidth a2 + b2·k (inside the window) or a3 + b3·k
    a1 = (2.0 * pass_active_params(roof, s) * s + attn * s * s / 2.0) / flops
    b1 = attn * s * s / flops
    a2 = w_full / bandwidth
    b2 = (kv_per_token_full + kv_per_token_sliding) * s / bandwidth
    tail = jnp.where(kv_per_token_sliding > 0, kv_per_token_sliding * window, 0.0)
    a3 = (w_full + tail) / bandwidth
    b3 = kv_per_token_full * s / bandwidth
    k_window = jnp.floor(window / s)  # chunks whose prefix fits the window: k·s ≤ W
    in_hi = jnp.minimum(last - 1.0, k_window)
    out_lo = jnp.clip(k_window + 1.0, 0.0, last)  # = last (an empty range) when W = inf
    comm_full = comm_s(roof, s)
    total = (
        sum_max_linear(a1, b1, a2, b2, 0.0, in_hi)
        + sum_max_linear(a1, b1, a3, b3, out_lo, last - 1.0)
        + last * comm_full
    )
    longest = (
        jnp.maximum(max_max_linear(a1, b1, a2, b2, 0.0, in_hi), max_max_linear(a1, b1, a3, b3, out_lo, last - 1.0))
        + comm_full
    )
    # the last chunk
    p = last * s
    n = input_len - p
    ops = 2.0 * pass_active_params(roof, n) * n + attn * (n * p + n * n / 2.0)
    kv = kv_read_bytes(p, kv_per_token_full, kv_per_token_sliding, window)
    w_last = pass_weights_bytes(roof, n)
    t_last = jnp.maximum(ops / flops, (w_last + kv) / bandwidth) + comm_s(roof, n)
    t_pre = total + t_last + k_c * launch_overhead_s
    t_chunk_max = jnp.maximum(longest, t_last) + launch_overhead_s
    return t_pre, t_chunk_max, k_c


class DecodeSteps(NamedTuple):
    """What a decode's step times at concurrency B and prompt I are, before the number of steps: the step time's two
    pieces inside the sliding window and past it (:class:`MaxOfLines` in the step j), the window's last step
    (W − I) and the per-step launch and communication times (§4, :func:`decode_itl`)."""

    in_window: MaxOfLines
    past_window: MaxOfLines
    j_window: Any
    launch_s: Any
    comm_s: Any


def decode_steps(batch, input_len, roof: Roof, attn) -> DecodeSteps:
    """:class:`DecodeSteps` of B sequences with I-token prompts (``attn`` = a_dec): step j decodes at context
    T_j = I + j, t_j = max(B·(2·P_act + a·T_j)/F, (M_W(B) + B·K(T_j))/BW), K split at the window."""
    flops, bandwidth = roof.flops, roof.bandwidth
    kv_per_token_full, kv_per_token_sliding, window = roof.kv_per_token_full, roof.kv_per_token_sliding, roof.window
    w_step = pass_weights_bytes(roof, batch)
    a1 = batch * (2.0 * pass_active_params(roof, batch) + attn * input_len) / flops
    b1 = batch * attn / flops
    per_token = kv_per_token_full + kv_per_token_sliding
    a2 = (w_step + batch * per_token * input_len) / bandwidth
    b2 = batch * per_token / bandwidth
    tail = jnp.where(kv_per_token_sliding > 0, kv_per_token_sliding * window, 0.0)
    a3 = (w_step + batch * (kv_per_token_full * input_len + tail)) / bandwidth
    b3 = batch * kv_per_token_full / bandwidth
    return DecodeSteps(
        max_of_lines(a1, b1, a2, b2),
        max_of_lines(a1, b1, a3, b3),
        jnp.floor(window - input_len),
        roof.launch_overhead_s,
        comm_s(roof, batch),
    )


def decode_itl_of(steps_of: DecodeSteps, output_len):
    """ITL of :func:`decode_itl` from its :class:`DecodeSteps`: the O − 1 step times summed in closed form on both
    sides of the window crossover (T_j ≤ W ⟺ j ≤ W − I); NaN when O = 1."""
    steps, j_window = output_len - 1.0, steps_of.j_window
    total = sum_max_of_lines(steps_of.in_window, 1.0, jnp.minimum(steps, j_window)) + sum_max_of_lines(
        steps_of.past_window, jnp.clip(j_window + 1.0, 1.0, jnp.maximum(steps + 1.0, 1.0)), steps
    )
    per_step = total / jnp.where(steps > 0, steps, 1.0) + steps_of.launch_s + steps_of.comm_s
    return jnp.where(steps > 0, per_step, jnp.nan)


def decode_itl(batch, input_len, output_len, roof: Roof, attn):
    """ITL = (Σ_{j=1..O−1} t_j)/(O − 1) at concurrency B (§4, §4b, §4c), seconds; NaN when O = 1.

    Step j decodes at context T_j = I + j: t_j = max(B·(2·P_act + a·T_j)/F, (M_W(B) + B·K(T_j))/BW) + t_l
    + 2·L·t_ar(B·D·b_a), with ``attn`` = a_dec; M_W(B) and the all-reduce are constant over the steps, so
    the sum stays closed form on both sides of the window crossover (T_j ≤ W ⟺ j ≤ W − I). ``roof``: :class:`Roof`.
    """
    return decode_itl_of(decode_steps(batch, input_len, roof, attn), output_len)


def time_to_first_token(batch, output_len, prefill_s, chunks, itl_s):
    """TTFT = B·t_pre + [B > 1 and O > 1]·(K_c − 1)·ITL: the batch's prefills, serialised, with the
    decode steps interleaved between chunks (§4, a screen, not a scheduler)."""
    interleaved = (batch > 1) & (output_len > 1)
    return batch * prefill_s + jnp.where(interleaved, (chunks - 1.0) * itl_s, 0.0)


def service_time(output_len, ttft_s, itl_s):
    """S(B) = TTFT + (O − 1)·ITL, = TTFT when O = 1 (§4), seconds."""
    return jnp.where(output_len > 1, ttft_s + (output_len - 1.0) * itl_s, ttft_s)


def itl_with_chunk(itl_s, chunk_max_s):
    """ITL_chunk = ITL + t_chunk_max: a decode step that waits for one interleaved chunk (§4)."""
    return itl_s + chunk_max_s


def measured_service_time(batch, measured_batch, measured_request_rate):
    """Measured mode: S(B) = max(B, B_cal)/R, slot occupancy held below B_cal (§4)."""
    return jnp.maximum(batch, measured_batch) / measured_request_rate


def measured_ttft_itl(output_len, service_s, measured_ttft_s, measured_itl_s):
    """Measured mode TTFT and ITL: the measured ones when O > 1; TTFT = S and ITL NaN when O = 1."""
    multi = output_len > 1
    return jnp.where(multi, measured_ttft_s, service_s), jnp.where(multi, measured_itl_s, jnp.nan)
