"""Data by name: the short names of the commands' ``--data`` (``fashion``, ``imagenet``, ``protocol``,
``folder``), or any class path, with their arguments checked by type before anything is read."""

from __future__ import annotations

import typing
from typing import Any

from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.imagenet import ClassFolderDataModule, ImageNetProtocolDataModule
from datamodules.open_set import OpenSetDataModule
from datamodules.severity import (
    FashionSeverityData,
    FolderSeverityData,
    ImageNetSeverityData,
    ProtocolSeverityData,
    SeverityData,
)
from openset_common import import_object, typed_arguments

DATAMODULES: dict[str, type[OpenSetDataModule]] = {
    "fashion": FashionMNISTOpenSetDataModule,
    "protocol": ImageNetProtocolDataModule,
    "folder": ClassFolderDataModule,
}
SEVERITY_DATA: dict[str, type[SeverityData]] = {
    "imagenet": ImageNetSeverityData,
    "protocol": ProtocolSeverityData,
    "folder": FolderSeverityData,
    "fashion": FashionSeverityData,
}


def resolve(name: str, registry: dict[str, type], base: type, *, what: str) -> type:
    """A class by short name (of ``registry``) or by class path, which must be a ``base``."""
    target = registry.get(name) or (import_object(name) if "." in name else None)
    if target is None:
        raise ValueError(f"unknown {what} {name!r}: use one of {sorted(registry)} or a class path "
                         f"(a subclass of {base.__module__}.{base.__qualname__})")
    if not (isinstance(target, type) and issubclass(target, base)):
        raise ValueError(f"{what} {name!r} is a {getattr(target, '__name__', target)}, not a {base.__qualname__}")
    return target


def build_datamodule(name: str, arguments: dict[str, Any] | None = None) -> OpenSetDataModule:
    """An open-set datamodule by name or class path (e.g. ``fashion``), its arguments checked by type."""
    target = resolve(name, DATAMODULES, OpenSetDataModule, what="datamodule")
    return target(**typed_arguments(target, dict(arguments or {}), what=f"--data {name} --data-arg"))


def build_severity_data(name: str | None, arguments: dict[str, Any] | None = None, *,
                        datamodule: Any | None = None) -> SeverityData:
    """The severity data of a command.

    Args:
        name: ``imagenet``, ``protocol``, ``folder``, ``fashion`` or a class path; ``None``: the model's own
            (its training ``datamodule``'s ``severity_data()``), else ImageNet.
        arguments: the data's arguments (``--data-arg``), checked by type.
        datamodule: the training datamodule of the model (a checkpoint's): ``protocol`` and ``fashion`` take its
            root, protocol and classes.
    """
    arguments = dict(arguments or {})
    factory = getattr(datamodule, "severity_data", None)
    if name is None and factory is None:
        name = "imagenet"
    if name is None or (factory is not None and name in ("protocol", "fashion", "folder")):
        made = typing.get_type_hints(factory).get("return")
        if isinstance(made, type):
            typed_arguments(made, arguments, what=f"--data-arg of {type(datamodule).__name__}'s severity data")
        return factory(**arguments)  # type: ignore[misc]
    target = resolve(name, SEVERITY_DATA, SeverityData, what="severity data")
    return target(**typed_arguments(target, arguments, what=f"--data {name} --data-arg"))
