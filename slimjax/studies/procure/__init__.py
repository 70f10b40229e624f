"""The procurement study (MODEL.md §8, §10): its file (:mod:`.spec`), the closed-form screen on the block engine
(:mod:`.screen`, the ``procurement`` kind of :mod:`slimjax.engine.grid`), sizing by simulation (:mod:`.sizing`)
and disaggregated pools (:mod:`slimjax.studies.disaggregated`), its text (:mod:`.tables`) and figures
(:mod:`.figures`), registered once as the ``procurement`` kind. Importing the package loads its file reader only;
the rest loads on first use (the command line checks a file before the engine and xarray load)."""

from ..present import StudyKind, deferred, lazy_members, register_study
from .spec import Study, parse

register_study(
    StudyKind(
        "procurement",
        figures=deferred(f"{__name__}.figures", "procurement_figures"),
        tables=deferred(f"{__name__}.figures", "report_tables"),
        text=deferred(f"{__name__}.tables", "ranked_tables"),
    )
)

_MODULES = ("figures", "screen", "sizing", "tables")
__getattr__ = lazy_members(__name__, {m: f".{m}" for m in _MODULES})

__all__ = [*_MODULES, "Study", "parse"]
