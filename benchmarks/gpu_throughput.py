"""ResNet-50 training throughput on one GPU through the project's LightningModule, with the real data
pipeline and the evaluation callbacks' cost per validation epoch: one short script for the day a GPU is lent.

Rows, all in one run (well under 5 minutes on one H100/H200-class GPU):

1. ``synthetic, Lightning``: ``OpenSetClassifier(loss="eos", backbone="torchvision:resnet50")`` trained
   through ``pl.Trainer.fit`` on synthetic 224 px batches, bf16-mixed, channels_last, with the largest batch
   that fits (512, 384, 256, 192, 128, 64 tried in turn, CUDA out-of-memory caught). The batches are
   pre-collated uint8 tensors in pinned memory, converted to float on the GPU, so the row measures the
   model, not the data loading.
2. ``synthetic, plain PyTorch``: the same steps as a plain loop (autocast bf16, channels_last, Adam, the
   same batches): the reference for Lightning's own overhead.
3. ``JPEG pipeline, Lightning``: the same training through ``ImageNetProtocolDataModule`` (protocol P2):
   JPEG decoding and the paper's train transform (Resize 256, RandomCrop 224, flip) in ``num_workers``
   processes, on an ImageNet-shaped folder of generated 300x300 JPEGs (smooth colour fields with noise,
   about 20 KB each; real ILSVRC2012 files average about 110 KB at about 400x350) that the script writes
   into a temporary folder, with P2's real wnids. Enough images that the timed steps stay within one epoch.
4. ``validation epoch``: ``trainer.validate`` over P2's validation split of that folder, no evaluation
   callbacks (best of 2 after a warm-up round; the variants alternate).
5. ``+ OpenSetEvaluation``: the time per validation epoch inside ``OpenSetEvaluation(every_n_epochs=1,
   plot_every_n_epochs=0)``'s hooks (GPU synchronised around each hook), and the wall difference to row 4.
6. ``+ SeverityAUROC``: the same for ``SeverityAUROC(kappas=[softmax, max_logit, entropy])`` with a
   ``ProtocolSeverityData`` on that folder (its own passes over the ID and OOD images).
7.-10. ``scoring pass``: the evaluation engine's pass (``ScoringPasses.outputs``: logits of every image,
   gathered) of the trained model over every JPEG of that folder, read from the folder and from its shard set
   (``datamodules.shards``, written first), decoded in the ``num_workers`` CPU workers (PIL, the default) or
   on the model's device (``--decode device``: the workers read the bytes, TorchCodec's nvJPEG decodes each
   batch, the resize and crop run on the GPU); the model as trained (bf16-mixed, channels_last). Best of 2.

Training rows: timed after ``--warmup-steps`` over ``--steps`` steps, the GPU synchronised at both ends.
Public reference: about 2,500 img/s for ResNet-50 (v1.5) mixed-precision training on one A100 80GB
(NVIDIA DeepLearningExamples, PyTorch, DALI data loading: 2,470 img/s).

``--tiny`` (automatic when no CUDA device is present) runs every row on the CPU at toy size (ResNet-18,
64 px, batch 4, 2 steps, 32-bit, one torch thread so that other processes on a small machine cannot stall
its thread barriers) so that the script keeps working; its numbers mean nothing.

Synthetic data, the plain step and the callback timing are :mod:`benchmarks.training`'s, shared with
``benchmarks.training_overhead``.

    python -m benchmarks.gpu_throughput [--tiny] [--write] [--work-dir DIR]
"""

from __future__ import annotations

import gc
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from PIL import Image

from benchmarks.common import benchmark_parser, finish, parse, quiet, table
from benchmarks.training import (
    LR,
    SEVERITY_KAPPAS,
    OnDevice,
    SyntheticData,
    callback_costs,
    plain_step,
)
from callbacks import OpenSetEvaluation, SeverityAUROC
from datamodules import Batch, ImageNetProtocolDataModule, imagenet_protocol
from datamodules.protocols import Protocol
from datamodules.severity import SEVERITY_SETS, ProtocolSeverityData
from lightning_modules import OpenSetClassifier

SECTION = "GPU throughput"
PROTOCOL = 2  # 30 known, 31 negative, 55 unknown classes
A100_REFERENCE = 2470  # img/s, ResNet-50 v1.5, AMP, 1x A100 80GB (NVIDIA DeepLearningExamples, PyTorch)
ROWS = ("synthetic, Lightning", "synthetic, plain PyTorch", "JPEG pipeline, Lightning", "validation epoch",
        "+ OpenSetEvaluation", "+ SeverityAUROC", "scoring pass: folders, CPU decode", "scoring pass: shards, CPU decode",
        "scoring pass: folders, device decode", "scoring pass: shards, device decode")
TRAINING_ROWS = ROWS[:3]
CALLBACK_ROWS = ROWS[4:6]
DECODE_ROWS = ROWS[6:]


@dataclass(frozen=True)
class Settings:
    """What one run does; :data:`GPU` and :data:`TINY` are the two presets."""

    device: str  # "cuda" or "cpu"
    backbone: str
    precision: str
    channels_last: bool
    resize: int  # Resize, then a crop of `crop` px (the paper: 256, 224)
    crop: int
    jpeg_size: int  # side of the generated JPEGs
    batch_sizes: tuple[int, ...]  # tried in this order; the first that fits is used
    warmup_steps: int
    steps: int
    num_workers: int
    val_per_class: int  # val/<wnid> images of every class (severity ID and OOD test images)
    unknown_train_per_class: int  # train/<wnid> images of the unknown classes (severity estimation pool)
    estimation: int  # severity estimation images per unknown class
    severity_test: int  # severity test images per unknown class
    val_repeat: int  # timed validate calls per variant
    val_warmup: bool  # one untimed round of the validate calls first

    def __post_init__(self) -> None:
        if self.warmup_steps < 1 or self.steps < 1:
            raise ValueError(f"warmup_steps and steps must be at least 1, got {self.warmup_steps}, {self.steps}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive, got {self.batch_sizes}")

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def train_per_class(self, classes: int) -> int:
        """Training images per known/negative class: the timed steps of the largest batch fit in one epoch
        (the protocol keeps 80% for training), and at least 5 (the stratified 80/20 split needs one
        validation image per class)."""
        needed = (self.warmup_steps + self.steps) * max(self.batch_sizes)
        return max(5, math.ceil(needed / (0.8 * classes)) + 1)


GPU = Settings(device="cuda", backbone="torchvision:resnet50", precision="bf16-mixed", channels_last=True, resize=256,
               crop=224, jpeg_size=300, batch_sizes=(512, 384, 256, 192, 128, 64), warmup_steps=5, steps=20,
               num_workers=min(16, os.cpu_count() or 1), val_per_class=20, unknown_train_per_class=20, estimation=20,
               severity_test=20, val_repeat=2, val_warmup=True)
TINY = Settings(device="cpu", backbone="torchvision:resnet18", precision="32-true", channels_last=False, resize=72,
                crop=64, jpeg_size=80, batch_sizes=(4,), warmup_steps=1, steps=2, num_workers=0, val_per_class=2,
                unknown_train_per_class=5, estimation=2, severity_test=2, val_repeat=1,
                val_warmup=False)


# --------------------------------------------------------------------------------------------------
# data


class ProtocolData(OnDevice, ImageNetProtocolDataModule):
    """``ImageNetProtocolDataModule`` with the :class:`OnDevice` transfer hook (channels_last on a GPU)."""


def write_jpeg(path: Path, *, size: int, seed: int) -> None:
    """A smooth random colour field with mild noise, as a JPEG of ``size`` x ``size`` px (quality 85)."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize((size, size), Image.Resampling.BICUBIC)
    pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (size, size, 3), dtype=np.int16)
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, format="JPEG", quality=85)


def write_imagenet_folder(root: Path, protocol: Protocol, *, train_per_class: int, unknown_train_per_class: int,
                          val_per_class: int, size: int, workers: int) -> int:
    """An ILSVRC2012-shaped folder with the protocol's wnids; returns the number of JPEGs written.

    ``train/<wnid>/<wnid>_<i>.JPEG``: ``train_per_class`` images of each known and negative class and
    ``unknown_train_per_class`` of each unknown class (severity estimation); ``val/<wnid>/
    ILSVRC2012_val_<n>.JPEG``: ``val_per_class`` images of every class.
    """
    jobs: list[Path] = []
    for wnid in protocol.known + protocol.negative + protocol.unknown:
        count = unknown_train_per_class if wnid in protocol.unknown else train_per_class
        jobs += [root / "train" / wnid / f"{wnid}_{i + 1}.JPEG" for i in range(count)]
    jobs += [root / "val" / wnid / f"ILSVRC2012_val_{n:08d}.JPEG"
             for n, wnid in enumerate((w for w in sorted(protocol.known + protocol.negative + protocol.unknown)
                                       for _ in range(val_per_class)), start=1)]
    for folder in {path.parent for path in jobs}:
        folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max(1, workers)) as pool:  # Pillow releases the GIL while encoding
        list(pool.map(lambda job: write_jpeg(job[1], size=size, seed=job[0]), enumerate(jobs)))
    return len(jobs)


# --------------------------------------------------------------------------------------------------
# training rows


def make_model(settings: Settings, num_classes: int) -> OpenSetClassifier:
    model = OpenSetClassifier(num_classes=num_classes, loss="eos", backbone=settings.backbone)
    return model.to(memory_format=torch.channels_last) if settings.channels_last else model


def trainer_args(settings: Settings, root: Path) -> dict[str, Any]:
    return {"accelerator": "gpu" if settings.cuda else "cpu", "devices": 1, "precision": settings.precision,
            "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
            "enable_model_summary": False, "benchmark": True if settings.cuda else None, "default_root_dir": str(root)}


class StepTimer(pl.Callback):
    """Wall time of training steps ``warmup + 1 .. warmup + steps`` and the images they used.

    Args:
        warmup, steps: untimed and timed steps.
        synchronize: waits for the device (the GPU queue) at both ends of the timed span.
    """

    def __init__(self, *, warmup: int, steps: int, synchronize: Callable[[], None]) -> None:
        self.warmup, self.steps, self.synchronize = warmup, steps, synchronize
        self.done = self.images = 0
        self.start = self.seconds = math.nan

    def step_done(self, images: int) -> None:
        self.done += 1
        if self.done == self.warmup:
            self.synchronize()
            self.start = time.perf_counter()
        elif self.warmup < self.done <= self.warmup + self.steps:
            self.images += images
            if self.done == self.warmup + self.steps:
                self.synchronize()
                self.seconds = time.perf_counter() - self.start

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.step_done(int(batch.targets.numel()))


def train_lightning(settings: Settings, data: pl.LightningDataModule, *, num_classes: int, root: Path,
                    warmup: int, steps: int) -> tuple[StepTimer, OpenSetClassifier]:
    """``pl.Trainer.fit`` for ``warmup + steps`` steps, timed by a :class:`StepTimer`."""
    model = make_model(settings, num_classes)
    timer = StepTimer(warmup=warmup, steps=steps, synchronize=settings.synchronize)
    trainer = pl.Trainer(**trainer_args(settings, root), max_steps=warmup + steps, limit_val_batches=0,
                         num_sanity_val_steps=0, callbacks=[timer])
    trainer.fit(model, datamodule=data)
    if timer.done != warmup + steps:
        raise RuntimeError(f"Lightning ran {timer.done} steps, {warmup + steps} expected")
    return timer, model


def train_plain(settings: Settings, data: SyntheticData, *, num_classes: int) -> StepTimer:
    """The same steps as :func:`train_lightning` in plain PyTorch: autocast, Adam, zero_grad/backward/step."""
    device = torch.device(settings.device)
    model = make_model(settings, num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    timer = StepTimer(warmup=settings.warmup_steps, steps=settings.steps, synchronize=settings.synchronize)
    bf16 = settings.precision.startswith("bf16")
    for batch in data.train_dataloader():
        batch = data.on_after_batch_transfer(Batch(*(t.to(device, non_blocking=True) for t in batch)), 0)
        plain_step(model, optimizer, batch, bf16=bf16)
        timer.step_done(int(batch.targets.numel()))
        if timer.done == settings.warmup_steps + settings.steps:
            break
    return timer


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def release_memory(settings: Settings) -> None:
    gc.collect()
    if settings.cuda:
        torch.cuda.empty_cache()


def synthetic_data(settings: Settings, *, num_classes: int, batch_size: int, num_batches: int) -> SyntheticData:
    """Training batches cycled from 4 distinct ones, pinned on a GPU machine, NHWC with ``channels_last``."""
    return SyntheticData(num_classes=num_classes, batch_size=batch_size, image_size=settings.crop,
                         num_batches=num_batches, distinct=4, pin=settings.cuda, channels_last=settings.channels_last)


def largest_batch(settings: Settings, *, num_classes: int, root: Path) -> tuple[int, list[int]]:
    """The first of ``settings.batch_sizes`` with which two training steps run; and those that ran out of memory."""
    failed: list[int] = []
    for size in settings.batch_sizes:
        data = synthetic_data(settings, num_classes=num_classes, batch_size=size, num_batches=2)
        fits = True
        try:
            train_lightning(settings, data, num_classes=num_classes, root=root, warmup=1, steps=1)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            fits = False
        del data
        release_memory(settings)  # after the except block, which dropped the traceback and its frames
        if fits:
            return size, failed
        failed.append(size)
        print(f"batch {size}: out of memory", flush=True)
    raise RuntimeError(f"none of the batch sizes {settings.batch_sizes} fits in memory")


@dataclass
class Row:
    """One line of the table. Training rows: ``steps`` timed steps of ``batch_size``; validation rows:
    the batches of one validation epoch. Callback rows: ``seconds`` and ``added_s`` are the time per
    validation epoch inside the callback's hooks, ``images`` what the callback evaluates."""

    row: str
    what: str
    batch_size: int
    steps: int
    images: int
    seconds: float
    images_per_s: float
    added_s: float | None = None
    added_wall_s: float | None = None


def training_row(name: str, what: str, timer: StepTimer, batch_size: int) -> Row:
    return Row(name, what, batch_size, timer.steps, timer.images, timer.seconds, timer.images / timer.seconds)


# --------------------------------------------------------------------------------------------------
# validation rows


def validation_rows(settings: Settings, model: OpenSetClassifier, data: ProtocolData, folder: Path, *,
                    root: Path) -> tuple[list[Row], float]:
    """``trainer.validate`` without evaluation callbacks, with OpenSetEvaluation, with SeverityAUROC.

    Returns:
        Rows 4-6 and the one-off set-up time of the severity data.
    """
    start = time.perf_counter()
    severity_data = ProtocolSeverityData(
        root=str(folder), protocol=PROTOCOL, estimation=settings.estimation, test=settings.severity_test,
        batch_size=data.batch_size, num_workers=settings.num_workers)
    severity_data.setup()
    severity_setup_s = time.perf_counter() - start
    severity_images = sum(len(severity_data[name]) for name in SEVERITY_SETS)
    variants: dict[str, Callable[[], list[pl.Callback]]] = {
        ROWS[3]: list,
        ROWS[4]: lambda: [OpenSetEvaluation(every_n_epochs=1, plot_every_n_epochs=0)],
        ROWS[5]: lambda: [SeverityAUROC(kappas=SEVERITY_KAPPAS, every_n_epochs=1, data=severity_data)],
    }
    costs = {cost.label: cost for cost in callback_costs(
        model, data, variants, trainer_args=lambda number: trainer_args(settings, root / f"validate-{number}"),
        repeat=settings.val_repeat, warmup=int(settings.val_warmup), synchronize=settings.synchronize)}
    val_images = len(data.val_set)
    batches = math.ceil(val_images / data.batch_size)
    base = costs[ROWS[3]].wall_s
    rows = [Row(ROWS[3], f"`trainer.validate`, P{PROTOCOL} validation split, no evaluation callbacks",
                data.batch_size, batches, val_images, base, val_images / base)]
    for name, images, what in (
        (ROWS[4], val_images, "`OpenSetEvaluation(every_n_epochs=1, plot_every_n_epochs=0)`: gather, OSCR, "
                              "CCR@FPR, AUROC of the epoch's predictions"),
        (ROWS[5], severity_images, f"`SeverityAUROC(kappas={SEVERITY_KAPPAS})`, `ProtocolSeverityData`: "
                                   "3 passes (ID, OOD estimation, OOD test), tables, figures"),
    ):
        inside = costs[name].hooks_s
        rows.append(Row(name, what, data.batch_size, batches, images, inside, images / inside, added_s=inside,
                        added_wall_s=costs[name].wall_s - base))
    return rows, severity_setup_s


def decode_rows(settings: Settings, model: OpenSetClassifier, data: ProtocolData, folder: Path, *,
                root: Path, batch_size: int) -> list[Row]:
    """Rows 7-10: the engine's scoring pass over every image of ``folder``, from the folder and from its shard
    set, decoded on the CPU and on the device."""
    from lightning_fabric import Fabric

    from datamodules.evaluation import EvaluationSet
    from datamodules.images import ImageFileDataset
    from datamodules.shards import folder_rows, write_shards
    from evaluation_engine.runner import Runner
    from evaluation_engine.scoring import ScoringPasses
    from lightning_modules.scoring import ScoringModel

    rows = [(path, 0) for path, _ in folder_rows(folder)]
    shards = write_shards(folder, folder_rows(folder), root / "shards", source={"kind": "folder"},
                          workers=max(1, settings.num_workers), log=lambda message: None)
    scoring = ScoringModel(model, model_input=data.model_input(), name="benchmark").to(settings.device).eval()
    if settings.channels_last:
        scoring = scoring.to(memory_format=torch.channels_last)
    runner = Runner(fabric=Fabric(accelerator="gpu" if settings.cuda else "cpu", devices=1,
                                  precision=settings.precision))
    result = []
    for name, where, decode in zip(DECODE_ROWS, ("folders", "shards", "folders", "shards"),
                                   ("cpu", "cpu", "device", "device"), strict=True):
        images = EvaluationSet(where, "ood", ImageFileDataset(str(folder) if where == "folders" else shards.root, rows))
        best = math.inf
        for _ in range(2):
            passes = ScoringPasses(decode=decode, memo=False)
            settings.synchronize()
            start = time.perf_counter()
            with torch.inference_mode():
                outputs = passes.outputs(runner, scoring, images, batch_size=batch_size, num_workers=settings.num_workers)
            settings.synchronize()
            best = min(best, time.perf_counter() - start)
        assert outputs["logits"].shape[0] == len(rows)
        result.append(Row(name, f"`ScoringPasses(decode={decode!r}).outputs`, every JPEG of the folder, from {where}, "
                                f"{settings.num_workers} workers", batch_size, math.ceil(len(rows) / batch_size),
                          len(rows), best, len(rows) / best))
    return result


# --------------------------------------------------------------------------------------------------
# report


def device_line(settings: Settings) -> str:
    if settings.cuda:
        props = torch.cuda.get_device_properties(0)
        gpu = f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    else:
        gpu = "no GPU (tiny CPU run)"
    return (f"{gpu}; {os.cpu_count()} CPU cores; torch {torch.__version__}, Lightning {pl.__version__}; "
            f"{settings.backbone}, precision {settings.precision}, channels_last {settings.channels_last}, "
            f"{settings.crop} px")


def markdown(rows: list[Row], settings: Settings, *, failed: list[int], files: int, severity_setup_s: float,
             peak_gib: float | None, elapsed_s: float) -> str:
    main = table(
        ["row", "what", "batch", "steps", "images", "seconds", "images/s", "added s/epoch (in hooks)",
         "added s/epoch (wall)"],
        [(r.row, r.what, r.batch_size, r.steps, f"{r.images:,}", f"{r.seconds:.3f}", f"{r.images_per_s:,.0f}",
          "—" if r.added_s is None else f"{r.added_s:.3f}",
          "—" if r.added_wall_s is None else f"{r.added_wall_s:+.3f}") for r in rows])
    by_name = {r.row: r for r in rows}
    lightning, plain, jpeg = (by_name[name] for name in TRAINING_ROWS)
    facts = table(["", ""], [
        ("batch", f"the first of {', '.join(map(str, settings.batch_sizes))} that fits"
                  + (f" ({', '.join(map(str, failed))} ran out of memory)" if failed else "")),
        ("peak GPU memory", "—" if peak_gib is None else f"{peak_gib:.1f} GiB"),
        ("Lightning / plain, time per image (synthetic)", f"{plain.images_per_s / lightning.images_per_s:.3f}"),
        ("JPEG pipeline / synthetic, images/s", f"{jpeg.images_per_s / lightning.images_per_s:.2f} "
                                                f"({settings.num_workers} workers, {files:,} JPEGs of "
                                                f"{settings.jpeg_size} px)"),
        ("synthetic / public A100 reference", f"{lightning.images_per_s / A100_REFERENCE:.2f} "
                                              f"(of {A100_REFERENCE:,} img/s)"),
        ("scoring pass, device / CPU decode", " · ".join(
            f"{where} {by_name[device].images_per_s / by_name[cpu].images_per_s:.2f}" for where, cpu, device in
            (("folders", DECODE_ROWS[0], DECODE_ROWS[2]), ("shards", DECODE_ROWS[1], DECODE_ROWS[3])))),
        ("scoring pass, shards / folders", " · ".join(
            f"{decode} decode {by_name[shards].images_per_s / by_name[files].images_per_s:.2f}" for decode, files, shards
            in (("CPU", DECODE_ROWS[0], DECODE_ROWS[1]), ("device", DECODE_ROWS[2], DECODE_ROWS[3])))),
        ("severity data set-up (once per fit)", f"{severity_setup_s:.2f} s"),
        ("whole run", f"{elapsed_s:.0f} s"),
    ])
    return "\n".join([
        f"Device: {device_line(settings)}. Training rows: {settings.steps} steps timed after "
        f"{settings.warmup_steps} warm-up step{'s' if settings.warmup_steps > 1 else ''}, the device synchronised at both ends. Callback rows: time inside "
        f"the callback's hooks per validation epoch, best of {settings.val_repeat}"
        f"{' after a warm-up round' if settings.val_warmup else ''}, and the difference of the whole validate "
        "calls. Public reference: NVIDIA DeepLearningExamples, ResNet-50 v1.5, PyTorch AMP, 1x A100 80GB.",
        "", main, "", facts])


def run(settings: Settings, work: Path) -> tuple[list[Row], str]:
    """Every row; returns them and the Markdown section."""
    began = time.perf_counter()
    protocol = imagenet_protocol(PROTOCOL)
    folder = work / "imagenet"
    for used in (folder, work / "protocols"):
        if used.exists():
            raise FileExistsError(f"{used} exists: give an empty --work-dir (files of another run would be mixed in)")
    files = write_imagenet_folder(
        folder, protocol, train_per_class=settings.train_per_class(len(protocol.known) + len(protocol.negative)),
        unknown_train_per_class=settings.unknown_train_per_class, val_per_class=settings.val_per_class,
        size=settings.jpeg_size, workers=max(settings.num_workers, os.cpu_count() or 1))
    print(f"wrote {files:,} JPEGs in {time.perf_counter() - began:.1f} s", flush=True)
    num_classes = protocol.num_classes
    batch_size, failed = largest_batch(settings, num_classes=num_classes, root=work)
    print(f"batch size {batch_size}", flush=True)
    total_steps = settings.warmup_steps + settings.steps
    synthetic = synthetic_data(settings, num_classes=num_classes, batch_size=batch_size, num_batches=total_steps)
    if settings.cuda:
        torch.cuda.reset_peak_memory_stats()
    timer = train_lightning(settings, synthetic, num_classes=num_classes, root=work,  # the model is dropped: memory
                            warmup=settings.warmup_steps, steps=settings.steps)[0]
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if settings.cuda else None
    rows = [training_row(ROWS[0], "`pl.Trainer.fit`, synthetic uint8 batches (converted on the device)", timer,
                         batch_size)]
    release_memory(settings)
    rows.append(training_row(ROWS[1], "plain loop: the same model, batches, autocast, Adam",
                             train_plain(settings, synthetic, num_classes=num_classes), batch_size))
    del synthetic
    release_memory(settings)
    data = ProtocolData(root=str(folder), protocol=PROTOCOL, protocol_dir=str(work / "protocols"),
                        batch_size=batch_size, num_workers=settings.num_workers, resize_size=settings.resize,
                        crop_size=settings.crop, pin_memory=settings.cuda)
    data.channels_last = settings.channels_last
    data.prepare_data()
    data.setup("fit")
    if len(data.train_set) < total_steps * batch_size:
        warnings.warn(f"{len(data.train_set)} training images: the timed steps cross an epoch boundary", stacklevel=2)
    timer, model = train_lightning(settings, data, num_classes=num_classes, root=work,
                                   warmup=settings.warmup_steps, steps=settings.steps)
    rows.append(training_row(ROWS[2], f"`pl.Trainer.fit`, `ImageNetProtocolDataModule` P{PROTOCOL}: JPEG decoding "
                             f"+ train transform, {settings.num_workers} workers", timer, batch_size))
    for row in rows:
        print(f"{row.row}: {row.images_per_s:,.1f} img/s", flush=True)
    release_memory(settings)
    validation, severity_setup_s = validation_rows(settings, model, data, folder, root=work)
    rows += validation
    release_memory(settings)
    rows += decode_rows(settings, model, data, folder, root=work, batch_size=batch_size)
    for row in rows[-len(DECODE_ROWS):]:
        print(f"{row.row}: {row.images_per_s:,.1f} img/s", flush=True)
    return rows, markdown(rows, settings, failed=failed, files=files, severity_setup_s=severity_setup_s,
                          peak_gib=peak_gib, elapsed_s=time.perf_counter() - began)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the benchmark, print the table and, with ``--write``, put it in RESULTS.md.

    Returns:
        The table: one dict per row (the fields of :class:`Row`), in the order of :data:`ROWS`.
    """
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--work-dir", help="empty folder for the generated JPEGs and run files (default: a temp dir)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="batch sizes to try, largest first")
    parser.add_argument("--steps", type=int, help="timed training steps")
    parser.add_argument("--warmup-steps", type=int, help="untimed training steps before them")
    args = parse(parser, argv)
    if not (args.tiny or torch.cuda.is_available()):
        if args.write:
            parser.error("--write records GPU numbers, and there is no CUDA device")
        print("no CUDA device: running the tiny CPU version", flush=True)
        args.tiny = True
    overrides = {key: value for key, value in (("batch_sizes", tuple(args.batch_sizes or ())),
                                               ("steps", args.steps), ("warmup_steps", args.warmup_steps)) if value}
    settings = replace(TINY if args.tiny else GPU, **overrides)
    threads = torch.get_num_threads()
    if args.tiny:
        torch.set_num_threads(1)
    try:
        with quiet():
            if args.work_dir:
                rows, body = run(settings, Path(args.work_dir))
            else:
                with tempfile.TemporaryDirectory() as work:
                    rows, body = run(settings, Path(work))
    finally:  # main() also runs in-process (tests): leave the process as it was
        torch.set_num_threads(threads)
    finish(args, SECTION, body, script="benchmarks.gpu_throughput")
    return [asdict(row) for row in rows]


if __name__ == "__main__":
    main()
