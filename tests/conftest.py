"""Shared fixtures: tiny ImageNet-shaped folders with real wnids, made by the tests themselves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.protocols import imagenet_protocol

ROOT = Path(__file__).resolve().parents[1]
TRAIN_IMAGES_PER_CLASS = 5
VAL_IMAGES_PER_CLASS = 2

# Keep W&B and matplotlib quiet and offline in every test, and never let a test reach the network.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# what a run in this process leaves in the environment that a child process must not inherit: a DDP rendezvous,
# and the address of this process's W&B service, which a child would join (and find its resumed run "in use")
DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")
INHERITED_ENV = (*DISTRIBUTED_ENV, "WANDB_SERVICE")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a command the tests run as a user would: this project importable, nothing inherited."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_ENV}
    env.update({"PYTHONPATH": str(ROOT), **extra})
    return env


def write_jpeg(path: Path, rng: np.random.Generator, size: int = 12) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=70)


def make_imagenet_folder(root: Path, wnids: list[str], *, train: int = TRAIN_IMAGES_PER_CLASS, val: int = VAL_IMAGES_PER_CLASS,
                         seed: int = 0) -> Path:
    """``root/train/<wnid>/<wnid>_<i>.JPEG`` and ``root/val/<wnid>/ILSVRC2012_val_<j>.JPEG``."""
    rng = np.random.default_rng(seed)
    counter = 0
    for wnid in wnids:
        for i in range(train):
            write_jpeg(root / "train" / wnid / f"{wnid}_{i + 1}.JPEG", rng)
        for _ in range(val):
            counter += 1
            write_jpeg(root / "val" / wnid / f"ILSVRC2012_val_{counter:08d}.JPEG", rng)
    return root


def protocol_wnids(*numbers: int) -> list[str]:
    wnids: set[str] = set()
    for number in numbers:
        protocol = imagenet_protocol(number)
        wnids |= set(protocol.known) | set(protocol.negative) | set(protocol.unknown)
    return sorted(wnids)


@pytest.fixture(scope="session")
def tiny_imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every class of P1, P2 and P3, 5 train and 2 val images each (read-only for tests)."""
    return make_imagenet_folder(tmp_path_factory.mktemp("imagenet"), protocol_wnids(1, 2, 3))


@pytest.fixture()
def tiny_p2(tmp_path: Path) -> Path:
    """A private, writable ImageNet folder with the classes of P2 only (tests may break it)."""
    return make_imagenet_folder(tmp_path / "imagenet", protocol_wnids(2))


def train_demo_checkpoint(directory: Path, loss: str, steps: int = 5, seed: int = 0) -> Path:
    """A Fashion-MNIST OpenSetClassifier checkpoint (small CNN, a few training steps) written by Lightning."""
    import pytorch_lightning as pl

    from datamodules import FashionMNISTOpenSetDataModule
    from lightning_modules import OpenSetClassifier, train_negatives_for_loss

    pl.seed_everything(seed)
    data = FashionMNISTOpenSetDataModule(max_train_per_class=40, batch_size=32, train_negatives=train_negatives_for_loss(loss))
    model = OpenSetClassifier(num_classes=4, loss=loss, backbone="small_cnn", in_channels=1)
    return fit_and_save(model, data, directory, steps)


def fit_and_save(model: Any, data: Any, directory: Path, steps: int) -> Path:
    """``steps`` CPU training steps of ``model`` on ``data``; the checkpoint ``<directory>/checkpoints/best.ckpt``."""
    import pytorch_lightning as pl

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=data)
    path = directory / "checkpoints" / "best.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An EOS checkpoint of the demo (``.../demo/checkpoints/best.ckpt``)."""
    return train_demo_checkpoint(tmp_path_factory.mktemp("checkpoint") / "demo", "eos")


@pytest.fixture(scope="session")
def bg_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A background-class checkpoint of the demo (``.../bg/checkpoints/best.ckpt``, 5 logits for 4 classes)."""
    return train_demo_checkpoint(tmp_path_factory.mktemp("checkpoint") / "bg", "bg", steps=15)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for a module's tests: the machine's two cores are shared, and with several
    threads per process (the DDP tests run two) they only contend for them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def install_package(folder: Path, *, distribution: str, modules: dict[str, str], entry_points: dict[str, dict[str, str]],
                    version: str = "0.1") -> Path:
    """A package as pip would leave it in ``folder`` (put that on ``sys.path``): its modules (name -> source), and
    a dist-info whose ``entry_points.txt`` declares ``entry_points`` (group -> name -> ``module:object``), so that
    ``importlib.metadata`` finds its plug-ins."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    info = folder / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items())
        for group, entries in entry_points.items()))
    return folder
