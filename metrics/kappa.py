"""Confidence functions κ: higher means more in-distribution, every κ returns shape ``(N,)``.

The κ of Galil, Dabbah, El-Yaniv (ICLR 2023), DESIGN.md §5.2:

    softmax     max_c softmax(z)_c                               (softmax response)
    max_logit   max_c z_c
    entropy     Σ_c p_c log p_c, p = softmax(z)                   (negative entropy)
    energy      T log Σ_c exp(z_c / T), T = 1                     (negative energy; pytorch-ood's EnergyBased)
    odin        max_c softmax(f(x̃)/T)_c, x̃ = x - ε sign(∇_x CE(f(x)/T, ŷ)), T = 2, ε = 1e-5
                (Liang, Li, Srikant, ICLR 2018; needs input gradients)
    mc_dropout  Σ_c p̄_c log p̄_c, p̄ = mean of 30 softmax passes with dropout active
                (Gal, Ghahramani, ICML 2016)

Deep-ensemble κ (Mukhoti et al., DESIGN.md §5.3; :mod:`metrics.ensemble`), on member logits ``(M, N, C)``:

    ensemble_mi       -MI = -(H(p̄) - mean_m H(p_m)),  p̄ = mean_m softmax(z_m)   (negative mutual information)
    ensemble_softmax  max_c p̄_c
    ensemble_entropy  Σ_c p̄_c log p̄_c                                            (negative predictive entropy)

Logit-based κ (``kind == "logits"``) take logits ``(N, C)``, so many κ can share one cached forward
pass; model-based κ (``kind == "model"``) take ``(model, images)``. :func:`from_pytorch_ood` turns any
pytorch-ood detector into a κ (its outlier score negated), so Energy, ViM, KNN, Mahalanobis ... work too.
Ensemble κ (``kind == "ensemble"``) take the ``(M, N, C)`` logits of M members (one batched forward of
``lightning_modules.nets.ensemble.DeepEnsemble``).

Background-class models (``background=True``, DESIGN.md §3–§4): the last logit is the background class.
The softmax runs over all ``K+1`` logits and the background column is dropped afterwards, exactly as in
OSCR and γ, so the model's rejection signal is kept (two known classes at 0.05 and ``p_bg = 0.9`` give
a softmax response of 0.05, not 0.5):

    softmax     max_{c<K} p_c,  p = softmax over K+1
    entropy     Σ_{c<K} p'_c log p'_c,  p'_c = p_c + p_bg / K: the background mass means "none of the known
                classes" and is spread uniformly over them (the EOS target for negatives), so p_bg = 1 gives
                the minimum -log K, as a uniform prediction does (the plain Σ_{c<K} p_c log p_c would instead
                tend to its maximum 0 as p_bg -> 1)
    mc_dropout  the same on the mean of the softmax passes
    ensemble_*  each member's softmax over K+1, background mass spread as for entropy (ensemble_softmax:
                the background column of the mean dropped, as for softmax)
    odin        ŷ = argmax over the known columns, softmax over K+1, max over the known columns
    max_logit, energy   computed on the K known logits (logit-space scores have no softmax to keep)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metrics.detectors.base import Detector
from metrics.ensemble import ensemble_entropy, ensemble_mi, ensemble_softmax
from openset_common import known_columns, spread_background_mass

KappaKind = Literal["logits", "features", "model", "ensemble"]


@dataclass(frozen=True)
class Kappa:
    """A named confidence function and what it takes (``logits``, ``features``, ``model`` + images, or the
    member logits ``(M, N, C)`` of an ``ensemble``).

    A κ backed by a detector of :mod:`metrics.detectors` (``detector`` set: Mahalanobis, KNN, ViM, ReAct,
    ASH, ... and any pytorch-ood detector by name, ``pood:<Class>``) is built per model with
    :meth:`build` and, when :attr:`needs_fit`, fitted on in-distribution training outputs before it scores
    (the engine's fit pass, :meth:`evaluation_engine.scoring.ScoringPasses.fitted`). Every other κ of the logits or
    an ensemble is a detector with an empty fit (:class:`FunctionDetector`).

    Attributes:
        background: whether it has a rule for background-class models (DESIGN.md §3): every κ of this module
            has; a pytorch-ood detector that scores the model's own outputs has not.
        checks: parameter name -> (predicate, what it must be), validated with the parameters.
        detector: the detector factory (a :class:`metrics.detectors.Detector` subclass, or a callable
            ``(background=..., **parameters) -> Detector`` for ``pood:`` names).
        open_parameters: the parameters are the detector's free keyword arguments (``pood:`` names), not a
            signature with defaults.
        model_check: for a model-based κ, ``(model) -> None`` raising when the model cannot serve it (MC dropout:
            no dropout), run before any pass (:func:`evaluation_engine.scoring.check_detectors`).
    """

    name: str
    fn: Callable[..., Tensor] | None
    kind: KappaKind
    background: bool = True
    checks: tuple[tuple[str, Callable[[Any], bool], str], ...] = ()
    detector: Any = None
    open_parameters: bool = False
    model_check: Callable[[nn.Module], None] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        if self.fn is None:
            raise TypeError(f"confidence function {self.name!r} is a detector: build() it (and fit it) first")
        return self.fn(*args, **kwargs)

    @property
    def detector_class(self) -> type[Detector] | None:
        target = self.detector
        return target if isinstance(target, type) else getattr(target, "detector_class", None)

    @property
    def needs_fit(self) -> bool:
        """Whether the κ must be fitted (on fit data, or only on the model's head) before it scores."""
        cls = self.detector_class
        return cls is not None and cls.needs_fit()

    @property
    def fit_data(self) -> bool:
        """Whether fitting needs a pass over in-distribution training images."""
        cls = self.detector_class
        return cls is not None and cls.fit_data

    @property
    def needs_head(self) -> bool:
        cls = self.detector_class
        return cls is not None and "head" in cls.inputs

    @property
    def default_fit(self) -> dict[str, Any]:
        cls = self.detector_class
        return dict(cls.default_fit) if cls is not None else {}

    def parameters(self, **overrides: Any) -> dict[str, Any]:
        """The κ's keyword parameters with their values (defaults updated by ``overrides``), e.g. ODIN's
        ``{"temperature": 2.0, "epsilon": 1e-5}``: part of every cache key, so a changed argument never
        reuses stale scores. A detector's are validated by building it once."""
        if self.detector is not None:
            resolved = dict(overrides) if self.open_parameters else self._with_defaults(self.detector.__init__, overrides)
            self.build(background=False, **resolved)  # invalid values are refused now, by the detector
            return resolved
        try:
            inspect.signature(self.fn)
        except (TypeError, ValueError):
            return dict(overrides)  # a callable without a signature
        resolved = self._with_defaults(self.fn, overrides)
        for name, valid, requirement in self.checks:
            value = resolved.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not valid(value):
                raise ValueError(f"confidence function {self.name!r}: {name} must be {requirement}, got {value!r}")
        return resolved

    def _with_defaults(self, function: Callable[..., Any], overrides: dict[str, Any]) -> dict[str, Any]:
        """``function``'s keyword defaults (``background`` aside) updated by ``overrides``; an override it does
        not take is refused, naming the κ."""
        signature = inspect.signature(function)
        values = {name: p.default for name, p in signature.parameters.items()
                  if p.default is not inspect.Parameter.empty and name != "background"}
        unknown = set(overrides) - set(values)
        if unknown:
            raise ValueError(f"confidence function {self.name!r} has no parameters {sorted(unknown)}; "
                             f"it takes {sorted(values)}")
        return {**values, **overrides}

    def build(self, *, background: bool = False, **parameters: Any) -> Detector:
        """The κ as a detector for one model (unfitted where it needs fitting); a model-based κ has none."""
        if self.detector is not None:
            return self.detector(background=background, **parameters)
        if self.kind == "model":
            raise TypeError(f"confidence function {self.name!r} scores images through the model; it has no "
                            "detector of the model's outputs")
        return FunctionDetector(self, background=background, parameters=parameters)


class FunctionDetector(Detector):
    """A κ of the logits (or of an ensemble's member logits) as a detector with an empty fit."""

    inputs = frozenset({"logits"})

    def __init__(self, kappa: Kappa, *, background: bool = False, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(background=background)
        self.kappa, self.parameters_ = kappa, dict(parameters or {})
        self.name = kappa.name  # type: ignore[misc]

    def hyperparameters(self) -> dict[str, Any]:
        return dict(self.parameters_)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        if self.kappa.kind == "features":  # a function of the features (from_pytorch_ood(..., kind="features"))
            return self.kappa(outputs["features"], background=self.background, **self.parameters_)
        logits = outputs["logits"]
        if self.kappa.kind == "ensemble":
            if logits.ndim != 3:
                raise ValueError(f"confidence function {self.kappa.name!r} needs an ensemble (member logits (M, N, C)); "
                                 "give the model as ensemble:<members file or checkpoints>")
            return self.kappa(logits.transpose(0, 1), background=self.background, **self.parameters_)
        if logits.ndim != 2:
            raise ValueError(f"confidence function {self.kappa.name!r} scores one model; for an ensemble use "
                             "ensemble_mi, ensemble_softmax or ensemble_entropy")
        return self.kappa(logits, background=self.background, **self.parameters_)


def _as_float(logits: Tensor) -> Tensor:
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, C), got {tuple(logits.shape)}")
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _negative_entropy_of_known(probs: Tensor, background: bool) -> Tensor:
    """``Σ p log p`` over the known classes; with a background column its mass is spread over them."""
    if background:
        probs = spread_background_mass(probs)
    return torch.special.xlogy(probs, probs).sum(dim=1)


def softmax_response(logits: Tensor, background: bool = False) -> Tensor:
    """``max_c softmax(z)_c`` (over the known columns of a softmax over all logits with a background)."""
    return known_columns(torch.softmax(_as_float(logits), dim=1), background).max(dim=1).values


def max_logit(logits: Tensor, background: bool = False) -> Tensor:
    """``max_c z_c`` over the known classes."""
    return known_columns(_as_float(logits), background).max(dim=1).values


def negative_entropy(logits: Tensor, background: bool = False) -> Tensor:
    """``Σ_c p_c log p_c`` of ``p = softmax(z)`` (``0 log 0 = 0``); the negative of the entropy."""
    logits = _as_float(logits)
    if background:
        return _negative_entropy_of_known(torch.softmax(logits, dim=1), True)
    log_p = torch.log_softmax(logits, dim=1)
    return (log_p.exp() * log_p).sum(dim=1)


def _check_gradients_available() -> None:
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "ODIN needs input gradients, which inference mode forbids: run it under "
            "torch.inference_mode(False) (the evaluation callbacks do) or a Trainer with inference_mode=False"
        )


def odin(
    model: nn.Module, images: Tensor, temperature: float = 2.0, epsilon: float = 1e-5, background: bool = False
) -> Tensor:
    """ODIN score: temperature-scaled softmax response after a small input perturbation.

    ``x̃ = x - ε · sign(∇_x CE(f(x)/T, ŷ))`` with ``ŷ = argmax f(x)`` (over the known classes), i.e. a step
    that raises the temperature-scaled softmax score of the predicted class; the score is
    ``max_c softmax(f(x̃)/T)_c``. The model should be in eval mode so that samples do not interact
    (batch norm statistics).
    """
    _check_gradients_available()
    with torch.enable_grad():
        inputs = images.detach().clone().requires_grad_(True)
        logits = model(inputs).float() / temperature
        predicted = known_columns(logits, background).argmax(dim=1)
        # summed, not averaged: each sample's gradient does not depend on the batch size
        loss = F.cross_entropy(logits, predicted, reduction="sum")
        (gradient,) = torch.autograd.grad(loss, inputs)
    perturbed = images.detach() - epsilon * gradient.sign()
    with torch.no_grad():
        return softmax_response(model(perturbed).float() / temperature, background=background)


def dropout_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose training flag switches dropout on.

    - ``nn.Dropout`` layers (any ``_DropoutNd``) with ``p > 0``;
    - modules with a ``drop_rate > 0`` attribute and no such dropout layer inside: the timm convention
      for models that apply dropout functionally in their head (ResNet, EfficientNet, ... created with
      ``drop_rate > 0``: ``F.dropout(x, p=self.drop_rate, training=self.training)``).
    """
    layers = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    functional = [
        m for m in model.modules()
        if isinstance(getattr(m, "drop_rate", None), (int, float)) and float(m.drop_rate) > 0
        and not any(isinstance(c, nn.modules.dropout._DropoutNd) and c.p > 0 for c in m.modules())
    ]
    return layers + functional


def no_dropout_message(model: nn.Module) -> str:
    """Why MC dropout cannot score ``model`` and what would, for its kind: the evaluation commands' models carry
    their spec (``timm:<name>``, ``torchvision:<name>``, a ``.ckpt`` of ``train.py``, ``module:<class>``)."""
    spec = str(getattr(model, "spec", ""))
    network = getattr(model, "network", model)
    name = f"{spec} ({type(network).__name__})" if spec else type(network).__name__
    retrain = ("train.py with a timm backbone created with dropout (--model.init_args.backbone timm:<name> "
               "--model.init_args.backbone_args '{drop_rate: 0.2}'; timm applies it in the pooled features)")
    if spec.endswith(".ckpt"):
        advice = (f"a checkpoint's network is the one it trained, and it has no dropout layer (--model-arg applies to "
                  f"timm/torchvision models only): MC dropout needs a network trained with dropout, e.g. retrain with "
                  f"{retrain}, or evaluate a timm model created with it (--model timm:<name> --model-arg drop_rate=0.2)")
    elif spec.startswith("timm:"):
        advice = ("create it with dropout in its head: evaluate.py --model-arg drop_rate=0.2 (timm's drop_rate, "
                  "applied to the pooled features)")
    elif spec.startswith("torchvision:"):
        advice = ("a torchvision builder that takes a dropout argument takes it as --model-arg (e.g. vit_b_16: "
                  "--model-arg dropout=0.1); one that does not (the ResNets) has no dropout to switch on: take the "
                  "timm model of the same name with dropout (--model timm:<name> --model-arg drop_rate=0.2)")
    else:
        advice = ("give it nn.Dropout layers with p > 0 (or a drop_rate > 0 applied functionally, timm's convention), "
                  "or evaluate a timm model created with dropout (--model timm:<name> --model-arg drop_rate=0.2)")
    return f"{name} has no dropout with p > 0, so MC dropout would equal the plain entropy: {advice}"


def check_dropout(model: nn.Module) -> None:
    """Refuse a model MC dropout cannot score (no dropout with ``p > 0``), with the advice for its kind
    (:func:`no_dropout_message`): MC dropout's ``model_check``, run before any pass."""
    if not dropout_modules(model):
        raise ValueError(no_dropout_message(model))


def mc_dropout(model: nn.Module, images: Tensor, passes: int = 30, background: bool = False) -> Tensor:
    """Negative entropy of the mean softmax over ``passes`` forward passes with dropout active.

    Only the dropout modules' own training flags are switched on (batch norm and everything else stays in
    eval mode); the flags are restored afterwards. Works for models with ``nn.Dropout`` layers and for timm
    models created with ``drop_rate > 0`` (functional dropout in the head, see :func:`dropout_modules`).
    """
    if passes < 1:
        raise ValueError(f"passes must be positive, got {passes}")
    layers = dropout_modules(model)
    if not layers:
        raise ValueError(no_dropout_message(model))
    modes = [layer.training for layer in layers]
    try:
        for layer in layers:
            layer.training = True  # this module only: its children keep their modes
        with torch.no_grad():
            mean = sum(torch.softmax(model(images).float(), dim=1) for _ in range(passes)) / passes
    finally:
        for layer, mode in zip(layers, modes, strict=True):
            layer.training = mode
    return _negative_entropy_of_known(mean, background)


def from_pytorch_ood(detector: Any, *, name: str, kind: KappaKind = "logits") -> Kappa:
    """Wrap a pytorch-ood detector as a κ: ``κ = -outlier score`` (pytorch-ood: higher = more OOD).

    Args:
        detector: e.g. ``pytorch_ood.detector.EnergyBased(model=None)``; fitted detectors (Mahalanobis,
            KNN, ViM) must be fitted on in-distribution data first.
        kind: ``"logits"`` calls ``predict_logits`` (on the known logits of a background-class model),
            ``"features"`` calls ``predict_features``, ``"model"`` calls ``predict(images)`` (the detector
            holds the model; the model argument is ignored).
    """
    if kind == "logits":
        def from_logits(logits: Tensor, background: bool = False) -> Tensor:
            return -detector.predict_logits(known_columns(_as_float(logits), background))

        return Kappa(name, from_logits, kind)
    if kind == "features":
        def from_features(features: Tensor, background: bool = False) -> Tensor:
            return -detector.predict_features(features)

        return Kappa(name, from_features, kind)
    if kind == "model":
        def from_model(model: nn.Module, images: Tensor, background: bool = False) -> Tensor:
            if background:
                raise ValueError(f"pytorch-ood detector {name!r} scores the model's own outputs, background "
                                 "column included; it cannot score a background-class model")
            return -detector.predict(images)

        return Kappa(name, from_model, kind, background=False)
    raise ValueError(f"kind must be 'logits', 'features' or 'model', got {kind!r}")


def _energy() -> Kappa:
    from pytorch_ood.detector import EnergyBased

    return from_pytorch_ood(EnergyBased(model=None), name="energy", kind="logits")


KAPPAS: dict[str, Kappa] = {
    "softmax": Kappa("softmax", softmax_response, "logits"),
    "max_logit": Kappa("max_logit", max_logit, "logits"),
    "entropy": Kappa("entropy", negative_entropy, "logits"),
    "energy": _energy(),
    "odin": Kappa("odin", odin, "model", checks=(("temperature", lambda t: t > 0, "positive"),
                                                 ("epsilon", lambda e: e >= 0, "non-negative"))),
    "mc_dropout": Kappa("mc_dropout", mc_dropout, "model",
                        checks=(("passes", lambda n: isinstance(n, int) and n >= 1, "a positive integer"),),
                        model_check=check_dropout),
    "ensemble_mi": Kappa("ensemble_mi", ensemble_mi, "ensemble"),
    "ensemble_softmax": Kappa("ensemble_softmax", ensemble_softmax, "ensemble"),
    "ensemble_entropy": Kappa("ensemble_entropy", ensemble_entropy, "ensemble"),
}


def detector_kappa(detector: Any, *, name: str | None = None, open_parameters: bool = False) -> Kappa:
    """A detector class of :mod:`metrics.detectors` as a κ: ``features`` kind when it reads features (the
    pass then keeps them), else ``logits``."""
    cls = detector if isinstance(detector, type) else detector.detector_class
    kind: KappaKind = "features" if {"features", "head"} & set(cls.inputs) else "logits"
    return Kappa(name or cls.name, None, kind, background=cls.background_rule, detector=detector,
                 open_parameters=open_parameters)


def _register_detectors() -> None:
    from metrics import detectors

    for name, cls in getattr(detectors, "DETECTORS", {}).items():
        KAPPAS.setdefault(name, detector_kappa(cls))


_register_detectors()

POOD_PREFIX = "pood:"


def get_kappa(name: str) -> Kappa:
    """The κ of a name of :data:`KAPPAS`, or ``pood:<Class>``: any pytorch-ood detector by its class name,
    fitted by the same fit pass (its keyword arguments through ``kappa_args``)."""
    if name.startswith(POOD_PREFIX):
        from metrics.detectors.pood import pood_detector_class

        return detector_kappa(pood_detector_class(name.removeprefix(POOD_PREFIX)), name=name, open_parameters=True)
    if name not in KAPPAS:
        raise ValueError(f"unknown confidence function {name!r}; choose from {sorted(KAPPAS)} or pood:<a pytorch-ood "
                         "detector class>")
    return KAPPAS[name]


def check_kappa(kappa: Kappa, *, model: str, ensemble: bool, background: bool) -> None:
    """Refuse a (model, κ) pair the κ cannot serve, naming both: an ensemble κ on one model, a single-model κ
    on an ensemble, a background-class model with a κ that has no background rule. Called when a run
    starts, before any pass."""
    if kappa.kind == "ensemble" and not ensemble:
        raise ValueError(f"confidence function {kappa.name!r} needs an ensemble (member logits (M, N, C)); {model} is "
                         "one model: give it as ensemble:<members file or checkpoints>")
    if kappa.kind != "ensemble" and ensemble:
        raise ValueError(f"confidence function {kappa.name!r} scores one model; {model} is an ensemble: use "
                         "ensemble_mi, ensemble_softmax or ensemble_entropy")
    if background and not kappa.background:
        raise ValueError(f"confidence function {kappa.name!r} has no rule for background-class models, and {model} "
                         "has a background class")


def pairs_with(kappa: Kappa, *, ensemble: bool) -> bool:
    """Whether a κ applies to a model of this kind (ensemble κ to ensembles, the others to single models):
    the rule by which commands that evaluate several models pair each κ with its models."""
    return (kappa.kind == "ensemble") == ensemble


def describe_arguments(parameters: dict[str, Any]) -> str:
    """A κ's resolved arguments as an error names them: ``t=0, k=50`` (sorted), or ``no arguments``."""
    return ", ".join(f"{name}={value!r}" for name, value in sorted(parameters.items())) or "no arguments"


def check_finite_scores(scores: Tensor, kappa: Kappa, *, parameters: dict[str, Any], data: str | None = None) -> None:
    """Refuse NaN or infinite scores of a κ, naming the κ, its arguments, the set (where known) and how many
    rows: a detector's non-finite output is an error at its source, not a NaN in a metric's input later.

    Raises:
        ValueError: some rows are not finite (the first row indices given).
    """
    if not scores.is_floating_point() or scores.numel() == 0:
        return
    low, high = torch.aminmax(scores.detach())
    if bool(torch.isfinite(low) & torch.isfinite(high)):  # NaN makes both NaN; an infinity is one of them
        return
    rows = (~torch.isfinite(scores.detach())).reshape(scores.shape[0], -1).any(dim=1).nonzero().flatten()
    where = f" of {data}" if data else ""
    raise ValueError(f"confidence function {kappa.name!r} ({describe_arguments(parameters)}) gave NaN or infinite "
                     f"scores for {rows.numel()} of {scores.shape[0]} images{where} (first rows: {rows[:5].tolist()}): "
                     f"a detector's scores must be finite; check its arguments (--kappa-arg {kappa.name}.NAME=VALUE) "
                     "and the model's outputs")


def kappa_scores(kappa: Kappa, outputs: dict[str, Tensor], *, background: bool, parameters: dict[str, Any],
                 detector: Detector | None = None, data: str | None = None, finite: bool = True) -> Tensor:
    """κ of every sample from one pass's outputs -- the one κ dispatch of every method (severity, the
    generated benchmarks, EvG's detector energies).

    Args:
        outputs: ``logits`` ``(N, C)`` (``(N, M, C)`` per sample for an ensemble), ``features`` ``(N, F)`` when a
            feature κ asked for them, ``scores/<κ>`` for a model-based κ's own pass.
        background: the last logit is the background class.
        parameters: the κ's resolved parameters (:meth:`Kappa.parameters`).
        detector: the κ's detector for this model, fitted (required for a κ that needs fitting:
            :meth:`evaluation_engine.scoring.ScoringPasses.fitted` makes it); default: :meth:`Kappa.build`.
        data: the set the outputs are of (its name), for the error of non-finite scores.
        finite: refuse NaN or infinite scores (:func:`check_finite_scores`); ``False`` only where a NaN score
            has a meaning of its own (EvG's search: a rejected proposal).
    """
    if kappa.kind == "model":
        scores = outputs[f"scores/{kappa.name}"]
    else:
        if kappa.kind == "features" and "features" not in outputs:
            raise ValueError(f"confidence function {kappa.name!r} needs the model's features; the pass has none")
        if detector is None:
            if kappa.needs_fit:
                raise ValueError(f"confidence function {kappa.name!r} must be fitted on in-distribution training "
                                 "outputs first (ScoringPasses.fitted), none was given")
            detector = kappa.build(background=background, **parameters)
        if kappa.detector is not None and outputs["logits"].ndim != 2:
            raise ValueError(f"detector {kappa.name!r} scores one model; for an ensemble use ensemble_mi, "
                             "ensemble_softmax or ensemble_entropy")
        scores = detector.score(outputs)
    if finite:
        check_finite_scores(scores, kappa, parameters=parameters, data=data)
    return scores
