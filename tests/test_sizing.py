"""MODEL.md §8 "Sizing by simulation": R_sim is the smallest R whose §9 simulation meets the SLOs, checked with
the plain Python event loop of tests/serving_reference.py on a slice of Azure's conversation trace, where the
screen is optimistic and where it is pessimistic; a candidate no R can serve is infeasible with its SLO named."""

import numpy as np
import pytest
import serving_reference as sref

import slimjax
from slimjax.constants import KV_POLICIES
from slimjax.errors import SlimjaxError
from slimjax.inputs import catalog
from slimjax.studies import candidates
from slimjax.studies.procure import sizing
from slimjax.studies.procure import spec as procurefile

SLO = {"ttft_s": 1.0, "itl_s": 0.05, "quantile": 0.9}


@pytest.fixture(scope="module")
def azure_slice(shared_data, tmp_path_factory):
    lines = (shared_data / "traces" / "AzureLLMInferenceTrace_conv.csv").read_text().splitlines()[:241]
    path = tmp_path_factory.mktemp("trace") / "conv_slice.csv"
    path.write_text("\n".join(lines) + "\n")  # a slice of the shared trace, in the test's own temp dir
    return path


@pytest.fixture(scope="module")
def sized(azure_slice):
    spec = dict(
        workloads=[dict(name="conv", trace=str(azure_slice), format="azure", classes=2)],
        rate_scale=[4],
        models=["Llama-3.1-8B"],
        gpus=["H100-SXM", "A100-SXM-80GB", "L40S"],
        tp=[1],
        batch=[8, 32],
        slo=SLO,
    )
    study = procurefile.parse(spec)
    return study, slimjax.procure(study)


def _reference_meets(study, m, g, n, b, replicas, stream=None):
    """The reference event loop's verdict on (model m, GPU g, TP index n, batch index b) at ``replicas``, under the
    study's KV policy and step order (docs/engines.md)."""
    if stream is None:
        stream = candidates.workload_stream(study.workloads[0], float(study.total_rate[0, 0]), study.sizing)
    sv = {k: float(np.asarray(v)[m, g, n]) for k, v in study.serving.fields().items()}
    terms = sref.replica_terms(catalog.resolve_model(study.models[m])[1], catalog.resolve_gpu(study.gpus[g])[1], sv)
    out = sref.simulate(
        terms,
        stream["arrival_s"].tolist(),
        [int(x) for x in stream["input_len"]],
        [int(x) for x in stream["output_len"]],
        int(study.batch[b]),
        replicas,
        policy=list(KV_POLICIES)[int(sv["kv_policy"])],
        watermark=sv["kv_watermark"],
        prefill_first=bool(sv["prefill_first"]),
    )
    ttft, e2e, o_len = np.asarray(out["ttft"]), np.asarray(out["e2e"]), stream["output_len"]
    tpot = np.where(o_len > 1, (e2e - ttft) / np.maximum(o_len - 1, 1), np.nan)
    q = study.slo["quantile"]
    return np.quantile(ttft, q) <= study.slo["ttft_s"] and np.nanquantile(tpot, q) <= study.slo["itl_s"]


def test_replicas_are_the_fewest_the_reference_simulation_accepts(sized):
    study, ds = sized
    r_sim = ds.replicas.isel(workload=0, rate=0, model=0, tp=0).values  # (gpu, batch)
    r_screen = ds.replicas_screen.isel(workload=0, rate=0, model=0, tp=0).values
    ok = np.isfinite(r_sim) & np.isfinite(r_screen)
    assert (r_screen[ok] < r_sim[ok]).any() and (r_screen[ok] > r_sim[ok]).any()  # the screen errs both ways
    picks = [np.argwhere(ok & (r_screen < r_sim))[0], np.argwhere(ok & (r_screen > r_sim))[0]]
    for g, b in picks:
        r = int(r_sim[g, b])
        assert _reference_meets(study, 0, g, 0, b, r)
        assert r == 1 or not _reference_meets(study, 0, g, 0, b, r - 1)


def test_cost_and_choice_follow_the_simulated_fleet(sized):
    study, ds = sized
    sel = dict(workload=0, rate=0, model=0)
    cost = ds.cost_per_hour.isel(sel)
    price = np.asarray(study.gpu.price_per_hour)[:, None, None]
    np.testing.assert_allclose(cost.values, ds.replicas.isel(sel).values * ds.tp.values[None, :, None] * price)
    assert float(ds.best_cost_per_hour.isel(sel)) == float(np.nanmin(cost.values))
    best = ds.sel(
        gpu=str(ds.best_gpu.isel(sel).values), tp=int(ds.best_tp.isel(sel)), batch=int(ds.best_batch.isel(sel))
    )
    best = best.isel(sel)
    assert float(best.replicas) == float(ds.best_replicas.isel(sel))
    assert float(best.sim_ttft_p_s) <= SLO["ttft_s"] and float(best.sim_tpot_p_s) <= SLO["itl_s"]
    assert float(ds.best_replicas_screen.isel(sel)) == float(best.replicas_screen)
    assert np.isfinite(float(ds.mix_cost_per_hour.isel(sel)))
    # what the sized answer assumed, in the store and at the end of its tables: the simulated prefill, not the screen's
    import json

    from slimjax.studies.procure.tables import ranked_tables

    said = json.loads(ds.attrs["assumptions"])
    assert any(a.startswith("prefill (simulated): prompts share engine steps of 2048 tokens") for a in said)
    assert not any(a.startswith("prefill (screen)") for a in said)
    assert ranked_tables(ds).split("assumptions:")[1].strip().startswith("prices: illustrative")


def test_a_lone_request_breaking_an_slo_is_infeasible_with_it_named(azure_slice):
    spec = dict(
        workloads=[dict(name="conv", trace=str(azure_slice), format="azure", classes=1)],
        rate_scale=[1],
        models=["Llama-3.1-8B"],
        gpus=["L40S"],
        tp=[1],
        batch=[8],
        slo={"ttft_s": 2.0, "itl_s": 0.004},  # a token every 4 ms: faster than one L40S decode step
        sizing={"max_replicas": 8},
    )
    ds = slimjax.procure(spec)
    assert not bool(ds.feasible.squeeze()) and np.isnan(float(ds.replicas.squeeze()))
    assert sizing.SIM_REASONS[int(ds.sim_reason.squeeze())] == "itl"
    assert sizing.SIM_REASONS[int(ds.binding_slo.squeeze())] == "itl"
    assert np.isnan(float(ds.best_cost_per_hour.squeeze()))


def test_bad_sizing_names_the_field():
    base = dict(
        workloads=[dict(name="w", input_len=100, output_len=10)],
        rates=[1],
        models=["Llama-3.1-8B"],
        gpus=["H100-SXM"],
        slo={"ttft_s": 1},
    )
    for bad, field in (
        ({"method": "guess"}, "sizing.method"),
        ({"max_replicas": 0}, "sizing.max_replicas"),
        ({"replicas": 3}, "sizing.replicas"),
    ):
        with pytest.raises(SlimjaxError, match=field.replace(".", r"\.")):
            procurefile.parse({**base, "sizing": bad})
    with pytest.raises(SlimjaxError, match="resume"):
        slimjax.procure(base, resume=True)


def test_reports_draw_sizing_and_simulation_stores(sized, tmp_path):
    from slimjax.store.sink import write_dataset

    _, ds = sized
    write_dataset(ds, tmp_path / "sized.zarr")
    stream = {"poisson": 4.0, "input_len": 500, "output_len": 40, "requests": 60, "seed": 1}
    slimjax.simulate(dict(models=["Llama-3.1-8B"], gpus=["L40S"], batch=[4, 16], stream=stream), tmp_path / "sim.zarr")
    page = slimjax.make_report([tmp_path / "sized.zarr", tmp_path / "sim.zarr"], tmp_path / "report")
    html = page.read_text()
    assert "Replicas by simulation vs the screen" in html and "TTFT and TPOT distributions" in html
    assert (tmp_path / "report" / "sized_sizing_conv.png").is_file()
    assert (tmp_path / "report" / "sim_simulation.png").is_file()
    assert "Simulated candidates" in html


def test_a_fixed_length_workload_is_sized_on_a_seeded_poisson_stream():
    spec = dict(
        workloads=[dict(name="chat", input_len=800, output_len=60)],
        rates=[6.0],
        models=["Llama-3.1-8B"],
        gpus=["L40S"],
        tp=[1],
        batch=[16],
        slo={"ttft_s": 0.5, "itl_s": 0.05},
        sizing={"requests": 150, "seed": 3},
    )
    study = procurefile.parse(spec)
    stream = candidates.workload_stream(study.workloads[0], 6.0, study.sizing)
    assert len(stream["arrival_s"]) == 150 and np.all(np.diff(stream["arrival_s"]) >= 0)
    assert 4.0 < 149 / stream["arrival_s"][-1] < 9.0  # about the study's rate
    ds = slimjax.procure(study).squeeze()
    r = int(ds.replicas)
    assert float(ds.sim_ttft_p_s) <= 0.5 and float(ds.sim_tpot_p_s) <= 0.05
    assert r == 1 or not _reference_meets(study, 0, 0, 0, 0, r - 1, stream=stream)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_procurement_is_sized_with_the_engine_the_study_names(engine):
    """A study that names its engine is sized under that engine's profile (paged KV, its budget, prefill first for
    SGLang): R_sim is the fewest replicas the event loop with the same rules accepts, and the store says which
    engine it assumed."""
    import json

    spec = dict(
        workloads=[dict(name="chat", input_len=1500, output_len=300)],
        rates=[8.0],
        models=["Llama-3.1-8B"],
        gpus=["L40S"],
        tp=[1],
        batch=[32],
        slo={"ttft_s": 1.0, "itl_s": 0.06},
        serving={"engine": engine, "gpu_memory_utilization": 0.5},
        sizing={"requests": 120, "seed": 5},
    )
    study = procurefile.parse(spec)
    stream = candidates.workload_stream(study.workloads[0], 8.0, study.sizing)
    ds = slimjax.procure(study)
    said = json.loads(ds.attrs["assumptions"])
    assert any(a.startswith("engine: " + ("vLLM" if engine == "vllm" else "SGLang")) for a in said)
    r = int(ds.replicas.squeeze())
    assert _reference_meets(study, 0, 0, 0, 0, r, stream=stream)
    assert r == 1 or not _reference_meets(study, 0, 0, 0, 0, r - 1, stream=stream)


def test_engine_settings_are_procurement_candidates_each_its_own_study(tmp_path):
    """``settings`` (issue 36, item 5): the study once per engine setting, along dim ``setting``, each equal to the
    study whose serving block sets those keys (replicas, cost and choice, bit for bit); ``best_setting`` is the
    cheapest setting's label; the tables print each setting and compare them; the store keeps each setting's
    assumptions; a bad setting is named; killed after its first part (of one per setting), it resumes with that part
    kept and ends as the uninterrupted run."""
    import json

    base = dict(
        workloads=[dict(name="long", input_len=4000, output_len=120)],
        rates=[6.0],
        models=["Llama-3.1-8B"],
        gpus=["H100-SXM"],
        tp=[1],
        batch=[16],
        slo={"ttft_s": 1.0, "itl_s": 0.03},
        sizing={"requests": 120, "seed": 2, "max_replicas": 8},
    )
    settings = [{"step_tokens": 8192}, {"step_tokens": 512, "chunk_size": 512}]
    out = tmp_path / "settings.zarr"
    ds = slimjax.procure({**base, "settings": settings}, out)
    labels = ["step_tokens 8192", "step_tokens 512, chunk_size 512"]
    assert list(ds.setting.values) == labels and "setting" not in ds.total_rate.dims
    costs = []
    for label, keys in zip(labels, settings, strict=True):
        alone = slimjax.procure({**base, "serving": keys})
        got = ds.sel(setting=label)
        for name in ("replicas", "cost_per_hour", "best_cost_per_hour", "best_replicas", "sim_ttft_p_s"):
            np.testing.assert_array_equal(got[name].values, alone[name].values, err_msg=f"{label}: {name}")
        costs.append(float(alone.best_cost_per_hour.squeeze()))
    assert str(ds.best_setting.squeeze().values) == labels[int(np.argmin(costs))]
    text = slimjax.procure_tables(ds)
    assert text.count("######## engine setting:") == 2 and "engine settings compared" in text and "← cheapest" in text
    assert "engine steps of 512 tokens" in text and "engine steps of 8192 tokens" in text  # each its own assumptions
    from slimjax.studies.procure import figures

    keys = [f.key for f in figures.procurement_figures(ds)]
    assert keys[0] == "settings_long" and "procurement_long_setting1" in keys  # compared, then each setting's
    import xarray as xr

    stored = xr.open_zarr(out)
    np.testing.assert_array_equal(stored.replicas.values, ds.replicas.values)
    assert json.loads(stored.attrs["settings"]) == labels
    with pytest.raises(SlimjaxError) as e:
        procurefile.parse({**base, "settings": [{"step_tokens": 256}, {"chunk_size": -1}]})
    assert e.value.field == "settings[1].chunk_size"
    real, calls = sizing._size_part, []

    def dies_after_one(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt  # a kill between parts: the second setting's
        calls.append(args[2:4])
        return real(*args, **kwargs)

    again = tmp_path / "again.zarr"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sizing, "_size_part", dies_after_one)
        with pytest.raises(KeyboardInterrupt):
            slimjax.procure({**base, "settings": settings}, again)
    report = slimjax.api.verify_store(again)
    assert (report["unit"], report["blocks"], report["recorded"]) == ("parts", 2, 1)
    calls.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sizing, "_size_part", lambda *a, **k: calls.append(a[2:4]) or real(*a, **k))
        resumed = slimjax.procure({**base, "settings": settings}, again, resume=True)
    assert calls == [(0, 0)]  # the second setting's only part: the first setting's was kept
    for name in ("replicas", "cost_per_hour", "best_setting", "sim_ttft_p_s"):
        np.testing.assert_array_equal(resumed[name].values, ds[name].values, err_msg=name)
    with pytest.raises(SlimjaxError) as e:  # screened settings have no journal to resume from
        slimjax.procure({**base, "settings": settings, "sizing": "screen"}, tmp_path / "s.zarr", resume=True)
    assert e.value.field == "resume"


def test_the_shipped_engine_settings_study_parses(shared_data):
    """sweeps/procure_engine_settings.yaml: one study per setting, each its own serving (step budget and chunk)."""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "sweeps" / "procure_engine_settings.yaml"
    study = procurefile.parse(path)
    assert [label for label, _ in study.variants] == [
        "step_tokens 8192",
        "step_tokens 2048",
        "step_tokens 512, chunk_size 512",
        "step_tokens 256, chunk_size 256",
    ]
    steps = [float(np.unique(v.serving.step_tokens)[0]) for _, v in study.variants]
    assert steps == [8192.0, 2048.0, 512.0, 256.0]
    assert study.serving_table["Llama-3.1-70B"]["H100-SXM"]["engine"].startswith("vLLM")


def test_a_killed_sized_study_resumes_from_its_finished_parts(sized, tmp_path, monkeypatch):
    """Sized by simulation, a study is kept part by part (one per workload × rate): killed after its first part,
    ``verify`` counts 1 of 2 parts, ``resume`` computes only the second, and the store equals an uninterrupted run's."""
    study, whole = sized
    spec = dict(study.spec, rate_scale=[2, 4])
    study = procurefile.parse(spec)
    out = tmp_path / "sized.zarr"
    real, calls = sizing._size_part, []

    def dies_after_one(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt  # a kill between parts
        calls.append(args[2:4])
        return real(*args, **kwargs)

    monkeypatch.setattr(sizing, "_size_part", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        slimjax.procure(study, out)
    report = slimjax.api.verify_store(out)
    assert (report["unit"], report["blocks"], report["recorded"], report["missing"]) == ("parts", 2, 1, [1])
    with pytest.raises(SlimjaxError, match="partial store .* exists: pass resume=True"):
        slimjax.procure(study, out)
    calls.clear()
    monkeypatch.setattr(sizing, "_size_part", lambda *a, **k: calls.append(a[2:4]) or real(*a, **k))
    resumed = slimjax.procure(study, out, resume=True)
    assert calls == [(0, 1)]  # workload 0 at the second rate: the first was kept
    assert not (tmp_path / "sized.zarr.partial").exists()
    report = slimjax.api.verify_store(out)  # the complete store: every part in it
    assert (report["unit"], report["blocks"], report["recorded"], report["ok"]) == ("parts", 2, 2, True)
    again = slimjax.procure(study)
    for v in ("replicas", "cost_per_hour", "sim_ttft_p_s", "best_gpu", "replicas_by_class"):
        if v in again:
            np.testing.assert_array_equal(resumed[v].values, again[v].values)
    # the shared rate's answers are the first fixture's, part by part or together
    np.testing.assert_array_equal(resumed["replicas"].sel(rate="4x").values, whole["replicas"].sel(rate="4x").values)


def test_parts_of_another_study_are_not_resumed(tmp_path):
    """A partial folder left by another study (another key or part count) is refused, naming overwrite; a part is
    kept whole (written under a temporary name, then renamed)."""
    from slimjax.store.parts import PartsJournal

    out = tmp_path / "s.zarr"
    first = PartsJournal(out, "study A", 3, resume=False)
    first.record(1, {"replicas": np.arange(4.0)})
    assert list(first.done()) == [1] and np.array_equal(first.done()[1]["replicas"], np.arange(4.0))
    assert sorted(p.name for p in first.folder.iterdir()) == ["part-1.npz", "study.json"]
    for key, n in (("study B", 3), ("study A", 4)):
        with pytest.raises(SlimjaxError, match="was another study .* pass overwrite=True"):
            PartsJournal(out, key, n, resume=True)
    assert list(PartsJournal(out, "study A", 3, resume=True).done()) == [1]
    assert PartsJournal(out, "study B", 3, resume=False).done() == {}  # overwrite: started over


def test_a_sized_study_refuses_the_dask_scheduler_in_one_line(sized, tmp_path):
    """Dask runs the screen's blocks only: a study sized by simulation refuses it before any work, naming the flag."""
    study, _ = sized
    with pytest.raises(SlimjaxError, match="scheduler.*applies to the screen alone: give sizing: screen"):
        slimjax.procure(study, tmp_path / "sized.zarr", scheduler="dask")
