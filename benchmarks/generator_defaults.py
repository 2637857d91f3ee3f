"""The near-OOD generator's two measured defaults, on the Fashion-MNIST demo.

1. The LPIPS pairing of ``G(z)`` with the batch's real images: ``random`` (an unbiased estimate of the
   expected distance to the data, minimised by one image close to all of them) against ``nearest`` (the
   perceptually nearest real image of the batch). Measured by the spread of the samples: the mean pairwise
   LPIPS of 64 fixed samples (off the diagonal), next to that of 64 real images.
2. Lazy regularisation under Adam: LPIPS and MI on every step (``regularise_every`` k = 1) against every 4th
   step with 4x the weights (k = 4, the demo's budget setting). Adam normalises each parameter's step by its
   running gradient scale, so k-times larger, k-times rarer regulariser gradients are not the k = 1
   objective; measured by the final MI and LPIPS of the samples.

Every run is the demo's near-OOD configuration (``configs/generators/fashion_near_ood.yaml``: DCGAN at
32 px, width 16, batch 64, λ_p 1, λ_s 10, the random-AlexNet LPIPS the demo asks for by name, since no
ImageNet backbone weights are available offline) against the demo's ensemble (``configs/ensemble/
fashion_mnist.yaml`` trained by ``train.py ensemble``), with fewer training steps than the demo's 250 (a
CPU budget, ``--steps``), the same seed for every run; only the pairing and k change. The plain GAN
(λ_p = λ_s = 0) with the same budget is the reference.

    python -m benchmarks.generator_defaults [--tiny] [--write] [--steps 150] [--members 5] [--seeds 0 1]

``--seeds``: every case is trained once per seed (initialisation, data order, noise), and the table gives
each seed's value and their mean: one seed's differences between cases are of the size of the differences
between seeds. The ensemble is always the one of seed 0, so that every run is judged alike. About 2 minutes a
seed on 2 unloaded CPU cores (the ensemble once, then five runs of 150 steps).
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from benchmarks.common import (
    benchmark_parser,
    finish,
    load_average,
    machine,
    parse,
    quiet,
    table,
    training_config,
)
from datamodules import FashionMNISTOpenSetDataModule
from lightning_modules.generated.generators import NearOODGenerator
from metrics.ensemble import mutual_information_from_logits

SECTION = "Generated benchmarks: the near-OOD pairing and lazy regularisation, measured"
ROOT = Path(__file__).resolve().parents[1]
GENERATOR_CONFIG = ROOT / "configs" / "generators" / "fashion_near_ood.yaml"
ENSEMBLE_CONFIG = ROOT / "configs" / "ensemble" / "fashion_mnist.yaml"
# (name, pairing, regularise_every, regularised): the 2 x 2 grid, then the plain GAN
CASES = (("random, k = 1", "random", 1, True), ("nearest, k = 1", "nearest", 1, True),
         ("random, k = 4", "random", 4, True), ("nearest, k = 4", "nearest", 4, True),
         ("plain GAN", "random", 1, False))


def train_members(folder: Path, *, count: int, tiny: bool) -> Path:
    """The demo's ensemble (``train.py ensemble`` with the demo's member config); the members file."""
    import train

    argv = ["--members", str(count), "--seed", "0", "--out-dir", str(folder), "--config", str(ENSEMBLE_CONFIG),
            "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    if tiny:
        # one batch per epoch, so that each of the 2 steps ends an epoch and validates (the checkpoint monitors it)
        argv += ["--trainer.max_steps=2", "--data.init_args.max_train_per_class=8"]
    saved_argv = sys.argv
    sys.argv = ["train.py"]  # LightningCLI reads the program name from it
    try:
        train.train_ensemble(argv)
    finally:
        sys.argv = saved_argv
    return folder / "ensemble.txt"


def demo_settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and data ``init_args`` of the demo's near-OOD config."""
    config = training_config(GENERATOR_CONFIG)
    return config.model.init_args.as_dict(), config.data.init_args.as_dict()


def mean_pairwise(module: NearOODGenerator, images: Tensor) -> float:
    """Mean LPIPS over the ``n (n - 1)`` ordered pairs of distinct images (the spread of a set)."""
    with torch.no_grad():
        distances = module.perceptual.pairwise(images, images)
    count = images.shape[0]
    return float(distances.sum() - distances.diagonal().sum()) / (count * (count - 1))


def describe(module: NearOODGenerator, perceptual: Any, samples: Tensor, references: Tensor) -> dict[str, float]:
    """Mean MI of the ensemble on the samples and their mean LPIPS to the nearest reference image."""
    with torch.no_grad():
        mi = mutual_information_from_logits(module.ensemble_logits(samples).float(),
                                            background=module.ensemble.background)
        nearest = perceptual.nearest(samples, references)[1]
    return {"mi": float(mi.mean()), "lpips_nearest": float(nearest.mean())}


def run_case(name: str, pairing: str, k: int, regularised: bool, *, model_args: dict[str, Any],
             data_args: dict[str, Any], steps: int, samples: int, references: Tensor, judge: NearOODGenerator,
             seed: int = 0) -> dict[str, Any]:
    """Train one generator for ``steps`` training steps; its samples' spread, MI and LPIPS."""
    pl.seed_everything(seed, verbose=False)
    args = {**model_args, "pairing": pairing, "regularise_every": k}
    if not regularised:
        args.update(lambda_perceptual=0.0, lambda_semantic=0.0, ensemble=None)
    module = NearOODGenerator(**args)
    weights: list[float] = []
    schedule = module.regularisation_weight
    module.regularisation_weight = lambda step: weights.append(schedule(step)) or weights[-1]  # type: ignore[method-assign]
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2 * steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    start = time.perf_counter()
    trainer.fit(module, datamodule=FashionMNISTOpenSetDataModule(**data_args))
    seconds = time.perf_counter() - start
    module.eval()
    with torch.no_grad():
        fixed = module.fixed_samples()[:samples]  # the same 64 latents for every run
        drawn = module(module.latent(torch.arange(4 * samples)))
    # every run is judged by the same ensemble and LPIPS (the plain GAN has none of its own)
    described = describe(judge, judge.perceptual, drawn, references)
    return {"case": name, "pairing": pairing, "k": k, "regularised": regularised, "steps": steps,
            "regularised_steps": sum(1 for w in weights if w > 0) if regularised else 0,
            "spread": mean_pairwise(judge, fixed), **described, "seconds": seconds, "samples": fixed}


def per_seed(rows: list[dict[str, Any]], case: str, key: str) -> str:
    """``"a, b (mean m)"``: a case's values over the seeds, in seed order, and their mean."""
    values = [r[key] for r in rows if r["case"] == case]
    listed = ", ".join(f"{v:.4f}" for v in values)
    return listed if len(values) == 1 else f"{listed} (mean {sum(values) / len(values):.4f})"


def markdown(rows: list[dict[str, Any]], *, real_spread: float, steps: int, members: int, batch_size: int,
             samples: int, references: int, elapsed_s: float, seeds: Sequence[int] = (0,)) -> str:
    first = [r for r in rows if r["seed"] == seeds[0]]
    return "\n".join([
        f"The demo's near-OOD generator (`configs/generators/fashion_near_ood.yaml`: DCGAN 32 px, width 16, batch "
        f"{batch_size}, λ_p 1, λ_s 10, LPIPS with a random AlexNet backbone, asked for by name) trained for {steps} "
        f"training steps (the demo: 400) against the demo's ensemble of {members} members; every case once per seed ({', '.join(map(str, seeds))}; each "
        "cell lists the seeds' values in that order). "
        f"Spread: mean pairwise LPIPS of {samples} fixed samples (the same latents in every run; distinct pairs); "
        f"MI: the ensemble's mean mutual information on {4 * samples} samples; LPIPS to data: their mean LPIPS to "
        f"the nearest of {references} real training images. Every column is measured with the training ensemble "
        "and LPIPS. Training times are wall times on a shared machine (other processes skew them).",
        "",
        table(["run", "regularised steps", f"spread (real images: {real_spread:.4f})", "MI", "LPIPS to data",
               "training (s)"],
              [(r["case"], f"{r['regularised_steps']} / {r['steps']}", per_seed(rows, r["case"], "spread"),
                per_seed(rows, r["case"], "mi"), per_seed(rows, r["case"], "lpips_nearest"),
                f"{sum(x['seconds'] for x in rows if x['case'] == r['case']):.0f}") for r in first]),
        "",
        f"Machine: {machine()}; load {load_average()}; {elapsed_s:.0f} s in all.",
    ])


def reference_images(data_args: dict[str, Any], count: int) -> Tensor:
    """``count`` training images, a seeded class-balanced choice (the train set is not class-sorted, but the
    choice must not depend on its order)."""
    data = FashionMNISTOpenSetDataModule(**data_args)
    data.setup("fit")
    by_class: dict[int, list[int]] = {}
    for index in torch.randperm(len(data.train_set), generator=torch.Generator().manual_seed(0)).tolist():
        by_class.setdefault(int(data.train_set[index].target), []).append(index)
        if sum(map(len, by_class.values())) >= 8 * count:
            break
    classes = sorted(by_class)
    chosen = [by_class[c][i] for i in range(count) for c in classes if i < len(by_class[c])][:count]
    return torch.stack([data.train_set[i].image for i in chosen])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the five cases, print the table and, with ``--write``, put it in RESULTS.md.

    Returns:
        ``rows`` (one dict per seed and case, in that order, with its ``seed`` and ``samples``), ``real_spread``, ``real`` (the real images it is
        measured on), ``judge`` (the module whose ensemble and LPIPS measured every run), ``steps``,
        ``members`` and ``expected_regularised`` (k -> the training steps that apply the regularisers).
    """
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 150; tiny 4)")
    parser.add_argument("--members", type=int, default=None, help="ensemble members (default 5, the demo's; tiny 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="seeds of the generators' runs (default 0 1; tiny 0; the ensemble's is always 0)")
    args = parse(parser, argv)
    steps = args.steps or (4 if args.tiny else 150)
    members = args.members or (2 if args.tiny else 5)
    seeds = args.seeds or ([0] if args.tiny else [0, 1])
    if steps < 1 or members < 1:
        parser.error(f"--steps and --members must be positive, got {steps} and {members}")
    if min(seeds) < 0 or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must be distinct and >= 0, got {seeds}")
    samples, references = (8, 16) if args.tiny else (64, 256)
    model_args, data_args = demo_settings()
    if args.tiny:
        model_args.update(base_width=8, latent_dim=16)
        model_args["allow_weak_ensemble"] = True  # the tiny ensemble's 2 steps are below any quality bar
        data_args.update(batch_size=8, max_train_per_class=8)
    start = time.perf_counter()
    threads = torch.get_num_threads()
    with quiet(), tempfile.TemporaryDirectory() as folder:
        warnings.filterwarnings("ignore", message=".*RANDOM backbone.*")
        warnings.filterwarnings("ignore", message=".*val_dataloader.*")
        warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode.*")  # the frozen scorers
        model_args["ensemble"] = str(train_members(Path(folder) / "ensemble", count=members, tiny=args.tiny))
        torch.set_num_threads(threads)
        pl.seed_everything(0, verbose=False)
        judge = NearOODGenerator(**model_args)
        real = reference_images(data_args, references)
        real_subset = real[torch.randperm(references, generator=torch.Generator().manual_seed(1))[:samples]]
        real_spread = mean_pairwise(judge, real_subset)
        rows = []
        for seed in seeds:
            for name, pairing, k, regularised in CASES:
                rows.append({"seed": seed, **run_case(name, pairing, k, regularised, model_args=model_args,
                                                      data_args=data_args, steps=steps, samples=samples,
                                                      references=real, judge=judge, seed=seed)})
                row = rows[-1]
                print(f"seed {seed}, {name}: spread {row['spread']:.4f}, MI {row['mi']:.4f}, LPIPS "
                      f"{row['lpips_nearest']:.4f} ({row['seconds']:.0f} s)", flush=True)
    body = markdown(rows, real_spread=real_spread, steps=steps, members=members, batch_size=data_args["batch_size"],
                    samples=samples, references=references, elapsed_s=time.perf_counter() - start, seeds=seeds)
    finish(args, SECTION, body, script="benchmarks.generator_defaults")
    return {"rows": rows, "real_spread": real_spread, "real": real_subset, "judge": judge,
            "steps": steps, "members": members, "seeds": seeds, "expected_regularised": {k: math.ceil(steps / k) for k in (1, 4)}}


if __name__ == "__main__":
    main()
