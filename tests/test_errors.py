"""Bad input: a clear error naming the field and value; nothing written, nothing existing touched."""

import json

import pytest

import slimjax
from slimjax import SlimjaxError
from slimjax.engine import grid

BASE = dict(models=["OPT-125m"], gpus=["H100-SXM"], batch=[1, 2, 4], input_len=[8], output_len=[4])


def err(spec, match):
    with pytest.raises(SlimjaxError, match=match):
        slimjax.sweep(spec, quiet=True)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(models=["Llama-3.1-8b-chat"]), r"models\[0\]: unknown model 'Llama-3.1-8b-chat'; did you mean"),
        (dict(gpus=["H100", "A100-SXM-80"]), r"gpus\[1\]: unknown GPU 'A100-SXM-80'; did you mean .*A100-SXM-80GB"),
        (dict(batch=[1, 0]), r"batch\[1\]: must be positive, got 0"),
        (dict(input_len=[-5]), r"input_len\[0\]: must be positive, got -5"),
        (dict(output_len={"start": 0, "stop": 10}), r"output_len\[0\]: must be positive, got 0"),
        (dict(output_len=[2.5]), r"output_len\[0\]: must be an integer, got 2.5"),
        (dict(batch=[1, 4, 2]), r"batch\[2\]: values must be strictly increasing"),
        (dict(batch={"start": 1, "stop": 8, "step": 0}), r"batch.step: must be positive"),
        (dict(batch={"start": 1}), r"batch.stop: missing"),
        (dict(batch=[2, 4]), r"batch: must contain 1 when the advisor is on"),
        (dict(slim={"eta_c": -0.1}), r"slim.eta_c: must be positive, got -0.1"),
        (dict(slim={"B0": -1}), r"slim.B0: must be non-negative, got -1"),
        (dict(slim={"H100-SXM": {"alpha": -1e-3}}), r"slim.H100-SXM.alpha: must be non-negative"),
        (dict(slim={"etac": 0.5}), r"slim.etac: not a coefficient nor a swept GPU; did you mean 'eta_c'"),
        (dict(slim={"L40S": {"eta_c": 0.5}}), r"slim.L40S: not a coefficient nor a swept GPU"),
        (dict(advisor={"epsilon": -1}), r"advisor.epsilon: must be in \[0, 1\), got -1"),
        (dict(advisor={"epsilon": 2}), r"advisor.epsilon: must be in \[0, 1\), got 2"),
        (dict(advisor={"slo_s": 0}), r"advisor.slo_s: must be positive"),
        (dict(advisor={"slo_s": 3, "slo_factor": 2}), r"advisor.slo_s: give either"),
        (dict(advisor={"slo_reference": {"batch": 0}}), r"advisor.slo_reference.batch: must be a positive integer"),
        (dict(advisor={"eps": 0.5}), r"advisor.eps: unknown key; did you mean 'epsilon'"),
        (dict(precision="float16"), r"precision: must be one of float32, float64, got 'float16'"),
        (dict(modles=["OPT-125m"]), r"modles: unknown top-level key; did you mean 'models'"),
        (dict(models=[]), r"models: must be a non-empty list"),
        (dict(models=["OPT-125m", "facebook/opt-125m"]), r"models\[1\]: 'OPT-125m' appears twice"),
        (
            dict(
                models=[
                    {
                        "name": "tiny",
                        "num_hidden_layers": 2,
                        "hidden_size": 64,
                        "num_attention_heads": 6,
                        "num_key_value_heads": 4,
                        "intermediate_size": 128,
                        "vocab_size": 100,
                    }
                ]
            ),
            r"models\[0\].num_key_value_heads: num_attention_heads \(6\) "
            r"must be divisible by num_key_value_heads \(4\)",
        ),
        (
            dict(
                models=[
                    {
                        "name": "tiny",
                        "num_hidden_layers": 0,
                        "hidden_size": 64,
                        "num_attention_heads": 4,
                        "intermediate_size": 128,
                        "vocab_size": 100,
                    }
                ]
            ),
            r"models\[0\].num_hidden_layers: must be a positive number, got 0",
        ),
        (dict(models=[{"num_hidden_layers": 2}]), r"models\[0\].name: an inline model needs a name"),
        (
            dict(gpus=[{"name": "mygpu", "tflops": 100, "bandwidth_tbs": -1, "memory_gib": 10}]),
            r"gpus\[0\].bandwidth_tbs: must be a positive number, got -1",
        ),
        (dict(gpus=[{"name": "mygpu", "tflops": 100, "memory_gib": 10}]), r"gpus\[0\].bandwidth_tbs: missing"),
    ],
)
def test_bad_spec(change, match):
    err({**BASE, **change}, match)


def test_missing_required_key():
    spec = dict(BASE)
    del spec["output_len"]
    err(spec, r"output_len: missing")


def test_unparseable_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("models: [OPT-125m\ngpus: H100\n")
    # the file, line and column where PyYAML stopped, and where the construct it was reading began
    err(
        str(path),
        r"bad.yaml:2:5: not valid YAML: expected ',' or '\]', but got ':' "
        r"\(while parsing a flow sequence, begun at 1:9\)",
    )
    path.write_text("")
    err(str(path), r"sweep file: .*bad.yaml' must hold a mapping of models, .* got an empty file")


def test_hf_config_lacking_key_in_sweep(tmp_path):
    cfg = tmp_path / "m_config.json"
    cfg.write_text(
        json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128})
    )
    err({**BASE, "models": [str(cfg)]}, r"models\[0\].vocab_size: missing")


def test_inline_model_and_gpu_work(tmp_path):
    spec = {
        **BASE,
        "models": [
            {
                "name": "tiny",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 100,
            }
        ],
        "gpus": [{"name": "mygpu", "tflops": 100, "bandwidth_tbs": 1, "memory_gib": 10, "price_per_hour": 1}],
    }
    ds = slimjax.sweep(spec, quiet=True)
    assert list(ds.model.values) == ["tiny"] and list(ds.gpu.values) == ["mygpu"]


def test_existing_store_untouched_without_overwrite(tmp_path):
    out = tmp_path / "s.zarr"
    slimjax.sweep(BASE, out, quiet=True)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SlimjaxError, match="already exists"):
        slimjax.sweep({**BASE, "input_len": [16]}, out, quiet=True)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    slimjax.sweep({**BASE, "input_len": [16]}, out, overwrite=True, quiet=True)
    assert list(slimjax.store.open_store(out).input_len.values) == [16]


def test_bad_spec_with_overwrite_keeps_existing_store(tmp_path):
    out = tmp_path / "s.zarr"
    slimjax.sweep(BASE, out, quiet=True)
    with pytest.raises(SlimjaxError):
        slimjax.sweep({**BASE, "gpus": ["nope"]}, out, overwrite=True, quiet=True)
    assert list(slimjax.store.open_store(out).input_len.values) == [8]


def test_failure_mid_sweep_keeps_the_old_store_and_the_partial_one_for_resume(tmp_path, monkeypatch):
    out = tmp_path / "s.zarr"
    slimjax.sweep(BASE, out, quiet=True)

    def boom(*a, **k):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(grid, "evaluate_block", boom)
    with pytest.raises(RuntimeError), pytest.warns(RuntimeWarning, match="s.zarr.partial.*--resume"):
        slimjax.sweep({**BASE, "input_len": [16]}, out, overwrite=True, quiet=True)
    assert list(slimjax.store.open_store(out).input_len.values) == [8]  # old store intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr", "s.zarr.partial"]  # kept, named, for --resume
    fresh = tmp_path / "new.zarr"
    with pytest.raises(RuntimeError), pytest.warns(RuntimeWarning):
        slimjax.sweep(BASE, fresh, quiet=True)
    assert not fresh.exists()  # the target appears only when complete


def test_out_must_not_be_a_foreign_folder(tmp_path):
    folder = tmp_path / "notzarr"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep")
    with pytest.raises(SlimjaxError, match="not a zarr store"):
        slimjax.sweep(BASE, folder, overwrite=True, quiet=True)
    assert (folder / "precious.txt").read_text() == "keep"
