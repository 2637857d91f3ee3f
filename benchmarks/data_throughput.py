"""Reading the ImageNet-21k pool from a folder tree against reading it from shards, on a synthetic 21k-shaped
tree: the index, the index's memory, and the images/s of a scoring pass; litdata's shards (the project's,
:mod:`datamodules.shards`) beside webdataset's tar shards, in one run.

The tree: ``--classes`` class folders named by real ImageNet-21k wnids (18,252 by default, the pool's
size after filtering), ``--per-class`` real JPEG files each (20 by default), 64-160 px, drawn from a bank
of distinct encoded images (smooth colour fields with noise) so that writing the tree costs file creation,
not encoding. Rows, all in one run:

1. ``index``: the time to know every image of the pool and its fingerprint, as a data set needs them before
   the first batch. Folders: list every class folder (``image_files``, as the datamodules do) and stat every
   file (``files_fingerprint``). litdata shards, the pool's rows (the set's whole listing, in its order, as
   the severity benchmark's pool is read): open the shard set (``shards.json``), recognise the rows as its
   listing by one digest of their paths and take the fingerprint the set recorded. litdata shards, the same
   rows shuffled (any other rows: a subset, another order): open ``index.npz``, look up every row and
   fingerprint it from the manifest. webdataset: read its shard list (the tar names; it keeps no index, so
   a reader knows the images only by streaming them). Best of ``--repeat`` for each. Warm page cache on a local disk
   for both (a shared file system makes the folder listing far slower: one metadata round trip per folder
   and per file).
2. ``index memory``: the peak Python allocation of building the index (tracemalloc), and its extrapolation
   to the full pool's 3.7M images: for the folders and the shuffled rows from two sizes (every row and half
   of them: the slope per row, the set's index arrays scaled with the set, plus what does not grow, such as
   one chunk's temporaries); for the pool's rows linearly (an upper bound).
3. ``pass``: images/s of the scoring pass over ``--pass-images`` images of the pool (evenly spread over the
   classes) with the demo's small CNN (1 x 28 x 28 input, batch 256, ``--workers`` loader processes,
   PIL decoding): ImageFileDataset on the folders, the same data set on the shard set (litdata random access,
   the sample order of the folders), webdataset's ``WebDataset`` over tar shards of the same images
   (streamed in shard order, split between the workers), and the shard set once more with its per-image check
   switched off (the check's cost in a pass, side by side). Best of ``--repeat`` after a warm-up pass.
4. ``where the time goes``: microseconds an image in one process (best of ``--repeat``), over 10,000 images of
   the pass: reading the bytes from a file, reading them from the shard set, decoding them (PIL), the model
   transform.
5. ``checking an image's bytes``: every read from a shard set checks the bytes against the digest recorded
   when the set was written, before they are decoded (:meth:`datamodules.shard_store.ShardSet.read`). The
   candidate digests (xxh3_64, zlib's crc32, blake2b, sha256) in microseconds an image, on this tree's files and
   on realistic ImageNet JPEGs (500 x 375 px, about 110 KB, ImageNet's mean file size), beside what a scoring
   pass spends on such an image anyway (decoding and the model's input transform: the demo's here, ImageNet's
   Resize 256 -> CenterCrop 224 for the 110 KB JPEG); and a read from the shard set with and without the check
   (10,000 images of the pass, one process). The share of the check is its cost over the rest of the image's
   work in the loader (read, decode, transform; the model's forward not counted, so an upper bound).
6. ``write``: the time to write the shards (``--workers`` processes), and to write them again when they are up
   to date (every source file's size and modification time compared with the manifest, the set verified).

    python -m benchmarks.data_throughput [--tiny] [--write] [--work-dir DIR] [--classes N] [--per-class N]
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import time
import tracemalloc
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms as T
import xxhash
from PIL import Image
from torch.utils.data import DataLoader

from benchmarks.common import benchmark_parser, finish, parse, quiet, table
from datamodules.batch import collate_samples
from datamodules.images import ImageFileDataset, image_files
from datamodules.shard_store import DIGESTS_ARRAY, LOOKUP_ARRAYS, ShardSet, array_digest
from datamodules.shards import write_shards
from openset_common.artefacts import files_fingerprint

SECTION = "Data throughput: the 21k pool from folders and from shards"
FULL_POOL = 18_252 * 200  # the C-OOD pool: 200 images of each of 18,252 classes
DIGESTS = {  # the candidates for the digest every read checks: name -> digest of bytes
    "xxh3_64 (xxhash): the digest every read checks": xxhash.xxh3_64_intdigest,
    "crc32 (zlib)": zlib.crc32,
    "blake2b, 8 bytes (hashlib)": lambda data: hashlib.blake2b(data, digest_size=8).digest(),
    "sha256 (hashlib): the manifest's, for verify --full and write --full": lambda data: hashlib.sha256(data).digest(),
}
IMAGENET_EVAL = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])


def image_bank(count: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct JPEG files (bytes), 64-160 px a side: smooth colour fields with noise."""
    rng = np.random.default_rng(seed)
    bank = []
    for _ in range(count):
        h, w = rng.integers(64, 161, size=2)
        field = rng.uniform(0, 255, size=(4, 4, 3)).astype(np.uint8)
        image = Image.fromarray(field).resize((int(w), int(h)), Image.BILINEAR)
        pixels = np.asarray(image).astype(np.int16) + rng.integers(-20, 21, size=(int(h), int(w), 3))
        buffer = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=85)
        bank.append(buffer.getvalue())
    return bank


def imagenet_like_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEG files the size of an average ImageNet file: 500 x 375 px (ImageNet's most common size),
    smooth shapes with sensor-like noise at quality 92, about 110 KB each (ImageNet-1k's mean file size)."""
    rng = np.random.default_rng(seed)
    files = []
    for _ in range(count):
        y, x = np.mgrid[0:375, 0:500] / 500
        waves = np.sin(x * rng.uniform(2, 12) + rng.uniform(0, 6)) * np.cos(y * rng.uniform(2, 12))
        pixels = 128 + waves[..., None] * rng.uniform(40, 110, 3) + rng.normal(0, 22, (375, 500, 3))
        buffer = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=92)
        files.append(buffer.getvalue())
    return files


def per_item_us(fn, items: list, repeat: int, rounds: int = 1) -> float:
    """Microseconds an item of ``fn(item)`` over ``items`` (each ``rounds`` times), the best of ``repeat``."""
    seconds = best_seconds(lambda: [fn(item) for _ in range(rounds) for item in items], repeat)
    return seconds / (len(items) * rounds) * 1e6


def imagenet_eval_input(data: bytes) -> torch.Tensor:
    """Decode a JPEG and apply ImageNet's evaluation transform (Resize 256, CenterCrop 224, ToTensor)."""
    with Image.open(io.BytesIO(data)) as image:
        return IMAGENET_EVAL(image.convert("RGB"))


def make_tree(root: Path, classes: int, per_class: int) -> list[str]:
    """The synthetic 21k-shaped tree under ``root``; returns its wnids."""
    from datamodules.imagenet21k import imagenet21k_wnids
    from datamodules.protocols import imagenet1k_wnids

    known = set(imagenet1k_wnids())
    wnids = [w for w in imagenet21k_wnids() if w not in known][:classes]
    bank = image_bank(min(512, classes * per_class))
    k = 0
    for wnid in wnids:
        folder = root / wnid
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (folder / f"{wnid}_{i}.JPEG").write_bytes(bank[k % len(bank)])
            k += 1
    return wnids


def folder_index(root: Path, wnids: list[str]) -> tuple[list[tuple[str, int]], str]:
    rows = [(f"{wnid}/{name}", label) for label, wnid in enumerate(wnids) for name in image_files(root / wnid)]
    return rows, files_fingerprint(root, [path for path, _ in rows])


def _reopen(out: Path) -> ShardSet:
    """Open a shard set afresh (the per-process cache cleared): read ``shards.json``, check its own digest."""
    from datamodules.shard_store import _open

    _open.cache_clear()
    return ShardSet.open(out)


def shard_index(out: Path, rows: list[tuple[str, int]]) -> str:
    from datamodules.shard_store import _open

    _open.cache_clear()
    return ImageFileDataset(str(out), rows).files_fingerprint()


def write_tars(root: Path, rows: list[tuple[str, int]], out: Path, per_shard: int) -> list[str]:
    """webdataset tar shards of the rows (``<key>.jpg`` bytes as they are, ``<key>.cls``)."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, (path, label) in enumerate(rows):
            sink.write({"__key__": f"{i:09d}", "jpg": (root / path).read_bytes(), "cls": str(label).encode()})
    return sorted(str(p) for p in out.glob("shard-*.tar"))


def at_full_pool(peak: int, images: int, half_peak: int, half_images: int, set_bytes: int = 0) -> float:
    """MB at the full pool (3.7M rows of a 3.7M-image set) from the peaks at ``images`` and at ``half_images``
    rows of the same set: what grows with the rows (the slope between the two), what grows with the set (its
    index arrays, ``set_bytes`` at ``images`` images) and what does not grow (one chunk's temporaries)."""
    slope = max(peak - half_peak, 0) / (images - half_images)
    fixed = peak - set_bytes - slope * images
    return (fixed + slope * FULL_POOL + set_bytes / images * FULL_POOL) / 2**20


def best_seconds(fn, repeat: int) -> float:
    """The shortest of ``repeat`` timed calls of ``fn`` (each a fresh index: the shard set's cache cleared)."""
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def per_image_us(dataset: ImageFileDataset, read, count: int, repeat: int) -> float:
    """Microseconds an image of ``read(dataset, index)`` over ``count`` images, the best of ``repeat``."""
    return best_seconds(lambda: [read(dataset, index) for index in range(count)], repeat) / count * 1e6


def peak_memory(fn) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def transform(image: Image.Image) -> torch.Tensor:
    """The demo model's input: grey 28 x 28 in [0, 1]."""
    grey = image.convert("L").resize((28, 28), Image.BILINEAR)
    return torch.from_numpy(np.asarray(grey, dtype=np.uint8).copy()).float().div(255).unsqueeze(0)


class Unchecked(ImageFileDataset):
    """A data set on a shard set whose reads skip the per-image check (:meth:`ShardSet.stored_bytes`): only to
    measure, side by side, what the check costs a scoring pass."""

    def encoded(self, index: int) -> bytes:
        store = self.stores[int(self.store_of[index])]  # type: ignore[index]
        return store.stored_bytes(int(self.positions[index]), self._inner[index])  # type: ignore[index, arg-type]


class Transformed(torch.utils.data.Dataset):
    def __init__(self, dataset: ImageFileDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        sample = self.dataset[index]
        return sample._replace(image=transform(sample.image))


def _wds_decode(sample: tuple) -> tuple[torch.Tensor, int]:
    data, label = sample
    with Image.open(io.BytesIO(data)) as image:
        return transform(image.convert("RGB")), int(label)


def wds_loader(urls: list[str], batch: int, workers: int) -> DataLoader:
    import webdataset as wds

    dataset = (wds.WebDataset(urls, shardshuffle=False, empty_check=False).to_tuple("jpg", "cls").map(_wds_decode)
               .batched(batch, partial=True))
    return DataLoader(dataset, batch_size=None, num_workers=workers)


def scoring_pass(loader, model: torch.nn.Module) -> tuple[int, float]:
    seen, total = 0, 0.0
    with torch.inference_mode():
        for batch in loader:
            images = batch.images if hasattr(batch, "images") else batch[0]
            total += float(model(images).logsumexp(dim=1).sum())
            seen += images.shape[0]
    return seen, total


def main(argv: Sequence[str] | None = None) -> str:
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--work-dir", default=None, help="where the tree and shards go (default: a temporary folder)")
    parser.add_argument("--classes", type=int, default=18_252)
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--pass-images", type=int, default=40_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    args = parse(parser, argv)
    if args.tiny:
        args.classes, args.per_class, args.pass_images, args.repeat = 30, 4, 60, 1
    torch.set_num_threads(1)
    from lightning_modules.open_set_classifier import OpenSetClassifier

    if args.work_dir is not None:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as work, quiet():
        work = Path(work)
        root = work / "imagenet21k"
        started = time.perf_counter()
        wnids = make_tree(root, args.classes, args.per_class)
        tree_seconds = time.perf_counter() - started
        (rows, folder_print), folder_peak = peak_memory(lambda: folder_index(root, wnids))
        half_wnids = wnids[: len(wnids) // 2]
        _, folder_half_peak = peak_memory(lambda: folder_index(root, half_wnids))
        half_images = len(folder_index(root, half_wnids)[0])
        folder_seconds = best_seconds(lambda: folder_index(root, wnids), args.repeat)
        out = work / "shards"
        start = time.perf_counter()
        write_shards(root, [(p, wnids[label]) for p, label in rows], out, source={"kind": "folder", "root": "pool"},
                     workers=args.workers, log=lambda message: None)
        write_seconds = time.perf_counter() - start
        start = time.perf_counter()  # an up-to-date set written again: compared with its files, verified
        write_shards(root, [(p, wnids[label]) for p, label in rows], out, source={"kind": "folder", "root": "pool"},
                     workers=args.workers, log=lambda message: None)
        again_seconds = time.perf_counter() - start
        open_seconds = best_seconds(lambda: _reopen(out), max(3, args.repeat))
        shard_print, shard_peak = peak_memory(lambda: shard_index(out, rows))
        shard_seconds = best_seconds(lambda: shard_index(out, rows), args.repeat)
        assert shard_print == folder_print, "the shard set must fingerprint as its files"
        shuffled = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
        _, lookup_peak = peak_memory(lambda: shard_index(out, shuffled))
        half = shuffled[: len(shuffled) // 2]  # made outside the measured window, as the rows are
        _, lookup_half_peak = peak_memory(lambda: shard_index(out, half))
        lookup_seconds = best_seconds(lambda: shard_index(out, shuffled), args.repeat)
        assert shard_index(out, shuffled) == files_fingerprint(root, [path for path, _ in shuffled])
        opened = ShardSet.open(out)
        index_bytes = sum(a.nbytes for a in opened.index.values())
        digest_check_seconds = best_seconds(lambda: [array_digest(opened.index[name]) for name in LOOKUP_ARRAYS],
                                            args.repeat)
        digests_bytes = opened.load_arrays((DIGESTS_ARRAY,))[DIGESTS_ARRAY].nbytes
        chosen = np.linspace(0, len(rows) - 1, min(args.pass_images, len(rows))).round().astype(int)
        subset = [rows[i] for i in sorted(set(chosen.tolist()))]
        start = time.perf_counter()
        urls = write_tars(root, subset, work / "tars", per_shard=max(1, len(subset) // (4 * args.workers)))
        tar_seconds = time.perf_counter() - start
        start = time.perf_counter()
        wds_files = sorted(os.listdir(work / "tars"))
        wds_index_seconds = time.perf_counter() - start
        model = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1).eval()
        loaders = {
            "folders (ImageFileDataset)": lambda: DataLoader(Transformed(ImageFileDataset(str(root), subset)),
                                                             batch_size=256, num_workers=args.workers,
                                                             collate_fn=collate_samples),
            "litdata shards (ImageFileDataset)": lambda: DataLoader(Transformed(ImageFileDataset(str(out), subset)),
                                                                    batch_size=256, num_workers=args.workers,
                                                                    collate_fn=collate_samples),
            "webdataset tars (WebDataset)": lambda: wds_loader(urls, 256, args.workers),
            "litdata shards, reads unchecked (only to measure the check)": lambda: DataLoader(
                Transformed(Unchecked(str(out), subset)), batch_size=256, num_workers=args.workers,
                collate_fn=collate_samples),
        }
        results: dict[str, list[float]] = {name: [] for name in loaders}
        sums: dict[str, float] = {}
        for round_ in range(args.repeat + 1):  # round 0 warms the page cache and the workers' imports
            for name, make in loaders.items():
                start = time.perf_counter()
                seen, total = scoring_pass(make(), model)
                if round_:
                    results[name].append(seen / (time.perf_counter() - start))
                sums[name] = total
                assert seen == len(subset), (name, seen)
        folder_sum = sums["folders (ImageFileDataset)"]
        assert sums["litdata shards (ImageFileDataset)"] == folder_sum, "shards must score as the folders"
        assert sums["litdata shards, reads unchecked (only to measure the check)"] == folder_sum
        assert abs(sums["webdataset tars (WebDataset)"] - folder_sum) <= 1e-6 * abs(folder_sum) + 1e-3
        count = min(len(subset), 10_000)
        on_files, on_shards = ImageFileDataset(str(root), subset), ImageFileDataset(str(out), subset)
        costs = {name: per_image_us(dataset, read, count, args.repeat) for name, dataset, read in (
            ("file", on_files, ImageFileDataset.encoded), ("shards", on_shards, ImageFileDataset.encoded),
            ("decoded", on_shards, ImageFileDataset.decode),
            ("transformed", on_shards, lambda dataset, index: transform(dataset.decode(index))))}
        store = on_shards.stores[0]
        costs["unchecked"] = per_image_us(on_shards, lambda dataset, index: store.stored_bytes(
            int(dataset.positions[index]), subset[index][0]), count, args.repeat)
        costs["checked"] = per_image_us(on_shards, ImageFileDataset.encoded, count, args.repeat)  # as warm
        tree_bytes = [on_shards.encoded(index) for index in range(count)]
        photos = imagenet_like_jpegs(8 if args.tiny else 32)
        rounds = 1 if args.tiny else 20
        hashes = {name: (per_item_us(fn, tree_bytes, args.repeat), per_item_us(fn, photos, args.repeat, rounds))
                  for name, fn in DIGESTS.items()}
        photo_us = per_item_us(imagenet_eval_input, photos, args.repeat)
        per_image = [("read the bytes of a file", costs["file"]),
                     ("read the bytes from the shard set (litdata)", costs["shards"]),
                     ("decode (PIL, RGB)", costs["decoded"] - costs["shards"]),
                     ("the model transform (grey, 28 x 28, tensor)", costs["transformed"] - costs["decoded"])]
        shutil.rmtree(root)
    images = len(rows)
    tree_kb = sum(len(data) for data in tree_bytes) / len(tree_bytes) / 1000
    photo_kb = sum(len(data) for data in photos) / len(photos) / 1000
    tree_work = costs["transformed"]  # read (checked) + decode + transform of one image of the tree
    check_us = max(costs["checked"] - costs["unchecked"], 0.0)
    chosen_hash = next(iter(DIGESTS))
    checked_rate = max(results["litdata shards (ImageFileDataset)"])
    unchecked_rate = max(results["litdata shards, reads unchecked (only to measure the check)"])
    check_table = table(
        ["checking an image's bytes (one process)", f"µs, this tree's files ({tree_kb:.1f} KB)",
         f"µs, an ImageNet-sized JPEG ({photo_kb:.0f} KB, 500 x 375)", "share of that JPEG's decode + transform"],
        [*[[name, f"{small:.2f}", f"{large:.2f}", f"{large / photo_us:.2%}"]
           for name, (small, large) in hashes.items()],
         ["decode + the model's input transform (here the demo's grey 28 x 28; the JPEG: Resize 256, CenterCrop 224)",
          f"{costs['transformed'] - costs['shards']:.1f}", f"{photo_us:.0f}", ""],
         ["a read from the shard set, unchecked", f"{costs['unchecked']:.1f}", "", ""],
         ["a read from the shard set, checked (what every read does)", f"{costs['checked']:.1f}", "", ""]])
    index_table = table(
        ["index of the pool", "images", "seconds", "peak MB (tracemalloc)", "at 3.7M images (MB)"],
        [["folders: list the class folders, stat every file", images, f"{folder_seconds:.3f}",
          f"{folder_peak / 2**20:.1f}", f"{at_full_pool(folder_peak, images, folder_half_peak, half_images):.0f}"],
         ["litdata shards: the pool's rows (the set's listing: one digest, the recorded fingerprint)", images,
          f"{shard_seconds:.3f}", f"{shard_peak / 2**20:.1f}", f"{shard_peak / images * FULL_POOL / 2**20:.0f}"],
         ["litdata shards: the rows shuffled (look up and fingerprint every row)", images, f"{lookup_seconds:.3f}",
          f"{lookup_peak / 2**20:.1f}", f"{at_full_pool(lookup_peak, images, lookup_half_peak, images // 2, index_bytes):.0f}"],
         ["  of which the shard index arrays", images, "", f"{index_bytes / 2**20:.1f}",
          f"{index_bytes / images * FULL_POOL / 2**20:.0f}"],
         [f"webdataset tars: list the {len(wds_files)} shards (no index of images)", len(subset),
          f"{wds_index_seconds:.4f}", "", ""],
         ["litdata shards: open the set (read shards.json, check its own digest)", images, f"{open_seconds:.4f}",
          "", ""],
         ["  of which checking the index arrays' sha256 at load (in the shuffled rows' time)", images,
          f"{digest_check_seconds:.3f}", "", ""],
         ["the per-image digests (xxh3_64, loaded by a process at its first read)", images, "",
          f"{digests_bytes / 2**20:.1f}", f"{digests_bytes / images * FULL_POOL / 2**20:.0f}"]])
    pass_table = table(
        ["scoring pass (small CNN, batch 256)", "images", "workers", "images/s (best)", "vs folders"],
        [[name, len(subset), args.workers, f"{max(v):.0f}", f"{max(v) / max(results['folders (ImageFileDataset)']):.2f}x"]
         for name, v in results.items()])
    time_table = table(["where the time goes (one process)", "images", "µs an image"],
                       [[name, count, f"{value:.1f}"] for name, value in per_image])
    write_table = table(["writing", "images", "seconds", "images/s"],
                        [["the synthetic tree (file creation only)", images, f"{tree_seconds:.1f}", f"{images / tree_seconds:.0f}"],
                         [f"litdata shards ({args.workers} workers, sha256 and xxh3_64 of every file)", images,
                          f"{write_seconds:.1f}", f"{images / write_seconds:.0f}"],
                         ["the same write again: up to date (stat every source file, verify the set)", images,
                          f"{again_seconds:.1f}", f"{images / again_seconds:.0f}"],
                         ["webdataset tars (1 process)", len(subset), f"{tar_seconds:.1f}", f"{len(subset) / tar_seconds:.0f}"]])
    body = (f"{args.classes} class folders x {args.per_class} JPEG files (64-160 px); index speed-up "
            f"{folder_seconds / shard_seconds:.1f}x (the pool's rows), {folder_seconds / lookup_seconds:.1f}x "
            f"(shuffled rows); the check of every read ({chosen_hash.split(' ')[0]}): {hashes[chosen_hash][0]:.1f} µs "
            f"an image here ({check_us:.1f} µs between a checked and an unchecked read), "
            f"{hashes[chosen_hash][0] / tree_work:.2%} of its read + decode + transform; "
            f"{hashes[chosen_hash][1]:.1f} µs for an ImageNet-sized JPEG, {hashes[chosen_hash][1] / photo_us:.2%} of its "
            f"decode + transform; the pass on shards {checked_rate / unchecked_rate:.2f}x as fast checked as unchecked\n\n{index_table}\n\n{pass_table}\n\n{time_table}\n\n{check_table}\n\n{write_table}")
    finish(args, SECTION, body, script="benchmarks.data_throughput")
    return body


if __name__ == "__main__":
    main()
