"""The option groups every evaluation command shares, typed once: the models' (:class:`ModelOptions`), the data's
(:class:`DataOptions`), the detectors' (:class:`DetectorOptions`), the outputs' (:class:`OutputOptions`), the
intervals (:class:`evaluation_engine.intervals.Intervals`) and the trainer's (:class:`TrainerOptions`).

A command composes the groups it uses by naming them in its ``__init__`` (``data_options: DataOptions | None``,
...), with the fields it reads (:attr:`Evaluation.option_fields`) and its own defaults
(:attr:`Evaluation.option_defaults`). On the command line and in YAML every field keeps its flat name
(``--kappa``, ``--data-arg``, ``--output-dir``, ``kappa:``), as the trainer's always did; jsonargparse parses
each group's fields by the group's types (:func:`add_command_arguments`), and :func:`compose` builds the groups
from the flat names, so ``evaluate.py``, the report card's sections and Python (``SeverityEvaluation.of(model=...,
data="fashion", kappa=["energy"])``) build a command the same way. Intervals stay one nested key
(``--intervals.level``, ``intervals: {level: 0.9}``).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metrics import resolve_detector
from metrics.detectors import Detector


class OptionGroup:
    """The base of the shared option groups: :meth:`of` builds one from ``None``, a mapping or itself."""

    @classmethod
    def of(cls, value: Any, defaults: Mapping[str, Any] | None = None, *, what: str | None = None) -> Any:
        """The group from ``None`` (``defaults``, else the group's own), a mapping of its field names over
        ``defaults`` (an unknown name is an error naming it and the fields), or an instance (kept as given)."""
        what = what or cls.__name__
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        if isinstance(value, cls):
            return value
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise TypeError(f"{what} must be a {cls.__name__} or a mapping of its options, got {value!r}")
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"{what}: {unknown} are not options of {cls.__name__} (its options: {names})")
        return cls(**{**dict(defaults or {}), **value})


FIT_OPTIONS = ("fraction", "per_class", "seed")


def check_fit_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A detector's ``fit`` option: ``{"fraction": f}`` (0 < f <= 1) or ``{"per_class": n}``, and ``seed``."""
    unknown = sorted(set(options) - set(FIT_OPTIONS))
    if unknown:
        raise ValueError(f"fit options of {name!r}: unknown {unknown}; choose from {list(FIT_OPTIONS)}")
    if "fraction" in options and "per_class" in options and options["fraction"] is not None \
            and options["per_class"] is not None:
        raise ValueError(f"fit options of {name!r}: give fraction or per_class, not both ({options})")
    fraction, per_class = options.get("fraction"), options.get("per_class")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0 < fraction <= 1):
        raise ValueError(f"fit options of {name!r}: fraction must be in (0, 1], got {fraction!r}")
    if per_class is not None and (isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1):
        raise ValueError(f"fit options of {name!r}: per_class must be a positive integer, got {per_class!r}")
    return {k: v for k, v in options.items() if v is not None}


@dataclass
class ModelOptions(OptionGroup):
    """How a command builds its models from their specs (``timm:<name>``, ``torchvision:<name>``, checkpoints of
    ``train.py``, ``ensemble:<members>``).

    Attributes:
        model_args: timm/torchvision model arguments, e.g. ``{"drop_rate": 0.2}`` for MC dropout.
        pretrained_file: an explicit weights file (timm).
        random_weights: timm/torchvision models without pretrained weights (tests).
    """

    model_args: dict[str, Any] | None = None
    pretrained_file: str | None = None
    random_weights: bool = False

    def __post_init__(self) -> None:
        self.model_args = dict(self.model_args or {})


@dataclass
class DataOptions(OptionGroup):
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
    data_args: dict[str, Any] | None = None
    batch_size: int | None = None
    num_workers: int | None = None

    def __post_init__(self) -> None:
        self.data_args = dict(self.data_args or {})
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or self.batch_size < 1):
            raise ValueError(f"batch_size must be positive, got {self.batch_size!r}")
        if self.num_workers is not None and (isinstance(self.num_workers, bool) or self.num_workers < 0):
            raise ValueError(f"num_workers must be zero or more, got {self.num_workers!r}")


@dataclass
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
        self.detectors: dict[str, type[Detector]] = {cls.name: cls for cls in resolved.values()}
        self.kappa = list(self.detectors)
        # every κ's resolved parameters (defaults + arguments: an unknown or invalid one named here), and every fit
        # cap checked, before anything runs
        self.parameters = {name: cls.arguments(**self.kappa_args.get(name, {})) for name, cls in self.detectors.items()}
        unfitted = sorted(name for name in self.fit if not self.detectors[name].fit_data)
        if unfitted:
            raise ValueError(f"fit options for {unfitted}, which are not among the fitted kappas")
        self.fit = {name: check_fit_options(name, options) for name, options in self.fit.items()}

    @staticmethod
    def resolve(kappa: Sequence[str | type[Detector]]) -> dict[Any, type[Detector]]:
        """The one place a κ is resolved (a registry name, an entry point, a class path, ``pood:<Class>``, or a
        class from Python): every command, section and callback takes its detectors from here, each then named
        by its detector's name. Given κ -> its detector class."""
        return {name: resolve_detector(name) for name in kappa}

    @property
    def classes(self) -> list[type[Detector]]:
        """The detector classes of :attr:`kappa`, in order."""
        return list(self.detectors.values())

    def only(self, kappa: Sequence[str | type[Detector]]) -> dict[str, Any]:
        """This group's fields for a run of some of its κ (a report section's): their arguments and fit caps."""
        kept = list(dict.fromkeys(cls.name for cls in self.resolve(kappa).values()))  # a class path: its name
        return {"kappa": kept, "kappa_args": {k: v for k, v in self.kappa_args.items() if k in kept},
                "fit_data": self.fit_data, "fit": {k: v for k, v in self.fit.items() if k in kept},
                "allow_fit_overlap": self.allow_fit_overlap}


@dataclass
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


def _group_type(hint: Any) -> type | None:
    for member in (hint, *typing.get_args(hint)):
        if inspect.isclass(member) and issubclass(member, OptionGroup):
            return member
    return None


def option_groups(cls: type) -> dict[str, type]:
    """The shared option groups a command composes: its ``__init__`` parameter name -> the group type."""
    hints = typing.get_type_hints(cls.__init__)
    return {name: group for name, hint in hints.items() if (group := _group_type(hint)) is not None}


def group_fields(cls: type, parameter: str, group: type) -> list[str]:
    """The fields of ``group`` that the command reads (:attr:`Evaluation.option_fields`, default: all)."""
    names = [f.name for f in dataclasses.fields(group)]
    return list(getattr(cls, "option_fields", {}).get(parameter, names))


def own_options(cls: type) -> list[str]:
    """The command's own options: its ``__init__``'s named parameters other than the groups and the trainer."""
    groups = option_groups(cls)
    return [name for name, p in inspect.signature(cls.__init__).parameters.items()
            if name not in ("self", "trainer", *groups) and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def flat_options(cls: type) -> dict[str, tuple[str | None, Any]]:
    """Every flat option name of a command -> (the group parameter it belongs to, or ``None`` for the command's
    own, and its type)."""
    hints = typing.get_type_hints(cls.__init__)
    options: dict[str, tuple[str | None, Any]] = {name: (None, hints.get(name, Any)) for name in own_options(cls)}
    for parameter, group in option_groups(cls).items():
        group_hints = typing.get_type_hints(group)
        for name in group_fields(cls, parameter, group):
            options[name] = (parameter, group_hints[name])
    return options


def compose(cls: type, options: Mapping[str, Any], *, what: str | None = None) -> dict[str, Any]:
    """The keyword arguments of command ``cls`` from flat option names (``kappa``, ``data_args``, ``output_dir``,
    and its own): each group's fields gathered into that group (over the command's defaults). An option the
    command does not take is an error naming it and the command's options; ``trainer`` and a group given whole
    pass through."""
    what = what or f"evaluate.py {getattr(cls, 'command', cls.__name__)}"
    known = flat_options(cls)
    groups = option_groups(cls)
    accepts_more = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())
    arguments: dict[str, Any] = {}
    gathered: dict[str, dict[str, Any]] = {}
    for name, value in options.items():
        if name == "trainer" or name in groups:
            arguments[name] = value
        elif name in known:
            parameter = known[name][0]
            if parameter is None:
                arguments[name] = value
            else:
                gathered.setdefault(parameter, {})[name] = value
        elif accepts_more:
            arguments[name] = value  # the report card's sections
        else:
            raise ValueError(f"{what} has no option {name!r} (its options: {sorted(known)})")
    for parameter, values in gathered.items():
        if parameter in arguments:
            raise ValueError(f"{what}: give {parameter} whole or its fields {sorted(values)}, not both")
        arguments[parameter] = values
    return arguments


def build_group(cls: type, parameter: str, value: Any) -> Any:
    """The group ``parameter`` of command ``cls`` from ``value`` (``None``, a mapping, an instance), over the
    command's defaults (an instance's fields left at the group's defaults take the command's); a field the command does not read, set to other than the group's default, is refused."""
    group = option_groups(cls)[parameter]
    defaults = {k: v for k, v in getattr(cls, "option_defaults", {}).items()
                if k in {f.name for f in dataclasses.fields(group)}}
    command = getattr(cls, "command", cls.__name__)
    plain = group()
    if isinstance(value, group):  # a group given whole: the fields it leaves at the group's defaults take the command's
        value = dataclasses.replace(value, **{k: v for k, v in defaults.items() if getattr(value, k) == getattr(plain, k)})
    built = group.of(value, defaults, what=f"evaluate.py {command}: {parameter}")
    used = set(group_fields(cls, parameter, group))
    unused = [f.name for f in dataclasses.fields(group)
              if f.name not in used and getattr(built, f.name) != getattr(plain, f.name)]
    if unused:
        raise ValueError(f"evaluate.py {command} takes no {', '.join('--' + u.replace('_', '-') for u in unused)} "
                         f"(its {parameter}: {sorted(used)})")
    return built


def add_command_arguments(parser: Any, cls: type, *, skip: set[str] = frozenset()) -> None:
    """A command's options on a jsonargparse parser, all at the top level: its own (by its signature) and each
    group's fields it reads (by the group's types), with the command's defaults; ``skip`` leaves options out."""
    groups = option_groups(cls)
    parser.add_class_arguments(cls, None, skip={"trainer", *groups, *skip}, sub_configs=True, fail_untyped=False)
    defaults = getattr(cls, "option_defaults", {})
    for parameter, group in groups.items():
        names = [f.name for f in dataclasses.fields(group)]
        used = set(group_fields(cls, parameter, group)) - set(skip)
        parser.add_class_arguments(group, None, skip={n for n in names if n not in used})
        given = {k: v for k, v in defaults.items() if k in used}
        if given:
            parser.set_defaults(given)


def section_type(cls: type, *, foreign: Sequence[str] = ()) -> Any:
    """The type of a report card's section of command ``cls``, for jsonargparse: a mapping of the command's own
    option names, each by its type (a word where a number is expected is named by the parser), and ``config``, a
    YAML file of the command's options whose relative path is read against the file that names it (jsonargparse's
    ``Path_fr``: the report's config file, else the current folder). ``foreign``: keys a section may not set but
    that the card refuses with its own message (the report's models and trainer options)."""
    from jsonargparse.typing import Path_fr

    hints: dict[str, Any] = {name: hint for name, (_, hint) in flat_options(cls).items()}
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

    known = flat_options(cls)
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


__all__ = ["DataOptions", "DetectorOptions", "ModelOptions", "OptionGroup", "OutputOptions", "add_command_arguments",
           "build_group", "check_options", "compose", "flat_options", "option_groups", "read_options", "section_type"]
