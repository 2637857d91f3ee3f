"""Methods as plug-ins (:mod:`evaluation_methods.registry`): a new evaluation method is its module and its
config, installed as a package with an entry point, and it appears in ``evaluate.py --help``, as a section of
``evaluate.py report``, in the card's leaderboard (compared like every column) and on its page -- with no edit of
``evaluate.py`` or ``report_card/``.

The toy method below lives in a folder the test writes: ``toy_method.py`` (its metric, its command, its
:class:`Method`) and ``toy.yaml`` (its config), with the dist-info of an installed package that names it as an
entry point of ``openset_bench.methods``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import evaluate
from evaluation_methods import registry
from evaluation_methods.registry import Headline, Method, MethodResult, register
from tests.conftest import install_package

CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]

TOY_MODULE = '''
"""A toy method that scores images: per (model, κ), the AUROC of the ID test images against a real OOD set,
fitted detectors fitted first, with a bootstrap interval (the images resampled, ID and OOD apart)."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from datamodules.catalog import build_datamodule, ood_context, real_ood_set
from datamodules.evaluation import EvaluationSet
from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import DataOptions, DetectorOptions, OutputOptions
from evaluation_engine.outputs import write_replicates, write_tables
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import default_fit_set
from evaluation_methods.registry import Estimate, Headline, Method, MethodResult
from metrics import pairs_with
from metrics.auroc import auroc, weighted_auroc
from metrics.resampling import resample_weights

COLUMNS = ("model", "kappa", "toy auroc", "low", "high")


@dataclass(kw_only=True, eq=False)
class ToyEvaluation(Evaluation, DetectorOptions, DataOptions, OutputOptions):
    """``evaluate.py toy``: ID test images vs a real OOD set, the AUROC of every model and kappa.

    Attributes:
        model: checkpoints of train.py (the first one's datamodule is the ID data unless --data names one).
        ood: the real OOD set (``digits``, ``fashion:unknown``, a folder).
        intervals: the bootstrap.
    """

    command: ClassVar[str] = "toy"
    model: list[str]
    ood: str = "digits"
    intervals: Intervals | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.intervals = Intervals.of(self.intervals)

    def run(self) -> MethodResult:
        models = [self.scoring_model(spec) for spec in self.model]  # a card's built models: no second read
        datamodule = build_datamodule(self.data, self.data_args) if self.data else models[0].training_datamodule()
        self.sets = (datamodule.evaluation_set("test", role="id_test", known_only=True),
                     EvaluationSet("ood", "ood", real_ood_set(self.ood, **ood_context(datamodule))))
        self.fit_set = default_fit_set(datamodule)
        self.passes = self.scoring_passes(self.cache_dir)
        return Runner.launch(self.options, lambda runner: self.evaluate(runner, models), name="toy")

    def evaluate(self, runner: Runner, models: list) -> MethodResult:
        rows, estimates, replicates = [], [], {}
        id_set, ood_set = self.sets
        weights = [resample_weights(len(s), self.intervals.resamples, self.intervals.seed, stratum=i)
                   for i, s in enumerate(self.sets)]  # the same resamples for every row: paired comparisons
        for model in models:
            for kappa in (k for k in self.detector_classes if pairs_with(k, ensemble=model.ensemble)):
                parameters, batch = self.kappa_parameters[kappa.name], {"batch_size": self.batch_size or 256}
                with runner.on_device(model), torch.no_grad():
                    if kappa.needs_fit:
                        self.passes.fitted_detector(runner, model, kappa, parameters, self.fit_set,
                                                    fit=self.fit.get(kappa.name), **batch)
                    scores = [self.passes.scores(runner, model, s, kappa, parameters, **batch) for s in self.sets]
                replicate = weighted_auroc(*scores, *weights)
                value, (low, high) = auroc(*scores), self.intervals.bounds(replicate)
                replicates[f"{model.display_name}|{kappa.name}"] = replicate
                rows.append(dict(zip(COLUMNS, (model.display_name, kappa.name, value, low, high), strict=True)))
                estimates.append(Estimate(model.display_name, kappa.name, "toy_auroc", value, low, high, replicate,
                                          f"{id_set.fingerprint()}+{ood_set.fingerprint()}"))
        if runner.is_global_zero and self.output_dir:
            write_tables(self.output_dir, "toy", rows, COLUMNS)
            write_replicates(self.output_dir, replicates, self.intervals)
        return MethodResult("toy", {"scores": rows}, folder=self.output_dir, estimates=estimates,
                            replicates=replicates, units=estimates[0].units if estimates else "")


class ToyMethod(Method):
    """The toy method's plug-in."""

    key, evaluation = "toy", ToyEvaluation
    title, name, group = "A toy method (ID test vs a real OOD set)", "Toy method", "Toy"
    unit = "the ID test and OOD images, resampled apart"
    headlines = (Headline("toy_auroc", "toy AUROC", "toy", True, "AUROC of the ID test images vs the OOD set"),)
'''


@pytest.fixture
def toy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The toy method installed as a package: its module, its config, and an entry point naming it."""
    folder = install_package(tmp_path / "site", distribution="toy-method", modules={"toy_method": TOY_MODULE},
                             entry_points={registry.ENTRY_POINTS: {"toy": "toy_method:ToyMethod"}})
    (tmp_path / "toy.yaml").write_text("ood: digits\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(registry, "_LOADED", False)  # the entry points are read again
    yield tmp_path
    registry.unregister("toy")
    sys.modules.pop("toy_method", None)


TOY_ARGS = ["--kappa", "softmax", "knn", "--fit-arg", "knn.per_class=30", "--ood", "digits"]


def toy_reference(checkpoint: Path) -> dict[str, np.ndarray]:
    """Per κ, the ID test and digits scores of the demo model, by the engine's passes in this process, and their
    AUROC by scikit-learn (an independent implementation of the metric the toy reports)."""
    from sklearn.metrics import roc_auc_score

    from datamodules.catalog import ood_context, real_ood_set
    from datamodules.evaluation import EvaluationSet
    from evaluation_engine import Runner, ScoringPasses
    from evaluation_engine.scoring import default_fit_set
    from lightning_modules.scoring import ScoringModel
    from metrics import resolve_detector

    model, runner, passes = ScoringModel(str(checkpoint)), Runner.local(), ScoringPasses()
    datamodule = model.training_datamodule()
    sets = (datamodule.evaluation_set("test", role="id_test", known_only=True),
            EvaluationSet("ood", "ood", real_ood_set("digits", **ood_context(datamodule))))
    knn, found = resolve_detector("knn"), {}
    with torch.no_grad():
        passes.fitted_detector(runner, model, knn, knn.arguments(), default_fit_set(datamodule), fit={"per_class": 30})
        for kappa in ("softmax", "knn"):
            ours, ood = (passes.scores(runner, model, s, resolve_detector(kappa), resolve_detector(kappa).arguments())
                         for s in sets)
            found[kappa] = roc_auc_score(np.r_[np.ones(len(ours)), np.zeros(len(ood))], np.r_[ours, ood])
    return found


def test_a_method_of_an_installed_package_is_a_command_and_a_report_section(toy_package: Path, demo_checkpoint: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    assert "toy" in registry.methods() and "toy" in evaluate.COMMANDS
    with pytest.raises(SystemExit) as exit_code:
        evaluate.main(["--help"])
    assert exit_code.value.code == 0
    listed = capsys.readouterr().out
    assert "toy" in listed and "ID test images vs a real OOD set" in listed
    with pytest.raises(SystemExit):
        evaluate.main(["report", "--help"])
    assert "--toy TOY" in capsys.readouterr().out

    # the command on its own: a real pass over the ID test images and the digits, KNN fitted on 30 training images
    # per class first; the AUROC of each κ is scikit-learn's on the same scores
    result = evaluate.main(["toy", "--model", str(demo_checkpoint), *TOY_ARGS, "--output-dir",
                            str(toy_package / "command"), *CLI])
    assert isinstance(result, MethodResult)
    expected = toy_reference(demo_checkpoint)
    assert [(r["kappa"], r["toy auroc"]) for r in result["scores"]] == [
        ("softmax", pytest.approx(expected["softmax"], abs=1e-12)), ("knn", pytest.approx(expected["knn"], abs=1e-12))]
    for row in result["scores"]:  # the percentile interval of its replicates, and the value inside it
        replicate = result.replicates[f"demo-best|{row['kappa']}"].numpy()
        assert (row["low"], row["high"]) == pytest.approx(tuple(np.quantile(replicate, [0.025, 0.975])), abs=1e-12)
        assert row["low"] < row["toy auroc"] < row["high"]

    # the report card of the toy section alone, its options from the method's own config file: the column holds
    # the command's numbers, and a second card reuses every pass from the cache
    config = toy_package / "report.yaml"
    config.write_text(yaml.safe_dump({"model": [str(demo_checkpoint)], "kappa": ["softmax", "knn"],
                                      "fit": {"knn": {"per_class": 30}}, "toy": {"config": "toy.yaml"},
                                      "output_dir": str(toy_package / "card"), "plots": False,
                                      "cache_dir": str(toy_package / "cache")}))
    rows = evaluate.main(["report", "--config", str(config), *CLI])
    assert [(r["model"], r["kappa"]) for r in rows] == [("demo-best", "softmax"), ("demo-best", "knn")]
    cells = [r["cells"]["toy_auroc"] for r in rows]
    assert [c["value"] for c in cells] == pytest.approx([expected["softmax"], expected["knn"]], abs=1e-12)
    assert [(c["low"], c["high"]) for c in cells] == [pytest.approx((r["low"], r["high"]), abs=1e-12)
                                                      for r in result["scores"]]
    assert cells[0]["unit"] == "the ID test and OOD images, resampled apart"
    assert sum(c["best"] for c in cells) == 1  # compared like every column
    card = json.loads((toy_package / "card" / "report.json").read_text())
    (column,) = card["leaderboard"]["columns"]
    assert (column["key"], column["group"], column["method_title"]) == ("toy_auroc", "Toy", "Toy method")
    section, cost = card["sections"]  # the method's, then what each detector cost
    assert section["title"] == "A toy method (ID test vs a real OOD set)"
    assert [(r["model"], r["κ"]) for r in cost["tables"][0]["rows"]] == [("demo-best", "softmax"), ("demo-best", "knn")]
    assert {entry["role"] for entry in card["passes"] if entry["source"] == "run"} == {"id_test", "ood", "fit"}
    evaluate.main(["report", "--config", str(config), "--output-dir", str(toy_package / "again"), *CLI])
    again = json.loads((toy_package / "again" / "report.json").read_text())
    assert {entry["source"] for entry in again["passes"]} == {"cache", "memory"}  # nothing run again
    page = (toy_package / "card" / "index.html").read_text()
    assert '<th colspan="1" title="Toy method">Toy</th>' in page


@pytest.mark.ddp
def test_the_toy_method_on_two_processes_equals_one(toy_package: Path, demo_checkpoint: Path) -> None:
    """The plug-in inherits the engine's exactness: its table and replicates on 2 gloo processes are 1 process's.
    One image per batch on both sides: the shards put other images together through the network than one process
    does, and a convolution's float32 result may differ in its last bits with the batch on some CPUs."""
    from tests.conftest import ROOT, child_env

    one = evaluate.main(["toy", "--model", str(demo_checkpoint), *TOY_ARGS, "--batch-size", "1", "--output-dir",
                         str(toy_package / "one"), *CLI])
    command = [sys.executable, str(ROOT / "evaluate.py"), "toy", "--model", str(demo_checkpoint), *TOY_ARGS,
               "--batch-size", "1",
               "--output-dir", str(toy_package / "two"), "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp",
               "--no-progress-bar", "--wandb-mode", "disabled"]
    env = child_env(PYTHONPATH=f"{ROOT}{os.pathsep}{toy_package / 'site'}", OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=toy_package, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (toy_package / "two" / "toy.csv").read_text() == (toy_package / "one" / "toy.csv").read_text()
    two = torch.load(toy_package / "two" / "replicates.pt", weights_only=False)["replicates"]
    assert set(two) == set(one.replicates) and all(torch.equal(two[k].double(), one.replicates[k]) for k in two)


class Clashing(Method):
    key, evaluation = "severity", evaluate.COMMANDS["severity"]
    title = name = group = "clash"


def test_a_method_that_takes_another_methods_name_or_column_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['severity'\] already registered by SeverityMethod"):
        register(Clashing)

    class Command(Method):  # its own key, but the command name of the open-set method
        key, evaluation = "open_set2", evaluate.COMMANDS["oscr"]
        title = name = group = "clash"

    with pytest.raises(ValueError, match=r"\['oscr'\] already registered by OpenSetMethod"):
        register(Command)

    class Column(Method):
        key, evaluation = "open_set2", type("E", (evaluate.COMMANDS["oscr"],), {"command": "oscr2"})
        title = name = group = "clash"
        headlines = (Headline("oscr_ccr", "x", "open_set2", True, ""),)

    with pytest.raises(ValueError, match=r"leaderboard columns \['oscr_ccr'\] are another method's"):
        register(Column)

    class TwoIds(Method):  # a plug-in of before, whose slug differed from its key
        key, slug, evaluation = "open_set3", "open_set4", type("E", (evaluate.COMMANDS["oscr"],), {"command": "oscr3"})
        title = name = group = "two ids"

    with pytest.raises(ValueError, match=r"method open_set3: one id per method, its key; its slug 'open_set4'"):
        register(TwoIds)
    assert not {"open_set2", "open_set3"} & set(registry.methods())


def test_an_unknown_report_section_names_the_registered_methods() -> None:
    from report_card.card import ReportCard

    with pytest.raises(ValueError, match=r"report sections \['sevrity'\] are no registered evaluation method .*"
                                         r"'evg', 'generated', 'ood', 'open_set', 'severity'"):
        ReportCard(model=["x.ckpt"], sections={"sevrity": {}})


def test_the_built_in_methods_keep_their_order_and_columns() -> None:
    assert list(registry.methods())[:4] == ["open_set", "severity", "generated", "evg"]
    assert [h.key for h in registry.headlines()][:9] == [
        "oscr_ccr", "oscr_auroc", "severity_mean", "severity_hardest", "near_ood", "shift", "real_ood", "evg_worst",
        "evg_min_rank"]
    assert {"severity-plot", "generate"} <= set(registry.commands())
    assert registry.methods()["evg"].headlines[1].digits == 0 and not registry.methods()["evg"].headlines[1].proportion


def test_a_method_key_the_card_or_its_columns_cannot_carry_is_refused() -> None:
    oscr = evaluate.COMMANDS["oscr"]
    for key in ("title", "report", "my-method"):
        command = type("E", (oscr,), {"command": f"command_of_{key}"})
        method = type("M", (Method,), {"key": key, "evaluation": command, "title": "t",
                                       "name": "n", "group": "g"})
        with pytest.raises(ValueError, match="must be a Python name and not one of evaluate.py report's own"):
            register(method)
    command = type("E", (oscr,), {"command": "wrong_column"})
    method = type("M", (Method,), {"key": "wrong_column", "evaluation": command, "title": "t",
                                   "name": "n", "group": "g",
                                   "headlines": (Headline("w", "w", "open_set", True, ""),)})
    with pytest.raises(ValueError, match=r"columns \['w'\] name another method than its key 'wrong_column'"):
        register(method)
    assert not {"title", "report", "my-method", "wrong_column"} & set(registry.methods())


def test_a_plug_in_that_does_not_import_is_named_and_raised_again(tmp_path: Path, monkeypatch) -> None:
    info = tmp_path / "broken_method-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\nbroken = no_such_module:Method\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LOADED", False)
    for _ in range(2):  # not a half-filled registry taken as whole on the second call
        with pytest.raises(ImportError, match=r"the evaluation method 'broken' of entry point 'no_such_module:Method'"):
            registry.methods()


def install_plug_in(folder: Path, monkeypatch: pytest.MonkeyPatch, *, module: str, source: str, value: str) -> None:
    """A package ``<module>-plugin`` 0.3 installed in ``folder``: its module and an entry point ``plug = <value>``."""
    (folder / f"{module}.py").write_text(source)
    info = folder / f"{module}_plugin-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}-plugin\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\nplug = {value}\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(registry, "_LOADED", False)
    monkeypatch.delitem(sys.modules, module, raising=False)


@pytest.mark.parametrize(("value", "loaded"), [
    ("not_a_method:make_method", "a function (not_a_method.make_method)"),
    ("not_a_method:Plain", "the class not_a_method.Plain"),
])
def test_a_plug_in_that_is_not_a_method_names_its_entry_point_and_package(tmp_path: Path, monkeypatch, value: str,
                                                                           loaded: str) -> None:
    """An entry point that loads a function or a class that is not a :class:`Method`: a TypeError naming the entry
    point, its group and the package that declares it, and what it loaded -- not register()'s bare complaint."""
    install_plug_in(tmp_path, monkeypatch, module="not_a_method", value=value,
                    source="def make_method():\n    return None\n\n\nclass Plain:\n    key = 'plain'\n")
    expected = (f"the evaluation method 'plug' of entry point '{value}' (openset_bench.methods, package "
                f"not_a_method-plugin 0.3) loads {loaded}, not a method: it must name a subclass (or an instance) "
                "of evaluation_methods.registry.Method")
    for _ in range(2):  # raised again on the next call, never a half-filled registry taken as whole
        with pytest.raises(TypeError) as raised:
            registry.methods()
        assert str(raised.value) == expected
    import evaluate  # every command, --help included: the message, not a traceback

    with pytest.raises(SystemExit) as exited:
        evaluate.main(["--help"])
    assert str(exited.value) == f"evaluate.py: {expected}"


def test_a_plug_in_method_that_register_refuses_names_its_entry_point(tmp_path: Path, monkeypatch) -> None:
    """A Method subclass whose registration fails (here: a key another method has) is named by its entry point and
    package, with register()'s reason after it."""
    source = ("from evaluation_methods.open_set import OpenSetMethod\n\n\n"
              "class Again(OpenSetMethod):\n    pass\n")
    install_plug_in(tmp_path, monkeypatch, module="clashing_method", value="clashing_method:Again", source=source)
    with pytest.raises(ValueError) as raised:
        registry.methods()
    assert str(raised.value).startswith("the evaluation method 'plug' of entry point 'clashing_method:Again' "
                                        "(openset_bench.methods, package clashing_method-plugin 0.3): method Again: ")
    assert "already registered by OpenSetMethod" in str(raised.value)
