"""Confidence functions κ by name: :data:`KAPPAS`, and the one κ dispatch of every method.

Every κ is a detector (:class:`metrics.detectors.Detector`, :mod:`metrics.detectors.registry`): the functions of
Galil et al. (``softmax``, ``max_logit``, ``entropy``, ``energy``, ``odin``, ``mc_dropout``), the deep-ensemble κ
of Mukhoti et al. (``ensemble_mi``, ``ensemble_softmax``, ``ensemble_entropy``), the fitted detectors
(``mahalanobis``, ``knn``, ``vim``, ...), any pytorch-ood detector (``pood:<Class>``), and those of other
packages (an entry point, a class path). Higher means more in-distribution; every κ returns shape ``(N,)``.

:data:`KAPPAS` (DESIGN.md §4) is the registry's name -> scorer view: ``KAPPAS["softmax"](logits,
background=True)``; logit-based ones take logits ``(N, C)``, model-based ones (odin, mc_dropout) ``(model,
images)``, ensemble ones member logits ``(M, N, C)``; a fitted detector scores after its fit (calling its
scorer unfitted is an error saying so: build it, :func:`metrics.detectors.build_detector`, and fit it).
The functions below take a detector class (:func:`metrics.detectors.resolve_detector` of a name).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from metrics.detectors import Detector, DetectorNotFitted, build_detector, detectors


class Scorer:
    """A detector class as a plain scoring function (the view :data:`KAPPAS` gives of it).

    Attributes:
        detector: the detector class.
    """

    def __init__(self, detector: type[Detector]) -> None:
        self.detector = detector

    def __repr__(self) -> str:
        return f"KAPPAS[{self.detector.name!r}]"

    @property
    def kind(self) -> str:
        """What it scores from (:attr:`metrics.detectors.Detector.kind`): what the call takes."""
        return self.detector.kind

    def __call__(self, *inputs: Any, background: bool = False, **hyperparameters: Any) -> Tensor:
        cls = self.detector
        kernel = getattr(cls, "kernel", None)
        if kernel is not None:  # a function of the logits, the member logits (M, N, C) or (model, images)
            return kernel(*inputs, background=background, **cls.arguments(**hyperparameters))
        if cls.needs_fit:
            raise DetectorNotFitted(f"detector {cls.name!r} is fitted before it scores: build_detector({cls.name!r}) "
                                    "and fit() it on in-distribution outputs first")
        (values,) = inputs
        key = "features" if cls.kind == "features" else "logits"
        return build_detector(cls, background=background, **hyperparameters).score({key: values})


class _Kappas(Mapping[str, Scorer]):
    """The registry as a name -> :class:`Scorer` mapping, read when asked (a detector registered later is in it)."""

    def __getitem__(self, name: str) -> Scorer:
        return Scorer(detectors()[name])

    def __iter__(self) -> Iterator[str]:
        return iter(detectors())

    def __len__(self) -> int:
        return len(detectors())

    def __repr__(self) -> str:
        return f"KAPPAS({sorted(self)})"


KAPPAS: Mapping[str, Scorer] = _Kappas()
"""Every registered detector's name -> its scorer (DESIGN.md §4)."""


def check_kappa(kappa: type[Detector], *, model: str, ensemble: bool, background: bool) -> None:
    """Refuse a (model, κ) pair the κ cannot serve, naming both: an ensemble κ on one model, a single-model κ
    on an ensemble, a background-class model with a κ that has no background rule. Called when a run
    starts, before any pass."""
    if kappa.kind == "ensemble" and not ensemble:
        raise ValueError(f"confidence function {kappa.name!r} needs an ensemble (member logits (M, N, C)); {model} is "
                         "one model: give it as ensemble:<members file or checkpoints>")
    if kappa.kind != "ensemble" and ensemble:
        raise ValueError(f"confidence function {kappa.name!r} scores one model; {model} is an ensemble: use "
                         "ensemble_mi, ensemble_softmax or ensemble_entropy")
    if background and not kappa.background_rule:
        raise ValueError(f"confidence function {kappa.name!r} has no rule for background-class models, and {model} "
                         "has a background class")


def pairs_with(kappa: type[Detector], *, ensemble: bool) -> bool:
    """Whether a κ applies to a model of this kind (ensemble κ to ensembles, the others to single models):
    the rule by which commands that evaluate several models pair each κ with its models."""
    return (kappa.kind == "ensemble") == ensemble


def describe_arguments(parameters: dict[str, Any]) -> str:
    """A κ's resolved arguments as an error names them: ``t=0, k=50`` (sorted), or ``no arguments``."""
    return ", ".join(f"{name}={value!r}" for name, value in sorted(parameters.items())) or "no arguments"


def check_finite_scores(scores: Tensor, kappa: type[Detector], *, parameters: dict[str, Any], data: str | None = None) -> None:
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


def kappa_scores(kappa: type[Detector], outputs: dict[str, Tensor], *, background: bool, parameters: dict[str, Any],
                 detector: Detector | None = None, data: str | None = None, finite: bool = True) -> Tensor:
    """κ of every sample from one pass's outputs -- the one κ dispatch of every method (severity, the
    generated benchmarks, EvG's detector energies).

    Args:
        outputs: ``logits`` ``(N, C)`` (``(N, M, C)`` per sample for an ensemble), ``features`` ``(N, F)`` when a
            feature κ asked for them, ``scores/<κ>`` for a model-based κ's own pass.
        background: the last logit is the background class.
        parameters: the κ's resolved hyperparameters (:meth:`Detector.arguments`).
        detector: the κ's detector for this model, fitted (required for a κ that needs fitting:
            :meth:`evaluation_engine.scoring.ScoringPasses.fitted_detector` makes it); default: built here.
        data: the set the outputs are of (its name), for the error of non-finite scores.
        finite: refuse NaN or infinite scores (:func:`check_finite_scores`); ``False`` only where a NaN score
            has a meaning of its own (EvG's search: a rejected proposal).
    """
    if kappa.kind == "features" and "features" not in outputs:
        raise ValueError(f"confidence function {kappa.name!r} needs the model's features; the pass has none")
    if detector is None:
        if kappa.needs_fit:
            raise ValueError(f"confidence function {kappa.name!r} must be fitted on in-distribution training "
                             "outputs first (ScoringPasses.fitted_detector), none was given")
        detector = kappa(background=background, **parameters)
    scores = detector.score(outputs)
    if finite:
        check_finite_scores(scores, kappa, parameters=parameters, data=data)
    return scores
