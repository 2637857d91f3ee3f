"""The γ confidence metric for checkpoint selection (Palechor, Bhoumik, Günther, WACV 2023, §4).

On the validation set (known classes and negatives):

    γ+ = mean over known samples of S_y
    γ- = mean over negative samples of (1 + 1/K - max_c S_c)    (SoftMax, EOS)
    γ- = mean over negative samples of (1 - max_{c<K} S_c)       (background class; background column dropped)
    γ  = (γ+ + γ-) / 2

Higher is better; the checkpoint with the best γ is kept. :func:`weighted_gamma` gives γ+, γ- and γ of every
row of resampling weights at once (:mod:`metrics.resampling`): the means above, weighted.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from metrics._validation import NEGATIVE_LABEL, check_probs_and_target
from metrics.collect import IndexedPredictions
from metrics.resampling import _check_weights


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


def weighted_gamma(
    probs: Tensor,
    target: Tensor,
    weights: Tensor,
    negative_label: int = NEGATIVE_LABEL,
    background: bool = False,
    *,
    num_classes: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`gamma` of every row of weights: row ``b`` counts sample ``i`` ``w_bi`` times::

        γ+_b = Σ_known w_bi S_y(x_i) / Σ_known w_bi
        γ-_b = Σ_neg w_bi (offset - max_c S_c(x_i)) / Σ_neg w_bi

    Args:
        probs, target, negative_label, background, num_classes: as :func:`gamma`.
        weights: ``(B, N)`` non-negative weights, one column per sample (e.g. the stratified bootstrap counts of
            :func:`metrics.resample_weights` of the knowns and of the negatives, put in their columns).

    Returns:
        ``(gamma_plus, gamma_minus, gamma)``, each ``(B,)`` float64: with integer weights row ``b`` equals
        :func:`gamma` on the data expanded by row ``b`` (to float64 rounding: the sums run in another order);
        NaN (and a warning) where a side has no sample or no weight.
    """
    if negative_label >= 0:
        raise ValueError(f"negative_label must be negative, got {negative_label}")
    probs, target, num_known = check_probs_and_target(probs, target, background=background, num_classes=num_classes)
    weights = _check_weights(weights, target.numel(), name="weights", device=probs.device)
    known = target >= 0
    negative = target == negative_label
    for name, side in (("known", known), (f"negative (label {negative_label})", negative)):
        if not bool(side.any()):
            warnings.warn(f"weighted_gamma: no {name} samples, its side of gamma is NaN", RuntimeWarning, stacklevel=2)
    target_score = probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)[known]
    offset = 1.0 if background else 1.0 + 1.0 / num_known
    negative_values = offset - probs.amax(dim=1)[negative].double()
    return _weighted_gamma_rows(target_score.double(), negative_values, weights[:, known],
                                weights[:, negative])


def _weighted_gamma_rows(target_score: Tensor, negative_values: Tensor, known_weights: Tensor,
                         negative_weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """γ+, γ-, γ of weight rows: ``target_score`` ``(N_K,)`` float64 ``S_y`` of the knowns,
    ``negative_values`` ``(N_neg,)`` float64 ``offset - max_c S_c`` of the negatives, ``(B, N_K)`` / ``(B, N_neg)`` weights. The
    weights' sums are taken in float64: exact for integer counts (below 2**53)."""
    known, negative = known_weights.double(), negative_weights.double()
    gamma_plus = (known @ target_score) / known.sum(dim=1)
    gamma_minus = (negative @ negative_values) / negative.sum(dim=1)
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
