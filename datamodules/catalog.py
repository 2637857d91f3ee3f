"""The benchmark data by name: one registry of the in-distribution data sets, the real OOD sets and the
severity pools every command names (``--data fashion``, ``--real-ood digits``, ``--ood fashion:unknown``).

- **In-distribution** (:class:`InDistribution`): a name, its open-set datamodule, the severity data of a model
  trained on it (by default the datamodule's ``severity_data(**arguments)``) and what its real OOD sets need
  of it (the Fashion-MNIST folder and the known classes, so ``fashion:`` sets refuse in-distribution classes).
- **Real OOD sets** (:class:`RealOOD`): ``NAME`` or ``NAME:ARGUMENT`` (``digits``, ``fashion:unknown``,
  ``fashion:4,6``); any other spec is a folder of images.
- **Severity pools** (:class:`SeverityPool`): the ``--data`` of ``evaluate.py severity`` (``imagenet``,
  ``protocol``, ``folder``, ``fashion``).
- **OOD benchmarks** (:class:`OODBenchmark`): the ``--data`` of ``evaluate.py ood`` (``openood:imagenet1k``, ...,
  and the demo's ``fashion``: :func:`fashion_benchmark`, of the real OOD sets above).

Every name may also be a class path (``my_package.data.MyDataModule``), its arguments checked by type before
anything is read. A new in-distribution data set is its datamodule and one :func:`register` call.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset

from datamodules.evaluation import EvaluationSet
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.imagenet import ClassFolderDataModule, ImageNetProtocolDataModule
from datamodules.images import IMAGE_EXTENSIONS, ImageFileDataset, TensorImageDataset, is_folder
from datamodules.ood_benchmark import OODBenchmarkData, openood_benchmark
from datamodules.open_set import OpenSetDataModule
from datamodules.severity import (
    FashionSeverityData,
    FolderSeverityData,
    ImageNetSeverityData,
    ProtocolSeverityData,
    SeverityData,
)
from datamodules.sources import (
    DEBIAN_FASHION_MNIST_DIR,
    DEMO_KNOWN,
    DEMO_NEGATIVE,
    DEMO_UNKNOWN,
    folder_images,
    load_digits_images,
    load_fashion_mnist,
)
from openset_common.labels import UNKNOWN_LABEL
from openset_common.typed import import_object, typed_arguments


def _own_severity_data(datamodule: Any, **arguments: Any) -> SeverityData:
    return datamodule.severity_data(**arguments)


@dataclasses.dataclass(frozen=True)
class InDistribution:
    """An in-distribution data set: its name, its datamodule, the severity data of a model trained on it
    (``severity(datamodule, **arguments)``; ``None``: it has no pool) and ``ood_context(datamodule)``, the
    arguments its real OOD sets take (:func:`real_ood_set`'s ``data_dir`` and ``known``)."""

    name: str
    datamodule: type[OpenSetDataModule]
    description: str
    severity: Callable[..., SeverityData] | None = _own_severity_data
    ood_context: Callable[[Any], dict[str, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class RealOOD:
    """A real OOD set: ``build(argument, data_dir=, known=, transform=)``, ``argument`` the text after
    ``NAME:`` (empty for a bare ``NAME``)."""

    name: str
    build: Callable[..., torch.utils.data.Dataset]
    description: str


@dataclasses.dataclass(frozen=True)
class OODBenchmark:
    """An OOD detection benchmark by name (the ``--data`` of ``evaluate.py ood``): ``build(**arguments)`` gives its
    :class:`datamodules.ood_benchmark.OODBenchmarkData`, the arguments checked by type first."""

    name: str
    build: Callable[..., OODBenchmarkData]
    description: str


@dataclasses.dataclass(frozen=True)
class SeverityPool:
    """A severity data set by name (the ``--data`` of ``evaluate.py severity``)."""

    name: str
    data: type[SeverityData]
    description: str


IN_DISTRIBUTION: dict[str, InDistribution] = {}
REAL_OOD: dict[str, RealOOD] = {}
SEVERITY_POOLS: dict[str, SeverityPool] = {}
OOD_BENCHMARKS: dict[str, OODBenchmark] = {}
_TABLES = {InDistribution: IN_DISTRIBUTION, RealOOD: REAL_OOD, SeverityPool: SEVERITY_POOLS, OODBenchmark: OOD_BENCHMARKS}


def register(entry: InDistribution | RealOOD | SeverityPool | OODBenchmark
             ) -> InDistribution | RealOOD | SeverityPool | OODBenchmark:
    """Add an entry to its table; a name already taken there by another entry is refused."""
    table = _TABLES[type(entry)]
    if entry.name in table and table[entry.name] != entry:
        raise ValueError(f"{type(entry).__name__} {entry.name!r} is already registered ({table[entry.name].description})")
    if isinstance(entry, RealOOD) and ":" in entry.name:
        raise ValueError(f"a real OOD set's name cannot hold ':' (its argument follows one), got {entry.name!r}")
    table[entry.name] = entry
    return entry


def resolve(name: str, table: dict[str, Any], base: type, *, what: str, attribute: str) -> type:
    """A class by name (of ``table``, its entries' ``attribute``) or by class path, which must be a ``base``."""
    entry = table.get(name)
    target = getattr(entry, attribute) if entry is not None else (import_object(name) if "." in name else None)
    if target is None:
        raise ValueError(f"unknown {what} {name!r}: use one of {sorted(table)} or a class path "
                         f"(a subclass of {base.__module__}.{base.__qualname__})")
    if not (isinstance(target, type) and issubclass(target, base)):
        raise ValueError(f"{what} {name!r} is a {getattr(target, '__name__', target)}, not a {base.__qualname__}")
    return target


def build_datamodule(name: str, arguments: dict[str, Any] | None = None) -> OpenSetDataModule:
    """An open-set datamodule by name or class path (e.g. ``fashion``), its arguments checked by type."""
    target = resolve(name, IN_DISTRIBUTION, OpenSetDataModule, what="datamodule", attribute="datamodule")
    return target(**typed_arguments(target, dict(arguments or {}), what=f"--data {name} --data-arg"))


def entry_of(datamodule: Any) -> InDistribution | None:
    """The in-distribution entry of a datamodule: the one of its own class, else of its nearest base class."""
    for cls in type(datamodule).__mro__:
        for entry in IN_DISTRIBUTION.values():
            if entry.datamodule is cls:
                return entry
    return None


def severity_factory(datamodule: Any) -> Callable[..., SeverityData] | None:
    """How to build the severity data of a model trained on ``datamodule`` (``None``: it has none): its entry's,
    else a ``severity_data`` method of a datamodule no entry names (a user's own)."""
    entry = entry_of(datamodule)
    if entry is not None:
        return None if entry.severity is None else (lambda **arguments: entry.severity(datamodule, **arguments))
    method = getattr(datamodule, "severity_data", None)
    return method if callable(method) else None


def build_severity_data(name: str | None, arguments: dict[str, Any] | None = None, *,
                        datamodule: Any | None = None) -> SeverityData:
    """The severity data of a command.

    Args:
        name: a severity pool's name (``imagenet``, ``protocol``, ``folder``, ``fashion``) or a class path;
            ``None``: the model's own (of its training ``datamodule``), else ImageNet.
        arguments: the data's arguments (``--data-arg``), checked by type.
        datamodule: the training datamodule of the model (a checkpoint's): ``protocol``, ``fashion`` and
            ``folder`` take its root, protocol and classes.
    """
    arguments = dict(arguments or {})
    factory = severity_factory(datamodule) if datamodule is not None else None
    if name is None and factory is None:
        name = "imagenet"
    if name is None or (factory is not None and name in ("protocol", "fashion", "folder")):
        entry = entry_of(datamodule)  # the function that builds it: the entry's, else the datamodule's method
        source = entry.severity if entry is not None and entry.severity is not _own_severity_data \
            else datamodule.severity_data
        made = typing.get_type_hints(source).get("return")
        if isinstance(made, type):
            typed_arguments(made, arguments, what=f"--data-arg of {type(datamodule).__name__}'s severity data")
        return factory(**arguments)  # type: ignore[misc]
    target = resolve(name, SEVERITY_POOLS, SeverityData, what="severity data", attribute="data")
    return target(**typed_arguments(target, arguments, what=f"--data {name} --data-arg"))


def build_ood_benchmark(name: str, arguments: dict[str, Any] | None = None) -> OODBenchmarkData:
    """An OOD benchmark by name (:data:`OOD_BENCHMARKS`: ``fashion``, ``openood:imagenet1k``, ...), its arguments
    (``--data-arg``) checked by type before anything is read.

    Raises:
        ValueError: an unknown name (naming the benchmarks there are), an argument the benchmark does not take.
    """
    entry = OOD_BENCHMARKS.get(name)
    if entry is None:
        raise ValueError(f"unknown OOD benchmark {name!r}: use one of {sorted(OOD_BENCHMARKS)}")
    return entry.build(**typed_arguments(entry.build, dict(arguments or {}), what=f"--data {name} --data-arg"))


def _openood_builder(benchmark: str) -> Callable[..., OODBenchmarkData]:
    """:func:`datamodules.ood_benchmark.openood_benchmark` of one benchmark, with its signature (the arguments a
    ``--data-arg`` may set) less the benchmark."""
    def build(**arguments: Any) -> OODBenchmarkData:
        return openood_benchmark(benchmark, **arguments)

    signature = inspect.signature(openood_benchmark)
    build.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])  # type: ignore[attr-defined]
    build.__annotations__ = {k: v for k, v in typing.get_type_hints(openood_benchmark).items() if k != "benchmark"}
    build.__name__ = build.__qualname__ = f"openood_{benchmark}"
    build.__doc__ = openood_benchmark.__doc__
    return build


def ood_context(datamodule: Any) -> dict[str, Any]:
    """What the real OOD sets need of an in-distribution datamodule (its entry's ``ood_context``; default: the
    Debian Fashion-MNIST folder and no known class)."""
    entry = entry_of(datamodule) if datamodule is not None else None
    if entry is not None and entry.ood_context is not None:
        return entry.ood_context(datamodule)
    return {"data_dir": DEBIAN_FASHION_MNIST_DIR, "known": ()}


def real_ood_set(spec: str, *, data_dir: str = DEBIAN_FASHION_MNIST_DIR, known: Sequence[int] = (),
                 transform: Callable | None = None) -> torch.utils.data.Dataset:
    """A real OOD set by name: ``NAME`` or ``NAME:ARGUMENT`` of :data:`REAL_OOD` (``digits``,
    ``fashion:unknown``, ``fashion:<id>,<id>``), else a folder of images (sub-folders included), every image
    labelled -2. Official test images only.

    Args:
        data_dir: the Fashion-MNIST folder (for ``fashion:`` sets).
        known: Fashion-MNIST class ids that are in-distribution (refused in a ``fashion:`` set).
        transform: applied to each raw image (default: none, an evaluation set: PIL images for files, float
            tensors for the others).
    """
    name, _, argument = spec.partition(":")
    entry = REAL_OOD.get(name)
    if entry is not None:  # a registered name wins over a folder of that name
        return entry.build(argument, data_dir=data_dir, known=known, transform=transform)
    folder = Path(spec)
    if not is_folder(folder):
        raise FileNotFoundError(f"real OOD set {spec!r}: not one of {sorted(REAL_OOD)} (NAME or NAME:ARGUMENT) nor "
                                "an existing folder")
    rows = [(path, UNKNOWN_LABEL) for path in folder_images(folder)]
    if not rows:
        raise FileNotFoundError(f"real OOD set folder {folder} holds no image files ({' '.join(IMAGE_EXTENSIONS)}, any case)")
    subfolders = [Path(path).parts[0] if len(Path(path).parts) > 1 else "" for path, _ in rows]
    index = {name: i for i, name in enumerate(sorted(set(subfolders)))}
    return _with_source_classes(ImageFileDataset(str(folder), rows, transform=transform),
                                torch.tensor([index[name] for name in subfolders]))


def _with_source_classes(dataset: Any, classes: torch.Tensor) -> Any:
    """Record each OOD image's class in its own source (a digit, a Fashion-MNIST class, the first sub-folder
    of an image folder; every label stays -2) as ``source_classes``: what a class-balanced choice of the
    images balances over (:func:`datamodules.images.balanced_choice`, EvG's seeds)."""
    dataset.source_classes = classes.long()
    return dataset


def digits_set(argument: str, *, transform: Callable | None = None, **_: Any) -> torch.utils.data.Dataset:
    """scikit-learn's 1,797 real 8x8 digits, upsampled to 28x28."""
    if argument:
        raise ValueError(f"the real OOD set digits takes no argument, got digits:{argument}")
    images, digit = load_digits_images()
    dataset = TensorImageDataset(images, torch.full((images.shape[0],), UNKNOWN_LABEL), transform=transform)
    return _with_source_classes(dataset, torch.from_numpy(digit))


def fashion_set(argument: str, *, data_dir: str, known: Sequence[int] = (), transform: Callable | None = None,
                **_: Any) -> torch.utils.data.Dataset:
    """Fashion-MNIST test images of some classes: ``unknown`` (the demo's never-seen classes) or ``<id>,<id>``."""
    spec = f"fashion:{argument}"
    try:
        classes = DEMO_UNKNOWN if argument == "unknown" else tuple(int(c) for c in argument.split(","))
    except ValueError:
        raise ValueError(f"real OOD set {spec!r}: give fashion:unknown or Fashion-MNIST class ids "
                         "(fashion:4,6)") from None
    if set(classes) & set(known):
        raise ValueError(f"real OOD set {spec!r} holds in-distribution classes {sorted(set(classes) & set(known))}")
    images, labels = load_fashion_mnist(data_dir, "test")
    mask = np.isin(labels, classes)
    dataset = TensorImageDataset(torch.from_numpy(images[mask].copy()).unsqueeze(1),
                                 torch.full((int(mask.sum()),), UNKNOWN_LABEL), transform=transform)
    return _with_source_classes(dataset, torch.from_numpy(labels[mask].astype(np.int64)))


def fashion_benchmark(*, data_dir: str = DEBIAN_FASHION_MNIST_DIR, unit_images: int = 64,
                      unit_tests: Sequence[str] | None = None, corruptions: Sequence[str] = ("gaussian_noise",
                      "gaussian_blur", "contrast"), severity: int = 3, val_images: int = 1000, seed: int = 0,
                      full_spectrum: bool = True, batch_size: int = 256, num_workers: int = 0) -> OODBenchmarkData:
    """The demo's OOD benchmark, OpenOOD's shape on Fashion-MNIST (Debian's ``dataset-fashion-mnist``):

    - ``id_test``: the test images of the demo's known classes (T-shirt/top, Trouser, Sneaker, Bag: labels 0-3);
    - ``id_val``: ``val_images`` training images of the known classes the demo model holds out for validation
      (the datamodule's own validation split: never a test image);
    - ``ood_val``: the test images of the demo's negative classes (Pullover, Dress, Sandal), the tuning set;
    - ``near``: the test images of its unknown classes (Coat, Shirt, Ankle boot);
    - ``far``: scikit-learn's 8x8 digits, upsampled;
    - ``unit``: the OOD unit tests (:mod:`datamodules.unit_tests`), ``unit_images`` each at 28x28, one channel;
    - ``csid``: the ID test images corrupted by each of ``corruptions`` at ``severity``
      (:mod:`datamodules.covariate_shift`), with their labels (made only with ``full_spectrum``).
    """
    from datamodules.covariate_shift import shifted_set
    from datamodules.unit_tests import UNIT_TESTS, unit_test_set

    datamodule = FashionMNISTOpenSetDataModule(data_dir=data_dir)
    id_test = datamodule.evaluation_set("test", role="id_test", known_only=True, name="fashion:known")
    id_val = datamodule.evaluation_set("val", role="id_val", known_only=True, name="fashion:known-val")
    if len(id_val) > val_images:
        id_val = EvaluationSet(id_val.name, "id_val", Subset(id_val.dataset, range(val_images)),
                               info=id_val.info)
    def classes(which: Sequence[int]) -> str:  # the real OOD set fashion:<ids>
        return ",".join(str(c) for c in which)

    fashion = "Fashion-MNIST test images (Xiao et al. 2017), Debian's dataset-fashion-mnist"
    sets: list[tuple[str, EvaluationSet, dict[str, Any]]] = [
        ("id_test", id_test, {"source": f"{fashion}, the known classes {list(DEMO_KNOWN)}"}),
        ("id_val", id_val, {"source": "the demo datamodule's validation split of the known classes' training images"}),
        ("ood_val", EvaluationSet("fashion:negative", "ood_val", fashion_set(classes(DEMO_NEGATIVE), data_dir=data_dir)),
         {"source": f"{fashion}, the negative classes {list(DEMO_NEGATIVE)}"}),
        ("near", EvaluationSet("fashion:unknown", "ood", fashion_set(classes(DEMO_UNKNOWN), data_dir=data_dir)),
         {"source": f"{fashion}, the unknown classes {list(DEMO_UNKNOWN)}"}),
        ("far", EvaluationSet("digits", "ood", digits_set("")),
         {"source": "scikit-learn's 1,797 8x8 digits, upsampled to 28x28"})]
    for name in unit_tests if unit_tests is not None else list(UNIT_TESTS):
        test = UNIT_TESTS[name]
        sets.append(("unit", EvaluationSet(f"unit:{name}", "ood", unit_test_set(name, unit_images, 28, channels=1,
                                                                               seed=seed)),
                     {"source": f"OOD unit test (Bitterwolf et al. 2023), generated here: {test.description}"}))
    for name in corruptions if full_spectrum else ():
        shifted = shifted_set(id_test.dataset, name=name, severity=severity, seed=seed)  # the ID labels kept
        sets.append(("csid", EvaluationSet(f"fashion:{name}-{severity}", "real_shift", shifted),
                     {"source": f"the ID test images, {name} at severity {severity} (ImageNet-C's corruption, "
                                "generated here)"}))
    return OODBenchmarkData("fashion", sets, classes=datamodule.class_names, num_classes=len(DEMO_KNOWN),
                            fit=lambda: datamodule.evaluation_set("train", role="fit", known_only=True, name="fit"),
                            description="the demo: Fashion-MNIST's known classes vs its unknown classes (near), the "
                                        "digits (far), the OOD unit tests, and corrupted ID images (full-spectrum)",
                            batch_size=batch_size, num_workers=num_workers)


def _fashion_context(datamodule: FashionMNISTOpenSetDataModule) -> dict[str, Any]:
    return {"data_dir": datamodule._folder(), "known": datamodule.known}


register(InDistribution("fashion", FashionMNISTOpenSetDataModule, "the demo: Fashion-MNIST, 4 known classes",
                        ood_context=_fashion_context))
register(InDistribution("protocol", ImageNetProtocolDataModule, "an ImageNet protocol P1-P3 of Palechor et al."))
register(InDistribution("folder", ClassFolderDataModule, "a user's class folders (root/train/<class>, root/val/<class>)"))
register(RealOOD("digits", digits_set, "scikit-learn's 8x8 digits, upsampled"))
register(RealOOD("fashion", fashion_set, "Fashion-MNIST test images of other classes (fashion:unknown, fashion:4,6)"))
register(OODBenchmark("fashion", fashion_benchmark, "the demo: Fashion-MNIST known vs unknown classes (near), the digits "
                      "(far), the OOD unit tests, corrupted ID images (full-spectrum)"))
for _benchmark, _what in (("imagenet1k", "ImageNet-1K (45,000 val images) vs SSB-hard, NINCO (near), iNaturalist, "
                                          "Textures, OpenImage-O (far); ImageNet-V2/-C/-R (full-spectrum)"),
                          ("imagenet200", "ImageNet-200 (a 200-class subset) vs the ImageNet-1K benchmark's OOD sets"),
                          ("cifar10", "CIFAR-10 vs CIFAR-100, TinyImageNet (near), MNIST, SVHN, Textures, Places365 (far)"),
                          ("cifar100", "CIFAR-100 vs CIFAR-10, TinyImageNet (near), MNIST, SVHN, Textures, Places365 (far)")):
    register(OODBenchmark(f"openood:{_benchmark}", _openood_builder(_benchmark), f"OpenOOD v1.5: {_what}"))
register(SeverityPool("imagenet", ImageNetSeverityData, "ImageNet-1k val vs an ImageNet-21k pool (Galil et al.)"))
register(SeverityPool("protocol", ProtocolSeverityData, "a protocol's known classes vs its unknown classes"))
register(SeverityPool("folder", FolderSeverityData, "a user's class folders vs a pool of folders"))
register(SeverityPool("fashion", FashionSeverityData, "the demo: Fashion-MNIST's other classes and the digits"))

__all__ = ["IN_DISTRIBUTION", "OOD_BENCHMARKS", "REAL_OOD", "SEVERITY_POOLS", "InDistribution", "OODBenchmark",
           "RealOOD", "SeverityPool", "build_datamodule", "build_ood_benchmark", "build_severity_data", "entry_of", "ood_context", "real_ood_set", "register",
           "severity_factory"]
