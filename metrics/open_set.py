"""Every number of the open-set evaluation of Palechor et al. from one set of test predictions, and its
bootstrap: :func:`open_set_report` and :func:`bootstrap_open_set` (every scalar of the report for each
resample, from the weighted kernels of :mod:`metrics.oscr`, :mod:`metrics.auroc` and :mod:`metrics.gamma`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from metrics._validation import NEGATIVE_LABEL, UNKNOWN_LABEL, check_probs_and_target
from metrics.auroc import _AUROCPlan, auroc
from metrics.gamma import _gamma_checked, _weighted_gamma_rows
from metrics.oscr import (
    AUTHORS_RELATIVE_TOLERANCE,
    DEFAULT_FPR_TARGETS,
    _authors_ccr,
    _authors_oscr_curve_checked,
    _closed_set_accuracy_checked,
    _ExactCCRPlan,
    _fitting_counts,
    _OpenSetPlan,
    _oscr_curve_checked,
    _row_scores,
    ccr_from_authors_curve,
    ccr_from_curve,
)
from metrics.resampling import (
    BLOCK_ROWS,
    INT32_LIMIT,
    INT64_LIMIT,
    PARALLEL_SIZE,
    _check_resamples,
    _chunk_rows,
    _RowStream,
    _Side,
    run_blocks,
)

GROUPS = {"negatives": NEGATIVE_LABEL, "unknowns": UNKNOWN_LABEL}
# Samples of the lowest scores searched first for a resample's lowest present score (open-set bootstrap).
HEAD_SAMPLES = 64
CONVENTIONS = ("exact", "authors")


def fpr_key(target: float, convention: str = "exact") -> str:
    """``1e-3`` -> ``"ccr@fpr=0.001"`` (exact convention) or ``"authors_ccr@fpr=0.001"``."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    return f"{'authors_' if convention == 'authors' else ''}ccr@fpr={target:g}"


def open_set_report(
    probs: Tensor,
    target: Tensor,
    *,
    fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
    background: bool = False,
    conventions: Sequence[str] = ("exact",),
    num_classes: int | None = None,
) -> dict[str, Any]:
    """Scalars, OSCR curves and score samples of a set with known and negative and/or unknown samples.

    For each group present (``negatives`` = label -1, ``unknowns`` = label -2): CCR at each FPR target in
    each requested convention (``"exact"``: the largest CCR whose FPR does not exceed the target, DESIGN.md
    §5.1; ``"authors"``: the published tables' procedure, NaN where they print "—", keys prefixed
    ``authors_``), the OSCR curve, and the AUROC of known vs. that group with ``max_c S_c`` as confidence.
    Overall: closed-set accuracy on the knowns and, with negatives present, γ.

    Returns:
        ``{"scalars": {name: float}, "curves": {group: (fpr, ccr, thresholds)},
        "scores": {"known_target": S_y of knowns, "<group>_max": max_c S_c of the group},
        "counts": {"known": N_K, "negatives": ..., "unknowns": ...}}``.
    """
    for convention in conventions:
        fpr_key(1.0, convention)  # validates the name
    # validated once here; the metrics below are the unvalidated helpers behind the public functions, and
    # they share one pass over the (N, K) table (S_y, max_c S_c and the argmax of every row)
    probs, target, num_known = check_probs_and_target(probs, target, background=background, num_classes=num_classes)
    rows = _row_scores(probs, target)
    target_score, confidence, _ = rows
    known = target >= 0
    scalars: dict[str, float] = {"closed_set_accuracy": float(_closed_set_accuracy_checked(probs, target, rows=rows))}
    curves: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
    scores = {"known_target": target_score[known]}
    counts = {"known": int(known.sum())}
    for group, label in GROUPS.items():
        members = target == label
        counts[group] = int(members.sum())
        if not members.any():
            continue
        fpr, ccr, thresholds = _oscr_curve_checked(probs, target, unknown_label=label, rows=rows)
        curves[group] = (fpr, ccr, thresholds)
        for convention in conventions:
            if convention == "exact":
                values = ccr_from_curve(fpr, ccr, fpr_targets)
            else:
                authors_fpr, authors_ccr, _ = _authors_oscr_curve_checked(probs, target, unknown_label=label, rows=rows)
                values = ccr_from_authors_curve(authors_fpr, authors_ccr, fpr_targets)
            for fpr_target, value in zip(fpr_targets, values.tolist(), strict=True):
                scalars[f"{group}/{fpr_key(fpr_target, convention)}"] = value
        scalars[f"{group}/auroc"] = auroc(confidence[known], confidence[members])
        scores[f"{group}_max"] = confidence[members]
    if counts["negatives"] and counts["known"]:
        # γ ignores the unknowns' rows itself: no copy of the known and negative rows
        gamma_plus, gamma_minus, gamma_value = _gamma_checked(probs, target, num_known=num_known,
                                                              negative_label=NEGATIVE_LABEL, background=background)
        scalars.update({"gamma": float(gamma_value), "gamma_plus": float(gamma_plus), "gamma_minus": float(gamma_minus)})
    return {"scalars": scalars, "curves": curves, "scores": scores, "counts": counts}


# --------------------------------------------------------------------------------------------------
# the bootstrap


def _first_present(counts: np.ndarray, head: np.ndarray, scores: np.ndarray) -> np.generic:
    """The lowest score with weight in a count row. ``head``: the samples of the lowest scores, ascending;
    a sample is absent with probability about 1/e, so the first few of them almost always hold it (else
    a full masked minimum)."""
    present = np.flatnonzero(counts[head])
    if present.size:
        return scores[head[present[0]]]
    return scores[counts > 0].min()


def _gather_into(row: np.ndarray, index: Tensor, buffer: np.ndarray) -> np.ndarray:
    """``row[index]``: into ``buffer`` (torch's index_select, int32 indices) when the dtypes agree."""
    if row.dtype != buffer.dtype:
        return row[index.numpy()]
    torch.index_select(torch.from_numpy(row), 0, index, out=torch.from_numpy(buffer))
    return buffer


class _OpenSetCPU:
    """The CPU bootstrap of :func:`bootstrap_open_set` with integer counts: blocks of rows (the generators
    of :func:`metrics.auroc.bootstrap_auroc`, strata 0 / 1 / 2) spread over threads, each row counted into reused uint8
    buffers and turned into all its scalars in numpy, exact integer counts throughout:

    - closed-set accuracy and the correct knowns' cumulative weight ``K`` in ascending ``S_y`` (shared by
      the groups);
    - per group, exact convention: the unknowns' counts in descending score order, their cumulative sum,
      ``np.searchsorted`` of the largest fitting count of each target (:func:`metrics.oscr._fitting_counts`; every row of
      a stratum sums to its size), and ``K_total - K[at_or_below]`` at that place (:class:`metrics.oscr._ExactCCRPlan`);
      when every unknown fits, the lowest present score of the knowns and the group;
    - per group, the AUROC of :class:`metrics.auroc._AUROCPlan` (the numpy row path of :func:`metrics.auroc.bootstrap_auroc`);
    - per group, authors' convention: the knowns' counts grouped by distinct target score (present
      thresholds by ``np.maximum.reduceat``), the FPR at each from the same cumulative unknown counts, and
      the first nearest present point per target, with the float64 operations of :func:`metrics.oscr._authors_ccr`;
    - γ from float64 dot products.
    """

    def __init__(self, plan: _OpenSetPlan, exact: dict[str, _ExactCCRPlan], aurocs: dict[str, _AUROCPlan],
                 groups: dict[str, tuple[Tensor, int]], targets: Tensor, conventions: Sequence[str],
                 gamma_minus_values: Tensor | None, results: dict[str, np.ndarray]) -> None:
        self.plan, self.exact, self.aurocs, self.groups = plan, exact, aurocs, groups
        self.targets, self.conventions, self.results = targets, tuple(conventions), results
        self.num_known = plan.target_score.numel()
        self.fitting = {group: _fitting_counts(e.num, targets.tolist()) for group, e in exact.items()}
        index = torch.int32 if max([self.num_known] + [e.num for e in exact.values()]) < INT32_LIMIT else torch.int64
        self.correct_order = plan.correct_order.to(index)
        self.orders = {group: e.order.to(index) for group, e in exact.items()}
        self.at_or_below = {group: e.at_or_below.numpy() for group, e in exact.items()}
        # float64 copies for the numpy comparisons: exact and order-preserving for every float dtype
        self.correct_sorted = plan.correct_sorted.double().numpy()
        self.target_np = plan.target_score.double().numpy()
        # the knowns and each group's samples of the lowest scores, ascending (for the lowest present score)
        lowest = torch.topk(plan.target_score, min(HEAD_SAMPLES, self.num_known), largest=False, sorted=True)
        self.known_head = lowest.indices.numpy()
        self.heads = {group: e.order[-HEAD_SAMPLES:].flip(0).numpy() for group, e in exact.items()}
        self.group_scores = {group: scores.double().numpy() for group, (scores, _) in groups.items()}
        self.gamma_minus = None if gamma_minus_values is None else gamma_minus_values.numpy()
        self.wide = np.int32 if max([self.num_known] + [e.num for e in exact.values()]) <= INT32_LIMIT else np.int64
        self.targets_list = targets.tolist()
        self.exact_keys = {group: [f"{group}/{fpr_key(t, 'exact')}" for t in self.targets_list] for group in exact}
        self.authors = "authors" in self.conventions
        if self.authors:  # the knowns grouped by distinct target score, and each score's place in every group
            values, value_of = plan._unique()
            self.values = values.double().numpy()
            self.by_value = torch.argsort(value_of, stable=True).to(index)
            sizes = np.bincount(value_of.numpy(), minlength=values.numel())
            self.value_starts = np.r_[0, np.cumsum(sizes)[:-1]]
            # unknowns of the group above each value: its cumulative weight in descending order, at this place
            self.above_place = {group: e.num - e.authors_search(plan)[1].numpy() for group, e in exact.items()}
            self.authors_keys = {group: [f"{group}/{fpr_key(t, 'authors')}" for t in self.targets_list]
                                 for group in exact}

    def work(self, blocks: list[int], resamples: int, seed: int) -> None:
        plan, results, n_k = self.plan, self.results, self.num_known
        sizes = {group: e.num for group, e in self.exact.items()}
        step = min([_RowStream(n_k, seed, 0).batch()] + [_RowStream(m, seed, 0).batch() for m in sizes.values()])
        known_buffer = np.empty((step, n_k), dtype=np.uint8)
        group_buffers = {group: np.empty((step, m), dtype=np.uint8) for group, m in sizes.items()}
        ordered_correct = np.empty(plan.correct_order.numel(), dtype=np.uint8)
        cumulative_correct = np.zeros(plan.correct_order.numel() + 1, dtype=self.wide)
        ordered = {group: np.empty(m, dtype=np.uint8) for group, m in sizes.items()}
        cumulative = {group: np.zeros(m + 1, dtype=self.wide) for group, m in sizes.items()}  # [0] = 0
        by_value = np.empty(n_k if self.authors else 0, dtype=np.uint8)
        workspaces = {group: a.workspace(np.uint8, np.uint8, narrow=a.num_ood * 255 <= INT32_LIMIT)
                      for group, a in self.aurocs.items()}
        full_known = np.full(step, n_k, dtype=np.int64)
        full = {group: np.full(step, m, dtype=np.int64) for group, m in sizes.items()}
        for block in blocks:
            first, last = block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, resamples)
            known_side = _Side(n_k, seed, 0, None, first)
            sides = {group: _Side(sizes[group], seed, stratum, None, first)
                     for group, (_, stratum) in self.groups.items()}
            for start in range(first, last, step):
                rows = min(step, last - start)
                known = known_side.counts(rows, known_buffer)
                counts = {group: side.counts(rows, group_buffers[group]) for group, side in sides.items()}
                self.rows(start, known, counts, ordered_correct, cumulative_correct, ordered, cumulative, by_value)
                for group, area in self.aurocs.items():
                    results[f"{group}/auroc"][start:start + rows] = area.area_counts(
                        known, counts[group], workspaces[group], (full_known[:rows], full[group][:rows]))
                if self.gamma_minus is not None:  # _weighted_gamma_rows in numpy: the rows sum to N
                    negatives = counts["negatives"]
                    gamma_plus = known.astype(np.float64) @ self.target_np / n_k
                    gamma_minus = negatives.astype(np.float64) @ self.gamma_minus / negatives.shape[1]
                    results["gamma"][start:start + rows] = (gamma_plus + gamma_minus) / 2
                    results["gamma_plus"][start:start + rows] = gamma_plus
                    results["gamma_minus"][start:start + rows] = gamma_minus

    def rows(self, start: int, known: np.ndarray, counts: dict[str, np.ndarray], ordered_correct: np.ndarray,
             cumulative_correct: np.ndarray, ordered: dict[str, np.ndarray], cumulative: dict[str, np.ndarray],
             by_value: np.ndarray) -> None:
        """Closed-set accuracy and the CCR@FPR of every group and convention, row by row."""
        results, n_k = self.results, self.num_known
        exact = "exact" in self.conventions
        for r in range(known.shape[0]):
            row = known[r]
            np.cumsum(_gather_into(row, self.correct_order, ordered_correct), dtype=self.wide,
                      out=cumulative_correct[1:])  # cumulative_correct[0] = 0
            correct_total = int(cumulative_correct[-1])
            results["closed_set_accuracy"][start + r] = correct_total / n_k
            lowest_known = present = None
            for group, sorted_group in self.exact.items():
                unknown = counts[group][r]
                fits = np.cumsum(_gather_into(unknown, self.orders[group], ordered[group]), dtype=self.wide,
                                 out=cumulative[group][1:])
                if self.authors:
                    if present is None:
                        present = self.authors_present(row, by_value)
                    values = self.authors_ccr(present, cumulative[group], self.above_place[group], sorted_group.num,
                                              cumulative_correct, correct_total)
                    for key, value in zip(self.authors_keys[group], values.tolist(), strict=True):
                        results[key][start + r] = value
                if not exact:
                    continue
                passing = np.searchsorted(fits, self.fitting[group], side="right")
                inside = passing < sorted_group.num
                read = self.at_or_below[group][np.minimum(passing, sorted_group.num - 1)]
                if not inside.all():  # every unknown fits: θ = the lowest present score
                    if lowest_known is None:
                        lowest_known = _first_present(row, self.known_head, self.target_np)
                    lowest = min(lowest_known, _first_present(unknown, self.heads[group], self.group_scores[group]))
                    read = np.where(inside, read, np.searchsorted(self.correct_sorted, lowest, side="right"))
                values = (correct_total - cumulative_correct[read]).astype(np.float64) / n_k
                for key, value in zip(self.exact_keys[group], values.tolist(), strict=True):
                    results[key][start + r] = value

    def authors_present(self, row: np.ndarray, by_value: np.ndarray) -> np.ndarray:
        """The authors' thresholds of a row: the distinct known scores present, all but the largest."""
        grouped = _gather_into(row, self.by_value, by_value)
        present = np.maximum.reduceat(grouped, self.value_starts) > 0
        present[present.size - 1 - int(np.argmax(present[::-1]))] = False
        return present

    def authors_ccr(self, present: np.ndarray, cumulative: np.ndarray, above_place: np.ndarray, total: int,
                    cumulative_correct: np.ndarray, correct_total: int) -> np.ndarray:
        """:func:`metrics.oscr._authors_ccr` of one row in numpy, with the same float64 operations: the FPR at every
        distinct known score, per target the first nearest present threshold, NaN when ``|FPR - t|/t >= 0.1``."""
        fpr = cumulative[above_place].astype(np.float64) / float(total)
        absent = ~present
        best = np.empty(len(self.targets_list), dtype=np.int64)
        nearest = np.empty(len(self.targets_list), dtype=np.float64)
        distance = np.empty_like(fpr)
        for column, t in enumerate(self.targets_list):
            np.abs(np.subtract(fpr, t, out=distance), out=distance)
            distance[absent] = math.inf
            best[column] = int(np.argmin(distance))  # first minimum: the lowest threshold among equally near
            nearest[column] = distance[best[column]]
        read = np.searchsorted(self.correct_sorted, self.values[best], side="right")
        ccr = (correct_total - cumulative_correct[read]).astype(np.float64) / self.num_known
        with np.errstate(invalid="ignore"):
            return np.where(nearest / np.asarray(self.targets_list) >= AUTHORS_RELATIVE_TOLERANCE, math.nan, ccr)


def bootstrap_open_set(
    probs: Tensor,
    target: Tensor,
    *,
    fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
    background: bool = False,
    conventions: Sequence[str] = ("exact",),
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Every scalar of :func:`metrics.open_set_report` for ``resamples`` stratified bootstrap resamples.

    Resampling units: the test samples, stratified: knowns (stratum 0), negatives -1 (stratum 1) and
    unknowns -2 (stratum 2) are resampled separately. Per resample the OSCR curve is the one of the
    expanded resample (CCR(θ) = correct knowns with S_y > θ / N_K, FPR(θ) = unknowns with max S > θ / N_U,
    θ over the scores present in the resample), computed from weighted cumulative sums over one sort per
    group shared by every resample; samples absent from a resample add no threshold. On the CPU each row is
    counted into reused uint8 buffers and turned into all its scalars in numpy (:class:`_OpenSetCPU`, the
    blocks of rows spread over threads as in :func:`metrics.auroc.bootstrap_auroc`; the exact convention costs about
    what the AUROC does); elsewhere batched torch. The values are the same either way.

    Returns:
        ``{key: (resamples,) float64}`` with the keys of ``open_set_report(...)["scalars"]``
        (``"closed_set_accuracy"``, ``"<group>/ccr@fpr=…"``, ``"<group>/authors_ccr@fpr=…"`` (NaN for "—"),
        ``"<group>/auroc"``, and ``"gamma"``, ``"gamma_plus"``, ``"gamma_minus"`` when negatives are present).
    """
    for convention in conventions:
        fpr_key(1.0, convention)
    _check_resamples(resamples, seed, 0)
    probs_k, target, num_known = check_probs_and_target(probs, target, background=background)
    probs_k = probs_k.detach()
    known = target >= 0
    if not bool(known.any()):
        raise ValueError("the open-set bootstrap needs at least one known sample (label >= 0)")
    targets = torch.as_tensor(list(fpr_targets), dtype=torch.float64, device=probs_k.device).flatten()
    if ((targets < 0) | (targets > 1) | ~torch.isfinite(targets)).any():
        raise ValueError(f"FPR targets must lie in [0, 1], got {targets.tolist()}")
    if "authors" in conventions and bool((targets == 0).any()):
        raise ValueError(f"FPR targets must lie in (0, 1] for convention='authors', got {targets.tolist()}")
    confidence, prediction = probs_k.max(dim=1)
    labels = target[known]
    target_score = probs_k[known].gather(1, labels[:, None]).squeeze(1)
    correct = prediction[known] == labels
    plan = _OpenSetPlan(target_score, correct)
    known_confidence = confidence[known]
    groups = {group: (confidence[target == label], stratum)
              for stratum, (group, label) in enumerate(GROUPS.items(), start=1) if bool((target == label).any())}
    auroc_plans = {group: _AUROCPlan(known_confidence, scores) for group, (scores, _) in groups.items()}
    exact_plans = {group: _ExactCCRPlan(plan, scores) for group, (scores, _) in groups.items()}
    negatives = probs_k[target == -1].double()
    offset = 1.0 if background else 1.0 + 1.0 / num_known
    gamma_minus_values = offset - negatives.max(dim=1).values if negatives.numel() else None

    if "authors" in conventions:  # the shared searches, once, before any thread
        plan._unique()
        for exact in exact_plans.values():
            exact.authors_search(plan)

    keys = ["closed_set_accuracy"]
    for group in groups:
        keys += [f"{group}/{fpr_key(t, c)}" for c in conventions for t in fpr_targets] + [f"{group}/auroc"]
    if gamma_minus_values is not None:
        keys += ["gamma", "gamma_plus", "gamma_minus"]

    num_known_samples = labels.numel()
    largest_group = max([scores.numel() for scores, _ in groups.values()], default=1)
    if probs_k.device.type == "cpu" and 2 * num_known_samples * largest_group <= INT64_LIMIT:
        arrays = {key: np.empty(resamples, dtype=np.float64) for key in keys}
        runner = _OpenSetCPU(plan, exact_plans, auroc_plans, groups, targets, conventions, gamma_minus_values, arrays)
        run_blocks(resamples, lambda mine: runner.work(mine, resamples, seed),
                   parallel=target.numel() >= PARALLEL_SIZE)
        return {key: torch.from_numpy(arrays[key]) for key in keys}
    return _bootstrap_open_set_torch(plan, exact_plans, auroc_plans, groups, targets, fpr_targets, conventions,
                                     gamma_minus_values, resamples, seed, keys)


def _bootstrap_open_set_torch(plan: _OpenSetPlan, exact_plans: dict[str, _ExactCCRPlan],
                              auroc_plans: dict[str, _AUROCPlan], groups: dict[str, tuple[Tensor, int]],
                              targets: Tensor, fpr_targets: Sequence[float], conventions: Sequence[str],
                              gamma_minus_values: Tensor | None, resamples: int, seed: int,
                              keys: list[str]) -> dict[str, Tensor]:
    """:func:`bootstrap_open_set` batched in torch, chunk of rows after chunk (accelerators)."""
    device = plan.target_score.device
    results: dict[str, list[Tensor]] = {key: [] for key in keys}
    num_samples = plan.target_score.numel() + sum(scores.numel() for scores, _ in groups.values())
    step = _chunk_rows(num_samples * max(1, len(targets)))
    known_side = _Side(plan.target_score.numel(), seed, 0)
    group_sides = {group: _Side(scores.numel(), seed, stratum) for group, (scores, stratum) in groups.items()}
    target_score_64 = plan.target_score.double()
    for start in range(0, resamples, step):
        rows = min(step, resamples - start)
        w_known = known_side.weights(rows, device)
        total_known = w_known.sum(dim=1, dtype=torch.int64).double()
        results["closed_set_accuracy"].append((w_known * plan.correct).sum(dim=1, dtype=torch.int64).double() / total_known)
        weights = {}
        for group, (scores, _) in groups.items():
            w_group = weights[group] = group_sides[group].weights(rows, device)
            for convention in conventions:
                if convention == "exact":
                    values = exact_plans[group].ccr(plan, w_known, w_group, targets)
                else:
                    values = _authors_ccr(plan, scores, w_known, w_group, targets, exact_plans[group])
                for column, fpr_target in enumerate(fpr_targets):
                    results[f"{group}/{fpr_key(fpr_target, convention)}"].append(values[:, column])
            results[f"{group}/auroc"].append(auroc_plans[group].area(w_known, w_group))
        if gamma_minus_values is not None:
            gamma_plus, gamma_minus, gamma_value = _weighted_gamma_rows(target_score_64, gamma_minus_values,
                                                                        w_known, weights["negatives"])
            results["gamma"].append(gamma_value)
            results["gamma_plus"].append(gamma_plus)
            results["gamma_minus"].append(gamma_minus)
    return {key: torch.cat(parts) for key, parts in results.items()}
