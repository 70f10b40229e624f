"""Behaviour pinned across refactors: the quickstart store, array for array, bit for bit, as recorded
by ``python bench/golden.py --write`` (the validate table is checked in test_validate). A change meant
to move these figures regenerates tests/golden/ in the same commit and says why."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from golden import GOLDEN, quickstart_digests  # noqa: E402  (bench/golden.py)


def test_quickstart_store_is_bit_identical_to_the_golden_one():
    want = json.loads((GOLDEN / "quickstart.json").read_text())
    got = quickstart_digests()
    assert sorted(got) == sorted(want)
    differs = [k for k in want if got[k] != want[k]]
    assert not differs, f"quickstart arrays differ from tests/golden/quickstart.json: {differs}"


def test_dense_capacity_and_queue_at_one_gpu_are_bit_identical_to_the_golden_ones():
    """Recorded from the code before the layered refactor; later extensions (MoE/MLA on the roofline,
    tensor-parallel communication) must not move a dense model at n_gpu = 1 by one bit."""
    from golden import capacity_digests

    want = json.loads((GOLDEN / "capacity.json").read_text())
    got = capacity_digests()
    differs = [k for k in want if got.get(k) != want[k]]
    assert not differs, f"capacity arrays differ from tests/golden/capacity.json: {differs}"
