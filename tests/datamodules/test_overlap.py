"""A fit set against the data a run evaluates on (datamodules.overlap): the same file (symlinks, hard links, shard
positions), the same bytes (copies: by size, head, then whole file), the same pixels (tensor sets), through
subsets and concatenations; files against tensors are not comparable, never "disjoint"."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Subset

from datamodules.evaluation import EvaluationSet, fit_folder_set
from datamodules.images import ImageFileDataset, TensorImageDataset
from datamodules.overlap import (
    EXAMPLES,
    HEAD_BYTES,
    SetImages,
    find_overlap,
    leaves,
    overlap_message,
    overlap_note,
)
from tests.conftest import make_imagenet_folder, write_jpeg

WNIDS = ["n01440764", "n01443537"]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """``train/<wnid>/`` 3 images and ``val/<wnid>/`` 2 images of 2 classes (tiny JPEGs of random pixels)."""
    return make_imagenet_folder(tmp_path / "ILSVRC2012", WNIDS, train=3, val=2)


def id_test(tree: Path) -> EvaluationSet:
    found = fit_folder_set(str(tree / "val"), WNIDS, name="id_test")
    return EvaluationSet("id_test", "id_test", found.dataset, info=found.info)


def relative(path: str, root: Path) -> str:
    return str(Path(path).relative_to(root))


def test_a_copy_of_the_test_folders_is_found_by_its_bytes_and_named_pair_by_pair(tree: Path, tmp_path: Path) -> None:
    shutil.copytree(tree / "val", tmp_path / "copy")
    test = id_test(tree)
    found = find_overlap(fit_folder_set(str(tmp_path / "copy"), WNIDS), test)
    assert found.count == 4 and found.hows == {"same file": 0, "same bytes": 4, "same pixels": 0}
    assert found.fit_indices.tolist() == [0, 1, 2, 3] and found.other_indices.tolist() == [0, 1, 2, 3]
    # each copy is paired with its original: the same relative path under both roots
    assert [(relative(a, tmp_path / "copy"), relative(b, tree / "val"), how) for a, b, how in found.examples] == \
        [(row, row, "same bytes") for row, _ in test.dataset.rows]
    assert (found.fit, found.other, found.fit_root, found.other_root) == ("fit", "id_test", str(tmp_path / "copy"),
                                                                          str(tree / "val"))
    message = overlap_message([found])
    assert "4 of its 4 images are images of id_test (role id_test" in message and "--allow-fit-overlap" in message
    assert f"{tmp_path / 'copy' / test.dataset.rows[0][0]} = {tree / 'val' / test.dataset.rows[0][0]}" in message
    assert overlap_note(found) == ("fit set 'fit' overlaps id_test: 4 of its 4 images are id_test images "
                                   "(allowed by --allow-fit-overlap)")
    # the training split: other images, nothing shared, and compared (not "not comparable")
    train = find_overlap(fit_folder_set(str(tree / "train"), WNIDS), test)
    assert train.count == 0 and train.comparable and train.examples == []


def test_symlinks_and_hard_links_are_the_same_file(tree: Path, tmp_path: Path) -> None:
    test = id_test(tree)
    folders = tmp_path / "folder-links"  # a folder of symlinks to the test folders (the second case)
    folders.mkdir()
    for wnid in WNIDS:
        os.symlink(tree / "val" / wnid, folders / wnid)
    files = tmp_path / "file-links"  # per file: a symlink for the first class, a hard link for the second
    for wnid in WNIDS:
        (files / wnid).mkdir(parents=True)
        for name in os.listdir(tree / "val" / wnid):
            (os.symlink if wnid == WNIDS[0] else os.link)(tree / "val" / wnid / name, files / wnid / name)
    for folder in (folders, files):
        found = find_overlap(fit_folder_set(str(folder), WNIDS), test)
        assert found.count == 4 and found.hows["same file"] == 4 and found.hows["same bytes"] == 0
        assert found.other_indices.tolist() == [0, 1, 2, 3]


def test_a_partial_overlap_counts_exactly_the_shared_images(tree: Path) -> None:
    test = id_test(tree)
    copied = {}  # fit row path -> the test row it copies: 3 of the 4 test images, under new names in train/
    for k, (row, _) in enumerate(test.dataset.rows[:3]):
        wnid = row.split("/")[0]
        target = tree / "train" / wnid / f"zz_copy_{k}.JPEG"
        shutil.copyfile(tree / "val" / row, target)
        copied[f"{wnid}/{target.name}"] = k
    fit = fit_folder_set(str(tree / "train"), WNIDS)
    found = find_overlap(fit, test)
    expected = sorted(i for i, (row, _) in enumerate(fit.dataset.rows) if row in copied)
    assert found.count == 3 and found.fit_indices.tolist() == expected and found.other_indices.tolist() == [0, 1, 2]
    assert found.summary().startswith("3 of its 9 images are images of id_test") and "3 of its 4 images" in found.summary()
    # a cap of the fit set counts the shared images it keeps
    assert found.within([0, expected[0], expected[1]]) == 2 and found.within(None) == 3


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_the_same_size_or_head_is_not_the_same_image_and_only_same_size_files_are_read(tmp_path: Path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    head = rng.bytes(HEAD_BYTES)
    fit_rows = {  # name -> bytes
        "a.png": rng.bytes(300),  # the size of a test file, other bytes
        "b.png": head + rng.bytes(900),  # the size and head of a test file, another tail
        "c.png": head + b"same tail" * 100,  # a copy of a test file longer than the head
        "d.png": rng.bytes(301),  # a size no test file has: never read
    }
    test_rows = {"x.png": rng.bytes(300), "y.png": head + rng.bytes(900), "z.png": head + b"same tail" * 100}
    for folder, rows in (("fit", fit_rows), ("test", test_rows)):
        for name, data in rows.items():
            write_bytes(tmp_path / folder / name, data)
    fit = EvaluationSet("fit", "fit", ImageFileDataset(str(tmp_path / "fit"), [(n, 0) for n in fit_rows]))
    test = EvaluationSet("ood", "ood", ImageFileDataset(str(tmp_path / "test"), [(n, -2) for n in test_rows]))
    reads: list[tuple[str, bool]] = []
    original = SetImages._read

    def counting(self, row, head):
        reads.append((self.name, int(row), head))
        return original(self, row, head)

    monkeypatch.setattr(SetImages, "_read", counting)
    found = find_overlap(fit, test)
    assert found.count == 1 and found.fit_indices.tolist() == [2] and found.other_indices.tolist() == [2]
    assert found.examples == [(str(tmp_path / "fit" / "c.png"), str(tmp_path / "test" / "z.png"), "same bytes")]
    # heads of the same-size files only (d.png never); whole files only where size and head agree
    assert sorted(r for r in reads if r[2]) == [("fit", 0, True), ("fit", 1, True), ("fit", 2, True),
                                                ("ood", 0, True), ("ood", 1, True), ("ood", 2, True)]
    assert sorted(r for r in reads if not r[2]) == [("fit", 1, False), ("fit", 2, False), ("ood", 1, False),
                                                    ("ood", 2, False)]


def test_tensor_sets_compare_pixels_through_subsets_and_concatenations(tree: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (10, 1, 4, 4), dtype=torch.uint8, generator=generator)
    fit = EvaluationSet("fit", "fit", Subset(TensorImageDataset(images, torch.arange(10) % 2), [1, 3, 5, 7, 9]))
    # the OOD set: two of the fit images stored as float (as the set yields them), after a file set and others
    other = TensorImageDataset(images[[7, 0, 3]].float().div(255), torch.full((3,), -2))
    files = id_test(tree).dataset
    ood = EvaluationSet("ood", "ood", ConcatDataset([files, Subset(other, [2, 1, 0])]))
    found = find_overlap(fit, ood)
    # fit positions 1 (image 3) and 3 (image 7); OOD positions 4 + 0 (image 3) and 4 + 2 (image 7)
    assert found.count == 2 and found.fit_indices.tolist() == [1, 3] and found.other_indices.tolist() == [4, 6]
    assert found.examples == [("fit[1]", "ood[4]", "same pixels"), ("fit[3]", "ood[6]", "same pixels")]
    assert "in memory (TensorImageDataset)" in found.other_root and str(tree / "val") in found.other_root
    # another shape of the same bytes is another image
    flat = TensorImageDataset(images[[3]].reshape(1, 1, 2, 8), torch.zeros(1))
    assert find_overlap(fit, EvaluationSet("ood", "ood", flat)).count == 0
    # files against tensors: not comparable, which is not "disjoint"
    apart = find_overlap(fit, id_test(tree))
    assert apart.count == 0 and not apart.comparable
    sets, of, position = leaves(ood.dataset)
    assert len(sets) == 2 and of.tolist() == [0, 0, 0, 0, 1, 1, 1] and position.tolist() == [0, 1, 2, 3, 2, 1, 0]


def test_rows_of_a_shard_set_are_compared_by_position_and_by_their_stored_bytes(tree: Path, tmp_path: Path) -> None:
    from datamodules.shards import folder_rows, write_shards

    shards = write_shards(tree, folder_rows(tree), tmp_path / "shards", source={"kind": "folder", "root": str(tree)},
                          workers=1, log=lambda message: None)
    test = id_test(tree)
    in_shards = EvaluationSet("id_test", "id_test", ImageFileDataset(str(Path(shards.root, "val")), test.dataset.rows))
    assert in_shards.dataset.in_shards(0)
    shutil.copytree(tree / "val", tmp_path / "copy")
    copy = find_overlap(fit_folder_set(str(tmp_path / "copy"), WNIDS), in_shards)
    assert copy.count == 4 and copy.hows["same bytes"] == 4 and copy.other_indices.tolist() == [0, 1, 2, 3]
    same = find_overlap(EvaluationSet("fit", "fit", ImageFileDataset(str(Path(shards.root, "val")),
                                                                     test.dataset.rows[2:])), in_shards)
    assert same.count == 2 and same.hows["same file"] == 2 and same.other_indices.tolist() == [2, 3]
    train = find_overlap(fit_folder_set(str(Path(shards.root, "train")), WNIDS), in_shards)
    assert train.count == 0 and train.comparable


def test_a_file_that_cannot_be_read_matches_nothing(tree: Path, tmp_path: Path) -> None:
    shutil.copytree(tree / "val", tmp_path / "copy")
    fit = fit_folder_set(str(tmp_path / "copy"), WNIDS)
    (tmp_path / "copy" / fit.dataset.rows[0][0]).unlink()
    write_jpeg(tmp_path / "copy" / "elsewhere.JPEG", np.random.default_rng(5))
    assert find_overlap(fit, id_test(tree)).fit_indices.tolist() == [1, 2, 3]


def test_an_error_names_at_most_the_first_few_pairs() -> None:
    images = torch.rand(12, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    fit = EvaluationSet("fit", "fit", TensorImageDataset(images, torch.zeros(12)))
    found = find_overlap(fit, EvaluationSet("id_test", "id_test", TensorImageDataset(images.flip(0), torch.zeros(12))))
    assert found.count == 12 and len(found.examples) == EXAMPLES
    assert found.examples[0] == ("fit[0]", "id_test[11]", "same pixels")
