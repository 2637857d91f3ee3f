"""OptFS: the piecewise-constant feature shaping fitted in closed form on in-distribution features.

Zhao, Xu, Gupta, Asthana, Zheng, Gould, *Towards Optimal Feature-Shaping Methods for Out-of-Distribution
Detection*, ICLR 2024 (the venue of the authors' README), as the authors' code computes it
(github.com/Qinyu-Allen-Zhao/OptFSOOD, ``detector/ours.py``, class ``Ours``: ``setup``, ``get_lc_fv_list``,
``postprocess``). With the head ``logits = z Wᵀ + b`` (``W`` ``(K, D)``) and the fit features ``z_i`` ``(D,)``:

    a, c     = the q and 1 - q quantiles of all N·D fit activations (np.quantile, linear interpolation)
    w        = (c - a) / B;   b_m = np.arange(a, c, w),  m = 0..M-1   (M = B, or B + 1 where arange's rounding adds
                                                                       one), the intervals [b_m, b_m + w)
    ŷ_i      = argmax_c logit_c(z_i)                                   the model's prediction (not the label)
    I_m      = (1/N) Σ_i Σ_j [b_m <= z_ij < b_m + w] W_{ŷ_i j} z_ij    the fit's mean contribution of interval m to
                                                                       the predicted logit (the paper's ID-only
                                                                       closed form, its Eq. 14)
    θ        = 1000 · I / ‖I‖₂
    s(z)_j   = z_j Σ_m [b_m <= z_j < b_m + w] θ_m                      the shaped feature (0 outside [a, c))
    score(z) = log Σ_k exp((s(z) Wᵀ + b)_k)                            ood_score "energy" (default)
             = Σ_j W_{ŷ(z) j} s(z)_j                                   ood_score "vanilla" ("Ours (V)": the
                                                                       predicted class's shaped logit, no bias)

Defaults: ``B = 100`` intervals and ``q = 10⁻³`` (``ours.py``: ``np.quantile(feature, 1e-3)``,
``np.quantile(feature, 1-1e-3)``, ``(right_b-left_b) / 100.0``; the scale 1000 of θ too), fitted on the training
features and their predictions (``utils/func.py`` ``get_feature_train``: the argmax of the softmax); ``ood_score``
``"energy"``, the score of the feature-shaping methods the paper compares with (ReAct, ASH, ...; the authors'
``eval_ood.py`` option ``-o energy``; their ``vanilla`` is ``-o``'s default). The paper's variant fitted with OOD
data (its Eq. 10) needs an OOD set the fit does not have; this is its ID-only solution, the one the authors run.
Their ``dynamic_weight`` refit (off in their code) is not implemented.

An activation on a rounding-level overlap of two intervals (``b_m + w`` computed above ``b_{m+1}``) is counted in
both and one in a gap in neither, as the authors' masks do. A background-class model's head is cut to its K
known rows (the prediction, the contributions, the energy). Float64 throughout (the authors' arrays are float32):
the quantiles are exact order statistics of the fit features in their dtype (:func:`element_quantile`, equal to
``np.quantile`` of the same array). Reference: ``tests/metrics/detectors/test_optfs.py`` transcribes ``ours.py``'s
setup and postprocess in numpy (unchunked, float64): the largest difference measured is 1.9e-15 of θ (relative to
its largest entry) and 7.3e-14 relative of the scores (both variants; features with ties, and activations counted
in two intervals by rounding).

Memory: ``O(B + K·D)`` state; the quantiles select over chunks (:func:`metrics.detectors.base.order_statistics`);
the interval pass and scoring keep ``O(rows·D)`` per chunk, rows = ``CHUNK_ELEMENTS / (8 D)`` (2048 at D = 2048:
eight ``rows × D`` temporaries of 32 MiB): measured 0.30 GB above 100,000 × 2048 float32 fit features of 1000
classes (peak RSS, glibc's mmap threshold fixed at 128 KiB), the same for 1,281,167 of them (nothing grows with N).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from metrics.detectors.base import (
    Detector,
    check_positive_int,
    check_width,
    chunk_rows,
    linear_quantile,
    row_chunks,
)
from metrics.detectors.registry import register_detector

THETA_NORM = 1000.0
"""The authors' length of θ (``lc_fv_list / np.linalg.norm(lc_fv_list, 2) * 1000``): the energy's temperature."""

TEMPORARIES = 8
"""``rows × D`` temporaries of a chunk (features, intervals, masks, contributions)."""

OOD_SCORES = ("energy", "vanilla")

SELECTION_ELEMENTS = 1 << 23
"""Elements per chunk of the quantiles' selection passes (8M: 64 MiB of int64 keys), as ReAct's."""


def element_quantile(features: Tensor, fraction: float) -> float:
    """``np.quantile(features, fraction)`` over every element, exactly, in the features' dtype (float16 and
    bfloat16 in float32), without a flattened copy (:func:`metrics.detectors.base.linear_quantile`)."""
    dtype = features.dtype if features.dtype in (torch.float32, torch.float64) else torch.float32
    width = max(features.shape[1], 1)
    rows = max(1, min(chunk_rows(width), SELECTION_ELEMENTS // width))

    def chunks():
        for (chunk,) in row_chunks(features, rows=rows):
            yield chunk.to(dtype).contiguous().reshape(-1)

    return linear_quantile(chunks, features.numel(), fraction, dtype=dtype)


@register_detector
class OptFS(Detector):
    """OptFS score: the energy (or the predicted logit) of the piecewise-constant shaped features (see the module
    docstring).

    Hyperparameters:
        bins: B, the number of intervals of width ``(c - a) / B`` (default 100).
        quantile: q in (0, 0.5), the activations' quantiles ``a`` and ``c = quantile(1 - q)`` bounding the
            intervals (default 0.001).
        ood_score: ``"energy"`` (default) or ``"vanilla"`` (the predicted class's shaped logit).

    Buffers (float64): the head, ``lower`` ``(M,)`` the intervals' lower edges ``b_m``, ``upper`` ``(M,)`` their
    upper edges ``b_m + w``, ``theta`` ``(M,)``.
    """

    name = "optfs"
    paper = "Zhao et al., ICLR 2024"
    inputs = frozenset({"features", "head"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("lower", "upper", "theta")

    def __init__(self, *, bins: int = 100, quantile: float = 1e-3, ood_score: str = "energy",
                 background: bool = False) -> None:
        super().__init__(background=background)
        self.bins = check_positive_int("bins", bins, detector=self.name)
        if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile < 0.5:
            raise ValueError(f"detector {self.name!r}: quantile must be a fraction in (0, 0.5), got {quantile!r}")
        self.quantile = float(quantile)
        if ood_score not in OOD_SCORES:
            raise ValueError(f"detector {self.name!r}: ood_score must be one of {list(OOD_SCORES)}, got {ood_score!r}")
        self.ood_score = ood_score

    def _known_head(self) -> tuple[Tensor, Tensor]:
        weight, bias = self.head_weight, self.head_bias
        return (weight[:-1], bias[:-1]) if self.background else (weight, bias)

    def _rows(self) -> int:
        return chunk_rows(TEMPORARIES * self.head_weight.shape[1])

    def _intervals(self, x: Tensor) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """For each activation the last interval ``m`` with ``b_m <= x`` and the one before it, each with whether
        ``x`` lies in it (below its upper edge): the two intervals that can hold ``x``."""
        index = torch.bucketize(x, self.lower, right=True) - 1
        last = index.clamp(min=0)
        previous = (index - 1).clamp(min=0)
        return ((previous, (index >= 1) & (x < self.upper[previous])),
                (last, (index >= 0) & (x < self.upper[last])))

    def _fit(self, data: dict[str, Tensor]) -> None:
        features = data["features"]
        weight, bias = self._known_head()
        check_width(features, weight.shape[1], what=f"detector {self.name!r}: the fit features", of="the head's weight")
        low = element_quantile(features, self.quantile)
        high = element_quantile(features, 1 - self.quantile)
        if not high > low:
            raise ValueError(f"detector {self.name!r}: the fit activations' {self.quantile} and {1 - self.quantile} "
                             f"quantiles are both {low}: no interval to shape (constant features?)")
        width = (high - low) / self.bins
        lower = np.arange(low, high, width)  # the authors' np.arange: B intervals, or B + 1 by rounding
        device = features.device
        self.register_buffer("lower", torch.from_numpy(lower).to(device))
        self.register_buffer("upper", torch.from_numpy(lower + width).to(device))
        sums = torch.zeros(lower.size, dtype=torch.float64, device=device)
        for (chunk,) in row_chunks(features, rows=self._rows()):
            x = chunk.to(torch.float64)
            predicted = torch.addmm(bias, x, weight.T).argmax(dim=1)
            contributions = weight[predicted] * x
            for index, inside in self._intervals(x):
                sums += torch.bincount(index[inside], weights=contributions[inside], minlength=lower.size)
        influence = sums / features.shape[0]
        norm = torch.linalg.vector_norm(influence)
        if not norm > 0:
            raise ValueError(f"detector {self.name!r}: the fit features contribute nothing to the predicted logits in "
                             "any interval (I = 0): θ is undefined")
        self.register_buffer("theta", influence / norm * THETA_NORM)

    def shaped(self, features: Tensor) -> Tensor:
        """``s(z)`` ``(rows, D)`` float64: each activation times the θ of its interval(s), 0 outside them."""
        x = features.to(torch.float64)
        shaped = torch.zeros_like(x)
        for index, inside in self._intervals(x):  # the lower interval first, as the authors' loop adds them
            shaped += torch.where(inside, x * self.theta[index], 0.0)
        return shaped

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        weight, bias = self._known_head()
        check_width(features, weight.shape[1], what=f"detector {self.name!r}: the features", of="the head's weight")
        scores = []
        for (chunk,) in row_chunks(features, rows=self._rows()):
            shaped = self.shaped(chunk)
            if self.ood_score == "energy":
                scores.append(torch.logsumexp(torch.addmm(bias, shaped, weight.T), dim=1))
            else:
                predicted = torch.addmm(bias, chunk.to(torch.float64), weight.T).argmax(dim=1)
                scores.append((weight[predicted] * shaped).sum(dim=1))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
