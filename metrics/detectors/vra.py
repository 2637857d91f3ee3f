"""VRA: the energy of the head's logits of the features clipped from below and above at activation percentiles.

Xu, Lian, Liu, Tao, *VRA: Variational Rectified Activation for Out-of-distribution Detection*, NeurIPS 2023, in the
form OpenOOD v1.5 runs it (``vra_postprocessor.py``). With the head ``logits = x Wᵀ + b``:

    α        = the q_low-th percentile of all fit activations (every element of the N × D fit features)
    β        = the q_high-th percentile of all fit activations
    score(x) = log Σ_k exp(logit_k(min(max(x, α), β)))

Defaults ``q_low = 0.1``, ``q_high = 0.9``: OpenOOD's ``configs/postprocessors/vra.yml`` (``percentile_low: 10``,
``percentile_high: 90``; its search sweeps ``percentile_high_list`` [85, 90, 95, 99] and ``percentile_low_list``
[1, 5, 10, 15]). The percentiles are ``np.percentile`` of the flattened activations with numpy's linear
interpolation, exactly (:func:`metrics.detectors.react.activation_percentile`, a selection over the chunks, no
flattened copy), as OpenOOD's ``setup``/``set_hyperparam`` compute them, on the ID **validation** images
(``id_loader_dict['val']``): ``fit_split = "val"``. Matched against OpenOOD's logic (written in numpy, float32 and
float64 ID val features with ties, its grid's percentiles): the thresholds bit for bit, the scores to 4.1e-16
relative.

What the authors and pytorch-ood do instead: the authors' VRA (zeroQiaoba/VRA, ``models/resnet.py``, ``case ==
'clip2'`` with ``lamb = 0``) sets activations *below* α to 0 rather than to α, keeps those in ``[α, β]`` and sets
those above β to β; its thresholds are per-dimension quantiles of the training features for CIFAR
(``torch.quantile(feat, q, dim=0)``, e.g. VRA on CIFAR-10 ``--q1 0.6 --q2 0.9``) and fixed values on ImageNet
(ResNet-50 ``--featmin 0.5 --featmax 1``). pytorch-ood's ``VRA`` clips like OpenOOD but per dimension
(``np.quantile(z, q, axis=0)``; defaults 0.01 / 0.99), so it equals this detector only for one-dimensional features
(tested). This detector is OpenOOD's: one pair of global thresholds, clipped on both sides.

The energy is over the known logits of a background-class model. The thresholds are float64 buffers of the
percentiles computed in the fit features' dtype, as numpy does (float16/bfloat16 features are selected in float32);
scoring clips and multiplies by the head in the features' precision, float32 for float32 features (exact clips: the
thresholds rounded to float32), the energy in float64 (:mod:`metrics.detectors.base`, *Precision*).

Memory: fit ``O(chunk)`` beyond the features (a selection's sample of ``N·D / 1024`` values, its bracket and one
chunk's temporaries; :func:`metrics.detectors.base.order_statistics`), score the head and ``O(chunk·(D + K))``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import (
    Buffers,
    Detector,
    check_fraction,
    check_width,
    in_product_precision,
    logsumexp_,
    row_chunks,
)
from metrics.detectors.react import activation_percentile
from metrics.detectors.registry import register_detector


@register_detector
class VRA(Detector):
    """VRA score, the energy of the head's logits of ``clip(x, α, β)`` (see the module docstring).

    Hyperparameters:
        lower_percentile: ``q_low`` in (0, 1), the fraction of fit activations below ``α`` (default 0.1).
        upper_percentile: ``q_high`` in (0, 1), above ``q_low``: the fraction below ``β`` (default 0.9).

    Buffers (float64): the head, ``lower_threshold`` ``α`` ``()`` and ``upper_threshold`` ``β`` ``()``.
    """

    name = "vra"
    paper = "Xu et al., NeurIPS 2023"
    inputs = frozenset({"features", "head"})
    fit_data = True
    fit_split = "val"
    refuse_non_finite = True
    fitted_buffers = ("lower_threshold", "upper_threshold")

    def __init__(self, *, lower_percentile: float = 0.1, upper_percentile: float = 0.9,
                 background: bool = False) -> None:
        super().__init__(background=background)
        self.lower_percentile = check_fraction("lower_percentile", lower_percentile, detector=self.name)
        self.upper_percentile = check_fraction("upper_percentile", upper_percentile, detector=self.name)
        if self.lower_percentile >= self.upper_percentile:
            raise ValueError(f"detector {self.name!r}: lower_percentile {lower_percentile!r} must be below "
                             f"upper_percentile {upper_percentile!r}")

    def _fit(self, data: dict[str, Tensor]) -> None:
        features = data["features"]
        check_width(features, self.head_weight.shape[1], what=f"detector {self.name!r}: the fit features",
                    of="the head's weight")
        for name, percentile in (("lower_threshold", self.lower_percentile),
                                 ("upper_threshold", self.upper_percentile)):
            value = activation_percentile(features, percentile)
            self.register_buffer(name, torch.tensor(value, dtype=torch.float64, device=features.device))

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        check_width(features, self.head_weight.shape[1], what=f"detector {self.name!r}: the features",
                    of="the head's weight")
        head, buffers = self.product_head(features), Buffers(features.device)
        # a float32 clip at the thresholds rounded to float32 is exact (metrics.detectors.base, Precision)
        lower, upper = in_product_precision(features, self.lower_threshold, self.upper_threshold)
        scores = []
        for (chunk,) in row_chunks(features):
            x = chunk.to(lower.dtype)
            clipped = torch.clamp(x, min=lower, max=upper, out=buffers.take("clipped", tuple(x.shape), x.dtype))
            scores.append(logsumexp_(self.head_logits(clipped, head, buffers)))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
