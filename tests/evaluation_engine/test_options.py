"""The shared option groups (evaluation_engine/options.py): each option declared once, in one group, with one type in
every command that inherits it; the commands' defaults; an option a command does not take refused; the command
line, a report's sections and Python building the same command."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import evaluate
from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import (
    DataArgOptions,
    DataOptions,
    DetectorOptions,
    ModelOptions,
    OptionGroup,
    OutputOptions,
    WeightOptions,
    check_options,
    command_options,
)
from evaluation_methods import (
    EvGEvaluation,
    GeneratedEvaluation,
    GenerateSets,
    OSCREvaluation,
    SeverityEvaluation,
)
from metrics import resolve_detector
from report_card.card import ReportCard

GROUPS = (WeightOptions, ModelOptions, DataArgOptions, DataOptions, DetectorOptions, OutputOptions)


def declared_in(cls: type, option: str) -> type:
    """The option group (or the command) whose own annotations declare ``option`` first in ``cls``'s bases: a
    command that only changes a group option's default declares it again, so the group is looked for among the
    command's bases."""
    groups = [base for base in cls.__mro__[1:] if base not in (Evaluation, OptionGroup)
              and option in base.__dict__.get("__annotations__", {})]
    return groups[-1] if groups else cls


def test_a_shared_option_is_declared_in_one_group_with_one_type_in_every_command() -> None:
    types: dict[str, set[str]] = {}
    for name, cls in evaluate.COMMANDS.items():
        hints = typing.get_type_hints(cls)
        for option in command_options(cls):
            if (name, option) in (("generate", "output_dir"), ("generate", "batch_size")):
                continue  # one folder per generator (a list), the generation's batch: the command's own
            owner = declared_in(cls, option)
            if owner in GROUPS:
                types.setdefault(option, set()).add(str(hints[option]))
                assert str(hints[option]) == str(typing.get_type_hints(owner)[option]), (name, option)
            else:  # the command's own: no group has an option of that name
                assert not any(option in typing.get_type_hints(group) for group in GROUPS), (name, option)
    assert all(len(t) == 1 for t in types.values()), types
    # the options every evaluation repeats are declared once, each in its group
    for option in ("kappa", "kappa_args", "fit_data", "fit", "data", "data_args", "batch_size", "num_workers",
                   "cache_dir", "plots", "random_weights", "model_args"):
        assert option in types, option
    # the groups each command inherits, and so the options it takes
    assert [g.__name__ for g in GROUPS if issubclass(SeverityEvaluation, g)] == [
        "WeightOptions", "ModelOptions", "DataArgOptions", "DataOptions", "DetectorOptions", "OutputOptions"]
    assert [k for k in command_options(OSCREvaluation) if declared_in(OSCREvaluation, k) in GROUPS] == [
        "output_dir", "cache_dir", "plots", "data_args"]
    assert [k for k in command_options(GenerateSets) if declared_in(GenerateSets, k) in GROUPS] == ["data_args"]


@pytest.mark.parametrize(("cls", "expected"), [
    (SeverityEvaluation, {"batch_size": None, "num_workers": None, "cache_dir": "runs/cache", "output_dir": None}),
    (GeneratedEvaluation, {"batch_size": 256, "num_workers": 0, "cache_dir": None, "output_dir": "runs/generated"}),
    (EvGEvaluation, {"batch_size": 256, "num_workers": 0, "cache_dir": None, "output_dir": "runs/evg"}),
])
def test_each_command_keeps_its_defaults_from_the_command_line_and_python(cls, expected) -> None:
    model = ["m.ckpt"] if cls is not SeverityEvaluation else "m.ckpt"
    line = evaluate.parse([cls.command, "--model", "m.ckpt"])[1]
    python = cls(model=model)
    changed = cls(model=model, data_args={"a": 1}, plots=False)
    for built in (line, python, changed):
        assert {k: getattr(built, k) for k in expected} == expected
    assert (changed.data_args, changed.plots, line.plots) == ({"a": 1}, False, True)
    assert line.kappa == python.kappa == ["softmax"] and line.detector_classes == [resolve_detector("softmax")]


def test_the_command_line_and_python_build_the_same_command() -> None:
    argv = ["severity", "--model", "m.ckpt", "--kappa", "softmax", "knn", "--kappa-arg", "knn.k=2",
            "--data", "fashion", "--data-arg", "estimation=20", "--batch-size", "7", "--output-dir", "out",
            "--no-plots", "--random-weights", "--fit-arg", "knn.per_class=3", "--intervals.level", "0.9"]
    line = evaluate.parse(argv)[1]
    python = SeverityEvaluation(model="m.ckpt", kappa=["softmax", "knn"], kappa_args={"knn": {"k": 2}},
                                data="fashion", data_args={"estimation": 20}, batch_size=7, output_dir="out",
                                plots=False, random_weights=True, fit={"knn": {"per_class": 3}},
                                intervals={"level": 0.9})
    options = [f.name for f in dataclasses.fields(SeverityEvaluation) if f.init and f.name != "trainer"]
    assert {k: getattr(line, k) for k in options} == {k: getattr(python, k) for k in options}
    assert {k: getattr(line, k) for k in options} == {
        "output_dir": "out", "cache_dir": "runs/cache", "plots": False, "kappa": ["softmax", "knn"],
        "kappa_args": {"knn": {"k": 2}}, "fit_data": None, "fit": {"knn": {"per_class": 3}},
        "allow_fit_overlap": False, "data_args": {"estimation": 20}, "data": "fashion", "batch_size": 7,
        "num_workers": None, "random_weights": True, "model_args": {}, "pretrained_file": None, "model": "m.ckpt",
        "num_levels": None, "intervals": Intervals(level=0.9)}
    # what the detector group resolved, once
    assert line.kappa_parameters["knn"]["k"] == 2 and line.detector_classes == [
        resolve_detector("softmax"), resolve_detector("knn")]


def test_bad_options_are_named_once_for_every_command() -> None:
    for command in ("severity", "generated", "evg"):
        with pytest.raises(SystemExit, match=r"kappa_args for \['odni'\], which are not among the kappas \['odin'\]"):
            evaluate.main([command, "--model", "m.ckpt", "--kappa", "odin", "--kappa-arg", "odni.temperature=10"])
        with pytest.raises(SystemExit, match=r"fit for \['knn'\], which are not among the kappas \['softmax'\]"):
            evaluate.main([command, "--model", "m.ckpt", "--fit-arg", "knn.fraction=0.1"])
        with pytest.raises(SystemExit, match="batch_size must be positive, got 0"):
            evaluate.main([command, "--model", "m.ckpt", "--batch-size", "0"])
        with pytest.raises(SystemExit, match="unknown"):
            evaluate.main([command, "--model", "m.ckpt", "--kappa", "sofmax"])
    with pytest.raises(ValueError, match="num_workers must be zero or more, got -1"):
        DataOptions(num_workers=-1)
    with pytest.raises(ValueError, match="give at least one confidence function"):
        DetectorOptions(kappa=[])
    assert DetectorOptions(kappa="energy").kappa == ["energy"]
    # an option the command does not take: refused from Python, naming it, and on the command line
    with pytest.raises(TypeError, match="unexpected keyword argument 'batch_size'"):
        OSCREvaluation(model="m.ckpt", batch_size=8)
    with pytest.raises(SystemExit):
        evaluate.parse(["oscr", "--model", "m.ckpt", "--batch-size", "8"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'chain'"):
        EvGEvaluation(model=["m.ckpt"], chain=3)


def test_a_report_section_is_checked_by_its_command_s_own_parser() -> None:
    assert check_options(EvGEvaluation, {"chains": 4, "kappa": ["energy"], "batch_size": 8},
                         what="report section evg") == {"chains": 4, "kappa": ["energy"], "batch_size": 8}
    with pytest.raises(ValueError, match=r"report section evg: .*batch_size.*eight"):
        check_options(EvGEvaluation, {"batch_size": "eight"}, what="report section evg")
    with pytest.raises(ValueError, match=r"report section oscr: \['kappa'\] are not options of evaluate.py oscr"):
        check_options(OSCREvaluation, {"kappa": ["energy"]}, what="report section oscr")
    # the card's detector options reach a section for the section's own κ only
    card = ReportCard(model=["m.ckpt"], kappa=["softmax", "knn"], kappa_args={"knn": {"k": 2}},
                      sections={"severity": {"kappa": ["softmax"]}}, fit={"knn": {"per_class": 3}})
    section = card._evaluation("severity", "m.ckpt", ["softmax"], card.output_dir / "s")
    assert (section.kappa, section.kappa_args, section.fit, section.fit_data) == (["softmax"], {}, {}, None)
    section = card._evaluation("severity", "m.ckpt", ["knn"], card.output_dir / "s")
    assert (section.kappa, section.kappa_args, section.fit) == (["knn"], {"knn": {"k": 2}}, {"knn": {"per_class": 3}})
    # --allow-fit-overlap of the card reaches every section that fits detectors, a section's own wins
    card = ReportCard(model=["m.ckpt"], kappa=["knn"], allow_fit_overlap=True,
                      sections={"severity": {}, "generated": {"allow_fit_overlap": False}})
    assert card._evaluation("severity", "m.ckpt", ["knn"], card.output_dir / "s").allow_fit_overlap is True
    assert card._evaluation("generated", "m.ckpt", ["knn"], card.output_dir / "g").allow_fit_overlap is False


def test_a_kappa_by_class_path_keeps_its_arguments_in_a_section_and_two_keys_of_one_detector_are_refused() -> None:
    path = "metrics.detectors.knn.KNN"
    options = DetectorOptions(kappa=[path, "softmax"], kappa_args={path: {"k": 3}}, fit={path: {"fraction": 0.5}})
    assert options.kappa == ["knn", "softmax"] and options.kappa_args == {"knn": {"k": 3}}
    # a report section naming the κ by its class path gets the card's arguments and cap of that detector
    card = ReportCard(model=["m.ckpt"], kappa=[path, "softmax"], kappa_args={path: {"k": 3}},
                      fit={path: {"fraction": 0.5}}, sections={"severity": {"kappa": [path]}})
    section = card._evaluation("severity", "m.ckpt", [path], card.output_dir / "s")
    assert (section.kappa, section.kappa_args, section.fit) == (["knn"], {"knn": {"k": 3}}, {"knn": {"fraction": 0.5}})
    with pytest.raises(ValueError, match=r"kappa_args for 'metrics.detectors.knn.KNN' and 'knn', which name one "
                                         r"detector \('knn'\): give its arguments once"):
        DetectorOptions(kappa=[path], kappa_args={path: {"k": 3}, "knn": {"k": 5}})


def test_a_detector_whose_hyperparameter_has_no_default_keeps_its_arguments_in_a_section() -> None:
    """Naming a section's κ resolves names only: a detector whose hyperparameter has no default reaches the
    section with the card's arguments (it is refused only where no arguments are given)."""
    needy = type("Needy", (resolve_detector("ash_s").__mro__[1],), {"name": "needy_options", "variant": "p"})
    options = DetectorOptions(kappa=[needy, "softmax"], kappa_args={"needy_options": {"percentile": 0.5}})
    assert options.kappa_parameters["needy_options"] == {"percentile": 0.5} and options.detector_classes[0] is needy
    section = SeverityEvaluation(model="m.ckpt", kappa=[needy], kappa_args={"needy_options": {"percentile": 0.5}})
    assert (section.kappa, section.kappa_parameters) == (["needy_options"], {"needy_options": {"percentile": 0.5}})
    with pytest.raises(ValueError, match=r"'needy_options' needs the hyperparameters \['percentile'\]"):
        DetectorOptions(kappa=[needy])


def test_a_command_is_compared_as_the_object_it_is_and_of_is_kept_for_one_release() -> None:
    one, other = SeverityEvaluation(model="m.ckpt"), SeverityEvaluation(model="m.ckpt")
    assert one != other and one == one and len({one, other}) == 2  # the groups compare by value, a command does not
    with pytest.warns(FutureWarning, match=r"SeverityEvaluation.of\(...\) is deprecated .*call SeverityEvaluation"):
        old = SeverityEvaluation.of(model="m.ckpt", kappa=["energy"])
    assert old.kappa == ["energy"]
    with pytest.warns(FutureWarning, match=r"ReportCard.of\(...\) is deprecated"):
        card = ReportCard.of(model=["m.ckpt"], severity={"num_levels": 3})
    assert card.sections == {"severity": {"num_levels": 3}}


def test_a_plug_in_command_with_its_own_init_is_typed_by_it() -> None:
    """A command written the older way, a plain class with its own ``__init__`` over the dataclass base, is read
    by its ``__init__``'s types (its list and boolean options are what the command line knows them as)."""

    class Plain(Evaluation):
        command = "plain"

        def __init__(self, model: list[str], verbose: bool = False, *, trainer=None) -> None:
            super().__init__(trainer=trainer)
            self.model, self.verbose = model, verbose

    assert command_options(Plain) == {"model": list[str], "verbose": bool}
    assert Plain(["a"], True).verbose is True
    assert command_options(SeverityEvaluation)["kappa"] == list[str]


def test_a_method_whose_command_takes_a_name_it_cannot_have_is_refused() -> None:
    from evaluation_methods.registry import Method, methods, register

    for name in ("report", "", "adversarial"):
        method = type("M", (Method,), {"key": "taken_name", "title": "t", "name": "n", "group": "g",
                                       "evaluation": type("E", (OSCREvaluation,), {"command": name})})
        with pytest.raises(ValueError, match=rf"method taken_name: its command {name!r} .* must be a name of its own"):
            register(method)
    assert "taken_name" not in methods()


def test_report_from_python_names_a_section_no_method_has() -> None:
    from report_card.card import report

    with pytest.raises(ValueError, match=r"report sections \['sevrity'\] are no registered evaluation method"):
        report(["m.ckpt"], sevrity={})
    with pytest.raises(ValueError, match="the report has no section"):
        report(["m.ckpt"], sections=None)
