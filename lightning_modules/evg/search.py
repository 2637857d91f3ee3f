"""Adversarial evaluation of OOD detectors: the chains as a LightningModule (EvG; Yoon et al., DESIGN.md §5.4).

:class:`Detector` turns any (model, κ) of this project -- a timm or torchvision classifier, a checkpoint, a
deep ensemble with its MI, a pytorch-ood detector wrapped as a κ -- into a black box: ``scores(images)`` is
κ (higher = more in-distribution) and ``energy(images)`` the standardised outlier score
``(-κ - μ) / (σ + 1e-3)`` with μ, σ from in-distribution **validation** images
(:func:`metrics.energy_standardisation`). No detector gradients are used by the search.

:class:`AdversarialSearch` runs, in ``predict_step``, every search of a batch of chains: for each detector,
variation model and sampler, the batched sampler of :mod:`lightning_modules.evg.samplers` from the chains' own
random generators, then the worst case of each chain scored by **every** detector (the transferability
matrix). Lightning spreads the batches of chains over the devices (without padding in prediction), and a
chain's result does not depend on its batch or process, so 2 processes give the 1-process results bit for bit.
The report is the job of :class:`callbacks.AdversarialReport`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor, nn

from lightning_modules.evg.samplers import SAMPLERS, SearchResult
from lightning_modules.evg.variations import PixelPerturbation
from lightning_modules.nets.ensemble import DeepEnsemble
from lightning_modules.scoring import load_scoring_network, penultimate_features, weights_fingerprint
from metrics import Kappa, energy_standardisation, get_kappa, standardised_energy


class Detector(nn.Module):
    """A (model, κ) pair as a black-box OOD detector.

    Args:
        network: the classifier (logits ``(N, C)``) or ensemble (``(M, N, C)``).
        kappa: the confidence function (a name of :data:`metrics.KAPPAS` or a :class:`metrics.Kappa`).
        name: how tables call it, e.g. ``demo-eos/softmax``.
        background: the network's last logit is a background class.
        kappa_args: keyword arguments of κ (e.g. ODIN's temperature).
        normalisation: ``(mean, std)`` per channel applied to ``[0, 1]`` images before the network (timm
            models' own normalisation; the project's checkpoints take raw ``[0, 1]`` images).
    """

    def __init__(self, network: nn.Module, kappa: str | Kappa, *, name: str, background: bool = False,
                 kappa_args: dict[str, Any] | None = None,
                 normalisation: tuple[Sequence[float], Sequence[float]] | None = None) -> None:
        super().__init__()
        self.network = network.eval().requires_grad_(False)
        if not isinstance(network, DeepEnsemble):  # its weights are stacked buffers, not modules
            # channels-last convolution weights: oneDNN (CPU) runs the demo's CNN about 1.6x faster with
            # them, and it is the fast layout of convolutions with mixed precision on GPUs
            self.network.to(memory_format=torch.channels_last)
        self.kappa = get_kappa(kappa) if isinstance(kappa, str) else kappa
        self.name, self.background = name, background
        self.kappa_args = self.kappa.parameters(**(kappa_args or {}))
        if normalisation is None:
            self.register_buffer("channel_mean", torch.zeros(0), persistent=False)
            self.register_buffer("channel_std", torch.zeros(0), persistent=False)
        else:
            self.register_buffer("channel_mean", torch.tensor(normalisation[0]).view(1, -1, 1, 1), persistent=False)
            self.register_buffer("channel_std", torch.tensor(normalisation[1]).view(1, -1, 1, 1), persistent=False)
        self.mean: float | None = None
        self.scale: float | None = None

    @classmethod
    def from_spec(cls, model: str, kappa: str, *, kappa_args: dict[str, Any] | None = None, pretrained: bool = True,
                  name: str | None = None) -> Detector:
        """A detector from a model name (``timm:<name>``, ``torchvision:<name>``, a ``.ckpt``, ``ensemble:...``)
        and a κ name; timm's normalisation is taken from the model's own evaluation transform."""
        network, transform, display, background = load_scoring_network(model, pretrained=pretrained)
        kappa_object = get_kappa(kappa)
        is_ensemble = model.startswith("ensemble:")
        if (kappa_object.kind == "ensemble") != is_ensemble:
            raise ValueError(f"confidence function {kappa!r} " + ("needs an ensemble model (ensemble:<members>)"
                             if not is_ensemble else f"scores one model; {model} is an ensemble"))
        return cls(network, kappa_object, name=name or f"{display}/{kappa}", background=background,
                   kappa_args=kappa_args, normalisation=transform_normalisation(transform))

    def fingerprint(self) -> str:
        return weights_fingerprint(self.network)

    def scores(self, images: Tensor) -> Tensor:
        """κ ``(N,)`` (float32) of images ``(N, C, H, W)`` in ``[0, 1]``."""
        if self.channel_mean.numel():
            images = (images - self.channel_mean) / self.channel_std
        kind = self.kappa.kind
        if kind == "model":  # e.g. ODIN: its own pass (with input gradients where it needs them)
            values = self.kappa(self.network, images, background=self.background, **self.kappa_args)
        else:
            with torch.no_grad():
                if kind == "features":
                    values = self.kappa(penultimate_features(self.network, images), background=self.background,
                                        **self.kappa_args)
                else:
                    logits = self.network(images)
                    expected = 3 if kind == "ensemble" else 2
                    if logits.ndim != expected:
                        raise ValueError(f"{self.name}: κ {self.kappa.name!r} takes "
                                         f"{'member logits (M, N, C)' if expected == 3 else 'logits (N, C)'}, "
                                         f"the model gives shape {tuple(logits.shape)}")
                    values = self.kappa(logits, background=self.background, **self.kappa_args)
        return values.detach().float()

    def fit_standardisation(self, id_validation_kappa: Tensor) -> None:
        """μ and σ + 1e-3 of ``-κ`` on in-distribution validation images (and nothing else)."""
        self.mean, self.scale = energy_standardisation(id_validation_kappa)

    def energy(self, images: Tensor) -> Tensor:
        if self.mean is None or self.scale is None:
            raise RuntimeError(f"{self.name}: fit_standardisation on ID validation scores before the search")
        return standardised_energy(self.scores(images), self.mean, self.scale)


def transform_normalisation(transform: Any) -> tuple[list[float], list[float]] | None:
    """The ``Normalize(mean, std)`` of a torchvision ``Compose`` (timm's eval transform), if it has one."""
    from torchvision import transforms as T

    for step in getattr(transform, "transforms", []):
        if isinstance(step, T.Normalize):
            return [float(m) for m in step.mean], [float(s) for s in step.std]
    return None


def search_pairs(variations: Sequence[str], samplers: Sequence[str]) -> list[tuple[str, str]]:
    """(variation, sampler) pairs to run: every pair, except that the l∞ sampler and the pixel perturbation
    only go together."""
    pairs = [(v, s) for v in variations for s in samplers if (v == "linf") == (s == "linf")]
    if not pairs:
        raise ValueError(f"no search to run with variations {list(variations)} and samplers {list(samplers)}")
    return pairs


class AdversarialSearch(pl.LightningModule):
    """The chains of the adversarial evaluation (see the module docstring).

    Args:
        detectors: name -> :class:`Detector` (standardised before ``predict``).
        variations: name -> variation model (:mod:`lightning_modules.evg.variations`); ``"linf"`` must be a
            :class:`PixelPerturbation`.
        samplers: name -> keyword arguments of that sampler of :data:`lightning_modules.evg.samplers.SAMPLERS`
            (e.g. ``{"mh": {"step_size": 0.1, "temperature": 1.0}, "random": {}}``).
        seed_images: ``(N_ood, C, H, W)`` OOD images in ``[0, 1]``; chain ``i`` varies image ``i mod N_ood``.
        steps: detector calls per chain (the authors' 2000).
        seed: the run's seed (each chain's generator is keyed by ``(seed, chain)``).
        trace_every: thin the energy traces to every this many steps.
    """

    def __init__(self, detectors: dict[str, Detector], variations: dict[str, nn.Module],
                 samplers: dict[str, dict[str, Any]], seed_images: Tensor, *, steps: int = 2000, seed: int = 0,
                 trace_every: int = 10) -> None:
        super().__init__()
        unknown = sorted(set(samplers) - set(SAMPLERS))
        if unknown:
            raise ValueError(f"unknown samplers {unknown}; choose from {sorted(SAMPLERS)}")
        if "linf" in variations and not isinstance(variations["linf"], PixelPerturbation):
            raise ValueError("the variation named 'linf' must be a PixelPerturbation")
        if seed_images.ndim != 4 or seed_images.shape[0] == 0:
            raise ValueError(f"seed_images must be (N >= 1, C, H, W), got {tuple(seed_images.shape)}")
        self.detectors = nn.ModuleDict(detectors)
        self.variations = nn.ModuleDict(variations)
        self.sampler_args = {name: dict(args or {}) for name, args in samplers.items()}
        self.pairs = search_pairs(list(variations), list(samplers))
        self.register_buffer("seed_images", seed_images.float(), persistent=False)
        self.steps, self.seed, self.trace_every = steps, seed, trace_every

    def seeds_of(self, chains: Tensor) -> Tensor:
        return self.seed_images[chains % self.seed_images.shape[0]]

    def search(self, detector: Detector, variation: nn.Module, sampler: str, chains: Tensor) -> SearchResult:
        """One sampler against one detector over one variation model, for a batch of chains."""
        seeds = self.seeds_of(chains) if variation.conditional else None

        def energy(points: Tensor) -> Tensor:
            return detector.energy(variation(points, seeds))

        return SAMPLERS[sampler](energy, variation.domain, chains, steps=self.steps, seed=self.seed,
                                 trace_every=self.trace_every, **self.sampler_args[sampler])

    def predict_step(self, batch: Tensor, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """``{"chains": (B,), "results": {(detector, variation, sampler): {...}}}`` for chain indices ``(B,)``."""
        chains = batch.to(self.device).long().view(-1)
        results: dict[tuple[str, str, str], dict[str, Tensor]] = {}
        started, total = time.perf_counter(), len(self.pairs) * len(self.detectors)
        for variation_name, sampler in self.pairs:
            variation = self.variations[variation_name]
            seeds = self.seeds_of(chains) if variation.conditional else None
            for name, detector in self.detectors.items():
                found = self.search(detector, variation, sampler, chains)
                with torch.no_grad():
                    worst = variation(found.points, seeds)
                scored = {f"kappa/{other}": self.detectors[other].scores(worst).cpu() for other in self.detectors}
                results[(name, variation_name, sampler)] = {
                    "points": found.points.cpu(), "energy": found.energy.cpu(), "best_step": found.best_step.cpu(),
                    "start_energy": found.start_energy.cpu(), "acceptance": found.acceptance.cpu(),
                    "calls": torch.tensor(found.calls), "trace_steps": found.trace_steps.cpu(),
                    "trace_energy": found.trace_energy.cpu(), "trace_best": found.trace_best.cpu(), **scored,
                }
                rank_zero_info(f"chains {int(chains[0])}-{int(chains[-1])}: search {len(results)}/{total} "
                               f"({name}, {variation_name}, {sampler}) done, {time.perf_counter() - started:.0f} s")
        return {"chains": chains.cpu(), "results": results}
