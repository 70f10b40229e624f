"""Write the report figures docs/cli.md shows into docs/ with the report command itself (never by hand): the
quickstart sweep, then `slimjax report`, keeping two of its PNGs.

    python bench/report_docs.py
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import slimjax

REPO = Path(__file__).resolve().parent.parent
KEEP = {
    "quickstart_throughput_vs_batch.png": "report_throughput_vs_batch.png",
    "quickstart_b_cap_heatmap.png": "report_b_cap_heatmap.png",
}


def main() -> None:
    slimjax.configure()
    work = Path(tempfile.mkdtemp(prefix="slimjax-docs-"))
    try:
        store = work / "quickstart.zarr"
        slimjax.sweep(str(REPO / "sweeps" / "quickstart.yaml"), store, quiet=True)
        slimjax.make_report([store], work / "report", quiet=True)
        docs = REPO / "docs"
        docs.mkdir(exist_ok=True)
        for src, dst in KEEP.items():
            shutil.copyfile(work / "report" / src, docs / dst)
            print(f"wrote docs/{dst}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
