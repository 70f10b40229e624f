"""A prefix cache per replica in the §9 simulation (docs/simulation.md, "Prefix caching"), as the rules there state
them: KV blocks of h prompt tokens keyed by chain id, held by the requests using them or free in the order they were
freed; a request reuses its leading cached blocks, the others join the cache when its prefill is done, and the least
recently freed block is evicted when an admission needs its bytes.

What a lane carries (:class:`PrefixCache`), and why it is laid out so:

- Only *tracked* chains get a row in the tables: those in the full blocks of two or more of the lane's requests. A
  chain in one prompt alone can be neither found nor adopted by another request, so it needs no lookup, only its
  place in the eviction order; since tracked chains are closed under prefixes, a request's blocks are its tracked
  ones then its untracked ones (:func:`lane_chains` numbers them, host side).
- The free order is a log of positions (``ring``): each release appends the request's untracked blocks as one run,
  then its tracked blocks that no one holds any more, deepest first. A tracked block's ``stamp`` is the position it
  was last freed at; its entry is current while no one holds it and its stamp is that position, and stale
  otherwise (skipped). Replica r has evicted everything of its own before ``head[r]`` (and ``used[r]`` blocks of the
  run at ``head[r]``), so a block is cached when held or when its stamp is at or past ``head[r]``: eviction writes
  nothing in the tables, it only moves the head.
- Each step's prefill completions (adoptions) and completions (releases) are queued as events and applied one per
  iteration of the lane loop before anything else happens in the lane (a step's end is one instant, so this is the
  rules' order), and admissions are one per iteration (:mod:`.loop`): no table is carried through an inner loop,
  which, vmapped over lanes, would copy it at every turn. Each event and admission reads and writes only the
  blocks of one request.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class PrefixParams(NamedTuple):
    """Per lane: the cache's block, h tokens (the trace's hash block) of c bytes (footprint(h), every layer)."""

    block_tokens: Any
    block_bytes: Any


PREFIX_TERMS = {"block_tokens": "prefix_block_tokens", "block_bytes": "prefix_block_bytes"}  # field: params key


class PrefixStream(NamedTuple):
    """Per request of a lane's stream (:func:`lane_chains`): its tracked chains, how many, and its full blocks."""

    chain: Any  # (N, T_max) int32: local ids of its first T tracked blocks' chains, C past them
    tracked: Any  # (N,) int32 T
    full: Any  # (N,) int32 F = ⌊I/h⌋ (its untracked blocks: F − T)
    tables: Any  # (C + 1,) zeros: the tables' width (the last column: no chain)


STREAM_KEYS = {"chain": "prefix_chain", "tracked": "prefix_tracked", "full": "prefix_full", "tables": "prefix_tables"}


class Events(NamedTuple):
    """A step's cache events in the rules' order (its prefill completions, then its completions, in slot order),
    applied one per lane iteration."""

    request: Any  # (E,) int32
    release: Any  # (E,) bool: a completion (else a prefill completion, adopting or inserting its blocks)
    hits: Any  # (E,) int32: blocks it found cached at admission (a prefill completion's first block to add)
    replica: Any  # () int32: the replica whose step queued them
    count: Any  # () int32
    at: Any  # () int32: the next one to apply


class PrefixCache(NamedTuple):
    """A lane's caches: per replica, the tracked chains' holders and free stamps and the eviction head; the free
    order's log, shared by the replicas (each entry names its replica)."""

    refs: Any  # (R, C + 1) int32: requests holding each tracked chain's block
    stamp: Any  # (R, C + 1) int32: where it was last freed in the log (-1: never)
    log: Any  # (Q,) int32: a tracked chain's id, or -(n + 1) for a run of n untracked blocks
    log_replica: Any  # (Q,) int32: whose entry (-1: none yet)
    tail: Any  # () int32: the next free position of the log
    head: Any  # (R,) int32: each replica's first entry not evicted
    used: Any  # (R,) int32: blocks of the run at head already evicted
    free_blocks: Any  # (R,) int32: cached blocks no one holds (the evictable ones)
    events: Events


def lane_chains(chains: np.ndarray, input_len, block_tokens: int) -> dict:
    """Host side: a lane's :class:`PrefixStream` arrays (keyed as :data:`STREAM_KEYS`) from its requests' chain ids
    (N, H) (-1 past a request's blocks; :meth:`slimjax.inputs.prefixes.PrefixBlocks.padded`)."""
    n = len(input_len)
    chains = np.asarray(chains, np.int64)
    chains = chains.reshape(n, chains.shape[-1] if chains.ndim == 2 else 0)
    full = np.floor(np.asarray(input_len, np.float64) / block_tokens).astype(np.int64)
    in_full = (np.arange(chains.shape[1])[None, :] < full[:, None]) & (chains >= 0)
    ids, counts = np.unique(chains[in_full], return_counts=True)
    shared = ids[counts > 1]
    tracked_mask = in_full & np.isin(chains, shared)
    tracked = tracked_mask.sum(axis=1)
    width = max(int(tracked.max(initial=0)), 1)
    local = np.full((n, width), len(shared), np.int32)
    rows, cols_at = np.nonzero(tracked_mask)
    local[rows, cols_at] = np.searchsorted(shared, chains[rows, cols_at])
    return {
        STREAM_KEYS["chain"]: local,
        STREAM_KEYS["tracked"]: tracked.astype(np.int32),
        STREAM_KEYS["full"]: full.astype(np.int32),
        STREAM_KEYS["tables"]: np.zeros(len(shared) + 1, np.int32),
    }


def stacked_lanes(lanes: list[dict], requests: int) -> dict:
    """Host side: several lanes' :func:`lane_chains` stacked (lanes, …), each padded to ``requests`` requests (no
    blocks) and to the widest chains and tables (a lane's own last column stays its no-chain column)."""
    width = max(d[STREAM_KEYS["chain"]].shape[1] for d in lanes)
    tables = max(d[STREAM_KEYS["tables"]].shape[0] for d in lanes)
    out = {k: [] for k in STREAM_KEYS.values()}
    for d in lanes:
        n = d[STREAM_KEYS["full"]].shape[0]
        none = d[STREAM_KEYS["tables"]].shape[0] - 1
        chain = np.full((requests, width), none, np.int32)
        chain[:n, : d[STREAM_KEYS["chain"]].shape[1]] = d[STREAM_KEYS["chain"]]
        out[STREAM_KEYS["chain"]].append(chain)
        for key in (STREAM_KEYS["tracked"], STREAM_KEYS["full"]):
            out[key].append(np.pad(d[key], (0, requests - n)))
        out[STREAM_KEYS["tables"]].append(np.zeros(tables, np.int32))
    return {k: np.stack(v) for k, v in out.items()}


def init(replicas: int, log: int, prefix: PrefixStream, events: int) -> PrefixCache:
    width = prefix.tables.shape[0]
    zero = jnp.zeros((), jnp.int32)
    return PrefixCache(
        refs=jnp.zeros((replicas, width), jnp.int32),
        stamp=jnp.full((replicas, width), -1, jnp.int32),
        log=jnp.zeros(log, jnp.int32),
        log_replica=jnp.full(log, -1, jnp.int32),
        tail=zero,
        head=jnp.zeros(replicas, jnp.int32),
        used=jnp.zeros(replicas, jnp.int32),
        free_blocks=jnp.zeros(replicas, jnp.int32),
        events=Events(
            request=jnp.zeros(events, jnp.int32),
            release=jnp.zeros(events, bool),
            hits=jnp.zeros(events, jnp.int32),
            replica=zero,
            count=zero,
            at=zero,
        ),
    )


def cached(cache: PrefixCache, r, chain):
    """Whether replica r's cache has each of ``chain``'s blocks (held, or free and not evicted); ``r`` (R, 1): every
    replica's."""
    return (cache.refs[r, chain] > 0) | (cache.stamp[r, chain] >= cache.head[r])


def leading(found, limit):
    """How many of the leading entries (last axis) are found, among the first ``limit``."""
    on = found & (jnp.arange(found.shape[-1]) < limit)
    return jnp.sum(jnp.cumprod(on.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def reusable(prefix: PrefixStream, params: PrefixParams, input_len, i):
    """The blocks request i may find cached: its tracked ones among its first ⌊(I − 1)/h⌋."""
    limit = jnp.floor((input_len - 1.0) / params.block_tokens).astype(jnp.int32)
    return jnp.minimum(prefix.tracked[i], limit)


class Admission(NamedTuple):
    """What admitting request i at replica r would take (rule 1)."""

    hits: Any  # m: its leading cached blocks
    need: Any  # footprint(I + O) − m·c
    hits_free: Any  # of them, the free ones (taken out of the free order)
    fits: Any  # need ≤ free + c·(free cached blocks other than its hits)


def admission(cache: PrefixCache, prefix: PrefixStream, params: PrefixParams, r, i, input_len, footprint, free):
    chain = prefix.chain[i]
    m = leading(cached(cache, r, chain), reusable(prefix, params, input_len, i))
    hit = jnp.arange(chain.shape[0]) < m
    hits_free = jnp.sum(hit & (cache.refs[r, chain] == 0)).astype(jnp.int32)
    need = footprint - m * params.block_bytes
    fits = ~(need > free + params.block_bytes * (cache.free_blocks[r] - hits_free))
    return Admission(m, need, hits_free, fits)


def admit(cache: PrefixCache, prefix: PrefixStream, params: PrefixParams, r, i, a: Admission, free, go):
    """(cache, free) after admitting request i at replica r where ``go``: its hits held, then the least recently
    freed blocks evicted until the pool has what it needs, which it then takes."""
    chain = prefix.chain[i]
    width = cache.refs.shape[1]
    hit = go & (jnp.arange(chain.shape[0]) < a.hits)
    refs = cache.refs.at[r, jnp.where(hit, chain, width)].add(jnp.int32(1), mode="drop")
    cache = cache._replace(refs=refs, free_blocks=cache.free_blocks.at[r].add(jnp.where(go, -a.hits_free, 0)))

    def short(c):  # as the rules add them: one block's bytes at a time
        return c[0] < a.need

    free_after, blocks = jax.lax.while_loop(
        lambda c: go & short(c), lambda c: (c[0] + params.block_bytes, c[1] + 1), (free, jnp.zeros((), jnp.int32))
    )
    cache = evict(cache, r, blocks)
    return cache, jnp.where(go, free_after - a.need, free)


def evict(cache: PrefixCache, r, blocks):
    """Replica r's ``blocks`` least recently freed blocks evicted: its head moved past them in the log (stale
    entries and other replicas' skipped)."""

    def entry(pos, used):
        v = cache.log[pos]
        mine = cache.log_replica[pos] == r
        c = jnp.maximum(v, 0)
        current = (cache.refs[r, c] == 0) & (cache.stamp[r, c] == pos)
        size = jnp.where(v >= 0, jnp.where(current, 1, 0), -v - 1)
        return jnp.where(mine, size - used, 0)

    def body(c):
        pos, used, left = c
        take = jnp.minimum(entry(pos, used), left)
        rest = entry(pos, used) - take
        moved = rest <= 0
        return jnp.where(moved, pos + 1, pos), jnp.where(moved, 0, used + take), left - take

    pos, used, _ = jax.lax.while_loop(
        lambda c: (c[2] > 0) & (c[0] < cache.tail), body, (cache.head[r], cache.used[r], blocks)
    )
    return cache._replace(
        head=cache.head.at[r].set(pos),
        used=cache.used.at[r].set(used),
        free_blocks=cache.free_blocks.at[r].add(-blocks),
    )


def queue_events(cache: PrefixCache, prefix: PrefixStream, r, request, hit_tokens, first, done, params, go):
    """The step's events queued (the queue is empty: events run before anything else): its prefill completions with
    tracked blocks past their hits, then its completions holding blocks, each in slot order."""
    n = prefix.full.shape[0]
    i = jnp.clip(request, 0, n - 1)
    hits = jnp.round(hit_tokens / params.block_tokens).astype(jnp.int32)
    adopt = go & first & (prefix.tracked[i] > hits)
    release = go & done & (prefix.full[i] > 0)
    E = cache.events.request.shape[0]
    n_adopt = jnp.sum(adopt)
    at_adopt = jnp.where(adopt, jnp.cumsum(adopt) - 1, E)
    at_release = jnp.where(release, n_adopt + jnp.cumsum(release) - 1, E)
    ev = cache.events
    ev = Events(
        request=ev.request.at[at_adopt]
        .set(i.astype(jnp.int32), mode="drop")
        .at[at_release]
        .set(i.astype(jnp.int32), mode="drop"),
        release=ev.release.at[at_adopt].set(False, mode="drop").at[at_release].set(True, mode="drop"),
        hits=ev.hits.at[at_adopt].set(hits, mode="drop"),
        replica=jnp.where(go, r, ev.replica).astype(jnp.int32),
        count=jnp.where(go, n_adopt + jnp.sum(release), ev.count).astype(jnp.int32),
        at=jnp.where(go, 0, ev.at).astype(jnp.int32),
    )
    return cache._replace(events=ev)


def pending(cache: PrefixCache):
    return cache.events.at < cache.events.count


def apply_event(cache: PrefixCache, prefix: PrefixStream, params: PrefixParams, free, go):
    """(cache, free) after the next queued event where ``go``. A prefill completion (rule 2): each tracked block past
    its hits is adopted where cached (its own copy's bytes back to the pool) or inserted, held by it. A completion
    (rule 3): its untracked blocks join the free order as one run, then each tracked block no one holds any more,
    deepest first."""
    ev = cache.events
    k = jnp.minimum(ev.at, ev.request.shape[0] - 1)
    i, r, release = ev.request[k], ev.replica, ev.release[k]
    chain = prefix.chain[i]
    width = cache.refs.shape[1]
    depth = jnp.arange(chain.shape[0])
    t_i = prefix.tracked[i]
    refs = cache.refs[r, chain]
    # a prefill completion: blocks hits … T
    adding = go & ~release & (depth >= ev.hits[k]) & (depth < t_i)
    found = adding & cached(cache, r, chain)
    adopted = jnp.sum(found)
    from_free = jnp.sum(found & (refs == 0)).astype(jnp.int32)
    # a completion: blocks 0 … T let go
    letting = go & release & (depth < t_i)
    freed = letting & (refs == 1)
    n_freed = jnp.sum(freed).astype(jnp.int32)
    deeper = jnp.cumsum(freed[::-1])[::-1] - freed  # freed blocks deeper than each
    run = prefix.full[i] - t_i
    pos = (cache.tail + 1 + deeper).astype(jnp.int32)
    log_size = cache.log.shape[0]
    at_run = jnp.where(go & release, cache.tail, log_size)
    at_freed = jnp.where(freed, pos, log_size)
    delta = jnp.where(adding, 1, jnp.where(letting, -1, 0)).astype(jnp.int32)
    refs_all = cache.refs.at[r, jnp.where(adding | letting, chain, width)].add(delta, mode="drop")
    stamp = cache.stamp.at[r, jnp.where(freed, chain, width)].set(pos, mode="drop")
    log = cache.log.at[at_run].set((-(run + 1)).astype(jnp.int32), mode="drop").at[at_freed].set(chain, mode="drop")
    log_replica = cache.log_replica.at[at_run].set(r, mode="drop").at[at_freed].set(r, mode="drop")
    blocks = jnp.where(go & release, run + n_freed, -from_free)
    cache = cache._replace(
        refs=refs_all,
        stamp=stamp,
        log=log,
        log_replica=log_replica,
        tail=cache.tail + jnp.where(go & release, 1 + n_freed, 0),
        free_blocks=cache.free_blocks.at[r].add(jnp.where(go, blocks, 0)),
        events=ev._replace(at=ev.at + go),
    )
    return cache, free + jnp.where(go & ~release, adopted * params.block_bytes, 0.0)


def matched(cache: PrefixCache, prefix: PrefixStream, params: PrefixParams, input_len, i):
    """(R,) each replica's leading cached blocks of request i (rule 4, ``prefix_affinity``)."""
    every = jnp.arange(cache.refs.shape[0])[:, None]
    return leading(cached(cache, every, prefix.chain[i]), reusable(prefix, params, input_len, i))
