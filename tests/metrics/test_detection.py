"""metrics.detection against its two references, pytorch-ood's ``OODMetrics`` and OpenOOD v1.5's
``compute_all_metrics`` (re-implemented below from its formula), sklearn, hand-computed values, and the
weighted rows against the unweighted functions on the expanded resamples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytorch_ood.metrics import OODMetrics
from sklearn import metrics as sk

import metrics.detection as detection
from metrics.auroc import auroc, bootstrap_auroc, weighted_auroc
from metrics.bootstrap_intervals import percentile_interval
from metrics.detection import (
    aupr_in,
    aupr_out,
    bootstrap_detection,
    detection_intervals,
    fpr_at_tpr,
    fpr_at_tpr_key,
    weighted_aupr,
    weighted_fpr_at_tpr,
)
from metrics.resampling import cluster_weights, resample_weights

# -- references ----------------------------------------------------------------------------------------------


def openood_reference(id_conf, ood_conf, tpr=0.95, drop_intermediate=True):
    """OpenOOD v1.5's ``auc_and_fpr_recall`` (openood/evaluators/metrics.py), from its formula: labels ``-1`` for
    OOD, OOD positive with the score ``-conf`` for the ROC and the AUPR-Out, ID positive with ``conf`` for the
    AUPR-In, FPR at the first ROC point with ``tpr >= 0.95`` of sklearn's ``roc_curve`` (its default
    ``drop_intermediate=True``), AUPR as the trapezoid ``auc(recall, precision)``."""
    conf = np.r_[np.asarray(id_conf, float), np.asarray(ood_conf, float)]
    label = np.r_[np.zeros(len(id_conf)), -np.ones(len(ood_conf))]
    ood_indicator = (label == -1).astype(int)
    fpr_list, tpr_list, _ = sk.roc_curve(ood_indicator, -conf, drop_intermediate=drop_intermediate)
    fpr = fpr_list[np.argmax(tpr_list >= tpr)]
    precision_in, recall_in, _ = sk.precision_recall_curve(1 - ood_indicator, conf)
    precision_out, recall_out, _ = sk.precision_recall_curve(ood_indicator, -conf)
    return float(fpr), float(sk.auc(recall_in, precision_in)), float(sk.auc(recall_out, precision_out))


def pytorch_ood_reference(id_conf, ood_conf, tpr=0.95):
    """pytorch-ood's ``OODMetrics``: outlier scores (``-conf``), labels < 0 for OOD."""
    metric = OODMetrics(fpr_at=tpr)
    scores = -torch.tensor(np.r_[np.asarray(id_conf, float), np.asarray(ood_conf, float)])
    labels = torch.tensor(np.r_[np.zeros(len(id_conf)), -np.ones(len(ood_conf))]).long()
    result = metric.update(scores, labels).compute()
    return result[f"FPR{tpr * 100:g}TPR"], result["AUPR-IN"], result["AUPR-OUT"]


def id_positive_reference(id_conf, ood_conf, tpr=0.95):
    """The literature's FPR@95 by brute force: the largest threshold t (accepting s >= t) that accepts at least
    ``tpr`` of the ID samples (the rate in float64), and the fraction of OOD samples it accepts."""
    id_conf, ood_conf = np.asarray(id_conf, float), np.asarray(ood_conf, float)
    for t in np.unique(np.r_[id_conf, ood_conf])[::-1]:
        if np.sum(id_conf >= t) / len(id_conf) >= tpr:
            return np.sum(ood_conf >= t) / len(ood_conf)
    raise AssertionError("unreachable: the lowest threshold accepts every ID sample")


def sklearn_id_positive(id_conf, ood_conf, tpr=0.95):
    """The same from sklearn's ROC with ID positive, every threshold kept."""
    labels = np.r_[np.ones(len(id_conf)), np.zeros(len(ood_conf))]
    fpr, tpr_curve, _ = sk.roc_curve(labels, np.r_[id_conf, ood_conf], drop_intermediate=False)
    return fpr[np.argmax(tpr_curve >= tpr)]


def tied_scores(seed, n_id=150, n_ood=110, levels=12):
    """Integer scores: many ties within and across the sides."""
    rng = np.random.default_rng(seed)
    return rng.integers(2, levels + 2, n_id).astype(float), rng.integers(0, levels, n_ood).astype(float)


def expanded(scores, weights):
    return torch.as_tensor(scores).repeat_interleave(torch.as_tensor(weights).long())


# -- point estimates ----------------------------------------------------------------------------------------


def test_hand_computed():
    # ID [5, 4, 3, 1], OOD [3, 3, 1, 0] (confidences).
    # FPR@95, id: 95% of 4 ID needs all 4: t = 1 accepts OOD {3, 3, 1}: 3/4.
    # FPR@95, ood: 95% of 4 OOD rejected needs all 4: c = 3 rejects ID {3, 1}: 2/4.
    # AUPR-In (ID positive, thresholds 5, 4, 3, 1, 0): (TP, FP) = (1,0) (2,0) (3,2) (4,3) (4,4), so
    #   (R, P) = (1/4, 1) (2/4, 1) (3/4, 3/5) (1, 4/7) (1, 1/2) after (0, 1);
    #   trapezoid 1/4·(1+1)/2 + 1/4·(1+1)/2 + 1/4·(1+3/5)/2 + 1/4·(3/5+4/7)/2 = 237/280,
    #   average precision 1/4·(1 + 1 + 3/5 + 4/7) = 111/140.
    # AUPR-Out (OOD positive, rejecting s <= 0, 1, 3, 4, 5): (TP, FP) = (1,0) (2,1) (4,2) (4,3) (4,4), so
    #   (R, P) = (1/4, 1) (2/4, 2/3) (1, 2/3) ...; trapezoid 1/4·1 + 1/4·(1+2/3)/2 + 1/2·2/3 = 19/24,
    #   average precision 1/4·1 + 1/4·2/3 + 1/2·2/3 = 3/4.
    a, b = torch.tensor([5.0, 4.0, 3.0, 1.0]), torch.tensor([3.0, 3.0, 1.0, 0.0])
    assert fpr_at_tpr(a, b) == 0.75
    assert fpr_at_tpr(a, b, convention="ood") == 0.5
    assert aupr_in(a, b) == pytest.approx(237 / 280, abs=1e-15)
    assert aupr_in(a, b, convention="average_precision") == pytest.approx(111 / 140, abs=1e-15)
    assert aupr_out(a, b) == pytest.approx(19 / 24, abs=1e-15)
    assert aupr_out(a, b, convention="average_precision") == pytest.approx(3 / 4, abs=1e-15)
    # and both references agree with the hand values
    assert pytorch_ood_reference(a, b) == pytest.approx((0.5, 237 / 280, 19 / 24), abs=1e-15)
    assert openood_reference(a, b) == pytest.approx((0.5, 237 / 280, 19 / 24), abs=1e-15)
    assert sklearn_id_positive(a, b) == 0.75


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tpr", [0.95, 0.9, 0.5])
def test_against_pytorch_ood_with_ties(seed, tpr):
    a, b = tied_scores(seed)
    expected_fpr, expected_in, expected_out = pytorch_ood_reference(a, b, tpr)
    assert fpr_at_tpr(a, b, tpr, convention="ood") == expected_fpr  # the same counts and division: exact
    assert aupr_in(a, b) == pytest.approx(expected_in, abs=1e-14)
    assert aupr_out(a, b) == pytest.approx(expected_out, abs=1e-14)


@pytest.mark.parametrize("seed", range(6))
def test_against_the_openood_formula_with_ties(seed):
    a, b = tied_scores(seed, levels=6 + seed)
    fpr, expected_in, expected_out = openood_reference(a, b)
    assert aupr_in(a, b) == pytest.approx(expected_in, abs=1e-14)
    assert aupr_out(a, b) == pytest.approx(expected_out, abs=1e-14)
    # every threshold kept: exactly OpenOOD's formula; OpenOOD's dropped thresholds can only raise its FPR
    assert fpr_at_tpr(a, b, convention="ood") == openood_reference(a, b, drop_intermediate=False)[0]
    assert fpr_at_tpr(a, b, convention="ood") <= fpr


def test_against_the_references_on_distinct_scores():
    rng = np.random.default_rng(7)
    a, b = rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.0, 200)
    expected = openood_reference(a, b)
    assert fpr_at_tpr(a, b, convention="ood") == expected[0]  # without ties no threshold that matters drops
    assert pytorch_ood_reference(a, b)[0] == expected[0]
    assert (aupr_in(a, b), aupr_out(a, b)) == pytest.approx(expected[1:], abs=1e-14)
    assert fpr_at_tpr(a, b) == sklearn_id_positive(a, b) == id_positive_reference(a, b)


def test_where_openood_and_pytorch_ood_differ():
    # confidences; 20 OOD, 10 ID. Rejecting s <= c: c = 0 rejects 17 OOD, then 1, 2, 3 each reject one ID and
    # one OOD: the points (ID, OOD) = (0, 17) (1, 18) (2, 19) (3, 20) (10, 20). 19/20 = 95% is reached at c = 2
    # (FPR 2/10), but (1, 18) and (2, 19) lie inside the run of equal steps (1, 1), which sklearn's
    # drop_intermediate removes: OpenOOD reads the next kept point (3, 20), FPR 3/10.
    a = [1.0, 2.0, 3.0] + [10.0] * 7
    b = [0.0] * 17 + [1.0, 2.0, 3.0]
    assert pytorch_ood_reference(a, b)[0] == 0.2
    assert openood_reference(a, b)[0] == 0.3
    assert fpr_at_tpr(a, b, convention="ood") == 0.2
    assert fpr_at_tpr(a, b, convention="openood") == 0.3  # OpenOOD's, the dropped point included
    # the literature's convention: all 10 ID accepted needs t = 1, which accepts OOD {1, 2, 3}: 3/20
    assert fpr_at_tpr(a, b) == 0.15


def test_openood_convention_by_hand():
    # confidences; the OOD-positive ROC (rejecting s <= c, ascending c) has the points (ID, OOD) rejected
    # c = 0: (0, 2), 1: (0, 4), 2: (0, 6), 3: (1, 7), 4: (3, 7), 9: (5, 8). The steps (0, 2) (0, 2) are equal, so
    # sklearn drops (0, 4); the first point with 7/8 = 87.5% >= 80% OOD rejected is (1, 7), kept: FPR 1/5 in
    # both conventions. At 50% (4 of 8) the "ood" point (0, 4) is dropped and OpenOOD reads (0, 6): FPR 0 too
    # (the run is vertical). At 100%: (5, 8), the last point, 5/5.
    a = [3.0, 4.0, 4.0, 9.0, 9.0]
    b = [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 9.0]
    for tpr, expected in ((0.8, 0.2), (0.5, 0.0), (1.0, 1.0)):
        assert fpr_at_tpr(a, b, tpr, convention="openood") == expected == openood_reference(a, b, tpr)[0]
    # a run of diagonal steps: ID [1, 2] + 8 x [5], OOD [0, 1, 2] + [3] x 3: points (0, 1) (1, 2) (2, 3) (2, 6)
    # (10, 6): (1, 2) lies inside the run of steps (1, 1) and is dropped; 2/6 OOD is reached there: "ood" reads
    # 1/10, OpenOOD the run's end (2, 3), 2/10
    a, b = [1.0, 2.0] + [5.0] * 8, [0.0, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert fpr_at_tpr(a, b, 2 / 6, convention="ood") == 0.1
    assert fpr_at_tpr(a, b, 2 / 6, convention="openood") == 0.2 == openood_reference(a, b, 2 / 6)[0]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("tpr", [0.95, 0.9, 0.5, 1.0, 0.05])
def test_openood_convention_is_openoods_formula_with_ties(seed, tpr):
    rng = np.random.default_rng(seed)
    levels = int(rng.integers(2, 12))
    a = rng.integers(0, levels, int(rng.integers(1, 60))).astype(float)
    b = rng.integers(0, levels, int(rng.integers(1, 60))).astype(float)
    assert fpr_at_tpr(a, b, tpr, convention="openood") == openood_reference(a, b, tpr)[0]
    assert fpr_at_tpr(a, b, tpr, convention="openood") >= fpr_at_tpr(a, b, tpr, convention="ood")


def test_openood_convention_on_distinct_scores_is_the_ood_one():
    rng = np.random.default_rng(11)
    a, b = rng.normal(1.0, 1.0, 400), rng.normal(0.0, 1.0, 300)
    for tpr in (0.95, 0.8):
        assert fpr_at_tpr(a, b, tpr, convention="openood") == fpr_at_tpr(a, b, tpr, convention="ood")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tpr", [0.95, 0.8, 1.0, 0.01])
def test_id_convention_is_the_id_positive_roc(seed, tpr):
    a, b = tied_scores(seed, n_id=97, n_ood=61, levels=9)
    assert fpr_at_tpr(a, b, tpr) == id_positive_reference(a, b, tpr) == sklearn_id_positive(a, b, tpr)


@pytest.mark.parametrize("seed", range(4))
def test_average_precision_is_sklearns(seed):
    a, b = tied_scores(seed, levels=7)
    labels = np.r_[np.ones(len(a)), np.zeros(len(b))]
    scores = np.r_[a, b]
    assert aupr_in(a, b, convention="average_precision") == pytest.approx(
        sk.average_precision_score(labels, scores), abs=1e-14)
    assert aupr_out(a, b, convention="average_precision") == pytest.approx(
        sk.average_precision_score(1 - labels, -scores), abs=1e-14)


@pytest.mark.parametrize("seed", range(3))
def test_sign_conventions(seed):
    a, b = (torch.from_numpy(x) for x in tied_scores(seed, levels=8))
    # swapping ID and OOD and negating the scores swaps AUPR-In and AUPR-Out and the FPR conventions
    for convention in ("trapezoid", "average_precision"):
        assert aupr_in(a, b, convention=convention) == aupr_out(-b, -a, convention=convention)
        assert aupr_out(a, b, convention=convention) == aupr_in(-b, -a, convention=convention)
    for tpr in (0.95, 0.7):
        assert fpr_at_tpr(a, b, tpr, convention="ood") == fpr_at_tpr(-b, -a, tpr, convention="id")
    # a better detector (ID shifted up) has a lower FPR and higher AUPRs
    assert fpr_at_tpr(a + 3, b) < fpr_at_tpr(a, b)
    assert aupr_in(a + 3, b) > aupr_in(a, b) and aupr_out(a + 3, b) > aupr_out(a, b)


def test_perfect_and_reversed_separation():
    a, b = torch.tensor([3.0, 4.0, 5.0]), torch.tensor([0.0, 1.0])
    assert (fpr_at_tpr(a, b), fpr_at_tpr(a, b, convention="ood")) == (0.0, 0.0)
    assert (aupr_in(a, b), aupr_out(a, b)) == (1.0, 1.0)
    assert (fpr_at_tpr(b, a), fpr_at_tpr(b, a, convention="ood")) == (1.0, 1.0)
    # one score for all: one point (R 1, P = share of positives) after (0, 1)
    c = torch.zeros(3)
    assert fpr_at_tpr(c, torch.zeros(2)) == 1.0
    assert aupr_in(c, torch.zeros(2)) == pytest.approx((1 + 3 / 5) / 2)
    assert aupr_in(c, torch.zeros(2), convention="average_precision") == pytest.approx(3 / 5)


def test_negative_zero_ties_with_zero_and_dtypes_mix():
    a, b = torch.tensor([0.0, 1.0, -0.0, 2.0]), torch.tensor([-0.0, 0.5, 0.0])
    a0, b0 = a.abs(), b.abs()
    assert fpr_at_tpr(a, b) == fpr_at_tpr(a0, b0)
    assert (aupr_in(a, b), aupr_out(a, b)) == (aupr_in(a0, b0), aupr_out(a0, b0))
    # integer and float32 / float64 inputs are promoted together
    ints = torch.tensor([5, 4, 3, 1])
    assert aupr_in(ints, torch.tensor([3.0, 3.0, 1.0, 0.0], dtype=torch.float32)) == aupr_in(
        [5.0, 4.0, 3.0, 1.0], np.array([3.0, 3.0, 1.0, 0.0]))


# -- weighted rows ------------------------------------------------------------------------------------------


def weights_with_gaps(n, rows, seed):
    """Resample counts plus rows that drop whole stretches (the top or bottom scores, a run in the middle)."""
    base = resample_weights(n, rows, seed)
    extra = torch.randint(0, 3, (3, n), generator=torch.Generator().manual_seed(seed))
    extra[0, : n // 3] = 0
    extra[1, -(n // 3):] = 0
    extra[2, n // 4: n // 2] = 0
    extra[:, 0] = 1  # every row keeps some weight
    return torch.cat([base, extra.int()])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_weighted_rows_equal_the_functions_on_the_expanded_data(dtype):
    a, b = tied_scores(3, n_id=60, n_ood=45, levels=10)
    a, b = torch.tensor(a, dtype=dtype) / 4, torch.tensor(b, dtype=dtype) / 4  # ties in float32 too
    w_id, w_ood = weights_with_gaps(60, 20, 1), weights_with_gaps(45, 20, 2)
    # sort the scores so that the gaps of weights_with_gaps are the top, the bottom and a run of scores
    a, b = a.sort(descending=True).values, b.sort().values
    for tpr in (0.95, 0.5, 1.0):
        for convention in ("id", "ood", "openood"):
            rows = weighted_fpr_at_tpr(a, b, w_id, w_ood, tpr, convention=convention)
            expected = [fpr_at_tpr(expanded(a, w_id[r]), expanded(b, w_ood[r]), tpr, convention=convention)
                        for r in range(w_id.shape[0])]
            assert rows.tolist() == expected  # exactly, every row
    for convention in ("trapezoid", "average_precision"):
        for positive, function in (("id", aupr_in), ("ood", aupr_out)):
            rows = weighted_aupr(a, b, w_id, w_ood, positive=positive, convention=convention)
            expected = [function(expanded(a, w_id[r]), expanded(b, w_ood[r]), convention=convention)
                        for r in range(w_id.shape[0])]
            assert rows.tolist() == expected


def test_weighted_rows_against_the_references_on_the_expanded_data():
    a, b = tied_scores(5, n_id=80, n_ood=50, levels=8)
    w_id, w_ood = resample_weights(80, 8, 3), resample_weights(50, 8, 3, stratum=1)
    fpr = weighted_fpr_at_tpr(torch.tensor(a), torch.tensor(b), w_id, w_ood, convention="ood")
    fpr_openood = weighted_fpr_at_tpr(torch.tensor(a), torch.tensor(b), w_id, w_ood, convention="openood")
    area_in = weighted_aupr(torch.tensor(a), torch.tensor(b), w_id, w_ood)
    area_out = weighted_aupr(torch.tensor(a), torch.tensor(b), w_id, w_ood, positive="ood")
    for r in range(8):
        x, y = expanded(a, w_id[r]).numpy(), expanded(b, w_ood[r]).numpy()
        expected = pytorch_ood_reference(x, y)
        assert float(fpr[r]) == expected[0]
        assert float(fpr_openood[r]) == openood_reference(x, y)[0]
        assert (float(area_in[r]), float(area_out[r])) == pytest.approx(expected[1:], abs=1e-14)


def test_batched_torch_path_equals_the_numpy_rows(monkeypatch):
    """Real-valued weights take the batched torch path (the one of accelerators); integer-valued ones give the
    numpy rows' values bit for bit, whatever the chunking."""
    a, b = (torch.from_numpy(x) for x in tied_scores(2, n_id=70, n_ood=40, levels=9))
    w_id, w_ood = weights_with_gaps(70, 12, 4), weights_with_gaps(40, 12, 5)
    monkeypatch.setattr(detection, "CHUNK_ELEMENTS", 300)  # two or three rows per chunk
    for convention in ("id", "ood", "openood"):
        assert torch.equal(weighted_fpr_at_tpr(a, b, w_id.double(), w_ood.double(), convention=convention),
                           weighted_fpr_at_tpr(a, b, w_id, w_ood, convention=convention))
    for positive in ("id", "ood"):
        for convention in ("trapezoid", "average_precision"):
            assert torch.equal(
                weighted_aupr(a, b, w_id.double(), w_ood.double(), positive=positive, convention=convention),
                weighted_aupr(a, b, w_id, w_ood, positive=positive, convention=convention))
    # real weights: sklearn's sample_weight curve (AUPR trapezoid of the weighted counts)
    real_id, real_ood = torch.rand(2, 70, dtype=torch.float64), torch.rand(2, 40, dtype=torch.float64)
    areas = weighted_aupr(a, b, real_id, real_ood)
    for r in range(2):
        precision, recall, _ = sk.precision_recall_curve(np.r_[np.ones(70), np.zeros(40)], np.r_[a, b],
                                                         sample_weight=np.r_[real_id[r], real_ood[r]])
        assert float(areas[r]) == pytest.approx(sk.auc(recall, precision), abs=1e-12)


def test_rows_without_weight_on_a_side_are_nan():
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 2.5])
    w_id = torch.tensor([[1, 1, 1], [0, 0, 0], [2, 0, 1]])
    w_ood = torch.tensor([[0, 0], [1, 1], [1, 1]])
    for weights in ((w_id, w_ood), (w_id.double(), w_ood.double())):
        fpr = weighted_fpr_at_tpr(a, b, *weights)
        area = weighted_aupr(a, b, *weights, positive="ood")
        assert math.isnan(fpr[0]) and math.isnan(fpr[1]) and math.isnan(area[0]) and math.isnan(area[1])
        assert float(fpr[2]) == fpr_at_tpr([1.0, 1.0, 3.0], b)
        assert float(area[2]) == aupr_out([1.0, 1.0, 3.0], b)


# -- bootstrap ---------------------------------------------------------------------------------------------


def test_bootstrap_uses_the_resamples_of_the_auroc_bootstrap():
    a, b = (torch.from_numpy(x) for x in tied_scores(1, n_id=90, n_ood=70, levels=10))
    replicates = bootstrap_detection(a, b, 40, 3)
    assert set(replicates) == {"fpr@95tpr", "aupr_in", "aupr_out"}
    w_id, w_ood = resample_weights(90, 40, 3, stratum=0), resample_weights(70, 40, 3, stratum=1)
    assert torch.equal(replicates["fpr@95tpr"], weighted_fpr_at_tpr(a, b, w_id, w_ood))
    assert torch.equal(replicates["aupr_in"], weighted_aupr(a, b, w_id, w_ood))
    assert torch.equal(replicates["aupr_out"], weighted_aupr(a, b, w_id, w_ood, positive="ood"))
    # ... the weights behind bootstrap_auroc's replicates: row b of both is the same resample
    areas = bootstrap_auroc(a, b, 40, 3)
    assert torch.equal(areas, weighted_auroc(a, b, w_id, w_ood))
    for r in (0, 17, 39):
        x, y = expanded(a, w_id[r]), expanded(b, w_ood[r])
        assert float(areas[r]) == pytest.approx(auroc(x, y), abs=1e-15)
        assert float(replicates["fpr@95tpr"][r]) == fpr_at_tpr(x, y)
        assert float(replicates["aupr_in"][r]) == aupr_in(x, y)
        assert float(replicates["aupr_out"][r]) == aupr_out(x, y)


def test_bootstrap_does_not_depend_on_threads_chunks_or_resamples(monkeypatch):
    a, b = torch.randn(300, dtype=torch.float64) + 1, torch.randn(200, dtype=torch.float64)
    whole = bootstrap_detection(a, b, 50, 1, tpr=0.9, fpr_convention="ood", aupr_convention="average_precision")
    assert set(whole) == {"fpr@90tpr", "aupr_in", "aupr_out"}
    monkeypatch.setattr(detection, "PARALLEL_SIZE", 1)  # blocks over threads
    monkeypatch.setattr(detection, "CHUNK_ELEMENTS", 1000)  # two rows at a time
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    again = bootstrap_detection(a, b, 50, 1, tpr=0.9, fpr_convention="ood", aupr_convention="average_precision")
    first = bootstrap_detection(a, b, 20, 1, tpr=0.9, fpr_convention="ood", aupr_convention="average_precision")
    for key in whole:
        assert torch.equal(whole[key], again[key])
        assert torch.equal(whole[key][:20], first[key])


def test_bootstrap_with_given_weights():
    a, b = (torch.from_numpy(x) for x in tied_scores(4, n_id=50, n_ood=60, levels=7))
    classes = torch.arange(60) % 6  # six OOD classes, resampled as units
    w_ood = cluster_weights(classes, 30, 2, stratum=1, num_units=6)
    replicates = bootstrap_detection(a, b, 30, 2, ood_weights=w_ood)
    w_id = resample_weights(50, 30, 2, stratum=0)
    assert torch.equal(replicates["aupr_out"], weighted_aupr(a, b, w_id, w_ood, positive="ood"))
    assert torch.equal(replicates["fpr@95tpr"], weighted_fpr_at_tpr(a, b, w_id, w_ood))
    both = bootstrap_detection(a, b, 30, 9, id_weights=w_id, ood_weights=w_ood)  # the seed is then unused
    assert all(torch.equal(both[key], replicates[key]) for key in both)


def test_detection_intervals_are_estimate_and_percentiles():
    a, b = torch.randn(200, dtype=torch.float64) + 1.5, torch.randn(150, dtype=torch.float64)
    out = detection_intervals(a, b, level=0.9, resamples=200, seed=4)
    replicates = bootstrap_detection(a, b, 200, 4)
    for key, estimate in (("fpr@95tpr", fpr_at_tpr(a, b)), ("aupr_in", aupr_in(a, b)),
                          ("aupr_out", aupr_out(a, b))):
        assert out[key] == (estimate, *percentile_interval(replicates[key], 0.9))
        assert out[key][1] <= estimate <= out[key][2]


# -- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: fpr_at_tpr(torch.tensor([1.0, math.nan]), torch.zeros(3)), "id_scores contains NaN"),
    (lambda: aupr_in(torch.ones(3), torch.tensor([0.0, math.inf])), "ood_scores contains NaN or infinite"),
    (lambda: aupr_out(torch.ones(3), torch.zeros(0)), "ood_scores is empty"),
    (lambda: fpr_at_tpr(torch.zeros(0), torch.zeros(3)), "id_scores is empty"),
    (lambda: fpr_at_tpr(torch.ones(2, 2), torch.zeros(3)), r"id_scores must have shape \(N,\)"),
    (lambda: fpr_at_tpr(torch.ones(3), torch.zeros(3), 0.0), "tpr must be a number in"),
    (lambda: fpr_at_tpr(torch.ones(3), torch.zeros(3), 1.5), "tpr"),
    (lambda: fpr_at_tpr(torch.ones(3), torch.zeros(3), True), "tpr"),
    (lambda: fpr_at_tpr(torch.ones(3), torch.zeros(3), math.nan), "tpr"),
    (lambda: fpr_at_tpr(torch.ones(3), torch.zeros(3), convention="sklearn"), "'sklearn'"),
    (lambda: aupr_in(torch.ones(3), torch.zeros(3), convention="step"), "'step'"),
    (lambda: weighted_aupr(torch.ones(3), torch.zeros(2), torch.ones(2, 3), torch.ones(2, 2), positive="x"),
     "positive"),
    (lambda: weighted_aupr(torch.ones(3), torch.zeros(2), torch.ones(2, 4), torch.ones(2, 2)), r"\(B, 3\)"),
    (lambda: weighted_fpr_at_tpr(torch.ones(3), torch.zeros(2), -torch.ones(2, 3), torch.ones(2, 2)), "negative"),
    (lambda: weighted_fpr_at_tpr(torch.ones(3), torch.zeros(2), torch.ones(2, 3), torch.ones(3, 2)),
     "same number of rows"),
    (lambda: bootstrap_detection(torch.ones(3), torch.zeros(2), 0), "resamples"),
    (lambda: bootstrap_detection(torch.ones(3), torch.zeros(2), 5, ood_weights=torch.ones(4, 2)),
     r"one row per resample, shape \(5, 2\)"),
    (lambda: bootstrap_detection(torch.ones(3), torch.zeros(2), 2, ood_weights=-torch.ones(2, 2)), "negative"),
    (lambda: bootstrap_detection(torch.ones(3), torch.zeros(2), 2, fpr_convention="x"), "fpr_convention"),
    (lambda: detection_intervals(torch.ones(3), torch.zeros(2), level=1.0), "level"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_replicate_key():
    assert fpr_at_tpr_key() == "fpr@95tpr"
    assert fpr_at_tpr_key(0.9) == "fpr@90tpr"
    assert fpr_at_tpr_key(0.999) == "fpr@99.9tpr"
