"""Open-Set Classification Rate (OSCR) curve and CCR at fixed FPR.

Dhamija, Günther, Boult, *Reducing Network Agnostophobia* (NeurIPS 2018), as used by Palechor, Bhoumik,
Günther, *Large-Scale Open-Set Classification Protocols for ImageNet* (WACV 2023):

    CCR(θ) = |{x known : argmax_c S_c(x) = y(x)  and  S_y(x) > θ}| / N_K
    FPR(θ) = |{x unknown : max_c S_c(x) > θ}| / N_U

with strict ``>`` for both and θ running over every distinct score, i.e. over the distinct values of
``{S_y(x) : x known} ∪ {max_c S_c(x) : x unknown}``. "Unknown" is whichever label ``unknown_label``
names: ``-1`` for the negatives seen in training, ``-2`` for the unknowns never seen. Samples with any
other negative label are ignored.

The curve is computed with a single sort of the ``N_K + N_U`` scores and two cumulative sums, so it
costs about one ``torch.sort`` (see ``benchmarks/oscr_benchmark.py``) instead of the authors' one pass
over the data per threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from metrics._validation import UNKNOWN_LABEL, check_probs_and_target
from metrics.collect import IndexedPredictions

DEFAULT_FPR_TARGETS: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0)


def _known_and_unknown_scores(
    probs: Tensor, target: Tensor, *, unknown_label: int, background: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Split into ``S_y`` and correctness of the known samples, and ``max_c S_c`` of the unknowns."""
    if unknown_label >= 0:
        raise ValueError(f"unknown_label must be negative (-1 negatives, -2 unknowns), got {unknown_label}")
    probs, target, _ = check_probs_and_target(probs, target, background=background)
    known = target >= 0
    unknown = target == unknown_label
    if not known.any():
        raise ValueError("OSCR needs at least one known sample (label >= 0); none was given")
    if not unknown.any():
        raise ValueError(f"OSCR needs at least one sample with unknown_label={unknown_label}; none was given")
    # one pass over (N, K) for all rows, then select: cheaper than copying the known and unknown rows
    max_score, prediction = probs.max(dim=1)
    labels = target.clamp(min=0)
    target_score = probs.gather(1, labels[:, None]).squeeze(1)[known]
    correct = (prediction == labels)[known]
    unknown_score = max_score[unknown]
    return target_score, correct, unknown_score


def oscr_curve(
    probs: Tensor,
    target: Tensor,
    unknown_label: int = UNKNOWN_LABEL,
    background: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """OSCR curve: one (FPR, CCR) point per distinct score threshold.

    Args:
        probs: ``(N, K)`` class probabilities over the known classes, or ``(N, K+1)`` with
            ``background=True`` (the last column is dropped, not renormalised).
        target: ``(N,)`` labels: ``0..K-1`` known, ``-1`` negative, ``-2`` unknown.
        unknown_label: which negative label counts as "unknown" for the FPR.
        background: whether ``probs`` carries a background column.

    Returns:
        ``(fpr, ccr, thresholds)``, each ``(T,)`` for the ``T`` distinct thresholds in descending
        order, so ``fpr`` and ``ccr`` are non-decreasing. ``fpr`` and ``ccr`` are float64.
    """
    target_score, correct, unknown_score = _known_and_unknown_scores(
        probs, target, unknown_label=unknown_label, background=background
    )
    num_known, num_unknown = target_score.numel(), unknown_score.numel()
    scores = torch.cat([target_score, unknown_score])
    # One int64 code per sample: bit 0 marks a correct known, bit 32 an unknown, so a single cumulative
    # sum counts both (counts stay far below 2**32).
    codes = torch.cat([correct.long(), torch.full((num_unknown,), 1 << 32, dtype=torch.long, device=scores.device)])

    sorted_scores, order = torch.sort(scores, descending=True)
    # Counts of samples strictly above each position's score: a cumulative sum shifted by one,
    # read off at the first occurrence of every distinct value (ties share that count).
    above = torch.cumsum(codes[order], dim=0)
    first = torch.ones_like(sorted_scores, dtype=torch.bool)
    first[1:] = sorted_scores[1:] != sorted_scores[:-1]
    positions = first.nonzero().squeeze(1)
    above = torch.cat([above.new_zeros(1), above])[positions]
    correct_above = above & 0xFFFFFFFF
    unknown_above = above >> 32
    ccr = correct_above.double() / num_known
    fpr = unknown_above.double() / num_unknown
    return fpr, ccr, sorted_scores[positions]


def ccr_from_curve(fpr: Tensor, ccr: Tensor, fpr_targets: Sequence[float] | Tensor) -> Tensor:
    """The largest CCR whose FPR does not exceed each target, from a curve of :func:`oscr_curve`."""
    targets = torch.as_tensor(fpr_targets, dtype=torch.float64, device=fpr.device).flatten()
    if ((targets < 0) | (targets > 1) | ~torch.isfinite(targets)).any():
        raise ValueError(f"FPR targets must lie in [0, 1], got {targets.tolist()}")
    # fpr and ccr are both non-decreasing along the curve, so the best CCR with FPR <= t is the
    # last point whose FPR is <= t. The first point (highest threshold) always has FPR 0.
    last = torch.searchsorted(fpr, targets, right=True) - 1
    return ccr[last.clamp(min=0)]


def ccr_at_fpr(
    probs: Tensor,
    target: Tensor,
    fpr_targets: Sequence[float] | Tensor = DEFAULT_FPR_TARGETS,
    unknown_label: int = UNKNOWN_LABEL,
    background: bool = False,
) -> Tensor:
    """CCR at fixed FPR: for each target, the largest CCR on the OSCR curve whose FPR does not exceed it.

    Args:
        probs, target, unknown_label, background: as in :func:`oscr_curve`.
        fpr_targets: FPR values in ``[0, 1]``, e.g. ``(1e-3, 1e-2, 1e-1, 1)``.

    Returns:
        ``(len(fpr_targets),)`` float64 tensor, one CCR per target.
    """
    fpr, ccr, _ = oscr_curve(probs, target, unknown_label=unknown_label, background=background)
    return ccr_from_curve(fpr, ccr, fpr_targets)


def closed_set_accuracy(probs: Tensor, target: Tensor, background: bool = False) -> Tensor:
    """Top-1 accuracy over the known samples, argmax over the known classes only (float64, 0-dim)."""
    probs, target, _ = check_probs_and_target(probs, target, background=background)
    known = target >= 0
    if not known.any():
        raise ValueError("closed-set accuracy needs at least one known sample (label >= 0)")
    return (probs[known].argmax(dim=1) == target[known]).double().mean()


def max_known_score(probs: Tensor, background: bool = False) -> Tensor:
    """``max_c S_c`` over the known classes, the open-set confidence of OSCR (``(N,)``)."""
    if background:
        probs = probs[:, :-1]
    return probs.max(dim=1).values


class OSCR(IndexedPredictions):
    """Stateful OSCR curve: ``compute()`` returns ``(fpr, ccr, thresholds)`` as :func:`oscr_curve`."""

    def __init__(self, unknown_label: int = UNKNOWN_LABEL, background: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unknown_label = unknown_label
        self.background = background

    def compute(self) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        probs, target = super().compute()
        return oscr_curve(probs, target, unknown_label=self.unknown_label, background=self.background)


class CCRAtFPR(OSCR):
    """Stateful CCR at fixed FPR: ``compute()`` returns one CCR per FPR target as :func:`ccr_at_fpr`."""

    higher_is_better = True

    def __init__(
        self,
        fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
        unknown_label: int = UNKNOWN_LABEL,
        background: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(unknown_label=unknown_label, background=background, **kwargs)
        self.fpr_targets = tuple(float(t) for t in fpr_targets)

    def compute(self) -> Tensor:  # type: ignore[override]
        fpr, ccr, _ = super().compute()
        return ccr_from_curve(fpr, ccr, self.fpr_targets)
