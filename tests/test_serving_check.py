"""`slimjax validate --serving`: each measured serving row scored by the serving fit's forward model (the §9 closed
loop at its concurrency, its engine's profile) at the calibrated constants; the per-row figures equal the simulate
study's own run of that row (one forward model), and the error table is numpy's arithmetic on them."""

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import slimjax
from slimjax.cli import main
from slimjax.inputs import catalog
from slimjax.inputs.serving import calibrated_request_overhead
from slimjax.inputs.traces import LAYOUT_REASONS
from slimjax.studies import serving_check, simulate


def _rows(shared_data, n=3):
    rows = slimjax.load_traces(shared_data / "measured" / "serving_h100_trtllm_llama31_8b.csv")
    pick = rows[(rows.input_len == 1024) & (rows.output_len == 128) & rows.batch.isin([8, 32])]
    return pick.groupby(["batch"]).head(n).reset_index(drop=True)


def _row_simulation(r, per_client: int, serving: dict):
    """A direct simulation of one measured row: C clients of its (I, O) on its TP degree."""
    stream = {"clients": [int(r.batch)], "input_len": int(r.input_len), "output_len": int(r.output_len)}
    spec = dict(
        models=[r.model],
        gpus=[r.gpu],
        tp=[int(r.n_gpu)],
        batch=[int(r.batch)],
        serving=serving,
        stream={"closed_loop": dict(stream, requests_per_client=per_client)},
        precision="float64",
    )
    return simulate.run(simulate.parse(spec)).squeeze()


def test_each_row_is_its_closed_loop_and_the_table_is_its_errors(shared_data):
    rows = _rows(shared_data)
    scored = serving_check.simulate_rows(rows, requests_per_client=3)
    r = scored.iloc[0]
    ds = _row_simulation(r, 3, {"efficiency": "calibrated", "engine": r.framework})
    np.testing.assert_allclose(
        [r.sim_ttft_s - r.request_overhead_s, r.sim_tpot_s], [ds.ttft_mean_s, ds.tpot_mean_s], rtol=1e-9
    )
    assert r.ttft_error == r.sim_ttft_s / r.ttft_s - 1
    # the client-side overhead of the row's engine API (fitted, configs/roofline/default.yaml) on top of the engine's
    assert r.request_overhead_s == calibrated_request_overhead("trtllm") and 0 <= r.request_overhead_s <= 0.1
    assert r.framework.startswith("trtllm")  # the row's engine profile: TensorRT-LLM's defaults
    table = serving_check.error_table(scored)
    pooled = table[table.dimension == "all"].iloc[0]
    assert pooled.rows == len(scored)
    np.testing.assert_allclose(pooled.ttft_mape_pct, 100 * np.mean(np.abs(scored.ttft_error)))
    np.testing.assert_allclose(pooled.tpot_bias_pct, 100 * np.mean(scored.tpot_error))
    assert set(table[table.dimension == "band"].value) == {"5–16", "17–64"}  # concurrency 8 and 32
    assert set(table[table.dimension == "engine"].value) == {"trtllm"}
    # a capacity planner's check: TPOT is at least one batch-1 decode step's weights ÷ bandwidth (TP n: n GPUs)
    assert (scored.sim_tpot_s > 16e9 / (scored.n_gpu * 3.35e12)).all()  # the weights split over n GPUs


def test_cli_scores_a_serving_file(shared_data, tmp_path):
    rows = _rows(shared_data, n=1)
    raw = pd.read_csv(shared_data / "measured" / "serving_h100_trtllm_llama31_8b.csv")
    keep = raw[(raw.isl == 1024) & (raw.osl == 128) & raw.batch_size.isin([8]) & (raw.tp_size == 1)].head(1)
    path = tmp_path / "serving.csv"
    keep.to_csv(path, index=False)
    out = tmp_path / "scored.csv"
    result = CliRunner().invoke(main, ["validate", "--serving", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "TTFT MAPE %" in result.output and "| all |" in result.output
    assert len(pd.read_csv(out)) == 1 and len(rows) >= 1


def test_api_validate_serving_is_the_serving_check(shared_data, tmp_path):
    """What `validate --serving` runs lives in the library: api.validate(serving=True) scores the file's rows
    through serving_check.simulate_rows and tabulates them with error_table, and says what it read."""
    from slimjax.api import validate
    from slimjax.inputs.traces import load_traces

    raw = pd.read_csv(shared_data / "measured" / "serving_h100_trtllm_llama31_8b.csv")
    keep = raw[(raw.isl == 1024) & (raw.osl == 128) & raw.batch_size.isin([8]) & (raw.tp_size == 1)].head(1)
    path = tmp_path / "serving.csv"
    keep.to_csv(path, index=False)
    got = validate([path], serving=True)
    want = serving_check.simulate_rows(load_traces(path))
    pd.testing.assert_frame_equal(got.rows, want)
    pd.testing.assert_frame_equal(got.table, serving_check.error_table(want))
    assert got.markdown == serving_check.error_markdown(got.table)
    assert got.read[0].startswith(f"{path}: 1 rows kept of 1 read")
    with pytest.raises(slimjax.SlimjaxError, match="traces: .*nope.csv not found"):
        validate([tmp_path / "nope.csv"], serving=True)


def test_each_row_runs_with_its_engine_profile(shared_data, tmp_path):
    """A two-row file of the shared serving runs, one vLLM and one SGLang row: each is simulated with its engine's
    profile (a vLLM row equals a simulation of `engine: vllm`, an SGLang row one of `engine: sglang`), and rows of
    layouts that cannot be served yet are dropped at reading with why, never scored as another layout."""
    raw = pd.read_csv(shared_data / "measured" / "serving_silicon_h100_h200.csv")
    dense = raw[raw.model_path.str.contains("Llama-3.1-8B") & (raw["mode"] == "agg")].sort_values("batch_size")
    two = pd.concat([dense[dense.backend == b].head(1) for b in ("vllm", "sglang")])  # the fewest clients
    odd = raw[raw["mode"] == "disagg"].head(1)
    path = tmp_path / "two.csv"
    pd.concat([two, odd]).to_csv(path, index=False)
    rows = slimjax.load_traces(path)
    assert len(rows) == 2 and rows.attrs["dropped"] == {LAYOUT_REASONS["disaggregated"]: 1}
    assert rows.attrs["assumed"] == {"with an fp8 KV cache (their precision is 8-bit or below)": 2}
    scored = serving_check.simulate_rows(rows, requests_per_client=2)
    for _, r in scored.iterrows():
        serving = {"efficiency": "calibrated", "engine": r.framework.split()[0]}
        serving["weight_dtype_bytes"] = float(r.weight_dtype_bytes)
        if np.isfinite(r.kv_dtype_bytes):  # an fp8 run's KV cache is fp8 (its reading says so)
            serving["kv_dtype_bytes"] = float(r.kv_dtype_bytes)
        ds = _row_simulation(r, 2, serving)  # the study's own simulation: one forward model, two code paths
        np.testing.assert_allclose(
            [r.sim_ttft_s - r.request_overhead_s, r.sim_tpot_s], [ds.ttft_mean_s, ds.tpot_mean_s], rtol=1e-9
        )
    table = serving_check.error_table(scored)
    assert set(table[table.dimension == "engine"].value) == {"vllm", "sglang"}
    assert set(table[table.dimension == "harness"].value) == {"closed_loop"}  # aiconfigurator's: the default


def test_a_row_that_cannot_be_built_is_listed_not_fatal(shared_data):
    rows = _rows(shared_data, n=1)
    bad = rows.iloc[:1].assign(n_gpu=3)  # a TP degree that does not divide Llama-3.1-8B's 32 heads
    scored = serving_check.simulate_rows(pd.concat([rows, bad], ignore_index=True), requests_per_client=2)
    assert scored.sim_ttft_s.notna().sum() == len(rows)
    table = serving_check.error_table(scored)
    ((why, n),) = table.attrs["not_run"].items()
    assert n == 1 and "does not divide the query heads" in why
    assert f"not run: 1 rows: {why}" in serving_check.error_markdown(table)


def test_disaggregated_rows_are_read_apart_and_run_through_both_pools(shared_data, tmp_path):
    """The shared file's disaggregated rows: read only with disaggregated=True (clients = the decode pool's slots,
    n_gpu = both pools' GPUs), those without their pools' workers listed with why, a pool whose attention TP crosses
    nodes listed with its pool named; a runnable row's closed loop settles, every later request of a client arriving
    as its last ends (docs/layouts.md), and its TPOT is no faster than the decode group's weights read once per step."""
    raw = pd.read_csv(shared_data / "measured" / "serving_silicon_h100_h200.csv")
    disagg = raw[raw["mode"] == "disagg"]
    stated = disagg[disagg.prefill_num_workers.notna()]
    small = stated[(stated.system == "h200_sxm") & (stated.decode_batch_size == 4) & (stated.prefill_tp_size == 8)]
    picked = pd.concat(
        [
            small.head(1),
            stated[stated.decode_tp_size == 16].head(1),  # TP 16 attention over two H100 nodes
            disagg[disagg.prefill_num_workers.isna()].head(1),
            raw[raw["mode"] == "agg"].head(1),
        ]
    )
    path = tmp_path / "disagg.csv"
    picked.to_csv(path, index=False)
    assert len(slimjax.load_traces(path)) == 1  # the aggregated row only
    rows = slimjax.load_traces(path, disaggregated=True)
    dropped = rows.attrs["dropped"]
    assert len(rows) == 2 and sum(dropped.values()) == 2
    assert any("workers or batch are not stated" in why for why in dropped)
    first = picked.iloc[0]
    clients = first.decode_batch_size * first.decode_num_workers * first.decode_attention_dp_size
    assert rows.batch.iloc[0] == clients and rows.n_gpu.iloc[0] == 8 + 8 * first.decode_num_workers
    apart = tmp_path / "apart.csv"  # the disaggregated rows alone, as validate --serving scores them
    picked.iloc[:3].to_csv(apart, index=False)
    from slimjax.api import validate

    got = validate([apart], serving=True, requests_per_client=2)
    assert got.read[-1].startswith(f"{apart}: 2 rows kept of 3 read") and got.read[-1].endswith("(disaggregated)")
    scored = got.rows
    ok, crossing = scored.iloc[0], scored.iloc[1]
    assert np.isfinite([ok.sim_ttft_s, ok.sim_tpot_s]).all() and ok.not_run == ""
    assert ok.closed_loop_passes >= 2 and ok.layout_kind == "disaggregated"
    assert np.isnan(crossing.sim_ttft_s) and crossing.not_run.startswith("its decode pool: ")
    assert "more than one node" in crossing.not_run
    # back of the envelope: a decode step reads at least the dense part and one expert's weights per MoE layer on
    # each of the decode group's 8 GPUs at its full HBM bandwidth
    arch = catalog.resolve_model("DeepSeek-V3")[1]
    gpu = catalog.resolve_gpu("H200", "gpu")[1]
    P_e = arch["n_ffn"] * arch["hidden"] * arch["expert_ffn_dim"]
    dense = arch["n_params"] - arch["n_experts"] * arch["n_moe_layers"] * P_e
    floor = (dense + arch["n_moe_layers"] * P_e) * 1.0 / (8 * gpu["bandwidth_bytes_per_s"])
    assert ok.sim_tpot_s > floor
    table = serving_check.error_table(scored)
    assert table[table.dimension == "layout_kind"].value.tolist() == ["disaggregated"]
    assert "its decode pool" in serving_check.error_markdown(table)


def test_a_disaggregated_row_on_a_gpu_without_a_network_is_listed(shared_data, monkeypatch):
    """The KV crosses the network between the pools: a GPU whose entry has no network_gbs cannot run the row, and
    says what to add where (every catalog GPU has one; a user's own entry may not)."""
    rows = slimjax.load_traces(shared_data / "measured" / "serving_silicon_h100_h200.csv", disaggregated=True).head(1)
    real = serving_check.resolve_gpu

    def without_network(name, field):
        label, row = real(name, field)
        return label, {**row, "network_bytes_per_s": 0.0}

    monkeypatch.setattr(serving_check, "resolve_gpu", without_network)
    scored = serving_check.simulate_disaggregated_rows(rows, requests_per_client=2)
    assert np.isnan(scored.sim_ttft_s.iloc[0])
    assert (
        scored.not_run.iloc[0].startswith("its GPU has no network_gbs")
        and "configs/gpus.yaml" in scored.not_run.iloc[0]
    )
