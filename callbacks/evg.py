"""The report of the adversarial evaluation of OOD detectors (EvG; Yoon et al., DESIGN.md §5.4).

:class:`AdversarialReport` runs around ``trainer.predict`` of an :class:`lightning_modules.evg.AdversarialSearch`:

1. ``on_predict_start``: κ of every detector on the ID validation, ID test and clean OOD images (passes
   sharded over the devices, every rank joins every gather, cached on disk per model weights, κ and image
   files), and each detector's energy standardised on its **ID validation** scores.
2. ``on_predict_batch_end``: the results of a batch of chains are written at once (atomically) to
   ``chains/<run key>/chains-<first>-<last>.pt``; a resumed run with the same detectors, data, variation
   models, samplers and seed skips the batches found there (:meth:`done`).
3. ``on_predict_end`` (global rank zero, after every rank finished): per (detector, variation model, sampler)
   the clean AUROC (ID test vs the unmodified OOD test images), the worst-case AUROC (ID test vs each
   chain's lowest-energy image), MinRank of both, the acceptance rate and the step at which each chain
   found its minimum; the transferability matrices (worst cases found against detector A scored by
   detector B); ``results.csv`` / ``.md``, ``transfer_<variation>_<sampler>.csv`` / ``.md`` / ``.png``,
   worst-case grids (seed image, then its worst case), energy traces, ``worst_cases.pt``; and the same to W&B.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor

from callbacks.generated import markdown_table
from callbacks.plots import plot_energy_traces, plot_heatmap, save_image_grid
from callbacks.scoring import PredictionCache, sharded_outputs
from callbacks.severity import rows_to_csv, slug
from common import atomic_write_bytes, atomic_write_text, digest, tensors_fingerprint
from datamodules.evg import AdversarialData
from metrics import auroc, min_rank

RESULT_COLUMNS = ("detector", "variation", "sampler", "chains", "steps", "clean auroc", "worst-case auroc",
                  "clean min rank", "min rank", "id test images", "ood test images", "acceptance",
                  "mean step of minimum", "mean start energy", "mean lowest energy", "varied")
SPLITS = ("id_validation", "id_test", "ood")


def _variation_config(variation: torch.nn.Module) -> dict[str, Any]:
    config = {k: v for k, v in vars(variation).items() if not k.startswith("_") and k != "training"
              and isinstance(v, (int, float, str, tuple, list, bool))}
    weights = dict(variation.named_parameters()) | dict(variation.named_buffers())
    return {"class": type(variation).__name__, **config, "weights": tensors_fingerprint(weights) if weights else ""}


class AdversarialReport(pl.Callback):
    """See the module docstring.

    Args:
        data: the ID validation, ID test and OOD sets (:class:`datamodules.evg.AdversarialData`).
        chains: the number of chains of the run (the report checks that every one has a result).
        output_dir: where the tables, figures and chain results go.
        cache_dir: cache of the detectors' scores on the fixed sets (``None``: ``<output_dir>/cache``).
        plots: write and log figures.
        grid_chains: worst cases shown per grid (the lowest energies first).
    """

    def __init__(self, data: AdversarialData, *, chains: int, output_dir: str | Path, cache_dir: str | Path | None = None,
                 plots: bool = True, grid_chains: int = 32) -> None:
        self.data, self.chains = data, chains
        self.output_dir = Path(output_dir)
        self.cache = PredictionCache(cache_dir if cache_dir is not None else self.output_dir / "cache")
        self.plots, self.grid_chains = plots, grid_chains
        self.scores: dict[str, dict[str, Tensor]] = {}
        self.standardisation: dict[str, tuple[float, float]] = {}
        self.rows: list[dict[str, Any]] = []
        self.transfer: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
        self._started = 0.0

    # -- the run's identity and its finished batches ----------------------------------------------

    def run_key(self, module: Any) -> str:
        """A digest of everything a chain's result depends on (the same in every process)."""
        seeds = module.seed_images
        return digest({
            "detectors": {name: [d.fingerprint(), d.kappa.name, d.kappa_args, d.background,
                                 d.channel_mean.tolist(), d.channel_std.tolist()] for name, d in module.detectors.items()},
            "variations": {name: _variation_config(v) for name, v in module.variations.items()},
            "samplers": module.sampler_args, "pairs": module.pairs, "steps": module.steps, "seed": module.seed,
            "trace_every": module.trace_every, "seed_images": tensors_fingerprint({"seeds": seeds}),
            "id_validation": self.data.fingerprint("id_validation"),
        })

    def chain_dir(self, module: Any) -> Path:
        if not hasattr(self, "_chain_dir"):
            self._chain_dir = self.output_dir / "chains" / self.run_key(module)[:16]
        return self._chain_dir

    @staticmethod
    def _chain_file(directory: Path, first: int, stop: int) -> Path:
        return directory / f"chains-{first:07d}-{stop - 1:07d}.pt"

    def done(self, module: Any) -> Callable[[int, int], bool]:
        """``(first, stop) -> True`` when the batch of chains ``[first, stop)`` has a readable result."""
        directory = self.chain_dir(module)
        return lambda first, stop: self._read(self._chain_file(directory, first, stop)) is not None

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        if not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # a truncated file of an interrupted write cannot exist (atomic), but a foreign one can
            return None
        return payload if isinstance(payload, dict) and "chains" in payload and "results" in payload else None

    # -- hooks ------------------------------------------------------------------------------------

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.perf_counter()
        for name, detector in pl_module.detectors.items():
            self.scores[name] = {split: self._kappa(trainer, pl_module, detector, split) for split in SPLITS}
            detector.fit_standardisation(self.scores[name]["id_validation"])
            self.standardisation[name] = (detector.mean, detector.scale)
        self.chain_dir(pl_module).mkdir(parents=True, exist_ok=True)

    def _kappa(self, trainer: pl.Trainer, pl_module: pl.LightningModule, detector: Any, split: str) -> Tensor:
        dataset = self.data.sets[split]
        fingerprint = self.data.fingerprint(split)
        key = digest({"model": detector.fingerprint(), "kappa": detector.kappa.name, "args": detector.kappa_args,
                      "background": detector.background, "normalisation": detector.channel_mean.tolist(),
                      "data": fingerprint, "precision": str(trainer.precision)})
        name = f"{slug(detector.name)}-{split}"
        cached = self.cache.load_on_rank_zero(trainer, name, key, rows=len(dataset))
        if cached is not None:
            return cached["kappa"]
        outputs = sharded_outputs(trainer, dataset, lambda images: {"kappa": detector.scores(images)}, keys=["kappa"],
                                  batch_size=self.data.batch_size, num_workers=self.data.num_workers,
                                  device=pl_module.device)
        if trainer.is_global_zero:
            self.cache.save(name, key, outputs, {"detector": detector.name, "split": split})
        return outputs["kappa"]

    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        chains = outputs["chains"]
        first, stop = int(chains[0]), int(chains[-1]) + 1
        buffer = io.BytesIO()
        torch.save(outputs, buffer)
        atomic_write_bytes(self._chain_file(self.chain_dir(pl_module), first, stop), buffer.getvalue())
        rank_zero_info(f"chains {first}-{stop - 1}: {len(outputs['results'])} searches done "
                       f"({time.perf_counter() - self._started:.1f} s since the start)")

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.strategy.barrier()  # every rank's chain files are written
        if trainer.is_global_zero:
            self._report(trainer, pl_module)
        trainer.strategy.barrier()

    # -- the report -------------------------------------------------------------------------------

    def assemble(self, module: Any) -> dict[tuple[str, str, str], dict[str, Tensor]]:
        """Every chain's result, per (detector, variation, sampler), ordered by chain index."""
        parts = []
        for path in sorted(self.chain_dir(module).glob("chains-*.pt")):
            payload = self._read(path)
            if payload is None:
                raise RuntimeError(f"chain result {path} is unreadable; delete it and run again to recompute it")
            parts.append(payload)
        if not parts:
            raise RuntimeError(f"no chain results in {self.chain_dir(module)}")
        chains = torch.cat([p["chains"] for p in parts])
        order = torch.argsort(chains)
        if not torch.equal(chains[order], torch.arange(self.chains)):
            missing = sorted(set(range(self.chains)) - set(chains.tolist()))[:10]
            raise RuntimeError(f"chain results in {self.chain_dir(module)} cover {chains.numel()} chains, expected "
                               f"0..{self.chains - 1} once each (missing e.g. {missing})")
        assembled: dict[tuple[str, str, str], dict[str, Tensor]] = {}
        for combo in parts[0]["results"]:
            merged: dict[str, Tensor] = {}
            for key in parts[0]["results"][combo]:
                values = [p["results"][combo][key] for p in parts]
                if key == "calls":
                    merged[key] = values[0]
                elif key == "trace_steps":
                    merged[key] = values[0]
                elif key in ("trace_energy", "trace_best"):
                    merged[key] = torch.cat(values, dim=1)[:, order]
                else:
                    merged[key] = torch.cat(values)[order]
            assembled[combo] = merged
        return assembled

    def _report(self, trainer: pl.Trainer, module: Any) -> None:
        results = self.assemble(module)
        out = self.output_dir
        self.rows, self.transfer = [], {}
        for (detector, variation, sampler), result in results.items():
            scores = self.scores[detector]
            worst = result[f"kappa/{detector}"]
            self.rows.append({
                "detector": detector, "variation": variation, "sampler": sampler, "chains": int(worst.numel()),
                "steps": int(result["calls"]), "clean auroc": auroc(scores["id_test"], scores["ood"]),
                "worst-case auroc": auroc(scores["id_test"], worst),
                "clean min rank": min_rank(scores["id_test"], scores["ood"]), "min rank": min_rank(scores["id_test"], worst),
                "id test images": int(scores["id_test"].numel()), "ood test images": int(scores["ood"].numel()),
                "acceptance": float(result["acceptance"].double().mean()),
                "mean step of minimum": float(result["best_step"].double().mean()),
                "mean start energy": float(result["start_energy"].double().mean()),
                "mean lowest energy": float(result["energy"].double().mean()),
                "varied": ", ".join(module.variations[variation].active_parameters),
            })
            matrix = self.transfer.setdefault((variation, sampler), {})
            matrix[detector] = {other: auroc(self.scores[other]["id_test"], result[f"kappa/{other}"])
                                for other in module.detectors}
        atomic_write_text(out / "results.csv", rows_to_csv(self.rows, RESULT_COLUMNS))
        standardisation = "; ".join(f"{n}: mean {m:.4g}, scale {s:.4g}" for n, (m, s) in self.standardisation.items())
        atomic_write_text(out / "results.md", f"Energy standardisation on ID validation (-κ): {standardisation}\n\n"
                          + markdown_table(self.rows, RESULT_COLUMNS))
        names = list(module.detectors)
        figures: dict[str, Path] = {}
        for (variation, sampler), matrix in self.transfer.items():
            columns = ("searched against", *names)
            rows = [{"searched against": a, **{b: matrix[a][b] for b in names}} for a in matrix]
            stem = f"transfer_{slug(variation)}_{slug(sampler)}"
            atomic_write_text(out / f"{stem}.csv", rows_to_csv(rows, columns))
            atomic_write_text(out / f"{stem}.md", "Worst-case AUROC of the detector of each column on the worst "
                              "cases found against the detector of each row\n\n" + markdown_table(rows, columns))
            if self.plots:
                values = np.array([[matrix[a][b] for b in names] for a in matrix])
                figures[stem] = plot_heatmap(values, list(matrix), names, out / f"{stem}.png",
                                             title=f"transfer of worst cases: {variation}, {sampler}",
                                             row_label="searched against", column_label="scored by (AUROC)")
        buffer = io.BytesIO()
        torch.save({f"{d}|{v}|{s}": {k: r[k] for k in ("points", "energy", "best_step")} for (d, v, s), r
                    in results.items()}, buffer)
        atomic_write_bytes(out / "worst_cases.pt", buffer.getvalue())
        if self.plots:
            figures.update(self._figures(module, results))
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_table(key="adversarial/results", columns=list(RESULT_COLUMNS),
                                 data=[[_cell(row[c]) for c in RESULT_COLUMNS] for row in self.rows])
                for name, path in figures.items():
                    logger.log_image(key=f"adversarial/{name}", images=[str(path)])
        rank_zero_info(f"\nAdversarial evaluation written to {out}\n" + markdown_table(self.rows, RESULT_COLUMNS))

    def _figures(self, module: Any, results: dict[tuple[str, str, str], dict[str, Tensor]]) -> dict[str, Path]:
        figures: dict[str, Path] = {}
        traces: dict[tuple[str, str], dict[str, tuple[Tensor, Tensor, Tensor]]] = {}
        for (detector, variation, sampler), result in results.items():
            model = module.variations[variation]
            shown = torch.argsort(result["energy"])[: self.grid_chains]  # the most trusted worst cases first
            chains = shown.to(module.device)
            with torch.no_grad():
                points = result["points"][shown].to(module.device)
                seeds = module.seeds_of(chains) if model.conditional else None
                worst = model(points, seeds).cpu()
            # conditional models: each seed image next to its worst case
            images = torch.stack([seeds.cpu(), worst], dim=1).flatten(0, 1) if seeds is not None else worst
            stem = f"{slug(detector)}__{slug(variation)}__{slug(sampler)}"
            figures[f"grid/{stem}"] = save_image_grid(images, self.output_dir / "grids" / f"{stem}.png")
            if result["trace_steps"].numel():
                traces.setdefault((detector, variation), {})[sampler] = (
                    result["trace_steps"], result["trace_energy"], result["trace_best"])
        for (detector, variation), per_sampler in traces.items():
            stem = f"{slug(detector)}__{slug(variation)}"
            figures[f"trace/{stem}"] = plot_energy_traces(per_sampler, self.output_dir / "traces" / f"{stem}.png",
                                                          title=f"{detector}, {variation}")
        return figures


def _cell(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) else str(value)
