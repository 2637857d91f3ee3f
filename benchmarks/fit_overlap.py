"""The check that no detector is fitted on the data it is tested on (:func:`datamodules.overlap.find_overlap`, run
once per fit set and evaluation set by :meth:`ScoringPasses.check_fit_overlap`) on an ImageNet-shaped tree, beside
the fingerprint stat the run already does for the same two sets (:meth:`EvaluationSet.fingerprint`:
``files_fingerprint`` stats every file).

The tree: ``--classes`` class folders of real ImageNet-1k wnids, ``--train`` training files and ``--val``
validation files each (1000 x (96 + 4) = 100k files by default: the ImageNet split's 25:1 ratio). The file sizes
are drawn from a log-normal with ILSVRC2012's mean JPEG size (about 110 KB; sigma 0.6, clipped to 1 KB..16 MB:
an approximation, no ImageNet on this machine), so that sizes collide between the sets as they do there. Each
file is a distinct random head of 4 KB (a JPEG's first 4 KB hold its header and entropy-coded data, distinct per
image) and a hole up to its size (sparse: 100k files of ImageNet's sizes take 400 MB of disk; reading a hole
costs a memory copy, not a disk read). Warm page cache on a local disk.

Cases, each the check of a fit set against the validation set, best of ``--repeat`` with fresh objects (no
memo), next to the fingerprints of both sets:

- ``train/ vs val/``: the ordinary run (nothing shared): a stat of every file, a 4 KB read of each file whose size
  also occurs in the other set;
- ``a copy of val/``: the issue's first case (every file a copy: read whole);
- ``links to val/``: the issue's second case (a folder of symlinks: the same file, nothing read);
- ``Fashion-MNIST train vs test``: the demo's tensor sets (60k and 10k images: a digest of every image).

A last row estimates the full ImageNet run (1.28M training and 50k validation images) from the per-file costs
measured here and the share of same-size files at that scale (sizes drawn from the same distribution).

    python -m benchmarks.fit_overlap [--tiny] [--write] [--work-dir DIR] [--classes 1000] [--train 96] [--val 4]
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import alternate, benchmark_parser, finish, load_average, machine, parse, table
from datamodules.evaluation import EvaluationSet
from datamodules.images import ImageFileDataset, TensorImageDataset
from datamodules.overlap import HEAD_BYTES, SetImages, find_overlap
from datamodules.protocols import imagenet1k_wnids

SECTION = "Fit sets against the evaluation data"
MEAN_BYTES = 110_000  # ILSVRC2012's mean JPEG size (138 GB / 1.28M images)
SIGMA = 0.6
FULL_TRAIN, FULL_VAL = 1_281_167, 50_000


def file_sizes(count: int, rng: np.random.Generator) -> np.ndarray:
    """Log-normal sizes with mean :data:`MEAN_BYTES`, clipped to 1 KB .. 16 MB (all above the 4 KB head)."""
    median = MEAN_BYTES / np.exp(SIGMA**2 / 2)
    return np.clip(rng.lognormal(np.log(median), SIGMA, count), max(1024, HEAD_BYTES + 1), 16 * 2**20).astype(np.int64)


def write_file(path: Path, head: bytes, size: int) -> None:
    with open(path, "wb") as handle:
        handle.write(head)
        handle.truncate(size)  # a hole up to the size: no disk space


def make_tree(root: Path, classes: int, train: int, val: int, seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    """``train/<wnid>/*`` and ``val/<wnid>/*`` (see the module docstring); the rows of each split, and the
    heads and sizes of the validation files (to write their copies)."""
    rng = np.random.default_rng(seed)
    wnids = imagenet1k_wnids()[:classes]
    rows: dict[str, list[tuple[str, int]]] = {"train": [], "val": []}
    for split, per_class in (("train", train), ("val", val)):
        sizes = file_sizes(classes * per_class, rng)
        heads = rng.bytes(classes * per_class * HEAD_BYTES)
        for label, wnid in enumerate(wnids):
            (root / split / wnid).mkdir(parents=True)
            for i in range(per_class):
                k = label * per_class + i
                name = f"{wnid}_{i}.JPEG"
                write_file(root / split / wnid / name, heads[k * HEAD_BYTES:(k + 1) * HEAD_BYTES], int(sizes[k]))
                rows[split].append((f"{wnid}/{name}", label))
    return rows


def copy_tree(source: Path, target: Path, rows: Sequence[tuple[str, int]]) -> None:
    """A byte-for-byte copy of the files (head, then the same hole), so that the copy stays sparse."""
    for relative, _ in rows:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        with open(source / relative, "rb") as handle:
            head = handle.read(HEAD_BYTES)
        write_file(target / relative, head, os.stat(source / relative).st_size)


def link_tree(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for wnid in sorted(os.listdir(source)):
        os.symlink(source / wnid, target / wnid)


def measure(fit: Callable[[], EvaluationSet], other: Callable[[], EvaluationSet], repeat: int) -> dict[str, Any]:
    """Best seconds of the fingerprints of both sets and of the check (fresh sets each time), and what the
    check read."""
    found: dict[str, Any] = {}

    def fingerprints() -> float:
        a, b = fit(), other()
        start = time.perf_counter()
        a.fingerprint(), b.fingerprint()
        return time.perf_counter() - start

    def check() -> float:
        a, b = SetImages(fit()), SetImages(other())
        start = time.perf_counter()
        overlap = find_overlap(a, b)
        seconds = time.perf_counter() - start
        found.update(count=overlap.count, hows=overlap.hows, heads=len(a._heads) + len(b._heads),
                     wholes=len(a._whole) + len(b._whole), images=a.size + b.size)
        return seconds

    times = alternate({"fingerprints": fingerprints, "check": check}, repeat=repeat)
    return {**found, "fingerprint_s": min(times["fingerprints"]), "check_s": min(times["check"])}


def head_seconds(fit: EvaluationSet, repeat: int, count: int = 20_000) -> float:
    """Seconds to read and digest one file's first 4 KB (best of ``repeat``, fresh objects, ``count`` files)."""
    rows = np.arange(min(count, len(fit)))
    best = float("inf")
    for _ in range(repeat):
        images = SetImages(fit)
        start = time.perf_counter()
        images.digests(rows, head=True)
        best = min(best, time.perf_counter() - start)
    return best / max(rows.size, 1)


def fashion_sets() -> tuple[TensorImageDataset, TensorImageDataset, str]:
    """The demo's Fashion-MNIST train and test images (uint8 tensors), or random ones of their shape."""
    try:
        from datamodules.fashion_mnist import load_fashion_mnist
        from datamodules.sources import DEBIAN_FASHION_MNIST_DIR

        train, train_labels = load_fashion_mnist(DEBIAN_FASHION_MNIST_DIR, "train")
        test, test_labels = load_fashion_mnist(DEBIAN_FASHION_MNIST_DIR, "test")
        return (TensorImageDataset(torch.from_numpy(train.copy()).unsqueeze(1), torch.from_numpy(train_labels.copy())),
                TensorImageDataset(torch.from_numpy(test.copy()).unsqueeze(1), torch.from_numpy(test_labels.copy())),
                "real")
    except (OSError, ValueError):
        generator = torch.Generator().manual_seed(0)
        return (TensorImageDataset(torch.randint(0, 256, (60_000, 1, 28, 28), dtype=torch.uint8, generator=generator),
                                   torch.zeros(60_000)),
                TensorImageDataset(torch.randint(0, 256, (10_000, 1, 28, 28), dtype=torch.uint8, generator=generator),
                                   torch.zeros(10_000)), "random (no Fashion-MNIST here)")


def same_size_share(fit: int, other: int, seed: int = 1) -> tuple[float, float]:
    """The share of ``fit`` files whose size occurs among ``other`` files' sizes, and the converse, for sizes
    of the tree's distribution."""
    rng = np.random.default_rng(seed)
    a, b = file_sizes(fit, rng), file_sizes(other, rng)
    return float(np.isin(a, b).mean()), float(np.isin(b, a).mean())


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--work-dir", default=None, help="where the tree goes (default: a temporary folder)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--train", type=int, default=96)
    parser.add_argument("--val", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parse(parser, argv)
    if args.tiny:
        args.classes, args.train, args.val, args.repeat = 20, 8, 2, 1
    if args.work_dir is not None:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        root = Path(work) / "ILSVRC2012"
        started = time.perf_counter()
        rows = make_tree(root, args.classes, args.train, args.val)
        copy_tree(root / "val", Path(work) / "copy", rows["val"])
        link_tree(root / "val", Path(work) / "links")
        tree_seconds = time.perf_counter() - started

        def files(folder: Path, split: str, role: str) -> Callable[[], EvaluationSet]:
            return lambda: EvaluationSet(split, role, ImageFileDataset(str(folder), rows[split]))  # type: ignore[arg-type]

        val = files(root / "val", "val", "id_test")
        results["train/ vs val/ (nothing shared)"] = measure(files(root / "train", "train", "fit"), val, args.repeat)
        results["a copy of val/ vs val/"] = measure(files(Path(work) / "copy", "val", "fit"), val, args.repeat)
        results["links to val/ vs val/"] = measure(files(Path(work) / "links", "val", "fit"), val, args.repeat)
        head_s = head_seconds(files(root / "train", "train", "fit")(), args.repeat)
    train, test, kind = fashion_sets()
    if args.tiny:
        train, test = (TensorImageDataset(d.images[:600], d.labels[:600]) for d in (train, test))
    results[f"Fashion-MNIST train vs test ({kind} tensors)"] = measure(
        lambda: EvaluationSet("train", "fit", train), lambda: EvaluationSet("test", "id_test", test), args.repeat)
    disjoint = results["train/ vs val/ (nothing shared)"]
    files_per_side = args.classes * (args.train + args.val)
    share_fit, share_val = same_size_share(FULL_TRAIN, FULL_VAL)
    # per file, from the ordinary case: the fingerprint's stat, the check without its head reads, a head read
    images = disjoint["images"]
    stat_s = disjoint["fingerprint_s"] / images
    check_file_s = max(disjoint["check_s"] - disjoint["heads"] * head_s, 0.0) / images
    heads = share_fit * FULL_TRAIN + share_val * FULL_VAL
    estimate = {"stat_s": stat_s, "check_file_s": check_file_s, "head_s": head_s, "share_fit": share_fit,
                "share_val": share_val, "heads": heads, "fingerprint_s": stat_s * (FULL_TRAIN + FULL_VAL),
                "check_s": check_file_s * (FULL_TRAIN + FULL_VAL) + head_s * heads}
    rows_out = [[name, r["images"], f"{r['fingerprint_s']:.3f}", f"{r['check_s']:.3f}",
                 f"{r['check_s'] / r['fingerprint_s']:.2f}x", r["heads"], r["wholes"], r["count"],
                 ", ".join(f"{how} {n}" for how, n in r["hows"].items() if n) or "—"] for name, r in results.items()]
    rows_out.append([f"ImageNet estimate: 1.28M train vs 50k val ({share_fit:.0%} / {share_val:.0%} same-size)",
                     FULL_TRAIN + FULL_VAL, f"{estimate['fingerprint_s']:.0f}", f"{estimate['check_s']:.0f}",
                     f"{estimate['check_s'] / estimate['fingerprint_s']:.2f}x",
                     round(heads), 0, 0, "—"])
    body = (f"Machine: {machine()}; load {load_average()}. Tree: {args.classes} classes x ({args.train} + {args.val}) "
            f"files (written in {tree_seconds:.1f} s), best of {args.repeat}.\n\n"
            + table(["fit set vs evaluation set", "images (both)", "fingerprints (s)", "check (s)",
                     "check / fingerprints", "heads read", "read whole", "shared", "how"], rows_out)
            + "\n\n" + table(["per file (the ordinary case)", "µs"],
                              [["the fingerprint's stat", f"{stat_s * 1e6:.1f}"],
                               ["the check without its head reads (stat, sizes, keys)", f"{check_file_s * 1e6:.1f}"],
                               ["a head read (open, 4 KB, blake2b; 20k files, 8 threads)", f"{head_s * 1e6:.1f}"]]))
    finish(args, SECTION, body, script="benchmarks.fit_overlap")
    return {"cases": results, "estimate": estimate, "files": files_per_side, "head_s": head_s}


if __name__ == "__main__":
    main()
