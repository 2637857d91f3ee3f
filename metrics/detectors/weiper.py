"""WeiPer: the class projections of the head perturbed at random, their softmax and the densities they spread.

Granz, Heurich, Landgraf, *WeiPer: OOD Detection using Weight Perturbations of Class Projections*, NeurIPS 2024, as
the authors' code computes it (github.com/mgranz/weiper, ``Weiper/OpenOOD/openood/postprocessors/weiper_kldiv/
utils.py``: ``calculate_weiper_space``, ``batch_histogram``, ``UniformKernel``, ``kldiv``,
``calculate_WeiPerKLDiv_score``; ``weiper_kldiv_postprocessor.py``: the fit). With the head ``logits = z Wᵀ + b``
(``W`` ``(K, D)``, rows ``w_c``) and ``r·K`` Gaussian directions ``η_{j,c} ~ N(0, I_D)``:

    w̃_{j,c}  = w_c + δ ‖w_c‖ η_{j,c} / ‖η_{j,c}‖       j = 1..r: r perturbed heads W̃_j, the same bias b
    ℓ_j(z)   = z W̃_jᵀ + b                             the j-th perturbed logits (K,)
    MSP_W(z) = (1/r) Σ_j max_c softmax(ℓ_j(z))_c

    weiper       MSP_W(z), the mean maximum softmax of the r perturbed heads
    weiper_kld   λ₂ MSP_W(z) - SKL(p, q(z)) - λ₁ SKL(p_W, q_W(z)), densities of the features and perturbed logits

WeiPer+KLD compares two densities of a sample with their mean over the fit samples. A sample's density ``h`` of
values ``v`` (its D features, or its r·K perturbed logits) is the share of them in each of ``n_bins`` equal bins
``[e_k, e_{k+1})`` spanning the fit set (the authors' ``linspace(min, max + 1e-8, n_bins + 1)`` over every fit
feature resp. every perturbed fit logit; values outside are dropped, not renormalised), and

    q(z)      = S_{s₁}(h_features(z)),   q_W(z) = S_{s₂}(h_logits(z))    S_s: the mean over s neighbouring bins
    p, p_W    = the mean of h_features resp. h_logits over the fit samples (not smoothed)
    SKL(p, q) = KL(p̂‖q̂) + KL(q̂‖p̂) = Σ_k (q̂_k - p̂_k)(log q̂_k - log p̂_k),   x̂ = (x + ε) / Σ_k (x_k + ε)

with ``ε₁`` for the features and ``ε₂`` for the logits. ``S_s`` is the authors' ``UniformKernel``: a
``Conv1d(padding="same", padding_mode="replicate")`` of ``s`` weights ``1/s``, so ``(s - 1) // 2`` bins on the
left and ``s - 1 - (s - 1) // 2`` on the right, the edge bins repeated. Higher = more in-distribution (the
authors return the same score: ``-(SKL + λ₁ SKL_W - λ₂ MSP_W)``).

Defaults: the authors' ImageNet-1K ResNet-50 values (the table of their README, github.com/mgranz/weiper
``Weiper/README.md``: ``n_repeats`` 100 = r, ``perturbation_distance`` 2.4 = δ, ``n_bins`` 100, ``lambda_1`` 2.5,
``lambda_2`` 0.25, ``smoothing`` 40 = s₁, ``smoothing_perturbed`` 15 = s₂; their config file
``configs/postprocessors/weiper_kldiv.yml`` holds the CIFAR-10 ones: δ 1.8, λ₂ 0.1, s₁ 4); ε₁ = 0.01 and ε₂ = 0.025
are ``calculate_WeiPerKLDiv_score``'s ``epsilon`` and ``epsilon_noise`` (no config sets them). ``weiper`` (MSP_W
alone, no fit data) takes the same r and δ: the authors publish no separate values for it.
``weiper_kld``'s fit set defaults to 300 images per class (``default_fit``): the authors fit ImageNet on a shuffled,
class-balanced 300,000 of its training images (``n_samples_for_setup: 300000``, ``imglist_generator.py``).

The directions are drawn from ``torch.Generator().manual_seed(seed)`` (``torch.randn`` of ``(r, K, D)`` in
float32, as the authors' ``randn_like`` of a float32 head) when the head is given, for the K known rows, and kept as
the buffer ``directions``: a state_dict holds them, so a loaded detector scores as the fitted one did. The authors
draw from the global generator (their runs' seed), so the directions, and the scores, are the same in law, not in
value.

Differences from the authors' code, each deliberate: the fit in float64 (their float32 rounds ``max + 1e-8`` back to
the maximum above |max| ≈ 0.17, so their histograms drop the fit set's largest value; here it stays in the last
bin), scoring in float64 but for the perturbed heads' product, in the features' precision (float32 for float32
features: the heads built in float64 and cast, the logits cast back for the softmax and the histograms; a float32
logit within float32 rounding of a bin edge may fall in the neighbouring bin: :mod:`metrics.detectors.base`,
*Precision*); the fit densities are the mean over the fit samples (theirs: the mean of per-batch means, the same for equal
batches); a background-class model's head is cut to its K known rows (directions, MSP_W, the logit densities).
Reference: ``tests/metrics/detectors/test_weiper.py`` transcribes the authors' functions (unchunked, float64, the
same directions, features with and without ties): the largest difference measured is 4.5e-16 relative for
``weiper`` and 8.9e-16 absolute for ``weiper_kld`` (1.7e-14 relative, on a score of 3.3e-3).

Memory: ``directions`` r·K·D float32 (819 MB at r = 100, K = 1000, D = 2048); g perturbed heads (g·K·D float64,
:data:`HEAD_ELEMENTS`: 32 MiB, and two temporaries of that size) at a time; per chunk ``O(rows·(D + g·K))``
(features, g heads' logits, their bin indices, the per-sample counts ``rows × n_bins``), rows = ``CHUNK_ELEMENTS /
(3 (D + g·K))`` (2763 at D = 2048, K = 1000, g = 2). Measured (peak RSS, glibc's mmap threshold fixed at 128 KiB,
6000 fit rows of D = 2048, K = 1000): 0.44 GB of temporaries in the fit and in scoring, so about 1.3 GB above the
features with the directions at r = 100, whatever N: within 2 GiB for 1,281,167 × 2048 fit features of 1000 classes.
The fit makes two passes (the extremes, then the bin counts), keeping only the ``n_bins`` totals; each pass
multiplies the fit features by all r heads (2·N·r·K·D flops: 5·10¹⁴ for full ImageNet, hence the 300-per-class
default cap).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from metrics.detectors.base import (
    Detector,
    check_non_negative,
    check_positive_int,
    check_width,
    chunk_rows,
    product_dtype,
    row_chunks,
)
from metrics.detectors.registry import register_detector

EDGE_MARGIN = 1e-8
"""The authors' ``max + 1e-8``: the last bin's upper edge, just above the fit set's largest value."""

NORM_FLOOR = 1e-12
"""``F.normalize``'s floor of a direction's norm."""

HEAD_ELEMENTS = 1 << 22
"""Elements of the perturbed heads built at once (32 MiB float64): g = ``max(1, HEAD_ELEMENTS // (K·D))`` heads
(2 at K = 1000, D = 2048; all r of a small head), scored by one matrix product."""

TEMPORARIES = 3
"""Per-row temporaries of a chunk, in units of ``D + g·K`` elements (rows = ``CHUNK_ELEMENTS / (3 (D + g·K))``)."""


def check_seed(value: object, *, detector: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 63:
        raise ValueError(f"detector {detector!r}: seed must be an integer in [0, 2**63), got {value!r}")
    return int(value)


def draw_directions(repeats: int, classes: int, dim: int, seed: int) -> Tensor:
    """``(r, K, D)`` float32 standard normal draws of a CPU generator seeded with ``seed``."""
    return torch.randn((repeats, classes, dim), generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def histogram_edges(low: Tensor, high: Tensor, bins: int) -> Tensor:
    """``bins + 1`` equal edges from ``low`` to ``high + 1e-8``, float64: the authors' ``linspace`` (``start +
    (k / bins)·(stop - start)``)."""
    low = low.to(torch.float64)
    stop = high.to(torch.float64) + EDGE_MARGIN
    steps = torch.arange(bins + 1, dtype=torch.float64, device=low.device) / bins
    return low + steps * (stop - low)


def bin_index(values: Tensor, edges: Tensor) -> tuple[Tensor, Tensor]:
    """The bin ``k`` of each value (``e_k <= v < e_{k+1}``) and whether it lies inside the edges at all."""
    index = torch.bucketize(values, edges, right=True) - 1
    return index, (index >= 0) & (index < edges.numel() - 1)


def bin_totals(values: Tensor, edges: Tensor) -> Tensor:
    """``(n_bins,)`` int64: how many of all ``values`` fall in each bin."""
    index, inside = bin_index(values, edges)
    return torch.bincount(index[inside], minlength=edges.numel() - 1)


def histogram_counts(values: Tensor, edges: Tensor) -> Tensor:
    """``(rows, n_bins)`` int64: how many of each row's values fall in each bin."""
    rows, bins = values.shape[0], edges.numel() - 1
    index, inside = bin_index(values, edges)
    flat = (index + bins * torch.arange(rows, device=values.device)[:, None])[inside]
    return torch.bincount(flat, minlength=rows * bins).reshape(rows, bins)


def smooth(density: Tensor, size: int) -> Tensor:
    """The mean over ``size`` neighbouring bins of each row, the edge bins repeated: the authors' ``UniformKernel``
    (``Conv1d(padding="same", padding_mode="replicate")``: ``(size - 1) // 2`` bins on the left)."""
    left = (size - 1) // 2
    padded = F.pad(density[:, None, :], (left, size - 1 - left), mode="replicate")[:, 0]
    return padded.unfold(1, size, 1).sum(dim=2) / size


def symmetric_kl(fit: Tensor, densities: Tensor, epsilon: float) -> Tensor:
    """``KL(p̂‖q̂) + KL(q̂‖p̂)`` of the fit density ``p`` ``(n_bins,)`` and each row ``q`` of ``densities``, both
    offset by ``epsilon`` and normalised (the authors' ``kldiv(..., symmetric=True)``)."""
    p = fit + epsilon
    p = p / p.sum()
    q = densities + epsilon
    q = q / q.sum(dim=1, keepdim=True)
    log_ratio = q.log() - p.log()
    return -(p * log_ratio).sum(dim=1) - (q * -log_ratio).sum(dim=1)


@register_detector
class WeiPer(Detector):
    """WeiPer's MSP_W: the mean maximum softmax of r randomly perturbed heads (see the module docstring).

    Hyperparameters:
        r: the number of perturbed heads (default 100).
        delta: δ, a perturbation's length relative to its class projection's (default 2.4).
        seed: the seed of the directions' generator (default 0).

    Buffers: the head (float64) and ``directions`` ``(r, K, D)`` float32, the directions' draws.
    """

    name = "weiper"
    paper = "Granz et al., NeurIPS 2024"
    inputs = frozenset({"features", "head"})
    refuse_non_finite = True
    fitted_buffers: tuple[str, ...] = ("directions",)

    def __init__(self, *, r: int = 100, delta: float = 2.4, seed: int = 0, background: bool = False) -> None:
        super().__init__(background=background)
        self.r = check_positive_int("r", r, detector=self.name)
        self.delta = check_non_negative("delta", delta, detector=self.name)
        self.seed = check_seed(seed, detector=self.name)

    def _store_head(self, weight: Tensor, bias: Tensor | None) -> None:
        super()._store_head(weight, bias)
        classes = weight.shape[0] - 1 if self.background else weight.shape[0]
        directions = draw_directions(self.r, classes, weight.shape[1], self.seed)
        self.register_buffer("directions", directions.to(self.head_weight.device))

    def _known_head(self) -> tuple[Tensor, Tensor]:
        weight, bias = self.head_weight, self.head_bias
        return (weight[:-1], bias[:-1]) if self.background else (weight, bias)

    def _group(self) -> int:
        """g, the perturbed heads built and scored at once (:data:`HEAD_ELEMENTS`)."""
        classes, dim = self.directions.shape[1:]
        return max(1, min(self.r, HEAD_ELEMENTS // (classes * dim)))

    def _rows(self) -> int:
        classes, dim = self.directions.shape[1:]
        return chunk_rows(TEMPORARIES * (dim + self._group() * classes))

    def _perturbed_logits(self, features: Tensor, dtype: torch.dtype = torch.float64) -> Iterator[Tensor]:
        """``ℓ_j(z)`` of g heads at a time, ``(rows, g, K)`` float64, for j = 1..r: the heads built in float64, their
        product with the features in ``dtype`` (scoring: the features' precision; the fit: float64)."""
        weight, bias = self._known_head()
        features = features.to(dtype)
        norms = weight.norm(dim=1, keepdim=True)
        group = self._group()
        for start in range(0, self.r, group):
            directions = self.directions[start:start + group].to(torch.float64)  # (g, K, D)
            unit = directions / directions.norm(dim=2, keepdim=True).clamp(min=NORM_FLOOR)
            heads = (weight + self.delta * unit * norms).reshape(-1, weight.shape[1])  # the g heads' rows, (g·K, D)
            logits = torch.addmm(bias.repeat(directions.shape[0]).to(dtype), features, heads.to(dtype).T)
            yield logits.to(torch.float64).reshape(features.shape[0], directions.shape[0], weight.shape[0])

    def _checked(self, features: Tensor, what: str) -> None:
        check_width(features, self.directions.shape[2], what=f"detector {self.name!r}: {what}",
                    of="the head's weight")

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        self._checked(features, "the features")
        scores = []
        for (chunk,) in row_chunks(features, rows=self._rows()):
            msp = torch.zeros(chunk.shape[0], dtype=torch.float64, device=chunk.device)
            for logits in self._perturbed_logits(chunk, product_dtype(chunk)):
                msp += torch.softmax(logits, dim=2).amax(dim=2).sum(dim=1)
            scores.append(msp / self.r)
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)


@register_detector
class WeiPerKLD(WeiPer):
    """WeiPer+KLD: ``λ₂ MSP_W - SKL(p, q) - λ₁ SKL(p_W, q_W)`` (see the module docstring).

    Hyperparameters (besides :class:`WeiPer`'s r, δ and seed):
        n_bins: the histograms' bins (default 100).
        lambda_1: λ₁, the weight of the perturbed logits' divergence (default 2.5).
        lambda_2: λ₂, the weight of MSP_W (default 0.25).
        s_1: the features' smoothing window in bins (default 40).
        s_2: the perturbed logits' smoothing window in bins (default 15).
        epsilon_1, epsilon_2: the offsets added to every bin of the features' and the logits' densities before
            normalising (defaults 0.01 and 0.025).

    Buffers (float64 but ``directions``): the head, ``directions``, ``feature_edges`` and ``logit_edges``
    ``(n_bins + 1,)``, ``feature_density`` and ``logit_density`` ``(n_bins,)`` (the fit means ``p`` and ``p_W``).
    """

    name = "weiper_kld"
    fit_data = True
    default_fit = {"per_class": 300}
    fitted_buffers = ("directions", "feature_edges", "logit_edges", "feature_density", "logit_density")

    def __init__(self, *, r: int = 100, delta: float = 2.4, n_bins: int = 100, lambda_1: float = 2.5,
                 lambda_2: float = 0.25, s_1: int = 40, s_2: int = 15, epsilon_1: float = 0.01,
                 epsilon_2: float = 0.025, seed: int = 0, background: bool = False) -> None:
        super().__init__(r=r, delta=delta, seed=seed, background=background)
        self.n_bins = check_positive_int("n_bins", n_bins, detector=self.name)
        self.lambda_1 = check_non_negative("lambda_1", lambda_1, detector=self.name)
        self.lambda_2 = check_non_negative("lambda_2", lambda_2, detector=self.name)
        self.s_1 = check_positive_int("s_1", s_1, detector=self.name)
        self.s_2 = check_positive_int("s_2", s_2, detector=self.name)
        self.epsilon_1 = check_non_negative("epsilon_1", epsilon_1, detector=self.name, positive=True)
        self.epsilon_2 = check_non_negative("epsilon_2", epsilon_2, detector=self.name, positive=True)

    def _fit(self, data: dict[str, Tensor]) -> None:
        features = data["features"]
        self._checked(features, "the fit features")
        rows, device = self._rows(), features.device
        extremes: dict[str, list[Tensor]] = {"features": [], "logits": []}
        for (chunk,) in row_chunks(features, rows=rows):  # pass 1: the extremes, over every value
            x = chunk.to(torch.float64)
            extremes["features"].append(torch.stack(torch.aminmax(x)))
            for logits in self._perturbed_logits(x):
                extremes["logits"].append(torch.stack(torch.aminmax(logits)))
        edges = {}
        for key, pairs in extremes.items():
            stacked = torch.stack(pairs)
            edges[key] = histogram_edges(stacked[:, 0].min(), stacked[:, 1].max(), self.n_bins)
        totals = {key: torch.zeros(self.n_bins, dtype=torch.long, device=device) for key in edges}
        for (chunk,) in row_chunks(features, rows=rows):  # pass 2: the bin counts of every value
            x = chunk.to(torch.float64)
            totals["features"] += bin_totals(x, edges["features"])
            for logits in self._perturbed_logits(x):
                totals["logits"] += bin_totals(logits, edges["logits"])
        samples, (classes, dim) = features.shape[0], self.directions.shape[1:]
        self.register_buffer("feature_edges", edges["features"])
        self.register_buffer("logit_edges", edges["logits"])
        # the mean over the fit samples of each one's shares: every sample has D features and r·K perturbed logits
        self.register_buffer("feature_density", totals["features"].to(torch.float64) / (samples * dim))
        self.register_buffer("logit_density", totals["logits"].to(torch.float64) / (samples * self.r * classes))

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        self._checked(features, "the features")
        classes = self.directions.shape[1]
        scores = []
        for (chunk,) in row_chunks(features, rows=self._rows()):
            x = chunk.to(torch.float64)
            feature_shares = histogram_counts(x, self.feature_edges).to(torch.float64) / x.shape[1]
            counts = torch.zeros(x.shape[0], self.n_bins, dtype=torch.long, device=x.device)
            msp = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
            for logits in self._perturbed_logits(chunk, product_dtype(chunk)):
                msp += torch.softmax(logits, dim=2).amax(dim=2).sum(dim=1)
                counts += histogram_counts(logits.reshape(x.shape[0], -1), self.logit_edges)
            logit_shares = counts.to(torch.float64) / (self.r * classes)
            divergence = symmetric_kl(self.feature_density, smooth(feature_shares, self.s_1), self.epsilon_1)
            divergence_perturbed = symmetric_kl(self.logit_density, smooth(logit_shares, self.s_2), self.epsilon_2)
            scores.append(-(divergence + self.lambda_1 * divergence_perturbed - self.lambda_2 * (msp / self.r)))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
