"""The metrics of the standard OOD benchmark (OpenOOD v1.5, Zhang et al. 2023) and the selective-classification
view of it (Traub et al., NeurIPS 2024), with the benchmark's whole table and its intervals.

**OpenOOD's metrics.** :func:`openood_metrics` returns what OpenOOD v1.5's ``compute_all_metrics``
(``openood/evaluators/metrics.py``) returns for one OOD set, from the project's functions: the AUROC
(:func:`metrics.auroc`: OpenOOD's ``auc(fpr, tpr)`` of the ROC with OOD positive and the score ``-conf`` is the same
Mann–Whitney area, ties ½), the FPR at 95% TPR with OOD positive on the points sklearn's ``roc_curve`` keeps
(:func:`metrics.fpr_at_tpr` with ``convention="openood"``), AUPR-In and AUPR-Out (the trapezoid,
:func:`metrics.aupr_in` / :func:`metrics.aupr_out`). OpenOOD's tables multiply these by 100; here they stay in
``[0, 1]``. Its near-/far-OOD figures are the plain mean over the sets of the group of the per-set values
(``openood/evaluation_api/evaluator.py``, ``_eval_ood``: ``np.mean(metrics_list, axis=0)``).

**Selective classification with OOD as failures** (Traub et al., "Overcoming Common Flaws in the Evaluation of
Selective Classification Systems", NeurIPS 2024; their code: ``fd_shifts/analysis/rc_stats.py``). Samples with a
confidence ``s`` (higher = more in-distribution: accepted first) and a failure indicator: in the OOD benchmark the
ID test images, a failure when misclassified, and one OOD set's images, always failures. With weights ``w`` (1
per sample, or bootstrap counts), the distinct confidences ``u_1 > u_2 > ... > u_B`` are the thresholds, and a
threshold accepts every sample with ``s >= u_b``, tied samples together (one point per distinct value, never a
split of a tie). At threshold ``b``::

    A_b = Σ_{s_i >= u_b} w_i     (accepted)        F_b = Σ_{s_i >= u_b, failure} w_i     (accepted failures)
    coverage c_b = A_b / W,   selective risk r_b = F_b / A_b,   generalized risk g_b = F_b / W,   W = Σ w

The risk-coverage curves join these points linearly (the trapezoid, as the authors' ``evaluate_auc``), from
coverage 0 to 1; at coverage 0 the generalized risk is 0 and the selective risk that of the first threshold
(``r_0 = r_1``, the authors' last point; ``g_0 = 0``). With ``m_b = A_b - A_{b-1}`` (``A_0 = F_0 = 0``)::

    AURC  = Σ_b (c_b - c_{b-1}) (r_b + r_{b-1}) / 2 = Σ_b m_b (r_b + r_{b-1}) / (2 W)
    AUGRC = Σ_b (c_b - c_{b-1}) (g_b + g_{b-1}) / 2 = Σ_b m_b (F_b + F_{b-1}) / (2 W²)

Both are means over coverage in ``[0, 1]`` of the interpolated risk: the AURC the mean selective risk, the
AUGRC the mean joint probability of being accepted and a failure ("the average risk of undetected failures").
The AUGRC equals the authors' identity ``AUGRC = (1 - AUROC_f) · acc · (1 - acc) + ½ (1 - acc)²`` exactly (the
sum counts, for every failure ``f``, the weight ranked strictly below it plus half the weight tied with it,
itself included: ``W² · AUGRC = Σ_f w_f (Σ_{s_j < s_f} w_j + ½ Σ_{s_j = s_f} w_j)``), with ``acc`` the share of
correct samples and ``AUROC_f`` the AUROC of correct against failed samples (ties ½); it is computed exactly in
integers for integer weights. Without ties the AURC is Geifman et al.'s per-sample mean
``(1/N) Σ_k r(k)`` (``r(k)`` the risk of the ``k`` most confident samples) plus ``(r(1) - r(N)) / (2N)`` (the
trapezoid's ends); with ties the per-sample form is undefined (which samples of a tie come first?), the one
point per distinct value is not. Lower is better for
both; an AURC of 0 / AUGRC of 0 needs no failure accepted before any correct sample (AUGRC's minimum is
``½ (1 - acc)²``, all failures last).

**Weighted, for the bootstrap.** :func:`weighted_aurc` / :func:`weighted_augrc` take weights ``(R, N)``; a row of
integer counts equals the unweighted function on the data expanded by it *exactly*: the thresholds of the
expanded data are the values with weight in the row, a value without weight adds a zero term and leaves the
next risk as it was, the AUGRC's numerator is an exact integer and the AURC's terms are summed in order.

**The benchmark's table.** :func:`benchmark_table` computes, for one detector and one ID set against the
ordered OOD sets of a benchmark, every metric per set and the near / far / all means, with percentile
bootstrap intervals over one shared resample (its docstring).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from metrics._validation import check_score_pair, check_scores
from metrics.auroc import auroc
from metrics.bootstrap_intervals import percentile_interval
from metrics.comparisons import worse_than_best
from metrics.detection import _Curve, _first_count, _scale, _unweighted
from metrics.resampling import (
    BLOCK_ROWS,
    INT32_LIMIT,
    _check_resamples,
    _check_weights,
    _RowStream,
    run_blocks,
)

OOD_GROUPS = ("near", "far")
"""OpenOOD's groups of OOD test sets; a table may have groups of its own too (the OOD unit tests: ``unit``)."""
ALL = "all"
"""The mean row over OpenOOD's groups (near and far; every set where the table has neither)."""
METRICS = ("auroc", "fpr@95tpr", "fpr@95tpr-openood", "aupr-in", "aupr-out", "aurc", "augrc")
"""The table's metric columns, in order; each has ``<metric> low`` and ``<metric> high``."""
HIGHER_IS_BETTER = {"auroc": True, "fpr@95tpr": False, "fpr@95tpr-openood": False, "aupr-in": True,
                    "aupr-out": True, "aurc": False, "augrc": False}
"""Each metric's direction (``metrics.worse_than_best(..., higher_is_better=...)``)."""
NOT_OOD_GROUPS = (ALL, "mean", "csid", "id_test", "id_val", "ood_val")
RISK_METRICS = ("aurc", "augrc")
"""The metrics that need the classifier's failures (``None`` without them)."""
ID_STRATUM = 0
TPR = 0.95
# Scores of one detector (ID + the largest set) from which the table's rows are spread over threads.
PARALLEL_SIZE = 1 << 14


# --------------------------------------------------------------------------------------------------
# checks


def _check_correct(correct: Tensor | object, n: int, *, name: str = "correct") -> Tensor:
    """A ``(n,)`` bool tensor from bools or 0/1 integers, refusing anything else."""
    correct = torch.as_tensor(correct)
    if correct.ndim != 1 or correct.numel() != n:
        raise ValueError(f"{name} must have shape ({n},), one flag per score, got {tuple(correct.shape)}")
    if correct.dtype != torch.bool:
        if correct.is_floating_point() or correct.is_complex():
            raise ValueError(f"{name} must hold bools or 0/1 integers, got {correct.dtype}")
        if correct.numel() and not bool(((correct == 0) | (correct == 1)).all()):
            bad = correct[(correct != 0) & (correct != 1)][:5].tolist()
            raise ValueError(f"{name} must hold bools or 0/1 integers, found {bad}")
        correct = correct.bool()
    return correct


def _check_risk_input(confidence: Tensor | object, correct: Tensor | object, what: str) -> tuple[Tensor, Tensor]:
    confidence = check_scores(confidence, name="confidence")
    if confidence.numel() == 0:
        raise ValueError(f"confidence is empty: {what} needs at least one sample")
    return confidence, _check_correct(correct, confidence.numel()).to(confidence.device)


# --------------------------------------------------------------------------------------------------
# the risk-coverage areas from the thresholds' counts


def _rc_areas(accepted: np.ndarray, failed: np.ndarray, total: int, *, with_augrc: bool = True) -> tuple[float, float]:
    """``(AURC, AUGRC)`` (module docstring) from the integer accepted and failed weight at or above each distinct
    value (``(B,)``, descending values; values without weight allowed: zero terms).

    The AUGRC's numerator is an exact int64 sum. The AURC's terms are summed in order (torch's CPU ``cumsum`` is
    sequential): a zero term leaves the sum as it was, so a row equals the expanded data's value exactly.
    """
    size = accepted.shape[0]
    if size == 0 or not total:
        return math.nan, math.nan
    gain = np.empty(size, dtype=accepted.dtype)
    gain[0] = accepted[0]
    np.subtract(accepted[1:], accepted[:-1], out=gain[1:])
    # the values before the first one with weight accept nothing: their risk is the first threshold's, r_0 = r_1
    start = int(np.searchsorted(accepted, accepted.dtype.type(0), side="right"))
    risk = np.empty(size + 1)
    np.divide(failed[start:], accepted[start:], out=risk[start + 1:])
    risk[:start + 1] = risk[start + 1]
    terms = risk[1:] + risk[:-1]
    np.multiply(terms, gain, out=terms)
    aurc = float(torch.cumsum(torch.from_numpy(terms), 0)[-1]) / (2.0 * total)
    if not with_augrc:
        return aurc, math.nan
    pairs = failed[1:] + failed[:-1]  # F_b + F_{b-1} <= 2 W
    numerator = int(gain[0]) * int(failed[0]) + int(np.multiply(gain[1:], pairs, dtype=np.int64).sum())
    return aurc, numerator / (2.0 * total * total)


def _rc_areas_rows(accepted: Tensor, failed: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_rc_areas` of ``(R, B)`` float64 rows at once (real weights, accelerators); NaN where a row has no
    weight."""
    gain = torch.diff(accepted, dim=1, prepend=torch.zeros_like(accepted[:, :1]))
    some = accepted > 0
    first = some.int().argmax(dim=1, keepdim=True)
    risk = failed / torch.where(some, accepted, torch.ones_like(accepted))
    risk = torch.where(some, risk, risk.gather(1, first))
    previous = torch.cat([risk[:, :1], risk[:, :-1]], dim=1)
    aurc = torch.cumsum(gain * (risk + previous), dim=1)[:, -1] / (2.0 * total)
    pairs = failed + torch.cat([torch.zeros_like(failed[:, :1]), failed[:, :-1]], dim=1)
    augrc = (gain * pairs).sum(dim=1) / (2.0 * total * total)
    empty = total <= 0
    return torch.where(empty, math.nan, aurc), torch.where(empty, math.nan, augrc)


class _RiskPlan:
    """One sort of the confidences (descending) and the place of each distinct value's last sample in it."""

    def __init__(self, confidence: Tensor, correct: Tensor) -> None:
        self.n = confidence.numel()
        self.device = confidence.device
        desc, self.order = torch.sort(confidence, descending=True, stable=True)
        values = torch.unique_consecutive(desc)
        self.hi = self.n - torch.searchsorted(desc.flip(0), values)  # samples at or above each value
        self.failure = (~correct).index_select(0, self.order)  # in sorted order
        if self.device.type == "cpu":
            self.np_order, self.np_hi = self.order.numpy(), self.hi.numpy()
            self.np_failure = self.failure.numpy().astype(np.uint8)

    def areas(self, weights: Tensor) -> tuple[Tensor, Tensor]:
        """``(AURC, AUGRC)`` of every row of ``(R, N)`` weights (float64 ``(R,)`` each; NaN for an empty row)."""
        if weights.dtype == torch.bool:
            weights = weights.to(torch.uint8)
        rows = weights.shape[0]
        if not weights.is_floating_point() and self.device.type == "cpu" and weights.device.type == "cpu":
            counts = weights.numpy()
            totals = counts.sum(axis=1, dtype=np.int64)
            wide = np.int32 if rows == 0 or 2 * int(totals.max()) <= INT32_LIMIT else np.int64  # 2 W fits
            aurc, augrc = np.full(rows, math.nan), np.full(rows, math.nan)
            cum_all = np.zeros(self.n + 1, dtype=wide)
            cum_failed = np.zeros(self.n + 1, dtype=wide)
            for r in range(rows):
                if totals[r] == 0:
                    continue
                gain = counts[r].take(self.np_order).astype(wide)
                np.cumsum(gain, out=cum_all[1:])
                np.cumsum(gain * self.np_failure, out=cum_failed[1:])
                aurc[r], augrc[r] = _rc_areas(cum_all[self.np_hi], cum_failed[self.np_hi], int(totals[r]))
            return torch.from_numpy(aurc), torch.from_numpy(augrc)
        weights = weights.to(self.device, torch.float64).index_select(1, self.order)
        zero = torch.zeros(rows, 1, dtype=torch.float64, device=self.device)
        cum_all = torch.cat([zero, torch.cumsum(weights, dim=1)], dim=1)
        cum_failed = torch.cat([zero, torch.cumsum(weights * self.failure, dim=1)], dim=1)
        aurc, augrc = _rc_areas_rows(cum_all.index_select(1, self.hi), cum_failed.index_select(1, self.hi),
                                     cum_all[:, -1])
        return aurc.cpu(), augrc.cpu()


def _ones(n: int, device: torch.device) -> Tensor:
    return torch.ones(1, n, dtype=torch.uint8, device=device)


def aurc(confidence: Tensor, correct: Tensor) -> float:
    """Area under the risk-coverage curve: the mean selective risk over coverage (module docstring).

    Args:
        confidence: ``(N,)`` confidence (higher = accepted first); tied samples are accepted together.
        correct: ``(N,)`` bools (or 0/1): whether the sample is a success (a correctly classified ID image); a
            failure otherwise (a misclassified ID image, any OOD image).

    Returns:
        The AURC in ``[0, 1]``; lower is better. 0 when nothing fails, 1 when everything does.

    Raises:
        ValueError: non-finite or empty confidences, ``correct`` of another length or not boolean.
    """
    confidence, correct = _check_risk_input(confidence, correct, "the AURC")
    return float(_RiskPlan(confidence, correct).areas(_ones(confidence.numel(), confidence.device))[0][0])


def augrc(confidence: Tensor, correct: Tensor) -> float:
    """Area under the generalized risk-coverage curve (Traub et al. 2024): the mean over coverage of the joint
    probability of being accepted and a failure, ``(1 - AUROC_f) · acc · (1 - acc) + ½ (1 - acc)²``
    (module docstring).

    Args: as :func:`aurc`.

    Returns:
        The AUGRC in ``[0, ½]``; lower is better (0 when nothing fails, ½ when everything does).
    """
    confidence, correct = _check_risk_input(confidence, correct, "the AUGRC")
    return float(_RiskPlan(confidence, correct).areas(_ones(confidence.numel(), confidence.device))[1][0])


def _weighted_areas(confidence: Tensor, correct: Tensor, weights: Tensor, what: str) -> tuple[Tensor, Tensor]:
    confidence, correct = _check_risk_input(confidence, correct, what)
    weights = _check_weights(weights, confidence.numel(), name="weights", device=confidence.device)
    return _RiskPlan(confidence, correct).areas(weights)


def weighted_aurc(confidence: Tensor, correct: Tensor, weights: Tensor) -> Tensor:
    """:func:`aurc` of every row of weights: row ``b`` counts sample ``i`` ``w_bi`` times.

    Args:
        confidence, correct: as :func:`aurc`.
        weights: ``(R, N)`` non-negative weights (integer bootstrap counts of :func:`metrics.resample_weights`,
            or real weights).

    Returns:
        ``(R,)`` float64; with integer weights row ``b`` equals :func:`aurc` on the data expanded by row ``b``
        exactly; NaN for a row of zero weights.
    """
    return _weighted_areas(confidence, correct, weights, "the weighted AURC")[0]


def weighted_augrc(confidence: Tensor, correct: Tensor, weights: Tensor) -> Tensor:
    """:func:`augrc` of every row of weights (as :func:`weighted_aurc`; integer rows exact to the expanded data)."""
    return _weighted_areas(confidence, correct, weights, "the weighted AUGRC")[1]


# --------------------------------------------------------------------------------------------------
# OpenOOD's compute_all_metrics


def openood_metrics(id_conf: Tensor, ood_conf: Tensor) -> dict[str, float]:
    """What OpenOOD v1.5's ``compute_all_metrics`` returns for one OOD set (its accuracy aside), in ``[0, 1]``.

    Args:
        id_conf: ``(N_id,)`` confidence of the ID test images (higher = more in-distribution).
        ood_conf: ``(N_ood,)`` confidence of one OOD set's images.

    Returns:
        ``{"auroc", "fpr@95tpr-openood", "aupr-in", "aupr-out"}``: :func:`metrics.auroc`,
        ``fpr_at_tpr(..., convention="openood")`` (OOD positive, the ROC points of sklearn's
        ``drop_intermediate=True``), :func:`metrics.aupr_in`, :func:`metrics.aupr_out` (trapezoid). OpenOOD's
        tables show these times 100.
    """
    id_conf, ood_conf = check_score_pair(id_conf, ood_conf, "OpenOOD's metrics")
    # one plan (one sort of each side) for the FPR and both AUPRs: the values of the separate functions
    values = _unweighted(id_conf, ood_conf, tpr=TPR, fpr="openood", aupr=("id", "ood"), aupr_convention="trapezoid")
    return {"auroc": auroc(id_conf, ood_conf), "fpr@95tpr-openood": float(values["fpr"][0]),
            "aupr-in": float(values["aupr_in"][0]), "aupr-out": float(values["aupr_out"][0])}


# --------------------------------------------------------------------------------------------------
# the benchmark's table


class IntervalSettings(Protocol):
    """What :func:`benchmark_table` reads of its ``intervals`` (``evaluation_engine.Intervals``)."""

    level: float
    resamples: int
    seed: int

    def auroc(self, id_scores: Tensor, ood_scores: Tensor) -> tuple[float | None, float | None]: ...

    def proportion(self, successes: int, trials: int) -> tuple[float, float]: ...


class ResampleCache:
    """The bootstrap counts of a benchmark's units, drawn once and shared by every detector's table.

    ``counts(n, stratum)`` is ``resample_weights(n, resamples, seed, stratum=stratum)`` as uint8 (``(R, n)``;
    the same rows, drawn by :mod:`metrics.resampling`'s generators; int32 should a count pass 255), kept for the
    next call: pass one cache to the :func:`benchmark_table` of every detector scored on the same images to draw
    the ID rows and each set's rows once (about a second at ImageNet's sizes and R = 1000, and 130 MB).
    """

    def __init__(self, resamples: int, seed: int) -> None:
        _check_resamples(resamples, seed, 0)
        self.resamples, self.seed = resamples, seed
        self._counts: dict[tuple[int, int], np.ndarray] = {}

    def counts(self, n: int, stratum: int) -> np.ndarray:
        key = (n, stratum)
        if key not in self._counts:
            rows = _RowStream(n, self.seed, stratum).counts(self.resamples, np.empty((self.resamples, n), np.uint8))
            rows.flags.writeable = False
            self._counts[key] = rows
        return self._counts[key]


@dataclass
class BenchmarkTable:
    """One detector's benchmark table (:func:`benchmark_table`).

    Attributes:
        rows: one dict per OOD set in the given order, then the mean of each group (``"near"``, ``"far"``, any
            other group such as ``"unit"``, in the order the groups first appear) and ``"all"`` (near and far):
            ``"set"`` (the set's name or the mean's), ``"group"`` (the set's group, ``"mean"`` for a mean), ``"images"`` (the set's OOD images; a mean's: its sets'), then every
            metric of :data:`METRICS` with ``"<metric> low"`` and ``"<metric> high"``.
        replicates: ``(row name, metric) -> (R,)`` float64 bootstrap replicates; replicate ``b`` of every row and
            metric comes from the same resample ``b`` of the images (paired across rows, metrics and detectors
            scored on the same images with the same seed and strata).
        accuracy: ``(accuracy, low, high)`` of the classifier on the ID images (Wilson's interval); ``None`` without
            the classifier's failures.
        level: the intervals' confidence level.
    """

    rows: list[dict[str, Any]]
    replicates: dict[tuple[str, str], Tensor] = field(repr=False)
    accuracy: tuple[float, float, float] | None
    level: float

    def row(self, name: str) -> dict[str, Any]:
        """The row of a set or a mean by its name."""
        for row in self.rows:
            if row["set"] == name:
                return row
        raise KeyError(f"no row {name!r} in the table; rows: {[row['set'] for row in self.rows]}")


def _check_sets(ood_sets: Mapping[str, Tensor], groups: Mapping[str, str], strata: Mapping[str, int] | None,
                device: torch.device) -> tuple[list[str], dict[str, Tensor], dict[str, int]]:
    if not isinstance(ood_sets, Mapping) or not ood_sets:
        raise ValueError("ood_sets must be a non-empty mapping of OOD set name -> scores")
    names = list(ood_sets)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"OOD set names must be non-empty strings, got {name!r}")
        if name in (*OOD_GROUPS, ALL, *groups.values()):
            raise ValueError(f"an OOD set may not be named {name!r}: the groups and {ALL!r} name the table's mean rows")
    if set(groups) != set(names):
        missing, extra = sorted(set(names) - set(groups)), sorted(set(groups) - set(names))
        raise ValueError(f"groups must name the group of every OOD set and nothing else: missing {missing}, "
                         f"not an OOD set {extra}")
    for name in names:
        group = groups[name]
        if not isinstance(group, str) or not group.isidentifier() or group in NOT_OOD_GROUPS:
            raise ValueError(f"the group of OOD set {name!r} must be a name of OOD test sets such as {OOD_GROUPS} or "
                             f"'unit' (not one of {NOT_OOD_GROUPS}: ID sets, validation sets and the means), got "
                             f"{group!r}")
    scores = {}
    for name in names:
        values = check_scores(ood_sets[name], name=f"the scores of OOD set {name!r}").to(device)
        if values.numel() == 0:
            raise ValueError(f"OOD set {name!r} has no scores")
        scores[name] = values
    if strata is None:
        strata = {name: 1 + position for position, name in enumerate(names)}
    else:
        if set(strata) != set(names):
            raise ValueError(f"strata must give every OOD set its stratum: missing {sorted(set(names) - set(strata))}"
                             f", not an OOD set {sorted(set(strata) - set(names))}")
        for name, value in strata.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"the stratum of OOD set {name!r} must be an integer >= 1 (0 is the ID images), "
                                 f"got {value!r}")
        if len(set(strata.values())) != len(strata):
            raise ValueError(f"every OOD set needs its own stratum, got {dict(strata)}")
        strata = dict(strata)
    return names, scores, strata


class _SetPlan:
    """What every resample of one (detector, OOD set) shares: the set's sort and its places among the ID scores."""

    def __init__(self, id_desc: Tensor, ood_scores: Tensor) -> None:
        self.n = ood_scores.numel()
        ood_desc, order = torch.sort(ood_scores, descending=True, stable=True)
        id_asc = id_desc.flip(0)
        num_id = id_desc.numel()
        self.id_curve = _Curve(id_desc, ood_desc)  # ID positive: AUPR-In, FPR (ID)
        self.ood_curve = _Curve(-ood_desc.flip(0), -id_desc.flip(0))  # OOD positive: AUPR-Out, FPR (OpenOOD)
        # numpy gathers in the rows (numpy never starts threads of its own: the rows' blocks run on threads)
        self.order = order.numpy()
        # AUROC: each OOD sample (in sorted order) against the ID weight strictly above it and tied with it
        above = num_id - torch.searchsorted(id_asc, ood_desc, right=True)
        at_or_above = num_id - torch.searchsorted(id_asc, ood_desc, right=False)
        self.above = above.numpy()
        tied = (at_or_above != above).nonzero().squeeze(1)
        self.tied, self.tied_above, self.tied_at = tied.numpy(), above[tied].numpy(), at_or_above[tied].numpy()
        # the thresholds of the risk-coverage curves: the distinct values of both sides (the ID curve's grid)
        self.grid_id, self.grid_ood, _ = self.id_curve.grid()
        self.ood_curve.grid()  # computed before the threads start

    def _above(self, cum_id: np.ndarray, gain: np.ndarray) -> int:
        """``Σ_j v_j (C(> t_j) + C(>= t_j))`` for ID cumulative weights ``C`` (descending), exact in int64 (the
        products fit int32)."""
        twice = 2 * int(np.multiply(cum_id.take(self.above), gain).sum(dtype=np.int64))
        if self.tied.size:
            tied = cum_id.take(self.tied_at) - cum_id.take(self.tied_above)
            twice += int(np.multiply(tied, gain.take(self.tied)).sum(dtype=np.int64))
        return twice

    def metrics(self, counts: np.ndarray, shared: _IDRow, out: dict[str, np.ndarray], r: int) -> None:
        """Every metric of one row of the set's counts into ``out[metric][r]``."""
        gain = counts.take(self.order)
        cum = np.zeros(self.n + 1, dtype=np.int32)
        torch.cumsum(torch.from_numpy(gain), 0, dtype=torch.int32, out=torch.from_numpy(cum[1:]))
        total = int(cum[-1])
        total_id, cum_id = shared.total, shared.cum
        # AUROC: twice U = Σ_j v_j (W_id(> t_j) + W_id(>= t_j))
        twice = self._above(cum_id, gain)
        out["auroc"][r] = twice / (2.0 * total_id * total)
        out["fpr@95tpr"][r] = float(cum[self.id_curve.np_neg_ge[shared.value]]) / total
        out["aupr-in"][r] = _scale(self.id_curve.row(cum_id, cum, shared.gain, None, "trapezoid")[1], total_id,
                                   "trapezoid")
        cum_asc = total - cum[::-1]
        out["aupr-out"][r] = _scale(self.ood_curve.row(cum_asc, shared.cum_asc, gain[::-1], None, "trapezoid")[1],
                                    total, "trapezoid")
        start = self.ood_curve.first_value(cum_asc, _first_count(total, TPR))
        out["fpr@95tpr-openood"][r] = self.ood_curve.kept_fp(cum_asc, shared.cum_asc, start) / total_id
        ood_part = cum.take(self.grid_ood)
        accepted = cum_id.take(self.grid_id)
        accepted += ood_part
        failed = shared.cum_failed.take(self.grid_id)
        failed += ood_part
        out["aurc"][r] = _rc_areas(accepted, failed, total_id + total, with_augrc=False)[0]
        # AUGRC by pairs, O(N_set) (module docstring: 2 W² AUGRC = Σ_f w_f (2 W - A(>= s_f) - A(> s_f)), failures
        # the misclassified ID images E and the set O), exact in integers: the grid's sum's value
        total_all, failures = total_id + total, shared.total_failed + total
        pairs = (shared.failed_pairs + 2 * shared.total_failed * total - self._above(shared.cum_failed, gain)
                 + twice + total * total)
        out["augrc"][r] = (2 * total_all * failures - pairs) / (2.0 * total_all * total_all)


class _IDSide:
    """What every resample of one detector's ID scores shares: their sort, the misclassified images in it and the
    places of their values (every cumulative sum counts the ID weight from the most confident end)."""

    def __init__(self, id_order: Tensor, correct: Tensor, curve: _Curve) -> None:
        self.order = id_order.numpy()
        failure = (~correct).index_select(0, id_order)
        self.failure = failure.numpy().astype(np.uint8)
        self.curve = curve
        failed = failure.nonzero().squeeze(1)
        values = curve.value_of[failed]
        self.failed = failed.numpy()  # the misclassified images' places in the sorted order
        self.failed_at = curve.pos_hi[values].numpy()  # ID at or above each one's value
        self.failed_above = curve.pos_lo[values].numpy()  # ID strictly above it


class _IDRow:
    """One row of the ID counts in the detector's sorted order, shared by every set: the counts (``gain``), their
    cumulative sums from the most confident end (``cum``; of the misclassified images ``cum_failed``) and from
    the least confident end (``cum_asc``), the ID value at which 95% of the ID weight is reached, and the
    misclassified images' pairs among the ID images ``Σ_e w_e (W(>= s_e) + W(> s_e))`` (the AUGRC's ID part)."""

    def __init__(self, counts: np.ndarray, side: _IDSide) -> None:
        self.gain = counts.take(side.order)
        size = self.gain.shape[0] + 1
        self.cum, self.cum_failed = np.zeros(size, dtype=np.int32), np.zeros(size, dtype=np.int32)
        # numpy buffers: torch's fills would start its thread pool inside the rows' threads
        torch.cumsum(torch.from_numpy(self.gain), 0, dtype=torch.int32, out=torch.from_numpy(self.cum[1:]))
        torch.cumsum(torch.from_numpy(self.gain * side.failure), 0, dtype=torch.int32,
                     out=torch.from_numpy(self.cum_failed[1:]))
        self.total, self.total_failed = int(self.cum[-1]), int(self.cum_failed[-1])
        self.cum_asc = self.total - self.cum[::-1]
        self.value = side.curve.first_value(self.cum, _first_count(self.total, TPR))
        around = self.cum.take(side.failed_at) + self.cum.take(side.failed_above)  # <= 2 W: fits int32
        self.failed_pairs = int(np.multiply(around, self.gain.take(side.failed), dtype=np.int64).sum())


def benchmark_table(
    id_scores: Tensor,
    id_correct: Tensor | None,
    ood_sets: Mapping[str, Tensor],
    groups: Mapping[str, str],
    *,
    intervals: IntervalSettings,
    strata: Mapping[str, int] | None = None,
    cache: ResampleCache | None = None,
    id_parts: Sequence[tuple[int, int]] | None = None,
) -> BenchmarkTable:
    """One detector's table of the OOD benchmark: every metric per OOD set, their near / far / all means, and
    intervals over one shared resample.

    Per set (ID test images against the set's images): ``auroc`` (:func:`metrics.auroc`), ``fpr@95tpr`` (ID
    positive, the project's :func:`metrics.fpr_at_tpr`), ``fpr@95tpr-openood`` (OOD positive, OpenOOD v1.5's:
    ``convention="openood"``), ``aupr-in``, ``aupr-out`` (trapezoid), ``aurc`` and ``augrc`` (ID images fail when
    misclassified, OOD images always: :func:`aurc`, :func:`augrc` on the concatenation). Each row's value equals
    the public function on the row's data exactly.

    Means: one per group (``near``, ``far``, ``unit``, ...) and ``all`` (the near and far sets; every set where
    there are neither), the plain mean over the sets of the per-set values (OpenOOD's near-/far-OOD figures), of
    every metric.

    Intervals: ``intervals.level`` percentile bootstrap intervals over ``intervals.resamples`` resamples, except
    the AUROC of a set, whose interval is ``intervals.auroc`` (by default logit DeLong; its bootstrap replicates
    are kept all the same). One resample is shared by the whole table: the ID images are resampled once
    (stratum 0, :func:`metrics.resample_weights` keyed by image index: the same rows for every set and every
    detector) and each OOD set separately with its own stratum (``strata[set]``, default ``1 +`` its position;
    pass the same strata to every detector). A mean's replicate ``b`` is the mean of its sets' replicates ``b``,
    so its interval accounts for the ID images the sets share. The sets themselves are held fixed: the
    intervals cover the sampling of images within the sets, not the choice of the sets (another benchmark's
    sets would differ by more). ``replicates[(row, metric)]`` pair across rows, metrics and detectors, for
    :func:`metrics.worse_than_best` per column (:data:`HIGHER_IS_BETTER` gives each metric's direction).

    Args:
        id_scores: ``(N_id,)`` the detector's confidence on the ID test images (higher = more in-distribution);
            for the full-spectrum benchmark the caller appends the covariate-shifted ID images here.
        id_correct: ``(N_id,)`` bools: whether the classifier got each ID image right; ``None`` where it is not
            known (scores of another tool without predictions): then AURC, AUGRC and the accuracy are ``None``.
        ood_sets: OOD set name -> ``(N_s,)`` the detector's confidence on the set's images, in table order.
        groups: OOD set name -> its group: ``"near"``, ``"far"`` (OpenOOD's), or one of the table's own (the OOD unit
            tests, ``"unit"``: a mean of their own, outside ``"all"``).
        intervals: ``evaluation_engine.Intervals`` (level, resamples, seed, ``auroc``, ``proportion``).
        strata: OOD set name -> its resampling stratum (distinct integers >= 1); default ``1 +`` position.
        cache: a :class:`ResampleCache` of ``(intervals.resamples, intervals.seed)`` shared by the detectors'
            tables, so that the resamples are drawn once; default: drawn for this table.
        id_parts: where the ID side is several sets (the full-spectrum benchmark: the ID test images, then each
            covariate-shifted set), ``(images, stratum)`` of each part in order, each resampled on its own (the ID
            test images stratum 0, each shifted set its own stratum, distinct from the OOD sets'); default: one
            part, stratum 0.

    Returns:
        The :class:`BenchmarkTable`: its rows, replicates and the ID accuracy with Wilson's interval
        (``intervals.proportion``). Computed on the CPU (rows of integer counts in numpy, blocks of rows over
        ``torch.get_num_threads()`` threads; the values do not depend on them).

    Raises:
        ValueError: bad scores or flags (naming the set), sets without a group or with another group than
            near / far, a set named like a mean row, strata that are not distinct integers >= 1, a cache of
            other resamples; all before any resampling.
    """
    id_scores = check_scores(id_scores, name="id_scores")
    if id_scores.numel() == 0:
        raise ValueError("id_scores is empty: the benchmark needs the ID test images' scores")
    known = id_correct is not None
    correct = (_check_correct(id_correct, id_scores.numel(), name="id_correct") if known
               else torch.ones(id_scores.numel(), dtype=torch.bool))
    names, sets, strata = _check_sets(ood_sets, groups, strata, id_scores.device)
    resamples, seed = intervals.resamples, intervals.seed
    if cache is None:
        cache = ResampleCache(resamples, seed)
    elif (cache.resamples, cache.seed) != (resamples, seed):
        raise ValueError(f"the cache holds {cache.resamples} resamples of seed {cache.seed}, the intervals ask for "
                         f"{resamples} of seed {seed}")
    id_scores, correct = id_scores.cpu(), correct.cpu()
    dtype = functools.reduce(torch.promote_types, [s.dtype for s in sets.values()], id_scores.dtype)
    id_scores = id_scores.to(dtype)
    sets = {name: values.cpu().to(dtype) for name, values in sets.items()}

    id_desc, id_order = torch.sort(id_scores, descending=True, stable=True)
    num_id = id_scores.numel()
    if num_id * 255 > INT32_LIMIT or any(s.numel() * 255 > INT32_LIMIT for s in sets.values()):
        raise ValueError("benchmark_table counts in int32: at most (2**31 - 1) / 255 images per side")
    plans = {name: _SetPlan(id_desc, sets[name]) for name in names}
    side = _IDSide(id_order, correct, plans[names[0]].id_curve)

    def compute(id_counts: np.ndarray, set_counts: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        rows = id_counts.shape[0]
        out = {name: {metric: np.empty(rows) for metric in METRICS} for name in names}

        def work(blocks: list[int]) -> None:
            for block in blocks:
                for r in range(block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, rows)):
                    shared = _IDRow(id_counts[r], side)
                    for name in names:
                        plans[name].metrics(set_counts[name][r], shared, out[name], r)

        run_blocks(rows, work, parallel=rows > BLOCK_ROWS and num_id + max(s.numel() for s in sets.values()) >= PARALLEL_SIZE)
        return out

    estimates = compute(np.ones((1, num_id), np.uint8), {name: np.ones((1, sets[name].numel()), np.uint8)
                                                        for name in names})
    if id_parts is None:
        id_counts = cache.counts(num_id, ID_STRATUM)
    else:
        parts = [(int(n), int(stratum)) for n, stratum in id_parts]
        if sum(n for n, _ in parts) != num_id or len({s for _, s in parts}) != len(parts) \
                or {s for _, s in parts} & set(strata.values()):
            raise ValueError(f"id_parts {parts} must cover the {num_id} ID scores, each part with its own stratum, none "
                             f"an OOD set's {sorted(strata.values())}")
        id_counts = np.concatenate([cache.counts(n, stratum) for n, stratum in parts], axis=1)
    replicates_by_set = compute(id_counts,
                                {name: cache.counts(sets[name].numel(), strata[name]) for name in names})

    level = float(intervals.level)
    table_rows: list[dict[str, Any]] = []
    replicates: dict[tuple[str, str], Tensor] = {}
    for name in names:
        row: dict[str, Any] = {"set": name, "group": groups[name], "images": sets[name].numel()}
        for metric in METRICS:
            values = torch.from_numpy(replicates_by_set[name][metric])
            replicates[(name, metric)] = values
            row[metric] = float(estimates[name][metric][0])
            if metric == "auroc":
                row["auroc low"], row["auroc high"] = intervals.auroc(id_scores, sets[name])
            else:
                row[f"{metric} low"], row[f"{metric} high"] = percentile_interval(values, level)
        table_rows.append(row)
    openood = [name for name in names if groups[name] in OOD_GROUPS] or names
    for mean in [*dict.fromkeys(groups[name] for name in names), ALL]:
        members = openood if mean == ALL else [name for name in names if groups[name] == mean]
        if not members:
            continue
        row = {"set": mean, "group": "mean", "images": sum(sets[name].numel() for name in members)}
        for metric in METRICS:
            values = torch.stack([replicates[(name, metric)] for name in members]).mean(dim=0)
            replicates[(mean, metric)] = values
            row[metric] = float(np.mean([float(estimates[name][metric][0]) for name in members]))
            row[f"{metric} low"], row[f"{metric} high"] = percentile_interval(values, level)
        table_rows.append(row)
    if not known:  # no failures known: no risk-coverage areas, no accuracy
        for row in table_rows:
            for metric in RISK_METRICS:
                row[metric] = row[f"{metric} low"] = row[f"{metric} high"] = None
        for key in [key for key in replicates if key[1] in RISK_METRICS]:
            del replicates[key]
        return BenchmarkTable(table_rows, replicates, None, level)
    successes = int(correct.sum())
    low, high = intervals.proportion(successes, num_id)
    return BenchmarkTable(table_rows, replicates, (successes / num_id, float(low), float(high)), level)


def table_marks(tables: Mapping[str, BenchmarkTable], level: float | None = None) -> dict[tuple[str, str], dict[str, bool]]:
    """Which detectors are worse than the best, per column, simultaneously (:func:`metrics.worse_than_best`).

    Args:
        tables: detector name -> its :class:`BenchmarkTable`, all over the same images, seed and strata (their
            replicates paired).
        level: the family-wise level per column; default the tables' level.

    Returns:
        ``(row name, metric) -> {detector: marked}`` for every row and metric of the tables.
    """
    detectors = list(tables)
    if not detectors:
        return {}
    first = tables[detectors[0]]
    keys = list(first.replicates)
    for name in detectors[1:]:
        if list(tables[name].replicates) != keys:
            raise ValueError(f"the tables of {detectors[0]!r} and {name!r} have other rows; compare tables of the "
                             "same OOD sets")
    level = first.level if level is None else level
    marks: dict[tuple[str, str], dict[str, bool]] = {}
    for key in keys:
        row, metric = key
        estimates = torch.tensor([tables[name].row(row)[metric] for name in detectors], dtype=torch.float64)
        stacked = torch.stack([tables[name].replicates[key] for name in detectors])
        marked = worse_than_best(estimates, stacked, level, higher_is_better=HIGHER_IS_BETTER[metric])
        marks[key] = dict(zip(detectors, marked.tolist(), strict=True))
    return marks


__all__ = [
    "HIGHER_IS_BETTER",
    "METRICS",
    "BenchmarkTable",
    "IntervalSettings",
    "ResampleCache",
    "aurc",
    "augrc",
    "benchmark_table",
    "openood_metrics",
    "table_marks",
    "weighted_aurc",
    "weighted_augrc",
]
