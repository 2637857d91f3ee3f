"""EvG's detector (DESIGN.md §5.4): varied images are raw images, taken through the model's own input
transform exactly as the engine's passes take every clean image, so the identity variation of a seed scores
its clean score -- for a timm model (PIL bicubic resize and crop) as for this project's tensor pipelines."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import functional as TF

from datamodules.transforms import ModelInput, TensorPipeline
from lightning_modules.evg import BlackBox, build_variation
from lightning_modules.scoring import ScoringModel, forward_outputs
from metrics import KAPPAS

pytestmark = pytest.mark.usefixtures("one_thread")


def eight_bit(count: int, channels: int, size: int, seed: int = 0) -> torch.Tensor:
    """Images as decoded from 8-bit files: ``k / 255``."""
    return torch.randint(0, 256, (count, channels, size, size), generator=torch.Generator().manual_seed(seed)) / 255.0


def clean_kappa(model: ScoringModel, images: torch.Tensor) -> torch.Tensor:
    """max-logit of each image through the model's own transform, one image at a time (the engine's rule)."""
    transform = model.model_input.transform()
    with torch.no_grad():
        return torch.cat([model(transform(image)[None]).max(dim=1).values for image in images])


def test_a_tensor_pipeline_runs_batched_as_image_by_image() -> None:
    """The batched path of a :class:`TensorPipeline` does per image what the pipeline does (grey by the mean of
    the channels, bilinear antialiased resize), then the normalisation."""
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12 * 12, 3))
    model = ScoringModel(network, model_input=ModelInput(TensorPipeline(12, 1), mean=(0.5,), std=(0.25,), size=(12, 12),
                                                         channels=1), name="net")
    detector = BlackBox(model, KAPPAS["max_logit"].detector)
    images = torch.rand(5, 3, 30, 20, generator=torch.Generator().manual_seed(0))
    expected = torch.stack([model.model_input.transform()(image) for image in images])
    torch.testing.assert_close(detector.adapt(images), expected, atol=1e-6, rtol=0)
    manual = torch.nn.functional.interpolate(images.mean(dim=1, keepdim=True), size=(12, 12), mode="bilinear",
                                             align_corners=False, antialias=True)
    torch.testing.assert_close(detector.adapt(images), (manual - 0.5) / 0.25, atol=1e-6, rtol=0)
    assert detector.adapt(images.double()).dtype == torch.float32  # as to_float_tensor, whatever the precision


def test_the_identity_variation_of_a_32px_seed_scores_its_clean_score_on_a_timm_model() -> None:
    """32 px OOD images and a timm model of a larger input (resnet10t: bicubic resize to 201, crop 176, ImageNet
    mean/std; resnet18's 235 and 224 work alike): the variation acts at 32 px (the authors'), the detector brings
    the varied image to the model's input by the model's own transform. The old rule (a bilinear resize of the
    whole image to the input) is another input: a gap of the order of the scores' spread."""
    model = ScoringModel("timm:resnet10t", pretrained=False)
    transform = model.model_input.pipeline
    assert "Resize(size=201, interpolation=bicubic" in repr(transform) and "CenterCrop(size=(176, 176))" in repr(transform)
    seeds = eight_bit(2, 3, 32)
    clean = clean_kappa(model, seeds)
    detector = BlackBox(model, KAPPAS["max_logit"].detector)
    for name in ("affine", "colour"):
        variation = build_variation(name, None, seed_shape=tuple(seeds.shape[1:]))
        assert getattr(variation, "preset", "colorV1") in ("affineV1", "colorV1")  # the 32 px presets
        varied = detector.scores(variation(variation.identity_point().expand(2, -1), seeds))
        torch.testing.assert_close(varied, clean, rtol=1e-5, atol=1e-5)
    # the images the old rule gave the model: the seed resized bilinearly to 224 px, no crop
    old = BlackBox(model, KAPPAS["max_logit"].detector, varied_images="model_input").scores(seeds)
    gap = float((old - clean).abs().max())
    assert gap > 1e-3 * float(clean.max() - clean.min()) and gap > 1e-3


def test_the_same_image_as_a_pil_file_and_as_a_tensor_is_the_same_input() -> None:
    """A seed decoded from an 8-bit file and the same pixels as a float tensor reach a PIL pipeline identically
    (the pipeline rounds a tensor to 8 bits, as a PNG): the data's own size needs no second pipeline."""
    model = ScoringModel("timm:resnet10t", pretrained=False)
    image = eight_bit(1, 3, 20)[0]
    as_file = TF.to_pil_image(image)
    torch.testing.assert_close(model.model_input.pipeline(as_file), model.model_input.pipeline(image), atol=0, rtol=0)


def test_a_fitted_kappa_is_a_constructor_argument_and_scores_as_its_detector() -> None:
    """A κ that fits (KNN) takes its fitted detector when the black box is built (no later set-up step), is
    refused without it, and scores the varied images as that detector scores their features."""
    from lightning_modules import OpenSetClassifier

    torch.manual_seed(0)
    network = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1).eval()
    model = ScoringModel(network, model_input=ModelInput(TensorPipeline(28, 1), size=(28, 28), channels=1), name="net")
    knn = KAPPAS["knn"].detector
    with pytest.raises(ValueError, match=r"net/knn: its detector 'knn' is fitted on in-distribution training outputs "
                                         r"first .*give it as fitted="):
        BlackBox(model, knn)
    with torch.no_grad():
        features = forward_outputs(model, torch.rand(40, 1, 28, 28), features=True)["features"]
    fitted = knn(k=2).fit({"features": features, "targets": torch.arange(40) % 4})
    detector = BlackBox(model, knn, kappa_args={"k": 2}, fitted=fitted)
    images = eight_bit(6, 1, 28)
    with torch.no_grad():
        expected = fitted.score({"features": forward_outputs(model, detector.adapt(images), features=True)["features"]})
    torch.testing.assert_close(detector.scores(images), expected.float())
    assert detector.fingerprint().endswith(fitted.state_fingerprint())


def test_a_detector_with_its_own_backward_pass_scores_proposals_as_its_detector() -> None:
    """AdaSCALE in EvG's search: its own pass (the input gradient of the predicted logit, one backward, the perturbed
    features) on the varied images, with its fitted ECDF, as the detector scores the same inputs."""
    from lightning_modules import OpenSetClassifier
    from lightning_modules.scoring import classification_head
    from metrics.detectors.adascale import STATISTIC

    torch.manual_seed(0)
    network = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1).eval()
    model = ScoringModel(network, model_input=ModelInput(TensorPipeline(28, 1), size=(28, 28), channels=1), name="net")
    adascale = KAPPAS["adascale_a"].detector
    head = classification_head(model)
    fitted = adascale()
    fitted._store_head(*head)
    validation = torch.rand(30, 1, 28, 28)
    with torch.no_grad():
        features = forward_outputs(model, validation, features=True)["features"]
    fitted.fit({"features": features, "targets": torch.arange(30) % 4,
                STATISTIC: fitted.image_outputs(model, validation)[STATISTIC]}, head=head)
    detector = BlackBox(model, adascale, fitted=fitted)
    images = eight_bit(5, 1, 28)
    inputs = detector.adapt(images)
    with torch.no_grad():
        shared = forward_outputs(model, inputs, features=True)
    expected = fitted.score({**shared, **fitted.image_outputs(model, inputs)})
    torch.testing.assert_close(detector.scores(images), expected.float())
    # its own pass decides: the same features with the fit set's largest statistic score otherwise
    largest = fitted.score({**shared, STATISTIC: fitted.fit_statistics[-1].expand(5)}).float()
    assert not torch.allclose(detector.scores(images), largest)
