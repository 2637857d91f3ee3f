import math

import numpy as np
import pytest
import torch

from metrics import (
    KAPPAS,
    MutualInformation,
    expected_entropy,
    member_probabilities,
    mutual_information,
    mutual_information_from_logits,
    predictive_entropy,
)
from tests.distributed import run_distributed

# --- an independent reference, written from the formula with loops over samples and members ---


def entropy_reference(p: np.ndarray) -> float:
    return -sum(float(q) * math.log(q) for q in p if q > 0)


def ensemble_reference(member_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(predictive entropy, expected entropy, MI) per sample, for (M, N, C) probabilities."""
    num_members, num_samples, _ = member_probs.shape
    predictive, expected = np.zeros(num_samples), np.zeros(num_samples)
    for n in range(num_samples):
        mean = sum(member_probs[m, n] for m in range(num_members)) / num_members
        predictive[n] = entropy_reference(mean)
        expected[n] = sum(entropy_reference(member_probs[m, n]) for m in range(num_members)) / num_members
    return predictive, expected, predictive - expected


def softmax_reference(logits: np.ndarray, background: bool) -> np.ndarray:
    """Each member's softmax; with a background class its probability spread over the K known classes."""
    e = np.exp(logits - logits.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    if background:
        k = p.shape[-1] - 1
        p = p[..., :k] + p[..., k:] / k
    return p


def random_member_probs(rng: np.random.Generator, m: int = 5, n: int = 40, c: int = 6) -> np.ndarray:
    """Dirichlet rows with exact zeros, some one-hot rows (exact 0 and 1), and a sample where all agree."""
    p = rng.dirichlet(np.full(c, 0.5), size=(m, n))
    zeros = rng.random((m, n, c)) < 0.2
    zeros[..., 0] = False  # keep at least one class per row
    p = np.where(zeros, 0.0, p)
    p /= p.sum(-1, keepdims=True)
    p[:, :5] = np.eye(c)[rng.integers(0, c, size=(m, 5))]  # one-hot members
    p[:, 5] = p[0, 5]  # all members agree
    return p


@pytest.mark.parametrize("seed", range(3))
def test_against_numpy_reference_with_exact_zeros_and_ones(seed):
    probs = random_member_probs(np.random.default_rng(seed), m=seed + 1)
    assert (probs == 0).any() and (probs == 1).any()
    predictive, expected, mi = ensemble_reference(probs)
    torch_probs = torch.from_numpy(probs)
    for fn, reference in ((predictive_entropy, predictive), (expected_entropy, expected),
                          (mutual_information, np.maximum(mi, 0.0))):
        result = fn(torch_probs)
        assert result.dtype == torch.float64 and result.shape == (probs.shape[1],)
        assert torch.isfinite(result).all()
        np.testing.assert_allclose(result.numpy(), reference, rtol=1e-12, atol=1e-14)
    # any float dtype in, float64 accumulation out
    result = mutual_information(torch_probs.float())
    assert result.dtype == torch.float64
    np.testing.assert_allclose(result.numpy(), ensemble_reference(probs.astype(np.float32).astype(np.float64))[2],
                               rtol=1e-12, atol=1e-12)
    if seed == 0:  # a single member has no epistemic uncertainty
        assert (mutual_information(torch_probs) == 0).all()


def test_hand_computed_cases():
    agreeing = torch.tensor([[0.7, 0.2, 0.1], [0.0, 1.0, 0.0]], dtype=torch.float64).expand(4, -1, -1)
    assert mutual_information(agreeing).tolist() == pytest.approx([0.0, 0.0], abs=1e-15)
    # two confident members that disagree on 2 classes: mean (1/2, 1/2, 0), MI = log 2 - 0
    disagreeing = torch.tensor([[[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]]])
    assert predictive_entropy(disagreeing).item() == pytest.approx(math.log(2), rel=1e-15)
    assert expected_entropy(disagreeing).item() == 0.0
    assert mutual_information(disagreeing).item() == pytest.approx(math.log(2), rel=1e-15)
    # uniform members: all uncertainty is aleatoric
    uniform = torch.full((3, 2, 7), 1 / 7)
    assert mutual_information(uniform).tolist() == pytest.approx([0.0, 0.0], abs=1e-7)
    assert predictive_entropy(uniform).tolist() == pytest.approx([math.log(7)] * 2, rel=1e-7)
    # half agree on class 0, half on class 1, each member 0.9 sure: H(mean) = log 2, mean H = H(0.9, 0.1)
    half = torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]], dtype=torch.float64)
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert mutual_information(half).item() == pytest.approx(math.log(2) - h, rel=1e-14)


def test_mi_is_clamped_only_for_rounding():
    # members equal up to the last bits: the difference of the entropies may be a few ulp below 0
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(200, 10, dtype=torch.float64), 1)
    members = torch.stack([p, p * (1 + 1e-16), p])
    mi = mutual_information(members)
    assert (mi >= 0).all() and mi.max() < 1e-14


@pytest.mark.parametrize("background", [False, True])
def test_from_logits_equals_probability_path(background):
    logits = torch.from_numpy(np.random.default_rng(3).normal(size=(4, 30, 6)) * 4)
    logits[:, :3] *= 500  # saturated members: probabilities of exactly 0 and 1 in float64
    via_probs = mutual_information(member_probabilities(logits, background=background))
    from_logits = mutual_information_from_logits(logits, background=background)
    assert from_logits.dtype == torch.float64
    torch.testing.assert_close(from_logits, via_probs, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(from_logits.numpy(), np.maximum(
        ensemble_reference(softmax_reference(logits.numpy(), background))[2], 0.0), rtol=1e-10, atol=1e-12)


def test_from_logits_gradient_is_finite_for_extreme_logits():
    # sample 0: two saturated members that disagree (MI = log 2); sample 1: two that agree (MI = 0)
    logits = torch.tensor([[[1e4, -1e4, 0.0], [1e4, -1e4, -1e4]],
                           [[-1e4, 1e4, 0.0], [1e4, -1e4, -1e4]]], requires_grad=True)
    mi = mutual_information_from_logits(logits)
    assert mi.dtype == torch.float32 and mi.requires_grad  # the input's precision, graph kept
    assert mi.detach().tolist() == pytest.approx([math.log(2), 0.0], abs=1e-6)
    (gradient,) = torch.autograd.grad(mi.sum(), logits)
    assert torch.isfinite(gradient).all()
    background = logits.detach().clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(mutual_information_from_logits(background, background=True).sum(), background)
    assert torch.isfinite(gradient).all()


def test_gradients_match_finite_differences():
    logits = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mutual_information_from_logits, (logits,))
    assert torch.autograd.gradcheck(lambda z: mutual_information_from_logits(z, background=True), (logits,))
    probs = torch.softmax(logits.detach(), -1).requires_grad_(True)
    assert torch.autograd.gradcheck(mutual_information, (probs,))


def test_probability_path_gradient_is_finite_at_zero_and_one():
    probs = torch.tensor([[[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]], [[0.5, 0.5, 0.0]]], requires_grad=True)
    mi = mutual_information(probs)
    assert mi.dtype == torch.float32
    (gradient,) = torch.autograd.grad(mi.sum(), probs)
    assert torch.isfinite(gradient).all()
    # half precision in: computed in float32 (promoted), not float64
    half = probs.detach().half().requires_grad_(True)
    assert mutual_information(half).dtype == torch.float32
    with torch.no_grad():
        assert mutual_information(probs).dtype == torch.float64


def test_background_member_probabilities_against_numpy():
    logits = np.random.default_rng(4).normal(size=(3, 25, 5)) * 3  # K = 4 known + background
    probs = member_probabilities(torch.from_numpy(logits), background=True)
    expected = softmax_reference(logits, background=True)
    assert probs.shape == (3, 25, 4)
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(probs.sum(-1).numpy(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(mutual_information(probs).numpy(), np.maximum(ensemble_reference(expected)[2], 0),
                               rtol=1e-10, atol=1e-13)
    # members sure of "background" are uniform over the known classes: maximal entropy, no disagreement
    sure = torch.tensor([[[0.0, 0.0, 20.0]]]).expand(2, -1, -1)
    assert predictive_entropy(member_probabilities(sure, background=True)).item() == pytest.approx(math.log(2))
    assert mutual_information_from_logits(sure, background=True).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("background", [False, True])
def test_single_member_ensemble_is_the_member(background):
    logits = torch.from_numpy(np.random.default_rng(6).normal(size=(20, 5)) * 3)
    members = logits[None]
    assert (mutual_information_from_logits(members, background=background) == 0).all()
    assert (mutual_information(member_probabilities(members, background=background)) == 0).all()
    assert torch.equal(KAPPAS["ensemble_softmax"](members, background=background),
                       KAPPAS["softmax"](logits, background=background))
    torch.testing.assert_close(KAPPAS["ensemble_entropy"](members, background=background),
                               KAPPAS["entropy"](logits, background=background), rtol=1e-12, atol=1e-14)


def test_bad_input_is_refused_with_the_offending_value():
    probs = torch.softmax(torch.randn(3, 4, 5), -1)
    with pytest.raises(ValueError, match=r"looks like logits.*"):
        mutual_information(torch.randn(3, 4, 5) * 3)
    with pytest.raises(ValueError, match=r"member_probs\[1\] rows must sum to 1.*row 2 sums to 0\.5"):
        bad = probs.clone()
        bad[1, 2] *= 0.5
        predictive_entropy(bad)
    with pytest.raises(ValueError, match=r"shape \(M, N, C\).*got \(4, 5\).*stack the members"):
        mutual_information(probs[0])
    with pytest.raises(ValueError, match=r"at least one member.*\(0, 4, 5\)"):
        expected_entropy(probs[:0])
    with pytest.raises(ValueError, match=r"member_logits\[2\] contains NaN.*first rows: \[1\]"):
        bad = torch.randn(3, 4, 5)
        bad[2, 1, 0] = float("nan")
        mutual_information_from_logits(bad)
    with pytest.raises(TypeError, match="floating point"):
        KAPPAS["ensemble_mi"](torch.ones(3, 4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(M, N, C\)"):
        KAPPAS["ensemble_softmax"](torch.randn(4, 5))
    assert mutual_information(torch.empty(2, 0, 3)).shape == (0,)


# --- the stateful twin ---

def test_metric_over_batches_equals_the_function_mean():
    probs = torch.from_numpy(random_member_probs(np.random.default_rng(7), n=53))
    metric = MutualInformation()
    for chunk in torch.arange(53).split(7):
        metric.update(probs[:, chunk], index=chunk)
    result = metric.compute()
    assert result.dtype == torch.float64 and result.shape == ()
    torch.testing.assert_close(result, mutual_information(probs).mean(), rtol=1e-14, atol=0)
    np.testing.assert_allclose(result.item(), np.maximum(ensemble_reference(probs.numpy())[2], 0).mean(), rtol=1e-12)
    assert (MutualInformation.is_differentiable, MutualInformation.higher_is_better,
            MutualInformation.full_state_update) == (False, None, False)
    with pytest.warns(UserWarning, match="before the ``update``"), pytest.raises(ValueError, match="before any update"):
        MutualInformation().compute()
    with pytest.raises(ValueError, match="looks like logits"):
        MutualInformation().update(torch.randn(2, 3, 4) * 5)


def _distributed_mi(rank: int, world_size: int, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.utils.data import DistributedSampler

    num_samples = probs.shape[1]
    # DistributedSampler pads the odd-sized set with a duplicate; the indices drop it again
    sampled = MutualInformation()
    index = torch.tensor(list(DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank, shuffle=True)))
    for chunk in index.split(6):
        sampled.update(probs[:, chunk], index=chunk)
    # every sample on rank 0, none on rank 1 (no update at all), no indices
    lopsided = MutualInformation()
    if rank == 0:
        for chunk in torch.arange(num_samples).split(9):
            lopsided.update(probs[:, chunk])
    return sampled.compute(), lopsided.compute()


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
def test_ddp_two_processes_equal_one_process():
    probs = torch.from_numpy(random_member_probs(np.random.default_rng(8), n=45))
    single = MutualInformation()
    for chunk in torch.arange(45).split(10):
        single.update(probs[:, chunk], index=chunk)
    expected = single.compute()
    for sampled, lopsided in run_distributed(_distributed_mi, probs):
        assert torch.equal(sampled, expected)
        assert torch.equal(lopsided, expected)
