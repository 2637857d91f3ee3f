"""The deep-ensemble confidence functions κ (Mukhoti et al., DESIGN.md §5.3), on an ensemble's member logits.

    ensemble_mi       -MI = -(H(p̄) - mean_m H(p_m)),  p̄ = mean_m softmax(z_m)   (negative mutual information)
    ensemble_softmax  max_c p̄_c
    ensemble_entropy  Σ_c p̄_c log p̄_c                                            (negative predictive entropy)

Detectors of kind ``ensemble``: they read the pass's member logits ``(N, M, C)``; the kernels are
:mod:`metrics.ensemble`'s (member logits ``(M, N, C)``, background rule included).
"""

from __future__ import annotations

from metrics.detectors.function import ScoreFunction
from metrics.detectors.registry import register_detector
from metrics.ensemble import ensemble_entropy, ensemble_mi, ensemble_softmax


@register_detector
class EnsembleMI(ScoreFunction):
    """The negative mutual information of the members' predictions."""

    name, paper, kernel = "ensemble_mi", "Mukhoti et al., 2022", ensemble_mi
    inputs = frozenset({"member_logits"})


@register_detector
class EnsembleSoftmax(ScoreFunction):
    """The softmax response of the members' mean prediction."""

    name, paper, kernel = "ensemble_softmax", "Lakshminarayanan et al., NeurIPS 2017", ensemble_softmax
    inputs = frozenset({"member_logits"})


@register_detector
class EnsembleEntropy(ScoreFunction):
    """The negative entropy of the members' mean prediction."""

    name, paper, kernel = "ensemble_entropy", "Lakshminarayanan et al., NeurIPS 2017", ensemble_entropy
    inputs = frozenset({"member_logits"})
