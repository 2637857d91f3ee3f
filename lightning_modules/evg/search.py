"""The chains of EvG as a LightningModule (Yoon et al., *Evaluating Out-of-Distribution Detectors Through
Adversarial Generation of Outliers*; DESIGN.md §5.4).

:class:`EvGSearch` runs, in ``predict_step``, every search of a batch of chains: for each detector
(:class:`lightning_modules.evg.black_box.BlackBox`),
variation model and sampler, the batched sampler of :mod:`lightning_modules.evg.samplers` from the chains' own
random generators, then the worst case of each chain scored by **every** detector (the transferability
matrix). :meth:`callbacks.EvGReport.run_chains` spreads the batches of chains over the processes (rank ``r``
of ``W`` runs batches ``r, r + W, ...``), and a chain's random numbers do not depend on its batch or process,
so 2 processes give the 1-process results bit for bit wherever the detectors' outputs are the same (float32
outputs may differ in their last bits with the batch). The report is the job of :class:`callbacks.EvGReport`.

Its fitted state is its detectors' energy standardisation (buffers), set by one explicit call,
:meth:`EvGSearch.fit_standardisation`, before the search; a search with an unfitted detector is refused.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor, nn

from lightning_modules.evg.black_box import BlackBox
from lightning_modules.evg.samplers import SAMPLERS, SearchResult, budget_of
from lightning_modules.evg.variations import PixelPerturbation


def search_pairs(variations: Sequence[str], samplers: Sequence[str]) -> list[tuple[str, str]]:
    """(variation, sampler) pairs to run: every pair, except that the l∞ sampler and the pixel perturbation
    only go together."""
    pairs = [(v, s) for v in variations for s in samplers if (v == "linf") == (s == "linf")]
    if not pairs:
        raise ValueError(f"no search to run with variations {list(variations)} and samplers {list(samplers)}")
    return pairs


class EvGSearch(pl.LightningModule):
    """The chains of the adversarial evaluation (see the module docstring).

    Args:
        detectors: name -> :class:`BlackBox` (standardised by :meth:`fit_standardisation` before ``predict``).
        variations: name -> variation model (:mod:`lightning_modules.evg.variations`); ``"linf"`` must be a
            :class:`PixelPerturbation`.
        samplers: name -> keyword arguments of that sampler of :data:`lightning_modules.evg.samplers.SAMPLERS`
            (e.g. ``{"mh": {"step_size": 0.1, "temperature": 1.0}, "random": {}}``).
        seed_images: ``(N_ood, C, H, W)`` OOD images in ``[0, 1]``; chain ``i`` varies image ``i mod N_ood``.
        steps: detector calls per chain (the authors' 2000).
        seed: the run's seed (each chain's generator is keyed by ``(seed, chain)``).
        trace_every: thin the energy traces to every this many steps.
    """

    def __init__(self, detectors: dict[str, BlackBox], variations: dict[str, nn.Module],
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

    def fit_standardisation(self, id_kappa: dict[str, Tensor]) -> None:
        """Fit every detector's energy standardisation on its in-distribution scores (detector name -> κ)."""
        missing = sorted(set(self.detectors) - set(id_kappa))
        if missing:
            raise ValueError(f"no in-distribution scores for the detectors {missing}")
        for name, detector in self.detectors.items():
            detector.fit_standardisation(id_kappa[name])

    def standardisation(self) -> dict[str, tuple[float, float]]:
        """Detector name -> (μ, σ + 1e-3) of its energy."""
        return {name: (float(d.energy_mean), float(d.energy_scale)) for name, d in self.detectors.items()}

    def check_standardised(self) -> None:
        """Refuse a search with a detector whose energy standardisation is not fitted."""
        unfitted = [name for name, detector in self.detectors.items() if not detector.standardised]
        if unfitted:
            raise RuntimeError(f"the detectors {unfitted} have no energy standardisation: call fit_standardisation "
                               "with their in-distribution scores before the search")

    def on_predict_start(self) -> None:
        self.check_standardised()

    def seeds_of(self, chains: Tensor) -> Tensor:
        return self.seed_images[chains % self.seed_images.shape[0]]

    def search(self, detector: BlackBox, variation: nn.Module, sampler: str, chains: Tensor) -> SearchResult:
        """One sampler against one detector over one variation model, for a batch of chains."""
        seeds = self.seeds_of(chains) if variation.conditional else None

        def energy(points: Tensor) -> Tensor:
            return detector.energy(variation(points, seeds))

        # the l-infinity baseline has its own budget (budget_of) and keeps its state image in [0, 1]
        extra: dict[str, Any] = budget_of(sampler, self.steps)
        if isinstance(variation, PixelPerturbation) and sampler == "linf":
            extra.update(zip(("low", "high"), variation.state_bounds(seeds), strict=True))
        return SAMPLERS[sampler](energy, variation.domain, chains, seed=self.seed, trace_every=self.trace_every,
                                 **extra, **self.sampler_args[sampler])

    def predict_step(self, batch: Tensor, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """``{"chains": (B,), "results": {(detector, variation, sampler): {...}}}`` for chain indices ``(B,)``."""
        chains = batch.to(self.device).long().view(-1)
        results: dict[tuple[str, str, str], dict[str, Tensor]] = {}
        started, total = time.perf_counter(), len(self.pairs) * len(self.detectors)
        for variation_name, sampler in self.pairs:
            variation = self.variations[variation_name]
            seeds = self.seeds_of(chains) if variation.conditional else None
            for name, detector in self.detectors.items():
                result = self.search(detector, variation, sampler, chains)
                with torch.no_grad():
                    worst = variation(result.points, seeds)
                scored = {f"kappa/{other}": self.detectors[other].scores(worst).cpu() for other in self.detectors}
                results[(name, variation_name, sampler)] = {
                    "points": result.points.cpu(), "energy": result.energy.cpu(), "best_step": result.best_step.cpu(),
                    "start_energy": result.start_energy.cpu(), "acceptance": result.acceptance.cpu(),
                    "calls": torch.tensor(result.calls), "trace_steps": result.trace_steps.cpu(),
                    "trace_energy": result.trace_energy.cpu(), "trace_best": result.trace_best.cpu(),
                    "nan_proposals": result.nan_proposals.cpu(), **scored,
                }
                rank_zero_info(f"chains {int(chains[0])}-{int(chains[-1])}: search {len(results)}/{total} "
                               f"({name}, {variation_name}, {sampler}) done, {time.perf_counter() - started:.0f} s")
        return {"chains": chains.cpu(), "results": results}


AdversarialSearch = EvGSearch  # the name of before, kept for one release
