"""The evaluation data type of the engine: roles, one fingerprint rule, one labels helper, raw sets from a
datamodule, and data by name with their arguments checked by type."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import ConcatDataset, Subset

from datamodules import FashionMNISTOpenSetDataModule, ImageNetProtocolDataModule
from datamodules.catalog import build_datamodule, build_severity_data
from datamodules.evaluation import EvaluationData, EvaluationSet, dataset_fingerprint, known_subset, raw
from datamodules.images import ImageFileDataset, TensorImageDataset, dataset_labels
from datamodules.severity import FashionSeverityData
from tests.conftest import write_jpeg


def tensors(count: int, seed: int = 0) -> TensorImageDataset:
    images = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (count, 1, 6, 6), dtype=np.uint8))
    return TensorImageDataset(images, torch.arange(count) % 3 - 1)


def files(root: Path, count: int) -> ImageFileDataset:
    rng = np.random.default_rng(1)
    for i in range(count):
        write_jpeg(root / "c" / f"{i}.JPEG", rng, size=5)
    return ImageFileDataset(str(root), [(f"c/{i}.JPEG", i % 2) for i in range(count)])


def test_labels_come_from_one_helper_through_subsets_and_concatenations(tmp_path):
    memory, disk = tensors(5), files(tmp_path, 4)
    assert dataset_labels(memory).tolist() == [-1, 0, 1, -1, 0]
    assert dataset_labels(disk).tolist() == [0, 1, 0, 1]
    assert dataset_labels(Subset(memory, [4, 0])).tolist() == [0, -1]
    assert dataset_labels(ConcatDataset([memory, disk])).tolist() == [-1, 0, 1, -1, 0, 0, 1, 0, 1]
    assert dataset_labels(Subset(Subset(disk, [3, 1, 2]), [2, 0])).tolist() == [0, 1]
    with pytest.raises(TypeError, match="cannot read the labels of a list"):
        dataset_labels([1, 2])  # type: ignore[arg-type]


def test_one_fingerprint_rule_for_files_and_tensors(tmp_path):
    memory = tensors(5)
    assert dataset_fingerprint(memory) == dataset_fingerprint(tensors(5))
    changed = tensors(5)
    changed.images[2, 0, 0, 0] ^= 1  # one bit of one pixel
    assert dataset_fingerprint(changed) != dataset_fingerprint(memory)
    assert dataset_fingerprint(Subset(memory, [0, 1])) != dataset_fingerprint(Subset(memory, [1, 0]))
    disk = files(tmp_path / "a", 3)
    before = dataset_fingerprint(disk)
    path = tmp_path / "a" / "c" / "1.JPEG"
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: another version of the file
    assert dataset_fingerprint(disk) != before
    # the same folder name elsewhere with other images is another set
    assert dataset_fingerprint(files(tmp_path / "b" / "a", 3)) != dataset_fingerprint(disk)


def test_evaluation_data_serves_roles_names_and_batches(tmp_path):
    data = EvaluationData([EvaluationSet("id_test", "id_test", tensors(4)),
                           EvaluationSet("pool", "ood", files(tmp_path, 3))], batch_size=2, classes=["x", "y"])
    assert [s.name for s in data.with_role("ood")] == ["pool"] and "id_test" in data
    assert data["pool"].labels().tolist() == [0, 1, 0] and len(data["id_test"]) == 4
    assert [row["images"] for row in data.describe()] == [4, 3]
    batch = next(iter(data.dataloader("id_test")))
    assert batch.images.shape == (2, 1, 6, 6) and batch.indices.tolist() == [0, 1]
    with pytest.raises(KeyError, match="no evaluation set 'missing'; the data have \\['id_test', 'pool'\\]"):
        data["missing"]
    with pytest.raises(ValueError, match="two evaluation sets are called 'pool'"):
        data.add(EvaluationSet("pool", "ood", tensors(1)))
    with pytest.raises(ValueError, match="role must be one of"):
        EvaluationSet("x", "other", tensors(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hold no images"):
        class Empty(EvaluationData):
            def build(self):
                self.add(EvaluationSet("none", "ood", tensors(0)))
        Empty().setup()


def test_a_datamodule_gives_raw_evaluation_sets(tiny_p2):
    protocol = ImageNetProtocolDataModule(root=str(tiny_p2), protocol=2, protocol_dir=str(tiny_p2 / "csv"),
                                          num_workers=0, resize_size=36, crop_size=32)
    protocol.prepare_data()
    test = protocol.evaluation_set("test", role="id_test", known_only=True)
    assert isinstance(test.dataset[0].image, Image.Image)  # raw: the scoring model applies its own transform
    assert len(test) == 30 * 2 and test.labels().min() == 0 and test.info["classes"] == protocol.class_names
    fashion = FashionMNISTOpenSetDataModule(max_train_per_class=20)
    val = fashion.evaluation_set("val", role="id_val")
    assert val.dataset[0].image.dtype == torch.float32 and set(val.labels().tolist()) == {-1, 0, 1, 2, 3}
    assert raw(known_subset(fashion.val_set), what="x").indices == known_subset(fashion.val_set).indices


def test_data_by_name_with_arguments_checked_by_type():
    assert isinstance(build_datamodule("fashion", {"max_train_per_class": 5}), FashionMNISTOpenSetDataModule)
    with pytest.raises(ValueError, match="max_train_per_class.*Expected.*int"):
        build_datamodule("fashion", {"max_train_per_class": 5.5})
    with pytest.raises(ValueError, match="unknown datamodule 'fasion'"):
        build_datamodule("fasion")
    with pytest.raises(ValueError, match="'datamodules.severity.FashionSeverityData' is a FashionSeverityData, not a "
                                         "OpenSetDataModule"):
        build_datamodule("datamodules.severity.FashionSeverityData")
    data = build_severity_data(None, {"estimation": 7}, datamodule=FashionMNISTOpenSetDataModule(known=[0, 1]))
    assert isinstance(data, FashionSeverityData) and data.known == [0, 1] and data.estimation == 7
    with pytest.raises(ValueError, match="has no arguments \\['estimaton'\\]"):
        build_severity_data("fashion", {"estimaton": 7})
    with pytest.raises(ValueError, match="Parser key \"known\""):
        build_severity_data("fashion", {"known": 3})


def test_a_set_of_another_kind_is_fingerprinted_by_its_images():
    """The cache keys and EvG's run key need the same digest in every process, also for a data set that is
    neither files nor tensors: its images are hashed."""
    from datamodules.batch import Sample

    class Listed(torch.utils.data.Dataset):
        def __init__(self, images: torch.Tensor) -> None:
            self.images = images

        def __len__(self) -> int:
            return len(self.images)

        def __getitem__(self, index: int) -> Sample:
            return Sample(self.images[index], -2, index)

    images = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert dataset_fingerprint(Listed(images)) == dataset_fingerprint(Listed(images.clone()))
    changed = images.clone()
    changed[2, 0, 3, 3] += 0.5
    assert dataset_fingerprint(Listed(changed)) != dataset_fingerprint(Listed(images))


def test_balanced_choice_takes_every_class_in_turn_seeded():
    import numpy as np

    from datamodules.images import balanced_choice

    labels = torch.tensor([0] * 50 + [1] * 7 + [2] * 30 + [5] * 13)  # sorted by class, as protocol lists are
    chosen = balanced_choice(labels, 40, seed=3)
    assert len(set(chosen.tolist())) == 40
    counts = np.bincount(labels[chosen].numpy(), minlength=6)[[0, 1, 2, 5]]
    assert counts.tolist() == [11, 7, 11, 11]  # 7 of class 1, the rest shared as evenly as possible
    for prefix in (4, 8, 12):  # every prefix of whole rounds has one image per class per round
        assert np.bincount(labels[chosen[:prefix]].numpy(), minlength=6)[[0, 1, 2, 5]].tolist() == [prefix // 4] * 4
    assert torch.equal(chosen, balanced_choice(labels, 40, seed=3))
    assert not torch.equal(chosen, balanced_choice(labels, 40, seed=4))
    assert sorted(balanced_choice(labels, 100, seed=0).tolist()) == list(range(100))
    with pytest.raises(ValueError, match="cannot choose 101 of 100 images"):
        balanced_choice(labels, 101, seed=0)
    with pytest.raises(ValueError, match="cannot choose 0 of 100"):
        balanced_choice(labels, 0, seed=0)


def test_a_models_class_names_are_read_as_class_folders_by_one_documented_rule(tmp_path, demo_checkpoint):
    """The demo model's class ``T-shirt/top`` cannot be a folder name: its folder is ``T-shirt_top`` (``/`` replaced
    by ``_``), so the demo model takes ``--fit-data`` (a folder of its classes' folders); a folder that follows no
    rule is named with the rule and an example path."""
    from datamodules.evaluation import class_folder, fit_folder_set
    from lightning_modules.scoring import ScoringModel

    classes = ScoringModel(str(demo_checkpoint)).classes
    assert classes == ["T-shirt/top", "Trouser", "Sneaker", "Bag"]  # what the checkpoint records
    assert [class_folder(c) for c in classes] == ["T-shirt_top", "Trouser", "Sneaker", "Bag"]
    rng = np.random.default_rng(3)
    for folder, count in (("Bag", 2), ("Sneaker", 1), ("T-shirt_top", 3), ("Trouser", 1)):
        for i in range(count):
            write_jpeg(tmp_path / "fit" / folder / f"{i}.png", rng, size=6)
    found = fit_folder_set(str(tmp_path / "fit"), classes)
    assert found.labels().tolist() == [0, 0, 0, 1, 2, 3, 3]  # in the model's class order
    assert [row[0] for row in found.dataset.rows[:3]] == ["T-shirt_top/0.png", "T-shirt_top/1.png", "T-shirt_top/2.png"]
    assert found.info["classes"] == classes
    (tmp_path / "fit" / "T-shirt_top").rename(tmp_path / "fit" / "T-shirt")
    with pytest.raises(ValueError) as raised:
        fit_folder_set(str(tmp_path / "fit"), classes)
    assert str(raised.value) == (
        f"fit data {tmp_path / 'fit'}: its class folders are not the model's classes: missing ['T-shirt_top'] (1; the "
        "folders of ['T-shirt/top']); not among the model's ['T-shirt'] (1); the model's classes: ['T-shirt/top', 'Trouser', "
        "'Sneaker', 'Bag']. A class's folder is its name with '/' replaced by '_' (class_folder), e.g. "
        f"{tmp_path / 'fit' / 'T-shirt_top'}")


def test_class_names_without_a_folder_of_their_own_are_refused_by_name(tmp_path):
    from datamodules.evaluation import class_folder, fit_folder_set

    (tmp_path / "fit").mkdir()
    with pytest.raises(ValueError, match=r"fit data .*fit: the classes 'a/b' and 'a_b' would both be the folder 'a_b'"):
        fit_folder_set(str(tmp_path / "fit"), ["a/b", "a_b"])
    assert class_folder("n01440764") == "n01440764" and class_folder("x\0y/z") == "x_y_z"
    for name in ("", ".", ".."):
        with pytest.raises(ValueError, match=f"class {name!r} has no folder name"):
            class_folder(name)
