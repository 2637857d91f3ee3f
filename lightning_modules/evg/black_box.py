"""A (model, κ) pair as EvG's black-box OOD detector (Yoon et al.; DESIGN.md §5.4).

:class:`BlackBox` turns any scoring model of this project -- a timm or torchvision classifier, a checkpoint,
a deep ensemble -- and any detector of :mod:`metrics.detectors` (a κ: by name, ``pood:<Class>`` or class path) into a black
box: ``scores(images)`` is κ (higher = more in-distribution) of the images a variation model makes, and
``energy(images)`` the standardised outlier score ``(-κ - μ) / (σ + 1e-3)``. No detector gradients are used
by the search.

The images arrive as float tensors in ``[0, 1]`` at the size the variations act at. By default
(``varied_images="raw"``) they are raw evaluation images, as every in-memory image of this project: the
model's own input transform brings them to its input -- its pipeline, then its normalisation
(:meth:`datamodules.transforms.ModelInput.transform`), the very transform the engine's passes apply to the ID
test and clean OOD images -- so the identity variation of a seed scores exactly what its clean image scores
(the authors' detectors take every image through their own ``transform``, e.g. ``vit_eval``'s ``Resize(224)``
of ``cifar_vit_hf_md.yml``). A :class:`datamodules.transforms.TensorPipeline` runs batched on the images'
device (the same operations as per image); any other pipeline (timm's and torchvision's PIL resize and
crop) runs image by image on the CPU, the image rounded to 8 bits as if written to a PNG file, as for every
in-memory image. With ``varied_images="model_input"`` the images are already what the model's pipeline
makes (the seeds went through it, ``vary_at: input``): only the normalisation is applied, after a bilinear
resize and a channel conversion for images of another size or channels (a GAN's). Either way they are
scored through the same outputs and κ dispatch as every other method
(:func:`lightning_modules.scoring.forward_outputs`, :func:`metrics.kappa_scores`).

μ and σ are the fitted state of the detector: buffers (``energy_mean``, ``energy_scale``, float64), set by
one explicit call, :meth:`fit_standardisation`, from in-distribution scores, saved with the run, NaN until
then (an energy asked of an unfitted detector is an error).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from datamodules.transforms import TensorPipeline
from lightning_modules.scoring import ScoringModel, forward_outputs
from metrics import (
    Detector,
    check_kappa,
    energy_standardisation,
    kappa_scores,
    standardised_energy,
)

VariedImages = Literal["raw", "model_input"]
VARIED_IMAGES: tuple[str, ...] = get_args(VariedImages)


class BlackBox(nn.Module):
    """A (model, κ) pair as a black-box OOD detector (see the module docstring).

    Args:
        model: the scoring model (its network, input and background rule).
        kappa: the confidence function's detector class (resolved by the command's detector options;
            ``metrics.KAPPAS["softmax"].detector`` from Python).
        name: how tables call it, e.g. ``demo-best/softmax`` (default: ``<model>/<κ>``).
        kappa_args: keyword arguments of κ (e.g. ODIN's temperature).
        fitted: a κ that fits on in-distribution training outputs (Mahalanobis, KNN, ...): its detector, fitted
            by the engine (:meth:`evaluation_engine.scoring.ScoringPasses.fitted_detector`); refused without.
        varied_images: what the images it scores are: ``"raw"`` images (the model's whole input transform
            brings them to its input, as every clean image) or ``"model_input"`` (already its pipeline's output:
            only the normalisation).

    Raises:
        ValueError: a κ the model cannot serve (an ensemble κ on one model, ...), naming both; a κ that fits
            without its fitted detector; an unknown ``varied_images``.
    """

    def __init__(self, model: ScoringModel, kappa: type[Detector], *, name: str | None = None,
                 kappa_args: dict[str, Any] | None = None, fitted: Detector | None = None,
                 varied_images: VariedImages = "raw") -> None:
        super().__init__()
        if varied_images not in VARIED_IMAGES:
            raise ValueError(f"varied_images must be one of {list(VARIED_IMAGES)}, got {varied_images!r}")
        self.varied_images = varied_images
        self.model = model.eval().requires_grad_(False)
        if not (isinstance(kappa, type) and issubclass(kappa, Detector)):
            raise TypeError(f"kappa must be a detector class (metrics.KAPPAS[name].detector), got {kappa!r}")
        self.kappa = kappa
        check_kappa(self.kappa, model=model.display_name, ensemble=model.ensemble, background=model.background_class)
        self.name = name or f"{model.display_name}/{self.kappa.name}"
        self.background = model.background_class
        self.kappa_args = self.kappa.arguments(**(kappa_args or {}))
        if kappa.needs_fit and not isinstance(fitted, kappa):
            raise ValueError(f"{self.name}: its detector {kappa.name!r} is fitted on in-distribution training outputs "
                             f"first (ScoringPasses.fitted_detector): give it as fitted=, got {fitted!r}")
        self.fitted = fitted if kappa.needs_fit else None  # the κ's fitted detector: a fixed black box of the search
        self.register_buffer("energy_mean", torch.tensor(float("nan"), dtype=torch.float64))
        self.register_buffer("energy_scale", torch.tensor(float("nan"), dtype=torch.float64))

    def fingerprint(self) -> str:
        """The model's weights and, for a fitted κ, the fitted state: another fit is another run."""
        if self.fitted is None:
            return self.model.fingerprint()
        return f"{self.model.fingerprint()}:{self.fitted.state_fingerprint()}"

    def adapt(self, images: Tensor) -> Tensor:
        """Images ``(N, C, H, W)`` in ``[0, 1]`` -> the model's input ``(N, C', H', W')``.

        ``"raw"``: ``normalise(pipeline(x_n))`` for each image, the model's own transform of every raw image
        (batched for a :class:`TensorPipeline`). ``"model_input"``: the model's channels (the mean of the
        channels, or repeated to 3) and size (bilinear, antialiased) where the images' differ, then its
        normalisation.
        """
        model_input = self.model.model_input
        if self.varied_images == "raw":
            return model_input.normalise(self._pipeline(images))
        channels = model_input.channels
        if channels is not None and images.shape[1] != channels:
            images = images.mean(dim=1, keepdim=True) if channels == 1 else images.expand(-1, channels, -1, -1)
        if model_input.size is not None and tuple(images.shape[-2:]) != tuple(model_input.size):
            images = F.interpolate(images, size=tuple(model_input.size), mode="bilinear", align_corners=False,
                                   antialias=True)
        return model_input.normalise(images)

    def _pipeline(self, images: Tensor) -> Tensor:
        """The model's pipeline of raw images, image by image as the engine's passes apply it."""
        pipeline = self.model.model_input.pipeline
        if isinstance(pipeline, TensorPipeline):  # TensorPipeline.__call__'s operations on the whole batch
            images = images.float()  # as to_float_tensor: float32, whatever the search's precision
            if pipeline.channels is not None and images.shape[1] != pipeline.channels:
                images = (images.mean(dim=1, keepdim=True) if pipeline.channels == 1
                          else images.expand(-1, pipeline.channels, -1, -1))
            if pipeline.size is not None and tuple(images.shape[-2:]) != pipeline.size:
                images = F.interpolate(images, size=pipeline.size, mode="bilinear", align_corners=False,
                                       antialias=True)
            return images
        made = [pipeline(image) for image in images.detach().cpu()]  # e.g. timm's PIL resize and crop
        return torch.stack(made).to(images.device)

    def scores(self, images: Tensor) -> Tensor:
        """κ ``(N,)`` (float32) of images ``(N, C, H, W)`` in ``[0, 1]``."""
        inputs = self.adapt(images)
        outputs: dict[str, Tensor] = {}
        if self.kappa.kind != "model" or self.kappa.inputs - {"model"}:
            with torch.no_grad():
                outputs.update(forward_outputs(self.model, inputs, features=self.kappa.reads_features))
        if self.kappa.kind == "model":  # e.g. ODIN, AdaSCALE: its own pass (with input gradients where it needs them)
            scorer = self.fitted if self.fitted is not None else self.kappa(background=self.background,
                                                                            **self.kappa_args)
            outputs.update(scorer.image_outputs(self.model, inputs))
        # finite=False: a NaN κ is a rejected proposal of the search (standardised_energy refuses infinities)
        return kappa_scores(self.kappa, outputs, background=self.background, parameters=self.kappa_args,
                            detector=self.fitted, finite=False).detach().float()

    @property
    def standardised(self) -> bool:
        return bool(torch.isfinite(self.energy_mean) and torch.isfinite(self.energy_scale))

    def fit_standardisation(self, id_kappa: Tensor) -> None:
        """Set μ and σ + 1e-3 of ``-κ`` on in-distribution images (:func:`metrics.energy_standardisation`)."""
        mean, scale = energy_standardisation(id_kappa)
        self.energy_mean.fill_(mean)
        self.energy_scale.fill_(scale)

    def energy(self, images: Tensor) -> Tensor:
        if not self.standardised:
            raise RuntimeError(f"{self.name}: call fit_standardisation with in-distribution scores before the search")
        return standardised_energy(self.scores(images), float(self.energy_mean), float(self.energy_scale))
