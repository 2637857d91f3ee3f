"""The generated benchmarks' hot paths, each side by side with its reference in the same run.

1. Ensemble forward, M = 5: ``DeepEnsemble`` (one vmapped call over stacked members) against a Python loop
   over the 5 member networks, the same inputs; for the demo's small CNN and for ResNet-18 members.
2. One training step of each regularised generator against the same step of the plain one (λ = 0), with
   the share of the step spent in LPIPS and in the ensemble (their forward and backward, measured by
   timing the step with each of them switched off in turn).

    python -m benchmarks.generators_benchmark [--tiny] [--write]
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import benchmark_parser, best_time, finish, machine, parse, quiet, table
from lightning_modules import OpenSetClassifier
from lightning_modules.generated.generators import NearOODGenerator, ShiftGenerator
from lightning_modules.nets.ensemble import DeepEnsemble
from tests.conftest import train_demo_checkpoint

SECTION = "Generated benchmarks: ensemble forward and generator steps"


def members(kind: str, count: int) -> list[nn.Module]:
    nets = []
    for seed in range(count):
        torch.manual_seed(seed)
        if kind == "small_cnn":
            model = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1)
        else:
            model = OpenSetClassifier(num_classes=10, backbone="torchvision:resnet18")
        nets.append(model.network.eval())
    return nets


def ensemble_forward(*, members_count: int, small_batch: int, resnet_batch: int, resnet_size: int,
                     repeat: int) -> list[dict[str, Any]]:
    """``vmap``, the loop over the member networks and ``DeepEnsemble``'s default, on the same inputs."""
    rows = []
    for kind, images in (("small_cnn", torch.rand(small_batch, 1, 28, 28)),
                         ("resnet18", torch.rand(resnet_batch, 3, resnet_size, resnet_size))):
        nets = members(kind, members_count)
        ensemble = DeepEnsemble(nets, batched=True)  # the vmap path
        default = DeepEnsemble(nets)  # on the CPU: cached channels-last member modules
        with torch.no_grad():
            batched = best_time(lambda e=ensemble, x=images: e(x), repeat=repeat)
            loop = best_time(lambda n=nets, x=images: [m(x)[0] for m in n], repeat=repeat)
            chosen = best_time(lambda e=default, x=images: e(x), repeat=repeat)
            reference = torch.stack([m(images)[0] for m in nets])
            difference = max((ensemble(images) - reference).abs().max().item(),
                             (default(images) - reference).abs().max().item())
        rows.append({"members": members_count, "kind": kind, "input": tuple(images.shape), "vmap_s": batched,
                     "loop_s": loop, "default_s": chosen, "difference": difference})
        print(f"{members_count} x {kind}: vmap {batched:.4f}s, loop {loop:.4f}s, default {chosen:.4f}s", flush=True)
    return rows


def step_time(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], steps: int = 3) -> float:
    """Best wall time of one discriminator + generator step of a generator module (no Trainer)."""
    optimizer_g, optimizer_d = module.configure_optimizers()
    images, labels = batch

    def one() -> None:
        if isinstance(module, NearOODGenerator):
            z = torch.randn(images.shape[0], module.latent_dim)
            fake = module(z)
            loss_d = module.discriminator_step_loss(images, None, fake, None)
        else:
            fake = module.generator(images)
            loss_d = module.discriminator_step_loss(images, fake)
        optimizer_d.zero_grad(set_to_none=True)
        loss_d.backward()
        optimizer_d.step()
        if isinstance(module, NearOODGenerator):
            loss_g, _ = module.generator_step_loss(images, fake, None)
        else:
            loss_g, _ = module.generator_step_loss(images, fake)
        optimizer_g.zero_grad(set_to_none=True)
        loss_g.backward()
        optimizer_g.step()

    return best_time(one, repeat=steps)


def generator_steps(member_paths: list[str], *, batch_size: int, repeat: int) -> list[dict[str, Any]]:
    """Each generator's plain step, its regularised step, and the regularised step without LPIPS and without
    the ensemble in turn."""
    torch.manual_seed(0)
    batch = (torch.rand(batch_size, 1, 32, 32), torch.zeros(batch_size, dtype=torch.long))
    rows = []
    for name, cls in (("shift (Pix2Pix)", ShiftGenerator), ("near-OOD (DCGAN)", NearOODGenerator)):
        common = {"base_width": 16, "lpips_net": "alex", "lpips_random_backbone": True}
        plain = step_time(cls(lambda_perceptual=0, lambda_semantic=0, **common), batch, steps=repeat)
        full = step_time(cls(ensemble=member_paths, **common), batch, steps=repeat)
        without_lpips = step_time(cls(ensemble=member_paths, lambda_perceptual=0, **common), batch, steps=repeat)
        without_ensemble = step_time(cls(lambda_semantic=0, **common), batch, steps=repeat)
        rows.append({"generator": name, "plain_s": plain, "regularised_s": full,
                     "lpips_share": max(full - without_lpips, 0.0) / full,
                     "ensemble_share": max(full - without_ensemble, 0.0) / full})
        print(f"{name}: plain {plain:.3f}s, regularised {full:.3f}s", flush=True)
    return rows


def train_members(folder: str, count: int) -> list[str]:
    """``count`` demo CNN checkpoints (a few steps each: the cost of a step does not depend on the weights)."""
    return [str(train_demo_checkpoint(Path(folder) / f"m{i}", "softmax", steps=5, seed=i)) for i in range(count)]


def markdown(forward: list[dict[str, Any]], steps: list[dict[str, Any]], *, members_count: int, batch_size: int,
             repeat: int, elapsed_s: float) -> str:
    return "\n".join([
        f"Ensemble forward, M = {members_count}, eval mode, no gradients, same inputs, best of {repeat} after a "
        "warm-up: `DeepEnsemble(batched=True)` (one `vmap` over the stacked members), a Python loop over the "
        "member networks as they were trained, and `DeepEnsemble`'s default on this device (`batched=None`: on "
        "the CPU the members one after the other as cached modules with channels-last convolution weights; on "
        "accelerators `vmap`). Ratios below 1 are faster than `vmap`.",
        "",
        table(["members", "input", "`vmap` (s)", "loop over the member networks (s)", "`DeepEnsemble` default here (s)",
               "loop / vmap", "default / vmap", "max abs difference"],
              [(f"{r['members']} x {r['kind']}", r["input"], f"{r['vmap_s']:.4f}", f"{r['loop_s']:.4f}",
                f"{r['default_s']:.4f}", f"{r['loop_s'] / r['vmap_s']:.2f}x", f"{r['default_s'] / r['vmap_s']:.2f}x",
                f"{r['difference']:.1e}") for r in forward]),
        "",
        f"One discriminator + generator step at 32 px, batch {batch_size}, U-Net/DCGAN width 16, an ensemble of "
        f"{members_count} demo CNNs (MI), LPIPS with an AlexNet backbone (random: no ImageNet weights here; the "
        "cost is the same), best of "
        f"{repeat}: the regularised step against the plain one (λ_p = λ_s = 0), and the share of the regularised "
        "step spent in LPIPS and in the ensemble (the step time without each, against the full step).",
        "",
        table(["generator", "plain step (s)", "regularised step (s)", "regularised / plain", "LPIPS share",
               "ensemble share"],
              [(r["generator"], f"{r['plain_s']:.3f}", f"{r['regularised_s']:.3f}",
                f"{r['regularised_s'] / r['plain_s']:.2f}x", f"{r['lpips_share']:.0%}", f"{r['ensemble_share']:.0%}")
               for r in steps]),
        "",
        f"Machine: {machine()}; {elapsed_s:.0f} s in all.",
    ])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the tables and, with ``--write``, put them in RESULTS.md.

    Returns:
        ``forward`` (one dict per member kind) and ``steps`` (one dict per generator).
    """
    parser = benchmark_parser(__doc__, section=SECTION)
    args = parse(parser, argv)
    count, repeat = (2, 1) if args.tiny else (5, 3)
    batch_size = 4 if args.tiny else 32
    start = time.perf_counter()
    with quiet():
        warnings.filterwarnings("ignore", message=".*RANDOM backbone.*")
        forward = ensemble_forward(members_count=count, small_batch=16 if args.tiny else 256,
                                   resnet_batch=2 if args.tiny else 16, resnet_size=32 if args.tiny else 112,
                                   repeat=repeat)
        with tempfile.TemporaryDirectory() as folder:
            steps = generator_steps(train_members(folder, count), batch_size=batch_size, repeat=repeat)
    body = markdown(forward, steps, members_count=count, batch_size=batch_size, repeat=repeat,
                    elapsed_s=time.perf_counter() - start)
    finish(args, SECTION, body, script="benchmarks.generators_benchmark")
    return {"forward": forward, "steps": steps}


if __name__ == "__main__":
    main()
