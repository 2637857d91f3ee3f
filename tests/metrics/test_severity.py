import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from metrics import class_mean_scores, level_percentiles, level_starts, severity_levels, severity_table
from tests.metrics.reference import severity_reference, severity_reference_exact


def test_percentiles_match_the_published_table():
    # the "percentile" column of the paper's published tables
    assert level_percentiles(11) == [0.0, 0.1, 0.2, 0.30000000000000004, 0.4, 0.5, 0.6000000000000001,
                                     0.7000000000000001, 0.8, 0.9, 1.0]


@pytest.mark.parametrize(("num_classes", "group_size"), [(15, 4), (40, 10), (101, 7), (1000, 1), (230, 200), (21, 11)])
@pytest.mark.parametrize("seed", range(2))
def test_against_reference(num_classes, group_size, seed):
    scores = torch.from_numpy(np.random.default_rng(seed).random(num_classes))
    groups, level_scores = severity_levels(scores, group_size)
    ref_groups, ref_scores = severity_reference(scores.tolist(), group_size)
    assert groups.shape == (11, group_size)
    assert groups.tolist() == ref_groups
    np.testing.assert_allclose(level_scores.numpy(), ref_scores, rtol=1e-12)


@pytest.mark.parametrize("num_levels", range(2, 61))
def test_any_number_of_levels_against_exact_fractions(num_levels):
    # q_i = i / (L - 1) in floating point lands below an integer window start (49 · (1/49) = 0.9999999999999999):
    # the starts are exact rationals, floor(i · W / (L - 1)), the last minus 1
    rng = np.random.default_rng(num_levels)
    for num_classes, group_size in [(num_levels + 9, 10), (100, 1), (150, 51), (200, 200), (61, 3), (2 * num_levels, 2)]:
        scores = torch.from_numpy(rng.random(num_classes))
        groups, level_scores = severity_levels(scores, group_size, num_levels)
        ref_groups, ref_scores = severity_reference_exact(scores.tolist(), group_size, num_levels)
        assert groups.shape == (num_levels, group_size)
        assert groups.tolist() == ref_groups, (num_classes, group_size)
        np.testing.assert_allclose(level_scores.numpy(), ref_scores, rtol=1e-12)
        # the last level is the hardest window there is, the first the easiest
        assert groups[-1].tolist() == torch.argsort(scores, stable=True)[-group_size:].tolist()
        assert groups[0].tolist() == torch.argsort(scores, stable=True)[:group_size].tolist()


def test_fifty_levels_hardest_is_the_last_window():
    # M = 100, G = 1: 100 windows; float q_49 · 100 = 99.99999999999999 picked window 98 as the "hardest"
    scores = torch.arange(100, dtype=torch.float64) / 100
    groups, level_scores = severity_levels(scores, 1, 50)
    assert groups[-1].tolist() == [99]
    assert level_scores[-1].item() == pytest.approx(0.99, abs=1e-12)
    assert groups[:, 0].tolist()[:3] == [0, 2, 4]  # floor(i · 100 / 49) = 0, 2, 4


def test_eleven_levels_equal_the_papers_float_rule():
    # the default keeps int(q · W) with the published percentiles q = 0, 0.1, ..., 1, for every W up to 3000
    for num_windows in range(1, 3001):
        paper = [int(q * num_windows) for q in level_percentiles(11)]
        paper[-1] -= 1
        assert level_starts(num_windows, 11) == paper, num_windows
    groups, _ = severity_levels(torch.arange(230, dtype=torch.float64), 1, 11)  # G = 1: window j is class j
    assert groups[:, 0].tolist() == [0, 23, 46, 69, 92, 115, 138, 161, 184, 207, 229]


def test_levels_get_harder_and_hand_computed_case():
    # M = 14, G = 4: 11 windows; starts int(q * 11) = 0,1,2,3,4,5,6,7,8,9,11 -> last minus 1 = 10
    scores = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.6, 0.4, 0.8, 0.05, 0.95, 0.15, 0.35, 0.55])
    groups, level_scores = severity_levels(scores, 4)
    assert groups[0].tolist() == [9, 1, 11, 5]  # the four lowest scores: easiest level
    assert groups[10].tolist() == [4, 8, 0, 10]  # the four highest: hardest level
    assert level_scores[0].item() == pytest.approx((0.05 + 0.1 + 0.15 + 0.2) / 4)
    assert (level_scores[1:] >= level_scores[:-1]).all()


def test_edge_cases():
    # M - G + 1 = L windows: every level its own window, each one class further
    scores = torch.tensor([0.3, 0.1, 0.2, 0.05, 0.9], dtype=torch.float64)
    groups, level_scores = severity_levels(scores, 3, 3)
    assert groups.tolist() == [[3, 1, 2], [1, 2, 0], [2, 0, 4]]
    assert level_scores.tolist() == pytest.approx([0.35 / 3, 0.6 / 3, 1.4 / 3], abs=1e-12)
    # M = G: one window, which the paper's rule repeats (the benchmark refuses or caps that before any pass)
    groups, level_scores = severity_levels(torch.tensor([0.3, 0.1, 0.2]), 3)
    assert groups.tolist() == [[1, 2, 0]] * 11
    assert torch.allclose(level_scores, torch.full((11,), 0.2, dtype=torch.float64))
    with pytest.raises(ValueError, match="M = 2 < G = 3"):
        severity_levels(torch.tensor([0.3, 0.1]), 3)
    with pytest.raises(ValueError, match="NaN"):
        severity_levels(torch.tensor([0.3, float("nan"), 0.2]), 2)


def test_class_means():
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0, 0.5])
    classes = torch.tensor([0, 0, 2, 1, 2])
    torch.testing.assert_close(class_mean_scores(scores, classes), torch.tensor([1.5, 10.0, 1.75], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"classes \[1\] have no"):
        class_mean_scores(scores, torch.tensor([0, 0, 2, 2, 2]))


def test_table_against_sklearn():
    rng = np.random.default_rng(0)
    id_scores = np.round(rng.random(300), 2)
    id_correct = rng.random(300) < 0.7
    ood_classes = np.repeat(np.arange(20), 10)
    ood_scores = np.round(rng.random(200) * (0.5 + ood_classes / 40), 2)
    groups, _ = severity_levels(class_mean_scores(torch.from_numpy(ood_scores), torch.from_numpy(ood_classes)), 5)
    rows = severity_table(id_scores=torch.from_numpy(id_scores), id_correct=torch.from_numpy(id_correct),
                          ood_scores=torch.from_numpy(ood_scores), ood_classes=torch.from_numpy(ood_classes),
                          groups=groups, model_name="m", kappa_name="softmax")
    assert [r["severity level"] for r in rows] == list(range(11))
    for row, group in zip(rows, groups, strict=True):
        members = np.isin(ood_classes, group.numpy())
        assert members.sum() == 50
        expected = roc_auc_score(np.r_[np.ones(300), np.zeros(50)], np.r_[id_scores, ood_scores[members]])
        assert row["ood-auroc"] == pytest.approx(expected, abs=1e-12)
        assert row["ood_avg_conf"] == pytest.approx(ood_scores[members].mean())
    assert rows[0]["id-acc"] == pytest.approx(id_correct.mean())
    assert rows[0]["id-auroc"] == pytest.approx(roc_auc_score(id_correct, id_scores), abs=1e-12)
    assert rows[0]["id_avg_conf"] == pytest.approx(id_scores.mean())
    assert rows[3]["model name - confidence function"] == "m-softmax"
    assert rows[0]["ood-auroc"] >= rows[-1]["ood-auroc"]  # harder levels: lower AUROC here by construction


def test_the_default_number_of_levels_is_the_papers_capped_at_the_windows():
    from metrics.severity import PAPER_LEVELS, resolve_num_levels

    assert PAPER_LEVELS == 11 and resolve_num_levels(None, 1000 + 10, 1000) == 11  # 11 windows: no warning
    with pytest.warns(UserWarning, match=r"the pool has M − G \+ 1 = 5 − 3 \+ 1 = 3 distinct windows, fewer than "
                                         r"the paper's 11 severity levels: 3 levels"):
        assert resolve_num_levels(None, 5, 3, data="the pool") == 3
    # a number given is the user's: refused above the windows, never capped
    assert resolve_num_levels(3, 5, 3) == 3
    with pytest.raises(ValueError, match=r"num_levels = 4 asks for more severity levels .* 3 windows"):
        resolve_num_levels(4, 5, 3)
    # a single window (a pool of G classes) has no levels to tell apart
    with pytest.raises(ValueError, match=r"the pool has 3 OOD pool classes and G = 3 ID classes: M − G \+ 1 = 1 "
                                         r"window, .* at least G \+ 1 = 4 OOD classes"):
        resolve_num_levels(None, 3, 3, data="the pool")
