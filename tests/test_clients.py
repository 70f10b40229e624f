"""Benchmark clients in (issue 14, item 3): GuideLLM reports and `vllm bench serve --save-result` with per-request
detail, read into the canonical trace table with their 90th percentiles. The fixtures are written here in each
tool's documented schema, not copied from any run:

- GuideLLM: the report is ``{"benchmarks": [GenerativeBenchmark, …]}``; a benchmark's ``metrics``
  (GenerativeMetrics) holds StatusDistributionSummary fields ``request_latency`` (s), ``time_to_first_token_ms``,
  ``inter_token_latency_ms``, ``prompt_token_count``, ``output_token_count``, ``request_concurrency``, each with a
  ``successful`` DistributionSummary (``mean``, ``median``, ``percentiles.p90`` …); ``args.strategy`` is e.g.
  ``{"type_": "concurrent", "streams": 8}`` and ``worker.backend_model`` the model (guidellm
  ``src/guidellm/benchmark/benchmark.py``, ``src/guidellm/objects/statistics.py``).
- vLLM: ``vllm bench serve --save-result --save-detailed`` writes ``max_concurrency``, ``completed``,
  ``total_input_tokens``, ``total_output_tokens``, ``duration``, ``mean_ttft_ms``, ``mean_tpot_ms``,
  ``mean_e2el_ms`` and per request ``ttfts`` (s), ``itls`` (a list of gaps per request, s), ``input_lens``,
  ``output_lens``; ``--metric-percentiles 90`` adds ``p90_ttft_ms`` … (vllm ``benchmarks/serve.py``); ``request_rate``
  is the offered rate (a number, or ``"inf"``: all at once) and ``max_concurrency`` is null without a cap, beside
  ``request_throughput`` (completed requests/s).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import slimjax
from slimjax.inputs.traces import detect_format


def _summary(mean, p90):
    return {
        "successful": {"mean": mean, "median": mean, "percentiles": {"p50": mean, "p90": p90, "p99": p90 * 1.2}},
        "errored": {"mean": 0.0},
        "incomplete": {"mean": 0.0},
        "total": {"mean": mean},
    }


def guidellm_report(streams=(1, 8), poisson_rate=None):
    benchmarks = []
    for n in streams:
        strategy = (
            {"type_": "concurrent", "streams": n}
            if poisson_rate is None
            else {"type_": "poisson", "rate": poisson_rate}
        )
        benchmarks.append(
            {
                "type_": "generative_benchmark",
                "run_id": "r",
                "args": {"strategy": strategy},
                "worker": {"type_": "generative_requests_worker", "backend_model": "meta-llama/Llama-3.1-8B-Instruct"},
                "start_time": 0.0,
                "end_time": 60.0,
                "metrics": {
                    "requests_per_second": _summary(n / 4.0, n / 3.5),
                    "request_concurrency": _summary(n - 0.2, n),
                    "request_latency": _summary(4.0 + 0.1 * n, 5.0 + 0.1 * n),
                    "prompt_token_count": _summary(1024.0, 1024.0),
                    "output_token_count": _summary(256.0, 256.0),
                    "time_to_first_token_ms": _summary(80.0 + 5 * n, 120.0 + 8 * n),
                    "inter_token_latency_ms": _summary(14.0 + 0.5 * n, 16.0 + 0.6 * n),
                },
            }
        )
    return {"benchmarks": benchmarks}


def vllm_result(detail=True, percentiles=False):
    r = {
        "date": "20261203-000000",
        "backend": "vllm",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "max_concurrency": 4,
        "completed": 4,
        "duration": 12.0,
        "total_input_tokens": 4 * 1000,
        "total_output_tokens": 4 * 200,
        "mean_ttft_ms": 90.0,
        "mean_tpot_ms": 15.0,
        "mean_e2el_ms": 3100.0,
    }
    if detail:
        r.update(
            ttfts=[0.08, 0.09, 0.10, 0.2],
            itls=[[0.014, 0.015], [0.016], [0.015, 0.03, 0.014], [0.015]],
            input_lens=[1000] * 4,
            output_lens=[200] * 4,
        )
    if percentiles:
        r.update(p90_ttft_ms=150.0, p90_itl_ms=25.0)
    return r


def test_guidellm_report_every_field_mapped(tmp_path):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(guidellm_report()))
    assert detect_format(path) == "guidellm_json"
    df = slimjax.load_traces(path, gpu="H100-SXM")
    assert list(df["batch"]) == [1, 8] and (df["model"] == "Llama-3.1-8B").all() and (df["gpu"] == "H100-SXM").all()
    row = df.iloc[1]
    assert row.input_len == 1024 and row.output_len == 256
    assert row.e2e_s == pytest.approx(4.8) and row.throughput == pytest.approx(8 * 1280 / 4.8)
    assert row.ttft_s == pytest.approx(0.120) and row.itl_s == pytest.approx(0.018)
    assert row.ttft_p90_s == pytest.approx(0.184) and row.itl_p90_s == pytest.approx(0.0208)
    assert row.max_concurrency == 8 and np.isnan(row.arrival_rate)  # a concurrency sweep offers no rate
    path.write_text(json.dumps(guidellm_report(streams=(4,), poisson_rate=1.5)))
    row = slimjax.load_traces(path, gpu="H100-SXM").iloc[0]
    assert row.arrival_rate == 1.5 and np.isnan(row.max_concurrency) and row.batch == 4  # mean concurrency 3.8


def test_vllm_per_request_detail_keeps_the_p90(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(vllm_result()))
    df = slimjax.load_traces(path, gpu="H100-SXM")
    row = df.iloc[0]
    assert row.ttft_p90_s == pytest.approx(np.percentile([0.08, 0.09, 0.10, 0.2], 90))
    assert row.itl_p90_s == pytest.approx(np.percentile([0.014, 0.015, 0.016, 0.015, 0.03, 0.014, 0.015], 90))
    path.write_text(json.dumps(vllm_result(detail=False, percentiles=True)))
    row = slimjax.load_traces(path, gpu="H100-SXM").iloc[0]
    assert row.ttft_p90_s == pytest.approx(0.150) and row.itl_p90_s == pytest.approx(0.025)
    path.write_text(json.dumps(vllm_result(detail=False)))
    assert np.isnan(slimjax.load_traces(path, gpu="H100-SXM").iloc[0].ttft_p90_s)  # not in the source: not invented
    assert row.max_concurrency == 4 and np.isnan(row.arrival_rate)
    # a rate-driven run without a cap: the offered rate kept, the batch the mean in flight (Little's law)
    path.write_text(
        json.dumps(
            {**vllm_result(detail=False), "request_rate": 2.0, "max_concurrency": None, "request_throughput": 1.9}
        )
    )
    row = slimjax.load_traces(path, gpu="H100-SXM").iloc[0]
    assert row.arrival_rate == 2.0 and np.isnan(row.max_concurrency) and row.batch == round(1.9 * 3.1)
    path.write_text(json.dumps({**vllm_result(detail=False), "request_rate": "inf"}))
    assert np.isnan(slimjax.load_traces(path, gpu="H100-SXM").iloc[0].arrival_rate)  # a burst has no rate


@pytest.mark.parametrize(
    "break_it,field",
    [
        (
            lambda d: d["benchmarks"][1]["metrics"].pop("time_to_first_token_ms"),
            "benchmarks[1].metrics.time_to_first_token_ms",
        ),
        (
            lambda d: d["benchmarks"][0]["metrics"]["request_latency"]["successful"].update(mean="slow"),
            "benchmarks[0].metrics.request_latency.successful.mean",
        ),
        (lambda d: d.update(benchmarks=[]), "'benchmarks'"),
    ],
)
def test_a_malformed_report_names_file_and_field(tmp_path, break_it, field):
    doc = guidellm_report()
    break_it(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(slimjax.SlimjaxError) as e:
        slimjax.load_traces(path, format="guidellm_json", gpu="H100-SXM")
    assert str(path) in str(e.value) and field in str(e.value)


def test_aiconfigurator_rows_without_a_backend_version_keep_their_framework(tmp_path, shared_data):
    import pandas as pd

    src = pd.read_csv(shared_data / "measured" / "serving_h100_trtllm_llama31_8b.csv").head(6)
    src.loc[src.index[:4], "backend_version"] = np.nan  # as most rows of other aiconfigurator exports have it
    path = tmp_path / "aic.csv"
    src.to_csv(path, index=False)
    df = slimjax.load_traces(path)
    assert len(df) == 6 and df["framework"].notna().all()
    assert set(df["framework"]) == {"trtllm", f"trtllm {src['backend_version'].iloc[-1]}"}
    assert len(slimjax.calibrate(df, group_by=("model", "gpu", "framework")).framework) == 2  # no row lost in groupby


def lifecycle_report(concurrency=8):
    """inference-perf's stage report (``inference_perf/reportgen/base.py`` summarize_requests: ResponsesSummary with
    benchmark_time_seconds, load_summary, successes.{count, latency.{request_latency, time_to_first_token,
    inter_token_latency, …: {mean, min, max, median, p90, …} in seconds}, throughput, prompt_tokens, output_tokens},
    failures)."""

    def dist(mean, p90):
        return {
            "mean": mean,
            "min": mean / 2,
            "max": p90 * 1.5,
            "median": mean,
            "p90": p90,
            "p99": p90 * 1.2,
        }

    load = {"count": 100, "requested_rate": 2.0, "achieved_rate": 2.0}
    if concurrency is not None:
        load["concurrency"] = concurrency
    return {
        "benchmark_time_seconds": 50.0,
        "load_summary": load,
        "successes": {
            "count": 100,
            "latency": {
                "request_latency": dist(4.0, 5.5),
                "time_to_first_token": dist(0.1, 0.2),
                "inter_token_latency": dist(0.015, 0.022),
                "time_per_output_token": dist(0.015, 0.02),
            },
            "throughput": {"requests_per_sec": 2.0, "total_tokens_per_sec": 2560.0},
            "prompt_tokens": {"total": 102400.0, "mean": 1024.0},
            "output_tokens": {"total": 25600.0, "mean": 256.0},
        },
        "failures": {"count": 0},
    }


def test_inference_perf_reports_every_field_mapped(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "stage_0_lifecycle_metrics.json").write_text(json.dumps(lifecycle_report(8)))
    (folder / "stage_1_lifecycle_metrics.json").write_text(json.dumps(lifecycle_report(None)))  # a rate stage
    (folder / "per_request_lifecycle_metrics.json").write_text("[]")  # per-request detail is not a summary
    assert detect_format(folder) == "inference_perf_json"
    df = slimjax.load_traces(folder, model="Llama-3.1-8B", gpu="H100-SXM")
    assert list(df["batch"]) == [8, 8]  # the rate stage: 2 requests/s × 4 s in flight (Little's law)
    row = df.iloc[0]
    assert (row.input_len, row.output_len, row.e2e_s, row.ttft_s, row.itl_s) == (1024, 256, 4.0, 0.1, 0.015)
    assert row.ttft_p90_s == 0.2 and row.itl_p90_s == 0.022 and row.throughput == pytest.approx(8 * 1280 / 4.0)
    assert row.max_concurrency == 8 and np.isnan(row.arrival_rate)
    assert df.iloc[1].arrival_rate == 2.0 and np.isnan(df.iloc[1].max_concurrency)
    broken = lifecycle_report()
    del broken["successes"]["latency"]["request_latency"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    with pytest.raises(slimjax.SlimjaxError, match=r"bad.json: field 'successes.latency.request_latency.mean'"):
        slimjax.load_traces(bad, model="Llama-3.1-8B", gpu="H100-SXM")


def test_aiconfigurator_precision_sets_the_weight_bytes(tmp_path, shared_data):
    import pandas as pd

    from slimjax.fit.features import row_features
    from slimjax.inputs.traces import precision_bytes

    assert (
        precision_bytes("fp8_block"),
        precision_bytes("nvfp4"),
        precision_bytes("w4a16_awq"),
        precision_bytes("float16"),
    ) == (1.0, 0.5625, 0.5, 2.0)
    assert np.isnan(precision_bytes("")) and precision_bytes("mystery") is None
    src = pd.read_csv(shared_data / "measured" / "serving_h100_trtllm_llama31_8b.csv").head(4)
    src["gemm_quant_mode"] = ["fp8", "", np.nan, "mystery"]
    src["precision"] = [np.nan, "fp8_block", np.nan, np.nan]
    path = tmp_path / "aic.csv"
    src.to_csv(path, index=False)
    df = slimjax.load_traces(path)
    assert len(df) == 3 and sum(df.attrs["dropped"].values()) == 1  # the unknown label is counted, not modelled
    assert list(df["weight_dtype_bytes"].fillna(-1)) == [1.0, 1.0, -1]
    feats = row_features(df)
    assert list(np.asarray(feats["model"].bytes_per_weight)) == [1.0, 1.0, 2.0]  # fp8 runs at fp8 bytes


def test_rows_say_whether_they_are_offline_batches_or_concurrent_clients(tmp_path, shared_data):
    """Offline batched generation (splitwise, LLM-Inference-Bench: B prompts at once) and serving clients
    (aiconfigurator's concurrency) are different forward models (fit.serving); the format says which, a canonical
    file per row, and a value that is neither is an error naming the column."""
    import pandas as pd

    measured = shared_data / "measured"
    assert slimjax.load_traces(measured / "splitwise_perf_model.csv")["offline"].all()
    assert slimjax.load_traces(measured / "llm_inference_bench_ttft_e2e.csv")["offline"].all()
    assert not slimjax.load_traces(measured / "serving_h100_trtllm_llama31_8b.csv")["offline"].any()
    rows = pd.DataFrame(
        dict(model="Llama-3.1-8B", gpu="H100-SXM", batch=[8, 8], input_len=512, output_len=128, itl_s=0.01)
    )
    path = tmp_path / "rows.csv"
    rows.assign(offline=["true", "False"]).to_csv(path, index=False)
    assert slimjax.load_traces(path)["offline"].tolist() == [True, False]
    rows.to_csv(path, index=False)
    assert not slimjax.load_traces(path)["offline"].any()  # no column: concurrent clients
    rows.assign(offline=["sometimes", "no"]).to_csv(path, index=False)
    with pytest.raises(slimjax.SlimjaxError, match="column 'offline'.*must be true or false, got 'sometimes'"):
        slimjax.load_traces(path)
