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
    Overlap,
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
    # files against tensors: compared (no file has the tensors' 4 x 4 size, so none is decoded)
    apart = find_overlap(fit, id_test(tree))
    assert apart.count == 0 and apart.comparable and apart.not_compared == ""
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


# -- files against tensors: PNG exports of the demo's in-memory test images ----------------------------------


def demo_test_images() -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's real test images ``(10000, 28, 28)`` uint8 and their classes (the demo's ID test and pool)."""
    from datamodules.sources import DEBIAN_FASHION_MNIST_DIR, load_fashion_mnist

    return load_fashion_mnist(DEBIAN_FASHION_MNIST_DIR, "test")


def export(path: Path, pixels: np.ndarray, mode: str = "L", **options) -> str:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).convert(mode).save(path, **options)
    return path.name


def test_png_exports_of_in_memory_test_images_are_found_by_their_pixels_and_a_jpeg_is_not(tmp_path: Path) -> None:
    from PIL import Image

    pixels, _ = demo_test_images()
    # the demo's sets: ID test images as uint8 tensors, pool images as float tensors (uint8 / 255)
    id_test = EvaluationSet("id_test", "id_test", TensorImageDataset(torch.from_numpy(pixels[:40].copy()).unsqueeze(1),
                                                                     torch.arange(40) % 4))
    pool = EvaluationSet("ood_test", "ood", TensorImageDataset(
        torch.from_numpy(pixels[100:110].copy()).unsqueeze(1).float() / 255, torch.full((10,), -2)))
    folder = tmp_path / "fit" / "T-shirt_top"
    rows = [  # (file, what it is)
        (export(folder / "a.png", pixels[5]), "id_test 5: a grey PNG"),
        (export(folder / "b.png", pixels[12], "RGB"), "id_test 12: an RGB PNG of the grey image"),
        (export(folder / "c.jpg", pixels[9], quality=95), "id_test 9: a JPEG (lossy: not found)"),
        (export(folder / "d.png", np.pad(pixels[7], 2)), "id_test 7 padded to 32 x 32: another size, not decoded"),
        (export(folder / "e.png", pixels[1000]), "another test image: no match"),
        (export(folder / "f.png", pixels[0]), "id_test 0"),
        (export(folder / "g.png", pixels[103]), "ood_test 3 (a float tensor image)"),
    ]
    fit_images = SetImages(EvaluationSet("fit", "fit", ImageFileDataset(str(tmp_path / "fit"), [
        (f"T-shirt_top/{name}", 0) for name, _ in rows])))
    found = find_overlap(fit_images, id_test)
    assert found.count == 3 and found.fit_indices.tolist() == [0, 1, 5] and found.other_indices.tolist() == [0, 5, 12]
    assert found.hows == {"same file": 0, "same bytes": 0, "same pixels": 3} and found.comparable
    assert found.examples == [(str(folder / "a.png"), "id_test[5]", "same pixels"),
                              (str(folder / "b.png"), "id_test[12]", "same pixels"),
                              (str(folder / "f.png"), "id_test[0]", "same pixels")]
    # the JPEG decodes to other pixels (it is the same picture: a lossy re-encode is not caught)
    decoded = np.asarray(Image.open(folder / "c.jpg").convert("L"))
    assert decoded.shape == (28, 28) and not np.array_equal(decoded, pixels[9])
    # headers read for every file, pixels decoded only for the 28 x 28 ones (the padded file: its size only)
    assert fit_images._dims.tolist() == [[28, 28]] * 3 + [[32, 32]] + [[28, 28]] * 3
    assert (fit_images._stages["pixels1"][1] == 1).tolist() == [True, True, True, False, True, True, True]
    # float tensor images compare by their uint8 values
    in_pool = find_overlap(fit_images, pool)
    assert (in_pool.fit_indices.tolist(), in_pool.other_indices.tolist()) == ([6], [3])
    # the other direction: in-memory fit images against an evaluation folder of their exports
    reverse = find_overlap(EvaluationSet("fit", "fit", id_test.dataset), EvaluationSet(
        "ood", "ood", ImageFileDataset(str(tmp_path / "fit"), [(f"T-shirt_top/{name}", -2) for name, _ in rows])))
    assert reverse.fit_indices.tolist() == [0, 5, 12] and reverse.other_indices.tolist() == [0, 1, 5]
    assert reverse.examples[0] == ("fit[0]", str(folder / "f.png"), "same pixels")


def test_what_cannot_be_compared_with_files_is_said_never_read_as_disjoint(tree: Path) -> None:
    files = id_test(tree)
    two_channels = EvaluationSet("ood", "ood", TensorImageDataset(torch.rand(3, 2, 8, 8), torch.full((3,), -2)))
    found = find_overlap(files, two_channels)
    assert not found.comparable and found.not_compared == (
        "3 tensor images of ood (shape (2, 8, 8)) against the files of id_test: only images of 1 or 3 channels are "
        "compared with decoded files")

    class Listed(torch.utils.data.Dataset):  # a data set of another kind: its images cannot be read by the check
        def __len__(self) -> int:
            return 2

    other = find_overlap(files, EvaluationSet("ood", "ood", ConcatDataset([Listed(), two_channels.dataset])))
    assert other.not_compared.startswith("2 images of ood are held by Listed, a data set the check cannot read")
    assert other.not_compared_warning().startswith(f"fit set 'id_test' ({tree / 'val'}) and ood (role ood, ")


# -- what cannot be read matches nothing ----------------------------------------------------------------------


def test_unreadable_files_of_the_same_row_and_size_in_two_sets_match_nothing(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    copy = rng.bytes(5000)
    for folder, other in (("fit", rng.bytes(600)), ("test", rng.bytes(600))):
        (tmp_path / folder / "broken.png").mkdir(parents=True)  # stat works, reading fails (IsADirectoryError)
        write_bytes(tmp_path / folder / "other.png", other)
        write_bytes(tmp_path / folder / "copy.png", copy)
    names = ["broken.png", "other.png", "copy.png"]
    fit = EvaluationSet("fit", "fit", ImageFileDataset(str(tmp_path / "fit"), [(n, 0) for n in names]))
    test = EvaluationSet("id_test", "id_test", ImageFileDataset(str(tmp_path / "test"), [(n, 0) for n in names]))
    assert os.stat(tmp_path / "fit" / "broken.png").st_size == os.stat(tmp_path / "test" / "broken.png").st_size
    images = SetImages(fit)
    found = find_overlap(images, test)
    # the copy only: the two unreadable rows (same row, same size) are no image, not the same one
    assert found.fit_indices.tolist() == [2] and found.other_indices.tolist() == [2]
    digests, readable = images.digests(np.arange(3), head=True)
    assert readable.tolist() == [False, True, True]


def test_a_shard_row_failing_its_digest_matches_nothing_and_the_check_goes_on(tree: Path, tmp_path: Path) -> None:
    from datamodules.shards import folder_rows, write_shards
    from tests.datamodules.test_shards import corrupt_stored_image

    shards = write_shards(tree, folder_rows(tree), tmp_path / "shards", source={"kind": "folder", "root": str(tree)},
                          workers=1, log=lambda message: None)
    test = id_test(tree)
    corrupt_stored_image(shards, tree / "val" / test.dataset.rows[1][0])
    in_shards = EvaluationSet("id_test", "id_test", ImageFileDataset(str(Path(shards.root, "val")), test.dataset.rows,
                                                                     on_bad_image="skip"))
    shutil.copytree(tree / "val", tmp_path / "copy")
    found = find_overlap(fit_folder_set(str(tmp_path / "copy"), WNIDS), in_shards)
    assert found.fit_indices.tolist() == [0, 2, 3] and found.other_indices.tolist() == [0, 2, 3]
    assert found.hows["same bytes"] == 3


def test_a_fit_folder_holding_the_validation_split_is_told_to_leave_fit_data_out() -> None:
    """EvG's ID validation images come from a checkpoint's train/ folder: given that whole folder as --fit-data, the
    advice is the road that works (the checkpoint's own training split), not "--fit-data ILSVRC2012/train"."""
    import numpy as np

    found = Overlap(fit="fit", other="id_val", other_role="id_val", fit_root="/data/mine/train",
                    other_root="/data/mine", fit_images=10, other_images=2, fit_indices=np.array([3, 7]),
                    other_indices=np.array([0, 1]), examples=[("train/cat/3.jpg", "train/cat/3.jpg", "same file")],
                    hows={"same file": 2})
    message = overlap_message([found])
    assert "leave --fit-data out to fit on the checkpoint's own training split, without them" in message
    found.other_role = "id_test"
    assert "leave --fit-data out" not in overlap_message([found])
