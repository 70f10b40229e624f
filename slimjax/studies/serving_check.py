"""The §9 simulation scored against measured serving runs (benchmark-client style: C concurrent clients, each
sending its next request when the last completes): TTFT and TPOT MAPE and bias per engine, model, GPU, TP degree,
precision, concurrency band and output length.

Each measured row (model, GPU, TP n, concurrency C, prompt I, output O, mean TTFT, mean TPOT/ITL, its engine)
becomes a closed loop of C clients on one replica of n GPUs with batch limit B = C, run as the row's benchmark
harness ran it (configs/harnesses.yaml: requests per client, request lengths, which requests are scored) by the
serving fit's forward model (:func:`slimjax.fit.serving.predict_serving`) with the row's engine profile at the
calibrated constants of its GPU; the simulated mean TTFT, plus the fitted client-side overhead of a request to its
engine's API (``request_overhead_s``, configs/roofline/default.yaml), and mean TPOT are compared with the measured
means.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from ..config import float64_scope
from ..engine import sim as engine
from ..fit import serving as serving_fit
from ..inputs.catalog import resolve_gpu
from ..inputs.engines import GENERIC, resolve_engine
from ..inputs.harnesses import request_lengths
from ..inputs.layouts import layout_kind
from ..inputs.serving import calibrated_efficiency, calibrated_link, calibrated_request_overhead
from ..inputs.traces import LAYOUT_COLUMNS
from ..model import batching as floor
from ..model.memory import model_kv_bytes_per_layer_token
from ..model.pipeline import kv_transfer_time
from . import disaggregated
from .candidates import candidate_inputs

CONCURRENCY_BANDS = ((1, 4), (5, 16), (17, 64), (65, 256), (257, np.inf))
# the error table's cuts (harness: how the row's client ran, configs/harnesses.yaml)
DIMENSIONS = ("engine", "harness", "model", "layout_kind", "gpu", "n_gpu", "precision", "band", "output_len")


def _band(c: float) -> str:
    for lo, hi in CONCURRENCY_BANDS:
        if lo <= c <= hi:
            return f"{lo}–{hi:g}" if np.isfinite(hi) else f"≥{lo}"
    return "?"


def _precision(b) -> str:
    return "fp16/bf16" if not np.isfinite(b) or b == 2 else {1: "fp8/int8", 0.5: "fp4/int4"}.get(b, f"{b:g} B")


def _scorable(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with both measured figures, with their precision and concurrency band."""
    need = rows.dropna(subset=["ttft_s", "itl_s"]).copy()
    need = need[(need.ttft_s > 0) & (need.itl_s > 0)].reset_index(drop=True)
    for col in ("weight_dtype_bytes", "kv_dtype_bytes"):
        if col not in need:
            need[col] = np.nan
    need["framework"] = need["framework"].fillna("generic").astype(str) if "framework" in need else "generic"
    need["precision"] = need.weight_dtype_bytes.map(_precision)
    need["band"] = need.batch.map(_band)
    # TP, TP+EP, DP+EP, wide-EP (inputs.layouts.layout_kind) or disaggregated: the layout cut of the error table
    ones = pd.Series(1.0, index=need.index)
    groups = [
        layout_kind(tp, dp, ep)
        for tp, dp, ep in zip(need["n_gpu"], need.get("dp", ones), need.get("ep", ones), strict=True)
    ]
    disagg = need["layout"].fillna("").to_numpy() == "disaggregated" if "layout" in need else np.zeros(len(need), bool)
    need["layout_kind"] = np.where(disagg, "disaggregated", groups)
    return need


def simulate_rows(rows: pd.DataFrame, requests_per_client: int | None = None) -> pd.DataFrame:
    """``rows`` (a :func:`slimjax.load_traces` frame with ttft_s and itl_s) with sim_ttft_s, sim_tpot_s and their
    errors (sim/measured − 1) added; rows without both measured figures are left out. The forward model is the
    serving fit's (:func:`slimjax.fit.serving.predict_serving`: a closed loop of C clients run as the row's harness
    ran it, ``requests_per_client`` where given for every row, with its engine's profile) at the calibrated
    constants of the row's GPU (configs/roofline/default.yaml), so validation and calibration cannot drift apart.
    A row whose configuration cannot run keeps NaN and says why in ``not_run``."""
    need = _scorable(rows)
    need["not_run"] = cannot_run(need)
    runs = need[need.not_run == ""]
    need["sim_ttft_s"] = np.nan
    need["sim_tpot_s"] = np.nan
    need["request_overhead_s"] = np.nan
    if len(runs):
        engines = serving_fit.row_profiles(runs)["engine"]
        pairs = list(zip(runs.gpu, engines, strict=True))
        each = {pair: calibrated_constants(*pair) for pair in set(pairs)}  # once per (GPU, engine)
        constants = pd.DataFrame([each[pair] for pair in pairs], index=runs.index)
        got = serving_fit.predict_serving(runs, constants, requests_per_client=requests_per_client)
        # what the client adds to each request's TTFT beyond the engine (the fitted overhead of its engine's API;
        # an offline batch has no client)
        overhead = np.where(serving_fit.offline_rows(runs), 0.0, [calibrated_request_overhead(e) for e in engines])
        need.loc[runs.index, "request_overhead_s"] = overhead
        need.loc[runs.index, "sim_ttft_s"] = got["ttft_sim_s"].to_numpy() + overhead
        need.loc[runs.index, "sim_tpot_s"] = got["tpot_sim_s"].to_numpy()
    need["ttft_error"] = need.sim_ttft_s / need.ttft_s - 1
    need["tpot_error"] = need.sim_tpot_s / need.itl_s - 1
    return need


def pool_rows(rows: pd.DataFrame, pool: str) -> pd.DataFrame:
    """A disaggregated row's ``pool`` (prefill or decode) as an aggregated row of one replica group: its TP, attention
    ranks, expert layout, and batch (``{pool}_batch`` per rank: batch·dp per replica)."""
    out = rows.copy()
    out["n_gpu"] = rows[f"{pool}_tp"].astype(float)
    for k in LAYOUT_COLUMNS:
        out[k] = rows[f"{pool}_{k}"].astype(float)
    out["batch"] = rows[f"{pool}_batch"] * rows[f"{pool}_dp"]
    return out


def _pool_problems(rows: pd.DataFrame) -> pd.Series:
    """Per disaggregated row, why a pool cannot run ("" where both can): a GPU without a network for the transfer,
    :func:`cannot_run` of each pool, and pipeline stages in a pool (not read)."""
    why = pd.Series("", index=rows.index, dtype=object)
    networked = {g: resolve_gpu(g, "traces.gpu")[1]["network_bytes_per_s"] > 0 for g in set(rows.gpu)}
    why = why.where(
        rows.gpu.map(networked).astype(bool),
        "its GPU has no network_gbs for the KV transfer (add it to its entry in configs/gpus.yaml)",
    )
    for pool in ("prefill", "decode"):
        staged = rows[f"{pool}_pp"].to_numpy(float) > 1
        why = why.where((why != "") | ~staged, f"its {pool} pool has pipeline stages (not read for pools)")
        own = cannot_run(pool_rows(rows, pool))
        why = why.where((why != "") | (own == ""), f"its {pool} pool: " + own)
    return why


def simulate_disaggregated_rows(rows: pd.DataFrame, requests_per_client: int | None = None) -> pd.DataFrame:
    """Disaggregated rows (:func:`slimjax.load_traces` with ``disaggregated=True``) with sim_ttft_s, sim_tpot_s and
    their errors, as :func:`simulate_rows` scores aggregated ones: each row's C clients (its decode slots) run as its
    harness ran them through the closed loop of §10's two pools (:func:`slimjax.studies.disaggregated.closed_loop`,
    docs/layouts.md): ``prefill_workers`` replicas of the prefill pool's layout, admitting ``prefill_batch`` requests
    per attention rank, the KV moved over the network, ``decode_workers`` replicas of the decode pool's. Each pool's
    serving is its engine's profile at the calibrated constants of its GPU; TTFT adds the engine's request overhead.
    A row that cannot run keeps NaN and says why in ``not_run``."""
    need = _scorable(rows)
    need["not_run"] = _pool_problems(need)
    for col in ("sim_ttft_s", "sim_tpot_s", "request_overhead_s", "closed_loop_passes"):
        need[col] = np.nan
    runs = need[need.not_run == ""]
    if len(runs):
        got = disaggregated_times(runs, requests_per_client)
        overhead = [calibrated_request_overhead(e) for e in serving_fit.row_profiles(runs)["engine"]]
        need.loc[runs.index, "request_overhead_s"] = overhead
        need.loc[runs.index, "sim_ttft_s"] = got["ttft_s"].to_numpy() + np.asarray(overhead)
        need.loc[runs.index, "sim_tpot_s"] = got["tpot_s"].to_numpy()
        need.loc[runs.index, "closed_loop_passes"] = got["passes"].to_numpy()
        unsettled = runs.index[~got["settled"].to_numpy(bool)]
        need.loc[unsettled, ["sim_ttft_s", "sim_tpot_s"]] = np.nan
        need.loc[unsettled, "not_run"] = "its closed loop did not settle (docs/layouts.md, disaggregated rows)"
    need["ttft_error"] = need.sim_ttft_s / need.ttft_s - 1
    need["tpot_error"] = need.sim_tpot_s / need.itl_s - 1
    return need


def disaggregated_times(rows: pd.DataFrame, requests_per_client: int | None = None) -> pd.DataFrame:
    """Per disaggregated row (runnable ones, see :func:`simulate_disaggregated_rows`): the simulated mean TTFT and
    TPOT over the requests its harness scores (TPOT = (end − first token)/(O − 1): the transfer and the decode
    queue included, §10), the closed loop's passes and whether it settled."""
    engines = serving_fit.row_profiles(rows)["engine"]
    pairs = list(zip(rows.gpu, engines, strict=True))
    each = {pair: calibrated_constants(*pair) for pair in set(pairs)}  # once per (GPU, engine)
    named = serving_fit.row_constants(rows, pd.DataFrame([each[p] for p in pairs], index=rows.index))
    harness = serving_fit.row_harnesses(rows, requests_per_client)
    clients = rows["batch"].to_numpy(int)
    # a request's KV crosses the network between one prefill rank's GPUs and one decode rank's, as many lanes as the
    # smaller of the two (§10)
    lanes = np.minimum(rows.prefill_tp * rows.prefill_pp, rows.decode_tp * rows.decode_pp).to_numpy(float)
    with float64_scope():
        pools = {}
        for pool in ("prefill", "decode"):
            x = serving_fit.lane_inputs(pool_rows(rows, pool))
            serving, terms = serving_fit.row_terms(x, named)
            pools[pool] = (x, serving, jax.tree_util.tree_map(np.asarray, terms))
        (x, serving_p, terms_p), (_, serving_d, terms_d) = pools["prefill"], pools["decode"]
        streams, fp_p, fp_d, xfer = [], [], [], []
        for j in range(len(rows)):

            def one(tree, j=j):
                return jax.tree_util.tree_map(lambda a: jnp.asarray(a)[j], tree)

            n = int(clients[j] * harness["requests_per_client"].iloc[j])
            ratio = harness["range_ratio"].iloc[j]
            I = request_lengths(x["input_len"][j : j + 1], n, ratio)[0]
            O = request_lengths(x["output_len"][j : j + 1], n, ratio)[0]
            streams.append(dict(input_len=I, output_len=O))
            model = one(x["model"])
            fp_p.append(np.asarray(floor.request_footprint_bytes(model, one(serving_p), jnp.asarray(I))))
            fp_d.append(np.asarray(floor.request_footprint_bytes(model, one(serving_d), jnp.asarray(I + O))))
            kv = float(model_kv_bytes_per_layer_token(model, one(serving_p).kv_dtype_bytes) * model.n_layers)
            gpu = one(x["gpu"])
            seconds = kv_transfer_time(kv * I, lanes[j], float(gpu.network_bytes_per_s), float(gpu.network_latency_s))
            xfer.append(np.where(O > 1, seconds, 0.0))
    got = disaggregated.closed_loop(
        terms_p,
        (rows.prefill_batch * rows.prefill_dp).to_numpy(float),
        rows.prefill_workers.to_numpy(int),
        terms_d,
        (rows.decode_batch * rows.decode_dp).to_numpy(float),
        rows.decode_workers.to_numpy(int),
        streams,
        fp_p,
        fp_d,
        xfer,
        clients,
    )
    out = []
    for j, g in enumerate(got):
        scored = slice(0, None) if harness["score_all"].iloc[j] else slice(int(clients[j]), None)
        O = streams[j]["output_len"]
        ttft = (g["first_token_s"] - g["arrival_s"])[scored]
        tpot = ((g["end_s"] - g["first_token_s"]) / np.maximum(O - 1.0, 1.0))[scored]
        out.append(dict(ttft_s=ttft.mean(), tpot_s=tpot.mean(), passes=g["passes"], settled=g["settled"]))
    return pd.DataFrame(out, index=rows.index)


def calibrated_constants(gpu: str, engine: str = GENERIC) -> dict:
    """The calibrated serving constants of a GPU under an engine's profile (its catalog key), as the studies'
    ``efficiency: calibrated`` takes them."""
    values, _ = calibrated_efficiency(gpu, engine)
    return {**values, **calibrated_link(gpu)}


def cannot_run(rows: pd.DataFrame) -> pd.Series:
    """Per row, why its configuration cannot run ("" where it can), as the studies refuse a candidate: its TP
    degree must divide the query heads, its weights leave a KV pool, and its request (I + O, and a paged prompt
    with the watermark) fit an empty replica."""
    with float64_scope():
        x = serving_fit.lane_inputs(rows)
        m, g = x["model"], x["gpu"]
        serving = serving_fit.row_serving(x)
        lengths = SimpleNamespace(input_len=x["input_len"], output_len=x["output_len"])
        terms, footprint, fits = candidate_inputs(m, g, serving, lengths, np.float64)
    n = len(rows)
    own = np.arange(n)
    fp = footprint[own, own]
    why = np.where(fits, "", "its weights leave no KV pool, or its TP degree does not divide the query heads")
    why = np.where(layout_problems(rows, x) != "", layout_problems(rows, x), why)
    why = np.where((why == "") & (fp > terms["pool"]), "its request's footprint for I + O exceeds the KV pool", why)
    if "kv_policy" in terms:
        units, watermark, pool = engine.prompt_units(terms, x["input_len"])
        short = engine.paged(terms) & (units[own, own] + watermark > pool)
        why = np.where((why == "") & short, "its prompt's KV blocks and the admission watermark exceed the pool", why)
    return pd.Series(why, index=rows.index, dtype=object)


def layout_problems(rows: pd.DataFrame, x: dict) -> np.ndarray:
    """Per row, why its layout cannot be served as docs/layouts.md states layouts ("" where it can): attention tensor
    parallel beyond one node, experts and attention on different GPU counts, ep not dividing the experts."""
    tp, dp, ep, moe_tp = (np.asarray(x[k], float) for k in ("n_gpu", "dp", "ep", "moe_tp"))
    node = np.asarray(x["gpu"].gpus_per_node, float)
    experts = np.asarray(x["model"].n_experts, float)
    safe_ep = np.maximum(ep, 1.0)
    why = np.full(len(rows), "", dtype=object)
    bad = [
        (
            (experts > 0) & (moe_tp > 0) & (moe_tp * ep != tp * dp),  # (a dense row's moe_tp means nothing)
            "its experts (moe_tp·ep) and attention (tp·dp) are on different GPU counts",
        ),
        (
            (ep > 1) & ((experts == 0) | (np.mod(experts, safe_ep) != 0)),
            "its expert-parallel degree does not divide the experts",
        ),
        (tp > node, "its attention tensor parallel spans more than one node (a TP degree beyond gpus_per_node)"),
    ]
    for mask, words in bad:
        why = np.where((why == "") & mask, words, why)
    return why


def error_table(scored: pd.DataFrame, by=DIMENSIONS) -> pd.DataFrame:
    """MAPE and bias (mean signed error), %, of TTFT and TPOT per value of each dimension in ``by`` (engine, harness,
    model, GPU, TP, precision, concurrency band, output length), then pooled (dimension ``all``). Rows whose
    simulation did not run are counted apart: ``attrs['not_run']`` {reason: rows}."""
    ran = scored.dropna(subset=["sim_ttft_s", "sim_tpot_s"]).copy()
    ran["engine"] = ran["framework"].map(lambda f: resolve_engine(str(f)).key) if "framework" in ran else "generic"

    def stats(g):
        return {
            "rows": len(g),
            "ttft_mape_pct": 100 * g.ttft_error.abs().mean(),
            "ttft_bias_pct": 100 * g.ttft_error.mean(),
            "tpot_mape_pct": 100 * g.tpot_error.abs().mean(),
            "tpot_bias_pct": 100 * g.tpot_error.mean(),
        }

    out = []
    for dim in (d for d in by if d in ran):  # (a frame without a harness column has one harness: the default)
        for value, g in ran.groupby(dim, sort=True):
            out.append({"dimension": dim, "value": _shown(value), **stats(g)})
    out.append({"dimension": "all", "value": "all", **stats(ran)})
    table = pd.DataFrame(out)
    table["rows"] = table["rows"].astype(int)
    failed = scored.loc[scored.sim_ttft_s.isna() | scored.sim_tpot_s.isna()]
    reasons = failed["not_run"] if "not_run" in failed else pd.Series("", index=failed.index)
    reasons = reasons.replace("", "the simulation gave no time (a stuck or stopped run)")
    table.attrs["not_run"] = {str(k): int(v) for k, v in pd.Series(reasons).value_counts().items()}
    return table


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float, np.integer, np.floating)) else str(value)


def error_markdown(table: pd.DataFrame) -> str:
    """:func:`error_table` as Markdown (one row per dimension value, the pooled row last), then the rows not run
    and why."""
    head = "| by | value | rows | TTFT MAPE % | TTFT bias % | TPOT MAPE % | TPOT bias % |"
    lines = [head, "|" + "---|" * 7]
    cols = ["ttft_mape_pct", "ttft_bias_pct", "tpot_mape_pct", "tpot_bias_pct"]
    for _, r in table.iterrows():
        figures = " | ".join(f"{r[c]:.1f}" for c in cols)
        lines.append(f"| {r.dimension} | {r.value} | {int(r.rows)} | {figures} |")
    for why, n in table.attrs.get("not_run", {}).items():
        lines.append(f"\nnot run: {n} rows: {why}")
    return "\n".join(lines)
