"""Training-loop overhead of PyTorch Lightning, side by side with a plain PyTorch loop in the same run.

Workloads:

(a) the demo: ``OpenSetClassifier(num_classes=4, loss="eos", backbone="small_cnn", in_channels=1)`` on
    the Fashion-MNIST open-set protocol (batch 128, ``num_workers=0``, a ``max_train_per_class`` subset);
(b) ResNet-50 (``backbone="torchvision:resnet50"``) on synthetic 224 px batches
    (:class:`benchmarks.training.SyntheticData`: random uint8 images held in memory, made float after the
    transfer, labels -1..K-1). On a small CPU only a few batches.

For each workload, one epoch through ``pl.Trainer.fit`` of the project's LightningModule (no logger,
checkpointing, progress bar, model summary or validation) against a plain loop doing the same steps
(:func:`benchmarks.training.plain_step`): the same initial weights, the same batches in the same order,
forward through ``module.network``, ``module.criterion``, Adam with the same lr. The first losses of both
must agree (else a warning). Runs alternate (Lightning, plain, Lightning, ...) after one warm-up run of
each, with the median step time, a paired lockstep estimate and the plain loop's run-to-run spread next to
the best epochs. Goal: Lightning within 5% of the plain loop. The cost of one ``self.log`` call inside a
running ``fit`` is measured apart.

Then the evaluation callbacks' cost per validation epoch on the demo
(:func:`benchmarks.training.callback_costs`): ``trainer.validate`` over the demo's validation set without
evaluation callbacks, with ``OpenSetEvaluation`` and with ``SeverityAUROC``.

    python -m benchmarks.training_overhead [--tiny] [--write]
"""

from __future__ import annotations

import copy
import gc
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.common import benchmark_parser, finish, load_average, machine, parse, quiet, table
from benchmarks.training import (
    LR,
    SEED,
    SEVERITY_KAPPAS,
    CallbackCost,
    SyntheticData,
    callback_costs,
    plain_step,
)
from callbacks import OpenSetEvaluation, SeverityAUROC
from datamodules import FashionMNISTOpenSetDataModule, collate_samples
from datamodules.severity import FashionSeverityData
from lightning_modules import OpenSetClassifier

SECTION = "Training-loop overhead"
GOAL = 1.05  # Lightning / plain loop
RECORDED_LOSSES = 5  # first steps whose losses must agree between the two loops
TRAINER_ARGS: dict[str, Any] = {
    "accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
    "enable_progress_bar": False, "enable_model_summary": False,
}


def fixed_order_loader(dataset: Dataset, *, batch_size: int, seed: int = SEED) -> DataLoader:
    """A shuffled loader with its own seeded generator: every call yields the same batches in the same order."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0, collate_fn=collate_samples,
                      generator=torch.Generator().manual_seed(seed))


class DemoData(FashionMNISTOpenSetDataModule):
    """The demo's datamodule, set up once (``fit`` and ``validate`` do not re-read the IDX files every run)
    and with a seeded training order, so that Lightning and the plain loop see the same batches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._built: set[str] = set()

    def setup(self, stage: str | None = None) -> None:
        key = "test" if stage in ("test", "predict") else "fit"  # "fit" and "validate" build the same sets
        if key not in self._built:
            super().setup(stage)
            self._built.add(key)

    def loader(self, dataset: Dataset | None = None) -> DataLoader:
        """``dataset`` (default: the training set) in the seeded order of every run."""
        return fixed_order_loader(self.train_set if dataset is None else dataset, batch_size=self.batch_size)

    def train_dataloader(self) -> DataLoader:
        return self.loader()


@dataclass
class Run:
    """One epoch: ``call_s`` the whole call (Trainer construction + ``fit``; optimizer construction + loop),
    ``loop_s`` the epoch loop alone (Lightning: ``on_train_epoch_start`` to ``on_train_epoch_end``)."""

    call_s: float
    loop_s: float
    steps: int
    images: int
    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)  # wall time of each step, batch loading included


class EpochProbe(pl.Callback):
    """Times Lightning's epoch loop, counts steps and images and records the first losses."""

    def __init__(self) -> None:
        self.start = self.end = math.nan
        self.steps = self.images = 0
        self.losses: list[float] = []
        self.step_ends: list[float] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.step_ends.append(time.perf_counter())
        self.steps += 1
        self.images += int(batch.targets.numel())
        if len(self.losses) < RECORDED_LOSSES:
            self.losses.append(float(outputs["loss"]))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.end = time.perf_counter()


def lightning_epoch(model: OpenSetClassifier, data: pl.LightningDataModule, *, root: str,
                    max_steps: int | None = None) -> Run:
    """One epoch of ``pl.Trainer.fit`` (``max_steps`` batches of it for a warm-up)."""
    probe = EpochProbe()
    start = time.perf_counter()
    trainer = pl.Trainer(**TRAINER_ARGS, max_epochs=1, limit_train_batches=max_steps or 1.0, limit_val_batches=0,
                         num_sanity_val_steps=0, default_root_dir=root, callbacks=[probe])
    trainer.fit(model, datamodule=data)
    call_s = time.perf_counter() - start
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    if lr != LR:
        warnings.warn(f"Lightning's optimizer has lr {lr}, the plain loop {LR}: not the same steps", stacklevel=2)
    return Run(call_s, probe.end - probe.start, probe.steps, probe.images, probe.losses,
               step_durations(probe.start, probe.step_ends))


def step_durations(start: float, ends: list[float]) -> list[float]:
    return [end - previous for previous, end in zip([start, *ends[:-1]], ends, strict=True)]


def plain_epoch(model: OpenSetClassifier, data: pl.LightningDataModule, *, max_steps: int | None = None) -> Run:
    """The same epoch as a plain PyTorch loop over ``data.train_dataloader()``."""
    start = time.perf_counter()
    data.setup("fit")  # a no-op once set up, as in every Lightning run after the first
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    losses: list[float] = []
    step_ends: list[float] = []
    steps = images = 0
    loop_start = time.perf_counter()
    for batch in data.train_dataloader():
        if max_steps is not None and steps >= max_steps:
            break
        batch = data.on_after_batch_transfer(batch, 0)  # what Lightning does after its (CPU) transfer
        loss = plain_step(model, optimizer, batch)
        step_ends.append(time.perf_counter())
        steps += 1
        images += int(batch.targets.numel())
        if len(losses) < RECORDED_LOSSES:
            losses.append(float(loss))
    end = time.perf_counter()
    return Run(end - start, end - loop_start, steps, images, losses, step_durations(loop_start, step_ends))


@dataclass
class Comparison:
    name: str
    description: str
    batch_size: int
    lightning: list[Run]
    plain: list[Run]
    paired: list[float] = field(default_factory=list)  # per-step Lightning / plain ratios of lockstep epochs

    def best(self, side: str, attribute: str) -> float:
        return min(getattr(run, attribute) for run in getattr(self, side))

    def median_step(self, side: str) -> float:
        """The median wall time of one step over every step of every timed epoch of a side: less sensitive
        than the best epoch to slow phases of a shared machine."""
        return statistics.median(step for run in getattr(self, side) for step in run.step_s)

    def spread(self, side: str) -> float:
        """Slowest / fastest epoch of a side: the run-to-run noise of the machine for this workload."""
        loops = [run.loop_s for run in getattr(self, side)]
        return max(loops) / min(loops)

    @property
    def steps(self) -> int:
        return self.lightning[0].steps

    @property
    def images(self) -> int:
        return self.lightning[0].images

    def loss_difference(self) -> float:
        """Largest absolute difference of the first losses between any run and Lightning's first run."""
        reference = self.lightning[0].losses
        return max(max(abs(a - b) for a, b in zip(reference, run.losses, strict=True))
                   for run in self.lightning + self.plain)


def compare(name: str, description: str, make_model: Callable[[], OpenSetClassifier], data: Any, *, root: str,
            repeat: int, warmup_steps: int, lockstep_epochs: int) -> tuple[Comparison, OpenSetClassifier]:
    """Warm up both loops, then ``repeat`` alternating epochs of each from the same initial weights, then
    ``lockstep_epochs`` epochs with both loops in lockstep (paired per-step ratios).

    Returns:
        The comparison and the model after Lightning's last epoch.
    """
    torch.manual_seed(SEED)
    template = make_model()
    lightning_epoch(copy.deepcopy(template), data, root=root, max_steps=warmup_steps)
    plain_epoch(copy.deepcopy(template), data, max_steps=warmup_steps)
    result = Comparison(name, description, data.batch_size, [], [])
    trained = template
    for _ in range(repeat):
        trained = copy.deepcopy(template)
        gc.collect()  # every run starts from a collected heap, not with the previous run's garbage
        result.lightning.append(lightning_epoch(trained, data, root=root))
        model = copy.deepcopy(template)
        gc.collect()
        result.plain.append(plain_epoch(model, data))
    result.paired = lockstep_ratios(template, data, root=root, epochs=lockstep_epochs)
    for run in result.lightning + result.plain:
        if (run.steps, run.images, len(run.losses)) != (result.steps, result.images, len(result.lightning[0].losses)):
            raise RuntimeError(f"{name}: the loops ran different epochs ({run.steps} vs {result.steps} steps)")
    difference = result.loss_difference()
    if not difference <= 1e-5 * max(abs(v) for v in result.lightning[0].losses):
        warnings.warn(f"{name}: the first {RECORDED_LOSSES} losses of Lightning and the plain loop differ by up to "
                      f"{difference:.3g}: the two loops do not run the same steps, the comparison is not fair",
                      RuntimeWarning, stacklevel=2)
    lightning, plain = result.best("lightning", "loop_s"), result.best("plain", "loop_s")
    print(f"{name}: {result.steps} steps, plain {plain:.3f}s, Lightning {lightning:.3f}s (epoch loop; "
          f"{lightning / plain:.3f}x; median step {result.median_step('lightning') / result.median_step('plain'):.3f}x"
          f"; paired {statistics.median(result.paired):.3f}x)"
          f", Lightning fit call {result.best('lightning', 'call_s'):.3f}s; first losses differ by {difference:.2g}",
          flush=True)
    for side in ("lightning", "plain"):
        print(f"  {side} epoch loops (s): {' '.join(f'{run.loop_s:.3f}' for run in getattr(result, side))}")
    return result, trained


class Lockstep(pl.Callback):
    """Runs the plain loop's step ``k`` right after Lightning's step ``k`` and times both, so that each pair
    of steps sees the same state of the machine (a paired estimate, robust to slow phases of a shared VM).

    The plain side has its own copy of the initial weights, its own Adam and its own copy of the data set,
    read in the same order (a copy, so that Lightning's batch ``k`` does not leave the plain loop's batch
    ``k`` in the CPU caches). Lightning's step ``k`` is the time from this callback's return after step ``k - 1`` (or the
    epoch start) to its call after step ``k``: batch loading, hooks, ``training_step``, backward,
    optimizer step and logging.
    """

    def __init__(self, model: OpenSetClassifier, data: Any) -> None:
        self.model, self.data = model, data
        self.optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        # the same batches as data.train_dataloader() (the same order), from a copy of the images
        self.batches = iter(data.loader(copy.deepcopy(data.train_set)))
        self.lightning_s: list[float] = []
        self.plain_s: list[float] = []
        self.lightning_losses: list[float] = []
        self.plain_losses: list[float] = []
        self.last = math.nan

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.model.train()
        self.last = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        start = time.perf_counter()
        self.lightning_s.append(start - self.last)
        loss = plain_step(self.model, self.optimizer, self.data.on_after_batch_transfer(next(self.batches), 0))
        self.last = time.perf_counter()
        self.plain_s.append(self.last - start)
        if len(self.plain_losses) < RECORDED_LOSSES:  # after the timed span
            self.plain_losses.append(float(loss))
            self.lightning_losses.append(float(outputs["loss"]))
            self.last = time.perf_counter()


def lockstep_ratios(template: OpenSetClassifier, data: Any, *, root: str, epochs: int) -> list[float]:
    """Per-step ratios Lightning / plain of ``epochs`` lockstep epochs (see :class:`Lockstep`)."""
    ratios: list[float] = []
    for _ in range(epochs):
        pair = Lockstep(copy.deepcopy(template), data)
        trainer = pl.Trainer(**TRAINER_ARGS, max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0,
                             default_root_dir=root, callbacks=[pair])
        gc.collect()
        trainer.fit(copy.deepcopy(template), datamodule=data)
        if pair.lightning_losses != pair.plain_losses:
            warnings.warn(f"lockstep: the first losses differ ({pair.lightning_losses} vs {pair.plain_losses})",
                          RuntimeWarning, stacklevel=2)
        ratios += [a / b for a, b in zip(pair.lightning_s, pair.plain_s, strict=True)]
    return ratios


class LogCallCost(pl.Callback):
    """Times ``calls`` extra ``pl_module.log`` calls per training step, made as the module logs ``train/loss``
    (``on_step`` and ``on_epoch``, progress bar, ``sync_dist``, explicit batch size)."""

    def __init__(self, calls: int = 20) -> None:
        self.calls = calls
        self.seconds: list[float] = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"]
        for _ in range(self.calls):
            start = time.perf_counter()
            pl_module.log("benchmark/probe", loss, on_step=True, on_epoch=True, prog_bar=True, sync_dist=True,
                          batch_size=int(batch.targets.numel()))
            self.seconds.append(time.perf_counter() - start)


def log_call_seconds(make_model: Callable[[], OpenSetClassifier], data: pl.LightningDataModule, *, root: str,
                     steps: int = 10) -> tuple[float, int]:
    """The median cost of one ``self.log`` call inside a running ``fit``, and the number of timed calls
    (``steps`` x 20, fewer if the epoch is shorter)."""
    probe = LogCallCost()
    trainer = pl.Trainer(**TRAINER_ARGS, max_epochs=1, limit_train_batches=steps, limit_val_batches=0,
                         num_sanity_val_steps=0, default_root_dir=root, callbacks=[probe])
    trainer.fit(make_model(), datamodule=data)
    return statistics.median(probe.seconds), len(probe.seconds)


def demo_callback_costs(model: OpenSetClassifier, data: pl.LightningDataModule, *, root: str,
                        repeat: int) -> tuple[list[CallbackCost], float]:
    """``trainer.validate`` without evaluation callbacks, with OpenSetEvaluation, with SeverityAUROC.

    Returns:
        One cost per variant, and the one-off set-up time of the severity data (once per ``fit``).
    """
    start = time.perf_counter()
    severity_data = FashionSeverityData(estimation=100, test=50)
    severity_data.setup()
    severity_setup_s = time.perf_counter() - start
    variants: dict[str, Callable[[], list[pl.Callback]]] = {
        "no evaluation callbacks (the model's own γ only)": list,
        "+ `OpenSetEvaluation(every_n_epochs=1, plot_every_n_epochs=0)`": lambda: [
            OpenSetEvaluation(every_n_epochs=1, plot_every_n_epochs=0)],
        f"+ `SeverityAUROC(kappas={SEVERITY_KAPPAS}, every_n_epochs=1, "
        "data=FashionSeverityData(estimation=100, test=50))` (default `plots=True`)": lambda: [
            SeverityAUROC(kappas=SEVERITY_KAPPAS, every_n_epochs=1, data=severity_data)],
        "+ the same `SeverityAUROC` with `plots=False` (no figure per κ and epoch)": lambda: [
            SeverityAUROC(kappas=SEVERITY_KAPPAS, every_n_epochs=1, data=severity_data, plots=False)],
    }
    costs = callback_costs(model, data, variants, repeat=repeat,
                           trainer_args=lambda number: {**TRAINER_ARGS, "default_root_dir": f"{root}/validate-{number}"})
    for cost in costs:
        print(f"validate {cost.label}: {cost.wall_s:.3f}s, in hooks {cost.hooks_s:.3f}s", flush=True)
    return costs, severity_setup_s


def rate(images_per_s: float) -> str:
    return f"{images_per_s:,.0f}" if images_per_s >= 100 else f"{images_per_s:.2f}"


def comparison_row(c: Comparison) -> dict[str, Any]:
    plain, lightning = c.best("plain", "loop_s"), c.best("lightning", "loop_s")
    return {"workload": c.name, "steps": c.steps, "batch_size": c.batch_size, "images": c.images,
            "plain_s": plain, "lightning_s": lightning, "ratio": lightning / plain,
            "median_step_ratio": c.median_step("lightning") / c.median_step("plain"),
            "paired_ratio": statistics.median(c.paired), "paired_steps": len(c.paired),
            "plain_spread": c.spread("plain"), "lightning_call_s": c.best("lightning", "call_s"),
            "plain_call_s": c.best("plain", "call_s"), "loss_difference": c.loss_difference(),
            "median_plain_step_s": c.median_step("plain"), "epochs": len(c.lightning) + len(c.plain)}


def markdown(comparisons: list[Comparison], costs: list[CallbackCost], severity_setup_s: float,
             log_call: tuple[float, int], *, validation_images: int, repeat: int, load: tuple[str, str]) -> str:
    rows = [comparison_row(c) for c in comparisons]
    loops = table(
        ["workload", "steps x batch", "plain loop (s/epoch)", "Lightning epoch loop (s/epoch)",
         "Lightning / plain (best epochs)", "(median step)", "(paired steps)", "plain spread",
         "`fit` start-up + tear-down (s)", "plain (img/s)", "Lightning (img/s)", "first losses differ by"],
        [(c.description, f"{r['steps']} x {r['batch_size']}", f"{r['plain_s']:.3f}", f"{r['lightning_s']:.3f}",
          f"{r['ratio']:.3f}", f"{r['median_step_ratio']:.3f}", f"{r['paired_ratio']:.3f} ({r['paired_steps']})",
          f"{r['plain_spread']:.2f}",
          f"{r['lightning_call_s'] - r['lightning_s'] - (r['plain_call_s'] - r['plain_s']):.2f}",
          rate(r["images"] / r["plain_s"]), rate(r["images"] / r["lightning_s"]), f"{r['loss_difference']:.2g}")
         for c, r in zip(comparisons, rows, strict=True)])
    log_call_s, log_calls = log_call
    demo_step = rows[0]["median_plain_step_s"]
    logging = table(["one `self.log` call inside a running `fit`", "timed calls", "the module's 2 calls per step",
                     "share of the demo's median plain step"],
                    [(f"{log_call_s * 1e3:.2f} ms", log_calls, f"{2 * log_call_s * 1e3:.1f} ms",
                      f"{2 * log_call_s / demo_step:.1%} (of {demo_step * 1e3:.0f} ms)")])
    baseline = costs[0]
    callbacks = table(
        ["`trainer.validate`, one epoch", "wall (s)", "added (wall, s/epoch)", "in hooks (s/epoch)", "callback setup (s)"],
        [(cost.label, f"{cost.wall_s:.3f}", *(("—",) * 3 if cost is baseline else
                                             (f"{cost.wall_s - baseline.wall_s:+.3f}", f"{cost.hooks_s:.3f}",
                                              f"{cost.setup_s:.3f}")))
         for cost in costs])
    return "\n".join([
        "One training epoch through `pl.Trainer.fit` of `OpenSetClassifier` against a plain PyTorch loop doing the "
        "same steps (the same initial weights and batches in the same order, `module.network`, `module.criterion`, "
        "`torch.optim.Adam(lr=1e-3)`); Lightning without logger, checkpointing, progress bar, model summary or "
        f"validation; 32-bit, CPU. Epochs alternate after one warm-up run of each; best of {repeat}. *Median step*: "
        f"the median of every step of the {repeat} epochs; *paired*: the median over steps of Lightning's step / the "
        "plain step when both loops run in lockstep in one `fit`; *spread*: the plain loop's slowest / fastest "
        f"epoch. Machine: {machine()}; 1-minute load average {load[0]} before and {load[1]} after the run.",
        "",
        loops,
        "",
        logging,
        "",
        f"Evaluation callbacks: one `trainer.validate` epoch over the {validation_images:,} demo validation images "
        "(batch 128) with the demo model after its epoch above, a fresh Trainer and callback per call, rounds "
        f"alternating, best of {repeat} after a warm-up round. *In hooks*: inside the callback's hooks per epoch "
        f"(`setup` apart). The severity data's own set-up: {severity_setup_s:.2f} s, once per `fit`.",
        "",
        callbacks,
    ])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the tables and, with ``--write``, put them in RESULTS.md.

    Returns:
        ``comparisons`` (one dict per workload, see :func:`comparison_row`), ``log_call_s`` and
        ``log_calls``, ``callbacks`` (label, wall_s, hooks_s, setup_s per validate variant),
        ``validation_images`` and ``severity_setup_s``.
    """
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--train-per-class", type=int,
                        help="max_train_per_class of the demo workload (default 700: 3,920 training images, 31 steps)")
    parser.add_argument("--resnet-batches", type=int, help="batches of the ResNet-50 epoch (default 6)")
    parser.add_argument("--resnet-batch-size", type=int, help="default 8")
    parser.add_argument("--resnet-image-size", type=int, help="default 224")
    parser.add_argument("--resnet-classes", type=int, default=10)
    parser.add_argument("--repeat", type=int, help="timed epochs of each loop (default 3)")
    args = parse(parser, argv)
    sizes = {"train_per_class": 50, "resnet_batches": 2, "resnet_batch_size": 2, "resnet_image_size": 64,
             "repeat": 1} if args.tiny else {"train_per_class": 700, "resnet_batches": 6, "resnet_batch_size": 8,
                                               "resnet_image_size": 224, "repeat": 3}
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    load = load_average()
    with quiet(), tempfile.TemporaryDirectory() as root:
        demo = DemoData(max_train_per_class=args.train_per_class, batch_size=128, num_workers=0)
        demo.setup("fit")

        def demo_model() -> OpenSetClassifier:
            return OpenSetClassifier(num_classes=4, loss="eos", backbone="small_cnn", in_channels=1)

        demo_result, trained = compare(
            "Demo (small CNN, Fashion-MNIST)",
            f"(a) demo: small CNN, Fashion-MNIST 28 px, `max_train_per_class={args.train_per_class}`",
            demo_model, demo, root=root, repeat=args.repeat, warmup_steps=3, lockstep_epochs=args.repeat)
        log_call = log_call_seconds(demo_model, demo, root=root)
        synthetic = SyntheticData(num_classes=args.resnet_classes, num_batches=args.resnet_batches,
                                  batch_size=args.resnet_batch_size, image_size=args.resnet_image_size)
        resnet_result, _ = compare(
            "ResNet-50 (synthetic)",
            f"(b) ResNet-50, synthetic {args.resnet_image_size} px, K = {args.resnet_classes} "
            f"({args.resnet_batches} batches)",
            lambda: OpenSetClassifier(num_classes=args.resnet_classes, loss="eos", backbone="torchvision:resnet50"),
            synthetic, root=root, repeat=args.repeat, warmup_steps=1, lockstep_epochs=1)
        full_demo = demo if args.tiny else DemoData(batch_size=128, num_workers=0)  # all of the demo's data
        full_demo.setup("fit")
        costs, severity_setup_s = demo_callback_costs(trained, full_demo, root=root, repeat=args.repeat)
        comparisons = [demo_result, resnet_result]
        body = markdown(comparisons, costs, severity_setup_s, log_call, validation_images=len(full_demo.val_set),
                        repeat=args.repeat, load=(load, load_average()))
    finish(args, SECTION, body, script="benchmarks.training_overhead")
    return {"comparisons": [comparison_row(c) for c in comparisons], "log_call_s": log_call[0],
            "log_calls": log_call[1], "validation_images": len(full_demo.val_set), "severity_setup_s": severity_setup_s,
            "callbacks": [{"label": c.label, "wall_s": c.wall_s, "hooks_s": c.hooks_s, "setup_s": c.setup_s}
                          for c in costs]}


if __name__ == "__main__":
    main()
