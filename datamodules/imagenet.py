"""ILSVRC2012 open-set protocols P1-P3 as a LightningDataModule (Palechor et al., WACV 2023), and the same
for a user's own class folders.

Expects the ILSVRC2012 folder layout ``<root>/train/<wnid>/*.JPEG`` and ``<root>/val/<wnid>/*.JPEG``
(:class:`ClassFolderDataModule`: ``<root>/train/<class>/*`` and ``<root>/val/<class>/*`` of any names, with
the known, negative and unknown classes given).
The protocol CSV files are read from ``protocol_dir`` (``p<n>_{train,val,test}.csv``, the authors' names
and format, so their published files can be used as they are); every row's folder and label are checked
against the protocol. Missing files are written there from the ImageNet folder by ``prepare_data`` with the
authors' split rule (:mod:`datamodules.protocols`): all three, or the test file alone; existing files are
never overwritten, so a missing train or val file next to existing ones is an error.

Every class folder the protocol needs is checked before training starts, with one error that lists all
missing wnids. Unreadable images fail with the file's path, or are skipped and counted
(``on_bad_image="skip"``); ``verify_images=True`` decodes every image once before training so that
neither happens hours into an epoch.
"""

from __future__ import annotations

import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from datamodules.images import BadImagePolicy, ImageFileDataset, image_files, is_folder, subfolders
from datamodules.open_set import OpenSetDataModule, TrainNegatives
from datamodules.protocols import (
    SPLITS,
    Protocol,
    check_class_folders,
    csv_path,
    file_prefix,
    imagenet_protocol,
    protocol_rows,
    read_protocol_csv,
    write_protocol_csvs,
)
from datamodules.severity import FolderSeverityData, ProtocolSeverityData
from datamodules.transforms import IMAGENET_MEAN, IMAGENET_STD, ModelInput, eval_transform, train_transform
from openset_common.artefacts import atomic_write_text
from openset_common.typed import save_arguments


@dataclass(kw_only=True)
class FolderOptions:
    """The options every class-folder protocol shares (ImageNet's P1-P3 and a user's class folders): where its CSV
    files are, and how its images are loaded and brought to the model. Each datamodule takes them by these names
    (``--data.init_args.crop_size 32``, ``crop_size: 32`` in YAML) and passes them on as ``**options``.

    Attributes:
        protocol_dir: folder of the protocol CSV files (``p<n>_{train,val,test}.csv``; read if present, else
            written there).
        train_negatives: ``"include"`` (EOS), ``"exclude"`` (SoftMax) or ``"background"`` (BG); linked to
            the model's loss by ``train.py``.
        batch_size: per-device batch size (the paper: 64).
        num_workers: data-loading processes per device.
        resize_size: the Resize before the crop (the paper: 256).
        crop_size: the crop (the paper: 224; random in training, centred in evaluation).
        normalize: subtract ``mean`` and divide by ``std`` (off in the paper).
        mean: the per-channel mean of ``normalize``.
        std: the per-channel standard deviation of ``normalize``.
        on_bad_image: ``"fail"`` or ``"skip"`` unreadable images.
        verify_images: decode every image of the protocol once in ``prepare_data``.
        pin_memory: pinned host memory for the loaders.
    """

    protocol_dir: str = "data/protocols"
    train_negatives: TrainNegatives = "include"
    batch_size: int = 64
    num_workers: int = 8
    resize_size: int = 256
    crop_size: int = 224
    normalize: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    on_bad_image: BadImagePolicy = "fail"
    verify_images: bool = False
    pin_memory: bool = True


class FolderProtocolDataModule(OpenSetDataModule):
    """An open-set protocol over class folders (``train/<class>/``, ``val/<class>/``); see the module docstring.

    Subclasses give the :class:`~datamodules.protocols.Protocol` (the known, negative and unknown classes)
    and the name of its CSV files, and pass the shared options (:class:`FolderOptions`) on as ``**options``.
    """

    def __init__(self, *, root: str, protocol: Protocol, name: int | str, **options: Any) -> None:
        try:
            self.options = FolderOptions(**options)
        except TypeError as error:  # a misspelt option, named with the datamodule the user called
            raise TypeError(f"{type(self).__name__}: {error} (its options: {[f.name for f in fields(FolderOptions)]})"
                            ) from None
        super().__init__(batch_size=self.options.batch_size, num_workers=self.options.num_workers,
                         train_negatives=self.options.train_negatives, pin_memory=self.options.pin_memory)
        if len(protocol.known) < 2:
            raise ValueError(f"an open-set protocol needs at least 2 known classes, got {protocol.known}")
        self.root = str(root)
        self.protocol_number = name
        self.protocol = protocol
        self.protocol_dir = Path(self.options.protocol_dir)
        self.on_bad_image = self.options.on_bad_image
        self.verify_images = self.options.verify_images
        self.crop_size = self.options.crop_size
        transform_kwargs = {"resize": self.options.resize_size, "crop": self.options.crop_size,
                            "normalize": self.options.normalize, "mean": self.options.mean, "std": self.options.std}
        self.train_transform = train_transform(**transform_kwargs)
        self.eval_transform = eval_transform(**transform_kwargs)

    @property
    def num_classes(self) -> int:
        return self.protocol.num_classes

    @property
    def class_names(self) -> list[str]:
        """The known wnids, sorted (label ``i`` is ``class_names[i]``)."""
        return list(self.protocol.known)

    def model_input(self) -> ModelInput:
        """The evaluation transform (Resize -> CenterCrop -> tensor[, Normalize]) on RGB images."""
        return ModelInput.from_transform(self.eval_transform, channels=3, size=(self.crop_size, self.crop_size))

    def csv_file(self, split: str) -> Path:
        return csv_path(self.protocol_dir, self.protocol_number, split)

    @property
    def unreadable_file(self) -> Path:
        return self.protocol_dir / f"{file_prefix(self.protocol_number)}_unreadable.txt"

    def check_folders(self, rows_by_split: dict[str, list[tuple[str, int]]]) -> None:
        """One error listing every class folder that the CSV rows refer to and that does not exist."""
        required: dict[str, set[str]] = {}
        for rows in rows_by_split.values():
            for relative, _ in rows:
                parts = relative.split("/")
                if len(parts) >= 3:
                    required.setdefault(parts[-3], set()).add(parts[-2])
        check_class_folders(self.root, required)

    def prepare_data(self) -> None:
        """Write missing protocol CSVs; optionally decode every image once (rank 0 of each node).

        Files already in ``protocol_dir`` are never overwritten: with all three missing, all three are
        written; with only the test file missing, only it (it does not depend on the train/val split).

        Raises:
            ValueError: if the train or the val file is missing while another of the three exists.
        """
        self.prepare_evaluation()
        if self.verify_images:
            rows = [row for split in SPLITS for row in self._read(split)]
            self.check_folders({"all": rows})
            self._verify([relative for relative, _ in rows])

    def prepare_evaluation(self) -> None:
        """Write the missing protocol CSVs (:meth:`prepare_data` without its decode of every image): an evaluation
        of class folders never trained on writes what training would."""
        self._write_missing_csvs()

    def _write_missing_csvs(self) -> None:
        missing = [split for split in SPLITS if not self.csv_file(split).is_file()]
        if not missing:
            return
        existing = [split for split in SPLITS if split not in missing]
        if existing and missing != ["test"] and self._written_by_this_rule(existing):
            # the files of this root by the split rule, a part of them written (each file atomically) by another
            # process of this run that prepares its data at the same time (every process of a torchrun launch of
            # an evaluation does): all three written again, the existing ones with the rows they hold
            write_protocol_csvs(self.root, self.protocol_number, self.protocol_dir, protocol=self.protocol,
                                splits=SPLITS)
            return
        if existing and missing != ["test"]:
            missing_names = ", ".join(str(self.csv_file(split)) for split in missing)
            existing_names = ", ".join(str(self.csv_file(split)) for split in existing)
            raise ValueError(
                f"protocol files: missing {missing_names} while {existing_names} "
                f"{'exists' if len(existing) == 1 else 'exist'}. The train and val files "
                "must come from one split of the same images (one train_test_split), so a missing one cannot be "
                f"written next to existing ones without risking overlap; remove {existing_names} to regenerate all "
                f"three from {self.root}, or supply the missing file(s)"
            )
        write_protocol_csvs(self.root, self.protocol_number, self.protocol_dir, protocol=self.protocol, splits=missing)

    def _written_by_this_rule(self, splits: list[str]) -> bool:
        """Whether the existing protocol files of ``splits`` hold exactly the rows the split rule gives for this
        root (then the missing ones can be written next to them: they are the same split's)."""
        try:
            rows = protocol_rows(self.root, self.protocol, splits=SPLITS)
            return all(self._read(split) == rows[split] for split in splits)
        except (OSError, ValueError):  # folders or files the caller's own error (or setup's) names
            return False

    def _read(self, split: str) -> list[tuple[str, int]]:
        return read_protocol_csv(self.csv_file(split), self.num_classes, protocol=self.protocol, split=split)

    def _verify(self, relatives: list[str]) -> None:
        images = ImageFileDataset(self.root, [(relative, 0) for relative in relatives])

        def readable(position: int) -> bool:
            try:
                images.decode(position)
                return True
            except Exception:
                return False

        with ThreadPoolExecutor(max_workers=max(1, self.num_workers)) as pool:
            bad = [relative for relative, ok in zip(relatives, pool.map(readable, range(len(relatives))), strict=True)
                   if not ok]
        if bad and self.on_bad_image == "fail":
            shown = ", ".join(os.path.join(self.root, b) for b in bad[:20])
            raise OSError(f"{len(bad)} unreadable images under {self.root}: {shown}{' ...' if len(bad) > 20 else ''}")
        atomic_write_text(self.unreadable_file, "".join(f"{b}\n" for b in bad))

    def _rows(self, split: str) -> list[tuple[str, int]]:
        rows = self._read(split)
        if self.verify_images and self.on_bad_image == "skip" and self.unreadable_file.is_file():
            unreadable = set(self.unreadable_file.read_text().split())
            rows = [row for row in rows if row[0] not in unreadable]
        return rows

    def setup(self, stage: str | None = None) -> None:
        splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}
        wanted = splits[stage] if stage in splits else SPLITS
        rows = {split: self._rows(split) for split in wanted}
        self.check_folders(rows)
        dataset_kwargs = {"root": self.root, "on_bad_image": self.on_bad_image}
        if "train" in rows:
            labels = [label for _, label in rows["train"]]
            kept = [rows["train"][i] for i in self.filter_train_labels(labels)]
            self.set_train_labels([label for _, label in kept])
            self.train_set = ImageFileDataset(
                rows=kept, transform=self.train_transform, target_transform=self.train_target_transform(), **dataset_kwargs
            )
        if "val" in rows:
            self.val_set = ImageFileDataset(rows=rows["val"], transform=self.eval_transform, **dataset_kwargs)
        if "test" in rows:
            self.test_set = ImageFileDataset(rows=rows["test"], transform=self.eval_transform, **dataset_kwargs)

    def severity_data(self, **kwargs: Any) -> FolderSeverityData:
        """The C-OOD severity data of a model trained here (DESIGN.md §5.2): ID = the known classes (their
        ``val/`` images), pool = the unknown classes (estimation images from their ``train/`` folders, which
        training never uses; test images from ``val/``), with this datamodule's root and loader settings.
        ``kwargs`` go to :class:`datamodules.severity.FolderSeverityData` (``estimation``, ``test``, an
        ImageNet-21k ``pool_root``/``pool_file``, ...)."""
        defaults = {"root": self.root, "known": self.protocol.known, "unknown": self.protocol.unknown,
                    "negative": self.protocol.negative, "batch_size": self.batch_size,
                    "num_workers": self.num_workers, "on_bad_image": self.on_bad_image}
        return FolderSeverityData(**{**defaults, **kwargs})

    def predict_dataloader(self) -> torch.utils.data.DataLoader:
        return self.test_dataloader()


class ImageNetProtocolDataModule(FolderProtocolDataModule):
    """ImageNet protocol P1, P2 or P3.

    Args:
        root: ILSVRC2012 folder with ``train/`` and ``val/`` class folders.
        protocol: 1, 2 or 3.
        options: the options of every class-folder protocol (:class:`FolderOptions`: ``protocol_dir``,
            ``train_negatives``, ``batch_size``, ``num_workers``, ``resize_size``, ``crop_size``, ...).
    """

    def __init__(self, root: str, protocol: int = 1, **options: Any) -> None:
        super().__init__(root=root, protocol=imagenet_protocol(protocol), name=protocol, **options)
        save_arguments(self, self.options, inspect.currentframe())

    def severity_data(self, **kwargs: Any) -> ProtocolSeverityData:
        """:meth:`FolderProtocolDataModule.severity_data` for the protocol's classes
        (:class:`datamodules.severity.ProtocolSeverityData`)."""
        protocol = kwargs.pop("protocol", self.protocol_number)
        if protocol != self.protocol_number:
            raise ValueError(f"severity data for protocol {protocol} asked of a model trained on P{self.protocol_number}")
        defaults = {"root": self.root, "batch_size": self.batch_size, "num_workers": self.num_workers,
                    "on_bad_image": self.on_bad_image}
        return ProtocolSeverityData(protocol=protocol, **{**defaults, **kwargs})


class ClassFolderDataModule(FolderProtocolDataModule):
    """A user's own class folders as an open-set protocol (``root/train/<class>/*``, ``root/val/<class>/*``):
    train/val split from ``train/`` with the protocols' rule, test = ``val/``, labels by role (known classes
    in sorted order ``0..K-1``, negatives ``-1``, unknowns ``-2``).

    Args:
        root: the folder with ``train/`` and ``val/`` class folders.
        known: the known classes (default: every class folder of ``train/`` that is not a negative or unknown).
        negative: classes seen in training as "other" (γ, the checkpoint-selection metric, needs some).
        unknown: classes never seen in training (their ``val/`` images are the test set's unknowns).
        name: the name of the CSV files (``<name>_{train,val,test}.csv`` in ``protocol_dir``).
        options: the options of every class-folder protocol (:class:`FolderOptions`).
    """

    def __init__(self, root: str, known: list[str] | None = None, negative: list[str] | None = None,
                 unknown: list[str] | None = None, name: str = "folders", **options: Any) -> None:
        negative, unknown = list(negative or []), list(unknown or [])
        if known is None:
            train = Path(root) / "train"
            if not is_folder(train):
                raise FileNotFoundError(f"{train} does not exist: give the known classes or a root with train/<class>/")
            known = [name for name in subfolders(train) if name not in set(negative) | set(unknown)]
            where = f"the class folders of {train} that are not negatives or unknowns"
        else:
            where = "the known classes given"
        if len(known) < 2:  # a classifier of one class cannot be trained (nor rejected against)
            raise ValueError(f"class folders {root}: an open-set protocol needs at least 2 known classes, found "
                             f"{len(known)}: {sorted(known)} ({where}; negative {sorted(negative)}, unknown "
                             f"{sorted(unknown)})")
        if str(name).isdigit():
            raise ValueError(f"name {name!r} would take the file names of ImageNet protocol P{name}: choose another")
        super().__init__(root=root, protocol=Protocol(list(known), negative, unknown), name=name, **options)
        save_arguments(self, self.options, inspect.currentframe())

    def check_folders(self, rows_by_split: dict[str, list[tuple[str, int]]]) -> None:
        """The class folders the rows refer to (:meth:`FolderProtocolDataModule.check_folders`), and every image
        they list under ``root``: protocol files written from other class folders (in training, say, with the
        default ``protocol_dir``) are named before any image is read, not at a file missing hours later."""
        super().check_folders(rows_by_split)
        listed: dict[str, set[str]] = {}
        absent: list[str] = []
        for rows in rows_by_split.values():
            for relative, _ in rows:
                folder, _, file = relative.rpartition("/")
                if folder not in listed:
                    listed[folder] = set(image_files(Path(self.root) / folder, warn=False))
                if file not in listed[folder]:
                    absent.append(relative)
        if absent:
            files = ", ".join(str(self.csv_file(split)) for split in rows_by_split if split in SPLITS)
            raise FileNotFoundError(
                f"{len(absent)} images the protocol files list are not under {self.root} ({', '.join(absent[:3])}"
                f"{', ...' if len(absent) > 3 else ''}): {files or self.protocol_dir} were written from other class "
                f"folders than these. Give a protocol_dir of their own (--data-arg protocol_dir=<a new folder>: this "
                f"root's files are written there, by the protocols' split rule) or remove those files")
