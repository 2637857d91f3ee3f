"""One detector concept (:mod:`metrics.detectors.registry`): a detector is found by its registered name, an entry
point of an installed package, a class path or ``pood:<Class>``, through one resolver; a detector of a package
outside the tree runs by name through ``evaluate.py severity`` and the report card. And the fixes of the
independent check of every detector: SHE refuses logits of another width, GEN takes ``clamp``."""

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
    with pytest.raises(ValueError, match="unknown detector 'ramp_test'; choose from \\['ash_b'"):
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

    card = ReportCard.of(model=[str(demo_checkpoint)], kappa=["energy", "shifted_energy"],
                         severity={"data": "fashion", "data_args": {"estimation": 20, "test": 10}},
                         output_dir=str(plugin / "card"), cache_dir=None, intervals={"resamples": 50},
                         trainer={"accelerator": "cpu", "devices": 1, "wandb_mode": "disabled", "progress_bar": False})
    leaderboard = {row["kappa"]: row["cells"]["severity_mean"]["value"] for row in card.run()}
    mean = float(np.mean([float(r["ood-auroc"]) for r in by_kappa["energy"]]))
    assert leaderboard == pytest.approx({"energy": mean, "shifted_energy": mean}, abs=1e-12)


# -- the detector fixes -------------------------------------------------------------------------------------------


def she_fitted(classes: int = 4, dim: int = 6) -> tuple[Detector, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(classes, dim, generator=g, dtype=torch.float64)
    features = torch.randn(200, dim, generator=g, dtype=torch.float64)
    logits = features @ weight.T
    targets = logits.argmax(dim=1)
    she = build_detector("she").fit({"features": features, "logits": logits, "targets": targets})
    return she, weight


def test_she_refuses_logits_of_another_width_naming_both() -> None:
    """SHE's prediction indexes its patterns: K−1 columns used to pick wrong patterns silently, K+1 an IndexError."""
    she, weight = she_fitted()
    features = torch.randn(5, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    logits = features @ weight.T
    expected = (features * she.patterns[logits.argmax(dim=1)]).sum(dim=1)
    torch.testing.assert_close(she.score({"features": features, "logits": logits}), expected)
    for width in (3, 5):
        wrong = torch.randn(5, width, dtype=torch.float64)
        with pytest.raises(ValueError, match=f"'she' was fitted on logits of 4 known classes; the logits to score "
                                             f"have {width} known columns"):
            she.score({"features": features, "logits": wrong})


def gen_reference(logits: np.ndarray, gamma: float, m: int | None, clamp: bool) -> np.ndarray:
    """The GEN score from the paper's equation (numpy, float64): minus the mean over the M largest probabilities of
    ``p^γ (1 - p)^γ``, the probabilities clamped to [1e-7, 1 - 1e-7] first where ``clamp``."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    if clamp:
        p = np.clip(p, 1e-7, 1 - 1e-7)
    p = -np.sort(-p, axis=1)[:, :m] if m is not None else p
    return -(p ** gamma * (1 - p) ** gamma).mean(axis=1)


def test_gen_is_the_papers_form_unclamped_and_pytorch_oods_with_clamp() -> None:
    from pytorch_ood.detector import GEN as PoodGEN

    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 4
    logits[0, :] = 0.0  # a uniform row, and ties
    logits[1, :3] = logits[1].max() + 1.0
    plain = build_detector("gen").score({"logits": logits})
    clamped = build_detector("gen", clamp=True).score({"logits": logits})
    np.testing.assert_allclose(plain.numpy(), gen_reference(logits.numpy(), 0.1, None, clamp=False), rtol=1e-12)
    np.testing.assert_allclose(clamped.numpy(), gen_reference(logits.numpy(), 0.1, None, clamp=True), rtol=1e-12)
    theirs = -PoodGEN(model=None, gamma=0.1, M=1000).predict_logits(logits).numpy()
    np.testing.assert_allclose(clamped.numpy(), theirs, rtol=1e-10)
    top = build_detector("gen", M=100).score({"logits": logits})
    np.testing.assert_allclose(top.numpy(), gen_reference(logits.numpy(), 0.1, 100, clamp=False), rtol=1e-12)
    # the two forms are not a rescaling of each other: on 1,000 classes the clamp moves the scores by up to ~24%
    relative = ((clamped - plain).abs() / plain.abs()).max().item()
    assert 0.05 < relative < 0.5
    with pytest.raises(ValueError, match="clamp must be true or false, got 'yes'"):
        build_detector("gen", clamp="yes")
