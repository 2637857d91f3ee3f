"""Write image files once into a shard set (:mod:`datamodules.shard_store`), which every data set then reads
wherever it would read the folder: the same rows, order, labels and fingerprint.

::

    python -m datamodules.shards write --folder /data/imagenet21k --out /shared/shards/in21k
    python -m datamodules.shards write --pool-file data/cood/pool.csv --pool-root /data/imagenet21k --out /shared/shards/pool
    python -m datamodules.shards write --protocol 1 --imagenet-root /data/ILSVRC2012 --protocol-dir data/protocols --out /shared/shards/p1
    python -m datamodules.shards write --folder /data/imagenet21k --out /shared/shards/in21k --update  # source changed
    python -m datamodules.shards verify /shared/shards/pool [--full]

Then give the shard folder where the folder was given (``--data-args root=/shared/shards/p1`` for a protocol
model, ``pool_root=/shared/shards/pool`` for the severity pool, ``--fit-data /shared/shards/train`` ...).

The rows are split into parts of ``part_size`` images, written by ``workers`` processes, each part a litdata
data set (``litdata.streaming.writer.BinaryWriter``) built in a ``.partial`` folder and renamed when whole. One
write at a time per folder (a ``filelock`` lock; a second is refused, naming the folder). A killed write
continues where it stopped (finished parts are kept once checked against their files, a half-written one is
redone). A finished set written again from the same rows is compared with its source, every file's size and
modification time against the manifest (``--full``: every file's bytes and every stored image too), and
verified: kept when all match; otherwise refused, naming the changed files, unless ``--update``, which writes
again only the parts that hold them (or do not verify) and the set's own files, ``shards.json`` last. A folder
that holds shards of other rows is refused, naming both fingerprints. The bytes of every file are stored as
they are, with their size, modification time, sha256 and xxh3_64 in the manifest; ``shards.json`` records the
digests of the manifest, of the index's arrays and of its own content, and the write's identity, which the index
records too (:mod:`datamodules.shard_store` says what reading checks).
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
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from datamodules.images import image_files_under
from datamodules.shard_store import (
    DIGESTS_ARRAY,
    FORMAT,
    IDENTITY,
    INDEX_ARRAYS,
    INDEX_FILE,
    MANIFEST_COLUMNS,
    MANIFEST_FILE,
    PARTS_DIR,
    SHARDS_FILE,
    ShardError,
    ShardSet,
    array_digest,
    is_shard_set,
    listing_fingerprint,
    path_keys,
    paths_digest,
    read_sample,
    sample_digest,
    sample_name,
    signed,
)
from openset_common.artefacts import atomic_write_bytes, atomic_write_text, check_writable_folder, digest

WRITING_FILE = ".writing.json"
LOCK_FILE = ".write.lock"  # held by the one write into a folder; not part of the set (a folder with only it is empty)
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
        lines.append((start + local, relative, label, len(data), info.st_mtime_ns, hashlib.sha256(data).hexdigest(),
                      f"{sample_digest(data):016x}"))
    writer.done()
    writer.merge()
    text = io.StringIO()
    table = csv.writer(text, lineterminator="\n")
    table.writerow(MANIFEST_COLUMNS)
    table.writerows(lines)
    Path(partial, MANIFEST_FILE).write_text(text.getvalue(), encoding="utf-8")
    os.replace(partial, folder)
    return {"count": len(rows)}


def _part_manifest(folder: Path) -> list[dict[str, str]] | None:
    """The manifest rows of a written part, or ``None`` when it has none of this format (a part written before
    the per-image digest was recorded is written again)."""
    try:
        with open(folder / MANIFEST_FILE, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return rows if tuple(reader.fieldnames or ()) == MANIFEST_COLUMNS else None


def changed_files(root: str | os.PathLike, rows: list[dict[str, str]], *, full: bool = False) -> dict[str, str]:
    """The source files of manifest rows that are not what was written, each ``path -> how``: missing, another
    size (and modification time), the modification time only (a ``stat`` each), and with ``full`` other bytes
    (each file read, its sha256)."""
    changed = {}
    for row in rows:
        path = os.path.join(root, row["path"])
        try:
            info = os.stat(path)
        except OSError:
            changed[row["path"]] = "missing"
            continue
        touched = info.st_mtime_ns != int(row["mtime_ns"])
        if info.st_size != int(row["size"]):
            changed[row["path"]] = f"size {row['size']} -> {info.st_size} bytes" + (", modified since" if touched else "")
        elif touched:
            changed[row["path"]] = f"modification time only, the same size of {info.st_size} bytes"
        elif full:
            with open(path, "rb") as handle:
                if hashlib.sha256(handle.read()).hexdigest() != row["sha256"]:
                    changed[row["path"]] = "other bytes, the same size and modification time"
    return changed


def _part_problems(folder: Path, count: int, *, rows: list[dict[str, str]] | None = None,
                   advice: str = "") -> list[str]:
    """The problems of one written part of ``count`` images: its ``index.json``, its chunk files at the sizes it
    records, its image count; given its manifest ``rows``, every sample read back and checked as a read checks
    it (:func:`datamodules.shard_store.read_sample`: path, position, xxh3_64), and its sha256."""
    try:
        chunks = json.loads((folder / "index.json").read_text())["chunks"]
    except (OSError, ValueError, KeyError) as error:
        return [f"part {folder}: no readable index.json ({error})"]
    problems = []
    if sum(int(c["chunk_size"]) for c in chunks) != count:
        problems.append(f"part {folder}: its chunks hold {sum(int(c['chunk_size']) for c in chunks)} images, its "
                        f"manifest rows {count}")
    for chunk in chunks:
        file = folder / chunk["filename"]
        size = file.stat().st_size if file.is_file() else None
        if size != int(chunk["chunk_bytes"]):
            problems.append(f"{file}: {'missing' if size is None else f'{size} bytes'}, expected {chunk['chunk_bytes']} "
                            "(truncated or replaced)")
    if problems or rows is None:
        return problems
    from litdata import StreamingDataset

    reader = StreamingDataset(str(folder))
    for local, row in enumerate(rows):
        where = sample_name(folder.parent.parent, folder.name, local, row["path"])
        try:
            data = read_sample(reader, local, position=int(row["index"]), path=row["path"],
                               recorded=int(row["xxh3_64"], 16), where=where, advice=advice)
        except ShardError as error:
            problems.append(str(error))
            continue
        if hashlib.sha256(data).hexdigest() != row["sha256"]:
            problems.append(f"{where}: its bytes are not the ones written (not the sha256 of its manifest row)"
                            + (f"; {advice}" if advice else ""))
    return problems


@contextmanager
def _write_lock(out: Path) -> Iterator[None]:
    """Hold the set's write lock (``filelock``, an OS lock on ``<out>/.write.lock``, released when the process
    ends however it ends) for one write; a second write into the folder meanwhile is refused at once."""
    lock = FileLock(out / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise ShardError(f"{out}: another write into this folder is running (it holds {out / LOCK_FILE}); wait for it "
                         "to finish, then run this write again (it continues or verifies that write)") from None
    try:
        yield
    finally:
        lock.release()


def write_shards(root: str | os.PathLike, rows: Rows, out: str | os.PathLike, *, source: dict[str, Any],
                 workers: int = 2, part_size: int | None = None, chunk_bytes: str = CHUNK_BYTES,
                 sections: Sections = (), update: bool = False, full: bool = False, log=print) -> ShardSet:
    """Write ``rows`` (relative paths under ``root`` with their class) into the shard set ``out``.

    One write at a time per folder (a lock). A killed write continues where it stopped. A finished set of the
    same rows is compared with its source (every file's size and modification time against the manifest; with
    ``full``, every file's bytes and every stored image) and checked (``verify``): when all match it is kept as
    it is; otherwise it is refused, naming what changed, unless ``update``: then the set becomes an unfinished
    write (its ``shards.json`` removed first, so nothing reads it half-updated), the parts that hold changed
    files or do not verify are written again, and the manifest, the index and ``shards.json`` (last) anew.

    Args:
        source: what the rows are (kind, root, ...), recorded in ``shards.json`` beside the rows' digest.
        workers: processes writing parts in parallel (``<= 1``: in this process).
        part_size: images per part (the unit of resumption, of updates and of parallel work); default: the part
            size of the set (or unfinished write) at ``out``, else :data:`PART_SIZE`. Another part size than an
            existing set's is refused (its parts are the unit of an update).
        sections: named runs ``(name, start, stop)`` of the rows (a pool's splits, a protocol's), recorded with
            their paths' digest and fingerprint, so that a data set of one of them needs no lookup.
        update: rewrite what is out of date in a finished set of these rows (or a set of an older format).
        full: compare bytes, not only sizes and modification times: each source file's sha256 with the
            manifest's, and every stored image with its digests.

    Returns:
        The finished set, opened.

    Raises:
        ValueError: ``out`` holds (or was being written with) another set of rows (both fingerprints), holds
            this set out of date or not verifying without ``update`` (naming the changed files or the problems),
            or a path appears twice.
        ShardError: another write into ``out`` is running.
        OSError: a source file cannot be read (named).
    """
    recorded, recorded_rows = _recorded_write(Path(out))
    if recorded_rows is not None and recorded_rows != digest(rows):
        recorded = None  # another set's part size: that set is refused below, naming both fingerprints
    if part_size is not None and recorded is not None and part_size != recorded:
        raise ValueError(f"{Path(out).absolute()} was written with parts of {recorded} images, not {part_size}: give "
                         f"--part-size {recorded} or none (its parts are the unit of a continued write and of an "
                         "update), or another --out")
    if part_size is None:
        part_size = recorded or PART_SIZE
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
    out.mkdir(parents=True, exist_ok=True)
    with _write_lock(out):
        plan = [(k, start, rows[start:start + part_size]) for k, start in enumerate(range(0, len(rows), part_size))]
        redo: list[str] | None = None
        if is_shard_set(out):
            existing, redo = _existing_set(str(root), out, identity, len(rows), update=update, full=full, log=log)
            if existing is not None:
                return existing
        elif any(p.name != LOCK_FILE for p in out.iterdir()):  # the lock's file is no content
            writing = out / WRITING_FILE
            if not writing.is_file():
                raise ValueError(f"{out} is not empty and holds no shard set: give an empty or new folder as --out")
            started = json.loads(writing.read_text())
            if started.get("rows_digest") != identity["rows_digest"] or started.get("part_size") != part_size:
                raise ValueError(f"{out} holds an unfinished write of other rows (rows fingerprint "
                                 f"{str(started.get('rows_digest'))[:16]}, part size {started.get('part_size')}); this "
                                 f"write: {identity['rows_digest'][:16]}, part size {part_size}: give another --out, "
                                 "or remove that folder")
        atomic_write_text(out / WRITING_FILE, json.dumps(identity, indent=1, sort_keys=True))
        (out / SHARDS_FILE).unlink(missing_ok=True)  # a set being updated is now an unfinished write: nothing reads it
        for name in redo or ():
            shutil.rmtree(out / PARTS_DIR / name, ignore_errors=True)
        # the parts an update keeps were checked above; otherwise (a new or continued write, or an update whose set's
        # own files cannot say which parts hold what) every part kept is checked against its files
        return _continue(str(root), out, plan, identity, sections, workers=workers, chunk_bytes=chunk_bytes,
                         recheck=redo is None, full=full, log=log)


def _recorded_write(out: Path) -> tuple[int | None, str | None]:
    """``(part size, rows digest)`` of the set, or of the unfinished write, at ``out`` (read from its own files),
    each ``None`` where there is none."""
    for name in (SHARDS_FILE, WRITING_FILE):
        try:
            meta = json.loads((out / name).read_text())
            size, rows = meta.get("part_size"), meta.get("rows_digest") or meta.get("source", {}).get("rows_digest")
        except (OSError, ValueError, AttributeError):
            continue
        valid = isinstance(size, int) and not isinstance(size, bool) and size > 0
        return (size if valid else None), (rows if isinstance(rows, str) else None)
    return None, None


def _existing_set(root: str, out: Path, identity: dict[str, Any], count: int, *, update: bool, full: bool,
                  log) -> tuple[ShardSet | None, list[str] | None]:
    """A finished set at ``out`` written again: ``(the set, None)`` when it is of these rows, up to date and
    verifies; else, with ``update``, ``(None, the parts to write again)`` (``None`` for "check every part": the
    set's own files cannot say which); else an error naming what is out of date."""
    try:
        existing: ShardSet | None = ShardSet.open(out)
        recorded = existing.source.get("rows_digest")  # type: ignore[union-attr]
        refused = None
    except ShardError as error:  # another format, an edited shards.json: its rows' digest, if it can be read
        existing, refused = None, error
        try:
            recorded = json.loads((out / SHARDS_FILE).read_text())["source"]["rows_digest"]
        except (OSError, ValueError, KeyError, TypeError):
            recorded = None
    if recorded is not None and recorded != identity["rows_digest"]:
        described = existing.describe_source() if existing is not None else f"rows fingerprint {recorded[:16]}"
        raise ValueError(f"{out} holds another shard set ({described}); this write is of {count} images with rows "
                         f"fingerprint {identity['rows_digest'][:16]}: give another --out, or remove that folder")
    problems: list[str] = [str(refused)] if refused is not None else []
    changed: dict[str, str] = {}
    redo: list[str] | None = None
    if existing is not None:
        problems, parts, rows = _checked(existing, full=full)
        if rows is not None:  # the set's own files are the ones written: the manifest says which part holds a file
            changed = changed_files(root, rows, full=full)
            stale = {existing.locate(position)[0] for position, row in enumerate(rows) if row["path"] in changed}
            redo = [existing.parts[number]["name"] for number in sorted(stale | parts)]
        if not problems and not changed:
            log(f"{out}: already written from these files ({len(existing)} images; their sizes and modification "
                f"times{' and bytes' if full else ''} match the manifest); verified"
                f"{' every byte' if full else ''}, not redone")
            return existing, None
    what = "; ".join(filter(None, [
        f"{len(changed)} source file(s) changed since it was written: "
        + ", ".join(f"{path} ({how})" for path, how in list(changed.items())[:5])
        + (", ..." if len(changed) > 5 else "") if changed else "",
        f"it does not verify: {'; '.join(problems[:3])}" + (" ..." if len(problems) > 3 else "") if problems else ""]))
    if not update:
        raise ValueError(f"{out} holds the shard set of these rows, out of date: {what}. Write it again with --update "
                         "(the parts that hold them are rewritten), or remove that folder")
    log(f"{out}: updating the shard set: {what}; rewriting "
        + (f"{len(redo)} part(s) {redo[:10]}" if redo is not None else "the parts that do not match their files"))
    return None, redo


def _continue(root: str, out: Path, plan: list, identity: dict[str, Any], sections: Sections, *, workers: int,
              chunk_bytes: str, recheck: bool, full: bool, log) -> ShardSet:
    """Write the parts of ``plan`` that are not written yet, then finish the set (:func:`_finish`). A part is
    kept when its manifest lists the plan's rows and, with ``recheck``, its chunks are whole and its files' sizes
    and modification times (``full``: bytes, and every stored image) are the manifest's."""
    parts_dir = out / PARTS_DIR
    parts_dir.mkdir(exist_ok=True)
    todo = []
    for k, start, chunk in plan:
        folder = parts_dir / f"{k:05d}"
        if folder.is_dir():
            written = _part_manifest(folder)
            if written is not None and [(r["path"], r["class"]) for r in written] == [(p, str(c)) for p, c in chunk] \
                    and not (recheck and (_part_problems(folder, len(written), rows=written if full else None)
                                          or changed_files(root, written, full=full))):
                continue
            shutil.rmtree(folder)
        todo.append((root, chunk, start, str(folder), chunk_bytes))
    log(f"{out}: {len(plan)} parts of up to {identity['part_size']} images, {len(plan) - len(todo)} already "
        f"written, {len(todo)} to write with {max(1, workers)} worker(s)")
    if workers <= 1 or len(todo) <= 1:
        for job in todo:
            _write_part(*job)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for future in [pool.submit(_write_part, *job) for job in todo]:
                future.result()
    return _finish(out, plan, identity, sections)


def _manifest_columns(rows: list[dict[str, Any]]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The paths, sizes, modification times (ns) and xxh3_64 digests of manifest rows."""
    return ([row["path"] for row in rows], np.array([int(row["size"]) for row in rows], dtype=np.int64),
            np.array([int(row["mtime_ns"]) for row in rows], dtype=np.int64),
            np.array([int(row["xxh3_64"], 16) for row in rows], dtype=np.uint64))


def _runs(paths: list[str], sizes: np.ndarray, mtimes: np.ndarray, sections: Sections) -> dict[str, Any]:
    """The listing's record: its paths' digest and fingerprint, and those of each section."""
    return {"paths_sha256": paths_digest(paths), "files_fingerprint": listing_fingerprint(paths, sizes, mtimes),
            "sections": [{"name": name, "start": start, "count": stop - start,
                          "paths_sha256": paths_digest(paths[start:stop]),
                          "files_fingerprint": listing_fingerprint(paths[start:stop], sizes[start:stop],
                                                                   mtimes[start:stop])}
                         for name, start, stop in sections]}


def _finish(out: Path, plan: list, identity: dict[str, Any], sections: Sections = ()) -> ShardSet:
    """The manifest, the index and ``shards.json`` (last, with the digests of the other two and its own) from
    the finished parts, each part's rows checked against the plan; the index and ``shards.json`` both record the
    write's identity (:data:`datamodules.shard_store.IDENTITY`)."""
    lines, parts = [], []
    for k, _, chunk in plan:
        rows = _part_manifest(out / PARTS_DIR / f"{k:05d}")
        if rows is None or [row["path"] for row in rows] != [path for path, _ in chunk]:
            raise ShardError(f"{out}: part {k:05d} does not hold the rows it was written for; write the set again")
        parts.append({"name": f"{k:05d}", "count": len(rows)})
        lines += rows
    text = io.StringIO()
    table = csv.DictWriter(text, fieldnames=MANIFEST_COLUMNS, lineterminator="\n")
    table.writeheader()
    table.writerows(lines)
    manifest = text.getvalue().encode("utf-8")
    atomic_write_bytes(out / MANIFEST_FILE, manifest)
    paths, sizes, mtimes, digests = _manifest_columns(lines)
    keys = path_keys(paths)
    order = np.argsort(keys, kind="stable")
    if len(np.unique(keys)) != len(keys):
        raise ShardError(f"{out}: two paths share a 64-bit key; write the set in two parts")
    arrays = {"keys": keys[order], "positions": order.astype(np.uint32 if len(keys) < 2**32 else np.int64),
              "sizes": sizes, "mtimes": mtimes, DIGESTS_ARRAY: digests}
    files = {"manifest_sha256": hashlib.sha256(manifest).hexdigest(),
             "index_sha256": {name: array_digest(array) for name, array in arrays.items()}, "parts": parts}
    # what both files record of this write, compared at open: the digest of what shards.json says of the others
    set_identity = digest(files)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, **{IDENTITY: np.array(set_identity)})
    atomic_write_bytes(out / INDEX_FILE, buffer.getvalue())
    meta = {"format": FORMAT, "source": {k: v for k, v in identity.items() if k not in ("count", "part_size")},
            "count": len(lines), "part_size": identity["part_size"], "listing": _runs(paths, sizes, mtimes, sections),
            **files, IDENTITY: set_identity, "library": _litdata_version()}
    atomic_write_text(out / SHARDS_FILE, json.dumps(signed(meta), indent=1, sort_keys=True))
    (out / WRITING_FILE).unlink(missing_ok=True)
    return ShardSet.open(out)


def _litdata_version() -> str:
    import litdata

    return f"litdata {litdata.__version__}"


# -- verifying ------------------------------------------------------------------------------------


def _checked(shards: ShardSet, *, full: bool) -> tuple[list[str], set[int], list[dict[str, str]] | None]:
    """The problems of a shard set (those of its own files, then each part's), the numbers of the parts that
    have any, and the manifest's rows when the set's own files have none (``None`` otherwise).

    Its own files: every array of ``index.npz`` against its digest in ``shards.json``; ``manifest.csv`` against
    its sha256; the index against the manifest (keys, positions, sizes, modification times, digests); the
    recorded runs of the listing (digest and fingerprint) against the manifest. Each part: its ``index.json``,
    its chunk files present at the sizes it records, its image count; with ``full``, every image read back and
    compared with its manifest row (path, position, xxh3_64, sha256). ``shards.json`` itself was checked when the
    set was opened (its own digest, its identity against the index's).
    """
    own: list[str] = []
    arrays = None
    try:
        arrays = shards.load_arrays(INDEX_ARRAYS)
    except ShardError as error:
        own.append(str(error))
    try:
        rows: list[dict[str, str]] | None = shards.manifest_rows()
    except ShardError as error:
        own.append(str(error))
        rows = None
    if rows is not None and len(rows) != len(shards):
        own.append(f"{Path(shards.root, MANIFEST_FILE)}: {len(rows)} rows, {SHARDS_FILE} says {len(shards)} images")
        rows = None
    if rows is not None:
        paths, sizes, mtimes, digests = _manifest_columns(rows)
        if arrays is not None and not (
                np.array_equal(arrays["keys"], path_keys(paths)[arrays["positions"]])
                and np.array_equal(np.sort(arrays["positions"]), np.arange(len(paths)))
                and all(np.array_equal(arrays[name], column) for name, column in
                        (("sizes", sizes), ("mtimes", mtimes), (DIGESTS_ARRAY, digests)))):
            own.append(f"{Path(shards.root, INDEX_FILE)} does not match {Path(shards.root, MANIFEST_FILE)}")
        for run in shards.runs():
            start, stop = run["start"], run["start"] + run["count"]
            if (paths_digest(paths[start:stop]) != run["paths_sha256"]
                    or listing_fingerprint(paths[start:stop], sizes[start:stop], mtimes[start:stop])
                    != run["files_fingerprint"]):
                own.append(f"{SHARDS_FILE}: its recorded run {run['name'] or 'of the whole listing'!r} "
                           f"[{start}, {stop}) does not match the manifest")
    problems, parts = list(own), set()
    for number, part in enumerate(shards.parts):
        start, stop = int(shards.starts[number]), int(shards.starts[number + 1])
        # without a manifest to compare with, a part is checked for what it holds, not for its bytes
        mine = _part_problems(Path(shards.root, PARTS_DIR, part["name"]), stop - start,
                              rows=rows[start:stop] if full and rows is not None else None,
                              advice=shards.rewrite(full=True))
        if mine:
            problems += mine
            parts.add(number)
    return problems, parts, rows if not own else None


def verify(shards: ShardSet, *, full: bool = False) -> list[str]:
    """The problems of a shard set, empty when it is whole (:func:`_checked`): everything a read checks (its
    index arrays, its manifest, the runs it records) and every part's presence and size; with ``full``, every
    byte. (Opening the set checked ``shards.json`` against its own digest and its index's identity.)"""
    return _checked(shards, full=full)[0]


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
    write.add_argument("--part-size", type=int, default=None,
                       help=f"images per part (default: the set's own when it exists, else {PART_SIZE:,})")
    write.add_argument("--update", action="store_true",
                       help="rewrite the parts of a finished set whose source files changed (or that do not verify), "
                            "or a set of an older format")
    write.add_argument("--full", action="store_true",
                       help="compare bytes too: every source file's sha256 with the manifest, every stored image")
    check_parser = sub.add_parser("verify", help="check a shard set (with --full: every image against its digests)")
    check_parser.add_argument("shards")
    check_parser.add_argument("--full", action="store_true")
    args = parser.parse_args(argv)
    try:
        return _command(parser, args)
    except (ValueError, OSError, ShardError) as error:  # bad input: its message, which names what to do
        print(f"python -m datamodules.shards {args.command}: {error}", file=sys.stderr)
        return 2


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "verify":
        try:
            problems = verify(ShardSet.open(args.shards), full=args.full)
        except ShardError as error:  # no set there, another format, an edited shards.json
            problems = [str(error)]
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
                          workers=args.workers, part_size=args.part_size, sections=sections, update=args.update,
                          full=args.full)
    print(f"{shards.root}: {len(shards)} images in {len(shards.parts)} parts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
