"""The procurement study (MODEL.md §8, §10): its file (:mod:`.spec`), the closed-form screen on the block engine
(:mod:`.screen`, the ``procurement`` kind of :mod:`slimjax.engine.grid`), sizing by simulation (:mod:`.sizing`)
and disaggregated pools (:mod:`slimjax.studies.disaggregated`), its text (:mod:`.tables`) and figures
(:mod:`.figures`), registered once as the ``procurement`` kind."""

from ..present import StudyKind, register_study
from . import figures, screen, sizing, tables
from .spec import Study, parse

register_study(
    StudyKind(
        "procurement", figures=figures.procurement_figures, tables=figures.report_tables, text=tables.ranked_tables
    )
)

__all__ = ["Study", "figures", "parse", "screen", "sizing", "tables"]
