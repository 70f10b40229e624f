"""One self-contained HTML page (PNG images embedded as data: URIs, no network, no JavaScript) and a PNG per
figure, from any stores slimjax wrote (sweep, procurement, agents, calibration) and ``validate --out`` CSVs."""

from __future__ import annotations

import base64
import html
import io
import os
import sys
from pathlib import Path

import pandas as pd
import xarray as xr

from .._version import __version__
from ..errors import SlimjaxError
from ..studies.present import StudyKind, study_kinds
from . import figures as F


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, border=0, classes="t", na_rep="—", escape=True)


def _open(path: Path):
    """('csv', DataFrame) for a validate CSV, else (kind, Dataset) for a store."""
    if path.suffix == ".csv":
        if not path.is_file():
            raise SlimjaxError(str(path), "not found")
        try:
            frame = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise SlimjaxError(str(path), f"not a CSV slimjax can read ({e})") from None
        missing = [c for c in F.VALIDATION_COLUMNS if c not in frame.columns]
        if missing:
            raise SlimjaxError(
                str(path), f"not a `slimjax validate --out` CSV: no column {', '.join(map(repr, missing))}"
            )
        return "validation", frame
    if not path.exists():
        raise SlimjaxError(str(path), "not found")
    from ..store.sink import open_store

    try:
        ds = open_store(path)
    except Exception as e:  # noqa: BLE001 - whatever xarray says about a folder that is not a store
        raise SlimjaxError(str(path), f"not a zarr store slimjax can read ({e})") from None
    kind = ds.attrs.get("kind")  # every store slimjax writes says what it is
    if kind == "roofline_calibration":
        raise SlimjaxError(str(path), "a roofline calibration store: its efficiencies feed sweeps, it has no report")
    if study_kind(kind) is None:
        raise SlimjaxError(
            str(path),
            f"holds nothing slimjax reports on (attrs kind is {kind!r}, not one of "
            f"{', '.join(k for k in study_kinds() if k != 'validation')} that slimjax wrote)",
        )
    return kind, ds


def study_kind(kind: str | None) -> StudyKind | None:
    """How a kind of store is shown: a study package's registration, or the report's own (sweep, procurement,
    calibration, validation: :mod:`.figures`)."""
    return study_kinds().get(kind)


def figures_for(kind: str, obj, at=None) -> tuple[list, list[tuple[str, pd.DataFrame]]]:
    """The figures and tables of one store (or CSV), as its kind registered them."""
    shown = study_kind(kind)
    return shown.figures(obj, at), shown.tables(obj)


def write_report(paths, out_dir, *, at: tuple[int, int] | None = None, quiet: bool | None = None) -> Path:
    """Write ``index.html`` and one PNG per figure into ``out_dir`` for every store or CSV in ``paths``;
    returns the page's path."""
    from ..store.sink import check_output_dir

    out = check_output_dir(out_dir)
    loaded = [(Path(p), *_open(Path(p))) for p in paths]  # every input read before anything is written
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    show = (not quiet and sys.stderr.isatty()) if quiet is not None else sys.stderr.isatty()
    progress = None
    if show:
        from tqdm import tqdm

        progress = tqdm(total=len(loaded), desc="slimjax report", unit="store", file=sys.stderr)
    for path, kind, obj in loaded:
        figs, tables = figures_for(kind, obj, at)
        blocks = [f"<h2>{html.escape(path.name)} <small>({kind})</small></h2>"]
        if kind != "validation" and isinstance(obj, xr.Dataset):
            n_pairs = obj.sizes.get("model", 1) * obj.sizes.get("gpu", 1)
            if kind == "sweep" and n_pairs > F.MAX_PANELS:
                blocks.append(
                    f"<p class='note'>{F.MAX_PANELS} of {n_pairs} model × GPU pairs are drawn, models and GPUs "
                    "spread evenly through the store; report a smaller store for others.</p>"
                )
        for fig in figs:
            png = _png(fig.figure)
            stem = f"{path.name.removesuffix('.zarr').removesuffix('.csv')}_{fig.key}"
            (out / f"{stem}.png").write_bytes(png)
            data = base64.b64encode(png).decode()
            blocks.append(
                f"<figure><figcaption><b>{html.escape(fig.title)}</b> — {html.escape(fig.caption)}</figcaption>"
                f"<img alt='{html.escape(fig.title)}' src='data:image/png;base64,{data}'></figure>"
            )
        for title, frame in tables:
            blocks.append(f"<h3>{html.escape(title)}</h3>{_table(frame)}")
        if not figs and not tables:
            blocks.append("<p class='note'>Nothing to draw from this store.</p>")
        sections.append("\n".join(blocks))
        if progress is not None:
            progress.update(1)
    if progress is not None:
        progress.close()
    page = out / "index.html"
    page.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>slimjax report</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1500px;color:#222}}img{{max-width:100%;height:auto}}
figure{{margin:1em 0 2em 0}}figcaption{{margin-bottom:.4em}}table.t{{border-collapse:collapse;font-size:13px}}
table.t td,table.t th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}}.note{{color:#666}}</style></head>
<body><h1>slimjax report</h1><p class="note">slimjax {html.escape(__version__)}; {len(loaded)} input(s):
{html.escape(", ".join(os.fspath(p) for p, _, _ in loaded))}</p>
{"".join(f"<section>{s}</section>" for s in sections)}
</body></html>
""")
    return page
