"""metrics.ood_benchmark against independent references: the AURC / AUGRC of Traub et al. from their definition
(a loop over the thresholds written here, and the AUGRC's closed form with sklearn's AUROC), OpenOOD v1.5's
``compute_all_metrics`` re-implemented below from its code, pytorch-ood's ``OODMetrics``, hand-computed values;
the weighted rows against the functions on the expanded data; the table's rows, means, resamples and pairing."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from pytorch_ood.metrics import OODMetrics
from sklearn import metrics as sk

import metrics.ood_benchmark as ood_benchmark
from benchmarks.ood_metrics_benchmark import compute_all_metrics
from metrics import (
    aupr_in,
    aupr_out,
    auroc,
    auroc_interval,
    fpr_at_tpr,
    percentile_interval,
    resample_weights,
    wilson_interval,
)
from metrics.ood_benchmark import (
    HIGHER_IS_BETTER,
    METRICS,
    ResampleCache,
    augrc,
    aurc,
    benchmark_table,
    openood_metrics,
    table_marks,
    weighted_augrc,
    weighted_aurc,
)

# -- references ----------------------------------------------------------------------------------------------


def risk_coverage_reference(confidence, correct):
    """Traub et al.'s curves from their definition (their ``rc_stats_utils``, read): samples sorted by ascending
    confidence and rejected one by one; a point (coverage, risk) wherever the next sample's confidence differs
    (tied samples leave together), starting from coverage 1; the last point coverage 0 with the selective risk
    of the last threshold and generalized risk 0; both areas by the trapezoid."""
    confidence = np.asarray(confidence, float)
    failure = 1.0 - np.asarray(correct, float)
    n = len(confidence)
    order = np.argsort(confidence, kind="stable")
    confidence, failure = confidence[order], failure[order]
    errors, remaining = failure.sum(), n
    coverage, selective, generalized = [1.0], [errors / n], [errors / n]
    for i in range(n - 1):
        remaining -= 1
        errors -= failure[i]
        if confidence[i] != confidence[i + 1]:
            coverage.append(remaining / n)
            selective.append(errors / remaining)
            generalized.append(errors / n)
    coverage.append(0.0)
    selective.append(selective[-1])
    generalized.append(0.0)
    coverage, selective, generalized = map(np.asarray, (coverage, selective, generalized))

    def trapezoid(risk):
        return float(np.sum((coverage[:-1] - coverage[1:]) * (risk[:-1] + risk[1:]) / 2))

    return trapezoid(selective), trapezoid(generalized)


def augrc_closed_form(confidence, correct):
    """Traub et al.'s identity: (1 - AUROC_f) acc (1 - acc) + (1 - acc)² / 2, AUROC_f of correct vs failed."""
    correct = np.asarray(correct, bool)
    accuracy = correct.mean()
    if accuracy in (0.0, 1.0):
        return 0.5 * (1 - accuracy) ** 2
    area = sk.roc_auc_score(correct, np.asarray(confidence, float))
    return (1 - area) * accuracy * (1 - accuracy) + 0.5 * (1 - accuracy) ** 2


def compute_all_metrics_reference(id_conf, ood_conf):
    """OpenOOD v1.5's ``compute_all_metrics`` / ``auc_and_fpr_recall`` (openood/evaluators/metrics.py), from its
    code: labels -1 for OOD; ``roc_curve(ood_indicator, -conf)`` with its default ``drop_intermediate=True``,
    FPR at ``argmax(tpr >= 0.95)``, AUROC ``auc(fpr, tpr)``, AUPR-In ``auc`` of ``precision_recall_curve(1 -
    ood_indicator, conf)``, AUPR-Out of ``precision_recall_curve(ood_indicator, -conf)``."""
    conf = np.r_[np.asarray(id_conf, float), np.asarray(ood_conf, float)]
    label = np.r_[np.zeros(len(id_conf), int), -np.ones(len(ood_conf), int)]
    fpr, auroc_, aupr_in_, aupr_out_ = compute_all_metrics(conf, label)  # the benchmark's anchor, the same rewrite
    return {"auroc": auroc_, "fpr@95tpr-openood": fpr, "aupr-in": aupr_in_, "aupr-out": aupr_out_}


def pytorch_ood_metrics(id_conf, ood_conf):
    metric = OODMetrics()
    scores = -torch.tensor(np.r_[np.asarray(id_conf, float), np.asarray(ood_conf, float)])
    labels = torch.tensor(np.r_[np.zeros(len(id_conf)), -np.ones(len(ood_conf))]).long()
    return metric.update(scores, labels).compute()


def tied(rng, n, levels):
    return rng.integers(0, levels, n).astype(float)


def expanded(values, counts):
    return torch.as_tensor(values).repeat_interleave(torch.as_tensor(counts).long())


@dataclass
class Settings:
    """The intervals a table reads (``evaluation_engine.Intervals`` without the engine)."""

    level: float = 0.95
    resamples: int = 40
    seed: int = 3

    def auroc(self, id_scores, ood_scores):
        return auroc_interval(id_scores, ood_scores, level=self.level)

    def proportion(self, successes, trials):
        return wilson_interval(successes, trials, self.level)


# -- AURC and AUGRC ------------------------------------------------------------------------------------------


def test_aurc_and_augrc_by_hand():
    # confidences 3, 2, 1: correct, wrong, correct. Thresholds accept {3}, {3, 2}, all: (A, F) = (1, 0) (2, 1)
    # (3, 1), selective risk 0, 1/2, 1/3 (and 0 at coverage 0). AURC = 1/3 (0 + (1/2 + 0)/2 + (1/3 + 1/2)/2)
    # = 2/9; AUGRC = (0 + (1 + 0) + (1 + 1)) / (2 · 9) = 1/6 = (1 - 1/2)(2/3)(1/3) + (1/3)²/2.
    assert aurc([3.0, 2.0, 1.0], [True, False, True]) == pytest.approx(2 / 9, abs=1e-15)
    assert augrc([3.0, 2.0, 1.0], [True, False, True]) == pytest.approx(1 / 6, abs=1e-15)
    # ties accepted together: 2, 2, 1, 1 with correct, wrong, correct, correct: thresholds (A, F) = (2, 1) (4, 1),
    # risks 1/2 (also at coverage 0), 1/4: AURC = 1/4 (2 (1/2 + 1/2)/2 + 2 (1/4 + 1/2)/2) = 7/16;
    # AUGRC = (2 (1 + 0) + 2 (1 + 1)) / (2 · 16) = 3/16
    assert aurc([2, 2, 1, 1], [1, 0, 1, 1]) == pytest.approx(7 / 16, abs=1e-15)
    assert augrc([2, 2, 1, 1], [1, 0, 1, 1]) == pytest.approx(3 / 16, abs=1e-15)
    # the OOD benchmark's view: ID 0.9 (right), 0.8 (wrong), OOD 0.85 (a failure): risks 0, 1/2, 2/3:
    # AURC = 1/3 (0 + 1/4 + 7/12) = 5/18; AUGRC = (0 + 1 + 3) / 18 = 2/9
    assert aurc([0.9, 0.8, 0.85], [True, False, False]) == pytest.approx(5 / 18, abs=1e-15)
    assert augrc([0.9, 0.8, 0.85], [True, False, False]) == pytest.approx(2 / 9, abs=1e-15)
    # nothing fails: 0; everything fails: AURC 1, AUGRC 1/2; one tie holding everything: risk = error rate
    assert (aurc([1.0, 2.0], [1, 1]), augrc([1.0, 2.0], [1, 1])) == (0.0, 0.0)
    assert (aurc([1.0, 2.0, 2.0], [0, 0, 0]), augrc([1.0, 2.0, 2.0], [0, 0, 0])) == (1.0, 0.5)
    assert aurc(torch.zeros(4), [1, 0, 1, 1]) == 0.25
    assert augrc(torch.zeros(4), [1, 0, 1, 1]) == 0.125  # (1 - 1/2)(3/4)(1/4) + (1/4)²/2: the tie counts ½
    # every failure below every success: AUGRC's minimum (1 - acc)²/2, AURC Geifman's optimum for distinct scores
    assert augrc([4.0, 3.0, 2.0, 1.0], [1, 1, 0, 0]) == pytest.approx(0.125, abs=1e-15)


@pytest.mark.parametrize("seed", range(12))
def test_against_the_definition_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    confidence = tied(rng, n, int(rng.integers(1, 15)))
    correct = rng.random(n) < rng.random()
    expected_aurc, expected_augrc = risk_coverage_reference(confidence, correct)
    assert aurc(confidence, correct) == pytest.approx(expected_aurc, abs=1e-13)
    assert augrc(confidence, correct) == pytest.approx(expected_augrc, abs=1e-13)
    assert augrc(confidence, correct) == pytest.approx(augrc_closed_form(confidence, correct), abs=1e-13)


def test_against_the_definition_on_distinct_scores_and_in_float32():
    rng = np.random.default_rng(5)
    confidence = rng.normal(size=500)
    correct = rng.random(500) < 1 / (1 + np.exp(-2 * confidence))  # confident ones right more often
    expected = risk_coverage_reference(confidence, correct)
    assert (aurc(confidence, correct), augrc(confidence, correct)) == pytest.approx(expected, abs=1e-13)
    single = torch.tensor(confidence, dtype=torch.float32)
    assert aurc(single, correct) == pytest.approx(risk_coverage_reference(single.double(), correct)[0], abs=1e-13)
    # a better confidence ranks failures lower: lower AURC and AUGRC than a random one
    assert aurc(confidence, correct) < aurc(rng.permutation(confidence), correct)
    assert augrc(confidence, correct) < augrc(rng.permutation(confidence), correct)


def weights_with_gaps(n, rows, seed):
    """Bootstrap counts plus rows without weight on stretches of the sorted scores (the top, the bottom, a run)."""
    base = resample_weights(n, rows, seed)
    extra = torch.randint(0, 3, (3, n), generator=torch.Generator().manual_seed(seed)).int()
    extra[0, : n // 3] = 0
    extra[1, -(n // 3):] = 0
    extra[2, n // 4: n // 2] = 0
    extra[:, n // 2] = 1
    return torch.cat([base, extra])


def test_weighted_rows_equal_the_functions_on_the_expanded_data():
    rng = np.random.default_rng(2)
    confidence = torch.from_numpy(np.sort(tied(rng, 70, 9))[::-1].copy())
    correct = torch.from_numpy(rng.random(70) < 0.6)
    weights = weights_with_gaps(70, 25, 4)
    rows_aurc, rows_augrc = weighted_aurc(confidence, correct, weights), weighted_augrc(confidence, correct, weights)
    expected_aurc = [aurc(expanded(confidence, w), expanded(correct, w)) for w in weights]
    expected_augrc = [augrc(expanded(confidence, w), expanded(correct, w)) for w in weights]
    assert rows_aurc.tolist() == expected_aurc  # exactly
    assert rows_augrc.tolist() == expected_augrc
    # real-valued weights (the batched torch path): the same values for integer-valued ones, to rounding
    assert weighted_aurc(confidence, correct, weights.double()).numpy() == pytest.approx(expected_aurc, abs=1e-13)
    assert weighted_augrc(confidence, correct, weights.double()).numpy() == pytest.approx(expected_augrc, abs=1e-13)
    # a row without weight has no curve
    empty = torch.zeros(2, 70, dtype=torch.int32)
    empty[1, 5] = 2
    for weights in (empty, empty.double()):
        values = weighted_aurc(confidence, correct, weights)
        assert math.isnan(values[0]) and float(values[1]) == float(not correct[5])


def test_weighted_rows_with_real_weights_are_the_weighted_curve():
    rng = np.random.default_rng(9)
    confidence, correct = tied(rng, 40, 6), rng.random(40) < 0.5
    weights = torch.from_numpy(rng.random((3, 40)))
    # the definition with real weights: the loop of risk_coverage_reference on weighted counts
    for row, w in enumerate(weights.numpy()):
        values = np.unique(confidence)[::-1]
        accepted = np.array([w[confidence >= u].sum() for u in values])
        failed = np.array([w[(confidence >= u) & ~correct].sum() for u in values])
        coverage, total = np.r_[0.0, accepted / w.sum()], w.sum()
        risk = failed / accepted
        selective, generalized = np.r_[risk[0], risk], np.r_[0.0, failed / total]
        area = np.sum(np.diff(coverage) * (selective[1:] + selective[:-1]) / 2)
        general = np.sum(np.diff(coverage) * (generalized[1:] + generalized[:-1]) / 2)
        assert float(weighted_aurc(confidence, correct, weights)[row]) == pytest.approx(area, abs=1e-13)
        assert float(weighted_augrc(confidence, correct, weights)[row]) == pytest.approx(general, abs=1e-13)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: aurc([1.0, math.nan], [1, 0]), "confidence contains NaN"),
    (lambda: aurc([], []), "confidence is empty"),
    (lambda: augrc([1.0, 2.0], [1, 0, 1]), r"correct must have shape \(2,\)"),
    (lambda: augrc([1.0, 2.0], [1, 2]), "bools or 0/1 integers, found \\[2\\]"),
    (lambda: aurc([1.0, 2.0], [0.5, 1.0]), "bools or 0/1 integers"),
    (lambda: weighted_aurc([1.0, 2.0], [1, 0], torch.ones(3, 3)), r"\(B, 2\)"),
    (lambda: weighted_augrc([1.0, 2.0], [1, 0], -torch.ones(3, 2)), "negative"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -- OpenOOD's metrics -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_openood_metrics_are_compute_all_metrics_with_ties(seed):
    rng = np.random.default_rng(seed)
    levels = int(rng.integers(3, 20))
    a = tied(rng, int(rng.integers(20, 200)), levels) + 1
    b = tied(rng, int(rng.integers(20, 200)), levels)
    ours, reference = openood_metrics(a, b), compute_all_metrics_reference(a, b)
    assert set(ours) == set(reference)
    assert ours == {"auroc": auroc(a, b), "fpr@95tpr-openood": fpr_at_tpr(a, b, convention="openood"),
                    "aupr-in": aupr_in(a, b), "aupr-out": aupr_out(a, b)}  # the project's functions, exactly
    assert ours["fpr@95tpr-openood"] == reference["fpr@95tpr-openood"]  # the same counts and division: exact
    for key in ("auroc", "aupr-in", "aupr-out"):
        assert ours[key] == pytest.approx(reference[key], abs=1e-13), key


def test_openood_metrics_where_a_dropped_point_decides():
    # ID [1, 2, 3] + 7 x [10], OOD 17 x [0] + [1, 2, 3] (metrics.detection's example): OpenOOD 0.3, every
    # threshold (pytorch-ood, convention "ood") 0.2
    a, b = [1.0, 2.0, 3.0] + [10.0] * 7, [0.0] * 17 + [1.0, 2.0, 3.0]
    ours = openood_metrics(a, b)
    assert ours["fpr@95tpr-openood"] == 0.3 == compute_all_metrics_reference(a, b)["fpr@95tpr-openood"]
    assert fpr_at_tpr(a, b, convention="ood") == 0.2 == pytorch_ood_metrics(a, b)["FPR95TPR"]
    # AUROC by hand: each ID 1, 2, 3 is above the 17 zeros, above the lower OOD ones and ties one: (17 + 0.5)
    # + (18 + 0.5) + (19 + 0.5) = 55.5, and 7 x 20 for the tens: (55.5 + 140) / 200
    assert ours["auroc"] == pytest.approx(195.5 / 200, abs=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_openood_metrics_against_pytorch_ood(seed):
    rng = np.random.default_rng(seed)
    a, b = tied(rng, 150, 10) + 2, tied(rng, 120, 10)
    ours, theirs = openood_metrics(a, b), pytorch_ood_metrics(a, b)
    assert ours["auroc"] == pytest.approx(theirs["AUROC"], abs=1e-6)  # pytorch-ood computes in float32
    assert ours["aupr-in"] == pytest.approx(theirs["AUPR-IN"], abs=1e-6)
    assert ours["aupr-out"] == pytest.approx(theirs["AUPR-OUT"], abs=1e-6)
    assert fpr_at_tpr(a, b, convention="ood") == pytest.approx(theirs["FPR95TPR"], abs=1e-7)
    assert ours["fpr@95tpr-openood"] >= theirs["FPR95TPR"] - 1e-7  # a dropped point can only raise it


# -- the table -------------------------------------------------------------------------------------------------


def table_data(seed=0, n_id=120, sizes=(60, 30, 45), levels=25):
    rng = np.random.default_rng(seed)
    id_scores = torch.from_numpy(tied(rng, n_id, levels) + 3)
    correct = torch.from_numpy(rng.random(n_id) < 0.7)
    sets = {name: torch.from_numpy(tied(rng, size, levels) + shift)
            for name, size, shift in zip(("ssb", "ninco", "textures"), sizes, (0, 1, -4), strict=True)}
    return id_scores, correct, sets, {"ssb": "near", "ninco": "near", "textures": "far"}


def set_metrics(id_scores, correct, ood_scores):
    """Every metric of one set by the project's public functions."""
    confidence = torch.cat([id_scores, ood_scores])
    succeeded = torch.cat([correct, torch.zeros(ood_scores.numel(), dtype=torch.bool)])
    return {"auroc": auroc(id_scores, ood_scores), "fpr@95tpr": fpr_at_tpr(id_scores, ood_scores),
            "fpr@95tpr-openood": fpr_at_tpr(id_scores, ood_scores, convention="openood"),
            "aupr-in": aupr_in(id_scores, ood_scores), "aupr-out": aupr_out(id_scores, ood_scores),
            "aurc": aurc(confidence, succeeded), "augrc": augrc(confidence, succeeded)}


def test_table_rows_are_the_metrics_of_each_set_and_their_means():
    id_scores, correct, sets, groups = table_data()
    settings = Settings()
    table = benchmark_table(id_scores, correct, sets, groups, intervals=settings)
    assert [row["set"] for row in table.rows] == ["ssb", "ninco", "textures", "near", "far", "all"]
    assert [row["group"] for row in table.rows] == ["near", "near", "far", "mean", "mean", "mean"]
    assert [row["images"] for row in table.rows] == [60, 30, 45, 90, 45, 135]
    for name, scores in sets.items():
        row = table.row(name)
        assert {metric: row[metric] for metric in METRICS} == set_metrics(id_scores, correct, scores)  # exactly
        assert (row["auroc low"], row["auroc high"]) == settings.auroc(id_scores, scores)
        for metric in METRICS[1:]:
            assert (row[f"{metric} low"], row[f"{metric} high"]) == percentile_interval(
                table.replicates[(name, metric)], 0.95)
    for mean, members in (("near", ["ssb", "ninco"]), ("far", ["textures"]), ("all", list(sets))):
        row = table.row(mean)
        for metric in METRICS:
            assert row[metric] == pytest.approx(np.mean([table.row(m)[metric] for m in members]), abs=1e-15)
            stacked = torch.stack([table.replicates[(m, metric)] for m in members])
            assert torch.allclose(table.replicates[(mean, metric)], stacked.mean(dim=0), rtol=0, atol=1e-15)
            assert (row[f"{metric} low"], row[f"{metric} high"]) == percentile_interval(
                table.replicates[(mean, metric)], 0.95)
    successes = int(correct.sum())
    assert table.accuracy == (successes / 120, *wilson_interval(successes, 120, 0.95))


def test_replicates_are_the_metrics_of_the_documented_resamples():
    id_scores, correct, sets, groups = table_data(seed=1)
    table = benchmark_table(id_scores, correct, sets, groups, intervals=Settings(resamples=30, seed=7),
                            strata={"ssb": 5, "ninco": 2, "textures": 9})
    id_weights = resample_weights(120, 30, 7, stratum=0)  # the ID images: stratum 0, keyed by image index
    for name, stratum in (("ssb", 5), ("ninco", 2), ("textures", 9)):
        ood_weights = resample_weights(sets[name].numel(), 30, 7, stratum=stratum)
        for r in (0, 13, 29):
            expected = set_metrics(expanded(id_scores, id_weights[r]), expanded(correct, id_weights[r]),
                                   expanded(sets[name], ood_weights[r]))
            assert {metric: float(table.replicates[(name, metric)][r]) for metric in METRICS} == expected


def test_a_full_spectrum_id_side_resamples_each_of_its_parts_on_its_own():
    """ID test images and a covariate-shifted set on the ID side (full-spectrum): each part drawn with its own stratum,
    the rows the concatenation of the parts' rows."""
    id_scores, correct, sets, groups = table_data(seed=3)
    table = benchmark_table(id_scores, correct, sets, groups, intervals=Settings(resamples=20, seed=4),
                            strata={"ssb": 1, "ninco": 2, "textures": 3}, id_parts=[(80, 0), (40, 7)])
    id_weights = torch.cat([resample_weights(80, 20, 4, stratum=0), resample_weights(40, 20, 4, stratum=7)], dim=1)
    ood_weights = resample_weights(sets["ninco"].numel(), 20, 4, stratum=2)
    for r in (0, 11, 19):
        expected = set_metrics(expanded(id_scores, id_weights[r]), expanded(correct, id_weights[r]),
                               expanded(sets["ninco"], ood_weights[r]))
        assert {metric: float(table.replicates[("ninco", metric)][r]) for metric in METRICS} == expected
    with pytest.raises(ValueError, match="must cover the 120 ID scores"):
        benchmark_table(id_scores, correct, sets, groups, intervals=Settings(resamples=20), id_parts=[(80, 0)])
    with pytest.raises(ValueError, match="its own stratum"):
        benchmark_table(id_scores, correct, sets, groups, intervals=Settings(resamples=20),
                        strata={"ssb": 1, "ninco": 2, "textures": 3}, id_parts=[(80, 0), (40, 2)])


def test_the_cache_holds_the_resample_weights():
    cache = ResampleCache(30, 7)
    rows = cache.counts(120, 4)
    assert rows.dtype == np.uint8 and not rows.flags.writeable
    assert np.array_equal(rows, resample_weights(120, 30, 7, stratum=4).numpy())
    assert cache.counts(120, 4) is rows  # drawn once


def test_default_strata_follow_the_sets_order():
    id_scores, correct, sets, groups = table_data(seed=2)
    settings = Settings(resamples=20)
    default = benchmark_table(id_scores, correct, sets, groups, intervals=settings)
    explicit = benchmark_table(id_scores, correct, sets, groups, intervals=settings,
                               strata={"ssb": 1, "ninco": 2, "textures": 3})
    other = benchmark_table(id_scores, correct, sets, groups, intervals=settings,
                            strata={"ssb": 1, "ninco": 2, "textures": 4})
    for key, values in default.replicates.items():
        assert torch.equal(values, explicit.replicates[key])
    assert torch.equal(default.replicates[("ssb", "auroc")], other.replicates[("ssb", "auroc")])
    assert not torch.equal(default.replicates[("textures", "auroc")], other.replicates[("textures", "auroc")])


def test_two_detectors_share_their_resamples():
    id_scores, correct, sets, groups = table_data(seed=3)
    settings = Settings(resamples=25)
    cache = ResampleCache(25, 3)
    first = benchmark_table(id_scores, correct, sets, groups, intervals=settings, cache=cache)
    # a detector equal to the first plus a constant (the same ranking) on the same images: the same replicates,
    # only if every row of both tables used the same weights
    shifted = benchmark_table(id_scores + 7.5, correct, {k: v + 7.5 for k, v in sets.items()}, groups,
                              intervals=settings)
    for key, values in first.replicates.items():
        assert torch.equal(values, shifted.replicates[key]), key
    marks = table_marks({"a": first, "b": shifted})
    assert set(marks) == set(first.replicates)
    assert not any(marked for row in marks.values() for marked in row.values())  # equal rows: never marked
    # a detector that scores the OOD images higher is marked worse in AUROC, by worse_than_best on the pairs
    worse = benchmark_table(id_scores, correct, {k: v + 2.0 for k, v in sets.items()}, groups, intervals=settings,
                            cache=cache)
    marks = table_marks({"a": first, "worse": worse})
    assert marks[("all", "auroc")] == {"a": False, "worse": True}
    assert marks[("all", "fpr@95tpr")] == {"a": False, "worse": True}  # lower is better there
    assert HIGHER_IS_BETTER["fpr@95tpr"] is False and HIGHER_IS_BETTER["auroc"] is True


def test_the_rows_do_not_depend_on_threads(monkeypatch):
    id_scores, correct, sets, groups = table_data(seed=4)
    settings = Settings(resamples=40)
    alone = benchmark_table(id_scores, correct, sets, groups, intervals=settings)
    monkeypatch.setattr(ood_benchmark, "PARALLEL_SIZE", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    threaded = benchmark_table(id_scores, correct, sets, groups, intervals=settings)
    for key, values in alone.replicates.items():
        assert torch.equal(values, threaded.replicates[key])


def test_a_group_without_sets_has_no_mean_row():
    id_scores, correct, sets, _ = table_data(seed=5)
    table = benchmark_table(id_scores, correct, sets, {name: "far" for name in sets},
                            intervals=Settings(resamples=10))
    assert [row["set"] for row in table.rows] == ["ssb", "ninco", "textures", "far", "all"]
    assert table.row("far")["auroc"] == table.row("all")["auroc"]


def bad_call(**changes):
    id_scores, correct, sets, groups = table_data(seed=6)
    arguments = {"id_scores": id_scores, "id_correct": correct, "ood_sets": sets, "groups": groups,
                 "intervals": Settings(resamples=10)}
    arguments.update(changes)
    return lambda: benchmark_table(arguments.pop("id_scores"), arguments.pop("id_correct"),
                                   arguments.pop("ood_sets"), arguments.pop("groups"), **arguments)


@pytest.mark.parametrize(("call", "message"), [
    (bad_call(groups={"ssb": "near", "ninco": "near"}), r"missing \['textures'\]"),
    (bad_call(groups={"ssb": "near", "ninco": "csid", "textures": "far"}), "group of OOD set 'ninco'.*'csid'"),
    (bad_call(ood_sets={"near": torch.zeros(3)}, groups={"near": "near"}), "may not be named 'near'"),
    (bad_call(ood_sets={"a": torch.tensor([0.0, math.nan])}, groups={"a": "far"}), "OOD set 'a'.*NaN"),
    (bad_call(ood_sets={"a": torch.zeros(0)}, groups={"a": "far"}), "OOD set 'a' has no scores"),
    (bad_call(ood_sets={}, groups={}), "non-empty mapping"),
    (bad_call(id_correct=torch.ones(5, dtype=torch.bool)), r"id_correct must have shape \(120,\)"),
    (bad_call(id_scores=torch.zeros(0), id_correct=torch.zeros(0)), "id_scores is empty"),
    (bad_call(strata={"ssb": 1, "ninco": 1, "textures": 2}), "its own stratum"),
    (bad_call(strata={"ssb": 0, "ninco": 1, "textures": 2}), "stratum of OOD set 'ssb' must be an integer >= 1"),
    (bad_call(strata={"ssb": 1}), "strata must give every OOD set"),
    (bad_call(cache=ResampleCache(10, 4)), "seed 4"),
])
def test_bad_table_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
