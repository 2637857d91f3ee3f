"""Evaluation callbacks: orchestration only (collect -> score -> metric -> log/plot); the math is in ``metrics``."""

from callbacks.open_set_evaluation import OpenSetEvaluation
from callbacks.severity import SeverityAUROC

__all__ = ["OpenSetEvaluation", "SeverityAUROC"]
