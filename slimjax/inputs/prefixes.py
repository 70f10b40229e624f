"""What a request stream's prompts share (docs/simulation.md, "Prompts that share a prefix"): per request the hash of
each block of its prompt, as traces give them (Mooncake's ``hash_ids``: one id per 512-token block, equal ids for
equal content) or as the conversation generator makes them, turned into *chain* ids — one id per distinct prefix
through a block, so a block matches only after the same blocks before it — and what an unbounded cache would reuse.

A prompt's full blocks, its first ⌊I/h⌋ of h tokens, are what a prefix cache keeps of it; a request reuses at most
its first ⌊(I − 1)/h⌋ (its last prompt token is always computed, as engines do).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ..errors import SlimjaxError

MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces' hash_ids: one per 512-token block (their README)


@dataclasses.dataclass(frozen=True)
class PrefixBlocks:
    """Per request the chain id of each of its prompt's blocks (⌈I/h⌉ of them, the last one maybe partial), of
    ``block_tokens`` h tokens each."""

    block_tokens: int
    chains: tuple[np.ndarray, ...]

    def padded(self, fill: int = -1) -> np.ndarray:
        """(N, H_max) int64 chain ids, ``fill`` past each request's blocks."""
        width = max((len(c) for c in self.chains), default=0)
        out = np.full((len(self.chains), width), fill, np.int64)
        for i, c in enumerate(self.chains):
            out[i, : len(c)] = c
        return out

    def take(self, keep: np.ndarray) -> PrefixBlocks:
        """The requests where ``keep`` (a bool mask or indices)."""
        idx = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep)
        return dataclasses.replace(self, chains=tuple(self.chains[i] for i in idx))


def reusable_blocks(input_len, block_tokens: int) -> np.ndarray:
    """⌊(I − 1)/h⌋: the leading blocks a prompt may find cached (its last token is always computed)."""
    return np.floor((np.asarray(input_len, np.float64) - 1.0) / block_tokens).astype(np.int64)


def full_blocks(input_len, block_tokens: int) -> np.ndarray:
    """⌊I/h⌋: the blocks a prompt fills, which a cache keeps once it is prefilled."""
    return np.floor(np.asarray(input_len, np.float64) / block_tokens).astype(np.int64)


def chain_blocks(hash_lists: Sequence[Sequence[int]], input_len, block_tokens: int, field: str) -> PrefixBlocks:
    """:class:`PrefixBlocks` from per-request block hashes: request i must give ⌈I_i/h⌉ of them (a count that does
    not match says the block size is not the trace's: named with the row). Chain ids number the distinct
    (prefix, block) pairs in order of first appearance, so equal ids at different depths or after different
    blocks are different chains."""
    if not isinstance(block_tokens, (int, np.integer)) or isinstance(block_tokens, bool) or block_tokens < 1:
        raise SlimjaxError(
            f"{field}.hash_block_tokens", f"must be a positive whole number of tokens, got {block_tokens!r}"
        )
    if len(hash_lists) != len(input_len):
        raise SlimjaxError(
            f"{field}.hash_ids", f"one list per request: {len(hash_lists)} for {len(input_len)} requests"
        )
    ids: dict[tuple[int, int], int] = {}
    chains = []
    for i, (hashes, n_tokens) in enumerate(zip(hash_lists, input_len, strict=True)):
        want = math.ceil(float(n_tokens) / block_tokens)
        if len(hashes) != want:
            raise SlimjaxError(
                f"{field}.hash_ids[{i}]",
                f"{len(hashes)} block hashes for a prompt of {float(n_tokens):,.0f} tokens: blocks of {block_tokens} "
                f"tokens give ⌈I/{block_tokens}⌉ = {want}; set hash_block_tokens to the trace's block size",
            )
        parent, chain = -1, np.empty(len(hashes), np.int64)
        for b, h in enumerate(hashes):
            if isinstance(h, bool) or not isinstance(h, (int, np.integer)):
                raise SlimjaxError(f"{field}.hash_ids[{i}][{b}]", f"must be an integer hash, got {h!r}")
            parent = ids.setdefault((parent, int(h)), len(ids))
            chain[b] = parent
        chains.append(chain)
    return PrefixBlocks(int(block_tokens), tuple(chains))


def trace_prefix(trace, block_tokens, field: str) -> PrefixBlocks | None:
    """The block chains of a trace that gives ``hash_ids`` (a :class:`slimjax.inputs.requests.RequestTrace`), in
    blocks of ``block_tokens`` (a Mooncake trace's: 512 unless given); None for a trace without them."""
    if trace.hash_ids is None:
        if block_tokens is not None:
            raise SlimjaxError(f"{field}.hash_block_tokens", f"{trace.source} has no hash_ids to give a block size of")
        return None
    if block_tokens is None and trace.format == "mooncake":
        block_tokens = MOONCAKE_BLOCK_TOKENS
    if block_tokens is None:
        raise SlimjaxError(f"{field}.hash_block_tokens", f"{trace.source} gives hash_ids: say its block size in tokens")
    return chain_blocks(trace.hash_ids, trace.input_len, block_tokens, field)


def reused_blocks(blocks: PrefixBlocks, input_len) -> np.ndarray:
    """Per request, the leading cacheable blocks of its prompt that an earlier request of the stream (in stream
    order) also held: what a cache that never evicts, on one replica, would skip — the most any prefix cache can."""
    seen: set[int] = set()
    out = np.zeros(len(blocks.chains), np.int64)
    limit, kept = reusable_blocks(input_len, blocks.block_tokens), full_blocks(input_len, blocks.block_tokens)
    for i, chain in enumerate(blocks.chains):
        n = 0
        while n < min(len(chain), limit[i]) and int(chain[n]) in seen:
            n += 1
        out[i] = n
        seen.update(int(c) for c in chain[: kept[i]])
    return out


def reuse_text(blocks: PrefixBlocks, input_len) -> str:
    """One line on what the stream's prompts share: the share of prompt tokens in blocks an earlier prompt began
    with (an unbounded cache on one replica)."""
    tokens = reused_blocks(blocks, input_len) * blocks.block_tokens
    share = float(np.sum(tokens)) / max(float(np.sum(input_len)), 1.0)
    return (
        f"prompts begin with {share:.1%} of their tokens in {blocks.block_tokens}-token blocks an earlier prompt "
        "began with (the most a prefix cache could skip: one replica, never evicting)"
    )


def conversation_prompts(
    conversations: int,
    turns: int,
    system_tokens: int,
    user_tokens: int,
    output_len: int,
    block_tokens: int,
    shared_system: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]]]:
    """(conversation, turn, prompt tokens, block hashes) of ``conversations`` × ``turns`` requests in which each turn
    resends its conversation's history: turn t's prompt is the system prompt (one shared by every conversation, or
    each its own), then t earlier user messages and answers, then its own message, S + t·(U + O) + U tokens: a prefix
    of its conversation's text. A block's hash names its content: the shared system prompt's block b, else
    conversation c's block b (the same text at every turn that fills it); a block a turn fills only partly is that
    turn's own."""
    conv, turn, prompt, hashes = [], [], [], []
    own: dict[tuple, int] = {}

    def content(key) -> int:
        return own.setdefault(key, len(own))

    for c in range(conversations):
        for t in range(turns):
            n = system_tokens + t * (user_tokens + output_len) + user_tokens
            ids = []
            for b in range(math.ceil(n / block_tokens)):
                end = (b + 1) * block_tokens
                if shared_system and end <= system_tokens:
                    key = ("system", b)
                elif end <= n:  # a full block: its conversation's text, at every turn that fills it
                    key = ("conversation", c, b)
                else:  # the last, partly filled: this turn's own
                    key = ("partial", c, t)
                ids.append(content(key))
            conv.append(c)
            turn.append(t)
            prompt.append(n)
            hashes.append(ids)
    return np.asarray(conv), np.asarray(turn), np.asarray(prompt, np.float64), hashes
