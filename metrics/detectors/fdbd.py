"""fDBD: the mean distance of the features to the head's decision boundaries, over their distance to the mean.

Liu, Qin, *Fast Decision Boundary based Out-of-Distribution Detector*, ICML 2024. With the head ``logits = x Wᵀ + b``
(``w_c`` its rows), ``ŷ = argmax_c logit_c(x)`` and ``μ`` the mean of the training features, the distance of ``x``
to the boundary between ``ŷ`` and ``c`` is ``|logit_ŷ(x) - logit_c(x)| / |w_ŷ - w_c|₂``, and

    score(x) = 1/(C - 1) · Σ_{c ≠ ŷ} |logit_ŷ(x) - logit_c(x)| / |w_ŷ - w_c|₂  /  max(|x - μ|₂, 10⁻⁸)

(higher = more in-distribution). This is pytorch-ood's ``fDBD`` (``predict_features`` negated, its 10⁻⁸ floor of
the distance included), which this matches to float64 rounding (measured on the tests' float64 features with ties:
2.8e-16 relative at most; 7.2e-16 against the authors' sum, written in numpy, over ``C - 1``). The authors' code
(litianliu/fDBD-OOD, ``run_imagenet.py``) and OpenOOD v1.5's ``fdbd_postprocessor.py`` sum over the classes
without the ``1/(C - 1)`` (a constant: the same ranking) and have no floor.

``distance_to_mean`` (default ``True``, the paper's regulariser ``|x - μ|``): ``False`` divides by the feature
norm ``|x|₂`` instead, OpenOOD's alternative (``distance_as_normalizer: False`` in
``configs/postprocessors/fdbd.yml``, whose search picks one of the two on the validation sets). No other
hyperparameter: the paper's detector has none.

``μ`` is the mean of the fit set's features (the training images; OpenOOD ``id_loader_dict['train']``).
Background-class models: ``C = K`` known classes (``ŷ`` among the known logits, the sum over the known rows of the
head). A head with two identical known rows has no boundary between them and is refused at fit. Float64 but
for the head's product, in the features' precision (float32 for float32 features; the logits' differences, the
distances and the norm in float64: :mod:`metrics.detectors.base`, *Precision*).

Memory: fit ``O(K² + D)``: the mean summed chunk by chunk in float64 without a float64 copy
(:func:`metrics.detectors.base.feature_mean`), the ``K × K`` boundary norms ``|w_p - w_c|`` (8 MB at K = 1000) from
the differences (:func:`boundary_norms`): measured 16 MiB above 1,280,000 × 2048 float32 fit features, nothing
``N``-sized. Score ``O(K² + chunk·(D + K))``, the chunk's temporaries in reused buffers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import Buffers, Detector, check_width, chunk_rows, feature_mean, row_chunks
from metrics.detectors.registry import register_detector

DISTANCE_FLOOR = 1e-8
"""pytorch-ood's floor of ``|x - μ|`` (a feature at the mean scores finite)."""


def boundary_norms(weight: Tensor) -> Tensor:
    """``(C, C)`` float64 ``|w_p - w_c|₂`` of the rows of ``weight`` ``(C, D)``, the diagonal 1 (pytorch-ood's and
    the authors' convention: the predicted class's own term is 0 / 1). From the differences, as the authors compute
    them (``torch.cdist`` without its Gram-matrix shortcut, whose cancellation would lose near-identical rows), no
    ``C × C × D`` temporary: 2.6 s at C = 1000, D = 2048 on one CPU core."""
    norms = torch.cdist(weight[None], weight[None], compute_mode="donot_use_mm_for_euclid_dist")[0]
    return norms.fill_diagonal_(1.0)


@register_detector
class FDBD(Detector):
    """fDBD score (see the module docstring).

    Hyperparameters:
        distance_to_mean: divide by ``|x - μ|`` (default, the paper's) or by ``|x|`` (``False``).

    Buffers (float64): the head, ``mean`` ``μ`` ``(D,)``, ``boundary_norms`` ``(K, K)`` (the known rows).
    """

    name = "fdbd"
    paper = "Liu & Qin, ICML 2024"
    inputs = frozenset({"features", "head"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("mean", "boundary_norms")

    def __init__(self, *, distance_to_mean: bool = True, background: bool = False) -> None:
        super().__init__(background=background)
        if not isinstance(distance_to_mean, bool):
            raise ValueError(f"detector {self.name!r}: distance_to_mean must be true or false, got "
                             f"{distance_to_mean!r}")
        self.distance_to_mean = distance_to_mean

    def _known_weight(self) -> Tensor:
        return self.head_weight[:-1] if self.background else self.head_weight

    def _fit(self, data: dict[str, Tensor]) -> None:
        features, weight = data["features"], self._known_weight()
        check_width(features, weight.shape[1], what=f"detector {self.name!r}: the fit features", of="the head's weight")
        if weight.shape[0] < 2:
            raise ValueError(f"detector {self.name!r} needs at least 2 known classes (a decision boundary), the head "
                             f"has {weight.shape[0]}")
        norms = boundary_norms(weight)
        same = (norms == 0).nonzero()
        if same.numel():
            (p, c), pairs = same[0].tolist(), same.shape[0] // 2
            raise ValueError(f"detector {self.name!r}: the head's rows {p} and {c} are identical ({pairs} pair"
                             f"{'s' if pairs > 1 else ''} of identical rows): no decision boundary between them")
        self.register_buffer("mean", feature_mean(features))
        self.register_buffer("boundary_norms", norms)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        check_width(features, self.mean.numel(), what=f"detector {self.name!r}: the features", of="its fit features")
        classes = self.boundary_norms.shape[0]
        scores, head, buffers = [], self.product_head(features), Buffers(features.device)
        for (chunk,) in row_chunks(features, rows=chunk_rows(features.shape[1] + 2 * classes)):
            logits = self.head_logits(chunk, head, buffers)
            top, predicted = logits.max(dim=1)
            norms = torch.index_select(self.boundary_norms, 0, predicted,
                                       out=buffers.take("norms", tuple(logits.shape), torch.float64))
            # top - logits as -logits + top: the same subtraction, in the logits' memory
            distances = logits.neg_().add_(top[:, None]).div_(norms).sum(dim=1) / (classes - 1)
            if self.distance_to_mean:  # x - μ, in float64 (a copy of a float64 chunk too: never written in place)
                x = buffers.take("centred", tuple(chunk.shape), torch.float64).copy_(chunk).sub_(self.mean)
            else:
                x = buffers.float64(chunk, "x")
            scores.append(distances / x.norm(dim=1).clamp(min=DISTANCE_FLOOR))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
