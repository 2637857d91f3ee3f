"""Open-Set Classification Rate (OSCR) curve and CCR at fixed FPR.

Dhamija, Günther, Boult, *Reducing Network Agnostophobia* (NeurIPS 2018), as used by Palechor, Bhoumik,
Günther, *Large-Scale Open-Set Classification Protocols for ImageNet* (WACV 2023):

    CCR(θ) = |{x known : argmax_c S_c(x) = y(x)  and  S_y(x) > θ}| / N_K
    FPR(θ) = |{x unknown : max_c S_c(x) > θ}| / N_U

with strict ``>`` for both and θ running over every distinct score, i.e. over the distinct values of
``{S_y(x) : x known} ∪ {max_c S_c(x) : x unknown}``. "Unknown" is whichever label ``unknown_label``
names: ``-1`` for the negatives seen in training, ``-2`` for the unknowns never seen. Samples with any
other negative label are ignored.

The curve is computed with a single sort of the ``N_K + N_U`` scores and two cumulative sums instead of
the authors' one pass over the data per threshold. The sort is of integers (each score's bit pattern with
a 2-bit tag, correct known / wrong known / unknown, attached: see ``_sort_keys``), which PyTorch radix-sorts
on CUDA and, for large 1-D tensors, on the CPU; so the whole curve, input validation included, costs less
than 1.5 ``torch.sort`` of N float32 values at N = 1e7 (``benchmarks/oscr_benchmark.py``).

The public functions validate their input once (:func:`metrics._validation.check_probs_and_target`) and
delegate to unvalidated ``_..._checked`` helpers, which :func:`metrics.open_set_report` calls directly
after its own single validation.

CCR at a fixed FPR comes in two conventions (DESIGN.md §5.1):

- ``"exact"`` (the default): the largest CCR on the curve above whose FPR does not exceed the target.
- ``"authors"``: the procedure behind the published tables of Palechor et al. (their ``calculate_oscr``
  and table script). The curve has thresholds only at the distinct target scores ``S_y`` of the known
  samples, all but the largest (:func:`authors_oscr_curve`); for each target ``t`` the table takes the
  point whose FPR is nearest to ``t`` (it may lie above ``t``; among equally near points the one with the
  lowest threshold) and prints "—" when ``|FPR - t| / t >= 0.1``, which is NaN here
  (:func:`ccr_from_authors_curve`). Use it to compare with their tables, and say so in reports.

**Weighted** (the bootstrap, :mod:`metrics.resampling`): :func:`weighted_ccr_at_fpr` gives CCR@FPR, in either
convention, of every row of weights at once, over one sort of the knowns' target scores and one of the
unknowns' scores shared by every row (``_OpenSetPlan``, ``_ExactCCRPlan``, ``_authors_ccr``): per row, the
curve of the expanded resample (θ over the scores *present* in the row: a sample of weight 0 adds no
threshold), read off weighted cumulative sums. :func:`metrics.bootstrap_open_set` runs the same kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor

from metrics._validation import UNKNOWN_LABEL, check_probs_and_target, known_columns
from metrics.collect import IndexedPredictions
from metrics.resampling import _check_weights

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


def _check_unknown_label(unknown_label: int) -> None:
    if unknown_label >= 0:
        raise ValueError(f"unknown_label must be negative (-1 negatives, -2 unknowns), got {unknown_label}")


def _groups(target: Tensor, unknown_label: int) -> tuple[Tensor, Tensor, int, int]:
    """Masks and counts of the known samples and of those labelled ``unknown_label`` (one host sync)."""
    known = target >= 0
    unknown = target == unknown_label
    num_known, num_unknown = torch.stack([known.count_nonzero(), unknown.count_nonzero()]).tolist()
    if not num_known:
        raise ValueError("OSCR needs at least one known sample (label >= 0); none was given")
    if not num_unknown:
        raise ValueError(f"OSCR needs at least one sample with unknown_label={unknown_label}; none was given")
    return known, unknown, num_known, num_unknown


# (S_y, max_c S_c, argmax_c S_c == y) of every row, as _row_scores returns them
Rows = tuple[Tensor, Tensor, Tensor]


def _row_scores(probs: Tensor, target: Tensor) -> Rows:
    """For every row: ``S_y`` (the label clamped to 0 for negatives), ``max_c S_c`` and ``argmax_c S_c = y``.

    One pass over ``(N, K)`` for all rows, then cheap ``(N,)`` selections: cheaper than copying the known
    and unknown rows first. ``max`` returns the first maximal index, as ``argmax`` does.
    """
    max_score, prediction = probs.max(dim=1)
    labels = target.clamp(min=0)
    target_score = probs.gather(1, labels[:, None]).squeeze(1)
    return target_score, max_score, prediction == labels


def _known_and_unknown_scores_checked(
    probs: Tensor, target: Tensor, *, unknown_label: int, rows: Rows | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``S_y`` and correctness of the known samples, ``max_c S_c`` of the unknowns, from validated input
    (``probs`` over the known columns, ``target`` int64, as :func:`check_probs_and_target` returns them;
    ``rows``: :func:`_row_scores` of them when the caller has it already)."""
    _check_unknown_label(unknown_label)
    known, unknown, _, _ = _groups(target, unknown_label)
    target_score, max_score, correct = _row_scores(probs, target) if rows is None else rows
    return target_score[known], correct[known], max_score[unknown]


# The sort keys of the exact curve. A non-negative float's bit pattern, read as an integer, orders as the
# float does, and a probability's pattern leaves the top two bits free (1.0 is 0x3F800000 in float32,
# 0x3FF0... in float64). So with ``bits`` the pattern and ``code`` a 2-bit tag,
#     key = ((bits << 2) | code) ^ FLIP,    FLIP = the largest signed value (all bits set but the sign),
# is ``FLIP - 4·bits - code``, an integer whose ascending order is the descending order of the scores (XOR
# with FLIP turns "ascending unsigned" into "descending signed"), with each score's samples adjacent and
# ``key >> 2 == FLIP // 4 - bits`` (arithmetic shift) shared by exactly the samples of one score. The shift
# maps -0.0 (the sign bit alone) onto +0.0. One integer sort (PyTorch radix-sorts large integer tensors) then
# orders the scores with their tags attached: no float comparison sort, no gather of the tags by its order.
_KEY_DTYPES = {torch.float32: (torch.int32, (1 << 31) - 1), torch.float64: (torch.int64, (1 << 63) - 1)}
# the tag of each sample, and the low two bits of its key after the XOR (3 ^ tag), which index the weights
_CODE_CORRECT, _CODE_WRONG, _CODE_UNKNOWN = 1, 0, 2
_CORRECT_WEIGHTS = (0.0, 0.0, 1.0, 0.0)  # low bits 2: a correctly classified known sample
_UNKNOWN_WEIGHTS = (0.0, 1.0, 0.0, 0.0)  # low bits 1: an unknown


def _sort_keys(scores: Tensor, known: Tensor, correct: Tensor) -> Tensor:
    """``(N,)`` integer keys whose ascending order is the descending order of ``scores`` (ties adjacent).

    Overwrites ``scores`` (a temporary of the caller) with the keys: at N = 1e7 every fresh ``(N,)`` buffer
    costs about as much as the operation that fills it, so the hot path works in place where it can.
    """
    key_dtype, flip = _KEY_DTYPES[scores.dtype]

    def tag(code: int) -> Tensor:
        return scores.new_tensor(flip ^ code, dtype=key_dtype)

    tags = torch.where(correct, tag(_CODE_CORRECT), tag(_CODE_WRONG))
    torch.where(known, tags, tag(_CODE_UNKNOWN), out=tags)
    # (bits << 2) has two zero low bits, so (bits << 2) ^ (FLIP ^ code) == ((bits << 2) | code) ^ FLIP; the
    # shift is a logical one in torch (it wraps, -0.0's sign bit drops out)
    return scores.view(key_dtype).bitwise_left_shift_(2).bitwise_xor_(tags)


def _curve_from_sorted_keys(
    keys: Tensor, *, num_known: int, num_unknown: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """``(fpr, ccr, thresholds)`` from the sorted keys of :func:`_sort_keys` (overwritten)."""
    float_dtype = {torch.int32: torch.float32, torch.int64: torch.float64}[keys.dtype]
    flip = _KEY_DTYPES[float_dtype][1]
    low = keys & 3
    runs = keys.bitwise_right_shift_(2)  # arithmetic shift: one value per distinct score, FLIP // 4 - bits
    # the distinct scores and where each run of them starts in the sorted keys
    distinct, run_lengths = torch.unique_consecutive(runs, return_counts=True)
    positions = torch.empty_like(run_lengths)
    positions[0] = 0
    torch.cumsum(run_lengths[:-1], dim=0, out=positions[1:])

    # counts of samples strictly above each distinct score: exclusive cumulative sums of the tags'
    # weights, read off at the first key of every run of equal scores (ties share that count). float64
    # counts are exact up to 2**53 samples.
    def rate_above(weights: tuple[float, ...], total: int) -> Tensor:
        above = torch.empty(low.numel() + 1, dtype=torch.float64, device=low.device)
        above[0] = 0
        table = torch.tensor(weights, dtype=torch.float64, device=low.device)
        torch.index_select(table, 0, low, out=above[1:])
        above[1:].cumsum_(dim=0)
        return above[positions].div_(total)

    ccr, fpr = rate_above(_CORRECT_WEIGHTS, num_known), rate_above(_UNKNOWN_WEIGHTS, num_unknown)
    thresholds = distinct.neg_().add_(flip // 4).view(float_dtype).to(dtype)
    return fpr, ccr, thresholds


def _oscr_curve_checked(
    probs: Tensor, target: Tensor, *, unknown_label: int, rows: Rows | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`oscr_curve` of validated input (``probs`` over the known columns, ``target`` int64, as
    :func:`check_probs_and_target` returns them; ``rows``: :func:`_row_scores` of them, left unchanged)."""
    _check_unknown_label(unknown_label)
    known, unknown, num_known, num_unknown = _groups(target, unknown_label)
    own = rows is None
    target_score, max_score, correct = _row_scores(probs, target) if own else rows
    if target_score.dtype in _KEY_DTYPES:
        # into our own temporary when there is one (the keys then overwrite it too)
        scores = torch.where(known, target_score, max_score, out=target_score if own else None)
    else:  # float16, bfloat16: float32 holds every value exactly
        scores = torch.where(known, target_score, max_score).float()
    keys = _sort_keys(scores, known, correct)
    if num_known + num_unknown < keys.numel():  # samples of another negative label take no part
        keys = keys[known | unknown]
    keys = torch.sort(keys).values
    return _curve_from_sorted_keys(keys, num_known=num_known, num_unknown=num_unknown, dtype=probs.dtype)


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
    _check_unknown_label(unknown_label)
    probs, target, _ = check_probs_and_target(probs, target, background=background)
    return _oscr_curve_checked(probs, target, unknown_label=unknown_label)


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
    _check_unknown_label(unknown_label)
    probs, target, _ = check_probs_and_target(probs, target, background=background)
    return _authors_oscr_curve_checked(probs, target, unknown_label=unknown_label)


def _authors_oscr_curve_checked(
    probs: Tensor, target: Tensor, *, unknown_label: int, rows: Rows | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`authors_oscr_curve` of validated input, as :func:`_oscr_curve_checked`."""
    target_score, correct, unknown_score = _known_and_unknown_scores_checked(
        probs, target, unknown_label=unknown_label, rows=rows
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
    _check_unknown_label(unknown_label)
    probs, target, _ = check_probs_and_target(probs, target, background=background)
    if convention == "authors":
        fpr, ccr, _ = _authors_oscr_curve_checked(probs, target, unknown_label=unknown_label)
        return ccr_from_authors_curve(fpr, ccr, fpr_targets)
    fpr, ccr, _ = _oscr_curve_checked(probs, target, unknown_label=unknown_label)
    return ccr_from_curve(fpr, ccr, fpr_targets)


def closed_set_accuracy(probs: Tensor, target: Tensor, background: bool = False) -> Tensor:
    """Top-1 accuracy over the known samples, argmax over the known classes only (float64, 0-dim)."""
    probs, target, _ = check_probs_and_target(probs, target, background=background)
    return _closed_set_accuracy_checked(probs, target)


def _closed_set_accuracy_checked(probs: Tensor, target: Tensor, *, rows: Rows | None = None) -> Tensor:
    """:func:`closed_set_accuracy` of validated input, as :func:`_oscr_curve_checked`."""
    known = target >= 0
    if not known.any():
        raise ValueError("closed-set accuracy needs at least one known sample (label >= 0)")
    if rows is not None:
        return rows[2][known].double().mean()
    return (probs[known].argmax(dim=1) == target[known]).double().mean()


def max_known_score(probs: Tensor, background: bool = False) -> Tensor:
    """``max_c S_c`` over the known classes, the open-set confidence of OSCR (``(N,)``)."""
    return known_columns(probs, background).amax(dim=1)


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


# --------------------------------------------------------------------------------------------------
# weighted: every row of resampling weights at once


class _OpenSetPlan:
    """The knowns' target scores and correctness, sorted once, shared by every group and resample."""

    def __init__(self, target_score: Tensor, correct: Tensor) -> None:
        self.target_score, self.correct = target_score, correct
        self.correct_index = correct.nonzero().squeeze(1)
        correct_sorted, order = torch.sort(target_score[correct])
        self.correct_sorted = correct_sorted
        self.correct_order = self.correct_index[order]  # ascending S_y of the correct knowns
        self._values: tuple[Tensor, Tensor] | None = None

    @property
    def values(self) -> Tensor:
        """The distinct target scores of the knowns, ascending (the authors' thresholds)."""
        return self._unique()[0]

    @property
    def value_of(self) -> Tensor:
        """Each known's index in :attr:`values`."""
        return self._unique()[1]

    def _unique(self) -> tuple[Tensor, Tensor]:
        if self._values is None:  # only the authors' convention needs them
            self._values = torch.unique(self.target_score, sorted=True, return_inverse=True)
        return self._values

    def correct_above(self, known_weights: Tensor, thresholds: Tensor) -> Tensor:
        """``(B', M)`` weight of correct knowns with ``S_y > θ`` for per-row thresholds ``(B', M)``."""
        ordered = known_weights.index_select(1, self.correct_order).long()
        cumulative = torch.nn.functional.pad(torch.cumsum(ordered, dim=1), (1, 0))
        at_or_below = torch.searchsorted(self.correct_sorted, thresholds.contiguous(), right=True)
        return cumulative[:, -1:] - cumulative.gather(1, at_or_below)


def _fitting_counts(total: int, targets: Sequence[float]) -> np.ndarray:
    """Per target ``t``: the largest count ``c`` with ``c / total <= t`` in float64 (the curve's FPR, a
    correctly rounded division, so monotone in ``c``: the counts that fit are ``0 .. c``)."""
    out = []
    for t in targets:
        c = min(total, max(0, math.floor(t * total)))
        while c < total and (c + 1) / total <= t:
            c += 1
        while c > 0 and c / total > t:
            c -= 1
        out.append(c)
    return np.asarray(out, dtype=np.int64)


class _ExactCCRPlan:
    """What every resample shares for the exact CCR@FPR of one group: the group's scores sorted once
    (descending), and for each place ``p`` of that order the number of correct knowns with ``S_y`` at or
    below the score there.

    For a resample, the exact CCR@FPR=t is the CCR at the lowest *present* threshold θ whose count of
    unknowns above it fits (``c / N_U <= t``). With ``C_p`` the unknowns' cumulative weight in descending
    order and ``p`` the first place where ``C_p`` no longer fits, θ is the score at ``p`` (it carries weight,
    so it is present; every lower threshold has the unknown at ``p`` above it); when every unknown fits, θ
    is the lowest present score of the knowns and the group (an absent score adds no curve point)."""

    def __init__(self, plan: _OpenSetPlan, scores: Tensor) -> None:
        self.num, self.scores = scores.numel(), scores
        self._authors: tuple[Tensor, Tensor] | None = None
        self.descending, self.order = torch.sort(scores, descending=True)
        self.at_or_below = torch.searchsorted(plan.correct_sorted, self.descending.to(plan.correct_sorted.dtype),
                                              right=True)

    def authors_search(self, plan: _OpenSetPlan) -> tuple[Tensor, Tensor]:
        """:func:`_authors_search` of the group, once (shared by every resample)."""
        if self._authors is None:
            self._authors = _authors_search(plan, self.scores)
        return self._authors

    def ccr(self, plan: _OpenSetPlan, w_known: Tensor, w_unknown: Tensor, targets: Tensor) -> Tensor:
        """``(B', M)`` exact CCR@FPR of integer weight rows, batched in torch (any device; counts: `.long()`)."""
        rows = w_known.shape[0]
        cumulative = torch.cumsum(w_unknown.index_select(1, self.order).long(), dim=1)
        total_unknown = cumulative[:, -1:].double()
        fpr = cumulative.double() / total_unknown  # FPR once the first p+1 unknowns are above θ, as oscr_curve
        passing = torch.searchsorted(fpr, targets.expand(rows, -1).contiguous(), right=True)
        infinity = torch.tensor(math.inf, dtype=self.descending.dtype, device=self.descending.device)
        lowest = torch.minimum(torch.where(w_known > 0, plan.target_score[None, :], infinity).min(dim=1).values,
                               torch.where(w_unknown > 0, self.scores[None, :], infinity).min(dim=1).values)
        theta = torch.where(passing < self.num, self.descending[passing.clamp(max=self.num - 1)], lowest[:, None])
        total_known = w_known.sum(dim=1, dtype=torch.int64).double()[:, None]
        return plan.correct_above(w_known, theta).double() / total_known


def _authors_search(plan: _OpenSetPlan, unknown_score: Tensor) -> tuple[Tensor, Tensor]:
    """The group's ascending order and, per distinct known score, how many of its samples lie at or below."""
    unknown_sorted, order = torch.sort(unknown_score)
    return order, torch.searchsorted(unknown_sorted, plan.values.to(unknown_sorted.dtype), right=True)


def _authors_ccr(plan: _OpenSetPlan, unknown_score: Tensor, w_known: Tensor, w_unknown: Tensor,
                 targets: Tensor, exact: _ExactCCRPlan | None = None) -> Tensor:
    """CCR@FPR by the authors' table rule for every row, thresholds = present distinct known scores but the
    largest; the nearest FPR point (lowest threshold among ties), NaN ("—") when |FPR - t|/t >= 0.1."""
    rows, num_values = w_known.shape[0], plan.values.numel()
    present = torch.zeros(rows, num_values, dtype=torch.int64, device=w_known.device)
    present.index_add_(1, plan.value_of, w_known.long())
    present = present > 0
    # the largest present value is not a threshold
    last = num_values - 1 - present.flip(1).int().argmax(dim=1)
    present[torch.arange(rows, device=present.device), last] = False
    order, at_or_below = exact.authors_search(plan) if exact is not None else _authors_search(plan, unknown_score)
    cumulative = torch.nn.functional.pad(torch.cumsum(w_unknown.index_select(1, order).long(), dim=1), (1, 0))
    fpr = (cumulative[:, -1:] - cumulative.index_select(1, at_or_below)).double() / cumulative[:, -1:].double()
    distance = (fpr[:, None, :] - targets[None, :, None]).abs()  # (B', M, V)
    distance = torch.where(present[:, None, :], distance, math.inf)
    best = distance.argmin(dim=2)  # first minimum: the lowest threshold among equally near points
    nearest = distance.gather(2, best[:, :, None]).squeeze(2)
    ccr = plan.correct_above(w_known, plan.values[best]).double() / w_known.sum(dim=1, dtype=torch.int64).double()[:, None]
    return torch.where(nearest / targets[None, :] >= AUTHORS_RELATIVE_TOLERANCE, math.nan, ccr)


def weighted_ccr_at_fpr(
    probs: Tensor,
    target: Tensor,
    weights: Tensor,
    fpr_targets: Sequence[float] | Tensor = DEFAULT_FPR_TARGETS,
    unknown_label: int = UNKNOWN_LABEL,
    background: bool = False,
    convention: Convention = "exact",
) -> Tensor:
    """:func:`ccr_at_fpr` of every row of integer weights at once (row ``b`` counts sample ``i`` ``w_bi`` times).

    Per row, the curve is the one of the expanded resample (module docstring, "Weighted"): θ runs over the
    scores present in the row, so a row equals :func:`ccr_at_fpr` on the data expanded by it exactly.

    Args:
        probs, target, fpr_targets, unknown_label, background, convention: as :func:`ccr_at_fpr`.
        weights: ``(B, N)`` non-negative integer counts, one column per sample (e.g. the stratified
            bootstrap counts of :func:`metrics.resample_weights` of the knowns and of the unknowns, put in their
            columns); columns of other labels are ignored.

    Returns:
        ``(B, len(fpr_targets))`` float64; NaN for a row without weight on the knowns or on the unknowns (no
        curve), and for "authors" where their table prints "—".

    Raises:
        TypeError: real or boolean weights (the curve counts samples).
    """
    _check_convention(convention)
    _check_unknown_label(unknown_label)
    probs, target, _ = check_probs_and_target(probs, target, background=background)
    targets = _fpr_targets(fpr_targets, convention=convention, device=probs.device)
    weights = _check_weights(weights, target.numel(), name="weights", device=probs.device)
    if weights.is_floating_point() or weights.dtype == torch.bool:
        raise TypeError(f"weights must be integer counts (how often each sample is drawn), got {weights.dtype}; "
                        "round real weights or use resample_weights / cluster_weights")
    known, unknown, _, _ = _groups(target, unknown_label)
    target_score, correct, unknown_score = _known_and_unknown_scores_checked(probs, target, unknown_label=unknown_label)
    plan = _OpenSetPlan(target_score, correct)
    exact = _ExactCCRPlan(plan, unknown_score)
    w_known, w_unknown = weights[:, known], weights[:, unknown]
    if convention == "exact":
        values = exact.ccr(plan, w_known, w_unknown, targets)
    else:
        values = _authors_ccr(plan, unknown_score, w_known, w_unknown, targets, exact)
    empty = (w_known.sum(dim=1) == 0) | (w_unknown.sum(dim=1) == 0)
    return torch.where(empty[:, None], math.nan, values)
