"""The shared option groups (evaluation_engine/options.py): one type per option in every command, the commands'
defaults, the fields a command does not read refused, the groups from flat names (the command line, the report's
sections, ``.of``) equal to the groups given whole."""

from __future__ import annotations

import typing

import pytest

import evaluate
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import (
    DataOptions,
    DetectorOptions,
    ModelOptions,
    OutputOptions,
    build_group,
    check_options,
    compose,
    flat_options,
    option_groups,
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

GROUPS = (ModelOptions, DataOptions, DetectorOptions, OutputOptions)


def test_a_shared_option_has_one_group_and_one_type_in_every_command() -> None:
    owners: dict[str, set[tuple[str, str]]] = {}
    for name, cls in evaluate.COMMANDS.items():
        groups = option_groups(cls)
        for option, (parameter, hint) in flat_options(cls).items():
            if (name, option) == ("generate", "output_dir"):  # one folder per generator: a list, the command's own
                continue
            owner = groups[parameter].__name__ if parameter else "own"
            owners.setdefault(option, set()).add((owner, str(hint)))
    for group in GROUPS:
        for field, hint in typing.get_type_hints(group).items():
            assert owners.get(field, {(group.__name__, str(hint))}) == {(group.__name__, str(hint))}, field
    # the options every evaluation repeats are no command's own any more
    for option in ("kappa", "kappa_args", "fit_data", "fit", "data", "data_args", "batch_size", "num_workers",
                   "cache_dir", "plots", "random_weights", "model_args"):
        assert all(owner != "own" for owner, _ in owners[option]), option
    # the commands that compose them: which groups, and which fields of a group they read
    assert set(option_groups(SeverityEvaluation)) == {"model_options", "data_options", "detector_options",
                                                      "output_options"}
    assert [k for k, (p, _) in flat_options(OSCREvaluation).items() if p] == ["data_args", "output_dir", "cache_dir",
                                                                                   "plots"]
    assert [k for k, (p, _) in flat_options(GenerateSets).items() if p] == ["data_args", "batch_size"]


@pytest.mark.parametrize(("cls", "expected"), [
    (SeverityEvaluation, {"batch_size": None, "num_workers": None, "cache_dir": "runs/cache", "output_dir": None}),
    (GeneratedEvaluation, {"batch_size": 256, "num_workers": 0, "cache_dir": None, "output_dir": "runs/generated"}),
    (EvGEvaluation, {"batch_size": 256, "num_workers": 0, "cache_dir": None, "output_dir": "runs/evg"}),
])
def test_each_command_keeps_its_defaults_from_the_command_line_python_and_a_group_given_whole(cls, expected) -> None:
    line = evaluate.parse([cls.command, "--model", "m.ckpt"])[1]
    flat = cls.of(model=["m.ckpt"] if cls is not SeverityEvaluation else "m.ckpt")
    whole = cls(["m.ckpt"] if cls is not SeverityEvaluation else "m.ckpt", data_options=DataOptions(data_args={"a": 1}),
                output_options=OutputOptions(plots=False))
    for built in (line, flat, whole):
        assert {k: getattr(built, k) for k in expected} == expected
    assert (whole.data_args, whole.plots, line.plots) == ({"a": 1}, False, True)
    assert line.detector_options == flat.detector_options == DetectorOptions(kappa=["softmax"])


def test_the_command_line_and_of_build_the_same_groups() -> None:
    argv = ["severity", "--model", "m.ckpt", "--kappa", "softmax", "knn", "--kappa-arg", "knn.k=2",
            "--data", "fashion", "--data-arg", "estimation=20", "--batch-size", "7", "--output-dir", "out",
            "--no-plots", "--random-weights", "--fit-arg", "knn.per_class=3", "--intervals.level", "0.9"]
    line = evaluate.parse(argv)[1]
    flat = SeverityEvaluation.of(model="m.ckpt", kappa=["softmax", "knn"], kappa_args={"knn": {"k": 2}},
                                 data="fashion", data_args={"estimation": 20}, batch_size=7, output_dir="out",
                                 plots=False, random_weights=True, fit={"knn": {"per_class": 3}},
                                 intervals={"level": 0.9})
    for parameter in option_groups(SeverityEvaluation):
        assert getattr(line, parameter) == getattr(flat, parameter), parameter
    assert line.detector_options == DetectorOptions(["softmax", "knn"], {"knn": {"k": 2}}, None, {"knn": {"per_class": 3}})
    assert line.detector_options.parameters["knn"]["k"] == 2 and line.detector_options.classes == [
        resolve_detector("softmax"), resolve_detector("knn")]
    assert line.data_options == DataOptions("fashion", {"estimation": 20}, 7, None)
    assert line.output_options == OutputOptions("out", "runs/cache", False)
    assert line.model_options == ModelOptions({}, None, True)
    assert line.intervals == flat.intervals == Intervals(level=0.9)
    # the flat attributes the commands read are the groups' fields
    assert (line.kappa, line.batch_size, line.cache_dir, line.random_weights) == (["softmax", "knn"], 7,
                                                                                   "runs/cache", True)


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
    # a field the command does not read: refused from Python (on the command line jsonargparse has no such option)
    with pytest.raises(ValueError, match=r"evaluate.py oscr takes no --batch-size \(its data_options: \['data_args'\]\)"):
        OSCREvaluation("m.ckpt", data_options=DataOptions(batch_size=8))
    with pytest.raises(SystemExit):
        evaluate.parse(["oscr", "--model", "m.ckpt", "--batch-size", "8"])
    with pytest.raises(ValueError, match=r"evaluate.py evg has no option 'chain' \(its options: .*'chains'"):
        compose(EvGEvaluation, {"model": ["m.ckpt"], "chain": 3})
    with pytest.raises(ValueError, match=r"give data_options whole or its fields \['batch_size'\], not both"):
        compose(EvGEvaluation, {"model": ["m.ckpt"], "data_options": DataOptions(), "batch_size": 3})
    with pytest.raises(ValueError, match=r"evaluate.py severity: data_options: \['bach_size'\] are not options of "
                                         r"DataOptions"):
        build_group(SeverityEvaluation, "data_options", {"bach_size": 3})


def test_a_report_section_is_checked_by_its_command_s_own_parser() -> None:
    assert check_options(EvGEvaluation, {"chains": 4, "kappa": ["energy"], "batch_size": 8},
                         what="report section evg") == {"chains": 4, "kappa": ["energy"], "batch_size": 8}
    with pytest.raises(ValueError, match=r"report section evg: .*batch_size.*eight"):
        check_options(EvGEvaluation, {"batch_size": "eight"}, what="report section evg")
    with pytest.raises(ValueError, match=r"report section oscr: \['kappa'\] are not options of evaluate.py oscr"):
        check_options(OSCREvaluation, {"kappa": ["energy"]}, what="report section oscr")
    # the card's detector options reach a section for the section's own κ only
    card = ReportCard.of(model=["m.ckpt"], kappa=["softmax", "knn"], kappa_args={"knn": {"k": 2}},
                         severity={"kappa": ["softmax"]}, fit={"knn": {"per_class": 3}})
    assert card.detector_options.only(["softmax"]) == {"kappa": ["softmax"], "kappa_args": {}, "fit_data": None,
                                                       "fit": {}, "allow_fit_overlap": False}
    assert card._evaluation("severity", "m.ckpt", ["softmax"], card.output_dir / "s").kappa_args == {}
    assert card._evaluation("severity", "m.ckpt", ["knn"], card.output_dir / "s").fit == {"knn": {"per_class": 3}}
    # --allow-fit-overlap of the card reaches every section that fits detectors, a section's own wins
    card = ReportCard.of(model=["m.ckpt"], kappa=["knn"], allow_fit_overlap=True, severity={},
                         generated={"allow_fit_overlap": False})
    assert card._evaluation("severity", "m.ckpt", ["knn"], card.output_dir / "s").allow_fit_overlap is True
    assert card._evaluation("generated", "m.ckpt", ["knn"], card.output_dir / "g").allow_fit_overlap is False


def test_a_kappa_by_class_path_keeps_its_arguments_in_a_section_and_two_keys_of_one_detector_are_refused() -> None:
    path = "metrics.detectors.knn.KNN"
    options = DetectorOptions(kappa=[path, "softmax"], kappa_args={path: {"k": 3}}, fit={path: {"fraction": 0.5}})
    assert options.kappa == ["knn", "softmax"] and options.kappa_args == {"knn": {"k": 3}}
    # a report section naming the κ by its class path gets the card's arguments and cap of that detector
    assert options.only([path]) == {"kappa": ["knn"], "kappa_args": {"knn": {"k": 3}}, "fit_data": None,
                                    "fit": {"knn": {"fraction": 0.5}}, "allow_fit_overlap": False}
    with pytest.raises(ValueError, match=r"kappa_args for 'metrics.detectors.knn.KNN' and 'knn', which name one "
                                         r"detector \('knn'\): give its arguments once"):
        DetectorOptions(kappa=[path], kappa_args={path: {"k": 3}, "knn": {"k": 5}})


def test_a_detector_whose_hyperparameter_has_no_default_keeps_its_arguments_in_a_section() -> None:
    """Naming a section's κ resolves names only: a detector whose hyperparameter has no default reaches the
    section with the card's arguments (it is refused only where no arguments are given)."""
    needy = type("Needy", (resolve_detector("ash_s").__mro__[1],), {"name": "needy_options", "variant": "p"})
    options = DetectorOptions(kappa=[needy, "softmax"], kappa_args={"needy_options": {"percentile": 0.5}})
    assert options.parameters["needy_options"] == {"percentile": 0.5} and options.classes[0] is needy
    assert options.only([needy]) == {"kappa": ["needy_options"], "kappa_args": {"needy_options": {"percentile": 0.5}},
                                     "fit_data": None, "fit": {}, "allow_fit_overlap": False}
    with pytest.raises(ValueError, match=r"'needy_options' needs the hyperparameters \['percentile'\]"):
        DetectorOptions(kappa=[needy])
