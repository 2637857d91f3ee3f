import shutil
from pathlib import Path

import pytest
import torch

from datamodules import ImageNetProtocolDataModule, UnreadableImageError, imagenet_protocol
from datamodules.protocols import read_protocol_csv

P2 = imagenet_protocol(2)


def make_datamodule(root: Path, protocol_dir: Path, **kwargs) -> ImageNetProtocolDataModule:
    return ImageNetProtocolDataModule(
        root=str(root), protocol=2, protocol_dir=str(protocol_dir), batch_size=8, num_workers=0, pin_memory=False, **kwargs
    )


def all_batches(loader):
    images, targets, indices, skipped = [], [], [], []
    for batch in loader:
        images.append(batch.images)
        targets.append(batch.targets)
        indices.append(batch.indices)
        skipped.append(batch.skipped)
    return torch.cat(images), torch.cat(targets), torch.cat(indices), torch.cat(skipped)


@pytest.mark.parametrize(("train_negatives", "negative_target"), [("include", -1), ("background", 30), ("exclude", None)])
def test_training_labels_per_loss(tiny_imagenet, tmp_path, train_negatives, negative_target):
    dm = make_datamodule(tiny_imagenet, tmp_path, train_negatives=train_negatives)
    dm.prepare_data()
    dm.setup("fit")
    rows = read_protocol_csv(tmp_path / "p2_train.csv", 30)
    _, targets, indices, _ = all_batches(dm.train_dataloader())
    num_negative_rows = sum(label == -1 for _, label in rows)
    assert num_negative_rows == 31 * 4  # 4 of 5 train images per class
    if negative_target is None:
        assert len(dm.train_set) == len(rows) - num_negative_rows
        assert (targets >= 0).all()
    else:
        assert len(dm.train_set) == len(rows)
        assert int((targets == negative_target).sum()) == num_negative_rows
    # validation keeps the project's labels for every loss (gamma needs -1)
    _, val_targets, _, _ = all_batches(dm.val_dataloader())
    assert int((val_targets == -1).sum()) == 31 and int((val_targets >= 0).sum()) == 30
    counts = dm.train_class_counts()
    expected = [4] * 30 + ([124] if train_negatives == "background" else [])
    assert counts.tolist() == expected


def test_transforms_are_the_papers(tiny_imagenet, tmp_path):
    dm = make_datamodule(tiny_imagenet, tmp_path)
    dm.prepare_data()
    dm.setup("test")
    images, targets, indices, skipped = all_batches(dm.test_dataloader())
    assert images.shape[1:] == (3, 224, 224)
    assert images.min() >= 0 and images.max() <= 1  # no mean/std normalisation by default
    assert indices.tolist() == list(range(len(dm.test_set)))
    assert skipped.numel() == 0
    assert sorted(set(targets.tolist())) == [-2, -1, *range(30)]
    normalised = make_datamodule(tiny_imagenet, tmp_path, normalize=True)
    normalised.setup("test")
    sample = normalised.test_set[0].image
    torch.testing.assert_close(sample[0], (dm.test_set[0].image[0] - 0.485) / 0.229)


def test_reads_existing_csvs_without_rewriting(tiny_imagenet, tmp_path):
    rows = [("train/" + P2.known[0] + f"/{P2.known[0]}_1.JPEG", 0), ("train/" + P2.negative[0] + f"/{P2.negative[0]}_1.JPEG", -1)]
    for split in ("train", "val", "test"):
        (tmp_path / f"p2_{split}.csv").write_text("".join(f"{p},{label}\r\n" for p, label in rows))
    dm = make_datamodule(tiny_imagenet, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 2 and dm.train_set.rows == rows


def test_label_out_of_range_in_csv(tiny_imagenet, tmp_path):
    for split in ("train", "val", "test"):
        (tmp_path / f"p2_{split}.csv").write_text(f"train/{P2.known[0]}/{P2.known[0]}_1.JPEG,31\n")
    dm = make_datamodule(tiny_imagenet, tmp_path)
    with pytest.raises(ValueError, match=r"p2_train\.csv:1: label 31 is out of range for 30 known classes"):
        dm.setup("fit")


def test_missing_folders_fail_before_training(tiny_p2, tmp_path):
    dm = make_datamodule(tiny_p2, tmp_path)
    dm.prepare_data()  # CSVs written while every folder exists
    shutil.rmtree(tiny_p2 / "train" / P2.known[0])
    shutil.rmtree(tiny_p2 / "train" / P2.negative[5])
    with pytest.raises(FileNotFoundError, match=rf"2 class folders are missing.*train/{P2.known[0]}, train/{P2.negative[5]}"):
        dm.setup("fit")


def corrupt(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])  # a truncated JPEG


def test_corrupt_image_fails_with_its_path(tiny_p2, tmp_path):
    dm = make_datamodule(tiny_p2, tmp_path)
    dm.prepare_data()
    dm.setup("test")
    bad = tiny_p2 / dm.test_set.rows[3][0]
    corrupt(bad)
    with pytest.raises(UnreadableImageError, match=str(bad)):
        all_batches(dm.test_dataloader())


def test_corrupt_image_skipped_and_counted(tiny_p2, tmp_path):
    dm = make_datamodule(tiny_p2, tmp_path, on_bad_image="skip")
    dm.prepare_data()
    dm.setup("test")
    for index in (3, 10):
        corrupt(tiny_p2 / dm.test_set.rows[index][0])
    with pytest.warns(RuntimeWarning, match="skipping unreadable image"):
        _, targets, indices, skipped = all_batches(dm.test_dataloader())
    assert skipped.tolist() == [3, 10]
    assert len(indices) == len(dm.test_set) - 2 and 3 not in indices.tolist()


def test_verify_images_lists_every_bad_file_before_training(tiny_p2, tmp_path):
    dm = make_datamodule(tiny_p2, tmp_path, verify_images=True)
    dm.prepare_data()
    bad = [tiny_p2 / "train" / P2.known[1] / f"{P2.known[1]}_2.JPEG", tiny_p2 / "val" / P2.unknown[0]]
    corrupt(bad[0])
    val_file = sorted(bad[1].iterdir())[0]
    corrupt(val_file)
    with pytest.raises(OSError, match="2 unreadable images") as error:
        dm.prepare_data()
    assert str(bad[0]) in str(error.value) and str(val_file) in str(error.value)
    skipping = make_datamodule(tiny_p2, tmp_path, verify_images=True, on_bad_image="skip")
    skipping.prepare_data()
    skipping.setup("test")
    assert len(skipping.test_set) == 2 * (30 + 31 + 55) - 1
