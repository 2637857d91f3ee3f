"""Write image files once into a shard set (:mod:`datamodules.shard_store`), which every data set then reads
wherever it would read the folder: the same rows, order, labels and fingerprint.

::

    python -m datamodules.shards write --folder /data/imagenet21k --out /shared/shards/in21k
    python -m datamodules.shards write --pool-file data/cood/pool.csv --pool-root /data/imagenet21k --out /shared/shards/pool
    python -m datamodules.shards write --protocol 1 --imagenet-root /data/ILSVRC2012 --protocol-dir data/protocols --out /shared/shards/p1
    python -m datamodules.shards verify /shared/shards/pool [--full]

Then give the shard folder where the folder was given (``--data-args root=/shared/shards/p1`` for a protocol
model, ``pool_root=/shared/shards/pool`` for the severity pool, ``--fit-data /shared/shards/train`` ...).

The rows are split into parts of ``part_size`` images, written by ``workers`` processes, each part a litdata
data set (``litdata.streaming.writer.BinaryWriter``) built in a ``.partial`` folder and renamed when whole. A
killed write continues where it stopped (finished parts are kept, a half-written one is redone); a finished
set written again from the same rows is verified, not redone; a folder that holds shards of other rows is
refused, naming both fingerprints. The bytes of every file are stored as they are, with their size,
modification time and sha256 in the manifest.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from datamodules.images import image_files_under
from datamodules.shard_store import (
    FORMAT,
    INDEX_FILE,
    MANIFEST_COLUMNS,
    MANIFEST_FILE,
    PARTS_DIR,
    SHARDS_FILE,
    ShardError,
    ShardSet,
    is_shard_set,
    listing_fingerprint,
    path_keys,
    paths_digest,
)
from openset_common import atomic_write_bytes, atomic_write_text, check_writable_folder, digest

WRITING_FILE = ".writing.json"
PART_SIZE = 10_000
CHUNK_BYTES = "64MB"

Rows = list[tuple[str, str]]  # (relative path, class)
Sections = list[tuple[str, int, int]]  # (name, start, stop) of runs of the rows


# -- the sources ----------------------------------------------------------------------------------


def folder_rows(root: str | os.PathLike) -> Rows:
    """Every image file under ``root`` (sorted relative paths, sub-folders included), its class the first
    folder of its path (``""`` for a file in the root): class folders, an ImageNet tree, the 21k tree."""
    rows = [(path, path.split("/")[0] if "/" in path else "") for path in image_files_under(root)]
    if not rows:
        raise FileNotFoundError(f"{root}: no image files to write into shards")
    return rows


def runs_of(names: Sequence[str]) -> Sections:
    """The contiguous runs of equal names, ``(name, start, stop)``: the sections a set records of its rows."""
    sections: Sections = []
    for i, name in enumerate(names):
        if sections and sections[-1][0] == name and sections[-1][2] == i:
            sections[-1] = (name, sections[-1][1], i + 1)
        else:
            sections.append((name, i, i + 1))
    return sections


def pool_source(pool_file: str | os.PathLike) -> tuple[Rows, Sections]:
    """The rows of an ImageNet-21k pool file (:func:`datamodules.imagenet21k.read_pool_file`), classed by wnid:
    its estimation images, then its test images, each in the pool file's order, so that each split the
    severity data reads is a recorded section of the set (no lookup); and those sections."""
    from datamodules.imagenet21k import read_pool_file

    pool = read_pool_file(pool_file)
    ordered = [row for split in ("estimation", "test") for row in pool if row[2] == split]
    return [(path, wnid) for path, wnid, _ in ordered], runs_of([split for _, _, split in ordered])


def protocol_rows_of(number: int, protocol_dir: str | os.PathLike) -> Rows:
    """The rows :func:`protocol_source` writes."""
    return protocol_source(number, protocol_dir)[0]


def protocol_source(number: int, protocol_dir: str | os.PathLike) -> tuple[Rows, Sections]:
    """The images of protocol ``number``'s three CSV files (train, val, test; each path once), classed by the
    wnid folder of the path, and the run of each split among them (a split whose every image is new is a
    recorded section of the set: its data set needs no lookup)."""
    from datamodules.protocols import SPLITS, csv_path, imagenet_protocol, read_protocol_csv

    protocol = imagenet_protocol(number)
    rows: Rows = []
    names: list[str] = []
    seen: set[str] = set()
    for split in SPLITS:
        file = csv_path(protocol_dir, number, split)
        if not file.is_file():
            raise FileNotFoundError(f"protocol file {file} does not exist: write the protocol's files first "
                                    f"(`python -m datamodules.protocols write --protocol {number} ...`)")
        for path, _ in read_protocol_csv(file, len(protocol.known), protocol=protocol, split=split):
            if path not in seen:
                seen.add(path)
                rows.append((path, path.split("/")[-2]))
                names.append(split)
    return rows, runs_of(names)


# -- writing --------------------------------------------------------------------------------------


def _write_part(root: str, rows: Rows, start: int, folder: str, chunk_bytes: str) -> dict[str, Any]:
    """Write one part: its litdata chunks and its manifest rows in ``<folder>.partial``, renamed when whole."""
    from litdata.streaming.writer import BinaryWriter

    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    writer = BinaryWriter(partial, chunk_bytes=chunk_bytes)
    lines = []
    for local, (relative, label) in enumerate(rows):
        path = os.path.join(root, relative)
        try:
            info = os.stat(path)
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise OSError(f"cannot read {path} to write it into shards: {error}") from error
        writer[local] = {"index": start + local, "path": relative, "image": data}
        lines.append((start + local, relative, label, len(data), info.st_mtime_ns, hashlib.sha256(data).hexdigest()))
    writer.done()
    writer.merge()
    text = io.StringIO()
    table = csv.writer(text, lineterminator="\n")
    table.writerow(MANIFEST_COLUMNS)
    table.writerows(lines)
    Path(partial, MANIFEST_FILE).write_text(text.getvalue(), encoding="utf-8")
    os.replace(partial, folder)
    return {"count": len(rows)}


def _part_manifest(folder: Path) -> list[dict[str, str]]:
    with open(folder / MANIFEST_FILE, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def write_shards(root: str | os.PathLike, rows: Rows, out: str | os.PathLike, *, source: dict[str, Any],
                 workers: int = 2, part_size: int = PART_SIZE, chunk_bytes: str = CHUNK_BYTES,
                 sections: Sections = (), log=print) -> ShardSet:
    """Write ``rows`` (relative paths under ``root`` with their class) into the shard set ``out``.

    Args:
        source: what the rows are (kind, root, ...), recorded in ``shards.json`` beside the rows' digest.
        workers: processes writing parts in parallel (``<= 1``: in this process).
        part_size: images per part (the unit of resumption and of parallel work).
        sections: named runs ``(name, start, stop)`` of the rows (a pool's splits, a protocol's), recorded with
            their paths' digest and fingerprint, so that a data set of one of them needs no lookup.

    Returns:
        The finished set, opened.

    Raises:
        ValueError: ``out`` holds (or was being written with) another set of rows (both fingerprints), or a
            path appears twice.
        OSError: a source file cannot be read (named).
    """
    if part_size < 1:
        raise ValueError(f"part_size must be positive, got {part_size}")
    for name, start, stop in sections:
        if not 0 <= start < stop <= len(rows):
            raise ValueError(f"section {name!r} [{start}, {stop}) is not a run of the {len(rows)} rows")
    out = Path(out).absolute()
    check_writable_folder(out, what="the shard set")
    paths = [path for path, _ in rows]
    if len(set(paths)) != len(paths):
        raise ValueError(f"the rows to write into {out} name a path twice")
    identity = {**source, "rows_digest": digest(rows), "count": len(rows), "part_size": part_size}
    if is_shard_set(out):
        existing = ShardSet.open(out)
        if existing.source.get("rows_digest") != identity["rows_digest"]:
            raise ValueError(f"{out} holds another shard set ({existing.describe_source()}); this write is of "
                             f"{len(rows)} images with rows fingerprint {identity['rows_digest'][:16]}: give another "
                             "--out, or remove that folder")
        problems = verify(existing)
        if problems:
            raise ShardError(f"{out}: a finished shard set of these rows that does not verify: {problems[:3]}; remove "
                             "it and write it again")
        log(f"{out}: already written from these rows ({len(existing)} images); verified, not redone")
        return existing
    writing = out / WRITING_FILE
    if out.is_dir() and any(out.iterdir()):
        if not writing.is_file():
            raise ValueError(f"{out} is not empty and holds no shard set: give an empty or new folder as --out")
        started = json.loads(writing.read_text())
        if started.get("rows_digest") != identity["rows_digest"] or started.get("part_size") != part_size:
            raise ValueError(f"{out} holds an unfinished write of other rows (rows fingerprint "
                             f"{str(started.get('rows_digest'))[:16]}, part size {started.get('part_size')}); this "
                             f"write: {identity['rows_digest'][:16]}, part size {part_size}: give another --out, or "
                             "remove that folder")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(writing, json.dumps(identity, indent=1, sort_keys=True))
    parts_dir = out / PARTS_DIR
    parts_dir.mkdir(exist_ok=True)
    plan = [(k, start, rows[start:start + part_size]) for k, start in enumerate(range(0, len(rows), part_size))]
    todo = []
    for k, start, chunk in plan:
        folder = parts_dir / f"{k:05d}"
        if folder.is_dir() and (folder / MANIFEST_FILE).is_file():
            if [r["path"] for r in _part_manifest(folder)] == [p for p, _ in chunk]:
                continue
            shutil.rmtree(folder)
        todo.append((str(root), chunk, start, str(folder), chunk_bytes))
    log(f"{out}: {len(plan)} parts of up to {part_size} images, {len(plan) - len(todo)} already written, "
        f"{len(todo)} to write with {max(1, workers)} worker(s)")
    if workers <= 1 or len(todo) <= 1:
        for job in todo:
            _write_part(*job)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for future in [pool.submit(_write_part, *job) for job in todo]:
                future.result()
    return _finish(out, plan, identity, sections)


def _manifest_columns(rows: list[dict[str, Any]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The paths, sizes and modification times (ns) of manifest rows."""
    return ([row["path"] for row in rows], np.array([int(row["size"]) for row in rows], dtype=np.int64),
            np.array([int(row["mtime_ns"]) for row in rows], dtype=np.int64))


def _finish(out: Path, plan: list, identity: dict[str, Any], sections: Sections = ()) -> ShardSet:
    """The manifest, the index and ``shards.json`` (last) from the finished parts."""
    lines, parts = [], []
    for k, _, chunk in plan:
        rows = _part_manifest(out / PARTS_DIR / f"{k:05d}")
        if len(rows) != len(chunk):
            raise ShardError(f"{out}: part {k:05d} holds {len(rows)} images, expected {len(chunk)}")
        parts.append({"name": f"{k:05d}", "count": len(rows)})
        lines += rows
    text = io.StringIO()
    table = csv.DictWriter(text, fieldnames=MANIFEST_COLUMNS, lineterminator="\n")
    table.writeheader()
    table.writerows(lines)
    manifest = text.getvalue().encode("utf-8")
    atomic_write_bytes(out / MANIFEST_FILE, manifest)
    paths, sizes, mtimes = _manifest_columns(lines)
    keys = path_keys(paths)
    order = np.argsort(keys, kind="stable")
    if len(np.unique(keys)) != len(keys):
        raise ShardError(f"{out}: two paths share a 64-bit key; write the set in two parts")
    buffer = io.BytesIO()
    np.savez(buffer, keys=keys[order], positions=order.astype(np.uint32 if len(keys) < 2**32 else np.int64),
             sizes=sizes, mtimes=mtimes)
    atomic_write_bytes(out / INDEX_FILE, buffer.getvalue())
    listing = {"paths_sha256": paths_digest(paths), "files_fingerprint": listing_fingerprint(paths, sizes, mtimes),
               "sections": [{"name": name, "start": start, "count": stop - start,
                             "paths_sha256": paths_digest(paths[start:stop]),
                             "files_fingerprint": listing_fingerprint(paths[start:stop], sizes[start:stop],
                                                                      mtimes[start:stop])}
                            for name, start, stop in sections]}
    meta = {"format": FORMAT, "source": {k: v for k, v in identity.items() if k not in ("count", "part_size")},
            "count": len(lines), "part_size": identity["part_size"], "parts": parts, "listing": listing,
            "manifest_sha256": hashlib.sha256(manifest).hexdigest(), "library": _litdata_version()}
    atomic_write_text(out / SHARDS_FILE, json.dumps(meta, indent=1, sort_keys=True))
    (out / WRITING_FILE).unlink(missing_ok=True)
    return ShardSet.open(out)


def _litdata_version() -> str:
    import litdata

    return f"litdata {litdata.__version__}"


# -- verifying ------------------------------------------------------------------------------------


def verify(shards: ShardSet, *, full: bool = False) -> list[str]:
    """The problems of a shard set, empty when it is whole: every part's chunks present at the sizes its
    ``index.json`` records and its image count; the manifest's sha256; the recorded runs of the listing
    (digest and fingerprint) against the manifest; with ``full``, every image read back and compared with its
    manifest sha256."""
    problems = []
    manifest = Path(shards.root, MANIFEST_FILE)
    if not manifest.is_file() or hashlib.sha256(manifest.read_bytes()).hexdigest() != shards.meta["manifest_sha256"]:
        problems.append(f"{manifest} is missing or not the manifest {SHARDS_FILE} records")
    else:
        paths, sizes, mtimes = _manifest_columns(shards.manifest_rows())
        for run in shards.runs():
            start, stop = run["start"], run["start"] + run["count"]
            if (paths_digest(paths[start:stop]) != run["paths_sha256"]
                    or listing_fingerprint(paths[start:stop], sizes[start:stop], mtimes[start:stop])
                    != run["files_fingerprint"]):
                problems.append(f"{SHARDS_FILE}: its recorded run {run['name'] or 'of the whole listing'!r} "
                                f"[{start}, {stop}) does not match the manifest")
    for part in shards.parts:
        folder = Path(shards.root, PARTS_DIR, part["name"])
        try:
            chunks = json.loads((folder / "index.json").read_text())["chunks"]
        except (OSError, ValueError, KeyError) as error:
            problems.append(f"part {folder}: no readable index.json ({error})")
            continue
        if sum(int(c["chunk_size"]) for c in chunks) != int(part["count"]):
            problems.append(f"part {folder}: its chunks hold {sum(int(c['chunk_size']) for c in chunks)} images, "
                            f"{SHARDS_FILE} says {part['count']}")
        for chunk in chunks:
            file = folder / chunk["filename"]
            size = file.stat().st_size if file.is_file() else None
            if size != int(chunk["chunk_bytes"]):
                problems.append(f"{file}: {'missing' if size is None else f'{size} bytes'}, expected {chunk['chunk_bytes']} "
                                "(truncated or replaced)")
    if full and not problems:
        for position, row in enumerate(shards.manifest_rows()):
            try:
                data = shards.read(position, row["path"])
            except ShardError as error:
                problems.append(str(error))
                continue
            if hashlib.sha256(data).hexdigest() != row["sha256"]:
                problems.append(f"shard set {shards.root}: image {position} ({row['path']}) differs from its manifest sha256")
    return problems


# -- the command line -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datamodules.shards", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write image files into a shard set (resumable)")
    source = write.add_mutually_exclusive_group(required=True)
    source.add_argument("--folder", help="every image under this folder (class folders, an ImageNet or 21k tree)")
    source.add_argument("--pool-file", help="the images of an ImageNet-21k pool file (with --pool-root)")
    source.add_argument("--protocol", type=int, choices=(1, 2, 3),
                        help="the images of protocol P1-P3's CSV files (with --imagenet-root, --protocol-dir)")
    write.add_argument("--pool-root", help="the ImageNet-21k folder the pool file's paths are under")
    write.add_argument("--imagenet-root", help="the ILSVRC2012 folder the protocol's paths are under")
    write.add_argument("--protocol-dir", default="data/protocols", help="folder of p<n>_{train,val,test}.csv")
    write.add_argument("--out", required=True, help="the shard set's folder (new, or a write to continue)")
    write.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    write.add_argument("--part-size", type=int, default=PART_SIZE)
    check = sub.add_parser("verify", help="check a shard set (with --full: every image against its sha256)")
    check.add_argument("shards")
    check.add_argument("--full", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "verify":
        problems = verify(ShardSet.open(args.shards), full=args.full)
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{args.shards}: {'verified' if not problems else f'{len(problems)} problem(s)'}")
        return 1 if problems else 0
    if args.folder:
        root, rows, kind, sections = args.folder, folder_rows(args.folder), {"kind": "folder"}, []
    elif args.pool_file:
        if not args.pool_root:
            parser.error("--pool-file needs --pool-root (the folder its paths are under)")
        root, (rows, sections) = args.pool_root, pool_source(args.pool_file)
        kind = {"kind": "pool", "pool_file_sha256": hashlib.sha256(Path(args.pool_file).read_bytes()).hexdigest()}
    else:
        if not args.imagenet_root:
            parser.error("--protocol needs --imagenet-root (the folder its paths are under)")
        root, (rows, sections) = args.imagenet_root, protocol_source(args.protocol, args.protocol_dir)
        kind = {"kind": "protocol", "protocol": args.protocol}
    shards = write_shards(root, rows, args.out, source={**kind, "root": str(Path(root).absolute())},
                          workers=args.workers, part_size=args.part_size, sections=sections)
    print(f"{shards.root}: {len(shards)} images in {len(shards.parts)} parts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
