"""Prompts that share a prefix (docs/simulation.md): block hashes read from traces and inline streams, turned into
chain ids; what a cache that never evicts would reuse, against an independent computation from the raw hashes;
the conversation generator's prompts and hashes by hand; bad hashes named with their row."""

import json
import math
import os

import numpy as np
import pytest

from slimjax.errors import SlimjaxError
from slimjax.inputs import prefixes
from slimjax.inputs.requests import load_requests
from slimjax.studies import simulate

DATA = os.environ.get("SLIMJAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
MOONCAKE = os.path.join(DATA, "traces", "mooncake_conversation_trace.jsonl")
BASE = dict(models=["Llama-3.1-8B"], gpus=["H100-SXM"], batch=[8], precision="float64")


def _seen_prefixes(hash_lists, input_len, block):
    """The oracle: per request, the longest run of its leading blocks (at most ⌊(I − 1)/h⌋) whose whole prefix, as a
    tuple of raw hashes, an earlier prompt filled (its ⌊I/h⌋ full blocks)."""
    seen, out = set(), []
    for hashes, n_tokens in zip(hash_lists, input_len, strict=True):
        limit = (int(n_tokens) - 1) // block
        n = 0
        while n < min(limit, len(hashes)) and tuple(hashes[: n + 1]) in seen:
            n += 1
        out.append(n)
        seen.update(tuple(hashes[: b + 1]) for b in range(min(int(n_tokens) // block, len(hashes))))
    return np.asarray(out)


def test_chain_ids_tell_equal_hashes_after_different_blocks_apart():
    blocks = prefixes.chain_blocks([[1, 2, 3], [1, 2, 4], [5, 2, 3], [1, 2]], [300, 300, 300, 200], 100, "stream")
    a, b, c, d = blocks.chains
    assert list(a[:2]) == list(b[:2]) and a[2] != b[2]  # a shared prefix, then different blocks
    assert not set(c) & set(a)  # hash 2 after hash 5 is another chain than hash 2 after hash 1
    assert list(d) == list(a[:2])
    # reusable: ⌊(I − 1)/h⌋ blocks (the last token is computed): 2 of request 1's 3, 1 of request 3's 2
    np.testing.assert_array_equal(prefixes.reused_blocks(blocks, [300, 300, 300, 200]), [0, 2, 0, 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reuse_equals_the_longest_earlier_prefix(seed):
    """Random streams of shared prefixes: the chain-id computation equals the raw-tuple oracle request by request."""
    rng = np.random.default_rng(seed)
    roots = [list(rng.integers(0, 50, rng.integers(1, 6))) for _ in range(6)]
    lists, lengths = [], []
    for _ in range(200):
        head = roots[rng.integers(len(roots))][: rng.integers(0, 6)]
        tail = list(rng.integers(0, 50, rng.integers(0, 4)))
        hashes = head + tail or [int(rng.integers(50))]
        lists.append(hashes)
        lengths.append(64 * len(hashes) - int(rng.integers(0, 64)))
    blocks = prefixes.chain_blocks(lists, lengths, 64, "stream")
    np.testing.assert_array_equal(prefixes.reused_blocks(blocks, lengths), _seen_prefixes(lists, lengths, 64))


@pytest.mark.skipif(
    not os.path.isfile(MOONCAKE), reason="../shared/data/traces/mooncake_conversation_trace.jsonl absent"
)
def test_the_mooncake_trace_keeps_its_hashes_and_says_what_prompts_share():
    trace = load_requests(MOONCAKE)
    raw = [json.loads(line) for line in open(MOONCAKE)]
    assert trace.hash_ids[:3] == tuple(tuple(r["hash_ids"]) for r in raw[:3])
    sim = simulate.parse({**BASE, "stream": {"trace": MOONCAKE, "duration_s": 300}})
    n = sim.stream.n_requests
    want = _seen_prefixes([r["hash_ids"] for r in raw[:n]], [r["input_length"] for r in raw[:n]], 512)
    got = prefixes.reused_blocks(sim.stream.prefix, sim.stream.input_len)
    np.testing.assert_array_equal(got, want)
    share = 512 * want.sum() / sum(r["input_length"] for r in raw[:n])
    assert f"prompts begin with {share:.1%} of their tokens" in sim.stream.description
    with pytest.raises(SlimjaxError) as e:  # the wrong block size: the first row's count names it
        simulate.parse({**BASE, "stream": {"trace": MOONCAKE, "duration_s": 10, "hash_block_tokens": 256}})
    assert e.value.field == "stream.hash_ids[0]" and "⌈I/256⌉ = 27" in str(e.value)


def test_a_csv_trace_gives_hashes_in_a_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,output_tokens,hash_ids\n0,150,10,1 2\n1.5,120,5,1;3\n2,60,7,[9]\n")
    trace = load_requests(path)
    assert trace.hash_ids == ((1, 2), (1, 3), (9,))
    sim = simulate.parse({**BASE, "stream": {"trace": str(path), "hash_block_tokens": 100}})
    np.testing.assert_array_equal(prefixes.reused_blocks(sim.stream.prefix, sim.stream.input_len), [0, 1, 0])
    with pytest.raises(SlimjaxError) as e:
        simulate.parse({**BASE, "stream": {"trace": str(path)}})
    assert e.value.field == "stream.hash_block_tokens"
    path.write_text("timestamp,input_tokens,output_tokens,hash_ids\n0,150,10,1 x\n1,150,10,1\n")
    with pytest.raises(SlimjaxError) as e:
        load_requests(path)
    assert e.value.field == f"{path}: row 2, column 'hash_ids'"


def test_inline_hashes_are_checked_and_change_no_time():
    """Block hashes describe the prompts; with the prefix cache off every time is as without them (on: the second
    request finds the first's block; tests/test_prefix_cache.py)."""
    requests = {"arrival_s": [0.0, 0.5, 1.0], "input_len": [700, 900, 300], "output_len": [20, 30, 40]}
    plain = simulate.run(simulate.parse({**BASE, "stream": {"requests": requests}}))
    hashed = {**requests, "hash_ids": [[1, 2], [1, 2], [3]], "hash_block_tokens": 512}
    sim = simulate.parse({**BASE, "stream": {"requests": hashed}, "serving": {"prefix_cache": 0}})
    np.testing.assert_array_equal(prefixes.reused_blocks(sim.stream.prefix, sim.stream.input_len), [0, 1, 0])
    np.testing.assert_array_equal(simulate.run(sim).e2e_s.values, plain.e2e_s.values)
    for bad, field in (
        ({**hashed, "hash_block_tokens": None}, "stream.requests.hash_block_tokens"),
        ({**requests, "hash_ids": [[1, 2], [1, 2], [3]]}, "stream.requests.hash_block_tokens"),
        ({**hashed, "hash_ids": [[1, 2], [1, "a"], [3]]}, "stream.requests.hash_ids[1][1]"),
        ({**hashed, "hash_ids": [[1], [1, 2], [3]]}, "stream.requests.hash_ids[0]"),
    ):
        with pytest.raises(SlimjaxError) as e:
            simulate.parse({**BASE, "stream": {"requests": bad}})
        assert e.value.field == field


def test_conversations_resend_their_history_by_hand():
    """Two conversations of two turns, a shared 1,024-token system prompt, 512-token messages and answers, blocks of
    512: turn t sends 1,024 + t·1,024 + 512 tokens; the second conversation's first turn reuses the system prompt's
    two blocks, each second turn its own first turn's three."""
    conv, turn, prompt, hashes = prefixes.conversation_prompts(2, 2, 1024, 512, 512, 512)
    np.testing.assert_array_equal(prompt, [1536, 2560, 1536, 2560])
    assert hashes[0][:2] == hashes[2][:2] and hashes[0][2] != hashes[2][2]  # shared system, own message
    assert hashes[1][:3] == hashes[0]  # the history resent
    blocks = prefixes.chain_blocks(hashes, prompt, 512, "stream")
    order = [0, 2, 1, 3]  # both first turns, then both second turns
    reused = prefixes.reused_blocks(blocks.take(np.asarray(order)), prompt[order])
    np.testing.assert_array_equal(reused, [0, 2, 3, 3])
    own = prefixes.conversation_prompts(2, 1, 1024, 512, 512, 512, shared_system=False)[3]
    assert not set(own[0]) & set(own[1])


def test_the_conversation_stream_is_seeded_ordered_and_checked():
    block = dict(conversations=6, turns=3, rate=1.0, think_s=20, system_tokens=1000, user_tokens=200, output_len=100)
    a = simulate.parse({**BASE, "stream": {"conversations": block}}).stream
    b = simulate.parse({**BASE, "stream": {"conversations": block}}).stream
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert a.n_requests == 18 and np.all(np.diff(a.arrival_s) >= 0)
    assert sorted(a.input_len) == sorted([1000 + t * 300 + 200 for t in range(3)] * 6)
    assert math.isclose(a.arrival_s.max(), a.arrival_s[a.input_len == 1200].max() + 40, rel_tol=1e-12)
    for key, value in (("turns", 0), ("think_s", -1), ("shared_system", "yes"), ("color", 1)):
        with pytest.raises(SlimjaxError) as e:
            simulate.parse({**BASE, "stream": {"conversations": {**block, key: value}}})
        assert e.value.field == f"stream.conversations.{key}"


# ---------------------------------------------------------------- the prefix cache's rules, on the event loop
# (docs/engines.md, "Prefix caching": the contract the simulation's cache is to equal per request)


def _terms(pool_blocks: float):
    """Llama-3.1-8B on an H100 (bf16 KV: 128 KiB a token, 64 MiB a 512-token block) with a pool of that many blocks."""
    import reference as ref
    import serving_reference as sref

    from slimjax.inputs import catalog

    arch, gpu = catalog.resolve_model("Llama-3.1-8B")[1], catalog.resolve_gpu("H100-SXM")[1]
    t = sref.replica_terms(arch, gpu, sref.default_serving(arch))
    block = arch["n_layers"] * ref.kv_bytes_per_layer_token(arch) * 512
    return dict(t, pool=pool_blocks * block), block


def test_lru_eviction_and_reuse_by_hand():
    """One replica, batch 1, a pool of six 512-token blocks; prompts of 1,025 tokens (2 full blocks, 2.03 blocks of
    footprint with their one output token). A caches a1 a2, B b1 b2 (the LRU: a2 a1 b2 b1, deepest first); D needs
    2.03 blocks with 2 free: a2 goes; C = a1 a2 c3 finds a1 only (512 tokens), evicts b2, re-caches a2; E = a1 a2 e3
    finds both (1,024 tokens)."""
    import serving_reference as sref

    t, block = _terms(6)
    chains = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 9], [0, 1, 10]]  # A B D C E
    got = sref.simulate(t, [0.0, 1.0, 2.0, 3.0, 4.0], [1025] * 5, [1] * 5, 1, chains=chains, block_tokens=512)
    assert got["prefix_hit_tokens"] == [0, 0, 0, 512, 1024]
    assert got["evicted"] == [[1, 4]]
    # C prefills only its last 513 tokens, over its cached 512
    assert got["ttft"][3] == pytest.approx(sref.step_seconds([], [(513, 512)], t), rel=1e-12)
    plain = sref.simulate(t, [0.0, 1.0, 2.0, 3.0, 4.0], [1025] * 5, [1] * 5, 1)
    assert plain["ttft"][3] == pytest.approx(sref.step_seconds([], [(1025, 0)], t), rel=1e-12)


def test_prefix_affinity_sends_a_request_where_its_prefix_is():
    """A (a long answer) on replica 0; B, sharing A's two blocks, arrives while A decodes: affinity sends it to
    replica 0 (hit 1,024 tokens) though replica 1 is empty, least_loaded to replica 1 (no hit); C, matching nothing,
    goes to the least loaded: replica 1 (B is done by then under least_loaded; empty under affinity)."""
    import serving_reference as sref

    t, _ = _terms(40)
    chains = [[0, 1, 2], [0, 1, 3], [4, 5, 6]]
    args = (t, [0.0, 0.5, 0.6], [1025, 1025, 1025], [400, 10, 10], 8, 2)
    affinity = sref.simulate(*args, router="prefix_affinity", chains=chains, block_tokens=512)
    least = sref.simulate(*args, router="least_loaded", chains=chains, block_tokens=512)
    assert affinity["replica"] == [0, 0, 1] and affinity["prefix_hit_tokens"] == [0, 1024, 0]
    assert least["replica"] == [0, 1, 1] and least["prefix_hit_tokens"] == [0, 0, 0]


@pytest.mark.skipif(
    not os.path.isfile(MOONCAKE), reason="../shared/data/traces/mooncake_conversation_trace.jsonl absent"
)
def test_a_procurement_workload_says_what_its_prompts_share():
    from slimjax.studies.procure import spec as procurefile

    base = dict(
        workloads=[dict(name="mooncake", trace=MOONCAKE, format="mooncake", duration_s=120)],
        rates=[1.0],
        models=["Llama-3.1-8B"],
        gpus=["H100-SXM"],
        tp=[1],
        batch=[16],
        slo={"ttft_s": 2.0},
    )
    study = procurefile.parse(base)
    assert "prompts begin with" in study.workloads[0].source and "512-token blocks" in study.workloads[0].source
    with pytest.raises(SlimjaxError) as e:
        procurefile.parse({**base, "workloads": [{**base["workloads"][0], "hash_block_tokens": 100}]})
    assert e.value.field == "workloads[0].hash_ids[0]"
