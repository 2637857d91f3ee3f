"""Every number of the open-set evaluation of Palechor et al. from one set of test predictions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from metrics._validation import NEGATIVE_LABEL, UNKNOWN_LABEL, check_probs_and_target
from metrics.auroc import auroc
from metrics.gamma import gamma
from metrics.oscr import DEFAULT_FPR_TARGETS, ccr_from_curve, closed_set_accuracy, max_known_score, oscr_curve

GROUPS = {"negatives": NEGATIVE_LABEL, "unknowns": UNKNOWN_LABEL}


def fpr_key(target: float) -> str:
    """``1e-3`` -> ``"ccr@fpr=0.001"``."""
    return f"ccr@fpr={target:g}"


def open_set_report(
    probs: Tensor,
    target: Tensor,
    *,
    fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
    background: bool = False,
) -> dict[str, Any]:
    """Scalars, OSCR curves and score samples of a test set with known, negative and unknown samples.

    For each group present (``negatives`` = label -1, ``unknowns`` = label -2): CCR at each FPR target,
    the OSCR curve, and the AUROC of known vs. that group with ``max_c S_c`` as confidence. Overall:
    closed-set accuracy on the knowns and, with negatives present, γ.

    Returns:
        ``{"scalars": {name: float}, "curves": {group: (fpr, ccr, thresholds)},
        "scores": {"known_target": S_y of knowns, "<group>_max": max_c S_c of the group},
        "counts": {"known": N_K, "negatives": ..., "unknowns": ...}}``.
    """
    probs_k, target, _ = check_probs_and_target(probs, target, background=background)
    known = target >= 0
    confidence = max_known_score(probs_k)
    scalars: dict[str, float] = {"closed_set_accuracy": float(closed_set_accuracy(probs_k, target))}
    curves: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
    scores = {"known_target": probs_k[known].gather(1, target[known][:, None]).squeeze(1)}
    counts = {"known": int(known.sum())}
    for group, label in GROUPS.items():
        members = target == label
        counts[group] = int(members.sum())
        if not members.any():
            continue
        fpr, ccr, thresholds = oscr_curve(probs_k, target, unknown_label=label)
        curves[group] = (fpr, ccr, thresholds)
        for fpr_target, value in zip(fpr_targets, ccr_from_curve(fpr, ccr, fpr_targets).tolist(), strict=True):
            scalars[f"{group}/{fpr_key(fpr_target)}"] = value
        scalars[f"{group}/auroc"] = auroc(confidence[known], confidence[members])
        scores[f"{group}_max"] = confidence[members]
    if counts["negatives"]:
        keep = target >= NEGATIVE_LABEL
        gamma_plus, gamma_minus, gamma_value = gamma(probs[keep], target[keep], background=background)
        scalars.update({"gamma": float(gamma_value), "gamma_plus": float(gamma_plus), "gamma_minus": float(gamma_minus)})
    return {"scalars": scalars, "curves": curves, "scores": scores, "counts": counts}
