"""Write (or check) the golden outputs that pin behaviour across refactors.

    python bench/golden.py --write     # record tests/golden/ from the current code
    python bench/golden.py             # compare the current code against tests/golden/

Golden outputs: every array of the quickstart sweep (sha256 of its bytes, dtype and shape), every
array of a capacity + queue sweep on dense models at n_gpu = 1 (CAPACITY_SWEEP), every array of the
shipped procurement study and its printed tables (PROCURE_STUDY), and the
`slimjax validate` table on the shared LLM-Inference-Bench data (full precision CSV). The test-suite
checks the same (tests/test_golden.py, and the validate table inside test_validate). A change that
is meant to move a figure regenerates them with --write in the same commit and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"


def array_digests(ds) -> dict:
    """{name: {dtype, shape, sha256}} for every data variable and coordinate of ``ds``."""
    out = {}
    for name in sorted(set(ds.data_vars) | set(ds.coords)):
        a = np.ascontiguousarray(np.asarray(ds[name].values))
        raw = a.astype(str).tobytes() if a.dtype.kind in "OU" else a.tobytes()
        out[name] = {"dtype": str(a.dtype), "shape": list(a.shape), "sha256": hashlib.sha256(raw).hexdigest()}
    return out


# The capacity calculator and queue on dense models at n_gpu = 1, where MODEL.md §4b/§4c (MoE, MLA,
# tensor-parallel communication) must leave every figure unchanged to the last bit.
CAPACITY_SWEEP = dict(
    models=["Llama-3.1-8B", "Mistral-7B-v0.1", "gemma-2-9b", "OPT-1.3b", "Llama-3.1-70B"],
    gpus=["H100-SXM", "A100-SXM-80GB", "L40S"],
    batch=[1, 2, 8, 32, 64],
    input_len=[128, 1000, 4096, 8192],
    output_len=[1, 64, 512],
    serving={"chunk_size": 512, "launch_overhead_s": 2e-5, "L40S": {"kv_dtype_bytes": "fp8"}},
    arrival_rate=[0.5, 2.0, 8.0],
    advisor=False,
    precision="float64",
    slim="per-gpu",  # the sets recorded with it
)


# Another CPU's code generation (vector width, FMA contraction, XLA's own exp/log) may move a float64 figure by
# a few ulps: a golden array whose digest differs is compared with its recorded values to this relative tolerance
# (seen: itl_s and itl_chunk_s on an AMD EPYC against the Intel machine that recorded the digests). Any change of
# method moves a figure by far more.
CROSS_CPU_RTOL = 1e-12


def capacity_sweep():
    import slimjax

    return slimjax.sweep(CAPACITY_SWEEP, quiet=True)


def float_values(ds) -> dict:
    """{name: values} of ``ds``'s floating-point variables and coordinates (what :data:`CROSS_CPU_RTOL` compares)."""
    arrays = {k: np.asarray(ds[k].values) for k in sorted(set(ds.data_vars) | set(ds.coords))}
    return {k: a for k, a in arrays.items() if a.dtype.kind == "f"}


def differing(got: dict, want: dict, values: dict, recorded: dict) -> list:
    """Names whose digest in ``got`` is not ``want``'s and whose values are not ``recorded``'s to
    :data:`CROSS_CPU_RTOL` (a name without recorded values must match its digest)."""
    out = []
    for k in want:
        if got.get(k) == want[k]:
            continue
        a, b = values.get(k), recorded.get(k)
        close = a is not None and b is not None and a.shape == b.shape
        if not (close and np.allclose(a, b, rtol=CROSS_CPU_RTOL, atol=0.0, equal_nan=True)):
            out.append(k)
    return out


def quickstart_digests() -> dict:
    import slimjax

    if hasattr(slimjax, "configure"):
        slimjax.configure()
    return array_digests(slimjax.sweep(str(REPO / "sweeps" / "quickstart.yaml"), quiet=True))


PROCURE_STUDY = REPO / "sweeps" / "procure_azure.yaml"


def procure_outputs() -> tuple[dict, str]:
    """The shipped procurement study (sweeps/procure_azure.yaml, on the shared Azure traces): every array's
    digest and the ranked tables exactly as ``slimjax procure`` prints them."""
    import slimjax
    from slimjax.studies.procure import spec as procurefile

    ds = slimjax.procure(screen_of(procurefile.parse(str(PROCURE_STUDY))))
    return array_digests(ds), slimjax.procure_tables(ds) + "\n"


def screen_of(study):
    """The study sized by its screen alone (MODEL.md §8's closed form): what the golden records (sizing by
    simulation is checked against the reference event loop in tests/test_sizing.py, not frozen)."""
    import dataclasses

    return dataclasses.replace(study, sizing={**study.sizing, "method": "screen"})


def validate_table_csv(data: Path) -> str:
    import pandas as pd

    import slimjax

    try:
        from slimjax.fit.validate import validate
    except ImportError:  # before the layered layout
        from slimjax.validate import validate
    frames = [
        slimjax.load_traces(data / "measured" / f)
        for f in ("llm_inference_bench.csv", "llm_inference_bench_ttft_e2e.csv")
    ]
    table = validate(pd.concat(frames, ignore_index=True)).table
    return table_csv(table)


def table_csv(table) -> str:
    flat = table.copy()
    flat.columns = [f"{a}|{b}" for a, b in flat.columns]
    return flat.to_csv(float_format="%.17g")


def recorded_validate_tables() -> list[str]:
    """The validate tables recorded, one per CPU family the suite has run on (validate.csv, validate.<cpu>.csv):
    SLIM's fits are ill-conditioned enough that another CPU's last bits move a MAPE by 0.5 % and a coverage by one
    row (an AMD EPYC against the Intel machine that recorded validate.csv), far beyond :data:`CROSS_CPU_RTOL`. A
    table must equal one of them."""
    return [path.read_text() for path in sorted(GOLDEN.glob("validate*.csv"))]


def same_table(got_csv: str, want_csv: str, rtol: float = 1e-8) -> bool:
    """The validate table equals the golden one: labels and counts exactly, scores to ``rtol`` (least-squares
    solves differ in the last bits between BLAS/LAPACK builds and CPUs, and the fits' iterations amplify them: a
    fresh install may not repeat 17 digits, and an AMD EPYC read one score 8e-10 apart from the recording machine;
    any change of method or data moves a score by far more)."""
    import io

    import pandas as pd

    got, want = (pd.read_csv(io.StringIO(t), index_col=0) for t in (got_csv, want_csv))
    if list(got.columns) != list(want.columns) or list(got.index) != list(want.index):
        return False
    floats = [c for c in want.columns if want[c].dtype.kind == "f"]
    rest = [c for c in want.columns if c not in floats]
    return bool(
        got[rest].equals(want[rest]) and np.allclose(got[floats], want[floats], rtol=rtol, atol=0, equal_nan=True)
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    data = Path(os.environ.get("SLIMJAX_DATA", REPO.parent / "shared" / "data"))
    digests = quickstart_digests()
    sweep = capacity_sweep()
    capacity, capacity_values = array_digests(sweep), float_values(sweep)
    csv = validate_table_csv(data)
    procure, procure_text = procure_outputs()
    if args.write:
        GOLDEN.mkdir(exist_ok=True)
        (GOLDEN / "quickstart.json").write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        (GOLDEN / "capacity.json").write_text(json.dumps(capacity, indent=1, sort_keys=True) + "\n")
        np.savez_compressed(GOLDEN / "capacity_values.npz", **capacity_values)
        (GOLDEN / "validate.csv").write_text(csv)
        (GOLDEN / "procure.json").write_text(json.dumps(procure, indent=1, sort_keys=True) + "\n")
        (GOLDEN / "procure_tables.txt").write_text(procure_text)
        print(f"wrote {GOLDEN}")
        return 0
    want = json.loads((GOLDEN / "quickstart.json").read_text())
    bad = [k for k in want if digests.get(k) != want[k]] + [k for k in digests if k not in want]
    same_csv = any(same_table(csv, want) for want in recorded_validate_tables())
    want_cap = json.loads((GOLDEN / "capacity.json").read_text())
    bad_cap = differing(capacity, want_cap, capacity_values, dict(np.load(GOLDEN / "capacity_values.npz")))
    want_proc = json.loads((GOLDEN / "procure.json").read_text())
    bad_proc = [k for k in want_proc if procure.get(k) != want_proc[k]] + [k for k in procure if k not in want_proc]
    same_text = procure_text == (GOLDEN / "procure_tables.txt").read_text()
    print("quickstart:", "identical" if not bad else f"differs in {bad}")
    print("capacity (its golden variables):", "identical" if not bad_cap else f"differs in {bad_cap}")
    print("validate table:", "identical" if same_csv else "differs")
    print("procurement store:", "identical" if not bad_proc else f"differs in {bad_proc}")
    print("procurement tables:", "identical" if same_text else "differ")
    return 0 if not (bad or bad_cap or bad_proc) and same_csv and same_text else 1


if __name__ == "__main__":
    sys.exit(main())
