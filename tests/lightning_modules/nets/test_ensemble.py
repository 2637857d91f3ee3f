"""DeepEnsemble: one batched forward equal to the per-member loop, frozen, mismatched members refused."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

import train
from lightning_modules import OpenSetClassifier
from lightning_modules.checkpoint import CheckpointError
from lightning_modules.ensemble_quality import QUALITY_FILE, measure_member, recorded_quality
from lightning_modules.nets.ensemble import DeepEnsemble, member_paths
from openset_common.artefacts import file_sha256
from tests.conftest import ROOT, train_demo_checkpoint


def members(count: int, **kwargs) -> list[OpenSetClassifier]:
    models = []
    for seed in range(count):
        torch.manual_seed(seed)
        model = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1, **kwargs)
        with torch.no_grad():  # non-trivial batch-norm statistics, different per member
            for module in model.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    module.running_mean.uniform_(-0.5, 0.5)
                    module.running_var.uniform_(0.5, 2.0)
        models.append(model.eval())
    return models


@pytest.mark.parametrize("batched", [True, None])  # vmap, and the CPU default (the member loop)
def test_batched_forward_equals_the_member_loop(batched):
    models = members(3)
    ensemble = DeepEnsemble([m.network for m in models], batched=batched)
    images = torch.rand(6, 1, 28, 28)
    with torch.no_grad():
        batched = ensemble(images)
        loop = torch.stack([m(images) for m in models])
    assert batched.shape == (3, 6, 4)
    # vmap and the channels-last members run other convolution kernels than the plain loop: equal to float32
    # rounding, whose size depends on the CPU (vector width, oneDNN blocking); a wrong member, order or
    # batch-norm statistic moves the logits by far more
    torch.testing.assert_close(batched, loop, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ensemble.member_forward(1, images), loop[1], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(loop[0], loop[1])  # the members differ


def test_frozen_but_differentiable_in_the_input():
    ensemble = DeepEnsemble([m.network for m in members(2)])
    ensemble.train()
    assert not ensemble.training and not any(m.training for m in ensemble.modules())
    assert list(ensemble.parameters()) == []  # nothing for an optimiser to find
    assert ensemble.state_dict() == {}  # not saved inside a module that holds it
    images = torch.rand(4, 1, 28, 28, requires_grad=True)
    ensemble(images).logsumexp(-1).sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0


def test_mismatched_architectures_are_refused():
    small = members(1)[0]
    wider = OpenSetClassifier(num_classes=5, backbone="small_cnn", in_channels=1)
    with pytest.raises(ValueError, match="member 1 has another architecture"):
        DeepEnsemble([small.network, wider.network])


@pytest.fixture(scope="module")
def member_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble")
    return [train_demo_checkpoint(root / f"m{i}", "eos", steps=2, seed=i) for i in range(2)]


def test_from_checkpoints_and_refusals(member_checkpoints, bg_checkpoint, tmp_path):
    ensemble = DeepEnsemble.from_checkpoints(member_checkpoints)
    assert ensemble.num_members == 2 and ensemble.num_classes == 4 and not ensemble.background
    assert ensemble.paths == [str(p) for p in member_checkpoints]
    # a background-class member predicts other classes (K+1 outputs, another loss)
    with pytest.raises(CheckpointError, match="disagrees with .* on its classes"):
        DeepEnsemble.from_checkpoints([member_checkpoints[0], bg_checkpoint])
    # a member trained on other known classes, or seeing another input transform
    for key, value, aspect in (("known", [0, 1, 2, 3], "classes"), ("in_channels", 3, "transform")):
        saved = torch.load(member_checkpoints[1], weights_only=False)
        saved["datamodule_hyper_parameters"][key] = value
        torch.save(saved, tmp_path / f"{key}.ckpt")
        with pytest.raises(CheckpointError, match=f"on its {aspect}"):
            DeepEnsemble.from_checkpoints([member_checkpoints[0], tmp_path / f"{key}.ckpt"])


@pytest.mark.slow
def test_train_ensemble_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    checkpoints = train.train_ensemble([
        "--members", "2", "--seed", "7", "--out-dir", str(tmp_path / "ens"),
        "--config", str(ROOT / "configs/demo/fashion_mnist_eos.yaml"), "--trainer.max_steps=3",
        "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--data.init_args.max_train_per_class=20",
        "--trainer.callbacks=[{class_path: pytorch_lightning.callbacks.ModelCheckpoint, init_args: "
        "{monitor: val/gamma, mode: max, filename: best, save_last: true}}]",
    ])
    assert checkpoints == [tmp_path / "ens" / f"member_{m}" / "checkpoints" / "best.ckpt" for m in range(2)]
    # the members file lists the checkpoints relative to itself, and is read so from any directory
    listed = tmp_path / "ens" / "ensemble.txt"
    assert listed.read_text().split() == [f"member_{m}/checkpoints/best.ckpt" for m in range(2)]
    monkeypatch.chdir(tmp_path / "ens" / "member_0")
    assert [Path(p).resolve() for p in member_paths(listed)] == [p.resolve() for p in checkpoints]
    monkeypatch.chdir(tmp_path)
    weights = [torch.load(p, weights_only=False)["state_dict"]["network.logits.weight"] for p in checkpoints]
    assert not torch.equal(*weights)  # different seeds: different members
    ensemble = DeepEnsemble.from_checkpoints(checkpoints)
    with torch.no_grad():
        assert ensemble(torch.rand(2, 1, 28, 28)).shape == (2, 2, 4)
    # each member's ID-test accuracy, measured as it was trained, recorded next to the members file
    record = json.loads((tmp_path / "ens" / QUALITY_FILE).read_text())
    assert record["min_accuracy"] is None and [m["seed"] for m in record["members"]] == [7, 8]
    assert [m["path"] for m in record["members"]] == listed.read_text().split()
    for entry, checkpoint in zip(record["members"], checkpoints, strict=True):
        again, _ = measure_member(checkpoint)  # anew, through the datamodule the checkpoint records
        assert entry["sha256"] == file_sha256(checkpoint) and entry["images"] == again.images == 4000
        assert entry["accuracy"] == pytest.approx(again.accuracy, abs=2 / 4000)  # other batches: a near-tie may flip
    assert recorded_quality(listed).members[1].accuracy == entry["accuracy"]  # what later commands read
    pl.seed_everything(0)


def test_members_files_resolve_relative_to_themselves_and_refuse_emptiness(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    listing = tmp_path / "a" / "ensemble.txt"
    listing.write_text("m0/best.ckpt\n\n/abs/m1.ckpt\n")
    monkeypatch.chdir(tmp_path)
    assert member_paths(listing) == [str(tmp_path / "a" / "m0" / "best.ckpt"), "/abs/m1.ckpt"]
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match=r"empty.txt lists no checkpoint"):
        member_paths(tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError, match="members file .*none.txt does not exist"):
        member_paths(tmp_path / "none.txt")


# -- the members' input normalisation ----------------------------------------------------------------------

# a datamodule normalisation unlike ImageNet's, so that a test finding ImageNet's numbers proves nothing
MEAN, STD = (0.2, 0.5, 0.7), (0.25, 0.5, 0.125)
SIZE = 16


def train_normalising_member(directory: Path, seed: int) -> Path:
    """A classifier checkpoint of ``train.py``'s kind whose datamodule normalises (``ClassFolderDataModule``
    with ``normalize=True``, 16 px RGB, 2 known classes and a negative one, which the validation split's γ
    needs), 2 training steps."""
    from datamodules import ClassFolderDataModule
    from tests.conftest import fit_and_save, make_imagenet_folder

    root = directory.parent / "folders"
    if not (root / "train").is_dir():
        make_imagenet_folder(root, ["n01440764", "n01443537", "n01484850"], train=5, val=1)
    pl.seed_everything(seed)
    data = ClassFolderDataModule(root=str(root), known=["n01440764", "n01443537"], negative=["n01484850"],
                                 protocol_dir=str(directory / "protocols"), train_negatives="exclude",
                                 batch_size=4, num_workers=0, resize_size=SIZE, crop_size=SIZE, normalize=True,
                                 mean=MEAN, std=STD, pin_memory=False)
    model = OpenSetClassifier(num_classes=2, loss="softmax", backbone="small_cnn", in_channels=3)
    return fit_and_save(model, data, directory, steps=2)


@pytest.fixture(scope="module")
def normalising_members(tmp_path_factory):
    root = tmp_path_factory.mktemp("normalising")
    return [train_normalising_member(root / f"m{i}", seed=i) for i in range(2)]


def by_hand(checkpoints, images):
    """``(M, N, C)`` logits of each member's own network on ``(images - MEAN) / STD`` (no ensemble code)."""
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    networks = [OpenSetClassifier.load_from_checkpoint(p).network.eval() for p in checkpoints]
    with torch.no_grad():
        return torch.stack([network((images - mean) / std)[0] for network in networks])


def test_unit_logits_apply_the_members_normalisation_and_forward_does_not(normalising_members):
    ensemble = DeepEnsemble.from_checkpoints(normalising_members)
    assert (ensemble.mean, ensemble.std, ensemble.input_size) == (MEAN, STD, SIZE)
    torch.manual_seed(0)
    images = torch.rand(5, 3, SIZE, SIZE)
    expected = by_hand(normalising_members, images)
    with torch.no_grad():  # tolerances: the channels-last members against the plain networks (float32 rounding)
        torch.testing.assert_close(ensemble.unit_logits(images), expected, rtol=1e-4, atol=1e-5)
        # forward takes the members' own (already normalised) input: it does not normalise a second time
        torch.testing.assert_close(ensemble(images), by_hand(normalising_members, images * torch.tensor(STD).view(
            1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)), rtol=1e-4, atol=1e-5)
        assert (ensemble(images) - expected).abs().max() > 1e-2  # the normalisation matters: the test can fail
        # images of another size are resized to the members' (bilinear, antialiased), then normalised
        larger = torch.rand(3, 3, 2 * SIZE, 2 * SIZE)
        resized = torch.nn.functional.interpolate(larger, size=(SIZE, SIZE), mode="bilinear", align_corners=False,
                                                  antialias=True)
        torch.testing.assert_close(ensemble.unit_logits(larger), by_hand(normalising_members, resized),
                                   rtol=1e-4, atol=1e-5)


def test_the_scoring_engine_and_unit_logits_give_the_same_logits(normalising_members):
    """The evaluation path (the members' ModelInput, then ``forward``) and the generators' path
    (``unit_logits`` on [0, 1] images) see one image alike: the normalisation is applied exactly once."""
    from PIL import Image

    from lightning_modules.scoring import ScoringModel

    spec = "ensemble:" + ",".join(str(p) for p in normalising_members)
    scoring = ScoringModel(spec)
    # the engine's ModelInput splits the Normalize off the eval transform (float32 numbers)
    assert scoring.model_input.mean == pytest.approx(MEAN) and scoring.model_input.std == pytest.approx(STD)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(4, SIZE, SIZE, 3), dtype=np.uint8)
    unit = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255  # what ToTensor makes of them
    transform = scoring.model_input.transform()
    with torch.no_grad():
        engine = scoring(torch.stack([transform(Image.fromarray(p)) for p in pixels]))  # PIL -> pipeline -> Normalize
        engine_tensors = scoring(scoring.model_input.normalise(unit))  # EvG's path for tensors in [0, 1]
        generators = scoring.network.unit_logits(unit)
    torch.testing.assert_close(engine, generators, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(engine_tensors, generators, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(generators, by_hand(normalising_members, unit), rtol=1e-4, atol=1e-5)


def test_a_bad_normalisation_is_refused(normalising_members, tmp_path):
    networks = [m.network for m in members(1)]
    with pytest.raises(ValueError, match=r"both mean and std, got mean=\(0.5,\), std=None"):
        DeepEnsemble(networks, mean=(0.5,))
    with pytest.raises(ValueError, match=r"positive std per channel, got mean=\(0.5, 0.5\), std=\(0.5, 0.0\)"):
        DeepEnsemble(networks, mean=(0.5, 0.5), std=(0.5, 0.0))
    grey = DeepEnsemble(networks, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2))
    with pytest.raises(ValueError, match=r"images with 1 channels, but the members' normalisation has 3"):
        grey.unit_logits(torch.rand(2, 1, 28, 28))
    with pytest.raises(ValueError, match=r"expected images \(N, C, H, W\) in \[0, 1\], got shape \(1, 28, 28\)"):
        grey.unit_logits(torch.rand(1, 28, 28))
    # a checkpoint that says it normalised but not with what
    for index, path in enumerate(normalising_members):
        saved = torch.load(path, weights_only=False)
        saved["datamodule_hyper_parameters"]["std"] = None
        torch.save(saved, tmp_path / f"m{index}.ckpt")
    with pytest.raises(CheckpointError, match=r"normalize: true\) but the checkpoint records no mean/std"):
        DeepEnsemble.from_checkpoints([tmp_path / "m0.ckpt", tmp_path / "m1.ckpt"])
