"""Pix2Pix, DCGAN and SNGAN networks: ranges and shapes per size, skips, patch grids, SN, conditioning."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from lightning_modules.nets.gans import (
    DCGANDiscriminator,
    DCGANGenerator,
    PatchGANDiscriminator,
    ResNetDiscriminator,
    ResNetGenerator,
    UNetGenerator,
    build_gan,
    dcgan_weights_init,
    default_patchgan_layers,
)

pytestmark = pytest.mark.usefixtures("one_thread")

LATENT = 8
# (family, image size): every supported size of every noise generator
NOISE_GENERATORS = [("dcgan", 32), ("dcgan", 64), ("resnet", 64), ("resnet", 128)]



def tiny_gan(kind: str, size: int, channels: int, num_classes: int = 0, **kwargs):
    return build_gan(
        kind,
        LATENT,
        channels,
        size,
        base_width=4 if kind == "dcgan" else 2,
        num_classes=num_classes,
        **kwargs,
    )


def parametrized(module: nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if parametrize.is_parametrized(m, "weight")]


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(("kind", "size"), NOISE_GENERATORS)
def test_noise_generators_make_unit_range_images_and_train_end_to_end(kind, size, channels):
    torch.manual_seed(0)
    generator, discriminator = tiny_gan(kind, size, channels)
    assert (generator.latent_dim, generator.image_size, generator.out_channels) == (LATENT, size, channels)
    images = generator(generator.sample_latent(3))
    assert images.shape == (3, channels, size, size)
    assert images.min() >= 0 and images.max() <= 1 and images.std() > 1e-3
    logits = discriminator(images)
    assert logits.shape == (3,) and torch.isfinite(logits).all()
    logits.sum().backward()
    for network in (generator, discriminator):
        missing = [
            name
            for name, p in network.named_parameters()
            if p.grad is None or not torch.isfinite(p.grad).all()
        ]
        assert missing == []


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("size", [32, 64, 128, 256])
def test_unet_maps_to_unit_range_with_one_level_per_halving(size, channels):
    torch.manual_seed(0)
    unet = UNetGenerator(channels, channels, size, base_width=4, max_width=16)
    levels = int(math.log2(size))
    assert unet.num_levels == levels == {32: 5, 64: 6, 128: 7, 256: 8}[size]
    stride2 = [m for m in unet.encoder.modules() if isinstance(m, nn.Conv2d) and m.stride == (2, 2)]
    transposed = [m for m in unet.decoder.modules() if isinstance(m, nn.ConvTranspose2d)]
    assert len(stride2) == len(transposed) == levels
    bottleneck = []
    unet.encoder[-1].register_forward_hook(lambda module, args, output: bottleneck.append(output.shape))
    images = unet(torch.rand(2, channels, size, size))
    assert bottleneck == [torch.Size([2, 16, 1, 1])]
    assert images.shape == (2, channels, size, size)
    assert images.min() >= 0 and images.max() <= 1 and images.std() > 1e-3


def test_unet_channels_can_change_and_dropout_is_in_the_first_three_decoder_blocks():
    torch.manual_seed(0)
    unet = UNetGenerator(1, 3, 32, base_width=4)
    assert unet(torch.rand(2, 1, 32, 32)).shape == (2, 3, 32, 32)
    with_dropout = [
        j for j, block in enumerate(unet.decoder) if any(isinstance(m, nn.Dropout) for m in block)
    ]
    assert with_dropout == [0, 1, 2]
    x = torch.rand(2, 1, 32, 32)
    assert not torch.equal(unet(x), unet(x))  # Pix2Pix's noise: dropout active in training
    unet.eval()
    assert torch.equal(unet(x), unet(x))
    assert not any(
        isinstance(m, nn.Dropout) for m in UNetGenerator(1, 3, 32, base_width=4, dropout=0).modules()
    )


def test_unet_output_depends_on_the_input_through_the_skip_connections():
    torch.manual_seed(0)
    unet = UNetGenerator(3, 3, 32, base_width=4).eval()
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    unet(x).sum().backward()
    assert x.grad.abs().sum() > 0
    # cut the bottleneck: the input still reaches the output, through the skips alone
    unet.encoder[-1].register_forward_hook(lambda module, args, output: torch.zeros_like(output))
    x.grad = None
    output = unet(x)
    output.sum().backward()
    assert x.grad.abs().sum() > 0
    with torch.no_grad():
        assert not torch.allclose(unet(torch.zeros(1, 3, 32, 32)), unet(torch.ones(1, 3, 32, 32)))


@pytest.mark.parametrize(("size", "layers", "grid"), [(32, 1, 14), (64, 2, 14), (128, 3, 14), (256, 3, 30)])
def test_patchgan_logit_grid_per_size(size, layers, grid):
    torch.manual_seed(0)
    assert default_patchgan_layers(size) == layers
    discriminator = PatchGANDiscriminator(3, size, base_width=4)
    assert discriminator.n_layers == layers and discriminator.grid_size == grid
    assert discriminator(torch.rand(2, 3, size, size), torch.rand(2, 3, size, size)).shape == (
        2,
        1,
        grid,
        grid,
    )


def test_patchgan_explicit_layers_and_a_grid_that_would_vanish():
    assert PatchGANDiscriminator(1, 32, base_width=4, n_layers=3)(
        torch.rand(1, 1, 32, 32), torch.rand(1, 1, 32, 32)
    ).shape == (1, 1, 2, 2)
    with pytest.raises(ValueError, match="n_layers=4 .* image_size=32"):
        PatchGANDiscriminator(1, 32, n_layers=4)
    with pytest.raises(ValueError, match="n_layers must be a positive int, got 0"):
        PatchGANDiscriminator(1, 32, n_layers=0)


def test_conditional_patchgan_reads_the_input_image():
    torch.manual_seed(0)
    discriminator = PatchGANDiscriminator(1, 32, base_width=4).eval()
    assert discriminator.model[0].in_channels == 2
    x, y = torch.rand(2, 1, 32, 32, requires_grad=True), torch.rand(2, 1, 32, 32)
    logits = discriminator(x, y)
    logits.sum().backward()
    assert x.grad.abs().sum() > 0
    assert not torch.allclose(logits, discriminator(torch.rand(2, 1, 32, 32), y))
    with pytest.raises(ValueError, match="takes \\(x, y\\)"):
        discriminator(y)
    unconditional = PatchGANDiscriminator(1, 32, base_width=4, conditional=False)
    assert unconditional.model[0].in_channels == 1 and unconditional(y).shape == (2, 1, 14, 14)
    with pytest.raises(ValueError, match="one image batch"):
        unconditional(x, y)


@pytest.mark.parametrize(
    ("build", "size", "shown"),
    [
        (lambda s: UNetGenerator(3, 3, s), 28, "28"),
        (lambda s: UNetGenerator(3, 3, s), 48, "48"),
        (lambda s: UNetGenerator(3, 3, s), 512, "512"),
        (lambda s: UNetGenerator(3, 3, s), 16, "16"),
        (lambda s: UNetGenerator(3, 3, s), (32, 64), r"\(32, 64\)"),
        (lambda s: PatchGANDiscriminator(3, s), 100, "100"),
        (lambda s: DCGANGenerator(LATENT, 3, s), 28, "28"),
        (lambda s: DCGANGenerator(LATENT, 3, s), 128, "128"),
        (lambda s: DCGANDiscriminator(3, s), 16, "16"),
        (lambda s: ResNetGenerator(LATENT, 3, s), 32, "32"),
        (lambda s: ResNetDiscriminator(3, s), 256, "256"),
        (lambda s: build_gan("auto", LATENT, 1, s), 28, "28"),
        (lambda s: build_gan("auto", LATENT, 1, s), 256, "256"),
    ],
)
def test_unsupported_sizes_raise_naming_the_size(build, size, shown):
    with pytest.raises(ValueError, match=shown):
        build(size)


def test_wrong_input_shapes_raise_naming_the_shape():
    with pytest.raises(ValueError, match=r"\(2, 3, 64, 64\)"):
        UNetGenerator(3, 3, 32, base_width=4)(torch.rand(2, 3, 64, 64))
    with pytest.raises(ValueError, match=r"\(2, 5\)"):
        DCGANGenerator(LATENT, 1, 32, base_width=4)(torch.rand(2, 5))
    with pytest.raises(ValueError, match="'gan'"):
        build_gan("gan", LATENT, 1, 32)  # type: ignore[arg-type]


def test_spectral_norm_present_or_absent():
    dcgan = DCGANDiscriminator(3, 32, base_width=4)
    assert parametrized(dcgan) == [] and any(isinstance(m, nn.BatchNorm2d) for m in dcgan.modules())
    sn_dcgan = DCGANDiscriminator(3, 32, base_width=4, spectral_norm=True, num_classes=3)
    convs = [name for name, m in sn_dcgan.named_modules() if isinstance(m, (nn.Conv2d, nn.Embedding))]
    assert parametrized(sn_dcgan) == convs and len(convs) == 5
    assert not any(isinstance(m, nn.BatchNorm2d) for m in sn_dcgan.modules())
    resnet = ResNetDiscriminator(3, 64, base_width=2, num_classes=3)  # SN by default
    layers = [
        name for name, m in resnet.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear, nn.Embedding))
    ]
    assert parametrized(resnet) == layers and "projection" in layers
    assert parametrized(ResNetDiscriminator(3, 64, base_width=2, spectral_norm=False)) == []
    # the spectral norm does its job: after some power iterations every layer's largest singular value is 1
    x = torch.rand(4, 3, 32, 32)
    for _ in range(20):
        sn_dcgan(x, torch.tensor([0, 1, 2, 0]))
    for name in convs:
        weight = sn_dcgan.get_submodule(name).weight.flatten(1)
        torch.testing.assert_close(
            torch.linalg.matrix_norm(weight, ord=2), torch.tensor(1.0), rtol=0, atol=2e-3
        )


@pytest.mark.parametrize(("kind", "size"), [("dcgan", 32), ("resnet", 64)])
def test_class_conditioning_changes_generator_and_projection(kind, size):
    torch.manual_seed(0)
    generator, discriminator = tiny_gan(kind, size, 3, num_classes=4)
    if kind == "resnet":
        # SNGAN initialises every class's BatchNorm gain to 1 and bias to 0 (labels matter only once
        # trained); give the classes different parameters, as a training step would
        for module in generator.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=module.weight.mean().item(), std=0.1)
    # training mode (batch statistics), one z for the whole batch: equal labels give equal images
    z = generator.sample_latent(1).repeat(4, 1)
    images = generator(z, torch.tensor([0, 3, 0, 3]))
    assert (images[0] - images[1]).abs().max() > 1e-3
    torch.testing.assert_close(images[0], images[2])
    discriminator.eval()
    # projection discriminator: the label enters only through <embed(y), phi(x)>
    x = torch.rand(1, 3, size, size).repeat(2, 1, 1, 1)
    phi = []
    features = discriminator.features if kind == "dcgan" else discriminator.blocks
    features.register_forward_hook(lambda module, args, output: phi.append(output))
    logits = discriminator(x, torch.tensor([0, 3]))
    pooled = (phi[0] if kind == "dcgan" else phi[0].relu()).sum(dim=(2, 3))[0]
    embedding = discriminator.projection.weight
    torch.testing.assert_close(
        logits[0] - logits[1], (embedding[0] - embedding[3]) @ pooled, rtol=1e-4, atol=1e-4
    )


def test_labels_are_checked():
    generator, discriminator = tiny_gan("dcgan", 32, 1, num_classes=3)
    z = generator.sample_latent(2)
    with pytest.raises(ValueError, match="needs labels"):
        generator(z)
    with pytest.raises(ValueError, match=r"\[0, 3\).* \[1, 3\]"):
        discriminator(torch.rand(2, 1, 32, 32), torch.tensor([1, 3]))
    unconditional, _ = tiny_gan("resnet", 64, 1)
    with pytest.raises(ValueError, match="takes no labels"):
        unconditional(unconditional.sample_latent(2), torch.tensor([0, 1]))


def test_build_gan_picks_the_family_by_size():
    for size, generator_type, discriminator_type in [
        (32, DCGANGenerator, DCGANDiscriminator),
        (64, ResNetGenerator, ResNetDiscriminator),
        (128, ResNetGenerator, ResNetDiscriminator),
    ]:
        generator, discriminator = build_gan("auto", LATENT, 1, size, base_width=2)
        assert type(generator) is generator_type and type(discriminator) is discriminator_type
    generator, discriminator = build_gan("dcgan", LATENT, 1, 64, base_width=2)
    assert type(generator) is DCGANGenerator and parametrized(discriminator) == []
    assert parametrized(build_gan("dcgan", LATENT, 1, 32, base_width=2, spectral_norm=True)[1]) != []


def test_sample_latent_is_standard_normal_and_reproducible():
    generator, _ = tiny_gan("dcgan", 32, 1)
    z = generator.sample_latent(4000, generator=torch.Generator().manual_seed(7))
    assert z.shape == (4000, LATENT) and z.dtype == torch.float32
    torch.testing.assert_close(z, generator.sample_latent(4000, generator=torch.Generator().manual_seed(7)))
    assert abs(z.mean().item()) < 0.03 and abs(z.std().item() - 1) < 0.03


def test_dcgan_initialisation():
    torch.manual_seed(0)
    generator = DCGANGenerator(
        100, 3, 32
    )  # the paper's widths: a 100 -> 256 4x4 projection has 409,600 weights
    first = generator.model[0].weight
    assert abs(first.mean().item()) < 1e-3 and abs(first.std().item() - 0.02) < 5e-4
    norms = torch.cat([m.weight for m in generator.modules() if isinstance(m, nn.BatchNorm2d)])
    assert abs(norms.mean().item() - 1) < 0.01 and abs(norms.std().item() - 0.02) < 0.005
    default = DCGANGenerator(100, 3, 32, init_weights=False).model[0].weight
    assert abs(default.std().item() - 0.02) > 0.005
    # spectrally normalised layers are initialised on their unnormalised weight
    discriminator = DCGANDiscriminator(3, 64, spectral_norm=True, init_weights=False)
    discriminator.apply(dcgan_weights_init)
    original = discriminator.features[-2].parametrizations.weight.original
    assert abs(original.std().item() - 0.02) < 5e-4
