"""Input checks shared by the metric functions.

Every metric validates its input the same way, so a NaN in the scores or a label outside the
protocol's range is reported with the offending value instead of producing a silently wrong number.
"""

from __future__ import annotations

import torch
from torch import Tensor

KNOWN_MIN_LABEL = 0
NEGATIVE_LABEL = -1
UNKNOWN_LABEL = -2


def as_tensor(values: Tensor | object, *, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """Convert array-likes (numpy, lists) to a tensor; keep tensors as they are."""
    tensor = values if isinstance(values, Tensor) else torch.as_tensor(values)
    if dtype is not None:
        tensor = tensor.to(dtype)
    return tensor


def check_finite(values: Tensor, *, name: str) -> None:
    """Raise ``ValueError`` naming the first rows that hold NaN or infinity."""
    # A float64 sum is finite exactly when every value is (NaN and infinities propagate, and no
    # realistic score table overflows it); one reduction instead of a full boolean mask.
    if values.is_floating_point() and not torch.isfinite(values.sum(dtype=torch.float64)):
        bad = ~torch.isfinite(values)
        if bad.any():
            rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().flatten()
            raise ValueError(
                f"{name} contains NaN or infinite values in {rows.numel()} rows "
                f"(first rows: {rows[:5].tolist()}); scores must be finite"
            )


def check_probs_and_target(
    probs: Tensor | object, target: Tensor | object, *, background: bool
) -> tuple[Tensor, Tensor, int]:
    """Validate ``probs`` ``(N, K)`` (``(N, K+1)`` with background) and ``target`` ``(N,)``.

    Returns:
        ``(probs over the K known classes, target as int64, K)``. With ``background=True`` the last
        column is dropped without renormalising (DESIGN.md §3).
    """
    probs = as_tensor(probs, name="probs")
    target = as_tensor(target, name="target")
    if probs.ndim != 2:
        raise ValueError(f"probs must have shape (N, K), got {tuple(probs.shape)}")
    if not probs.is_floating_point():
        raise TypeError(f"probs must be floating point, got {probs.dtype}")
    if target.ndim != 1 or target.shape[0] != probs.shape[0]:
        raise ValueError(
            f"target must have shape (N,) with N = {probs.shape[0]} to match probs, got {tuple(target.shape)}"
        )
    if target.is_floating_point():
        raise TypeError(f"target must hold integer labels, got {target.dtype}")
    check_finite(probs, name="probs")
    if background:
        if probs.shape[1] < 2:
            raise ValueError(f"background=True needs at least 2 columns (K known + 1 background), got {probs.shape[1]}")
        probs = probs[:, :-1]
    num_known = probs.shape[1]
    target = target.long()
    too_large = target >= num_known
    if too_large.any():
        raise ValueError(
            f"target holds label {int(target[too_large][0])} but probs cover only {num_known} known classes "
            f"(labels 0..{num_known - 1}, negatives {NEGATIVE_LABEL}, unknowns {UNKNOWN_LABEL})"
        )
    return probs, target, num_known


def check_scores(scores: Tensor | object, *, name: str) -> Tensor:
    """Validate a 1-D score vector."""
    scores = as_tensor(scores, name=name)
    if scores.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got {tuple(scores.shape)}")
    if not scores.is_floating_point():
        scores = scores.double()
    check_finite(scores, name=name)
    return scores
