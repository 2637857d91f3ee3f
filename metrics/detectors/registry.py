"""The detectors by name: a decorator, an entry-point group, class paths and pytorch-ood's classes.

Every detector of the project -- every confidence function κ -- is a :class:`metrics.detectors.Detector`
subclass, found by one resolver, :func:`resolve_detector`, from any of:

    a registry name        ``softmax``, ``mahalanobis``, ...: classes decorated with :func:`register_detector`
                           (the built-in ones, and any a user's module registers when it is imported)
    an entry point         group ``openset_bench.detectors`` of an installed package
                           (``my_score = "my_package.detectors:MyScore"``), loaded when the registry is first read
    a class path           ``my_package.detectors.MyScore``: a Detector subclass, imported and registered
    ``pood:<Class>``       any pytorch-ood 0.4.0 detector that scores a model's outputs
                           (:mod:`metrics.detectors.pood`)

A detector's name is its class's ``name`` (a class path or entry point names its class; a class without a
``name`` takes its path or entry-point name).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any, TypeVar

from metrics.detectors.base import Detector
from openset_common.typed import import_object, plugins

ENTRY_POINTS = "openset_bench.detectors"
POOD_PREFIX = "pood:"

BUILT_IN = (
    "metrics.detectors.confidence",
    "metrics.detectors.perturbation",
    "metrics.detectors.ensemble",
    "metrics.detectors.mahalanobis",
    "metrics.detectors.mahalanobis_pp",
    "metrics.detectors.knn",
    "metrics.detectors.vim",
    "metrics.detectors.react",
    "metrics.detectors.ash",
    "metrics.detectors.scale",
    "metrics.detectors.she",
    "metrics.detectors.gen",
    "metrics.detectors.dice",
    "metrics.detectors.adascale",
    "metrics.detectors.nci",
    "metrics.detectors.fdbd",
    "metrics.detectors.gradnorm",
    "metrics.detectors.vra",
    "metrics.detectors.nnguide",
    "metrics.detectors.klm",
    "metrics.detectors.openmax",
    "metrics.detectors.ghost",
    "metrics.detectors.postmax",
    "metrics.detectors.weiper",
    "metrics.detectors.optfs",
    "metrics.detectors.nac",
)
"""The modules of the built-in detectors, in the order the detectors' page lists them."""

_REGISTRY: dict[str, type[Detector]] = {}
_LOADED = False

D = TypeVar("D", bound=type[Detector])


def register_detector(cls: D) -> D:
    """Class decorator: register a :class:`Detector` subclass under its ``name``.

    Raises:
        TypeError: not a Detector subclass, or no ``name``.
        ValueError: the name is another class's.
    """
    if not (isinstance(cls, type) and issubclass(cls, Detector)):
        raise TypeError(f"register_detector takes a subclass of {Detector.__module__}.Detector, got {cls!r}")
    if not cls.name or cls.name.startswith(POOD_PREFIX):
        raise TypeError(f"detector class {cls.__module__}.{cls.__qualname__} needs a name (its class attribute "
                        f"`name`, not starting with {POOD_PREFIX!r})")
    other = _REGISTRY.get(cls.name)
    if other is not None and other is not cls and f"{other.__module__}.{other.__qualname__}" != \
            f"{cls.__module__}.{cls.__qualname__}":
        raise ValueError(f"detector name {cls.name!r} of {cls.__module__}.{cls.__qualname__} is already "
                         f"{other.__module__}.{other.__qualname__}'s")
    _REGISTRY[cls.name] = cls
    return cls


def unregister_detector(name: str) -> None:
    """Remove a registered detector (tests)."""
    _REGISTRY.pop(name, None)


def _load() -> None:
    for module in BUILT_IN:
        importlib.import_module(module)
    for name, origin, loaded in plugins(ENTRY_POINTS, "detector"):
        if not (isinstance(loaded, type) and issubclass(loaded, Detector)):
            raise TypeError(f"{origin} loads {loaded!r}, not a detector: it must name a subclass of "
                            f"{Detector.__module__}.Detector")
        if not loaded.name:
            loaded.name = name
        try:
            register_detector(loaded)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{origin}: {error}") from error


def detectors() -> dict[str, type[Detector]]:
    """Every registered detector by name: the built-in ones (in :data:`BUILT_IN`'s order), then those of
    installed packages (entry points), then any registered since."""
    global _LOADED
    if not _LOADED:
        _LOADED = True  # first: a plug-in that reads the registry while it loads sees what is loaded so far
        try:
            _load()
        except BaseException:
            _LOADED = False
            raise
    return dict(_REGISTRY)


def resolve_detector(name: str | type[Detector]) -> type[Detector]:
    """The detector class of a name: a registry name, ``pood:<Class>``, or a class path (see the module
    docstring); a Detector subclass is returned as it is.

    Raises:
        ValueError: an unknown name (listing the registered ones) or a class path that is not a Detector.
    """
    if isinstance(name, type) and issubclass(name, Detector):
        return name
    if not isinstance(name, str) or not name:
        raise ValueError(f"a detector is a name, pood:<class> or a class path, got {name!r}")
    if name.startswith(POOD_PREFIX):
        from metrics.detectors.pood import pood_detector_class

        return pood_detector_class(name.removeprefix(POOD_PREFIX))
    registered = detectors()
    if name in registered:
        return registered[name]
    if "." in name:
        target = import_object(name)
        if not (isinstance(target, type) and issubclass(target, Detector)):
            raise ValueError(f"detector {name!r} is {getattr(target, '__qualname__', target)!r}, not a subclass of "
                             f"{Detector.__module__}.Detector")
        if target._score is Detector._score and target.score_images is Detector.score_images and \
                target.image_outputs is Detector.image_outputs:
            raise ValueError(f"detector {name!r} is a base class that scores nothing (it defines neither _score nor "
                             "score_images): name a detector")
        if not target.name:  # named by its path: a subclass of that name (the class itself, and its other
            target = type(target.__name__, (target,), {"name": name, "__module__": target.__module__,  # subclasses,
                                                       "__qualname__": target.__qualname__})  # stay unnamed)
        return register_detector(target)  # from now on its name finds it too (a clash is refused, naming both)
    raise ValueError(f"unknown detector {name!r}; choose from {sorted(registered)}, "
                     "pood:<a pytorch-ood detector class> or a class path (my_package.module.MyDetector, a subclass of "
                     "metrics.detectors.Detector)")


def build_detector(name: str | type[Detector], *, background: bool = False, **hyperparameters: Any) -> Detector:
    """The detector ``name`` (:func:`resolve_detector`) with ``hyperparameters``, unfitted.

    Raises:
        ValueError: an unknown name or hyperparameter (naming it and listing the valid ones), or an invalid
            value (naming it).
    """
    cls = resolve_detector(name)
    return cls(background=background, **cls.arguments(**hyperparameters))
