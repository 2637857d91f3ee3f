"""Typed configuration: importing an object by its path, the plug-ins of an entry-point group, a dataclass from a
mapping, and the arguments of a class checked by the types of its signature (the ``--data-arg`` of every command,
before anything is built)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
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


def typed_arguments(target: Any, arguments: dict[str, Any], *, what: str) -> dict[str, Any]:
    """Check ``arguments`` of a class (or function) by the types of its signature, before it is built:
    an unknown name, a float where an int is expected, a scalar where a list is expected are errors that
    name ``what``, the argument and the expected type. Returns the arguments as parsed."""
    from jsonargparse import ArgumentParser

    parameters = inspect.signature(target).parameters
    unknown = sorted(set(arguments) - set(parameters))
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        raise ValueError(f"{what} ({getattr(target, '__name__', target)}) has no arguments {unknown}; it takes "
                         f"{[n for n in parameters if n != 'self']}")
    parser = ArgumentParser(exit_on_error=False)
    typed = {name: value for name, value in arguments.items() if name in parameters}
    if inspect.isclass(target):
        parser.add_class_arguments(target, None, skip={n for n in parameters if n not in typed}, fail_untyped=False)
    else:
        parser.add_function_arguments(target, None, skip={n for n in parameters if n not in typed}, fail_untyped=False)
    try:
        parsed = parser.parse_object(typed)
    except Exception as error:  # jsonargparse's ArgumentError names the key and the expected type
        raise ValueError(f"{what}: {error}".replace("\n", " ")) from None
    return {name: parsed[name] for name in typed}
