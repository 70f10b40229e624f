"""`slimjax validate --serving`: each measured serving row scored by the §9 closed loop at its concurrency; the
per-row figures equal a direct simulation of that row, and the error table is numpy's arithmetic on them."""

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import slimjax
from slimjax.cli import main
from slimjax.studies import serving_check, simulate


def _rows(shared_data, n=3):
    rows = slimjax.load_traces(shared_data / "measured" / "serving_h100_trtllm_llama31_8b.csv")
    pick = rows[(rows.input_len == 1024) & (rows.output_len == 128) & rows.batch.isin([8, 32])]
    return pick.groupby(["batch"]).head(n).reset_index(drop=True)


def test_each_row_is_its_closed_loop_and_the_table_is_its_errors(shared_data):
    rows = _rows(shared_data)
    scored = serving_check.simulate_rows(rows, requests_per_client=3)
    r = scored.iloc[0]
    sim = simulate.parse(
        dict(
            models=[r.model],
            gpus=[r.gpu],
            tp=[int(r.n_gpu)],
            batch=[int(r.batch)],
            serving={"efficiency": "calibrated"},
            stream={
                "closed_loop": {
                    "clients": [int(r.batch)],
                    "input_len": int(r.input_len),
                    "output_len": int(r.output_len),
                    "requests_per_client": 3,
                }
            },
        )
    )
    ds = simulate.run(sim).squeeze()
    assert r.sim_ttft_s == float(ds.ttft_mean_s) and r.sim_tpot_s == float(ds.tpot_mean_s)
    assert r.ttft_error == r.sim_ttft_s / r.ttft_s - 1
    table = serving_check.error_table(scored)
    pooled = table[table.gpu == "all"].iloc[0]
    assert pooled.rows == len(scored)
    np.testing.assert_allclose(pooled.ttft_mape_pct, 100 * np.mean(np.abs(scored.ttft_error)))
    np.testing.assert_allclose(pooled.tpot_bias_pct, 100 * np.mean(scored.tpot_error))
    bands = set(table.band) - {"all"}
    assert bands == {"5–16", "17–64"}  # concurrency 8 and 32
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
