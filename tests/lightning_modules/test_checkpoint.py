import pytest
import torch

from lightning_modules import OpenSetClassifier
from lightning_modules.checkpoint import import_class, load_module, read_checkpoint


def test_load_module_restores_the_recorded_class_and_weights(demo_checkpoint):
    module = load_module(demo_checkpoint)
    assert isinstance(module, OpenSetClassifier)
    saved = read_checkpoint(demo_checkpoint)
    assert saved["model_class"] == "lightning_modules.open_set_classifier.OpenSetClassifier"
    assert saved["datamodule_class"] == "datamodules.fashion_mnist.FashionMNISTOpenSetDataModule"
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, saved["state_dict"][name]), name


def test_bad_checkpoints(tmp_path, demo_checkpoint):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_checkpoint(tmp_path / "none.ckpt")
    saved = read_checkpoint(demo_checkpoint)
    del saved["model_class"]
    torch.save(saved, tmp_path / "foreign.ckpt")
    with pytest.raises(ValueError, match="no 'model_class'"):
        load_module(tmp_path / "foreign.ckpt")
    with pytest.raises(ValueError, match="module.Class"):
        import_class("OpenSetClassifier")
