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

CCR at a fixed FPR comes in two conventions (DESIGN.md §5.1):

- ``"exact"`` (the default): the largest CCR on the curve above whose FPR does not exceed the target.
- ``"authors"``: the procedure behind the published tables of Palechor et al. (their ``calculate_oscr``
  and table script). The curve has thresholds only at the distinct target scores ``S_y`` of the known
  samples, all but the largest (:func:`authors_oscr_curve`); for each target ``t`` the table takes the
  point whose FPR is nearest to ``t`` (it may lie above ``t``; among equally near points the one with the
  lowest threshold) and prints "—" when ``|FPR - t| / t >= 0.1``, which is NaN here
  (:func:`ccr_from_authors_curve`). Use it to compare with their tables, and say so in reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from metrics._validation import UNKNOWN_LABEL, check_probs_and_target, known_columns
from metrics.collect import IndexedPredictions

DEFAULT_FPR_TARGETS: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0)

Convention = Literal["exact", "authors"]
CONVENTIONS: tuple[str, ...] = get_args(Convention)
# the authors' table prints "—" when the nearest curve point is this far from the target, relative to it
AUTHORS_RELATIVE_TOLERANCE = 0.1


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")


def _fpr_targets(fpr_targets: Sequence[float] | Tensor, *, convention: str, device: torch.device | None) -> Tensor:
    """FPR targets as a float64 ``(M,)`` tensor: ``[0, 1]`` for "exact", ``(0, 1]`` for "authors"."""
    targets = torch.as_tensor(fpr_targets, dtype=torch.float64, device=device).flatten()
    if ((targets < 0) | (targets > 1) | ~torch.isfinite(targets)).any():
        raise ValueError(f"FPR targets must lie in [0, 1], got {targets.tolist()}")
    if convention == "authors" and (targets == 0).any():
        raise ValueError(
            f"FPR targets must lie in (0, 1] for convention='authors' (its '—' rule divides by the target), "
            f"got {targets.tolist()}"
        )
    return targets


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
    targets = _fpr_targets(fpr_targets, convention="exact", device=fpr.device)
    # fpr and ccr are both non-decreasing along the curve, so the best CCR with FPR <= t is the
    # last point whose FPR is <= t. The first point (highest threshold) always has FPR 0.
    last = torch.searchsorted(fpr, targets, right=True) - 1
    return ccr[last.clamp(min=0)]


def authors_oscr_curve(
    probs: Tensor,
    target: Tensor,
    unknown_label: int = UNKNOWN_LABEL,
    background: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The OSCR curve as the authors' ``calculate_oscr`` computes it (Palechor et al., WACV 2023).

    With ``τ`` running over the distinct target scores ``S_y`` of the known samples in ascending order,
    all but the largest (``np.unique(target_score)[:-1]``)::

        CCR(τ) = |{x known : argmax_c S_c(x) = y(x)  and  S_y(x) > τ}| / N_K
        FPR(τ) = |{x unknown : max_c S_c(x) > τ}| / N_U

    The formulas are those of :func:`oscr_curve`; only the thresholds differ (no threshold at the unknowns'
    scores, none at the largest known score), so this curve is a subset of the exact one. It is the
    curve behind the published CCR@FPR tables (``convention="authors"``), computed with one sort per
    group and a binary search per threshold instead of their pass over the data per threshold.

    Args:
        probs: ``(N, K)`` class probabilities over the known classes, or ``(N, K+1)`` with
            ``background=True`` (the last column is dropped, not renormalised).
        target: ``(N,)`` labels: ``0..K-1`` known, ``-1`` negative, ``-2`` unknown.
        unknown_label: which negative label counts as "unknown" for the FPR.
        background: whether ``probs`` carries a background column.

    Returns:
        ``(fpr, ccr, thresholds)``, each ``(T,)`` with ``T`` = number of distinct known target scores
        minus one (``T = 0``: empty curve), thresholds in ascending order, so ``fpr`` and ``ccr`` are
        non-increasing. ``fpr`` and ``ccr`` are float64; ``thresholds`` have the dtype of ``probs``.
    """
    target_score, correct, unknown_score = _known_and_unknown_scores(
        probs, target, unknown_label=unknown_label, background=background
    )
    num_known, num_unknown = target_score.numel(), unknown_score.numel()
    thresholds = torch.unique(target_score, sorted=True)[:-1].contiguous()
    correct_scores = torch.sort(target_score[correct]).values
    unknown_scores = torch.sort(unknown_score).values
    # samples strictly above τ = all of them minus those <= τ (right=True puts ties below τ)
    correct_above = correct_scores.numel() - torch.searchsorted(correct_scores, thresholds, right=True)
    unknown_above = num_unknown - torch.searchsorted(unknown_scores, thresholds, right=True)
    return unknown_above.double() / num_unknown, correct_above.double() / num_known, thresholds


def ccr_from_authors_curve(fpr: Tensor, ccr: Tensor, fpr_targets: Sequence[float] | Tensor) -> Tensor:
    """CCR at each FPR target by the authors' table rule, from a curve of :func:`authors_oscr_curve`.

    For each target ``t`` the point ``i = argmin_i |FPR_i - t|`` (it may lie above ``t``; among equally
    near points the first, i.e. the lowest threshold, as ``np.argmin`` over ascending thresholds gives);
    the value is ``CCR_i``, or NaN (the tables' "—") when ``|FPR_i - t| / t >= 0.1``, and NaN for every
    target when the curve is empty.

    Args:
        fpr: ``(T,)`` non-increasing FPR, thresholds ascending, as :func:`authors_oscr_curve` returns it.
        ccr: ``(T,)`` CCR at the same thresholds.
        fpr_targets: ``M`` FPR values in ``(0, 1]``.

    Returns:
        ``(M,)`` float64 tensor, one CCR (or NaN) per target.
    """
    targets = _fpr_targets(fpr_targets, convention="authors", device=fpr.device)
    num_points = fpr.numel()
    if num_points == 0:
        return torch.full_like(targets, float("nan"))
    fpr, ccr = fpr.double(), ccr.double()
    # -fpr is non-decreasing, so a binary search finds the two candidates: "below", the first point
    # whose FPR is <= t (the largest such FPR, lowest threshold among its ties), and "above", the first
    # point of the run of the smallest FPR > t (the run ends at below - 1). Negation is exact.
    ascending = -fpr
    below = torch.searchsorted(ascending, -targets)
    has_below, has_above = below < num_points, below > 0
    above = torch.searchsorted(ascending, ascending[(below - 1).clamp(min=0)])
    below = below.clamp(max=num_points - 1)
    distance_below = (fpr[below] - targets).abs()
    distance_above = (fpr[above] - targets).abs()
    # "above" has the lower index, so it wins ties, as np.argmin would pick it
    use_above = has_above & (~has_below | (distance_above <= distance_below))
    nearest = torch.where(use_above, above, below)
    distance = torch.where(use_above, distance_above, distance_below)
    return torch.where(distance / targets >= AUTHORS_RELATIVE_TOLERANCE, float("nan"), ccr[nearest])


def ccr_at_fpr(
    probs: Tensor,
    target: Tensor,
    fpr_targets: Sequence[float] | Tensor = DEFAULT_FPR_TARGETS,
    unknown_label: int = UNKNOWN_LABEL,
    background: bool = False,
    convention: Convention = "exact",
) -> Tensor:
    """CCR at fixed FPR, one value per target, in the exact or the authors' table convention.

    ``convention="exact"`` (default): the largest CCR on :func:`oscr_curve` whose FPR does not exceed the
    target (DESIGN.md §5.1). ``convention="authors"``: the procedure behind the published tables of
    Palechor et al. (WACV 2023): the point of :func:`authors_oscr_curve` whose FPR is nearest to the
    target, NaN (their "—") when it is 10 % of the target or more away (:func:`ccr_from_authors_curve`).

    Args:
        probs, target, unknown_label, background: as in :func:`oscr_curve`.
        fpr_targets: FPR values in ``[0, 1]`` (``(0, 1]`` for "authors"), e.g. ``(1e-3, 1e-2, 1e-1, 1)``.
        convention: ``"exact"`` or ``"authors"``.

    Returns:
        ``(len(fpr_targets),)`` float64 tensor, one CCR per target (NaN possible only for "authors").
    """
    _check_convention(convention)
    if convention == "authors":
        fpr, ccr, _ = authors_oscr_curve(probs, target, unknown_label=unknown_label, background=background)
        return ccr_from_authors_curve(fpr, ccr, fpr_targets)
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
    return known_columns(probs, background).max(dim=1).values


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
    """Stateful CCR at fixed FPR: ``compute()`` returns one CCR per FPR target as :func:`ccr_at_fpr`.

    ``convention`` is ``"exact"`` (default) or ``"authors"`` (the published tables' rule, NaN for "—").
    """

    higher_is_better = True

    def __init__(
        self,
        fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
        unknown_label: int = UNKNOWN_LABEL,
        background: bool = False,
        convention: Convention = "exact",
        **kwargs: Any,
    ) -> None:
        _check_convention(convention)
        # fail at construction, not after a whole evaluation epoch
        _fpr_targets(fpr_targets, convention=convention, device=None)
        super().__init__(unknown_label=unknown_label, background=background, **kwargs)
        self.fpr_targets = tuple(float(t) for t in fpr_targets)
        self.convention = convention

    def compute(self) -> Tensor:  # type: ignore[override]
        probs, target = IndexedPredictions.compute(self)
        return ccr_at_fpr(
            probs,
            target,
            self.fpr_targets,
            unknown_label=self.unknown_label,
            background=self.background,
            convention=self.convention,
        )
