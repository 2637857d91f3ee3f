"""A deep ensemble (Lakshminarayanan, Pritzel, Blundell, NeurIPS 2017) of this project's classifiers.

Mukhoti et al. regularise their generators with the mutual information of a pre-trained deep ensemble
(DESIGN.md §5.3). The members are ordinary :class:`OpenSetClassifier` checkpoints of ``train.py``, trained
with different seeds (initialisation and data order; ``python train.py ensemble``), so every existing
evaluation works on each member. :class:`DeepEnsemble` loads M of them, frozen, and returns ``(M, N, C)``
logits in one call: members of identical architecture run as one batched forward (``torch.func``'s
``stack_module_state`` + ``functional_call`` under ``vmap``), not a Python loop over members. On the CPU
``vmap`` over convolutions is slower than running the members one after the other (about 2x for 5 demo
CNNs, ``benchmarks/RESULTS.md``), so ``batched=None`` (the default) takes ``vmap`` on accelerators and
the member loop on the CPU; ``batched=True`` / ``False`` forces one. Both give the same logits.

Inputs. :meth:`DeepEnsemble.forward` takes the members' own input, already normalised as their datamodule
normalised it: the evaluation engine (:class:`lightning_modules.scoring.ScoringModel`) applies the members'
:class:`~datamodules.transforms.ModelInput` first. :meth:`DeepEnsemble.unit_logits` takes images in
``[0, 1]`` (what a generator makes), resizes them to the members' input size and applies the members'
normalisation (``normalize``, ``mean``, ``std`` of their datamodule, recorded by :meth:`from_checkpoints`),
so the members see generated images as they saw their training images. Both give the same logits for the
same image; neither normalises twice.

The ensemble is a fixed scorer: its weights are non-persistent buffers (they never get gradients or
optimiser state and do not enter the checkpoint of a module that holds it; that module records the member
paths instead), and it stays in eval mode whatever ``train()`` is called with. Gradients flow to the
input images, which is what a generator trained against the ensemble's MI needs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state

from lightning_modules.checkpoint import CheckpointError, checkpoint_record, load_module, read_checkpoint
from lightning_modules.open_set_classifier import OpenSetClassifier

# datamodule arguments that decide the input a member sees: members must agree on them
TRANSFORM_ARGUMENTS = ("image_size", "resize_size", "crop_size", "normalize", "mean", "std", "in_channels")
# datamodule arguments that decide the classes (and their order) a member predicts
CLASS_ARGUMENTS = ("known", "protocol")


def member_paths(members: str | Path | Sequence[str | Path]) -> list[str]:
    """Member checkpoints from a list, a comma-separated string, or a members file (one path per line, as
    ``train.py ensemble`` writes ``ensemble.txt``). A members file's relative paths are relative to the
    file's folder, never to the current directory, so the file names the same members wherever it is read
    from."""
    if isinstance(members, (str, Path)):
        members = [members]
    members = [str(m) for m in members]
    if len(members) == 1 and not members[0].endswith(".ckpt") and "," not in members[0]:
        path = Path(members[0])
        if not path.is_file():
            raise FileNotFoundError(f"ensemble members file {path} does not exist (train.py ensemble writes it)")
        listed = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        if not listed:
            raise ValueError(f"ensemble members file {path} lists no checkpoint (one path per line)")
        return [str(Path(entry) if Path(entry).is_absolute() else path.parent / entry) for entry in listed]
    return [p for m in members for p in m.split(",") if p]


def _member_signature(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What must be equal across members: model hyper-parameters, classes and input transform."""
    model = checkpoint.get("hyper_parameters", {})
    data = checkpoint.get("datamodule_hyper_parameters", {})
    return {
        "model class": checkpoint.get("model_class"),
        "architecture": {k: model.get(k) for k in ("backbone", "backbone_args", "in_channels", "deep_feature_dim")},
        "classes": {"num_classes": model.get("num_classes"), "background": model.get("loss") == "bg",
                    **{k: _plain(data.get(k)) for k in CLASS_ARGUMENTS if k in data},
                    "datamodule": checkpoint.get("datamodule_class")},
        "transform": {k: _plain(data.get(k)) for k in TRANSFORM_ARGUMENTS if k in data},
    }


def member_normalisation(data: dict[str, Any], path: str | Path
                         ) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """``(mean, std)`` a member's datamodule normalised its ``[0, 1]`` images with (``(None, None)``: none),
    from the ``datamodule_hyper_parameters`` of its checkpoint (``normalize``, ``mean``, ``std``; the
    ImageNet-shaped datamodules subtract ``mean`` and divide by ``std`` after ``ToTensor``)."""
    if not data.get("normalize", False):
        return None, None
    if data.get("mean") is None or data.get("std") is None:
        raise CheckpointError(f"ensemble member {path}: its datamodule normalised its images (normalize: true) but "
                              f"the checkpoint records no mean/std (mean={data.get('mean')}, std={data.get('std')})")
    return tuple(float(m) for m in data["mean"]), tuple(float(s) for s in data["std"])


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (tuple, list)) else value


class _Logits(nn.Module):
    """An :class:`OpenSetNetwork` (which returns ``(logits, features)``) as a logits-only module."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: Tensor) -> Tensor:
        out = self.network(images)
        return out[0] if isinstance(out, tuple) else out


class DeepEnsemble(nn.Module):
    """M frozen classifiers of identical architecture; ``forward(images) -> (M, N, C)`` logits.

    Args:
        members: the member networks (each maps images to logits or to ``(logits, ...)``).
        background: whether the last logit is a background class (all members alike).
        num_classes: ``K``, the known classes.
        paths: the checkpoints the members came from (recorded for reports and for rebuilding).
        input_size: the side of the images the members were trained on (``None``: unknown), so that
            callers can resize other images to it.
        mean, std: the per-channel normalisation the members' datamodule applied to images in ``[0, 1]``
            (``None``: none), applied by :meth:`unit_logits`, never by :meth:`forward`.
        batched: ``True`` vmap, ``False`` the member loop, ``None`` vmap on accelerators, the loop on the CPU.

    Raises:
        ValueError: members of different architecture (parameter names or shapes differ); ``mean`` without
            ``std`` (or the reverse), of other lengths, or a ``std`` that is not positive.
    """

    def __init__(
        self, members: Sequence[nn.Module], *, background: bool = False, num_classes: int | None = None,
        paths: Sequence[str] = (), input_size: int | None = None, mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None, batched: bool | None = None,
    ) -> None:
        super().__init__()
        self.batched = batched
        if not members:
            raise ValueError("an ensemble needs at least one member")
        if (mean is None) != (std is None):
            raise ValueError(f"give the members' normalisation as both mean and std, got mean={mean}, std={std}")
        if mean is not None and std is not None:
            mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
            if len(mean) != len(std) or not mean or any(not s > 0 for s in std):
                raise ValueError(f"the members' normalisation needs one mean and one positive std per channel, got "
                                 f"mean={mean}, std={std}")
        self.mean: tuple[float, ...] | None = mean
        self.std: tuple[float, ...] | None = std
        wrapped = [_Logits(copy.deepcopy(m)).eval() for m in members]
        reference = {k: tuple(v.shape) for k, v in wrapped[0].state_dict().items()}
        for index, member in enumerate(wrapped[1:], start=1):
            shapes = {k: tuple(v.shape) for k, v in member.state_dict().items()}
            if shapes != reference or type(member.network) is not type(wrapped[0].network):
                differing = sorted(set(shapes.items()) ^ set(reference.items()))[:3]
                raise ValueError(
                    f"ensemble member {index} has another architecture than member 0 "
                    f"({type(member.network).__name__} vs {type(wrapped[0].network).__name__}; differing "
                    f"parameters: {differing}); a batched ensemble needs identical architectures"
                )
        self.num_members = len(wrapped)
        self.background = background
        self.num_classes = num_classes
        self.paths = [str(p) for p in paths]
        self.first_checkpoint: dict[str, Any] | None = None  # the first member's record (from_checkpoints)
        self.input_size = input_size
        params, buffers = stack_module_state(wrapped)
        self._names = {"params": sorted(params), "buffers": sorted(buffers)}
        # stacked weights as non-persistent buffers: moved by .to(), never trained, not in checkpoints
        self._slots: dict[str, str] = {}
        for kind, tensors in (("params", params), ("buffers", buffers)):
            for i, name in enumerate(sorted(tensors)):
                slot = f"_{kind}_{i}"
                self._slots[f"{kind}:{name}"] = slot
                self.register_buffer(slot, tensors[name].detach().clone(), persistent=False)
        self._base = [copy.deepcopy(wrapped[0]).to("meta")]  # a list: not a registered submodule
        self._cpu_members: tuple[tuple, list[nn.Module]] | None = None
        self.train(False)

    @classmethod
    def from_checkpoints(cls, paths: str | Path | Sequence[str | Path]) -> DeepEnsemble:
        """Load members from ``train.py`` checkpoints, refusing members that disagree on classes,
        architecture or input transform (the message names the first differing member and what differs)."""
        paths = [Path(p) for p in member_paths(paths)]
        if not paths:
            raise ValueError("give at least one member checkpoint")
        checkpoints = [read_checkpoint(p) for p in paths]
        reference = _member_signature(checkpoints[0])
        for path, checkpoint in zip(paths[1:], checkpoints[1:], strict=True):
            signature = _member_signature(checkpoint)
            for aspect in ("model class", "classes", "architecture", "transform"):
                if signature[aspect] != reference[aspect]:
                    raise CheckpointError(
                        f"ensemble member {path} disagrees with {paths[0]} on its {aspect}: "
                        f"{signature[aspect]} vs {reference[aspect]}"
                    )
        modules = [load_module(p, c, expected=OpenSetClassifier) for p, c in zip(paths, checkpoints, strict=True)]
        data = checkpoints[0].get("datamodule_hyper_parameters", {})
        input_size = data.get("image_size", data.get("crop_size"))
        mean, std = member_normalisation(data, paths[0])
        ensemble = cls([m.network for m in modules], background=bool(modules[0].background_class),
                       num_classes=modules[0].num_classes, paths=[str(p) for p in paths],
                       input_size=int(input_size) if input_size is not None else None, mean=mean, std=std)
        ensemble.first_checkpoint = checkpoint_record(checkpoints[0])  # its recipe and data: no second read
        return ensemble

    def _stacked(self, kind: str) -> dict[str, Tensor]:
        return {name: getattr(self, self._slots[f"{kind}:{name}"]) for name in self._names[kind]}

    def forward(self, images: Tensor) -> Tensor:
        """``(N, ...)`` images -> ``(M, N, C)`` logits: all members in one vmapped call (or, on the CPU unless
        ``batched=True``, one member after the other: faster there). The images are the members' own input,
        already normalised as their datamodule normalised it (the evaluation engine's ``ModelInput`` does it);
        images in ``[0, 1]`` go through :meth:`unit_logits`."""
        if self.batched is False or (self.batched is None and images.device.type == "cpu"):
            return torch.stack([member(images) for member in self._member_modules(images.device)])
        base = self._base[0]

        def member(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor) -> Tensor:
            return functional_call(base, (params, buffers), (x,))

        return torch.vmap(member, in_dims=(0, 0, None))(self._stacked("params"), self._stacked("buffers"), images)

    def unit_logits(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` images in ``[0, 1]`` -> ``(M, N, K)`` logits, the images seen as the members saw theirs.

        The images are resized to :attr:`input_size` (bilinear, antialiased; when it is known and differs),
        then normalised with the members' ``(x - mean) / std`` (when their datamodule normalised), then go
        through :meth:`forward`. Differentiable in the images.

        Raises:
            ValueError: not a 4-d batch, or a channel count the members' normalisation has no entry for.
        """
        if images.dim() != 4:
            raise ValueError(f"expected images (N, C, H, W) in [0, 1], got shape {tuple(images.shape)}")
        size = self.input_size
        if size is not None and tuple(images.shape[-2:]) != (size, size):
            images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        if self.mean is not None and self.std is not None:
            if len(self.mean) not in (1, images.shape[1]):
                raise ValueError(f"images with {images.shape[1]} channels, but the members' normalisation has "
                                 f"{len(self.mean)} (mean={self.mean}, std={self.std})")
            mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
            std = torch.tensor(self.std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
            images = (images - mean) / std
        return self(images)

    def _member_modules(self, device: torch.device) -> list[nn.Module]:
        """The members as frozen modules with their own weights (channels-last convolutions: oneDNN runs the
        demo's CNN about 1.6x faster with them and caches their reordered weights across calls), rebuilt
        from the stacked buffers whenever those move or change."""
        stacked = self._stacked("params")
        key = (str(device), tuple(t.data_ptr() for t in stacked.values()), tuple(t._version for t in stacked.values()))
        if self._cpu_members is None or self._cpu_members[0] != key:
            buffers = self._stacked("buffers")
            modules = []
            for index in range(self.num_members):
                module = copy.deepcopy(self._base[0]).to_empty(device=device)
                module.load_state_dict({**{k: v[index] for k, v in stacked.items()},
                                        **{k: v[index] for k, v in buffers.items()}})
                modules.append(module.to(memory_format=torch.channels_last).eval().requires_grad_(False))
            self._cpu_members = (key, modules)
        return self._cpu_members[1]

    def member_forward(self, index: int, images: Tensor) -> Tensor:
        """One member's logits ``(N, C)`` (for checks and per-member evaluation)."""
        params = {k: v[index] for k, v in self._stacked("params").items()}
        buffers = {k: v[index] for k, v in self._stacked("buffers").items()}
        return functional_call(self._base[0], (params, buffers), (images,))

    def train(self, mode: bool = True) -> DeepEnsemble:
        """Always eval mode: the ensemble is a fixed scorer (batch norm uses its running statistics)."""
        return super().train(False)

    def extra_repr(self) -> str:
        normalisation = f", mean={self.mean}, std={self.std}" if self.mean is not None else ""
        return f"members={self.num_members}, num_classes={self.num_classes}, background={self.background}{normalisation}"
