"""The γ confidence metric for checkpoint selection (Palechor, Bhoumik, Günther, WACV 2023, §4).

On the validation set (known classes and negatives):

    γ+ = mean over known samples of S_y
    γ- = mean over negative samples of (1 + 1/K - max_c S_c)    (SoftMax, EOS)
    γ- = mean over negative samples of (1 - max_{c<K} S_c)       (background class; background column dropped)
    γ  = (γ+ + γ-) / 2

Higher is better; the checkpoint with the best γ is kept.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from metrics._validation import NEGATIVE_LABEL, check_probs_and_target
from metrics.collect import IndexedPredictions


def gamma(
    probs: Tensor,
    target: Tensor,
    negative_label: int = NEGATIVE_LABEL,
    background: bool = False,
    *,
    num_classes: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """γ+, γ- and γ of the paper.

    Args:
        probs: ``(N, K)`` softmax probabilities over the known classes, or ``(N, K+1)`` with
            ``background=True`` (last column dropped, not renormalised).
        target: ``(N,)`` labels: known ``0..K-1``, negatives ``negative_label``; other labels are ignored.
        negative_label: the label of negative samples.
        background: whether ``probs`` carries a background column (changes the γ- formula).
        num_classes: ``K`` when known (from the model): a probability width other than ``K`` (``K+1`` with
            background) is refused.

    Returns:
        ``(gamma_plus, gamma_minus, gamma)`` as float64 0-dim tensors. A side without samples gives NaN
        (and a warning), so an empty validation split can never look like a good checkpoint.
    """
    if negative_label >= 0:
        raise ValueError(f"negative_label must be negative, got {negative_label}")
    probs, target, num_known = check_probs_and_target(probs, target, background=background, num_classes=num_classes)
    return _gamma_checked(probs, target, num_known=num_known, negative_label=negative_label, background=background)


def _gamma_checked(
    probs: Tensor, target: Tensor, *, num_known: int, negative_label: int = NEGATIVE_LABEL, background: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`gamma` of validated input: ``probs`` over the ``num_known`` known columns (background already
    dropped; ``background`` only picks the γ- formula) and int64 ``target``, as :func:`check_probs_and_target`
    returns them. Rows of other labels are ignored, so callers need not select the known and negative rows."""
    known = target >= 0
    negative = target == negative_label
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=probs.device)
    if known.any():
        # gather then select: no copy of the known rows, no float64 copy of the table
        target_score = probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)
        gamma_plus = target_score[known].double().mean()
    else:
        warnings.warn("gamma: no known samples, gamma_plus is NaN", RuntimeWarning, stacklevel=3)
        gamma_plus = nan
    if negative.any():
        offset = 1.0 if background else 1.0 + 1.0 / num_known
        gamma_minus = (offset - probs.amax(dim=1)[negative].double()).mean()
    else:
        warnings.warn(
            f"gamma: no negative samples (label {negative_label}), gamma_minus is NaN", RuntimeWarning, stacklevel=3
        )
        gamma_minus = nan
    return gamma_plus, gamma_minus, (gamma_plus + gamma_minus) / 2


class Gamma(IndexedPredictions):
    """Stateful γ over batches and DDP ranks: ``compute()`` returns ``(gamma_plus, gamma_minus, gamma)``.

    Update with ``(probs, target, index)``; see :class:`metrics.collect.IndexedPredictions`.
    """

    higher_is_better = True

    def __init__(
        self, negative_label: int = NEGATIVE_LABEL, background: bool = False, num_classes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.negative_label = negative_label
        self.background = background
        self.num_classes = num_classes

    def compute(self) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        probs, target = super().compute()
        return gamma(probs, target, negative_label=self.negative_label, background=self.background,
                     num_classes=self.num_classes)
