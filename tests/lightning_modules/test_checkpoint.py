import pytest
import torch

from lightning_modules import NearOODGenerator, OpenSetClassifier
from lightning_modules.checkpoint import CheckpointError, import_class, load_module, read_checkpoint
from tests.conftest import ROOT

LEGACY = ROOT / "tests" / "data" / "legacy"


@pytest.mark.parametrize(("name", "expected", "recorded"), [
    ("classifier.ckpt", OpenSetClassifier, "lightning_modules.open_set_classifier.OpenSetClassifier"),
    ("near_ood.ckpt", NearOODGenerator, "lightning_modules.generators.NearOODGenerator"),
])
def test_checkpoints_written_before_the_packages_moved_still_load(name, expected, recorded):
    """Checkpoints written by the code before lightning_modules/ was arranged by paper (tests/data/legacy,
    made with that code) record the old module paths; they load with their weights."""
    saved = read_checkpoint(LEGACY / name)
    assert saved["model_class"] == recorded
    module = load_module(LEGACY / name, expected=expected)
    assert type(module) is expected
    for key, tensor in module.state_dict().items():
        assert torch.equal(tensor, saved["state_dict"][key]), key
    assert import_class(saved["datamodule_class"]).__name__ == "FashionMNISTOpenSetDataModule"


def test_load_module_restores_the_recorded_class_and_weights(demo_checkpoint):
    module = load_module(demo_checkpoint)
    assert isinstance(module, OpenSetClassifier)
    saved = read_checkpoint(demo_checkpoint)
    # the public class paths, which do not depend on the module a class lives in
    assert saved["model_class"] == "lightning_modules.OpenSetClassifier"
    assert saved["datamodule_class"] == "datamodules.FashionMNISTOpenSetDataModule"
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


def test_unreadable_files_give_an_error_naming_the_file(tmp_path, demo_checkpoint):
    from lightning_modules.checkpoint import CheckpointError

    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(demo_checkpoint.read_bytes()[:5000])
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    tensor = tmp_path / "tensor.ckpt"
    torch.save(torch.zeros(3), tensor)
    for path, message in ((truncated, "not a readable checkpoint"), (text, "not a torch.save archive"),
                          (tensor, "not a Lightning checkpoint .found Tensor")):
        with pytest.raises(CheckpointError, match=message) as error:
            read_checkpoint(path)
        assert str(path) in str(error.value)
        assert "mmap can only be used" not in str(error.value)


def test_a_checkpoint_of_another_model_class_is_refused(tmp_path, demo_checkpoint):
    from lightning_modules.checkpoint import CheckpointError
    from lightning_modules.scoring import ScoringModel

    saved = read_checkpoint(demo_checkpoint)
    saved["model_class"] = "pytorch_lightning.demos.boring_classes.BoringModel"
    torch.save(saved, tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError, match="holds a pytorch_lightning.demos.boring_classes.BoringModel, but a "
                                              "lightning_modules.open_set_classifier.OpenSetClassifier is expected"):
        load_module(tmp_path / "other.ckpt", expected=OpenSetClassifier)
    with pytest.raises(CheckpointError, match="other.ckpt holds a"):
        ScoringModel(str(tmp_path / "other.ckpt"))


def damage_a_tensor(source, target) -> None:
    """Flip one byte inside the largest tensor of a checkpoint archive: the archive stays a valid zip file."""
    import shutil
    import zipfile

    shutil.copy(source, target)
    with zipfile.ZipFile(target) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
    with open(target, "r+b") as handle:
        handle.seek(member.header_offset + 26)
        name_length, extra_length = (int.from_bytes(handle.read(2), "little") for _ in range(2))
        offset = member.header_offset + 30 + name_length + extra_length + member.file_size // 2
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x10]))


def test_damaged_tensor_bytes_are_refused(tmp_path, demo_checkpoint):
    """torch memory-maps tensors without reading them: without the CRC check, a damaged byte would load as a
    model with other weights (that evaluates to other numbers)."""
    damaged = tmp_path / "damaged.ckpt"
    damage_a_tensor(demo_checkpoint, damaged)
    with pytest.raises(CheckpointError, match=r"damaged.ckpt is damaged: the bytes of .* do not match the archive's CRC"):
        read_checkpoint(damaged)
    assert read_checkpoint(demo_checkpoint)["state_dict"]  # the intact one still reads


def test_a_run_is_refused_on_data_of_other_classes(demo_checkpoint):
    from lightning_modules.checkpoint import check_classes, load_run

    saved = read_checkpoint(demo_checkpoint)
    assert saved["classes"] == ["T-shirt/top", "Trouser", "Sneaker", "Bag"]  # recorded at training
    model, datamodule, _ = load_run(demo_checkpoint, {"batch_size": 7})
    assert datamodule.batch_size == 7 and isinstance(model, OpenSetClassifier)
    # four classes again, but other ones: the counts agree, the classes do not
    with pytest.raises(ValueError, match=r"trained on other classes.*only in the model \(T-shirt/top, Trouser, "
                                         r"Sneaker, Bag\).*only in the data \(Pullover, Dress, Coat, Shirt\)"):
        load_run(demo_checkpoint, {"known": [2, 3, 4, 6], "negative": [0, 1, 5], "unknown": [7, 8, 9]})
    with pytest.raises(ValueError, match=r"the same classes in another order, so label i means another class"):
        check_classes(["a", "b"], ["b", "a"], model="m", data="d")
    check_classes(["a", "b"], None, model="m", data="d")  # unknown classes: nothing to compare
    with pytest.raises(ValueError, match=r"has no arguments \['batchsize'\]"):
        load_run(demo_checkpoint, {"batchsize": 7})


def test_a_model_of_more_classes_reads_the_datas_labels_as_its_own():
    """An ImageNet-1k model on a protocol's known classes (generated, EvG): accepted, labels mapped."""
    from lightning_modules.checkpoint import check_classes, class_indices

    model, data = ["a", "b", "c", "d", "e"], ["d", "b"]
    check_classes(model, data, model="m", data="d", subset=True)
    with pytest.raises(ValueError, match=r"only in the model \(a, c, e\)"):
        check_classes(model, data, model="m", data="d")  # severity: the levels are the model's own classes
    with pytest.raises(ValueError, match=r"only in the data \(z\)"):
        check_classes(model, ["d", "z"], model="m", data="d", subset=True)
    assert class_indices(model, data).tolist() == [3, 1]
    assert class_indices(model, model) is None and class_indices(None, data) is None


def test_class_folders_found_by_listing_are_rebuilt_from_the_recorded_classes(tmp_path, monkeypatch):
    """LightningCLI records a class-folders datamodule's arguments as given (``known: null``, the folders of
    train/ then listed): evaluated from another folder (the relative training root not there), its datamodule is
    rebuilt from the classes the checkpoint records, instead of failing to list a folder the evaluation never
    needed."""
    from lightning_modules.checkpoint import datamodule_from_checkpoint

    monkeypatch.chdir(tmp_path)  # no data/my-images here
    checkpoint = {"datamodule_class": "datamodules.ClassFolderDataModule", "classes": ["cat", "dog"],
                  "datamodule_hyper_parameters": {"_class_path": "datamodules.ClassFolderDataModule",
                                                  "root": "data/my-images", "known": None, "negative": ["fox"],
                                                  "unknown": ["owl"], "num_workers": 0}}
    datamodule = datamodule_from_checkpoint(checkpoint, "best.ckpt")
    assert datamodule.protocol.known == ["cat", "dog"] and datamodule.protocol.unknown == ["owl"]
    assert datamodule.root == "data/my-images"
    moved = datamodule_from_checkpoint(checkpoint, "best.ckpt", {"root": str(tmp_path / "elsewhere")})
    assert moved.root == str(tmp_path / "elsewhere") and moved.protocol.known == ["cat", "dog"]
