"""The Lightning callbacks of the four methods (``pl.Callback`` only): they collect a method's outputs during
``trainer.test`` / ``predict`` / ``fit`` and hand them to :mod:`metrics` through the engine (:mod:`engine`).

Open-set OSCR (:class:`OpenSetEvaluation`), C-OOD severity (:class:`SeverityAUROC`, also during training), the
generated sets (:class:`GeneratedSetWriter`, :class:`SampleGrids`, :class:`GeneratedBenchmark`) and EvG
(:class:`EvGReport`). The commands that run them are in :mod:`methods`.
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
