"""Area under the ROC curve for separating in-distribution from out-of-distribution scores.

In-distribution is the positive class and scores follow the project's κ convention (higher = more
in-distribution). The AUROC is computed in its Mann–Whitney form,

    AUROC = (1 / (N_id N_ood)) Σ_i Σ_j [ 1(s_i > t_j) + ½ 1(s_i = t_j) ],

with exact integer counts (one sort of all scores). torchmetrics' ``binary_auroc`` is not used here
because it treats scores outside ``[0, 1]`` as logits and applies a sigmoid, which saturates large
scores (max-logit, energy) to 1.0 in floating point and turns distinct scores into ties.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics._validation import check_scores
from metrics.collect import IndexedPredictions


def auroc(id_scores: Tensor, ood_scores: Tensor) -> float:
    """AUROC with in-distribution as the positive class, ties counting one half.

    Args:
        id_scores: ``(N_id,)`` confidence of in-distribution samples.
        ood_scores: ``(N_ood,)`` confidence of out-of-distribution samples.

    Returns:
        The probability that a random ID sample scores higher than a random OOD sample.
    """
    id_scores = check_scores(id_scores, name="id_scores")
    ood_scores = check_scores(ood_scores, name="ood_scores").to(id_scores.device)
    num_id, num_ood = id_scores.numel(), ood_scores.numel()
    if num_id == 0 or num_ood == 0:
        raise ValueError(f"AUROC needs both ID and OOD scores, got {num_id} ID and {num_ood} OOD")
    dtype = torch.promote_types(id_scores.dtype, ood_scores.dtype)
    scores = torch.cat([id_scores.to(dtype), ood_scores.to(dtype)])
    _, inverse = torch.unique(scores, sorted=True, return_inverse=True)
    num_values = int(inverse.max()) + 1
    id_count = torch.bincount(inverse[:num_id], minlength=num_values)
    ood_count = torch.bincount(inverse[num_id:], minlength=num_values)
    ood_below = torch.cumsum(ood_count, dim=0) - ood_count
    # Twice the Mann-Whitney U statistic, in exact integer arithmetic.
    twice_u = int((id_count * (2 * ood_below + ood_count)).sum())
    return twice_u / (2.0 * num_id * num_ood)


class OODAUROC(IndexedPredictions):
    """Stateful AUROC: update with ``(scores, is_id, index)``; ``compute()`` returns :func:`auroc`."""

    higher_is_better = True

    def compute(self) -> Tensor:  # type: ignore[override]
        scores, is_id = super().compute()
        return torch.tensor(auroc(scores[is_id.bool()], scores[~is_id.bool()]), dtype=torch.float64)
