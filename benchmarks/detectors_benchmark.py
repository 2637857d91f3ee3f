"""Every fitted detector at ImageNet scale: fit and score time and peak memory of ours (``metrics.detectors``)
against pytorch-ood 0.4.0 on the same synthetic 2048-d float32 features, side by side in one process, beside one
matrix product of the same shapes where the detector is one.

The cases: every registered detector that fits or reads the head (``DETECTORS``, ``needs_fit``) and GradNorm
(no fit: scoring only), but

- AdaSCALE-A and -L and NAC-UE (kind ``model``): their fit and scoring run a forward and backward pass of the model
  over images, not features;
- ``knn`` (k = 50 on the whole fit set, the paper's CIFAR setting): its bank is the fit set, ``N × D`` float64
  (20 GiB at 1.28M) by design; ``knn_imagenet`` (1%) is its ImageNet form.

Ours fits on N = 1.28M samples of K = 1000 classes (ImageNet's training set) or on the detector's own default
cap of them (``default_fit``: KNN and NNGuide 1%, WeiPer+KLD 300 per class) and scores 50k ID + 100k OOD samples.
WeiPer multiplies every row by r = 100 perturbed heads (``2·r·K·D`` flops a row: 2·10⁸), so its scoring is timed
on ``--weiper-rows`` rows and WeiPer+KLD's fit on ``--weiper-fit`` samples per class, both extrapolated linearly.

pytorch-ood, where it has the detector, fits on the same features: on all N where its fit's memory, estimated
from its code before it runs (:attr:`Pood.fit_bytes`), fits ``--pood-memory`` GiB (and the memory the machine
has free), else on the first ``N / 2ʲ`` rows that fit (the row says why); ours then also fits on those rows, so
that time and scores compare on the same fit. It scores the 150k samples in batches (``--pood-batch`` rows, as
a data loader feeds it), or, where its scoring is a loop over the classes, a per-sample backward or a per-sample
Python loop, on a subset timed and extrapolated linearly (``--pood-score-rows``, ``--pood-subset``). Its fDBD
fit forms the ``K × K × D`` differences of the head's rows (7.6 GiB at K = 1000, whatever N): over the budget, its
scoring is timed with the same denominators computed by ``torch.cdist``.

The difference of the scores: max |ours + pytorch-ood| / max |pytorch-ood| (pytorch-ood's scores are outlier
scores, ours their negation, on the same scale for each of these detectors), on the rows pytorch-ood scored,
ours fitted on the same rows as pytorch-ood. ViM: against pytorch-ood run in float64, ours scoring the features as
float64 (pytorch-ood's float32 eigenvectors mix the subspaces where the synthetic spectrum has no gap). OpenMax: Spearman's rank correlation (pytorch-ood
fits its Weibull models by a Nelder-Mead search stopping at 1e-4 and weights the distances ``(w, 1 - w)``, ours
by maximum likelihood with the paper's ``(1/200, 1)``). VRA: none (pytorch-ood clips every feature dimension at
its own percentiles, another detector for D > 1).

The reference "one matrix product of the same shapes": for a fit the Gram matrix ``XᵀX`` of the fit features
(timed on 65536 rows, extrapolated linearly), for scoring ``(150k × 2048)(2048 × 2048)`` (the Mahalanobis family,
ViM) and ``(150k × 2048)(2048 × bank)`` (KNN, NNGuide), in float64 and in float32: ours fits in float64 and scores
these float32 features with float32 products (ViM, NNGuide; KNN and the Mahalanobis family in float64: their
distances cancel), pytorch-ood computes in float32. Peak memory (``openset_common.resources.measure``): the resident set above the one before the
case, sampled every 5 ms, with glibc's mmap threshold fixed (:func:`fix_mmap_threshold`) so that it follows the
live memory (on a GPU, ``--device cuda``: the CUDA allocator's peak above its start).

All the cases take over an hour on 2 CPU cores: ``--only a,b,c`` runs a part, and ``--only ... --write`` puts its
rows in place of those detectors' rows in RESULTS.md, keeping the others with the run that measured them (each
run is listed, with its date and load; the table's first column names it). ``--phase fit`` or ``--phase score``
measures one phase (and, with ``--write``, replaces only that phase's rows): a scoring-only run fits ours once,
untimed, on the rows pytorch-ood fits on (those whose scores are compared), pytorch-ood on the same rows, and
reports the scoring rows alone; a fit-only run reports the fit rows and scores nothing.

Goal (issue 35): ours within 2 GiB above the features in every case, and no slower than pytorch-ood where it ran
on the same rows.

    python -m benchmarks.detectors_benchmark [--tiny] [--write] [--only mahalanobis,vim] [--phase both] [--device cpu]
        [--fit 1280000] [--knn-fit 12800] [--id 50000] [--ood 100000] [--classes 1000] [--dim 2048]
        [--pood-memory 6] [--pood-batch 16384] [--pood-score-rows 256] [--pood-subset 1024]
        [--weiper-fit 4] [--weiper-rows 2048]
"""

from __future__ import annotations

import ctypes
import datetime
import gc
import math
import re
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn

from benchmarks.common import benchmark_parser, finish, generated_block, load_average, machine, parse, table
from metrics.detectors import DETECTORS, build_detector
from metrics.detectors.vim import principal_dimension
from openset_common.resources import Measured, hardware, measure

SECTION = "Fitted detectors at ImageNet scale"
GOAL_BYTES = 2 * 2**30  # ours: peak memory above the features
GENERATION_ROWS = 16384
AGREEMENT = 1e-2  # ours against pytorch-ood (float32): a bug shows far above its rounding
RANK_AGREEMENT = 0.95  # Spearman's ρ where only the ranks compare (OpenMax: measured 0.989 on 64k fit samples)
RESERVE = 2 * 2**30  # memory left to the rest of the machine when pytorch-ood's fit size is chosen
PHASES = ("both", "fit", "score")
"""``--phase``: what a run measures, the fits and the scoring (default), or one of them."""
SKIPPED = {
    "adascale_a": "kind model: its fit and scoring run a perturbed forward and backward pass over images",
    "adascale_l": "kind model: its fit and scoring run a perturbed forward and backward pass over images",
    "nac": "kind model: its fit and scoring read the layers' states of a forward and backward pass over images "
           "(the fit on 1,000 images; its fit memory is the counts, 5.3 MB for ResNet-50's defaults)",
    "knn": "the paper's CIFAR setting, k = 50 on the whole fit set: its bank is the fit set (N × D float64, "
           "20 GiB at 1.28M) by design; knn_imagenet is the ImageNet form",
}


# --------------------------------------------------------------------------------------------------
# synthetic features


def class_means(classes: int, dim: int, seed: int = 0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(classes, dim, generator=generator) * 1.5


def make_features(n: int, means: Tensor, seed: int, *, shifted: bool = False) -> tuple[Tensor, Tensor]:
    """``n`` float32 rows, ReLU of the class mean plus unit noise (``shifted``: of noise alone), generated
    in chunks into one tensor (no second copy); balanced targets."""
    classes, dim = means.shape
    generator = torch.Generator().manual_seed(seed)
    features = torch.empty(n, dim)
    targets = torch.arange(n) % classes
    for start in range(0, n, GENERATION_ROWS):
        rows = slice(start, min(start + GENERATION_ROWS, n))
        noise = torch.randn(rows.stop - start, dim, generator=generator)
        centre = 0.3 if shifted else means[targets[rows]]
        features[rows] = torch.relu_(noise.add_(centre))
    return features, targets


def make_head(means: Tensor) -> tuple[Tensor, Tensor]:
    """A head that reads the classes off the synthetic features: the centred class means."""
    weight = (means - means.mean(dim=0)) / means.shape[1] ** 0.5
    return weight.contiguous(), torch.zeros(means.shape[0])


def logits_of(features: Tensor, head: tuple[Tensor, Tensor]) -> Tensor:
    """``features @ Wᵀ + b`` in float32, chunk by chunk into one tensor."""
    weight, bias = head
    logits = features.new_empty(features.shape[0], weight.shape[0])
    for start in range(0, features.shape[0], GENERATION_ROWS):
        rows = slice(start, start + GENERATION_ROWS)
        torch.addmm(bias, features[rows], weight.T, out=logits[rows])
    return logits


# --------------------------------------------------------------------------------------------------
# references


def matmul_seconds(left: Tensor, right: Tensor, *, dtype: torch.dtype, rows: int | None = None) -> float:
    """One ``left @ right`` in ``dtype`` (the cast not timed); on the first ``rows`` rows of ``left`` when
    given, extrapolated linearly to all of them."""
    part = left if rows is None or rows >= left.shape[0] else left[:rows]
    a, b = part.to(dtype), right.to(dtype)
    _synchronize(a.device)
    seconds = measure(lambda: _synchronized(a @ b), device=a.device, collect=False).seconds
    return seconds * left.shape[0] / part.shape[0]


def gram_rate(features: Tensor, *, dtype: torch.dtype, rows: int) -> float:
    """Seconds per fit row of ``XᵀX``, timed on ``rows`` rows."""
    part = features[:rows].to(dtype)
    _synchronize(part.device)
    return measure(lambda: _synchronized(part.T @ part), device=part.device, collect=False).seconds / part.shape[0]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _synchronized(value: Tensor) -> Tensor:
    _synchronize(value.device)
    return value


def relative_difference(ours: Tensor, theirs: Tensor) -> float:
    """``max |ours + theirs| / max |theirs|`` (pytorch-ood's score is the outlier score, ours its negation)."""
    ours, theirs = ours.double().cpu(), torch.as_tensor(theirs).double().cpu()
    return float((ours + theirs).abs().max() / theirs.abs().max().clamp(min=1e-300))


def rank_correlation(ours: Tensor, theirs: Tensor) -> float:
    """Spearman's ρ of ours and pytorch-ood's negated scores (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(ours.double().cpu().numpy(), -torch.as_tensor(theirs).double().cpu().numpy()).statistic)


def vim_in_float64(features: Tensor, targets: Tensor, test: Tensor, head: tuple[Tensor, Tensor]) -> float:
    """Ours against pytorch-ood's ViM run in float64 (its ``.float()`` casts made ``.double()``), both fitted on
    ``features`` and scoring ``test`` as float64 (ours then multiplies in float64 too): pytorch-ood's float32
    eigenvectors are what differ, where the spectrum has no gap at d."""
    import pytorch_ood.detector as pood

    weight, bias = (t.double() for t in head)
    ours = build_detector("vim").fit({"features": features, "targets": targets}, head=head).score(
        {"features": test.double()})
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with mock.patch.object(torch.Tensor, "float", torch.Tensor.double):
            theirs = pood.ViM(None, d=principal_dimension(None, features.shape[1]), w=weight, b=bias) \
                .fit_features(features.double(), targets).predict_features(test.double())
    finally:
        torch.set_default_dtype(old)
    return relative_difference(ours, theirs)


# --------------------------------------------------------------------------------------------------
# pytorch-ood, as this project's tests build and feed each of its detectors (tests/metrics/detectors/)


def _maps(features: Tensor) -> Tensor:
    return features[:, :, None, None]


def _head_function(head: tuple[Tensor, Tensor]) -> Callable[[Tensor], Tensor]:
    weight, bias = head
    return lambda maps: maps.flatten(1) @ weight.T + bias


def _linear(head: tuple[Tensor, Tensor]) -> nn.Linear:
    weight, bias = head
    layer = nn.Linear(weight.shape[1], weight.shape[0]).to(weight.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer


def _identity(maps: Tensor) -> Tensor:
    return maps


def _copies(count: float, width: str) -> Callable[[int, int, int], float]:
    """``count`` float32 ``n × D`` (``width="D"``) or ``n × K`` (``"K"``) matrices."""
    return lambda n, d, k: count * 4 * n * (d if width == "D" else k)


@dataclass(frozen=True)
class Pood:
    """How pytorch-ood 0.4.0 runs one detector on the benchmark's float32 features.

    Attributes:
        fit: its fitted detector from the fit data (``features``, ``targets``, ``logits``, ``correct``), the
            head and our detector's hyperparameters.
        score: its outlier scores of a batch of outputs (``features``, ``logits``).
        fit_bytes: its fit's memory above the inputs at ``(n, D, K)``, estimated from its code (``held`` says
            what it holds), before it runs.
        held: what ``fit_bytes`` counts.
        scoring: ``"batches"`` (all rows, ``--pood-batch`` at a time), ``"loop"`` (a loop over the K classes
            per batch: ``--pood-score-rows`` rows, extrapolated) or ``"subset"`` (``--pood-subset`` rows,
            extrapolated).
        batch: rows per call of its scoring (default ``--pood-batch``).
        why: why it scores a subset.
        compare: ``"scores"`` (max relative difference), ``"ranks"`` (Spearman's ρ), else why not compared.
        on_cpu: it takes CPU tensors only (sklearn, numpy).
        lean_fit: where its fit's memory does not depend on N and is over the budget, a fit to the same state
            without that memory (``lean_why``), so that its scoring can be timed.
    """

    fit: Callable[[dict[str, Tensor], tuple[Tensor, Tensor], dict[str, Any]], Any]
    score: Callable[[Any, dict[str, Tensor]], Tensor]
    fit_bytes: Callable[[int, int, int], float] = lambda n, d, k: 0.0
    held: str = ""
    scoring: str = "batches"
    batch: int | None = None
    why: str = ""
    compare: str = "scores"
    on_cpu: bool = False
    lean_fit: Callable[[dict[str, Tensor], tuple[Tensor, Tensor], dict[str, Any]], Any] | None = None
    lean_why: str = ""


def _pood() -> Any:
    import pytorch_ood.detector as pood

    return pood


def _she_fit(data: dict[str, Tensor], head: tuple[Tensor, Tensor], _: dict[str, Any]) -> Any:
    return _pood().SHE(None, _head_function(head)).fit_features(data["features"], data["targets"])


def _openmax_fit(data: dict[str, Tensor], head: tuple[Tensor, Tensor], h: dict[str, Any]) -> Any:
    # pytorch-ood fits on every sample it is given: the correctly classified ones, as ours; its distance is
    # w·euclidean + (1 - w)·cosine, ours (1/200)·euclidean + 1·cosine = 1.005 × its with w = 0.005 / 1.005
    weight = h["euclidean_weight"] / (h["euclidean_weight"] + h["cosine_weight"])
    detector = _pood().OpenMax(None, tailsize=h["tailsize"], alpha=h["alpha"], euclid_weight=weight)
    return detector.fit_logits(data["logits"][data["correct"]], data["targets"][data["correct"]])


def _fdbd_fit(data: dict[str, Tensor], head: tuple[Tensor, Tensor], *, lean: bool = False) -> Any:
    detector = _pood().fDBD(None, _linear(head))
    if not lean:
        return detector.fit_features(data["features"])
    with mock.patch.object(type(detector), "_precompute_denom_matrix", _fdbd_denominators):
        return detector.fit_features(data["features"])


def _fdbd_denominators(detector: Any) -> None:
    """pytorch-ood's ``fDBD._precompute_denom_matrix`` (``|w_p - w_c|``, the diagonal 1) without its ``K × K × D``
    differences."""
    weight = detector.head.weight.data
    norms = torch.cdist(weight, weight, compute_mode="donot_use_mm_for_euclid_dist")
    detector._denom_matrix = norms.fill_diagonal_(1.0)


def _gradnorm(head: tuple[Tensor, Tensor], h: dict[str, Any]) -> Any:
    model = nn.Sequential(nn.Identity(), _linear(head))
    return _pood().GradNorm(model, param_filter=lambda name: name == "1.weight", temperature=h["temperature"])


def _ash(variant: str) -> Pood:
    return Pood(fit=lambda data, head, h: _pood().ASH(_identity, _head_function(head), variant=variant,
                                                      percentile=h["percentile"]),
                score=lambda d, out: d.predict_feature_maps(_maps(out["features"])))


_MAHALANOBIS_HELD = "per class a copy of its rows, and the D × D covariance"
POOD: dict[str, Pood] = {
    "mahalanobis": Pood(fit=lambda data, head, h: _pood().Mahalanobis(None).fit_features(data["features"],
                                                                                           data["targets"]),
                        score=lambda d, out: d.predict_features(out["features"]), held=_MAHALANOBIS_HELD,
                        scoring="loop", why="a (rows × D)(D × D) product per class"),
    "relative_mahalanobis": Pood(
        fit=lambda data, head, h: _pood().RMD(None).fit_features(data["features"], data["targets"]),
        score=lambda d, out: d.predict_features(out["features"]), fit_bytes=_copies(3, "D"),
        held="the known rows' copy and two centred copies of it (the background Gaussian)", scoring="loop",
        why="a (rows × D)(D × D) product per class"),
    "vim": Pood(fit=lambda data, head, h: _pood().ViM(None, d=principal_dimension(h["d"], data["features"].shape[1]),
                                                      w=head[0], b=head[1]).fit_features(data["features"],
                                                                                         data["targets"]),
                score=lambda d, out: d.predict_features(out["features"]),
                fit_bytes=lambda n, dim, k: 4 * n * (dim + k + dim - principal_dimension(None, dim)),
                held="the logits, the centred features and their projection at once"),
    "knn_imagenet": Pood(fit=lambda data, head, h: _pood().KNN(None, k=h["k"]).fit_features(data["features"],
                                                                                             data["targets"]),
                         score=lambda d, out: d.predict_features(out["features"]), fit_bytes=_copies(2, "D"),
                         held="the normalised bank and sklearn's copy", on_cpu=True),
    "react": Pood(fit=lambda data, head, h: _pood().ReAct(_identity, _head_function(head), percentile=h["percentile"])
                  .fit_feature_maps(_maps(data["features"]), data["targets"]),
                  score=lambda d, out: d.predict_feature_maps(_maps(out["features"])), fit_bytes=_copies(2, "D"),
                  held="the flattened known activations and np.percentile's copy"),
    "vra": Pood(fit=lambda data, head, h: _pood().VRA(None, _head_function(head), lower_percentile=h["lower_percentile"],
                                                      upper_percentile=h["upper_percentile"])
                .fit_feature_maps(_maps(data["features"]), data["targets"]),
                score=lambda d, out: d.predict_feature_maps(_maps(out["features"])), fit_bytes=_copies(2, "D"),
                held="the known rows' copy and np.quantile's copy",
                compare="its thresholds are per feature dimension (np.quantile(z, q, axis=0)): another detector "
                        "for D > 1"),
    "dice": Pood(fit=lambda data, head, h: _pood().DICE(None, head[0], head[1], p=h["p"]).fit_features(
        data["features"], data["targets"]), score=lambda d, out: d.predict_features(out["features"]),
        fit_bytes=_copies(1, "D"), held="the known rows' copy", scoring="subset", batch=32,
        why="its scoring forms rows × K × D float32 products (32 rows at a time here: 262 MB at K = 1000)"),
    "ash_s": _ash("ash-s"),
    "ash_p": _ash("ash-p"),
    "ash_b": _ash("ash-b"),
    "scale": Pood(fit=lambda data, head, h: _pood().SCALE(_identity, _head_function(head), percentile=h["percentile"]),
                  score=lambda d, out: d.predict_feature_maps(_maps(out["features"]))),
    "nci": Pood(fit=lambda data, head, h: _pood().NCI(None, _linear(head), alpha=h["alpha"]).fit_features(
        data["features"]), score=lambda d, out: d.predict_features(out["features"])),
    "fdbd": Pood(fit=lambda data, head, h: _fdbd_fit(data, head), score=lambda d, out: d.predict_features(out["features"]),
                 fit_bytes=lambda n, d, k: 4 * k * k * d, held="the K × K × D differences of the head's rows",
                 lean_fit=lambda data, head, h: _fdbd_fit(data, head, lean=True),
                 lean_why="its scoring timed with its fit's denominators computed here by torch.cdist (the same "
                          "norms, K × K)"),
    "gradnorm": Pood(fit=lambda data, head, h: _gradnorm(head, h), score=lambda d, out: d.predict(out["features"]),
                     scoring="subset", batch=64,
                     why="a per-sample backward (torch.func); autograd keeps every sample's K × D gradient until the "
                         "call returns (8 MB a sample at K = 1000), so 64 samples a call"),
    "nnguide": Pood(fit=lambda data, head, h: _pood().NNGuide(None, _head_function(head), k=h["k"]).fit_features(
        data["features"], data["targets"]), score=lambda d, out: d.predict_features(out["features"]),
        fit_bytes=_copies(3, "D"), held="the known rows' copy, the scaled chunks and the bank"),
    "she": Pood(fit=_she_fit, score=lambda d, out: d.predict_features(out["features"]), fit_bytes=_copies(3, "D"),
                held="the known rows' copy, the correctly classified rows and their concatenation"),
    "klm": Pood(fit=lambda data, head, h: _pood().KLMatching(None).fit_logits(data["logits"], data["targets"]),
                score=lambda d, out: d.predict_logits(out["logits"]), fit_bytes=_copies(2, "K"),
                held="the known logits' copy and their softmax"),
    "openmax": Pood(fit=_openmax_fit, score=lambda d, out: d.predict_logits(out["logits"]), fit_bytes=_copies(1, "K"),
                    held="the correctly classified logits", scoring="subset",
                    why="a Python loop over the samples (scipy's Weibull CDF per top class)", compare="ranks"),
}


# --------------------------------------------------------------------------------------------------
# the cases


@dataclass(frozen=True)
class Case:
    """One detector of the benchmark.

    Attributes:
        detector: its registry name.
        fit: ``"all"`` (N rows), ``"cap"`` (its ``default_fit`` of N), ``"head"`` (the head alone: no fit data)
            or ``"none"`` (no fit: scoring only).
        logits: its fit reads the fit set's logits (made once, for these cases, after the others).
        reference: ``"gram"`` (``XᵀX`` / ``(N × D)(D × D)``), ``"bank"`` (``(N × D)(D × bank)``) or ``None``.
        weiper: timed on ``--weiper-rows`` scored rows (and ``--weiper-fit`` fit samples per class), extrapolated.
    """

    detector: str
    fit: str = "all"
    logits: bool = False
    reference: str | None = None
    weiper: bool = False
    pood: Pood | None = field(default=None, compare=False)


CASES = [Case(name, fit=fit, logits=logits, reference=reference, weiper=name.startswith("weiper"),
              pood=POOD.get(name)) for name, fit, logits, reference in [
    ("mahalanobis", "all", False, "gram"),
    ("relative_mahalanobis", "all", False, "gram"),
    ("mahalanobis_pp", "all", False, "gram"),
    ("relative_mahalanobis_pp", "all", False, "gram"),
    ("vim", "all", False, "gram"),
    ("knn_imagenet", "cap", False, "bank"),
    ("nnguide", "cap", False, "bank"),  # the logits of its 1% bank only
    ("react", "all", False, None),
    ("vra", "all", False, None),
    ("dice", "all", False, None),
    ("ash_s", "head", False, None),
    ("ash_p", "head", False, None),
    ("ash_b", "head", False, None),
    ("scale", "head", False, None),
    ("nci", "all", False, None),
    ("fdbd", "all", False, None),
    ("gradnorm", "none", False, None),
    ("optfs", "all", False, None),
    ("weiper", "head", False, None),
    ("weiper_kld", "cap", False, None),
    ("she", "all", True, None),
    ("klm", "all", True, None),
    ("openmax", "all", True, None),
    ("ghost", "all", True, None),
    ("postmax", "all", True, None),
]]
"""In the order they run: the cases that read the fit set's logits last, so that those 1.28M × 1000 float32
logits (4.8 GiB) are held only while they run."""


def covered() -> set[str]:
    """The detectors the cases cover: every built-in one that fits or reads the head, and GradNorm, but
    :data:`SKIPPED`."""
    return {case.detector for case in CASES}


def pood_rows(estimate: Callable[[int, int, int], float], n: int, dim: int, classes: int, budget: float) -> int:
    """The largest ``n / 2ʲ`` whose estimated memory fits ``budget`` bytes (at least ``classes`` rows)."""
    rows = n
    while rows > classes and estimate(rows, dim, classes) > budget:
        rows = max(classes, rows // 2)
    return rows


def available_bytes() -> float:
    """MemAvailable of /proc/meminfo (infinite where it cannot be read)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf


def _mib(measured: Measured) -> float | None:
    return None if measured.peak_bytes is None else measured.peak_bytes / 2**20


def _batches(outputs: dict[str, Tensor], rows: int) -> Iterator[dict[str, Tensor]]:
    total = next(iter(outputs.values())).shape[0]
    for start in range(0, total, rows):
        yield {key: value[start:start + rows] for key, value in outputs.items()}


@dataclass
class Run:
    """The data and settings of one run, and its rows."""

    features: Tensor
    targets: Tensor
    test: dict[str, Tensor]
    head: tuple[Tensor, Tensor]
    device: torch.device
    settings: dict[str, Any]
    logits: Tensor | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    gram: dict[torch.dtype, float] = field(default_factory=dict)
    square: dict[torch.dtype, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ helpers
    def add(self, **row: Any) -> dict[str, Any]:
        row["goal"] = goal(row)
        self.rows.append(row)
        parts = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
        print(f"  {parts}", flush=True)
        return row

    def fit_data(self, rows: int, case: Case) -> dict[str, Tensor]:
        data = {"features": self.features[:rows], "targets": self.targets[:rows]}
        if case.logits:
            data["logits"] = self.logits[:rows]
        elif case.detector == "nnguide":  # its 1% bank's logits (the cap), not the whole fit set's
            data["logits"] = logits_of(data["features"], self.head)
        return data

    def measure(self, fn: Callable[[], Any]) -> Measured:
        return measure(fn, device=self.device, collect=False)  # one garbage collection per case (0.2 s each here)

    def reference(self, case: Case, phase: str, rows: int, bank: int) -> dict[str, Any]:
        if case.reference is None:
            return {}
        if phase == "fit":
            if case.reference != "gram":
                return {}
            return dict(reference="XᵀX", reference_f64_s=self.gram[torch.float64] * rows,
                        reference_f32_s=self.gram[torch.float32] * rows)
        if case.reference == "gram":
            return dict(reference="(N × D)(D × D)", reference_f64_s=self.square[torch.float64],
                        reference_f32_s=self.square[torch.float32])
        bank_features = self.features[:bank]
        test = self.test["features"]
        return dict(reference=f"(N × D)(D × {bank:,})",
                    reference_f64_s=matmul_seconds(test, bank_features.T, dtype=torch.float64, rows=32768),
                    reference_f32_s=matmul_seconds(test, bank_features.T, dtype=torch.float32, rows=32768))

    # ------------------------------------------------------------------ one case
    def case(self, case: Case) -> None:
        s = self.settings
        name, n = case.detector, self.features.shape[0]
        classes = self.head[0].shape[0]
        cls = DETECTORS[name]
        hyperparameters = cls.hyperparameter_defaults()
        print(f"{name}:", flush=True)
        gc.collect()
        fit_rows = fitted_rows(cls, case, n, classes, s.get("bank_rows"))
        if case.weiper and case.fit == "cap":  # timed on --weiper-fit per class, extrapolated
            timed_rows = min(fit_rows, s["weiper_fit"] * classes)
        else:
            timed_rows = fit_rows
        pood = case.pood
        pood_n, over = None, False
        if pood is not None and case.fit in ("all", "cap"):
            budget = min(s["pood_memory"], available_bytes() - RESERVE)
            pood_n = pood_rows(pood.fit_bytes, fit_rows, self.features.shape[1], classes, budget)
            s.setdefault("pood_budget", {})[name] = budget
            over = pood.fit_bytes(pood_n, self.features.shape[1], classes) > budget  # not on any rows
            if over:
                pood_n = fit_rows if pood.lean_fit is not None else None
        # ---------------------------------------------------------- fit
        detector = build_detector(name)
        at: dict[int, Any] = {}
        theirs = None
        phase = s.get("phase", "both")
        if case.fit in ("all", "cap") and phase == "score":  # one fit of each, untimed, on the compared rows
            rows = pood_n if pood is not None and pood_n is not None else timed_rows
            data = self.fit_data(rows, case)
            at[fit_rows] = detector.fit(data, head=self.head)  # its scores are those compared: no second scoring
            if pood is not None and over and pood.lean_fit is not None:
                theirs = pood.lean_fit(data, self.head, hyperparameters)
            elif pood is not None and not over:
                theirs = self.pood_fit(pood, rows, case, hyperparameters, {})
            del data
        elif case.fit in ("head", "none"):
            fitted = self.measure(lambda: detector.fit({}, head=self.head) if case.fit == "head" else detector)
            at[fit_rows] = fitted.value
            if case.weiper and phase != "score":  # its fit draws the r·K·D directions
                self.add(detector=name, phase="fit", rows=0, ours_s=fitted.seconds, ours_peak_mib=_mib(fitted))
            if pood is not None:
                theirs = pood.fit({}, self.head, hyperparameters)
            del fitted
        else:
            data = self.fit_data(timed_rows, case)
            fitted = self.measure(lambda: detector.fit(data, head=self.head))
            at[fit_rows] = fitted.value
            row = dict(detector=name, phase="fit", rows=fit_rows, ours_s=fitted.seconds * fit_rows / timed_rows,
                       ours_peak_mib=_mib(fitted), **self.reference(case, "fit", fit_rows, 0))
            if timed_rows < fit_rows:
                row.update(ours_rows=timed_rows, ours_extrapolated=True)
            if pood is not None and over:
                estimate = pood.fit_bytes(fit_rows, self.features.shape[1], classes) / 2**30
                row["pood_note"] = (f"its fit not run: it holds {pood.held}, ~{estimate:.3g} GiB at any N, over the "
                                    f"{budget_text(s['pood_budget'][name])}")
                if pood.lean_fit is not None:
                    row["pood_note"] += f"; {pood.lean_why}"
                    theirs = pood.lean_fit(data, self.head, hyperparameters)
            elif pood is not None and pood_n == fit_rows:
                theirs = self.pood_fit(pood, pood_n, case, hyperparameters, row)
            elif pood is not None:
                row["pood_note"] = (f"run on {_size(pood_n)} only: it holds {pood.held}, "
                                    f"~{pood.fit_bytes(fit_rows, self.features.shape[1], classes) / 2**30:.3g} GiB "
                                    f"at {_size(fit_rows)}, over the {budget_text(s['pood_budget'][name])}")
            self.add(**row)
            del data, fitted
            if pood is not None and not over and pood_n != fit_rows:  # ours on its rows: the same fit to compare
                data = self.fit_data(pood_n, case)
                fitted = self.measure(lambda: build_detector(name).fit(data, head=self.head))
                at[pood_n] = fitted.value
                row = dict(detector=name, phase="fit", rows=pood_n, ours_s=fitted.seconds, ours_peak_mib=_mib(fitted),
                           **self.reference(case, "fit", pood_n, 0))
                theirs = self.pood_fit(pood, pood_n, case, hyperparameters, row)
                self.add(**row)
                del data, fitted
        if phase == "fit":
            at.clear()
            gc.collect()
            return
        # ---------------------------------------------------------- score
        scorer = at[fit_rows]
        test = self.test
        total = test["features"].shape[0]
        scored = total if not case.weiper else min(total, s["weiper_rows"])
        outputs = {key: value[:scored] for key, value in test.items()}
        measured = self.measure(lambda: scorer.score(outputs))
        row = dict(detector=name, phase="score", rows=total, ours_s=measured.seconds * total / scored,
                   ours_peak_mib=_mib(measured), **self.reference(case, "score", total, fit_rows))
        if scored < total:
            row.update(ours_rows=scored, ours_extrapolated=True)
        ours = measured.value
        measured = scorer = at[fit_rows] = None  # free our fitted state before pytorch-ood scores
        if theirs is not None:
            part = {"batches": total, "loop": s["pood_score_rows"], "subset": s["pood_subset"]}[pood.scoring]
            part = min(part, total)
            batch = pood.batch or s["pood_batch"]
            inputs = {key: value[:part] for key, value in test.items()}
            if pood.on_cpu:
                inputs = {key: value.cpu() for key, value in inputs.items()}
            their = self.measure(lambda: torch.cat([torch.as_tensor(pood.score(theirs, b)).reshape(-1)
                                                    for b in _batches(inputs, batch)]))
            row.update(pood_rows=part, pood_s=their.seconds * total / part, pood_peak_mib=_mib(their),
                       pood_extrapolated=part < total, pood_batch=min(batch, part))
            if part < total:
                row["pood_why"] = pood.why
            if over:
                row["pood_note"] = pood.lean_why
            same = at.get(pood_n) if pood_n is not None else None
            mine = ours[:part] if same is None else same.score({key: value[:part] for key, value in test.items()})
            if name == "vim":
                row["difference_f32"] = relative_difference(mine, their.value)
                check = s["check_rows"]
                row["difference"] = vim_in_float64(self.features[:check], self.targets[:check], test["features"][:check],
                                                   self.head)
            elif pood.compare == "scores":
                row["difference"] = relative_difference(mine, their.value)
            elif pood.compare == "ranks":
                row["rank_correlation"] = rank_correlation(mine, their.value)
            else:
                row["not_compared"] = pood.compare
            their = theirs = None
        self.add(**row)
        at.clear()
        gc.collect()

    def pood_fit(self, pood: Pood, rows: int, case: Case, hyperparameters: dict[str, Any], row: dict[str, Any]) -> Any:
        data = self.fit_data(rows, case)
        if case.detector == "openmax":
            data["correct"] = data["logits"].argmax(dim=1) == data["targets"]
        if pood.on_cpu:
            data = {key: value.cpu() for key, value in data.items()}
        measured = self.measure(lambda: pood.fit(data, self.head, hyperparameters))
        row.update(pood_rows=rows, pood_s=measured.seconds, pood_peak_mib=_mib(measured),
                   pood_estimate_mib=pood.fit_bytes(rows, self.features.shape[1], self.head[0].shape[0]) / 2**20)
        return measured.value


def fitted_rows(cls: type, case: Case, n: int, classes: int, bank: int | None = None) -> int:
    """The rows ours fits on: N, or its default cap of them (the first rows: their classes cycle, so any
    prefix is class-balanced as the engine's seeded cap is); ``bank``: the 1% banks' rows instead."""
    cap = cls.default_fit if case.fit == "cap" else {}
    if "fraction" in cap:
        return min(n, bank) if bank is not None else max(classes, round(n * cap["fraction"]))
    if "per_class" in cap:
        return min(n, cap["per_class"] * classes)
    return n


def goal(row: dict[str, Any]) -> str:
    """Whether the row meets the goal: ours' peak within 2 GiB, and no slower than pytorch-ood where it ran on
    (or was extrapolated to) the same rows; ``"yes"`` or ``"no: ..."``."""
    failures = []
    peak = row.get("ours_peak_mib")
    if peak is not None and peak * 2**20 > GOAL_BYTES:
        failures.append(f"{_memory(peak)} > 2 GiB")
    if comparable(row) and row["ours_s"] > row["pood_s"]:
        failures.append(f"{row['ours_s'] / row['pood_s']:.1f}x pytorch-ood's time")
    return "yes" if not failures else "no: " + ", ".join(failures)


def comparable(row: dict[str, Any]) -> bool:
    return "pood_s" in row and (row.get("pood_rows") == row["rows"] or bool(row.get("pood_extrapolated")))


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 128 KiB (``mallopt(M_MMAP_THRESHOLD)``): every larger block is mapped on its
    own and unmapped when freed, so the resident set follows the live memory. By default glibc raises the
    threshold up to 32 MiB as blocks are freed and serves them from its heap, which keeps freed memory resident:
    a case would then show the memory an earlier case freed (or none of its own, reusing it). False where it is
    not glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024))  # M_MMAP_THRESHOLD = -3
    except (OSError, AttributeError):
        return False


def run(*, fit: int, n_id: int, n_ood: int, classes: int, dim: int, device: torch.device,
        only: Sequence[str] | None, phase: str = "both", **settings: Any) -> dict[str, Any]:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    cases = [case for case in CASES if only is None or case.detector in only]
    out: dict[str, Any] = {"fit": fit, "id": n_id, "ood": n_ood, "classes": classes, "dim": dim,
                           "device": str(device), "hardware": hardware(device), "load_start": load_average(),
                           "settings": settings, "cases": [case.detector for case in cases], "phase": phase}
    out["mmap_threshold_fixed"] = fix_mmap_threshold()
    means = class_means(classes, dim)
    generated = measure(lambda: make_features(fit, means, seed=1))
    features, targets = generated.value
    out["generate_s"] = generated.seconds
    test_features = torch.cat([make_features(n_id, means, seed=2)[0],
                               make_features(n_ood, means, seed=3, shifted=True)[0]])
    head = make_head(means)
    features, targets, test_features = features.to(device), targets.to(device), test_features.to(device)
    head = tuple(t.to(device) for t in head)
    test = {"features": test_features, "logits": logits_of(test_features, head)}
    _ = torch.randn(512, dim, device=device) @ torch.randn(dim, dim, device=device)  # wake the BLAS threads
    print(f"features: {fit:,} x {dim} float32 for the fits ({features.nbytes / 2**30:.1f} GiB, generated in "
          f"{generated.seconds:.0f} s), {n_id:,} + {n_ood:,} to score", flush=True)
    del generated
    state = Run(features=features, targets=targets, test=test, head=head, device=device,
                settings={**settings, "phase": phase})
    gram_rows = settings["gram_rows"]
    state.gram = {dtype: gram_rate(features, dtype=dtype, rows=min(gram_rows, fit)) for dtype in (torch.float64,
                                                                                                   torch.float32)}
    square = torch.randn(dim, dim, device=device)
    state.square = {dtype: matmul_seconds(test_features, square, dtype=dtype, rows=32768)
                    for dtype in (torch.float64, torch.float32)}
    for case in cases:
        if case.logits and state.logits is None:
            made = measure(lambda: logits_of(features, head))
            state.logits = made.value
            print(f"fit logits: {fit:,} x {classes} float32 ({state.logits.nbytes / 2**30:.1f} GiB, {made.seconds:.0f} s)",
                  flush=True)
            del made
        state.case(case)
    out["rows"] = state.rows
    out["pood_budget"] = state.settings.get("pood_budget", {})
    for row in state.rows:
        if row.get("difference", 0.0) > AGREEMENT:
            raise AssertionError(f"ours and pytorch-ood differ by {row['difference']:.3g} (relative): {row}")
        if row.get("rank_correlation", 1.0) < RANK_AGREEMENT:
            raise AssertionError(f"ours and pytorch-ood rank differently (ρ {row['rank_correlation']:.4f}): {row}")
    out["load"] = load_average()
    return out


# --------------------------------------------------------------------------------------------------
# the table


def _size(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1_000_000 else f"{n / 1e3:.3g}k" if n >= 1000 else str(n)


def _seconds(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _memory(value: float | None) -> str:
    return "—" if value is None else f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def budget_text(budget: float) -> str:
    return f"budget of {budget / 2**30:.3g} GiB (--pood-memory, and the memory free)"


def _difference(row: dict[str, Any]) -> str:
    if "difference" in row:
        cell = f"{row['difference']:.1e}"
        return cell + (f" ({row['difference_f32']:.1e} in float32)" if "difference_f32" in row else "")
    if "rank_correlation" in row:
        return f"ρ = {row['rank_correlation']:.4f} (ranks)"
    if "not_compared" in row:
        return f"— ({row['not_compared']})"
    return "—"


HEADER = ["run", "detector", "phase", "N", "ours (s)", "ours: peak memory", "pytorch-ood (s)",
          "pytorch-ood: peak memory", "pytorch-ood / ours", "one matrix product", "its time f64 / f32 (s)",
          "ours / f64 product", "max relative difference", "goal met"]


def table_row(row: dict[str, Any], label: str) -> tuple[str, ...]:
    """One row of the table (:data:`HEADER`), of the run ``label``."""
    rows = "head" if row["rows"] == 0 else _size(row["rows"])
    ours = _seconds(row["ours_s"])
    if row.get("ours_extrapolated"):
        ours = f"~{ours}, from {_size(row['ours_rows'])}"
    pood_s = row.get("pood_s")
    if pood_s is None:
        pood_cell, versus = f"— ({row['pood_note']})" if "pood_note" in row else "—", "—"
    else:
        at = "" if row.get("pood_rows") == row["rows"] else f" at {_size(row['pood_rows'])}"
        if row.get("pood_extrapolated"):
            at = f", from {row['pood_rows']:,} rows ({row['pood_why']})"
        note = f"; {row['pood_note']}" if "pood_note" in row else ""
        pood_cell = f"{'~' if row.get('pood_extrapolated') else ''}{_seconds(pood_s)}{at}{note}"
        versus = f"{pood_s / row['ours_s']:.1f}x" if comparable(row) else "—"
    reference = row.get("reference")
    if reference is None:
        ref_cell, ratio = "—", "—"
    else:
        ref_cell = f"{_seconds(row['reference_f64_s'])} / {_seconds(row['reference_f32_s'])}"
        ratio = f"{row['ours_s'] / row['reference_f64_s']:.2f}x"
    return (label, row["detector"], row["phase"], rows, ours, _memory(row.get("ours_peak_mib")), pood_cell,
            _memory(row.get("pood_peak_mib")), versus, reference or "—", ref_cell, ratio, _difference(row), row["goal"])


def description(r: dict[str, Any]) -> str:
    """What every run of the table measured, and how (the settings of this run)."""
    s = r["settings"]
    skipped = "; ".join(f"{name} ({why})" for name, why in SKIPPED.items())
    mmap = ("with glibc's mmap threshold fixed at 128 KiB (every larger block is returned to the system when "
            "freed, so the resident set follows the live memory, whatever ran before)" if r["mmap_threshold_fixed"]
            else "glibc's mmap threshold not fixed (not glibc): freed memory may stay resident")
    gpu = ("" if r["device"].startswith("cuda") else
           " GPU: not measured here (this machine has no GPU; `--device cuda` runs the same cases on one).")
    return (
        f"Synthetic float32 features, D = {r['dim']}, K = {r['classes']} classes (ReLU of class mean + unit noise; "
        f"OOD: ReLU of noise); ours fits on {r['fit']:,} samples or the detector's default cap of them (the first "
        "rows, class-balanced: KNN and NNGuide 1%, WeiPer+KLD 300 per class, timed on "
        f"{s['weiper_fit']} per class and extrapolated); {r['id']:,} ID + {r['ood']:,} OOD samples scored (WeiPer "
        f"timed on {s['weiper_rows']:,} and extrapolated). VRA and KL matching fit on ID validation images in the "
        "engine (`fit_split = \"val\"`): here on the same N, an upper bound. One run of each case (wall-clock s; `~` "
        "extrapolated linearly). Peak memory: the resident set above the one before the case, "
        f"{mmap}; the fit features themselves "
        f"({r['fit'] * r['dim'] * 4 / 2**30:.1f} GiB) and their logits are not counted. pytorch-ood 0.4.0 fits on "
        "all N where its memory, estimated from its code, fits the run's budget, else on the first rows that do "
        "(ours then fits on those too, the row below); it scores in batches of "
        f"{s['pood_batch']:,} rows, or a subset, extrapolated. \"max relative difference\": max |ours - "
        "pytorch-ood| / max |pytorch-ood| of the scores, both fitted on the same rows, on the rows pytorch-ood "
        f"scored (ViM: against pytorch-ood run in float64, both fitted on the first {s['check_rows']:,} rows and "
        "scoring float64 features, and in parentheses against its float32 fit; OpenMax: Spearman's ρ). Goal met: ours' peak within 2 GiB and, "
        f"where pytorch-ood ran on the same rows, ours no slower. Not run: {skipped}.{gpu}")


def run_line(r: dict[str, Any], label: str) -> str:
    """The run ``label``: when, which cases, its machine and load."""
    budgets = [b / 2**30 for b in r["pood_budget"].values()]
    span = f"{min(budgets):.3g}" if budgets and f"{min(budgets):.3g}" == f"{max(budgets):.3g}" else \
        f"{min(budgets, default=0):.3g}-{max(budgets, default=0):.3g}"
    budget = (f"; pytorch-ood's fit budget {span} GiB (--pood-memory "
              f"{r['settings']['pood_memory'] / 2**30:g}, or the memory free less {RESERVE / 2**30:g} GiB)"
              if budgets else "")
    phase = {"both": "", "fit": " (fits only: --phase fit)",
             "score": " (scoring only: --phase score; ours and pytorch-ood fitted once, untimed, on the rows whose "
                      "scores are compared)"}[r.get("phase", "both")]
    return (f"- Run {label}, {datetime.date.today().isoformat()}: {', '.join(r['cases'])}{phase}; features generated in "
            f"{r['generate_s']:.0f} s{budget}; device {r['hardware']}; {machine()}; load {r['load_start']} at the "
            f"start and {r['load']} at the end.")


def compose(paragraph: str, runs: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    met = sum(line[-1] == "yes" for line in lines)
    return "\n".join([paragraph, "", *runs, "", table(HEADER, lines), "",
                      f"Goal met in {met} of {len(lines)} rows."])


def markdown(r: dict[str, Any], label: str = "A") -> str:
    """The block of one run: what it measured, the run, its table."""
    return compose(description(r), [run_line(r, label)], [table_row(row, label) for row in r["rows"]])


def merge(previous: str | None, r: dict[str, Any]) -> str:
    """The block with this run's rows in place of those of its detectors and phases in ``previous`` (a block this
    script wrote: the rows of the other detectors, or of their other phase, and their runs kept), in the order of
    :data:`CASES`, each detector's fit rows before its scoring."""
    kept_runs: dict[str, str] = {}
    kept: list[tuple[str, ...]] = []
    runs = dict(re.findall(r"^- Run ([A-Z]), (.*)$", previous or "", re.M))
    phases = ("fit", "score") if r.get("phase", "both") == "both" else (r["phase"],)
    replaced = {(name, phase) for name in r["cases"] for phase in phases}
    for line in (previous or "").splitlines():
        cells = tuple(cell.strip() for cell in line.strip().strip("|").split("|"))
        if len(cells) == len(HEADER) and cells[0] in runs and cells[1] in covered() and \
                (cells[1], cells[2]) not in replaced:
            kept.append(cells)
            kept_runs[cells[0]] = runs[cells[0]]
    label = next(letter for letter in string.ascii_uppercase if letter not in kept_runs)
    order = {case.detector: index for index, case in enumerate(CASES)}
    lines = sorted(kept + [table_row(row, label) for row in r["rows"]],
                   key=lambda cells: (order[cells[1]], cells[2] == "score"))  # stable
    run_lines = [f"- Run {key}, {value}" for key, value in sorted(kept_runs.items())] + [run_line(r, label)]
    return compose(description(r), sorted(run_lines), lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and, with ``--write``, put it in RESULTS.md; returns the numbers."""
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--only", help="comma-separated detectors to run (default: every case; not with --write)")
    parser.add_argument("--phase", choices=PHASES, default="both",
                        help="measure the fits and the scoring (both, the default), or one phase: fit, score")
    parser.add_argument("--device", default="cpu", help="where ours and pytorch-ood run (default cpu; cuda)")
    parser.add_argument("--fit", type=int, help="fit samples (default 1280000)")
    parser.add_argument("--knn-fit", type=int, help="fit samples of the 1%% banks, KNN and NNGuide (default 1%% of --fit)")
    parser.add_argument("--id", type=int, help="ID samples scored (default 50000)")
    parser.add_argument("--ood", type=int, help="OOD samples scored (default 100000)")
    parser.add_argument("--classes", type=int, help="classes K (default 1000)")
    parser.add_argument("--dim", type=int, help="feature dimension D (default 2048)")
    parser.add_argument("--pood-memory", type=float, help="GiB pytorch-ood's fit may take (default 6)")
    parser.add_argument("--pood-batch", type=int, help="rows per pytorch-ood scoring call (default 16384)")
    parser.add_argument("--pood-score-rows", type=int,
                        help="rows pytorch-ood's Mahalanobis and RMD score, a product per class (default 256)")
    parser.add_argument("--pood-subset", type=int,
                        help="rows pytorch-ood's DICE, GradNorm and OpenMax score (default 1024)")
    parser.add_argument("--weiper-fit", type=int, help="fit samples per class WeiPer+KLD is timed on (default 4)")
    parser.add_argument("--weiper-rows", type=int, help="rows WeiPer's scoring is timed on (default 2048)")
    args = parse(parser, argv)
    only = None
    if args.only:
        only = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(only) - covered())
        if unknown:
            parser.error(f"--only: no case {unknown[0]!r}; the cases are {', '.join(c.detector for c in CASES)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device")
    tiny = args.tiny
    fit = args.fit or (3000 if tiny else 1_280_000)
    result = run(fit=fit, bank_rows=args.knn_fit, n_id=args.id or (300 if tiny else 50_000),
                 n_ood=args.ood or (600 if tiny else 100_000), classes=args.classes or (10 if tiny else 1000),
                 dim=args.dim or (64 if tiny else 2048), device=device, only=only, phase=args.phase,
                 pood_memory=(args.pood_memory if args.pood_memory is not None else 6.0) * 2**30,
                 pood_batch=args.pood_batch or (256 if tiny else 16384),
                 pood_score_rows=args.pood_score_rows or (100 if tiny else 256),
                 pood_subset=args.pood_subset or (200 if tiny else 1024),
                 weiper_fit=args.weiper_fit or (100 if tiny else 4), weiper_rows=args.weiper_rows or (200 if tiny else 2048),
                 gram_rows=1000 if tiny else 65536, check_rows=1000 if tiny else 16384)
    body = merge(generated_block(SECTION), result) if only and args.write else markdown(result)
    finish(args, SECTION, body, script="benchmarks.detectors_benchmark")
    return result


if __name__ == "__main__":
    main()
