"""GHOST: the maximum logit normalised by the z-scores of the features under the predicted class's Gaussian.

Rabinowitz, Cruz, Günther, Boult, *GHOST: Gaussian Hypothesis Open-Set Technique*, AAAI 2025. On the fit samples
the model classifies correctly, each known class ``c`` gets a Gaussian with a diagonal covariance over the ``D``
feature dimensions; a sample's z-scores under its predicted class's Gaussian normalise its maximum logit:

    μ_c, σ_c = the per-dimension mean and standard deviation (N_c - 1) of the features φ of the correctly
               classified fit samples of class c;  σ_cd = 0 counts as ∞ (a constant dimension adds nothing)
    ĉ(x)     = argmax_c z_c                                 over the known logits z
    γ(x)     = z_ĉ / Σ_d |φ_d - μ_ĉd| / σ_ĉd                the GHOST score γ of the paper (its Fig. 2)
    score(x) = Ψ_ĉ(γ(x))                                   with ``gpd=True`` (the default), else γ(x)

where ``Ψ_c`` is the CDF of a generalized Pareto distribution (GPD) fitted by maximum likelihood to the γ of the
correctly classified fit samples of class c (one GPD per class, ``scipy.stats.genpareto.fit``, shape, location and
scale free; see :mod:`metrics.detectors.postmax`): the released code's "probability of knowness", higher = more
in-distribution.

Defaults and where they come from: GHOST has no hyperparameter (the paper's "hyperparameter-free"). ``gpd=True``
is the authors' released code (github.com/Vastlab/GHOST, ``GHOST.py``: ``Gaus_gen`` fits ``torch.mean`` /
``torch.std`` per predicted class of the correctly classified training samples, ``std[std == 0] = inf``; ``norm``
divides the predicted class's logit by the sum of absolute z-scores; ``gpd_mp_fit`` fits one
``scipy.stats.genpareto`` per class to those normalised logits and ``ReScore`` returns the predicted class's GPD
CDF); ``gpd=False`` is γ itself, the paper's GHOST score γ of its Fig. 2 (there the z-scores "are used together
with the maximum logit"; the formula is the released code's), which names no GPD. Within a class Ψ is
monotone in γ, so both rank one class's samples alike; across classes the GPDs reorder them, and a GPD with
``ξ < 0`` saturates at 1 (ties).

Differences from the released code, none of which changes a score where the code runs: the GPD of class c is fitted
to the class's own samples (the code takes each row's ``argmax`` of a vector that is zero but at the predicted
class, which is that class when γ > 0, always the case for correctly classified samples with a positive maximum
logit; a negative γ would land in another class's fit); the sum of z-scores is floored to 10⁻¹² (a feature
exactly at its class's mean in every varying dimension: the code stops in the debugger there); float64 where
the code's features come as they are stored. A class with fewer than 2 correctly classified fit samples has no
standard deviation and is refused (the code fails on it with a ``KeyError`` at scoring).

Reference: the released code's logic written in torch and numpy, unchunked
(``tests/metrics/detectors/test_ghost.py``, 300 fit samples of 4 classes, D = 32, with and without ties, a
constant dimension): measured largest differences γ 4.3e-16 relative (the class sums are added row by row here,
by ``torch.mean`` / ``torch.std`` there), the GPD parameters 3.4e-8 relative and the scores 1.3e-8 absolute:
scipy's Nelder-Mead fit carries γ's last-bit differences into its parameters at its own tolerance, not to float64
rounding.

Background-class models: the prediction and the maximum over the known logits; the Gaussians of the K known
classes. Float64 throughout.

Memory: three passes over the fit features (the class sums, the squared deviations, γ) through two reused
``chunk × D`` float64 buffers (chunk = ``CHUNK_ELEMENTS / 2D`` rows: 8192 at D = 2048, 256 MiB together; no
compacted copy of a chunk), the ``K × D`` statistics (sums, squares, μ, σ: 16 MiB each at K = 1000, D = 2048) and
``O(N)`` for the γ of the correctly classified fit samples and their classes (about 40 MB with the sort at
1,281,167); never an ``N × D`` matrix. Measured peak above 60,000 × 2048 float32 fit features of 100 classes:
263 MiB; for ImageNet's 1,281,167 × 2048 of 1000 classes about 400 MiB above the features, within 2 GiB. The
per-class GPD fits take 0.05-0.1 s each (measured on 1,281 values on this project's shared 2-core machine: 1-2
minutes for 1000 classes). Score: the same two buffers and ``O(N)``: ``O(K·D + chunk·D + N)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import Detector, check_width, chunk_rows, row_chunks
from metrics.detectors.postmax import NORM_FLOOR, check_logits, fit_gpd, gpd_cdf
from metrics.detectors.registry import register_detector

MIN_SAMPLES = 2
"""Correctly classified fit samples a class needs: its standard deviation divides by N_c - 1."""


class Workspace:
    """Two reused ``chunk × D`` float64 buffers (the rows, the gathered class statistics): a fresh 64-256 MiB
    temporary per chunk costs its page faults every time (measured 4x slower than a reused buffer for a cast,
    a gather and a subtraction at 4096 × 2048). All chunks of :meth:`chunks` fit them."""

    def __init__(self, features: Tensor, device: torch.device) -> None:
        dim = features.shape[1]
        self.rows = chunk_rows(2 * dim)  # the two buffers together within CHUNK_ELEMENTS
        size = min(self.rows, features.shape[0])
        self.values = torch.empty(size, dim, dtype=torch.float64, device=device)
        self.gathered = torch.empty(size, dim, dtype=torch.float64, device=device)

    def load(self, rows: Tensor) -> Tensor:
        """The chunk's rows cast to float64 into the first buffer (a view of it)."""
        values = self.values[:rows.shape[0]]
        values.copy_(rows)
        return values

    def gather(self, statistics: Tensor, labels: Tensor) -> Tensor:
        """``statistics[labels]`` into the second buffer (a view of it)."""
        return torch.index_select(statistics, 0, labels, out=self.gathered[:labels.shape[0]])

    def deviation_sums(self, rows: Tensor, labels: Tensor, means: Tensor, stds: Tensor) -> Tensor:
        """``Σ_d |φ_d - μ_ld| / σ_ld`` per row, ``l`` its label (``σ = ∞`` adds 0), floored to 10⁻¹²."""
        values = self.load(rows).sub_(self.gather(means, labels)).abs_()
        return values.div_(self.gather(stds, labels)).sum(dim=1).clamp_(min=NORM_FLOOR)


@register_detector
class GHOST(Detector):
    """GHOST score (see the module docstring).

    Hyperparameters:
        gpd: map γ through the predicted class's fitted GPD CDF, as the authors' code does (default ``True``);
            ``False``: γ itself.

    Buffers (float64): ``means`` ``(K, D)``, ``stds`` ``(K, D)`` (``inf`` for a constant dimension), ``pareto``
    ``(K, 3)`` the per-class ``(ξ, μ, σ)`` (scipy's shape, loc, scale; ``(0, 3)`` with ``gpd=False``).
    """

    name = "ghost"
    paper = "Rabinowitz et al., AAAI 2025"
    inputs = frozenset({"features", "logits"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("means", "stds", "pareto")

    def __init__(self, *, gpd: bool = True, background: bool = False) -> None:
        super().__init__(background=background)
        if not isinstance(gpd, bool):
            raise ValueError(f"detector {self.name!r}: gpd must be true or false, got {gpd!r}")
        self.gpd = gpd

    def _fit(self, data: dict[str, Tensor]) -> None:
        features, logits, targets = data["features"], data["logits"], data["targets"]
        if features.ndim != 2:
            raise ValueError(f"detector {self.name!r}: fit features must be (N, D), got {tuple(features.shape)}")
        check_logits(self, logits, features)
        classes, dim, device = self.known_logits(logits[:1]).shape[1], features.shape[1], features.device
        if int(targets.max()) >= classes:
            raise ValueError(f"detector {self.name!r}: fit targets go up to {int(targets.max())}, the logits have "
                             f"{classes} known classes")
        # each pass adds the rows in their order into one accumulator (index_add_ runs over the rows in order):
        # the sums, and so every fitted value, do not depend on the chunk size. A row the model misclassifies is
        # added as zeros under its target (x + 0.0 = x exactly): no compacted copy of the chunk
        work = Workspace(features, device)
        sums = torch.zeros(classes, dim, dtype=torch.float64, device=device)
        counts = torch.zeros(classes, dtype=torch.long, device=device)
        for x, z, y in row_chunks(features, logits, targets, rows=work.rows):
            correct, wrong, labels = self._split(z, y, device)
            sums.index_add_(0, labels, work.load(x).index_fill_(0, wrong, 0.0))
            counts += torch.bincount(labels[correct], minlength=classes)
        few = (counts < MIN_SAMPLES).nonzero().flatten().tolist()
        if few:
            raise ValueError(f"detector {self.name!r}: class {few[0]} has {int(counts[few[0]])} correctly predicted "
                             f"fit samples (classes with fewer than {MIN_SAMPLES}: {few[:10]}"
                             f"{' ...' if len(few) > 10 else ''}); GHOST's Gaussian of a class is the mean and "
                             "standard deviation of those")
        means = sums / counts[:, None]
        squares = torch.zeros(classes, dim, dtype=torch.float64, device=device)
        for x, z, y in row_chunks(features, logits, targets, rows=work.rows):
            _, wrong, labels = self._split(z, y, device)
            deviations = work.load(x).sub_(work.gather(means, labels)).index_fill_(0, wrong, 0.0)
            squares.index_add_(0, labels, deviations.mul_(deviations))
        stds = (squares / (counts[:, None] - 1)).sqrt()
        stds[stds == 0] = float("inf")  # the authors' rule: a constant dimension adds nothing to the sum
        self.register_buffer("means", means)
        self.register_buffer("stds", stds)
        if not self.gpd:
            self.register_buffer("pareto", torch.zeros(0, 3, dtype=torch.float64, device=device))
            return
        gammas, labels_of = [], []
        for x, z, y in row_chunks(features, logits, targets, rows=work.rows):
            correct, _, labels = self._split(z, y, device)
            top = self.known_logits(z).to(device).gather(1, labels[:, None]).squeeze(1)
            gamma = top / work.deviation_sums(x, labels, means, stds)
            gammas.append(gamma[correct])
            labels_of.append(labels[correct])
        gamma, labels = torch.cat(gammas), torch.cat(labels_of)
        order = torch.argsort(labels, stable=True)  # each class's γ in the fit rows' order
        parts = torch.split(gamma[order], counts.tolist())
        self.register_buffer("pareto", torch.tensor([fit_gpd(part) for part in parts], dtype=torch.float64,
                                                 device=device))

    def _split(self, logits: Tensor, targets: Tensor, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """A fit chunk's mask of correctly classified rows, the indices of the others, and the targets (long)."""
        targets = targets.to(device=device, dtype=torch.long)
        correct = self.known_logits(logits).argmax(dim=1).to(device) == targets
        return correct, (~correct).nonzero().flatten(), targets

    def normalised(self, outputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(γ, ĉ)``: the z-score-normalised maximum logits ``(N,)`` and the predicted classes ``(N,)``."""
        features, logits = outputs["features"], outputs["logits"]
        check_width(features, self.means.shape[1], what=f"detector {self.name!r}: the features",
                    of="its fit features")
        check_logits(self, logits, features, self.means.shape[0])
        device = self.means.device
        work, gammas, predictions = Workspace(features, device), [], []
        for x, z in row_chunks(features, logits, rows=work.rows):
            top, predicted = self.known_logits(z).max(dim=1)
            predicted = predicted.to(device)
            gammas.append(top.to(device) / work.deviation_sums(x, predicted, self.means, self.stds))
            predictions.append(predicted)
        if not gammas:
            empty = features.new_zeros(0, dtype=torch.float64)
            return empty, empty.long()
        return torch.cat(gammas), torch.cat(predictions)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        gamma, predicted = self.normalised(outputs)
        if not self.gpd:
            return gamma
        return gpd_cdf(gamma, self.pareto[predicted]).to(outputs["features"].device)
