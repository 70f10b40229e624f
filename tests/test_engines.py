"""Engine profiles (configs/engines.yaml, docs/engines.md): each engine's defaults against the values its sources
state, names resolved generally, a study's own keys winning, an unknown engine run as generic and said so."""

import json
from pathlib import Path

import pytest

from slimjax.errors import SlimjaxError
from slimjax.inputs.catalog import resolve_gpu
from slimjax.inputs.engines import engine_catalog, engine_table_markdown, resolve_engine, version_key
from slimjax.studies import simulate

DOCS = Path(__file__).resolve().parent.parent / "docs" / "engines.md"


def _on(engine: str, gpu: str) -> dict:
    return resolve_engine(engine).settings(gpu, resolve_gpu(gpu)[1])


def test_vllm_defaults_are_its_documented_ones():
    """vLLM V1: recompute preemption, 16-token blocks, max_num_batched_tokens 8192 on ≥ 70 GiB GPUs but A100
    (EngineArgs.get_batch_defaults, from 0.9.0), else 2048; prompts share steps."""
    h100 = _on("vllm", "H100-SXM")
    assert h100 == dict(
        kv_policy="recompute",
        kv_watermark=0.0,
        block_size=16,
        step_tokens=8192,
        chunk_size=0,
        prefill_first=0,
        prefix_cache=1,
    )
    assert _on("vllm", "H200")["step_tokens"] == 8192
    assert _on("vllm", "A100-SXM-80GB")["step_tokens"] == 2048  # 80 GiB, but vLLM excludes A100
    assert _on("vllm", "L40S")["step_tokens"] == 2048  # 48 GiB
    assert _on("vllm@0.8.5", "H100-SXM")["step_tokens"] == 2048  # before the larger default


def test_sglang_defaults_are_its_documented_ones():
    """SGLang: retract, page size 1, max_prefill_tokens 16384, chunked_prefill_size by GPU memory (8192 for H100
    and H200, 16384 from 160 GiB), prefill batches before decode batches."""
    h200 = _on("SGLang", "H200")
    assert h200 == dict(
        kv_policy="retract",
        kv_watermark=0.0,
        block_size=1,
        step_tokens=16384,
        chunk_size=8192,
        prefill_first=1,
        prefix_cache=1,
    )
    assert _on("sglang", "H100-SXM")["chunk_size"] == 8192
    assert _on("sglang", "B200")["chunk_size"] == 16384


def test_trtllm_defaults_are_its_documented_ones():
    """TensorRT-LLM: GUARANTEED_NO_EVICT (reserve), tokens_per_block 32, max_num_tokens 8192, mixed steps."""
    for name in ("trtllm", "TensorRT-LLM", "trt_llm", "TRT-LLM@1.0.0rc3"):
        assert resolve_engine(name).key == "trtllm"
        assert _on(name, "H100-SXM") == dict(
            kv_policy="reserve", block_size=32, step_tokens=8192, chunk_size=0, prefill_first=0, prefix_cache=1
        )


def test_every_value_cites_its_source():
    for key, entry in engine_catalog().items():
        for setting, value in entry["settings"].items():
            assert isinstance(value, dict) and len(value.get("source", "")) > 20, f"{key}.{setting} has no source"


def test_an_unknown_engine_runs_generic_and_says_so():
    profile = resolve_engine("lightllm@2.1")
    assert profile.key == "generic" and not profile.known and profile.version == "2.1"
    assert "not in configs/engines.yaml" in profile.label and "generic" in profile.label
    assert resolve_engine("generic").known
    with pytest.raises(SlimjaxError, match=r"serving\.engine: must name an engine"):
        resolve_engine("")
    assert version_key("1.0.0rc3") == (1, 0, 0) and version_key(None) == ()


def _sim(serving, gpu="H100-SXM"):
    return simulate.parse(
        dict(
            models=["Llama-3.1-8B"],
            gpus=[gpu],
            batch=[8],
            precision="float64",
            serving=serving,
            stream={"poisson": 2.0, "input_len": 500, "output_len": 20, "requests": 12},
        )
    )


def test_a_study_names_its_engine_and_its_own_keys_win():
    sim = _sim({"engine": "vllm", "chunk_size": 512})
    row = sim.serving_table["Llama-3.1-8B"]["H100-SXM"]
    assert row["engine"] == "vLLM (V1 engine)"
    assert row["kv_policy"] == "recompute" and row["step_tokens"] == 8192 and row["chunk_size"] == 512
    said = json.loads(simulate.run(sim).attrs["assumptions"])
    assert said[1].startswith("engine: vLLM (V1 engine)")
    assert "paged KV, preemption by recomputation (latest admitted first)" in said[2]


def test_an_unknown_engine_is_labelled_in_the_outputs():
    ds = simulate.run(_sim({"engine": "lightllm"}))
    said = json.loads(ds.attrs["assumptions"])
    assert "lightllm: not in configs/engines.yaml, run with the generic defaults" in said[1]
    assert "lightllm" in json.loads(ds.attrs["serving"])["Llama-3.1-8B"]["H100-SXM"]["engine"]


def test_the_sglang_profile_runs_prefill_first():
    sim = _sim({"engine": "sglang"})
    said = json.loads(simulate.run(sim).attrs["assumptions"])
    assert "prompts run in engine steps of 16384 tokens of their own, before the decodes" in said[2]


def test_docs_show_the_engine_table():
    """docs/engines.md's table is the catalog's (generated; cannot go stale)."""
    text = DOCS.read_text()
    begin, end = "<!-- engines:begin", "<!-- engines:end -->"
    table = text.split(begin)[1].split("\n", 1)[1].split(end)[0].strip()
    assert table == engine_table_markdown()


def test_docs_show_the_harness_table():
    """docs/engines.md's harness table is configs/harnesses.yaml's (generated; cannot go stale)."""
    from slimjax.inputs.harnesses import harness_table_markdown

    text = DOCS.read_text()
    begin, end = "<!-- harnesses:begin", "<!-- harnesses:end -->"
    table = text.split(begin)[1].split("\n", 1)[1].split(end)[0].strip()
    assert table == harness_table_markdown()
