"""PostMax: the maximum logit divided by the feature magnitude, mapped through a generalized Pareto CDF.

Cruz, Rabinowitz, Günther, Boult, *Operational Open-Set Recognition and PostMax Refinement*, ECCV 2024. With the
known logits ``z``, the prediction ``ĉ = argmax_c z_c`` and the penultimate features ``φ``:

    γ(x)     = z_ĉ / |φ|₂                          the maximum logit normalised by the feature magnitude
    (ξ, μ, σ) = the maximum-likelihood generalized Pareto distribution (GPD) of γ over the fit samples
               that the model classifies correctly (one GPD for all classes)
    score(x) = Ψ(γ(x); ξ, μ, σ) = 1 - (1 + ξ (γ - μ)/σ)^(-1/ξ)     (ξ ≠ 0; 1 - exp(-(γ - μ)/σ) at ξ = 0)

on the GPD's support, 0 below ``μ`` and, for ``ξ < 0``, 1 above ``μ - σ/ξ``: the probability that γ comes from the
training distribution (higher = more in-distribution). The paper's pipeline (its Fig. 1): the maximum logits of
the correctly classified training samples, normalised by the feature magnitude ``ℓ``, are the data of one
maximum-likelihood GPD fit (µ, σ, ξ); the GPD's CDF Ψ of a test sample's normalised maximum logit is its score.

Defaults and where they come from: PostMax has no hyperparameter (the paper's). The feature magnitude is the
Euclidean norm (the paper's "feature magnitude"; a zero feature vector is floored to 10⁻¹² as pytorch-ood and
:mod:`metrics.detectors.knn` floor a norm, which keeps γ finite). The fit is ``scipy.stats.genpareto.fit(γ)``
with all three parameters free: maximum likelihood by scipy's default optimiser, as the same authors' released
GHOST code fits its GPDs (github.com/Vastlab/GHOST, ``GHOST.py``: ``scipy.stats.genpareto.fit(data)``, and
``scipy.stats.genpareto.cdf`` to score). The authors' PostMax repository (github.com/Vastlab/PostMax-OOSA) holds
no code ("to be released"), so the reference (``tests/metrics/detectors/test_postmax.py``) is the paper's
pipeline written with that GPD machinery, unchunked, in numpy (300 fit samples of 4 classes, D = 32, with and
without ties): the same GPD parameters to the last bit and the scores to 1.7e-16 (measured largest difference; γ's
norm is torch's here, numpy's there).

Background-class models: the maximum and the prediction over the known logits. Float64 throughout. The GPD is
scipy's (NumPy on the CPU): a chunk's γ goes to the CPU for its CDF.

Memory: fit ``O(N)`` float64 (the γ of the correctly classified fit samples: 10 MB for ImageNet's 1,281,167
training images) and ``O(chunk·D)`` (a chunk's correctly classified rows and their float64 cast: measured peak 399
MiB above 60,000 × 2048 float32 fit features, the same at any N; never an ``N × D`` matrix), within 2 GiB above
ImageNet's features; scipy's fit evaluates the likelihood over those ``N`` values (measured on this project's
shared 2-core machine: 1 s for 100,000 values, 41 s for 1,281,167). Score ``O(chunk·(D + K) + N)``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from metrics.detectors.base import Detector, check_width, row_chunks
from metrics.detectors.registry import register_detector

NORM_FLOOR = 1e-12
"""The floor of a divisor (a feature norm, GHOST's sum of z-scores): a zero vector gives a finite γ."""


def fit_gpd(values: Tensor) -> tuple[float, float, float]:
    """``(ξ, μ, σ)``: scipy's maximum-likelihood generalized Pareto fit of ``values`` (1-D), shape, location and
    scale all free (``scipy.stats.genpareto.fit``, its default optimiser and starting point)."""
    with np.errstate(all="ignore"):  # the optimiser probes parameters where the log-likelihood overflows
        shape, loc, scale = stats.genpareto.fit(values.detach().to(torch.float64).cpu().numpy())
    return float(shape), float(loc), float(scale)


def gpd_cdf(values: Tensor, parameters: Tensor) -> Tensor:
    """``Ψ(values; ξ, μ, σ)`` elementwise, float64, on ``values``' device: ``parameters`` ``(3,)`` or ``(N, 3)``
    (one ``(ξ, μ, σ)`` per value) in scipy's order (shape, loc, scale)."""
    params = parameters.detach().to(torch.float64).cpu().numpy()
    with np.errstate(all="ignore"):
        cdf = stats.genpareto.cdf(values.detach().to(torch.float64).cpu().numpy(), params[..., 0],
                                  loc=params[..., 1], scale=params[..., 2])
    return torch.from_numpy(np.asarray(cdf, dtype=np.float64)).to(values.device)


def correct_fit_rows(detector: Detector, logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For a chunk of fit rows: the mask of those the model classifies correctly (over the known logits), their
    classes and their known logits in float64."""
    known = detector.known_logits(logits)
    targets = targets.to(device=known.device, dtype=torch.long)
    correct = known.argmax(dim=1) == targets
    return correct, targets[correct], known[correct]


def check_logits(detector: Detector, logits: Tensor, features: Tensor, classes: int | None = None) -> None:
    """The logits to score are ``(N, K)`` known columns like the fit's (where ``classes`` is known), one row per
    feature row."""
    if logits.ndim != 2:
        raise ValueError(f"detector {detector.name!r}: logits must be (N, C), got {tuple(logits.shape)}")
    known = detector.known_logits(logits[:1]).shape[1]
    if classes is not None and known != classes:
        raise ValueError(f"detector {detector.name!r} was fitted on logits of {classes} known classes; the logits to "
                         f"score have {known} known columns (the predicted class indexes its fitted statistics)")
    if logits.shape[0] != features.shape[0]:
        raise ValueError(f"detector {detector.name!r}: {logits.shape[0]} rows of logits, {features.shape[0]} of "
                         "features")


def normalised_max_logits(known: Tensor, features: Tensor) -> Tensor:
    """``γ = max_c z_c / max(|φ|₂, 10⁻¹²)`` per row, float64."""
    norms = features.to(torch.float64).norm(dim=1).clamp(min=NORM_FLOOR)
    return known.to(torch.float64).max(dim=1).values / norms


@register_detector
class PostMax(Detector):
    """PostMax score, the GPD CDF of the feature-normalised maximum logit (see the module docstring).

    Buffers (float64): ``pareto`` ``(3,)``: the fitted ``(ξ, μ, σ)`` (scipy's shape, loc, scale); ``width`` ``()``
    the fit features' dimension; ``classes`` ``()`` the number of known classes.
    """

    name = "postmax"
    paper = "Cruz et al., ECCV 2024"
    inputs = frozenset({"features", "logits"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("pareto", "width", "classes")

    def _fit(self, data: dict[str, Tensor]) -> None:
        features, logits, targets = data["features"], data["logits"], data["targets"]
        if features.ndim != 2:
            raise ValueError(f"detector {self.name!r}: fit features must be (N, D), got {tuple(features.shape)}")
        check_logits(self, logits, features)
        classes = self.known_logits(logits[:1]).shape[1]
        if int(targets.max()) >= classes:
            raise ValueError(f"detector {self.name!r}: fit targets go up to {int(targets.max())}, the logits have "
                             f"{classes} known classes")
        gammas = []
        for x, z, y in row_chunks(features, logits, targets):
            correct, _, known = correct_fit_rows(self, z, y)
            gammas.append(normalised_max_logits(known, x[correct.to(x.device)]))
        gamma = torch.cat(gammas)
        if gamma.numel() < 2:
            raise ValueError(f"detector {self.name!r}: {gamma.numel()} of {targets.shape[0]} fit samples are "
                             "classified correctly; PostMax fits its GPD to the normalised maximum logits of those "
                             "and needs at least 2")
        device = features.device
        self.register_buffer("pareto", torch.tensor(fit_gpd(gamma), dtype=torch.float64, device=device))
        self.register_buffer("width", torch.tensor(features.shape[1], device=device))
        self.register_buffer("classes", torch.tensor(classes, device=device))

    def normalised(self, outputs: dict[str, Tensor]) -> Tensor:
        """``(N,)`` γ, the feature-normalised maximum logits, before the GPD."""
        features, logits = outputs["features"], outputs["logits"]
        check_width(features, int(self.width), what=f"detector {self.name!r}: the features", of="its fit features")
        check_logits(self, logits, features, int(self.classes))
        parts = [normalised_max_logits(self.known_logits(z), x) for x, z in row_chunks(features, logits)]
        return torch.cat(parts) if parts else features.new_zeros(0, dtype=torch.float64)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        return gpd_cdf(self.normalised(outputs), self.pareto)
