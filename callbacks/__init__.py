"""Evaluation callbacks: orchestration only (collect -> score -> metric -> log/plot); the math is in ``metrics``."""

from callbacks.open_set_evaluation import OpenSetEvaluation

__all__ = ["OpenSetEvaluation"]
