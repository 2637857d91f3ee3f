"""Raw data sources, without Lightning: the Fashion-MNIST IDX files, scikit-learn's digits, image folders, and
real OOD sets by name.

Fashion-MNIST (Xiao, Rasul, Vollgraf, 2017): ten classes of 28x28 grey-scale clothing images, read from the
IDX files of Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``) or of any
folder in that layout or torchvision's (``FashionMNIST/raw``). Nothing is downloaded here: a folder without
the files is an error that says where they must be. The decoded arrays are kept (read-only) for the rest of
the process, keyed by the files' sizes and modification times, so every datamodule and data set of a run
reads each file once.

scikit-learn's digits: the real 8x8 handwritten digits (1,797 images) bundled with scikit-learn, upsampled.
"""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import numpy as np
import torch

from datamodules.images import image_files_under

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
DEMO_KNOWN = (0, 1, 7, 8)
DEMO_NEGATIVE = (2, 3, 5)
DEMO_UNKNOWN = (4, 6, 9)
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


class FashionMNISTMissing(FileNotFoundError):
    """The Fashion-MNIST IDX files are not in the folder given; the message says where they must be."""


def read_idx(path: str | Path) -> np.ndarray:
    """Read a (gzipped) IDX file of unsigned bytes: images ``(N, H, W)`` or labels ``(N,)``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (magic {data[:4].hex()})")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: header says {shape}, found {array.size} values")
    return array.reshape(shape)


def find_fashion_mnist(data_dir: str | Path) -> Path | None:
    """The folder holding the four IDX files (Debian's layout or torchvision's ``FashionMNIST/raw``)."""
    for candidate in (Path(data_dir), Path(data_dir) / "FashionMNIST" / "raw"):
        if all((candidate / name).is_file() for pair in FASHION_MNIST_FILES.values() for name in pair):
            return candidate
    return None


def require_fashion_mnist(data_dir: str | Path) -> Path:
    """The folder of the IDX files, or :class:`FashionMNISTMissing` saying where they must be."""
    folder = find_fashion_mnist(data_dir)
    if folder is None:
        names = ", ".join(name for pair in FASHION_MNIST_FILES.values() for name in pair)
        raise FashionMNISTMissing(
            f"Fashion-MNIST IDX files not found in {data_dir} (nor in {Path(data_dir) / 'FashionMNIST' / 'raw'}): "
            f"put {names} there, or install Debian's dataset-fashion-mnist (it puts them in "
            f"{DEBIAN_FASHION_MNIST_DIR}, the default data_dir); FashionMNISTOpenSetDataModule(download=True) "
            "downloads them with torchvision instead"
        )
    return folder


@functools.lru_cache(maxsize=8)
def _decoded(images_file: str, labels_file: str, stamp: tuple) -> tuple[np.ndarray, np.ndarray]:
    images, labels = read_idx(images_file), read_idx(labels_file)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images_file}: {images.shape[0]} images but {labels_file} has {labels.shape[0]} labels")
    return images, labels


def load_fashion_mnist(data_dir: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images (N, 28, 28) uint8, labels (N,) uint8)`` of the ``"train"`` or ``"test"`` split (read-only
    arrays, decoded once per process and files)."""
    if split not in FASHION_MNIST_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    folder = require_fashion_mnist(data_dir)
    files = [str((folder / name).resolve()) for name in FASHION_MNIST_FILES[split]]
    stamp = tuple((os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files)
    return _decoded(files[0], files[1], stamp)


def load_digits_images(size: int = 28) -> tuple[torch.Tensor, np.ndarray]:
    """scikit-learn's real 8x8 digits (1,797 images, 0-16 grey levels) as ``(N, 1, size, size)`` in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    images = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return images.clamp(0, 1), digits.target.astype(np.int64)


def folder_images(folder: str | Path) -> list[str]:
    """Every image file under ``folder`` (sub-folders included), as sorted paths relative to it; other files
    are left out with a warning that counts them (:func:`datamodules.images.image_files_under`)."""
    return image_files_under(folder)
