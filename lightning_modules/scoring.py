"""``ScoringModel``: a fixed classifier to be evaluated by any method, from a name, a checkpoint or a module.

The model is any timm or torchvision ImageNet classifier (``timm:<name>``, ``torchvision:<name>``, weights
from the local cache, extra arguments such as ``drop_rate`` through ``model_args``), a checkpoint of this
project (``path/to/best.ckpt``: an :class:`OpenSetClassifier`), a deep ensemble (``ensemble:<members file>``
or ``ensemble:<a.ckpt>,<b.ckpt>``), or an ``nn.Module`` given from Python. ``forward`` returns the model's
full logits (``(M, N, C)`` for an ensemble); for a background-class checkpoint ``background_class`` is
``True`` and the last logit is the background class, which every κ and metric drops *after* the softmax
(DESIGN.md §3), never before.

Every model carries its :class:`~datamodules.transforms.ModelInput`, the transform from a raw evaluation
image to what it takes, so every method feeds it alike: a timm model's data configuration, a torchvision
model's weights preset, a checkpoint's own datamodule (:meth:`datamodules.OpenSetDataModule.model_input`).
A module given without one is refused (no PIL image ever reaches a network). It also carries the classes
it predicts (``classes``), so that data of other classes are refused by name, not by count.

The evaluation itself is done by the callbacks' ``evaluate`` (:mod:`evaluation_engine.scoring` runs the passes) in
the processes of an :class:`evaluation_engine.runner.Runner`.
"""

from __future__ import annotations

import inspect
from itertools import chain
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from torch import Tensor, nn

from datamodules.protocols import imagenet1k_wnids
from datamodules.transforms import ModelInput
from lightning_modules.checkpoint import (
    CheckpointError,
    checkpoint_record,
    datamodule_from_checkpoint,
    import_class,
    load_module,
    read_checkpoint,
)
from lightning_modules.nets.backbones import OpenSetNetwork, build_classifier
from lightning_modules.nets.ensemble import CLASS_ARGUMENTS, TRANSFORM_ARGUMENTS, DeepEnsemble
from lightning_modules.open_set_classifier import OpenSetClassifier
from openset_common.artefacts import tensors_fingerprint


def checkpoint_display_name(path: Path) -> str:
    """``runs/p1-eos/checkpoints/best.ckpt`` -> ``p1-eos-best``; other names -> their stem."""
    return path.stem if path.stem not in ("best", "last") else f"{path.parent.parent.name}-{path.stem}"


def head_width(network: nn.Module) -> int | None:
    """The number of logits of a timm (``num_classes``) or torchvision (its last ``Linear``) classifier."""
    width = getattr(network, "num_classes", None)
    if isinstance(width, int):
        return width
    linears = [m for m in network.modules() if isinstance(m, nn.Linear)]
    return linears[-1].out_features if linears else None


def imagenet_classes(num_classes: int | None) -> list[str] | None:
    """The ImageNet-1k wnids in the order of a 1000-class head (timm's synset list), else ``None``."""
    return imagenet1k_wnids() if num_classes == 1000 else None


def checkpoint_input(checkpoint: dict[str, Any], path: str | Path) -> tuple[ModelInput, list[str] | None]:
    """The model input and classes of a checkpoint of ``train.py``, from its own datamodule."""
    datamodule = datamodule_from_checkpoint(checkpoint, path)
    model_input = getattr(datamodule, "model_input", None)
    if not callable(model_input):
        raise CheckpointError(f"checkpoint {path}: its datamodule {type(datamodule).__name__} says nothing of the "
                              "model's input (no model_input()); give the model as a module with its ModelInput")
    classes = checkpoint.get("classes") or getattr(datamodule, "class_names", None)
    return model_input(), list(classes) if classes is not None else None


# what a checkpoint's hyper-parameters say of its network, its training objective and its training data
ARCHITECTURE_ARGUMENTS = ("backbone", "backbone_args", "in_channels", "deep_feature_dim")
LOSS_ARGUMENTS = ("loss", "negative_weight")
DATA_ARGUMENTS = (*CLASS_ARGUMENTS, "negative", "unknown", "train_negatives", *TRANSFORM_ARGUMENTS)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (tuple, list)) else value


def _class_path(recorded: str | None) -> str | None:
    """A recorded class path as the class's own module path (one class recorded under its public path, or under a
    module path of before a move, reads alike); as recorded where it does not import."""
    if recorded is None:
        return None
    try:
        recorded_class = import_class(recorded)
    except (ImportError, AttributeError, ValueError):
        return recorded
    return f"{recorded_class.__module__}.{recorded_class.__qualname__}"


def checkpoint_recipe(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint of ``train.py`` says of the recipe that trained it, read from its stored
    hyper-parameters (nothing run): its module's class path, its network (``backbone`` and its arguments), its
    training loss, its classes (the known classes in label order) and its data (the datamodule's class and the
    arguments that decide the classes, the negatives and the input). Paths, batch size, workers and the seeds
    are left out: runs of one recipe may differ in them."""
    model = checkpoint.get("hyper_parameters", {}) or {}
    data = checkpoint.get("datamodule_hyper_parameters", {}) or {}
    classes = checkpoint.get("classes")
    return {
        "model class": _class_path(checkpoint.get("model_class")),
        "architecture": {k: _plain(model.get(k)) for k in ARCHITECTURE_ARGUMENTS},
        "loss": {k: model.get(k) for k in LOSS_ARGUMENTS if k in model},
        "classes": list(classes) if classes is not None else {"num_classes": model.get("num_classes")},
        "data": {"datamodule": _class_path(checkpoint.get("datamodule_class")),
                 **{k: _plain(data.get(k)) for k in DATA_ARGUMENTS if k in data}},
    }


def load_scoring_network(
    model: str, *, pretrained: bool = True, pretrained_file: str | None = None, model_args: dict[str, Any] | None = None
) -> tuple[nn.Module, ModelInput, str, bool, list[str] | None]:
    """``(network, model input, display name, background_class, classes)`` for a model name or checkpoint."""
    network, model_input, name, background, classes, _, _ = load_scoring_recipe(
        model, pretrained=pretrained, pretrained_file=pretrained_file, model_args=model_args)
    return network, model_input, name, background, classes


def load_scoring_recipe(
    model: str, *, pretrained: bool = True, pretrained_file: str | None = None, model_args: dict[str, Any] | None = None
) -> tuple[nn.Module, ModelInput, str, bool, list[str] | None, dict[str, Any], dict[str, Any] | None]:
    """:func:`load_scoring_network`, the model's recipe: ``kind`` (``checkpoint``, ``ensemble``, ``timm``,
    ``torchvision``) and what the spec says of its architecture, classes and data (a checkpoint's:
    :func:`checkpoint_recipe`; an ensemble's: its number of members and its first member's recipe, the members
    agree on it; a timm/torchvision model's: its name and head), and the checkpoint's record
    (:func:`lightning_modules.checkpoint.checkpoint_record`, an ensemble's first member's; ``None`` for a timm or
    torchvision model), all from the checkpoints read once to build it."""
    if model.startswith("ensemble:"):
        if model_args:
            raise ValueError(f"model_args {sorted(model_args)} apply to timm/torchvision models, not to {model}")
        ensemble = DeepEnsemble.from_checkpoints(model.removeprefix("ensemble:"))
        checkpoint = ensemble.first_checkpoint
        model_input, classes = checkpoint_input(checkpoint, ensemble.paths[0])
        spec = model.removeprefix("ensemble:")
        if "," not in spec and not spec.endswith(".ckpt"):  # a members file: named by its folder (two ensembles
            name = f"ensemble{ensemble.num_members}-{Path(spec).parent.name or Path(spec).stem}"  # stay apart)
        else:
            name = f"ensemble{ensemble.num_members}-{checkpoint_display_name(Path(ensemble.paths[0]))}"
        recipe = {"kind": "ensemble", "members": ensemble.num_members, **checkpoint_recipe(checkpoint)}
        return ensemble, model_input, name, ensemble.background, classes, recipe, checkpoint
    if model.endswith(".ckpt"):
        if model_args:
            raise ValueError(f"model_args {sorted(model_args)} apply to timm/torchvision models, not to checkpoint {model}")
        checkpoint = read_checkpoint(model)
        module = load_module(model, checkpoint, expected=OpenSetClassifier,
                             hint="scoring needs a classifier of train.py (an OpenSetClassifier checkpoint)")
        model_input, classes = checkpoint_input(checkpoint, model)
        return (module, model_input, checkpoint_display_name(Path(model)), bool(module.background_class), classes,
                {"kind": "checkpoint", **checkpoint_recipe(checkpoint)}, checkpoint_record(checkpoint))
    network, transform = build_classifier(model, pretrained=pretrained, pretrained_file=pretrained_file,
                                          model_args=model_args)
    kind, _, name = model.partition(":")
    recipe = {"kind": kind, "architecture": {"name": name, **dict(model_args or {})},
              "classes": {"num_classes": head_width(network)}}
    return network, ModelInput.from_transform(transform, channels=3), name, False, \
        imagenet_classes(head_width(network)), recipe, None


def build_arguments(model: str, *, pretrained: bool = True, pretrained_file: str | None = None,
                    model_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a :class:`ScoringModel` of the spec ``model`` is built from besides the spec: another model is another
    build (``pretrained`` does not apply to a checkpoint or an ensemble, whose weights are their own)."""
    own_weights = model.startswith("ensemble:") or model.endswith(".ckpt")
    return {"pretrained": None if own_weights else bool(pretrained), "pretrained_file": pretrained_file,
            "model_args": dict(model_args or {})}


def weights_fingerprint(network: nn.Module) -> str:
    """sha256 over every parameter and buffer (non-persistent ones too, e.g. an ensemble's stacked weights):
    a cache made with other weights is never reused."""
    return tensors_fingerprint({**dict(network.named_parameters()), **dict(network.named_buffers())})


def penultimate_features(network: nn.Module, images: Tensor) -> Tensor:
    """Pre-logit features: an :class:`OpenSetClassifier`'s pooled backbone activations (see its ``features``), timm's
    ``forward_features``/``forward_head(pre_logits=True)`` interface, or a module's own ``features`` method
    (a method of its class, not a submodule called ``features`` as torchvision's VGG has)."""
    if isinstance(network, OpenSetClassifier):
        return network.features(images)
    if hasattr(network, "forward_features") and hasattr(network, "forward_head"):
        return network.forward_head(network.forward_features(images), pre_logits=True)
    if inspect.isfunction(getattr(type(network), "features", None)):
        return network.features(images)
    raise ValueError(f"{type(network).__name__} has no forward_features/forward_head: features need a timm model "
                     "or a classifier of this project")


def has_features(module: nn.Module) -> bool:
    """Whether :func:`penultimate_features` can give the module's features (without running it)."""
    network = getattr(module, "network", module) if isinstance(module, ScoringModel) else module
    if isinstance(network, DeepEnsemble):
        return False
    return isinstance(network, OpenSetClassifier) or (
        hasattr(network, "forward_features") and hasattr(network, "forward_head")) or inspect.isfunction(
        getattr(type(network), "features", None))


def classification_head(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """The linear head ``(W (C, D), b (C,) or None)`` that maps :func:`penultimate_features` to the logits, for
    the detectors that recompute logits from shaped features (ReAct, ASH, DICE, ViM, SCALE): for an
    :class:`OpenSetClassifier` the composition of its deep-feature layer ``Linear(F, D)`` and its logit layer
    ``Linear(D, K', bias=False)`` (both linear: exact), timm's ``get_classifier()``, else the module's
    last ``nn.Linear`` (torchvision's ``fc``). The fit pass checks that ``features @ W.T + b`` gives the logits.

    Raises:
        ValueError: the model has no linear head (an ensemble, a module without ``nn.Linear``, timm's
            identity classifier).
    """
    network = getattr(module, "network", module) if isinstance(module, pl.LightningModule) else module
    if isinstance(network, OpenSetClassifier):
        network = network.network
    if isinstance(network, DeepEnsemble):
        raise ValueError("an ensemble has no single classification head: detectors that read the head score one model")
    if isinstance(network, OpenSetNetwork):  # Linear(F, D) then Linear(D, K'): one linear map of the features
        first, second = network.deep_features, network.logits
        weight = second.weight.detach() @ first.weight.detach()
        bias = second.weight.detach() @ first.bias.detach() if first.bias is not None else None
        if second.bias is not None:
            bias = second.bias.detach() if bias is None else bias + second.bias.detach()
        return weight, bias
    if callable(getattr(network, "get_classifier", None)):
        linear: Any = network.get_classifier()
    elif callable(getattr(network, "get_classifier", None)):
        linear = network.get_classifier()
    else:
        linears = [m for m in network.modules() if isinstance(m, nn.Linear)]
        linear = linears[-1] if linears else None
    if not isinstance(linear, nn.Linear):
        raise ValueError(f"{type(network).__name__} has no linear classification head (found "
                         f"{type(linear).__name__}): ReAct, ASH, DICE, ViM and SCALE need one")
    return linear.weight.detach(), None if linear.bias is None else linear.bias.detach()


def _timm_composed(network: nn.Module) -> bool:
    """A timm model, whose ``forward`` is ``forward_head(forward_features(x))`` (timm's contract for its models)."""
    return type(network).__module__.startswith("timm.") and hasattr(network, "forward_features") \
        and hasattr(network, "forward_head")


def _open_set_composed(network: nn.Module) -> bool:
    """An :class:`OpenSetClassifier` whose ``forward`` and ``features`` are its class's own (backbone, then two
    linear layers), not a subclass's."""
    kind = type(network)
    return isinstance(network, OpenSetClassifier) and isinstance(network.network, OpenSetNetwork) \
        and kind.forward is OpenSetClassifier.forward and kind.features is OpenSetClassifier.features \
        and type(network.network).forward is OpenSetNetwork.forward


def shares_features_pass(module: nn.Module) -> bool:
    """Whether one run of the network gives both its logits and its penultimate features (:func:`joint_outputs`);
    otherwise a pass that needs both runs it twice (a module with its own ``features`` method)."""
    network = module.network if isinstance(module, ScoringModel) else module
    return _open_set_composed(network) or _timm_composed(network)


def joint_outputs(network: nn.Module, images: Tensor) -> tuple[Tensor, Tensor]:
    """``(logits, features)`` of one run of a network whose forward is the composition of the two
    (:func:`shares_features_pass`): the trunk runs once and the cheap head twice, each exactly as the network's own
    ``forward`` and :func:`penultimate_features` compute them (the same operations on the same trunk output)."""
    if _open_set_composed(network):
        inner = network.network
        features = inner.backbone(images)
        return inner.logits(inner.deep_features(features)), features
    if _timm_composed(network):
        trunk = network.forward_features(images)
        return network.forward_head(trunk), network.forward_head(trunk, pre_logits=True)
    raise ValueError(f"{type(network).__name__}: its logits and features are separate runs (shares_features_pass)")


def forward_outputs(module: nn.Module, images: Tensor, *, features: bool = False) -> dict[str, Tensor]:
    """What one batch gives every κ: ``logits`` ``(N, C)`` (``(N, M, C)`` for an ensemble, which returns
    ``(M, N, C)``: per sample first, so passes gather them by sample) and, when asked, ``features``, from one run
    of the network where it gives both (:func:`shares_features_pass`), else from a second run."""
    if features and shares_features_pass(module):
        logits, penultimate = module.joint_outputs(images) if isinstance(module, ScoringModel) \
            else joint_outputs(module, images)
        return {"logits": logits, "features": penultimate}
    logits = module(images)
    out = {"logits": logits.transpose(0, 1) if logits.ndim == 3 else logits}
    if features:
        out["features"] = module.features(images) if hasattr(module, "features") else penultimate_features(module, images)
    return out


class ScoringModel(pl.LightningModule):
    """A fixed classifier for evaluation (see the module docstring).

    Args:
        model: ``timm:<name>``, ``torchvision:<name>``, a ``.ckpt`` of this project, ``ensemble:<members>``,
            or (from Python) an ``nn.Module`` that maps input batches to logits.
        pretrained: load pretrained weights from the local cache (timm/torchvision).
        pretrained_file: explicit weights file (timm).
        model_args: extra keyword arguments of ``timm.create_model`` / torchvision's builder, e.g.
            ``{"drop_rate": 0.2}`` for MC dropout on a timm ResNet.
        model_input: how the model takes images (required for a module; the others know theirs).
        name: how tables call the model (default: from the spec).
        classes: the classes of its logits, in order (default: from the spec; ``None``: unknown).
        background: the last logit of a module is a background class.

    It keeps ``recipe``, what its spec says of its kind, architecture, classes and data
    (:func:`load_scoring_recipe`): the report card compares the seeds of one model with it before any pass.
    """

    def __init__(
        self,
        model: str | nn.Module,
        pretrained: bool = True,
        pretrained_file: str | None = None,
        model_args: dict[str, Any] | None = None,
        *,
        model_input: ModelInput | None = None,
        name: str | None = None,
        classes: list[str] | None = None,
        background: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(model, nn.Module):
            if model_input is None:
                raise ValueError(f"a {type(model).__name__} given as a module needs its model_input (a "
                                 "datamodules.transforms.ModelInput: the transform from raw images to its input)")
            self.network, self.model_input = model, model_input
            self.display_name = name or type(model).__name__
            self.background_class = background or bool(getattr(model, "background_class", False))
            self.classes = list(classes) if classes is not None else None
            self.spec = f"module:{type(model).__name__}"
            self.recipe: dict[str, Any] = {"kind": "module",
                                           "model class": f"{type(model).__module__}.{type(model).__qualname__}"}
            self.checkpoint: dict[str, Any] | None = None
            self.build_arguments: dict[str, Any] = {}
        elif isinstance(model, str):
            self.network, found_input, found_name, self.background_class, found_classes, self.recipe, \
                self.checkpoint = load_scoring_recipe(model, pretrained=pretrained, pretrained_file=pretrained_file,
                                    model_args=model_args)
            self.model_input = model_input or found_input
            self.display_name = name or found_name
            self.build_arguments = build_arguments(model, pretrained=pretrained, pretrained_file=pretrained_file,
                                                   model_args=model_args)
            self.classes = list(classes) if classes is not None else found_classes
            self.spec = model
        else:
            raise TypeError(f"model must be a name, a checkpoint path or an nn.Module, got {type(model).__name__}")
        self.network.eval()
        self.forward_calls = 0  # batches the network saw (tests count passes with it)
        self._training_datamodule: pl.LightningDataModule | None = None

    @property
    def ensemble(self) -> bool:
        return isinstance(self.network, DeepEnsemble)

    @property
    def checkpoint_path(self) -> str | None:
        """The checkpoint of train.py the model comes from (an ensemble's first member), else ``None``."""
        if self.checkpoint is None:
            return None
        return self.network.paths[0] if self.ensemble else self.spec

    def training_datamodule(self, overrides: dict[str, Any] | None = None) -> pl.LightningDataModule | None:
        """The datamodule its checkpoint was trained on (an ensemble's first member's), with ``overrides``, built
        from the record kept when the model was built (the file is not read again); ``None`` for a timm,
        torchvision or in-memory model. Without overrides it is built once and kept."""
        if self.checkpoint is None:
            return None
        if overrides:
            return datamodule_from_checkpoint(self.checkpoint, self.checkpoint_path, overrides)
        if self._training_datamodule is None:
            self._training_datamodule = datamodule_from_checkpoint(self.checkpoint, self.checkpoint_path)
        return self._training_datamodule

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(N, C)`` (``(M, N, C)`` for an ensemble); ``C = K+1`` with the background class last."""
        self.forward_calls += 1
        return self.network(self._as_weights(images))

    def features(self, images: Tensor) -> Tensor:
        """Penultimate features ``(N, F)`` for feature-based κ."""
        return penultimate_features(self.network, self._as_weights(images))

    def joint_outputs(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits, features)`` of one run of the network (:func:`joint_outputs`; one batch the network saw)."""
        self.forward_calls += 1
        return joint_outputs(self.network, self._as_weights(images))

    def _as_weights(self, images: Tensor) -> Tensor:
        """Images in the weights' floating type: a ``*-true`` precision (``64-true``, ``bf16-true``) converts the
        weights, and the passes feed images outside Lightning's steps (mixed precision keeps float32 weights
        and autocasts, so nothing changes there)."""
        weight = next((t for t in chain(self.network.parameters(), self.network.buffers()) if t.is_floating_point()),
                      None)
        return images.to(weight.dtype) if weight is not None and images.is_floating_point() else images

    def outputs(self, images: Tensor, *, features: bool = False) -> dict[str, Tensor]:
        return forward_outputs(self, images, features=features)

    def fingerprint(self) -> str:
        return weights_fingerprint(self.network)

