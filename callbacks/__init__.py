"""Evaluation callbacks: orchestration only (collect -> score -> metric -> log/plot); the math is in ``metrics``."""

from callbacks.evg import AdversarialReport
from callbacks.generated import GeneratedBenchmark, GeneratedSetWriter, SampleGrids
from callbacks.open_set import OpenSetEvaluation
from callbacks.severity import SeverityAUROC

__all__ = ["AdversarialReport", "GeneratedBenchmark", "GeneratedSetWriter", "OpenSetEvaluation", "SampleGrids",
           "SeverityAUROC"]
