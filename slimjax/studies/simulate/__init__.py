"""The serving simulation as a study (MODEL.md §9, §10): its file (:mod:`.spec`), its run over candidates
(:mod:`.run`, on :mod:`slimjax.engine.sim`) and how its store is shown (:mod:`.present`), registered once as the
``simulation`` kind."""

from ..present import StudyKind, register_study
from . import present
from .run import PER_REQUEST, SIMULATION, SUMMARIES, broadcast_candidates, candidate_inputs, run, simulation_assumptions
from .spec import Simulation, Stream, parse

register_study(
    StudyKind(
        "simulation", figures=present.simulation_figures, tables=present.report_tables, text=present.simulation_table
    )
)

__all__ = [
    "PER_REQUEST",
    "SIMULATION",
    "SUMMARIES",
    "Simulation",
    "Stream",
    "broadcast_candidates",
    "candidate_inputs",
    "parse",
    "present",
    "run",
    "simulation_assumptions",
]
