"""Generated sets on disk and the data of the generated benchmark (``datamodules.generated``, DESIGN.md §5.3):
per-index latent seeds, the validation of a set folder, real OOD sets and the resizing of every set."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from PIL import Image
from torch.utils.data import DataLoader, Subset

from datamodules.catalog import real_ood_set
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.generated import (
    MANIFEST_COLUMNS,
    GeneratedBenchmarkData,
    GeneratedDataset,
    IncompleteGeneratedSet,
    LatentSeeds,
)
from datamodules.images import NonImageFilesWarning, TensorImageDataset
from datamodules.sources import DEMO_KNOWN, load_fashion_mnist


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's cores are shared with other test runs
    yield
    torch.set_num_threads(threads)


def write_set(folder: Path, images: torch.Tensor, *, kind: str = "shift", rows: int | None = None,
              columns: tuple[str, ...] = MANIFEST_COLUMNS) -> Path:
    """A generated set folder as ``evaluate.py generate`` lays it out (PNG files left out: nothing reads them)."""
    folder.mkdir(parents=True)
    torch.save(images, folder / "images.pt")
    count = images.shape[0] if rows is None else rows
    with open(folder / "manifest.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for i in range(count):
            writer.writerow({"file": f"images/{i:06d}.png", "index": i, "seed": -1 if kind == "shift" else 7 + i,
                             "source_index": 10 + i if kind == "shift" else -1,
                             "source_label": (3 * i) % 4 if kind == "shift" else -1,
                             "ensemble_prediction": 0, "mi": 0.5, "lpips": 0.25, "generator_sha256": "ab" * 32})
    (folder / "info.json").write_text(json.dumps({"kind": kind, "generator": "g.ckpt", "count": count}))
    return folder


def uint8_images(count: int, channels: int = 1, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (count, channels, size, size), dtype=np.uint8))


@pytest.fixture(scope="module")
def fashion_folder() -> str:
    return FashionMNISTOpenSetDataModule()._folder()


# -- LatentSeeds --------------------------------------------------------------------------------------


def test_latent_seeds_are_per_index_whatever_the_slicing() -> None:
    seeds = LatentSeeds(10, 3)
    assert len(seeds) == 10
    expected = [(3 * 1_000_003 + i, i) for i in range(10)]
    assert [seeds[i] for i in range(10)] == expected
    for batch_size in (1, 3, 4, 10):
        batches = list(DataLoader(seeds, batch_size=batch_size))
        pairs = [(int(s), int(i)) for batch in batches for s, i in zip(*batch, strict=True)]
        assert pairs == expected
    # a slice (e.g. a rank's shard of a distributed sampler) holds the same seeds for the same indices
    shard = Subset(seeds, [1, 3, 5, 7, 9, 1])  # padded with a duplicate, as DistributedSampler does
    assert [shard[k] for k in range(6)] == [expected[i] for i in (1, 3, 5, 7, 9, 1)]
    # other base seeds give other per-image seeds
    assert {s for s, _ in expected}.isdisjoint({LatentSeeds(10, 4)[i][0] for i in range(10)})


def test_latent_of_an_image_does_not_depend_on_its_batch() -> None:
    from lightning_modules.generated.generators import NearOODGenerator

    generator = NearOODGenerator(lambda_perceptual=0, lambda_semantic=0, base_width=8, latent_dim=16)
    seeds = torch.tensor([LatentSeeds(6, 2)[i][0] for i in range(6)])
    together = generator.latent(seeds)
    alone = torch.cat([generator.latent(seeds[i: i + 1]) for i in range(6)])
    assert torch.equal(together, alone)
    assert torch.equal(together[4], torch.randn(16, generator=torch.Generator().manual_seed(int(seeds[4]))))
    assert not torch.equal(together[0], together[1])


@pytest.mark.parametrize("count", [0, -3])
def test_latent_seeds_need_a_positive_count(count: int) -> None:
    with pytest.raises(ValueError, match=f"positive, got {count}"):
        LatentSeeds(count, 0)


# -- GeneratedDataset ---------------------------------------------------------------------------------


def test_generated_dataset_reads_images_and_labels(tmp_path: Path) -> None:
    images = uint8_images(5)
    shift = GeneratedDataset(write_set(tmp_path / "shift", images))
    assert len(shift) == 5 and shift.info["kind"] == "shift"
    assert shift.labels.tolist() == [0, 3, 2, 1, 0]  # the source labels of the manifest
    sample = shift[3]
    assert sample.target == 1 and sample.index == 3
    assert torch.equal(sample.image, images[3].float() / 255)
    assert [row["source_index"] for row in shift.rows] == ["10", "11", "12", "13", "14"]
    near = GeneratedDataset(write_set(tmp_path / "near", images, kind="near_ood"))
    assert near.labels.tolist() == [-2] * 5  # unknown: near-OOD images have no known class


@pytest.mark.parametrize("missing", ["manifest.csv", "info.json", "images.pt"])
def test_generated_dataset_refuses_an_incomplete_folder(tmp_path: Path, missing: str) -> None:
    folder = write_set(tmp_path / "set", uint8_images(3))
    (folder / missing).unlink()
    with pytest.raises(IncompleteGeneratedSet, match=f"{re.escape(str(folder))} is not a complete.*{missing}"):
        GeneratedDataset(folder)
    assert issubclass(IncompleteGeneratedSet, FileNotFoundError)


def test_generated_dataset_refuses_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(IncompleteGeneratedSet, match=re.escape(str(tmp_path / "nowhere"))):
        GeneratedDataset(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("images", "message"),
    [
        (uint8_images(3).float() / 255, r"uint8 tensor, found Tensor torch.float32 \(3, 1, 32, 32\)"),
        (uint8_images(3)[:, 0], r"uint8 tensor, found Tensor torch.uint8 \(3, 32, 32\)"),
        ([1, 2, 3], "uint8 tensor, found list"),
    ],
)
def test_generated_dataset_refuses_wrong_images(tmp_path: Path, images: object, message: str) -> None:
    folder = write_set(tmp_path / "set", uint8_images(3))
    torch.save(images, folder / "images.pt")
    with pytest.raises(ValueError, match=message):
        GeneratedDataset(folder)


def test_generated_dataset_refuses_a_count_mismatch(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "set", uint8_images(4), rows=3)
    with pytest.raises(ValueError, match=f"{re.escape(str(folder))}: images.pt holds 4 images but manifest.csv 3"):
        GeneratedDataset(folder)


def test_generated_dataset_refuses_other_columns(tmp_path: Path) -> None:
    columns = tuple(c for c in MANIFEST_COLUMNS if c != "lpips")
    folder = write_set(tmp_path / "set", uint8_images(2), columns=columns)
    with pytest.raises(ValueError, match=r"manifest.csv: expected the columns .*'lpips'.*, got \['file'"):
        GeneratedDataset(folder)


# -- real OOD sets ---------------------------------------------------------------------------------------


def test_digits_are_the_1797_sklearn_images_labelled_unknown(fashion_folder: str) -> None:
    from sklearn.datasets import load_digits

    digits = real_ood_set("digits", data_dir=fashion_folder, known=DEMO_KNOWN)
    assert len(digits) == 1797
    assert digits.labels.tolist() == [-2] * 1797
    raw = torch.from_numpy(load_digits().images[100].astype(np.float32) / 16)[None, None]
    expected = F.interpolate(raw, size=(28, 28), mode="bilinear", align_corners=False)[0].clamp(0, 1)
    torch.testing.assert_close(digits[100].image, expected, rtol=0, atol=1e-6)


def test_fashion_unknown_is_the_official_test_images_of_classes_4_6_9(fashion_folder: str) -> None:
    unknown = real_ood_set("fashion:unknown", data_dir=fashion_folder, known=DEMO_KNOWN)
    images, classes = load_fashion_mnist(fashion_folder, "test")
    chosen = np.flatnonzero(np.isin(classes, (4, 6, 9)))
    assert len(unknown) == 3000 == chosen.size
    assert unknown.labels.tolist() == [-2] * 3000
    assert torch.equal(unknown.images[:, 0], torch.from_numpy(images[chosen]))
    assert torch.equal(unknown[2999].image, torch.tensor(images[chosen[-1]]).float()[None] / 255)
    classes_3 = real_ood_set("fashion:3", data_dir=fashion_folder, known=DEMO_KNOWN)
    assert torch.equal(classes_3.images[:, 0], torch.from_numpy(images[classes == 3]))


def test_a_known_class_is_refused_as_real_ood(fashion_folder: str) -> None:
    with pytest.raises(ValueError, match=r"'fashion:4,7,8' holds in-distribution classes \[7, 8\]"):
        real_ood_set("fashion:4,7,8", data_dir=fashion_folder, known=DEMO_KNOWN)


def test_an_image_folder_is_read_with_unknown_labels(tmp_path: Path, fashion_folder: str) -> None:
    rng = np.random.default_rng(1)
    pixels = {"a/one.png": rng.integers(0, 256, (6, 5, 3), dtype=np.uint8),
              "b/two.png": rng.integers(0, 256, (6, 5), dtype=np.uint8)}
    for name, array in pixels.items():
        (tmp_path / "ood" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(tmp_path / "ood" / name)
    (tmp_path / "ood" / "notes.txt").write_text("not an image")
    Image.fromarray(pixels["b/two.png"]).save(tmp_path / "ood" / "b" / "three.PGM")  # netpbm, upper case
    with pytest.warns(NonImageFilesWarning, match=r"ignored 1 file in .*ood that are not images .*: notes\.txt$"):
        folder = real_ood_set(str(tmp_path / "ood"), data_dir=fashion_folder, known=DEMO_KNOWN)
    assert [path for path, _ in folder.rows] == ["a/one.png", "b/three.PGM", "b/two.png"]
    assert folder.source_classes.tolist() == [0, 1, 1]
    first, second = folder[0], folder[2]
    assert (first.target, second.target) == (-2, -2)
    # raw images (an evaluation set: each model applies its own transform), decoded as RGB
    assert isinstance(first.image, Image.Image) and first.image.mode == "RGB"
    assert torch.equal(TF.to_tensor(first.image), torch.from_numpy(pixels["a/one.png"]).permute(2, 0, 1).float() / 255)
    # a grey-scale file is read as RGB (three equal channels)
    assert torch.equal(TF.to_tensor(second.image), torch.from_numpy(pixels["b/two.png"]).float().div(255).expand(3, -1, -1))


def test_a_missing_or_empty_folder_is_refused(tmp_path: Path, fashion_folder: str) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "absent"))):
        real_ood_set(str(tmp_path / "absent"), data_dir=fashion_folder, known=DEMO_KNOWN)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(tmp_path / 'empty'))} holds no"):
        real_ood_set(str(tmp_path / "empty"), data_dir=fashion_folder, known=DEMO_KNOWN)


# -- GeneratedBenchmarkData ------------------------------------------------------------------------------


def test_benchmark_data_names_roles_and_labels_every_set(tmp_path: Path) -> None:
    id_test = TensorImageDataset(uint8_images(4, size=28), torch.tensor([0, 1, 2, 3]))
    near = write_set(tmp_path / "near", uint8_images(3, seed=1), kind="near_ood")
    shift = write_set(tmp_path / "shift", uint8_images(2, seed=2))
    real = TensorImageDataset(uint8_images(5, channels=3, size=20), torch.full((5,), -2))
    data = GeneratedBenchmarkData(id_test, near_ood=[near], shift=[shift], real_ood={"rgb": real}, batch_size=2,
                                  classes=["a", "b", "c", "d"])
    assert data.kinds == {"id_test": "id", "near_ood:near": "near_ood", "shift:shift": "shift",
                          "real:rgb": "real_ood"}
    assert {s.name: s.role for s in data} == {"id_test": "id_test", "near_ood:near": "near_ood",
                                               "shift:shift": "shift", "real:rgb": "ood"}
    assert {name: len(s) for name, s in data.sets.items()} == {
        "id_test": 4, "near_ood:near": 3, "shift:shift": 2, "real:rgb": 5}
    # the sets keep their own sizes and channels: each model's input transform converts them
    assert data["real:rgb"].dataset[0].image.shape == (3, 20, 20) and data["id_test"].dataset[0].image.shape == (1, 28, 28)
    assert data["shift:shift"].labels().tolist() == [0, 3] and data["near_ood:near"].labels().tolist() == [-2] * 3
    assert data.info["near_ood:near"]["kind"] == "near_ood" and "id_test" not in data.info
    assert data.classes == ["a", "b", "c", "d"] and data.batch_size == 2


def test_benchmark_data_refuses_a_set_of_the_other_kind(tmp_path: Path) -> None:
    id_test = TensorImageDataset(uint8_images(2, size=28), torch.tensor([0, 1]))
    near = write_set(tmp_path / "near", uint8_images(3), kind="near_ood")
    with pytest.raises(ValueError, match=f"{re.escape(str(near))} is a near_ood set, given as shift"):
        GeneratedBenchmarkData(id_test, shift=[near])
    shift = write_set(tmp_path / "shift", uint8_images(3))
    with pytest.raises(ValueError, match="is a shift set, given as near_ood"):
        GeneratedBenchmarkData(id_test, near_ood=[shift])


# -- a manifest of another set, a set of other classes ----------------------------------------------------


def edit_manifest(folder: Path, row: int, **values: object) -> None:
    with open(folder / "manifest.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[row].update({k: str(v) for k, v in values.items()})
    with open(folder / "manifest.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(MANIFEST_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


def edit_info(folder: Path, **values: object) -> None:
    info = json.loads((folder / "info.json").read_text())
    (folder / "info.json").write_text(json.dumps({**info, **values}))


def test_manifest_integers_are_read_exactly(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "near", uint8_images(2), kind="near_ood")
    edit_manifest(folder, 1, seed=2**62 + 1)  # no float holds this: it must come back digit for digit
    assert int(GeneratedDataset(folder).rows[1]["seed"]) == 2**62 + 1
    edit_manifest(folder, 1, seed="1.7e7")
    with pytest.raises(ValueError, match=r"manifest.csv, row 1: seed must be an integer, got '1.7e7'"):
        GeneratedDataset(folder)


def test_a_manifest_of_another_generator_is_refused(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "shift", uint8_images(3))
    edit_info(folder, generator_sha256="ab" * 32)
    assert len(GeneratedDataset(folder)) == 3  # every row names the generator of info.json
    edit_manifest(folder, 2, generator_sha256="cd" * 32)
    with pytest.raises(ValueError, match=r"row 2: generated by cdcdcdcdcdcd\.\.\., but info.json names the generator "
                                         r"abababababab\.\.\.: the manifest belongs to another set"):
        GeneratedDataset(folder)


def test_a_shift_set_with_a_near_ood_manifest_is_refused(tmp_path: Path) -> None:
    # a near-OOD manifest (no sources, labels -1) under a shift set's info.json used to score accuracy 0.000
    near = write_set(tmp_path / "near", uint8_images(3), kind="near_ood")
    edit_info(near, kind="shift")
    with pytest.raises(ValueError, match=f"{re.escape(str(near / 'manifest.csv'))}, row 0: a shifted image needs its "
                                         r"source image and known-class label, got source_index -1 and source_label -1"):
        GeneratedDataset(near)
    shift = write_set(tmp_path / "shift", uint8_images(3))
    edit_info(shift, kind="near_ood")
    with pytest.raises(ValueError, match=r"row 0: a near-OOD image has no source image, got source_index 10"):
        GeneratedDataset(shift)
    other = write_set(tmp_path / "other", uint8_images(3))
    edit_info(other, classes=["a", "b"])  # labels 0, 3, 2: not of two classes
    with pytest.raises(ValueError, match=r"row 1: source_label 3 is not one of the set's 2 classes"):
        GeneratedDataset(other)


def test_rows_out_of_order_or_a_wrong_count_are_refused(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "set", uint8_images(3))
    edit_manifest(folder, 1, index=2)
    with pytest.raises(ValueError, match=r"row 1: index is 2, expected 1"):
        GeneratedDataset(folder)
    counted = write_set(tmp_path / "counted", uint8_images(3))
    edit_info(counted, count=4)
    with pytest.raises(ValueError, match=r"holds 3 rows but info.json counts 4 images"):
        GeneratedDataset(counted)


def test_a_set_of_other_classes_is_refused_naming_both_lists(tmp_path: Path) -> None:
    id_test = TensorImageDataset(uint8_images(2, size=28), torch.tensor([0, 1]))
    shift = write_set(tmp_path / "shift", uint8_images(3))
    edit_info(shift, classes=["a", "b", "c", "d"])
    data = GeneratedBenchmarkData(id_test, shift=[shift], classes=["a", "b", "c", "d"])
    assert data["shift:shift"].labels().tolist() == [0, 3, 2]
    with pytest.raises(ValueError, match=re.escape(f"{shift} was generated for the classes ['a', 'b', 'c', 'd'], but "
                                                   "the ID data have the classes ['a', 'b', 'd', 'c']")):
        GeneratedBenchmarkData(id_test, shift=[shift], classes=["a", "b", "d", "c"])
    unrecorded = write_set(tmp_path / "old", uint8_images(3))
    with pytest.warns(UserWarning, match="does not record the classes"):
        GeneratedBenchmarkData(id_test, shift=[unrecorded], classes=["a", "b", "c", "d"])


# -- real shifted sets --------------------------------------------------------------------------------------


def write_class_folders(root: Path, names: dict[str, int]) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    pixels: dict[str, list[np.ndarray]] = {}
    for name, count in names.items():
        for i in range(count):
            array = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
            path = root / name / ("deep" if i == 2 else "") / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(path)
            pixels.setdefault(name, []).append(array)
    return pixels


def test_real_shift_folders_are_labelled_with_the_known_classes(tmp_path: Path) -> None:
    from datamodules.generated import real_shift_set

    classes = ["T-shirt/top", "Trouser", "n01440764"]
    pixels = write_class_folders(tmp_path / "r", {"n01440764": 3, "t-shirt_top": 2, "Trouser": 1})
    (tmp_path / "r" / "Trouser" / "notes.txt").write_text("not an image")
    (tmp_path / "r" / "README.md").write_text("ImageNet-R, three classes")  # beside the class folders: no image
    with pytest.warns(NonImageFilesWarning, match=r"ignored 1 file in .*Trouser that are not images"):
        dataset = real_shift_set(tmp_path / "r", classes)
    # sorted folders: Trouser (exact), n01440764 (exact wnid), t-shirt_top (T-shirt/top up to case and punctuation)
    assert dataset.labels().tolist() == [1, 2, 2, 2, 0, 0]
    assert [path for path, _ in dataset.rows][:4] == ["Trouser/0.png", "n01440764/0.png", "n01440764/1.png",
                                                      "n01440764/deep/2.png"]
    assert torch.equal(TF.to_tensor(dataset[3].image), torch.from_numpy(pixels["n01440764"][2]).permute(2, 0, 1) / 255)
    assert dataset.transform is None and dataset.on_bad_image == "fail"
    assert real_shift_set(tmp_path / "r", classes, on_bad_image="skip").on_bad_image == "skip"


def test_real_shift_refuses_unknown_classes_and_loose_files(tmp_path: Path) -> None:
    from datamodules.generated import real_shift_set

    write_class_folders(tmp_path / "r", {"Trouser": 1, "Dress": 1})
    with pytest.raises(ValueError, match=re.escape(f"real shifted set {tmp_path / 'r'}: the class folder 'Dress' is "
                                                   "none of the known classes ['T-shirt/top', 'Trouser']")):
        real_shift_set(tmp_path / "r", ["T-shirt/top", "Trouser"])
    write_class_folders(tmp_path / "two", {"Trouser": 1, "trouser": 1})
    with pytest.raises(ValueError, match=r"the folders 'Trouser' and 'trouser' are both the class 'Trouser'"):
        real_shift_set(tmp_path / "two", ["Trouser"])
    write_class_folders(tmp_path / "loose", {"Trouser": 1})
    Image.fromarray(np.zeros((3, 3), dtype=np.uint8)).save(tmp_path / "loose" / "x.png")
    with pytest.raises(ValueError, match=r"files \['x.png'\] lie outside the class folders"):
        real_shift_set(tmp_path / "loose", ["Trouser"])
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "absent"))):
        real_shift_set(tmp_path / "absent", ["Trouser"])
    (tmp_path / "empty" / "Trouser").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="holds no image files"):
        real_shift_set(tmp_path / "empty", ["Trouser"])
