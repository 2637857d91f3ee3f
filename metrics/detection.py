"""The OOD-detection metrics reported beside the AUROC: FPR at 95% TPR, AUPR-In and AUPR-Out.

Scores follow the project's κ convention: confidences, **higher = more in-distribution**. A threshold ``t``
*accepts* a sample as ID when its score ``s >= t``; the thresholds are the distinct scores (one per distinct
value, so tied samples always enter together), counted exactly in integers.

**FPR@TPR** (``convention="id"``, the default). ID is the positive class, as for :func:`metrics.auroc`:

    t* = the largest threshold with  fl(#{ID s >= t} / N_id) >= tpr
    FPR@TPR = #{OOD s >= t*} / N_ood

the fraction of OOD samples accepted at the strictest threshold that accepts at least ``tpr`` of the ID
samples (in float64, as both references compare the rate: ``t*`` is the ``⌈tpr·N_id⌉``-th largest ID score
up to the rounding of ``tpr``). OOD samples tied with ``t*`` are accepted, i.e. count as false positives.
No interpolation between thresholds. This is sklearn's ``roc_curve(is_id, score, drop_intermediate=False)``
read at the first point with ``tpr >= 0.95``, and the definition in the text of ODIN (Liang et al., ICLR
2018: "the probability that a negative (OOD) example is misclassified as positive (ID) when the TPR is
95%"), of the energy score (Liu et al., NeurIPS 2020) and of most published tables; the Hendrycks-lineage
code (``fpr_and_fdr_at_recall`` in energy_ood and its descendants) makes ID positive by default too
(``--out_as_pos`` off), though it reads the point nearest to 95% instead of the first one reaching it.

``convention="ood"``: OOD is the positive class, as in both references below: with the outlier score
``-s``, the OOD detection rate is fixed instead,

    c* = the smallest score with  fl(#{OOD s <= c} / N_ood) >= tpr
    FPR@TPR = #{ID s <= c*} / N_id

the fraction of ID samples rejected when at least ``tpr`` of the OOD samples are rejected; ID samples tied
with ``c*`` are rejected. It is the mirror image: ``fpr_at_tpr(a, b, convention="ood") ==
fpr_at_tpr(-b, -a, convention="id")``. The two conventions are different numbers (not a relabelling): e.g.
ID ``[5, 4, 3, 1]``, OOD ``[3, 3, 1, 0]`` give 0.75 (OOD accepted at 100% of ID: ``t* = 1``) and 0.5 (ID
rejected at 100% of OOD: ``c* = 3``).

``convention="openood"``: exactly OpenOOD v1.5's ``compute_all_metrics`` (``auc_and_fpr_recall``:
``fpr_list[argmax(tpr_list >= 0.95)]`` of ``roc_curve(ood_indicator, -conf)``), i.e. ``"ood"`` read on the
points that sklearn's ``roc_curve`` keeps with its default ``drop_intermediate=True``. The ROC has one point per
distinct score of both sides together, ``p_j = (#ID s <= u_j, #OOD s <= u_j)`` for the distinct scores ``u_j``
ascending; sklearn keeps the first and the last point and drops an interior point whose step from the point
before equals the step to the point after (``p_j - p_{j-1} == p_{j+1} - p_j``: its rule
``where(r_[True, logical_or(diff(fps, 2), diff(tps, 2)), True])``, applied before it prepends ``(0, 0)``).
The FPR is then read at the first *kept* point whose OOD rate reaches ``tpr``: the ``"ood"`` point ``c*`` when
it is kept, else the first kept point after it, at the end of its run of equal steps, whose FPR is never
lower. Weighted, the points are the distinct scores with weight in the row (those of the expanded data).

**AUPR** (``convention="trapezoid"``, the default, as both references). The precision-recall curve of the
positive class has one point per distinct threshold, in sklearn's ``precision_recall_curve`` form: with
``TP_k``, ``FP_k`` the positives and negatives at or beyond threshold ``k`` (thresholds from the most to the
least positive), ``R_k = TP_k / N_pos``, ``P_k = TP_k / (TP_k + FP_k)``, starting from ``(R_0, P_0) = (0, 1)``;
the area is the trapezoid over these points (``sklearn.metrics.auc(recall, precision)``)::

    AUPR = Σ_k (R_k - R_{k-1}) (P_k + P_{k-1}) / 2

``convention="average_precision"``: sklearn's ``average_precision_score``, the step integral
``Σ_k (R_k - R_{k-1}) P_k`` (the linear interpolation of the trapezoid overstates the area where the
precision falls between points, Davis & Goadrich 2006). **AUPR-In** (:func:`aupr_in`): ID positive, score ``s``. **AUPR-Out**
(:func:`aupr_out`): OOD positive, score ``-s``. So ``aupr_in(a, b) == aupr_out(-b, -a)``.

**Where the references differ** (read from their code: pytorch-ood 0.4.0 ``pytorch_ood.metrics``
``OODMetrics`` / ``functional.py``, inputs outlier scores with labels, OOD = label < 0; OpenOOD v1.5
``openood/evaluators/metrics.py``, ``compute_all_metrics`` → ``auc_and_fpr_recall``):

- Which class is positive for FPR@95: the same in both, **OOD** (pytorch-ood ``FPRAtTPR``: "the fraction of
  ID samples that are flagged as OOD when ... 95% of the OOD samples are detected"; OpenOOD:
  ``roc_curve(ood_indicator, -conf)``, adopted in commit 873e8c2, Aug 2023, "fix ood eval (ood as pos)";
  before it, OpenOOD v1.0 used ``fpr_recall``, ID positive, still in the file but unused). Both
  therefore compute ``convention="ood"``, not the literature's ``"id"``.
- Ties at the 95% point: both take every distinct score as a threshold, ``>=``, the first point whose rate
  reaches ``tpr`` (pytorch-ood: ``searchsorted`` on the TPR; OpenOOD: ``argmax(tpr >= 0.95)``), no
  interpolation. But OpenOOD calls ``roc_curve`` with its default ``drop_intermediate=True``, which removes
  the thresholds inside a run of thresholds with identical (ID, OOD) increments. When the first point with
  TPR >= 0.95 is one of them, OpenOOD reads the FPR at the end of the run, a higher value; pytorch-ood keeps
  every threshold. This needs ties (with distinct scores a removed point lies on a vertical segment and
  the FPR is unchanged). Example (confidences): ID ``[1, 2, 3] + 7 × [10]``, OOD ``17 × [0] + [1, 2, 3]``:
  pytorch-ood 0.2 (19 of 20 OOD rejected at ``c* = 2``, ID ``{1, 2}`` rejected), OpenOOD 0.3 (the point
  ``(2/10, 19/20)`` is removed, the next kept one is ``(3/10, 20/20)``). ``convention="ood"`` follows
  pytorch-ood (every threshold), i.e. OpenOOD without the removal; it is never above OpenOOD's value.
  ``convention="openood"`` is OpenOOD's, removal included.
- AUPR: the same in both, the **trapezoid** over sklearn's precision-recall points, ``(0, 1)`` included
  (OpenOOD: ``auc(recall, precision)``; pytorch-ood: "by the trapezoidal rule, as
  ``sklearn.metrics.auc(recall, precision)``"), not the average precision. Their AUPR-In (ID positive,
  ``conf``) and AUPR-Out (OOD positive, ``-conf``) agree to rounding (summation order).
- (Not a reference here: Hendrycks et al.'s ``fpr_and_fdr_at_recall`` takes the point *nearest* to 95%
  recall and their AUPR is the average precision.)

The project follows the literature's FPR@95 (ID positive, ``convention="id"``, the default: it is what the
method papers' tables report and the project's positive class everywhere) and offers ``"ood"`` to reproduce
pytorch-ood exactly and ``"openood"`` to reproduce OpenOOD v1.5's tables exactly; it follows both
references for the AUPR (the trapezoid) and offers ``"average_precision"``.

**Bootstrap.** :func:`weighted_fpr_at_tpr` and :func:`weighted_aupr` take resampling weights ``(R, N)`` per
side, keyed by sample (integer counts of :func:`metrics.resampling.resample_weights` or
:func:`metrics.resampling.cluster_weights`), and compute every row over one sort of each side: the row's
weights in sorted order, their cumulative sum, and the counts at and beyond every distinct value read from
it at places found once. The curve of the AUPR-In needs only the distinct ID values (the point before a
value counts what lies strictly above it), the AUPR-Out only the distinct OOD values, and the FPR one binary
search. On the CPU integer counts go row by row through numpy (a row's arrays stay in cache; blocks of rows
over threads in :func:`bootstrap_detection`), elsewhere batched torch over chunks of rows (memory bounded by
``CHUNK_ELEMENTS``), with the same values. A distinct value without weight in a row adds an exactly zero term
(a repeated point), and the terms are summed in order (torch's CPU ``cumsum`` is sequential), so a row equals
the unweighted function on the data expanded by that row's weights *exactly* (on an accelerator, to
rounding). :func:`bootstrap_detection` resamples ID and OOD separately with the strata of
:func:`metrics.auroc.bootstrap_auroc` (ID 0, OOD 1), so its row ``b`` uses the weights of row ``b`` of
the AUROC bootstrap: the replicates pair with the AUROC's. Measured on 2 CPU cores, R = 1000: about 1.3 s at
N_id = N_ood = 5·10^4, 2 s at 10^5 each (``bootstrap_auroc``: about 1 s; drawing the weights is much of either).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from metrics._validation import check_level, check_score_pair
from metrics.bootstrap_intervals import percentile_interval
from metrics.resampling import (
    BLOCK_ROWS,
    INT32_LIMIT,
    _check_resamples,
    _check_weight_pair,
    _check_weights,
    _Side,
    run_blocks,
)

FPR_CONVENTIONS = ("id", "ood", "openood")
AUPR_CONVENTIONS = ("trapezoid", "average_precision")
# The strata of metrics.auroc.bootstrap_auroc: the same seed gives the same resamples (paired replicates).
ID_STRATUM = 0
OOD_STRATUM = 1
# Elements per work array of a chunk of rows (rows x (N_id + N_ood)): about 8 arrays of 8 bytes live at once.
CHUNK_ELEMENTS = 1 << 20
# Scores (N_id + N_ood) from which the CPU bootstrap spreads its blocks of rows over threads (measured: below
# it the threads cost more than they save on 2 cores).
PARALLEL_SIZE = 1 << 16


# --------------------------------------------------------------------------------------------------
# checks


def _check_tpr(tpr: float) -> float:
    if isinstance(tpr, bool) or not isinstance(tpr, (int, float)) or not (0.0 < float(tpr) <= 1.0):
        raise ValueError(f"tpr must be a number in (0, 1], got {tpr!r}")
    return float(tpr)


def _check_convention(convention: str, allowed: tuple[str, ...], name: str = "convention") -> str:
    if convention not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {convention!r}")
    return convention


def _check_positive(positive: str) -> str:
    return _check_convention(positive, ("id", "ood"), "positive")


def fpr_at_tpr_key(tpr: float = 0.95) -> str:
    """The replicate key of the FPR at ``tpr``: ``"fpr@95tpr"`` for 0.95, ``"fpr@90tpr"`` for 0.9."""
    return f"fpr@{_check_tpr(tpr) * 100:g}tpr"


# --------------------------------------------------------------------------------------------------
# the shared plan: one sort of each side


class _Curve:
    """The thresholds of one curve and where they fall in both sorted sides.

    The curve's *positive* side P (ID for the ID curve, OOD for the OOD curve) is oriented so that a higher
    score is more positive (the OOD curve uses ``-s``); a threshold at the distinct value ``u`` counts the
    samples at or beyond it (``>= u``). With ``CP`` / ``CQ`` the cumulative weights of P and of the negative
    side Q in descending oriented order (``C[0] = 0``), the curve's point at ``u`` is ``TP = CP[pos_hi]``,
    ``FP = CQ[neg_ge]`` and the point before it (samples strictly beyond ``u``) ``CP[pos_lo]``,
    ``CQ[neg_gt]``. The values run from the most to the least positive, the order of the curve.
    """

    def __init__(self, pos_desc: Tensor, neg_desc: Tensor) -> None:
        self.num_pos, self.num_neg = pos_desc.numel(), neg_desc.numel()
        values, value_of = torch.unique_consecutive(pos_desc, return_inverse=True)
        pos_asc, neg_asc = pos_desc.flip(0), neg_desc.flip(0)
        search = torch.searchsorted
        self.pos_hi = self.num_pos - search(pos_asc, values)  # P at or beyond each value
        self.pos_lo = self.num_pos - search(pos_asc, values, right=True)  # P strictly beyond it
        self.neg_ge = self.num_neg - search(neg_asc, values)
        self.neg_gt = self.num_neg - search(neg_asc, values, right=True)
        self.value_of = value_of  # each sorted P sample's value
        self.ties = values.numel() < self.num_pos
        self.cross_ties = not torch.equal(self.neg_ge, self.neg_gt)  # some Q sample equals some P value
        self._sorted = (pos_asc, neg_asc, values)
        self._grid: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if pos_desc.device.type == "cpu":
            self.np_pos_hi = self.pos_hi.numpy()
            self.np_neg_ge, self.np_neg_gt = self.neg_ge.numpy(), self.neg_gt.numpy()
            self.np_value_of = value_of.numpy()

    # -- the ROC points of sklearn's roc_curve, for drop_intermediate (convention="openood") -------------

    def grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct values of both sides together, from the most to the least positive: ``(P at or beyond
        each, Q at or beyond each, each P value's place in it)`` (numpy int64; computed once, on demand).
        sklearn's ``roc_curve`` has one point per such value (``_binary_clf_curve``)."""
        if self._grid is None:
            pos_asc, neg_asc, values = self._sorted
            union = torch.unique(torch.cat([pos_asc, neg_asc])).flip(0)  # descending
            search = torch.searchsorted
            pos_ge = self.num_pos - search(pos_asc, union)
            neg_ge = self.num_neg - search(neg_asc, union)
            place = search(-union, -values)  # each P value's index in the descending grid
            self._grid = (pos_ge.cpu().numpy().astype(np.int64), neg_ge.cpu().numpy().astype(np.int64),
                          place.cpu().numpy().astype(np.int64))
        return self._grid

    def first_value(self, cp: np.ndarray, first_count: int) -> int:
        """The P value (index in :attr:`value_of`'s values) at which the TP count first reaches ``first_count``
        in one row of integer cumulative counts ``cp`` (``(N_pos + 1,)``, curve order)."""
        place = int(np.searchsorted(cp, cp.dtype.type(first_count))) - 1  # the P sample where TP reaches it
        return int(self.np_value_of[place]) if self.ties else place

    def kept_fp(self, cp: np.ndarray, cq: np.ndarray, value: int) -> float:
        """The FP count (``cq`` units) of the first point that sklearn's ``roc_curve(..., drop_intermediate=True)``
        keeps at or after the point of P value ``value``, in one row of cumulative weights ``cp`` / ``cq``
        (``(N + 1,)``, curve order; integers or floats).

        The curve's points are the grid values with weight in this row (a value without weight is no point of
        the data the row expands to): ``p_j = (FP_j, TP_j)`` at or beyond value ``j``. sklearn keeps the first
        and the last point and an interior point ``j`` unless ``p_j - p_{j-1} == p_{j+1} - p_j`` (its rule
        ``where(r_[True, logical_or(diff(fps, 2), diff(tps, 2)), True])``). The point at ``value`` has weight
        (its TP grew there); the point before it counts what lies strictly beyond ``value``, whatever grid value
        that is; the walk goes on from ``value`` through the run of equal steps, chunk by chunk.
        """
        pos_ge, neg_ge, place = self.grid()
        start = int(place[value])
        if start == 0:
            return float(cq[neg_ge[0]])  # the first grid value: the first point, kept
        prev_q, prev_p = cq[neg_ge[start - 1]], cp[pos_ge[start - 1]]
        cur_q, cur_p = cq[neg_ge[start]], cp[pos_ge[start]]
        if prev_q == 0 and prev_p == 0:
            return float(cur_q)  # nothing beyond it in this row: the first point, kept
        size, j, step = pos_ge.shape[0], start + 1, 32
        while j < size:
            stop = min(j + step, size)
            qs = np.concatenate(([cur_q], cq[neg_ge[j:stop]]))
            ps = np.concatenate(([cur_p], cp[pos_ge[j:stop]]))
            moved = (qs[1:] != qs[:-1]) | (ps[1:] != ps[:-1])  # the grid values with weight in this row
            if moved.any():
                seq_q = np.concatenate(([prev_q, cur_q], qs[1:][moved]))
                seq_p = np.concatenate(([prev_p, cur_p], ps[1:][moved]))
                dq, dp = np.diff(seq_q), np.diff(seq_p)
                differ = (dq[:-1] != dq[1:]) | (dp[:-1] != dp[1:])  # point i's step differs from the next one's
                if differ.any():
                    return float(seq_q[1 + int(np.argmax(differ))])
                prev_q, prev_p, cur_q, cur_p = seq_q[-2], seq_p[-2], seq_q[-1], seq_p[-1]
            j, step = stop, 2 * step
        return float(cur_q)  # the last point, kept

    # -- one row of integer counts, numpy (the CPU path) ----------------------------------------------

    def row(self, cp: np.ndarray, cq: np.ndarray, gain: np.ndarray, first_count: int | None,
            area: str | None) -> tuple[float, float]:
        """``(FP count at the FPR point, summed area terms)`` of one row (NaN for what is not asked): ``cp`` /
        ``cq`` the ``(N + 1,)`` integer cumulative counts in curve order, ``gain`` the P counts in curve order,
        ``first_count`` the least TP count whose rate reaches the TPR (None: no FPR), ``area`` the AUPR
        convention (None: no area); :func:`_scale` turns the sum into the area."""
        fp_count = math.nan
        if first_count is not None:
            place = int(np.searchsorted(cp, cp.dtype.type(first_count))) - 1  # the P sample where TP reaches it
            value = int(self.np_value_of[place]) if self.ties else place
            fp_count = float(cq[self.np_neg_ge[value]])
        if area is None:
            return fp_count, math.nan
        if self.ties:  # TP at each value; the P beyond a value are those at or beyond the value before it
            counts = np.zeros(self.np_pos_hi.shape[0] + 1, dtype=cp.dtype)
            np.take(cp, self.np_pos_hi, out=counts[1:])
            tp, tp_before = counts[1:], counts[:-1]
            gain = tp - tp_before
        else:
            tp, tp_before = cp[1:], cp[:-1]
        fp = cq.take(self.np_neg_ge)
        precision = _np_precision(tp, fp)
        if area == "trapezoid":
            precision += _np_precision(tp_before, cq.take(self.np_neg_gt) if self.cross_ties else fp)
        precision *= gain
        # summed in order (torch's CPU cumsum is sequential): a zero term leaves the sum bit-for-bit unchanged
        return fp_count, float(torch.cumsum(torch.from_numpy(precision), 0)[-1])

    # -- rows of any weights, batched torch (accelerators, real weights) -------------------------------

    def rows(self, cp: Tensor, cq: Tensor, tpr: float | None, area: str | None) -> tuple[Tensor | None, Tensor | None]:
        """``(FP weight at the FPR point, area)`` of ``(rows, N + 1)`` float64 cumulative weights."""
        tp = cp.index_select(1, self.pos_hi)
        fp = cq.index_select(1, self.neg_ge)
        fp_at = terms = None
        if tpr is not None:
            rate = tp / cp[:, -1:]
            target = torch.full((rate.shape[0], 1), tpr, dtype=rate.dtype, device=rate.device)
            place = torch.searchsorted(rate, target).clamp_(max=rate.shape[1] - 1)  # the curve ends at TPR 1
            fp_at = fp.gather(1, place).squeeze(1)
        if area is not None:
            tp_before = cp.index_select(1, self.pos_lo)
            terms = _precision(tp, fp)
            if area == "trapezoid":
                terms = terms + _precision(tp_before, cq.index_select(1, self.neg_gt))
            terms = torch.cumsum((tp - tp_before) * terms, dim=1)[:, -1]
        return fp_at, terms


def _np_precision(tp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``TP / (TP + FP)`` in float64, 1 where nothing is accepted yet (sklearn's first point ``(0, 1)``): the
    counts grow along the curve, so those points are a prefix, found by binary search."""
    accepted = tp + fp
    start = int(np.searchsorted(accepted, accepted.dtype.type(0), side="right"))
    out = np.empty(accepted.shape[0], dtype=np.float64)
    out[:start] = 1.0
    np.divide(tp[start:], accepted[start:], out=out[start:])
    return out


def _precision(tp: Tensor, fp: Tensor) -> Tensor:
    accepted = tp + fp
    return torch.where(accepted > 0, tp / accepted, 1.0)


def _first_count(total: int, tpr: float) -> int:
    """The least count ``k`` with ``k / total >= tpr`` in float64 (the references compare the rate; the
    division is correctly rounded, so monotone in ``k``)."""
    k = min(total, max(1, math.ceil(tpr * total)))
    while k > 1 and (k - 1) / total >= tpr:
        k -= 1
    while k < total and k / total < tpr:
        k += 1
    return k


class _DetectionPlan:
    """What every row of weights shares: each side sorted once (descending), and the two curves over it: the
    ID curve (ID positive, confidence; AUPR-In, FPR ``convention="id"``) and the OOD curve (OOD positive,
    minus the confidence; AUPR-Out, ``convention="ood"``), whose cumulative counts are those of the ID curve
    read from the other end (``C_asc[p] = total - C_desc[N - p]``)."""

    def __init__(self, id_scores: Tensor, ood_scores: Tensor) -> None:
        self.num_id, self.num_ood = id_scores.numel(), ood_scores.numel()
        self.device = id_scores.device
        id_desc, self.id_order = torch.sort(id_scores, descending=True, stable=True)
        ood_desc, self.ood_order = torch.sort(ood_scores, descending=True, stable=True)
        self.id_curve = _Curve(id_desc, ood_desc)
        self.ood_curve = _Curve(-ood_desc.flip(0), -id_desc.flip(0))
        if self.device.type == "cpu":
            self.np_id_order, self.np_ood_order = self.id_order.numpy(), self.ood_order.numpy()

    def metrics(self, id_weights: Tensor, ood_weights: Tensor, *, tpr: float | None = None, fpr: str = "id",
                aupr: tuple[str, ...] = (), aupr_convention: str = "trapezoid") -> dict[str, Tensor]:
        """``{"fpr": (rows,)}`` (when ``tpr`` is given, by convention ``fpr``) and ``"aupr_in"`` /
        ``"aupr_out"`` for the positive sides named in ``aupr``; float64, NaN for a row without weight on a
        side. Integer weights on the CPU go row by row through numpy (exact integer counts, each row's arrays in
        cache, threads free of torch's intra-op pool); others batched through torch. The values are the same."""
        if id_weights.dtype == torch.bool:
            id_weights = id_weights.to(torch.uint8)
        if ood_weights.dtype == torch.bool:
            ood_weights = ood_weights.to(torch.uint8)
        integer = not (id_weights.is_floating_point() or ood_weights.is_floating_point())
        if integer and self.device.type == "cpu" and id_weights.device.type == "cpu" and ood_weights.device.type == "cpu":
            return self._numpy_rows(id_weights.numpy(), ood_weights.numpy(), tpr, fpr, aupr, aupr_convention)
        return self._torch_rows(id_weights, ood_weights, tpr, fpr, aupr, aupr_convention)

    def _numpy_rows(self, id_counts: np.ndarray, ood_counts: np.ndarray, tpr: float | None, fpr: str,
                    aupr: tuple[str, ...], aupr_convention: str) -> dict[str, Tensor]:
        rows = id_counts.shape[0]
        id_totals = id_counts.sum(axis=1, dtype=np.int64)
        ood_totals = ood_counts.sum(axis=1, dtype=np.int64)
        wide = np.int32 if rows == 0 or int(id_totals.max()) + int(ood_totals.max()) <= INT32_LIMIT else np.int64
        out = {key: np.full(rows, math.nan) for key in self._keys(tpr, aupr)}
        area = {"id": aupr_convention if "id" in aupr else None, "ood": aupr_convention if "ood" in aupr else None}
        cum_id = np.zeros(self.num_id + 1, dtype=wide)
        cum_ood = np.zeros(self.num_ood + 1, dtype=wide)
        t_cum_id, t_cum_ood = torch.from_numpy(cum_id), torch.from_numpy(cum_ood)
        for r in range(rows):
            total_id, total_ood = int(id_totals[r]), int(ood_totals[r])
            if total_id == 0 or total_ood == 0:
                continue  # no curve: NaN
            id_gain = id_counts[r].take(self.np_id_order)  # descending confidence
            ood_gain = ood_counts[r].take(self.np_ood_order)
            # integer cumulative counts (torch's int32 cumsum is several times faster than numpy's)
            torch.cumsum(torch.from_numpy(id_gain), 0, dtype=t_cum_id.dtype, out=t_cum_id[1:])
            torch.cumsum(torch.from_numpy(ood_gain), 0, dtype=t_cum_ood.dtype, out=t_cum_ood[1:])
            if (tpr is not None and fpr == "id") or area["id"] is not None:
                first = _first_count(total_id, tpr) if tpr is not None and fpr == "id" else None
                fp_count, value = self.id_curve.row(cum_id, cum_ood, id_gain, first, area["id"])
                if first is not None:
                    out["fpr"][r] = fp_count / total_ood
                if area["id"] is not None:
                    out["aupr_in"][r] = _scale(value, total_id, area["id"])
            if (tpr is not None and fpr in ("ood", "openood")) or area["ood"] is not None:
                # the OOD curve's cumulative counts, from the least confident end
                cum_ood_asc = total_ood - cum_ood[::-1]
                cum_id_asc = total_id - cum_id[::-1]
                first = _first_count(total_ood, tpr) if tpr is not None and fpr == "ood" else None
                fp_count, value = self.ood_curve.row(cum_ood_asc, cum_id_asc, ood_gain[::-1], first, area["ood"])
                if first is not None:
                    out["fpr"][r] = fp_count / total_id
                if tpr is not None and fpr == "openood":
                    start = self.ood_curve.first_value(cum_ood_asc, _first_count(total_ood, tpr))
                    out["fpr"][r] = self.ood_curve.kept_fp(cum_ood_asc, cum_id_asc, start) / total_id
                if area["ood"] is not None:
                    out["aupr_out"][r] = _scale(value, total_ood, area["ood"])
        return {key: torch.from_numpy(values) for key, values in out.items()}

    def _torch_rows(self, id_weights: Tensor, ood_weights: Tensor, tpr: float | None, fpr: str,
                    aupr: tuple[str, ...], aupr_convention: str) -> dict[str, Tensor]:
        id_weights, ood_weights = id_weights.to(self.device), ood_weights.to(self.device)
        rows = id_weights.shape[0]
        cum_id = torch.zeros(rows, self.num_id + 1, dtype=torch.float64, device=self.device)
        cum_ood = torch.zeros(rows, self.num_ood + 1, dtype=torch.float64, device=self.device)
        torch.cumsum(id_weights.index_select(1, self.id_order), dim=1, dtype=torch.float64, out=cum_id[:, 1:])
        torch.cumsum(ood_weights.index_select(1, self.ood_order), dim=1, dtype=torch.float64, out=cum_ood[:, 1:])
        total_id, total_ood = cum_id[:, -1], cum_ood[:, -1]
        out: dict[str, Tensor] = {}
        if (tpr is not None and fpr == "id") or "id" in aupr:
            fp_at, area = self.id_curve.rows(cum_id, cum_ood, tpr if fpr == "id" else None,
                                             aupr_convention if "id" in aupr else None)
            if fp_at is not None:
                out["fpr"] = fp_at / total_ood
            if area is not None:
                out["aupr_in"] = _scale(area, total_id, aupr_convention)
        if (tpr is not None and fpr in ("ood", "openood")) or "ood" in aupr:
            cum_ood_asc = total_ood[:, None] - cum_ood.flip(1)
            cum_id_asc = total_id[:, None] - cum_id.flip(1)
            fp_at, area = self.ood_curve.rows(cum_ood_asc, cum_id_asc, tpr if fpr == "ood" else None,
                                              aupr_convention if "ood" in aupr else None)
            if fp_at is not None:
                out["fpr"] = fp_at / total_id
            if tpr is not None and fpr == "openood":  # sklearn's dropped points: a short walk per row, on the CPU
                curve = self.ood_curve
                rate = cum_ood_asc.index_select(1, curve.pos_hi) / total_ood[:, None]
                target = torch.full((rate.shape[0], 1), tpr, dtype=rate.dtype, device=rate.device)
                start = torch.searchsorted(rate, target).clamp_(max=rate.shape[1] - 1).squeeze(1).cpu().tolist()
                cp, cq = cum_ood_asc.cpu().numpy(), cum_id_asc.cpu().numpy()
                fp_kept = [curve.kept_fp(cp[r], cq[r], start[r]) for r in range(cp.shape[0])]
                out["fpr"] = torch.tensor(fp_kept, dtype=torch.float64, device=self.device) / total_id
            if area is not None:
                out["aupr_out"] = _scale(area, total_ood, aupr_convention)
        empty = (total_id <= 0) | (total_ood <= 0)
        return {key: torch.where(empty, math.nan, out[key]).cpu() for key in self._keys(tpr, aupr)}

    @staticmethod
    def _keys(tpr: float | None, aupr: tuple[str, ...]) -> list[str]:
        return (["fpr"] if tpr is not None else []) + [f"aupr_{'in' if side == 'id' else 'out'}" for side in aupr]


def _scale(summed, total, convention: str):
    """The area from its summed terms ``Σ gain · (P + P_before)`` (trapezoid) or ``Σ gain · P``."""
    return summed / (2.0 * total) if convention == "trapezoid" else summed / total


# --------------------------------------------------------------------------------------------------
# point estimates


def _unweighted(id_scores: Tensor, ood_scores: Tensor, **wanted) -> dict[str, Tensor]:
    plan = _DetectionPlan(id_scores, ood_scores)
    ones_id = torch.ones(1, plan.num_id, dtype=torch.int32, device=plan.device)
    ones_ood = torch.ones(1, plan.num_ood, dtype=torch.int32, device=plan.device)
    return plan.metrics(ones_id, ones_ood, **wanted)


def fpr_at_tpr(id_scores: Tensor, ood_scores: Tensor, tpr: float = 0.95, *, convention: str = "id") -> float:
    """False positive rate at the threshold that reaches a true positive rate of ``tpr`` (module docstring).

    Args:
        id_scores: ``(N_id,)`` confidence of in-distribution samples (higher = more in-distribution).
        ood_scores: ``(N_ood,)`` confidence of out-of-distribution samples.
        tpr: in ``(0, 1]``.
        convention: ``"id"`` (default): the fraction of OOD samples accepted at the largest threshold ``t``
            (accepting ``s >= t``) that accepts at least ``tpr`` of the ID samples (ODIN, energy, the method
            papers). ``"ood"``: the fraction of ID samples rejected at the smallest threshold ``c`` (rejecting
            ``s <= c``) that rejects at least ``tpr`` of the OOD samples (pytorch-ood's ``FPR95TPR``).
            ``"openood"``: ``"ood"`` read on the ROC points that sklearn's ``roc_curve(drop_intermediate=True)``
            keeps (module docstring), exactly OpenOOD v1.5's ``fpr@95`` (``compute_all_metrics``); never below
            ``"ood"``, equal to it unless ties put the ``"ood"`` point inside a run of equal ROC steps.

    Returns:
        The FPR in ``[0, 1]``; lower is better.

    Raises:
        ValueError: non-finite scores, an empty side, ``tpr`` outside ``(0, 1]`` or an unknown convention.
    """
    tpr = _check_tpr(tpr)
    convention = _check_convention(convention, FPR_CONVENTIONS)
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "FPR@TPR")
    return float(_unweighted(id_scores, ood_scores, tpr=tpr, fpr=convention)["fpr"][0])


def aupr_in(id_scores: Tensor, ood_scores: Tensor, *, convention: str = "trapezoid") -> float:
    """Area under the precision-recall curve with ID as the positive class and the confidence as the score.

    Args:
        id_scores: ``(N_id,)``; ood_scores: ``(N_ood,)`` confidences (higher = more in-distribution).
        convention: ``"trapezoid"`` (default, pytorch-ood's ``AUPR-IN`` and OpenOOD's ``aupr_in``:
            ``auc(recall, precision)``) or ``"average_precision"`` (sklearn's ``average_precision_score``).

    Returns:
        The AUPR-In in ``[0, 1]``; higher is better (a random detector gets about ``N_id / (N_id + N_ood)``).
    """
    convention = _check_convention(convention, AUPR_CONVENTIONS)
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "AUPR-In")
    return float(_unweighted(id_scores, ood_scores, aupr=("id",), aupr_convention=convention)["aupr_in"][0])


def aupr_out(id_scores: Tensor, ood_scores: Tensor, *, convention: str = "trapezoid") -> float:
    """Area under the precision-recall curve with OOD as the positive class and minus the confidence as the
    score (:func:`aupr_in` with the roles swapped: ``aupr_out(a, b) == aupr_in(-b, -a)``).

    Returns:
        The AUPR-Out in ``[0, 1]``; higher is better (a random detector gets about ``N_ood / (N_id + N_ood)``).
    """
    convention = _check_convention(convention, AUPR_CONVENTIONS)
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "AUPR-Out")
    return float(_unweighted(id_scores, ood_scores, aupr=("ood",), aupr_convention=convention)["aupr_out"][0])


# --------------------------------------------------------------------------------------------------
# weighted rows and the bootstrap


def _chunk_rows(num_samples: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(num_samples, 1))


def _weighted(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor, ood_weights: Tensor,
              what: str, **wanted) -> dict[str, Tensor]:
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, what)
    id_weights, ood_weights = _check_weight_pair(id_scores, ood_scores, id_weights, ood_weights)
    plan = _DetectionPlan(id_scores, ood_scores)
    step = _chunk_rows(plan.num_id + plan.num_ood)
    parts = [plan.metrics(id_weights[start:start + step], ood_weights[start:start + step], **wanted)
             for start in range(0, id_weights.shape[0], step)]
    if not parts:
        return {}
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def weighted_fpr_at_tpr(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor, ood_weights: Tensor,
                        tpr: float = 0.95, *, convention: str = "id") -> Tensor:
    """:func:`fpr_at_tpr` of every weighted resample at once: row ``b`` counts sample ``i`` ``w_bi`` times.

    Args:
        id_scores: ``(N_id,)``; ood_scores: ``(N_ood,)``.
        id_weights: ``(R, N_id)``; ood_weights: ``(R, N_ood)`` non-negative weights, one row per resample
            (integer counts from :func:`metrics.resampling.resample_weights` / ``cluster_weights``, keyed by
            sample; real weights are accepted and weight the counts).
        tpr, convention: as :func:`fpr_at_tpr`.

    Returns:
        ``(R,)`` float64: with integer weights row ``b`` equals :func:`fpr_at_tpr` on the data expanded by
        row ``b`` exactly; NaN for a row whose ID or OOD weights are all zero.
    """
    tpr = _check_tpr(tpr)
    convention = _check_convention(convention, FPR_CONVENTIONS)
    rows = _weighted(id_scores, ood_scores, id_weights, ood_weights, "weighted FPR@TPR", tpr=tpr, fpr=convention)
    return rows.get("fpr", torch.empty(0, dtype=torch.float64))


def weighted_aupr(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor, ood_weights: Tensor, *,
                  positive: str = "id", convention: str = "trapezoid") -> Tensor:
    """:func:`aupr_in` (``positive="id"``) or :func:`aupr_out` (``positive="ood"``) of every weighted resample.

    Args: as :func:`weighted_fpr_at_tpr`; ``convention`` as :func:`aupr_in`.

    Returns:
        ``(R,)`` float64: with integer weights row ``b`` equals the unweighted AUPR of the data expanded by
        row ``b`` exactly (on the CPU); NaN for a row whose ID or OOD weights are all zero.
    """
    side = _check_positive(positive)
    convention = _check_convention(convention, AUPR_CONVENTIONS)
    rows = _weighted(id_scores, ood_scores, id_weights, ood_weights, "weighted AUPR", aupr=(side,),
                     aupr_convention=convention)
    return rows.get("aupr_in" if side == "id" else "aupr_out", torch.empty(0, dtype=torch.float64))


def _given_weights(weights: Tensor | None, n: int, resamples: int, *, name: str, device: torch.device) -> Tensor | None:
    """A side's own resampling weights, checked: ``(resamples, n)``, finite and non-negative."""
    if weights is None:
        return None
    weights = _check_weights(weights, n, name=name, device=device)
    if weights.shape[0] != resamples:
        raise ValueError(f"{name} must have one row per resample, shape ({resamples}, {n}), "
                         f"got {tuple(weights.shape)}")
    return weights


def bootstrap_detection(
    id_scores: Tensor,
    ood_scores: Tensor,
    resamples: int = 1000,
    seed: int = 0,
    *,
    id_weights: Tensor | None = None,
    ood_weights: Tensor | None = None,
    tpr: float = 0.95,
    fpr_convention: str = "id",
    aupr_convention: str = "trapezoid",
) -> dict[str, Tensor]:
    """FPR@TPR, AUPR-In and AUPR-Out of ``resamples`` stratified bootstrap resamples.

    Resampling units: the ID samples (stratum 0) and the OOD samples (stratum 1), resampled separately: the
    weights of :func:`metrics.auroc.bootstrap_auroc` with the same ``seed`` (row ``b`` is row ``b`` of
    ``resample_weights(N_id, resamples, seed, stratum=0)`` and ``(N_ood, ..., stratum=1)``), so replicate ``b``
    of every metric here pairs with AUROC replicate ``b``. ``id_weights`` / ``ood_weights`` replace a side's
    default weights (e.g. :func:`metrics.resampling.cluster_weights` of the OOD classes); they need
    ``resamples`` rows. The default weights are drawn chunk by chunk, never all ``R x N`` at once; on the CPU
    at large N the blocks of rows are spread over ``torch.get_num_threads()`` threads (the values do not
    depend on it).

    Returns:
        ``{fpr_at_tpr_key(tpr): (R,), "aupr_in": (R,), "aupr_out": (R,)}`` float64 (``"fpr@95tpr"`` for the
        default ``tpr``); row ``b`` equals the unweighted functions on resample ``b`` expanded.
    """
    _check_resamples(resamples, seed, 0)
    tpr = _check_tpr(tpr)
    fpr_convention = _check_convention(fpr_convention, FPR_CONVENTIONS, "fpr_convention")
    aupr_convention = _check_convention(aupr_convention, AUPR_CONVENTIONS, "aupr_convention")
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "the detection bootstrap")
    num_id, num_ood = id_scores.numel(), ood_scores.numel()
    given_id = _given_weights(id_weights, num_id, resamples, name="id_weights", device=id_scores.device)
    given_ood = _given_weights(ood_weights, num_ood, resamples, name="ood_weights", device=id_scores.device)
    plan = _DetectionPlan(id_scores, ood_scores)
    wanted = {"tpr": tpr, "fpr": fpr_convention, "aupr": ("id", "ood"), "aupr_convention": aupr_convention}
    key = fpr_at_tpr_key(tpr)
    arrays = {name: torch.empty(resamples, dtype=torch.float64) for name in (key, "aupr_in", "aupr_out")}
    step = _chunk_rows(num_id + num_ood)

    def work(blocks: list[int]) -> None:
        for block in blocks:  # a block of BLOCK_ROWS rows has its own generators (metrics.resampling)
            first, last = block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, resamples)
            id_side = _Side(num_id, seed, ID_STRATUM, None, first) if given_id is None else None
            ood_side = _Side(num_ood, seed, OOD_STRATUM, None, first) if given_ood is None else None
            for start in range(first, last, step):
                rows = min(step, last - start)
                w_id = given_id[start:start + rows] if id_side is None else torch.from_numpy(id_side.counts(rows))
                w_ood = (given_ood[start:start + rows] if ood_side is None
                         else torch.from_numpy(ood_side.counts(rows)))
                values = plan.metrics(w_id, w_ood, **wanted)
                arrays[key][start:start + rows] = values["fpr"]
                arrays["aupr_in"][start:start + rows] = values["aupr_in"]
                arrays["aupr_out"][start:start + rows] = values["aupr_out"]

    run_blocks(resamples, work, parallel=plan.device.type == "cpu" and num_id + num_ood >= PARALLEL_SIZE)
    return arrays


def detection_intervals(
    id_scores: Tensor,
    ood_scores: Tensor,
    *,
    level: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
    tpr: float = 0.95,
    fpr_convention: str = "id",
    aupr_convention: str = "trapezoid",
) -> dict[str, tuple[float, float, float]]:
    """Point estimate and percentile bootstrap interval of FPR@TPR, AUPR-In and AUPR-Out.

    Returns:
        ``{fpr_at_tpr_key(tpr): (estimate, low, high), "aupr_in": (...), "aupr_out": (...)}``: the estimate
        from all samples (:func:`fpr_at_tpr`, :func:`aupr_in`, :func:`aupr_out`), the interval the
        ``(1 ± level)/2`` quantiles of :func:`bootstrap_detection`
        (:func:`metrics.bootstrap_intervals.percentile_interval`).
    """
    level = check_level(level)
    replicates = bootstrap_detection(id_scores, ood_scores, resamples, seed, tpr=tpr,
                                     fpr_convention=fpr_convention, aupr_convention=aupr_convention)
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "the detection intervals")
    estimates = _unweighted(id_scores, ood_scores, tpr=tpr, fpr=fpr_convention, aupr=("id", "ood"),
                            aupr_convention=aupr_convention)
    key = fpr_at_tpr_key(tpr)
    out = {}
    for name, estimate in ((key, estimates["fpr"]), ("aupr_in", estimates["aupr_in"]),
                           ("aupr_out", estimates["aupr_out"])):
        out[name] = (float(estimate[0]), *percentile_interval(replicates[name], level))
    return out


__all__ = [
    "AUPR_CONVENTIONS",
    "FPR_CONVENTIONS",
    "aupr_in",
    "aupr_out",
    "bootstrap_detection",
    "detection_intervals",
    "fpr_at_tpr",
    "fpr_at_tpr_key",
    "weighted_aupr",
    "weighted_fpr_at_tpr",
]
