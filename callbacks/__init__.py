"""Evaluation callbacks: orchestration only (collect -> score -> metric -> log/plot); the math is in ``metrics``.

Each method has its callback and its typed evaluation (the command of ``evaluate.py``, runnable from
Python): open-set OSCR (:class:`OpenSetEvaluation`, :class:`OSCREvaluation`), C-OOD severity
(:class:`SeverityAUROC`, :class:`SeverityEvaluation`), the generated benchmarks (:class:`GeneratedBenchmark`,
:class:`GeneratedEvaluation`, :class:`GenerateSets`), EvG (:class:`EvGReport`, :class:`EvGEvaluation`). They
stand on one engine: the scoring passes (:mod:`callbacks.scoring`) and the report layer
(:mod:`callbacks.report`).
"""

from callbacks.evg import AdversarialReport, EvGEvaluation, EvGReport
from callbacks.generated import (
    GeneratedBenchmark,
    GeneratedEvaluation,
    GeneratedSetWriter,
    GenerateSets,
    SampleGrids,
)
from callbacks.open_set import OpenSetEvaluation, OSCREvaluation
from callbacks.run import Evaluation, TrainerOptions
from callbacks.scoring import ScoringPasses
from callbacks.severity import SeverityAUROC, SeverityEvaluation, SeverityPlot

__all__ = [
    "AdversarialReport",
    "EvGEvaluation",
    "EvGReport",
    "Evaluation",
    "GenerateSets",
    "GeneratedBenchmark",
    "GeneratedEvaluation",
    "GeneratedSetWriter",
    "OSCREvaluation",
    "OpenSetEvaluation",
    "SampleGrids",
    "ScoringPasses",
    "SeverityAUROC",
    "SeverityEvaluation",
    "SeverityPlot",
    "TrainerOptions",
]
