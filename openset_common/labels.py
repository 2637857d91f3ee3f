"""The label convention and the background column (DESIGN.md §3): known classes ``0..K-1``, negatives ``-1``,
unknowns ``-2``; the background class is the last column of a ``(N, K+1)`` tensor, dropped without renormalising
(and, where a distribution over the known classes is needed, its mass spread uniformly over them)."""

from __future__ import annotations

from torch import Tensor

KNOWN_MIN_LABEL = 0


NEGATIVE_LABEL = -1


UNKNOWN_LABEL = -2


LOWEST_LABEL = UNKNOWN_LABEL


def known_columns(values: Tensor, background: bool) -> Tensor:
    """The columns of the known classes: ``(N, K+1) -> (N, K)`` with ``background=True``, else unchanged.

    The background column is the last one; it is dropped *after* any softmax over all ``K+1`` columns,
    never renormalised away (DESIGN.md §3).
    """
    if not background:
        return values
    if values.ndim < 2 or values.shape[-1] < 2:
        raise ValueError(
            f"background=True needs at least 2 columns (K known + 1 background), got shape {tuple(values.shape)}"
        )
    return values[..., :-1]


def spread_background_mass(probs: Tensor) -> Tensor:
    """``(..., K+1) -> (..., K)``: ``p'_c = p_c + p_bg / K``, the background probability spread uniformly over
    the K known classes (it means "none of them"), so each row still sums to 1 and ``p_bg = 1`` is uniform."""
    known = known_columns(probs, True)
    return known + probs[..., -1:] / known.shape[-1]
