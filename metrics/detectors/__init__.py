"""Detectors: every confidence function κ of the project is a :class:`metrics.detectors.Detector` (DESIGN.md §5.2).

One concept: an ``nn.Module`` that declares what it reads (logits, features, the head, member logits, the model),
is fitted on in-distribution outputs where it needs to (its state in buffers) and scores samples, higher = more
in-distribution, float ``(N,)``. Each module's docstring has the formula, the paper, the defaults and where
they come from, and the memory bound. They are found by name through :mod:`metrics.detectors.registry`
(:func:`resolve_detector`: a registered name, an entry point of ``openset_bench.detectors``, a class path, or
``pood:<Class>`` for any pytorch-ood detector that scores a model's outputs); :data:`DETECTORS` is the registry
of the built-in ones:

    softmax, max_logit, entropy, energy    the logits' confidence functions (no fit)
    odin, mc_dropout                       images through the model (input perturbation, dropout passes)
    ensemble_mi, _softmax, _entropy        an ensemble's member logits
    mahalanobis, relative_mahalanobis      class Gaussians of the features (Lee 2018, Ren 2021)
    knn, knn_imagenet                      k-th nearest fit feature (Sun 2022)
    vim                                    residual against energy (Wang 2022)
    react                                  energy of clipped features (Sun 2021)
    ash_s, ash_p, ash_b, scale             energy of shaped features (Djurisic 2023, Xu 2024)
    she                                    features · pattern of the prediction (Zhang 2023)
    gen                                    generalised entropy (Liu 2023)
    dice                                   energy of a sparsified head (Sun & Li 2022)
    adascale_a, adascale_l                 SCALE with a percentile adapted per image under a perturbation (Regmi 2025)
    nci                                    centred feature · predicted weight + L1 norm (Liu & Qin 2025)
    fdbd                                   distance to the decision boundaries (Liu & Qin 2024)
    gradnorm                               L1 norm of the head's KL-to-uniform gradient (Huang 2021)
    vra                                    energy of features clipped on both sides (Xu 2023)
    mahalanobis_pp, relative_mahalanobis_pp  class Gaussians of the normalised features (Müller & Hein 2025)
    nnguide                                energy guided by a bank of scaled features (Park 2023)
    klm                                    KL to the class-typical softmax (Hendrycks 2022)
    openmax                                Weibull-revised activation vector (Bendale & Boult 2016)
    postmax                                GPD CDF of max logit / feature norm (Cruz 2024)
    ghost                                  max logit / sum of class z-scores, per-class GPD (Rabinowitz 2025)
    weiper, weiper_kld                     randomly perturbed class projections: their softmax, the densities
                                           of the features and perturbed logits (Granz 2024)
    optfs                                  energy of features shaped by a fitted piecewise constant (Zhao 2024)
    nac                                    coverage of layers' neuron states (output · KL gradient) fitted on
                                           training images (Liu 2024; its own pass, a backward)
"""

from __future__ import annotations

from metrics.detectors.adascale import AdaSCALEA, AdaSCALEL
from metrics.detectors.ash import ASH, ASHB, ASHP, ASHS
from metrics.detectors.base import CHUNK_ROWS, KINDS, Detector, DetectorNotFitted, Head, row_chunks
from metrics.detectors.confidence import Energy, Entropy, MaxLogit, Softmax
from metrics.detectors.dice import DICE
from metrics.detectors.ensemble import EnsembleEntropy, EnsembleMI, EnsembleSoftmax
from metrics.detectors.fdbd import FDBD
from metrics.detectors.function import ScoreFunction
from metrics.detectors.gen import GEN
from metrics.detectors.ghost import GHOST
from metrics.detectors.gradnorm import GradNorm
from metrics.detectors.klm import KLMatching
from metrics.detectors.knn import KNN, KNNImageNet
from metrics.detectors.mahalanobis import Mahalanobis, RelativeMahalanobis
from metrics.detectors.mahalanobis_pp import MahalanobisPP, RelativeMahalanobisPP
from metrics.detectors.nac import NAC
from metrics.detectors.nci import NCI
from metrics.detectors.nnguide import NNGuide
from metrics.detectors.openmax import OpenMax
from metrics.detectors.optfs import OptFS
from metrics.detectors.perturbation import ODIN, MCDropout
from metrics.detectors.postmax import PostMax
from metrics.detectors.react import ReAct
from metrics.detectors.registry import (
    ENTRY_POINTS,
    POOD_PREFIX,
    build_detector,
    detectors,
    register_detector,
    resolve_detector,
    unregister_detector,
)
from metrics.detectors.scale import SCALE
from metrics.detectors.shaping import ActivationShaping
from metrics.detectors.she import SHE
from metrics.detectors.vim import ViM
from metrics.detectors.vra import VRA
from metrics.detectors.weiper import WeiPer, WeiPerKLD

DETECTORS: dict[str, type[Detector]] = {cls.name: cls for cls in (
    Softmax,
    MaxLogit,
    Entropy,
    Energy,
    ODIN,
    MCDropout,
    EnsembleMI,
    EnsembleSoftmax,
    EnsembleEntropy,
    Mahalanobis,
    RelativeMahalanobis,
    MahalanobisPP,
    RelativeMahalanobisPP,
    KNN,
    KNNImageNet,
    ViM,
    ReAct,
    ASHS,
    ASHP,
    ASHB,
    SCALE,
    SHE,
    GEN,
    DICE,
    AdaSCALEA,
    AdaSCALEL,
    NCI,
    FDBD,
    GradNorm,
    VRA,
    NNGuide,
    KLMatching,
    OpenMax,
    GHOST,
    PostMax,
    WeiPer,
    WeiPerKLD,
    OptFS,
    NAC,
)}
"""The built-in detectors by name (the registry, :func:`detectors`, holds these and any registered since)."""

__all__ = [
    "ASH",
    "ASHB",
    "ASHP",
    "ASHS",
    "ActivationShaping",
    "AdaSCALEA",
    "AdaSCALEL",
    "CHUNK_ROWS",
    "DETECTORS",
    "DICE",
    "Detector",
    "DetectorNotFitted",
    "ENTRY_POINTS",
    "Energy",
    "EnsembleEntropy",
    "EnsembleMI",
    "EnsembleSoftmax",
    "Entropy",
    "FDBD",
    "GEN",
    "GHOST",
    "GradNorm",
    "Head",
    "KINDS",
    "KLMatching",
    "KNN",
    "KNNImageNet",
    "MCDropout",
    "Mahalanobis",
    "MahalanobisPP",
    "MaxLogit",
    "NAC",
    "NCI",
    "NNGuide",
    "ODIN",
    "OpenMax",
    "OptFS",
    "POOD_PREFIX",
    "PostMax",
    "ReAct",
    "RelativeMahalanobis",
    "RelativeMahalanobisPP",
    "SCALE",
    "SHE",
    "ScoreFunction",
    "Softmax",
    "VRA",
    "ViM",
    "WeiPer",
    "WeiPerKLD",
    "build_detector",
    "detectors",
    "register_detector",
    "resolve_detector",
    "row_chunks",
    "unregister_detector",
]
