"""Generators of shifted and near-OOD images regularised with LPIPS and ensemble MI (Mukhoti et al.).

DESIGN.md §5.3. Both are LightningModules with manual optimisation (a discriminator step, then a
generator step, every training step), trained with ``train.py fit`` like the classifiers.

:class:`ShiftGenerator` (a regularised Pix2Pix: U-Net generator, PatchGAN discriminator) maps an
in-distribution image ``x`` to ``G(x)``, perceptually different but with the same label:

    L_G = adv(D, G(x)) + λ_L1 |G(x) - target|₁ - λ_p LPIPS(x, G(x)) + λ_s MI(G(x))

:class:`NearOODGenerator` (a regularised GAN: DCGAN for small images, ResNet/SNGAN for 64-128 px) maps
noise ``z`` to ``G(z)``, perceptually close to the data but semantically new:

    L_G = adv(D, G(z)) + λ_p LPIPS(G(z), x_real) - λ_s MI(G(z))

The discriminator losses are the unregularised ones. MI is the mutual information of a frozen deep
ensemble (:class:`lightning_modules.nets.ensemble.DeepEnsemble`) on the generated images, resized to the
members' input size and normalised as the members' own datamodule normalised their training images
(:meth:`DeepEnsemble.unit_logits`); LPIPS is :class:`lightning_modules.nets.lpips.PerceptualDistance` (VGG by
default), which takes images in [0, 1]. The generators' networks and LPIPS work in [0, 1]: a datamodule that
serves normalised images (``normalize: true``) is refused at setup, naming its mean and std.
With ``lambda_perceptual = lambda_semantic = 0`` neither is loaded and the modules are the plain Pix2Pix
and the plain GAN (the latter is EvG's GAN variation model).

The MI term is only as meaningful as the ensemble: members near chance disagree everywhere. At ``fit`` with
``lambda_semantic > 0`` the ensemble's quality is read from the record ``train.py ensemble`` wrote next to its
members file (or the members are measured on their ID test split; :mod:`lightning_modules.ensemble_quality`),
and an ensemble with a member below its bar (the bar stated at training, else the sanity bar) is refused
unless ``allow_weak_ensemble``; the checkpoint records what was checked (``ensemble_quality``), so the sets a
generator makes say whether a weak ensemble shaped them.

The Mukhoti et al. text this project works from has lost its equations, tables and hyper-parameters: every
λ, image size, step count and learning rate here and in ``configs/generators/`` is this project's own choice.
Choices the paper leaves open (documented options; the README says why the defaults):

- Pix2Pix has no paired target here. ``discriminator="unconditional"`` (default): D judges realism, real
  ID images against ``G(x)``; ``"conditional"``: Pix2Pix's ``D(x, y)`` with ``(x, x)`` as the real pair.
  ``l1_target="source"`` (default): L1 pulls ``G(x)`` towards ``x`` (the only target there is), which with
  the LPIPS push keeps the shift bounded; ``"none"`` drops it.
- ``pairing`` of ``G(z)`` with ``x_real``: ``"random"`` (a random real image of the batch: an unbiased
  estimate of the expected distance to the data, which is minimised by one image close to all of them, so
  it pulls every sample towards one average image) or ``"nearest"`` (the perceptually nearest real image of
  the batch, chosen without gradients from the B x B distances of :meth:`PerceptualDistance.pairwise`: each
  sample is pulled to the data point it already resembles, which should keep the samples spread). Measured
  on the demo (``benchmarks/generator_defaults.py``, ``benchmarks/RESULTS.md``: 4 seeds), ``random`` did
  not pull the samples together: at k = 1 its samples were as spread as ``nearest``'s (mean pairwise LPIPS
  0.079 both; real images 0.088), so the default stays ``random``, which needs no B x B distances a step.
- ``regularise_every = k`` applies the LPIPS and MI terms on every k-th training step only, with their
  weights multiplied by k (lazy regularisation, Karras et al., *Analyzing and Improving the Image Quality of
  StyleGAN*, CVPR 2020). That is the same expected gradient at 1/k of the regularisers' cost under plain SGD,
  but not under Adam, whose normalised step sees k-times larger, k-times rarer regulariser gradients: k > 1
  is another objective, not a cheaper k = 1. Measured on the near-OOD demo (same benchmark), k = 4 gave
  less spread samples (0.066 vs 0.079), further from the data (LPIPS 0.046 vs 0.042), with a higher MI
  (0.069 vs 0.055) than k = 1, at about half the training time. The default, 1, applies the objective at
  every step. The schedule counts training steps over the whole run (``global_step // 2``), not batches
  within an epoch.

Under DDP every rank draws its own randomness: the latent noise, the fake labels, the random pairing and the
dropout masks of a training step come from the seed :func:`step_seed` ``(seed, rank, step)``, so N processes
train on N times the fakes, not on N copies of one batch, and a resumed run draws what the uninterrupted run
would have drawn. The frozen ensemble and LPIPS (and the fixed-sample buffers, identical on every rank by
construction) are kept out of DDP's start-up broadcast and its per-step buffer broadcast
(``_ddp_params_and_buffers_to_ignore``); the two trained networks are synchronised as usual.

Every step computes ``G(·)`` once and shares it between the adversarial, L1, LPIPS and MI terms; the
discriminator's fake pass uses the detached output; the ensemble and LPIPS get neither gradients nor
optimiser state and are not saved in the checkpoint (the ensemble's member paths are, in the
hyper-parameters).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from datamodules.batch import unpack_batch
from lightning_modules.checkpoint import record_run
from lightning_modules.ensemble_quality import EnsembleQuality, check_ensemble
from lightning_modules.nets.ensemble import DeepEnsemble
from lightning_modules.nets.gans import PatchGANDiscriminator, UNetGenerator, build_gan
from lightning_modules.nets.lpips import PerceptualDistance
from metrics.ensemble import mutual_information_from_logits
from openset_common.typed import save_arguments

AdversarialLoss = Literal["non_saturating", "hinge"]
FIXED_SAMPLES = 64


# attributes whose parameters and buffers DDP must neither broadcast at start-up nor re-broadcast every step:
# frozen scorers, and non-persistent buffers that every rank builds identically
FROZEN_PREFIXES = ("ensemble.", "perceptual.", "reference_images", "fixed_")


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of training step ``step`` on process ``rank``: 64 bits of numpy's ``SeedSequence([seed, rank,
    step])``, so that no two (rank, step) pairs share a random stream and a resumed run draws what the
    uninterrupted one would have drawn."""
    for name, value in (("seed", seed), ("rank", rank), ("step", step)):
        if int(value) < 0:
            raise ValueError(f"{name} must be >= 0 for the training noise's seed, got {value}")
    return int(np.random.SeedSequence([int(seed), int(rank), int(step)]).generate_state(1, dtype=np.uint64)[0])


@contextmanager
def seeded_randomness(seed: int, device: torch.device) -> Iterator[None]:
    """Run a block with the global CPU generator (and, on a GPU, the current device's) seeded with ``seed``,
    restoring their states afterwards: the block's random draws (``randn``, ``randperm``, dropout masks) are
    a function of ``seed`` alone and leave the rest of the run's randomness as it was."""
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else [], device_type="cuda"):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


def refuse_normalised_data(datamodule: Any) -> None:
    """Raise if a datamodule serves normalised images: the generators' networks and LPIPS take ``[0, 1]``.

    Raises:
        ValueError: naming the datamodule and its mean and std.
    """
    hparams = getattr(datamodule, "hparams", None) or {}
    if hparams.get("normalize", False):
        raise ValueError(
            f"{type(datamodule).__name__} serves normalised images (normalize=True, mean={hparams.get('mean')}, "
            f"std={hparams.get('std')}), but the generators' networks and LPIPS take images in [0, 1]: set the "
            "datamodule's normalize: false (the ensemble applies its members' own normalisation to generated images)"
        )


def discriminator_loss(real: Tensor, fake: Tensor, kind: AdversarialLoss) -> Tensor:
    """The unregularised discriminator loss on real and fake logits (any shape, e.g. PatchGAN maps)."""
    if kind == "hinge":
        return F.relu(1.0 - real).mean() + F.relu(1.0 + fake).mean()
    return 0.5 * (F.binary_cross_entropy_with_logits(real, torch.ones_like(real))
                  + F.binary_cross_entropy_with_logits(fake, torch.zeros_like(fake)))


def generator_adversarial_loss(fake: Tensor, kind: AdversarialLoss) -> Tensor:
    """Non-saturating ``-log D(G)`` or hinge ``-D(G)``."""
    if kind == "hinge":
        return -fake.mean()
    return F.binary_cross_entropy_with_logits(fake, torch.ones_like(fake))


@dataclass(kw_only=True)
class GeneratorOptions:
    """The options both generators share: the regularisers, the adversarial game and the optimiser. Each generator
    takes them by these names (``--model.init_args.lambda_semantic 0``, ``lr: 2e-4`` in YAML) and passes them on
    as ``**options``.

    Attributes:
        ensemble: member checkpoints of the deep ensemble, or a members file (needed when ``lambda_semantic > 0``).
        lambda_adversarial: the weight of the adversarial term.
        lambda_perceptual: the weight of the LPIPS term (shift: ``-LPIPS(x, G(x))``; near-OOD:
            ``+LPIPS(G(z), x_real)``).
        lambda_semantic: the weight of the ensemble's MI term (shift: ``+MI(G(x))``; near-OOD: ``-MI(G(z))``).
        lpips_net: the LPIPS backbone.
        lpips_random_backbone: a randomly initialised LPIPS backbone (only when asked for by name).
        lr: Adam's learning rate for both networks (Pix2Pix's 2e-4; Mukhoti et al.'s are lost, this is this
            project's choice).
        betas: Adam's betas (Pix2Pix's (0.5, 0.999)).
        adversarial_loss: ``"non_saturating"`` (Pix2Pix's BCE) or ``"hinge"``.
        regularise_every: apply LPIPS and MI on every k-th step with k-times the weights (see the module docstring).
        training_seed: the seed of the training randomness (dropout masks, latent noise, fake labels, the random
            pairing; see :func:`step_seed`); ``None``: the run's ``seed_everything`` seed. (Not ``seed``: the
            datamodules' ``seed`` hyper-parameter would clash with it in the logger's merged hyper-parameters.)
        allow_weak_ensemble: train the MI term against an ensemble below its quality bar anyway (see the module
            docstring); the checkpoint and the sets generated from it say so.
    """

    ensemble: list[str] | str | None = None
    lambda_adversarial: float = 1.0
    lambda_perceptual: float = 1.0
    lambda_semantic: float = 1.0
    lpips_net: str = "vgg"
    lpips_random_backbone: bool = False
    lr: float = 2e-4
    betas: tuple[float, float] = (0.5, 0.999)
    adversarial_loss: AdversarialLoss = "non_saturating"
    regularise_every: int = 1
    training_seed: int | None = None
    allow_weak_ensemble: bool = False


class RegularisedGenerator(pl.LightningModule):
    """What both generators share: the regularisers, the two optimisers, logging and fixed samples; their options
    (:class:`GeneratorOptions`) come as ``**options``."""

    generator: nn.Module
    discriminator: nn.Module

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.automatic_optimization = False
        try:
            self.options = o = GeneratorOptions(**options)
        except TypeError as error:  # a misspelt option, named with the generator the user called
            raise TypeError(f"{type(self).__name__}: {error} (its options: "
                            f"{[f.name for f in fields(GeneratorOptions)]})") from None
        if o.regularise_every < 1:
            raise ValueError(f"regularise_every must be >= 1, got {o.regularise_every}")
        if o.training_seed is not None and o.training_seed < 0:
            raise ValueError(f"training_seed must be >= 0 (or None: the run's seed_everything seed), got "
                             f"{o.training_seed}")
        self.regularise_every = o.regularise_every
        self.training_seed = o.training_seed  # not `seed`: a datamodule's `seed` hyper-parameter would clash
        if o.lambda_adversarial < 0 or o.lambda_perceptual < 0 or o.lambda_semantic < 0:
            raise ValueError(f"the loss weights must be >= 0, got lambda_adversarial={o.lambda_adversarial}, "
                             f"lambda_perceptual={o.lambda_perceptual}, lambda_semantic={o.lambda_semantic} (the "
                             "signs of the regularisers are fixed by the objective)")
        if o.adversarial_loss not in ("non_saturating", "hinge"):
            raise ValueError(f"adversarial_loss must be 'non_saturating' or 'hinge', got {o.adversarial_loss!r}")
        if o.lambda_semantic > 0 and not o.ensemble:
            raise ValueError("lambda_semantic > 0 needs the ensemble's member checkpoints (ensemble: [...])")
        self.lambda_adversarial = o.lambda_adversarial
        self.lambda_perceptual, self.lambda_semantic = o.lambda_perceptual, o.lambda_semantic
        self.lr, self.betas, self.adversarial_loss = o.lr, tuple(o.betas), o.adversarial_loss
        self.ensemble = DeepEnsemble.from_checkpoints(o.ensemble) if o.ensemble else None
        self.ensemble_members, self.allow_weak_ensemble = o.ensemble, o.allow_weak_ensemble
        self.ensemble_quality: EnsembleQuality | None = None  # checked at fit (see the module docstring)
        self.perceptual = (PerceptualDistance(o.lpips_net, random_backbone=o.lpips_random_backbone)
                           if o.lambda_perceptual > 0 else None)
        self._ddp_params_and_buffers_to_ignore = self.frozen_names()

    # -- the run: data in [0, 1], per-rank randomness, frozen scorers kept out of DDP's broadcasts ----------

    def frozen_names(self) -> list[str]:
        """The parameters and buffers DDP must leave alone (see ``FROZEN_PREFIXES``)."""
        named = [*self.named_parameters(), *self.named_buffers()]
        return sorted({name for name, _ in named if name.startswith(FROZEN_PREFIXES)})

    def setup(self, stage: str) -> None:
        """Refuse a datamodule of normalised images, and at ``fit`` an MI regulariser's ensemble below its quality
        bar (unless ``allow_weak_ensemble``); list the frozen tensors for DDP (which wraps the module after this
        hook)."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            refuse_normalised_data(datamodule)
        if stage == "fit":
            self.check_ensemble_quality()
        self._ddp_params_and_buffers_to_ignore = self.frozen_names()

    def check_ensemble_quality(self) -> EnsembleQuality | None:
        """The MI regulariser's ensemble held to its quality bar (``None``: no MI term, nothing to check).

        Raises:
            lightning_modules.ensemble_quality.WeakEnsembleError: a member below the bar and not
                ``allow_weak_ensemble``.
        """
        if self.ensemble is None or self.lambda_semantic <= 0 or not self.ensemble_members:
            return None
        device = self.trainer.strategy.root_device if self._trainer is not None else self.device
        self.ensemble_quality = check_ensemble(
            self.ensemble_members, what="the generator's MI regulariser (lambda_semantic > 0)",
            allow_weak=self.allow_weak_ensemble, option="--model.init_args.allow_weak_ensemble=true", device=device)
        return self.ensemble_quality

    @property
    def noise_seed(self) -> int:
        """The seed of the training noise: ``training_seed``, else the run's ``seed_everything`` seed, else 0."""
        if self.training_seed is not None:
            return self.training_seed
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def training_step_index(self, batch_idx: int) -> int:
        """The training step over the whole run (``global_step`` counts 2 optimiser steps per training step);
        ``batch_idx`` without a trainer."""
        return self.trainer.global_step // 2 if self._trainer is not None else batch_idx

    def step_randomness(self, step: int) -> Any:
        """The context of training step ``step``'s random draws on this process (see :func:`step_seed`)."""
        rank = self.global_rank if self._trainer is not None else 0
        return seeded_randomness(step_seed(self.noise_seed, rank, step), self.device)

    # -- regularisers --------------------------------------------------------------------------------

    def ensemble_logits(self, images: Tensor) -> Tensor:
        """``(M, N, C)`` logits of the ensemble on generated images in [0, 1], resized to the members' input
        size and normalised with the members' own normalisation (:meth:`DeepEnsemble.unit_logits`)."""
        if self.ensemble is None:
            raise RuntimeError("this generator has no ensemble (give `ensemble` member checkpoints)")
        return self.ensemble.unit_logits(images)

    def mutual_information(self, images: Tensor) -> Tensor:
        """``(N,)`` MI of the ensemble (differentiable in the images)."""
        return mutual_information_from_logits(self.ensemble_logits(images).float(),
                                              background=self.ensemble.background)

    # -- optimisation ----------------------------------------------------------------------------------

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        # only the two networks: the ensemble and LPIPS have no parameters to find (frozen buffers / no grad)
        return [torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=self.betas),
                torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=self.betas)]

    def regularisation_weight(self, step: int) -> float:
        """``k`` on every k-th training step (lazy regularisation), 0 on the others."""
        return float(self.regularise_every) if step % self.regularise_every == 0 else 0.0

    def _step(self, optimizer: Any, loss: Tensor) -> None:
        self.toggle_optimizer(optimizer)
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        optimizer.step()
        self.untoggle_optimizer(optimizer)

    def _log_terms(self, terms: dict[str, Tensor], batch_size: int) -> None:
        self.log_dict({f"train/{k}": v.detach().float() for k, v in terms.items()}, on_step=True, on_epoch=True,
                      sync_dist=True, batch_size=batch_size, prog_bar=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        record_run(self, checkpoint)
        if self.ensemble_quality is not None:  # what the MI term's ensemble was held to (evaluate.py generate reads it)
            checkpoint["ensemble_quality"] = self.ensemble_quality.as_dict()
        # LPIPS is rebuilt from its package and the torch cache, not stored with every generator
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("perceptual.")}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.perceptual is not None:
            checkpoint["state_dict"].update({f"perceptual.{k}": v for k, v in self.perceptual.state_dict().items()})

    def fixed_samples(self) -> Tensor:
        """Generated images for the sample grids: the same inputs at every call (``(n, C, H, W)`` in [0, 1])."""
        raise NotImplementedError

    # -- generation (``evaluate.py generate``: ``trainer.predict`` + :class:`callbacks.GeneratedSetWriter`) --

    def attach_scorers(self, ensemble: DeepEnsemble | None, perceptual: PerceptualDistance | None,
                       reference: Tensor | None = None) -> None:
        """Use this ensemble and LPIPS for the per-image MI and LPIPS of a generated set (by default the
        generator's own, if it was trained with them); ``reference``: the ID images a near-OOD image's
        LPIPS is measured to (the nearest of them)."""
        self.ensemble = ensemble.to(self.device) if ensemble is not None else None
        self.perceptual = perceptual.to(self.device) if perceptual is not None else None
        if reference is not None:
            self.register_buffer("reference_images", reference.to(self.device), persistent=False)
        self._ddp_params_and_buffers_to_ignore = self.frozen_names()

    def _describe(self, images: Tensor, out: dict[str, Tensor], *, sources: Tensor | None) -> dict[str, Tensor]:
        """Per-image ensemble prediction and MI, and LPIPS to the source (shift) or nearest reference image."""
        nan = torch.full((images.shape[0],), float("nan"), device=images.device)
        out["mi"], out["ensemble_prediction"], out["lpips"] = nan, torch.full_like(nan, -1), nan.clone()
        if self.ensemble is not None:
            logits = self.ensemble_logits(images).float()
            out["mi"] = mutual_information_from_logits(logits, background=self.ensemble.background).float()
            mean = torch.softmax(logits, dim=-1).mean(dim=0)
            if self.ensemble.background:
                mean = mean[:, :-1]
            out["ensemble_prediction"] = mean.argmax(dim=1).float()
        if self.perceptual is not None:
            if sources is not None:
                out["lpips"] = self.perceptual(sources, images).float()
            elif getattr(self, "reference_images", None) is not None:
                out["lpips"] = self.perceptual.nearest(images, self.reference_images)[1].float()
        return out


class ShiftGenerator(RegularisedGenerator):
    """Regularised Pix2Pix: shifted images with the source's label (see the module docstring).

    Args:
        channels: image channels.
        image_size: side of the square images (32 ... 256, a power of two).
        lambda_l1: the weight of the L1 term.
        discriminator: ``"unconditional"`` (realism) or ``"conditional"`` (Pix2Pix's ``D(x, y)``).
        l1_target: ``"source"`` or ``"none"``.
        base_width: of the U-Net and the PatchGAN (whose depth follows the image size).
        dropout: of the U-Net.
        options: the options both generators share (:class:`GeneratorOptions`: ``ensemble``, ``lambda_perceptual``
            (``-LPIPS(x, G(x))``), ``lambda_semantic`` (``+MI(G(x))``), ``lr``, ...; ``training_seed`` seeds the
            dropout masks).
    """

    def __init__(self, channels: int = 1, image_size: int = 32, lambda_l1: float = 10.0,
                 discriminator: Literal["unconditional", "conditional"] = "unconditional",
                 l1_target: Literal["source", "none"] = "source", base_width: int = 64, dropout: float = 0.5,
                 **options: Any) -> None:
        super().__init__(**options)
        save_arguments(self, self.options, inspect.currentframe())
        if discriminator not in ("unconditional", "conditional"):
            raise ValueError(f"discriminator must be 'unconditional' or 'conditional', got {discriminator!r}")
        if l1_target not in ("source", "none"):
            raise ValueError(f"l1_target must be 'source' or 'none', got {l1_target!r}")
        if lambda_l1 < 0:  # `lambda_l1 > 0` gates the term: a negative weight would silently drop it
            raise ValueError(f"the loss weights must be >= 0, got lambda_l1={lambda_l1}")
        self.conditional = discriminator == "conditional"
        self.lambda_l1 = lambda_l1 if l1_target == "source" else 0.0
        self.generator = UNetGenerator(channels, channels, image_size, base_width=base_width, dropout=dropout)
        self.discriminator = PatchGANDiscriminator(channels, image_size, base_width=base_width,
                                                   conditional=self.conditional)
        self.register_buffer("fixed_sources", torch.empty(0), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        """Shifted images ``G(x)`` in [0, 1], same shape as ``x``."""
        return self.generator(images)

    def _judge(self, source: Tensor, image: Tensor) -> Tensor:
        return self.discriminator(source, image) if self.conditional else self.discriminator(image)

    def discriminator_step_loss(self, images: Tensor, fake: Tensor) -> Tensor:
        """The unregularised D loss: real ID images (the pair ``(x, x)`` when conditional) against ``G(x)``
        detached."""
        return discriminator_loss(self._judge(images, images), self._judge(images, fake.detach()),
                                  self.adversarial_loss)

    def generator_step_loss(self, images: Tensor, fake: Tensor, regularisation: float = 1.0
                            ) -> tuple[Tensor, dict[str, Tensor]]:
        """``L_G`` and its unweighted terms for source images and their shifts ``fake = G(images)``;
        ``regularisation`` multiplies the LPIPS and MI weights (0 skips them: lazy regularisation)."""
        terms = {"g_adversarial": generator_adversarial_loss(self._judge(images, fake), self.adversarial_loss)}
        loss_g = self.lambda_adversarial * terms["g_adversarial"]
        if self.lambda_l1 > 0:
            terms["l1"] = (fake - images).abs().mean()
            loss_g = loss_g + self.lambda_l1 * terms["l1"]
        if self.perceptual is not None and regularisation > 0:
            terms["lpips"] = self.perceptual(images, fake).mean()
            loss_g = loss_g - regularisation * self.lambda_perceptual * terms["lpips"]
        if self.lambda_semantic > 0 and regularisation > 0:
            terms["mi"] = self.mutual_information(fake).mean()
            loss_g = loss_g + regularisation * self.lambda_semantic * terms["mi"]
        return loss_g, terms

    def training_step(self, batch: Any, batch_idx: int) -> None:
        images, _, _, _ = unpack_batch(batch)
        optimizer_g, optimizer_d = self.optimizers()
        step = self.training_step_index(batch_idx)
        with self.step_randomness(step):  # this rank's own dropout masks
            fake = self.generator(images)  # once per step, shared by every term below
            loss_d = self.discriminator_step_loss(images, fake)
            self._step(optimizer_d, loss_d)
            loss_g, terms = self.generator_step_loss(images, fake, self.regularisation_weight(step))
            self._step(optimizer_g, loss_g)
        self._log_terms({"d_loss": loss_d, **terms, "g_loss": loss_g}, images.shape[0])

    def on_fit_start(self) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        train_set = getattr(datamodule, "train_set", None)
        if train_set is not None and self.fixed_sources.numel() == 0:  # the first images: the same on every rank
            count = min(FIXED_SAMPLES // 4, len(train_set))  # 16 sources: 4 (source, shifted) pairs per row
            self.fixed_sources = torch.stack([train_set[i].image for i in range(count)]).to(self.device)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        """Shift a batch of source images (deterministic: the generator in eval mode, dropout off)."""
        images, labels, indices, _ = unpack_batch(batch)
        self.generator.eval()
        with torch.no_grad():
            shifted = self.generator(images)
            out = {"images": shifted.float(), "indices": indices, "targets": labels,
                   "source_index": indices.float(), "source_label": labels.float(),
                   "seed": torch.full_like(indices, -1).float()}
            return self._describe(shifted, out, sources=images)

    def fixed_samples(self) -> Tensor:
        if self.fixed_sources.numel() == 0:
            raise RuntimeError("no fixed source images yet (they are taken from the training set at fit start)")
        with torch.no_grad():
            was_training = self.generator.training
            self.generator.eval()
            shifted = self.generator(self.fixed_sources)
            self.generator.train(was_training)
        # sources and their shifted images, interleaved: one row per pair in a two-column grid
        return torch.stack([self.fixed_sources, shifted], dim=1).flatten(0, 1)


class NearOODGenerator(RegularisedGenerator):
    """Regularised GAN: near-OOD images from noise (see the module docstring).

    With ``lambda_perceptual = lambda_semantic = 0`` it is the plain GAN (EvG's GAN variation model).

    Args:
        channels, image_size: of the generated images (DCGAN 32/64 px, ResNet 64/128 px).
        latent_dim: dimension of ``z``.
        architecture: ``"auto"`` (DCGAN up to 32 px, ResNet above), ``"dcgan"`` or ``"resnet"``.
        spectral_norm: spectral normalisation in D (``None``: the architecture's default).
        conditional_classes: > 0 for a class-conditional GAN over that many classes (labels from the batch for
            real images, uniform for fakes). Not called ``num_classes``: ``train.py`` links the data's class count
            to a model's ``num_classes``, which would make every GAN conditional.
        pairing: ``"random"`` or ``"nearest"`` real image of the batch for the LPIPS term.
        options: the options both generators share (:class:`GeneratorOptions`: ``ensemble``, ``lambda_perceptual``
            (``+LPIPS(G(z), x_real)``), ``lambda_semantic`` (``-MI(G(z))``), ``lr``, ...; ``training_seed`` seeds the
            latent noise, the fake labels and the random pairing).
    """

    def __init__(self, channels: int = 1, image_size: int = 32, latent_dim: int = 64,
                 architecture: Literal["auto", "dcgan", "resnet"] = "auto", base_width: int = 64,
                 spectral_norm: bool | None = None, conditional_classes: int = 0,
                 pairing: Literal["random", "nearest"] = "random", **options: Any) -> None:
        super().__init__(**options)
        save_arguments(self, self.options, inspect.currentframe())
        if pairing not in ("random", "nearest"):
            raise ValueError(f"pairing must be 'random' or 'nearest', got {pairing!r}")
        self.pairing, self.num_classes, self.latent_dim = pairing, conditional_classes, latent_dim
        self.generator, self.discriminator = build_gan(architecture, latent_dim, channels, image_size,
                                                       base_width=base_width, num_classes=conditional_classes,
                                                       spectral_norm=spectral_norm)
        noise = torch.Generator().manual_seed(0)  # identical on every rank and after every resume
        self.register_buffer("fixed_noise", torch.randn(FIXED_SAMPLES, latent_dim, generator=noise), persistent=False)
        self.register_buffer("fixed_labels", torch.arange(FIXED_SAMPLES) % max(conditional_classes, 1),
                             persistent=False)

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Images ``G(z)`` in [0, 1] for latents ``(N, latent_dim)`` (and labels when class-conditional)."""
        return self.generator(z, labels) if self.num_classes else self.generator(z)

    def _judge(self, images: Tensor, labels: Tensor | None) -> Tensor:
        return self.discriminator(images, labels) if self.num_classes else self.discriminator(images)

    def paired_real(self, fake: Tensor, real: Tensor) -> Tensor:
        """The real image of the batch each generated image is compared with by the LPIPS term."""
        if self.pairing == "random":
            return real[torch.randperm(real.shape[0], device=real.device)[: fake.shape[0]]]
        with torch.no_grad():  # the choice itself is not differentiated; one backbone pass per image
            distances = self.perceptual.pairwise(fake, real)
        return real[distances.argmin(dim=1)]

    def discriminator_step_loss(self, real: Tensor, real_labels: Tensor | None, fake: Tensor,
                                fake_labels: Tensor | None) -> Tensor:
        """The unregularised D loss: real ID images against ``G(z)`` detached."""
        return discriminator_loss(self._judge(real, real_labels), self._judge(fake.detach(), fake_labels),
                                  self.adversarial_loss)

    def generator_step_loss(self, real: Tensor, fake: Tensor, fake_labels: Tensor | None, regularisation: float = 1.0
                            ) -> tuple[Tensor, dict[str, Tensor]]:
        """``L_G`` and its unweighted terms for generated images ``fake`` and the batch's real images;
        ``regularisation`` multiplies the LPIPS and MI weights (0 skips them: lazy regularisation)."""
        terms = {"g_adversarial": generator_adversarial_loss(self._judge(fake, fake_labels), self.adversarial_loss)}
        loss_g = self.lambda_adversarial * terms["g_adversarial"]
        if self.perceptual is not None and regularisation > 0:
            terms["lpips"] = self.perceptual(fake, self.paired_real(fake, real)).mean()
            loss_g = loss_g + regularisation * self.lambda_perceptual * terms["lpips"]
        if self.lambda_semantic > 0 and regularisation > 0:
            terms["mi"] = self.mutual_information(fake).mean()
            loss_g = loss_g - regularisation * self.lambda_semantic * terms["mi"]
        return loss_g, terms

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, labels, _, _ = unpack_batch(batch)
        optimizer_g, optimizer_d = self.optimizers()
        step = self.training_step_index(batch_idx)
        with self.step_randomness(step):  # this rank's own z, fake labels, pairing (and dropout masks)
            z = torch.randn(real.shape[0], self.latent_dim, device=real.device)
            fake_labels = (torch.randint(0, self.num_classes, (real.shape[0],), device=real.device)
                           if self.num_classes else None)
            fake = self(z, fake_labels)  # once per step, shared by every term below
            loss_d = self.discriminator_step_loss(real, labels if self.num_classes else None, fake, fake_labels)
            self._step(optimizer_d, loss_d)
            loss_g, terms = self.generator_step_loss(real, fake, fake_labels, self.regularisation_weight(step))
            self._step(optimizer_g, loss_g)
        self._log_terms({"d_loss": loss_d, **terms, "g_loss": loss_g}, real.shape[0])

    def latent(self, seeds: Tensor) -> Tensor:
        """``z`` of each image from its own seed: an image does not depend on batch size or process count."""
        return torch.stack([torch.randn(self.latent_dim, generator=torch.Generator().manual_seed(int(s)))
                            for s in seeds.cpu()]).to(self.device)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        """Generate one image per seed of the batch (``datamodules.generated.LatentSeeds``)."""
        seeds, indices = batch
        labels = indices % self.num_classes if self.num_classes else None
        self.generator.eval()
        with torch.no_grad():
            images = self(self.latent(seeds), labels)
            minus_one = torch.full_like(indices, -1).float()
            out = {"images": images.float(), "indices": indices, "targets": torch.full_like(indices, -2),
                   "source_index": minus_one, "source_label": labels.float() if labels is not None else minus_one,
                   "seed": seeds.float()}
            return self._describe(images, out, sources=None)

    def fixed_samples(self) -> Tensor:
        with torch.no_grad():
            was_training = self.generator.training
            self.generator.eval()
            images = self(self.fixed_noise, self.fixed_labels if self.num_classes else None)
            self.generator.train(was_training)
        return images
