"""OpenOOD v1.5's image lists as package data and the evaluation sets they define: the shipped files against
their manifest and the published counts, user files checked against the published hashes, subsets marked as
such, missing images counted per set before anything is read, other roots per set, shard sets, the labels, and a
round trip through a tiny OpenOOD-layout tree."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import lzma
import os
import shutil
from collections import Counter
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datamodules import NonImageFilesWarning, openood
from datamodules.openood import (
    BENCHMARKS,
    LEADERBOARD,
    evaluation_sets,
    openood_tree,
    read_leaderboard,
    read_list,
    resolve_images,
)
from datamodules.shards import folder_rows, write_shards

DATA = Path(str(resources.files("datamodules").joinpath("data")))
L, C = "images_largescale", "images_classic"

# The sets of each benchmark as OpenOOD v1.5 defines them (openood/evaluation_api/datasets.py, DATA_INFO: role and
# data_dir) with the line counts of the paper's tables and of the lists (None: a list the package does not ship).
PUBLISHED = {
    "imagenet1k": {
        "id_train": ("id_train", L, None), "id_val": ("id_val", L, 5000), "id_test": ("id_test", L, 45000),
        "imagenet_v2": ("csid", L, 10000), "imagenet_c": ("csid", L, 10000), "imagenet_r": ("csid", L, 30000),
        "imagenet_es": ("csid", L, None), "ood_val": ("ood_val", L, 1763),
        "ssb_hard": ("near", L, 49000), "ninco": ("near", L, 5879),
        "inaturalist": ("far", L, 10000), "textures": ("far", C, 5160), "openimage_o": ("far", L, 15869)},
    "imagenet200": {
        "id_train": ("id_train", L, None), "id_val": ("id_val", L, 1000), "id_test": ("id_test", L, 9000),
        "imagenet_v2": ("csid", L, 2000), "imagenet_c": ("csid", L, 2000), "imagenet_r": ("csid", L, 30000),
        "ood_val": ("ood_val", L, 1763), "ssb_hard": ("near", L, 49000), "ninco": ("near", L, 5879),
        "inaturalist": ("far", L, 10000), "textures": ("far", C, 5160), "openimage_o": ("far", L, 15869)},
    "cifar10": {
        "id_train": ("id_train", C, 50000), "id_val": ("id_val", C, 1000), "id_test": ("id_test", C, 9000),
        "cifar10c": ("csid", C, 10000), "ood_val": ("ood_val", C, 1000), "cifar100": ("near", C, 9000),
        "tin": ("near", C, 7793), "mnist": ("far", C, 70000), "svhn": ("far", C, 26032),
        "texture": ("far", C, 5640), "places365": ("far", C, 35195)},
    "cifar100": {
        "id_train": ("id_train", C, 50000), "id_val": ("id_val", C, 1000), "id_test": ("id_test", C, 9000),
        "ood_val": ("ood_val", C, 972), "cifar10": ("near", C, 10000), "tin": ("near", C, 6526),
        "mnist": ("far", C, 70000), "svhn": ("far", C, 26032), "texture": ("far", C, 5640),
        "places365": ("far", C, 33773)},
}
CLASSES = {"imagenet1k": 1000, "imagenet200": 200, "cifar10": 10, "cifar100": 100}
FORMATS = {".jpeg": "JPEG", ".jpg": "JPEG", ".png": "PNG", ".gif": "GIF"}


def manifest_rows() -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO((DATA / "openood" / "manifest.csv").read_text())))


def shipped_text(benchmark: str, name: str) -> str:
    """A shipped list decompressed here, without the module under test."""
    row = next(r for r in manifest_rows() if r["benchmark"] == benchmark and r["set"] == name)
    return lzma.decompress((DATA / "openood" / row["file"]).read_bytes()).decode()


def blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def test_the_manifest_matches_every_shipped_file_and_nothing_else_is_shipped():
    rows = manifest_rows()
    files = {row["file"] for row in rows if row["file"]}
    on_disk = {str(p.relative_to(DATA / "openood")) for p in (DATA / "openood").rglob("*.xz")}
    assert files == on_disk
    for row in rows:
        if not row["file"]:
            assert row["sha256"] == row["lines"] == row["folder"] == ""
            assert len(row["git_blob"]) == 40 and row["copies"]
            continue
        data = lzma.decompress((DATA / "openood" / row["file"]).read_bytes())
        lines = data.decode().split("\n")
        assert lines[-1] == ""  # every line ends with a newline
        assert hashlib.sha256(data).hexdigest() == row["sha256"]
        assert blob_id(data) == row["git_blob"]
        assert len(lines) - 1 == int(row["lines"])
        assert {line.split(" ")[0].split("/")[0] for line in lines[:-1]} == {row["folder"]}
        assert row["list"] == f"benchmark_imglist/{openood._OPENOOD_NAME[row['benchmark']]}/" \
                              f"{Path(row['list']).name}"


@pytest.mark.parametrize("benchmark", sorted(PUBLISHED))
def test_every_set_has_openood_s_role_data_dir_and_published_count(benchmark):
    found = BENCHMARKS[benchmark]
    assert found.num_classes == CLASSES[benchmark]
    assert list(found.sets) == list(PUBLISHED[benchmark])  # DATA_INFO's order
    for name, (role, data_dir, lines) in PUBLISHED[benchmark].items():
        spec = found.sets[name]
        assert (spec.role, spec.data_dir, spec.lines, spec.shipped) == (role, data_dir, lines, lines is not None)
        if lines is not None:
            assert len(read_list(benchmark, name)) == lines


def test_imagenet_lists_hold_the_50000_validation_images_and_imagenet200_is_a_part_of_them():
    test, val = read_list("imagenet1k", "id_test"), read_list("imagenet1k", "id_val")
    assert set(Counter(label for _, label in test).values()) == {45}  # every class, 45 images each
    assert set(Counter(label for _, label in val).values()) == {5}
    assert {label for _, label in test} == set(range(1000))
    label_of = dict(test + val)
    assert sorted(label_of) == [f"imagenet_1k/val/ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 50001)]
    # ImageNet-200: 200 of those classes, in the same order, every one of their validation images (45 + 5)
    small = read_list("imagenet200", "id_test") + read_list("imagenet200", "id_val")
    mapping = {small_label: label_of[path] for path, small_label in small}
    assert len(mapping) == 200 and [mapping[k] for k in sorted(mapping)] == sorted(mapping.values())
    assert all(label_of[path] == mapping[label] for path, label in small)
    assert sorted(p for p, _ in small) == sorted(p for p, label in label_of.items() if label in mapping.values())
    for name in ("imagenet_v2", "imagenet_c", "imagenet_r"):
        big = dict(read_list("imagenet1k", name))
        assert all(big[path] == mapping[label] for path, label in read_list("imagenet200", name))
    for name in ("ood_val", "ssb_hard", "ninco", "inaturalist", "textures", "openimage_o"):
        assert {label for _, label in read_list("imagenet1k", name)} == {-1}
        assert BENCHMARKS["imagenet200"].sets[name].sha256 == BENCHMARKS["imagenet1k"].sets[name].sha256


@pytest.mark.parametrize("benchmark", ["cifar10", "cifar100"])
def test_cifar_id_val_and_test_split_the_10000_test_images(benchmark):
    test, val = read_list(benchmark, "id_test"), read_list(benchmark, "id_val")
    classes = CLASSES[benchmark]
    assert set(Counter(label for _, label in test).values()) == {9000 // classes}
    assert set(Counter(label for _, label in val).values()) == {1000 // classes}
    assert len({path for path, _ in test + val}) == 10000
    assert {path.split("/")[1] for path, _ in test + val} == {"test"}
    assert not {p for p, _ in read_list(benchmark, "ood_val")} & {p for p, _ in read_list(benchmark, "tin")}


def test_a_list_the_package_does_not_ship_needs_a_file_and_is_checked_by_its_git_blob(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"5e823112e3fe22e051ece24e99b69fdb636a49f3.*imagenet_es=PATH.*"
                                                r"benchmark_imglist/imagenet/test_imagenet_es\.txt"):
        read_list("imagenet1k", "imagenet_es")
    # a set known only by its git blob id: the published bytes are accepted, others refused naming both ids
    ninco = BENCHMARKS["imagenet1k"].sets["ninco"]
    data = shipped_text("imagenet1k", "ninco").encode()
    blob_only = dataclasses.replace(ninco, sha256=None, lines=None, file=None)
    monkeypatch.setitem(BENCHMARKS["imagenet1k"].sets, "ninco", blob_only)
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_bytes(data)
    bad.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1])  # the last line dropped
    assert read_list("imagenet1k", "ninco", good) == [(line.split(" ")[0], -1) for line in data.decode().splitlines()]
    with pytest.raises(ValueError, match=rf"git blob id {blob_id(bad.read_bytes())} \(5878 lines\) differs from the "
                                         rf"published list's {ninco.git_blob} \(its line count unknown\)"):
        read_list("imagenet1k", "ninco", bad)


def test_a_tampered_or_other_list_is_refused_with_both_hashes_and_line_counts(tmp_path):
    published = shipped_text("imagenet1k", "ninco")
    extra = tmp_path / "extra.txt"
    extra.write_text(published + "ninco/extra/extra.jpg -1\n")
    expected = BENCHMARKS["imagenet1k"].sets["ninco"].sha256
    got = hashlib.sha256(extra.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match=rf"sha256 {got} \(5880 lines\) differs from the published list's {expected} "
                                         r"\(5879 lines\); it has 1 line more"):
        read_list("imagenet1k", "ninco", extra)
    missing = tmp_path / "missing.txt"
    missing.write_text("".join(line + "\n" for line in published.splitlines()[2:]))
    with pytest.raises(ValueError, match=r"\(5877 lines\).*\(5879 lines\); it has 2 lines less"):
        read_list("imagenet1k", "ninco", missing)
    edited = tmp_path / "edited.txt"
    edited.write_text(published.replace("ninco/", "NINCO/", 1))  # same count, one byte changed
    with pytest.raises(ValueError, match=r"\(5879 lines\) differs from the published list's .* \(5879 lines\)\. "):
        read_list("imagenet1k", "ninco", edited)
    # another benchmark's list of the same name (CIFAR-10's TIN given as CIFAR-100's) is refused likewise
    other = tmp_path / "test_tin.txt"
    other.write_text(shipped_text("cifar10", "tin"))
    with pytest.raises(ValueError, match=r"\(7793 lines\).*\(6526 lines\); it has 1267 lines more"):
        read_list("cifar100", "tin", other)
    # the published list itself, as OpenOOD ships it or with Windows line ends, reads as the package's copy
    same, crlf = tmp_path / "same.txt", tmp_path / "crlf.txt"
    same.write_text(published)
    crlf.write_bytes(published.replace("\n", "\r\n").encode())
    assert read_list("imagenet1k", "ninco", same) == read_list("imagenet1k", "ninco") == \
        read_list("imagenet1k", "ninco", crlf)


def test_a_corrupt_package_copy_and_unknown_names_are_named(monkeypatch):
    with pytest.raises(ValueError, match=r"no set 'nico'; its sets: \['id_train', 'id_val'"):
        read_list("imagenet1k", "nico")
    with pytest.raises(ValueError, match=r"unknown OpenOOD benchmark 'imagenet'; choose one of \['imagenet1k'"):
        read_list("imagenet", "ninco")
    monkeypatch.setattr(openood, "_shipped_bytes", lambda file: b"ninco/a.jpg -1\n")
    with pytest.raises(RuntimeError, match=r"test_ninco\.txt\.xz \(1 lines, sha256 .*\) is not the one its manifest "
                                           r"records \(5879 lines"):
        read_list("imagenet1k", "ninco")


def test_sets_are_chosen_by_name_or_role():
    cifar = BENCHMARKS["cifar10"]
    assert [s.name for s in cifar.select(None)] == ["id_val", "id_test", "ood_val", "cifar100", "tin", "mnist", "svhn",
                                                    "texture", "places365"]
    assert [s.name for s in cifar.select(["near", "id_test"])] == ["id_test", "cifar100", "tin"]
    assert [s.evaluation_role for s in cifar.select(["id_train", "csid", "ood_val", "far"])] == \
        ["fit", "real_shift", "ood_val", "ood", "ood", "ood", "ood"]
    with pytest.raises(ValueError, match=r"no set \['nearood'\]; its sets: .* or a role: \['id_train'"):
        cifar.select(["nearood"])


# -- the images -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("openood")
    return root, openood_tree(root, "imagenet1k", per_set=3, seed=7)


def copy_tree(tree, tmp_path) -> tuple[Path, dict[str, Path]]:
    root, lists = tree
    shutil.copytree(root, tmp_path / "data")
    return tmp_path / "data", {name: tmp_path / "data" / path.relative_to(root) for name, path in lists.items()}


def test_the_tiny_tree_holds_real_names_of_the_published_lists(tree):
    root, lists = tree
    assert sorted(lists) == sorted(["id_val", "id_test", "ood_val", "ssb_hard", "ninco", "inaturalist", "textures",
                                    "openimage_o"])
    for name, path in lists.items():
        spec = BENCHMARKS["imagenet1k"].sets[name]
        assert path == root / spec.list
        lines = path.read_text().splitlines()
        published = shipped_text("imagenet1k", name).splitlines()
        assert len(lines) == 3 and set(lines) <= set(published)
        assert [published.index(line) for line in lines] == sorted(published.index(line) for line in lines)
        for line in lines:
            path = line.split(" ")[0]
            with Image.open(root / spec.data_dir / path) as image:  # the format of the extension (NINCO has PNGs)
                assert image.size == (8, 8) and image.format == FORMATS[Path(path).suffix.lower()]


def test_a_round_trip_through_the_tiny_tree(tree):
    root, lists = tree
    found = evaluation_sets("imagenet1k", data_root=root, subset_lists=lists)
    assert list(found) == ["id_val", "id_test", "ood_val", "ssb_hard", "ninco", "inaturalist", "textures",
                           "openimage_o"]
    roles = {"id_val": "id_val", "id_test": "id_test", "ood_val": "ood_val", "ssb_hard": "ood", "ninco": "ood",
             "inaturalist": "ood", "textures": "ood", "openimage_o": "ood"}
    for name, evaluation_set in found.items():
        spec = BENCHMARKS["imagenet1k"].sets[name]
        lines = [line.split(" ") for line in lists[name].read_text().splitlines()]
        assert evaluation_set.name == name and evaluation_set.role == roles[name]
        expected = [-2 if spec.role in ("ood_val", "near", "far") else int(label) for _, label in lines]
        assert evaluation_set.labels().tolist() == expected
        for i, (path, _) in enumerate(lines):
            image = evaluation_set.dataset[i].image
            with Image.open(root / spec.data_dir / path) as written:
                assert np.array_equal(np.asarray(image), np.asarray(written.convert("RGB")))
        info = evaluation_set.info
        assert info["subset"] is True and info["subset_lines"] == 3
        assert info["subset_sha256"] == hashlib.sha256(lists[name].read_bytes()).hexdigest()
        assert (info["list_sha256"], info["list_lines"], info["group"]) == (spec.sha256, spec.lines, spec.role)
        assert info["root"] == str(root / spec.data_dir)
        # the fingerprint is the exact file list: relative paths, sizes and modification times
        hasher = hashlib.sha256()
        for path, _ in lines:
            stat = os.stat(root / spec.data_dir / path)
            hasher.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        assert evaluation_set.dataset.files_fingerprint() == hasher.hexdigest()
    assert len({s.fingerprint() for s in found.values()}) == len(found)


def test_a_subset_holds_lines_of_the_published_list_only(tree, tmp_path):
    root, lists = tree
    lines = lists["ninco"].read_text().splitlines()
    stranger = tmp_path / "stranger.txt"
    stranger.write_text(f"{lines[0]}\nninco/made_up/x.jpg -1\n")
    with pytest.raises(ValueError, match=r"1 of its 2 lines are not lines of the published list \(first: line 2 "
                                         r"'ninco/made_up/x.jpg -1'\)"):
        evaluation_sets("imagenet1k", ["ninco"], data_root=root, subset_lists={"ninco": stranger})
    twice = tmp_path / "twice.txt"
    twice.write_text(f"{lines[0]}\n{lines[1]}\n{lines[0]}\n")
    with pytest.raises(ValueError, match="1 lines are there more than once"):
        evaluation_sets("imagenet1k", ["ninco"], data_root=root, subset_lists={"ninco": twice})
    broken = tmp_path / "broken.txt"
    broken.write_text(f"{lines[0]}\n{lines[1].split(' ')[0]}\n")
    with pytest.raises(ValueError, match=r"broken\.txt, line 2: .* is not '<relative path> <label>'"):
        evaluation_sets("imagenet1k", ["ninco"], data_root=root, subset_lists={"ninco": broken})
    id_line = lists["id_test"].read_text().splitlines()[0]
    relabelled = tmp_path / "relabelled.txt"
    relabelled.write_text(id_line.rsplit(" ", 1)[0] + " 1000\n")
    with pytest.raises(ValueError, match=r"line 1: label 1000 is not one of the 1000 classes 0\.\.999"):
        evaluation_sets("imagenet1k", ["id_test"], data_root=root, subset_lists={"id_test": relabelled})


def test_missing_images_are_counted_per_set_before_any_is_read(tree, tmp_path, monkeypatch):
    root, lists = copy_tree(tree, tmp_path)
    ninco = [line.split(" ")[0] for line in lists["ninco"].read_text().splitlines()]
    textures = [line.split(" ")[0] for line in lists["textures"].read_text().splitlines()]
    (root / L / ninco[0]).unlink()
    (root / L / ninco[2]).unlink()
    shutil.rmtree(root / C / "texture")
    monkeypatch.setattr(openood, "ImageFileDataset", lambda *a, **k: pytest.fail("read before the check"))
    with pytest.raises(FileNotFoundError) as error:
        evaluation_sets("imagenet1k", data_root=root, subset_lists=lists)
    message = str(error.value)
    assert f"ninco: 2 of 3 images missing under {root / L} (first: {ninco[0]}, {ninco[2]})" in message
    assert f"textures: 3 of 3 images missing under {root / C} (first: {', '.join(textures)})" in message
    assert "ssb_hard" not in message and "id_test" not in message


def test_a_missing_root_folder_or_list_is_named(tree, tmp_path):
    root, lists = copy_tree(tree, tmp_path)
    with pytest.raises(FileNotFoundError, match=f"data root {tmp_path / 'nowhere'} does not exist"):
        evaluation_sets("imagenet1k", data_root=tmp_path / "nowhere", subset_lists=lists)
    with pytest.raises(FileNotFoundError, match=r"set 'ninco' .* no data_root and no set_roots\['ninco'\]"):
        evaluation_sets("imagenet1k", ["ninco"], subset_lists={"ninco": lists["ninco"]})
    with pytest.raises(FileNotFoundError, match=f"its root {tmp_path / 'NINCO'} \\(set_roots\\) does not exist"):
        evaluation_sets("imagenet1k", ["ninco"], set_roots={"ninco": tmp_path / "NINCO"})
    shutil.rmtree(root / C)
    with pytest.raises(FileNotFoundError, match=f"set 'textures' .* the folder {root / C} does not exist"):
        evaluation_sets("imagenet1k", ["textures"], data_root=root)
    with pytest.raises(FileNotFoundError, match="imagenet_es.*is not shipped"):
        evaluation_sets("imagenet1k", ["imagenet_es"], data_root=root)
    with pytest.raises(ValueError, match=r"set_roots names \['nico'\], which are not sets of the benchmark \['id_train'"):
        evaluation_sets("imagenet1k", ["id_test"], data_root=root, set_roots={"nico": root})


def test_a_set_root_replaces_the_first_folder_of_each_path(tree, tmp_path):
    root, lists = copy_tree(tree, tmp_path)
    shutil.move(root / L / "ninco", tmp_path / "NINCO")  # NINCO as distributed: its class folders
    shutil.move(root / L / "imagenet_1k", tmp_path / "ILSVRC2012")  # holding val/ILSVRC2012_val_*.JPEG
    found = evaluation_sets("imagenet1k", ["ninco", "id_test", "ssb_hard"], data_root=root, subset_lists=lists,
                            set_roots={"ninco": tmp_path / "NINCO", "id_test": tmp_path / "ILSVRC2012"})
    for name, folder in (("ninco", tmp_path / "NINCO"), ("id_test", tmp_path / "ILSVRC2012")):
        lines = [line.split(" ") for line in lists[name].read_text().splitlines()]
        dataset = found[name].dataset
        assert [dataset.path(i) for i in range(3)] == [str(folder / path.split("/", 1)[1]) for path, _ in lines]
        assert found[name].info["layout"] == "set_root" and found[name].info["root"] == str(folder)
        with Image.open(folder / lines[1][0].split("/", 1)[1]) as written:
            assert np.array_equal(np.asarray(dataset[1].image), np.asarray(written.convert("RGB")))
    assert found["ssb_hard"].dataset.root == str(root / L)  # the others keep OpenOOD's layout
    with pytest.raises(FileNotFoundError, match=f"ninco: 3 of 3 images missing under {root}"):
        evaluation_sets("imagenet1k", ["ninco"], data_root=tmp_path, set_roots={"ninco": root},
                        subset_lists={"ninco": lists["ninco"]})


def test_a_shard_set_of_the_data_folder_reads_as_the_folder(tree, tmp_path):
    root, lists = copy_tree(tree, tmp_path)
    with pytest.warns(NonImageFilesWarning, match="benchmark_imglist/imagenet/test_imagenet.txt"):  # lists left out
        rows = folder_rows(root)
    shards = write_shards(root, rows, tmp_path / "shards", source={"kind": "folder", "root": str(root)}, workers=1,
                          log=lambda message: None)
    chosen = ["id_test", "ninco", "textures"]
    from_folder = evaluation_sets("imagenet1k", chosen, data_root=root, subset_lists=lists)
    from_shards = evaluation_sets("imagenet1k", chosen, data_root=shards.root, subset_lists=lists)
    for name in chosen:
        assert from_shards[name].dataset.in_shards(0)
        assert from_shards[name].labels().tolist() == from_folder[name].labels().tolist()
        assert from_shards[name].fingerprint() == from_folder[name].fingerprint()
        assert np.array_equal(np.asarray(from_shards[name].dataset[2].image),
                              np.asarray(from_folder[name].dataset[2].image))
    # a published line whose image the shard set does not hold is counted like a missing file
    published = shipped_text("imagenet1k", "ninco").splitlines()
    absent = next(line for line in published if line not in lists["ninco"].read_text())
    more = tmp_path / "more.txt"
    more.write_text(lists["ninco"].read_text() + absent + "\n")
    with pytest.raises(FileNotFoundError, match=f"ninco: 1 of 4 images missing under {shards.root}/{L} "
                                                f"\\(first: {absent.split(' ')[0]}\\)"):
        resolve_images("imagenet1k", ["ninco"], data_root=shards.root, subset_lists={"ninco": more})


def test_the_whole_published_list_is_read_when_every_image_is_there(tmp_path):
    # CIFAR-100's OOD validation list (972 lines) written whole: no subset, the published hash recorded
    rows = read_list("cifar100", "ood_val")
    rng = np.random.default_rng(0)
    for path, _ in rows:
        target = tmp_path / C / path
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (2, 2, 3), dtype=np.uint8)).save(target)
    found = evaluation_sets("cifar100", ["ood_val"], data_root=tmp_path)["ood_val"]
    assert len(found) == 972 and found.role == "ood_val" and set(found.labels().tolist()) == {-2}
    assert found.info["subset"] is False and "subset_sha256" not in found.info
    assert found.info["list_sha256"] == BENCHMARKS["cifar100"].sets["ood_val"].sha256
    assert found.info["list_source"] == "package data datamodules/data/openood/cifar100/val_tin.txt.xz"


def test_the_published_leaderboard_is_shipped_with_its_hash_and_date():
    manifest = list(csv.DictReader(io.StringIO((DATA / "openood_leaderboard" / "manifest.csv").read_text())))
    assert sorted(LEADERBOARD) == sorted(["cifar10", "cifar100", "imagenet200_ood", "imagenet200_fsood",
                                          "imagenet1k_ood", "imagenet1k_fsood", "papers"])
    for row in manifest:
        data = (DATA / "openood_leaderboard" / row["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row["sha256"]
        table = read_leaderboard(row["file"].removesuffix(".csv"))
        assert len(table) == int(row["rows"]) == len(data.decode().splitlines()) - 1
        assert row["date"][:4] in ("2024", "2025") and len(row["commit"]) == 40
    msp = next(r for r in read_leaderboard("imagenet1k_ood") if r["Postprocessor"] == "MSP"
               and r["Training"] == "CrossEntropy" and r["Arch"] == "ResNet50")
    assert (msp["Near-OOD_AUROC"], msp["Far-OOD_AUROC"], msp["ID_Accuracy"]) == ("76.02", "85.23", "76.18")
    with pytest.raises(ValueError, match="no OpenOOD leaderboard table 'imagenet'"):
        read_leaderboard("imagenet")
