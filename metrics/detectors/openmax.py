"""OpenMax: Weibull models of the distances of the activation vectors to their class means.

Bendale, Boult, *Towards Open Set Deep Networks*, CVPR 2016 (the authors' code: github.com/abhijitbendale/OSDN,
``compute_openmax.py``, ``evt_fitting.py``, ``openmax_utils.py``, with libMR's ``FitHigh`` / ``W_score``). The
activation vector (AV) of a sample is its logits ``v`` over the K known classes.

Fit, on the fit samples the model classifies correctly (``argmax v = y``):

    μ_c      = the mean AV of the correctly classified fit samples of class c          (the MAV)
    d(v, μ)  = a·|v - μ|₂ + b·(1 - v·μ / (|v| |μ|))                                    (a, b: the distance weights)
    the tail = the ``tailsize`` largest distances d(v_i, μ_c) of class c's correctly classified samples
    Weibull  = libMR's ``FitHigh``: the maximum-likelihood 2-parameter Weibull (shape κ_c, scale λ_c, location 0)
               of the tail translated by ``10000 - min(tail)``

Score of a sample with AV ``v``: its ``α`` largest logits, classes ``s(1), ..., s(α)`` (descending), are revised
with the weights ``ω_s(r) = (α + 1 - r)/α`` and the Weibull CDF of their distances,

    w_c   = 1 - exp(-((d(v, μ_c) + 10000 - min(tail_c)) / λ_c)^κ_c)        (libMR's ``W_score``)
    v̂_c   = v_c · (1 - ω_c·w_c),     v̂_0 = Σ_c v_c · ω_c·w_c               (ω_c = 0 outside the top α)
    P(unknown | x) = exp(v̂_0) / (exp(v̂_0) + Σ_c exp(v̂_c))
    score(x) = -P(unknown | x)

higher = more in-distribution: the same ranking as the probability of the known classes ``1 - P(unknown)``,
without the rounding of ``1 - p`` that ties every sample whose ``P(unknown)`` is below 10⁻¹⁶ (pytorch-ood's
``OpenMax`` returns ``P(unknown)``, OpenOOD's ``openmax_postprocessor.py`` ``-P(unknown)``). The softmax is taken
with a log-sum-exp (pytorch-ood clips the revised AV at 709 before ``exp``; OpenOOD overflows there). Among equal
logits the lower class index ranks first, as ``argmax`` predicts it (the authors', pytorch-ood's and OpenOOD's
reversed ascending ``argsort`` leaves the order of ties to numpy's sort, which is not stable: its SIMD sort orders
them by the machine). ``α > K`` is ``α = K`` (pytorch-ood's). A zero AV or MAV has the cosine distance 1 (its
norm floored at 10⁻¹²; NaN in pytorch-ood). A background-class model's AV is its known logits.

The Weibull fit is written here: with ``x_i`` the translated tail and ``y_i = x_i / max x``, the shape is the root
of the profile likelihood equation ``Σ y^κ ln y / Σ y^κ - mean(ln y) - 1/κ = 0`` (increasing in κ, a unique root
when the tail holds two distinct values; found by bisection to a relative width of 2⁻⁵², vectorised over the
classes), and ``λ = max x · (mean y^κ)^{1/κ}``. pytorch-ood's port of libMR (``libnotmr.py``) fits the same model
with ``scipy.stats.exponweib.fit(..., floc=0, f0=1)``, a Nelder-Mead search stopped at a relative tolerance of
10⁻⁴: its shapes differ from the maximum-likelihood ones by ~10⁻⁷ relative, more for narrow tails (scipy's own
``weibull_min.fit(floc=0)`` falls short of the maximum too at such shapes, ~10⁶ and above). A class whose tail
holds one distinct value (e.g. one correctly classified sample) has no Weibull fit and is refused, as is a class
without a correctly classified fit sample (and, before the fit pass, a fit set of fewer than two samples a class).

Defaults, the authors' code: ``tailsize = 20`` (``WEIBULL_TAIL_SIZE``), ``alpha = 10`` (``ALPHA_RANK``) and their
``eucos`` distance ``|v - μ|/200 + cosine distance`` (``compute_distance``: ``euclidean_weight = 0.005``,
``cosine_weight = 1``); they average 10 crops' AVs ("channels"), one AV here. pytorch-ood's defaults are tail 25,
α 10, the Euclidean distance (``euclid_weight=1``, i.e. ``euclidean_weight = 1, cosine_weight = 0``); OpenOOD's
(hard-coded in its postprocessor, :mod:`metrics.detectors.presets`) tail 20, α 3, Euclidean.

Reference (``tests/metrics/detectors/test_openmax.py``, logits of 300 × 32 features, ties included): pytorch-ood
0.4.0's ``OpenMax`` (float64; given the correctly classified samples, which it does not select itself) agrees to
2.5·10⁻⁶ relative with the Euclidean distance, the distance of its Nelder-Mead Weibull to the maximum-likelihood
one (with the cosine distance's narrow tails its search stops further off), and to 1.5·10⁻¹¹ relative with the
maximum-likelihood fit (solved there by ``brentq``) in its place; a numpy transcription of the authors' (OSDN) /
OpenOOD's per-sample revision with that fit agrees to 3.5·10⁻¹¹; the Weibull parameters agree with ``brentq``'s
root to 4·10⁻¹⁶ (shapes up to 10⁹). (pytorch-ood's ``predict`` also measures a distance only to the classes some
sample of the same batch predicts, 0 to the others, so its scores depend on the batch; the tests give it batches
that predict every class.)

Memory: fit ``O(K² + K·tailsize + chunk·K)`` in two passes over the logits (the class sums, then the distances
merged into each class's running tail); score ``O(K² + chunk·α·K)``, chunk = ``min(CHUNK_ROWS, CHUNK_ELEMENTS /
(α·K))`` rows (the MAVs of each row's top α classes, ``chunk × α × K`` float64: 256 MiB). Measured (CPU, float32
logits, K = 1000): the fit peaks 523 MiB above the logits at N = 200,000 and 521 MiB at N = 400,000; scoring 719 MiB
above the fitted state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metrics.detectors.base import (
    Detector,
    check_non_negative,
    check_positive_int,
    chunk_rows,
    row_chunks,
)
from metrics.detectors.registry import register_detector

TRANSLATION = 10000.0
"""libMR's ``translate_amount``: the tail is fitted as ``d + 10000 - min(tail)``."""

NORM_FLOOR = 1e-12
"""The floor of the norms in the cosine distance: a zero vector has the cosine distance 1."""

BISECTION_STEPS = 200
"""An upper bound of the bisection's steps; it stops when the bracket's ratio is within 2⁻⁵² of 1 (~60 steps)."""


def weibull_fit_high(tails: Tensor, sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """libMR's ``FitHigh`` of each row's tail: the maximum-likelihood Weibull (location 0) of ``tail + 10000 -
    min(tail)``.

    Args:
        tails: ``(K, T)`` float64, row c's first ``sizes[c]`` entries the tail of class c (any order), the rest
            ignored.
        sizes: ``(K,)`` the tail sizes, each >= 1.

    Returns:
        ``(shape, scale, tail_min)``, each ``(K,)`` float64; a row whose tail holds one distinct value has no fit:
        NaN shape and scale (the caller refuses it).
    """
    width = tails.shape[1]
    valid = torch.arange(width, device=tails.device)[None, :] < sizes[:, None]
    tail_min = torch.where(valid, tails, torch.inf).amin(dim=1)
    translated = torch.where(valid, tails + TRANSLATION - tail_min[:, None], 1.0)
    largest = torch.where(valid, translated, -torch.inf).amax(dim=1)
    log_y = torch.where(valid, torch.log1p((translated - largest[:, None]) / largest[:, None]), 0.0)  # <= 0
    count = sizes.to(torch.float64)
    spread = -log_y.sum(dim=1) / count  # -mean(ln y) > 0 unless the tail is one value
    fitted = spread > 0
    spread = torch.where(fitted, spread, 1.0)

    def equation(shape: Tensor) -> tuple[Tensor, Tensor]:
        weights = torch.where(valid, torch.exp(shape[:, None] * log_y), 0.0)  # y^κ, the largest is 1
        total = weights.sum(dim=1)
        return (weights * log_y).sum(dim=1) / total + spread - 1 / shape, total

    low = 1 / spread  # the weighted mean of ln y is <= 0: the equation is <= 0 here
    high = 2 * low
    for _ in range(1100):  # doubled until the equation is positive (a few steps; 1100 reach float64's largest)
        below = (equation(high)[0] <= 0) & fitted
        if not bool(below.any()):
            break
        low, high = torch.where(below, high, low), torch.where(below, 2 * high, high)
    for _ in range(BISECTION_STEPS):
        middle = torch.sqrt(low * high)
        below = equation(middle)[0] <= 0
        low, high = torch.where(below, middle, low), torch.where(below, high, middle)
        if bool((high / low <= 1 + 2 ** -52).all()):
            break
    shape = (low + high) / 2
    _, total = equation(shape)
    scale = largest * torch.exp(torch.log(total / count) / shape)
    nan = torch.full_like(shape, math.nan)
    return torch.where(fitted, shape, nan), torch.where(fitted, scale, nan), tail_min


def weibull_cdf(distances: Tensor, shape: Tensor, scale: Tensor, tail_min: Tensor) -> Tensor:
    """libMR's ``W_score`` after ``FitHigh``: ``1 - exp(-((d + 10000 - min(tail)) / λ)^κ)``, 0 below the support."""
    translated = distances + TRANSLATION - tail_min
    power = torch.exp(shape * torch.log1p((translated - scale) / scale).nan_to_num(nan=-torch.inf))
    return torch.where(translated > 0, -torch.expm1(-power), 0.0)


@register_detector
class OpenMax(Detector):
    """OpenMax score, ``-P(unknown)`` of the revised activation vector (see the module docstring).

    Hyperparameters:
        tailsize: the largest distances per class the Weibull is fitted to (default 20, the authors').
        alpha: the top classes revised, ``α`` (default 10, the authors').
        euclidean_weight: ``a``, the weight of the Euclidean distance (default 1/200, the authors' ``eucos``).
        cosine_weight: ``b``, the weight of the cosine distance (default 1, the authors' ``eucos``).

    Buffers (float64): ``class_means`` ``(K, K)`` the MAVs; ``weibull_shape``, ``weibull_scale``, ``tail_min``
    ``(K,)``, each class's Weibull and the smallest distance of its tail.
    """

    name = "openmax"
    paper = "Bendale & Boult, CVPR 2016"
    inputs = frozenset({"logits"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("class_means", "weibull_shape", "weibull_scale", "tail_min")

    def __init__(self, *, tailsize: int = 20, alpha: int = 10, euclidean_weight: float = 0.005,
                 cosine_weight: float = 1.0, background: bool = False) -> None:
        super().__init__(background=background)
        self.tailsize = check_positive_int("tailsize", tailsize, detector=self.name)
        if self.tailsize < 2:
            raise ValueError(f"detector {self.name!r}: tailsize must be an integer >= 2 (a Weibull fit needs two "
                             f"distances), got {tailsize!r}")
        self.alpha = check_positive_int("alpha", alpha, detector=self.name)
        self.euclidean_weight = check_non_negative("euclidean_weight", euclidean_weight, detector=self.name)
        self.cosine_weight = check_non_negative("cosine_weight", cosine_weight, detector=self.name)
        if self.euclidean_weight == 0 and self.cosine_weight == 0:
            raise ValueError(f"detector {self.name!r}: euclidean_weight and cosine_weight are both 0: no distance")

    def check_fit_size(self, samples: int, classes: int) -> None:
        if samples < 2 * classes:  # before the fit pass: each class's Weibull needs two distinct distances
            raise ValueError(f"detector {self.name!r}: {samples} fit samples of {classes} classes; each class's "
                             "Weibull fit needs at least two correctly classified samples; fit on more samples")

    def distance(self, vectors: Tensor, means: Tensor) -> Tensor:
        """``a·|v - μ| + b·(1 - v·μ/(|v| |μ|))`` over the last dimension, float64 (broadcasting)."""
        result = torch.zeros(torch.broadcast_shapes(vectors.shape, means.shape)[:-1], dtype=torch.float64,
                             device=vectors.device)
        if self.euclidean_weight:
            result = result + self.euclidean_weight * torch.linalg.vector_norm(vectors - means, dim=-1)
        if self.cosine_weight:
            norms = (torch.linalg.vector_norm(vectors, dim=-1).clamp(min=NORM_FLOOR)
                     * torch.linalg.vector_norm(means, dim=-1).clamp(min=NORM_FLOOR))
            result = result + self.cosine_weight * (1 - (vectors * means).sum(dim=-1) / norms)
        return result

    def _fit(self, data: dict[str, Tensor]) -> None:
        logits, targets = data["logits"], data["targets"]
        if logits.ndim != 2:
            raise ValueError(f"detector {self.name!r}: fit logits must be (N, C), got {tuple(logits.shape)}")
        classes = self.known_logits(logits[:1]).shape[1]
        if int(targets.max()) >= classes:
            raise ValueError(f"detector {self.name!r}: fit targets go up to {int(targets.max())}, the logits have "
                             f"{classes} known classes")
        device = logits.device
        rows = chunk_rows(classes)

        def correct_chunks():
            for z, y in row_chunks(logits, targets, rows=rows):
                z, y = self.known_logits(z), y.to(device=device, dtype=torch.long)
                right = z.argmax(dim=1) == y
                yield z[right], y[right]

        sums = torch.zeros(classes, classes, dtype=torch.float64, device=device)
        counts = torch.zeros(classes, dtype=torch.long, device=device)
        for z, y in correct_chunks():
            sums.index_add_(0, y, z)
            counts += torch.bincount(y, minlength=classes)
        empty = (counts == 0).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"detector {self.name!r}: class {empty[0]} has no correctly classified fit sample "
                             f"(classes without one: {empty[:10]}{' ...' if len(empty) > 10 else ''}); OpenMax's mean "
                             "activation vector of a class is the mean of those")
        means = sums / counts[:, None].to(torch.float64)
        tails = torch.full((classes, self.tailsize), -torch.inf, dtype=torch.float64, device=device)
        for z, y in correct_chunks():
            tails = _merge_tails(tails, self.distance(z, means[y]), y)
        shape, scale, tail_min = weibull_fit_high(tails, counts.clamp(max=self.tailsize))
        degenerate = torch.isnan(shape).nonzero().flatten().tolist()
        if degenerate:
            raise ValueError(f"detector {self.name!r}: the tail of class {degenerate[0]}'s distances holds a single "
                             f"distinct value (classes with such a tail: {degenerate[:10]}"
                             f"{' ...' if len(degenerate) > 10 else ''}; class {degenerate[0]} has "
                             f"{int(counts[degenerate[0]])} correctly classified fit samples): no Weibull fit; fit on "
                             "more samples")
        self.register_buffer("class_means", means)
        self.register_buffer("weibull_shape", shape)
        self.register_buffer("weibull_scale", scale)
        self.register_buffer("tail_min", tail_min)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        logits = outputs["logits"]
        classes = self.class_means.shape[0]
        self.check_known_width(logits, classes)
        alpha = min(self.alpha, classes)
        weights = torch.tensor([(alpha + 1 - r) / alpha for r in range(1, alpha + 1)], dtype=torch.float64,
                               device=self.class_means.device)
        scores = []
        for (chunk,) in row_chunks(logits, rows=chunk_rows(alpha * classes)):
            v = self.known_logits(chunk)
            # the α largest, descending; equal logits: the lower index first (argmax's)
            top = torch.sort(v, dim=1, descending=True, stable=True).indices[:, :alpha]
            distances = self.distance(v[:, None, :], self.class_means[top])
            revision = weights * weibull_cdf(distances, self.weibull_shape[top], self.weibull_scale[top],
                                             self.tail_min[top])
            top_logits = v.gather(1, top)
            revised = v.scatter(1, top, top_logits * (1 - revision))
            unknown = (top_logits * revision).sum(dim=1, keepdim=True)
            log_total = torch.logsumexp(torch.cat([unknown, revised], dim=1), dim=1)
            scores.append(-torch.exp(unknown[:, 0] - log_total))
        return torch.cat(scores) if scores else logits.new_zeros(0, dtype=torch.float64)


def _merge_tails(tails: Tensor, distances: Tensor, classes: Tensor) -> Tensor:
    """Each class's ``T`` largest values of its running tail ``(K, T)`` (``-inf`` where unfilled) and the new
    ``distances`` of the classes ``classes``: one sort by value, then a stable one by class."""
    count, width = tails.shape
    values = torch.cat([tails.reshape(-1), distances])
    owners = torch.cat([torch.arange(count, device=tails.device).repeat_interleave(width), classes])
    order = torch.sort(values, descending=True, stable=True).indices
    order = order[torch.sort(owners[order], stable=True).indices]
    owners, values = owners[order], values[order]
    sizes = torch.bincount(owners, minlength=count)
    rank = torch.arange(owners.numel(), device=tails.device) - (sizes.cumsum(0) - sizes)[owners]
    kept = rank < width
    merged = torch.full_like(tails, -torch.inf)
    merged[owners[kept], rank[kept]] = values[kept]
    return merged
