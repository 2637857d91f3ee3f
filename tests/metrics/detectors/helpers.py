"""Shared data builders of the detector tests: class-structured features, a linear head, fitted detectors, and
pytorch-ood run in float64 to compare with."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from unittest import mock

import torch
from torch import Tensor, nn

from metrics.detectors import DETECTORS, Detector, ScoreFunction, build_detector

OUTPUT_DETECTORS = sorted(name for name, cls in DETECTORS.items() if not issubclass(cls, ScoreFunction))
"""The detectors with a fit or a head (the κ of the logits, the model and the ensemble are tested in
test_confidence.py, test_perturbation.py and test_ensemble.py)."""

N, D, K = 300, 32, 4

# float64 on both sides: the differences are rounding of sums of ~D products of O(1) values, far below 1e-12
# for these scores of magnitude 1e-2..1e2, so atol only covers scores that happen to be near 0
ATOL = 1e-12
# KNN's distances at 0 (duplicated features): sqrt(2 - 2s) of an s within a few float64 ulps of 1, here and in
# sklearn (sqrt(|x|² - 2x·y + |y|²)): both sqrt(~1e-15) = ~3e-8, so they agree to 1e-7 there
KNN_ATOL = 1e-7


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def centres() -> Tensor:
    return torch.rand(K, D, generator=generator(99), dtype=torch.float64) * 2


def make_head(seed: int = 1) -> tuple[Tensor, Tensor]:
    """A linear head that mostly predicts :func:`make_features`' classes: the centres plus noise."""
    g = generator(seed)
    weight = centres() - centres().mean(dim=0) + 0.3 * torch.randn(K, D, generator=g, dtype=torch.float64)
    return weight / math.sqrt(D), torch.randn(K, generator=g, dtype=torch.float64) * 0.1


def make_features(n: int = N, seed: int = 0, *, grid: float | None = None) -> tuple[Tensor, Tensor]:
    """Non-negative (post-ReLU-like) class-structured features and their classes; ``grid``: rounded to it
    (ties)."""
    g = generator(seed)
    targets = torch.arange(n) % K
    features = torch.relu(centres()[targets] + torch.randn(n, D, generator=g, dtype=torch.float64))
    if grid is not None:
        features = torch.round(features / grid) * grid
    return features, targets


def logits_of(features: Tensor, head: tuple[Tensor, Tensor]) -> Tensor:
    return features @ head[0].T + head[1]


def pass_statistic(features: Tensor) -> Tensor:
    """What a ``model`` detector's own pass gives besides the shared pass (AdaSCALE's ``Q'``), made up from the
    features for the tests that run every detector on features alone: a per-row value with ties."""
    return torch.round(features[:, :3].sum(dim=1) / 0.5) * 0.5


def nac_pass(features: Tensor, head: tuple[Tensor, Tensor], *, classes: int = K) -> dict[str, Tensor]:
    """NAC's own pass made up from the features, as if they were the output of each of its default layers (a
    quarter of the columns each) under a linear head: the state ``x ⊙ ∂L/∂x = x ⊙ Wᵀ(p - u)`` of the head's
    ``classes`` known rows (a background row the tests append is not one of them), scaled by ``100 / α_l`` so that
    the sigmoid at each default ``α_l`` sees the same spread; and the widths."""
    weight, bias, x = head[0][:classes], head[1][:classes], features.double()
    probabilities = torch.softmax(x @ weight.T + bias, dim=1)
    states = x * ((probabilities - 1 / classes) @ weight) * 100
    defaults = DETECTORS["nac"]()
    parts = torch.tensor_split(states, len(defaults.layers), dim=1)
    states = torch.cat([part / alpha for part, alpha in zip(parts, defaults.layer_alpha, strict=True)], dim=1)
    states = states.to(features.dtype)  # float32 where the pass's outputs are
    widths = torch.tensor([float(p.shape[1]) for p in parts], dtype=torch.float64).expand(features.shape[0], -1)
    return {"nac/states": states, "nac/widths": widths}


def fit_data(features: Tensor, targets: Tensor, head: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    return {"features": features, "targets": targets, "logits": logits_of(features, head),
            "adascale/statistic": pass_statistic(features), **nac_pass(features, head)}


def outputs(features: Tensor, head: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    return {"features": features, "logits": logits_of(features, head), "adascale/statistic": pass_statistic(features),
            **nac_pass(features, head)}


def fitted(name: str, data: dict[str, Tensor], head: tuple[Tensor, Tensor], **hyperparameters) -> Detector:
    detector = build_detector(name, **hyperparameters)
    return detector.fit(data, head=head) if detector.needs_fit else detector


@contextlib.contextmanager
def pood_in_float64() -> Iterator[None]:
    """pytorch-ood's code in float64: its buffers follow the default dtype, and ViM and DICE cast with
    ``.float()`` (in float32 ViM's eigenvectors alone differ by ~7e-6)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with mock.patch.object(torch.Tensor, "float", torch.Tensor.double):
            yield
    finally:
        torch.set_default_dtype(old)


def as_maps(features: Tensor) -> Tensor:
    return features[:, :, None, None]


def linear(head: tuple[Tensor, Tensor]):
    weight, bias = head
    return lambda maps: maps.flatten(1) @ weight.T + bias


def identity(maps: Tensor) -> Tensor:
    return maps


def assert_matches(ours: Tensor, theirs: Tensor, *, atol: float = ATOL) -> None:
    """Ours is float64 and pytorch-ood's outlier score negated."""
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, -torch.as_tensor(theirs).double(), rtol=1e-5, atol=atol)


class LogitsModel(nn.Module):
    """Treats its input as the logits, through a dropout layer and a learnable-free identity."""

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x)
