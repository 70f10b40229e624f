"""Catalogs and the Hugging Face config reader (MODEL.md §0)."""

import json

import pytest

from slimjax import SlimjaxError
from slimjax.inputs.catalog import gpu_catalog, model_catalog, model_from_hf, resolve_gpu, resolve_model

REQUIRED_MODELS = [
    "OPT-125m",
    "OPT-350m",
    "OPT-1.3b",
    "OPT-2.7b",
    "OPT-6.7b",
    "OPT-13b",
    "Llama-2-7b",
    "Meta-Llama-3-8B",
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "Mistral-7B-v0.1",
    "Qwen2-7B",
    "gemma-2-9b",
    "DeepSeek-V2",
    "Mixtral-8x7B",
]
REQUIRED_GPUS = [
    "A100-SXM-40GB",
    "A100-SXM-80GB",
    "A100-PCIe-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "GH200",
    "L40S",
    "B200",
    "MI300X",
]


def test_catalogs_hold_the_fleet():
    assert set(REQUIRED_MODELS) <= set(model_catalog())
    assert set(REQUIRED_GPUS) <= set(gpu_catalog())
    for name in REQUIRED_MODELS:
        label, row = resolve_model(name)
        assert label == name and row["n_params"] > 1e8
    for name in REQUIRED_GPUS:
        row = resolve_gpu(name)[1]
        assert row["flops_per_s"] > 1e14 and row["bandwidth_bytes_per_s"] > 5e11 and row["memory_bytes"] >= 40 * 2**30
        assert row["price_per_hour"] > 0


def test_gpu_units_converted_once():
    h100 = resolve_gpu("H100-SXM")[1]
    assert (
        h100["flops_per_s"] == 989e12
        and h100["bandwidth_bytes_per_s"] == 3.35e12
        and h100["memory_bytes"] == 80 * 2**30
    )
    gh200 = resolve_gpu("GH200")[1]
    assert gh200["memory_bytes"] == 96 * 2**30 and gh200["bandwidth_bytes_per_s"] == 4.0e12


def test_aliases_resolve_hf_ids():
    assert resolve_model("meta-llama/Llama-3.1-8B")[0] == "Llama-3.1-8B"
    assert resolve_model("facebook/opt-13b")[0] == "OPT-13b"
    assert resolve_gpu("h100-sxm5-80gb")[0] == "H100-SXM"


def test_opt13b_parameter_count_close_to_published():
    """REFERENCES: OPT-13B has 12,853,473,280 parameters; §0's count ignores biases and norms."""
    p = resolve_model("OPT-13b")[1]["n_params"]
    assert p == pytest.approx(12_853_473_280, rel=1e-3)
    assert p < 12_853_473_280


def test_llama31_8b_parameter_count():
    """Llama-3.1-8B: 8,030,261,248 parameters with norms; §0 ignores the 266,240 norm weights."""
    assert resolve_model("Llama-3.1-8B")[1]["n_params"] == 8_030_261_248 - 266_240


def test_fallbacks_and_gating():
    row = model_from_hf(
        dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8, intermediate_size=1024, vocab_size=1000)
    )
    assert row["n_kv_heads"] == 8 and row["head_dim"] == 64 and row["n_ffn"] == 3 and row["window"] == float("inf")
    opt = model_from_hf(
        dict(
            model_type="opt", num_hidden_layers=2, hidden_size=512, num_attention_heads=8, ffn_dim=2048, vocab_size=1000
        )
    )
    assert opt["n_ffn"] == 2 and opt["ffn_dim"] == 2048


def test_sliding_window_variants():
    mistral = resolve_model("Mistral-7B-v0.1")[1]
    assert mistral["window"] == 4096 and mistral["n_sliding_layers"] == 32
    gemma = resolve_model("gemma-2-9b")[1]
    assert gemma["window"] == 4096 and gemma["n_sliding_layers"] == 21
    qwen = resolve_model("Qwen2-7B")[1]
    assert qwen["n_sliding_layers"] == 0  # use_sliding_window: false


def test_moe_active_ffn_width():
    assert resolve_model("Mixtral-8x7B")[1]["ffn_dim"] == 2 * 14336
    assert resolve_model("DeepSeek-V2")[1]["ffn_dim"] == (6 + 2) * 1536
    assert resolve_model("Mixtral-8x7B")[1]["n_params"] == 46_702_792_704


def test_every_shared_hf_config_loads(shared_data):
    files = sorted((shared_data / "models").glob("*_config.json"))
    assert len(files) >= 10
    for path in files:
        label, row = resolve_model(str(path))
        assert row["n_layers"] > 0 and row["n_params"] > 1e9, label
        cfg = json.loads(path.read_text())
        text = cfg.get("text_config", cfg)
        if text.get("layer_types"):
            assert row["n_sliding_layers"] == sum("sliding" in t for t in text["layer_types"])


def test_real_configs_specifics(shared_data):
    models = shared_data / "models"
    llama = resolve_model(str(models / "meta-llama--Meta-Llama-3.1-8B_config.json"))[1]
    assert llama == resolve_model("Llama-3.1-8B")[1]
    oss = resolve_model(str(models / "openai--gpt-oss-20b_config.json"))[1]
    assert oss["window"] == 128 and oss["n_sliding_layers"] == 12 and oss["ffn_dim"] == 4 * 2880
    v3 = resolve_model(str(models / "deepseek-ai--DeepSeek-V3_config.json"))[1]
    assert v3["mla"] == 1.0 and (v3["kv_lora_rank"] + v3["rope_dim"]) * v3["n_layers"] == 35_136
    assert v3["n_params"] == pytest.approx(671e9, rel=0.01)
    gemma4 = resolve_model(str(models / "google--gemma-4-26B-A4B_config.json"))[1]
    assert gemma4["window"] == 1024 and gemma4["n_sliding_layers"] == 25


def test_config_lacking_a_key_names_it(tmp_path):
    path = tmp_path / "bad_config.json"
    path.write_text(json.dumps(dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8, vocab_size=1000)))
    with pytest.raises(SlimjaxError, match="intermediate_size"):
        resolve_model(str(path))


def test_unknown_names_suggest_close_ones():
    with pytest.raises(SlimjaxError, match="did you mean.*Llama-3.1-8B"):
        resolve_model("Llama-3.1-8b-instruct", "models[0]")
    with pytest.raises(SlimjaxError, match="did you mean.*H100"):
        resolve_gpu("H10O-SXM", "gpus[1]")


@pytest.mark.parametrize(
    "raw, want",
    [
        ("Nvidia GH200 GPU", "GH200"),
        ("AMD MI300X GPU", "MI300X"),
        ("NVIDIA H200 SXM", "H200"),
        ("Nvidia A100 GPU", "A100-SXM-40GB"),
        ("H100 80GB", "H100-SXM"),
        ("nvidia-h100-sxm5-80gb", "H100-SXM"),
        ("A100 40GB", "A100-SXM-40GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("l40s", "L40S"),
        ("h100_sxm", "H100-SXM"),
        ("TPUv9", None),
    ],
)
def test_trace_hardware_names_resolve_generally(raw, want):
    from slimjax.inputs.catalog import resolve_hardware
    from slimjax.inputs.traces import hardware_table

    assert resolve_hardware(raw, hardware_table()) == want


def test_an_ambiguous_hardware_name_lists_the_candidates():
    from slimjax.inputs.catalog import resolve_hardware

    with pytest.raises(
        SlimjaxError, match=r"'A100 GPU' could mean A100-SXM-40GB, A100-SXM-80GB; say which in configs/hardware.yaml"
    ):
        resolve_hardware("A100 GPU", {"a100-40": "A100-SXM-40GB"})


def test_unmapped_hardware_is_counted_per_name_and_named_when_nothing_is_left(tmp_path):
    from slimjax import calibrate, load_traces

    path = tmp_path / "t.csv"
    path.write_text(
        "model,gpu,batch,input_len,output_len,e2e_s\n"
        + "Llama-3.1-8B,Gaudi3,8,100,50,1.5\n" * 3
        + "Llama-3.1-8B,TPUv9,8,100,50,1.5\n"
        + "Llama-3.1-8B,AMD MI300X GPU,8,100,50,1.5\n"
    )
    df = load_traces(path)
    assert df.gpu.tolist() == ["MI300X"]
    assert df.attrs["dropped"]["hardware 'Gaudi3' unknown (add it to configs/hardware.yaml or the GPU catalog)"] == 3
    path.write_text("model,gpu,batch,input_len,output_len,e2e_s\nLlama-3.1-8B,Gaudi3,8,100,50,1.5\n")
    with pytest.raises(SlimjaxError, match=r"no rows to fit \(1 dropped: hardware 'Gaudi3' unknown"):
        calibrate(load_traces(path))


def test_catalog_holds_every_shared_config_and_every_verified_model_arch_row(shared_data):
    import csv

    for path in sorted((shared_data / "models").glob("*_config.json")):
        alias = path.name.removesuffix("_config.json").replace("--", "/")
        if alias == "meta-llama/Meta-Llama-3.1-8B" or alias == "meta-llama/Meta-Llama-3.1-70B":
            alias = alias.replace("Meta-Llama-3.1", "Llama-3.1")
        from_catalog, from_file = resolve_model(alias)[1], resolve_model(str(path))[1]
        p_catalog, p_file = from_catalog.pop("n_params"), from_file.pop("n_params")
        assert from_catalog == from_file, alias
        assert p_catalog == pytest.approx(p_file, rel=1e-3), alias  # a published total may count norms and routers
    rows = [
        r
        for r in csv.DictReader(open(shared_data / "models" / "model_arch.csv"))
        if r["verified_verbatim"].startswith("yes")
    ]
    assert len(rows) >= 20
    for r in rows:
        name, arch = resolve_model(r["model"])
        assert arch["n_layers"] == float(r["layers"]) and arch["hidden"] == float(r["hidden"]), name
        assert arch["n_heads"] == float(r["heads"]) and arch["n_kv_heads"] == float(r["kv_heads"]), name
