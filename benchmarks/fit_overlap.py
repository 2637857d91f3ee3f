"""The check that no detector is fitted on the data it is tested on (:func:`datamodules.overlap.find_overlap`, run
once per fit set and evaluation set by :meth:`ScoringPasses.check_fit_overlap`) on an ImageNet-shaped tree, beside
the fingerprint stat the run already does for the same two sets (:meth:`EvaluationSet.fingerprint`:
``files_fingerprint`` stats every file).

The tree: ``--classes`` class folders of real ImageNet-1k wnids, ``--train`` training files and ``--val``
validation files each (1000 x (96 + 4) = 100k files by default: the ImageNet split's 25:1 ratio), and a ``pool/``
split of ``--pool`` files each (1000 x 270 = 270k: the severity command's 21k pool, about 3.6M images, is 2.8 times
ImageNet's 1.28M training images, whose fit set the command compares with it). The file sizes
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
- ``train/ vs pool/``: the severity command's fit set against its pool (most sizes shared: many head reads), then
  the same check in a second run, whose :class:`ScoringPasses` takes both sets' identities from ``cache_dir``
  (:meth:`SetImages.save` by the first; the sets' fingerprints, which the run computes for its passes anyway,
  are computed before the clock starts);
- ``Fashion-MNIST train vs test``: the demo's tensor sets (60k and 10k images: a digest of every image);
- ``PNG exports of Fashion-MNIST train vs test``: the demo's ``--fit-data`` as files against its in-memory test
  images (every file's header read, and every 28 x 28 file decoded and compared by its pixels).

The last rows estimate the full ImageNet runs (1.28M training images against the 50k validation images, and
against the 3.6M of the 21k pool, first run and second run) from the per-file costs measured here and the share
of same-size files at that scale (sizes drawn from the same distribution).

    python -m benchmarks.fit_overlap [--tiny] [--write] [--work-dir DIR] [--classes 1000] [--train 96] [--val 4]
        [--pool 270] [--exports 60000]
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import alternate, benchmark_parser, finish, load_average, machine, parse, table
from datamodules.evaluation import EvaluationSet
from datamodules.images import ImageFileDataset, TensorImageDataset
from datamodules.overlap import HEAD_BYTES, SetImages, find_overlap
from datamodules.protocols import imagenet1k_wnids
from evaluation_engine.scoring import ScoringPasses

SECTION = "Fit sets against the evaluation data"
MEAN_BYTES = 110_000  # ILSVRC2012's mean JPEG size (138 GB / 1.28M images)
SIGMA = 0.6
FULL_TRAIN, FULL_VAL = 1_281_167, 50_000
FULL_POOL = 3_600_000  # the severity command's ImageNet-21k pool (images of the classes it keeps)


def file_sizes(count: int, rng: np.random.Generator) -> np.ndarray:
    """Log-normal sizes with mean :data:`MEAN_BYTES`, clipped to 1 KB .. 16 MB (all above the 4 KB head)."""
    median = MEAN_BYTES / np.exp(SIGMA**2 / 2)
    return np.clip(rng.lognormal(np.log(median), SIGMA, count), max(1024, HEAD_BYTES + 1), 16 * 2**20).astype(np.int64)


def write_file(path: Path, head: bytes, size: int) -> None:
    with open(path, "wb") as handle:
        handle.write(head)
        handle.truncate(size)  # a hole up to the size: no disk space


def make_tree(root: Path, classes: int, train: int, val: int, pool: int = 0, seed: int = 0
              ) -> dict[str, list[tuple[str, int]]]:
    """``train/<wnid>/*``, ``val/<wnid>/*`` and ``pool/<wnid>/*`` (see the module docstring): the rows of each
    split."""
    rng = np.random.default_rng(seed)
    wnids = imagenet1k_wnids()[:classes]
    rows: dict[str, list[tuple[str, int]]] = {"train": [], "val": [], "pool": []}
    for split, per_class in (("train", train), ("val", val), ("pool", pool)):
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


def read_counts(*sets: SetImages) -> dict[str, int]:
    """What the check read of the sets: heads, whole files, image headers (files opened to compare with tensor
    images) and files decoded."""
    def done(images: SetImages, stage: str) -> int:
        return int((images._stages[stage][1] != 0).sum()) if stage in images._stages else 0

    return {"heads": sum(done(s, "head") for s in sets), "wholes": sum(done(s, "whole") for s in sets),
            "headers": sum(int((s._dims[:, 0] != -2).sum()) if s._dims is not None else 0 for s in sets),
            "decoded": sum(done(s, stage) for s in sets for stage in ("pixels1", "pixels3"))}


@contextmanager
def counted_reads() -> Iterator[dict[str, int]]:
    """What the check reads from the files while inside: stats of a set, heads, whole files, opened images."""
    reads = {"stats": 0, "heads": 0, "wholes": 0, "opened": 0}
    read, look, stat = SetImages._read, SetImages._look, SetImages.stat

    def counted_read(self: SetImages, row: int, head: bool) -> bytes | None:
        reads["heads" if head else "wholes"] += 1
        return read(self, row, head)

    def counted_look(self: SetImages, row: int, wanted: Any) -> Any:
        reads["opened"] += 1
        return look(self, row, wanted)

    def counted_stat(self: SetImages) -> Any:
        reads["stats"] += self._stat is None
        return stat(self)

    SetImages._read, SetImages._look, SetImages.stat = counted_read, counted_look, counted_stat  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        SetImages._read, SetImages._look, SetImages.stat = read, look, stat  # type: ignore[method-assign]


def measure(fit: Callable[[], EvaluationSet], other: Callable[[], EvaluationSet], repeat: int, *,
            cache_dir: Path | None = None) -> dict[str, Any]:
    """Best seconds of the fingerprints of both sets and of the check (fresh sets each time), and what the
    check read. With ``cache_dir``: also the check of a second run (``second_s``): a fresh :class:`ScoringPasses`
    on ``cache_dir``, where a first one saved both sets' identities, the sets' fingerprints computed before."""
    measured: dict[str, Any] = {}

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
        measured.update(count=overlap.count, hows=overlap.hows, images=a.size + b.size, **read_counts(a, b))
        return seconds

    cases: dict[str, Callable[[], float]] = {"fingerprints": fingerprints, "check": check}
    if cache_dir is not None:
        ScoringPasses(cache_dir).overlap(fit(), other())  # the first run: computes and saves the identities

        def second() -> float:
            a, b = fit(), other()
            a.fingerprint(), b.fingerprint()
            passes = ScoringPasses(cache_dir)
            with counted_reads() as reads:
                start = time.perf_counter()
                overlap = passes.overlap(a, b)
                seconds = time.perf_counter() - start
            measured.update(second_count=overlap.count, second_reads=reads)
            return seconds

        cases["second run"] = second
    times = alternate(cases, repeat=repeat)
    return {**measured, "fingerprint_s": min(times["fingerprints"]), "check_s": min(times["check"]),
            **({"second_s": min(times["second run"])} if cache_dir is not None else {})}


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


def header_seconds(files: EvaluationSet, repeat: int) -> float:
    """Seconds to read one file's image header (PIL's open: the size without decoding) as the check of files
    against tensor images does for every file, decoding none here (best of ``repeat``, fresh objects)."""
    best = float("inf")
    for _ in range(repeat):
        images = SetImages(files)
        start = time.perf_counter()
        images.decoded([(1, 1, 1)])  # a size no file has: every header read, nothing decoded
        best = min(best, time.perf_counter() - start)
    return best / max(len(files), 1)


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


def write_exports(folder: Path, images: torch.Tensor) -> list[tuple[str, int]]:
    """Each image ``(N, 1, 28, 28)`` uint8 as a grey PNG (what a user exporting the demo's images writes); the rows."""
    from PIL import Image

    folder.mkdir(parents=True)
    rows = []
    for k, image in enumerate(images[:, 0].numpy()):
        Image.fromarray(image).save(folder / f"{k}.png")
        rows.append((f"{k}.png", 0))
    return rows


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
    parser.add_argument("--pool", type=int, default=270, help="pool files per class (the severity pool's share)")
    parser.add_argument("--exports", type=int, default=60_000, help="Fashion-MNIST training images exported as PNG")
    parser.add_argument("--repeat", type=int, default=3)
    args = parse(parser, argv)
    if args.tiny:
        args.classes, args.train, args.val, args.pool, args.exports, args.repeat = 20, 8, 2, 20, 300, 1
    if args.work_dir is not None:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        root = Path(work) / "ILSVRC2012"
        started = time.perf_counter()
        rows = make_tree(root, args.classes, args.train, args.val, args.pool)
        copy_tree(root / "val", Path(work) / "copy", rows["val"])
        link_tree(root / "val", Path(work) / "links")
        tree_seconds = time.perf_counter() - started

        def files(folder: Path, split: str, role: str) -> Callable[[], EvaluationSet]:
            return lambda: EvaluationSet(split, role, ImageFileDataset(str(folder), rows[split]))  # type: ignore[arg-type]

        val = files(root / "val", "val", "id_test")
        results["train/ vs val/ (nothing shared)"] = measure(files(root / "train", "train", "fit"), val, args.repeat)
        results["a copy of val/ vs val/"] = measure(files(Path(work) / "copy", "val", "fit"), val, args.repeat)
        results["links to val/ vs val/"] = measure(files(Path(work) / "links", "val", "fit"), val, args.repeat)
        pool = measure(files(root / "train", "train", "fit"), files(root / "pool", "pool", "ood"), args.repeat,
                       cache_dir=Path(work) / "cache")
        results["train/ vs pool/ (the severity pool)"] = pool
        head_s = head_seconds(files(root / "train", "train", "fit")(), args.repeat)
        train, test, kind = fashion_sets()
        if args.tiny:
            train, test = (TensorImageDataset(d.images[:600], d.labels[:600]) for d in (train, test))
        results[f"Fashion-MNIST train vs test ({kind} tensors)"] = measure(
            lambda: EvaluationSet("train", "fit", train), lambda: EvaluationSet("test", "id_test", test), args.repeat)
        exported = write_exports(Path(work) / "exports", train.images[:args.exports])

        def exports() -> EvaluationSet:
            return EvaluationSet("train", "fit", ImageFileDataset(str(Path(work) / "exports"), exported))

        results[f"PNG exports of Fashion-MNIST train ({len(exported)} files) vs test ({kind} tensors)"] = measure(
            exports, lambda: EvaluationSet("test", "id_test", test), args.repeat)
        header_s = header_seconds(exports(), args.repeat)
    disjoint = results["train/ vs val/ (nothing shared)"]
    files_per_side = args.classes * (args.train + args.val)
    share_fit, share_val = same_size_share(FULL_TRAIN, FULL_VAL)
    share_train_pool, share_pool = same_size_share(FULL_TRAIN, FULL_POOL)
    # per file, from the ordinary case: the fingerprint's stat, the check without its head reads, a head read
    images = disjoint["images"]
    stat_s = disjoint["fingerprint_s"] / images
    check_file_s = max(disjoint["check_s"] - disjoint["heads"] * head_s, 0.0) / images
    heads = share_fit * FULL_TRAIN + share_val * FULL_VAL
    second_file_s = pool["second_s"] / pool["images"]  # a second run, per file: the saved identities and keys
    pool_files, pool_heads = FULL_TRAIN + FULL_POOL, share_train_pool * FULL_TRAIN + share_pool * FULL_POOL
    estimate = {"stat_s": stat_s, "check_file_s": check_file_s, "head_s": head_s, "share_fit": share_fit,
                "share_val": share_val, "heads": heads, "fingerprint_s": stat_s * (FULL_TRAIN + FULL_VAL),
                "check_s": check_file_s * (FULL_TRAIN + FULL_VAL) + head_s * heads,
                "pool": {"share_fit": share_train_pool, "share_pool": share_pool, "heads": pool_heads,
                         "fingerprint_s": stat_s * pool_files, "check_s": check_file_s * pool_files + head_s * pool_heads,
                         "second_s": second_file_s * pool_files, "second_file_s": second_file_s}}
    big = estimate["pool"]
    rows_out = []
    for name, r in results.items():
        rows_out.append([name, r["images"], f"{r['fingerprint_s']:.3f}", f"{r['check_s']:.3f}",
                         f"{r['check_s'] / r['fingerprint_s']:.2f}x", r["heads"], r["wholes"],
                         f"{r['headers']} / {r['decoded']}", r["count"],
                         ", ".join(f"{how} {n}" for how, n in r["hows"].items() if n) or "—"])
        if "second_s" in r:
            rows_out.append([f"{name}, second run (identities from cache_dir)", r["images"], f"{r['fingerprint_s']:.3f}",
                             f"{r['second_s']:.3f}", f"{r['second_s'] / r['fingerprint_s']:.2f}x",
                             r["second_reads"]["heads"], r["second_reads"]["wholes"],
                             f"{r['second_reads']['opened']} / 0", r["second_count"], "—"])
    rows_out.append([f"ImageNet estimate: 1.28M train vs 50k val ({share_fit:.0%} / {share_val:.0%} same-size)",
                     FULL_TRAIN + FULL_VAL, f"{estimate['fingerprint_s']:.0f}", f"{estimate['check_s']:.0f}",
                     f"{estimate['check_s'] / estimate['fingerprint_s']:.2f}x",
                     round(heads), 0, "0 / 0", 0, "—"])
    rows_out.append([f"ImageNet estimate: 1.28M train vs the 3.6M of the 21k pool ({share_train_pool:.0%} / "
                     f"{share_pool:.0%} same-size)", pool_files, f"{big['fingerprint_s']:.0f}", f"{big['check_s']:.0f}",
                     f"{big['check_s'] / big['fingerprint_s']:.2f}x", round(pool_heads), 0, "0 / 0", 0, "—"])
    rows_out.append(["the same, second run (identities from cache_dir)", pool_files, f"{big['fingerprint_s']:.0f}",
                     f"{big['second_s']:.0f}", f"{big['second_s'] / big['fingerprint_s']:.2f}x", 0, 0, "0 / 0", 0,
                     "—"])
    body = (f"Machine: {machine()}; load {load_average()}. Tree: {args.classes} classes x ({args.train} + {args.val} "
            f"+ {args.pool} pool) files (written in {tree_seconds:.1f} s), best of {args.repeat}.\n\n"
            + table(["fit set vs evaluation set", "images (both)", "fingerprints (s)", "check (s)",
                     "check / fingerprints", "heads read", "read whole", "headers / decoded", "shared", "how"],
                    rows_out)
            + "\n\n" + table(["per file (the ordinary case)", "µs"],
                              [["the fingerprint's stat", f"{stat_s * 1e6:.1f}"],
                               ["the check without its head reads (stat, sizes, keys)", f"{check_file_s * 1e6:.1f}"],
                               ["a head read (open, 4 KB, blake2b; 20k files, 8 threads)", f"{head_s * 1e6:.1f}"],
                               ["a second run's check (identities from cache_dir: load, keys, compare)",
                                f"{second_file_s * 1e6:.2f}"],
                               ["an image header read (PIL's open, against tensor images; PNG exports, 8 threads)",
                                f"{header_s * 1e6:.1f}"]]))
    finish(args, SECTION, body, script="benchmarks.fit_overlap")
    return {"cases": results, "estimate": estimate, "files": files_per_side, "head_s": head_s, "header_s": header_s}


if __name__ == "__main__":
    main()
