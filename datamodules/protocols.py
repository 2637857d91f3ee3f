"""ImageNet open-set protocols P1-P3 (Palechor, Bhoumik, Günther, WACV 2023) and their CSV files.

``imagenet_protocol(n)`` returns the published class lists (package data, ``data/SOURCES.md``).
``write_protocol_csvs`` writes the authors' train/val/test CSV files from an ILSVRC2012 folder with
their exact split rule, and ``read_protocol_csv`` reads those files (theirs or ours); given the protocol
and the split, it checks each row's folder (``train/`` or ``val/``), class and label against the rules:

- known classes get the index in the sorted known wnid list, negatives ``-1``, unknowns ``-2``;
- train/val: the images of ``train/<wnid>/`` of the known then the negative classes (files sorted within
  a class) -> ``sklearn.model_selection.train_test_split(train_size=0.8, stratify=wnid, random_state=42)``;
- test: the images of ``val/<wnid>/`` of the known, negative and unknown classes;
- rows ``train/<wnid>/<file>,<label>``, paths relative to the ImageNet root, no header.

``protocol_from_superclasses`` builds a protocol from any WordNet superclasses.

Command line::

    python -m datamodules.protocols write --imagenet-root /data/ILSVRC2012 --protocol 1 --out-dir data/protocols
"""

from __future__ import annotations

import argparse
import csv
import io
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from sklearn.model_selection import train_test_split

from datamodules.images import IMAGE_EXTENSIONS, image_files, is_folder, non_image_files
from datamodules.wordnet import descendants_in
from openset_common.artefacts import atomic_write_text, check_writable_folder
from openset_common.labels import NEGATIVE_LABEL, UNKNOWN_LABEL

SPLITS = ("train", "val", "test")
ROLES = ("known", "negative", "unknown")


@dataclass(frozen=True)
class Protocol:
    """Sorted wnid lists of the known, negative and unknown classes."""

    known: list[str]
    negative: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for role in ROLES:
            wnids = getattr(self, role)
            if list(wnids) != sorted(set(wnids)):
                object.__setattr__(self, role, sorted(set(wnids)))
        seen: dict[str, str] = {}
        clashes = []
        for role in ROLES:
            for wnid in getattr(self, role):
                if wnid in seen:
                    clashes.append(f"{wnid} ({seen[wnid]} and {role})")
                seen[wnid] = role
        if clashes:
            raise ValueError(f"classes in more than one role: {', '.join(clashes)}")
        if not self.known:
            raise ValueError("a protocol needs at least one known class")

    @property
    def num_classes(self) -> int:
        """``K``, the number of known classes."""
        return len(self.known)

    def labels(self) -> dict[str, int]:
        """wnid -> label: index in the sorted known list, ``-1`` negative, ``-2`` unknown."""
        labels = {wnid: i for i, wnid in enumerate(self.known)}
        labels.update({wnid: NEGATIVE_LABEL for wnid in self.negative})
        labels.update({wnid: UNKNOWN_LABEL for wnid in self.unknown})
        return labels


@cache
def _published_lists() -> dict[int, dict[str, list[tuple[int, str]]]]:
    text = resources.files("datamodules").joinpath("data/protocol_class_lists.csv").read_text()
    lists: dict[int, dict[str, list[tuple[int, str]]]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        lists.setdefault(int(row["protocol"]), {r: [] for r in ROLES})[row["role"]].append(
            (int(row["label"]), row["wnid"])
        )
    return lists


def imagenet_protocol(number: int) -> Protocol:
    """The published class lists of protocol ``number`` (1, 2 or 3): 116/67/166, 30/31/55, 151/97/164."""
    lists = _published_lists()
    if number not in lists:
        raise ValueError(f"ImageNet protocols are 1, 2 and 3, got {number!r}")
    roles = {role: [wnid for _, wnid in lists[number][role]] for role in ROLES}
    protocol = Protocol(**roles)
    published_labels = {wnid: label for label, wnid in lists[number]["known"]}
    if published_labels != {wnid: i for i, wnid in enumerate(protocol.known)}:
        raise RuntimeError(f"package data for P{number}: known labels are not the sorted-wnid order")
    return protocol


def imagenet1k_wnids() -> list[str]:
    """The 1000 ILSVRC2012 wnids, in class-index order (timm's synset list)."""
    import timm.data

    path = Path(timm.data.__file__).parent / "_info" / "imagenet_synsets.txt"
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def protocol_from_superclasses(
    known: Sequence[str],
    negative: Sequence[str] = (),
    unknown: Sequence[str] = (),
    *,
    candidates: Iterable[str] | None = None,
    wordnet: object = None,
) -> Protocol:
    """A protocol from WordNet superclasses: each role gets every candidate class below its superclasses.

    Args:
        known, negative, unknown: superclass wnids of each role.
        candidates: the classes to choose from (default: the ImageNet-1k classes).
        wordnet: an NLTK WordNet reader (default: :func:`datamodules.wordnet.load_wordnet`).

    Raises:
        ValueError: if a class falls below superclasses of two roles (name them apart) or a role is empty.
    """
    candidates = list(candidates) if candidates is not None else imagenet1k_wnids()
    roles = {role: descendants_in(roots, candidates, wordnet) for role, roots in zip(ROLES, (known, negative, unknown), strict=True)}
    for role, roots in zip(ROLES, (known, negative, unknown), strict=True):
        if roots and not roles[role]:
            raise ValueError(f"no candidate class lies below the {role} superclasses {list(roots)}")
    return Protocol(**roles)


# --------------------------------------------------------------------------------------------------
# CSV files


def file_prefix(number: int | str) -> str:
    """``p<n>`` for ImageNet protocol ``n`` (the authors' file names), the name itself for another protocol."""
    return f"p{number}" if isinstance(number, int) or str(number).isdigit() else str(number)


def csv_path(directory: str | os.PathLike, number: int | str, split: str) -> Path:
    """``<directory>/p<number>_<split>.csv``, the authors' file names (``<name>_<split>.csv`` for a protocol of
    a user's own class folders)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return Path(directory) / f"{file_prefix(number)}_{split}.csv"


def check_class_folders(imagenet_root: str | os.PathLike, required: dict[str, Iterable[str]]) -> None:
    """Raise one ``FileNotFoundError`` that lists every missing ``<split>/<wnid>`` folder."""
    root = Path(imagenet_root)
    if not is_folder(root):
        raise FileNotFoundError(f"ImageNet root {root} does not exist")
    missing = [f"{split}/{wnid}" for split, wnids in required.items() for wnid in sorted(set(wnids))
               if not is_folder(root / split / wnid)]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} class folders are missing under {root}: {', '.join(missing)}. "
            "Expected the ILSVRC2012 layout train/<wnid>/*.JPEG and val/<wnid>/*.JPEG "
            "(the validation images sorted into class folders)"
        )


def _check_populated(root: Path, split: str, classes: list[str], required: list[str], *, minimum: int) -> None:
    """Refuse class folders with fewer than ``minimum`` images (a known class without images would be a
    class the model never sees; the train/val split needs two images of each class)."""
    counts = Counter(classes)
    few = []
    for wnid in required:
        if counts[wnid] >= minimum:
            continue
        others = non_image_files(root / split / wnid)
        ignored = f"; {len(others)} other files ignored: {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
        few.append(f"{split}/{wnid} ({counts[wnid]} image{'s' if counts[wnid] != 1 else ''}{ignored if others else ''})")
    if few:
        raise ValueError(f"{len(few)} class folders under {root} hold fewer than {minimum} images "
                         f"(image files by extension: {' '.join(IMAGE_EXTENSIONS)}): {', '.join(few)}")


def _check_splits(splits: Sequence[str]) -> tuple[str, ...]:
    splits = tuple(splits)
    unknown = [split for split in splits if split not in SPLITS]
    if unknown or not splits:
        raise ValueError(f"splits must be a non-empty selection of {SPLITS}, got {splits!r}")
    if ("train" in splits) != ("val" in splits):
        # the two halves of one train_test_split: written apart, they could overlap or miss images
        raise ValueError(f"train and val come from one split and are written together, got splits={splits!r}")
    return splits


def protocol_rows(
    imagenet_root: str | os.PathLike,
    protocol: Protocol,
    *,
    random_state: int = 42,
    splits: Sequence[str] = SPLITS,
) -> dict[str, list[tuple[str, int]]]:
    """The rows of the train, val and test files of a protocol (see the module docstring for the rule).

    Args:
        splits: the files wanted; ``train`` and ``val`` only together (they are the halves of one split).
            Only the folders these splits read must exist.
    """
    splits = _check_splits(splits)
    root = Path(imagenet_root)
    labels = protocol.labels()
    required: dict[str, list[str]] = {}
    if "train" in splits:
        required["train"] = protocol.known + protocol.negative
    if "test" in splits:
        required["val"] = protocol.known + protocol.negative + protocol.unknown
    check_class_folders(root, required)
    rows: dict[str, list[tuple[str, int]]] = {}
    if "train" in splits:
        images, classes = [], []
        for wnid in protocol.known + protocol.negative:
            files = image_files(root / "train" / wnid)
            images += [f"train/{wnid}/{name}" for name in files]
            classes += [wnid] * len(files)
        _check_populated(root, "train", classes, protocol.known + protocol.negative, minimum=2)
        try:
            train_images, val_images, train_classes, val_classes = train_test_split(
                images, classes, train_size=0.8, stratify=classes, random_state=random_state
            )
        except ValueError as error:  # too few images for one validation image per class
            count, number = len(images), len(set(classes))
            held = count - int(0.8 * count)
            raise ValueError(f"the train images under {root / 'train'} cannot be split 80/20 by class: {count} images of "
                             f"{number} classes leave {held} for validation, and every class needs one there and two "
                             "in training (the split is stratified); give every class at least 5 training images "
                             f"(scikit-learn: {error})") from None
        rows["train"] = [(path, labels[wnid]) for path, wnid in zip(train_images, train_classes, strict=True)]
        rows["val"] = [(path, labels[wnid]) for path, wnid in zip(val_images, val_classes, strict=True)]
    if "test" in splits:
        rows["test"] = [(f"val/{wnid}/{name}", labels[wnid])
                        for wnid in protocol.known + protocol.negative + protocol.unknown
                        for name in image_files(root / "val" / wnid)]
        _check_populated(root, "val", [path.split("/")[1] for path, _ in rows["test"]],
                         protocol.known + protocol.negative + protocol.unknown, minimum=1)
    return {split: rows[split] for split in SPLITS if split in splits}


def write_protocol_csvs(
    imagenet_root: str | os.PathLike,
    number: int,
    out_dir: str | os.PathLike,
    *,
    protocol: Protocol | None = None,
    random_state: int = 42,
    splits: Sequence[str] = SPLITS,
) -> dict[str, Path]:
    """Write ``p<n>_train.csv``, ``p<n>_val.csv`` and ``p<n>_test.csv`` (each atomically).

    Args:
        imagenet_root: folder with ``train/<wnid>/`` and ``val/<wnid>/``.
        number: protocol number (names the files; selects the published lists unless ``protocol`` is given).
        out_dir: where to write.
        protocol: a custom protocol (for example from :func:`protocol_from_superclasses`).
        splits: the files to write, e.g. ``("test",)``; ``train`` and ``val`` only together.

    Returns:
        split -> path of each file written.
    """
    protocol = protocol or imagenet_protocol(number)
    rows = protocol_rows(imagenet_root, protocol, random_state=random_state, splits=splits)
    paths = {}
    for split, split_rows in rows.items():
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(split_rows)
        paths[split] = csv_path(out_dir, number, split)
        atomic_write_text(paths[split], buffer.getvalue())
    return paths


def _row_checker(protocol: Protocol, split: str) -> Callable[[str, int], str | None]:
    """A function ``(relative, label) -> None``, or the reason why the row contradicts ``protocol`` and ``split``.

    One dict lookup per row: the files of P1 have about 100k rows.
    """
    folder = "val" if split == "test" else "train"
    labels = protocol.labels()
    roles = {wnid: (labels[wnid], role) for role in ROLES for wnid in getattr(protocol, role)}

    def check(relative: str, label: int) -> str | None:
        parts = relative.split("/")
        if len(parts) < 3 or parts[0] != folder:
            return (f"{relative!r} (label {label}) is not under '{folder}/<wnid>/': "
                    f"the {split} file lists ILSVRC2012 {folder}/ images")
        wnid = parts[-2]
        class_role = roles.get(wnid)
        if class_role is None:
            return (f"class {wnid} has label {label}, but it is in none of the protocol's known, negative "
                    f"and unknown classes")
        expected, role = class_role
        if role == "unknown" and split != "test":
            return (f"class {wnid} has label {label}, but it is an unknown class of the protocol, "
                    f"which never appears in the {split} file (only in test, with label {UNKNOWN_LABEL})")
        if label != expected:
            return f"class {wnid} has label {label}, expected {expected} (its role in the protocol: {role})"
        return None

    return check


def read_protocol_csv(
    path: str | os.PathLike,
    num_classes: int,
    *,
    protocol: Protocol | None = None,
    split: str | None = None,
) -> list[tuple[str, int]]:
    """Read a protocol CSV (``relative/path.JPEG,label`` rows, no header; the authors' or ours).

    Args:
        path: the CSV file.
        num_classes: ``K``; labels must lie in ``-2 .. K-1``.
        protocol, split: given together, every row must also agree with them: in the ``train`` and ``val``
            files each path is ``train/<wnid>/...`` of a known (label: its index) or negative (``-1``) class;
            in the ``test`` file each path is ``val/<wnid>/...`` with the label of the wnid's role (``-2``
            for unknowns).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: naming the file and line of a malformed row, a label outside ``-2 .. num_classes-1``, or
            a row whose folder, class or label contradicts the protocol and split.
    """
    path = Path(path)
    check: Callable[[str, int], str | None] | None = None
    if protocol is not None or split is not None:
        if protocol is None:
            raise ValueError(f"split={split!r} needs the protocol to check the rows against")
        if split is None:
            raise ValueError("checking the rows against a protocol needs the split (train, val or test)")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if protocol.num_classes != num_classes:
            raise ValueError(f"num_classes={num_classes} but the protocol has {protocol.num_classes} known classes")
        check = _row_checker(protocol, split)
    if not path.is_file():
        raise FileNotFoundError(f"protocol file {path} does not exist")
    rows = []
    with open(path, newline="", encoding="utf-8") as handle:
        for line_number, row in enumerate(csv.reader(handle), start=1):
            if not row:
                continue
            if len(row) != 2:
                raise ValueError(f"{path}:{line_number}: expected 'relative/path,label', got {row!r}")
            try:
                label = int(row[1])
            except ValueError:
                raise ValueError(f"{path}:{line_number}: label {row[1]!r} is not an integer") from None
            if not UNKNOWN_LABEL <= label < num_classes:
                raise ValueError(
                    f"{path}:{line_number}: label {label} is out of range for {num_classes} known classes "
                    f"(expected {UNKNOWN_LABEL}..{num_classes - 1})"
                )
            if check is not None:
                problem = check(row[0], label)
                if problem is not None:
                    raise ValueError(f"{path}:{line_number}: {problem}: the file is not this protocol's (written for "
                                     "another split into known, negative and unknown classes, for other class folders, "
                                     "or by hand); write "
                                     "this protocol's files into a protocol_dir of their own (--data-arg "
                                     "protocol_dir=<a new folder>), or remove the file to write it again")
            rows.append((row[0], label))
    if not rows:
        raise ValueError(f"protocol file {path} is empty")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m datamodules.protocols", description="ImageNet protocols P1-P3")
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write p<n>_{train,val,test}.csv from an ILSVRC2012 folder")
    write.add_argument("--imagenet-root", required=True, type=Path)
    write.add_argument("--protocol", type=int, choices=(1, 2, 3), required=True)
    write.add_argument("--out-dir", type=Path, required=True)
    show = sub.add_parser("show", help="print the class counts of a protocol")
    show.add_argument("--protocol", type=int, choices=(1, 2, 3), required=True)
    args = parser.parse_args(argv)
    if args.command == "write":
        try:
            check_writable_folder(args.out_dir, what="the protocol CSV output")
            written = write_protocol_csvs(args.imagenet_root, args.protocol, args.out_dir)
        except (ValueError, OSError) as error:  # bad input: the message names the folder, class or file
            raise SystemExit(f"{parser.prog} write: {error}") from None
        for split, path in written.items():
            print(f"{split}: {path}")
    else:
        protocol = imagenet_protocol(args.protocol)
        print(f"P{args.protocol}: {len(protocol.known)} known, {len(protocol.negative)} negative, "
              f"{len(protocol.unknown)} unknown classes")


if __name__ == "__main__":  # ``python -m datamodules.protocols``: the package has imported this module already;
    from datamodules import protocols  # run that copy, whose classes are the ones every other module sees

    protocols.main()
