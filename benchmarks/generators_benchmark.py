"""The generated benchmarks' hot paths, each side by side with its reference in the same run.

1. Ensemble forward, M = 5: ``DeepEnsemble`` (one vmapped call over stacked members) against a Python loop
   over the 5 member networks, the same inputs; for the demo's small CNN and for ResNet-18 members.
2. One training step of each regularised generator against the same step of the plain one (λ = 0), with
   the share of the step spent in LPIPS and in the ensemble (their forward and backward, measured by
   timing the step with each of them switched off in turn).

    python -m benchmarks.generators_benchmark [--no-write]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from benchmarks.common import best_time, machine, write_section


def members(kind: str, count: int) -> list[nn.Module]:
    from lightning_modules import OpenSetClassifier

    nets = []
    for seed in range(count):
        torch.manual_seed(seed)
        if kind == "small_cnn":
            model = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1)
        else:
            model = OpenSetClassifier(num_classes=10, backbone="torchvision:resnet18")
        nets.append(model.network.eval())
    return nets


def ensemble_forward() -> str:
    from lightning_modules.nets.ensemble import DeepEnsemble

    lines = ["| members | input | `vmap` (s) | loop over the member networks (s) | `DeepEnsemble` default here (s) "
             "| loop / vmap | default / vmap | max abs difference |", "|---|---|---|---|---|---|---|---|"]
    for kind, images in (("small_cnn", torch.rand(256, 1, 28, 28)), ("resnet18", torch.rand(16, 3, 112, 112))):
        nets = members(kind, 5)
        ensemble = DeepEnsemble(nets, batched=True)  # the vmap path
        default = DeepEnsemble(nets)  # on the CPU: cached channels-last member modules
        with torch.no_grad():
            batched = best_time(lambda e=ensemble, x=images: e(x))
            loop = best_time(lambda n=nets, x=images: [m(x)[0] for m in n])
            chosen = best_time(lambda e=default, x=images: e(x))
            reference = torch.stack([m(images)[0] for m in nets])
            difference = max((ensemble(images) - reference).abs().max().item(),
                             (default(images) - reference).abs().max().item())
        lines.append(f"| 5 x {kind} | {tuple(images.shape)} | {batched:.4f} | {loop:.4f} | {chosen:.4f} "
                     f"| {loop / batched:.2f}x | {chosen / batched:.2f}x | {difference:.1e} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def step_time(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], steps: int = 3) -> float:
    """Best wall time of one discriminator + generator step of a generator module (no Trainer)."""
    from lightning_modules.generated.generators import NearOODGenerator

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


def generator_steps(member_paths: list[str]) -> str:
    from lightning_modules.generated.generators import NearOODGenerator, ShiftGenerator

    torch.manual_seed(0)
    batch = (torch.rand(32, 1, 32, 32), torch.zeros(32, dtype=torch.long))
    lines = ["| generator | plain step (s) | regularised step (s) | regularised / plain | LPIPS share | ensemble share |",
             "|---|---|---|---|---|---|"]
    for name, cls in (("shift (Pix2Pix)", ShiftGenerator), ("near-OOD (DCGAN)", NearOODGenerator)):
        common = {"base_width": 16, "lpips_net": "alex", "lpips_random_backbone": True}
        plain = step_time(cls(lambda_perceptual=0, lambda_semantic=0, **common), batch)
        full = step_time(cls(ensemble=member_paths, **common), batch)
        without_lpips = step_time(cls(ensemble=member_paths, lambda_perceptual=0, **common), batch)
        without_ensemble = step_time(cls(lambda_semantic=0, **common), batch)
        lpips_share = max(full - without_lpips, 0.0) / full
        ensemble_share = max(full - without_ensemble, 0.0) / full
        lines.append(f"| {name} | {plain:.3f} | {full:.3f} | {full / plain:.2f}x | {lpips_share:.0%} | "
                     f"{ensemble_share:.0%} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def train_members(folder: str) -> list[str]:
    from pathlib import Path

    from tests.conftest import train_demo_checkpoint

    return [str(train_demo_checkpoint(Path(folder) / f"m{i}", "softmax", steps=5, seed=i)) for i in range(5)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    import tempfile
    import warnings

    warnings.filterwarnings("ignore", message=".*RANDOM backbone.*")
    start = time.perf_counter()
    forward = ensemble_forward()
    with tempfile.TemporaryDirectory() as folder:
        steps = generator_steps(train_members(folder))
    body = "\n".join([
        "Ensemble forward, M = 5, eval mode, no gradients, same inputs, best of 3 after a warm-up: "
        "`DeepEnsemble(batched=True)` (one `vmap` over the stacked members), a Python loop over the 5 member "
        "networks as they were trained, and `DeepEnsemble`'s default on this device (`batched=None`: on the CPU the "
        "members one after the other as cached modules with channels-last convolution weights; on accelerators "
        "`vmap`, where one batched call saves M - 1 launches of every layer). Ratios below 1 are faster than `vmap`.",
        "",
        forward,
        "",
        "One discriminator + generator step at 32 px, batch 32, U-Net/DCGAN width 16, an ensemble of 5 demo CNNs "
        "(MI), LPIPS with an AlexNet backbone (random: no ImageNet weights on this machine; the cost is the same) — "
        "the regularised step against the plain one (λ_p = λ_s = 0), and the share of the regularised step spent in "
        "LPIPS and in the ensemble (the step time without each, against the full step), best of 3.",
        "",
        steps,
        "",
        f"Machine: {machine()}; {time.perf_counter() - start:.0f} s in all.",
    ])
    if not args.no_write:
        write_section("Generated benchmarks: ensemble forward and generator steps", body)
    print(body)


if __name__ == "__main__":
    main()
