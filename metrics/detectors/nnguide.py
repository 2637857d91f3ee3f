"""NNGuide: the energy guided by the similarity to a bank of confidence-scaled training features.

Park, Jung, Teoh, *Nearest Neighbor Guidance for Out-of-Distribution Detection*, ICCV 2023 (the authors' code:
github.com/roomo7time/nnguide, ``ood_detectors/nnguide.py``). With ``ẑ = x / max(|x|₂, 10⁻¹²)`` the normalised
features and ``E(x) = log Σ_c exp(logit_c(x))`` the energy of the logits, the bank holds every fit sample's
normalised feature scaled by its own energy, ``b_j = E(x_j)·ẑ_j``, and

    guidance(x) = (1/k) Σ of the k largest inner products ẑ·b_j over the bank
    score(x)    = guidance(x) · E(x)

(higher = more in-distribution; pytorch-ood's ``NNGuide`` returns minus this). The neighbours are the k
largest *scaled* similarities ``ẑ·b_j`` (faiss ``IndexFlatIP`` over the scaled bank in the authors' code and in
OpenOOD, ``topk`` in pytorch-ood), not the k most similar features.

Defaults: ``k = 10``, the authors' ``configs/detector/nnguide.yaml`` (``knn_k: 10``) and pytorch-ood's default;
the bank is a 1% sample of the training set, the authors' ``dataloaders/datasets_large.py``
(``bankset_ratio=0.01``, a shuffled ``int(N·0.01)``) and OpenOOD's ``configs/postprocessors/nnguide.yml``
(``alpha: 0.01``; its ``K: 100``): the detector's ``default_fit = {"fraction": 0.01}``, the engine's seeded,
class-balanced 1% of the fit set (``--fit-arg nnguide.fraction=F`` changes it, ``1.0`` keeps every fit image). A
background-class model's energy is over its known logits.

Reference: pytorch-ood 0.4.0's ``NNGuide`` (run in float64), to float64 rounding: the largest difference measured
on the tests' data (300 × 32 features, ties included) is 5·10⁻¹⁶ relative; and a numpy transcription of OpenOOD's
``nnguide_postprocessor.py`` (whose normaliser ``x/|x| + 10⁻¹⁰`` adds 10⁻¹⁰ to every element: the scores agree to
1.7·10⁻⁹ relative, the offset's effect).

Precision (:mod:`metrics.detectors.base`): the bank and the fit are float64; scoring normalises the features and
multiplies them by the bank in their own precision, float32 for float32 features (with a float32 copy of the bank, made
once per score call: 100 MiB at 12,810 × 2048), and averages the k neighbours and multiplies by the energy in float64.

Memory: pytorch-ood's ``NNGuide`` keeps the scaled bank of every fit sample (float32 ``N × D``) and its fit and
scoring, given 1,281,167 × 2048 features, needed ~34 GiB (pytorch-ood issue #159). Here the bank is the capped fit
set's, float64: fit ``O(N_bank·D + chunk·D)``, written row chunk by row chunk into the bank (no other ``N × D``
matrix); score ``O(N_bank·D + chunk·(D + N_bank))`` with chunk = ``min(CHUNK_ROWS, CHUNK_ELEMENTS / N_bank)``
rows, so the similarity block stays under 256 MiB. At the default 1% of ImageNet's 1,281,167 training images (the
engine's class-balanced cap: about 12,810 images) the bank is 12,810 × 2048 float64 = 200 MiB; measured (CPU,
float32 features and 1000 logits): the fit peaks 404 MiB above its features, scoring 560 MiB above the fitted
state. The whole training set (``fraction 1.0``) would be a 20 GiB bank: what the bank keeps is the cap's to bound.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import (
    Buffers,
    Detector,
    check_positive_int,
    check_width,
    chunk_rows,
    in_product_precision,
    row_chunks,
)
from metrics.detectors.knn import normalise
from metrics.detectors.registry import register_detector


@register_detector
class NNGuide(Detector):
    """NNGuide score, ``E(x) · mean of the k largest ẑ·b_j`` (see the module docstring).

    Hyperparameters:
        k: the neighbours of the guidance (default 10, the authors' and pytorch-ood's).

    Buffers: ``bank`` ``(N_bank, D)`` float64, the normalised fit features scaled by their energy.
    """

    name = "nnguide"
    paper = "Park et al., ICCV 2023"
    inputs = frozenset({"features", "logits"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("bank",)
    default_fit = {"fraction": 0.01}

    def __init__(self, *, k: int = 10, background: bool = False) -> None:
        super().__init__(background=background)
        self.k = check_positive_int("k", k, detector=self.name)

    def check_fit_size(self, samples: int, classes: int) -> None:
        if self.k > samples:  # before the fit pass (the engine knows the capped set's size)
            raise ValueError(f"detector {self.name!r}: k = {self.k} neighbours, but the bank (the fit set) has only "
                             f"{samples} samples; lower k or fit on more samples")

    def _energy(self, logits: Tensor) -> Tensor:
        return torch.logsumexp(self.known_logits(logits), dim=1)

    def _fit(self, data: dict[str, Tensor]) -> None:
        features, logits = data["features"], data["logits"]
        if features.ndim != 2 or logits.ndim != 2:
            raise ValueError(f"detector {self.name!r}: fit features and logits must be (N, D) and (N, C), got "
                             f"{tuple(features.shape)} and {tuple(logits.shape)}")
        self.check_fit_size(features.shape[0], 0)
        bank = torch.empty(features.shape, dtype=torch.float64, device=features.device)
        start = 0
        for x, z in row_chunks(features, logits):
            bank[start:start + x.shape[0]] = normalise(x) * self._energy(z.to(x.device))[:, None]
            start += x.shape[0]
        self.register_buffer("bank", bank)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features, logits = outputs["features"], outputs["logits"]
        check_width(features, self.bank.shape[1], what=f"detector {self.name!r}: the features", of="its fit features")
        if logits.shape[0] != features.shape[0]:
            raise ValueError(f"detector {self.name!r}: {logits.shape[0]} rows of logits, {features.shape[0]} of "
                             "features")
        scores, buffers = [], Buffers(features.device)
        (bank,) = in_product_precision(features, self.bank)  # float32 features: a float32 copy, once per call
        for x, z in row_chunks(features, logits, rows=chunk_rows(self.bank.shape[0])):
            similarity = torch.mm(normalise(x, bank.dtype), bank.T,
                                  out=buffers.take("similarity", (x.shape[0], bank.shape[0]), bank.dtype))
            neighbours = torch.topk(similarity, self.k, dim=1, sorted=False).values  # exact in either precision
            scores.append(neighbours.to(torch.float64).mean(dim=1) * self._energy(z.to(x.device)))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
