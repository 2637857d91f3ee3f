"""Uncertainty of a deep ensemble: predictive entropy, expected entropy and their difference, the mutual
information (Mukhoti et al., *Raising the Bar on the Evaluation of Out-of-Distribution Detection*,
arXiv:2209.11960; DESIGN.md §5.3, where it is the semantic loss of the generators).

For M members with class distributions ``p_m(y|x)`` over C classes, natural log, ``0 log 0 = 0``:

    predictive entropy   H(p̄),  p̄ = (1/M) Σ_m p_m(y|x),  H(p) = -Σ_c p_c log p_c    (total uncertainty)
    expected entropy     (1/M) Σ_m H(p_m(y|x))                                       (aleatoric part)
    mutual information   MI(x) = H(p̄) - (1/M) Σ_m H(p_m(y|x))                        (epistemic part)

MI is the information about the model gained by observing the label, ``I(y; m | x)``: 0 when the members
agree, at most ``log min(M, C)``; MI >= 0 by Jensen's inequality (H is concave). Computed as a difference it
can come out a few ulp below 0 when the members (nearly) agree, so it is clamped at 0 from below; that is
the only clamping, and it never changes a value by more than the float rounding.

Background-class members (``background=True``, DESIGN.md §3): each member's softmax runs over all ``K+1``
logits and the background mass is spread uniformly over the K known classes,
``p'_c = p_c + p_bg / K`` (:func:`common.spread_background_mass`, as the ``entropy`` κ does), so every
member still gives a distribution over the known classes that sums to 1: a member sure of "background" is a
uniform, maximally uncertain member. Dropping the column without renormalising, as OSCR does, would not
give a distribution and the entropies would be meaningless.

Precision: the functions accept probabilities or logits of any float dtype and accumulate in float64.
When the input requires grad (a generator's loss), they instead compute in the input's dtype promoted to
at least float32 and keep the graph. ``x log x`` has derivative ``log x + 1 = -inf`` at ``x = 0``: the
probability functions evaluate ``x log max(x, tiny)``, whose derivative at 0 is the finite ``log tiny``;
:func:`mutual_information_from_logits` works in log space (``log_softmax``, ``logsumexp``) and has finite
gradients even for saturated members (logits of ±1e4), which makes it the function to train with.

Ensemble confidence functions κ (higher = more in-distribution, registered in :data:`metrics.KAPPAS` with
``kind == "ensemble"``) take member logits ``(M, N, C)``: :func:`ensemble_mi` (-MI), :func:`ensemble_softmax`
(``max_c p̄_c``) and :func:`ensemble_entropy` (-H(p̄)). A single-member ensemble has MI = 0 and its
``ensemble_softmax`` and ``ensemble_entropy`` are the member's ``softmax`` and ``entropy`` κ.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metrics._validation import as_tensor, check_finite, check_probabilities
from metrics.collect import IndexedPredictions
from openset_common.labels import known_columns, spread_background_mass

__all__ = [
    "MutualInformation",
    "ensemble_entropy",
    "ensemble_mi",
    "ensemble_softmax",
    "expected_entropy",
    "member_probabilities",
    "mutual_information",
    "mutual_information_from_logits",
    "predictive_entropy",
]


# -- input checks and working precision ---------------------------------------------------------------

def _check_members(values: Tensor | object, *, name: str, probabilities: bool) -> Tensor:
    """Validate ``(M, N, C)`` member outputs (probabilities or logits); return them as a tensor.

    The common case costs one reduction and one host sync; only a failing input is checked member by member,
    so that the message names the member and its rows.
    """
    values = as_tensor(values, name=name)
    if not values.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {values.dtype}")
    if values.ndim != 3:
        raise ValueError(
            f"{name} must have shape (M, N, C) (members, samples, classes), got {tuple(values.shape)}"
            + (": stack the members' outputs along a new first dimension" if values.ndim == 2 else "")
        )
    if values.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one member (M >= 1), got shape {tuple(values.shape)}")
    if values.shape[2] < 1:
        raise ValueError(f"{name} must hold at least one class (C >= 1), got shape {tuple(values.shape)}")
    if values.numel() == 0:
        return values
    detached = values.detach()
    sums = detached.sum(dim=2, dtype=torch.float64)
    suspicious = ~torch.isfinite(sums).all()
    if probabilities:
        low, high = torch.aminmax(detached)
        suspicious |= (low < 0) | (high > 1) | ((sums - 1.0).abs().max() > 0.05)
    if bool(suspicious):
        for member in range(detached.shape[0]):
            check_finite(detached[member], name=f"{name}[{member}]")
            if probabilities:
                check_probabilities(detached[member], name=f"{name}[{member}]")
    return values


def _working_dtype(values: Tensor) -> torch.dtype:
    """float64 for evaluation; the input's dtype promoted to at least float32 when a graph is being built."""
    if values.requires_grad and torch.is_grad_enabled():
        return torch.promote_types(values.dtype, torch.float32)
    return torch.float64


def _as_working(values: Tensor) -> Tensor:
    return values.to(_working_dtype(values))


def _entropy(probs: Tensor) -> Tensor:
    """``-Σ_c p_c log p_c`` over the last dimension, ``0 log 0 = 0``.

    ``xlogy(p, max(p, tiny))``: the same value as ``xlogy(p, p)`` (the clamp only touches subnormal
    probabilities, whose terms are below ``1e-300``), but the derivative at ``p = 0`` is ``log tiny``
    (about -87 in float32, -708 in float64), not ``-inf``/NaN.
    """
    tiny = torch.finfo(probs.dtype).tiny
    return -torch.special.xlogy(probs, probs.clamp_min(tiny)).sum(dim=-1)


# -- pure functions ------------------------------------------------------------------------------------

def member_probabilities(member_logits: Tensor, background: bool = False) -> Tensor:
    """Each member's softmax: ``(M, N, C)`` logits -> ``(M, N, K)`` class distributions.

    Args:
        member_logits: ``(M, N, C)`` logits of M members for N samples.
        background: the last logit is a background class (``C = K + 1``): the softmax runs over all C
            logits and the background mass is spread over the K known classes, ``p'_c = p_c + p_bg / K``
            (:func:`common.spread_background_mass`), so each row still sums to 1.

    Returns:
        ``(M, N, K)`` probabilities (``K = C`` without background), float64 (see the module docstring for
        inputs that require grad).
    """
    member_logits = _check_members(member_logits, name="member_logits", probabilities=False)
    probs = torch.softmax(_as_working(member_logits), dim=-1)
    if background:
        probs = spread_background_mass(probs)
    return probs


def predictive_entropy(member_probs: Tensor) -> Tensor:
    """Entropy of the mean prediction, ``H(p̄) = -Σ_c p̄_c log p̄_c`` with ``p̄ = (1/M) Σ_m p_m``.

    Args:
        member_probs: ``(M, N, C)`` class probabilities of M members (rows sum to 1).

    Returns:
        ``(N,)`` float64 (the promoted input dtype when the input requires grad), in ``[0, log C]``.

    Raises:
        ValueError: a shape other than ``(M, N, C)`` with ``M >= 1``, NaN, or values that are not
            probabilities (e.g. logits).
    """
    probs = _as_working(_check_members(member_probs, name="member_probs", probabilities=True))
    return _entropy(probs.mean(dim=0))


def expected_entropy(member_probs: Tensor) -> Tensor:
    """Mean of the members' entropies, ``(1/M) Σ_m H(p_m)``.

    Args:
        member_probs: ``(M, N, C)`` class probabilities of M members (rows sum to 1).

    Returns:
        ``(N,)`` float64 (the promoted input dtype when the input requires grad), in ``[0, log C]``.

    Raises:
        ValueError: as :func:`predictive_entropy`.
    """
    probs = _as_working(_check_members(member_probs, name="member_probs", probabilities=True))
    return _entropy(probs).mean(dim=0)


def mutual_information(member_probs: Tensor) -> Tensor:
    """Mutual information of a deep ensemble, ``MI = H(p̄) - (1/M) Σ_m H(p_m)`` (Mukhoti et al.).

    Differentiable when ``member_probs`` requires grad (computed in its dtype promoted to at least
    float32, gradients finite at probabilities 0 and 1); to train on logits prefer
    :func:`mutual_information_from_logits`.

    Args:
        member_probs: ``(M, N, C)`` class probabilities of M members (rows sum to 1).

    Returns:
        ``(N,)`` MI in ``[0, log min(M, C)]``, float64 (the promoted input dtype when the input requires
        grad). Clamped at 0 from below, for float rounding only (the true value is >= 0 by Jensen).

    Raises:
        ValueError: as :func:`predictive_entropy`.
    """
    probs = _as_working(_check_members(member_probs, name="member_probs", probabilities=True))
    return (_entropy(probs.mean(dim=0)) - _entropy(probs).mean(dim=0)).clamp_min(0.0)


def mutual_information_from_logits(member_logits: Tensor, background: bool = False) -> Tensor:
    """:func:`mutual_information` of the members' softmax, computed in log space (the training loss).

    ``log p_m = log_softmax(z_m)``, ``log p̄ = logsumexp_m(log p_m) - log M``, and every entropy is
    ``-Σ_c exp(log p_c) log p_c``: no ``log 0`` even for saturated members, so the gradients stay finite
    (logits of ±1e4 included). With ``background=True`` the spread ``p'_c = p_c + p_bg / K`` is taken in log
    space too, ``log p'_c = logaddexp(log p_c, log p_bg - log K)``.

    Args:
        member_logits: ``(M, N, C)`` logits of M members.
        background: the last logit is a background class (see :func:`member_probabilities`).

    Returns:
        ``(N,)`` MI, float64 (the input's dtype promoted to at least float32 when it requires grad).
    """
    member_logits = _check_members(member_logits, name="member_logits", probabilities=False)
    log_p = torch.log_softmax(_as_working(member_logits), dim=-1)
    if background:
        known = known_columns(log_p, True)
        log_p = torch.logaddexp(known, log_p[..., -1:] - math.log(known.shape[-1]))
    expected = -(log_p.exp() * log_p).sum(dim=-1).mean(dim=0)
    log_mean = torch.logsumexp(log_p, dim=0) - math.log(log_p.shape[0])
    predictive = -(log_mean.exp() * log_mean).sum(dim=-1)
    return (predictive - expected).clamp_min(0.0)


# -- confidence functions κ (higher = more in-distribution) --------------------------------------------

def ensemble_mi(member_logits: Tensor, background: bool = False) -> Tensor:
    """κ = -MI of the members' softmax: ``(M, N, C)`` logits -> ``(N,)`` float64, at most 0."""
    return -mutual_information(member_probabilities(member_logits, background=background))


def ensemble_softmax(member_logits: Tensor, background: bool = False) -> Tensor:
    """κ = ``max_c p̄_c``, the softmax response of the mean prediction: ``(M, N, C)`` -> ``(N,)`` float64.

    With a background class the mean runs over the members' softmax over all C logits and the background
    column is dropped afterwards, without renormalising (as the ``softmax`` κ and OSCR do).
    """
    member_logits = _check_members(member_logits, name="member_logits", probabilities=False)
    mean = torch.softmax(_as_working(member_logits), dim=-1).mean(dim=0)
    return known_columns(mean, background).max(dim=-1).values


def ensemble_entropy(member_logits: Tensor, background: bool = False) -> Tensor:
    """κ = ``-H(p̄)``, the negative predictive entropy: ``(M, N, C)`` logits -> ``(N,)`` float64.

    With a background class each member's background mass is spread over the known classes first (as the
    ``entropy`` κ does).
    """
    return -predictive_entropy(member_probabilities(member_logits, background=background))


# -- stateful twin -------------------------------------------------------------------------------------

class MutualInformation(IndexedPredictions):
    """Mean mutual information over all samples of all batches and DDP ranks.

    ``update(member_probs, index=None)`` computes the per-sample MI of a batch (:func:`mutual_information`,
    ``(M, N, C)`` -> ``(N,)``) and keeps it in a ``cat`` state with the samples' dataset indices;
    ``compute()`` returns the float64 mean over every distinct sample.

    Why per-sample values and not a running sum: a float sum depends on the order of the additions, so a
    ``sum`` state would give a different last bit on 2 processes than on 1, and it could not drop the
    duplicates with which ``DistributedSampler`` pads the last batch. With the dataset indices the padding
    is dropped (:class:`metrics.collect.IndexedPredictions`), and the mean is ``math.fsum`` (the correctly
    rounded sum, independent of order) divided by the count: 1 and N processes agree exactly. Memory is one
    float64 per sample.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def update(self, member_probs: Tensor, index: Tensor | None = None) -> None:  # type: ignore[override]
        """Add one batch: ``member_probs`` ``(M, N, C)``, ``index`` ``(N,)`` dataset indices or ``None``."""
        values = mutual_information(as_tensor(member_probs, name="member_probs").detach())
        # the base class pairs every value with a label; MI has none, so every sample gets label 0
        super().update(values, torch.zeros(values.shape[0], dtype=torch.long, device=values.device), index)

    def compute(self) -> Tensor:  # type: ignore[override]
        values, _ = self._gathered()
        if values.numel() == 0:
            raise ValueError(f"{type(self).__name__}.compute(): the updates held no samples")
        return torch.tensor(math.fsum(values.double().tolist()) / values.numel(), dtype=torch.float64)
