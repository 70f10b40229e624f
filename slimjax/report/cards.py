"""What a user reads at one operating point or over one (I, O) of a sweep: the summary tables, the capacity
calculator's cards and verdict, and an agent graph's cards — text and DataFrames from results, no physics."""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from ..engine.schema import VARIABLES
from ..inputs.axes import on_grid_lengths
from ..model.agents import API_LIMITS, WINNERS


def summary(ds: xr.Dataset, input_len: int | None = None, output_len: int | None = None) -> dict[str, pd.DataFrame]:
    """Per model × GPU at one (I, O): ``b_cap``, the throughput there, and the plateau throughput
    (the best SLIM throughput over the batches that fit). (I, O) default to the grid values closest
    (in log scale) to a typical chat request, I = 1024, O = 256. Returns DataFrames (rows model,
    columns GPU) keyed by what they hold, and the (I, O) used under ``"at"``. With the capacity
    calculator on, ``runs`` says which (model, GPU) hold at least one sequence of I + O tokens (the
    others are NaN in every table, never a number), ``n_gpu`` the group size, and ``notes`` one line per
    configuration that does not run, with the smallest TP degree that would fit it; ``notes`` also
    names each model whose context (max_position_embeddings) I + O exceeds.
    """

    i, o = on_grid_lengths(ds["input_len"].values, ds["output_len"].values, input_len, output_len)
    at = ds.sel(input_len=i, output_len=o)
    tput = at["slim_throughput"].load()
    models, gpus = list(ds["model"].values), list(ds["gpu"].values)
    frame = lambda a: pd.DataFrame(np.asarray(a), index=models, columns=gpus)  # noqa: E731
    runs = None
    if "fits" in ds:
        runs = at["max_seqs"].load() >= 1
        tput = tput.where(at["fits"].load())
    out = {"at": pd.DataFrame({"input_len": [i], "output_len": [o]}), "plateau_throughput": frame(tput.max("batch"))}
    if "b_cap" in ds:
        b_cap = at["b_cap"].load()
        out["b_cap"] = frame(b_cap if runs is None else b_cap.where(runs))
        chosen = tput.sel(batch=xr.where(b_cap > 0, b_cap, ds["batch"].values[0])).where(b_cap > 0)
        out["throughput_at_b_cap"] = frame(chosen)
        if "n_gpu" in ds:  # groups of different sizes compare per GPU and per dollar, not per group
            # n_tp·n_pp·D GPUs (docs/layouts.md), the attention data-parallel ranks D from the serving settings
            ranks = xr.DataArray(serving_setting(ds, models, gpus, "dp"), dims=("model", "gpu"))
            gpus_per_group = (ds["n_gpu"] * (ds["pp"] if "pp" in ds else 1) * ranks).load()
            out["throughput_per_gpu_at_b_cap"] = frame(chosen / gpus_per_group.where(gpus_per_group > 0))
            prices = xr.DataArray(gpu_prices(ds, gpus), dims="gpu", coords={"gpu": gpus})
            out["cost_per_mtok_at_b_cap"] = frame(gpus_per_group * prices / (chosen * 3600.0) * 1e6)
    notes = []
    if "within_context" in ds:
        for m in models:
            if not bool(at["within_context"].sel(model=m)):
                notes.append(
                    f"{m}: I + O = {i + o} tokens is beyond its context (max_position_embeddings); "
                    "its figures are extrapolated"
                )
    if runs is not None:
        out["runs"] = frame(runs)
        out["n_gpu"] = frame(ds["n_gpu"])
        for m in models:
            for g in gpus:
                if bool(runs.sel(model=m, gpu=g)):
                    continue
                n = int(ds["n_gpu"].sel(model=m, gpu=g))
                need = int(ds["n_gpu_to_fit"].sel(model=m, gpu=g))
                group = f"{n} GPU{'s' if n > 1 else ''}" if n else "no TP degree up to 8"
                fix = f"the smallest TP degree that fits is {need}" if need else "no TP degree in 1, 2, 4, 8 fits it"
                notes.append(f"{m} on {g} ({group}): does not fit weights plus one sequence of {i + o} tokens; {fix}")
    if "slim_at_floor" in ds:
        flag = ds["slim_at_floor"]
        n_set = flag.attrs.get("nonzero")
        n_set = int((flag > 0).sum()) if n_set is None else int(n_set)
        n_fit = int(ds["fits"].sum()) if "fits" in ds else int(flag.size)
        if n_set:
            at_floor = int((at["slim_at_floor"] > 0).sum())
            notes.append(
                f"SLIM is at its physical floor (100 % of peak FLOP/s and bandwidth on the group) at {n_set:,} of the "
                f"{n_fit:,} points that fit ({at_floor:,} of them at I = {i}, O = {o}); slim_at_floor marks them"
            )
    out["notes"] = pd.DataFrame({"note": notes})
    if "agent_local_s" in ds:
        out["agents"] = agent_table(at)
        out["agent_assumptions"] = json.loads(ds["agent_local_s"].attrs.get("assumptions", "[]"))
    return out


def serving_setting(ds: xr.Dataset, models: list[str], gpus: list[str], key: str, default: float = 1.0) -> np.ndarray:
    """(M, G): a serving setting per (model, GPU) as the store's ``serving`` attr recorded it (``default`` where
    it has none)."""
    table = json.loads(ds.attrs.get("serving", "{}"))
    return np.array([[float(table.get(m, {}).get(g, {}).get(key, default)) for g in gpus] for m in models])


def gpu_prices(ds: xr.Dataset, gpus: list[str]) -> np.ndarray:
    """$/GPU-hour of each of ``gpus`` as the store's specs attr recorded them (the catalog's illustrative on-demand
    prices, dated by the ``price_date`` attr); NaN where a GPU has none."""
    recorded = json.loads(ds.attrs.get("specs", "{}")).get("gpus", {})
    return np.array([float(recorded.get(g, {}).get("price_per_hour", np.nan) or np.nan) for g in gpus])


def agent_table(at: xr.Dataset) -> pd.DataFrame:
    """Per model, GPU and agent graph at one (I, O): the local batch limit with the shortest T_local
    (ties: smaller), its time and cost, the API's time, binding limit and cost, and who is faster and
    cheaper there. A configuration that does not fit reads "does not fit", never a number."""
    rows = []
    for m in at["model"].values:
        for g in at["gpu"].values:
            for a in at["agent"].values:
                c = at.sel(model=m, gpu=g, agent=a)
                local = c["agent_local_s"].values
                fits = np.isfinite(local).any()
                k = int(np.argmin(np.where(np.isfinite(local), local, np.inf))) if fits else 0  # masked: NaN
                best = c.isel(batch=k)
                api_s = float(best["agent_api_s"])
                rows.append(
                    {
                        "model": m,
                        "gpu": g,
                        "agent": a,
                        "n_gpu": int(at["n_gpu"].sel(model=m, gpu=g)) if "n_gpu" in at else 1,
                        "batch": int(at["batch"].values[k]) if fits else "—",
                        "local": _quantity(float(best["agent_local_s"]), "s") if fits else "does not fit",
                        "dependency bound": _quantity(float(best["agent_dependency_bound_s"]), "s") if fits else "—",
                        "API": _quantity(api_s, "s"),
                        "API bound by": API_LIMITS[int(best["agent_api_limit"])],
                        "local $": f"{float(best['agent_local_cost_usd']):.4f}" if fits else "—",
                        "API $": f"{float(best['agent_api_cost_usd']):.4f}",
                        "faster": WINNERS[int(best["agent_faster"])],
                        "cheaper": WINNERS[int(best["agent_cheaper"])],
                        "break-even $/Mtok": _break_even_price(best) if fits else "—",
                        "break-even RPM": _break_even_rpm(float(best["agent_break_even_rpm"])) if fits else "—",
                    }
                )
    return pd.DataFrame(rows)


def _break_even_price(at) -> str:
    """The blended API price at which local and API cost the same, beside the price given."""
    price, given = float(at["agent_break_even_price_per_mtok"]), float(at["agent_api_price_per_mtok"])
    if not np.isfinite(price):
        return "none (the replica does not run)"
    side = "API cheaper" if given < price else "local cheaper" if given > price else "equal"
    return f"${price:,.4g}/Mtok blended (given ${given:,.4g}: {side})"


def _break_even_rpm(rpm: float) -> str:
    if np.isnan(rpm):
        return "none (the token quota, service time or parallelism keeps the API slower)"
    return "any (the API is as fast at every quota)" if rpm == 0 else f"{rpm:,.4g} requests/min"


def agent_cards(result: Mapping) -> list[tuple[str, str]]:
    """(label, text) cards of :func:`agent`'s result (MODEL.md §6); +inf reads "does not fit"."""
    from ..constants import PRICE_DATE

    at, flips = result["at"], result["flips"]
    local_fits = np.isfinite(at["agent_local_s"])
    cards = [
        (
            "Local replica",
            f"{int(at['n_gpu'])} GPU(s), {int(at['slots'])} slots (batch limit {result['batch']}, "
            f"max_seqs {int(at['max_seqs'])})"
            if local_fits
            else "does not fit (no slots)",
        ),
        ("Local time T_local", _quantity(at["agent_local_s"], "s") if local_fits else "not runnable (does not fit)"),
        (
            "Dependency bound",
            _quantity(at["agent_dependency_bound_s"], "s") if local_fits else "not runnable (does not fit)",
        ),
        (
            "API time T_api",
            f"{_quantity(at['agent_api_s'], 's')} (bound by {API_LIMITS[int(at['agent_api_limit'])]})",
        ),
        ("Local cost", f"${at['agent_local_cost_usd']:,.4f}" if local_fits else "not runnable (does not fit)"),
        ("API cost", f"${at['agent_api_cost_usd']:,.4f}"),
        ("Faster", WINNERS[int(at["agent_faster"])]),
        ("Cheaper", WINNERS[int(at["agent_cheaper"])]),
        ("Break-even API price", _break_even_price(at) if local_fits else "none (the replica does not run)"),
        (
            "Break-even API rate",
            _break_even_rpm(float(at["agent_break_even_rpm"])) if local_fits else "none (the replica does not run)",
        ),
    ]
    for key, label, unit in (
        ("faster_by_calls", "Faster flips", "calls per stage"),
        ("cheaper_by_calls", "Cheaper flips", "calls per stage"),
        ("faster_by_rpm", "Faster flips", "API RPM"),
    ):
        f = flips[key]
        cards.append(
            (
                f"{label} ({unit})",
                "never over the range searched"
                if f is None
                else f"between {f[0]:g} and {f[1]:g} {unit}: {f[2]} from there on",
            )
        )
    cards.append(("Prices", f"illustrative, dated {PRICE_DATE} (GPU catalog, API defaults; editable)"))
    if "efficiency" in result:
        cards.append(("Roofline constants", result["efficiency"]))
    for k, line in enumerate(result.get("assumptions", ())):
        cards.append(("Assumptions" if k == 0 else "", line))
    return cards


def _quantity(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "n/a"
    if isinstance(value, float) and np.isinf(value):
        return "Unbounded"
    if unit == "bytes":
        for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{value / size:,.4g} {name} ({value:,.0f} bytes)"
        return f"{value:,.0f} bytes"
    if unit == "s":
        for name, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
            if abs(value) >= scale:
                return f"{_number(value / scale)} {name}"
        return "0 s" if value == 0 else "< 1 ns"
    if unit == "1":
        return _number(value) if value > 1 else "< 0.01%" if 0 < value < 1e-4 else f"{value:.2%}"
    return f"{_number(value)} {unit}"


def _number(value: float) -> str:
    """Four significant figures with thousands separators, never an exponent for the sizes cards show."""
    if value == 0 or not np.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    digits = max(0, 3 - int(np.floor(np.log10(abs(value)))))
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:,.0f}"


CARDS = (
    ("n_gpu", "GPUs in the group"),
    ("weights_bytes", "Weights"),
    ("kv_pool_bytes", "KV pool"),
    ("kv_bytes_per_token", "KV bytes per token"),
    ("seq_footprint_bytes", "Footprint per sequence"),
    ("max_seqs", "Max concurrent sequences"),
    ("ttft_s", "TTFT"),
    ("itl_s", "ITL"),
    ("itl_chunk_s", "ITL with an interleaved chunk"),
    ("service_s", "Service time S(B)"),
    ("request_rate", "Request rate"),
    ("token_throughput", "Token throughput"),
    ("utilization", "Utilization"),
    ("p_wait", "P(wait)"),
    ("wait_s", "Wait"),
    ("response_s", "Response"),
    ("in_system", "In system"),
)


BATCH_CARDS = ("ttft_s", "itl_s", "itl_chunk_s", "service_s", "request_rate", "token_throughput")  # at B itself
QUEUE_CARDS = ("utilization", "p_wait", "wait_s", "response_s", "in_system")  # of a batch limit that fits


def _runs(result: Mapping[str, float]) -> tuple[bool, bool]:
    """(the configuration fits: pool > 0 and max_seqs ≥ 1, the batch fits: B ≤ max_seqs) (MODEL.md §4c)."""
    if "fits" not in result:
        return True, True
    return result["max_seqs"] >= 1, bool(result["fits"])


def capacity_verdict(result: Mapping[str, float], input_len: int, output_len: int) -> str | None:
    """None when the configuration runs at its batch; else why not, in words: weights against usable
    memory and the smallest ``n_gpu`` that fits, or how many sequences the KV pool holds (MODEL.md §4c)."""
    config_fits, batch_fits = _runs(result)
    if batch_fits:
        return None
    weights, pool, seqs = result["weights_bytes"], result["kv_pool_bytes"], int(result["max_seqs"])
    n, need = int(result.get("n_gpu", 0)), int(result.get("n_gpu_to_fit_batch", result.get("n_gpu_to_fit", 0)))
    batch = result.get("batch")
    what = "this batch" if batch is None else f"batch {int(batch)}"
    tp, pp = (int(x) for x in result.get("tp_pp_to_fit_batch", (0, 0)))
    stages = (  # where no tensor-parallel group fits: the fewest pipeline stages of the largest one in a node
        f"--n-gpu {tp} --pp {pp} ({tp * pp} GPUs in {pp} pipeline stages) holds {what}"
        if pp
        else "nor do 8 pipeline stages of the largest group in a node"
        if "tp_pp_to_fit_batch" in result
        else ""
    )
    fix = (
        f"the smallest --n-gpu that fits {what} is {need}"
        if need
        else "; ".join(filter(None, ("no tensor-parallel group of 1, 2, 4 or 8 of these GPUs fits it", stages)))
    )
    if config_fits:
        return (
            f"batch does not fit: the KV pool {_quantity(pool, 'bytes')} holds {seqs:,} "
            f"sequence{'s' if seqs != 1 else ''} "
            f"of {input_len + output_len:,} tokens ({_quantity(result['seq_footprint_bytes'], 'bytes')} each); "
            f"run at most "
            f"{seqs:,} at once, or {fix}"
        )
    if not n:
        return (
            f"does not fit: no tensor-parallel group of 1, 2, 4 or 8 of these GPUs holds its weights "
            f"({_quantity(weights, 'bytes')}) and one sequence of {input_len + output_len} tokens (n_gpu: auto "
            f"found none)" + (f"; {stages}" if stages else "")
        )
    if pool <= 0:
        usable = pool + weights  # u·M − M_R
        why = (
            f"weights {_quantity(weights, 'bytes')} exceed usable memory {_quantity(usable, 'bytes')} "
            f"(u·M − M_R on {n} GPU{'s' if n > 1 else ''}) by {_quantity(-pool, 'bytes')}"
        )
    else:
        why = (
            f"the KV pool {_quantity(pool, 'bytes')} is smaller than one sequence of {input_len + output_len} tokens "
            f"({_quantity(result['seq_footprint_bytes'], 'bytes')})"
        )
    return f"does not fit: {why}; {fix}"


def capacity_cards(result: Mapping[str, float]) -> list[tuple[str, str]]:
    """(label, value with units) for each calculator card present in ``result``; +inf reads "Unbounded"."""
    cards = []
    config_fits, batch_fits = _runs(result)
    for key, label in CARDS:
        if key in result:
            unit = VARIABLES[key].units
            value = result[key]
            if key == "n_gpu":
                text = f"{int(value)}" if value else "none of 1, 2, 4, 8 fits"
                pp, dp = int(result.get("pp", 1) or 1), int(result.get("dp", 1) or 1)
                if value and pp * dp > 1:  # the group's GPUs, not one rank's tensor-parallel ones
                    text = f"{int(value) * pp * dp} (TP {int(value)} × PP {pp} × DP {dp})"
            elif key == "max_seqs":
                text = f"{int(value):,}"
            elif key == "kv_pool_bytes" and value <= 0:  # no negative size: say what it means
                text = f"none: weights exceed usable memory by {_quantity(-float(value), unit)}"
            elif key == "kv_pool_bytes" and int(result.get("pp", 1) or 1) > 1:  # one stage's, not the group's
                pp = int(result["pp"])
                label, text = f"{label} per stage", f"{_quantity(float(value), unit)} in each of {pp} stages"
            else:
                text = _quantity(float(value), unit)
            if not batch_fits and (key in BATCH_CARDS or key in QUEUE_CARDS):
                # no number for what cannot happen, nor a queue without its service time
                text = "not runnable (does not fit)"
            cards.append((label, text))
    if "speculative" in result:  # TTFT, ITL and the rates are speculative decoding's (docs/speculative.md)
        cards.append(("Speculative decoding", result["speculative"]))
    if "efficiency" in result:  # measured or not: said beside every time it prints
        cards.append(("Roofline constants", result["efficiency"]))
    return cards


def agent_flips(ds: xr.Dataset, calls, rpms) -> tuple[dict, pd.DataFrame, pd.DataFrame, dict]:
    """From an agent sweep with graphs ``at``, ``calls=C`` for each of ``calls`` and ``rpm=R`` for each of
    ``rpms`` (one model, GPU, batch, I, O): the graph's own figures, the two scans as DataFrames, and where the
    faster and cheaper side first flips along each scan ((before, after, new winner), or None)."""
    names = [v for v in ds.data_vars if v.startswith("agent_")]
    at = {k: ds[k].sel(agent="at").item() for k in names}
    at.update({k: ds[k].item() for k in ("n_gpu", "max_seqs", "weights_bytes", "kv_pool_bytes")})

    def frame(prefix, values, column):
        labels = [f"{prefix}={v:g}" if prefix == "rpm" else f"{prefix}={v}" for v in values]
        sub = ds.sel(agent=labels)
        return pd.DataFrame({column: values, **{k: sub[k].values for k in names}})

    by_calls, by_rpm = frame("calls", calls, "calls_per_stage"), frame("rpm", rpms, "rpm")

    def flip(df, key, column):
        change = np.flatnonzero(np.diff(df[key].to_numpy()) != 0)
        if not change.size:
            return None
        return df[column].iloc[change[0]], df[column].iloc[change[0] + 1], WINNERS[int(df[key].iloc[change[0] + 1])]

    flips = {
        "faster_by_calls": flip(by_calls, "agent_faster", "calls_per_stage"),
        "cheaper_by_calls": flip(by_calls, "agent_cheaper", "calls_per_stage"),
        "faster_by_rpm": flip(by_rpm, "agent_faster", "rpm"),
    }
    return at, by_calls, by_rpm, flips
