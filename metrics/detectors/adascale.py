"""AdaSCALE: SCALE's activation scaling with a percentile adapted per sample from how its features move under a
small input perturbation.

Regmi, *AdaSCALE: Adaptive Scaling for OOD Detection*, 2025, as OpenOOD v1.5 runs it
(``openood/postprocessors/adascale_postprocessor.py``, ``openood/networks/adascale_net.py``, configs
``configs/postprocessors/adascale_{a,l}.yml``), whose leaderboard it leads on ImageNet-1K (ResNet-50 near / far
AUROC 84.42 / 97.27 for AdaSCALE-A). With ``x`` the model input, ``f(x)`` the penultimate features (``D``), the
head's logits ``z = W f + b`` and ``ŷ = argmax z``:

    g     = ∇_x z_ŷ(x)                                            (one backward per image)
    x'    = x + 0.5 · sign(g) ⊙ m,   m = 1 on the ⌊o·|x|⌋ input elements of smallest |g|, else 0
    Δ     = |f(x) - f(x')|
    Q'(x) = Σ_{i ∈ top_k1(f(x))} relu(f(x'))_i + λ · Σ_{i ∈ top_k2(f(x))} Δ_i
            (top_k: the indices of the k largest features; k1 = ⌊D·k1%⌋, k2 = ⌊D·k2%⌋)
    p(x)  = p_min + (1 - F̂(Q'(x))) · (p_max - p_min)      F̂: the empirical CDF of Q' on ID validation images
    s(x)  = Σ_d relu(f)_d / Σ_{top k(x)} relu(f)_d,         k(x) = D - round(D · p(x) / 100)
    AdaSCALE-A:  score = log Σ_c exp((W (f · e^{s}) + b)_c)       (the features scaled, as SCALE)
    AdaSCALE-L:  score = log Σ_c exp((W f + b)_c · s²)            (the logits scaled)

The fit is the ECDF: ``Q'`` of every ID validation image (``fit_split = "val"``, as OpenOOD's ``setup`` reads
``id_loader_dict['val']``; OpenOOD takes 5,000 of them at random, unseeded, the project all the fit set holds or
its ``--fit-arg`` cap, seeded), sorted into a buffer. ``Q'`` comes from the detector's own pass
(:meth:`AdaSCALEA.image_outputs`: one forward of the features with the input's gradient, one backward, one forward
of the perturbed input; with the shared pass, 3 forward passes and 1 backward per image), which depends on ``k1, k2, lmbda, o``
only: a search over the percentile range (OpenOOD's grid) reuses it.

Units are OpenOOD's, so that its grid and values carry over exactly: ``p_min, p_max, k1, k2`` in percent, ``o``
a fraction of the input's elements, and the step 0.5 in the model input's units, as OpenOOD steps its normalised
input (about 0.5·σ_c ≈ 0.12 of the image's range for ImageNet's σ; on a model that takes ``[0, 1]`` images, such as
the project's own classifiers, it is half the range: a stronger perturbation than OpenOOD's networks see). Defaults: ``p = [80, 85]``, OpenOOD's comment "For ResNet-50 model, following
hyperparameters works best" in both configs, ``k1 = 5``, ``k2 = 1``, ``λ = 10``, ``o = 0.05`` (its
``postprocessor_args``; those start its search at ``[75, 85]``, the ``openood`` preset). ``k(x)`` rounds half to
even (``torch.round``), as OpenOOD; where it rounds to 0 (``D`` below ~50 with ``p`` near 99) one activation is
kept, where OpenOOD divides by 0. ``F̂(t)`` is the fraction of fit values ``<= t`` (statsmodels' ``ECDF``,
which OpenOOD calls). Background-class models: the energy of the known logits, ``ŷ`` among them.

Tested against a reference written from OpenOOD's code on the same images and model (both float64):
the statistic and the scores agree to 1e-12 relative. The engine's pass keeps ``Q'`` in float32 (every pass
output is gathered as float32): fit and test values are rounded alike. Scoring: the scale ``s(x)`` in float64, the
head's product (of the scaled features) in the features' precision, float32 for float32 features, the energy in
float64 (:mod:`metrics.detectors.base`, *Precision*).

Memory: the fit keeps ``N_val`` float64 values; a pass holds a batch's input gradient; scoring ``O(chunk·D)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from metrics.detectors.base import Detector, check_non_negative, check_width, row_chunks
from metrics.detectors.perturbation import _check_gradients_available
from metrics.detectors.registry import register_detector

STATISTIC = "adascale/statistic"
"""The key of ``Q'`` in the detector's own pass."""


def _check_percent(name: str, value: Any, *, detector: str, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < 100:
        raise ValueError(f"detector {detector!r}: {name} must be a percentage in ({low:g}, 100), got {value!r}")
    return float(value)


def kept(dim: int, percent: float) -> int:
    """``⌊D · percent / 100⌋``, computed as OpenOOD does (``int(D * k / 100)``)."""
    return int(dim * percent / 100)


def perturbation_statistic(features: Tensor, perturbed: Tensor, *, k1: int, k2: int, lmbda: float) -> Tensor:
    """``Q'`` per row (see the module docstring) from the features of ``x`` and of ``x'``, float64."""
    features, perturbed = features.to(torch.float64), perturbed.to(torch.float64)
    top1 = features.topk(k1, dim=1).indices
    top2 = features.topk(k2, dim=1).indices
    return (perturbed.relu().gather(1, top1).sum(dim=1)
            + lmbda * (features - perturbed).abs().gather(1, top2).sum(dim=1))


def adaptive_scale(features: Tensor, percentiles: Tensor) -> Tensor:
    """``s = Σ relu(f) / Σ_{top k} relu(f)`` per row with ``k = D - round(D · p / 100)``, float64 (``percentiles``:
    ``p`` per row, in percent); a row whose top ``k`` sum to 0 gets ``s = 1`` (OpenOOD divides 0 by 0)."""
    activations = features.to(torch.float64).relu()
    dim = activations.shape[1]
    counts = dim - torch.round(dim * percentiles.to(torch.float64) / 100).long()
    counts = counts.clamp(min=1)
    values = activations.topk(int(counts.max()), dim=1).values
    mask = torch.arange(values.shape[1], device=values.device)[None, :] < counts[:, None]
    top = (values * mask).sum(dim=1)
    total = activations.sum(dim=1)
    return torch.where(top == 0, torch.ones_like(top), total / torch.where(top == 0, torch.ones_like(top), top))


@register_detector
class AdaSCALEA(Detector):
    """AdaSCALE-A: the energy of the head's logits of ``f · e^{s(x)}`` (see the module docstring).

    Hyperparameters (OpenOOD's units):
        p_min, p_max: the percentile range in percent, ``0 < p_min < p_max < 100`` (default 80, 85).
        k1, k2: the percent of the ``D`` features whose perturbed activations / shifts enter ``Q'`` (5, 1).
        lmbda: ``λ``, the weight of the shifts (10).
        o: the fraction of input elements perturbed (0.05).

    Buffers (float64): the head and ``fit_statistics`` ``(N_val,)``, the sorted ``Q'`` of the fit images.
    """

    name = "adascale_a"
    paper = "Regmi, 2025"
    inputs = frozenset({"model", "features", "head"})
    fit_data = True
    fit_split = "val"
    refuse_non_finite = True
    fitted_buffers = ("fit_statistics",)
    image_keys = (STATISTIC,)
    pass_name = "adascale"
    pass_hyperparameters = ("k1", "k2", "lmbda", "o")
    logit_scaling = False

    def __init__(self, *, p_min: float = 80.0, p_max: float = 85.0, k1: float = 5.0, k2: float = 1.0,
                 lmbda: float = 10.0, o: float = 0.05, background: bool = False) -> None:
        super().__init__(background=background)
        self.p_min = _check_percent("p_min", p_min, detector=self.name)
        self.p_max = _check_percent("p_max", p_max, detector=self.name)
        if self.p_max < self.p_min:
            raise ValueError(f"detector {self.name!r}: p_max = {p_max} is below p_min = {p_min}")
        self.k1 = _check_percent("k1", k1, detector=self.name)
        self.k2 = _check_percent("k2", k2, detector=self.name)
        self.lmbda = check_non_negative("lmbda", lmbda, detector=self.name)
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not 0 < o < 1:
            raise ValueError(f"detector {self.name!r}: o must be a fraction in (0, 1), got {o!r}")
        self.o = float(o)

    # -- the detector's own pass ----------------------------------------------------------------------
    def passes_per_image(self) -> tuple[int, int]:
        """The shared forward pass, then its own: the features with the input's gradient (1 forward, 1 backward)
        and the perturbed input's features (1 forward)."""
        return (3, 1)

    def image_outputs(self, model: nn.Module, images: Tensor) -> dict[str, Tensor]:
        """``Q'`` of each image (``adascale/statistic``): the features with the input's gradient of the predicted
        logit (through the head), one backward, the perturbed input's features. ``model.features(images)`` gives
        the penultimate features (a :class:`lightning_modules.scoring.ScoringModel`); the head must be stored
        (the engine stores it before the pass)."""
        _check_gradients_available()
        features_of = getattr(model, "features", None)
        if not callable(features_of):
            raise ValueError(f"detector {self.name!r} needs a model with a features() method (its penultimate "
                             f"features), got {type(model).__name__}")
        if not hasattr(self, "head_weight"):
            raise ValueError(f"detector {self.name!r}: its pass needs the model's classification head stored first")
        with torch.enable_grad():
            inputs = images.detach().clone().requires_grad_(True)
            features = features_of(inputs)
            weight = self.head_weight.to(device=features.device, dtype=features.dtype)
            bias = self.head_bias.to(device=features.device, dtype=features.dtype)
            logits = features @ weight.T + bias
            known = logits[:, :-1] if self.background else logits
            predicted = known.detach().argmax(dim=1)
            # summed over the batch: each image's gradient is its own
            (gradient,) = torch.autograd.grad(known.gather(1, predicted[:, None]).sum(), inputs)
        with torch.no_grad():
            perturbed = features_of(self.perturb(images.detach(), gradient))
            dim = features.shape[1]
            statistic = perturbation_statistic(features.detach(), perturbed, k1=kept(dim, self.k1),
                                               k2=kept(dim, self.k2), lmbda=self.lmbda)
        return {STATISTIC: statistic}

    def perturb(self, images: Tensor, gradient: Tensor) -> Tensor:
        """``x + 0.5 · sign(g) ⊙ m`` with ``m`` on the ``⌊o · |x|⌋`` elements of smallest ``|g|`` per image."""
        flat = gradient.reshape(gradient.shape[0], -1)
        count = int(flat.shape[1] * self.o)
        mask = torch.zeros_like(flat)
        if count:
            mask.scatter_(1, flat.abs().topk(count, dim=1, largest=False).indices, 1.0)
        return images + 0.5 * gradient.sign() * mask.view_as(gradient)

    # -- fit and score ------------------------------------------------------------------------------
    def _fit(self, data: dict[str, Tensor]) -> None:
        statistics = data[STATISTIC].to(torch.float64).reshape(-1)
        self.register_buffer("fit_statistics", statistics.sort().values)

    def percentiles(self, statistic: Tensor) -> Tensor:
        """``p(x) = p_min + (1 - F̂(Q'(x)))(p_max - p_min)`` per row, in percent."""
        reference = self.fit_statistics
        below = torch.searchsorted(reference, statistic.to(torch.float64).contiguous(), right=True)
        ecdf = below.to(torch.float64) / reference.numel()
        return self.p_min + (1 - ecdf) * (self.p_max - self.p_min)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features, statistic = outputs["features"], outputs[STATISTIC]
        check_width(features, self.head_weight.shape[1], what=f"detector {self.name!r}: the features",
                    of="the head's weight")
        scores, head = [], self.product_head(features)
        for chunk, values in row_chunks(features, statistic):
            scale = adaptive_scale(chunk, self.percentiles(values))  # float64
            x = chunk.to(head[0].dtype)  # the head's product in the features' precision (base's Precision)
            if self.logit_scaling:
                logits = self.head_logits(x, head) * scale[:, None] ** 2
            else:
                logits = self.head_logits(x * torch.exp(scale).to(x.dtype)[:, None], head)
            scores.append(torch.logsumexp(logits, dim=1))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)


@register_detector
class AdaSCALEL(AdaSCALEA):
    """AdaSCALE-L: the energy of the head's logits scaled by ``s(x)²`` (see the module docstring)."""

    name = "adascale_l"
    logit_scaling = True
