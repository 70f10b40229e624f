"""Output schema (MODEL.md §7): every variable's dims, units and long name, in one place."""

from __future__ import annotations

DIMS = ("model", "gpu", "batch", "input_len", "output_len")
ALL5 = DIMS
PAIR = ("model", "gpu")
PAIR_LENS = ("model", "gpu", "input_len", "output_len")

# name -> (dims, units, long_name)
VARIABLES: dict[str, tuple[tuple[str, ...], str, str]] = {
    # Dims a variable does not depend on are dropped (MODEL.md §7 allows it; it saves grid bytes).
    "prefill_flops": (("model", "batch", "input_len"), "FLOP", "SLIM prefill FLOPs of the batch, F_pre (Eq. 8)"),
    "kv_traffic_bytes": (PAIR_LENS, "bytes", "SLIM KV-cache bytes read in decode per request, M_dec (Eq. 11)"),
    "slim_prefill_s": (("model", "gpu", "batch", "input_len"), "s", "SLIM prefill time T_pre (Eq. 7)"),
    "slim_decode_s": (ALL5, "s", "SLIM decode time T_dec (Eq. 9)"),
    "slim_e2e_s": (ALL5, "s", "SLIM end-to-end batch latency E2E (Eq. 5)"),
    "slim_throughput": (ALL5, "tokens/s", "SLIM total-token throughput B(I+O)/E2E (Eq. 6)"),
    "b_cap": (PAIR_LENS, "batch size (0 = none)", "batch-capacity advisor recommendation B_cap (Eq. 13)"),
}

QUEUE_DIMS = (*ALL5, "arrival_rate")
# The capacity calculator (MODEL.md §3–§4), present when a sweep has serving, measured or arrival_rate.
CAPACITY_VARIABLES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "weights_bytes": (PAIR, "bytes", "resident weights of the replica group, M_W = P·b_w"),
    "kv_pool_bytes": (PAIR, "bytes", "KV-cache pool u·M − M_W − M_R (negative: weights do not fit)"),
    "kv_bytes_per_token": (PAIR, "bytes", "raw KV-cache bytes per token, L·e_kv"),
    "seq_footprint_bytes": (PAIR_LENS, "bytes", "KV bytes reserved per sequence of I + O tokens (blocks, window, factors)"),
    "max_seqs": (PAIR_LENS, "sequences", "concurrent sequences that fit the KV pool, floor(pool / footprint)"),
    "prefill_s": (("model", "gpu", "input_len"), "s", "roofline prefill time of one prompt, chunked"),
    "chunk_max_s": (("model", "gpu", "input_len"), "s", "longest prefill chunk"),
    "itl_s": (ALL5, "s", "inter-token latency at concurrency B"),
    "itl_chunk_s": (ALL5, "s", "inter-token latency of a step that waits for one prefill chunk (roofline)"),
    "ttft_s": (ALL5, "s", "time to first token of the batch (service proxy)"),
    "service_s": (ALL5, "s", "service time S(B) of the batch"),
    "request_rate": (ALL5, "requests/s", "completed requests per second, B / S(B)"),
    "token_throughput": (ALL5, "tokens/s", "prompt + output tokens per second, B·(I + O) / S(B)"),
}
# The M/M/c queue (MODEL.md §5), present when a sweep has arrival_rate.
QUEUE_VARIABLES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "utilization": (QUEUE_DIMS, "1", "server utilisation ρ = λ·S(m)/m, m = min(B, max_seqs)"),
    "p_wait": (QUEUE_DIMS, "1", "probability an arrival waits (Erlang C); 1 without steady state"),
    "wait_s": (QUEUE_DIMS, "s", "mean queueing delay W_q (+inf: unbounded)"),
    "response_s": (QUEUE_DIMS, "s", "mean response time W_q + S (+inf: unbounded)"),
    "in_system": (QUEUE_DIMS, "requests", "mean requests in system, λ·R (+inf: unbounded)"),
}
# With coefficients from a calibrated store (covariance known): 90 % prediction intervals.
INTERVAL_VARIABLES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "slim_throughput_lo": (ALL5, "tokens/s", "lower end of the 90 % prediction interval of slim_throughput"),
    "slim_throughput_hi": (ALL5, "tokens/s", "upper end of the 90 % prediction interval of slim_throughput"),
    "b_cap_lo": (PAIR_LENS, "batch size (0 = none)", "B_cap with throughput and E2E at the pessimistic ends of their 90 % intervals"),
    "b_cap_hi": (PAIR_LENS, "batch size (0 = none)", "B_cap with throughput and E2E at the optimistic ends of their 90 % intervals"),
}
ALL_VARIABLES = {**VARIABLES, **INTERVAL_VARIABLES, **CAPACITY_VARIABLES, **QUEUE_VARIABLES}
ROOFLINE_ONLY = ("prefill_s", "chunk_max_s", "itl_chunk_s")

COORD_ATTRS = {
    "model": {"long_name": "model"},
    "gpu": {"long_name": "GPU"},
    "batch": {"units": "sequences", "long_name": "batch size / concurrency B"},
    "input_len": {"units": "tokens", "long_name": "input (prompt) length I"},
    "output_len": {"units": "tokens", "long_name": "output length O"},
    "arrival_rate": {"units": "requests/s", "long_name": "Poisson arrival rate λ"},
}
