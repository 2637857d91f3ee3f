"""Any pytorch-ood detector that scores a model's outputs, by its class name, as a :class:`Detector`.

``pood_detector("KNN", k=5)`` (or ``build_detector("pood:KNN", k=5)``) is a detector named ``pood:KNN`` whose
score is pytorch-ood's outlier score negated (higher = more in-distribution), as float64. What it reads
comes from the pytorch-ood class:

- a ``LogitsDetector`` (``predict_logits``: EnergyBased, GEN, MaxSoftmax, OpenMax, ...) reads ``logits``, the
  known columns of a background-class model; it is fitted on them (``fit_logits``) when it
  ``requires_fit``;
- a ``FeaturesDetector`` (``predict_features``: Mahalanobis, KNN, ViM, SHE, ...) reads ``features``, fitted
  with ``fit_features`` when it ``requires_fit``;
- a ``FeatureMapsDetector`` (ASH, ReAct, SCALE, VRA) reads the pooled ``features`` as ``B × D × 1 × 1`` maps,
  with an identity backbone;
- constructor arguments ``w``/``b`` (ViM, DICE) get the model's head, ``head`` a callable
  ``x ↦ x Wᵀ + b`` (SHE, fDBD, NCI, ..., the feature-map detectors): the detector then reads ``head`` too.
  A background-class model's head is cut to its known rows.

The other keyword arguments go to the pytorch-ood constructor (``model``/``encoder``/``backbone`` are
``None``/identity). Classes that score images through the model (ODIN, MCD, GradNorm, Gram,
MahalanobisODIN, ...) are refused: they need the network and its input gradients, not a model's outputs.
Tensors are handed over in torch's default dtype (float32 unless changed: pytorch-ood creates its own buffers
in it), on the caller's device.

The fitted pytorch-ood object is not a buffer. ``state_fingerprint`` stays meaningful all the same: at fit
the detector records ``fit_digest``, a sha256 of the fit tensors, as a buffer (the head and tensor arguments
are buffers too, the other arguments are hyperparameters). A fresh detector that loads a fitted
``state_dict`` has the digest but not the pytorch-ood object; if the class needs fit data, scoring it is
refused until it is fitted again (head-only classes rebuild from the head buffers).
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from metrics.detectors.base import Detector, DetectorNotFitted, chunk_rows, row_chunks

INJECTED = frozenset({"model", "encoder", "backbone", "head", "w", "b"})
"""Constructor arguments the wrapper supplies itself."""

NEEDS_SPATIAL_MAPS = frozenset({"RankFeat"})
"""Feature-map detectors whose score is degenerate on 1 × 1 maps (RankFeat removes the maps' rank-1 part,
all of a 1 × 1 map)."""

_CLASSES: dict[str, type[PoodDetector]] = {}


class _LinearHead(nn.Linear):
    """``x ↦ flatten(x) Wᵀ + b``: the head as the ``nn.Linear`` pytorch-ood detectors call (and read
    ``.weight`` of)."""

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        super().__init__(weight.shape[1], weight.shape[0], dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            self.weight.copy_(weight)
            self.bias.copy_(bias)
        self.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.flatten(1).to(self.weight.dtype))


def fit_digest(tensors: dict[str, Tensor]) -> bytes:
    """sha256 over the names, dtypes, shapes and bytes of the fit tensors, read chunk by chunk (no copy of the
    fit set: ``bytes`` of a 10 GB tensor would be one)."""
    hasher = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):
        hasher.update(f"{name}{tensor.dtype}{tuple(tensor.shape)}".encode())
        flat = tensor.detach().reshape(tensor.shape[0], -1) if tensor.ndim else tensor.detach().reshape(1, 1)
        for (chunk,) in row_chunks(flat, rows=chunk_rows(max(flat.shape[1], 1))):
            hasher.update(chunk.contiguous().cpu().view(torch.uint8).numpy())
    return hasher.digest()


def _identity(x: Tensor) -> Tensor:
    return x


def _representation(cls: type) -> str | None:
    from pytorch_ood.api import FeatureMapsDetector, FeaturesDetector, LogitsDetector

    for base, kind in ((LogitsDetector, "logits"), (FeaturesDetector, "features"),
                       (FeatureMapsDetector, "feature_maps")):
        if issubclass(cls, base):
            return kind
    return None


def _pood_classes() -> dict[str, type]:
    import pytorch_ood.detector as module

    return {name: getattr(module, name) for name in module.__all__ if inspect.isclass(getattr(module, name))}


def supported_classes() -> list[str]:
    """The pytorch-ood detector classes this wrapper takes by name."""
    return sorted(name for name, cls in _pood_classes().items()
                  if _representation(cls) is not None and name not in NEEDS_SPATIAL_MAPS)


def _describe(value: Any) -> Any:
    """A hyperparameter as it enters the fingerprint: stable across processes (no memory addresses)."""
    if isinstance(value, Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype} (a buffer)"
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}"
    return value


class PoodDetector(Detector):
    """Base of the per-class wrappers :func:`pood_detector_class` makes (see the module docstring)."""

    pood_class: ClassVar[type] = object
    representation: ClassVar[str] = "logits"
    uses_head: ClassVar[frozenset[str]] = frozenset()
    refuse_non_finite = True
    fitted_buffers = ("fit_digest",)

    def __init__(self, *, background: bool = False, **kwargs: Any) -> None:
        super().__init__(background=background)
        signature = inspect.signature(self.pood_class.__init__)
        parameters = {name: p for name, p in signature.parameters.items()
                      if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        open_keywords = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
        valid = sorted(set(parameters) - INJECTED)
        unknown = sorted(set(kwargs) - set(valid)) if not open_keywords else sorted(set(kwargs) & INJECTED)
        if unknown:
            raise ValueError(f"detector {self.name!r}: pytorch-ood's {self.pood_class.__name__} has no argument "
                             f"{unknown[0]!r} to set; it takes {valid}"
                             + (" (and keyword arguments it passes on)" if open_keywords else ""))
        missing = [name for name in valid if parameters[name].default is inspect.Parameter.empty
                   and name not in kwargs]
        if missing:
            raise ValueError(f"detector {self.name!r}: pytorch-ood's {self.pood_class.__name__} needs the argument "
                             f"{missing[0]!r} (it takes {valid})")
        self.defaults = {name: parameters[name].default for name in valid if name not in missing}
        self.kwargs = dict(kwargs)
        for name, value in kwargs.items():
            if isinstance(value, Tensor):
                self.register_buffer(f"argument_{name}", value.detach().clone())
        self._pood: Any = None
        # built once now on a stand-in head, so that pytorch-ood refuses invalid values before any pass
        self._built(torch.zeros(2, 2), torch.zeros(2))

    def hyperparameters(self) -> dict[str, Any]:
        return {name: _describe(value) for name, value in {**self.defaults, **self.kwargs}.items()}

    # ----------------------------------------------------------------- the pytorch-ood object
    def _built(self, weight: Tensor | None, bias: Tensor | None) -> Any:
        dtype = torch.get_default_dtype()
        head = None if weight is None else _LinearHead(weight.to(dtype), bias.to(dtype))
        arguments: dict[str, Any] = {}
        for name in inspect.signature(self.pood_class.__init__).parameters:
            if name in ("model", "encoder"):
                arguments[name] = None
            elif name == "backbone":
                arguments[name] = _identity
            elif name == "head":
                arguments[name] = head
            elif name == "w":
                arguments[name] = head.weight.detach()
            elif name == "b":
                arguments[name] = head.bias.detach()
        arguments.update({name: getattr(self, f"argument_{name}") if isinstance(value, Tensor) else value
                          for name, value in self.kwargs.items()})
        try:
            return self.pood_class(**arguments)
        except (AssertionError, TypeError, ValueError) as error:
            raise ValueError(f"detector {self.name!r}: pytorch-ood's {self.pood_class.__name__} refused the "
                             f"arguments {self.hyperparameters()}: {error or type(error).__name__}") from error

    def _known_head(self) -> tuple[Tensor | None, Tensor | None]:
        if not self.uses_head:
            return None, None
        weight, bias = self.head_weight, self.head_bias
        return (weight[:-1], bias[:-1]) if self.background else (weight, bias)

    def _as_input(self, outputs: dict[str, Tensor], key: str) -> Tensor:
        value = outputs[key]
        if key == "logits":
            value = self.known_logits(value)
        value = value.detach().to(torch.get_default_dtype())
        return value[:, :, None, None] if self.representation == "feature_maps" else value

    # ----------------------------------------------------------------- fit and score
    def _store_head(self, weight: Tensor, bias: Tensor | None) -> None:
        super()._store_head(weight, bias)
        if not self.fit_data:
            self._pood = self._built(*self._known_head())

    def _fit(self, data: dict[str, Tensor]) -> None:
        detector = self._built(*self._known_head())
        key = "logits" if self.representation == "logits" else "features"
        inputs, targets = self._as_input(data, key), data["targets"]
        method = {"logits": "fit_logits", "features": "fit_features", "feature_maps": "fit_feature_maps"}
        try:
            getattr(detector, method[self.representation])(inputs, targets)
        except (AssertionError, TypeError, ValueError) as error:
            raise ValueError(f"detector {self.name!r}: pytorch-ood's {self.pood_class.__name__} failed to fit: "
                             f"{error or type(error).__name__}") from error
        self.register_buffer("fit_digest", torch.tensor(list(fit_digest({key: data[key], "targets": targets})),
                                                        dtype=torch.uint8, device=targets.device))
        self._pood = detector

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        if self._pood is None:
            if self.fit_data:
                raise DetectorNotFitted(f"detector {self.name!r}: the fitted pytorch-ood {self.pood_class.__name__} "
                                        "is not part of a state_dict; fit it again on the fit data")
            self._pood = self._built(*self._known_head())
        key = "logits" if self.representation == "logits" else "features"
        method = getattr(self._pood, {"logits": "predict_logits", "features": "predict_features",
                                      "feature_maps": "predict_feature_maps"}[self.representation])
        scores = []
        for (chunk,) in row_chunks(outputs[key]):
            with torch.no_grad():
                scores.append(-torch.as_tensor(method(self._as_input({key: chunk}, key))).to(torch.float64).reshape(-1))
        return torch.cat(scores) if scores else torch.zeros(0, dtype=torch.float64)


def pood_detector_class(class_name: str) -> type[PoodDetector]:
    """The :class:`Detector` subclass wrapping pytorch-ood's detector ``class_name`` (one per class)."""
    if class_name in _CLASSES:
        return _CLASSES[class_name]
    classes = _pood_classes()
    supported = supported_classes()
    if class_name not in classes:
        raise ValueError(f"pytorch-ood has no detector class {class_name!r}; the supported ones: {supported}")
    cls = classes[class_name]
    if class_name in NEEDS_SPATIAL_MAPS:
        raise ValueError(f"pytorch-ood's {class_name} needs spatial feature maps (B x C x H x W); the model outputs "
                         "pooled features, on which it is degenerate: it is not supported by name")
    representation = _representation(cls)
    if representation is None:
        raise ValueError(f"pytorch-ood's {class_name} scores images through the model (it needs the network, "
                         "and for most its input gradients), not a model's outputs: it is not supported by name; "
                         f"the supported ones: {supported}")
    arguments = set(inspect.signature(cls.__init__).parameters)
    uses_head = frozenset(arguments & {"w", "b", "head"})
    if representation == "feature_maps":
        uses_head |= {"head"}
    inputs = {"logits"} if representation == "logits" else {"features"}
    if uses_head:
        inputs.add("head")
    wrapper = type(f"Pood{class_name}", (PoodDetector,), {
        "__doc__": f"pytorch-ood's ``{class_name}`` as a detector (see :mod:`metrics.detectors.pood`).",
        "__module__": __name__,
        "name": f"pood:{class_name}",
        "pood_class": cls,
        "representation": representation,
        "uses_head": uses_head,
        "inputs": frozenset(inputs),
        "fit_data": bool(getattr(cls, "requires_fit", False)),
        "background_rule": True,
    })
    _CLASSES[class_name] = wrapper
    return wrapper


def pood_detector(class_name: str, *, background: bool = False, **kwargs: Any) -> PoodDetector:
    """pytorch-ood's detector ``class_name`` with keyword arguments ``kwargs``, as a :class:`Detector`."""
    return pood_detector_class(class_name)(background=background, **kwargs)

