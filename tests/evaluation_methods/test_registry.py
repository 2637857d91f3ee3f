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
"""A toy evaluation method: the mean of a fixed ramp of numbers, scaled per kappa, with a bootstrap interval."""

from pathlib import Path

import torch

from evaluation_engine.intervals import Intervals
from evaluation_engine.command import Evaluation
from evaluation_engine.runner import TrainerOptions
from evaluation_methods.registry import Estimate, Headline, Method, MethodResult
from lightning_modules.scoring import checkpoint_display_name

SCALE = {"softmax": 1.0, "energy": 0.5}


def toy_numbers(kappa: str, offset: float) -> torch.Tensor:
    """The toy metric's numbers: 101 points of a ramp on [0, 1], scaled by the kappa's factor, plus offset."""
    return torch.linspace(0, 1, 101, dtype=torch.float64) * SCALE[kappa] + offset


class ToyEvaluation(Evaluation):
    """``evaluate.py toy``: the toy score of every model and kappa.

    Args:
        model: the models.
        kappa: the kappas.
        offset: added to every number.
        output_dir: unused (the card gives one).
        intervals: the bootstrap.
    """

    command = "toy"

    def __init__(self, model: list[str], kappa: list[str] = ("softmax",), offset: float = 0.0,
                 output_dir: str | None = None, intervals: Intervals | None = None, *,
                 trainer: TrainerOptions | None = None) -> None:
        super().__init__(trainer=trainer)
        self.model, self.kappa, self.offset = list(model), list(kappa), offset
        self.output_dir, self.intervals = output_dir, Intervals.of(intervals)

    def run(self) -> MethodResult:
        rows, estimates, replicates = [], [], {}
        for spec in self.model:
            name = checkpoint_display_name(Path(spec))
            for kappa in self.kappa:
                numbers = toy_numbers(kappa, self.offset)
                generator = torch.Generator().manual_seed(self.intervals.seed)  # the same resamples for every row
                draws = torch.randint(0, numbers.numel(), (self.intervals.resamples, numbers.numel()),
                                      generator=generator)
                replicate = numbers[draws].mean(dim=1)
                low, high = self.intervals.bounds(replicate)
                value = float(numbers.mean())
                replicates[f"{name}|{kappa}"] = replicate
                rows.append({"model": name, "kappa": kappa, "toy score": value})
                estimates.append(Estimate(name, kappa, "toy_score", value, low, high, replicate, "the ramp's points"))
        return MethodResult("toy", {"scores": rows}, folder=self.output_dir, estimates=estimates,
                            replicates=replicates, units="the ramp's points")


class ToyMethod(Method):
    """The toy method's plug-in."""

    key, slug, evaluation = "toy", "toy", ToyEvaluation
    title, name, group = "A toy method (the ramp)", "Toy method", "Toy"
    unit = "the ramp's points"
    headlines = (Headline("toy_score", "toy score", "toy", True, "the mean of the toy numbers"),)
'''


@pytest.fixture
def toy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The toy method installed as a package: its module, its config, and an entry point naming it."""
    folder = install_package(tmp_path / "site", distribution="toy-method", modules={"toy_method": TOY_MODULE},
                             entry_points={registry.ENTRY_POINTS: {"toy": "toy_method:ToyMethod"}})
    (tmp_path / "toy.yaml").write_text("offset: 0.25\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(registry, "_LOADED", False)  # the entry points are read again
    yield tmp_path
    registry.unregister("toy")
    sys.modules.pop("toy_method", None)


def test_a_method_of_an_installed_package_is_a_command_and_a_report_section(toy_package: Path, demo_checkpoint: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    assert "toy" in registry.methods() and "toy" in evaluate.COMMANDS
    with pytest.raises(SystemExit) as exit_code:
        evaluate.main(["--help"])
    assert exit_code.value.code == 0
    listed = capsys.readouterr().out
    assert "toy" in listed and "the toy score of every model and kappa" in listed
    with pytest.raises(SystemExit):
        evaluate.main(["report", "--help"])
    assert "--toy TOY" in capsys.readouterr().out

    # the command on its own: the typed class's options from the command line
    result = evaluate.main(["toy", "--model", str(demo_checkpoint), "--kappa", "softmax", "energy", "--offset", "0.25",
                            *CLI])
    assert isinstance(result, MethodResult)
    ramp = np.linspace(0, 1, 101)
    assert [r["toy score"] for r in result["scores"]] == pytest.approx([ramp.mean() + 0.25, ramp.mean() / 2 + 0.25],
                                                                       abs=1e-12)

    # the report card of the toy section alone, its options from the method's own config file
    config = toy_package / "report.yaml"
    config.write_text(yaml.safe_dump({"model": [str(demo_checkpoint)], "kappa": ["softmax", "energy"],
                                      "toy": {"config": "toy.yaml"}, "output_dir": str(toy_package / "card"),
                                      "cache_dir": None, "plots": False,
                                      "intervals": {"resamples": 300, "seed": 7}}))
    rows = evaluate.main(["report", "--config", str(config), *CLI])
    assert [(r["model"], r["kappa"]) for r in rows] == [("demo-best", "softmax"), ("demo-best", "energy")]
    cells = [r["cells"]["toy_score"] for r in rows]
    # the card shows the toy's own estimates: the means and the percentile interval of its replicates
    numbers = [ramp + 0.25, ramp / 2 + 0.25]
    assert [c["value"] for c in cells] == pytest.approx([n.mean() for n in numbers], abs=1e-12)
    draws = torch.randint(0, 101, (300, 101), generator=torch.Generator().manual_seed(7)).numpy()
    for found, values in zip(cells, numbers, strict=True):
        means = values[draws].mean(axis=1)
        assert (found["low"], found["high"]) == pytest.approx(
            (np.quantile(means, 0.025), np.quantile(means, 0.975)), abs=1e-9)
    # compared like every column: the softmax row is best; energy is lower on every resample, so marked worse
    assert [c["best"] for c in cells] == [True, False] and [c["significant"] for c in cells] == [False, True]
    assert cells[0]["unit"] == "the ramp's points"

    card = json.loads((toy_package / "card" / "report.json").read_text())
    (column,) = card["leaderboard"]["columns"]
    assert (column["key"], column["group"], column["method_title"]) == ("toy_score", "Toy", "Toy method")
    (section,) = card["sections"]
    assert section["title"] == "A toy method (the ramp)" and section["tables"][0]["title"] == "scores"
    assert [r["toy score"] for r in section["tables"][0]["rows"]] == pytest.approx([n.mean() for n in numbers])
    page = (toy_package / "card" / "index.html").read_text()
    assert '<th colspan="1" title="Toy method">Toy</th>' in page and "A toy method (the ramp)" in page
    assert "toy score" in (toy_package / "card" / "report.md").read_text()


class Clashing(Method):
    key, slug, evaluation = "severity", "severity2", evaluate.COMMANDS["severity"]
    title = name = group = "clash"


def test_a_method_that_takes_another_methods_name_or_column_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['severity'\] already registered by SeverityMethod"):
        register(Clashing)

    class Column(Method):
        key, slug, evaluation = "oscr2", "open_set2", type("E", (evaluate.COMMANDS["oscr"],), {"command": "oscr2"})
        title = name = group = "clash"
        headlines = (Headline("oscr_ccr", "x", "open_set2", True, ""),)

    with pytest.raises(ValueError, match=r"leaderboard columns \['oscr_ccr'\] are another method's"):
        register(Column)
    assert "oscr2" not in registry.methods()


def test_an_unknown_report_section_names_the_registered_methods() -> None:
    from report_card.card import ReportCard

    with pytest.raises(ValueError, match=r"report sections \['sevrity'\] are no registered evaluation method .*"
                                         r"'evg', 'generated', 'oscr', 'severity'"):
        ReportCard(["x.ckpt"], sevrity={})


def test_the_built_in_methods_keep_their_order_and_columns() -> None:
    assert list(registry.methods())[:4] == ["oscr", "severity", "generated", "evg"]
    assert [h.key for h in registry.headlines()][:9] == [
        "oscr_ccr", "oscr_auroc", "severity_mean", "severity_hardest", "near_ood", "shift", "real_ood", "evg_worst",
        "evg_min_rank"]
    assert {"severity-plot", "generate"} <= set(registry.commands())
    assert registry.methods()["evg"].headlines[1].digits == 0 and not registry.methods()["evg"].headlines[1].proportion


def test_a_method_key_the_card_or_its_columns_cannot_carry_is_refused() -> None:
    oscr = evaluate.COMMANDS["oscr"]
    for key in ("title", "report", "my-method"):
        command = type("E", (oscr,), {"command": key})
        method = type("M", (Method,), {"key": key, "slug": f"{key}_slug", "evaluation": command, "title": "t",
                                       "name": "n", "group": "g"})
        with pytest.raises(ValueError, match="must be a Python name and not one of evaluate.py report's own"):
            register(method)
    command = type("E", (oscr,), {"command": "wrong_column"})
    method = type("M", (Method,), {"key": "wrong_column", "slug": "wrong_column", "evaluation": command, "title": "t",
                                   "name": "n", "group": "g",
                                   "headlines": (Headline("w", "w", "open_set", True, ""),)})
    with pytest.raises(ValueError, match=r"columns \['w'\] name another method than its slug 'wrong_column'"):
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
