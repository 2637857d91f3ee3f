"""Typed configuration: importing an object by its path, the plug-ins of an entry-point group, a dataclass from a
mapping, the arguments of a class checked by the types of its signature (the ``--data-arg`` of every command,
before anything is built), and a Lightning module's arguments, its option dataclass's among them, recorded."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import types
from collections.abc import Iterator, Mapping
from typing import Any


def plugins(group: str, what: str) -> Iterator[tuple[str, str, Any]]:
    """``(name, origin, object)`` of each entry point of ``group`` (installed packages' plug-ins: methods,
    detectors): its name, how an error names it (``origin``: ``the <what> '<name>' of entry point '<value>' (<group>, package <dist> <version>)``) and what it loads.

    Raises:
        ImportError: a plug-in that does not import, named (not a traceback of the import machinery).
    """
    import importlib.metadata

    for entry in importlib.metadata.entry_points(group=group):
        dist = getattr(entry, "dist", None)
        package = f", package {dist.name} {dist.version}" if dist is not None else ""
        origin = f"the {what} {entry.name!r} of entry point {entry.value!r} ({group}{package})"
        try:
            loaded = entry.load()
        except Exception as error:  # noqa: BLE001 - any error of a plug-in's import is named with it
            raise ImportError(f"{origin} does not import: {error}") from error
        yield entry.name, origin, loaded


def import_object(path: str) -> Any:
    """``"package.module.Name"`` -> the object (a class, a function)."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a module.Name path")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import {path!r}: {error}") from error


def dataclass_of(cls: type, value: Any, *, what: str) -> Any:
    """An options dataclass ``cls`` from ``None`` (its defaults), a mapping of its field names (from Python or
    YAML: an unknown name is an error naming it and the options), or an instance of it."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"{what}: {unknown} are not options of {cls.__name__} (its options: {sorted(fields)})")
        return cls(**value)
    raise TypeError(f"{what} must be a {cls.__name__} or a mapping of its options, got {value!r}")


def _parser(target: Any, skip: set[str] | frozenset[str] = frozenset()) -> Any:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    if inspect.isclass(target):
        parser.add_class_arguments(target, None, skip=set(skip), fail_untyped=False)
    else:
        parser.add_function_arguments(target, None, skip=set(skip), fail_untyped=False)
    return parser


def parameter_names(target: Any) -> tuple[list[str], bool]:
    """The arguments a class (or function) takes, as jsonargparse (so LightningCLI) reads its signature: its own,
    and those its ``**options`` pass on (to a base class's ``__init__``, an options dataclass), and whether it
    takes more (``**kwargs`` that go nowhere jsonargparse can follow)."""
    parameters = inspect.signature(target).parameters
    names = list(_parser(target).get_defaults().keys())
    own = [n for n, p in parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self"]
    more = any(p.kind is p.VAR_KEYWORD for p in parameters.values()) and set(names) <= set(own)
    return list(dict.fromkeys([*own, *names])), more


def typed_arguments(target: Any, arguments: dict[str, Any], *, what: str) -> dict[str, Any]:
    """Check ``arguments`` of a class (or function) by the types of its signature (:func:`parameter_names`: the
    options it passes on as ``**options`` among them), before it is built: an unknown name, a float where an int
    is expected, a scalar where a list is expected are errors that name ``what``, the argument and the expected
    type. Returns the arguments as parsed."""
    names, more = parameter_names(target)
    unknown = sorted(set(arguments) - set(names))
    if unknown and not more:
        raise ValueError(f"{what} ({getattr(target, '__name__', target)}) has no arguments {unknown}; it takes "
                         f"{names}")
    typed = {name: value for name, value in arguments.items() if name in names}
    parser = _parser(target, skip={n for n in names if n not in typed})
    try:
        parsed = parser.parse_object(typed)
    except Exception as error:  # jsonargparse's ArgumentError names the key and the expected type
        raise ValueError(f"{what}: {error}".replace("\n", " ")) from None
    return {name: parsed[name] for name in typed}


def save_arguments(module: Any, options: Any, frame: types.FrameType | None) -> None:
    """Record a LightningModule's or LightningDataModule's constructor arguments as its hyper-parameters (what a
    checkpoint keeps and the module is rebuilt from): LightningCLI's parsed arguments, else those of the
    constructor's ``frame`` (its own and the options it passed on as ``**options``), with every field of its
    option dataclass ``options`` that neither gave added at its value, so a module records the same keys however it
    was built. A key it does not take (``train.py`` links the data's ``num_classes`` to every model, which a class
    that passes ``**options`` on seems to accept) is not recorded: the checkpoint would not load."""
    module.save_hyperparameters(frame=frame)
    for name, value in dataclasses.asdict(options).items():
        module.hparams.setdefault(name, value)
    taken, more = parameter_names(type(module))
    for name in [k for k in module.hparams if not more and not k.startswith("_") and k not in taken]:
        del module.hparams[name]
    module._hparams_initial = copy.deepcopy(module.hparams)
