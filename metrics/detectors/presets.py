"""OpenOOD v1.5's detector hyper-parameters as presets, and its automatic parameter search.

OpenOOD v1.5 (Zhang et al., *OpenOOD v1.5: Enhanced Benchmark for Out-of-Distribution Detection*, 2023;
github.com/Jingkang50/OpenOOD) scores each detector ("postprocessor") with the values of its
``configs/postprocessors/<name>.yml``: ``postprocessor_args`` are the values it starts from, and where the file
says ``APS_mode: True`` its evaluator (``openood/evaluation_api/evaluator.py``, ``Evaluator.hyperparam_search``)
replaces them by the combination of ``postprocessor_sweep`` with the highest AUROC of the ID validation list
against the OOD validation list (:data:`SEARCH_SETS`; the test lists are never used for it).

Per benchmark: the evaluator reads the *same* file for every benchmark (``get_postprocessor(config_root,
postprocessor_name, id_data_name)`` merges only ``dataset.name`` into it), so the starting values are the same
for cifar10, cifar100, imagenet200 and imagenet1k (OpenOOD's ``imagenet``). What differs per benchmark is (a) the
search's choice, made on that benchmark's validation lists (:func:`tune`), (b) ODIN's per-channel input std
(``normalization_dict``, see ODIN below), (c) the class count of MDS, RMDS, SHE, KLM and OpenMax (``info.py``),
which the project's detectors take from their fit data.

:data:`PRESETS` holds, per benchmark and per project detector that OpenOOD v1.5 has, its parameters in the
project's names and units (OpenOOD's percentiles 0-100 are the project's fractions 0-1), with the file and value
read (``source``), OpenOOD's name, whether OpenOOD searches it (``searched``), and ``fit_split``, the ID split
OpenOOD fits it on: ``"id_train"`` (the training list) or ``"id_val"`` (ReAct's and VRA's percentiles, AdaSCALE's
ECDF and KL matching's typical posteriors: their ``setup`` reads ``id_loader_dict['val']``); give that split as the
detector's fit data.

    OpenOOD      project                 parameters (OpenOOD's -> the project's)
    msp          softmax                 -
    mls          max_logit               -
    ebo          energy                  temperature 1 (the project's energy is T = 1, no parameter)
    odin         odin                    temperature 1000, noise 0.0014 -> epsilon 0.0014 (see below)
    gen          gen                     gamma 0.1, M 100 (clamp off: OpenOOD's form)
    react        react                   percentile 90 -> 0.9, fitted on ID val
    ash          ash_b                   percentile 90 -> 0.9: OpenOOD's ``ASHNet`` calls ``ash_b`` (ASH-B),
                                         not the project's ``ash_s`` / ``ash_p``
    scale        scale                   percentile 85 -> 0.85
    dice         dice                    p 90 -> 0.9 (not searched: ``APS_mode: False``)
    vim          vim                     dim 256 -> d 256 (the principal subspace's dimension)
    knn          knn                     K 50 -> k 50, on the whole training list (also for ImageNet-1K: the
                                         project's ``knn``, not ``knn_imagenet`` and its 1% fit sample)
    mds          mahalanobis             - (shrinkage 0: sklearn's EmpiricalCovariance, no ridge)
    rmds         relative_mahalanobis    - (shrinkage 0)
    she          she                     metric inner_product (the project's only form)
    nci          nci                     alpha 0.0001 (the L1-norm weight), fitted on the training list
    fdbd         fdbd                    distance_as_normalizer True -> distance_to_mean True
    gradnorm     gradnorm                - (T = 1; not searched: ``APS_mode: False``)
    vra          vra                     percentile_high 90 -> upper_percentile 0.9, percentile_low 10 ->
                                         lower_percentile 0.1, fitted on ID val
    nnguide      nnguide                 K 100 -> k 100; alpha 0.01 (the bank's share of the training set) is
                                         nnguide's default fit cap, 1%
    klm          klm                     -, fitted on ID val
    openmax      openmax                 weibull_tail 20 -> tailsize 20, weibull_alpha 3 -> alpha 3, Euclidean
                                         distance (euclidean_weight 1, cosine_weight 0): hard-coded in
                                         ``openmax_postprocessor.py``
    nac          nac                     per layer O -> o_star, M -> bins, sig_alpha -> alpha; the layers of the
                                         authors' README command; per benchmark (below)

NAC-UE's rows on OpenOOD v1.5's leaderboard are its authors' (Liu et al., ICLR 2024), run with their fork of
OpenOOD (:data:`NAC_REPOSITORY`, at :data:`NAC_COMMIT`): OpenOOD's own ``configs/postprocessors`` have no NAC, and
the fork's ``get_postprocessor`` reads ``nac_<id_name>.yml``, one file per benchmark with its own values and sweep
(:data:`BENCHMARK_SEARCH_GRIDS`: :func:`search_grid`). ``cifar10``, ``cifar100`` and ``imagenet1k`` have a ResNet
file; ``imagenet200`` has none, so the ``openood`` preset has no NAC there. The fork searches NAC on every benchmark
(the README's commands pass ``aps``, which overrides the files' ``APS_mode``) over the per-layer values jointly, in
its ``recursive_generator``'s order (the first layer's O fastest). It fits on 1,000 class-balanced training images
(``valid_num: 1000``): ``nac``'s default fit cap ``{"images": 1000}``, 1 per class on ImageNet-1K, 100 on CIFAR-10,
10 on CIFAR-100.

Where the scores differ from the project's only by a monotone map the ranking, hence every metric, is the
same: GEN sums over the M largest probabilities where the project averages (a factor ``1/min(M, C)``); KNN returns
minus the squared distance (faiss ``IndexFlatL2``) of features normalised as ``x/|x| + 1e-10`` where the project
returns minus the distance of ``x/max(|x|, 1e-12)``; MDS and RMDS divide the scatter by N and drop the ½ (a factor
``2N`` resp. ``N``); fDBD sums over the classes where the project averages over the ``C - 1`` others (a factor
``C - 1``); GradNorm sums its cross-entropy to the uniform distribution over the classes where the project takes the
KL divergence, a mean (a factor ``C``). ViM's ``d >= D`` (the grid's 1000 on a 512-wide ResNet-18) leaves OpenOOD
an empty residual (a non-finite α, no best AUROC) and is ``D // 2`` here. NNGuide's OpenOOD normaliser adds ``10⁻¹⁰`` to every
normalised element (a ~10⁻⁹ relative change of its scores); OpenMax's confidence is ``-P(unknown)``, the
project's.

ASH's and SCALE's kept count ``k = D - round(p·D)`` (:func:`metrics.detectors.shaping.kept_count`) at ``p =
P / 100`` equals OpenOOD's ``D - round(D · P / 100)`` for the widths of OpenOOD's networks (512, 768, 2048, 3024)
and every grid percentile; where ``D · P / 100`` is a half-integer, which OpenOOD rounds to even, the float
``p · D`` can fall just below it: at P = 70 for 39 widths up to 4096 (45, 85, 165, ...), where one activation more
is kept here (measured; the presets' own percentiles, 90 and 85, have no such width).

ODIN's noise: OpenOOD steps ``x_n - noise · sign₊(∇) / std_c`` on the *normalised* input ``x_n = (x - mean_c) /
std_c`` (``sign₊``: ``torch.ge(grad, 0)`` mapped to ±1, so a zero gradient steps as +1), which is a step of
exactly ``noise`` on the image in [0, 1]. The project's ``epsilon`` is a step on the model's input: the preset's
0.0014 reproduces OpenOOD for a model that takes [0, 1] images (normalising inside itself, or not at all, as the
project's own checkpoints by default); for a model fed normalised images the equivalent step is
``noise / std_c`` per channel, which a scalar epsilon cannot give (each entry's ``notes`` has the values).

Read at OpenOOD commit :data:`OPENOOD_COMMIT` (:data:`OPENOOD_COMMIT_DATE`, ``setup.py`` version 1.5). At the tag
``v1.5`` (8d44375e, 2023-06-26) ``gen.yml`` and ``scale.yml`` did not exist yet, EBO's sweep was temperature
[1, 10, 100, 1000], and ViM's ``set_hyperparam`` did not recompute its subspace (its dim sweep had no effect: the
subspace stayed that of dim 256). :data:`NOT_MAPPED` lists OpenOOD's postprocessors without a project detector.

The ``"paper"`` preset is the project's own defaults (each detector's constructor, documented in its module).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from metrics.auroc import auroc
from metrics.detectors.base import Detector
from metrics.detectors.registry import detectors, resolve_detector

OPENOOD_REPOSITORY = "github.com/Jingkang50/OpenOOD"
OPENOOD_COMMIT = "3c35632ee91b54b09d1f085d04f94744cece7d0b"
OPENOOD_COMMIT_DATE = "2025-12-01"
OPENOOD_VERSION = "1.5"
"""``setup.py``'s version at :data:`OPENOOD_COMMIT` (the tag ``v1.5`` is 8d44375e, 2023-06-26)."""

BENCHMARKS = ("cifar10", "cifar100", "imagenet200", "imagenet1k")
"""The benchmarks of OpenOOD v1.5, by the project's names."""

OPENOOD_BENCHMARKS = MappingProxyType({"cifar10": "cifar10", "cifar100": "cifar100", "imagenet200": "imagenet200",
                                       "imagenet1k": "imagenet"})
"""The project's benchmark name -> OpenOOD's ``id_name``."""

PRESET_NAMES = ("openood", "paper")
"""``openood``: :data:`PRESETS`; ``paper``: the project's defaults (each detector's constructor)."""

FIT_SPLITS = ("id_train", "id_val")

SEARCH_SETS = MappingProxyType({
    "cifar10": ("benchmark_imglist/cifar10/val_cifar10.txt", "benchmark_imglist/cifar10/val_tin.txt"),
    "cifar100": ("benchmark_imglist/cifar100/val_cifar100.txt", "benchmark_imglist/cifar100/val_tin.txt"),
    "imagenet200": ("benchmark_imglist/imagenet200/val_imagenet200.txt",
                    "benchmark_imglist/imagenet200/val_openimage_o.txt"),
    "imagenet1k": ("benchmark_imglist/imagenet/val_imagenet.txt", "benchmark_imglist/imagenet/val_openimage_o.txt"),
})
"""Per benchmark, the (ID val, OOD val) image lists OpenOOD's search scores (``openood/evaluation_api/datasets.py``
``DATA_INFO[id]['id']['val']`` and ``['ood']['val']``); the first is also ReAct's and VRA's fit split ``id_val``."""

INPUT_STD = MappingProxyType({
    "cifar10": (0.2470, 0.2435, 0.2616),
    "cifar100": (0.2675, 0.2565, 0.2761),
    "imagenet200": (0.229, 0.224, 0.225),
    "imagenet1k": (0.229, 0.224, 0.225),
})
"""OpenOOD's per-channel input std per benchmark (``openood/preprocessors/transform.py`` ``normalization_dict``),
by which its ODIN divides the gradient's sign."""


@dataclass(frozen=True)
class Preset:
    """A detector's parameters in a preset.

    Attributes:
        detector: the project's detector name (the registry's).
        parameters: its hyperparameters, the project's names and units (read-only; :func:`preset_parameters`
            gives a copy).
        source: where the values come from: OpenOOD's file and the values as read there.
        openood_name: OpenOOD's postprocessor name (``None`` for the ``paper`` preset).
        searched: whether OpenOOD's evaluator replaces the values by its search (``APS_mode: True``); its grid is
            :data:`SEARCH_GRIDS`.
        fit_split: the ID split the detector is fitted on: ``"id_train"``, ``"id_val"`` or ``None`` (no fit data).
        notes: how OpenOOD's method differs from the project's detector, where it does.
    """

    detector: str
    parameters: Mapping[str, Any]
    source: str
    openood_name: str | None = None
    searched: bool = False
    fit_split: str | None = None
    notes: str = ""

    def __post_init__(self) -> None:
        if self.fit_split is not None and self.fit_split not in FIT_SPLITS:
            raise ValueError(f"preset of {self.detector!r}: fit_split {self.fit_split!r}; choose from {FIT_SPLITS}")
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))


def _percent(value: float) -> float:
    """OpenOOD's percentile (0-100) as the project's fraction (0-1): ``value / 100``, correctly rounded, so
    ``90 -> 0.9``; ReAct's ``np.percentile`` and DICE's quantile give OpenOOD's values from it, and ASH's and SCALE's
    kept count too but where ``D · value / 100`` is a half-integer (see the module docstring; tested)."""
    return value / 100


_CONFIGS = "configs/postprocessors"
_ODIN_NOTE = ("epsilon is OpenOOD's noise on the image in [0, 1] (image_space: the project's ODIN steps noise / std_c on "
              "a normalised model input, as OpenOOD does; std = {std} in OpenOOD's preprocessing here, i.e. {steps} per "
              "channel); OpenOOD's sign maps a zero gradient to +1, the project's to 0")


_ADASCALE_ARGS = {"p_min": 75.0, "p_max": 85.0, "k1": 5.0, "k2": 1.0, "lmbda": 10.0, "o": 0.05}
_ADASCALE_READ = ("num_samples 5000, percentile [75, 85], k1 5, k2 1, lmbda 10, o 0.05, APS_mode True (sweep "
                  "percentile_list: the 36 pairs [a, b], a < b, of 60, 65, ..., 95, 99; k1, k2, lmbda, o fixed); "
                  "adascale_postprocessor.py: the ECDF of id_loader_dict['val']")
_ADASCALE_NOTE = ("OpenOOD fits the ECDF on 5,000 ID validation images drawn at random (unseeded), the project on all "
                  "of them (or its --fit-arg cap, seeded)")
_ADASCALE_PAIRS = tuple((float(a), float(b)) for i, a in enumerate((60, 65, 70, 75, 80, 85, 90, 95, 99))
                        for b in (60, 65, 70, 75, 80, 85, 90, 95, 99)[i + 1:])


NAC_REPOSITORY = "github.com/BierOne/ood_coverage"
NAC_COMMIT = "b00278098a8f4c629d785161c48605a5f837d563"
"""The authors' fork of OpenOOD whose ``configs/postprocessors/nac/resnet/nac_<benchmark>.yml`` the NAC presets
read (2024-10-25)."""

_NAC_LAYERS = ("avgpool", "layer3", "layer2", "layer1")
_NAC_FILES: Mapping[str, tuple[str, bool, dict[str, tuple[int, int, float]],
                               dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]]]] = {
    # benchmark: (file, its APS_mode, layer_kwargs per layer (O, M, sig_alpha), postprocessor_sweep per layer)
    "cifar10": ("configs/postprocessors/nac/resnet/nac_cifar10.yml", False,
                {"avgpool": (50, 50, 100), "layer3": (100, 500, 1000), "layer2": (5, 50, 0.001),
                 "layer1": (100, 500, 0.001)},
                {"avgpool": ((10, 50), (50,), (100,)), "layer3": ((100,), (50, 500), (1000, 5000)),
                 "layer2": ((5, 10), (50,), (0.001,)), "layer1": ((5, 10, 50, 100), (50, 500), (0.001, 0.005))}),
    "cifar100": ("configs/postprocessors/nac/resnet/nac_cifar100.yml", False,
                 {"avgpool": (50, 50, 50), "layer3": (500, 1000, 10), "layer2": (500, 50, 1), "layer1": (5, 50, 0.005)},
                 {"avgpool": ((50,), (50, 500), (1, 50)), "layer3": ((500,), (50, 500, 1000), (10, 50, 100)),
                  "layer2": ((100, 500), (50, 500), (1,)), "layer1": ((5, 50), (50,), (0.005,))}),
    "imagenet1k": ("configs/postprocessors/nac/resnet/nac_imagenet.yml", True,
                   {"avgpool": (10, 50, 3000), "layer3": (500, 50, 300), "layer2": (50, 500, 0.01),
                    "layer1": (5000, 1000, 1)},
                   {"avgpool": ((10, 50, 500), (50, 500), (3000,)), "layer3": ((100, 500), (50, 500), (50, 100, 300)),
                    "layer2": ((50, 500), (500,), (0.01,)), "layer1": ((5000,), (500, 1000), (0.1, 1))}),
}
"""NAC's values as read from the authors' files (their keys O, M, sig_alpha; every layer's ``method`` is
``sigmoid(o*g_kl)``, ``valid_num`` 1000, ``test_method`` avg)."""


def _nac_parameters(values: Mapping[str, tuple[Any, Any, Any]]) -> dict[str, Any]:
    return {"layers": _NAC_LAYERS, "alpha": tuple(float(values[layer][2]) for layer in _NAC_LAYERS),
            "bins": tuple(int(values[layer][1]) for layer in _NAC_LAYERS),
            "o_star": tuple(int(values[layer][0]) for layer in _NAC_LAYERS)}


def _nac_grid(benchmark: str) -> Mapping[str, tuple[Any, ...]]:
    """The fork's sweep as one joint key ``o_star,bins,alpha``: every combination of the per-layer values in its
    ``recursive_generator``'s order (its ``args_dict``: per layer O, M, sig_alpha, method; the first fastest)."""
    sweep = _NAC_FILES[benchmark][3]
    lists = [(layer, position, values) for layer in _NAC_LAYERS for position, values in enumerate(sweep[layer])]
    combinations = []
    for chosen in itertools.product(*(values for _, _, values in reversed(lists))):
        picked = {(layer, position): value for (layer, position, _), value in zip(reversed(lists), chosen, strict=True)}
        parameters = _nac_parameters({layer: tuple(picked[(layer, p)] for p in range(3)) for layer in _NAC_LAYERS})
        combinations.append((parameters["o_star"], parameters["bins"], parameters["alpha"]))
    return MappingProxyType({"o_star,bins,alpha": tuple(combinations)})


def _nac_entry(benchmark: str) -> Preset:
    path, aps, values, sweep = _NAC_FILES[benchmark]
    read = "; ".join(f"{layer} O {values[layer][0]}, M {values[layer][1]}, sig_alpha {values[layer][2]}"
                     for layer in _NAC_LAYERS)
    swept = "; ".join(f"{layer} O {list(sweep[layer][0])}, M {list(sweep[layer][1])}, sig_alpha "
                      f"{list(sweep[layer][2])}" for layer in _NAC_LAYERS)
    per_class = {"imagenet1k": 1, "cifar10": 100, "cifar100": 10}[benchmark]  # ⌊1000 / K⌋
    aps_note = "" if aps else ", over the file's APS_mode False"
    return Preset("nac", _nac_parameters(values),
                  f"{path} of the authors' fork {NAC_REPOSITORY} (OpenOOD's configs have no NAC): layer_kwargs {read}; "
                  f"method sigmoid(o*g_kl); valid_num 1000; APS_mode {aps} (postprocessor_sweep {swept}); layers "
                  "avgpool layer3 layer2 layer1 from the README's command", "nac", searched=True,
                  fit_split="id_train",
                  notes=f"OpenOOD v1.5's NAC rows are the authors' runs of their fork; it searches the sweep on every "
                        f"benchmark (the README's commands pass aps{aps_note}) and fits on 1,000 class-balanced "
                        f"training images ({per_class} per class here: the detector's default cap, images=1000), drawn "
                        "with numpy's RandomState(1) per "
                        "class (the project's draw is seeded otherwise); its coverages are float32")


def _openood_entries() -> tuple[Preset, ...]:
    """The presets as read from OpenOOD (the same for every benchmark; ODIN's notes are added per benchmark)."""
    return (
        Preset("softmax", {}, f"{_CONFIGS}/msp.yml: no postprocessor_args, APS_mode False (BasePostprocessor: max "
               "softmax)", "msp"),
        Preset("max_logit", {}, f"{_CONFIGS}/mls.yml: no postprocessor_args, APS_mode False", "mls"),
        Preset("energy", {}, f"{_CONFIGS}/ebo.yml: temperature 1, sweep temperature_list [1], APS_mode True "
               "(T * logsumexp(z / T) at T = 1 is the project's energy, which has no temperature)", "ebo",
               searched=True),
        Preset("odin", {"temperature": 1000.0, "epsilon": 0.0014, "image_space": True},
               f"{_CONFIGS}/odin.yml: temperature 1000, "
               "noise 0.0014, APS_mode True (sweep temperature [1, 10, 100, 1000], noise [0.0014, 0.0028])", "odin",
               searched=True),
        Preset("gen", {"gamma": 0.1, "M": 100, "clamp": False}, f"{_CONFIGS}/gen.yml: gamma 0.1, M 100, APS_mode "
               "True (sweep gamma_list [0.01, 0.1, 0.5, 1, 2, 5, 10], M_list [10, 50, 100, 200, 500, 1000]); "
               "probabilities unclamped (gen_postprocessor.py)", "gen", searched=True,
               notes="OpenOOD sums p^γ(1-p)^γ over the M largest probabilities, the project averages: a factor "
                     "1/min(M, C), the same ranking"),
        Preset("react", {"percentile": _percent(90)}, f"{_CONFIGS}/react.yml: percentile 90, APS_mode True (sweep "
               "percentile_list [85, 90, 95, 99]); react_postprocessor.py: np.percentile of the flattened "
               "activations of id_loader_dict['val']", "react", searched=True, fit_split="id_val",
               notes="OpenOOD computes the clip on the ID validation activations (fit_split id_val), not the "
                     "training set"),
        Preset("ash_b", {"percentile": _percent(90)}, f"{_CONFIGS}/ash.yml: percentile 90, APS_mode True (sweep "
               "percentile_list [65, 70, 75, 80, 85, 90, 95]); openood/networks/ash_net.py: forward_threshold "
               "calls ash_b (ASH-B) on the pooled feature", "ash", searched=True,
               notes="OpenOOD's ASH is ASH-B at percentile 90 (the paper's ImageNet ASH-B uses 65, the project's "
                     "ash_b default); the project's ash_s and ash_p are not what OpenOOD runs"),
        Preset("scale", {"percentile": _percent(85)}, f"{_CONFIGS}/scale.yml: percentile 85, APS_mode True (sweep "
               "percentile_list [65, 70, 75, 80, 85, 90, 95]); openood/networks/scale_net.py", "scale",
               searched=True),
        Preset("dice", {"p": _percent(90)}, f"{_CONFIGS}/dice.yml: p 90, APS_mode False (sweep p_list [90], "
               "unused); dice_postprocessor.py: the mean activation of id_loader_dict['train'], np.percentile of "
               "the contributions", "dice", fit_split="id_train"),
        Preset("vim", {"d": 256}, f"{_CONFIGS}/vim.yml: dim 256, APS_mode True (sweep dim_list [256, 1000]); "
               "vim_postprocessor.py: fitted on id_loader_dict['train']", "vim", searched=True, fit_split="id_train",
               notes="dim >= D (1000 on a 512-wide ResNet-18) leaves OpenOOD an empty residual; the project takes "
                     "D // 2 there"),
        Preset("knn", {"k": 50}, f"{_CONFIGS}/knn.yml: K 50, APS_mode True (sweep K_list [50, 100, 200, 500, "
               "1000]); knn_postprocessor.py: faiss IndexFlatL2 over the normalised features of "
               "id_loader_dict['train'] (the whole training list)", "knn", searched=True, fit_split="id_train",
               notes="OpenOOD scores minus the squared distance of x/|x| + 1e-10, the project minus the distance of "
                     "x/max(|x|, 1e-12): the same ranking but for the 1e-10 offset; fit on the whole training list "
                     "(not knn_imagenet's 1% sample)"),
        Preset("mahalanobis", {"shrinkage": 0.0}, f"{_CONFIGS}/mds.yml: no postprocessor_args, APS_mode False; "
               "mds_postprocessor.py: class means and sklearn EmpiricalCovariance of the class-centred features of "
               "id_loader_dict['train']", "mds", fit_split="id_train",
               notes="OpenOOD scores max_c -(x-μ_c)ᵀΣ⁻¹(x-μ_c) with Σ = S/N (no ridge), the project -½ of it with S "
                     "(+1e-6 I): a factor 2N, the same ranking"),
        Preset("relative_mahalanobis", {"shrinkage": 0.0}, f"{_CONFIGS}/rmds.yml: no postprocessor_args, APS_mode "
               "False; rmds_postprocessor.py: fitted on id_loader_dict['train']", "rmds", fit_split="id_train",
               notes="OpenOOD's distances are N times the project's (Σ = S/N): the same ranking"),
        Preset("adascale_a", _ADASCALE_ARGS, f"{_CONFIGS}/adascale_a.yml: {_ADASCALE_READ}", "adascale_a",
               searched=True, fit_split="id_val", notes=_ADASCALE_NOTE),
        Preset("adascale_l", _ADASCALE_ARGS, f"{_CONFIGS}/adascale_l.yml: {_ADASCALE_READ}", "adascale_l",
               searched=True, fit_split="id_val", notes=_ADASCALE_NOTE),
        Preset("she", {}, f"{_CONFIGS}/she.yml: metric inner_product, APS_mode False; she_postprocessor.py: the "
               "mean feature of the correctly predicted samples of id_loader_dict['train'] per class", "she",
               fit_split="id_train",
               notes="a class without a correctly predicted training sample is NaN in OpenOOD, refused here"),
        Preset("nci", {"alpha": 0.0001}, f"{_CONFIGS}/nci.yml: alpha 0.0001, APS_mode True (sweep alpha_list "
               "[0.0001, 0.001, 0.01, 0.1]); nci_postprocessor.py: the mean feature of id_loader_dict['train']",
               "nci", searched=True, fit_split="id_train",
               notes="a feature exactly at the training mean is 0 / 0 in OpenOOD, pScore 0 here"),
        Preset("fdbd", {"distance_to_mean": True}, f"{_CONFIGS}/fdbd.yml: distance_as_normalizer True, APS_mode "
               "True (sweep distance_as_normalizer_list [True, False]); fdbd_postprocessor.py: the mean feature of "
               "id_loader_dict['train']", "fdbd", searched=True, fit_split="id_train",
               notes="OpenOOD sums the boundary distances over the classes, the project averages over the C - 1 "
                     "others: a factor C - 1, the same ranking; the project floors the distance at 1e-8"),
        Preset("gradnorm", {"temperature": 1.0}, f"{_CONFIGS}/gradnorm.yml: no postprocessor_args, APS_mode False; "
               "gradnorm_postprocessor.py: the L1 norm of the fc weight's gradient of sum_c -log softmax(z)_c (no "
               "temperature: T = 1)", "gradnorm",
               notes="OpenOOD's loss sums over the C classes, the project's KL divergence averages: a factor C, the "
                     "same ranking"),
        Preset("vra", {"upper_percentile": _percent(90), "lower_percentile": _percent(10)},
               f"{_CONFIGS}/vra.yml: percentile_high 90, percentile_low 10, APS_mode True (sweep percentile_high_list "
               "[85, 90, 95, 99], percentile_low_list [1, 5, 10, 15]); vra_postprocessor.py: np.percentile of the "
               "flattened activations of id_loader_dict['val']", "vra", searched=True, fit_split="id_val",
               notes="OpenOOD computes both clips on the ID validation activations (fit_split id_val)"),
        Preset("nnguide", {"k": 100}, f"{_CONFIGS}/nnguide.yml: K 100, alpha 0.01, APS_mode False (sweep K_list "
               "[100], alpha_list [0.01]); nnguide_postprocessor.py: the bank is the batches of "
               "id_loader_dict['train'] up to the first past alpha * N images", "nnguide", fit_split="id_train",
               notes="OpenOOD's bank is the first batches of its (shuffled) training loader past 1% of the images; "
                     "the project's is nnguide's default_fit, a seeded class-balanced 1% of the fit set (OpenOOD's "
                     "alpha; --fit-arg nnguide.fraction=F); OpenOOD normalises as x/|x| + 1e-10 (the offset on every "
                     "element), the project as x/max(|x|, 1e-12)"),
        Preset("klm", {}, f"{_CONFIGS}/klm.yml: no postprocessor_args, APS_mode False; kl_matching_postprocessor.py: "
               "the mean softmax of the samples of id_loader_dict['val'] predicted as each class", "klm",
               fit_split="id_val",
               notes="OpenOOD fits the class-typical softmax on the ID validation list (fit_split id_val), as the "
                     "paper does; a class no validation sample is predicted as gets a one-hot posterior there (an "
                     "infinite divergence for any softmax that is not exactly that one-hot) and is left out here"),
        Preset("openmax", {"tailsize": 20, "alpha": 3, "euclidean_weight": 1.0, "cosine_weight": 0.0},
               f"{_CONFIGS}/openmax.yml: APS_mode False, no OpenMax arguments (its postprocessor_args are another "
               "method's, unused); openmax_postprocessor.py: weibull_tail 20, weibull_alpha 3, distance 'euclidean' "
               "(hard-coded), fitted on the correctly classified samples of id_loader_dict['train'], libmr "
               "fit_high", "openmax", fit_split="id_train",
               notes="OpenOOD's confidence is -P(unknown), the project's score; its eu_weight 0.5 applies to 'eucos' "
                     "only (unused); the paper's code uses alpha 10 and eucos (the project's defaults)"),
    )


def _odin_note(benchmark: str) -> str:
    std = INPUT_STD[benchmark]
    steps = ", ".join(f"{0.0014 / s:.5f}" for s in std)
    return _ODIN_NOTE.format(std=std, steps=f"({steps})")


def _build_presets() -> Mapping[str, Mapping[str, Preset]]:
    presets = {}
    for benchmark in BENCHMARKS:
        entries = {}
        for entry in _openood_entries():
            if entry.detector == "odin":
                entry = Preset(entry.detector, entry.parameters, entry.source, entry.openood_name,
                               searched=entry.searched, fit_split=entry.fit_split, notes=_odin_note(benchmark))
            entries[entry.detector] = entry
        if benchmark in _NAC_FILES:  # the authors' file of the benchmark (none for imagenet200)
            entries["nac"] = _nac_entry(benchmark)
        presets[benchmark] = MappingProxyType(entries)
    return MappingProxyType(presets)


PRESETS: Mapping[str, Mapping[str, Preset]] = _build_presets()
"""OpenOOD v1.5's parameters: benchmark (:data:`BENCHMARKS`) -> project detector name -> :class:`Preset`."""

OPENOOD_NAMES = MappingProxyType({entry.openood_name: entry.detector for entry in PRESETS["cifar10"].values()})
"""OpenOOD's postprocessor name -> the project's detector name (``ash -> ash_b``, ``mds -> mahalanobis``, ...)."""

NOT_MAPPED = MappingProxyType({
    "temp_scaling": "no project detector: MSP at a temperature fitted on ID val by NLL",
    "mds_ensemble": "no project detector (Lee et al.'s multi-layer Mahalanobis with input pre-processing)",
    "gram": "no project detector (Gram matrices of every layer)",
    "rankfeat": "no project detector (rank-1 feature removal)",
    "residual": "no project detector (ViM's residual alone)",
    "relation": "no project detector", "iodin": "no project detector", "grood": "no project detector",
    "cfood": "no project detector", "ssd": "no project detector",
    "dropout": "not the project's mc_dropout: OpenOOD takes the max softmax of the mean logits of its passes, the "
               "project the negative entropy of the mean softmax",
    "ensemble": "not the project's ensemble_softmax: OpenOOD takes the max softmax of the members' mean logits, the "
                "project the max of their mean softmax",
})
"""OpenOOD v1.5's post-hoc postprocessors without a project detector, and why (its training-time methods, e.g.
``cider``, ``godin``, ``mos``, ``npos``, ``rotpred``, ``t2fnorm``, ``mcd``, need their own training, not a
detector)."""

MISSING_PRESETS = MappingProxyType({
    ("imagenet200", "nac"): "the authors' fork, whose runs OpenOOD v1.5 lists, reads nac_<id_name>.yml per benchmark "
                            "and has no nac_imagenet200.yml: no values to give (--preset paper, or its --kappa-arg)",
})
"""(benchmark, detector) pairs without an ``openood`` preset although the detector has one elsewhere, and why."""

SEARCH_GRIDS: Mapping[str, Mapping[str, tuple[Any, ...]]] = MappingProxyType({
    "energy": MappingProxyType({}),
    "odin": MappingProxyType({"temperature": (1.0, 10.0, 100.0, 1000.0), "epsilon": (0.0014, 0.0028)}),
    "gen": MappingProxyType({"gamma": (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0), "M": (10, 50, 100, 200, 500, 1000)}),
    "react": MappingProxyType({"percentile": tuple(_percent(p) for p in (85, 90, 95, 99))}),
    "ash_b": MappingProxyType({"percentile": tuple(_percent(p) for p in (65, 70, 75, 80, 85, 90, 95))}),
    "scale": MappingProxyType({"percentile": tuple(_percent(p) for p in (65, 70, 75, 80, 85, 90, 95))}),
    "vim": MappingProxyType({"d": (256, 1000)}),
    "knn": MappingProxyType({"k": (50, 100, 200, 500, 1000)}),
    "adascale_a": MappingProxyType({"p_min,p_max": _ADASCALE_PAIRS}),
    "adascale_l": MappingProxyType({"p_min,p_max": _ADASCALE_PAIRS}),
    "nci": MappingProxyType({"alpha": (0.0001, 0.001, 0.01, 0.1)}),
    "fdbd": MappingProxyType({"distance_to_mean": (True, False)}),
    "vra": MappingProxyType({"upper_percentile": tuple(_percent(p) for p in (85, 90, 95, 99)),
                             "lower_percentile": tuple(_percent(p) for p in (1, 5, 10, 15))}),
    "nac": _nac_grid("imagenet1k"),
})
"""OpenOOD's ``postprocessor_sweep`` of every postprocessor it searches (``APS_mode: True``), in the project's
names and units (see each :class:`Preset`'s ``source`` for the values as read), the parameters in OpenOOD's key
order (which :func:`grid_combinations` follows); a key ``"a,b"`` searches the pairs its values list (AdaSCALE's
percentile ranges ``[p_min, p_max]``) jointly. ``energy`` has one combination: OpenOOD's only temperature, 1,
is the project's energy. It is benchmark-independent: the sweep files are the same for every benchmark, but NAC's,
whose fork reads one file per benchmark (:data:`BENCHMARK_SEARCH_GRIDS`): its entry here is ImageNet-1K's, the
benchmark of its defaults, used where a search names no benchmark of OpenOOD's."""

BENCHMARK_SEARCH_GRIDS: Mapping[str, Mapping[str, Mapping[str, tuple[Any, ...]]]] = MappingProxyType({
    "nac": MappingProxyType({benchmark: _nac_grid(benchmark) for benchmark in _NAC_FILES}),
})
"""The detectors whose sweep differs per benchmark: detector -> benchmark -> grid (NAC: 256 combinations on
CIFAR-10, 288 on CIFAR-100, 576 on ImageNet-1K, each three per-layer tuples searched jointly)."""


def search_grid(detector: str, benchmark: str | None = None) -> Mapping[str, tuple[Any, ...]]:
    """The OpenOOD search grid of ``detector``: its benchmark's (:data:`BENCHMARK_SEARCH_GRIDS`) where it has one,
    else :data:`SEARCH_GRIDS`'s.

    Raises:
        ValueError: a detector OpenOOD does not search.
    """
    per_benchmark = BENCHMARK_SEARCH_GRIDS.get(detector, {})
    if benchmark in per_benchmark:
        return per_benchmark[benchmark]
    if detector not in SEARCH_GRIDS:
        raise ValueError(f"no OpenOOD search grid for detector {detector!r}; OpenOOD searches {sorted(SEARCH_GRIDS)} "
                         "(give a grid)")
    return SEARCH_GRIDS[detector]


# --------------------------------------------------------------------------------------------- presets
def _check_benchmark(benchmark: str) -> None:
    if benchmark not in BENCHMARKS:
        alias = next((ours for ours, theirs in OPENOOD_BENCHMARKS.items() if theirs == benchmark != ours), None)
        hint = f" (OpenOOD's {benchmark!r} is {alias!r} here)" if alias else ""
        raise ValueError(f"unknown benchmark {benchmark!r}{hint}; the presets are for {list(BENCHMARKS)}")


def preset_entry(preset: str, benchmark: str, detector: str) -> Preset:
    """The :class:`Preset` of ``detector`` on ``benchmark`` in ``preset`` (:data:`PRESET_NAMES`): ``openood``
    from :data:`PRESETS`, ``paper`` the project's defaults of any registered detector.

    Raises:
        ValueError: an unknown preset or benchmark (naming the valid ones), or a detector the preset lacks (naming
            the detectors it has, and the project's name of an OpenOOD postprocessor's).
    """
    if preset not in PRESET_NAMES:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESET_NAMES)}")
    _check_benchmark(benchmark)
    if preset == "paper":
        registered = detectors()
        if detector not in registered:
            raise ValueError(f"preset 'paper' has no detector {detector!r}; it has the registered detectors "
                             f"{sorted(registered)}")
        cls = registered[detector]
        parameters = cls.arguments()
        split = ("id_val" if cls.fit_split == "val" else "id_train") if cls.fit_data else None
        return Preset(detector, parameters, f"{cls.__module__}.{cls.__qualname__}: the constructor's defaults "
                      f"({cls.paper or 'the project'})", fit_split=split)
    entries = PRESETS[benchmark]
    if detector not in entries:
        if (benchmark, detector) in MISSING_PRESETS:
            why = f" on {benchmark} ({MISSING_PRESETS[(benchmark, detector)]})"
        elif detector in OPENOOD_NAMES and OPENOOD_NAMES[detector] != detector:
            why = f": OpenOOD's {detector!r} is the project's {OPENOOD_NAMES[detector]!r}"
        elif detector in NOT_MAPPED:
            why = f" (OpenOOD's {detector!r}: {NOT_MAPPED[detector]})"
        else:
            why = " (OpenOOD v1.5 has no counterpart of it)"
        raise ValueError(f"preset 'openood' has no detector {detector!r}{why}; it has {sorted(entries)}")
    return entries[detector]


def preset_parameters(preset: str, benchmark: str, detector: str) -> dict[str, Any]:
    """The hyperparameters of ``detector`` on ``benchmark`` in ``preset`` (``"openood"`` or ``"paper"``), for
    :func:`metrics.detectors.build_detector` or a command's ``kappa_args`` (a copy: :func:`preset_entry` gives the
    source and the fit split).

    Raises:
        ValueError: as :func:`preset_entry`.
    """
    return dict(preset_entry(preset, benchmark, detector).parameters)


# --------------------------------------------------------------------------------------------- the search
def grid_combinations(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of ``grid`` in OpenOOD's search order (``Evaluator.recursive_generator``): the *first*
    parameter varies fastest (``{"gamma": [a, b], "M": [x, y]}`` -> (a, x), (b, x), (a, y), (b, y)). An empty grid
    is one empty combination."""
    names = list(grid)
    combinations = [dict(zip(names, reversed(values), strict=True))
                    for values in itertools.product(*(tuple(grid[name]) for name in reversed(names)))]
    return [{name: value for key, joint in combination.items()
             for name, value in (zip(key.split(","), joint, strict=True) if "," in key else [(key, joint)])}
            for combination in combinations]


@dataclass(frozen=True)
class TuneResult:
    """OpenOOD's automatic parameter search of one detector (:func:`tune`).

    Attributes:
        detector: the detector's name.
        grid: the searched values per parameter.
        combinations: every combination, in search order (:func:`grid_combinations`).
        aurocs: each combination's AUROC of the ID val scores against the OOD val scores (ID positive).
        index: the chosen combination's position: the first with the highest AUROC.
    """

    detector: str
    grid: Mapping[str, tuple[Any, ...]]
    combinations: tuple[Mapping[str, Any], ...]
    aurocs: tuple[float, ...]
    index: int

    @property
    def parameters(self) -> dict[str, Any]:
        """The chosen values (a copy)."""
        return dict(self.combinations[self.index])

    @property
    def auroc(self) -> float:
        """The chosen combination's validation AUROC."""
        return self.aurocs[self.index]


ScoreFn = Callable[[dict[str, Any]], tuple[Tensor, Tensor]]


def tune(detector: str | type[Detector], grid: Mapping[str, Sequence[Any]] | None, score_fn: ScoreFn, *,
         benchmark: str | None = None) -> TuneResult:
    """OpenOOD v1.5's automatic parameter search (``Evaluator.hyperparam_search``): score every combination of
    ``grid`` and choose the one with the highest AUROC of the ID validation scores against the OOD validation
    scores; among equal AUROCs the first in search order (OpenOOD keeps a combination only if ``auroc >
    max_auroc``), the search order being :func:`grid_combinations`'s (the first parameter fastest).

    AUROC is :func:`metrics.auroc` (ID positive, ties ½), which equals OpenOOD's ``compute_all_metrics`` AUROC
    (OOD positive on the negated score, sklearn's trapezoids); it is exact here, where sklearn's float sums can
    break a tie. One deviation: OpenOOD starts from ``max_auroc = 0``, so a grid whose every AUROC is 0 leaves it
    without a choice (an error); here the first combination is chosen.

    Args:
        detector: the detector's name (or class); its hyperparameters are the grid's keys.
        grid: parameter -> the values to try, in the project's names and units; ``None``: :func:`search_grid`'s.
        score_fn: ``score_fn(parameters) -> (id_val_scores (N,), ood_val_scores (M,))``, the detector built with
            ``parameters`` (the combination; the defaults apply to the rest) and fitted as its preset says, scoring
            the ID and OOD validation sets (:data:`SEARCH_SETS`), higher = more in-distribution.
        benchmark: the benchmark searched (``imagenet1k``, ...), for a detector whose sweep depends on it (NAC).

    Returns:
        The grid, every combination's AUROC and the chosen combination (:class:`TuneResult`).

    Raises:
        ValueError: a grid key that is not a hyperparameter of the detector, an empty list of values, an invalid
            value (every combination is checked before ``score_fn`` runs), no grid for the detector, or scores that
            are not a pair of valid non-empty score vectors (naming the combination).
    """
    cls = resolve_detector(detector)
    name = cls.name
    if grid is None:
        grid = search_grid(name, benchmark)
    if not isinstance(grid, Mapping):
        raise ValueError(f"tune {name!r}: the grid is a mapping parameter -> values, got {grid!r}")
    checked: dict[str, tuple[Any, ...]] = {}
    known = cls.hyperparameter_defaults()
    for parameter, values in grid.items():
        unknown = [part for part in parameter.split(",") if part not in known]  # "a,b": searched jointly
        if unknown and not cls.open_hyperparameters():
            raise ValueError(f"tune {name!r}: the grid's {unknown[0]!r} is not a hyperparameter of the detector; it "
                             f"takes {sorted(known) or 'none'}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"tune {name!r}: the grid's {parameter!r} needs a non-empty list of values, got "
                             f"{values!r}")
        checked[parameter] = tuple(values)
    combinations = grid_combinations(checked)
    for combination in combinations:  # every value checked before any scoring
        try:
            cls.arguments(**combination)
        except ValueError as error:
            raise ValueError(f"tune {name!r}: the grid's combination {combination} is invalid: {error}") from None
    aurocs: list[float] = []
    index = 0
    for position, combination in enumerate(combinations):
        result = score_fn(dict(combination))
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise ValueError(f"tune {name!r}: score_fn({combination}) must return (id_val_scores, ood_val_scores), "
                             f"got {type(result).__name__}")
        id_scores, ood_scores = (torch.as_tensor(s) if not isinstance(s, Tensor) else s for s in result)
        try:
            value = auroc(id_scores, ood_scores)
        except ValueError as error:
            raise ValueError(f"tune {name!r}: the scores of {combination}: {error}") from None
        if math.isnan(value):
            raise ValueError(f"tune {name!r}: the AUROC of {combination} is NaN")
        aurocs.append(value)
        if value > aurocs[index]:  # strictly: the first of equal AUROCs stays (OpenOOD's `auroc > max_auroc`)
            index = position
    return TuneResult(name, MappingProxyType(checked), tuple(MappingProxyType(c) for c in combinations),
                      tuple(aurocs), index)


__all__ = [
    "BENCHMARKS", "BENCHMARK_SEARCH_GRIDS", "FIT_SPLITS", "INPUT_STD", "MISSING_PRESETS", "NAC_COMMIT",
    "NAC_REPOSITORY", "NOT_MAPPED", "OPENOOD_BENCHMARKS", "OPENOOD_COMMIT",
    "OPENOOD_COMMIT_DATE", "OPENOOD_NAMES", "OPENOOD_REPOSITORY", "OPENOOD_VERSION", "PRESETS", "PRESET_NAMES",
    "SEARCH_GRIDS", "SEARCH_SETS", "Preset", "TuneResult", "grid_combinations", "preset_entry", "preset_parameters",
    "search_grid", "tune",
]
