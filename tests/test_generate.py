"""``evaluate.py generate`` (DESIGN.md §5.3): a generated set is reproducible, every manifest value can be
recomputed from the generator, the ensemble and LPIPS, 2 processes write the same set as 1, and a set is
written whole or not at all."""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import evaluate
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.generated import MANIFEST_COLUMNS, GeneratedDataset, IncompleteGeneratedSet
from datamodules.sources import DEMO_KNOWN, load_fashion_mnist
from tests.conftest import train_demo_checkpoint

# No ImageNet weights on this machine: every generator and set here uses the random LPIPS backbone, asked for
# by name; its warning says so once per construction.
pytestmark = pytest.mark.filterwarnings(r"ignore:LPIPS\(alex, RANDOM backbone:UserWarning")

CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]
MEMBER_SIZE = 28  # the ensemble members' input (the demo's Fashion-MNIST size); the generators make 32 px


@functools.cache
def train_generators(root: str) -> dict[str, Path | list[Path]]:
    """Tiny ShiftGenerator and NearOODGenerator checkpoints (4 optimiser steps, 2 per network) with a 2-member
    ensemble of demo classifiers; cached per folder so the benchmark tests reuse them in the same session."""
    import pytorch_lightning as pl

    from lightning_modules.generated.generators import NearOODGenerator, ShiftGenerator

    if root in _TRAINED and all(Path(p).exists() for p in _flat(_TRAINED[root])):
        return _TRAINED[root]
    folder = Path(root)
    members = [train_demo_checkpoint(folder / f"member{seed}", "softmax", steps=3, seed=seed) for seed in range(2)]
    paths: dict[str, Path | list[Path]] = {"members": members}
    for kind, generator_class in (("shift", ShiftGenerator), ("near_ood", NearOODGenerator)):
        pl.seed_everything(0)
        data = FashionMNISTOpenSetDataModule(train_negatives="exclude", image_size=32, max_train_per_class=16,
                                             batch_size=8)
        # No ImageNet weights on this machine: the random LPIPS backbone is asked for by name (not a
        # perceptual distance; these tests check the plumbing and the arithmetic, not what LPIPS means).
        # members of 3 steps, far below any quality bar: allowed by name (the bar is tested on its own)
        model = generator_class(ensemble=[str(p) for p in members], lpips_net="alex", lpips_random_backbone=True,
                                base_width=8, allow_weak_ensemble=True)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
        trainer.fit(model, datamodule=data)
        paths[kind] = folder / f"{kind}.ckpt"
        trainer.save_checkpoint(paths[kind])  # on_save_checkpoint records model_class and datamodule_class
    _TRAINED[root] = paths
    return paths


_TRAINED: dict[str, dict[str, Path | list[Path]]] = {}  # the session's generators, by folder


def _flat(paths: dict[str, Path | list[Path]]) -> list[Path]:
    return [p for value in paths.values() for p in (value if isinstance(value, list) else [value])]


@pytest.fixture(scope="module")
def generators(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> dict:
    return train_generators(str(tmp_path_factory.getbasetemp() / "generators"))


def seeded_random_lpips() -> torch.nn.Module:
    """AlexNet LPIPS with the random backbone that ``evaluate.py`` builds (asked for by name: there are no
    ImageNet weights here): the backbone comes from seed 0, so it is the same network in every process."""
    from lightning_modules.nets.lpips import PerceptualDistance

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return PerceptualDistance("alex", random_backbone=True)


def generate(checkpoint: Path, output: Path, *options: str) -> Path:
    return evaluate.main(["generate", "--ckpt", str(checkpoint), "--output-dir", str(output), *options, *CLI])


def manifest(folder: Path) -> list[dict[str, str]]:
    with open(folder / "manifest.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == MANIFEST_COLUMNS
        return list(reader)


def column(rows: list[dict[str, str]], name: str, kind: type = int) -> list:
    return [kind(row[name]) for row in rows]


def pngs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "images").iterdir())}


def load_images(folder: Path) -> torch.Tensor:
    return torch.load(folder / "images.pt", weights_only=True)


def chosen_test_indices(count: int, seed: int) -> np.ndarray:
    """The test-set indices of the ``count`` in-distribution test images ``generate`` chooses with ``seed``,
    in the order of the choice: ``balanced_choice`` over the known test images' labels read from the IDX file."""
    from datamodules.images import balanced_choice

    _, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    known = np.flatnonzero(np.isin(classes, DEMO_KNOWN))
    labels = [DEMO_KNOWN.index(int(c)) for c in classes[known]]
    return known[balanced_choice(labels, count, seed).numpy()]


def known_test_images(count: int, size: int = 32, *, seed: int | None = None, indices: np.ndarray | None = None
                      ) -> tuple[np.ndarray, torch.Tensor, list[int]]:
    """In-distribution Fashion-MNIST test images read from the IDX files: the first ``count`` (or those
    ``generate`` chooses with ``seed``, in test-set order; or the test-set ``indices`` given), their test-set
    indices, the images in [0, 1] at ``size`` px and their labels (position in the known classes)."""
    images, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    if indices is None:
        indices = (np.flatnonzero(np.isin(classes, DEMO_KNOWN))[:count] if seed is None
                   else np.sort(chosen_test_indices(count, seed)))
    pixels = torch.from_numpy(images[indices].copy()).float().div(255).unsqueeze(1)
    if size != 28:
        pixels = F.interpolate(pixels, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return indices, pixels, [DEMO_KNOWN.index(int(c)) for c in classes[indices]]


def as_uint8(images: torch.Tensor) -> torch.Tensor:
    return torch.round(images.clamp(0, 1) * 255).to(torch.uint8)


def member_logits(members: list[Path], images: torch.Tensor) -> torch.Tensor:
    """``(M, N, C)`` logits of every member loaded on its own, on images resized to the members' input."""
    from lightning_modules.checkpoint import load_module
    from lightning_modules.open_set_classifier import OpenSetClassifier

    resized = F.interpolate(images, size=(MEMBER_SIZE, MEMBER_SIZE), mode="bilinear", align_corners=False,
                            antialias=True)
    with torch.no_grad():
        return torch.stack([load_module(p, expected=OpenSetClassifier).eval()(resized) for p in members])


# What ``generate`` computed and what a test recomputes pass through the networks in other batches (and the
# ensemble's channels-last members): equal to float32 rounding only, whose size depends on the CPU's kernels.
# Hence: images within one uint8 step (a float on a rounding edge), LPIPS and MI within a tolerance, and an
# ensemble prediction equal unless its two best classes are within float rounding of each other.
LPIPS_RTOL, LPIPS_ATOL = 1e-4, 1e-5
MI_RTOL, MI_ATOL = 1e-4, 1e-8  # MI is float64 from float32 logits: it moves by about (logit rounding) x (disagreement)
TIE_MARGIN = 1e-4  # of the mean probability


def assert_ensemble_predictions(predicted: list[int], logits: torch.Tensor) -> None:
    """``predicted`` (the manifest's ensemble predictions) is the argmax of the mean softmax of the ``(M, N, C)``
    recomputed ``logits``; where the two best classes lie within ``TIE_MARGIN``, either of them."""
    probabilities = torch.softmax(logits.double(), -1).mean(0)
    assert len(predicted) == probabilities.shape[0]
    chosen = probabilities[torch.arange(len(predicted)), torch.tensor(predicted)]
    best = probabilities.max(dim=1).values
    assert (chosen >= best - TIE_MARGIN).all(), (predicted, probabilities.argmax(1).tolist())


def assert_pngs_are_the_tensor(folder: Path, images: torch.Tensor) -> None:
    files = pngs(folder)
    assert list(files) == [f"{i:06d}.png" for i in range(images.shape[0])]
    for i, name in enumerate(files):
        decoded = np.asarray(Image.open(folder / "images" / name))
        assert np.array_equal(decoded, images[i, 0].numpy()), name


# -- reproducibility --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other_near_ood_images(generators: dict, tmp_path: Path) -> None:
    near = generators["near_ood"]
    options = ("--num", "5", "--batch-size", "2", "--reference", "4")
    first = generate(near, tmp_path / "first", *options, "--seed", "3")
    again = generate(near, tmp_path / "again", *options, "--seed", "3")
    other = generate(near, tmp_path / "other", *options, "--seed", "4")
    assert (first / "images.pt").read_bytes() == (again / "images.pt").read_bytes()
    assert (first / "manifest.csv").read_bytes() == (again / "manifest.csv").read_bytes()
    assert (first / "info.json").read_bytes() == (again / "info.json").read_bytes()
    assert pngs(first) == pngs(again) and len(pngs(first)) == 5
    # image i comes from the seed base * 1_000_003 + i, so another base changes every image
    assert column(manifest(first), "seed") == [3 * 1_000_003 + i for i in range(5)]
    assert column(manifest(other), "seed") == [4 * 1_000_003 + i for i in range(5)]
    differs = (load_images(first) != load_images(other)).flatten(1).any(dim=1)
    assert differs.tolist() == [True] * 5
    assert json.loads((other / "info.json").read_text())["seed"] == 4


@pytest.mark.slow
def test_shift_sources_are_a_seeded_class_balanced_choice(generators: dict, tmp_path: Path) -> None:
    from datamodules.images import BALANCED_RULE

    shift = generators["shift"]
    zero = generate(shift, tmp_path / "zero", "--num", "6", "--batch-size", "2", "--seed", "0")
    again = generate(shift, tmp_path / "again", "--num", "6", "--batch-size", "4", "--seed", "0")
    seven = generate(shift, tmp_path / "seven", "--num", "6", "--batch-size", "2", "--seed", "7")
    # eval mode (dropout off, running statistics): each shifted image is a function of its source alone, so
    # another batch size writes the same set; to float32 rounding only, since other images share the batch
    # through the convolutions (the bytes of a pixel on a rounding edge, the last digit of an MI, may differ on
    # some CPUs), whereas batch statistics or dropout would change the images by far more than one step
    assert (load_images(zero).int() - load_images(again).int()).abs().max() <= 1
    for first, second in zip(manifest(zero), manifest(again), strict=True):
        for key in ("file", "index", "seed", "source_index", "source_label", "generator_sha256"):
            assert first[key] == second[key], key
        assert float(first["lpips"]) == pytest.approx(float(second["lpips"]), rel=LPIPS_RTOL, abs=LPIPS_ATOL)
        assert float(first["mi"]) == pytest.approx(float(second["mi"]), rel=MI_RTOL, abs=MI_ATOL)
    from lightning_modules.checkpoint import load_module

    _, sources, _ = known_test_images(6, seed=0)
    with torch.no_grad():
        logits = member_logits(generators["members"], load_module(shift).eval().generator(sources))
    for folder in (zero, again):
        assert_ensemble_predictions(column(manifest(folder), "ensemble_prediction"), logits)
    assert list(pngs(zero)) == list(pngs(again))  # each PNG is its images.pt image (the manifest tests)
    assert column(manifest(zero), "seed") == [-1] * 6
    _, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    for folder, seed in ((zero, 0), (seven, 7)):
        rows = manifest(folder)
        sources = column(rows, "source_index")
        assert sources == sorted(chosen_test_indices(6, seed).tolist())  # written in test-set order
        # class-balanced over the 4 known classes: 6 images are 2, 2, 1, 1 -- never the first rows of a class
        labels = column(rows, "source_label")
        assert sorted(np.bincount(labels, minlength=4).tolist()) == [1, 1, 2, 2]
        assert labels == [DEMO_KNOWN.index(int(classes[i])) for i in sources]
        info = json.loads((folder / "info.json").read_text())
        assert info["source_choice"] == {"rule": BALANCED_RULE, "seed": seed} and info["reference_choice"] is None
    assert column(manifest(zero), "source_index") != column(manifest(seven), "source_index")
    # a source both seeds chose gets the same shifted image (to one uint8 step: batched with other sources)
    common = set(column(manifest(zero), "source_index")) & set(column(manifest(seven), "source_index"))
    for source in common:
        a = column(manifest(zero), "source_index").index(source)
        b = column(manifest(seven), "source_index").index(source)
        assert (load_images(zero)[a].int() - load_images(seven)[b].int()).abs().max() <= 1


# -- the manifest against independent recomputation -------------------------------------------------------


def test_shift_manifest_matches_sources_sha256_lpips_and_mi(generators: dict, tmp_path: Path) -> None:
    from lightning_modules.checkpoint import load_module
    from metrics.ensemble import mutual_information_from_logits

    checkpoint = generators["shift"]
    folder = generate(checkpoint, tmp_path / "shift", "--num", "6", "--batch-size", "4")
    rows, images = manifest(folder), load_images(folder)
    assert images.dtype == torch.uint8 and images.shape == (6, 1, 32, 32) and len(rows) == 6
    assert column(rows, "index") == list(range(6))
    assert column(rows, "file", str) == [f"images/{i:06d}.png" for i in range(6)]
    sha256 = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert column(rows, "generator_sha256", str) == [sha256] * 6
    info = json.loads((folder / "info.json").read_text())
    assert info["generator_sha256"] == sha256 and info["kind"] == "shift" and info["count"] == 6

    indices, sources, labels = known_test_images(6, seed=0)
    assert column(rows, "source_index") == indices.tolist()  # the chosen ID test images, in test-set order
    assert column(rows, "source_label") == labels
    module = load_module(checkpoint).eval()
    with torch.no_grad():
        shifted = module.generator(sources)
        lpips = seeded_random_lpips()(sources, shifted)
    assert (as_uint8(shifted).int() - images.int()).abs().max() <= 1  # rounding of equal floats aside
    np.testing.assert_allclose(column(rows, "lpips", float), lpips.numpy(), rtol=LPIPS_RTOL, atol=LPIPS_ATOL)
    logits = member_logits(generators["members"], shifted)
    mi = mutual_information_from_logits(logits)
    np.testing.assert_allclose(column(rows, "mi", float), mi.numpy(), rtol=MI_RTOL, atol=MI_ATOL)
    assert_ensemble_predictions(column(rows, "ensemble_prediction"), logits)
    assert_pngs_are_the_tensor(folder, images)
    dataset = GeneratedDataset(folder)
    assert dataset.labels.tolist() == labels and torch.equal(dataset.images, images)


def test_near_ood_manifest_matches_seeds_nearest_lpips_and_mi(generators: dict, tmp_path: Path) -> None:
    from lightning_modules.checkpoint import load_module
    from metrics.ensemble import mutual_information_from_logits

    checkpoint = generators["near_ood"]
    folder = generate(checkpoint, tmp_path / "near", "--num", "5", "--batch-size", "2", "--reference", "6",
                      "--seed", "2")
    rows, images = manifest(folder), load_images(folder)
    assert len(rows) == 5 and images.shape == (5, 1, 32, 32)
    sha256 = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert column(rows, "generator_sha256", str) == [sha256] * 5
    assert column(rows, "source_index") == [-1] * 5 and column(rows, "source_label") == [-1] * 5
    seeds = [2 * 1_000_003 + i for i in range(5)]
    assert column(rows, "seed") == seeds

    module = load_module(checkpoint).eval()
    latents = torch.stack([torch.randn(module.latent_dim, generator=torch.Generator().manual_seed(s)) for s in seeds])
    _, references, _ = known_test_images(6, seed=2)  # the reference images: the seeded class-balanced choice
    lpips = seeded_random_lpips()
    with torch.no_grad():
        generated = module.generator(latents)
        # brute force: every (image, reference) pair through LPIPS' own forward, then the nearest
        pairs = torch.stack([lpips(generated, r.expand_as(generated)) for r in references], dim=1)
    assert (as_uint8(generated).int() - images.int()).abs().max() <= 1
    np.testing.assert_allclose(column(rows, "lpips", float), pairs.min(dim=1).values.numpy(), rtol=LPIPS_RTOL,
                               atol=LPIPS_ATOL)
    logits = member_logits(generators["members"], generated)
    np.testing.assert_allclose(column(rows, "mi", float), mutual_information_from_logits(logits).numpy(),
                               rtol=MI_RTOL, atol=MI_ATOL)
    assert_ensemble_predictions(column(rows, "ensemble_prediction"), logits)
    assert_pngs_are_the_tensor(folder, images)
    info = json.loads((folder / "info.json").read_text())
    assert info["kind"] == "near_ood" and info["reference_images"] == 6
    assert info["reference_choice"]["seed"] == 2 and info["source_choice"] is None
    assert info["ensemble"] == [str(p) for p in generators["members"]]
    assert GeneratedDataset(folder).labels.tolist() == [-2] * 5


# -- whole or not at all ---------------------------------------------------------------------------------


def failing_png_writer(monkeypatch: pytest.MonkeyPatch, after: int) -> list[str]:
    """Make PIL's ``Image.save`` fail (a full disk) after ``after`` files; returns the paths it wrote."""
    written: list[str] = []
    save = Image.Image.save

    def flaky_save(self: Image.Image, fp: object, *args: object, **kwargs: object) -> None:
        if len(written) == after:
            raise OSError("No space left on device (simulated)")
        written.append(str(fp))
        save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", flaky_save)
    return written


def test_an_interrupted_generation_leaves_no_set(generators: dict, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tmp_path / "sets"
    folder = parent / "shift"
    written = failing_png_writer(monkeypatch, after=3)
    with pytest.raises(SystemExit, match="No space left"):  # the error, without a traceback
        generate(generators["shift"], folder, "--num", "6", "--batch-size", "4")
    monkeypatch.undo()
    # the PNG files went into a staging folder `.shift.*` next to the set, which is gone again
    assert len(written) == 3 and all(Path(p).parent.parent.name.startswith(".shift.") for p in written)
    assert not folder.exists()
    assert list(parent.iterdir()) == []
    with pytest.raises(IncompleteGeneratedSet, match=f"{re.escape(str(folder))} is not a complete generated set"):
        GeneratedDataset(folder)


@pytest.mark.slow
def test_an_existing_set_is_kept_until_overwrite_replaces_it_whole(generators: dict, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    near = generators["near_ood"]
    folder = tmp_path / "near"
    generate(near, folder, "--num", "7", "--reference", "4", "--seed", "0")
    before = {name: (folder / name).read_bytes() for name in ("images.pt", "manifest.csv", "info.json")}
    with pytest.raises(SystemExit, match=f"{re.escape(str(folder))}, which exists.*--overwrite"):
        generate(near, folder, "--num", "5", "--reference", "4", "--seed", "1")
    # an interrupted overwrite leaves the old set whole
    failing_png_writer(monkeypatch, after=2)
    with pytest.raises(SystemExit, match="No space left"):
        generate(near, folder, "--num", "5", "--reference", "4", "--seed", "1", "--overwrite")
    monkeypatch.undo()
    assert {name: (folder / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["near"]  # no staging folder left
    assert len(GeneratedDataset(folder)) == 7

    (folder / "stale.txt").write_text("from an older run")
    generate(near, folder, "--num", "5", "--reference", "4", "--seed", "1", "--overwrite")
    assert not (folder / "stale.txt").exists()
    assert list(pngs(folder)) == [f"{i:06d}.png" for i in range(5)]  # images 5 and 6 of the old set are gone
    assert column(manifest(folder), "seed") == [1_000_003 + i for i in range(5)]
    assert json.loads((folder / "info.json").read_text())["count"] == 5
    assert len(GeneratedDataset(folder)) == 5

    (folder / "manifest.csv").unlink()  # a set broken by hand is not taken as complete either
    with pytest.raises(IncompleteGeneratedSet, match=f"{re.escape(str(folder))}.*manifest.csv is missing"):
        GeneratedDataset(folder)


# -- bad inputs --------------------------------------------------------------------------------------------


def test_generate_refuses_a_classifier_checkpoint(generators: dict, tmp_path: Path) -> None:
    member = generators["members"][0]
    with pytest.raises(SystemExit, match="RegularisedGenerator") as raised:
        generate(member, tmp_path / "set", "--num", "2")
    message = str(raised.value)
    assert str(member) in message and "OpenSetClassifier" in message
    assert not (tmp_path / "set").exists()


def test_generate_refuses_a_missing_checkpoint_and_too_many_sources(generators: dict, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=f"checkpoint {re.escape(str(tmp_path / 'absent.ckpt'))} does not exist"):
        generate(tmp_path / "absent.ckpt", tmp_path / "set", "--num", "2")
    # the demo has 4000 in-distribution test images (1000 of each known class) to shift
    with pytest.raises(SystemExit, match="--num 4001: the data have only 4000 in-distribution test images"):
        generate(generators["shift"], tmp_path / "set", "--num", "4001")


@pytest.mark.parametrize("num", ["0", "-3"])
def test_generate_refuses_a_count_that_is_not_positive(generators: dict, tmp_path: Path, num: str) -> None:
    with pytest.raises(SystemExit, match=f"the number of images must be positive, got {num}"):
        generate(generators["near_ood"], tmp_path / "set", "--num", num)
    assert not (tmp_path / "set").exists()


def test_every_output_folder_is_checked_before_anything_is_generated(generators: dict, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(SystemExit, match=f"{re.escape(str(tmp_path / 'file'))} is a file"):
        evaluate.main(["generate", "--model", str(generators["near_ood"]), str(generators["shift"]), "--output-dir",
                       str(tmp_path / "first"), str(tmp_path / "file" / "second"), "--num", "2", *CLI])
    assert not (tmp_path / "first").exists()  # the first set was not generated either
    with pytest.raises(SystemExit, match="one output folder per generator: 2 checkpoints, 1 folders"):
        evaluate.main(["generate", "--model", str(generators["near_ood"]), str(generators["shift"]), "--output-dir",
                       str(tmp_path / "first"), "--num", "2", *CLI])
    # one folder for two generators: with --overwrite the second set silently replaced the first
    with pytest.raises(SystemExit, match=r"each generator needs its own output folder: \[.*first.*\] given more than once"):
        evaluate.main(["generate", "--model", str(generators["near_ood"]), str(generators["shift"]), "--output-dir",
                       str(tmp_path / "first"), str(tmp_path / "." / "first"), "--num", "2", "--overwrite", *CLI])
    assert not (tmp_path / "set").exists()


# -- exact integers, provenance, generation mode --------------------------------------------------------


@pytest.mark.parametrize("seed", [17, 2**40 + 5])
def test_manifest_integers_round_trip_exactly(generators: dict, tmp_path: Path, seed: int) -> None:
    # float32 would write 17000052 for each of 17000051 ... 17000054; 2**40 * 1_000_003 needs all 64 bits
    from lightning_modules.checkpoint import load_module

    folder = generate(generators["near_ood"], tmp_path / "near", "--num", "4", "--batch-size", "3", "--reference", "2",
                      "--seed", str(seed))
    seeds = [seed * 1_000_003 + i for i in range(4)]
    assert [row["seed"] for row in manifest(folder)] == [str(s) for s in seeds]
    assert [row["seed"] for row in GeneratedDataset(folder).rows] == [str(s) for s in seeds]
    assert json.loads((folder / "info.json").read_text())["seed"] == seed
    module = load_module(generators["near_ood"]).eval()
    latents = torch.stack([torch.randn(module.latent_dim, generator=torch.Generator().manual_seed(s)) for s in seeds])
    with torch.no_grad():
        assert (as_uint8(module.generator(latents)).int() - load_images(folder).int()).abs().max() <= 1


def test_a_seed_whose_image_seeds_overflow_64_bits_is_refused(generators: dict, tmp_path: Path) -> None:
    largest = (2**63 - 4) // 1_000_003
    with pytest.raises(SystemExit, match=f"seed {largest + 1}: .*0 <= seed <= {largest}"):
        generate(generators["near_ood"], tmp_path / "near", "--num", "4", "--seed", str(largest + 1))
    assert not (tmp_path / "near").exists()


def test_info_records_the_generators_training_and_the_generation(generators: dict, tmp_path: Path) -> None:
    for kind in ("shift", "near_ood"):
        checkpoint = torch.load(generators[kind], map_location="cpu", weights_only=False)
        hparams = checkpoint["hyper_parameters"]
        folder = generate(generators[kind], tmp_path / kind, "--num", "3", "--reference", "2")
        info = json.loads((folder / "info.json").read_text())
        assert info["classes"] == ["T-shirt/top", "Trouser", "Sneaker", "Bag"] and info["mode"] == "eval"
        training = info["training"]
        assert training["image_size"] == 32 == hparams["image_size"] and training["channels"] == 1
        for key in ("lambda_adversarial", "lambda_perceptual", "lambda_semantic", "regularise_every",
                    "adversarial_loss", "lpips_net"):
            assert training[key] == hparams[key], (kind, key)
        # 4 optimiser steps of Lightning's counter: 2 training steps of a D and a G update each
        assert training["optimizer_steps"] == checkpoint["global_step"] == 4 and training["training_steps"] == 2
        if kind == "shift":
            assert (training["lambda_l1"], training["discriminator"], training["pairing"]) == (10.0, "unconditional", None)
        else:
            assert (training["lambda_l1"], training["discriminator"], training["pairing"]) == (None, None, "random")
        members = generators["members"]
        assert [r["resolved"] for r in info["training_ensemble"]] == [str(Path(p).resolve()) for p in members]
        assert [r["sha256"] for r in info["training_ensemble"]] == [hashlib.sha256(Path(p).read_bytes()).hexdigest()
                                                                    for p in members]


@pytest.mark.slow
def test_pix2pix_mode_is_the_training_forward_with_the_batch_seed(generators: dict, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    import copy

    from callbacks.generated import mode_seed
    from lightning_modules.checkpoint import load_module

    checkpoint = generators["shift"]
    folder = generate(checkpoint, tmp_path / "pix2pix", "--num", "6", "--batch-size", "6", "--seed", "3",
                      "--mode", "pix2pix")
    plain = generate(checkpoint, tmp_path / "eval", "--num", "6", "--batch-size", "6", "--seed", "3")
    assert json.loads((folder / "info.json").read_text())["mode"] == "pix2pix"
    order = chosen_test_indices(6, 3)  # the batch: the sources in the order of the choice
    _, sources, _ = known_test_images(6, indices=order)
    generator = copy.deepcopy(load_module(checkpoint).generator).train()  # the training forward, by hand
    torch.manual_seed(mode_seed(3, int(order[0])))
    with torch.no_grad():
        shifted = generator(sources)
    written = as_uint8(shifted)[np.argsort(order)]  # the set is written in test-set order
    assert (written.int() - load_images(folder).int()).abs().max() <= 1
    assert not torch.equal(load_images(folder), load_images(plain))  # dropout and batch statistics do matter
    again = generate(checkpoint, tmp_path / "again", "--num", "6", "--batch-size", "6", "--seed", "3", "--mode",
                     "pix2pix")
    assert (again / "images.pt").read_bytes() == (folder / "images.pt").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit):  # jsonargparse names the option and its choices
        generate(checkpoint, tmp_path / "bad", "--num", "2", "--mode", "train")
    error = capsys.readouterr().err
    assert 'key "mode"' in error and "Got value: train" in error and "'pix2pix'" in error


@pytest.mark.slow  # three generations end to end; openset_common's staging helpers are tested in the default tier
def test_a_killed_generation_cleans_up_and_the_next_run_removes_what_a_kill_left(
        generators: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import os
    import signal
    import stat

    from openset_common.artefacts import staging_folder

    near, parent = generators["near_ood"], tmp_path / "sets"
    folder = parent / "near"
    save = Image.Image.save
    written: list[str] = []

    def interrupted_save(how: str):
        def flaky_save(self: Image.Image, fp: object, *args: object, **kwargs: object) -> None:
            if len(written) == 2:
                if how == "sigterm":  # `kill <pid>`, as a scheduler's time limit sends it
                    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                        raise AssertionError("SIGTERM would end the run here without removing its staging folder")
                    os.kill(os.getpid(), signal.SIGTERM)
                else:
                    raise KeyboardInterrupt  # Ctrl+C
            written.append(str(fp))
            save(self, fp, *args, **kwargs)
        return flaky_save

    for how in ("sigterm", "ctrl-c"):
        written.clear()
        monkeypatch.setattr(Image.Image, "save", interrupted_save(how))
        with pytest.raises(SystemExit):
            generate(near, folder, "--num", "5", "--reference", "4")
        monkeypatch.undo()
        assert len(written) == 2 and Path(written[0]).parent.parent.parent == parent
        assert not parent.exists() or list(parent.iterdir()) == []  # the staging folder went with the run
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was the writing's alone
    # a run killed outright (SIGKILL, a power cut) cannot clean up: the next run removes its staging folder
    child = os.fork()
    if child == 0:  # the killed run: makes its staging folder and ends without removing it
        staging_folder(parent, ".near.staging-")
        os._exit(0)
    os.waitpid(child, 0)
    (killed,) = list(parent.iterdir())
    alive = staging_folder(parent, ".near.staging-")  # a run still writing (this process): left alone
    umask = os.umask(0o027)  # a user whose files the group may read, others not
    try:
        generate(near, folder, "--num", "3", "--reference", "4")
    finally:
        os.umask(umask)
    assert f"removed the staging folder {killed} of a generation that did not finish" in capsys.readouterr().err
    assert sorted(parent.iterdir()) == sorted([folder, alive])
    assert len(GeneratedDataset(folder)) == 3
    # the set has the permissions of any new file of the user (the umask's), not mkdtemp's 0700 / mkstemp's 0600
    modes = {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}
    assert modes == {".": 0o750, "images": 0o750, **{f"images/{i:06d}.png": 0o640 for i in range(3)},
                     "images.pt": 0o640, "manifest.csv": 0o640, "info.json": 0o640, "grid.png": 0o640}
