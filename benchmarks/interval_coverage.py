"""The coverage of every interval the framework reports, and the family-wise error of its ▼ marks, by
simulation with a known truth.

Every interval is computed by the project's own public functions on simulated test data whose population
value is known (closed form, or a sample of 2·10^6); a repetition draws new test data. Coverage = the share of
repetitions whose interval holds the truth, with its Monte-Carlo standard error ``√(c(1-c)/R)``; the goal:
within 0.93-0.97 at n >= 50 and never an interval of zero width from a finite sample.

1. AUROC, by each method of ``metrics.auroc_interval`` (auto, logit, newcombe, delong, bootstrap), at
   n ∈ {20, 50, 200, 1000} per side and AUROC ∈ {0.75, 0.95, 0.99}: binormal scores (ID N(d, 1), OOD N(0, 1)),
   and as checks of robustness unequal variances (OOD sd 2), coarse ties (the binormal rounded to steps of 0.5)
   and exponential scores (Hanley & McNeil's model).
2. The open-set metrics of ``metrics.bootstrap_open_set`` (stratified percentile bootstrap): CCR@FPR 0.1 in both
   conventions, γ, closed-set accuracy (Wilson's interval, what the callbacks report, and the percentile
   bootstrap they reported before), and the AUROC knowns vs unknowns (``auroc_interval``), K = 4 classes,
   n knowns, n negatives, n unknowns.
3. ECE (``bootstrap_accuracy_ece``, torchmetrics' binned plug-in, 15 bins): the plug-in's bias, the coverage of
   the population ECE and of the plug-in's own expectation at n, for a calibrated and a miscalibrated model.
4. Severity (the callback's construction: pool classes keyed by index, ID images, levels held fixed): mean and
   hardest level, classes with random effects; the truth is the population AUROC of the classes the levels
   hold (conditional on the pool, as the card's intervals are), and, for contrast, its expectation over pools.
5. EvG: the worst-case AUROC (chains clustered by seed image, one and three chains per seed) and MinRank
   conditional on the search (Wilson's interval of the count of ID images above the fixed worst case), with the
   chain bootstrap it replaced.
6. The paired difference of two correlated detectors' AUROC (``paired_difference``).
7. The ▼ marks: the chance of any false ▼ with 5 and 10 detectors of equal true AUROC (500/500 images,
   correlation 0.8), per-pair (the card before) vs ``worse_than_best`` (after), and the power to mark one
   detector 0.03 below the others.
8. A model of 3 training seeds (``metrics.seed_mean``): training variance on the separation, a shared test set.
9. The OOD benchmark's means over sets (``metrics.benchmark_table``, OpenOOD v1.5's near / far / all figures):
   five binormal OOD sets of known AUROC (two near, three far, sized like ImageNet-1K's against its ID test set)
   against one shared ID set, the sets held fixed; the coverage of the mean AUROC per group, of each set's AUROC
   interval, and of the mean FPR@95 and AUGRC over all sets (closed-form truths).

    python -m benchmarks.interval_coverage [--tiny] [--write] [--reps 2000] [--resamples 1000]
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from scipy.special import ndtr, ndtri

from benchmarks.common import benchmark_parser, finish, load_average, machine, parse, table
from evaluation_engine.intervals import Intervals
from metrics import (
    auroc,
    auroc_interval,
    benchmark_table,
    bootstrap_accuracy_ece,
    bootstrap_auroc,
    bootstrap_min_rank,
    bootstrap_open_set,
    cluster_weights,
    max_known_score,
    min_rank,
    paired_difference,
    percentile_interval,
    resample_weights,
    seed_mean,
    severity_levels,
    weighted_auroc,
    wilson_interval,
    worse_than_best,
)

SECTION = "Interval coverage"
METHODS = ("auto", "logit", "newcombe", "delong", "bootstrap")
SIZES = (20, 50, 200, 1000)
AUROCS = (0.75, 0.95, 0.99)
FAMILIES = ("binormal", "unequal", "ties", "exponential")


class Coverage:
    """Counts of repetitions: covered, zero width, undefined (NaN interval)."""

    def __init__(self) -> None:
        self.covered = self.zero = self.undefined = self.total = 0
        self.widths: list[float] = []

    def add(self, low: float | None, high: float | None, truth: float) -> None:
        self.total += 1
        if low is None or high is None or math.isnan(low) or math.isnan(high):
            self.undefined += 1
            return
        self.covered += low - 1e-12 <= truth <= high + 1e-12
        self.zero += high - low <= 0
        self.widths.append(high - low)

    def text(self) -> str:
        defined = self.total - self.undefined
        if defined == 0:
            return "—"
        c = self.covered / defined
        out = f"{c:.3f} ± {math.sqrt(max(c * (1 - c), 1e-12) / defined):.3f}"
        if self.zero:
            out += f" ({self.zero / defined:.0%} zero width)"
        if self.undefined:
            out += f" ({self.undefined / self.total:.0%} undefined)"
        return out

    @property
    def rate(self) -> float:
        defined = self.total - self.undefined
        return self.covered / defined if defined else math.nan


# --------------------------------------------------------------------------------------------------
# 1. AUROC


def auroc_scores(rng: np.random.Generator, family: str, area: float, n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """ID and OOD scores with the population AUROC ``area`` (ties ½) of a family, and that truth."""
    if family == "binormal":
        d = math.sqrt(2) * float(ndtri(area))
        return rng.normal(d, 1, n), rng.normal(0, 1, n), area
    if family == "unequal":
        d = math.sqrt(5) * float(ndtri(area))
        return rng.normal(d, 1, n), rng.normal(0, 2, n), area
    if family == "ties":
        d, step = math.sqrt(2) * float(ndtri(area)), 0.5
        grid = np.arange(-60, 80)
        p_id = ndtr((grid + 0.5) * step - d) - ndtr((grid - 0.5) * step - d)
        p_ood = ndtr((grid + 0.5) * step) - ndtr((grid - 0.5) * step)
        truth = float((p_id * (np.cumsum(p_ood) - p_ood + 0.5 * p_ood)).sum())
        return np.round(rng.normal(d, 1, n) / step), np.round(rng.normal(0, 1, n) / step), truth
    if family == "exponential":  # P(X > Y) = area for X ~ Exp(rate (1 - area)/area), Y ~ Exp(1)
        return rng.exponential(area / (1 - area), n), rng.exponential(1, n), area
    raise ValueError(family)


def auroc_study(rng: np.random.Generator, reps: int, resamples: int, families: Sequence[str],
                sizes: Sequence[int], bootstrap_reps: int) -> list[dict[str, Any]]:
    rows = []
    for family in families:
        for area in AUROCS:
            for n in sizes:
                tallies = {m: Coverage() for m in METHODS}
                for rep in range(reps):
                    x, y, truth = auroc_scores(rng, family, area, n)
                    id_scores, ood_scores = torch.from_numpy(x), torch.from_numpy(y)
                    for method in METHODS:
                        if method == "bootstrap" and (family != "binormal" or rep >= bootstrap_reps):
                            continue
                        tallies[method].add(*auroc_interval(id_scores, ood_scores, method=method, resamples=resamples,
                                                          seed=rep), truth)
                rows.append({"family": family, "auroc": area, "n": n, **tallies})
    return rows


# --------------------------------------------------------------------------------------------------
# 2. open set


OPEN_SET_K, OPEN_SET_SIGNAL = 4, 2.5


def open_set_sample(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n knowns (logits: signal on the true class + N(0, 1)), n negatives and n unknowns (N(0, 1) logits)."""
    labels = rng.integers(0, OPEN_SET_K, n)
    known = rng.normal(0, 1, (n, OPEN_SET_K))
    known[np.arange(n), labels] += OPEN_SET_SIGNAL
    others = rng.normal(0, 1, (2 * n, OPEN_SET_K)) * 1.3
    logits = torch.from_numpy(np.concatenate([known, others]))
    target = torch.from_numpy(np.r_[labels, -np.ones(n, dtype=np.int64), -2 * np.ones(n, dtype=np.int64)])
    return torch.softmax(logits, dim=1), target


def open_set_truth(rng: np.random.Generator, size: int = 2_000_000) -> dict[str, float]:
    probs, target = open_set_sample(rng, size)
    known = target >= 0
    confidence, prediction = probs.max(dim=1)
    correct = known & (prediction == target.clamp(min=0))
    target_score = probs[known].gather(1, target[known][:, None]).squeeze(1)
    theta = float(np.quantile(confidence[target == -2].numpy(), 0.9))
    ccr = float(((target_score > theta) & correct[known]).double().mean())
    gamma_plus = float(target_score.double().mean())
    gamma_minus = float((1 + 1 / OPEN_SET_K - confidence[target == -1].double()).mean())
    unknown = confidence[target == -2][:200_000].double()
    known_confidence = confidence[known][:200_000].double()
    return {"ccr": ccr, "gamma": (gamma_plus + gamma_minus) / 2, "accuracy": float(correct[known].double().mean()),
            "auroc": auroc(known_confidence, unknown)}


def open_set_study(rng: np.random.Generator, reps: int, resamples: int, sizes: Sequence[int],
                   population: int = 2_000_000) -> tuple[list[dict[str, Any]], dict[str, float]]:
    truth = open_set_truth(rng, population)
    rows = []
    for n in sizes:
        tallies = {k: Coverage() for k in ("ccr exact", "ccr authors", "gamma", "accuracy", "accuracy bootstrap",
                                          "auroc")}
        for rep in range(reps):
            probs, target = open_set_sample(rng, n)
            replicates = bootstrap_open_set(probs, target, fpr_targets=(0.1,), conventions=("exact", "authors"),
                                            resamples=resamples, seed=rep)
            tallies["ccr exact"].add(*percentile_interval(replicates["unknowns/ccr@fpr=0.1"]), truth["ccr"])
            tallies["ccr authors"].add(*percentile_interval(replicates["unknowns/authors_ccr@fpr=0.1"]), truth["ccr"])
            tallies["gamma"].add(*percentile_interval(replicates["gamma"]), truth["gamma"])
            known = target >= 0
            correct = int((probs[known].argmax(dim=1) == target[known]).sum())
            tallies["accuracy"].add(*wilson_interval(correct, int(known.sum())), truth["accuracy"])  # the callbacks'
            tallies["accuracy bootstrap"].add(*percentile_interval(replicates["closed_set_accuracy"]), truth["accuracy"])
            confidence = max_known_score(probs)
            tallies["auroc"].add(*auroc_interval(confidence[target >= 0], confidence[target == -2]), truth["auroc"])
        rows.append({"n": n, **tallies})
    return rows, truth


# --------------------------------------------------------------------------------------------------
# 3. ECE


def ece_sample(rng: np.random.Generator, n: int, shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-class probabilities with max-probability confidence uniform in [0.5, 1] and accuracy ``conf - shift``."""
    confidence = rng.uniform(0.5, 1, n)
    correct = rng.uniform(size=n) < np.clip(confidence - shift, 0, 1)
    labels = rng.integers(0, 2, n)
    predicted = np.where(correct, labels, 1 - labels)
    probs = np.empty((n, 2))
    probs[np.arange(n), predicted] = confidence
    probs[np.arange(n), 1 - predicted] = 1 - confidence
    return torch.from_numpy(probs), torch.from_numpy(labels)


def ece_truth(shift: float) -> float:
    """Σ_b P(b) |E[acc - conf | b]| for confidence uniform on [0.5, 1] and accuracy = confidence - shift:
    ``shift`` in every bin the confidence reaches."""
    return shift


def ece_study(rng: np.random.Generator, reps: int, resamples: int, sizes: Sequence[int]) -> list[dict[str, Any]]:
    rows = []
    for shift in (0.0, 0.1):
        for n in sizes:
            population, expected, estimates = Coverage(), Coverage(), []
            plug_in = float(np.mean([_ece(*ece_sample(rng, n, shift)) for _ in range(max(20, 4 * reps))]))
            for rep in range(reps):
                probs, labels = ece_sample(rng, n, shift)
                estimates.append(_ece(probs, labels))
                low, high = percentile_interval(bootstrap_accuracy_ece(probs, labels, resamples=resamples, seed=rep)["ece"])
                population.add(low, high, ece_truth(shift))
                expected.add(low, high, plug_in)
            rows.append({"shift": shift, "n": n, "truth": ece_truth(shift), "bias": float(np.mean(estimates)) - shift,
                         "population": population, "expected": expected, "expected value": plug_in})
    return rows


def _ece(probs: torch.Tensor, labels: torch.Tensor) -> float:
    from torchmetrics.functional.classification import multiclass_calibration_error

    return float(multiclass_calibration_error(probs.float(), labels, num_classes=probs.shape[1], n_bins=15, norm="l1"))


# --------------------------------------------------------------------------------------------------
# 4. severity


def severity_study(rng: np.random.Generator, reps: int, resamples: int,
                   settings: Sequence[tuple[int, int, int]], pools: int = 4000) -> list[dict[str, Any]]:
    """Pools of ``classes`` classes with severity levels of ``group`` classes (11 levels) and ``images`` test
    images per class: class means μ_c ~ N(0, 1), images N(μ_c, 0.5²), 3·images estimation images; ID N(2, 1)
    with as many ID test images as one level has. Two truths: the level's population AUROC
    mean_c Φ((2 - μ_c)/√1.25) over the classes the pool's level holds (conditional on the pool and its levels:
    what the card's interval is about, the test images of one benchmark), and that averaged over ``pools`` pools
    (the expectation over pools, which an interval with the levels held fixed does not cover: the levels are
    selected extremes of the pool, whose spread over pools a resample of the pool's own classes cannot show)."""
    rows = []
    for classes, group, images in settings:
        def pool(generator: np.random.Generator, classes: int = classes, group: int = group,
                 images: int = images) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
            means = generator.normal(0, 1, classes)
            estimation = means[:, None] + generator.normal(0, 0.5, (classes, 3 * images))
            # κ: higher = more ID; the severity levels sort the classes by their mean κ on estimation images
            groups, _ = severity_levels(torch.from_numpy(estimation.mean(axis=1)), group, 11)
            return means, estimation, groups

        truths = np.zeros((pools, 11))
        for k in range(pools):
            means, _, groups = pool(rng)
            population = ndtr((2 - means) / math.sqrt(1.25))
            truths[k] = [population[g.numpy()].mean() for g in groups]
        truth_mean, truth_hardest = float(truths.mean(axis=1).mean()), float(truths[:, -1].mean())
        mean, hardest, empty = Coverage(), Coverage(), 0
        pooled_mean, pooled_hardest = Coverage(), Coverage()
        for rep in range(reps):
            means, _, groups = pool(rng)
            population = ndtr((2 - means) / math.sqrt(1.25))
            conditional = np.array([population[g.numpy()].mean() for g in groups])
            test = means[:, None] + rng.normal(0, 0.5, (classes, images))
            ood_scores = torch.from_numpy(test.reshape(-1))
            ood_classes = torch.arange(classes).repeat_interleave(images)
            id_scores = torch.from_numpy(rng.normal(2, 1, group * images))
            id_weights = resample_weights(id_scores.numel(), resamples, rep, stratum=0)
            class_weights = cluster_weights(ood_classes, resamples, rep, stratum=1, num_units=classes)
            per_level = []
            for level_classes in groups:
                members = torch.isin(ood_classes, level_classes)
                per_level.append(weighted_auroc(id_scores, ood_scores[members], id_weights, class_weights[:, members]))
            stacked = torch.stack(per_level)
            empty += int(torch.isnan(stacked.mean(dim=0)).sum())
            mean_interval, hardest_interval = percentile_interval(stacked.mean(dim=0)), percentile_interval(stacked[-1])
            mean.add(*mean_interval, float(conditional.mean()))
            hardest.add(*hardest_interval, float(conditional[-1]))
            pooled_mean.add(*mean_interval, truth_mean)
            pooled_hardest.add(*hardest_interval, truth_hardest)
        rows.append({"classes": classes, "group": group, "images": images, "mean": mean, "hardest": hardest,
                     "pooled mean": pooled_mean, "pooled hardest": pooled_hardest, "empty": empty / (reps * resamples)})
    return rows


# --------------------------------------------------------------------------------------------------
# 5. EvG


def evg_study(rng: np.random.Generator, reps: int, resamples: int, sizes: Sequence[int],
              draws: int = 4000) -> list[dict[str, Any]]:
    """ID test κ ~ N(0, 1); seed images κ ~ N(-m, 1); a chain's worst case: its seed's κ + 1 + N(0, 0.5²)
    (the search raises the seed's score), ``per_seed`` chains per seed image. Worst-case AUROC truth:
    Φ((m - 1)/√(1 + 1 + 0.25)); MinRank's conditional truth: N_id (1 - Φ(max worst case))."""
    rows = []
    for area in AUROCS:
        shift = 1 + math.sqrt(2.25) * float(ndtri(area))  # m with the worst-case AUROC = area
        for per_seed in (1, 3):
            for n in sizes:
                worst_cov, minrank_cov, old_cov, old_conditional = Coverage(), Coverage(), Coverage(), Coverage()
                expected_minrank = _expected_min_rank(rng, shift, n, per_seed, draws)
                seeds = max(2, n // per_seed)
                seed_of_chain = torch.arange(seeds).repeat_interleave(per_seed)  # chain i varies seed i // per_seed
                for rep in range(reps):
                    id_scores = torch.from_numpy(rng.normal(0, 1, n))
                    seed_scores = rng.normal(-shift, 1, seeds)
                    worst = torch.from_numpy(seed_scores[seed_of_chain.numpy()] + 1
                                             + rng.normal(0, 0.5, seed_of_chain.numel()))
                    worst_cov.add(*auroc_interval(id_scores, worst, ood_clusters=seed_of_chain), area)
                    count = min_rank(id_scores, worst)
                    low, high = wilson_interval(count, n)
                    conditional = n * (1 - float(ndtr(float(worst.max()))))
                    minrank_cov.add(math.floor(low * n + 1e-9), math.ceil(high * n - 1e-9), conditional)
                    old = bootstrap_min_rank(id_scores, worst, resamples, rep)
                    old_low, old_high = percentile_interval(old.double())
                    old_cov.add(math.floor(old_low), math.ceil(old_high), expected_minrank)
                    old_conditional.add(math.floor(old_low), math.ceil(old_high), conditional)
                rows.append({"auroc": area, "chains per seed": per_seed, "n": n, "worst": worst_cov,
                             "minrank": minrank_cov, "old": old_cov, "old conditional": old_conditional})
    return rows


def _expected_min_rank(rng: np.random.Generator, shift: float, n: int, per_seed: int, draws: int = 4000) -> float:
    values = []
    seeds = max(2, n // per_seed)
    for _ in range(draws):
        seed_scores = rng.normal(-shift, 1, seeds)
        worst = np.repeat(seed_scores, per_seed) + 1 + rng.normal(0, 0.5, seeds * per_seed)
        values.append(int((rng.normal(0, 1, n) > worst.max()).sum()))
    return float(np.mean(values))


# --------------------------------------------------------------------------------------------------
# 6-7. paired differences and the ▼


def correlated(rng: np.random.Generator, n: int, shifts: Sequence[float], correlation: float = 0.8
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Detectors on the same images: score = √ρ·shared + √(1-ρ)·own (+ shift on ID): AUROC Φ(shift/√2)."""
    shared_id, shared_ood = rng.normal(size=n), rng.normal(size=n)
    out = []
    for shift in shifts:
        id_scores = math.sqrt(correlation) * shared_id + math.sqrt(1 - correlation) * rng.normal(size=n) + shift
        ood_scores = math.sqrt(correlation) * shared_ood + math.sqrt(1 - correlation) * rng.normal(size=n)
        out.append((torch.from_numpy(id_scores), torch.from_numpy(ood_scores)))
    return out


def difference_study(rng: np.random.Generator, reps: int, resamples: int, sizes: Sequence[int]) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        tallies = Coverage()
        shifts = (math.sqrt(2) * float(ndtri(0.9)), math.sqrt(2) * float(ndtri(0.87)))
        for rep in range(reps):
            (a_id, a_ood), (b_id, b_ood) = correlated(rng, n, shifts)
            a, b = bootstrap_auroc(a_id, a_ood, resamples, rep), bootstrap_auroc(b_id, b_ood, resamples, rep)
            low, high, _ = paired_difference(a, b)
            tallies.add(low, high, 0.9 - 0.87)
        rows.append({"n": n, "difference": tallies})
    return rows


def marks_study(rng: np.random.Generator, reps: int, resamples: int, n: int) -> list[dict[str, Any]]:
    rows = []
    equal = math.sqrt(2) * float(ndtri(0.9))
    for detectors, worse_by in ((5, 0.0), (10, 0.0), (10, 0.03)):
        before = after = found_before = found_after = 0
        for rep in range(reps):
            shifts = [equal] * detectors
            if worse_by:
                shifts[0] = math.sqrt(2) * float(ndtri(0.9 - worse_by))
            data = correlated(rng, n, shifts)
            replicates = torch.stack([bootstrap_auroc(i, o, resamples, rep) for i, o in data])
            estimates = torch.tensor([auroc(i, o) for i, o in data], dtype=torch.float64)
            best = int(estimates.argmax())
            per_pair = [r != best and paired_difference(replicates[r], replicates[best])[2] for r in range(detectors)]
            simultaneous = worse_than_best(estimates, replicates).tolist()
            false = range(1, detectors) if worse_by else range(detectors)  # rows of the best true value
            before += any(per_pair[r] for r in false)
            after += any(simultaneous[r] for r in false)
            found_before += bool(worse_by) and per_pair[0]
            found_after += bool(worse_by) and simultaneous[0]
        rows.append({"detectors": detectors, "worse by": worse_by, "before": before / reps, "after": after / reps,
                     "power before": found_before / reps if worse_by else None,
                     "power after": found_after / reps if worse_by else None, "reps": reps})
    return rows


# --------------------------------------------------------------------------------------------------
# 8. training seeds


def seeds_study(rng: np.random.Generator, reps: int, resamples: int, sizes: Sequence[int]) -> list[dict[str, Any]]:
    """3 seeds; seed s separates by d + u_s, u_s ~ N(0, 0.15²) (training variance), on one shared test set per
    repetition: ID = shared + the seed's own noise. Truth: E_u[AUROC] of the recipe (a sample of 10^6 u)."""
    d, spread, seeds = math.sqrt(2) * float(ndtri(0.85)), 0.15, 3
    u = rng.normal(0, spread, 1_000_000)
    truth = float(ndtr((d + u) / math.sqrt(2)).mean())
    rows = []
    for n in sizes:
        tallies = Coverage()
        for rep in range(reps):
            shared_id, shared_ood = rng.normal(size=n), rng.normal(size=n)
            estimates, replicates = [], []
            for shift in d + rng.normal(0, spread, seeds):
                id_scores = torch.from_numpy(math.sqrt(0.8) * shared_id + math.sqrt(0.2) * rng.normal(size=n) + shift)
                ood_scores = torch.from_numpy(math.sqrt(0.8) * shared_ood + math.sqrt(0.2) * rng.normal(size=n))
                estimates.append(auroc(id_scores, ood_scores))
                replicates.append(bootstrap_auroc(id_scores, ood_scores, resamples, rep))
            combined = seed_mean(torch.tensor(estimates, dtype=torch.float64), torch.stack(replicates))
            tallies.add(combined.low, combined.high, truth)
        rows.append({"n": n, "seeds": tallies})
    return rows


# --------------------------------------------------------------------------------------------------
# 9. the OOD benchmark's means over sets


# set -> (group, AUROC against the ID set, size relative to the ID set: ImageNet-1K's SSB-hard, NINCO,
# iNaturalist, Textures, OpenImage-O against its 45,000 ID test images, roughly)
OOD_MEAN_SETS = {"near_a": ("near", 0.80, 1.0), "near_b": ("near", 0.85, 0.15), "far_a": ("far", 0.92, 0.25),
                 "far_b": ("far", 0.95, 0.15), "far_c": ("far", 0.90, 0.35)}
OOD_MEAN_ACCURACY = 0.8


def ood_mean_truth(n: int) -> dict[str, float]:
    """Closed-form truths of the study's table for ``n`` ID images. ID κ ~ N(0, 1), set s κ ~ N(-δ_s, 1) with
    δ_s = √2 Φ⁻¹(AUROC_s); FPR@95 (ID positive) Φ(Φ⁻¹(0.95) - δ_s) (the share of the set above the ID's 5%
    quantile); the ID images right with probability 0.8 whatever their κ, so the AUGRC of set s is
    (1 - AUROC_f) acc (1 - acc) + (1 - acc)²/2 with acc = 0.8 n / (n + n_s) and AUROC_f the AUROC of the right
    ID images against the failures (the wrong ID images at ½, the set at AUROC_s), by the set's share of them."""
    truth: dict[str, float] = {}
    for name, (_, area, relative) in OOD_MEAN_SETS.items():
        size = max(3, round(relative * n))
        delta = math.sqrt(2) * float(ndtri(area))
        wrong = (1 - OOD_MEAN_ACCURACY) * n
        accuracy = OOD_MEAN_ACCURACY * n / (n + size)
        failure_auroc = (wrong * 0.5 + size * area) / (wrong + size)
        truth[f"{name} auroc"] = area
        truth[f"{name} fpr@95tpr"] = float(ndtr(float(ndtri(0.95)) - delta))
        truth[f"{name} augrc"] = (1 - failure_auroc) * accuracy * (1 - accuracy) + 0.5 * (1 - accuracy) ** 2
    for mean in ("near", "far", "all"):
        members = [name for name, (group, _, _) in OOD_MEAN_SETS.items() if mean in ("all", group)]
        for metric in ("auroc", "fpr@95tpr", "augrc"):
            truth[f"{mean} {metric}"] = float(np.mean([truth[f"{name} {metric}"] for name in members]))
    return truth


def ood_mean_study(rng: np.random.Generator, reps: int, resamples: int, sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Per ID size n: a fresh ID set and five OOD sets per repetition (:data:`OOD_MEAN_SETS`), the table of
    ``benchmark_table`` (the sets held fixed: one shared resample, ID stratum 0, each set its own), and whether its
    intervals hold the closed-form truths (:func:`ood_mean_truth`)."""
    groups = {name: group for name, (group, _, _) in OOD_MEAN_SETS.items()}
    columns = ("near auroc", "far auroc", "all auroc", "set auroc", "all fpr@95tpr", "all augrc")
    rows = []
    for n in sizes:
        truth = ood_mean_truth(n)
        tallies = {column: Coverage() for column in columns}
        for rep in range(reps):
            id_scores = torch.from_numpy(rng.normal(0, 1, n))
            correct = torch.from_numpy(rng.random(n) < OOD_MEAN_ACCURACY)
            sets = {}
            for name, (_, area, relative) in OOD_MEAN_SETS.items():
                delta = math.sqrt(2) * float(ndtri(area))
                sets[name] = torch.from_numpy(rng.normal(-delta, 1, max(3, round(relative * n))))
            table = benchmark_table(id_scores, correct, sets, groups,
                                    intervals=Intervals(resamples=resamples, seed=rep))
            for column in columns[:3] + columns[4:]:
                row, metric = column.split(" ")
                values = table.row(row)
                tallies[column].add(values[f"{metric} low"], values[f"{metric} high"], truth[column])
            for name in sets:
                values = table.row(name)
                tallies["set auroc"].add(values["auroc low"], values["auroc high"], truth[f"{name} auroc"])
        rows.append({"n": n, "sets": {name: max(3, round(relative * n)) for name, (_, _, relative)
                                      in OOD_MEAN_SETS.items()}, **tallies})
    return rows


# --------------------------------------------------------------------------------------------------
# the run


def run(reps: int, resamples: int, *, tiny: bool, only: Sequence[str] = ()) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    sizes = (20, 50) if tiny else SIZES
    started = time.perf_counter()
    result: dict[str, Any] = {"reps": reps, "resamples": resamples, "machine": machine(), "load": [load_average()]}
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("auroc", lambda: auroc_study(rng, reps, resamples, FAMILIES[:1] if tiny else FAMILIES, sizes,
                                      bootstrap_reps=max(2, reps // 4))),
        ("open_set", lambda: open_set_study(rng, max(2, reps // 4), resamples, sizes,
                                            population=40_000 if tiny else 2_000_000)),
        ("ece", lambda: ece_study(rng, max(2, reps // 4), resamples, sizes)),
        ("severity", lambda: severity_study(rng, max(2, reps // 4), resamples,
                                            [(16, 4, 10)] if tiny else [(16, 4, 10), (60, 20, 10), (300, 100, 5)],
                                            pools=50 if tiny else 4000)),
        ("evg", lambda: evg_study(rng, max(2, reps // 2), resamples, sizes, draws=50 if tiny else 4000)),
        ("difference", lambda: difference_study(rng, max(2, reps // 4), resamples, sizes)),
        ("marks", lambda: marks_study(rng, max(2, reps // 4), resamples, 100 if tiny else 500)),
        ("seeds", lambda: seeds_study(rng, max(2, reps // 4), resamples, sizes)),
        ("ood_mean", lambda: ood_mean_study(rng, max(2, reps // 4), resamples, sizes if tiny else (200, 1000))),
    ]
    unknown = set(only) - {name for name, _ in steps}
    if unknown:
        raise SystemExit(f"--only: no study named {sorted(unknown)}; the studies: {[name for name, _ in steps]}")
    for name, step in steps:
        if only and name not in only:
            continue
        begun = time.perf_counter()
        result[name] = step()
        result[f"{name}_s"] = time.perf_counter() - begun
    result["seconds"] = time.perf_counter() - started
    result["load"].append(load_average())
    return result


def markdown(result: dict[str, Any]) -> str:
    reps, resamples = result["reps"], result["resamples"]
    steps = ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in result.items() if k.endswith("_s"))
    parts = [f"Machine: {result['machine']}; load {' → '.join(result['load'])}; {result['seconds']:.0f} s ({steps}). "
             f"Coverage ± Monte-Carlo standard error over R repetitions (R = {reps} for the AUROC methods but the "
             f"bootstrap, R/4 elsewhere, R/2 for EvG), {resamples} bootstrap resamples, 95% intervals."]
    if "auroc" in result:
        parts.append("**AUROC** (``auroc_interval``; bootstrap on the binormal family only):\n\n" + table(
            ["family", "AUROC", "n per side", *METHODS],
            [[r["family"], r["auroc"], r["n"], *[r[m].text() for m in METHODS]] for r in result["auroc"]]))
    if "open_set" in result:
        rows, truth = result["open_set"]
        parts.append(f"**Open set** (K = {OPEN_SET_K}; n knowns, n negatives, n unknowns; truths: CCR@FPR 0.1 "
                     f"{truth['ccr']:.3f}, γ {truth['gamma']:.3f}, accuracy {truth['accuracy']:.3f}, AUROC "
                     f"{truth['auroc']:.3f}; 'undefined': the authors' \"—\" in every resample):\n\n" + table(
                         ["n", "CCR@FPR 0.1 exact", "CCR@FPR 0.1 authors", "γ", "accuracy (Wilson)",
                          "accuracy (percentile bootstrap, before)", "AUROC unknowns"],
                         [[r["n"], *[r[k].text() for k in ("ccr exact", "ccr authors", "gamma", "accuracy",
                                                           "accuracy bootstrap", "auroc")]]
                          for r in rows]))
    if "ece" in result:
        parts.append("**ECE** (torchmetrics' binned plug-in, 15 bins, percentile bootstrap of it; confidence uniform "
                     "on [0.5, 1], accuracy = confidence − shift):\n\n" + table(
                         ["shift (population ECE)", "n", "bias of the plug-in", "covers the population ECE",
                          "covers the plug-in's expectation at n"],
                         [[r["shift"], r["n"], f"{r['bias']:+.4f}", r["population"].text(), r["expected"].text()]
                          for r in result["ece"]]))
    if "severity" in result:
        parts.append("**Severity** (11 levels; truth: the population AUROC of the classes the pool's levels hold, "
                     "conditional on the pool; and, not what the interval is about, the level's expected AUROC over "
                     "pools):\n\n" + table(
                         ["pool classes", "classes per level", "test images per class", "mean AUROC", "hardest level",
                          "mean, over pools", "hardest, over pools", "empty-level resamples"],
                         [[r["classes"], r["group"], r["images"], r["mean"].text(), r["hardest"].text(),
                           r["pooled mean"].text(), r["pooled hardest"].text(), f"{r['empty']:.2%}"]
                          for r in result["severity"]]))
    if "evg" in result:
        parts.append("**EvG** (n chains, n ID test images; the worst-case AUROC clustered by seed image; MinRank "
                     "conditional on the search by Wilson, and the chain bootstrap it replaced, against E[MinRank] and "
                     "against the conditional truth):\n\n" + table(
                         ["worst-case AUROC", "chains per seed", "n", "worst-case AUROC interval", "MinRank (Wilson, conditional)",
                          "chain bootstrap vs E[MinRank]", "chain bootstrap vs conditional"],
                         [[r["auroc"], r["chains per seed"], r["n"], r["worst"].text(), r["minrank"].text(), r["old"].text(),
                           r["old conditional"].text()] for r in result["evg"]]))
    if "difference" in result:
        parts.append("**Paired difference** (two detectors on the same images, correlation 0.8, AUROC 0.90 vs 0.87):\n\n"
                     + table(["n per side", "coverage of the difference"],
                             [[r["n"], r["difference"].text()] for r in result["difference"]]))
    if "marks" in result:
        parts.append("**▼ marks** (AUROC 0.9, 500/500 images, correlation 0.8; the chance of any false ▼ in a column, "
                     "and the power to mark a detector 0.03 below):\n\n" + table(
                         ["detectors", "one worse by", "any false ▼, per pair (before)", "any false ▼, worse_than_best",
                          "power, per pair", "power, worse_than_best"],
                         [[r["detectors"], r["worse by"], _rate(r["before"], r["reps"]), _rate(r["after"], r["reps"]),
                           _rate(r["power before"], r["reps"]), _rate(r["power after"], r["reps"])]
                          for r in result["marks"]]))
    if "seeds" in result:
        parts.append("**Three training seeds** (``seed_mean``; training sd 0.15 on the separation, a shared test set):"
                     "\n\n" + table(["n per side", "coverage of E[AUROC] over training"],
                                    [[r["n"], r["seeds"].text()] for r in result["seeds"]]))
    if "ood_mean" in result:
        sizes = result["ood_mean"][0]["sets"] if result["ood_mean"] else {}
        parts.append("**OOD benchmark means** (``benchmark_table``; five binormal OOD sets against one ID set, sets "
                     "held fixed, truths in closed form: AUROC "
                     + ", ".join(f"{name} {area}" for name, (_, area, _) in OOD_MEAN_SETS.items())
                     + f"; set sizes relative to n: {', '.join(f'{r:g}' for _, _, r in OOD_MEAN_SETS.values())}"
                     f" (e.g. {', '.join(str(v) for v in sizes.values())} at n = {result['ood_mean'][0]['n']}); "
                     "'set AUROC': every set's own interval, `Intervals.auroc` (`auto`: logit DeLong), pooled over the five):\n\n" + table(
                         ["n ID images", "near mean AUROC", "far mean AUROC", "all mean AUROC", "set AUROC",
                          "all mean FPR@95", "all mean AUGRC"],
                         [[r["n"], *[r[k].text() for k in ("near auroc", "far auroc", "all auroc", "set auroc",
                                                           "all fpr@95tpr", "all augrc")]]
                          for r in result["ood_mean"]]))
    return "\n\n".join(parts)


def _rate(value: float | None, reps: int) -> str:
    if value is None:
        return "—"
    return f"{value:.3f} ± {math.sqrt(max(value * (1 - value), 1e-12) / reps):.3f}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the study, print the tables and, with ``--write``, put them in RESULTS.md; returns the numbers."""
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--reps", type=int, help="repetitions (default 2000; --tiny 8)")
    parser.add_argument("--resamples", type=int, help="bootstrap resamples (default 1000; --tiny 50)")
    parser.add_argument("--only", nargs="+", default=(), metavar="STUDY",
                        help="run only these studies (auroc open_set ece severity evg difference marks seeds ood_mean); "
                             "with --write the section holds only their tables")
    args = parse(parser, argv)
    reps = args.reps or (8 if args.tiny else 2000)
    resamples = args.resamples or (50 if args.tiny else 1000)
    result = run(reps, resamples, tiny=args.tiny, only=args.only)
    finish(args, SECTION, markdown(result), script="benchmarks.interval_coverage")
    return result


if __name__ == "__main__":
    main()
