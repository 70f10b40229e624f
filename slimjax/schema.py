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

COORD_ATTRS = {
    "model": {"long_name": "model"},
    "gpu": {"long_name": "GPU"},
    "batch": {"units": "sequences", "long_name": "batch size / concurrency B"},
    "input_len": {"units": "tokens", "long_name": "input (prompt) length I"},
    "output_len": {"units": "tokens", "long_name": "output length O"},
}
