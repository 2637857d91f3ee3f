"""Every number of the open-set evaluation of Palechor et al. from one set of test predictions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from metrics._validation import NEGATIVE_LABEL, UNKNOWN_LABEL, check_probs_and_target
from metrics.auroc import auroc
from metrics.gamma import gamma
from metrics.oscr import (
    DEFAULT_FPR_TARGETS,
    authors_oscr_curve,
    ccr_from_authors_curve,
    ccr_from_curve,
    closed_set_accuracy,
    max_known_score,
    oscr_curve,
)

GROUPS = {"negatives": NEGATIVE_LABEL, "unknowns": UNKNOWN_LABEL}
CONVENTIONS = ("exact", "authors")


def fpr_key(target: float, convention: str = "exact") -> str:
    """``1e-3`` -> ``"ccr@fpr=0.001"`` (exact convention) or ``"authors_ccr@fpr=0.001"``."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    return f"{'authors_' if convention == 'authors' else ''}ccr@fpr={target:g}"


def open_set_report(
    probs: Tensor,
    target: Tensor,
    *,
    fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
    background: bool = False,
    conventions: Sequence[str] = ("exact",),
    num_classes: int | None = None,
) -> dict[str, Any]:
    """Scalars, OSCR curves and score samples of a set with known and negative and/or unknown samples.

    For each group present (``negatives`` = label -1, ``unknowns`` = label -2): CCR at each FPR target in
    each requested convention (``"exact"``: the largest CCR whose FPR does not exceed the target, DESIGN.md
    §5.1; ``"authors"``: the published tables' procedure, NaN where they print "—", keys prefixed
    ``authors_``), the OSCR curve, and the AUROC of known vs. that group with ``max_c S_c`` as confidence.
    Overall: closed-set accuracy on the knowns and, with negatives present, γ.

    Returns:
        ``{"scalars": {name: float}, "curves": {group: (fpr, ccr, thresholds)},
        "scores": {"known_target": S_y of knowns, "<group>_max": max_c S_c of the group},
        "counts": {"known": N_K, "negatives": ..., "unknowns": ...}}``.
    """
    for convention in conventions:
        fpr_key(1.0, convention)  # validates the name
    probs_k, target, _ = check_probs_and_target(probs, target, background=background, num_classes=num_classes)
    probs = torch.as_tensor(probs)
    known = target >= 0
    confidence = max_known_score(probs_k)
    scalars: dict[str, float] = {"closed_set_accuracy": float(closed_set_accuracy(probs, target, background=background))}
    curves: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
    scores = {"known_target": probs_k[known].gather(1, target[known][:, None]).squeeze(1)}
    counts = {"known": int(known.sum())}
    for group, label in GROUPS.items():
        members = target == label
        counts[group] = int(members.sum())
        if not members.any():
            continue
        fpr, ccr, thresholds = oscr_curve(probs, target, unknown_label=label, background=background)
        curves[group] = (fpr, ccr, thresholds)
        for convention in conventions:
            if convention == "exact":
                values = ccr_from_curve(fpr, ccr, fpr_targets)
            else:
                authors_fpr, authors_ccr, _ = authors_oscr_curve(probs, target, unknown_label=label,
                                                                 background=background)
                values = ccr_from_authors_curve(authors_fpr, authors_ccr, fpr_targets)
            for fpr_target, value in zip(fpr_targets, values.tolist(), strict=True):
                scalars[f"{group}/{fpr_key(fpr_target, convention)}"] = value
        scalars[f"{group}/auroc"] = auroc(confidence[known], confidence[members])
        scores[f"{group}_max"] = confidence[members]
    if counts["negatives"] and counts["known"]:
        keep = target >= NEGATIVE_LABEL
        gamma_plus, gamma_minus, gamma_value = gamma(probs[keep], target[keep], background=background)
        scalars.update({"gamma": float(gamma_value), "gamma_plus": float(gamma_plus), "gamma_minus": float(gamma_minus)})
    return {"scalars": scalars, "curves": curves, "scores": scores, "counts": counts}
