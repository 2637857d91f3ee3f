"""The ensemble quality bar (``lightning_modules/ensemble_quality.py``): the members' ID-test accuracy measured
where they are trained (``train.py ensemble``), recorded next to the members file and trusted only for the same
files, and a weak ensemble refused where it would shape a result (the generators' MI term, the description of
generated sets) unless told, in which case every row it shapes says so."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

import evaluate
import train
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.sources import DEMO_KNOWN, load_fashion_mnist
from lightning_modules import OpenSetClassifier, ShiftGenerator
from lightning_modules.ensemble_quality import (
    QUALITY_FILE,
    EnsembleQuality,
    MemberAccuracy,
    WeakEnsembleError,
    WeakEnsembleWarning,
    chance_accuracy,
    check_bar,
    ensemble_quality,
    measure_member,
    recorded_quality,
    require_quality,
    sanity_bar,
    write_record,
)
from openset_common.artefacts import file_sha256
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")  # the two cores are shared (tests/conftest.py)

CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]
KNOWN_TEST_IMAGES = 4000  # Fashion-MNIST's 1000 test images of each of the demo's 4 known classes


def quality(*accuracies: float, bar: float | None = None) -> EnsembleQuality:
    members = tuple(MemberAccuracy(f"m{i}.ckpt", a, 100) for i, a in enumerate(accuracies))
    return EnsembleQuality(members, num_classes=4, min_accuracy=bar, name="ens/ensemble.txt")


def test_the_bars():
    assert chance_accuracy(4) == 0.25 and sanity_bar(4) == 0.625  # chance plus half the way to 1
    assert sanity_bar(116) == pytest.approx((1 + 1 / 116) / 2)
    assert check_bar(None) is None and check_bar(0.9) == 0.9
    with pytest.raises(ValueError, match=r"a fraction in \[0, 1\], got 1.5"):
        check_bar(1.5)
    with pytest.raises(ValueError, match="num_classes must be positive, got 0"):
        chance_accuracy(0)


def test_a_member_below_the_bar_is_named_refused_and_let_through_when_told():
    weak = quality(0.95, 0.62, 0.97)  # no bar stated: the sanity bar 0.625
    assert weak.bar == 0.625 and weak.weak and [i for i, _ in weak.below] == [1]
    assert weak.flag("describer") == "describer ens/ensemble.txt: member 1 0.620 < bar 0.625"
    with pytest.raises(WeakEnsembleError, match=(
            r"ens/ensemble.txt is below its quality bar for the test: member 1 \(m1.ckpt\) has ID-test accuracy "
            r"0.620 on 100 images, below 0.625 \(the sanity bar, chance 0.250 plus half the way to 1.*"
            r"give --allow-weak-ensemble to use it anyway")):
        require_quality(weak, what="the test")
    with pytest.warns(WeakEnsembleWarning, match=r"member 1 .*Used anyway \(--allow-weak-ensemble\)"):
        assert require_quality(weak, what="the test", allow_weak=True) is weak
    # a stated bar replaces the sanity bar, above it or below it
    assert quality(0.95, 0.89, bar=0.9).below[0][0] == 1
    assert "the bar stated at training" in quality(0.95, 0.89, bar=0.9).refusal("the test")
    assert not quality(0.3, 0.4, bar=0.25).weak and quality(0.3, bar=0.25).flag() == "no"
    passing = quality(0.95, 0.91, bar=0.9)
    assert require_quality(passing, what="the test") is passing
    assert passing.summary() == "members' ID-test accuracy 0.910-0.950 (2 members, bar 0.900 stated)"
    # what a checkpoint and info.json record reads back as it was
    assert EnsembleQuality.from_dict(json.loads(json.dumps(weak.as_dict()))) == weak


def test_the_measured_accuracy_is_the_known_class_argmax_on_the_id_test_split(demo_checkpoint):
    member, num_classes = measure_member(demo_checkpoint)
    pixels, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    known = np.isin(classes, DEMO_KNOWN)
    labels = torch.tensor([DEMO_KNOWN.index(int(c)) for c in classes[known]])
    network = OpenSetClassifier.load_from_checkpoint(demo_checkpoint).eval()
    with torch.no_grad():
        predicted = network(torch.from_numpy(pixels[known].copy()).float().div(255).unsqueeze(1)).argmax(dim=1)
    assert num_classes == 4 and member.images == int(known.sum()) == KNOWN_TEST_IMAGES
    # one batch here, the datamodule's batches there: a near-tie may round to another class
    assert member.accuracy == pytest.approx(float((predicted == labels).double().mean()), abs=3 / KNOWN_TEST_IMAGES)
    assert member.sha256 == file_sha256(demo_checkpoint)


def uniform_member(source: Path, path: Path) -> Path:
    """A classifier checkpoint whose logits are all 0: it predicts class 0 for every image, so its accuracy on
    the 4 balanced known classes is exactly chance, 0.25 (a deliberately weak member)."""
    saved = torch.load(source, weights_only=False)
    saved["state_dict"]["network.logits.weight"] = torch.zeros_like(saved["state_dict"]["network.logits.weight"])
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, path)
    return path


@pytest.fixture(scope="module")
def weak_ensemble(tmp_path_factory: pytest.TempPathFactory, demo_checkpoint: Path) -> Path:
    """A members file of one member at chance (no record: its accuracy is measured)."""
    folder = tmp_path_factory.mktemp("weak")
    uniform_member(demo_checkpoint, folder / "member_0" / "checkpoints" / "best.ckpt")
    (folder / "ensemble.txt").write_text("member_0/checkpoints/best.ckpt\n")
    return folder / "ensemble.txt"


def test_a_record_is_trusted_only_for_the_same_member_files(weak_ensemble, tmp_path):
    folder = tmp_path / "moved"
    shutil.copytree(weak_ensemble.parent, folder)
    listing, member = folder / "ensemble.txt", folder / "member_0" / "checkpoints" / "best.ckpt"
    state = torch.get_rng_state()
    measured = ensemble_quality(listing)
    assert torch.equal(torch.get_rng_state(), state)  # a check before a training run leaves its randomness alone
    assert measured.source == "measured" and measured.min_accuracy is None
    assert [(m.accuracy, m.images) for m in measured.members] == [(0.25, KNOWN_TEST_IMAGES)]  # exactly chance
    write_record(listing, EnsembleQuality(
        (MemberAccuracy(str(member), 0.25, KNOWN_TEST_IMAGES, sha256=file_sha256(member), seed=3),), num_classes=4,
        min_accuracy=0.2, name=str(listing)))
    record = json.loads((folder / QUALITY_FILE).read_text())
    assert record["members"] == [{"path": "member_0/checkpoints/best.ckpt", "sha256": file_sha256(member),
                                  "seed": 3, "accuracy": 0.25, "images": KNOWN_TEST_IMAGES}]
    assert (record["num_classes"], record["chance"], record["min_accuracy"], record["sanity_bar"]) == (4, 0.25, 0.2,
                                                                                                       0.625)
    read = recorded_quality(listing)
    assert read is not None and read.source == f"recorded in {folder / QUALITY_FILE}"
    assert not read.weak and read.bar == 0.2  # the stated bar, below the sanity bar: the researcher's call
    # a member that changed since its accuracy was recorded: the record is not trusted
    saved = torch.load(member, weights_only=False)
    saved["epoch"] = 99
    torch.save(saved, member)
    with pytest.warns(WeakEnsembleWarning, match="changed since its accuracy was recorded"):
        assert recorded_quality(listing) is None
    # another list of members than the record's
    (folder / "ensemble.txt").write_text("member_0/checkpoints/best.ckpt\nmember_0/checkpoints/best.ckpt\n")
    with pytest.warns(WeakEnsembleWarning, match="records other members than"):
        assert recorded_quality(listing) is None
    # checkpoints given one by one have no record: measured
    assert recorded_quality([str(member)]) is None


def test_train_ensemble_refuses_a_member_below_the_bar_and_leaves_no_members_file(tmp_path, monkeypatch):
    """(The record a passing run writes: ``tests/lightning_modules/nets/test_ensemble.py``.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    out = tmp_path / "ens"
    out.mkdir()
    # an earlier run's members file and record: their members are about to be replaced, so they go first
    (out / "ensemble.txt").write_text("member_0/checkpoints/best.ckpt\n")
    (out / QUALITY_FILE).write_text("{}\n")
    # one batch an epoch (80 training images), so each of the 2 steps validates and checkpoints
    fit = ["--out-dir", str(out), "--config", str(ROOT / "configs/ensemble/fashion_mnist.yaml"), "--trainer.max_steps=2",
           "--trainer.max_epochs=2", "--data.init_args.max_train_per_class=25", "--trainer.enable_model_summary=false"]
    with pytest.raises(SystemExit, match=r"--min-accuracy: the minimum accuracy is a fraction in \[0, 1\], got 90.0"):
        train.train_ensemble(["--min-accuracy", "90", *fit])
    assert (out / "ensemble.txt").exists()  # a refused command line touches nothing
    # a stated bar no 2-step member reaches: refused at the first member, naming it, its accuracy and the bar
    with pytest.raises(WeakEnsembleError, match=(
            r"ensemble member 0 \(.*member_0/checkpoints/best.ckpt\) has ID-test accuracy 0\.\d{4} on 4000 "
            r"known-class images, below the bar --min-accuracy 0.99: no members file is written")):
        train.train_ensemble(["--members", "2", "--seed", "5", "--min-accuracy", "0.99", *fit])
    assert not (out / "ensemble.txt").exists() and not (out / QUALITY_FILE).exists()
    assert not (out / "member_1").exists()  # stopped at the first member below the bar
    pl.seed_everything(0)


def test_generated_refuses_a_weak_describer_unless_told_and_then_flags_its_rows(weak_ensemble, demo_checkpoint,
                                                                                 tmp_path):
    output = tmp_path / "tables"
    args = ["generated", "--model", str(demo_checkpoint), "--kappa", "softmax", "--real-ood", "digits",
            "--ensemble", str(weak_ensemble), "--output-dir", str(output), "--no-plots", *CLI]
    with pytest.raises(SystemExit, match=(
            rf"evaluate.py generated: {weak_ensemble} is below its quality bar for describing the sets \(--ensemble\): "
            r"member 0 \(.*best.ckpt\) has ID-test accuracy 0.250 on 4000 images, below 0.625.*--allow-weak-ensemble")):
        evaluate.main(args)
    assert not output.exists()  # refused before anything ran
    with pytest.warns(WeakEnsembleWarning, match="Used anyway"):
        result = evaluate.main([*args, "--allow-weak-ensemble"])
    flag = f"describer {weak_ensemble}: member 0 0.250 < bar 0.625"
    assert {row["set"]: row["weak ensemble"] for row in result["sets"]} == {"id_test": flag, "real:digits": flag}
    # the detectors' numbers are the model's own, not the describer's
    assert {row["weak ensemble"] for row in result["detectors"]} == {"no"}
    assert f"| {flag} |" in (output / "sets.md").read_text()
    assert "members' ID-test accuracy 0.250-0.250 (1 member, bar 0.625 sanity, none stated)" in (
        output / "sets.md").read_text()


def fit_generator(members: Path, **kwargs: object) -> tuple[ShiftGenerator, pl.Trainer]:
    """A tiny ShiftGenerator with the MI term (no LPIPS term), 1 training step on the 32 px demo data."""
    pl.seed_everything(0)
    module = ShiftGenerator(ensemble=str(members), lambda_perceptual=0.0, base_width=8, lpips_net="alex",
                            lpips_random_backbone=True, **kwargs)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    data = FashionMNISTOpenSetDataModule(train_negatives="exclude", image_size=32, max_train_per_class=8, batch_size=8)
    trainer.fit(module, datamodule=data)
    return module, trainer


@pytest.fixture(scope="module")
def weak_generator(weak_ensemble: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generator trained against the weak ensemble, allowed by name; its checkpoint."""
    with pytest.warns(WeakEnsembleWarning, match="Used anyway"):
        module, trainer = fit_generator(weak_ensemble, allow_weak_ensemble=True)
    assert trainer.global_step == 2 and module.ensemble_quality is not None and module.ensemble_quality.weak
    path = tmp_path_factory.mktemp("generator") / "shift.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_a_generator_refuses_a_weak_mi_ensemble_unless_told(weak_ensemble, weak_generator):
    with pytest.raises(WeakEnsembleError, match=(
            r"below its quality bar for the generator's MI regulariser \(lambda_semantic > 0\): member 0 .* 0.250 .*"
            r"--model.init_args.allow_weak_ensemble=true")):
        fit_generator(weak_ensemble)
    # told: it trained (the fixture), and its checkpoint records what its MI term rested on
    recorded = torch.load(weak_generator, weights_only=False)["ensemble_quality"]
    assert recorded["weak"] is True and recorded["name"] == str(weak_ensemble)
    assert [(m["accuracy"], m["images"]) for m in recorded["members"]] == [(0.25, KNOWN_TEST_IMAGES)]
    plain, _ = fit_generator(weak_ensemble, lambda_semantic=0.0)  # no MI term: nothing to check
    assert plain.ensemble_quality is None


@pytest.mark.slow
@pytest.mark.filterwarnings(r"ignore:LPIPS\(alex, RANDOM backbone:UserWarning")
def test_the_sets_of_a_generator_trained_against_a_weak_ensemble_say_so(weak_ensemble, weak_generator, tmp_path):
    recorded = torch.load(weak_generator, weights_only=False)["ensemble_quality"]
    # the generator's own ensemble describes the manifest: allowed, as the generator was trained with it
    with pytest.warns(WeakEnsembleWarning):
        folder = evaluate.main(["generate", "--model", str(weak_generator), "--num", "4", "--output-dir",
                                str(tmp_path / "set"), *CLI])
    info = json.loads((folder / "info.json").read_text())
    assert info["training_ensemble_quality"] == recorded and info["ensemble_quality"]["weak"] is True
    with pytest.raises(SystemExit, match="below its quality bar for describing the images"):  # another describer
        evaluate.main(["generate", "--model", str(weak_generator), "--num", "4", "--output-dir", str(tmp_path / "other"),
                       "--ensemble", str(weak_ensemble.parent / "member_0" / "checkpoints" / "best.ckpt"), *CLI])
    result = evaluate.main(["generated", "--model", str(weak_ensemble.parent / "member_0/checkpoints/best.ckpt"),
                            "--kappa", "softmax", "--shift", str(folder), "--output-dir", str(tmp_path / "tables"),
                            "--no-plots", *CLI])
    flags = {row["set"]: row["weak ensemble"] for row in result["detectors"]}
    assert flags == {"id_test": "no", "shift:set": f"generator's ensemble {weak_ensemble}: member 0 0.250 < bar 0.625"}
