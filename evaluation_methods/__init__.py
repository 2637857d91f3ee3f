"""The evaluation methods, one module per paper, each the typed command of ``evaluate.py`` that runs it."""

from evaluation_methods.evg import EvGEvaluation
from evaluation_methods.generated import GeneratedEvaluation, GenerateSets
from evaluation_methods.open_set import OSCREvaluation
from evaluation_methods.severity import SeverityEvaluation, SeverityPlot

__all__ = ["EvGEvaluation", "GenerateSets", "GeneratedEvaluation", "OSCREvaluation", "SeverityEvaluation",
           "SeverityPlot"]
