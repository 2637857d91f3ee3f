"""Open-set training losses of Palechor, Bhoumik, Günther (WACV 2023), DESIGN.md §5.1.

Labels follow the project convention: known classes ``0..K-1``, negatives ``-1``. The background-class
loss receives negatives already mapped to ``K`` by :class:`datamodules.transforms.BackgroundClassTarget`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openset_common.labels import NEGATIVE_LABEL


class EntropicOpenSetLoss(nn.Module):
    """Entropic Open-Set loss (Dhamija, Günther, Boult, *Reducing Network Agnostophobia*, NeurIPS 2018).

    With ``S = softmax(logits)`` over the ``K`` known classes, per sample

        known x with label y:   J(x) = -log S_y(x)
        negative x (label -1):  J(x) = -(1/K) Σ_{c=1}^{K} log S_c(x)

    i.e. cross-entropy against a one-hot target for knowns and the uniform target ``1/K`` for negatives.
    The batch loss is the mean over all samples.

    Args:
        negative_weight: multiplies the negative term (the authors' ``unk_weight``; 1 in the paper).
    """

    def __init__(self, negative_weight: float = 1.0) -> None:
        super().__init__()
        if negative_weight < 0:
            raise ValueError(f"negative_weight must be non-negative, got {negative_weight}")
        self.negative_weight = negative_weight

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """``logits`` ``(N, K)``, ``target`` ``(N,)`` in ``{-1, 0..K-1}`` -> scalar loss."""
        if logits.ndim != 2 or target.shape != logits.shape[:1]:
            raise ValueError(f"expected logits (N, K) and target (N,), got {tuple(logits.shape)} and {tuple(target.shape)}")
        num_classes = logits.shape[1]
        bad = (target < NEGATIVE_LABEL) | (target >= num_classes)
        if bad.any():
            raise ValueError(
                f"EntropicOpenSetLoss got label {int(target[bad][0])}; expected known labels 0..{num_classes - 1} "
                f"or negatives {NEGATIVE_LABEL} (unknowns -2 must not appear in training)"
            )
        log_probs = F.log_softmax(logits, dim=1)
        negative = target == NEGATIVE_LABEL
        known_term = -log_probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)
        negative_term = -self.negative_weight * log_probs.sum(dim=1) / num_classes
        return torch.where(negative, negative_term, known_term).mean()


def background_class_weights(class_counts: Tensor) -> Tensor:
    """Class weights of the background-class (BG) loss: ``w_c = N / (N_c (K+1))``.

    Args:
        class_counts: ``(K+1,)`` number of training samples per class, the background class last.

    Returns:
        ``(K+1,)`` float weights; a balanced training set gives all ones.
    """
    counts = torch.as_tensor(class_counts)
    if counts.ndim != 1 or counts.numel() < 2:
        raise ValueError(f"class_counts must be a 1-D tensor of K+1 >= 2 counts, got shape {tuple(counts.shape)}")
    if (counts <= 0).any():
        empty = (counts <= 0).nonzero().flatten().tolist()
        raise ValueError(f"every class needs at least one training sample; classes {empty} have none")
    counts = counts.double()
    return (counts.sum() / (counts * counts.numel())).float()


class BackgroundClassLoss(nn.Module):
    """Cross-entropy over ``K+1`` classes with :func:`background_class_weights`.

    As ``torch.nn.CrossEntropyLoss(weight=w)`` (the authors' choice), the batch loss is the weighted mean
    ``Σ_i w_{y_i} ℓ_i / Σ_i w_{y_i}``. The weights are a buffer, so they move with ``.to()`` and are saved
    in checkpoints.
    """

    weight: Tensor

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(num_classes + 1))

    def set_class_counts(self, class_counts: Tensor) -> None:
        """Recompute the weights from ``(K+1,)`` training counts (background last)."""
        weight = background_class_weights(class_counts)
        if weight.shape != self.weight.shape:
            raise ValueError(f"expected {self.weight.numel()} class counts (K+1), got {weight.numel()}")
        self.weight.copy_(weight)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if (target < 0).any():
            raise ValueError(
                "BackgroundClassLoss got a negative label: negatives must be mapped to the background class K "
                "(datamodule train_negatives='background', or datamodules.transforms.BackgroundClassTarget)"
            )
        return F.cross_entropy(logits, target, weight=self.weight.to(logits.dtype))


class SoftMaxLoss(nn.Module):
    """Plain cross-entropy over the known classes (the paper's S baseline; negatives are not trained on)."""

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if (target < 0).any():
            raise ValueError(
                "the softmax loss got a negative label: negatives must be removed from its training set "
                "(datamodule train_negatives='exclude')"
            )
        return F.cross_entropy(logits, target)
