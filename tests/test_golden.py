"""Behaviour pinned across refactors: the quickstart store, array for array, bit for bit, as recorded
by ``python bench/golden.py --write`` (the validate table is checked in test_validate). A change meant
to move these figures regenerates tests/golden/ in the same commit and says why."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from golden import GOLDEN, array_digests  # noqa: E402  (bench/golden.py)

import slimjax  # noqa: E402


@pytest.fixture(scope="module")
def quickstart():
    return slimjax.sweep(str(REPO / "sweeps" / "quickstart.yaml"), quiet=True)


def test_quickstart_store_is_bit_identical_to_the_golden_one(quickstart):
    want = json.loads((GOLDEN / "quickstart.json").read_text())
    got = array_digests(quickstart)
    assert sorted(got) == sorted(want)
    differs = [k for k in want if got[k] != want[k]]
    assert not differs, f"quickstart arrays differ from tests/golden/quickstart.json: {differs}"


def test_dense_capacity_and_queue_at_one_gpu_are_bit_identical_to_the_golden_ones():
    """Recorded from the code before the layered refactor; later extensions (MoE/MLA on the roofline,
    tensor-parallel communication) must not move a dense model at n_gpu = 1 by one bit."""
    from golden import array_digests, capacity_sweep, differing, float_values

    want = json.loads((GOLDEN / "capacity.json").read_text())
    sweep = capacity_sweep()
    # bit for bit on the recording CPU; another CPU's code generation to CROSS_CPU_RTOL of the recorded values
    differs = differing(array_digests(sweep), want, float_values(sweep), dict(np.load(GOLDEN / "capacity_values.npz")))
    assert not differs, f"capacity arrays differ from tests/golden/capacity.json: {differs}"


def test_quickstart_tables_show_no_configuration_that_cannot_run(quickstart):
    """Memory is on (n_gpu: auto): every number in the summary belongs to a configuration that fits, and
    each one that does not is named with the smallest TP degree that would hold it."""
    tables = slimjax.summary(quickstart)
    runs = tables["runs"]
    for name in ("b_cap", "throughput_at_b_cap", "plateau_throughput"):
        assert tables[name].where(~runs).isna().all().all(), name
    assert runs.values.sum() > 0.9 * runs.size  # nearly everything runs on its auto-sized group
    at = quickstart.sel(input_len=1024, output_len=256)
    b_cap = at.b_cap.values
    assert np.all(b_cap <= at.max_seqs.values)  # the advisor only recommends batches that fit
    assert (quickstart.n_gpu.values[runs.values] >= 1).all()
    for m, g in zip(*np.where(~runs.values), strict=False):
        model, gpu = str(quickstart.model[m].values), str(quickstart.gpu[g].values)
        assert any(line.startswith(f"{model} on {gpu}") for line in tables["notes"]["note"])
