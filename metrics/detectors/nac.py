"""NAC-UE: neuron activation coverage of the states of chosen layers, a histogram per neuron fitted on training
images.

Liu, Tian, Li, Ma, Wang, *Neuron Activation Coverage: Rethinking Out-of-distribution Detection and Generalization*,
ICLR 2024 (the authors' code, github.com/BierOne/ood_coverage: ``openood/postprocessors/nac_postprocessor.py`` and
``nac/coverage.py``, ``instr_state.py``, ``utils.py``; its results are OpenOOD v1.5's NAC-UE rows, e.g. ImageNet-1K
ResNet-50 far-OOD AUROC 95.29). For each chosen layer ``l`` with output ``o`` (``(C_l, H, W)`` maps, ``(T, C_l)``
tokens or ``(C_l,)``) and the logits ``z`` of ``C`` classes:

    L(x)      = -(1/C) Σ_c log softmax(z)_c  = KL(u ‖ softmax(z)) + log C    (u uniform; the authors' ``kl_grad``)
    g         = ∂L/∂o                                            (one backward per image, all layers at once)
    s_n(x)    = (Σ_{h,w} o_n) · (Σ_{h,w} g_n)                    (sums over the positions (tokens); the authors'
                                                                  ``avg_pooling`` sums, "the denominator can be
                                                                  scaled by sigmoid smooth")
    v_n(x)    = 1 / (1 + exp(-α_l · s_n(x)))                     (the state, ``sigmoid(o*g_kl)``)
    t_0..t_{M-1}                                                  bin edges: the authors' ``logspace(1e3, M)``, below
    A_{n,j}   = #{fit images with t_j <= v_n < t_{j+1}}          (j = 0..M-2: M - 1 intervals per neuron)
    φ_{n,j}   = min(A_{n,j} / O*_l, 1)                           (the coverage of a bin)
    score(x)  = Σ_l (1/L) · mean_n φ_{n, j_n(x)}                 (j_n(x): the bin v_n(x) falls in; none: 0)

The edges, for even ``M`` (the authors' code breaks on an odd ``M``, refused here): with ``h = M/2`` and
``e_i = log(1 + i·(√1000 - 1)/(h - 1)) / log 1000`` (``e_0 = 0 .. e_{h-1} = 0.5``), the edges are ``e_0 .. e_{h-2}``,
then ``1 - e_{h-1-i}`` for ``i = 0..h-1`` (``0.5 .. 1``), the last raised to ``1.01``, and ``1.2`` appended (numpy's
float64 operations as in the authors' ``logspace``: their edges bit for bit). They are dense around 0.5, a state
``s`` near 0, where the sigmoid is steep, and coarse near 0 and 1. pytorch-ood 0.4.0's ``NACUE`` (marked
``ai_coded``) differs: geometric bins dense near 0 and 1 (``logspace(1e-6, 0.5)`` mirrored, right-closed), the state
of the mean over the positions of the product ``o ⊙ g`` (not the product of the sums), ``log(p + 1e-12)`` in the
loss, and the layers' coverages summed (here averaged: a factor ``L``) and negated. With its bins replaced by the
authors' and on layers whose outputs have one position (where the mean of the product is the product of the sums),
it scores ``-L`` times these scores (tested).

Defaults: the authors' ImageNet ResNet-50 setting (``configs/postprocessors/nac/resnet/nac_imagenet.yml`` and the
README's command ``imagenet_test_ood_nac.sh resnet50 64 1000 "avgpool layer3 layer2 layer1" aps``): ``layers``
``avgpool, layer3, layer2, layer1`` (torchvision's module names; timm's ResNets call the pooling ``global_pool``,
which ``avgpool`` finds there: :data:`ALIASES`),
per layer ``alpha`` (their ``sig_alpha``) ``3000, 300, 0.01, 1``, ``bins`` (``M``) ``50, 50, 500, 1000`` and
``o_star`` (``O``) ``10, 500, 50, 5000``; the file's ``layer_kwargs``, its ``postprocessor_sweep`` the
``openood`` preset's search (:mod:`metrics.detectors.presets`). Every layer takes the ``sigmoid(o*g_kl)`` state, the
configs' only ``method``. The fit: 1,000 training images, class-balanced (``valid_num: 1000``, their
``TrainSubset(balanced=True)``: ``⌊1000 / K⌋`` per class, 1 per class on ImageNet-1K, 100 on CIFAR-10), so
``default_fit = {"images": 1000}`` (the engine's seeded class-balanced choice of 1,000 images; ``--fit-arg
nac.images=N`` for another count); the authors' seed differs (numpy's ``RandomState(1)`` per class).

Names are resolved in the network the pass receives, unwrapped as :func:`lightning_modules.scoring.penultimate_features`
does (a module's ``network``, a project classifier's ``network.backbone``), else as paths of the module itself;
a missing name is refused naming the network's children. A module whose output a later in-place operation changes
(a ``ReLU(inplace=True)`` after it) gives the states after that operation, as the authors' hooks do. Background-class
models: ``L`` over the ``K`` known logits. Where the authors take ViT's final norm at the class token, a ``(T, C)``
output is summed over its tokens here (their pooling of ViT's other layers).

The detector's own pass (:meth:`NAC.image_outputs`; 1 forward and 1 backward per image, no shared pass) gives
``s`` of every neuron of every layer, concatenated (``nac/states``), and each layer's width (``nac/widths``): the
pass depends on ``layers`` only, so a search over ``alpha``, ``bins`` and ``o_star`` (fit and score) reruns no
backward. Float64 from the layer outputs on (the engine keeps pass outputs in float32: fit and test states are
rounded alike); the authors' coverages are float32 (``t_act`` is a float32 tensor), the states too.

Tested against a reference written from the authors' logic (hooks, ``kl_grad`` per layer with ``retain_graph``,
the pooling, ``Estimator`` with its broadcast comparisons and ``get_score``/``ood_test``, unchunked) on a small
network in float64, with and without a background class: the states agree bit for bit and the scores to 1.1e-16
(the order of float64 sums), also on states with ties (a grid of values; a state of 0 has the sigmoid 0.5, an edge
of every ``M``); against pytorch-ood's ``NACUE`` configured as above to 1.5e-7 (its coverages are divided in
float32), which with its own geometric bins differs by up to 0.47 on the same network.

Memory: the fit keeps the counts, ``Σ_l n_l (M_l - 1)`` int64 (the defaults on ResNet-50: 661,760 counts, 5.3 MB),
and one chunk's temporaries, ``O(chunk · W)`` with ``W = Σ_l n_l`` neurons (3,840 for the defaults) and chunk =
``CHUNK_ELEMENTS / (4 W)`` rows (256 MiB); nothing ``N``-sized besides the pass's states themselves (the default
fit: 1,000 × 3,840 float32, 15 MB; all 1,281,167 ImageNet images would be 19.7 GB of pass outputs). Measured
(``openset_common.resources.measure``, 3,840 states of the defaults' widths): the fit peaks 0.2-0.3 GiB above 20,000
and 60,000 images' states alike (0.4 ms an image on a shared 2-core CPU), the score 0.26 GiB. Scoring: the coverages
(float64, as many as the counts) and ``O(chunk · W)``. The pass holds one batch's activations for its backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metrics.detectors.base import Detector, check_finite_rows, chunk_rows, row_chunks
from metrics.detectors.registry import register_detector

STATES = "nac/states"
"""The key of the states ``s`` ``(N, W)`` (every layer's neurons, in the order of ``layers``) in the own pass."""
WIDTHS = "nac/widths"
"""The key of each layer's width ``(N, L)`` (the same in every row) in the own pass."""

DEFAULT_LAYERS = ("avgpool", "layer3", "layer2", "layer1")
"""The authors' ImageNet ResNet-50 layers (their README's command), in their config's order."""

LAYER_DEFAULTS = {"avgpool": (3000.0, 50, 10), "layer3": (300.0, 50, 500), "layer2": (0.01, 500, 50),
                  "layer1": (1.0, 1000, 5000)}
"""The authors' ImageNet ResNet-50 ``(sig_alpha, M, O)`` of each layer, by name (``nac_imagenet.yml``'s
``layer_kwargs``, keyed by layer as there): the defaults of ``alpha``, ``bins`` and ``o_star`` for the layers named."""

TEMPORARIES = 4
"""``rows × W`` temporaries of a chunk (the states, their sigmoid, the bins, the flat indices)."""

ALIASES = {"avgpool": "global_pool", "global_pool": "avgpool"}
"""One pooling's two names: torchvision's ResNets call it ``avgpool`` (the authors' name), timm's ``global_pool``; a
name the network lacks is looked up under its other name, so the defaults serve both."""

EDGE_BASE = 1000.0
"""The base of the authors' ``logspace(1e3, M)``."""


def bin_edges(bins: int) -> Tensor:
    """The authors' ``M`` bin edges ``(M,)`` float64 (``coverage.py`` ``logspace(base=1e3, num=M)``; see the module
    docstring), for an even ``M >= 4``: ``M - 1`` intervals ``[t_j, t_{j+1})``."""
    half = bins // 2
    positions = np.linspace(1.0, np.sqrt(EDGE_BASE), num=half)
    lower = np.log(positions) / np.log(EDGE_BASE)  # numpy's emath.logn(base, x), the same operations
    edges = np.concatenate([lower[:-1], (1.0 - lower)[::-1]])
    edges[-1] += 1e-2
    return torch.from_numpy(np.append(edges, 1.2))


def state_sigmoid(states: Tensor, alpha: float) -> Tensor:
    """``1 / (1 + exp(-α s))`` in float64, written as the authors' ``sigmoid`` (``torch.sigmoid`` can differ in the
    last bit, which can move a state across a bin edge)."""
    return 1 / (1 + torch.exp(-alpha * states.to(torch.float64)))


def bin_indices(values: Tensor, edges: Tensor) -> tuple[Tensor, Tensor]:
    """The interval ``j`` with ``t_j <= v < t_{j+1}`` of each value, and whether it has one (``0 <= v < t_{M-1}``)."""
    index = torch.searchsorted(edges, values.contiguous(), right=True) - 1
    inside = (index >= 0) & (index < edges.numel() - 1)
    return index.clamp(0, edges.numel() - 2), inside


def pooled(values: Tensor) -> Tensor:
    """A layer output (or its gradient) per neuron, float64: ``(B, C)`` as it is, ``(B, C, H, W)`` summed over the
    positions, ``(B, T, C)`` summed over the tokens (the authors' pooling of ResNets and of ViT's MLP layers).
    Maps are channels first: a channels-last stage (timm's Swin, ``(B, H, W, C)``) would be pooled over the wrong
    axes, so name a layer of such a network whose output is ``(B, T, C)`` or ``(B, C)``."""
    values = values.to(torch.float64)
    if values.ndim == 2:
        return values
    if values.ndim == 3:
        return values.sum(dim=1)
    if values.ndim == 4:
        return values.sum(dim=(2, 3))
    raise ValueError(f"a layer's output of shape {tuple(values.shape)}: NAC takes (B, C), (B, T, C) tokens or "
                     "(B, C, H, W) maps")


def network_of(model: nn.Module) -> nn.Module:
    """The network whose modules ``layers`` name: a module's ``network`` (a ``ScoringModel``, a project classifier and
    its ``OpenSetNetwork``) and then its ``backbone`` (the project's classifiers), as
    :func:`lightning_modules.scoring.penultimate_features` reaches the features."""
    network = model
    for _ in range(4):  # ScoringModel -> OpenSetClassifier -> OpenSetNetwork
        inner = getattr(network, "network", None)
        if not isinstance(inner, nn.Module):
            break
        network = inner
    backbone = getattr(network, "backbone", None)
    return backbone if isinstance(backbone, nn.Module) else network


def _as_tuple(name: str, value: Any, layers: tuple[str, ...], *, detector: str) -> tuple[Any, ...]:
    if value is None:  # the authors' value of each layer, by its name
        position = ("alpha", "bins", "o_star").index(name)
        unknown = [layer for layer in layers if layer not in LAYER_DEFAULTS and ALIASES.get(layer) not in LAYER_DEFAULTS]
        if unknown:
            raise ValueError(f"detector {detector!r}: no default {name} for the layers {unknown} (the authors' values "
                             f"are for {list(LAYER_DEFAULTS)}): give alpha, bins and o_star, one per layer in the "
                             f"order of layers or one for all (--kappa-arg {detector}.{name}=[...])")
        return tuple(LAYER_DEFAULTS[layer if layer in LAYER_DEFAULTS else ALIASES[layer]][position] for layer in layers)
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,) * len(layers)
    if len(values) != len(layers):
        raise ValueError(f"detector {detector!r}: {name} gives {len(values)} values for the {len(layers)} layers "
                         f"{list(layers)}; give one per layer (in their order) or one for all (by default each named "
                         f"layer takes the authors' value: {list(LAYER_DEFAULTS)})")
    return values


def _check_alpha(value: Any, *, detector: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"detector {detector!r}: alpha (the sigmoid's steepness) must be a positive finite number per "
                         f"layer, got {value!r}")
    return float(value)


def _check_bins(value: Any, *, detector: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 4 or value % 2:
        raise ValueError(f"detector {detector!r}: bins (the authors' M, M - 1 intervals) must be an even integer >= 4 "
                         f"per layer (their edges have M entries only for an even M), got {value!r}")
    return int(value)


def _check_o_star(value: Any, *, detector: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"detector {detector!r}: o_star (the authors' O, the count of a fully covered bin) must be an "
                         f"integer >= 1 per layer, got {value!r}")
    return int(value)


def _check_layers(value: Any, *, detector: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in value.split(",")) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or \
            not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"detector {detector!r}: layers must name modules of the network ('avgpool,layer3' or a "
                         f"list of names), got {value!r}")
    names = tuple(n.strip() for n in names)
    if len(set(names)) != len(names):
        raise ValueError(f"detector {detector!r}: layers name a module twice: {list(names)}")
    return names


@register_detector
class NAC(Detector):
    """NAC-UE score, the mean coverage of the bins a sample's neuron states fall in (see the module docstring).

    Hyperparameters (one value per layer, in the order of ``layers``, or one for all):
        layers: the modules whose outputs are covered, by name in the network (``"avgpool,layer3,layer2,layer1"``
            or a list; default the authors' ResNet-50 ImageNet layers). The only one the own pass depends on.
        alpha: the sigmoid's steepness ``α`` (the authors' ``sig_alpha``; default 3000, 300, 0.01, 1).
        bins: ``M``, the number of bin edges (``M - 1`` intervals; even, >= 4; default 50, 50, 500, 1000).
        o_star: ``O*``, the fit count at which a bin is fully covered (the authors' ``O``; default 10, 500, 50, 5000).

    The defaults (``None``) are the authors' values of each layer by its name (:data:`LAYER_DEFAULTS`, for avgpool,
    layer3, layer2, layer1 in any order or subset); other layers need the values given.

    Buffers: ``counts`` ``(Σ_l n_l (M_l - 1),)`` int64, the fit images per neuron and interval (layer by layer,
    neuron-major), and ``widths`` ``(L,)``, each layer's neurons.
    """

    name = "nac"
    paper = "Liu et al., ICLR 2024"
    inputs = frozenset({"model"})
    fit_data = True
    refuse_non_finite = True
    default_fit = {"images": 1000}
    fitted_buffers = ("counts", "widths")
    image_keys = (STATES, WIDTHS)
    pass_hyperparameters = ("layers",)

    def __init__(self, *, layers: str | Sequence[str] = DEFAULT_LAYERS,
                 alpha: float | Sequence[float] | None = None, bins: int | Sequence[int] | None = None,
                 o_star: int | Sequence[int] | None = None, background: bool = False) -> None:
        super().__init__(background=background)
        self.layers = _check_layers(layers, detector=self.name)
        per_layer = {name: _as_tuple(name, value, self.layers, detector=self.name)
                     for name, value in (("alpha", alpha), ("bins", bins), ("o_star", o_star))}
        self.layer_alpha = tuple(_check_alpha(v, detector=self.name) for v in per_layer["alpha"])
        self.layer_bins = tuple(_check_bins(v, detector=self.name) for v in per_layer["bins"])
        self.layer_o_star = tuple(_check_o_star(v, detector=self.name) for v in per_layer["o_star"])
        # the hyperparameters as given (None: the authors' values of the named layers), each layer's in layer_*
        self.alpha = None if alpha is None else self.layer_alpha
        self.bins = None if bins is None else self.layer_bins
        self.o_star = None if o_star is None else self.layer_o_star

    # -- the detector's own pass ----------------------------------------------------------------------
    def passes_per_image(self) -> tuple[int, int]:
        """Its own pass only: one forward keeping the layers' outputs, one backward to them."""
        return (1, 1)

    def modules_of(self, model: nn.Module) -> list[nn.Module]:
        """The modules ``layers`` name, in :func:`network_of` ``(model)`` (else as paths of ``model`` itself).

        Raises:
            ValueError: a name neither has, naming the network's children.
        """
        network = network_of(model)
        inner, outer = dict(network.named_modules()), dict(model.named_modules())
        found = []
        for name in self.layers:
            module = inner.get(name, outer.get(name))
            if module is None and name in ALIASES:
                module = inner.get(ALIASES[name], outer.get(ALIASES[name]))
            if module is None:
                children = [child for child, _ in network.named_children()]
                raise ValueError(f"detector {self.name!r}: the network {type(network).__name__} has no module "
                                 f"{name!r}; its children are {children} (name nested modules with dots, e.g. "
                                 "'layer4.2'; --kappa-arg nac.layers=NAME,NAME)")
            found.append(module)
        return found

    def image_outputs(self, model: nn.Module, images: Tensor) -> dict[str, Tensor]:
        """The states ``s`` (``nac/states``, ``(B, W)``) and the layers' widths (``nac/widths``, ``(B, L)``) of a
        batch: one forward that keeps each layer's output, one backward of ``L`` summed over the batch (each image's
        gradient is its own in eval mode) to all of them."""
        if torch.is_inference_mode_enabled():
            raise RuntimeError(f"detector {self.name!r} needs gradients, which inference mode forbids: run it under "
                               "torch.inference_mode(False) (the evaluation callbacks do)")
        modules = self.modules_of(model)
        outputs: list[list[Tensor]] = [[] for _ in modules]

        def keeper(position: int):
            def keep(_module: nn.Module, _inputs: Any, output: Any) -> None:
                outputs[position].append(output)
            return keep

        handles = [module.register_forward_hook(keeper(i)) for i, module in enumerate(modules)]
        try:
            with torch.enable_grad():
                # the input needs a gradient: the layer outputs do then, whether or not the weights are frozen
                logits = model(images.detach().clone().requires_grad_(True))
        finally:
            for handle in handles:
                handle.remove()
        if not isinstance(logits, Tensor) or logits.ndim != 2:
            raise ValueError(f"detector {self.name!r} needs a model that gives logits (N, C), got "
                             f"{tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__}")
        for name, kept in zip(self.layers, outputs, strict=True):
            if len(kept) != 1 or not isinstance(kept[0], Tensor):
                raise ValueError(f"detector {self.name!r}: layer {name!r} gave {len(kept)} outputs in one forward "
                                 f"({', '.join(type(k).__name__ for k in kept) or 'none'}); NAC covers a module that "
                                 "runs once and returns one tensor")
        layer_outputs = [kept[0] for kept in outputs]
        with torch.enable_grad():
            known = logits[:, :-1] if self.background else logits
            loss = -F.log_softmax(known.to(torch.float64), dim=1).mean(dim=1).sum()
            gradients = torch.autograd.grad(loss, layer_outputs, allow_unused=True)
        states = []
        for name, output, gradient in zip(self.layers, layer_outputs, gradients, strict=True):
            if gradient is None:
                raise ValueError(f"detector {self.name!r}: the output of layer {name!r} does not reach the logits")
            states.append(pooled(output.detach()) * pooled(gradient))
        widths = torch.tensor([s.shape[1] for s in states], dtype=torch.float64, device=logits.device)
        return {STATES: torch.cat(states, dim=1), WIDTHS: widths.expand(logits.shape[0], -1)}

    # -- fit and score ------------------------------------------------------------------------------
    def _layer_widths(self, widths: Tensor, states: Tensor, *, what: str) -> list[int]:
        if widths.ndim != 2 or widths.shape[1] != len(self.layers):
            raise ValueError(f"detector {self.name!r}: the {what} widths must be (N, {len(self.layers)}), one per "
                             f"layer of {list(self.layers)}, got {tuple(widths.shape)}: states of other layers")
        if widths.shape[0] and not torch.equal(widths, widths[:1].expand_as(widths)):
            raise ValueError(f"detector {self.name!r}: the {what} widths differ between rows")
        layer_widths = [int(w) for w in widths[0].tolist()] if widths.shape[0] else []
        if states.ndim != 2 or sum(layer_widths) != states.shape[1]:
            raise ValueError(f"detector {self.name!r}: the {what} states {tuple(states.shape)} are not the layers' "
                             f"{layer_widths} neurons")
        return layer_widths

    def _layers(self, widths: Sequence[int]) -> list[tuple[int, int, int, Tensor]]:
        """Per layer: its first column in the states, its width, its first count, its bin edges."""
        layers, column, count = [], 0, 0
        for width, bins in zip(widths, self.layer_bins, strict=True):
            layers.append((column, width, count, bin_edges(bins)))
            column += width
            count += width * (bins - 1)
        return layers

    def _rows(self, width: int) -> int:
        return chunk_rows(TEMPORARIES * max(width, 1))

    def _fit(self, data: dict[str, Tensor]) -> None:
        states = data[STATES]
        widths = self._layer_widths(data[WIDTHS], states, what="fit")
        layers = self._layers(widths)
        total = sum(w * (m - 1) for w, m in zip(widths, self.layer_bins, strict=True))
        counts = torch.zeros(total, dtype=torch.int64, device=states.device)
        for (chunk,) in row_chunks(states, rows=self._rows(states.shape[1])):
            for (column, width, start, edges), alpha, bins in zip(layers, self.layer_alpha, self.layer_bins,
                                                                  strict=True):
                index, inside = bin_indices(state_sigmoid(chunk[:, column:column + width], alpha),
                                            edges.to(chunk.device))
                flat = index + torch.arange(width, device=chunk.device) * (bins - 1)
                counts[start:start + width * (bins - 1)] += torch.bincount(flat[inside], minlength=width * (bins - 1))
        self.register_buffer("counts", counts)
        self.register_buffer("widths", torch.tensor(widths, dtype=torch.int64, device=states.device))

    def coverages(self) -> list[Tensor]:
        """Per layer, ``φ = min(A / O*, 1)`` ``(n_l, M_l - 1)`` float64."""
        result = []
        for (_, width, start, _), bins, o_star in zip(self._layers(self.widths.tolist()), self.layer_bins,
                                                      self.layer_o_star,
                                                      strict=True):
            counts = self.counts[start:start + width * (bins - 1)].to(torch.float64)
            result.append((counts / o_star).clamp(max=1).view(width, bins - 1))
        return result

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        states = outputs[STATES]
        check_finite_rows(states, what=f"detector {self.name!r}: the states to score")
        widths = self._layer_widths(outputs[WIDTHS], states, what="scored")
        if widths != self.widths.tolist():
            raise ValueError(f"detector {self.name!r} was fitted on layers of {self.widths.tolist()} neurons; the "
                             f"states to score have {widths}")
        layers, coverages = self._layers(widths), self.coverages()
        scores = []
        for (chunk,) in row_chunks(states, rows=self._rows(states.shape[1])):
            total = torch.zeros(chunk.shape[0], dtype=torch.float64, device=chunk.device)
            for (column, width, _, edges), alpha, coverage in zip(layers, self.layer_alpha, coverages, strict=True):
                index, inside = bin_indices(state_sigmoid(chunk[:, column:column + width], alpha),
                                            edges.to(chunk.device))
                covered = coverage.to(chunk.device).gather(1, index.T).T * inside
                total += covered.mean(dim=1) / len(layers)  # the authors' sum of each layer's score over L
            scores.append(total)
        return torch.cat(scores) if scores else states.new_zeros(0, dtype=torch.float64)
