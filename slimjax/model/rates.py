"""Rates from a batch's time (MODEL.md §1 Eq. 6 and §4): the one definition of each."""

from __future__ import annotations


def token_throughput(batch, input_len, output_len, seconds):
    """B·(I + O) / t, total (prompt + generated) tokens/s of B requests done in ``seconds``
    (SLIM's T with t = E2E, Eq. 6; the calculator's with t = S(B), §4)."""
    return batch * (input_len + output_len) / seconds


def request_rate(batch, service_s):
    """Completed requests/s, B / S(B) (§4)."""
    return batch / service_s
