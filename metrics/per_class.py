"""Per-class AUROC and its dispersion over the known classes: how evenly a detector serves the classes.

Rabinowitz, Cruz, Günther, Boult, *GHOST: Gaussian Hypothesis Open-Set Technique*, AAAI 2025, show that one
AUROC over all known samples hides how differently a detector treats the individual classes, and report the
spread of the per-class performance. For each known class ``c`` with test samples ``I_c`` (by their true label)
and the OOD samples ``O`` (negatives and unknowns, or the one kind asked for):

    AUROC_c = (1 / (|I_c| |O|)) Σ_{i∈I_c} Σ_{j∈O} [1(s_i > t_j) + ½ 1(s_i = t_j)]      (:func:`metrics.auroc`)

and over the K classes their mean, standard deviation, minimum, maximum and range (max - min). The standard
deviation is the population one, ``sqrt((1/K) Σ_c (AUROC_c - mean)²)`` (``ddof=0``, numpy's ``np.std``): the K
classes are the whole population of known classes, not a sample of them; ``ddof=1`` gives the sample standard
deviation. The GHOST paper's text (as far as it could be read here) and its released code
(github.com/Vastlab/GHOST: the detector only, no evaluation script) do not fix the divisor: a documented choice.
The mean is the unweighted mean over classes (each class counts once), not the AUROC of all known samples.

All K AUROCs come from one sort of the OOD scores: each known sample's count of OOD scores below it and tied with
it (two binary searches), summed per class in exact int64, so each ``AUROC_c`` equals :func:`metrics.auroc` of
the class's scores against the OOD scores exactly. Memory ``O(N)``; time ``O(N log N)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from metrics._validation import as_tensor, check_scores
from openset_common.labels import LOWEST_LABEL, NEGATIVE_LABEL, UNKNOWN_LABEL


@dataclass(frozen=True)
class PerClassAUROC:
    """The per-class AUROCs of one detector and their dispersion.

    Attributes:
        classes: ``(K,)`` the known classes, ascending (every class ``0..num_classes-1`` where that was given).
        auroc: ``(K,)`` float64, ``AUROC_c`` of class ``classes[k]``'s samples against every OOD sample.
        counts: ``(K,)`` the test samples of each class.
        mean: the unweighted mean of ``auroc``.
        std: its standard deviation with divisor ``K - ddof``.
        min, max: the worst and the best class's AUROC.
        range: ``max - min``.
        ddof: the standard deviation's delta degrees of freedom (0: population).
        num_ood: the OOD samples every class was compared with.
    """

    classes: Tensor
    auroc: Tensor
    counts: Tensor
    mean: float
    std: float
    min: float
    max: float
    range: float
    ddof: int
    num_ood: int

    @property
    def worst_class(self) -> int:
        """The class with the lowest AUROC (the first such class among ties)."""
        return int(self.classes[int(torch.argmin(self.auroc))])


def per_class_auroc(scores: Tensor, target: Tensor, *, unknown_label: int | None = None,
                    num_classes: int | None = None, ddof: int = 0) -> PerClassAUROC:
    """The AUROC of each known class's samples against all OOD samples, and its mean, std and range.

    Args:
        scores: ``(N,)`` confidence κ (higher = more in-distribution) of known and OOD samples.
        target: ``(N,)`` labels: known ``0..K-1``, negatives ``-1``, unknowns ``-2`` (DESIGN §3).
        unknown_label: which OOD samples: ``None`` (default) every sample with a negative label, ``-1`` the
            negatives only, ``-2`` the unknowns only (the samples of the other kind are left out).
        num_classes: ``K``: every class ``0..K-1`` must then have test samples (a class without any is refused,
            naming it, rather than left out of the dispersion silently); ``None``: the classes present.
        ddof: the standard deviation's divisor is ``K - ddof``: 0 (default) the population standard deviation, 1
            the sample one.

    Returns:
        :class:`PerClassAUROC`.

    Raises:
        ValueError: shapes that disagree, non-finite scores, labels outside the convention, no known or no OOD
            sample, a missing class, a ``ddof`` that leaves no degree of freedom.
    """
    scores = check_scores(scores, name="scores")
    target = as_tensor(target, name="target")
    if target.ndim != 1 or target.shape[0] != scores.shape[0]:
        raise ValueError(f"target must have shape (N,) with N = {scores.shape[0]} to match scores, got "
                         f"{tuple(target.shape)}")
    if target.is_floating_point():
        raise TypeError(f"target must hold integer labels, got {target.dtype}")
    if unknown_label not in (None, NEGATIVE_LABEL, UNKNOWN_LABEL):
        raise ValueError(f"unknown_label must be None (every OOD sample), {NEGATIVE_LABEL} (negatives) or "
                         f"{UNKNOWN_LABEL} (unknowns), got {unknown_label!r}")
    if isinstance(ddof, bool) or not isinstance(ddof, int) or ddof < 0:
        raise ValueError(f"ddof must be a non-negative integer, got {ddof!r}")
    target = target.to(device=scores.device, dtype=torch.long)
    if target.numel() and int(target.min()) < LOWEST_LABEL:
        raise ValueError(f"target holds label {int(target.min())}; labels are known 0..K-1, negatives "
                         f"{NEGATIVE_LABEL} and unknowns {UNKNOWN_LABEL}, nothing below {LOWEST_LABEL}")
    known = target >= 0
    ood = ~known if unknown_label is None else target == unknown_label
    if not bool(known.any()):
        raise ValueError("per-class AUROC needs known samples (labels >= 0); target has none")
    if not bool(ood.any()):
        which = "OOD" if unknown_label is None else f"label {unknown_label}"
        raise ValueError(f"per-class AUROC needs {which} samples to compare each class with; target has none")
    labels = target[known]
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
        if int(labels.max()) >= num_classes:
            raise ValueError(f"target holds label {int(labels.max())} but there are {num_classes} known classes "
                             f"(0..{num_classes - 1})")
        present = torch.bincount(labels, minlength=num_classes)
        missing = (present == 0).nonzero().flatten().tolist()
        if missing:
            raise ValueError(f"class {missing[0]} has no test sample (classes without one: {missing[:10]}"
                             f"{' ...' if len(missing) > 10 else ''} of 0..{num_classes - 1}); its AUROC is "
                             "undefined")
    classes, inverse, counts = torch.unique(labels, sorted=True, return_inverse=True, return_counts=True)
    if len(classes) - ddof < 1:
        raise ValueError(f"ddof = {ddof} leaves no degree of freedom for the standard deviation of "
                         f"{len(classes)} classes")
    ood_sorted = torch.sort(scores[ood]).values
    known_scores = scores[known].contiguous()
    below = torch.searchsorted(ood_sorted, known_scores, right=False)  # OOD scores strictly below s_i
    at_or_below = torch.searchsorted(ood_sorted, known_scores, right=True)
    # twice each sample's Mann-Whitney count (below + ½ tied = (below + at_or_below) / 2), per class, in int64
    twice_u = torch.zeros(len(classes), dtype=torch.long, device=scores.device)
    twice_u.index_add_(0, inverse, below + at_or_below)
    num_ood = ood_sorted.numel()
    auroc = twice_u.double() / (2.0 * counts.double() * num_ood)
    mean = float(auroc.mean())
    std = math.sqrt(float(((auroc - mean) ** 2).sum()) / (len(classes) - ddof))
    low, high = float(auroc.min()), float(auroc.max())
    return PerClassAUROC(classes=classes, auroc=auroc, counts=counts, mean=mean, std=std, min=low, max=high,
                         range=high - low, ddof=ddof, num_ood=num_ood)
