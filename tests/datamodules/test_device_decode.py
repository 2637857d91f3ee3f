"""Decoding on the model's device (datamodules.device_decode): the same model inputs as the CPU path to 1/255."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import Subset

from datamodules.device_decode import collate_encoded, device_decoding, encoded_set
from datamodules.images import ImageFileDataset, TensorImageDataset, UnreadableImageError
from datamodules.transforms import ModelInput, PILPipeline

IMAGENET = ModelInput(PILPipeline(T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()]), "RGB"),
                      (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), (224, 224), 3)
SMALL = ModelInput(PILPipeline(T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()]), "RGB"), size=(32, 32),
                   channels=3)
SQUARE = ModelInput(PILPipeline(T.Compose([T.Resize((40, 56)), T.ToTensor()]), "RGB"), size=(40, 56), channels=3)
GREY = ModelInput(PILPipeline(T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()]), "L"), size=(32, 32),
                  channels=1)


def photo_like(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth shapes with sensor-like noise: what JPEG is made for (pure noise would test the quantiser only)."""
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    waves = np.sin(x * rng.uniform(2, 12) + rng.uniform(0, 6)) * np.cos(y * rng.uniform(2, 12))
    image = 128 + waves[..., None] * rng.uniform(40, 110, 3) + rng.normal(0, 12, (height, width, 3))
    return image.clip(0, 255).astype(np.uint8)


def write_images(folder: Path, count: int = 16, *, seed: int = 0) -> list[tuple[str, int]]:
    """JPEGs of 64-160 px at qualities 60-95 (one greyscale file, one 4:4:4), and one PNG."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        pixels = photo_like(rng, int(rng.integers(64, 161)), int(rng.integers(64, 161)))
        image = Image.fromarray(pixels).convert("L") if i == 3 else Image.fromarray(pixels)
        name = f"img_{i}.png" if i == 5 else f"img_{i}.JPEG"
        image.save(folder / name, **({} if i == 5 else {"quality": int(rng.integers(60, 96)),
                                                        "subsampling": 0 if i == 7 else 2}))
        rows.append((name, i % 3))
    return rows


def cpu_and_device(dataset, model_input: ModelInput, *, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    encoded, decoder = device_decoding(dataset, model_input, device)
    cpu = torch.stack([model_input.transform()(dataset[i].image) for i in range(len(dataset))])
    images, targets, indices, skipped = decoder(collate_encoded([encoded[i] for i in range(len(encoded))]))
    assert targets.tolist() == dataset_targets(dataset) and indices.tolist() == list(range(len(dataset)))
    assert skipped.numel() == 0
    return cpu, images.cpu()


def dataset_targets(dataset) -> list[int]:
    return [dataset[i].target for i in range(len(dataset))]


def pixel_levels(cpu: torch.Tensor, device: torch.Tensor, model_input: ModelInput) -> torch.Tensor:
    """|CPU - device| in 1/255 steps of the [0, 1] pipeline output (the normalisation undone)."""
    std = torch.tensor(model_input.std or (1.0,) * cpu.shape[1]).view(1, -1, 1, 1)
    return (cpu - device).abs() * std * 255


@pytest.mark.parametrize("model_input", [IMAGENET, SMALL, SQUARE, GREY], ids=["imagenet", "small", "square", "grey"])
def test_the_device_path_gives_the_cpu_inputs_to_one_level(model_input, tmp_path):
    """PIL's decoder and resize against torchvision's decode_jpeg and tensor resize, on the CPU: no pixel of the
    model input differs by more than 1/255, and most are equal."""
    dataset = ImageFileDataset(str(tmp_path), write_images(tmp_path))
    cpu, device = cpu_and_device(dataset, model_input)
    assert cpu.shape == device.shape == (16, model_input.channels, *model_input.size)
    levels = pixel_levels(cpu, device, model_input)
    assert levels.max().item() <= 1 + 1e-3
    assert levels.mean().item() < 0.3  # measured 0.12-0.19 levels: rounding, not another image


def test_shards_give_the_bytes_of_the_files(tmp_path):
    from datamodules.shards import folder_rows, write_shards

    folder = tmp_path / "folder"
    rows = write_images(folder / "a", 6)
    shards = write_shards(folder, folder_rows(folder), tmp_path / "shards", source={"kind": "folder"}, workers=1,
                          part_size=4, log=lambda message: None)
    files = ImageFileDataset(str(folder), [(f"a/{name}", label) for name, label in rows])
    stored = ImageFileDataset(shards.root, files.rows)
    assert [stored.encoded(i) for i in range(6)] == [(folder / "a" / name).read_bytes() for name, _ in rows]
    first, second = (encoded_set(d) for d in (files, stored))
    assert all(torch.equal(first[i].image, second[i].image) for i in range(6))


def test_subsets_keep_their_indices_and_targets(tmp_path):
    dataset = ImageFileDataset(str(tmp_path), write_images(tmp_path, 8))
    nested = Subset(Subset(dataset, [7, 1, 2, 5, 6]), [4, 0, 2])
    encoded = encoded_set(nested)
    assert len(encoded) == 3
    assert [(s.target, s.index) for s in (encoded[i] for i in range(3))] == [
        (nested[i].target, nested[i].index) for i in range(3)] == [(0, 6), (1, 7), (2, 2)]


def test_what_cannot_go_to_the_device_stays_on_the_cpu(tmp_path):
    dataset = ImageFileDataset(str(tmp_path), write_images(tmp_path, 4))
    tensors = TensorImageDataset(torch.rand(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
    other_step = ModelInput(PILPipeline(T.Compose([T.Resize(36), T.RandomHorizontalFlip(), T.ToTensor()]), "RGB"))
    assert device_decoding(tensors, SMALL, "cpu") is None
    assert device_decoding(dataset, other_step, "cpu") is None
    assert device_decoding(ImageFileDataset(str(tmp_path), dataset.rows, transform=T.ToTensor()), SMALL, "cpu") is None
    assert device_decoding(dataset, SMALL, "cpu") is not None


def test_a_corrupt_image_is_named_or_skipped(tmp_path):
    rows = write_images(tmp_path, 6)
    (tmp_path / rows[2][0]).write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    encoded, decoder = device_decoding(ImageFileDataset(str(tmp_path), rows), SMALL, "cpu")
    batch = collate_encoded([encoded[i] for i in range(6)])
    with pytest.raises(UnreadableImageError, match=r"cannot read image .*img_2\.JPEG"):
        decoder(batch)
    encoded, decoder = device_decoding(ImageFileDataset(str(tmp_path), rows, on_bad_image="skip"), SMALL, "cpu")
    with pytest.warns(RuntimeWarning, match=r"skipping unreadable image .*img_2\.JPEG"):
        images, targets, indices, skipped = decoder(collate_encoded([encoded[i] for i in range(6)]))
    assert indices.tolist() == [0, 1, 3, 4, 5] and skipped.tolist() == [2] and images.shape[0] == 5
    (tmp_path / rows[4][0]).unlink()
    with pytest.raises(UnreadableImageError, match=r"cannot read image .*img_4\.JPEG"):
        encoded_set(ImageFileDataset(str(tmp_path), rows))[4]


def test_scoring_passes_decode_on_the_device_path(tmp_path):
    """The engine's pass with ``decode="device"``: the same samples in the same order, the logits of a small
    network within what one level of input gives, and cached apart from the CPU path's."""
    from datamodules.evaluation import EvaluationSet
    from evaluation_engine.scoring import ScoringPasses
    from lightning_modules.scoring import ScoringModel
    from tests.evaluation_engine.test_scoring import fake_runner

    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                  torch.nn.Linear(4, 3))
    model = ScoringModel(network, model_input=SMALL)
    files = EvaluationSet("files", "ood", ImageFileDataset(str(tmp_path / "images"), write_images(tmp_path / "images")))
    passes = {decode: ScoringPasses(tmp_path / "cache", decode=decode) for decode in ("cpu", "device")}
    outputs = {d: p.outputs(fake_runner(0, 1), model, files, batch_size=5) for d, p in passes.items()}
    assert torch.equal(outputs["cpu"]["targets"], outputs["device"]["targets"])
    torch.testing.assert_close(outputs["device"]["logits"], outputs["cpu"]["logits"], atol=2e-3, rtol=0)
    assert passes["cpu"].passes == passes["device"].passes == 1  # two cache entries, not one reused
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (nvJPEG)")
@pytest.mark.parametrize("model_input", [IMAGENET, SMALL], ids=["imagenet", "small"])
def test_nvjpeg_gives_the_cpu_inputs_to_one_level(model_input, tmp_path):
    dataset = ImageFileDataset(str(tmp_path), write_images(tmp_path))
    cpu, device = cpu_and_device(dataset, model_input, device="cuda")
    levels = pixel_levels(cpu, device, model_input)
    assert levels.max().item() <= 1 + 1e-3 and levels.mean().item() < 0.3


def test_a_command_whose_passes_cannot_decode_on_the_device_refuses_it():
    from evaluation_methods.open_set import OSCREvaluation
    from evaluation_methods.severity import SeverityEvaluation, SeverityPlot

    with pytest.raises(ValueError, match=r"evaluate\.py severity-plot decodes its images on the CPU \(--decode device "
                                         r"applies to the scoring passes of oscr, severity, generated, evg and report\)"):
        SeverityPlot(tables=["runs/severity.csv"], output="all.png", trainer={"decode": "device"})
    assert SeverityEvaluation(model="timm:resnet18", trainer={"decode": "device"}).options.decode == "device"
    # OSCR's protocol test set is one of the shared passes: it decodes where the others do (a card's sections agree)
    assert OSCREvaluation(model="runs/p1/best.ckpt", trainer={"decode": "device"}).options.decode == "device"
