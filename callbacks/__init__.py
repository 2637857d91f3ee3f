"""Each method's evaluation: its ``evaluate(runner, ...)`` (in the processes of an
:class:`evaluation_engine.runner.Runner`: launched by a command, or a Trainer's during training) scores through the
engine's passes and hands the outputs to :mod:`metrics`, returning a :class:`evaluation_engine.results.MethodResult`;
its Lightning hooks call the same ``evaluate`` during training (and the generators' writers run in ``predict``).

Open-set OSCR (:class:`OpenSetEvaluation`), C-OOD severity (:class:`SeverityAUROC`, also during training), the
generated sets (:class:`GeneratedSetWriter`, :class:`SampleGrids`, :class:`GeneratedBenchmark`) and EvG
(:class:`EvGReport`). The commands that run them are in :mod:`evaluation_methods`.
"""

from callbacks.evg import AdversarialReport, EvGReport
from callbacks.generated import GeneratedBenchmark, GeneratedSetWriter, SampleGrids
from callbacks.open_set import OpenSetEvaluation
from callbacks.severity import SeverityAUROC

__all__ = [
    "AdversarialReport",
    "EvGReport",
    "GeneratedBenchmark",
    "GeneratedSetWriter",
    "OpenSetEvaluation",
    "SampleGrids",
    "SeverityAUROC",
]
