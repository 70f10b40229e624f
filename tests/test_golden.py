"""Behaviour pinned across refactors: the quickstart store, array for array, bit for bit, as recorded
by ``python bench/golden.py --write`` (the validate table is checked in test_validate). A change meant
to move these figures regenerates tests/golden/ in the same commit and says why."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from golden import GOLDEN, quickstart_digests  # noqa: E402


def test_quickstart_store_is_bit_identical_to_the_golden_one():
    want = json.loads((GOLDEN / "quickstart.json").read_text())
    got = quickstart_digests()
    assert sorted(got) == sorted(want)
    differs = [k for k in want if got[k] != want[k]]
    assert not differs, f"quickstart arrays differ from tests/golden/quickstart.json: {differs}"
