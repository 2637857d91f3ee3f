"""DeepEnsemble: one batched forward equal to the per-member loop, frozen, mismatched members refused."""

import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

import train
from lightning_modules import OpenSetClassifier
from lightning_modules.checkpoint import CheckpointError
from lightning_modules.nets.ensemble import DeepEnsemble, member_paths
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
    torch.testing.assert_close(batched, loop, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ensemble.member_forward(1, images), loop[1], rtol=1e-5, atol=1e-6)
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
