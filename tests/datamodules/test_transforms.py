"""How a model takes images (``ModelInput``): tensor and PIL pipelines, the split of an evaluation transform
into its pipeline and normalisation, against torchvision's and timm's own transforms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms as T

from datamodules.transforms import ModelInput, PILPipeline, TensorPipeline, eval_transform, to_pil_image


def reference_resize(image: torch.Tensor, size: int) -> torch.Tensor:
    return F.interpolate(image[None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]


def test_tensor_pipeline_resizes_and_converts_channels():
    grey = torch.rand(1, 28, 28, generator=torch.Generator().manual_seed(0))
    colour = torch.rand(3, 20, 20, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(TensorPipeline(32, None)(grey), reference_resize(grey, 32), rtol=0, atol=0)
    # the same numbers as torchvision's Resize on a tensor
    assert torch.equal(TensorPipeline(32, None)(grey), T.Resize((32, 32), antialias=True)(grey))
    torch.testing.assert_close(TensorPipeline(28, 1)(colour), reference_resize(colour.mean(dim=0, keepdim=True), 28),
                               rtol=0, atol=0)
    assert torch.equal(TensorPipeline(None, 3)(grey), grey.expand(3, -1, -1))
    assert torch.equal(TensorPipeline(28, 1)(grey), grey)  # already its size and channels: untouched
    uint8 = (grey * 255).round().to(torch.uint8)
    assert torch.equal(TensorPipeline(28, 1)(uint8), uint8.float() / 255)
    pil = Image.fromarray(uint8[0].numpy())
    assert torch.equal(TensorPipeline(28, 1)(pil), uint8.float() / 255)
    with pytest.raises(ValueError, match="channels must be 1, 3 or None"):
        TensorPipeline(28, 2)


def test_a_tensor_reaches_a_pil_pipeline_as_if_written_to_a_png_file():
    image = torch.rand(3, 9, 7, generator=torch.Generator().manual_seed(2))
    pixels = (image * 255).round().to(torch.uint8)
    pil = to_pil_image(image, "RGB")
    assert np.array_equal(np.asarray(pil), pixels.permute(1, 2, 0).numpy())
    grey = to_pil_image(image[:1], "RGB")  # grey to RGB: three equal channels
    assert np.array_equal(np.asarray(grey)[..., 0], np.asarray(grey)[..., 2])
    pipeline = PILPipeline(T.Compose([T.Resize(8), T.CenterCrop(6), T.ToTensor()]))
    assert torch.equal(pipeline(image), T.Compose([T.Resize(8), T.CenterCrop(6), T.ToTensor()])(pil))


def test_an_evaluation_transform_splits_into_its_pipeline_and_normalisation():
    plain = ModelInput.from_transform(eval_transform(resize=36, crop=32))
    assert plain.size == (32, 32) and plain.mean is None and plain.channels == 3
    normalised = ModelInput.from_transform(eval_transform(resize=36, crop=32, normalize=True))
    assert normalised.mean == pytest.approx((0.485, 0.456, 0.406)) and normalised.std == pytest.approx((0.229, 0.224, 0.225))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    torch.testing.assert_close(normalised.transform()(image), eval_transform(resize=36, crop=32, normalize=True)(image),
                               rtol=0, atol=0)
    batch = torch.stack([normalised.pipeline(image)] * 2)
    torch.testing.assert_close(normalised.normalise(batch)[0], normalised.transform()(image), rtol=0, atol=1e-7)
    assert plain.key() != normalised.key()


def test_timm_and_torchvision_transforms_are_the_models_own():
    import timm
    import torchvision
    from timm.data import create_transform, resolve_model_data_config

    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (300, 260, 3), dtype=np.uint8))
    model = timm.create_model("resnet18", pretrained=False)
    timm_transform = create_transform(**resolve_model_data_config(model), is_training=False)
    model_input = ModelInput.from_transform(timm_transform)
    assert model_input.size == (224, 224) and model_input.mean is not None
    assert torch.equal(model_input.transform()(image), timm_transform(image))
    preset = torchvision.models.get_model_weights("resnet18").DEFAULT.transforms()
    model_input = ModelInput.from_transform(preset)
    assert model_input.size == (224, 224)
    torch.testing.assert_close(model_input.transform()(image), preset(image), rtol=0, atol=0)
