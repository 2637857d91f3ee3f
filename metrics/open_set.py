"""Every number of the open-set evaluation of Palechor et al. from one set of test predictions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from metrics._validation import NEGATIVE_LABEL, UNKNOWN_LABEL, check_probs_and_target
from metrics.auroc import auroc
from metrics.gamma import _gamma_checked
from metrics.oscr import (
    DEFAULT_FPR_TARGETS,
    _authors_oscr_curve_checked,
    _closed_set_accuracy_checked,
    _oscr_curve_checked,
    _row_scores,
    ccr_from_authors_curve,
    ccr_from_curve,
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
    # validated once here; the metrics below are the unvalidated helpers behind the public functions, and
    # they share one pass over the (N, K) table (S_y, max_c S_c and the argmax of every row)
    probs, target, num_known = check_probs_and_target(probs, target, background=background, num_classes=num_classes)
    rows = _row_scores(probs, target)
    target_score, confidence, _ = rows
    known = target >= 0
    scalars: dict[str, float] = {"closed_set_accuracy": float(_closed_set_accuracy_checked(probs, target, rows=rows))}
    curves: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
    scores = {"known_target": target_score[known]}
    counts = {"known": int(known.sum())}
    for group, label in GROUPS.items():
        members = target == label
        counts[group] = int(members.sum())
        if not members.any():
            continue
        fpr, ccr, thresholds = _oscr_curve_checked(probs, target, unknown_label=label, rows=rows)
        curves[group] = (fpr, ccr, thresholds)
        for convention in conventions:
            if convention == "exact":
                values = ccr_from_curve(fpr, ccr, fpr_targets)
            else:
                authors_fpr, authors_ccr, _ = _authors_oscr_curve_checked(probs, target, unknown_label=label, rows=rows)
                values = ccr_from_authors_curve(authors_fpr, authors_ccr, fpr_targets)
            for fpr_target, value in zip(fpr_targets, values.tolist(), strict=True):
                scalars[f"{group}/{fpr_key(fpr_target, convention)}"] = value
        scalars[f"{group}/auroc"] = auroc(confidence[known], confidence[members])
        scores[f"{group}_max"] = confidence[members]
    if counts["negatives"] and counts["known"]:
        # γ ignores the unknowns' rows itself: no copy of the known and negative rows
        gamma_plus, gamma_minus, gamma_value = _gamma_checked(probs, target, num_known=num_known,
                                                              negative_label=NEGATIVE_LABEL, background=background)
        scalars.update({"gamma": float(gamma_value), "gamma_plus": float(gamma_plus), "gamma_minus": float(gamma_minus)})
    return {"scalars": scalars, "curves": curves, "scores": scores, "counts": counts}
