"""Input checks shared by the metric functions.

Every metric validates its input the same way, so a NaN in the scores, logits passed where probabilities
belong, or a label outside the protocol's range is reported with the offending value instead of producing
a silently wrong number.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from openset_common.labels import LOWEST_LABEL, NEGATIVE_LABEL, UNKNOWN_LABEL, known_columns

# Rows of probabilities must sum to 1 within this tolerance: loose enough for probabilities rounded to a
# few decimals or computed in bfloat16, tight enough that logits essentially never pass.
PROBABILITY_SUM_TOLERANCE = 0.05
# Row sums are first taken in float32; a table whose worst row deviates from 1 by more than the tolerance
# minus this margin is summed again in float64, which decides. The float32 rounding error of a sum of values
# in [0, 1] stays orders of magnitude below it (pairwise summation; about 1e-6 even for 20k classes).
ROW_SUM_MARGIN = 1e-3


def as_tensor(values: Tensor | object, *, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """Convert array-likes (numpy, lists) to a tensor; keep tensors as they are."""
    tensor = values if isinstance(values, Tensor) else torch.as_tensor(values)
    if dtype is not None:
        tensor = tensor.to(dtype)
    return tensor


def _min_max(values: Tensor) -> tuple[float, float]:
    """``(min, max)`` of a non-empty tensor as Python numbers, in one pass and one host sync.

    For floating values both are finite exactly when every value is: a NaN anywhere makes both NaN (min and
    max propagate it) and an infinity is the max or the min itself. So this one reduction serves the
    finiteness check and the range check alike.
    """
    low, high = torch.stack(list(torch.aminmax(values))).tolist()
    return low, high


def _raise_not_finite(values: Tensor, *, name: str) -> None:
    """The slow path of a failing finiteness check: name the first rows that hold NaN or infinity."""
    bad = ~torch.isfinite(values)
    rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().flatten()
    raise ValueError(
        f"{name} contains NaN or infinite values in {rows.numel()} rows "
        f"(first rows: {rows[:5].tolist()}); scores must be finite"
    )


def check_finite(values: Tensor, *, name: str) -> None:
    """Raise ``ValueError`` naming the first rows that hold NaN or infinity."""
    # one min/max reduction (NaN and infinities show in it, see _min_max) instead of a full boolean
    # mask; only a failing input pays for the mask that names its rows
    if values.is_floating_point() and values.numel() and not all(map(math.isfinite, _min_max(values))):
        _raise_not_finite(values, name=name)


def _check_range(low: float, high: float, *, name: str) -> None:
    if low < 0.0 or high > 1.0:
        raise ValueError(
            f"{name} must be probabilities in [0, 1], found values from {low:.4g} to {high:.4g}: "
            "this looks like logits; apply a softmax first"
        )


def _check_row_sums(probs: Tensor, *, name: str) -> None:
    """Every row of ``probs`` (values already known to lie in ``[0, 1]``) sums to 1 within the tolerance.

    The sums are taken in float32 (float64 for float64 input): several times cheaper than float64 on the
    CPU, and with values in ``[0, 1]`` their rounding error is far below ``ROW_SUM_MARGIN``. Only a table whose
    worst row comes within that margin of the tolerance is summed again in float64, which decides (and names
    the row) exactly as before.
    """
    if probs.device.type == "cpu" and probs.dtype in (torch.float32, torch.float64):
        # a matrix-vector product streams the table once, ~2x faster on the CPU than a sum over its short
        # rows; not on CUDA, where TF32 matmuls (float32_matmul_precision "high") would round the sums
        sums = torch.mv(probs, probs.new_ones(probs.shape[1]))
    else:
        accumulate = torch.float64 if probs.dtype == torch.float64 else torch.float32
        sums = probs.sum(dim=1, dtype=accumulate)
    low, high = _min_max(sums)
    if max(1.0 - low, high - 1.0) <= PROBABILITY_SUM_TOLERANCE - ROW_SUM_MARGIN:
        return
    sums = probs.sum(dim=1, dtype=torch.float64)
    worst = int((sums - 1.0).abs().argmax())
    if abs(float(sums[worst]) - 1.0) > PROBABILITY_SUM_TOLERANCE:
        raise ValueError(
            f"{name} rows must sum to 1 (a softmax over all columns, background included), but row {worst} sums "
            f"to {float(sums[worst]):.4g}: this looks like logits or scores that are not a distribution over the classes"
        )


def check_probabilities(probs: Tensor, *, name: str = "probs") -> None:
    """Raise ``ValueError`` unless every value lies in ``[0, 1]`` and every row sums to 1 (within tolerance).

    Logits, energies or unnormalised scores fail here with a message that says so, instead of giving a
    plausible-looking but meaningless OSCR curve or γ.
    """
    if probs.numel() == 0:
        return
    _check_range(*_min_max(probs), name=name)
    _check_row_sums(probs, name=name)


def check_probability_table(probs: Tensor, *, name: str = "probs") -> None:
    """:func:`check_finite` and :func:`check_probabilities` of a ``(N, C)`` table, fused: two reductions.

    One min/max pass proves finiteness and the ``[0, 1]`` range at once, one row sum the normalisation; the
    errors, their order (finiteness first) and their messages are those of the two checks.
    """
    if probs.numel() == 0:
        return
    low, high = _min_max(probs)
    if not (math.isfinite(low) and math.isfinite(high)):
        _raise_not_finite(probs, name=name)
    _check_range(low, high, name=name)
    _check_row_sums(probs, name=name)


def check_labels(target: Tensor, *, num_known: int) -> None:
    """Labels must be known ``0..K-1``, negative ``-1`` or unknown ``-2``."""
    if target.numel() == 0:
        return
    low, high = _min_max(target)  # one min/max pass and one sync for both bounds
    if high >= num_known:
        raise ValueError(
            f"target holds label {high} but probs cover only {num_known} known classes "
            f"(labels 0..{num_known - 1}, negatives {NEGATIVE_LABEL}, unknowns {UNKNOWN_LABEL})"
        )
    if low < LOWEST_LABEL:
        raise ValueError(
            f"target holds label {low}; labels are known 0..{num_known - 1}, negatives {NEGATIVE_LABEL} "
            f"and unknowns {UNKNOWN_LABEL}, nothing below {LOWEST_LABEL}"
        )


def check_probs_and_target(
    probs: Tensor | object, target: Tensor | object, *, background: bool, num_classes: int | None = None
) -> tuple[Tensor, Tensor, int]:
    """Validate ``probs`` ``(N, K)`` (``(N, K+1)`` with background) and ``target`` ``(N,)``.

    Args:
        probs: softmax probabilities; with ``background=True`` over ``K+1`` columns, background last.
        target: labels, known ``0..K-1``, negatives ``-1``, unknowns ``-2``.
        background: whether the last column is a background class.
        num_classes: ``K`` when the caller knows it (e.g. from the model): then a width of ``K+1`` without
            ``background=True`` (or ``K`` with it) is refused instead of read as a different class count.

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
    if num_classes is not None and probs.shape[1] != num_classes + int(background):
        if not background and probs.shape[1] == num_classes + 1:
            raise ValueError(
                f"probs has {probs.shape[1]} columns for {num_classes} known classes: the model has a background "
                "class; pass background=True so that its column is dropped after the softmax"
            )
        raise ValueError(
            f"probs has {probs.shape[1]} columns but the model has {num_classes} known classes"
            + (" plus a background column" if background else "")
        )
    check_probability_table(probs, name="probs")  # finiteness, range and row sums: two reductions
    probs = known_columns(probs, background)
    num_known = probs.shape[1]
    target = target.long()
    check_labels(target, num_known=num_known)
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


def check_level(level: float) -> float:
    """A confidence level in ``(0, 1)``, as a float."""
    level = float(level)
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    return level


def check_score_pair(id_scores: Tensor | object, ood_scores: Tensor | object, what: str) -> tuple[Tensor, Tensor]:
    """Both sides' scores validated (:func:`check_scores`), non-empty, on the ID scores' device and in their
    promoted dtype; ``what`` names the metric in the error."""
    id_scores = check_scores(id_scores, name="id_scores")
    ood_scores = check_scores(ood_scores, name="ood_scores").to(id_scores.device)
    for name, scores in (("id_scores", id_scores), ("ood_scores", ood_scores)):
        if scores.numel() == 0:
            raise ValueError(f"{name} is empty: {what} needs both ID and OOD scores, got {id_scores.numel()} ID "
                             f"and {ood_scores.numel()} OOD")
    dtype = torch.promote_types(id_scores.dtype, ood_scores.dtype)
    return id_scores.to(dtype), ood_scores.to(dtype)
