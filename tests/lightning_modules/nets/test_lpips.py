"""PerceptualDistance: no downloads, an explicit random backbone, frozen, differentiable, small images.

No ImageNet backbone weights exist on these machines, so the distance tests run on random backbones (which
the module flags as not perceptual); the cached-weights path is tested with a SqueezeNet weight file the
test writes into a temporary torch hub cache.
"""

from __future__ import annotations

import socket
import warnings
from pathlib import Path

import lpips
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from lightning_modules.nets.backbones import PretrainedWeightsMissing
from lightning_modules.nets.lpips import BACKBONES, PerceptualDistance, backbone_weights_url

pytestmark = pytest.mark.usefixtures("one_thread")

WEIGHT_FILES = {
    "vgg": "vgg16-397923af.pth",
    "alex": "alexnet-owt-7be5be79.pth",
    "squeeze": "squeezenet1_1-b8a52dc0.pth",
}


def _no_network(*args, **kwargs):
    raise AssertionError("PerceptualDistance tried to reach the network")



@pytest.fixture(scope="module")
def random_distances():
    """One random-backbone distance per backbone, built with the network and hub downloads disabled."""
    built, caught = {}, {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _no_network)
        patch.setattr(torch.hub, "load_state_dict_from_url", _no_network)
        patch.setattr(torch.hub, "download_url_to_file", _no_network)
        for net in BACKBONES:
            torch.manual_seed(0)
            with warnings.catch_warnings(record=True) as records:
                warnings.simplefilter("always")
                built[net] = PerceptualDistance(net, random_backbone=True)
            caught[net] = [record for record in records if issubclass(record.category, UserWarning)]
    return built, caught


@pytest.mark.parametrize("net", sorted(BACKBONES))
def test_missing_weights_raise_naming_file_folder_and_url(net, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", _no_network)
    with pytest.raises(PretrainedWeightsMissing) as error:
        PerceptualDistance(net)
    message = str(error.value)
    assert WEIGHT_FILES[net] in message
    assert str(tmp_path / "hub" / "checkpoints") in message
    assert backbone_weights_url(net) in message and "random_backbone=True" in message
    assert backbone_weights_url(net).endswith(WEIGHT_FILES[net])


def test_random_backbone_warns_and_says_so(random_distances):
    distances, caught = random_distances
    for net, distance in distances.items():
        assert distance.random_backbone is True
        assert distance.description == f"LPIPS({net}, RANDOM backbone: not a perceptual distance)"
        assert len(caught[net]) == 1, [str(record.message) for record in caught[net]]
        assert "not perceptual" in str(caught[net][0].message)
        assert distance.description in repr(distance)


def test_linear_layers_are_the_calibrated_ones(random_distances):
    # lpips loads them with strict=False: a key mismatch would silently leave them random
    distance = random_distances[0]["vgg"]
    shipped = torch.load(Path(lpips.__file__).parent / "weights" / "v0.1" / "vgg.pth", map_location="cpu")
    for layer in range(5):
        torch.testing.assert_close(
            distance.lpips.lins[layer].model[1].weight, shipped[f"lin{layer}.model.1.weight"], rtol=0, atol=0
        )


def test_frozen_and_always_in_eval_mode(random_distances):
    distance = random_distances[0]["vgg"]
    assert not any(parameter.requires_grad for parameter in distance.parameters())
    parent = nn.Sequential(nn.Linear(2, 2), distance)
    assert parent.train() is parent and distance.train(True) is distance
    assert parent[0].training
    assert not any(module.training for module in distance.modules())


def test_identity_symmetry_and_positivity(random_distances):
    distance = random_distances[0]["vgg"]
    generator = torch.Generator().manual_seed(0)
    x, y = torch.rand(3, 3, 32, 32, generator=generator), torch.rand(3, 3, 32, 32, generator=generator)
    with torch.no_grad():
        to_itself, forward, backward = distance(x, x), distance(x, y), distance(y, x)
    assert forward.shape == (3,)
    torch.testing.assert_close(to_itself, torch.zeros(3), rtol=0, atol=1e-6)
    torch.testing.assert_close(forward, backward, rtol=0, atol=0)
    assert (forward > 1e-4).all()
    # closer images are closer: a slightly perturbed copy is nearer than an independent image
    with torch.no_grad():
        near = distance(x, (x + 0.02 * torch.randn(x.shape, generator=generator)).clamp(0, 1))
    assert (near < forward).all()


def test_matches_the_lpips_formula_on_unit_interval_images(random_distances):
    """``sum_l mean_hw sum_c w_lc (f̂_l(x) - f̂_l(y))²`` on ``2x - 1``, computed from the backbone directly."""
    distance = random_distances[0]["vgg"]
    generator = torch.Generator().manual_seed(1)
    x, y = torch.rand(2, 3, 20, 24, generator=generator), torch.rand(2, 3, 20, 24, generator=generator)
    shift = torch.tensor([-0.030, -0.088, -0.188])[None, :, None, None]
    scale = torch.tensor([0.458, 0.448, 0.450])[None, :, None, None]
    with torch.no_grad():
        features_x = distance.lpips.net((2 * x - 1 - shift) / scale)
        features_y = distance.lpips.net((2 * y - 1 - shift) / scale)
        expected = torch.zeros(2)
        for layer, (fx, fy) in enumerate(zip(features_x, features_y, strict=True)):
            fx = fx / (fx.square().sum(1, keepdim=True).sqrt() + 1e-10)
            fy = fy / (fy.square().sum(1, keepdim=True).sqrt() + 1e-10)
            weights = distance.lpips.lins[layer].model[1].weight.flatten()
            expected += ((fx - fy).square() * weights[None, :, None, None]).sum(1).mean((1, 2))
        # lpips weighs the channels with a 1x1 convolution, this sum runs elementwise: other kernels on the same
        # features, whose float32 sums over up to 512 channels agree to ~1e-6 (bound 512 ulps), CPU-dependent
        torch.testing.assert_close(distance(x, y), expected, rtol=1e-4, atol=1e-7)


def test_gradients_reach_the_inputs_and_not_the_parameters(random_distances):
    distance = random_distances[0]["vgg"]
    generator = torch.Generator().manual_seed(2)
    x = torch.rand(2, 3, 32, 32, generator=generator).requires_grad_(True)
    y = torch.rand(2, 3, 32, 32, generator=generator)
    distance(x, y).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(parameter.grad is None for parameter in distance.parameters())
    # at x == y the distance is at its minimum: finite (no 0/0 from the feature normalisation), zero gradient
    same = y.clone().requires_grad_(True)
    distance(same, y).sum().backward()
    assert torch.isfinite(same.grad).all()
    torch.testing.assert_close(same.grad, torch.zeros_like(same.grad), rtol=0, atol=1e-6)


def test_grayscale_28px_equals_repeated_channels(random_distances):
    distance = random_distances[0]["vgg"]
    generator = torch.Generator().manual_seed(3)
    x, y = torch.rand(2, 1, 28, 28, generator=generator), torch.rand(2, 1, 28, 28, generator=generator)
    with torch.no_grad():
        gray = distance(x, y)
        torch.testing.assert_close(gray, distance(x.repeat(1, 3, 1, 1), y.repeat(1, 3, 1, 1)), rtol=0, atol=0)
    assert (gray > 0).all()


@pytest.mark.parametrize(
    ("net", "shape"),
    [("vgg", (8, 8)), ("vgg", (8, 20)), ("alex", (16, 16)), ("alex", (28, 28)), ("squeeze", (16, 16))],
)
def test_small_inputs_are_upsampled_bilinearly_to_the_minimum(random_distances, net, shape):
    distance = random_distances[0][net]
    generator = torch.Generator().manual_seed(4)
    x, y = torch.rand(2, 3, *shape, generator=generator), torch.rand(2, 3, *shape, generator=generator)
    size = tuple(max(side, BACKBONES[net][1]) for side in shape)
    upsample = lambda images: F.interpolate(images, size=size, mode="bilinear", align_corners=False)  # noqa: E731
    with torch.no_grad():
        expected = distance.lpips(upsample(x), upsample(y), normalize=True).flatten()
        torch.testing.assert_close(distance(x, y), expected, rtol=0, atol=0)


@pytest.mark.parametrize("net", sorted(BACKBONES))
def test_documented_minimum_is_the_smallest_size_the_backbone_accepts(random_distances, net):
    model = random_distances[0][net].lpips
    minimum = BACKBONES[net][1]
    with torch.no_grad():
        assert model(torch.rand(1, 3, minimum, minimum), torch.rand(1, 3, minimum, minimum)).shape == (
            1,
            1,
            1,
            1,
        )
        with pytest.raises(RuntimeError):
            model(torch.rand(1, 3, minimum - 1, minimum - 1), torch.rand(1, 3, minimum - 1, minimum - 1))


def test_cached_backbone_weights_load_without_network(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    monkeypatch.setattr(torch.hub, "download_url_to_file", _no_network)
    torch.manual_seed(5)
    state = torchvision.models.squeezenet1_1().state_dict()
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(state, cache / WEIGHT_FILES["squeeze"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither the random-backbone warning nor torchvision's deprecation
        distance = PerceptualDistance("squeeze")
    assert distance.random_backbone is False and distance.description == "LPIPS(squeeze, ImageNet backbone)"
    torch.testing.assert_close(
        distance.lpips.net.slice1[0].weight, state["features.0.weight"], rtol=0, atol=0
    )
    torch.testing.assert_close(
        distance.lpips.net.slice7[0].expand3x3.weight, state["features.12.expand3x3.weight"], rtol=0, atol=0
    )


def test_bad_arguments_raise_value_errors(random_distances):
    with pytest.raises(ValueError, match="'resnet'"):
        PerceptualDistance("resnet", random_backbone=True)
    distance = random_distances[0]["squeeze"]
    with pytest.raises(ValueError, match=r"\(2, 4, 32, 32\)"):
        distance(torch.rand(2, 4, 32, 32), torch.rand(2, 4, 32, 32))
    with pytest.raises(ValueError, match=r"\(2, 3, 32, 32\) and \(2, 3, 16, 16\)"):
        distance(torch.rand(2, 3, 32, 32), torch.rand(2, 3, 16, 16))


def test_pairwise_and_nearest_agree_with_the_pairwise_forward(random_distances):
    distance = random_distances[0]["vgg"]
    generator = torch.Generator().manual_seed(6)
    x = torch.rand(3, 1, 28, 28, generator=generator)
    references = torch.cat(
        [torch.rand(4, 1, 28, 28, generator=generator), x[2:3], x[0:1]]
    )  # x[2] at 4, x[0] at 5
    with torch.no_grad():
        table = distance.pairwise(x, references)
        expected = torch.stack([distance(x, r.expand_as(x)) for r in references], dim=1)
        torch.testing.assert_close(table, expected, rtol=1e-4, atol=1e-5)
        indices, nearest = distance.nearest(x, references, chunk_size=4)  # the copies lie in the second chunk
    assert indices[0] == 5 and indices[2] == 4 and indices[1] == expected[1].argmin()
    # the chunks put 4 and 2 references through the backbone (and the cross-term matmul) where the table put 6:
    # equal to float32 rounding only, whose size depends on the CPU's kernels
    torch.testing.assert_close(nearest, table.min(dim=1).values, rtol=1e-4, atol=1e-5)
    assert nearest[0] < 1e-5 and nearest[2] < 1e-5
    with pytest.raises(ValueError, match=r"\(0, 1, 28, 28\)"):
        distance.nearest(x, references[:0])


def test_random_backbone_is_the_same_network_in_every_process_and_leaves_the_global_generator_alone():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.manual_seed(5)
        before = torch.rand(3)
        torch.manual_seed(5)
        first = PerceptualDistance("alex", random_backbone=True)
        after = torch.rand(3)
        torch.manual_seed(123)  # another process, another global seed
        second = PerceptualDistance("alex", random_backbone=True)
    assert torch.equal(before, after)  # built without drawing from the global generator
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
