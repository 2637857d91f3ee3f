"""The evaluation engine every method stands on: where an evaluation runs (:mod:`evaluation_engine.runner`: the
processes Fabric launches or a Trainer runs, the precision, the loggers, the trainer options), the scoring passes
(:mod:`evaluation_engine.scoring`: one sharded pass per (model, data set), cached, fitted detectors' fit pass), the
intervals (:mod:`evaluation_engine.intervals`), the outputs (:mod:`evaluation_engine.outputs`: folders, atomic table
writers, replicates, W&B), what an evaluation returns (:mod:`evaluation_engine.results`), the figures
(:mod:`evaluation_engine.plots`) and the base of the typed evaluation commands (:mod:`evaluation_engine.command`)."""

from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.results import MethodResult
from evaluation_engine.runner import Runner, TrainerOptions
from evaluation_engine.scoring import ScoringPasses

__all__ = ["Evaluation", "Intervals", "MethodResult", "Runner", "ScoringPasses", "TrainerOptions"]
