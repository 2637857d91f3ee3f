import csv
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image
from sklearn.model_selection import train_test_split

from datamodules.protocols import (
    Protocol,
    imagenet1k_wnids,
    imagenet_protocol,
    protocol_from_superclasses,
    protocol_rows,
    read_protocol_csv,
    write_protocol_csvs,
)
from datamodules.wordnet import descendants_in

# Published counts and a fingerprint of each exact wnid set (sha256 of the sorted wnids joined by ",")
# of the authors' protocol files.
PUBLISHED = {
    (1, "known"): (116, "ad9c19facd1fe952"),
    (1, "negative"): (67, "11ea624b12a19fab"),
    (1, "unknown"): (166, "11469ae159992f80"),
    (2, "known"): (30, "f527191a071c05c7"),
    (2, "negative"): (31, "b119e39823b57f1b"),
    (2, "unknown"): (55, "47fc00d5295192c4"),
    (3, "known"): (151, "e293ab30beb39edc"),
    (3, "negative"): (97, "e1efcc3e121a14c9"),
    (3, "unknown"): (164, "8490096f84378734"),
}


@pytest.mark.parametrize(("number", "role"), sorted(PUBLISHED))
def test_published_counts_and_exact_sets(number, role):
    wnids = getattr(imagenet_protocol(number), role)
    count, fingerprint = PUBLISHED[(number, role)]
    assert len(wnids) == count
    assert wnids == sorted(wnids)
    assert hashlib.sha256(",".join(wnids).encode()).hexdigest()[:16] == fingerprint


def test_named_classes_and_labels():
    p1 = imagenet_protocol(1)
    labels = p1.labels()
    assert labels["n02085620"] == 0  # Chihuahua: first known wnid
    assert labels["n02113978"] == 115  # Mexican hairless: last known wnid
    assert labels["n02120079"] == -1  # Arctic fox: a negative (fox)
    assert labels["n04037443"] == -2  # racer (a motor vehicle): unknown
    assert p1.num_classes == 116
    assert set(imagenet_protocol(3).known) & {"n01440764"}  # tench (fish) is a known class of P3
    with pytest.raises(ValueError, match="1, 2 and 3"):
        imagenet_protocol(4)


def test_p1_lists_follow_the_superclass_rule_where_wordnet_agrees():
    # WordNet 3.0's hyponym closure is a superset of the lists built from ImageNet's own hierarchy
    built = protocol_from_superclasses(
        known=["n02084071"],
        negative=["n02118333", "n02115335", "n02114100", "n02120997", "n02131653", "n02441326", "n02370806", "n02469914"],
        unknown=["n07555863", "n03791235", "n03183080"],
    )
    published = imagenet_protocol(1)
    assert (len(built.known), len(built.negative), len(built.unknown)) == (118, 72, 179)
    for role in ("known", "negative", "unknown"):
        assert set(getattr(published, role)) <= set(getattr(built, role)), role


def test_p2_and_p3_lists_lie_below_their_superclasses():
    in1k = imagenet1k_wnids()
    p2 = imagenet_protocol(2)
    hunting_dogs = descendants_in(["n02087122"], in1k)
    assert set(p2.known) | set(p2.negative) <= set(hunting_dogs)
    # P2's rule: sorted hunting-dog classes, the first half known, the rest negative
    assert max(p2.known) < min(p2.negative)
    unknown_roots = ["n02085374", "n02118333", "n02115335", "n02114100", "n02120997", "n02131653", "n02441326", "n02370806"]
    assert set(p2.unknown) <= set(descendants_in(unknown_roots, in1k))
    p3 = imagenet_protocol(3)
    mixed_13 = ["n02084071", "n01503061", "n02159955", "n03405725", "n02512053", "n02484322", "n02958343",
                "n02120997", "n04490091", "n13134947", "n12992868", "n02858304", "n03082979"]
    below_mixed = set(descendants_in(mixed_13, in1k))
    assert set(p3.known) | set(p3.negative) <= below_mixed
    p3_unknown_roots = ["n01661091", "n03051540", "n02370806", "n07707451", "n02686568"]
    assert set(p3.unknown) <= below_mixed | set(descendants_in(p3_unknown_roots, in1k))


def test_protocol_rejects_overlapping_roles():
    with pytest.raises(ValueError, match="n1.*known and negative"):
        Protocol(known=["n1", "n2"], negative=["n1"])


def test_generated_csvs_follow_the_split_rule(tiny_imagenet, tmp_path):
    protocol = imagenet_protocol(2)
    paths = write_protocol_csvs(tiny_imagenet, 2, tmp_path)
    assert {split: p.name for split, p in paths.items()} == {"train": "p2_train.csv", "val": "p2_val.csv", "test": "p2_test.csv"}
    rows = {split: read_protocol_csv(path, protocol.num_classes) for split, path in paths.items()}
    expected_label = {w: i for i, w in enumerate(protocol.known)} | {w: -1 for w in protocol.negative} | {w: -2 for w in protocol.unknown}
    for split, split_rows in rows.items():
        for relative, label in split_rows:
            folder, wnid, name = relative.split("/")
            assert folder == ("val" if split == "test" else "train")
            assert label == expected_label[wnid], relative
            assert (tiny_imagenet / relative).is_file()
    # independent re-derivation of the rule: files sorted within a class, known then negative classes
    images, classes = [], []
    for wnid in protocol.known + protocol.negative:
        names = sorted(p.name for p in (tiny_imagenet / "train" / wnid).iterdir())
        images += [f"train/{wnid}/{n}" for n in names]
        classes += [wnid] * len(names)
    x_train, x_val = train_test_split(images, train_size=0.8, stratify=classes, random_state=42)
    assert [r for r, _ in rows["train"]] == x_train
    assert [r for r, _ in rows["val"]] == x_val
    test_classes = protocol.known + protocol.negative + protocol.unknown
    assert len(rows["test"]) == 2 * len(test_classes)
    assert {r.split("/")[1] for r, _ in rows["test"]} == set(test_classes)
    # no header, one "path,label" per line
    first = paths["train"].read_text().splitlines()[0]
    assert first.count(",") == 1 and first.startswith("train/n0")


def test_reads_the_authors_format(tmp_path):
    # the authors wrote their files with csv.writer's default "\r\n" line ends
    path = tmp_path / "p2_val.csv"
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows([("train/n02098286/n02098286_321.JPEG", -1), ("train/n02094433/n02094433_1443.JPEG", 26)])
    assert read_protocol_csv(path, 30) == [("train/n02098286/n02098286_321.JPEG", -1), ("train/n02094433/n02094433_1443.JPEG", 26)]


@pytest.mark.parametrize(("content", "message"), [
    ("a.JPEG,30\n", r"bad\.csv:1: label 30 is out of range for 30 known classes"),
    ("a.JPEG,0\nb.JPEG,-3\n", r"bad\.csv:2: label -3 is out of range"),
    ("a.JPEG,zero\n", r"bad\.csv:1: label 'zero' is not an integer"),
    ("a.JPEG\n", r"bad\.csv:1: expected 'relative/path,label'"),
    ("", "is empty"),
])
def test_bad_csv_rows_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_protocol_csv(path, 30)


def test_missing_class_folders_are_listed_in_one_error(tiny_p2: Path, tmp_path):
    protocol = imagenet_protocol(2)
    gone = [protocol.known[3], protocol.negative[0]]
    for wnid in gone:
        shutil.rmtree(tiny_p2 / "train" / wnid)
        shutil.rmtree(tiny_p2 / "val" / wnid)
    shutil.rmtree(tiny_p2 / "val" / protocol.unknown[-1])
    with pytest.raises(FileNotFoundError) as error:
        write_protocol_csvs(tiny_p2, 2, tmp_path / "out")
    message = str(error.value)
    assert message.startswith("5 class folders are missing")
    for wnid in gone:
        assert f"train/{wnid}" in message and f"val/{wnid}" in message
    assert f"val/{protocol.unknown[-1]}" in message
    assert not (tmp_path / "out").exists()  # nothing half-written


# --------------------------------------------------------------------------------------------------
# rows checked against the protocol and the split

P2 = imagenet_protocol(2)


def train_image_row(wnid: str, label: int, index: int = 1) -> tuple[str, int]:
    return f"train/{wnid}/{wnid}_{index}.JPEG", label


def val_image_row(wnid: str, label: int, index: int = 1) -> tuple[str, int]:
    return f"val/{wnid}/ILSVRC2012_val_{index:08d}.JPEG", label


def write_rows(path: Path, rows: list[tuple[str, int]], line_end: str = "\n") -> Path:
    path.write_bytes("".join(f"{relative},{label}{line_end}" for relative, label in rows).encode())
    return path


@pytest.mark.parametrize(("split", "rows", "message"), [
    ("train", [train_image_row(P2.known[0], 0), train_image_row(P2.known[3], 4)],
     rf"p2_train\.csv:2: class {P2.known[3]} has label 4, expected 3 \(its role in the protocol: known\)"),
    ("val", [train_image_row(P2.negative[0], 0)],
     rf"p2_val\.csv:1: class {P2.negative[0]} has label 0, expected -1 \(its role in the protocol: negative\)"),
    ("val", [train_image_row(P2.known[1], 1), train_image_row(P2.known[1], -1, 2)],
     rf"p2_val\.csv:2: class {P2.known[1]} has label -1, expected 1 \(its role in the protocol: known\)"),
    ("train", [train_image_row(P2.known[0], 0), train_image_row(P2.known[1], 1), train_image_row(P2.unknown[0], -2)],
     rf"p2_train\.csv:3: class {P2.unknown[0]} has label -2, but it is an unknown class of the protocol, "
     r"which never appears in the train file \(only in test, with label -2\)"),
    ("val", [train_image_row(P2.unknown[4], -1)],
     rf"p2_val\.csv:1: class {P2.unknown[4]} has label -1, but it is an unknown class"),
    ("test", [val_image_row(P2.unknown[2], -1)],
     rf"p2_test\.csv:1: class {P2.unknown[2]} has label -1, expected -2 \(its role in the protocol: unknown\)"),
    ("test", [val_image_row(P2.unknown[2], -2), val_image_row(P2.known[29], -2, 2)],
     rf"p2_test\.csv:2: class {P2.known[29]} has label -2, expected 29 \(its role in the protocol: known\)"),
    ("test", [val_image_row(P2.negative[7], 3)],
     rf"p2_test\.csv:1: class {P2.negative[7]} has label 3, expected -1 \(its role in the protocol: negative\)"),
    ("train", [train_image_row("n01440764", 0)],  # tench: a class of P1/P3, in no role of P2
     r"p2_train\.csv:1: class n01440764 has label 0, but it is in none of the protocol's known, negative "
     r"and unknown classes"),
    ("test", [val_image_row(P2.known[0], 0), val_image_row("n01440764", -2, 2)],
     r"p2_test\.csv:2: class n01440764 has label -2, but it is in none of the protocol's"),
    ("val", [(f"val/{P2.known[0]}/ILSVRC2012_val_00000001.JPEG", 0)],
     rf"p2_val\.csv:1: 'val/{P2.known[0]}/ILSVRC2012_val_00000001\.JPEG' \(label 0\) is not under 'train/<wnid>/': "
     r"the val file lists ILSVRC2012 train/ images"),
    ("test", [val_image_row(P2.known[0], 0), train_image_row(P2.known[0], 0)],
     rf"p2_test\.csv:2: 'train/{P2.known[0]}/{P2.known[0]}_1\.JPEG' \(label 0\) is not under 'val/<wnid>/': "
     r"the test file lists ILSVRC2012 val/ images"),
    ("train", [(f"{P2.known[0]}_1.JPEG", 0)], r"p2_train\.csv:1: .* is not under 'train/<wnid>/'"),
])
def test_rows_must_match_the_protocol_and_split(tmp_path, split, rows, message):
    path = write_rows(tmp_path / f"p2_{split}.csv", rows)
    with pytest.raises(ValueError, match=message) as raised:
        read_protocol_csv(path, 30, protocol=P2, split=split)
    # and what to do: files of another split of classes (the default protocol_dir of another run) are not these
    assert str(raised.value).endswith(": the file is not this protocol's (written for another split into known, "
                                      "negative and unknown classes, for other class folders, or by hand); write this "
                                      "protocol's files into "
                                      "a protocol_dir of their own (--data-arg protocol_dir=<a new folder>), or remove "
                                      "the file to write it again")
    # without the protocol only the format and the label range are checked (other callers)
    assert read_protocol_csv(path, 30) == rows


def test_checked_read_keeps_correct_files_ours_and_the_authors(tiny_imagenet, tmp_path):
    ours = write_protocol_csvs(tiny_imagenet, 2, tmp_path / "ours")
    for split, path in ours.items():
        rows = read_protocol_csv(path, 30)
        assert len(rows) > 0
        assert read_protocol_csv(path, 30, protocol=P2, split=split) == rows
        # the authors' files: csv.writer's default "\r\n" line ends
        authors = tmp_path / "authors" / path.name
        authors.parent.mkdir(exist_ok=True)
        with open(authors, "w", newline="") as handle:
            csv.writer(handle).writerows(rows)
        assert b"\r\n" in authors.read_bytes()
        assert read_protocol_csv(authors, 30, protocol=P2, split=split) == rows


def test_checked_read_of_the_authors_rows(tmp_path):
    rows = [("train/n02098286/n02098286_321.JPEG", -1), ("train/n02094433/n02094433_1443.JPEG", 26)]
    path = write_rows(tmp_path / "p2_val.csv", rows, line_end="\r\n")
    assert read_protocol_csv(path, 30, protocol=P2, split="val") == rows
    test_rows = [val_image_row(P2.unknown[0], -2), val_image_row(P2.negative[0], -1, 2), val_image_row(P2.known[5], 5, 3)]
    path = write_rows(tmp_path / "p2_test.csv", test_rows, line_end="\r\n")
    assert read_protocol_csv(path, 30, protocol=P2, split="test") == test_rows


def test_read_protocol_csv_checks_its_arguments(tmp_path):
    path = write_rows(tmp_path / "p2_train.csv", [train_image_row(P2.known[0], 0)])
    with pytest.raises(ValueError, match="split='train' needs the protocol"):
        read_protocol_csv(path, 30, split="train")
    with pytest.raises(ValueError, match="protocol needs the split"):
        read_protocol_csv(path, 30, protocol=P2)
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'val', 'test'\), got 'dev'"):
        read_protocol_csv(path, 30, protocol=P2, split="dev")
    with pytest.raises(ValueError, match="num_classes=31 but the protocol has 30 known classes"):
        read_protocol_csv(path, 31, protocol=P2, split="train")


def test_write_only_the_test_file(tiny_imagenet, tmp_path):
    full = write_protocol_csvs(tiny_imagenet, 2, tmp_path / "all")
    paths = write_protocol_csvs(tiny_imagenet, 2, tmp_path / "test_only", splits=("test",))
    assert paths == {"test": tmp_path / "test_only" / "p2_test.csv"}
    assert sorted(p.name for p in (tmp_path / "test_only").iterdir()) == ["p2_test.csv"]
    assert paths["test"].read_bytes() == full["test"].read_bytes()


@pytest.mark.parametrize("splits", [("train",), ("val", "test"), ("train", "dev")])
def test_write_refuses_half_a_train_val_split(tiny_imagenet, tmp_path, splits):
    with pytest.raises(ValueError, match="splits") as error:
        write_protocol_csvs(tiny_imagenet, 2, tmp_path / "out", splits=splits)
    assert repr(tuple(splits)) in str(error.value)
    assert not (tmp_path / "out").exists()


def test_class_folders_with_too_few_images_are_named(tmp_path):
    for split, wnid, count in [("train", "a", 3), ("train", "b", 1), ("val", "a", 1), ("val", "b", 0)]:
        (tmp_path / split / wnid).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (4, 4), (i, 0, 0)).save(tmp_path / split / wnid / f"{i}.jpg")
    protocol = Protocol(["a", "b"], [], [])
    with pytest.raises(ValueError, match=r"1 class folders under .* hold fewer than 2 images \(image files by extension: "
                                         r"\.jpg .*\.pgm\): train/b \(1 image\)$"):
        protocol_rows(tmp_path, protocol)
    (tmp_path / "val" / "b" / "0.txt").write_text("a label, not an image")
    with pytest.raises(ValueError, match=r"fewer than 1 images .*: val/b \(0 images; 1 other files ignored: 0\.txt\)$"):
        protocol_rows(tmp_path, protocol, splits=["test"])
    Image.new("RGB", (4, 4)).save(tmp_path / "train" / "b" / "1.jpg")
    with pytest.raises(ValueError, match=r"cannot be split 80/20 by class: 5 images of 2 classes leave 1 for "
                                         r"validation, .* give every class at least 5 training images .*test_size = 1 "
                                         r"should be greater"):
        protocol_rows(tmp_path, protocol, splits=["train", "val"])  # 5 images: one validation image for 2 classes


def test_the_write_command_names_bad_folders_without_a_traceback(tmp_path, monkeypatch):
    from datamodules import protocols

    with pytest.raises(SystemExit, match=rf"^python -m datamodules.protocols write: ImageNet root {tmp_path / 'none'} "
                                         r"does not exist$"):
        protocols.main(["write", "--imagenet-root", str(tmp_path / "none"), "--protocol", "2", "--out-dir",
                        str(tmp_path / "csv")])
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(SystemExit, match=r"write: the protocol CSV output goes to .*file/csv, but .*file is a file$"):
        protocols.main(["write", "--imagenet-root", str(tmp_path / "none"), "--protocol", "2", "--out-dir",
                        str(tmp_path / "file" / "csv")])
    (tmp_path / "locked").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path / "locked"))  # a non-root user's
    with pytest.raises(SystemExit, match=r"write: the protocol CSV output goes to .*locked, but .*locked cannot be written$"):
        protocols.main(["write", "--imagenet-root", str(tmp_path / "none"), "--protocol", "2", "--out-dir",
                        str(tmp_path / "locked")])
