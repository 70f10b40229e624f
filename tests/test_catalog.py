"""Catalogs and the Hugging Face config reader (MODEL.md §0)."""

import json

import numpy as np
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


# hardware and checkpoint strings as public benchmark outputs write them (aiconfigurator systems, nvidia-smi names,
# MLPerf / vLLM / GuideLLM result files, Hugging Face checkpoint ids) -> what they are in the catalogs
BENCHMARK_HARDWARE = [
    ("b200_sxm", "B200"),
    ("h200_sxm", "H200"),
    ("gb200", "GB200"),
    ("GB200 NVL72", "GB200"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 80GB HBM3 (SXM5)", "H100-SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
    ("a100_pcie", "A100-PCIe-80GB"),
    ("h100_pcie", "H100-PCIe"),
    ("NVIDIA H200", "H200"),
    ("H200 SXM 141GB", "H200"),
    ("nvidia-h200-141gb", "H200"),
    ("NVIDIA B200", "B200"),
    ("B200 SXM 180GB", "B200"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40S-48GB", "L40S"),
    ("AMD Instinct MI300X", "MI300X"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("h100-80gb-pcap", "H100-SXM"),
    ("NVIDIA H100 NVL", None),  # its own part (94 GB, PCIe pair): not the SXM H100
    ("AMD Instinct MI325X", None),
]
BENCHMARK_CHECKPOINTS = [
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "Llama-3.1-8B", "fp8"),
    ("nvidia/Qwen3-32B-NVFP4", "Qwen3-32B", "nvfp4"),
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B", None),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "Llama-3.1-70B", None),
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "Llama-3.1-70B", "fp8"),
    ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8-dynamic", "Llama-3.1-8B", "fp8"),
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "Llama-3.1-8B", "int8"),
    ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "Llama-3.1-70B", "int4"),
    ("Qwen/Qwen3-8B-AWQ", "Qwen3-8B", "int4"),
    ("Qwen/Qwen2-7B-Instruct-GPTQ-Int8", "Qwen2-7B", "int8"),
    ("Qwen/Qwen3-30B-A3B-FP8", "Qwen3-30B-A3B", "fp8"),
    ("Qwen/Qwen3-235B-A22B-FP8", "Qwen3-235B-A22B", "fp8"),
    ("nvidia/DeepSeek-R1-FP4", "DeepSeek-R1", "fp4"),
    ("TheBloke/Llama-2-70B-Chat-AWQ", "Llama-2-70b", "int4"),
    ("meta-llama/Llama-2-70b-chat-hf", "Llama-2-70b", None),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B", None),
    ("neuralmagic/Mistral-7B-Instruct-v0.3-GPTQ-4bit", "Mistral-7B-v0.3", "int4"),
    ("google/gemma-2-9b-it", "gemma-2-9b", None),
    ("google/gemma-3-1b-it", "gemma-3-1b-it", None),
    ("openai/gpt-oss-120b", "gpt-oss-120b", None),
    ("llama2-70b", "Llama-2-70b", None),
]


@pytest.mark.parametrize("raw, want", BENCHMARK_HARDWARE)
def test_benchmark_hardware_strings_resolve(raw, want):
    from slimjax.inputs.catalog import resolve_hardware
    from slimjax.inputs.traces import hardware_table

    assert resolve_hardware(raw, hardware_table()) == want


@pytest.mark.parametrize("raw, want, precision", BENCHMARK_CHECKPOINTS)
def test_benchmark_checkpoint_ids_resolve_to_base_model_and_precision(raw, want, precision):
    from slimjax.inputs.catalog import resolve_checkpoint

    assert resolve_checkpoint(raw) == (want, precision)


def test_checkpoint_names_fail_with_the_nearest_and_catalog_names_stay_themselves():
    from slimjax.inputs.catalog import model_catalog, resolve_checkpoint

    assert len(BENCHMARK_HARDWARE) + len(BENCHMARK_CHECKPOINTS) >= 30
    with pytest.raises(SlimjaxError, match=r"unknown model 'RedHatAI/Llama-3.3-70B-Instruct-FP8'.*configs/models.yaml"):
        resolve_checkpoint("RedHatAI/Llama-3.3-70B-Instruct-FP8")  # another checkpoint: added by the user, not guessed
    for m, row in model_catalog().items():
        for name in (m, *row.get("aliases", [])):
            assert resolve_checkpoint(name)[0] == m


def test_a_quantized_checkpoint_sets_its_rows_precision_and_unstated_ones_are_counted(tmp_path):
    from slimjax import load_traces

    path = tmp_path / "t.csv"
    path.write_text(
        "model,gpu,batch,input_len,output_len,e2e_s\n"
        "nvidia/Llama-3.1-8B-Instruct-FP8,b200_sxm,8,100,50,1.5\n"
        "meta-llama/Llama-3.1-8B-Instruct,NVIDIA H100 80GB HBM3,8,100,50,1.5\n"
        "bigscience/bloom-176b,H100-SXM,8,100,50,1.5\n"
    )
    df = load_traces(path)
    assert df.model.tolist() == ["Llama-3.1-8B"] * 2 and df.gpu.tolist() == ["B200", "H100-SXM"]
    assert df.weight_dtype_bytes.iloc[0] == 1.0 and np.isnan(df.weight_dtype_bytes.iloc[1])
    assert df.attrs["assumed"] == {"no precision stated: weights at the checkpoint's own dtype": 1}
    assert df.attrs["dropped"] == {
        "model 'bigscience/bloom-176b' not in the catalog (add it, or an alias, to configs/models.yaml)": 1
    }


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


def test_every_catalog_gpu_says_where_its_constants_come_from():
    """Each GPU's roofline constants carry a source: measured rows, the pooled default of its vendor, or another
    vendor's (MI300X: no AMD rows); the capacity card says it beside the times."""
    import slimjax
    from slimjax.inputs.catalog import gpu_catalog
    from slimjax.inputs.serving import CONSTANTS_SOURCES, constants_source

    marks = {g: constants_source(g)[0] for g in gpu_catalog()}
    assert set(marks.values()) <= set(CONSTANTS_SOURCES) and all(row.get("vendor") for row in gpu_catalog().values())
    assert marks["H100-SXM"] == "measured" and marks["H200"] == "pooled" and marks["MI300X"] == "other vendor"
    assert constants_source("H100-SXM", "plain")[0] == "plain"
    card = dict(
        slimjax.capacity_cards(
            slimjax.capacity("Llama-3.1-8B", "MI300X", 512, 128, 8, serving={"efficiency": "calibrated"})
        )
    )
    assert "other vendor: no measurements of its vendor" in card["Roofline constants"]
