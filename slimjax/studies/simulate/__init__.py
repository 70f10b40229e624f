"""The serving simulation as a study (MODEL.md §9, §10): its file (:mod:`.spec`), its run over candidates
(:mod:`.fleet`, on :mod:`slimjax.engine.sim`) and how its store is shown (:mod:`.present`), registered once as the
``simulation`` kind. Importing the package loads its file reader only; the run and its presentation load on first
use (the command line checks a file before the engine and xarray load)."""

from ..present import StudyKind, deferred, lazy_members, register_study
from .spec import Simulation, Stream, parse

register_study(
    StudyKind(
        "simulation",
        figures=deferred(f"{__name__}.present", "simulation_figures"),
        tables=deferred(f"{__name__}.present", "report_tables"),
        text=deferred(f"{__name__}.present", "simulation_table"),
    )
)

_RUN = ("PER_REQUEST", "SIMULATION", "SUMMARIES", "broadcast_candidates", "candidate_inputs", "run")
__getattr__ = lazy_members(
    __name__, {"present": ".present", "simulation_assumptions": ".fleet", **dict.fromkeys(_RUN, ".fleet")}
)

__all__ = [*_RUN, "Simulation", "Stream", "parse", "present", "simulation_assumptions"]
