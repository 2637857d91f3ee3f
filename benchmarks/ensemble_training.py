"""Training the demo's deep ensemble: M sequential Lightning fits (``train.py ensemble``, what the demo runs)
side by side, in the same run, with the M members trained as one batched model and with M plain PyTorch loops.

Cases, each training M members of ``configs/ensemble/fashion_mnist.yaml`` (small CNN, SoftMax loss on the 4
known Fashion-MNIST classes, Adam with the config's lr and cosine schedule, its batch size and training images):

1. ``train.py ensemble`` (the reference): M ``fit`` runs in one process, member m seeded ``seed + m``; each
   with Lightning's sanity check, one validation epoch (γ for the checkpoint), its checkpoint, and the
   member's ID-test accuracy measured afterwards (the quality bar's measurement);
2. batched (``torch.func``): the M members' parameters stacked (``stack_module_state``), one ``vmap`` of
   ``functional_call`` over them (each member its own batch: its own seed for initialisation and data order),
   one Adam over the stacked parameters (Adam is elementwise: M independent Adams), the batch-norm running
   statistics updated per member inside ``vmap``;
3. M plain loops, one member after the other: the same steps as (2) without ``vmap``.

(2) and (3) train only (no validation, no checkpoint); every case's members are then scored on the 4,000
known-class ID test images by the same function (:func:`lightning_modules.ensemble_quality.known_class_accuracy`).
The cases alternate (``benchmarks.common.alternate``) so that a slow phase of the shared machine falls on all.

    python -m benchmarks.ensemble_training [--tiny] [--write] [--members 5] [--repeat 1]
"""

from __future__ import annotations

import copy
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, stack_module_state

from benchmarks.common import (
    alternate,
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
from lightning_modules import OpenSetClassifier
from lightning_modules.ensemble_quality import known_class_accuracy

SECTION = "Ensemble training: sequential Lightning fits against one batched model"
ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ensemble" / "fashion_mnist.yaml"
SEED = 0


def settings(*, tiny: bool) -> dict[str, Any]:
    """lr, cosine T_max, batch size and training images a class of the member config (tiny: a toy budget)."""
    config = training_config(CONFIG)
    model, data = config.model.init_args, config.data.init_args
    setting = {"lr": float(model.optimizer.init_args.lr), "t_max": int(model.lr_scheduler.init_args.T_max),
               "batch_size": int(data.batch_size), "max_train_per_class": data.max_train_per_class}
    if tiny:  # 4 x 32 training images in batches of 32: 4 steps
        setting.update(t_max=4, batch_size=32, max_train_per_class=40)
    return setting


def member(seed: int) -> OpenSetClassifier:
    """A member as ``train.py ensemble`` initialises it: the config's classifier built right after seeding."""
    pl.seed_everything(seed, verbose=False)
    return OpenSetClassifier(num_classes=4, loss="softmax", backbone="small_cnn", in_channels=1)


def training_tensors(setting: dict[str, Any]) -> tuple[Tensor, Tensor, FashionMNISTOpenSetDataModule]:
    """The training images in [0, 1] ``(N, 1, 28, 28)`` and labels of the config's datamodule, and the
    datamodule (its test split is what the members are scored on)."""
    data = FashionMNISTOpenSetDataModule(train_negatives="exclude", batch_size=setting["batch_size"], num_workers=0,
                                         max_train_per_class=setting["max_train_per_class"])
    data.setup("fit")
    data.setup("test")
    return data.train_set.images.float().div(255), data.train_set.labels, data


def batches(count: int, batch_size: int, seed: int) -> list[Tensor]:
    """One epoch of a member's data order: a permutation from its own seed, cut into batches (the last one
    partial, as a DataLoader without ``drop_last``)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return list(order.split(batch_size))


def train_plain(seeds: Sequence[int], images: Tensor, labels: Tensor, setting: dict[str, Any]
                ) -> list[OpenSetClassifier]:
    """Case 3: each member its own plain loop, one after the other."""
    models = []
    for seed in seeds:
        model = member(seed)
        model.train()
        optimizer = torch.optim.Adam(model.network.parameters(), lr=setting["lr"])
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=setting["t_max"])
        for index in batches(len(labels), setting["batch_size"], seed):
            loss = model.criterion(model.network(images[index])[0], labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        models.append(model.eval())
    return models


def stacked_members(seeds: Sequence[int]) -> tuple[list[OpenSetClassifier], dict[str, Tensor], dict[str, Tensor]]:
    """The members as :func:`member` initialises them, and their stacked parameters (trainable leaves) and
    buffers."""
    models = [member(seed) for seed in seeds]
    params, buffers = stack_module_state([m.network for m in models])
    return models, {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}, buffers


def train_batched(seeds: Sequence[int], images: Tensor, labels: Tensor, setting: dict[str, Any]
                  ) -> list[OpenSetClassifier]:
    """Case 2: the members as one batched model (``vmap`` over stacked parameters, one Adam over them)."""
    models, params, buffers = stacked_members(seeds)
    base = copy.deepcopy(models[0].network).to("meta").train()
    if (labels < 0).any():  # SoftMaxLoss's own check, which vmap cannot run (data-dependent control flow)
        raise ValueError("the softmax members train on the known classes only: negative labels in the training set")

    def loss(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(base, (p, b), (x,))[0], y)  # SoftMaxLoss's cross-entropy

    optimizer = torch.optim.Adam(params.values(), lr=setting["lr"])
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=setting["t_max"])
    orders = [batches(len(labels), setting["batch_size"], seed) for seed in seeds]
    for step in zip(*orders, strict=True):  # the same number of images for every member: equal batch sizes
        index = torch.stack(step)
        losses = torch.vmap(loss, in_dims=(0, 0, 0, 0))(params, buffers, images[index], labels[index])
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # the members' parameters are disjoint: each gets its own loss's gradient
        optimizer.step()
        schedule.step()
    for index, model in enumerate(models):  # the trained weights back into ordinary members
        model.network.load_state_dict({**{k: v[index].detach() for k, v in params.items()},
                                       **{k: v[index] for k, v in buffers.items()}})
        model.eval()
    return models


def train_lightning(seeds: Sequence[int], root: Path, setting: dict[str, Any], *, tiny: bool) -> list[OpenSetClassifier]:
    """Case 1: ``train.py ensemble`` as the demo runs it (without the bar: every case is scored alike below)."""
    import train
    from lightning_modules.checkpoint import load_module

    folder = Path(tempfile.mkdtemp(dir=root))
    argv = ["--members", str(len(seeds)), "--seed", str(seeds[0]), "--out-dir", str(folder), "--config", str(CONFIG),
            "--trainer.enable_model_summary=false"]
    if tiny:
        argv += [f"--data.init_args.batch_size={setting['batch_size']}",
                 f"--data.init_args.max_train_per_class={setting['max_train_per_class']}",
                 f"--model.init_args.lr_scheduler.init_args.T_max={setting['t_max']}"]
    saved = sys.argv
    sys.argv = ["train.py"]  # LightningCLI reads the program name from it
    try:
        checkpoints = train.train_ensemble(argv)
    finally:
        sys.argv = saved
    return [load_module(path, expected=OpenSetClassifier).eval() for path in checkpoints]


def timed(fn: Callable[[], list[OpenSetClassifier]]) -> Callable[[], tuple[float, list[OpenSetClassifier]]]:
    """``fn`` returning its wall time with its members."""

    def run() -> tuple[float, list[OpenSetClassifier]]:
        start = time.perf_counter()
        models = fn()
        return time.perf_counter() - start, models
    return run


def measure(seeds: list[int], setting: dict[str, Any], *, repeat: int, tiny: bool) -> dict[str, Any]:
    """Every case, alternated: ``rows``, ``steps``, ``init_equal``, ``training_images``, ``test_images``."""
    members = len(seeds)
    with quiet(), tempfile.TemporaryDirectory() as root:
        images, labels, data = training_tensors(setting)
        # what the batched model starts from is what each member would start from on its own
        reference = [member(seed).network.state_dict() for seed in seeds]
        _, stacked, stacked_buffers = stacked_members(seeds)
        init_equal = all(torch.equal(stacked[k][m], reference[m][k]) for m in range(members) for k in stacked) and all(
            torch.equal(stacked_buffers[k][m], reference[m][k]) for m in range(members) for k in stacked_buffers)
        cases = {
            "`train.py ensemble`: M sequential Lightning fits": timed(
                lambda: train_lightning(seeds, Path(root), setting, tiny=tiny)),
            "one batched model (`torch.func` vmap, one Adam)": timed(
                lambda: train_batched(seeds, images, labels, setting)),
            "M plain PyTorch loops, one after the other": timed(lambda: train_plain(seeds, images, labels, setting)),
        }
        results = alternate(cases, repeat=repeat, warmup=0)
        rows = []
        for name, runs in results.items():
            seconds, models = min(runs, key=lambda run: run[0])
            accuracies = [known_class_accuracy(m, data, device="cpu")[0] for m in models]
            rows.append({"case": name, "seconds": seconds, "accuracies": accuracies})
    return {"rows": rows, "steps": math.ceil(len(labels) / setting["batch_size"]), "init_equal": init_equal,
            "training_images": len(labels), "test_images": int((data.test_set.labels >= 0).sum())}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and, with ``--write``, put it in RESULTS.md.

    Returns:
        ``rows`` (per case: ``case``, ``seconds`` (the best of the repeats), ``accuracies`` of its members),
        ``members``, ``steps``, ``init_equal`` (the batched members' initial weights equal the individually
        seeded members'), ``settings``.
    """
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--members", type=int, help="members of the ensemble (default 5, the demo's; tiny 2)")
    parser.add_argument("--repeat", type=int, default=1, help="timed rounds of every case (after no warm-up)")
    args = parse(parser, argv)
    members = args.members or (2 if args.tiny else 5)
    seeds = [SEED + m for m in range(members)]
    setting = settings(tiny=args.tiny)
    load = load_average()
    threads = torch.get_num_threads()
    if args.tiny:  # a toy run on a shared machine: one thread does not wait for the other core
        torch.set_num_threads(1)
    try:
        result = measure(seeds, setting, repeat=args.repeat, tiny=args.tiny)
    finally:
        torch.set_num_threads(threads)
    rows = result["rows"]
    reference_s = rows[0]["seconds"]
    body = "\n\n".join([
        f"{members} members of `configs/ensemble/fashion_mnist.yaml`, seeds {seeds[0]}-{seeds[-1]}: "
        f"{result['training_images']} training images, {result['steps']} steps of {setting['batch_size']}, Adam lr "
        f"{setting['lr']} with a cosine decay over {setting['t_max']} steps; the best of {args.repeat} alternated "
        f"round(s). Accuracy: each member's on the {result['test_images']} known-class ID test images. Ratios below 1 "
        "are faster than `train.py ensemble`.",
        table(["case", "seconds", "/ train.py ensemble", "members' ID-test accuracy (min-max)"],
              [[r["case"], f"{r['seconds']:.1f}", f"{r['seconds'] / reference_s:.2f}x",
                f"{min(r['accuracies']):.3f}-{max(r['accuracies']):.3f}"] for r in rows]),
        f"The batched model's initial weights equal each member's own seeded initialisation: {result['init_equal']}. "
        f"Machine: {machine()}; 1-minute load average {load} before and {load_average()} after the run.",
    ])
    finish(args, SECTION, body, script="benchmarks.ensemble_training")
    return {"rows": rows, "members": members, "steps": result["steps"], "init_equal": result["init_equal"],
            "settings": setting}


if __name__ == "__main__":
    main()
