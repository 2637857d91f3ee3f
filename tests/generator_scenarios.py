"""Generator training under DDP, run as a script (Lightning launches the other rank).

    python -m tests.generator_scenarios --kind shift --devices 2 --members m0.ckpt m1.ckpt --out result.pt \
        [--steps 3] [--resume last.ckpt]

``--steps``: training steps in all (a resumed run included); each is a D and a G optimiser step, so the run
ends at ``global_step == 2 * steps``.

Trains a few steps on the Fashion-MNIST demo data (32 px, known classes) with the regularisers on (a random
LPIPS backbone, asked for by name; a 2-member ensemble), then every rank saves its generator and
discriminator weights and global step, at the start of training (after a resume's restore) and at the end,
so a test can check that the ranks hold identical weights and that a resume continues from the checkpoint.
Every rank also saves the randomness of each of its training steps (the near-OOD generator's latent ``z``,
the shift generator's dropout masks, with the step index) and what DDP was told to leave alone (the names
it ignores, the buffers it broadcasts every step), so a test can check that the ranks train on different
fakes and that the frozen scorers are never broadcast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytorch_lightning as pl
import torch

from datamodules import FashionMNISTOpenSetDataModule
from lightning_modules.generated.generators import NearOODGenerator, ShiftGenerator


def networks(module: pl.LightningModule) -> dict[str, torch.Tensor]:
    """Copies of the generator's and the discriminator's parameters and buffers."""
    return {k: v.detach().clone() for k, v in module.state_dict().items() if k.startswith(("generator.", "discriminator."))}


class StartState(pl.Callback):
    """The weights and global step a rank starts training from (a resumed run: those restored)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.weights, self.global_step = networks(pl_module), trainer.global_step


class StepRandomness(pl.Callback):
    """Per training step: its index, the generator's input ``z`` (near-OOD) or the first dropout layer's
    mask (shift); and DDP's view of the module (the names it ignores, the buffers it broadcasts)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.draws: list[torch.Tensor] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if isinstance(pl_module, NearOODGenerator):
            self.handle = pl_module.generator.register_forward_pre_hook(
                lambda module, args: self.draws.append(args[0].detach().clone()))
        else:
            dropout = next(m for m in pl_module.generator.modules() if isinstance(m, torch.nn.Dropout))
            self.handle = dropout.register_forward_hook(
                lambda module, args, output: self.draws.append((output == 0).detach().clone()))
        ddp = trainer.strategy.model
        self.ignored = sorted(getattr(ddp, "parameters_to_ignore", ()))
        self.broadcast = sorted(getattr(ddp, "named_module_buffers", {}))
        self.broadcast_buffers = bool(getattr(ddp, "broadcast_buffers", False))
        self.frozen = sorted(name for name, _ in [*pl_module.named_parameters(), *pl_module.named_buffers()]
                             if name.startswith(("ensemble.", "perceptual.")))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object,
                             batch_idx: int) -> None:
        self.steps.append(trainer.global_step // 2)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.handle.remove()
        ddp = trainer.strategy.model  # the buffers a forward synchronised (re-collected at every forward)
        self.broadcast = sorted(set(self.broadcast) | set(getattr(ddp, "named_module_buffers", {})))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=("shift", "near_ood"), required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--members", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0)
    data = FashionMNISTOpenSetDataModule(train_negatives="exclude", image_size=32, max_train_per_class=24, batch_size=8)
    cls = ShiftGenerator if args.kind == "shift" else NearOODGenerator
    model = cls(ensemble=args.members, lpips_net="alex", lpips_random_backbone=True, base_width=8,
                allow_weak_ensemble=True)  # members of a few steps: below any quality bar
    out = Path(args.out)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=out.parent / "checkpoints", save_last=True)
    start, randomness = StartState(), StepRandomness()
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp_find_unused_parameters_true" if args.devices > 1 else "auto",
                         max_steps=2 * args.steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, callbacks=[checkpoint, start, randomness])
    trainer.fit(model, datamodule=data, ckpt_path=args.resume)
    torch.save({"weights": networks(model), "global_step": trainer.global_step, "start_weights": start.weights,
                "start_global_step": start.global_step, "steps": randomness.steps, "draws": randomness.draws,
                "ddp_ignored": randomness.ignored, "ddp_broadcast": randomness.broadcast,
                "ddp_broadcast_buffers": randomness.broadcast_buffers, "frozen": randomness.frozen,
                "batch_size": data.batch_size, "latent_dim": getattr(model, "latent_dim", None)},
               out.with_suffix(f".rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main()
