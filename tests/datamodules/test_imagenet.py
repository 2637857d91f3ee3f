import shutil
from pathlib import Path

import pytest
import torch

from datamodules import ImageNetProtocolDataModule, UnreadableImageError, imagenet_protocol
from datamodules.protocols import read_protocol_csv, write_protocol_csvs
from tests.conftest import make_imagenet_folder

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
    test_rows = [(f"val/{P2.unknown[0]}/ILSVRC2012_val_00000001.JPEG", -2)]  # the test file lists val/ images
    for split in ("train", "val", "test"):
        (tmp_path / f"p2_{split}.csv").write_text("".join(f"{p},{label}\r\n" for p, label in (test_rows if split == "test" else rows)))
    before = snapshot(tmp_path)
    dm = make_datamodule(tiny_imagenet, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 2 and dm.train_set.rows == rows
    assert snapshot(tmp_path) == before


def snapshot(folder: Path) -> dict[str, bytes]:
    """The name and bytes of every file in ``folder``."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def user_rows(split: str) -> list[tuple[str, int]]:
    """A few correct rows of a protocol file, not the ones ``write_protocol_csvs`` would write."""
    if split == "test":
        return [(f"val/{P2.unknown[1]}/ILSVRC2012_val_00000003.JPEG", -2), (f"val/{P2.known[2]}/ILSVRC2012_val_00000001.JPEG", 2)]
    index = {"train": 1, "val": 2}[split]
    return [(f"train/{P2.known[2]}/{P2.known[2]}_{index}.JPEG", 2), (f"train/{P2.negative[3]}/{P2.negative[3]}_{index}.JPEG", -1)]


def write_user_files(protocol_dir: Path, splits: tuple[str, ...]) -> None:
    protocol_dir.mkdir(parents=True, exist_ok=True)
    for split in splits:  # the authors' "\r\n" line ends
        (protocol_dir / f"p2_{split}.csv").write_bytes("".join(f"{p},{label}\r\n" for p, label in user_rows(split)).encode())


def test_only_a_missing_test_file_is_written(tiny_imagenet, tmp_path):
    protocol_dir = tmp_path / "protocols"
    write_user_files(protocol_dir, ("train", "val"))
    before = snapshot(protocol_dir)
    dm = make_datamodule(tiny_imagenet, protocol_dir)
    dm.prepare_data()
    after = snapshot(protocol_dir)
    assert sorted(after) == ["p2_test.csv", "p2_train.csv", "p2_val.csv"]
    assert {name: after[name] for name in before} == before  # the user's files, byte for byte
    reference = write_protocol_csvs(tiny_imagenet, 2, tmp_path / "reference")
    assert after["p2_test.csv"] == reference["test"].read_bytes()
    dm.setup("fit")
    assert dm.train_set.rows == user_rows("train") and dm.val_set.rows == user_rows("val")


def test_all_missing_files_are_written(tiny_imagenet, tmp_path):
    dm = make_datamodule(tiny_imagenet, tmp_path / "protocols")
    dm.prepare_data()
    reference = write_protocol_csvs(tiny_imagenet, 2, tmp_path / "reference")
    assert snapshot(tmp_path / "protocols") == snapshot(tmp_path / "reference")
    assert set(reference) == {"train", "val", "test"}


@pytest.mark.parametrize("missing", [("train",), ("val",), ("train", "test"), ("val", "test")])
def test_missing_train_or_val_file_never_overwrites_the_others(tiny_imagenet, tmp_path, missing):
    protocol_dir = tmp_path / "protocols"
    present = tuple(split for split in ("train", "val", "test") if split not in missing)
    write_user_files(protocol_dir, present)
    before = snapshot(protocol_dir)
    dm = make_datamodule(tiny_imagenet, protocol_dir)
    with pytest.raises(ValueError) as error:
        dm.prepare_data()
    message = str(error.value)
    missing_names = ", ".join(str(protocol_dir / f"p2_{split}.csv") for split in missing)
    present_names = ", ".join(str(protocol_dir / f"p2_{split}.csv") for split in present)
    assert f"missing {missing_names} while {present_names} exist" in message
    assert "train and val files must come from one split" in message
    assert f"remove {present_names} to regenerate all three" in message and "or supply the missing file" in message
    assert snapshot(protocol_dir) == before  # nothing overwritten, nothing added


@pytest.mark.parametrize(("split", "stage"), [("train", "fit"), ("val", "validate"), ("test", "test")])
def test_setup_checks_labels_against_the_protocol(tiny_imagenet, tmp_path, split, stage):
    paths = write_protocol_csvs(tiny_imagenet, 2, tmp_path)
    lines = paths[split].read_text().splitlines()
    relative, label = lines[4].split(",")
    wnid = relative.split("/")[1]
    role = "known" if int(label) >= 0 else {-1: "negative", -2: "unknown"}[int(label)]
    wrong = (int(label) + 1) % 30 if int(label) >= 0 else (5 if int(label) == -1 else -1)
    lines[4] = f"{relative},{wrong}"
    paths[split].write_text("\n".join(lines) + "\n")
    dm = make_datamodule(tiny_imagenet, tmp_path)
    with pytest.raises(ValueError, match=rf"p2_{split}\.csv:5: class {wnid} has label {wrong}, expected {label} "
                                         rf"\(its role in the protocol: {role}\)"):
        dm.setup(stage)


def test_verify_images_checks_labels_against_the_protocol(tiny_imagenet, tmp_path):
    paths = write_protocol_csvs(tiny_imagenet, 2, tmp_path)
    train_lines = paths["train"].read_text().splitlines()
    paths["test"].write_text(paths["test"].read_text() + train_lines[0] + "\n")  # a train image in the test file
    dm = make_datamodule(tiny_imagenet, tmp_path, verify_images=True)
    line = 2 * (30 + 31 + 55) + 1
    with pytest.raises(ValueError, match=rf"p2_test\.csv:{line}: '{train_lines[0].split(',')[0]}' \(label -?\d+\) "
                                         r"is not under 'val/<wnid>/'"):
        dm.prepare_data()


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


def test_a_users_own_class_folders_are_a_protocol(tmp_path):
    """Class folders of any names (not wnids): known by default every train/ class that is not a negative or
    unknown, the protocols' split rule, test = val/, and the severity pool of the unknown classes."""
    from datamodules import ClassFolderDataModule

    root = make_imagenet_folder(tmp_path / "mine", ["cat", "dog", "fox", "owl"], train=5, val=2)
    data = ClassFolderDataModule(root=str(root), negative=["fox"], unknown=["owl"], protocol_dir=str(tmp_path / "csv"),
                                 num_workers=0, resize_size=36, crop_size=32)
    assert data.class_names == ["cat", "dog"] and data.num_classes == 2
    data.prepare_data()
    assert sorted(p.name for p in (tmp_path / "csv").iterdir()) == ["folders_test.csv", "folders_train.csv",
                                                                     "folders_val.csv"]
    data.setup("fit")
    data.setup("test")
    assert sorted(set(data.split_labels("train").tolist()) | set(data.split_labels("val").tolist())) == [-1, 0, 1]
    assert data.split_labels("test").tolist() == [0, 0, 1, 1, -1, -1, -2, -2]
    assert data.test_set[0][0].shape == (3, 32, 32)
    severity = data.severity_data(estimation=3)
    severity.setup()
    assert severity.classes == ["cat", "dog"] and severity.ood_classes == ["owl"]
    assert severity["ood_estimation"].labels().tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="would take the file names of ImageNet protocol P1"):
        ClassFolderDataModule(root=str(root), name="1")


def text_files_class(tmp_path: Path) -> Path:
    """Class folders cat, dog, fox, owl whose ``train/dog`` holds text files only (and a JPEG named upper case)."""
    root = make_imagenet_folder(tmp_path / "mine", ["cat", "dog", "fox", "owl"], train=5, val=2)
    for path in (root / "train" / "dog").iterdir():
        path.unlink()
    for i in range(5):
        (root / "train" / "dog" / f"notes_{i}.txt").write_text("not an image")
    return root


@pytest.mark.parametrize("on_bad_image", ["fail", "skip"])
def test_a_class_folder_of_text_files_is_named_not_trained_empty(tmp_path, on_bad_image):
    from datamodules import ClassFolderDataModule
    from datamodules.images import NonImageFilesWarning

    root = text_files_class(tmp_path)
    (root / "train" / "cat" / "labels.csv").write_text("x")  # one stray file beside images: ignored, counted
    data = ClassFolderDataModule(root=str(root), negative=["fox"], unknown=["owl"], protocol_dir=str(tmp_path / "csv"),
                                 num_workers=0, on_bad_image=on_bad_image)
    with pytest.warns(NonImageFilesWarning, match=r"ignored 1 file in .*train/cat.*labels\.csv"), \
            pytest.raises(ValueError, match=r"train/dog \(0 images; 5 other files ignored: notes_0\.txt"):
        data.prepare_data()
    assert not (tmp_path / "csv").exists() or not any((tmp_path / "csv").iterdir())  # nothing half-written


def test_upper_case_extensions_are_images(tmp_path):
    from datamodules import ClassFolderDataModule

    root = make_imagenet_folder(tmp_path / "mine", ["cat", "dog", "fox"], train=5, val=2)
    for path in (root / "train" / "cat").iterdir():
        path.rename(path.with_suffix(".JPG"))
    data = ClassFolderDataModule(root=str(root), negative=["fox"], protocol_dir=str(tmp_path / "csv"), num_workers=0)
    data.prepare_data()
    data.setup("fit")
    assert sum(label == 0 for label in data.split_labels("train").tolist() + data.split_labels("val").tolist()) == 5


def test_fewer_than_two_known_classes_name_the_classes_found(tmp_path):
    from datamodules import ClassFolderDataModule

    root = make_imagenet_folder(tmp_path / "mine", ["cat", "fox", "owl"], train=5, val=2)
    (root / "train" / ".ipynb_checkpoints").mkdir()  # hidden folders are no class
    with pytest.raises(ValueError, match=r"at least 2 known classes, found 1: \['cat'\] .*negative \['fox'\], "
                                         r"unknown \['owl'\]"):
        ClassFolderDataModule(root=str(root), negative=["fox"], unknown=["owl"], protocol_dir=str(tmp_path / "csv"))
    with pytest.raises(ValueError, match=r"at least 2 known classes, found 0: \[\]"):
        ClassFolderDataModule(root=str(root), known=[], negative=["fox"], protocol_dir=str(tmp_path / "csv"))


def test_an_evaluation_of_class_folders_never_trained_on_writes_their_protocol_files(tmp_path, monkeypatch):
    """``evg --data datamodules.ClassFolderDataModule --data-arg root=<new folders>``: the evaluation sets are
    prepared as training prepares them (the three protocol files written, by the split rule), not "protocol file
    .../folders_val.csv does not exist"."""
    from datamodules import ClassFolderDataModule
    from datamodules.protocols import Protocol, protocol_rows

    monkeypatch.chdir(tmp_path)  # the default protocol_dir, data/protocols, of a fresh working folder
    root = make_imagenet_folder(tmp_path / "new", ["cat", "dog", "fox", "owl"], train=5, val=2, seed=4)
    data = ClassFolderDataModule(root=str(root), known=["cat", "dog"], negative=["fox"], unknown=["owl"],
                                 num_workers=0, verify_images=True)
    decoded = []  # prepare_data's decode of every image is a Trainer's job, once per node: not every rank's here
    monkeypatch.setattr(type(data), "_verify", lambda self, relatives: decoded.append(len(relatives)))
    val = data.evaluation_set("val", role="id_val", known_only=True)
    test = data.evaluation_set("test", role="id_test")
    assert sorted(p.name for p in (tmp_path / "data" / "protocols").iterdir()) == [
        "folders_test.csv", "folders_train.csv", "folders_val.csv"]
    expected = protocol_rows(root, Protocol(["cat", "dog"], ["fox"], ["owl"]))  # the split rule, independently
    assert [val.dataset.dataset.rows[i] for i in val.dataset.indices] == [r for r in expected["val"] if r[1] >= 0]
    assert test.dataset.rows == expected["test"] and test.labels().tolist() == [0, 0, 1, 1, -1, -1, -2, -2]
    assert decoded == []


def test_protocol_files_of_other_class_folders_are_named_before_any_image_is_read(tmp_path):
    """The protocol files in protocol_dir were written from the training folders; the evaluation's folders hold
    other files: one error naming the files, the images and what to do, before any image is decoded."""
    from datamodules import ClassFolderDataModule

    arguments = {"known": ["cat", "dog"], "negative": ["fox"], "unknown": ["owl"], "num_workers": 0,
                 "protocol_dir": str(tmp_path / "csv")}
    trained = make_imagenet_folder(tmp_path / "trained", ["cat", "dog", "fox", "owl"], train=5, val=2)
    ClassFolderDataModule(root=str(trained), **arguments).prepare_data()
    other = tmp_path / "other"
    for path in sorted(trained.rglob("*.JPEG")):  # the same classes, files of other names
        (other / path.relative_to(trained)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, (other / path.relative_to(trained)).with_name(f"x{path.name}"))
    data = ClassFolderDataModule(root=str(other), **arguments)
    with pytest.raises(FileNotFoundError) as raised:
        data.evaluation_set("test", role="id_test")
    assert str(raised.value) == (
        f"8 images the protocol files list are not under {other} (val/cat/ILSVRC2012_val_00000001.JPEG, "
        f"val/cat/ILSVRC2012_val_00000002.JPEG, val/dog/ILSVRC2012_val_00000003.JPEG, ...): {tmp_path / 'csv'}/"
        "folders_test.csv were written from other class folders than these. Give a protocol_dir of their own "
        "(--data-arg protocol_dir=<a new folder>: this root's files are written there, by the protocols' split "
        "rule) or remove those files")
    own = ClassFolderDataModule(root=str(other), **{**arguments, "protocol_dir": str(tmp_path / "other-csv")})
    assert len(own.evaluation_set("test", role="id_test")) == 8


def test_the_rest_of_a_split_another_process_is_writing_is_written_next_to_it(tmp_path):
    """Every process of a torchrun launch prepares its evaluation data: one may find the train file another has
    just written and the val file not yet. Files holding exactly this root's rows by the split rule are completed;
    files of other rows are still refused, naming them."""
    from datamodules import ClassFolderDataModule

    root = make_imagenet_folder(tmp_path / "mine", ["cat", "dog", "fox"], train=5, val=2)
    data = ClassFolderDataModule(root=str(root), negative=["fox"], protocol_dir=str(tmp_path / "csv"), num_workers=0)
    data.prepare_data()
    written = {split: data.csv_file(split).read_text() for split in ("train", "val", "test")}
    data.csv_file("val").unlink()
    data.csv_file("test").unlink()
    data.prepare_data()
    assert {split: data.csv_file(split).read_text() for split in written} == written
    data.csv_file("val").unlink()
    data.csv_file("train").write_text("".join(written["train"].splitlines(keepends=True)[1:]))  # one row fewer
    with pytest.raises(ValueError, match=r"protocol files: missing .*folders_val.csv while .*folders_train.csv, "
                                         r".*folders_test.csv exist"):
        data.prepare_data()
