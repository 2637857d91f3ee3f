"""One detector concept (:mod:`metrics.detectors.registry`): a detector is found by its registered name, an entry
point of an installed package, a class path or ``pood:<Class>``, through one resolver; a detector of a package
outside the tree runs by name through ``evaluate.py severity`` and the report card; unknown names and arguments
are refused, and every κ declares its pass and its fit. (The fixes of the independent check of every detector:
test_she.py, test_gen.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate
from metrics import KAPPAS, build_detector, resolve_detector
from metrics.detectors import DETECTORS, Detector, DetectorNotFitted, registry
from tests.conftest import install_package

CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]

PLUGIN_MODULE = '''
"""An out-of-tree detector: the energy scaled (a power of two keeps every float's order: its AUROCs are the energy's)."""

import torch

from metrics.detectors import Detector


class ShiftedEnergy(Detector):
    """``scale · log Σ exp(z)`` over the known logits, in their dtype (as the energy κ computes it)."""

    name = "shifted_energy"
    inputs = frozenset({"logits"})

    def __init__(self, *, scale: float = 2.0, background: bool = False) -> None:
        super().__init__(background=background)
        if not scale > 0:
            raise ValueError(f"detector 'shifted_energy': scale must be positive, got {scale!r}")
        self.scale = float(scale)

    def _score(self, outputs):
        logits = outputs["logits"]
        return self.scale * torch.logsumexp(logits[:, :-1] if self.background else logits, dim=1)


class NotADetector:
    pass
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``shifted_energy`` installed as a package: its module and an entry point of ``openset_bench.detectors``."""
    folder = install_package(tmp_path / "site", distribution="energy-plugin", modules={"energy_plugin": PLUGIN_MODULE},
                             entry_points={registry.ENTRY_POINTS: {"shifted_energy": "energy_plugin:ShiftedEnergy"}})
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(registry, "_LOADED", False)  # the entry points are read again
    yield tmp_path
    registry.unregister_detector("shifted_energy")
    sys.modules.pop("energy_plugin", None)


def test_an_installed_detector_is_a_name_everywhere(plugin: Path) -> None:
    cls = resolve_detector("shifted_energy")
    assert cls.__module__ == "energy_plugin" and cls.kind == "logits" and not cls.needs_fit
    assert "shifted_energy" in KAPPAS and cls.arguments() == {"scale": 2.0}
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = 3.0 * torch.logsumexp(logits, dim=1)
    torch.testing.assert_close(KAPPAS["shifted_energy"](logits, scale=3.0), expected)
    torch.testing.assert_close(build_detector("shifted_energy", scale=3.0).score({"logits": logits}), expected)
    with pytest.raises(ValueError, match="scale must be positive, got -1"):
        cls.arguments(scale=-1)


def test_a_class_path_and_the_decorator_register_and_resolve(plugin: Path) -> None:
    assert resolve_detector("energy_plugin.ShiftedEnergy").name == "shifted_energy"
    with pytest.raises(ValueError, match="'energy_plugin.NotADetector' is 'NotADetector', not a subclass of "
                                         "metrics.detectors.base.Detector"):
        resolve_detector("energy_plugin.NotADetector")
    with pytest.raises(ValueError, match="cannot import 'no_such_package.Score'"):
        resolve_detector("no_such_package.Score")

    @registry.register_detector
    class Ramp(Detector):
        name, inputs = "ramp_test", frozenset({"logits"})

        def _score(self, outputs):
            return outputs["logits"][:, 0].double()

    try:
        assert resolve_detector("ramp_test") is Ramp and KAPPAS["ramp_test"].detector is Ramp
        with pytest.raises(ValueError, match="detector name 'softmax' of .* is already "
                                             "metrics.detectors.confidence.Softmax's"):
            registry.register_detector(type("Again", (Ramp,), {"name": "softmax"}))
        with pytest.raises(TypeError, match="needs a name"):
            registry.register_detector(type("Nameless", (Detector,), {}))
    finally:
        registry.unregister_detector("ramp_test")
    with pytest.raises(ValueError, match="unknown detector 'ramp_test'; choose from \\['adascale_a'"):
        resolve_detector("ramp_test")


def test_a_broken_entry_point_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = install_package(tmp_path / "site", distribution="broken-detector", version="0.2", modules={},
                             entry_points={registry.ENTRY_POINTS: {"broken": "no_such_module:Score"}})
    info = folder / "broken_detector-0.2.dist-info"
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(registry, "_LOADED", False)
    with pytest.raises(ImportError, match="the detector 'broken' of entry point 'no_such_module:Score' "
                                          r"\(openset_bench.detectors, package broken-detector 0.2\) does not import"):
        resolve_detector("softmax")
    monkeypatch.setattr(registry, "_LOADED", False)
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))  # taken off again: the built-in ones load
    (info / "entry_points.txt").write_text("")
    assert resolve_detector("softmax") is DETECTORS["softmax"]


def test_a_fitted_detectors_scorer_says_it_must_be_fitted() -> None:
    with pytest.raises(DetectorNotFitted, match="detector 'knn' is fitted before it scores"):
        KAPPAS["knn"](torch.randn(4, 8))


@pytest.mark.slow
def test_an_installed_detector_runs_through_severity_and_the_card(plugin: Path, demo_checkpoint: Path) -> None:
    """``--kappa energy_plugin.ShiftedEnergy`` (a class path, its argument given by it) in ``evaluate.py severity``,
    ``shifted_energy`` (its entry point's name) in a card: its severity AUROCs are the energy's
    (scaled by a power of two: no score's order changes, so no level and no AUROC), its rows named by it."""
    tables = evaluate.main(["severity", "--model", str(demo_checkpoint), "--data", "fashion", "--data-arg",
                            "estimation=20", "--data-arg", "test=10", "--kappa", "energy", "energy_plugin.ShiftedEnergy",
                            "--kappa-arg", "energy_plugin.ShiftedEnergy.scale=0.5", "--output-dir", str(plugin / "severity"),
                            *CLI])
    by_kappa = {k: tables[k] for k in ("energy", "shifted_energy")}
    assert len(by_kappa["energy"]) == len(by_kappa["shifted_energy"]) == 11
    for ours, energy in zip(by_kappa["shifted_energy"], by_kappa["energy"], strict=True):
        assert float(ours["ood-auroc"]) == pytest.approx(float(energy["ood-auroc"]), abs=1e-12)
    assert len({round(float(r["ood-auroc"]), 6) for r in by_kappa["energy"]}) > 3  # levels of differing AUROC
    written = (plugin / "severity" / "severity.csv").read_text()
    assert written.count(",shifted_energy,") == 11 and "energy_plugin" not in written  # rows named by the detector

    from report_card.card import ReportCard

    card = ReportCard(model=[str(demo_checkpoint)], kappa=["energy", "shifted_energy"],
                      output_dir=str(plugin / "card"), cache_dir=None,
                      intervals={"resamples": 50},
                      trainer={"accelerator": "cpu", "devices": 1, "wandb_mode": "disabled", "progress_bar": False},
                      sections={"severity": {"data": "fashion", "data_args": {"estimation": 20, "test": 10}}})
    leaderboard = {row["kappa"]: row["cells"]["severity_mean"]["value"] for row in card.run()}
    mean = float(np.mean([float(r["ood-auroc"]) for r in by_kappa["energy"]]))
    assert leaderboard == pytest.approx({"energy": mean, "shifted_energy": mean}, abs=1e-12)


# -- names, arguments and declarations -----------------------------------------------------------------------


def test_unknown_names_hyperparameters_and_invalid_values_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown detector 'mahalanobi'; choose from \['adascale_a'"):
        build_detector("mahalanobi")
    with pytest.raises(ValueError, match=r"'knn' has no hyperparameter 'kk'; it takes \['k'\]"):
        build_detector("knn", kk=3)
    with pytest.raises(ValueError, match="'she' has no hyperparameter 'p'; it takes none"):
        build_detector("she", p=3)
    for name, kwargs, message in [("react", {"percentile": 1.5}, "percentile must be a fraction in \\(0, 1\\), got 1.5"),
                                  ("ash_b", {"percentile": 0}, "got 0"), ("knn", {"k": 0}, "k must be an integer >= 1, got 0"),
                                  ("knn_imagenet", {"k": 2.5}, "got 2.5"), ("dice", {"p": -0.1}, "got -0.1"),
                                  ("gen", {"gamma": 0}, "gamma must be a positive finite number, got 0"),
                                  ("mahalanobis", {"shrinkage": -1}, "got -1"), ("vim", {"d": 0}, "got 0")]:
        with pytest.raises(ValueError, match=message):
            build_detector(name, **kwargs)
    with pytest.raises(ValueError, match="ODIN scores images through the model.*not supported by name"):
        build_detector("pood:ODIN")
    with pytest.raises(ValueError, match="MCD scores images through the model"):
        build_detector("pood:MCD")
    with pytest.raises(ValueError, match=r"no detector class 'Knn'; the supported ones: \['ASH', 'DICE'"):
        build_detector("pood:Knn")
    with pytest.raises(ValueError, match="ViM needs the argument 'd'"):
        build_detector("pood:ViM")
    with pytest.raises(ValueError, match=r"has no argument 'temperature' to set; it takes \['detector', 'percentile', "
                                         r"'threshold'\]"):
        build_detector("pood:ReAct", temperature=2)
    with pytest.raises(ValueError, match="refused the arguments.*percentile must be a fraction"):
        build_detector("pood:ASH", percentile=3)


def test_every_kappa_is_a_detector_that_declares_its_pass_and_fit():
    from metrics.detectors import build_detector

    expected_kind = {"softmax": "logits", "max_logit": "logits", "entropy": "logits", "energy": "logits",
                     "odin": "model", "mc_dropout": "model", "ensemble_mi": "ensemble",
                     "ensemble_softmax": "ensemble", "ensemble_entropy": "ensemble", "gen": "logits",
                     "mahalanobis": "features", "relative_mahalanobis": "features", "knn": "features",
                     "knn_imagenet": "features", "vim": "features", "react": "features", "ash_s": "features",
                     "ash_p": "features", "ash_b": "features", "scale": "features", "she": "features",
                     "dice": "features", "adascale_a": "model", "adascale_l": "model", "nci": "features",
                     "fdbd": "features", "gradnorm": "features", "vra": "features", "mahalanobis_pp": "features",
                     "relative_mahalanobis_pp": "features", "nnguide": "features", "klm": "logits",
                     "openmax": "logits", "ghost": "features", "postmax": "features", "weiper": "features",
                     "weiper_kld": "features", "optfs": "features", "nac": "model"}
    assert {name: cls.kind for name, cls in DETECTORS.items()} == expected_kind
    fitted = {"mahalanobis", "relative_mahalanobis", "knn", "knn_imagenet", "vim", "react", "she", "dice",
              "adascale_a", "adascale_l", "nci", "fdbd", "vra", "mahalanobis_pp", "relative_mahalanobis_pp",
              "nnguide", "klm", "openmax", "ghost", "postmax", "weiper_kld", "optfs", "nac"}
    # DICE's contribution means come from the fit data; WeiPer's MSP draws its directions when given the head
    head_only = {"ash_s", "ash_p", "ash_b", "scale", "weiper"}
    for name, cls in DETECTORS.items():
        assert resolve_detector(name) is cls and isinstance(build_detector(name), cls)
        assert (cls.fit_data, cls.needs_fit) == (name in fitted, name in fitted | head_only)
    # the hyperparameters are the constructor's keyword-only arguments, each with its default
    assert resolve_detector("knn").arguments() == {"k": 50}
    assert resolve_detector("gen").arguments(M=100) == {"gamma": 0.1, "M": 100, "clamp": False}
    assert resolve_detector("ash_p").arguments() == {"percentile": 0.6}
    assert resolve_detector("knn").arguments(k=7)["k"] == 7
    with pytest.raises(ValueError, match="'knn' has no hyperparameter 'neighbours'; it takes \\['k'\\]"):
        resolve_detector("knn").arguments(neighbours=7)
    with pytest.raises(ValueError, match="percentile must be a fraction in \\(0, 1\\), got 1.5"):
        resolve_detector("react").arguments(percentile=1.5)  # refused by the detector when the arguments resolve
    # a function of the logits is a detector with an empty fit, scoring what its KAPPAS scorer scores
    logits = torch.randn(4, 3)
    softmax = build_detector("softmax")
    assert softmax.fitted and torch.equal(softmax.score({"logits": logits}), torch.softmax(logits, 1).max(1).values)
    # any pytorch-ood detector by name, fitted by the same pass: its arguments are free keywords
    pood = resolve_detector("pood:KNN")
    assert pood.fit_data and pood.kind == "features" and pood.arguments(k=3) == {"k": 3}
    with pytest.raises(ValueError, match="unknown detector 'mahalanobis2'"):
        resolve_detector("mahalanobis2")


def test_class_paths_of_base_classes_and_nameless_detectors() -> None:
    with pytest.raises(ValueError, match="'metrics.detectors.base.Detector' is a base class that scores nothing"):
        resolve_detector("metrics.detectors.base.Detector")
    # the shaping base takes its percentile without a default: a run must give it, and is told so
    needy = type("Needy", (resolve_detector("ash_s").__mro__[1],), {"name": "needy", "variant": "p"})
    with pytest.raises(ValueError, match=r"'needy' needs the hyperparameters \['percentile'\], which have no "
                                         r"default \(--kappa-arg needy.percentile=VALUE\)"):
        needy.arguments()
    assert needy.arguments(percentile=0.5) == {"percentile": 0.5}
    nameless = type("Nameless", (DETECTORS["softmax"],), {"name": "", "__module__": __name__})
    globals()["Nameless"] = nameless
    try:
        resolved = resolve_detector(f"{__name__}.Nameless")
        assert resolved.name == f"{__name__}.Nameless" and issubclass(resolved, nameless) and nameless.name == ""
        assert resolve_detector(f"{__name__}.Nameless") is resolved  # registered: the same class again
    finally:
        registry.unregister_detector(f"{__name__}.Nameless")
        del globals()["Nameless"]
