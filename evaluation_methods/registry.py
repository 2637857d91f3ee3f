"""The registry of evaluation methods and the typed results they return (DESIGN.md §2).

A method is a :class:`Method`: its command (the typed :class:`evaluation_engine.Evaluation` that
``evaluate.py <key>`` runs), the leaderboard columns it fills (:class:`Headline`), its resampling unit, and
how its results become a section of the report card (:meth:`Method.section`). Its command returns a
:class:`MethodResult`: the method's own tables (the mapping the command always returned, so
``result["detectors"]`` reads as before), its headline :class:`Estimate` s with their intervals and bootstrap
replicates, the units they resampled, and its figures. The report card and ``evaluate.py`` are loops over
:func:`methods`; they never read a method's files or column names.

A new method is its metric, its command with a :class:`Method` (one module) and its config: registered with
:func:`register` in that module, or from another package by an entry point of the group
``openset_bench.methods`` (``toy = "my_package.toy:ToyMethod"``), and it appears in ``evaluate.py --help``,
as a ``<key>:`` section of ``evaluate.py report``, in the card's leaderboard and on its page.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import DETECTION_METRICS, Intervals
from evaluation_engine.results import Estimate, Figure, MethodResult, number
from metrics.detectors import Detector
from openset_common.typed import plugins

ENTRY_POINTS = "openset_bench.methods"
# the methods of this project, each registered by its own module when imported
BUILT_IN = ("evaluation_methods.open_set", "evaluation_methods.severity", "evaluation_methods.generated",
            "evaluation_methods.evg", "evaluation_methods.ood")


@dataclasses.dataclass(frozen=True)
class Headline:
    """A leaderboard column: ``key``, its title, the method (its :attr:`Method.key`), whether higher is better,
    what it is, the decimals the terminal shows (0 for a count such as MinRank), and whether the value is a
    proportion within [0, 1] (AUROC, CCR; a count is not: its seed-mean interval is clipped at 0 only)."""

    key: str
    title: str
    method: str
    higher_is_better: bool
    description: str
    digits: int = 3
    proportion: bool = True


@dataclasses.dataclass
class Table:
    """A table of a card section: its title, its columns, its rows (cells: plain values or :func:`cell`)."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]]


@dataclasses.dataclass
class Section:
    """A method's section of the report card (the schema of :mod:`report_card.page`)."""

    method: str
    title: str
    text: str
    tables: list[Table] = dataclasses.field(default_factory=list)
    figures: list[Figure] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "title": self.title, "text": self.text,
                "tables": [dataclasses.asdict(t) for t in self.tables],
                "images": [{"title": f.title, "path": str(f.path), "caption": f.caption} for f in self.figures]}


@dataclasses.dataclass
class CardContext:
    """What a section may use of the card that shows it: the intervals, whether figures are drawn, the card's
    folder (for a figure across the method's results)."""

    intervals: Intervals
    plots: bool
    output_dir: Path


@dataclasses.dataclass(frozen=True)
class Run:
    """One evaluation of a method for the card: its name (a model's, or ``None`` for one over every model),
    the model argument of its command, and the κ it scores (``None``: the method's own)."""

    name: str | None
    model: str | list[str]
    kappa: list[str] | None


class Method:
    """An evaluation method as a plug-in. Subclasses set the class attributes and, where the defaults do not
    fit, :meth:`runs`, :meth:`check`, :meth:`section` and :meth:`notes`.

    Attributes:
        key: the method's one id: the card's section key, its folder there and the leaderboard columns' method
            (``open_set``).
        title: the section's title; ``name`` the short one of the leaderboard's legend; ``group`` the
            leaderboard's column group.
        unit: what the intervals resample.
        headlines: the leaderboard columns it fills.
        evaluation: its command's typed class (its name, ``evaluation.command``, is the key's unless the command
            kept an older name: ``evaluate.py oscr``); ``commands`` more commands of the method (``severity-plot``).
        per_model: one evaluation per model of the card (in the model's folder), else one over all models.
    """

    key: ClassVar[str]
    title: ClassVar[str]
    name: ClassVar[str]
    group: ClassVar[str]
    unit: ClassVar[str] = ""
    headlines: ClassVar[tuple[Headline, ...]] = ()
    evaluation: ClassVar[type[Evaluation]]
    commands: ClassVar[tuple[type[Evaluation], ...]] = ()
    per_model: ClassVar[bool] = False

    def runs(self, models: Mapping[str, Any], kappas: Sequence[type[Detector]]) -> list[Run]:
        """The evaluations the card runs: ``models`` maps each spec to its :class:`lightning_modules.scoring.ScoringModel`,
        ``kappas`` are the section's detector classes (resolved once, by its detector options). By default one
        evaluation over every model."""
        return [Run(None, list(models), [k.name for k in kappas])]

    def check(self, specs: Sequence[str]) -> None:
        """Refuse, before anything runs, a card whose models this method cannot evaluate."""

    def section(self, results: Mapping[str | None, MethodResult], context: CardContext) -> Section:
        """The card's section of this method's results (per :attr:`Run.name`). By default every table of the
        results and their figures."""
        tables = [Table(f"{name + ': ' if name else ''}{title}", list(rows[0]) if rows else [], list(rows))
                  for name, result in results.items() for title, rows in result.items()
                  if isinstance(rows, list) and all(isinstance(r, Mapping) for r in rows)]
        return Section(self.key, self.title, f"Resampled: {self.unit}.", tables,
                       [f for result in results.values() for f in result.figures])

    def notes(self, results: Mapping[str | None, MethodResult], models: Sequence[Any]) -> list[str]:
        """Notes for the end of the card."""
        return []


# what a method's key cannot be: evaluate.py report's command and its own options (a section is --<key>)
RESERVED = frozenset({"report", "model", "kappa", "kappa_args", "output_dir", "cache_dir", "intervals", "title",
                      "random_weights", "plots", "fit_data", "fit", "trainer", "config", "help"})
# the other names of commands on evaluate.py's line (the alias -> the command)
COMMAND_ALIASES = {"adversarial": "evg"}
_REGISTRY: dict[str, Method] = {}
_LOADED = False


def register(method: type[Method] | Method) -> Any:
    """Register a method (a :class:`Method` subclass or instance; usable as a class decorator). A key already
    registered by another method is refused, and so is a command name another method uses."""
    instance = method() if isinstance(method, type) else method
    for attribute in ("key", "title", "name", "group", "evaluation"):
        if not hasattr(instance, attribute):
            raise TypeError(f"method {type(instance).__name__} does not set {attribute}")
    if getattr(instance, "slug", instance.key) != instance.key:  # a plug-in written for two ids
        raise ValueError(f"method {instance.key}: one id per method, its key; its slug {instance.slug!r} is no "
                         "longer read (drop it, or make it the key)")
    for cls in (instance.evaluation, *instance.commands):
        command = getattr(cls, "command", "")
        if not command or command == "report" or command in COMMAND_ALIASES or command.startswith("-"):
            raise ValueError(f"method {instance.key}: its command {command!r} ({cls.__name__}) must be a name of its own "
                             f"(not empty, not evaluate.py report, not an alias {sorted(COMMAND_ALIASES)})")
    if not instance.key.isidentifier() or instance.key in RESERVED:
        raise ValueError(f"method key {instance.key!r}: a report section's key must be a Python name and not one "
                         f"of evaluate.py report's own options or commands {sorted(RESERVED)}")
    wrong = [h.key for h in instance.headlines if h.method != instance.key]
    if wrong:
        raise ValueError(f"method {instance.key}: leaderboard columns {wrong} name another method than its key "
                         f"{instance.key!r} (Headline.method)")
    for other in _REGISTRY.values():
        if type(other) is type(instance):
            continue
        taken = {other.key, *(c.command for c in (other.evaluation, *other.commands))}
        mine = {instance.key, *(c.command for c in (instance.evaluation, *instance.commands))}
        if taken & mine:
            raise ValueError(f"method {type(instance).__name__}: {sorted(taken & mine)} already registered by "
                             f"{type(other).__name__}")
    columns = {h.key for m in _REGISTRY.values() if m.key != instance.key for h in m.headlines}
    clash = sorted(columns & {h.key for h in instance.headlines})
    if clash:
        raise ValueError(f"method {instance.key}: leaderboard columns {clash} are another method's")
    _REGISTRY[instance.key] = instance
    return method


def unregister(key: str) -> None:
    """Remove a registered method (tests)."""
    _REGISTRY.pop(key, None)


def methods() -> dict[str, Method]:
    """Every registered method by key, the built-in ones first, then those of installed packages (entry points
    of ``openset_bench.methods``), then any registered since."""
    global _LOADED
    if not _LOADED:
        _LOADED = True  # set first: a plug-in that asks for the methods while it loads gets those loaded so far
        try:
            _load()
        except BaseException:
            _LOADED = False  # raised again on the next call, never a half-filled registry taken as whole
            raise
    # the built-in methods in the order of BUILT_IN (whatever order their modules were imported in), then the rest
    rank = {module: i for i, module in enumerate(BUILT_IN)}
    ordered = sorted(_REGISTRY.values(), key=lambda m: rank.get(type(m).__module__, len(rank)))
    return {method.key: method for method in ordered}


def _load() -> None:
    for module in BUILT_IN:
        importlib.import_module(module)
    for _, origin, loaded in plugins(ENTRY_POINTS, "evaluation method"):
        if not (isinstance(loaded, Method) or (isinstance(loaded, type) and issubclass(loaded, Method))):
            what = (f"the class {loaded.__module__}.{loaded.__qualname__}" if isinstance(loaded, type) else
                    f"a {type(loaded).__name__} ({getattr(loaded, '__module__', '?')}."
                    f"{getattr(loaded, '__qualname__', repr(loaded))})")
            raise TypeError(f"{origin} loads {what}, not a method: it must name a subclass (or an "
                            f"instance) of {Method.__module__}.{Method.__qualname__}")
        if not any(type(m) is loaded or m is loaded for m in _REGISTRY.values()):
            try:
                register(loaded)
            except (TypeError, ValueError) as error:  # its class attributes, a key another method has, ...
                raise type(error)(f"{origin}: {error}") from error


def commands() -> dict[str, type[Evaluation]]:
    """Every command of every registered method (its own and its extra commands), by name."""
    by_name: dict[str, type[Evaluation]] = {}
    for method in methods().values():
        for cls in (method.evaluation, *method.commands):
            by_name[cls.command] = cls
    return by_name


def headlines() -> tuple[Headline, ...]:
    """Every leaderboard column, in the order of the registered methods."""
    return tuple(h for method in methods().values() for h in method.headlines)


# -- cells of the card's tables ------------------------------------------------------------------------

DETECTION_HEADERS = ("FPR@95TPR", "AUPR-In", "AUPR-Out")


def cell(value: Any, low: Any = None, high: Any = None) -> dict[str, Any] | Any:
    """A table cell with its interval (the page's Cell), or the plain value where it has none."""
    if value is None or isinstance(value, str):
        return value
    return {"value": number(value), "low": number(low), "high": number(high), "best": False,
            "significant": False, "share_first": None, "unit": ""}


def column_cell(row: Mapping[str, Any], column: str) -> dict[str, Any] | Any:
    """The cell of a table row's ``column`` with its ``<column> low``/``<column> high`` interval."""
    return cell(row.get(column), row.get(f"{column} low"), row.get(f"{column} high"))


def detection_cells(row: Mapping[str, Any]) -> dict[str, Any]:
    """The detector metrics beside the AUROC of a method's table row, as the card's cells (empty where the row
    has none: an ID row, a table of before)."""
    return {header: column_cell(row, column) for header, column in zip(DETECTION_HEADERS, DETECTION_METRICS,
                                                                         strict=True)}


__all__ = ["CardContext", "DETECTION_HEADERS", "Estimate", "Figure", "Headline", "Method", "MethodResult", "Run",
           "Section", "Table", "cell", "column_cell", "commands", "detection_cells", "headlines", "methods",
           "number", "register", "unregister"]
