"""Measured traces in: one canonical long table from the formats the field produces.

Canonical columns: model, gpu, n_gpu, framework, batch, input_len, output_len and any of
e2e_s, throughput, ttft_s, itl_s (seconds; tokens/s counts prompt + output tokens), and the 90th
percentiles ttft_p90_s, itl_p90_s where the source has them (benchmark clients), and weight_dtype_bytes where
the run's weights were quantized (NaN: the checkpoint's bytes per weight), arrival_rate (requests/s the client
offered) and max_concurrency (its cap on requests in flight) where a benchmark client records them, and offline:
True where a row's B requests ran as one batch started at once (offline batched generation: its TTFT is the batch's
prefill, its latency the batch's), False where B clients kept B requests in flight (a serving benchmark's closed
loop, MODEL.md §9) — the format says which.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ..errors import SlimjaxError
from . import catalog
from .harnesses import DEFAULT as DEFAULT_HARNESS
from .harnesses import harness_of

CANONICAL = (
    "model",
    "gpu",
    "n_gpu",
    "framework",
    "batch",
    "input_len",
    "output_len",
    "e2e_s",
    "throughput",
    "ttft_s",
    "itl_s",
    "ttft_p90_s",
    "itl_p90_s",
    "weight_dtype_bytes",
    "kv_dtype_bytes",
    "arrival_rate",
    "max_concurrency",
    "offline",
    "layout",
    "harness",
    "dp",
    "ep",
    "moe_tp",
)
# a disaggregated row's two pools (docs/layouts.md, disaggregated rows): per pool its workers (replica groups), batch
# per attention rank and layout, from the aiconfigurator columns `{pool}_num_workers`, `{pool}_batch_size`,
# `{pool}_tp_size`, …; the value where a row has none (NaN: required)
POOL_KINDS = ("prefill", "decode")
POOL_FIELDS = {
    "workers": ("num_workers", np.nan),
    "batch": ("batch_size", np.nan),
    "tp": ("tp_size", 1.0),
    "pp": ("pp_size", 1.0),
    "dp": ("attention_dp_size", 1.0),
    "ep": ("moe_ep_size", 1.0),
    "moe_tp": ("moe_tp_size", 0.0),
}
POOL_COLUMNS = tuple(f"{pool}_{field}" for pool in POOL_KINDS for field in POOL_FIELDS)
CANONICAL = (*CANONICAL, *POOL_COLUMNS)
MEASURES = ("e2e_s", "throughput", "ttft_s", "itl_s")
PERCENTILES = ("ttft_p90_s", "itl_p90_s")
# arrival_rate: the Poisson (or fixed) request rate the client offered, requests/s; NaN for concurrency-driven runs
# (and for vLLM's request_rate inf, a burst). max_concurrency: the client's cap on requests in flight (NaN: none; then
# `batch` is the mean in flight by Little's law). With ttft_p90_s they let calibrate_roofline fit through §5's wait
# quantile, at m = min(max_concurrency, max_seqs) slots.
OPTIONAL = ("weight_dtype_bytes", "kv_dtype_bytes", "arrival_rate", "max_concurrency")  # NaN where a format has none
# a group's layout beyond tensor parallel (docs/layouts.md: attention data-parallel ranks, expert-parallel ranks, GPUs
# of one expert), 1, 1 and 0 (derived) where a format has none
LAYOUT_COLUMNS = {"dp": 1.0, "ep": 1.0, "moe_tp": 0.0}
# layout: why a row's deployment is not one tensor-parallel group slimjax can serve yet (empty: it is); such rows
# are dropped at load with that reason, so that none is scored as another layout
LAYOUT_REASONS = {
    "disaggregated": "a disaggregated deployment (prefill and decode pools with their own layouts): read apart "
    "(load_traces(..., disaggregated=True)) and scored by validate --serving's disaggregated closed loop",
    "pipeline": "pipeline stages (pp_size > 1): the serving check runs tensor-parallel groups only",
}
# why a disaggregated reading leaves a row out: it is an aggregated one (read without disaggregated=True)
AGGREGATED_REASON = "an aggregated deployment (read without disaggregated=True)"
_SIGNATURES = {
    "llm_inference_bench": {
        "Hardware",
        "Num of Hardware",
        "Framework",
        "Model",
        "Input Output Length",
        "Batch Size",
        "Latency",
        "Throughput",
    },
    "llm_inference_bench_ttft": {
        "Hardware",
        "Num of Hardware",
        "Framework",
        "Model",
        "Input Length",
        "Output Length",
        "Batch Size",
        "TTFT Latency",
        "end_latency",
    },
    "aiconfigurator": {
        "model_path",
        "system",
        "backend",
        "isl",
        "osl",
        "batch_size",
        "tp_size",
        "silicon_ttft_ms",
        "silicon_tpot_ms",
    },
    "splitwise": {
        "model",
        "hardware",
        "prompt_size",
        "batch_size",
        "token_size",
        "prompt_time",
        "token_time",
        "e2e_time",
        "tensor_parallel",
    },
    "canonical": {"model", "gpu", "batch", "input_len", "output_len"},
}


@functools.cache
def hardware_table() -> dict[str, str]:
    """Trace hardware names → catalog GPUs (configs/hardware.yaml, editable)."""
    with open(catalog.configs_dir() / "hardware.yaml") as f:
        return dict(yaml.safe_load(f)["hardware"])


def _numeric(df: pd.DataFrame, columns, path) -> pd.DataFrame:
    """Columns as numbers; a value that is present but not a number is a malformed file."""
    for col in columns:
        converted = pd.to_numeric(df[col], errors="coerce")
        bad = converted.isna() & df[col].notna() & (df[col].astype(str).str.strip() != "")
        if bad.any():
            row = int(np.argmax(bad.to_numpy()))
            raise SlimjaxError(f"{path}: row {row + 2}, column {col!r}", f"not a number: {df[col].iloc[row]!r}")
        df[col] = converted
    return df


def _read_csv(path: Path, fmt: str) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise SlimjaxError(str(path), f"not a readable CSV ({e})") from None
    missing = sorted(READERS[fmt].columns - set(df.columns))
    if missing:
        raise SlimjaxError(f"{path}: column {missing[0]!r}", f"missing for format {fmt!r}")
    return df


def _llm_inference_bench(path: Path) -> pd.DataFrame:
    df = _numeric(
        _read_csv(path, "llm_inference_bench"),
        ["Num of Hardware", "Input Output Length", "Batch Size", "Latency", "Throughput"],
        path,
    )
    return pd.DataFrame(
        dict(
            model=df["Model"],
            gpu=df["Hardware"],
            n_gpu=df["Num of Hardware"],
            framework=df["Framework"],
            batch=df["Batch Size"],
            input_len=df["Input Output Length"],
            output_len=df["Input Output Length"],
            e2e_s=df["Latency"],
            throughput=df["Throughput"],
            ttft_s=np.nan,
            itl_s=np.nan,
        )
    )


def _llm_inference_bench_ttft(path: Path) -> pd.DataFrame:
    """The same benchmark's TTFT table. Its end_latency is the batch time of the IL = OL run (it equals
    llm_inference_bench.csv's Latency there), not of the listed output length, so only TTFT is kept."""
    cols = ["Num of Hardware", "Input Length", "Output Length", "Batch Size", "TTFT Latency"]
    df = _numeric(_read_csv(path, "llm_inference_bench_ttft"), cols, path)
    return pd.DataFrame(
        dict(
            model=df["Model"],
            gpu=df["Hardware"],
            n_gpu=df["Num of Hardware"],
            framework=df["Framework"],
            batch=df["Batch Size"],
            input_len=df["Input Length"],
            output_len=df["Output Length"],
            e2e_s=np.nan,
            throughput=np.nan,
            ttft_s=df["TTFT Latency"],
            itl_s=np.nan,
        )
    )


_UNKNOWN_PRECISION = -1.0  # a label precision_bytes cannot read: the row is dropped with its cause


def precision_bytes(value) -> float:
    """Bytes per weight of a run's precision label as serving benchmarks write it — ``fp8``, ``fp8_block``,
    ``nvfp4``, ``float16``, ``w4a16_awq``, ``int8_wo`` …: NaN when empty (the checkpoint's own), None when
    unrecognised."""
    import re

    if value is None or (isinstance(value, float) and np.isnan(value)) or str(value).strip() == "":
        return float("nan")
    text = str(value).strip().lower()
    for token in re.split(r"[_\-\s/]+", text):
        if token in catalog._DTYPE_BYTES:
            return float(catalog._DTYPE_BYTES[token])
        m = re.fullmatch(r"w(\d+)a\d+", token)
        if m:
            return int(m.group(1)) / 8.0
    return None


def _aiconfigurator(path: Path) -> pd.DataFrame:
    df = _numeric(
        _read_csv(path, "aiconfigurator"),
        ["isl", "osl", "batch_size", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms"],
        path,
    )
    ttft, itl = df["silicon_ttft_ms"] / 1e3, df["silicon_tpot_ms"] / 1e3
    e2e = ttft + (df["osl"] - 1) * itl
    # an empty backend_version must not blank the framework (groupby would then drop the row silently)
    version = df["backend_version"].fillna("").astype(str).str.strip() if "backend_version" in df else ""
    framework = (
        (df["backend"].fillna("unknown").astype(str) + " " + version).str.strip()
        if "backend_version" in df
        else df["backend"].fillna("unknown").astype(str)
    )
    # the GEMMs' quantization sets the weight bytes; `precision` where that is empty
    label = df["gemm_quant_mode"] if "gemm_quant_mode" in df else pd.Series(np.nan, index=df.index)
    if "precision" in df:
        label = label.where(label.notna() & (label.astype(str).str.strip() != ""), df["precision"])
    weight_bytes = label.map(lambda v: _UNKNOWN_PRECISION if (b := precision_bytes(v)) is None else b)
    # the KV cache of a run at 8-bit precision or below is fp8: a bf16 cache cannot hold what these runs serve
    # (Llama-3.1-70B on one H200, 32 clients of 9,216 tokens: 94 GB of bf16 KV beside 70 GB of fp8 weights, yet
    # TTFT 0.47 s and TPOT 38 ms, no queue), and fp8 is the smallest KV these engines keep on Hopper
    run = df["precision"].map(precision_bytes) if "precision" in df else pd.Series(np.nan, index=df.index)
    kv_bytes = run.map(lambda b: 1.0 if b is not None and np.isfinite(b) and b <= 1 else np.nan)

    def column(col, default):
        if col not in df:
            return pd.Series(default, index=df.index, dtype=float)
        return pd.to_numeric(df[col], errors="coerce").fillna(default)

    def above_one(col):
        return column(col, 1.0) > 1

    layout = pd.Series("", index=df.index)
    layout = layout.where(~(above_one("pp_size")), "pipeline")
    if "mode" in df:
        layout = layout.where(df["mode"].astype(str).str.strip().str.lower() != "disagg", "disaggregated")

    # with attention data parallel, batch_size is each rank's concurrency: the client ran batch_size·dp (the rows'
    # own silicon_concurrency says so for every such row)
    dp = column("attention_dp_size", 1.0)
    pools = {
        f"{pool}_{field}": column(f"{pool}_{source}", default)
        for pool in POOL_KINDS
        for field, (source, default) in POOL_FIELDS.items()
    }
    disagg = layout == "disaggregated"
    # a disaggregated row: its clients are the decode pool's slots, batch·workers·dp (each such row's
    # silicon_concurrency says so), its GPUs both pools' (workers·tp·pp·dp each); its group columns stay 1
    clients = pools["decode_batch"] * pools["decode_workers"] * pools["decode_dp"]
    gpus = sum(
        pools[f"{pool}_workers"] * pools[f"{pool}_tp"] * pools[f"{pool}_pp"] * pools[f"{pool}_dp"]
        for pool in POOL_KINDS
    )
    return pd.DataFrame(
        dict(
            weight_dtype_bytes=weight_bytes,
            model=df["model_path"],
            gpu=df["system"],
            n_gpu=df["tp_size"].where(~disagg, gpus),
            dp=dp.where(~disagg, 1.0),
            ep=column("moe_ep_size", 1.0).where(~disagg, 1.0),
            moe_tp=column("moe_tp_size", 0.0).where(~disagg, 0.0),
            framework=framework,
            batch=(df["batch_size"] * dp).where(~disagg, clients),
            input_len=df["isl"],
            output_len=df["osl"],
            e2e_s=e2e,
            throughput=df["batch_size"].where(~disagg, clients) * (df["isl"] + df["osl"]) / e2e,
            ttft_s=ttft,
            itl_s=itl,
            kv_dtype_bytes=kv_bytes,
            layout=layout,
            # how its client ran (configs/harnesses.yaml), recognised from its source
            harness=df["silicon_data_source"].map(harness_of) if "silicon_data_source" in df else DEFAULT_HARNESS,
            **{k: v.where(disagg) for k, v in pools.items()},
        )
    )


def _splitwise(path: Path) -> pd.DataFrame:
    cols = ["prompt_size", "batch_size", "token_size", "prompt_time", "token_time", "e2e_time", "tensor_parallel"]
    df = _numeric(_read_csv(path, "splitwise"), cols, path)
    # e2e_time is unreliable for token_size >= 1024 (generation stopped early): rebuild it there
    rebuilt = df["prompt_time"] + (df["token_size"] - 1) * df["token_time"]
    e2e = np.where(df["token_size"] >= 1024, rebuilt, df["e2e_time"]) / 1e3
    return pd.DataFrame(
        dict(
            model=df["model"],
            gpu=df["hardware"],
            n_gpu=df["tensor_parallel"],
            framework="splitwise-sim",
            batch=df["batch_size"],
            input_len=df["prompt_size"],
            output_len=df["token_size"],
            e2e_s=e2e,
            throughput=df["batch_size"] * (df["prompt_size"] + df["token_size"]) / e2e,
            ttft_s=df["prompt_time"] / 1e3,
            itl_s=df["token_time"] / 1e3,
        )
    )


def _json_documents(path: Path, pattern: str, what: str, skip: str | None = None):
    """(file, parsed JSON) for ``path`` (a file, or a folder's files matching ``pattern``); a file that is not
    JSON is an error naming it."""
    files = sorted(path.glob(pattern)) if path.is_dir() else [path]
    files = [f for f in files if skip is None or skip not in f.name]
    if not files:
        raise SlimjaxError(str(path), f"no {what}")
    for f in files:
        try:
            yield f, json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise SlimjaxError(str(f), f"not valid JSON ({e})") from None


def _vllm_bench_json(path: Path, defaults: dict) -> pd.DataFrame:
    rows = []
    for f, r in _json_documents(path, "*.json", ".json result files"):
        need = (
            "completed",
            "total_input_tokens",
            "total_output_tokens",
            "mean_ttft_ms",
            "mean_tpot_ms",
            "mean_e2el_ms",
        )
        for k in need:
            _number_field(r, k, f)
        done = r["completed"]
        I, O = r["total_input_tokens"] / max(done, 1), r["total_output_tokens"] / max(done, 1)
        e2e = r["mean_e2el_ms"] / 1e3
        cap = None if r.get("max_concurrency") is None else _number_field(r, "max_concurrency", f)
        if cap is None:  # a rate-driven run without a cap: the mean in flight by Little's law
            batch = max(1, round(_number_field(r, "request_throughput", f) * e2e))
        else:
            batch = cap
        tput = (
            (r["total_input_tokens"] + r["total_output_tokens"]) / r["duration"]
            if r.get("duration")
            else batch * (I + O) / e2e
        )
        rows.append(
            dict(
                model=r.get("model_id") or r.get("model") or defaults.get("model"),
                gpu=r.get("gpu") or defaults.get("gpu"),
                n_gpu=r.get("tensor_parallel_size") or defaults.get("n_gpu", 1),
                framework=r.get("backend") or defaults.get("framework", "vLLM"),
                batch=batch,
                max_concurrency=np.nan if cap is None else cap,
                input_len=round(I),
                output_len=round(O),
                e2e_s=e2e,
                throughput=tput,
                ttft_s=r["mean_ttft_ms"] / 1e3,
                itl_s=r["mean_tpot_ms"] / 1e3,
                ttft_p90_s=_vllm_p90(r, "ttft", f),
                itl_p90_s=_vllm_p90(r, "itl", f),
                arrival_rate=_offered_rate(r.get("request_rate")),
            )
        )
    return pd.DataFrame(rows)


def _offered_rate(value) -> float:
    """A client's offered request rate (requests/s) when finite and positive, else NaN (a burst, or none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
        return float("nan")
    return float(value)


def _vllm_p90(r: dict, metric: str, f: Path) -> float:
    """The 90th percentile of ``metric`` (ttft or itl), seconds: ``p90_<metric>_ms`` when the run asked for it
    (``--metric-percentiles``), else from the per-request detail (``ttfts``: one value per request, s;
    ``itls``: one list of gaps per request, s); NaN when neither is there."""
    key = f"p90_{metric}_ms"
    if key in r:
        return _number_field(r, key, f) / 1e3
    detail = r.get(f"{metric}s")
    if not detail:
        return float("nan")
    values = (
        np.concatenate([np.atleast_1d(np.asarray(v, float)) for v in detail])
        if metric == "itl"
        else np.asarray(detail, float)
    )
    values = values[np.isfinite(values)]
    return float(np.percentile(values, 90)) if values.size else float("nan")


def _number_field(r: dict, key: str, f) -> float:
    """``r[key]`` as a float, where ``key`` may be a dotted path into nested mappings; else an error naming
    the file and the field."""
    v = r
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SlimjaxError(f"{f}: field {key!r}", f"missing or not a number ({v!r})")
    return float(v)


def _guidellm_json(path: Path, defaults: dict) -> pd.DataFrame:
    """GuideLLM's benchmark report (``guidellm benchmark … --output-path X.json``): one row per benchmark (rate
    or concurrency) from its ``metrics`` distributions — request_latency (s), time_to_first_token_ms,
    inter_token_latency_ms, prompt_token_count, output_token_count, request_concurrency — each read from its
    ``successful`` summary (mean, and percentiles.p90 for TTFT and ITL)."""
    _, doc = next(_json_documents(path, "*.json", "GuideLLM report"))
    benchmarks = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise SlimjaxError(f"{path}: field 'benchmarks'", "missing or empty (not a GuideLLM report)")
    rows = []
    for k, b in enumerate(benchmarks):
        where = f"{path}: benchmarks[{k}]"
        metrics = b.get("metrics") if isinstance(b, dict) else None
        if not isinstance(metrics, dict):
            raise SlimjaxError(f"{where}.metrics", "missing")

        def summary(name: str, stat: str = "mean", metrics=metrics, where=where) -> float:
            s = metrics.get(name, {})
            s = s.get("successful") if isinstance(s, dict) else None
            value = (s or {}).get("percentiles", {}).get(stat) if stat.startswith("p") else (s or {}).get(stat)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SlimjaxError(
                    f"{where}.metrics.{name}.successful.{'percentiles.' if stat.startswith('p') else ''}{stat}",
                    f"missing or not a number ({value!r})",
                )
            return float(value)

        strategy = (b.get("args") or {}).get("strategy") or {}
        concurrency = strategy.get("streams") if strategy.get("type_") == "concurrent" else None
        batch = float(concurrency) if isinstance(concurrency, (int, float)) else summary("request_concurrency")
        worker = b.get("worker") or {}
        I, O = summary("prompt_token_count"), summary("output_token_count")
        e2e = summary("request_latency")
        rows.append(
            dict(
                model=worker.get("backend_model") or defaults.get("model"),
                gpu=defaults.get("gpu"),
                n_gpu=defaults.get("n_gpu", 1),
                framework=defaults.get("framework", "GuideLLM"),
                batch=max(1, round(batch)),
                input_len=round(I),
                output_len=round(O),
                e2e_s=e2e,
                throughput=max(1, round(batch)) * (I + O) / e2e,
                ttft_s=summary("time_to_first_token_ms") / 1e3,
                itl_s=summary("inter_token_latency_ms") / 1e3,
                ttft_p90_s=summary("time_to_first_token_ms", "p90") / 1e3,
                itl_p90_s=summary("inter_token_latency_ms", "p90") / 1e3,
                arrival_rate=_offered_rate(strategy.get("rate"))
                if strategy.get("type_") in ("poisson", "constant")
                else np.nan,
                max_concurrency=float(concurrency) if isinstance(concurrency, (int, float)) else np.nan,
            )
        )
    return pd.DataFrame(rows)


def _inference_perf_json(path: Path, defaults: dict) -> pd.DataFrame:
    """inference-perf lifecycle reports (``stage_N_lifecycle_metrics.json`` or ``summary_lifecycle_metrics.json``; a
    folder of them): one row per file from ``successes.latency`` (request_latency, time_to_first_token,
    inter_token_latency: seconds, mean and p90), ``successes.prompt_tokens`` / ``output_tokens`` (mean) and the
    stage's ``load_summary.concurrency`` — where a stage ran at a request rate instead, the mean number of
    requests in flight by Little's law, requests_per_sec × mean request latency."""
    rows = []
    for f, r in _json_documents(path, "*lifecycle_metrics.json", "*lifecycle_metrics.json reports", skip="per_request"):

        def field(*keys, r=r, f=f):
            return _number_field(r, ".".join(keys), f)

        latency = ("successes", "latency")
        e2e = field(*latency, "request_latency", "mean")
        concurrency = (r.get("load_summary") or {}).get("concurrency")
        batch = (
            float(concurrency)
            if isinstance(concurrency, (int, float)) and not isinstance(concurrency, bool)
            else field("successes", "throughput", "requests_per_sec") * e2e
        )

        def p90(name, latency=r["successes"]["latency"]):
            return float(latency[name].get("p90", np.nan)) if isinstance(latency.get(name), dict) else np.nan

        I, O = field("successes", "prompt_tokens", "mean"), field("successes", "output_tokens", "mean")
        b = max(1, round(batch))
        rows.append(
            dict(
                model=defaults.get("model"),
                gpu=defaults.get("gpu"),
                n_gpu=defaults.get("n_gpu", 1),
                framework=defaults.get("framework", "inference-perf"),
                batch=b,
                input_len=round(I),
                output_len=round(O),
                e2e_s=e2e,
                throughput=b * (I + O) / e2e,
                ttft_s=field(*latency, "time_to_first_token", "mean"),
                itl_s=field(*latency, "inter_token_latency", "mean"),
                ttft_p90_s=p90("time_to_first_token"),
                itl_p90_s=p90("inter_token_latency"),
                arrival_rate=np.nan
                if concurrency is not None
                else _offered_rate((r.get("load_summary") or {}).get("requested_rate")),
                max_concurrency=float(concurrency) if concurrency is not None else np.nan,
            )
        )
    return pd.DataFrame(rows)


def _offline_flag(path: Path) -> Callable[[Any], bool]:
    def flag(value) -> bool:
        text = str(value).strip().lower()
        if text in ("true", "1", "1.0", "yes", "offline", "batch"):
            return True
        if text in ("false", "0", "0.0", "no", "online", "closed", "nan", ""):
            return False
        raise SlimjaxError(f"{path}: column 'offline'", f"must be true or false, got {value!r}")

    return flag


def _canonical(path: Path, defaults: dict) -> pd.DataFrame:
    """A CSV already in the canonical columns; missing optional columns from ``defaults`` or NaN."""
    df = _read_csv(path, "canonical")
    for col in CANONICAL:
        if col not in df:
            df[col] = defaults.get(
                col,
                np.nan
                if col in (*MEASURES, *PERCENTILES, *OPTIONAL, *POOL_COLUMNS)
                else {"n_gpu": 1, "framework": "unknown", "offline": False}.get(col),
            )
    df["offline"] = df["offline"].map(_offline_flag(path))
    numeric = ["n_gpu", "batch", "input_len", "output_len", *MEASURES, *PERCENTILES, *OPTIONAL, *POOL_COLUMNS]
    return _numeric(df, numeric, path)[list(CANONICAL)]


def _llm_inference_bench_garbage(df: pd.DataFrame, drop) -> None:
    """The source's known garbage: where I + O exceeds the served context the "latency" is ~0.05 s (the served
    context can be shorter than the config's, so an impossible per-sequence decode speed, > 2 000 tokens/s,
    flags them too); its llama.cpp rows report a throughput 16–64x below B·(I + O)/latency: one of the two is
    wrong, and a fit cannot tell which."""
    context = df["model"].map(_context_len)
    garbage = (df["input_len"] + df["output_len"] > context) | (df["output_len"] / df["e2e_s"] > 2000)
    df = drop(garbage, "input + output beyond the served context (garbage rows, ~0.05 s latency)")
    consistent = df["throughput"] * df["e2e_s"] / (df["batch"] * (df["input_len"] + df["output_len"]))
    drop((consistent - 1.0).abs() > 0.05, "throughput differs from B·(I + O)/latency by over 5 % (inconsistent row)")


@dataclasses.dataclass(frozen=True)
class TraceFormat:
    """One measured-trace format: how to read it into the canonical columns and how to recognise it.

    ``columns``: a CSV format's signature (detected when a CSV has all of them; ``last``: only after every
    other CSV format). ``detect``: a JSON file or folder format, ``detect(path, head)`` with ``head`` the
    parsed JSON (None for a folder or a file that does not parse); ``last``: the fallback among those.
    ``clean(df, drop)``: drops of the format's known bad rows after the common ones (``drop(mask, reason)``
    counts them and returns the frame without them)."""

    name: str
    read: Callable[[Path, dict], pd.DataFrame]  # (path, defaults) -> a frame with (some of) CANONICAL
    columns: frozenset = frozenset()
    detect: Callable[[Path, Any], bool] | None = None
    last: bool = False
    clean: Callable[[pd.DataFrame, Any], None] | None = None
    offline: bool = False  # rows are offline batches (B requests at once), not B concurrent clients


READERS: dict[str, TraceFormat] = {}


def register_trace_format(fmt: TraceFormat) -> TraceFormat:
    """Add a trace format: ``load_traces`` reads it, detects it and every caller lists it."""
    if fmt.name in READERS:
        raise ValueError(f"trace format {fmt.name!r} is already registered")
    if not fmt.columns and fmt.detect is None:
        raise ValueError(f"trace format {fmt.name!r} needs CSV columns or a detect function")
    READERS[fmt.name] = fmt
    return fmt


def formats() -> tuple[str, ...]:
    """The registered trace formats' names."""
    return tuple(READERS)


def _csv_reader(reader):
    return lambda path, defaults: reader(path)


def _is_dict_with(*keys):
    return lambda path, head: isinstance(head, dict) and all(k in head for k in keys)


for _fmt in (
    TraceFormat("canonical", _canonical, frozenset(_SIGNATURES["canonical"]), last=True),
    TraceFormat(
        "llm_inference_bench",
        _csv_reader(_llm_inference_bench),
        frozenset(_SIGNATURES["llm_inference_bench"]),
        clean=_llm_inference_bench_garbage,
        offline=True,
    ),
    TraceFormat(
        "llm_inference_bench_ttft",
        _csv_reader(_llm_inference_bench_ttft),
        frozenset(_SIGNATURES["llm_inference_bench_ttft"]),
        offline=True,
    ),
    TraceFormat("aiconfigurator", _csv_reader(_aiconfigurator), frozenset(_SIGNATURES["aiconfigurator"])),
    TraceFormat("splitwise", _csv_reader(_splitwise), frozenset(_SIGNATURES["splitwise"]), offline=True),
    TraceFormat("vllm_bench_json", _vllm_bench_json, detect=lambda path, head: True, last=True),
    TraceFormat("guidellm_json", _guidellm_json, detect=_is_dict_with("benchmarks")),
    TraceFormat(
        "inference_perf_json",
        _inference_perf_json,
        detect=lambda path, head: (
            _is_dict_with("successes", "load_summary")(path, head)
            or (path.is_dir() and any(path.glob("*lifecycle_metrics.json")))
        ),
    ),
):
    register_trace_format(_fmt)
del _SIGNATURES  # the signatures live on the registered formats


def detect_format(path: Path) -> str:
    """The registered format ``path`` is: a JSON file or folder by its formats' ``detect``, a CSV by its header
    (formats marked ``last`` after the others)."""

    def ordered(candidates):
        return sorted(candidates, key=lambda f: f.last)  # stable: registration order within each rank

    if (path.suffix == ".json" and path.is_file()) or path.is_dir():
        head = None
        if path.is_file():
            try:
                head = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                head = None  # the fallback reader names the problem
        for fmt in ordered(f for f in READERS.values() if f.detect is not None):
            if fmt.detect(path, head):
                return fmt.name
    try:
        columns = set(pd.read_csv(path, nrows=0).columns)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError, OSError) as e:
        raise SlimjaxError(str(path), f"cannot read ({e})") from None
    for fmt in ordered(f for f in READERS.values() if f.columns):
        if fmt.columns <= columns:
            return fmt.name
    raise SlimjaxError(str(path), f"unrecognised trace format; give format= one of {', '.join(READERS)}")


def _context_len(model: str) -> float:
    try:
        _, row = catalog._lookup(model, catalog.model_catalog(), "model", "model")
    except SlimjaxError:
        return np.inf
    return float(row.get("max_position_embeddings") or np.inf)


def load_traces(
    path: str | os.PathLike, format: str | None = None, *, disaggregated: bool = False, **defaults
) -> pd.DataFrame:
    """The canonical trace table from ``path`` (a file, or a folder of vLLM result JSONs).

    ``disaggregated``: keep only the disaggregated deployments (prefill and decode pools, :data:`POOL_COLUMNS`; their
    ``n_gpu`` every GPU of both pools, ``batch`` the clients), which are otherwise left out with their reason, and
    leave out the aggregated rows; a disaggregated row whose pools' workers or batch are not stated is left out
    with why.

    Rows are dropped, with a count per cause in ``df.attrs['dropped']``: hardware that neither
    configs/hardware.yaml nor the GPU catalog (names, aliases, normalised) knows, counted per name; model not in
    the catalog, missing values, non-positive sizes or times, the known garbage rows whose I + O exceeds the
    model's context, and rows faster than their own configuration at 100 % of peak (:mod:`.physics`). A malformed
    file is an error naming the file, row and column. ``defaults`` fill columns a format lacks (e.g.
    ``gpu='H100-SXM'`` for vLLM JSONs).
    """
    path = Path(path)
    if not path.exists():
        raise SlimjaxError(str(path), "not found")
    fmt = format or detect_format(path)
    if fmt not in READERS:
        raise SlimjaxError("format", f"unknown trace format {fmt!r}; one of {', '.join(READERS)}")
    df = READERS[fmt].read(path, defaults)
    df = df.reindex(columns=list(CANONICAL)).reset_index(drop=True)  # percentiles NaN where a format has none
    df = df.fillna(LAYOUT_COLUMNS)
    if fmt != "canonical":  # a canonical file says it per row
        df["offline"] = READERS[fmt].offline
    df["offline"] = df["offline"].astype(bool)
    dropped: dict[str, int] = {}

    def drop(mask, reason):
        nonlocal df
        n = int(mask.sum())
        if n:
            dropped[reason] = dropped.get(reason, 0) + n
            df = df[~mask].reset_index(drop=True)
        return df  # a format's clean step goes on with the frame as the drop left it

    layout = df["layout"].fillna("").astype(str)
    if disaggregated:
        drop(layout != "disaggregated", AGGREGATED_REASON)
        sizes = [f"{pool}_{field}" for pool in POOL_KINDS for field in ("workers", "batch")]
        drop(
            df[sizes].isna().any(axis=1),
            "a disaggregated deployment whose pools' workers or batch are not stated (prefill_num_workers, "
            "decode_num_workers, prefill_batch_size, decode_batch_size): its GPUs and each pool's slots are unknown",
        )
        layout = df["layout"].fillna("").astype(str)
    for kind, reason in LAYOUT_REASONS.items():
        if not (disaggregated and kind == "disaggregated"):
            drop(layout == kind, reason)
            layout = df["layout"].fillna("").astype(str)
    unknown = df["weight_dtype_bytes"] == _UNKNOWN_PRECISION
    drop(unknown, "precision label not recognised (weights' bytes unknown; give a canonical weight_dtype_bytes column)")
    df["weight_dtype_bytes"] = df["weight_dtype_bytes"].astype(float)
    table = hardware_table()
    mapping = {g: catalog.resolve_hardware(g, table) for g in df["gpu"].dropna().astype(str).unique()}
    names = df["gpu"].astype(str)
    for raw, gpu in mapping.items():  # counted per name, so the user knows what to add where
        if gpu is None:
            drop(names == raw, f"hardware {raw!r} unknown (add it to configs/hardware.yaml or the GPU catalog)")
            names = df["gpu"].astype(str)
    df["gpu"] = df["gpu"].astype(str).map(mapping)
    drop(df["gpu"].isna(), "hardware missing")
    names, precision = {}, {}
    for m in df["model"].dropna().unique():
        try:
            names[m], precision[m] = catalog.resolve_checkpoint(str(m))
        except SlimjaxError:
            names[m] = None
    for raw, model in names.items():  # counted per name, so the user knows what to add where
        if model is None:
            drop(df["model"] == raw, f"model {raw!r} not in the catalog (add it, or an alias, to configs/models.yaml)")
    # a quantized checkpoint's id says its weights' precision where the row does not
    named = df["model"].map(lambda m: precision_bytes(precision.get(m)))
    df["weight_dtype_bytes"] = df["weight_dtype_bytes"].where(df["weight_dtype_bytes"].notna(), named)
    df["model"] = df["model"].map(names)
    drop(df["model"].isna(), "model missing")
    drop(
        df[["batch", "input_len", "output_len", "n_gpu"]].isna().any(axis=1) | df[list(MEASURES)].isna().all(axis=1),
        "missing values",
    )
    sizes = df[["batch", "input_len", "output_len", "n_gpu"]]
    times = df[list(MEASURES + PERCENTILES)]
    drop((sizes <= 0).any(axis=1) | (times <= 0).any(axis=1), "non-positive size or time")
    if READERS[fmt].clean is not None:
        READERS[fmt].clean(df, drop)
    from .physics import impossible_rows

    taken = np.zeros(len(df), bool)  # faster than its own configuration at 100 % of peak; a row counted once
    for reason, mask in impossible_rows(df).items():
        if (mask & ~taken).any():
            dropped[reason] = int((mask & ~taken).sum())
        taken |= mask
    df = df[~taken].reset_index(drop=True)
    for col in ("batch", "input_len", "output_len", "n_gpu"):
        df[col] = df[col].astype(np.int64)
    df.attrs["dropped"] = dropped
    unstated = int(df["weight_dtype_bytes"].isna().sum())
    # read at the checkpoint's own dtype (its config's torch_dtype): said, not silent
    df.attrs["assumed"] = {"no precision stated: weights at the checkpoint's own dtype": unstated} if unstated else {}
    kv = int(df["kv_dtype_bytes"].notna().sum())
    if kv:
        df.attrs["assumed"]["with an fp8 KV cache (their precision is 8-bit or below)"] = kv
    df.attrs["format"] = fmt
    df.attrs["source"] = str(path)
    return df


def read_line(path, frame: pd.DataFrame) -> str:
    """What reading ``path`` gave, in one line: rows kept of rows read, what was dropped and assumed, and why."""
    dropped = frame.attrs.get("dropped", {})
    read = len(frame) + sum(dropped.values())
    return (
        f"{path}: {len(frame)} rows kept of {read} read"
        + "".join(f"; dropped {n} ({why})" for why, n in dropped.items())
        + "".join(f"; {n} rows {why}" for why, n in frame.attrs.get("assumed", {}).items())
    )


def load_many(paths, format: str | None = None, said=None) -> tuple[pd.DataFrame, list[str]]:
    """The traces of several files as one frame (its ``attrs['dropped']`` summed over the files), and each
    file's :func:`read_line` (also given to ``said`` as each file is read, so that it is shown whatever
    comes next)."""
    frames = []
    for p in paths:
        frames.append(load_traces(p, format=format))
        if said is not None:
            said(read_line(p, frames[-1]))
    combined = pd.concat(frames, ignore_index=True)
    dropped: dict = {}
    for f in frames:
        for why, n in f.attrs.get("dropped", {}).items():
            dropped[why] = dropped.get(why, 0) + n
    combined.attrs["dropped"] = dropped
    return combined, [read_line(p, f) for p, f in zip(paths, frames, strict=True)]
