"""The evaluation engine every method stands on: the scoring passes (:mod:`evaluation_engine.scoring`: one sharded pass per
(model, data set), cached, fitted detectors' fit pass), the intervals (:mod:`evaluation_engine.intervals`), the outputs
(:mod:`evaluation_engine.outputs`: folders, atomic table writers, replicates, W&B), the figures (:mod:`evaluation_engine.plots`) and
the trainer options and base of the typed evaluations (:mod:`evaluation_engine.run`)."""

from evaluation_engine.intervals import Intervals
from evaluation_engine.run import Evaluation, TrainerOptions
from evaluation_engine.scoring import ScoringPasses

__all__ = ["Evaluation", "Intervals", "ScoringPasses", "TrainerOptions"]
