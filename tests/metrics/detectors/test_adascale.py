"""AdaSCALE-A and -L (:mod:`metrics.detectors.adascale`) against a reference written from OpenOOD v1.5's code
(``adascale_postprocessor.py`` and ``networks/adascale_net.py``: its setup, ``perturb``, ``get_percentile`` with
statsmodels' ECDF, ``ada_scale`` and ``forward_threshold``), run on the same tiny network and images in float64;
the engine's own pass (sharded, cached, shared by -A and -L) in tests/evaluation_engine/test_detector_passes.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from metrics.detectors import build_detector
from metrics.detectors.adascale import STATISTIC, adaptive_scale, kept

D = 100  # k1 = 5% -> 5 features, k2 = 1% -> 1


class Net(nn.Module):
    """A tiny convolutional classifier with a ``features`` method (pooled ReLU activations) and a linear head."""

    def __init__(self, classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, D, 3, padding=1)
        self.fc = nn.Linear(D, classes)

    def features(self, images: Tensor) -> Tensor:
        return torch.relu(self.conv(images)).mean(dim=(2, 3))

    def forward(self, images: Tensor) -> Tensor:
        return self.fc(self.features(images))


def openood_statistic(net: Net, data: Tensor, *, k1: float, k2: float, lmbda: float, o: float,
                      background: bool = False) -> tuple[Tensor, Tensor]:
    """OpenOOD's setup/postprocess up to ``topk_norm`` (its Q'), unbatched and unchunked: (features, Q')."""
    data = data.clone().requires_grad_(True)
    feature = net.features(data)
    output = net.fc(feature)
    known = output[:, :-1] if background else output
    labels = known.detach().argmax(dim=1)
    known[torch.arange(len(labels)), labels].backward(torch.ones(len(labels), dtype=output.dtype))
    grad = data.grad.detach()
    batch, channels, height, width = data.shape
    n_pixels = int(channels * height * width * o)
    abs_grad = grad.abs().view(batch, -1)
    _, indices = torch.topk(abs_grad, n_pixels, dim=1, largest=False)
    mask = torch.zeros_like(abs_grad, dtype=torch.uint8)
    mask.scatter_(1, indices, 1)
    perturbed_data = data.detach() + grad.sign() * mask.view(batch, channels, height, width) * 0.5
    with torch.no_grad():
        feature_perturbed = net.features(perturbed_data)
        feature = feature.detach()
        shift = (feature - feature_perturbed).abs()
        k1_, k2_ = int(D * k1 / 100), int(D * k2 / 100)
        top1 = torch.gather(torch.relu(feature_perturbed), 1, torch.topk(feature, dim=1, k=k1_)[1])
        top2 = torch.gather(shift, 1, torch.topk(feature, dim=1, k=k2_)[1])
        return feature, top1.sum(dim=1) + lmbda * top2.sum(dim=1)


def openood_scores(net: Net, feature: Tensor, statistic: Tensor, fit_statistic: Tensor, *, p_min: float, p_max: float,
                   logit_scaling: bool, background: bool = False) -> Tensor:
    """``forward_threshold`` and the energy: the ECDF as statsmodels' (fraction of fit values <= t)."""
    reference = np.sort(fit_statistic.numpy())
    ecdf = np.searchsorted(reference, statistic.numpy(), side="right") / len(reference)
    percentile = torch.from_numpy(p_min + (1 - ecdf) * (p_max - p_min))
    x = torch.relu(feature)
    n = x.shape[1]
    ks = n - torch.round(n * percentile / 100.0).to(torch.int)
    values, _ = torch.topk(x, int(ks.max()), dim=1)
    mask = torch.arange(int(ks.max()))[None, :] < ks[:, None]
    scale = x.sum(dim=1, keepdim=True) / (values * mask).sum(dim=1, keepdim=True)
    if logit_scaling:
        logits = net.fc(feature) * scale ** 2.0
    else:
        logits = net.fc(feature * torch.exp(scale))
    logits = logits[:, :-1] if background else logits
    return torch.logsumexp(logits, dim=1)


def images(n: int, seed: int, *, shift: float = 0.0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 6, 6, generator=generator, dtype=torch.float64) + shift


@pytest.mark.parametrize("name", ["adascale_a", "adascale_l"])
@pytest.mark.parametrize("background", [False, True])
def test_adascale_matches_openoods_code(name, background) -> None:
    net = Net(classes=5).double().eval()
    parameters = {"p_min": 70.0, "p_max": 90.0, "k1": 5.0, "k2": 1.0, "lmbda": 10.0, "o": 0.05}
    validation, test = images(60, 1), torch.cat([images(20, 2), images(20, 3, shift=0.7)])
    head = (net.fc.weight.detach(), net.fc.bias.detach())
    detector = build_detector(name, background=background, **parameters)
    detector._store_head(*head)  # as the engine does before the pass
    fit_statistic = detector.image_outputs(net, validation)[STATISTIC]
    fit_features, theirs_fit = openood_statistic(net, validation, k1=5.0, k2=1.0, lmbda=10.0, o=0.05,
                                                 background=background)
    torch.testing.assert_close(fit_statistic, theirs_fit, rtol=1e-12, atol=1e-12)
    detector.fit({"features": fit_features, "targets": torch.zeros(60, dtype=torch.long), STATISTIC: fit_statistic},
                 head=head)
    statistic = detector.image_outputs(net, test)[STATISTIC]
    features, theirs_statistic = openood_statistic(net, test, k1=5.0, k2=1.0, lmbda=10.0, o=0.05, background=background)
    torch.testing.assert_close(statistic, theirs_statistic, rtol=1e-12, atol=1e-12)
    ours = detector.score({"features": features, STATISTIC: statistic})
    theirs = openood_scores(net, features, theirs_statistic, theirs_fit, p_min=70.0, p_max=90.0,
                            logit_scaling=name == "adascale_l", background=background)
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-12, atol=1e-12)
    # ties in the statistic: the ECDF counts every fit value <= t
    tied = detector.score({"features": features[:3], STATISTIC: fit_statistic.sort().values[[0, 30, 59]]})
    reference = openood_scores(net, features[:3], fit_statistic.sort().values[[0, 30, 59]], theirs_fit, p_min=70.0,
                               p_max=90.0, logit_scaling=name == "adascale_l", background=background)
    torch.testing.assert_close(tied, reference.detach(), rtol=1e-12, atol=1e-12)


def test_the_scale_and_the_percentile_by_hand() -> None:
    x = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0], [4.0, 3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    # D = 5: p = 60 keeps k = 5 - round(3) = 2 -> 10 / 7; p = 50: round(2.5) = 2 (half to even) -> k = 3 -> 10 / 9
    torch.testing.assert_close(adaptive_scale(x, torch.tensor([60.0, 50.0])),
                               torch.tensor([10 / 7, 10 / 9], dtype=torch.float64), rtol=1e-15, atol=0)
    assert (kept(2048, 5.0), kept(2048, 1.0), kept(100, 29.0)) == (102, 20, 29)  # OpenOOD's int(D * k / 100)
    detector = build_detector("adascale_a", p_min=80.0, p_max=90.0)
    detector.register_buffer("fit_statistics", torch.tensor([1.0, 2.0, 2.0, 3.0], dtype=torch.float64))
    # F̂(2) = 3/4 -> p = 80 + 0.25 * 10; F̂(0.5) = 0 -> 90; F̂(3) = 1 -> 80
    torch.testing.assert_close(detector.percentiles(torch.tensor([2.0, 0.5, 3.0])),
                               torch.tensor([82.5, 90.0, 80.0], dtype=torch.float64), rtol=0, atol=0)


def test_the_perturbation_touches_the_smallest_gradients_only() -> None:
    detector = build_detector("adascale_a", o=0.25)
    gradient = torch.tensor([[[[0.1, -3.0], [-0.2, 4.0]]]])  # 4 elements: 1 perturbed, the smallest |g| (0.1)
    perturbed = detector.perturb(torch.zeros(1, 1, 2, 2), gradient)
    assert perturbed.flatten().tolist() == [0.5, 0.0, 0.0, 0.0]


def test_bad_hyperparameters_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'adascale_a': p_max = 70.0 is below p_min = 80.0"):
        build_detector("adascale_a", p_min=80.0, p_max=70.0)
    with pytest.raises(ValueError, match=r"'adascale_l': k1 must be a percentage in \(0, 100\), got 0.0"):
        build_detector("adascale_l", k1=0.0)
    with pytest.raises(ValueError, match=r"o must be a fraction in \(0, 1\), got 1.5"):
        build_detector("adascale_a", o=1.5)
    with pytest.raises(ValueError, match="needs a model with a features\\(\\) method"):
        build_detector("adascale_a").image_outputs(nn.Linear(3, 2), torch.rand(2, 3))
