"""SHE: simplified Hopfield energy, the inner product of the features with the predicted class's pattern.

Zhang, Fu, Chen, Du, Li, Wang, Liu, Han, Zhang, *Out-of-Distribution Detection based on In-Distribution Data Patterns
Memorization with Modern Hopfield Energy*, ICLR 2023, as pytorch-ood's ``SHE`` computes it (whose scores this
matches):

    S_c      = the mean feature of the fit samples of class c that the model predicts correctly   (K, D)
    ŷ(x)     = argmax_c logit_c(x)                         over the known logits
    score(x) = x · S_ŷ(x)

It reads the model's logits for ŷ; for a model of this project ``logits = head(features)``, so ŷ is
pytorch-ood's ``head(z).argmax``. A class without a correctly predicted fit sample is refused (as
pytorch-ood does). A background-class model predicts among its known classes. No hyperparameters. Float64.

Memory: the patterns ``O(K·D)``, streamed sums ``O(chunk·D)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import Detector, check_width, row_chunks
from metrics.detectors.registry import register_detector


@register_detector
class SHE(Detector):
    """SHE score (see the module docstring).

    Buffers (float64): ``patterns`` ``(K, D)``.
    """

    name = "she"
    paper = "Zhang et al., ICLR 2023"
    inputs = frozenset({"features", "logits"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("patterns",)

    def _fit(self, data: dict[str, Tensor]) -> None:
        features, logits, targets = data["features"], data["logits"], data["targets"]
        if features.ndim != 2:
            raise ValueError(f"detector {self.name!r}: fit features must be (N, D), got {tuple(features.shape)}")
        classes = self.known_logits(logits[:1]).shape[1]
        if int(targets.max()) >= classes:
            raise ValueError(f"detector {self.name!r}: fit targets go up to {int(targets.max())}, the logits have "
                             f"{classes} known classes")
        sums = torch.zeros(classes, features.shape[1], dtype=torch.float64, device=features.device)
        counts = torch.zeros(classes, dtype=torch.float64, device=features.device)
        for x, z, y in row_chunks(features, logits, targets):
            y = y.to(device=features.device, dtype=torch.long)
            correct = self.known_logits(z).argmax(dim=1) == y
            sums.index_add_(0, y[correct], x[correct].to(torch.float64))
            counts += torch.bincount(y[correct], minlength=classes).to(torch.float64)
        empty = (counts == 0).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"detector {self.name!r}: class {empty[0]} has no correctly predicted fit sample "
                             f"(classes without one: {empty[:10]}{' ...' if len(empty) > 10 else ''}); SHE's "
                             "pattern of a class is the mean of those")
        self.register_buffer("patterns", sums / counts[:, None])

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features, logits = outputs["features"], outputs["logits"]
        check_width(features, self.patterns.shape[1], what=f"detector {self.name!r}: the features", of="its fit features")
        classes = self.patterns.shape[0]
        if logits.ndim != 2 or self.known_logits(logits[:1]).shape[1] != classes:
            known = self.known_logits(logits[:1]).shape[1] if logits.ndim == 2 else None
            raise ValueError(f"detector {self.name!r} was fitted on logits of {classes} known classes; the logits to "
                             f"score have {known if known is not None else tuple(logits.shape)}"
                             f"{' known columns' if known is not None else ''} (the predicted class indexes its "
                             "patterns: another model's logits would pick wrong patterns or none)")
        if logits.shape[0] != features.shape[0]:
            raise ValueError(f"detector {self.name!r}: {logits.shape[0]} rows of logits, {features.shape[0]} of features")
        scores = [(x.to(torch.float64) * self.patterns[self.known_logits(z).argmax(dim=1)]).sum(dim=1)
                  for x, z in row_chunks(features, logits)]
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
