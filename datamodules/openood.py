"""OpenOOD v1.5's benchmarks: its published image lists as package data, and the evaluation sets they define.

Zhang, Yang, Wang et al., *OpenOOD v1.5: Enhanced Benchmark for Out-of-Distribution Detection* (2023),
github.com/Jingkang50/OpenOOD. A benchmark is its ``DATA_INFO`` entry (``openood/evaluation_api/datasets.py``):
per in-distribution data set, the ID train / val / test lists, the full-spectrum ``csid`` lists (covariate-
shifted ID, labelled with the ID classes), one OOD validation list (for hyper-parameter search only) and the
near- and far-OOD test lists. Each list is OpenOOD's ``benchmark_imglist/<benchmark>/<file>.txt``, one
``<relative path> <label>`` per line, label ``-1`` for OOD; the path lies under ``<data root>/images_largescale/``
or ``<data root>/images_classic/`` (the set's ``data_dir``).

The sets and their lines (the package's ``BENCHMARKS``), by OpenOOD role:

- ``imagenet1k`` (K = 1000): id_val 5,000 and id_test 45,000 (ImageNet's validation images, 5 + 45 per
  class); csid imagenet_v2 10,000, imagenet_c 10,000, imagenet_r 30,000, imagenet_es (the user's file);
  ood_val OpenImage-O 1,763; near ssb_hard 49,000, ninco 5,879; far inaturalist 10,000, textures 5,160,
  openimage_o 15,869; id_train (the user's file).
- ``imagenet200`` (K = 200): id_val 1,000, id_test 9,000 (the validation images of 200 of those classes);
  csid imagenet_v2 2,000, imagenet_c 2,000, imagenet_r 30,000; the OOD lists of ImageNet-1K (the same bytes);
  id_train (the user's file).
- ``cifar10`` (K = 10): id_train 50,000, id_val 1,000, id_test 9,000 (the CIFAR-10 test set split 1,000 /
  9,000); csid cifar10c 10,000; ood_val TIN 1,000; near cifar100 9,000, tin 7,793; far mnist 70,000, svhn
  26,032, texture 5,640, places365 35,195.
- ``cifar100`` (K = 100): id_train 50,000, id_val 1,000, id_test 9,000; ood_val TIN 972; near cifar10
  10,000, tin 6,526; far mnist 70,000, svhn 26,032, texture 5,640, places365 33,773.

The lists are shipped xz-compressed in ``data/openood/`` with ``manifest.csv``: per set its OpenOOD role, list
path, line count, sha256 and git blob id of the list's bytes, ``data_dir``, the folder every path starts with,
and the public copies that hold exactly these bytes (``data/SOURCES.md``). Three lists are known only by their
git blob id, which every copy agrees on: ImageNet-1K's ``test_imagenet_es.txt`` and the ImageNet-1K and -200
``train`` lists. The user gives those as files (``lists={"imagenet_es": PATH}``; OpenOOD keeps them in its
``benchmark_imglist.zip``), checked against that id.

Reading a list checks it: a shipped list's sha256 and line count against the manifest, a user's file against
the published list's sha256 (or git blob id), refusing any other file with both hashes and both line counts
(OpenOOD v1.0's lists, a copy with a line more or less). A **subset** of a published list (``subset_lists``)
is accepted only as such: each of its lines must be a line of the published list, and every set read from it
says so in its ``info`` (``subset``, its own sha256 and lines), so a run on a subset is never mistaken for the
benchmark. :func:`openood_tree` writes such subsets, with tiny images named by the real file names, for tests
and documentation.

Where the images are (:func:`resolve_images`): by default OpenOOD's own layout, ``<data_root>/<data_dir>/<path>``.
``set_roots={"ninco": "/data/NINCO"}`` puts one set elsewhere: its list's path with the first component (the
set's folder in OpenOOD's layout, ``ninco``, ``imagenet_1k``, ``texture``, ...) replaced by the set's root, so
``ninco/amphiuma_means/x.jpg`` is read as ``/data/NINCO/amphiuma_means/x.jpg``, ``imagenet_1k/val/ILSVRC2012_val_
00000001.JPEG`` from ``set_roots={"id_test": "/data/ILSVRC2012"}`` as ``/data/ILSVRC2012/val/ILSVRC2012_val_
00000001.JPEG`` and ``texture/banded/banded_0002.jpg`` from ``set_roots={"textures": "/data/dtd/images"}`` (DTD as
distributed). Any root, ``data_root`` or a set's, may be a shard set or lie in one (:mod:`datamodules.shards`,
e.g. a set written from the whole OpenOOD data folder). Every image is looked for before anything is read: a
missing one is an error that counts the missing images of each set and names the first few and the root searched.

Labels (:func:`evaluation_sets`): ID and csid sets keep OpenOOD's class index ``0..K-1``; OOD sets (label
``-1`` in the lists) get the project's unknown label ``-2`` (DESIGN.md §3). Roles (:mod:`datamodules.evaluation`):
``id_test``, ``id_val``, ``ood_val`` (OpenOOD's OOD validation set: hyper-parameter search only), ``ood``
(near and far; ``info["group"]`` says which), ``real_shift`` (csid) and ``fit`` (ID train).
"""

from __future__ import annotations

import csv
import hashlib
import io
import lzma
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from datamodules.evaluation import EvaluationSet
from datamodules.images import BadImagePolicy, ImageFileDataset, is_folder
from datamodules.shard_store import path_keys, shard_set_of
from openset_common.labels import UNKNOWN_LABEL

OPENOOD_ROLES = ("id_train", "id_val", "id_test", "csid", "ood_val", "near", "far")
"""OpenOOD's roles of a list, in ``DATA_INFO``'s order."""

EVALUATION_ROLES = {"id_train": "fit", "id_val": "id_val", "id_test": "id_test", "csid": "real_shift",
                    "ood_val": "ood_val", "near": "ood", "far": "ood"}
"""The evaluation role (:data:`datamodules.evaluation.ROLES`) of each OpenOOD role."""

OOD_ROLES = ("ood_val", "near", "far")
OPENOOD_OOD_LABEL = -1  # the lists' label of every OOD image
DEFAULT_ROLES = ("id_val", "id_test", "ood_val", "near", "far")
"""The sets :func:`evaluation_sets` reads when none are named: OpenOOD's standard OOD benchmark (its
full-spectrum ``csid`` sets and the ID train list are read when named, by set or by role)."""

MISSING_SHOWN = 5  # missing images named per set

_DATA = "data/openood"
_LEADERBOARD = "data/openood_leaderboard"
_NUM_CLASSES = {"imagenet1k": 1000, "imagenet200": 200, "cifar10": 10, "cifar100": 100}
_OPENOOD_NAME = {"imagenet1k": "imagenet", "imagenet200": "imagenet200", "cifar10": "cifar10", "cifar100": "cifar100"}
_BENCHMARK_ZIP = "benchmark_imglist.zip (scripts/download/download.py of github.com/Jingkang50/OpenOOD)"


@dataclass(frozen=True)
class OpenOODSet:
    """One list of an OpenOOD v1.5 benchmark (a row of ``data/openood/manifest.csv``).

    Attributes:
        benchmark: this project's name of the benchmark (``imagenet1k``, ``imagenet200``, ``cifar10``, ``cifar100``).
        name: the set's name, unique in its benchmark (``id_test``, ``ninco``, ``ood_val``, ...).
        role: OpenOOD's role, one of :data:`OPENOOD_ROLES`.
        list: OpenOOD's path of the list, ``benchmark_imglist/<benchmark>/<file>.txt``.
        lines: its line count (``None``: unknown, the list is not shipped).
        sha256: of the list's bytes (``None``: not shipped; then ``git_blob`` identifies it).
        git_blob: the list's git blob id (sha1 of ``"blob <size>\\0"`` and the bytes), as public copies name it.
        data_dir: ``images_largescale`` or ``images_classic``: where OpenOOD's layout keeps its images.
        folder: the first component of every path of the list (``None``: unknown).
        file: the shipped xz file under ``data/openood/`` (``None``: not shipped).
        copies: the public repositories (``owner/name@commit``) holding exactly these bytes.
    """

    benchmark: str
    name: str
    role: str
    list: str
    lines: int | None
    sha256: str | None
    git_blob: str
    data_dir: str
    folder: str | None
    file: str | None
    copies: tuple[str, ...] = ()

    @property
    def shipped(self) -> bool:
        return self.file is not None

    @property
    def evaluation_role(self) -> str:
        return EVALUATION_ROLES[self.role]

    @property
    def is_ood(self) -> bool:
        return self.role in OOD_ROLES

    @property
    def what(self) -> str:
        return f"OpenOOD {self.benchmark} set {self.name!r} ({self.list})"


@dataclass(frozen=True)
class OpenOODBenchmark:
    """An OpenOOD v1.5 benchmark: its name, OpenOOD's name, its number of ID classes and its sets in order."""

    name: str
    openood_name: str
    num_classes: int
    sets: dict[str, OpenOODSet] = field(default_factory=dict)

    def set(self, name: str) -> OpenOODSet:
        if name not in self.sets:
            raise ValueError(f"OpenOOD benchmark {self.name!r} has no set {name!r}; its sets: {list(self.sets)}")
        return self.sets[name]

    def select(self, names: Iterable[str] | None = None) -> list[OpenOODSet]:
        """The sets named, in the benchmark's order: set names or OpenOOD roles (``near``, ``far``, ``csid``, ...,
        each meaning all of its sets); ``None``: the sets of :data:`DEFAULT_ROLES`.

        Raises:
            ValueError: a name that is neither a set of the benchmark nor a role, naming both lists.
        """
        wanted = set(DEFAULT_ROLES if names is None else ([names] if isinstance(names, str) else names))
        unknown = sorted(wanted - set(self.sets) - set(OPENOOD_ROLES))
        if unknown:
            raise ValueError(f"OpenOOD benchmark {self.name!r} has no set {unknown}; its sets: {list(self.sets)}, "
                           f"or a role: {list(OPENOOD_ROLES)}")
        return [s for s in self.sets.values() if s.name in wanted or s.role in wanted]


def _load_benchmarks() -> dict[str, OpenOODBenchmark]:
    text = resources.files("datamodules").joinpath(f"{_DATA}/manifest.csv").read_text()
    benchmarks = {name: OpenOODBenchmark(name, _OPENOOD_NAME[name], classes) for name, classes in _NUM_CLASSES.items()}
    for row in csv.DictReader(io.StringIO(text)):
        entry = OpenOODSet(
            benchmark=row["benchmark"], name=row["set"], role=row["role"], list=row["list"],
            lines=int(row["lines"]) if row["lines"] else None, sha256=row["sha256"] or None, git_blob=row["git_blob"],
            data_dir=row["data_dir"], folder=row["folder"] or None, file=row["file"] or None,
            copies=tuple(c for c in row["copies"].split(";") if c))
        benchmarks[entry.benchmark].sets[entry.name] = entry
    return benchmarks


BENCHMARKS: dict[str, OpenOODBenchmark] = _load_benchmarks()
"""The four OpenOOD v1.5 benchmarks by name, each with its sets (package data, ``data/openood/manifest.csv``)."""


def benchmark_of(name: str) -> OpenOODBenchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown OpenOOD benchmark {name!r}; choose one of {list(BENCHMARKS)}")
    return BENCHMARKS[name]


# -- the lists ------------------------------------------------------------------------------------


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes: ``sha1(b"blob <size>\\0" + data)``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _line_count(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


@lru_cache(maxsize=8)
def _shipped_bytes(file: str) -> bytes:
    return lzma.decompress(resources.files("datamodules").joinpath(f"{_DATA}/{file}").read_bytes())


def published_bytes(spec: OpenOODSet) -> bytes:
    """The bytes of a shipped list, checked against the manifest's sha256 and line count.

    Raises:
        FileNotFoundError: the list is not shipped (say how to give it).
        RuntimeError: the package data do not match their manifest.
    """
    if spec.file is None:
        raise FileNotFoundError(_not_shipped(spec))
    data = _shipped_bytes(spec.file)
    sha, lines = hashlib.sha256(data).hexdigest(), _line_count(data)
    if sha != spec.sha256 or lines != spec.lines:
        raise RuntimeError(f"{spec.what}: the package's copy datamodules/{_DATA}/{spec.file} ({lines} lines, sha256 "
                           f"{sha}) is not the one its manifest records ({spec.lines} lines, sha256 {spec.sha256}); "
                           "reinstall the package")
    return data


def _not_shipped(spec: OpenOODSet) -> str:
    return (f"{spec.what} is not shipped with this package (no public copy of its content was found; its git blob id "
            f"is {spec.git_blob}): give it as a file, lists={{{spec.name!r}: PATH}} (--list {spec.name}=PATH); "
            f"OpenOOD keeps it as {spec.list} in its {_BENCHMARK_ZIP}")


@dataclass(frozen=True)
class ListRead:
    """A list as read: its rows, the published list's identity, and what was read (the package's copy, a user's
    file, or a subset of the published list)."""

    spec: OpenOODSet
    rows: list[tuple[str, int]]
    source: str
    sha256: str | None
    git_blob: str
    lines: int
    subset: bool = False
    subset_sha256: str | None = None
    note: str = ""

    def info(self) -> dict[str, Any]:
        info = {"benchmark": self.spec.benchmark, "set": self.spec.name, "openood_role": self.spec.role,
                "list": self.spec.list, "list_sha256": self.sha256, "list_git_blob": self.git_blob,
                "list_lines": self.lines, "list_source": self.source, "subset": self.subset}
        if self.subset:
            info.update(subset_sha256=self.subset_sha256, subset_lines=len(self.rows))
        if self.note:
            info["note"] = self.note
        return info


def _parse(text: str, spec: OpenOODSet, *, where: str) -> list[tuple[str, int]]:
    """The ``(path, label)`` rows of a list's text, as OpenOOD's ``ImglistDataset`` reads a line
    (``line.split(" ", 1)``: the path, then the label), each checked: a relative path without ``..``; label
    ``-1`` for an OOD set, ``0..K-1`` otherwise."""
    classes = BENCHMARKS[spec.benchmark].num_classes
    rows: list[tuple[str, int]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        path, _, label_text = line.partition(" ")
        try:
            label = int(label_text)
        except ValueError:
            raise ValueError(f"{where}, line {number}: {line!r} is not '<relative path> <label>'") from None
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise ValueError(f"{where}, line {number}: {path!r} is not a relative path inside the data folder")
        if spec.is_ood and label != OPENOOD_OOD_LABEL:
            raise ValueError(f"{where}, line {number}: label {label} in an OOD list (OpenOOD labels OOD images -1)")
        if not spec.is_ood and not 0 <= label < classes:
            raise ValueError(f"{where}, line {number}: label {label} is not one of the {classes} classes 0..{classes - 1}")
        rows.append((path, label))
    if not rows:
        raise ValueError(f"{where} holds no line")
    return rows


def _read_file(path: str | os.PathLike, spec: OpenOODSet) -> bytes:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{spec.what}: the list file {file} does not exist")
    return file.read_bytes()


def _check_published(data: bytes, spec: OpenOODSet, *, where: str) -> tuple[bytes, str]:
    """``data`` if it is the published list (sha256, or the git blob id where only that is known), else a
    ``ValueError`` with both hashes and both line counts. A copy with CRLF line ends is accepted when its
    LF form is the published list (returned in that form, with a note)."""
    def matches(candidate: bytes) -> bool:
        if spec.sha256 is not None:
            return hashlib.sha256(candidate).hexdigest() == spec.sha256
        return git_blob_id(candidate) == spec.git_blob

    if matches(data):
        return data, ""
    if b"\r\n" in data and matches(data.replace(b"\r\n", b"\n")):
        return data.replace(b"\r\n", b"\n"), "read with CRLF line ends as LF"
    lines = _line_count(data)
    kind, expected, got = (("sha256", spec.sha256, hashlib.sha256(data).hexdigest()) if spec.sha256 is not None
                           else ("git blob id", spec.git_blob, git_blob_id(data)))
    published = f"{spec.lines} lines" if spec.lines is not None else "its line count unknown"
    hint = ""
    if spec.lines is not None and lines != spec.lines:
        hint = f"; it has {abs(lines - spec.lines)} line{'s' if abs(lines - spec.lines) != 1 else ''} " \
               f"{'more' if lines > spec.lines else 'less'}"
    raise ValueError(f"{where} is not OpenOOD v1.5's {spec.list}: its {kind} {got} ({lines} lines) differs from the "
                     f"published list's {expected} ({published}){hint}. Another release's list (OpenOOD v1.0's) or "
                     "an edited copy is refused; a part of the published list is read as subset_lists={"
                     f"{spec.name!r}: PATH}}, marked as a subset")


def _read(benchmark: str, name: str, path: str | os.PathLike | None = None, *,
          subset: str | os.PathLike | None = None) -> ListRead:
    spec = benchmark_of(benchmark).set(name)
    if path is None:
        data, source, note = published_bytes(spec), f"package data datamodules/{_DATA}/{spec.file}", ""
    else:
        data, note = _check_published(_read_file(path, spec), spec, where=f"{spec.what}: the file {path}")
        source = str(path)
    sha256 = spec.sha256 or hashlib.sha256(data).hexdigest()
    full = _parse(data.decode(), spec, where=f"{spec.what} ({source})")
    if subset is None:
        return ListRead(spec, full, source, sha256, spec.git_blob, len(full), note=note)
    part = _read_file(subset, spec)
    where = f"{spec.what}: the subset file {subset}"
    rows = _parse(part.decode().replace("\r\n", "\n"), spec, where=where)
    known = set(full)
    strangers = [(n, f"{p} {lab}") for n, (p, lab) in enumerate(rows, start=1) if (p, lab) not in known]
    if strangers:
        raise ValueError(f"{where}: {len(strangers)} of its {len(rows)} lines are not lines of the published list "
                         f"(first: line {strangers[0][0]} {strangers[0][1]!r}); a subset holds lines of "
                         f"{spec.list} only")
    twice = [row for row, count in Counter(rows).items() if count > 1]
    if twice:
        raise ValueError(f"{where}: {len(twice)} lines are there more than once (first: {' '.join(map(str, twice[0]))!r})")
    return ListRead(spec, rows, source, sha256, spec.git_blob, len(full), subset=True,
                    subset_sha256=hashlib.sha256(part).hexdigest(), note=note)


def read_list(benchmark: str, name: str, path: str | os.PathLike | None = None) -> list[tuple[str, int]]:
    """The ``(relative path, label)`` rows of an OpenOOD v1.5 list, in the list's order (OpenOOD's labels:
    the class index, ``-1`` for OOD).

    Args:
        benchmark: ``imagenet1k``, ``imagenet200``, ``cifar10`` or ``cifar100``.
        name: the set (``id_test``, ``ninco``, ...; :data:`BENCHMARKS`).
        path: a user's copy of the list; ``None``: the package's (decompressed, checked against the manifest).

    Raises:
        ValueError: an unknown benchmark or set (naming the choices); a file that is not the published list (both
            hashes and line counts); a malformed line.
        FileNotFoundError: no path for a list the package does not ship (saying where OpenOOD keeps it).
    """
    return _read(benchmark, name, path).rows


def listed(benchmark: str, name: str, path: str | os.PathLike | None = None, *,
           subset: str | os.PathLike | None = None) -> ListRead:
    """:func:`read_list` with what was read: the rows, the published list's sha256 and lines, the source, and for a
    ``subset`` file (lines of the published list only) the subset's own hash (:class:`ListRead`). What the OOD
    benchmark reads when it takes scores instead of images (``evaluate.py ood --scores``)."""
    return _read(benchmark, name, path, subset=subset)


# -- the images -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedSet:
    """A set's images: ``rows`` (paths relative to ``root``, OpenOOD's labels) and the list they come from."""

    listed: ListRead
    root: str
    rows: list[tuple[str, int]]
    layout: str  # "openood" (<data_root>/<data_dir>/<path>) or "set_root"

    @property
    def spec(self) -> OpenOODSet:
        return self.listed.spec


def _under_set_root(path: str, *, where: str) -> str:
    """The path below a set's root: the list's path without its first component (the set's folder)."""
    _, _, rest = path.partition("/")
    if not rest:
        raise ValueError(f"{where}: the path {path!r} has no folder to replace with the set's root")
    return rest


def _present(root: str, relatives: Sequence[str], cache: dict[tuple[str, str], set[str]]) -> np.ndarray:
    """Which of ``relatives`` exist under ``root``: in a shard set, by its index's path keys; on the file system,
    by listing each parent folder once (``cache``: folder -> its file names, shared between sets)."""
    inside = shard_set_of(root)
    if inside is not None:
        shards, relative = inside
        inner = [f"{relative}/{r}" if relative else r for r in relatives]
        keys_of_set = shards.index["keys"]
        if not len(keys_of_set):
            return np.zeros(len(inner), dtype=bool)
        keys = path_keys(inner)
        slots = np.searchsorted(keys_of_set, keys).clip(max=len(keys_of_set) - 1)
        return keys_of_set[slots] == keys
    found = np.zeros(len(relatives), dtype=bool)
    for i, relative in enumerate(relatives):
        folder, _, name = relative.rpartition("/")
        key = (root, folder)
        if key not in cache:
            try:
                with os.scandir(os.path.join(root, folder)) as entries:
                    cache[key] = {e.name for e in entries if e.is_file()}
            except (FileNotFoundError, NotADirectoryError):
                cache[key] = set()
        found[i] = name in cache[key]
    return found


def resolve_images(benchmark: str, sets: Iterable[str] | None = None, *, data_root: str | os.PathLike | None = None,
                   set_roots: Mapping[str, str | os.PathLike] | None = None,
                   lists: Mapping[str, str | os.PathLike] | None = None,
                   subset_lists: Mapping[str, str | os.PathLike] | None = None) -> dict[str, ResolvedSet]:
    """Where each image of each set is, every image checked present before anything is read.

    Args:
        benchmark: the benchmark (:data:`BENCHMARKS`).
        sets: set names or OpenOOD roles (``["id_test", "near", "far"]``); ``None``: :data:`DEFAULT_ROLES`.
        data_root: OpenOOD's data folder (holding ``images_largescale/`` and ``images_classic/``), a shard set of
            it or a folder in one; needed by every set without a root of its own.
        set_roots: a root per set: the list's path with its first component replaced by the root (module
            docstring), a folder or a shard set.
        lists: a user's copy of a set's list (needed for the lists the package does not ship), checked to be
            the published one.
        subset_lists: a part of a set's published list (each line one of its lines): only those images are read,
            and the set is marked as a subset.

    Raises:
        FileNotFoundError: a missing data root, ``data_dir`` or set root (named); a list neither shipped nor given;
            missing images: per set, how many of how many, the root searched and the first few.
        ValueError: an unknown benchmark or set, or a ``set_roots`` / ``lists`` / ``subset_lists`` key that is
            not a set of the benchmark (keys of sets not read are left alone); a list that is not the published one (both hashes and line counts).
    """
    found = benchmark_of(benchmark)
    chosen = found.select(sets)
    set_roots, lists, subset_lists = dict(set_roots or {}), dict(lists or {}), dict(subset_lists or {})
    for option, given in (("set_roots", set_roots), ("lists", lists), ("subset_lists", subset_lists)):
        stray = sorted(set(given) - set(found.sets))  # a set of the benchmark not read here is left alone
        if stray:
            raise ValueError(f"OpenOOD {benchmark}: {option} names {stray}, which are not sets of the benchmark "
                             f"{list(found.sets)}")
    # the roots first: a wrong folder is named before any list is read
    roots: dict[str, tuple[str, str]] = {}
    if data_root is not None and not is_folder(data_root):
        raise FileNotFoundError(f"OpenOOD data root {data_root} does not exist (a folder or a shard set holding "
                                "images_largescale/ and images_classic/)")
    for spec in chosen:
        if spec.name in set_roots:
            root = os.fspath(set_roots[spec.name])
            if not is_folder(root):
                raise FileNotFoundError(f"{spec.what}: its root {root} (set_roots) does not exist")
            roots[spec.name] = (root, "set_root")
            continue
        if data_root is None:
            raise FileNotFoundError(f"{spec.what}: no data_root and no set_roots[{spec.name!r}] says where its images "
                                    f"are (OpenOOD's layout: <data_root>/{spec.data_dir}/{spec.folder or '<folder>'}/...)")
        root = os.path.join(os.fspath(data_root), spec.data_dir)
        if not is_folder(root):
            raise FileNotFoundError(f"{spec.what}: the folder {root} does not exist (OpenOOD's layout keeps this set "
                                    f"under <data_root>/{spec.data_dir}/; or give set_roots={{{spec.name!r}: PATH}})")
        roots[spec.name] = (root, "openood")
    listed = {spec.name: _read(benchmark, spec.name, lists.get(spec.name), subset=subset_lists.get(spec.name))
              for spec in chosen}
    resolved: dict[str, ResolvedSet] = {}
    for spec in chosen:
        root, layout = roots[spec.name]
        rows = listed[spec.name].rows
        if layout == "set_root":
            rows = [(_under_set_root(p, where=spec.what), label) for p, label in rows]
        resolved[spec.name] = ResolvedSet(listed[spec.name], root, rows, layout)
    cache: dict[tuple[str, str], set[str]] = {}
    problems = []
    for name, found in resolved.items():
        present = _present(found.root, [p for p, _ in found.rows], cache)
        if not present.all():
            missing = [found.rows[i][0] for i in np.flatnonzero(~present)[:MISSING_SHOWN]]
            problems.append(f"{name}: {int((~present).sum())} of {len(found.rows)} images missing under {found.root} "
                            f"(first: {', '.join(missing)})")
    if problems:
        raise FileNotFoundError(f"OpenOOD {benchmark}: images missing; " + "; ".join(problems))
    return resolved


def evaluation_sets(benchmark: str, sets: Iterable[str] | None = None, *,
                    data_root: str | os.PathLike | None = None,
                    set_roots: Mapping[str, str | os.PathLike] | None = None,
                    lists: Mapping[str, str | os.PathLike] | None = None,
                    subset_lists: Mapping[str, str | os.PathLike] | None = None,
                    on_bad_image: BadImagePolicy = "fail") -> dict[str, EvaluationSet]:
    """The evaluation sets of an OpenOOD v1.5 benchmark, by set name (:func:`resolve_images` for the arguments).

    Each set yields its list's images in the list's order, labelled with OpenOOD's class index (ID and csid
    sets) or the project's unknown label ``-2`` (OOD sets, ``-1`` in the lists); its role is
    :data:`EVALUATION_ROLES` of OpenOOD's; its fingerprint is its exact file list (:class:`EvaluationSet`'s rule);
    its ``info`` holds the benchmark, OpenOOD's role (``group``), the list's path, sha256, git blob id and source,
    the root, and whether the set is a subset (then the subset's own sha256 and lines).
    """
    out: dict[str, EvaluationSet] = {}
    for name, found in resolve_images(benchmark, sets, data_root=data_root, set_roots=set_roots, lists=lists,
                                      subset_lists=subset_lists).items():
        spec = found.spec
        rows = [(path, UNKNOWN_LABEL if spec.is_ood else label) for path, label in found.rows]
        dataset = ImageFileDataset(found.root, rows, on_bad_image=on_bad_image)
        info = {**found.listed.info(), "group": spec.role, "root": found.root, "layout": found.layout,
                "data_dir": spec.data_dir, "num_classes": BENCHMARKS[benchmark].num_classes}
        out[name] = EvaluationSet(name, spec.evaluation_role, dataset, info=info)  # type: ignore[arg-type]
    return out


# -- a tiny tree for tests and documentation ------------------------------------------------------


def openood_tree(root: str | os.PathLike, benchmark: str, *, sets: Iterable[str] | None = None, per_set: int = 3,
                 seed: int = 0, size: int = 8) -> dict[str, Path]:
    """A tiny OpenOOD data folder: ``per_set`` lines of each set's published list (chosen seeded, kept in the
    list's order) as ``<root>/benchmark_imglist/<openood benchmark>/<file>.txt``, and for each of their paths a
    ``size`` x ``size`` image of seeded noise at ``<root>/<data_dir>/<path>`` (the real file name; its format by
    the extension: JPEG, PNG, ...).

    The lists written are subsets of the published ones: read them as ``subset_lists`` (and ``data_root=root``),
    which marks every set read as a subset. Sets the package does not ship cannot be subset-checked and are
    left out unless named (then refused).

    Returns:
        The subset list file of each set written, by set name.

    Raises:
        FileNotFoundError: a set named whose list the package does not ship.
        ValueError: ``per_set`` or ``size`` not positive.
    """
    if per_set < 1 or size < 1:
        raise ValueError(f"per_set and size must be positive, got per_set={per_set}, size={size}")
    named = None if sets is None else ([sets] if isinstance(sets, str) else list(sets))
    chosen = benchmark_of(benchmark).select(named)
    for spec in chosen:
        if not spec.shipped and named is not None and spec.name in named:
            raise FileNotFoundError(_not_shipped(spec))
    rng = np.random.default_rng(seed)
    folder = Path(root)
    written: dict[str, Path] = {}
    for spec in chosen:
        if not spec.shipped:
            continue
        lines = published_bytes(spec).decode().splitlines()
        keep = np.sort(rng.choice(len(lines), size=min(per_set, len(lines)), replace=False))
        chosen_lines = [lines[i] for i in keep.tolist()]
        for line in chosen_lines:
            image = folder / spec.data_dir / line.split(" ", 1)[0]
            image.parent.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            known = Image.registered_extensions().get(image.suffix.lower())
            Image.fromarray(pixels).save(image, format=known or "JPEG")
        target = folder / spec.list
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(f"{line}\n" for line in chosen_lines))
        written[spec.name] = target
    return written


# -- the published leaderboard --------------------------------------------------------------------


@dataclass(frozen=True)
class LeaderboardTable:
    """A table of OpenOOD's published leaderboard (``data/openood_leaderboard/manifest.csv``)."""

    file: str
    source: str
    commit: str
    date: str
    rows: int
    sha256: str


def _leaderboard_manifest() -> dict[str, LeaderboardTable]:
    text = resources.files("datamodules").joinpath(f"{_LEADERBOARD}/manifest.csv").read_text()
    return {row["file"].removesuffix(".csv"): LeaderboardTable(row["file"], row["source"], row["commit"], row["date"],
                                                               int(row["rows"]), row["sha256"])
            for row in csv.DictReader(io.StringIO(text))}


LEADERBOARD: dict[str, LeaderboardTable] = _leaderboard_manifest()
"""The leaderboard's tables by name (``cifar10``, ``cifar100``, ``imagenet200_ood``, ``imagenet200_fsood``,
``imagenet1k_ood``, ``imagenet1k_fsood``, ``papers``), with the date of the last commit that changed each."""


def read_leaderboard(table: str) -> list[dict[str, str]]:
    """The rows of a published leaderboard table as they are (strings, e.g. ``"88.03 ± 0.25"``), checked against
    the manifest's sha256 and row count.

    Raises:
        ValueError: an unknown table (naming the tables).
        RuntimeError: the package's copy is not the one recorded.
    """
    if table not in LEADERBOARD:
        raise ValueError(f"no OpenOOD leaderboard table {table!r}; the tables: {list(LEADERBOARD)}")
    entry = LEADERBOARD[table]
    data = resources.files("datamodules").joinpath(f"{_LEADERBOARD}/{entry.file}").read_bytes()
    rows = list(csv.DictReader(io.StringIO(data.decode())))
    if hashlib.sha256(data).hexdigest() != entry.sha256 or len(rows) != entry.rows:
        raise RuntimeError(f"the package's OpenOOD leaderboard table {entry.file} is not the one its manifest records "
                           f"(sha256 {entry.sha256}, {entry.rows} rows); reinstall the package")
    return rows


__all__ = ["BENCHMARKS", "DEFAULT_ROLES", "EVALUATION_ROLES", "LEADERBOARD", "OPENOOD_ROLES", "LeaderboardTable",
           "ListRead", "OpenOODBenchmark", "OpenOODSet", "ResolvedSet", "benchmark_of", "evaluation_sets",
           "git_blob_id", "listed", "openood_tree", "published_bytes", "read_leaderboard", "read_list", "resolve_images"]
