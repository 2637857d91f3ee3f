import numpy as np
import pytest
import torch

from metrics import (
    DEFAULT_FPR_TARGETS,
    OSCR,
    CCRAtFPR,
    authors_oscr_curve,
    ccr_at_fpr,
    ccr_from_authors_curve,
    closed_set_accuracy,
    oscr_curve,
    resample_weights,
    weighted_ccr_at_fpr,
)
from tests.distributed import run_distributed
from tests.metrics.reference import (
    authors_ccr_at_fpr_reference,
    authors_oscr_reference,
    ccr_at_fpr_reference,
    oscr_reference,
    random_open_set_data,
)

# Hand-computed case (K = 2). Known: S_y = 0.9 (correct), 0.4 (wrong: argmax is 1), 0.7 (correct).
# Unknown max scores: 0.8, 0.5. Thresholds 0.9, 0.8, 0.7, 0.5, 0.4 with strict ">".
HAND_PROBS = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.3, 0.7], [0.8, 0.2], [0.5, 0.5]])
HAND_TARGET = torch.tensor([0, 0, 1, -2, -2])


def test_hand_computed_curve():
    fpr, ccr, thresholds = oscr_curve(HAND_PROBS, HAND_TARGET)
    torch.testing.assert_close(thresholds, torch.tensor([0.9, 0.8, 0.7, 0.5, 0.4]))
    torch.testing.assert_close(ccr, torch.tensor([0, 1 / 3, 1 / 3, 2 / 3, 2 / 3], dtype=torch.float64))
    torch.testing.assert_close(fpr, torch.tensor([0, 0, 0.5, 0.5, 1.0], dtype=torch.float64))


def test_hand_computed_ccr_at_fpr():
    ccr = ccr_at_fpr(HAND_PROBS, HAND_TARGET, [0.0, 0.49, 0.5, 1.0])
    torch.testing.assert_close(ccr, torch.tensor([1 / 3, 1 / 3, 2 / 3, 2 / 3], dtype=torch.float64))


def test_negatives_and_unknowns_are_separate():
    probs = torch.cat([HAND_PROBS, torch.tensor([[0.95, 0.05]])])
    target = torch.cat([HAND_TARGET, torch.tensor([-1])])
    # the negative (-1) must not change the curve on unknowns ...
    for a, b in zip(oscr_curve(probs, target, unknown_label=-2), oscr_curve(HAND_PROBS, HAND_TARGET), strict=True):
        torch.testing.assert_close(a, b)
    # ... and on negatives it is the only sample counted for the FPR
    fpr, ccr, thresholds = oscr_curve(probs, target, unknown_label=-1)
    torch.testing.assert_close(thresholds, torch.tensor([0.95, 0.9, 0.7, 0.4]))
    torch.testing.assert_close(fpr, torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64))


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("unknown_label", [-1, -2])
@pytest.mark.parametrize("seed", range(4))
def test_against_reference_with_ties(seed, unknown_label, background):
    rng = np.random.default_rng(seed)
    probs, target = random_open_set_data(rng, n=300, k=5, background=background, decimals=2)
    fpr, ccr, thresholds = oscr_curve(torch.from_numpy(probs), torch.from_numpy(target), unknown_label, background)
    ref_fpr, ref_ccr, ref_thresholds = oscr_reference(probs, target, unknown_label, background)
    assert len(np.unique(ref_thresholds)) < 300, "the data must contain ties"
    np.testing.assert_array_equal(thresholds.numpy(), ref_thresholds.astype(np.float32))
    np.testing.assert_array_equal(fpr.numpy(), ref_fpr)
    np.testing.assert_array_equal(ccr.numpy(), ref_ccr)
    targets = [0.0, 1e-3, 1e-2, 0.05, 1e-1, 0.5, 1.0]
    np.testing.assert_array_equal(
        ccr_at_fpr(torch.from_numpy(probs), torch.from_numpy(target), targets, unknown_label, background).numpy(),
        ccr_at_fpr_reference(probs, target, targets, unknown_label, background),
    )


def test_background_column_is_dropped_not_renormalised():
    # the background column holds the largest value; dropping it must not rescale the known scores
    probs = torch.tensor([[0.3, 0.1, 0.6], [0.2, 0.25, 0.55], [0.1, 0.05, 0.85]])
    target = torch.tensor([0, 1, -2])
    fpr, ccr, thresholds = oscr_curve(probs, target, background=True)
    torch.testing.assert_close(thresholds, torch.tensor([0.3, 0.25, 0.1]))
    torch.testing.assert_close(ccr, torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(fpr, torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(closed_set_accuracy(probs, target, background=True), torch.tensor(1.0, dtype=torch.float64))


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="NaN"):
        oscr_curve(torch.tensor([[float("nan"), 0.5], [0.5, 0.5]]), torch.tensor([0, -2]))
    with pytest.raises(ValueError, match="label 2"):
        oscr_curve(HAND_PROBS, torch.tensor([0, 0, 2, -2, -2]))
    with pytest.raises(ValueError, match="unknown_label=-1"):
        oscr_curve(HAND_PROBS, HAND_TARGET, unknown_label=-1)
    with pytest.raises(ValueError, match="known sample"):
        oscr_curve(HAND_PROBS[3:], HAND_TARGET[3:])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ccr_at_fpr(HAND_PROBS, HAND_TARGET, [1.5])
    with pytest.raises(TypeError, match="integer labels"):
        oscr_curve(HAND_PROBS, HAND_TARGET.float())


def test_stateful_metrics_match_functions_across_batches():
    rng = np.random.default_rng(7)
    probs, target = map(torch.from_numpy, random_open_set_data(rng, n=101, k=4))
    oscr, ccr = OSCR(unknown_label=-2), CCRAtFPR(unknown_label=-2)
    for start in range(0, 101, 16):
        index = torch.arange(start, min(start + 16, 101))
        oscr.update(probs[index], target[index], index)
        ccr.update(probs[index], target[index], index)
    for a, b in zip(oscr.compute(), oscr_curve(probs, target), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(ccr.compute(), ccr_at_fpr(probs, target, DEFAULT_FPR_TARGETS))


def _distributed_oscr(rank: int, world_size: int, probs: torch.Tensor, target: torch.Tensor):
    from torch.utils.data import DistributedSampler

    # DistributedSampler pads 101 samples to 102 by repeating one: the metric must drop it
    sampler = DistributedSampler(range(len(target)), num_replicas=world_size, rank=rank, shuffle=True, seed=3)
    index = torch.tensor(list(sampler))
    oscr = OSCR(unknown_label=-1)
    ccr = CCRAtFPR(unknown_label=-2)
    for chunk in index.split(8):
        oscr.update(probs[chunk], target[chunk], chunk)
        ccr.update(probs[chunk], target[chunk], chunk)
    return oscr.compute(), ccr.compute()


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
def test_ddp_two_processes_equal_one_process():
    rng = np.random.default_rng(11)
    probs, target = map(torch.from_numpy, random_open_set_data(rng, n=101, k=4))
    results = run_distributed(_distributed_oscr, probs, target)
    expected_curve = oscr_curve(probs, target, unknown_label=-1)
    expected_ccr = ccr_at_fpr(probs, target, DEFAULT_FPR_TARGETS, unknown_label=-2)
    for curve, ccr in results:
        for a, b in zip(curve, expected_curve, strict=True):
            assert torch.equal(a, b)
        assert torch.equal(ccr, expected_ccr)


# --- the integer sort keys of oscr_curve: every dtype, the whole [0, 1] range, ties of the argmax -------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("unknown_label", [-1, -2])
def test_every_dtype_against_reference(dtype, unknown_label):
    probs, target = random_open_set_data(np.random.default_rng(5), n=400, k=4, decimals=3)
    probs = torch.from_numpy(probs).to(dtype)
    # the reference sees exactly the values the metric sees
    fpr, ccr, thresholds = oscr_curve(probs, torch.from_numpy(target), unknown_label)
    ref_fpr, ref_ccr, ref_thresholds = oscr_reference(probs.double().numpy(), target, unknown_label)
    assert thresholds.dtype == dtype and fpr.dtype == ccr.dtype == torch.float64
    np.testing.assert_array_equal(thresholds.double().numpy(), ref_thresholds)
    np.testing.assert_array_equal(fpr.numpy(), ref_fpr)
    np.testing.assert_array_equal(ccr.numpy(), ref_ccr)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_over_the_whole_range(dtype):
    # 0, -0.0, subnormals, tiny and large probabilities, 1: bit patterns on both sides of the keys' sign bit
    values = [0.0, -0.0, 1e-40, 1e-30, 1e-19, 1e-10, 0.25, 0.5, 0.75, 1.0]
    if dtype == torch.float64:
        values += [1e-310, 1e-300, 1e-100]
    values = torch.tensor(values, dtype=dtype)
    n = values.numel()
    # known rows: S_y = v (correct when it is the max); unknown rows: max = v
    known_rows = torch.stack([values, 1 - values], dim=1)
    unknown_rows = torch.stack([values.flip(0), 1 - values.flip(0)], dim=1).max(dim=1, keepdim=True).values
    probs = torch.cat([known_rows, torch.cat([unknown_rows, 1 - unknown_rows], dim=1)])
    target = torch.cat([torch.zeros(n, dtype=torch.long), torch.full((n,), -2)])
    fpr, ccr, thresholds = oscr_curve(probs, target)
    ref_fpr, ref_ccr, ref_thresholds = oscr_reference(probs.double().numpy(), target.numpy())
    np.testing.assert_array_equal(thresholds.double().numpy(), ref_thresholds)  # -0.0 == 0.0: one threshold
    np.testing.assert_array_equal(fpr.numpy(), ref_fpr)
    np.testing.assert_array_equal(ccr.numpy(), ref_ccr)
    assert thresholds[0] == 1.0 and thresholds[-1] == 0.0 and torch.all(thresholds[1:] < thresholds[:-1])


def test_tied_maximum_counts_as_correct_only_for_the_first_column():
    # argmax takes the first maximal column (as numpy and the authors' code do)
    probs = torch.tensor([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2], [0.3, 0.35, 0.35], [0.3, 0.35, 0.35], [0.6, 0.2, 0.2]])
    target = torch.tensor([0, 1, 1, 2, -2])
    fpr, ccr, thresholds = oscr_curve(probs, target)
    # correct: rows 0 (S_y 0.4) and 2 (S_y 0.35); rows 1 and 3 are misclassified
    torch.testing.assert_close(thresholds, torch.tensor([0.6, 0.4, 0.35]))
    torch.testing.assert_close(ccr, torch.tensor([0.0, 0.0, 0.25], dtype=torch.float64))
    torch.testing.assert_close(fpr, torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64))
    assert closed_set_accuracy(probs, target).item() == 0.5


def test_other_negative_labels_take_no_part_and_many_ties():
    rng = np.random.default_rng(9)
    probs, target = random_open_set_data(rng, n=20_000, k=3, decimals=2)  # about 100 distinct scores
    for label, other in ((-2, -1), (-1, -2)):
        fpr, ccr, thresholds = oscr_curve(torch.from_numpy(probs), torch.from_numpy(target), label)
        keep = target != other
        alone = oscr_curve(torch.from_numpy(probs[keep]), torch.from_numpy(target[keep]), label)
        for a, b in zip((fpr, ccr, thresholds), alone, strict=True):
            assert torch.equal(a, b)
        ref_fpr, ref_ccr, ref_thresholds = oscr_reference(probs, target, label)
        np.testing.assert_array_equal(thresholds.numpy(), ref_thresholds.astype(np.float32))
        np.testing.assert_array_equal(fpr.numpy(), ref_fpr)
        np.testing.assert_array_equal(ccr.numpy(), ref_ccr)


def test_inputs_are_not_modified():
    probs, target = map(torch.from_numpy, random_open_set_data(np.random.default_rng(2), n=300, k=4))
    probs_before, target_before = probs.clone(), target.clone()
    for convention in ("exact", "authors"):
        ccr_at_fpr(probs, target, convention=convention)
    oscr_curve(probs, target)
    assert torch.equal(probs, probs_before) and torch.equal(target, target_before)


# --- the authors' table convention (DESIGN.md §5.1) -------------------------------------------------


def _equal_with_nan(actual: torch.Tensor, expected: torch.Tensor | np.ndarray) -> None:
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def test_authors_convention_hand_computed():
    # HAND case. Thresholds: the distinct known S_y {0.4, 0.7, 0.9} but the largest -> 0.4, 0.7.
    #   τ = 0.4: CCR = |{0.9, 0.7}| / 3 = 2/3 (0.4 is misclassified anyway), FPR = |{0.8, 0.5}| / 2 = 1
    #   τ = 0.7: CCR = |{0.9}| / 3 = 1/3,                                      FPR = |{0.8}| / 2 = 0.5
    # Table (nearest FPR, "—" if |FPR - t| / t >= 0.1), against the exact convention (largest CCR with
    # FPR <= t on the full curve of test_hand_computed_curve):
    #   t = 0.1 : nearest 0.5, |0.4| / 0.1 = 4      -> NaN   exact 1/3
    #   t = 0.46: nearest 0.5 (above t), 0.087      -> 1/3   exact 1/3
    #   t = 0.5 : FPR 0.5 exactly                   -> 1/3   exact 2/3 (θ = 0.5 has FPR 0.5, CCR 2/3)
    #   t = 0.55: nearest 0.5, 0.05 / 0.55 = 0.091  -> 1/3   exact 2/3
    #   t = 1   : FPR 1                             -> 2/3   exact 2/3
    fpr, ccr, thresholds = authors_oscr_curve(HAND_PROBS, HAND_TARGET)
    torch.testing.assert_close(thresholds, torch.tensor([0.4, 0.7]))
    torch.testing.assert_close(fpr, torch.tensor([1.0, 0.5], dtype=torch.float64))
    torch.testing.assert_close(ccr, torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
    targets = [0.1, 0.46, 0.5, 0.55, 1.0]
    nan = float("nan")
    authors = ccr_at_fpr(HAND_PROBS, HAND_TARGET, targets, convention="authors")
    _equal_with_nan(authors, [nan, 1 / 3, 1 / 3, 1 / 3, 2 / 3])
    exact = ccr_at_fpr(HAND_PROBS, HAND_TARGET, targets, convention="exact")
    torch.testing.assert_close(exact, torch.tensor([1 / 3, 1 / 3, 2 / 3, 2 / 3, 2 / 3], dtype=torch.float64))
    _equal_with_nan(authors, authors_ccr_at_fpr_reference(HAND_PROBS.numpy(), HAND_TARGET.numpy(), targets))


def test_authors_empty_curve_gives_nan():
    # all known samples share one target score: np.unique(...)[:-1] is empty, the table is all "—"
    probs = torch.tensor([[0.7, 0.3], [0.3, 0.7], [0.6, 0.4]])
    target = torch.tensor([0, 1, -2])
    fpr, ccr, thresholds = authors_oscr_curve(probs, target)
    assert fpr.numel() == ccr.numel() == thresholds.numel() == 0
    _equal_with_nan(ccr_at_fpr(probs, target, [0.1, 1.0], convention="authors"), [float("nan")] * 2)


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("unknown_label", [-1, -2])
@pytest.mark.parametrize("seed", range(4))
def test_authors_convention_against_reference_with_ties(seed, unknown_label, background):
    rng = np.random.default_rng(100 + seed)
    probs, target = random_open_set_data(rng, n=300, k=5, background=background, decimals=2)
    fpr, ccr, thresholds = authors_oscr_curve(torch.from_numpy(probs), torch.from_numpy(target), unknown_label, background)
    ref_fpr, ref_ccr, ref_thresholds = authors_oscr_reference(probs, target, unknown_label, background)
    assert len(ref_thresholds) < (target >= 0).sum() - 1, "the known target scores must contain ties"
    np.testing.assert_array_equal(thresholds.numpy(), ref_thresholds.astype(np.float32))
    np.testing.assert_array_equal(fpr.numpy(), ref_fpr)
    np.testing.assert_array_equal(ccr.numpy(), ref_ccr)
    targets = [1e-3, 1e-2, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0]
    actual = ccr_at_fpr(torch.from_numpy(probs), torch.from_numpy(target), targets, unknown_label, background,
                        convention="authors")
    expected = authors_ccr_at_fpr_reference(probs, target, targets, unknown_label, background)
    assert np.isnan(expected).any() and not np.isnan(expected).all(), "the grid must hit both '—' and values"
    np.testing.assert_array_equal(actual.numpy(), expected)  # NaN positions must agree as well
    _equal_with_nan(ccr_from_authors_curve(torch.from_numpy(ref_fpr), torch.from_numpy(ref_ccr), targets), expected)


def test_authors_tie_rule_takes_lowest_threshold():
    # Five correct knowns, S_y = 0.60 .. 0.68 -> thresholds 0.60, 0.62, 0.64, 0.66 with CCR 4/5 .. 1/5.
    # Sixteen unknowns: 8 at 0.9, 1 at 0.63, 7 at 0.55 -> FPR = 9/16, 9/16, 8/16, 8/16.
    known = torch.tensor([0.60, 0.62, 0.64, 0.66, 0.68])
    unknown = torch.tensor([0.9] * 8 + [0.63] + [0.55] * 7)
    scores = torch.cat([known, unknown])
    probs = torch.stack([scores, 1 - scores], dim=1)
    target = torch.tensor([0] * 5 + [-2] * 16)
    fpr, ccr, _ = authors_oscr_curve(probs, target)
    torch.testing.assert_close(fpr, torch.tensor([9, 9, 8, 8], dtype=torch.float64) / 16)
    torch.testing.assert_close(ccr, torch.tensor([4, 3, 2, 1], dtype=torch.float64) / 5)
    # t = 17/32 lies exactly half-way (1/32 from both, 0.059 relative): the lowest threshold, 0.60, wins;
    # t = 0.52 is nearest to 8/16, reached first at 0.64; t = 0.55 is nearest to 9/16, first at 0.60.
    targets = [17 / 32, 0.52, 0.55]
    expected = torch.tensor([4 / 5, 2 / 5, 4 / 5], dtype=torch.float64)
    torch.testing.assert_close(ccr_at_fpr(probs, target, targets, convention="authors"), expected)
    _equal_with_nan(expected, authors_ccr_at_fpr_reference(probs.numpy(), target.numpy(), targets))
    # the same rule straight on a curve: equally near runs on both sides -> first index overall
    curve_fpr = torch.tensor([0.75, 0.5, 0.5, 0.25], dtype=torch.float64)
    curve_ccr = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)
    _equal_with_nan(ccr_from_authors_curve(curve_fpr, curve_ccr, [0.5, 0.26, 0.7]), [0.8, 0.6, 0.9])


def test_authors_bad_targets_and_convention_are_rejected():
    for bad in ([0.0], [-0.1], [1e-2, 0.0]):
        with pytest.raises(ValueError, match=r"\(0, 1\]|\[0, 1\]"):
            ccr_at_fpr(HAND_PROBS, HAND_TARGET, bad, convention="authors")
        with pytest.raises(ValueError, match=r"\(0, 1\]|\[0, 1\]"):
            CCRAtFPR(fpr_targets=bad, convention="authors")
    with pytest.raises(ValueError, match="convention='authors'"):
        ccr_from_authors_curve(torch.tensor([0.5]), torch.tensor([0.5]), [0.0])
    with pytest.raises(ValueError, match=r"\('exact', 'authors'\).*'paper'"):
        ccr_at_fpr(HAND_PROBS, HAND_TARGET, [0.1], convention="paper")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'paper'"):
        CCRAtFPR(convention="paper")  # type: ignore[arg-type]
    # 0 stays a valid target for the exact convention
    torch.testing.assert_close(ccr_at_fpr(HAND_PROBS, HAND_TARGET, [0.0]), torch.tensor([1 / 3], dtype=torch.float64))


def test_stateful_authors_convention_matches_function_across_batches():
    rng = np.random.default_rng(13)
    probs, target = map(torch.from_numpy, random_open_set_data(rng, n=150, k=4, background=True))
    targets = (1e-2, 0.1, 0.3, 0.5, 1.0)
    metric = CCRAtFPR(fpr_targets=targets, unknown_label=-1, background=True, convention="authors")
    # batches arrive out of order: the metric restores dataset order by index
    for chunk in torch.randperm(150, generator=torch.Generator().manual_seed(0)).split(16):
        metric.update(probs[chunk], target[chunk], chunk)
    result = metric.compute()
    expected = ccr_at_fpr(probs, target, targets, unknown_label=-1, background=True, convention="authors")
    _equal_with_nan(result, expected)
    _equal_with_nan(result, authors_ccr_at_fpr_reference(probs.numpy(), target.numpy(), targets, -1, True))
    assert torch.isnan(result).any() and not torch.isnan(result).all()


# -- weighted: every row of resampling weights at once ---------------------------------------------------------


def _weighted_case(seed: int, background: bool, n: int = 260) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tied probabilities, and 14 rows of weights: bootstrap counts, one row of ones, one without unknowns."""
    probs, target = random_open_set_data(np.random.default_rng(seed), n, 4, background=background)
    probs = torch.tensor(probs / probs.sum(axis=1, keepdims=True))
    target = torch.from_numpy(target)
    weights = resample_weights(n, 14, seed)
    weights[0] = 1
    weights[1, target == -2] = 0
    return probs, target, weights


@pytest.mark.parametrize("convention", ["exact", "authors"])
@pytest.mark.parametrize("background", [False, True])
def test_weighted_ccr_at_fpr_equals_the_references_on_the_expanded_rows(convention, background):
    probs, target, weights = _weighted_case(3 + background, background)
    fpr_targets = (0.01, 0.05, 0.1, 0.5, 1.0)
    ours = weighted_ccr_at_fpr(probs, target, weights, fpr_targets, background=background, convention=convention)
    reference = authors_ccr_at_fpr_reference if convention == "authors" else ccr_at_fpr_reference
    assert bool(torch.isnan(ours[1]).all())  # no unknown in the row: no curve
    nan_seen = 0
    for b in [0, *range(2, 14)]:
        rows = np.repeat(np.arange(target.numel()), weights[b].numpy())
        expected = reference(probs[rows].numpy(), target[rows].numpy(), fpr_targets, background=background)
        np.testing.assert_allclose(ours[b].numpy(), expected, rtol=0, atol=1e-12)
        direct = ccr_at_fpr(probs[rows], target[rows], fpr_targets, background=background, convention=convention)
        assert torch.equal(ours[b].isnan(), direct.isnan())
        nan_seen += int(direct.isnan().sum())
    assert convention == "exact" or nan_seen > 0  # the authors' "—" was exercised


def test_weighted_ccr_at_fpr_of_negatives_ignores_the_unknowns():
    probs, target, weights = _weighted_case(9, False)
    ours = weighted_ccr_at_fpr(probs, target, weights, (0.1, 1.0), unknown_label=-1)
    for b in range(14):
        rows = np.repeat(np.arange(target.numel()), weights[b].numpy())
        expected = ccr_at_fpr_reference(probs[rows].numpy(), target[rows].numpy(), (0.1, 1.0),
                                        unknown_label=-1)
        np.testing.assert_allclose(ours[b].numpy(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("weights", "error", "message"), [
    (torch.ones(2, 5), TypeError, "integer counts"),
    (torch.ones(2, 4, dtype=torch.int64), ValueError, r"\(B, 5\)"),
    (-torch.ones(2, 5, dtype=torch.int64), ValueError, "negative"),
])
def test_weighted_ccr_at_fpr_refuses_bad_weights(weights, error, message):
    with pytest.raises(error, match=message):
        weighted_ccr_at_fpr(HAND_PROBS, HAND_TARGET, weights)
