"""NAC-UE (:mod:`metrics.detectors.nac`) against a reference written from the authors' code's logic
(github.com/BierOne/ood_coverage: ``KMNC.assess``/``assess_ood`` with the retained layers and ``kl_grad`` per layer,
the ResNet pooling, ``get_state_func('sigmoid(o*g_kl)')``, ``Estimator`` with its ``logspace`` edges and broadcast
comparisons), unchunked, on a tiny network in float64; against pytorch-ood 0.4.0's ``NACUE`` with its bins replaced
by the authors'; by hand; and on states with ties. The engine's own pass in
tests/evaluation_engine/test_detector_passes.py."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from pytorch_ood.detector import NACUE
from pytorch_ood.detector import nac as pood_nac
from torch import Tensor, nn

from metrics.detectors import build_detector
from metrics.detectors.nac import STATES, WIDTHS, bin_edges, network_of
from tests.metrics.detectors.helpers import make_features, pood_in_float64


class Net(nn.Module):
    """A tiny ResNet-shaped classifier: maps of several positions (``layer1``, ``layer2``), a 1 × 1 pooling
    (``avgpool``), a 2-D hidden layer (``hidden``) and a linear head."""

    def __init__(self, classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.layer1 = nn.Sequential(nn.Conv2d(6, 8, 3, padding=1), nn.ReLU())
        self.layer2 = nn.Sequential(nn.Conv2d(8, 12, 3, padding=1, stride=2), nn.ReLU())
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.hidden = nn.Sequential(nn.Linear(12, 10), nn.ReLU())
        self.fc = nn.Linear(10, classes)

    def forward(self, images: Tensor) -> Tensor:
        maps = self.layer2(self.layer1(torch.relu(self.stem(images))))
        return self.fc(self.hidden(self.avgpool(maps).flatten(1)))


LAYERS = ("avgpool", "hidden", "layer2", "layer1")
PARAMETERS = {"layers": LAYERS, "alpha": (2000.0, 1000.0, 300.0, 100.0), "bins": (6, 10, 50, 20),
              "o_star": (2, 3, 5, 10)}


def images(n: int, seed: int, *, shift: float = 0.0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 6, 6, generator=generator, dtype=torch.float64) + shift


# ------------------------------------------------------------------ the reference: the authors' logic, unchunked
def authors_edges(bins: int) -> Tensor:
    """``coverage.py``'s ``logspace(1e3, M)``."""
    half = int(bins / 2)
    x = np.linspace(1, np.sqrt(1e3), num=half)
    left = np.emath.logn(1e3, x)
    right = (1 - left)[::-1]
    x = np.concatenate([left[:-1], right])
    x[-1] += 1e-2
    return torch.from_numpy(np.append(x, 1.2))


def authors_products(net: nn.Module, data: Tensor, layers, *, background: bool = False) -> list[Tensor]:
    """``assess``: the retained outputs (not detached), ``p = model(x)``, per layer ``kl_grad`` (the cross-entropy
    to the uniform targets summed over the batch, ``retain_graph`` but for the last layer), the outputs and the
    gradients summed over the positions where they are maps; the product ``o * g_kl`` per layer."""
    retained = {}
    named = dict(net.named_modules())
    handles = [named[name].register_forward_hook(lambda _m, _i, out, name=name: retained.__setitem__(name, out))
               for name in layers]
    try:
        outputs = net(data)
    finally:
        for handle in handles:
            handle.remove()
    outputs = outputs[:, :-1] if background else outputs
    products = []
    for j, name in enumerate(layers):
        state = retained[name]
        targets = torch.ones_like(outputs) / outputs.shape[-1]
        loss = torch.sum(-targets * torch.log_softmax(outputs, dim=-1), dim=-1)
        gradient = torch.autograd.grad(loss.sum(), state, retain_graph=j < len(layers) - 1)[0]
        state = state.detach()
        if state.ndim > 2:
            state, gradient = state.sum(dim=[2, 3]), gradient.sum(dim=[2, 3])
        products.append(state * gradient)
    return products


def authors_sigmoid(x: Tensor, alpha: float) -> Tensor:
    return 1 / (1 + torch.exp(-alpha * x))


def authors_hits(states: Tensor, edges: Tensor) -> Tensor:
    """``Estimator.update``'s ``b_act``: ``(N, M - 1, n)``, whether each state lies in each interval."""
    bins = edges.numel()
    thresh = edges.view(bins, -1).repeat(1, states.shape[1])
    return (states.unsqueeze(1) >= thresh[:bins - 1].unsqueeze(0)) & (states.unsqueeze(1) < thresh[1:bins].unsqueeze(0))


def authors_scores(fit_products: list[Tensor], test_products: list[Tensor], *, alpha, bins, o_star) -> Tensor:
    """``Estimator.update`` over the fit states, ``get_score`` (``min(t_act / O, 1)``), ``ood_test`` (the covered
    bins summed over the intervals, averaged over the neurons) and ``single_ood_test`` (each layer's score / L)."""
    scores = torch.zeros(test_products[0].shape[0], dtype=torch.float64)
    for fit, test, a, m, o in zip(fit_products, test_products, alpha, bins, o_star, strict=True):
        edges = authors_edges(m)
        t_act = authors_hits(authors_sigmoid(fit, a), edges).sum(dim=0).to(torch.float64)
        coverage = torch.min(t_act / o, torch.ones_like(t_act))
        hits = authors_hits(authors_sigmoid(test, a), edges)
        scores += (hits * coverage.unsqueeze(0)).sum(dim=1).mean(dim=1) / len(fit_products)
    return scores


def fitted_on(detector, net: nn.Module, data: Tensor):
    outputs = detector.image_outputs(net, data)
    return detector.fit({**outputs, "targets": torch.zeros(data.shape[0], dtype=torch.long)})


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("background", [False, True])
def test_nac_matches_the_authors_code_on_a_network(background) -> None:
    net = Net(classes=5).double().eval()
    fit, test = images(60, 1), torch.cat([images(30, 2), images(20, 3, shift=0.8)])
    detector = build_detector("nac", background=background, **PARAMETERS)
    fit_outputs = detector.image_outputs(net, fit)
    theirs_fit = authors_products(net, fit, LAYERS, background=background)
    torch.testing.assert_close(fit_outputs[STATES], torch.cat(theirs_fit, dim=1), rtol=1e-12, atol=1e-17)
    assert fit_outputs[WIDTHS].tolist() == [[12.0, 10.0, 12.0, 8.0]] * 60
    detector.fit({**fit_outputs, "targets": torch.zeros(60, dtype=torch.long)})
    test_outputs = detector.image_outputs(net, test)
    theirs_test = authors_products(net, test, LAYERS, background=background)
    theirs = authors_scores(theirs_fit, theirs_test, alpha=PARAMETERS["alpha"], bins=PARAMETERS["bins"],
                            o_star=PARAMETERS["o_star"])
    ours = detector.score(test_outputs)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-15)
    assert len(set(ours.tolist())) > 10  # the bins part the samples, not one value for all
    # the hidden layer's ReLU zeros: states of exactly 0, whose sigmoid 0.5 is an edge (ties at an edge)
    assert (fit_outputs[STATES][:, 12:22] == 0).any()


def test_background_model_covers_the_gradient_of_its_known_classes_only() -> None:
    net = Net(classes=5).double().eval()
    known = Net(classes=5).double().eval()
    known.fc = nn.Linear(10, 4).double()
    with torch.no_grad():  # the same network without the background row of its head
        known.fc.weight.copy_(net.fc.weight[:4])
        known.fc.bias.copy_(net.fc.bias[:4])
    fit, test = images(40, 1), images(20, 2, shift=0.5)
    with_background = fitted_on(build_detector("nac", background=True, **PARAMETERS), net, fit)
    without = fitted_on(build_detector("nac", **PARAMETERS), known, fit)
    assert torch.equal(with_background.counts, without.counts)
    scores = with_background.score(with_background.image_outputs(net, test))
    assert torch.equal(scores, without.score(without.image_outputs(known, test)))
    # the background logit in the softmax would change the gradients, hence the states
    plain = build_detector("nac", **PARAMETERS)
    assert not torch.equal(plain.image_outputs(net, fit)[STATES], with_background.image_outputs(net, fit)[STATES])


def authors_bins(z_hat: Tensor, m: int) -> Tensor:
    """The authors' interval of each state, for pytorch-ood's ``m`` bins (``m = M - 1`` intervals)."""
    return torch.searchsorted(authors_edges(m + 1), z_hat.contiguous(), right=True) - 1


def test_nac_matches_pytorch_ood_with_the_authors_bins_on_layers_of_one_position() -> None:
    """pytorch-ood's ``NACUE`` with its geometric bins replaced by the authors' and on layers whose outputs have one
    position (its mean of ``o ⊙ g`` is then the authors' product of the sums): ``-L`` times the scores."""
    net = Net(classes=4).double().eval()
    fit, test = images(50, 1), torch.cat([images(20, 2), images(20, 3, shift=0.8)])
    parameters = {"layers": ("avgpool", "hidden"), "alpha": (2000.0, 1000.0), "bins": (50, 100), "o_star": (10, 20)}
    ours = fitted_on(build_detector("nac", **parameters), net, fit).score(
        build_detector("nac", **parameters).image_outputs(net, test))
    with pood_in_float64(), mock.patch.object(pood_nac, "_bin_indices_geometric", authors_bins):
        detector = NACUE(net, layers=[net.avgpool, net.hidden], m_bins=[49, 99], alpha=[2000.0, 1000.0],
                         o_star=[10, 20])
        detector.fit([fit[:25], fit[25:]])
        theirs = detector.predict(test)
    # pytorch-ood divides its counts in float32 (``.to(torch.float32)``): its scores carry float32 rounding
    torch.testing.assert_close(ours * 2, -theirs.double(), rtol=1e-6, atol=1e-7)
    assert len(set(ours.tolist())) > 10


def test_hand_computed_coverage_with_ties_at_an_edge() -> None:
    """Layer ``a``: 2 neurons, M = 4 (edges 0, 0.5, 1.01, 1.2), α = 1, O* = 2; layer ``b``: 1 neuron, M = 6 (edges 0,
    0.404, 0.5, 0.596, 1.01, 1.2), α = 2, O* = 1. A state of 0 has the sigmoid 0.5, the edge, and counts above it."""
    assert bin_edges(4).tolist() == [0.0, 0.5, 1.01, 1.2]
    assert bin_edges(6)[[0, 2, 4, 5]].tolist() == [0.0, 0.5, 1.01, 1.2]
    detector = build_detector("nac", layers="a, b", alpha=(1.0, 2.0), bins=(4, 6), o_star=(2, 1))
    widths = torch.tensor([[2.0, 1.0]]).expand(4, -1)
    fit = torch.tensor([[0.0, -3.0, 0.0], [0.0, -3.0, 0.1], [-1.0, -3.0, 0.1], [2.0, 0.0, -10.0]],
                       dtype=torch.float64)
    detector.fit({STATES: fit, WIDTHS: widths, "targets": torch.zeros(4, dtype=torch.long)})
    # a: neuron 0 in intervals 1, 1, 0, 1 and neuron 1 in 0, 0, 0, 1; b: 2, 2, 2, 0 (σ(0.2) = 0.55, σ(-20) ≈ 0)
    assert detector.counts.tolist() == [1, 3, 0, 3, 1, 0] + [1, 0, 3, 0, 0]
    test = torch.tensor([[0.0, 0.0, 0.1], [-1.0, -1.0, -0.05], [5.0, -5.0, 3.0], [-5.0, 5.0, -10.0]],
                        dtype=torch.float64)
    # coverages a: neuron 0 (0.5, 1, 0), neuron 1 (1, 0.5, 0); b: (1, 0, 1, 0, 0)
    expected = [(0.75 + 1) / 2, (0.75 + 0) / 2, (1.0 + 0) / 2, (0.5 + 1) / 2]
    assert detector.score({STATES: test, WIDTHS: widths}).tolist() == expected


@pytest.mark.parametrize("seed", [0, 1])
def test_random_states_with_ties_match_the_authors_estimator(seed) -> None:
    """States on a grid (many ties, many exact zeros: the sigmoid's 0.5 is an edge of every M) fed to the fit and
    the score directly, against the authors' ``Estimator`` on the same states."""
    features, _ = make_features(200, seed=seed, grid=0.5)
    test, _ = make_features(120, seed=seed + 10, grid=0.5)
    fit_states, test_states = features - 1, torch.cat([test - 1, -test[:40]])
    parameters = {"layers": ("a", "b", "c", "d"), "alpha": (1.0, 2.0, 0.5, 3.0), "bins": (4, 10, 50, 500),
                  "o_star": (1, 5, 20, 100)}
    widths = torch.full((1, 4), 8.0, dtype=torch.float64)
    detector = build_detector("nac", **parameters).fit(
        {STATES: fit_states, WIDTHS: widths.expand(200, -1), "targets": torch.zeros(200, dtype=torch.long)})
    ours = detector.score({STATES: test_states, WIDTHS: widths.expand(160, -1)})
    theirs = authors_scores(list(fit_states.split(8, dim=1)), list(test_states.split(8, dim=1)),
                            alpha=parameters["alpha"], bins=parameters["bins"], o_star=parameters["o_star"])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-15)
    assert (fit_states == 0).any() and len(set(ours.tolist())) > 5
    for bins in (4, 6, 50, 500, 1000):  # the edges are the authors' bit for bit
        assert torch.equal(bin_edges(bins), authors_edges(bins))


def test_layers_are_found_in_the_wrapped_network_and_refused_by_name() -> None:
    net = Net().double().eval()

    class Classifier(nn.Module):  # a project classifier: .network.backbone, then the head
        def __init__(self) -> None:
            super().__init__()
            self.network = nn.Module()
            self.network.backbone = net
            self.network.head = nn.Identity()

        def forward(self, images: Tensor) -> Tensor:
            return self.network.head(self.network.backbone(images))

    wrapped = Classifier()
    assert network_of(wrapped) is net
    detector = build_detector("nac", **PARAMETERS)
    data = images(6, 4)
    assert torch.equal(detector.image_outputs(wrapped, data)[STATES], detector.image_outputs(net, data)[STATES])
    full_path = build_detector("nac", layers="network.backbone.layer1", alpha=100.0, bins=20, o_star=10)
    assert torch.equal(full_path.image_outputs(wrapped, data)[STATES][:, :8],
                       detector.image_outputs(net, data)[STATES][:, -8:])
    with pytest.raises(ValueError, match=r"'nac': the network Net has no module 'layer4'; its children are \['stem', "
                                         r"'layer1', 'layer2', 'avgpool', 'hidden', 'fc'\]"):
        build_detector("nac", layers="layer4,layer1", alpha=1.0, bins=4, o_star=1).image_outputs(wrapped, data)
    twice = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4))
    twice.add_module("unused", nn.Linear(4, 4))
    twice.add_module("dangling", nn.Linear(3, 2))

    def forward(x: Tensor) -> Tensor:  # the second layer runs twice, "unused" never, "dangling" off the logits' path
        twice.dangling(x)
        return twice[1](twice[1](twice[0](x)))

    twice.forward = forward
    with pytest.raises(ValueError, match="the output of layer 'dangling' does not reach the logits"):
        build_detector("nac", layers="dangling", alpha=1.0, bins=4, o_star=1).image_outputs(twice, torch.rand(2, 3))
    with pytest.raises(ValueError, match="layer '1' gave 2 outputs in one forward \\(Tensor, Tensor\\)"):
        build_detector("nac", layers="1", alpha=1.0, bins=4, o_star=1).image_outputs(twice, torch.rand(2, 3))
    with pytest.raises(ValueError, match="layer 'unused' gave 0 outputs in one forward \\(none\\)"):
        build_detector("nac", layers="unused", alpha=1.0, bins=4, o_star=1).image_outputs(twice, torch.rand(2, 3))
    with torch.inference_mode(), pytest.raises(RuntimeError, match="'nac' needs gradients"):
        detector.image_outputs(net, data)


def test_default_layers_are_a_torchvision_resnets() -> None:
    import torchvision

    resnet = torchvision.models.resnet18(num_classes=3).eval()
    detector = build_detector("nac")
    assert detector.layers == ("avgpool", "layer3", "layer2", "layer1")
    outputs = detector.image_outputs(resnet, torch.rand(2, 3, 32, 32))
    assert outputs[WIDTHS][0].tolist() == [512, 256, 128, 64] and outputs[STATES].shape == (2, 960)
    assert detector.passes_per_image() == (1, 1) and detector.pass_parameters() == {"layers": detector.layers}


def test_default_layers_find_a_timm_resnets_pooling_under_its_own_name() -> None:
    from lightning_modules.scoring import ScoringModel

    scoring = ScoringModel("timm:test_resnet", pretrained=False, model_args={"num_classes": 3})
    images = torch.rand(2, 3, 32, 32)
    detector = build_detector("nac")
    kept = {}
    scoring.network.global_pool.register_forward_hook(lambda _m, _i, out: kept.update(pool=out.detach()))
    states = detector.image_outputs(scoring, images)  # "avgpool" is timm's "global_pool"
    width = scoring.network.num_features
    assert states[WIDTHS][0, 0].item() == width
    renamed = build_detector("nac", layers=("global_pool", "layer3", "layer2", "layer1"))
    assert torch.equal(renamed.image_outputs(scoring, images)[STATES], states[STATES])
    with torch.no_grad():  # recomputed without autograd: kernels may differ in the last bits on another CPU
        pooled_features = scoring.network.forward_head(scoring.network.forward_features(images), pre_logits=True)
    torch.testing.assert_close(kept["pool"], pooled_features, rtol=1e-5, atol=1e-6)


def test_bad_hyperparameters_and_inputs_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'nac': bins \(the authors' M, M - 1 intervals\) must be an even integer >= 4"
                                         r" per layer .*got 5"):
        build_detector("nac", bins=5)
    with pytest.raises(ValueError, match="must be an even integer >= 4 per layer .*got 2"):
        build_detector("nac", bins=(50, 50, 2, 50))
    with pytest.raises(ValueError, match=r"'nac': alpha \(the sigmoid's steepness\) must be a positive finite number "
                                         r"per layer, got 0.0"):
        build_detector("nac", alpha=0.0)
    with pytest.raises(ValueError, match="'nac': o_star .* must be an integer >= 1 per layer, got 0"):
        build_detector("nac", o_star=(10, 0, 50, 5000))
    with pytest.raises(ValueError, match=r"'nac': alpha gives 4 values for the 2 layers \['layer3', 'layer4'\]"):
        build_detector("nac", layers="layer3,layer4", alpha=(3000.0, 300.0, 0.01, 1.0), bins=50, o_star=10)
    with pytest.raises(ValueError, match=r"'nac': no default alpha for the layers \['layer4'\] \(the authors' values "
                                         r"are for \['avgpool', 'layer3', 'layer2', 'layer1'\]\)"):
        build_detector("nac", layers="layer3,layer4", bins=50, o_star=10)
    # the authors' values go with the layers' names, in any order (timm's global_pool is their avgpool)
    reordered = build_detector("nac", layers="layer1,global_pool,layer3")
    assert (reordered.layer_alpha, reordered.layer_bins, reordered.layer_o_star) == (
        (1.0, 3000.0, 300.0), (1000, 50, 50), (5000, 10, 500))
    assert reordered.hyperparameters()["alpha"] is None and build_detector("nac").layer_alpha == (3000.0, 300.0, 0.01,
                                                                                                 1.0)
    with pytest.raises(ValueError, match="'nac': layers name a module twice"):
        build_detector("nac", layers="a,a", alpha=1.0, bins=4, o_star=1)
    with pytest.raises(ValueError, match="'nac': layers must name modules of the network"):
        build_detector("nac", layers="", alpha=1.0, bins=4, o_star=1)
    with pytest.raises(ValueError, match="has no hyperparameter 'M'"):
        build_detector("nac", M=50)
    detector = build_detector("nac", layers="a,b", alpha=1.0, bins=4, o_star=1)
    states = torch.zeros(3, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"'nac': the fit widths must be \(N, 2\), one per layer of \['a', 'b'\]"):
        detector.fit({STATES: states, WIDTHS: torch.ones(3, 3), "targets": torch.zeros(3, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"the fit states \(3, 5\) are not the layers' \[2, 2\] neurons"):
        detector.fit({STATES: states, WIDTHS: torch.full((3, 2), 2.0), "targets": torch.zeros(3, dtype=torch.long)})
    detector.fit({STATES: states, WIDTHS: torch.tensor([[2.0, 3.0]]).expand(3, -1),
                  "targets": torch.zeros(3, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"fitted on layers of \[2, 3\] neurons; the states to score have \[3, 2\]"):
        detector.score({STATES: states, WIDTHS: torch.tensor([[3.0, 2.0]]).expand(3, -1)})
    broken = states.clone()
    broken[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"'nac': the states to score hold NaN or infinite values in 1 of 3 rows"):
        detector.score({STATES: broken, WIDTHS: torch.tensor([[2.0, 3.0]]).expand(3, -1)})
    with pytest.raises(ValueError, match=r"needs a model that gives logits \(N, C\)"):
        build_detector("nac", layers="0", alpha=1.0, bins=4, o_star=1).image_outputs(
            nn.Sequential(nn.Linear(3, 2), nn.Flatten(0)), torch.rand(2, 3))
