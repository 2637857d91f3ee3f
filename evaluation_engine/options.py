"""The option groups every evaluation command shares, typed once: the models' (:class:`ModelOptions`), the data's
(:class:`DataOptions`), the detectors' (:class:`DetectorOptions`), the outputs' (:class:`OutputOptions`), the
intervals (:class:`evaluation_engine.intervals.Intervals`) and the trainer's (:class:`TrainerOptions`).

Each group is a keyword-only dataclass, and a command (itself one, :class:`evaluation_engine.command.Evaluation`)
inherits the groups it uses: their fields are its own, flat, with their types, defaults and documentation
(``--kappa``, ``--data-arg``, ``--output-dir``; ``kappa:`` in YAML; ``SeverityEvaluation(model=..., data="fashion",
kappa=["energy"])`` from Python), a command changes a default by declaring the field again (``cache_dir: str |
None = "runs/cache"``), and each group's ``__post_init__`` checks its fields (:class:`DetectorOptions` resolves
every κ there, once). jsonargparse parses a command by its signature (:func:`add_command_arguments`), so
``evaluate.py``, a report card's sections and Python build a command the same way. Intervals stay one nested key
(``--intervals.level``, ``intervals: {level: 0.9}``). A group also stands alone (a callback's
``DetectorOptions(kappa=[...])``).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metrics import resolve_detector
from metrics.detectors import Detector


class OptionGroup:
    """The base of the option groups and of the commands that inherit them (keyword-only dataclasses): each
    group's ``__post_init__`` checks its own fields and calls the next one's, so a command that inherits several
    groups runs every group's checks once, in the order of its bases."""

    def __post_init__(self) -> None:
        """The end of the chain of checks."""


FIT_CAPS = ("fraction", "per_class", "images")
"""The ways to cap a fit set (one at a time): a fraction of it, at most ``N`` images per class, or ``N`` images in
all; each a seeded class-balanced choice (:func:`evaluation_engine.scoring.fit_subset`)."""
FIT_OPTIONS = (*FIT_CAPS, "seed")


def check_fit_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A detector's ``fit`` option: ``{"fraction": f}`` (0 < f <= 1), ``{"per_class": n}`` or ``{"images": n}``
    (one of them), and ``seed``."""
    unknown = sorted(set(options) - set(FIT_OPTIONS))
    if unknown:
        raise ValueError(f"fit options of {name!r}: unknown {unknown}; choose from {list(FIT_OPTIONS)}")
    caps = [k for k in FIT_CAPS if options.get(k) is not None]
    if len(caps) > 1:
        raise ValueError(f"fit options of {name!r}: give one of {' or '.join(FIT_CAPS)}, not {' and '.join(caps)} "
                         f"({options})")
    fraction = options.get("fraction")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0 < fraction <= 1):
        raise ValueError(f"fit options of {name!r}: fraction must be in (0, 1], got {fraction!r}")
    for key in ("per_class", "images"):
        count = options.get(key)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ValueError(f"fit options of {name!r}: {key} must be a positive integer, got {count!r}")
    return {k: v for k, v in options.items() if v is not None}


@dataclass(kw_only=True)
class WeightOptions(OptionGroup):
    """Whether timm and torchvision models get their pretrained weights.

    Attributes:
        random_weights: timm/torchvision models without pretrained weights (tests).
    """

    random_weights: bool = False


@dataclass(kw_only=True)
class ModelOptions(WeightOptions):
    """How a command builds its models from their specs (``timm:<name>``, ``torchvision:<name>``, checkpoints of
    ``train.py``, ``ensemble:<members>``).

    Attributes:
        model_args: timm/torchvision model arguments, e.g. ``{"drop_rate": 0.2}`` for MC dropout.
        pretrained_file: an explicit weights file (timm).
    """

    model_args: dict[str, Any] | None = None
    pretrained_file: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.model_args = dict(self.model_args or {})


@dataclass(kw_only=True)
class DataArgOptions(OptionGroup):
    """Arguments of a datamodule to change.

    Attributes:
        data_args: arguments of the data or datamodule to change (``--data-arg root=/data/ILSVRC2012``).
    """

    data_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.data_args = dict(self.data_args or {})


@dataclass(kw_only=True)
class DataOptions(DataArgOptions):
    """The in-distribution data of a command and its passes.

    Attributes:
        data: the data: a name of :mod:`datamodules.catalog` (``fashion``, ``imagenet``, ``protocol``, ``folder``,
            ...), a checkpoint (its datamodule) or a datamodule class path; default: the first checkpoint model's
            datamodule (each command says its own default).
        data_args: arguments of that data or datamodule to change (``--data-arg root=/data/ILSVRC2012``).
        batch_size: of the passes (default: the command's or the data's).
        num_workers: data-loading workers of the passes (default: the command's or the data's).
    """

    data: str | None = None
    batch_size: int | None = None
    num_workers: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or self.batch_size < 1):
            raise ValueError(f"batch_size must be positive, got {self.batch_size!r}")
        if self.num_workers is not None and (isinstance(self.num_workers, bool) or self.num_workers < 0):
            raise ValueError(f"num_workers must be zero or more, got {self.num_workers!r}")


@dataclass(kw_only=True)
class DetectorOptions(OptionGroup):
    """The detectors (confidence functions κ, :data:`metrics.KAPPAS`) a command scores and how they are fitted.

    Attributes:
        kappa: the κ names (``softmax``, ``energy``, ``odin``, ``mahalanobis``, ``knn``, ``vim``, ``react``,
            ``ash``, ..., ``pood:<Detector>`` for any pytorch-ood detector by name); each is paired with the models
            it applies to (ensemble κ with ensembles).
        kappa_args: per κ, its arguments, e.g. ``{"odin": {"temperature": 1000}}`` (``--kappa-arg
            odin.temperature=1000``); a κ not among ``kappa`` is refused.
        fit_data: the in-distribution training images of fitted detectors (Mahalanobis, KNN, ViM, ReAct, ...):
            ``<folder>/<class>/*`` with the model's classes (ILSVRC2012/train for a timm model); default: a
            checkpoint's (or the ID datamodule's) training split.
        fit: per κ, the cap of its fit set: ``{"knn": {"fraction": 0.01}}``, ``{"mahalanobis": {"per_class":
            100}}`` (``--fit-arg knn.fraction=0.01``); a κ not among ``kappa`` is refused.
        allow_fit_overlap: run even when the fit set holds images the command evaluates on (the same files, links
            to them or copies: :mod:`datamodules.overlap`), which is otherwise refused before any pass, naming the
            images; every table a detector fitted on such a set shapes then says so (``fit overlap``).
    """

    kappa: list[str] = field(default_factory=lambda: ["softmax"])
    kappa_args: dict[str, dict[str, Any]] | None = None
    fit_data: str | None = None
    fit: dict[str, dict[str, Any]] | None = None
    allow_fit_overlap: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.kappa = [self.kappa] if isinstance(self.kappa, str) else list(self.kappa)
        self.kappa_args, self.fit = dict(self.kappa_args or {}), dict(self.fit or {})
        if not self.kappa:
            raise ValueError("give at least one confidence function (--kappa)")
        resolved = self.resolve(self.kappa)
        named = {name: cls.name for name, cls in resolved.items()}
        for option in ("kappa_args", "fit"):
            given = getattr(self, option)
            unknown = sorted(set(given) - set(named) - set(named.values()))
            if unknown:
                raise ValueError(f"{option} for {unknown}, which are not among the kappas {list(named.values())}")
            keys: dict[str, str] = {}
            for key in given:
                other = keys.setdefault(named.get(key, key), key)
                if other != key:
                    raise ValueError(f"{option} for {other!r} and {key!r}, which name one detector "
                                     f"({named.get(key, key)!r}): give its arguments once")
            setattr(self, option, {named.get(key, key): dict(value or {}) for key, value in given.items()})
        detectors: dict[str, type[Detector]] = {cls.name: cls for cls in resolved.values()}
        self.kappa = list(detectors)
        #: the detector classes of :attr:`kappa`, in order
        self.detector_classes: list[type[Detector]] = list(detectors.values())
        # every κ's resolved parameters (defaults + arguments: an unknown or invalid one named here), and every fit
        # cap checked, before anything runs
        self.kappa_parameters: dict[str, dict[str, Any]] = {
            name: cls.arguments(**self.kappa_args.get(name, {})) for name, cls in detectors.items()}
        unfitted = sorted(name for name in self.fit if not detectors[name].fit_data)
        if unfitted:
            raise ValueError(f"fit options for {unfitted}, which are not among the fitted kappas")
        self.fit = {name: check_fit_options(name, options) for name, options in self.fit.items()}

    @staticmethod
    def resolve(kappa: Sequence[str | type[Detector]]) -> dict[Any, type[Detector]]:
        """The one place a κ is resolved (a registry name, an entry point, a class path, ``pood:<Class>``, or a
        class from Python): every command, section and callback takes its detectors from here, each then named
        by its detector's name. Given κ -> its detector class."""
        return {name: resolve_detector(name) for name in kappa}

@dataclass(kw_only=True)
class OutputOptions(OptionGroup):
    """Where a command writes and caches.

    Attributes:
        output_dir: the command's folder of tables, figures and ``replicates.pt`` (each command says its default);
            written whole or not at all.
        cache_dir: the cache of model passes (``None``: none; fingerprinted by model, data and fit, so a change
            never reuses stale scores).
        plots: write and log the figures.
    """

    output_dir: str | None = None
    cache_dir: str | None = None
    plots: bool = True


# the parameters of a command that are no option of its parser: the trainer's options (given flat, as
# TrainerOptions' fields) and the report card's sections (one option per registered method)
NOT_OPTIONS = ("trainer", "sections")


def command_options(cls: type) -> dict[str, Any]:
    """A command's options (the keyword arguments of its constructor, its option groups' fields among them) ->
    their types."""
    owner = next(k for k in cls.__mro__ if "__init__" in vars(k))  # whose __init__ the command runs
    params = vars(owner).get("__dataclass_params__")
    hints = typing.get_type_hints(cls if params is not None and params.init else cls.__init__)
    return {name: hints.get(name, Any) for name, p in inspect.signature(cls).parameters.items()
            if name not in NOT_OPTIONS and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def add_command_arguments(parser: Any, cls: type, *, skip: set[str] | frozenset[str] = frozenset()) -> None:
    """A command's options on a jsonargparse parser, all at the top level, by its constructor's signature (a
    dataclass's fields, its option groups' included, with their defaults and documentation); ``skip`` leaves
    options out."""
    parser.add_class_arguments(cls, None, skip={*NOT_OPTIONS, *skip}, sub_configs=True, fail_untyped=False)


def section_type(cls: type, *, foreign: Sequence[str] = ()) -> Any:
    """The type of a report card's section of command ``cls``, for jsonargparse: a mapping of the command's own
    option names, each by its type (a word where a number is expected is named by the parser), and ``config``, a
    YAML file of the command's options whose relative path is read against the file that names it (jsonargparse's
    ``Path_fr``: the report's config file, else the current folder). ``foreign``: keys a section may not set but
    that the card refuses with its own message (the report's models and trainer options)."""
    from jsonargparse.typing import Path_fr

    hints = command_options(cls)
    if "intervals" in hints:
        hints["intervals"] = dict[str, Any] | None  # given by its fields, built by Intervals.of
    fields = {"config": Path_fr | None, **hints, **dict.fromkeys(foreign, Any)}
    return typing.TypedDict(f"{getattr(cls, 'command', cls.__name__)}_section", fields, total=False)  # type: ignore[operator]


def read_options(cls: type, path: str | Any, *, what: str) -> dict[str, Any]:
    """The options in a YAML file of command ``cls`` (its ``--config``), read and checked by the command's own
    jsonargparse parser (its options and the trainer's): only the keys the file sets."""
    from jsonargparse import ArgumentParser

    from evaluation_engine.runner import TrainerOptions

    parser = ArgumentParser(exit_on_error=False)
    add_command_arguments(parser, cls, skip={"model"})
    parser.add_argument("--model", type=Any, default=None)  # a command's own file names its models; optional here
    parser.add_class_arguments(TrainerOptions, None)
    try:
        return parser.parse_path(path, defaults=False).as_dict()
    except Exception as error:  # jsonargparse's errors name the key and the expected type
        raise ValueError(f"{what}: {error}".replace("\n", " ")) from None


def check_options(cls: type, options: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """``options`` (flat names, some of a command's) checked by the command's own parser: an unknown name, a word
    where a number is expected, a scalar where a list is expected are errors naming ``what``, the option and the
    expected type. Returns them as parsed."""
    from jsonargparse import ArgumentParser

    known = command_options(cls)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{what}: {unknown} are not options of evaluate.py {getattr(cls, 'command', cls.__name__)} "
                         f"(its options: {sorted(known)})")
    parser = ArgumentParser(exit_on_error=False)
    add_command_arguments(parser, cls, skip=set(known) - set(options))
    try:
        parsed = parser.parse_object(dict(options))
    except Exception as error:  # jsonargparse's ArgumentError names the key and the expected type
        raise ValueError(f"{what}: {error}".replace("\n", " ")) from None
    return {name: parsed[name] for name in options}


__all__ = ["DataArgOptions", "DataOptions", "DetectorOptions", "ModelOptions", "OptionGroup", "OutputOptions",
           "WeightOptions", "add_command_arguments", "check_options", "command_options", "read_options",
           "section_type"]
