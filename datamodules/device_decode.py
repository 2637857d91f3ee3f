"""JPEG decoding on the model's device, a batch at a time (optional: decoding in the CPU workers is the default).

The CPU path: a loader worker reads a file (or its bytes in a shard set), decodes it with PIL and runs the model's
input pipeline (``Resize -> CenterCrop -> ToTensor`` of :class:`datamodules.transforms.ModelInput`). The device
path: the workers only read the bytes; each batch is decoded at once by TorchCodec's ``decode_jpeg(list,
device=...)`` (one nvJPEG call on CUDA, libjpeg-turbo on the CPU; torchvision 0.29 deprecates its own decoders
for TorchCodec's) and the same steps run on the decoded ``uint8`` tensors on that device (:class:`TensorPipeline`:
torchvision's antialiased resize of tensors, the same crop, the scaling to ``[0, 1]``). The two agree to about 1/255 per pixel (``tests/datamodules/test_device_decode.py`` measures it
on the CPU; the resize kernels and the decoders round differently), so a set scored one way is cached apart
from the other (``ScoringPasses`` adds ``decode: device`` to the pass's key).

Only sets of JPEG files or shards (:class:`datamodules.images.ImageFileDataset`, also under ``Subset``) and
pipelines of those three steps can go to the device; :func:`device_decoding` answers ``None`` for anything
else, and the pass decodes on the CPU as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torchvision.transforms as T
from torch import Tensor
from torch.utils.data import Dataset, Subset
from torchcodec.decoders import decode_image, decode_jpeg
from torchvision.transforms import functional as F

from datamodules.batch import Sample
from datamodules.images import ImageFileDataset
from datamodules.transforms import ModelInput, PILPipeline

DECODERS = ("cpu", "device")


class EncodedBatch(NamedTuple):
    data: list[Tensor]  # each the bytes of one JPEG, uint8 (N_i,)
    targets: Tensor
    indices: Tensor
    skipped: Tensor


class EncodedSet(Dataset):
    """The files of an :class:`ImageFileDataset` (through ``Subset`` wrappers) as their bytes: samples whose
    ``image`` is a ``uint8`` tensor of the file's bytes, with the target and index the wrapped set gives."""

    def __init__(self, files: ImageFileDataset, positions: Sequence[int], length: int) -> None:
        self.files, self.positions, self.length = files, positions, length  # a range stays a range

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Sample:
        position = self.positions[index]
        data = self.files.guarded(position, self.files.encoded)  # a missing file: named, or skipped
        return Sample(None if data is None else torch.frombuffer(bytearray(data), dtype=torch.uint8),
                      self.files.rows[position][1], position)


def encoded_set(dataset: Dataset) -> EncodedSet | None:
    """:class:`EncodedSet` of a set of files without transforms (possibly under ``Subset``), else ``None``."""
    positions: list[int] | None = None
    length = len(dataset)  # type: ignore[arg-type]
    while isinstance(dataset, Subset):
        inner = list(dataset.indices)
        positions = inner if positions is None else [inner[p] for p in positions]
        dataset = dataset.dataset
    if not isinstance(dataset, ImageFileDataset) or dataset.transform is not None or dataset.target_transform:
        return None
    return EncodedSet(dataset, positions if positions is not None else range(len(dataset)), length)


def collate_encoded(samples: list[Sample]) -> EncodedBatch:
    readable = [s for s in samples if s.image is not None]
    return EncodedBatch([s.image for s in readable], torch.tensor([s.target for s in readable], dtype=torch.long),
                        torch.tensor([s.index for s in readable], dtype=torch.long),
                        torch.tensor([s.index for s in samples if s.image is None], dtype=torch.long))


class TensorPipeline:
    """A model input's ``Resize -> CenterCrop -> ToTensor`` (+ ``Normalize``) on decoded ``uint8`` tensors
    ``(C, H, W)``, on any device: :meth:`of` builds it from a :class:`ModelInput`, or answers ``None`` when the
    pipeline has another step (the CPU path then stays)."""

    def __init__(self, steps: list[Any], mode: str, model_input: ModelInput) -> None:
        self.steps, self.mode, self.model_input = steps, mode, model_input

    @classmethod
    def of(cls, model_input: ModelInput) -> TensorPipeline | None:
        pipeline = model_input.pipeline
        if not isinstance(pipeline, PILPipeline) or pipeline.mode not in ("RGB", "L"):
            return None
        steps = list(getattr(pipeline.transform, "transforms", [pipeline.transform]))
        if not steps or not isinstance(steps[-1], T.ToTensor):
            return None
        if not all(isinstance(step, (T.Resize, T.CenterCrop)) for step in steps[:-1]):
            return None
        return cls(steps[:-1], pipeline.mode, model_input)

    def __call__(self, image: Tensor) -> Tensor:
        """A decoded RGB ``uint8`` image ``(3, H, W)`` -> the model's input ``(C, h, w)``, float."""
        if self.mode == "L":  # PIL's convert("L") in its fixed point: ITU-R 601-2 luma, rounded
            weights = torch.tensor([19595, 38470, 7471], dtype=torch.int32, device=image.device).view(3, 1, 1)
            image = ((image.to(torch.int32) * weights).sum(0, keepdim=True) + 0x8000).bitwise_right_shift(16)
            image = image.to(torch.uint8)
        for step in self.steps:
            if isinstance(step, T.Resize):
                image = F.resize(image, step.size, interpolation=step.interpolation, max_size=step.max_size,
                                 antialias=True)
            else:
                image = F.center_crop(image, step.size)
        return self.model_input.normalise(image.float().div_(255).unsqueeze(0)).squeeze(0)


class DeviceDecoder:
    """Batches of JPEG bytes -> model inputs ``(B, C, h, w)`` on ``device``: decoded all at once, transformed
    there. A batch that does not decode as a whole is decoded image by image (a PNG among the JPEGs: decoded on
    the CPU and moved), and an image that does not decode at all is named, or skipped under
    ``on_bad_image="skip"``, as on the CPU path."""

    def __init__(self, encoded: EncodedSet, pipeline: TensorPipeline, device: torch.device | str) -> None:
        self.encoded, self.pipeline, self.device = encoded, pipeline, torch.device(device)

    def __call__(self, batch: EncodedBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(images, targets, indices, skipped)`` as :func:`datamodules.batch.unpack_batch` gives them."""
        if not batch.data:
            return torch.empty(0), batch.targets, batch.indices, batch.skipped
        try:
            images = decode_jpeg(batch.data, mode="RGB", device=self.device)
        except RuntimeError:
            images = [self.encoded.files.guarded(int(index), lambda _, data=data: self._one(data))
                      for data, index in zip(batch.data, batch.indices.tolist(), strict=True)]
        kept = [i for i, image in enumerate(images) if image is not None]
        if len(kept) < len(images):
            dropped = batch.indices[[i for i in range(len(images)) if images[i] is None]]
            batch = EncodedBatch([], batch.targets[kept], batch.indices[kept], torch.cat([batch.skipped, dropped]))
        if not kept:
            return torch.empty(0), batch.targets, batch.indices, batch.skipped
        inputs = torch.stack([self.pipeline(images[i].to(self.device)) for i in kept])
        return inputs, batch.targets, batch.indices, batch.skipped

    def _one(self, data: Tensor) -> Tensor:
        try:
            return decode_jpeg(data, mode="RGB", device=self.device)
        except RuntimeError:
            return decode_image(data, mode="RGB")


def device_decoding(dataset: Dataset, model_input: ModelInput, device: torch.device | str
                    ) -> tuple[EncodedSet, DeviceDecoder] | None:
    """The bytes of a set and their decoder on ``device``, or ``None`` where the device path does not apply (the
    set is not of files, or the model input has other steps than resize, crop and scaling)."""
    pipeline = TensorPipeline.of(model_input)
    encoded = encoded_set(dataset) if pipeline is not None else None
    if encoded is None or pipeline is None:
        return None
    return encoded, DeviceDecoder(encoded, pipeline, device)
