"""The one detector interface of the project: an ``nn.Module`` that declares what it reads, is fitted on
in-distribution outputs, stores what it fitted as buffers, and scores samples (higher = in-distribution).

A detector reads some of these per-sample outputs of one pass of a model (its :attr:`Detector.inputs`):

    logits         ``(N, C)`` the model's logits (a background-class model's last column is its background)
    features       ``(N, D)`` the penultimate (pre-logit) features the head maps to the logits
    member_logits  ``(N, M, C)`` the logits of an ensemble's M members, sample first (the pass's ``logits`` of an
                   ensemble: one layout, fixed by the pass)
    model          the network itself and the images: the detector runs its own pass over them
                   (:meth:`Detector.image_outputs`: ODIN's input perturbation, MC dropout's passes, AdaSCALE's
                   perturbed features), with a backward where it needs input gradients
    targets        ``(N,)`` the classes ``0..K-1`` of the fit data (fit only)

and, when it declares ``"head"`` among its :attr:`Detector.inputs`, the classification head ``(W, b)`` with
``logits = features @ W.T + b`` (``W`` ``(C, D)``, ``b`` ``(C,)`` or ``None``), handed to :meth:`Detector.fit`
once: ReAct, ASH, DICE, ViM, SCALE and SHE recompute logits from shaped features.

What a detector is follows from what it reads (:attr:`Detector.kind`: ``logits``, ``features``, ``ensemble`` or
``model``) and whether it fits (:attr:`Detector.needs_fit`); its hyper-parameters are its constructor's
keyword-only arguments, declared once there (:meth:`Detector.hyperparameter_defaults`), each kept as the
attribute of its name.

``fit`` receives the outputs of the fit pass over in-distribution training images (:attr:`Detector.fit_data`
says whether it needs them; a detector that needs only the head is fitted with the head alone) and returns the
detector; the state lands in buffers (float64 where it is a statistic), so it moves with ``.to()``, rides in a
``state_dict`` and is fingerprinted (:meth:`Detector.state_fingerprint`) into every cache key that depends on
it. Scoring an unfitted detector is an error naming it.

Precision: fits and fitted state are float64 (the statistics, the banks, the head's buffers), whatever the
features' dtype; scores are float64. The one exception, and its one rule (:func:`product_dtype`): a scoring product of
the features with a fitted matrix (the head's ``W`` in :meth:`Detector.head_logits`, ViM's projection, NNGuide's bank,
DICE's masked head, WeiPer's perturbed heads, KL matching's log typical posteriors) runs in the features' precision, float32 for float32 features
(the precision the network computed them and its own logits in, the papers' and pytorch-ood's: a float64 product
takes twice as long on a CPU), float64 for float64 features (exactly as before: the casts are no-ops). Its operands
are cast once per score call (:func:`in_product_precision`); the elementwise shaping before it (a clip, a top-k, a
mask) runs in the features' dtype where that is exact, and everything after it (logsumexp, norms, ratios) in float64
from its float64 cast. Clipping float32 values at a float64 threshold rounded to float32 is exact: rounding to nearest
is monotone, so ``min(x, round(c)) = round(min(x, c))`` for every float32 ``x``, the value a float64 clip would hand
the float32 product (a threshold fitted on float32 features is a float32 value: nothing rounds). Float32 features
therefore score to float32 rounding of their float64 scores (``tests/metrics/detectors/test_base.py`` bounds it),
float64 features bit for bit as in float64 throughout.

Large fit sets: a detector reads its fit tensors in chunks of :data:`CHUNK_ROWS` rows (views of the caller's
tensors) and never builds another ``N × D`` matrix; each docstring states its memory bound. The streamed
statistics they share live here: :func:`streamed_moments` (class sums and the float64 Gram matrix in one pass),
:func:`linear_quantile` (an exact ``np.quantile`` by radix selection, without sorting), and the checks
(:func:`check_finite_rows`, the hyperparameter checks).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from openset_common.artefacts import tensors_fingerprint

Head = tuple[Tensor, Tensor | None]
"""A linear classification head ``(W (C, D), b (C,) or None)``: ``logits = features @ W.T + b``."""

INPUTS = frozenset({"logits", "features", "head", "member_logits", "model"})

KINDS = ("logits", "features", "ensemble", "model")
"""What a detector scores from: a pass's logits, its features (and the head), an ensemble's member logits, or
images through the model (:attr:`Detector.kind`)."""

FIT_SPLITS = ("train", "val")
"""The in-distribution splits a detector is fitted on (:attr:`Detector.fit_split`)."""

CHUNK_ROWS = 16384
"""Rows of a fit or score tensor processed at once (a chunk of 16384 × 2048 float64 is 256 MiB)."""

CHUNK_ELEMENTS = 1 << 25
"""Elements of one chunk's widest temporary (32M: 256 MiB float64), e.g. KNN's similarities to every fit
sample: a chunk has at most ``CHUNK_ELEMENTS // width`` rows."""


def chunk_rows(width: int = 1) -> int:
    """Rows per chunk for temporaries ``width`` wide: :data:`CHUNK_ROWS`, fewer where ``width`` is large.
    Both constants are read at call time, so a test can make them small."""
    return max(1, min(CHUNK_ROWS, CHUNK_ELEMENTS // max(int(width), 1)))


def row_chunks(*tensors: Tensor, rows: int | None = None) -> Iterator[tuple[Tensor, ...]]:
    """Consecutive row slices (views) of equally long tensors, :data:`CHUNK_ROWS` rows unless given."""
    rows = chunk_rows() if rows is None else rows
    total = tensors[0].shape[0]
    for start in range(0, total, rows):
        yield tuple(t[start:start + rows] for t in tensors)


def product_dtype(features: Tensor) -> torch.dtype:
    """The precision of a scoring product of ``features`` with a fitted float64 matrix (the module docstring's
    *Precision*): float64 for float64 features, float32 for any other dtype (float32; float16 and bfloat16 features
    are multiplied in float32)."""
    return torch.float64 if features.dtype == torch.float64 else torch.float32


def in_product_precision(features: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Fitted float64 ``tensors`` (a matrix, its offset) in :func:`product_dtype` of ``features``: float32 copies
    for float32 features, the tensors themselves for float64 ones. Called once per score call, not per chunk (a
    1000 × 2048 head takes ~8 ms, NNGuide's 12,810 × 2048 bank ~50 ms)."""
    dtype = product_dtype(features)
    return tuple(t.to(dtype) for t in tensors)


@contextmanager
def ieee_float32_products() -> Iterator[None]:
    """Float32 matrix products in IEEE float32 within the block (``torch.set_float32_matmul_precision("highest")``,
    restored after it): the ``"high"`` a Lightning user often sets lets CUDA, and oneDNN on the CPU, round a float32
    product's inputs to TF32's 10-bit mantissa (1e-3 relative), far from the float32 rounding that the product
    precision (the module docstring's *Precision*) promises. :meth:`Detector.score` runs every score in it."""
    previous = torch.get_float32_matmul_precision()
    if previous == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


class Buffers:
    """Memory reused by the chunks of one score call for their large temporaries.

    ``take(name, shape, dtype)`` hands every chunk the same memory (a view of its first elements), written with
    ``out=`` and in-place operations. A fresh ``rows × D`` temporary is mapped and faulted in page by page each
    time it is allocated (glibc maps every block above its mmap threshold, 32 MiB at most, on its own): measured on
    a 16384 × 2048 float32 chunk, a float64 copy takes 0.13 s fresh and 0.024 s into reused memory, and the
    float64 tail of a 1000-class energy (cast, bias, log-sum-exp) 0.12 s fresh against 0.06 s reused, a float32
    product of the chunk being 0.66 s."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._memory: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A contiguous ``shape`` tensor of ``dtype`` in the memory named ``name`` (its contents undefined)."""
        size = math.prod(shape)
        memory = self._memory.get(name)
        if memory is None or memory.dtype != dtype or memory.numel() < size:
            memory = self._memory[name] = torch.empty(size, dtype=dtype, device=self.device)
        return memory[:size].view(shape)

    def float64(self, values: Tensor, name: str) -> Tensor:
        """``values`` as float64: themselves if they are (never to be written then), else their copy in ``name``."""
        if values.dtype == torch.float64:
            return values
        return self.take(name, tuple(values.shape), torch.float64).copy_(values)


def logsumexp_(values: Tensor) -> Tensor:
    """``torch.logsumexp(values, dim=1)`` ``(rows,)``, computed in ``values``' own memory, which it overwrites: the same
    operations in the same order as torch's (the same bits), without its two ``rows × C`` temporaries."""
    maxes = values.amax(dim=1, keepdim=True)
    maxes.masked_fill_(maxes.abs() == math.inf, 0)
    return values.sub_(maxes).exp_().sum(dim=1).log_().add_(maxes.squeeze(1))


NUMPY_BUFFER = 1 << 16
"""Elements of numpy's cast buffer in :func:`float64_sums`: measured on 1,280,000 × 2048 float32 features (2 threads), the
mean in 0.96 s against 1.16 s at its default 8192 and 1.2 s at 2¹⁸ (a buffer outgrowing the cache)."""


def _numpy_float64_sums(array: np.ndarray, dim: int) -> np.ndarray:
    with np.errstate():  # the buffer size is scoped to it (numpy 2)
        np.setbufsize(NUMPY_BUFFER)
        return np.add.reduce(array, axis=dim, dtype=np.float64)


def float64_sums(values: Tensor, dim: int) -> Tensor:
    """``values.sum(dim)`` of a 2-D tensor accumulated in float64, without a float64 copy of ``values``.

    Float64 values: their own ``sum`` (as before). Others on the CPU: numpy's ``add.reduce(..., dtype=float64)``,
    which casts through a buffer (:data:`NUMPY_BUFFER`), the independent sums split among torch's threads (each sum
    whole in one thread: the same bits on any number of threads). Torch's ``sum(dtype=float64)`` (2.14) makes a
    float64 copy first: 0.088 against 0.014 s (one thread) for a 16384 × 2048 float32 chunk. The two orders of
    summation differ in the last bits only (measured on 131,072 × 256 float32 values: both exact on ReLU features,
    1.8e-13 against 5.6e-13 relative to ``math.fsum`` on log-normal values spanning 30 octaves). Elsewhere (a GPU):
    ``sum(dtype=float64)``."""
    if values.dtype == torch.float64:
        return values.sum(dim=dim)
    if values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float16):
        return values.sum(dim=dim, dtype=torch.float64)
    array = values.detach().numpy()
    width = array.shape[1 - dim]  # the independent sums
    threads = max(1, min(torch.get_num_threads(), width // 256))
    if threads == 1 or array.size < 1 << 20:
        return torch.from_numpy(_numpy_float64_sums(array, dim))
    bounds = [width * i // threads for i in range(threads + 1)]
    parts = [array[:, a:b] if dim == 0 else array[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    with ThreadPoolExecutor(threads) as pool:
        sums = list(pool.map(lambda part: _numpy_float64_sums(part, dim), parts))
    return torch.from_numpy(np.concatenate(sums))


class DetectorNotFitted(RuntimeError):
    """A detector that needs fitting was asked to score before :meth:`Detector.fit`."""


class Detector(nn.Module):
    """Base class of every detector, every confidence function κ of the project (see the module docstring).

    Class attributes (what the detector is; the engine reads them before any pass):
        name: the registry name (``mahalanobis``, ``softmax``, ...).
        paper: the paper it comes from, as the detectors' page cites it (``Lee et al., NeurIPS 2018``).
        inputs: what :meth:`fit` and :meth:`score` read, a subset of :data:`INPUTS`.
        fit_data: whether :meth:`fit` needs the outputs of in-distribution training images (else only the head,
            or nothing).
        background_rule: whether it has a rule for background-class models (the last logit the background:
            logit-based scores use the known columns, class statistics the known classes).

    Derived when a subclass is made (never set by hand):
        kind: ``"model"`` (reads the model), ``"ensemble"`` (member logits), ``"features"`` (features or the
            head) or ``"logits"``.
        needs_fit: whether :meth:`fit` must run before :meth:`score` (fit data or the head).
        needs_head: whether :meth:`fit` takes the model's classification head.
        reads_features: whether it reads the pass's penultimate features (the features or the head).

    Constructor arguments are keyword-only hyperparameters (each stored as the attribute of its name; they are
    :meth:`hyperparameters`) plus ``background``: the model's last logit is the background class.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    inputs: ClassVar[frozenset[str]] = frozenset({"logits"})
    fit_data: ClassVar[bool] = False
    background_rule: ClassVar[bool] = True
    default_fit: ClassVar[dict[str, Any]] = {}
    """The engine's default cap of the fit set: ``{"fraction": f}``, ``{"per_class": n}`` or ``{"images": n}`` (seeded,
    class-balanced); empty = every fit image. A user's ``fit`` option overrides it."""
    fit_split: ClassVar[str] = "train"
    """The in-distribution split :meth:`fit` reads (:data:`FIT_SPLITS`): ``"train"``, the training images (the
    class statistics, the banks), or ``"val"``, held-out validation images (VRA's and AdaSCALE's percentiles, as
    their papers and OpenOOD fit them): the engine hands such a detector the data's ID validation set where it has
    one (the OOD benchmark's ``id_val`` group) and says on the card where it had to fit on the training images."""
    fitted_buffers: ClassVar[tuple[str, ...]] = ()
    """The buffers :meth:`fit` registers (besides the head's): a fresh detector loading a fitted
    ``state_dict`` takes them with their fitted shapes."""
    refuse_non_finite: ClassVar[bool] = False
    """Whether :meth:`score` refuses inputs with NaN or infinite values (naming how many rows) before
    scoring; the fitted detectors of this package do."""
    image_keys: ClassVar[tuple[str, ...]] = ()
    """The per-image outputs of a ``model`` detector's own pass (:meth:`image_outputs`); empty: its scores,
    ``scores/<name>`` (:meth:`score_images`)."""
    pass_name: ClassVar[str] = ""
    """The name of a ``model`` detector's own pass (default: its own): detectors that run the same pass share it
    (AdaSCALE-A and -L)."""
    pass_hyperparameters: ClassVar[tuple[str, ...] | None] = None
    """The hyperparameters its own pass depends on (part of that pass's cache key); ``None``: all. AdaSCALE's
    percentile range acts after the pass, so a search over it reruns no backward."""
    kind: ClassVar[str] = "logits"
    needs_fit: ClassVar[bool] = False
    needs_head: ClassVar[bool] = False
    reads_features: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = set(cls.inputs) - INPUTS
        if unknown:
            raise TypeError(f"detector {cls.__name__} declares unknown inputs {sorted(unknown)}; choose from "
                            f"{sorted(INPUTS)}")
        cls.kind = ("model" if "model" in cls.inputs else "ensemble" if "member_logits" in cls.inputs
                    else "features" if {"features", "head"} & set(cls.inputs) else "logits")
        if cls.fit_split not in FIT_SPLITS:
            raise TypeError(f"detector {cls.__name__} declares fit_split {cls.fit_split!r}; choose from {FIT_SPLITS}")
        cls.needs_head = "head" in cls.inputs
        cls.reads_features = bool({"features", "head"} & set(cls.inputs))
        cls.needs_fit = bool(cls.fit_data) or cls.needs_head

    def __init__(self, *, background: bool = False) -> None:
        super().__init__()
        self.background = bool(background)
        self.register_buffer("_fitted", torch.tensor(not self.needs_fit))

    # ----------------------------------------------------------------- what the engine asks
    @classmethod
    def hyperparameter_defaults(cls) -> dict[str, Any]:
        """The hyperparameters with their defaults: the constructor's keyword-only arguments but ``background``
        (their one declaration); one without a default holds ``inspect.Parameter.empty``."""
        return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if p.kind == p.KEYWORD_ONLY and name != "background"}

    @classmethod
    def open_hyperparameters(cls) -> bool:
        """Whether the constructor takes keyword arguments it does not name (a wrapper passing them on)."""
        return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())

    @classmethod
    def arguments(cls, **overrides: Any) -> dict[str, Any]:
        """The hyperparameters a run uses: the defaults updated by ``overrides`` (e.g. ODIN's
        ``{"temperature": 2.0, "epsilon": 1e-5}``), part of every cache key, so a changed argument never reuses
        stale scores. Invalid values are refused now, by building the detector once.

        Raises:
            ValueError: an argument the detector does not take (naming the valid ones), or an invalid value.
        """
        defaults = cls.hyperparameter_defaults()
        required = sorted(k for k, v in defaults.items() if v is inspect.Parameter.empty and k not in overrides)
        if required:
            raise ValueError(f"detector {cls.name!r} needs the hyperparameters {required}, which have no default "
                             f"(--kappa-arg {cls.name}.{required[0]}=VALUE)")
        if not cls.open_hyperparameters():
            unknown = sorted(set(overrides) - set(defaults))
            if unknown:
                raise ValueError(f"detector {cls.name!r} has no hyperparameter {unknown[0]!r}; it takes "
                                 f"{sorted(defaults) or 'none'}")
            resolved = {**defaults, **overrides}
        else:  # a wrapper's own arguments are those given (the wrapped class's defaults apply)
            resolved = dict(overrides)
        cls(background=False, **resolved)
        return resolved

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        """Refuse, before any pass, a model this detector cannot score (MC dropout: no dropout). Default: any."""

    @property
    def fitted(self) -> bool:
        return bool(self._fitted)

    def check_fit_size(self, samples: int, classes: int) -> None:
        """Refuse, before the fit pass, a fit set too small for this detector (KNN's ``k``, ...): the engine
        calls it with the capped fit set's size and its number of classes. Default: any size."""

    def hyperparameters(self) -> dict[str, Any]:
        """The constructor's hyperparameters with their values (part of every cache key)."""
        return {name: getattr(self, name) for name in self.hyperparameter_defaults()}

    def state_fingerprint(self) -> str:
        """sha256 over the hyperparameters and every buffer: what a cache of its scores depends on."""
        tensors = {name: buffer for name, buffer in self.named_buffers()}
        return tensors_fingerprint({**tensors, "hyperparameters": torch.tensor(
            list(repr(sorted(self.hyperparameters().items())).encode()), dtype=torch.uint8)})

    # ----------------------------------------------------------------- fit and score
    def fit(self, data: dict[str, Tensor], *, head: Head | None = None) -> Detector:
        """Fit on in-distribution outputs (``features``/``logits``/``targets`` as :attr:`inputs` declare)."""
        if self.needs_head:
            if head is None:
                raise ValueError(f"detector {self.name!r} needs the model's classification head (W, b)")
            weight, bias = head
            self._store_head(weight, bias)
        if self.fit_data:
            self._fit(self._checked_fit_data(data))
        self._fitted.fill_(True)
        return self

    def score(self, outputs: dict[str, Tensor]) -> Tensor:
        """``(N,)`` scores, higher = more in-distribution, from one pass's ``outputs``: ``logits`` (``(N, M, C)``
        for an ensemble: its member logits), ``features`` where it reads them; a ``model`` detector's own pass
        gives ``scores/<name>`` (:meth:`score_images`)."""
        if not self.fitted:
            raise DetectorNotFitted(f"detector {self.name!r} is not fitted: call fit() on in-distribution outputs "
                                    "first (the evaluation commands fit it on their fit set)")
        if self.kind == "model" and not self.image_keys:  # its own pass gives its scores
            return outputs[f"scores/{self.name}"]
        logits = outputs.get("logits")
        if self.kind == "ensemble" and (logits is None or logits.ndim != 3):
            raise ValueError(f"detector {self.name!r} needs an ensemble (member logits (N, M, C)); give the model as "
                             "ensemble:<members file or checkpoints>")
        if self.kind != "ensemble" and logits is not None and logits.ndim != 2:
            raise ValueError(f"detector {self.name!r} scores one model; for an ensemble use ensemble_mi, "
                             "ensemble_softmax or ensemble_entropy")
        missing = sorted(k for k in (self.inputs - {"head", "member_logits", "model"}) | set(self.pass_keys())
                         if k not in outputs)
        if missing:
            raise ValueError(f"detector {self.name!r} reads {missing}, which the outputs lack (they hold {sorted(outputs)})")
        if self.refuse_non_finite:
            for key in sorted(self.inputs - {"head", "member_logits", "model"}):
                check_finite_rows(outputs[key], what=f"detector {self.name!r}: the {key} to score")
        with ieee_float32_products():
            return self._score(outputs)

    def score_images(self, model: nn.Module, images: Tensor) -> Tensor:
        """``(N,)`` scores of images through the model (a ``model`` detector's own pass: ODIN, MC dropout)."""
        raise TypeError(f"detector {self.name!r} scores a pass's outputs, not images through the model")

    def passes_per_image(self) -> tuple[int, int]:
        """The forward and backward passes of the network per scored image, all told (the cost table's column):
        ``(1, 0)`` for a detector of the shared pass; ODIN ``(2, 1)``, MC dropout ``(passes, 0)``, AdaSCALE
        ``(3, 1)`` (the shared pass and its own)."""
        return (1, 0)

    @classmethod
    def pass_keys(cls) -> tuple[str, ...]:
        """The keys of a ``model`` detector's own pass (:meth:`image_outputs`); none for the others."""
        if cls.kind != "model":
            return ()
        return cls.image_keys or (f"scores/{cls.name}",)

    def pass_parameters(self) -> dict[str, Any]:
        """The hyperparameters its own pass depends on (:attr:`pass_hyperparameters`): that pass's cache key."""
        values = self.hyperparameters()
        return values if self.pass_hyperparameters is None else {k: values[k] for k in self.pass_hyperparameters}

    def image_outputs(self, model: nn.Module, images: Tensor) -> dict[str, Tensor]:
        """A ``model`` detector's own per-image pass (:meth:`pass_keys`, each ``(N, ...)``): what its fit and its
        score read besides the shared pass's outputs. It depends on the model and on :meth:`pass_parameters` only,
        never on the fitted state (the engine caches it under those). Default: ``scores/<name>``, the scores of
        :meth:`score_images`."""
        return {f"scores/{self.name}": self.score_images(model, images)}

    def forward(self, outputs: dict[str, Tensor]) -> Tensor:
        return self.score(outputs)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # the fitted buffers exist only after fit(): a fresh detector takes them (with their shapes) from a
        # fitted state_dict, so that it scores exactly as the fitted one did
        names = set(self.fitted_buffers) | {"head_weight", "head_bias"}
        for key, value in state_dict.items():
            name = key[len(prefix):]
            if key.startswith(prefix) and name in names and isinstance(value, Tensor):
                current = self._buffers.get(name)
                if current is None or current.shape != value.shape or current.dtype != value.dtype:
                    self.register_buffer(name, torch.empty_like(value, device=self._fitted.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ----------------------------------------------------------------- for subclasses
    def _fit(self, data: dict[str, Tensor]) -> None:  # pragma: no cover - overridden where fit_data
        raise NotImplementedError

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def _store_head(self, weight: Tensor, bias: Tensor | None) -> None:
        if weight.ndim != 2:
            raise ValueError(f"detector {self.name!r}: the head's weight must be (C, D), got {tuple(weight.shape)}")
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"detector {self.name!r}: the head's bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
        # where the detector lives (the CPU, where the engine fits and scores the gathered outputs), not where the
        # model's head is: a model on a GPU leaves no buffer of its detector there
        device = self._fitted.device
        self.register_buffer("head_weight", weight.detach().to(device=device, dtype=torch.float64).clone())
        self.register_buffer("head_bias", torch.zeros(weight.shape[0], dtype=torch.float64, device=device)
                             if bias is None else bias.detach().to(device=device, dtype=torch.float64).clone())

    def product_head(self, features: Tensor) -> Head:
        """The head for :meth:`head_logits`: ``W`` in the precision of its products with ``features``
        (:func:`product_dtype`), cast once per score call, and the float64 ``b``, added to the float64 product."""
        (weight,) = in_product_precision(features, self.head_weight)
        return weight, self.head_bias

    def head_logits(self, features: Tensor, head: Head | None = None, buffers: Buffers | None = None) -> Tensor:
        """``features @ W.T + b`` ``(rows, C)`` float64, the known columns only for a background-class model.

        The product runs in the features' precision (:func:`product_dtype`; the module docstring's *Precision*), is
        cast to float64 and the bias added there; ``head`` from :meth:`product_head` (once per score call; without
        it, cast here). With ``buffers``, the product and the logits are written into their memory (valid until the
        next chunk's)."""
        weight, bias = self.product_head(features) if head is None else head
        x = features.to(weight.dtype)
        if buffers is None:
            logits = (x @ weight.T).to(torch.float64) + bias
        else:
            product = torch.mm(x, weight.T, out=buffers.take("head product", (x.shape[0], weight.shape[0]), x.dtype))
            logits = buffers.float64(product, "head logits").add_(bias)
        return logits[:, :-1] if self.background else logits

    def check_known_width(self, logits: Tensor, classes: int) -> None:
        """Refuse logits whose known columns are not the ``classes`` the detector was fitted on, naming both."""
        known = self.known_logits(logits[:1]).shape[1] if logits.ndim == 2 else None
        if known != classes:
            raise ValueError(f"detector {self.name!r} was fitted on logits of {classes} known classes; the logits to "
                             f"score have {known if known is not None else tuple(logits.shape)}"
                             f"{' known columns' if known is not None else ''}")

    def known_logits(self, logits: Tensor) -> Tensor:
        """The logits of the known classes (a background-class model's last column dropped), float64."""
        return (logits[:, :-1] if self.background else logits).to(torch.float64)

    def _checked_fit_data(self, data: dict[str, Tensor]) -> dict[str, Tensor]:
        needed = sorted((self.inputs - {"head", "model"}) | set(self.pass_keys()) | {"targets"})
        missing = [k for k in needed if k not in data]
        if missing:
            raise ValueError(f"detector {self.name!r} fits on {needed}; the fit data lack {missing}")
        targets = data["targets"]
        n = targets.shape[0]
        if n == 0:
            raise ValueError(f"detector {self.name!r}: the fit data are empty")
        for key in needed:
            value = data[key]
            if value.shape[0] != n:
                raise ValueError(f"detector {self.name!r}: fit {key} has {value.shape[0]} rows, the targets {n}")
            if key != "targets" and value.is_floating_point():
                bad = non_finite_rows(value)  # chunked: no N x D mask (isfinite's would be 3x the features)
                if bad.numel():
                    raise ValueError(f"detector {self.name!r}: {bad.numel()} fit samples have NaN or infinite {key}")
        if targets.dtype.is_floating_point or int(targets.min()) < 0:
            raise ValueError(f"detector {self.name!r}: fit targets must be the known classes 0..K-1, got "
                             f"{targets.dtype} values from {targets.min().item()}")
        return data


# --------------------------------------------------------------------------------------------------
# checks shared by the detectors


def non_finite_rows(values: Tensor) -> Tensor:
    """The rows (indices) of ``values`` that hold NaN or infinity, chunk by chunk: one min/max reduction per
    chunk (a NaN makes both NaN, an infinity is one of them); only a failing chunk pays for its mask."""
    if not values.is_floating_point() or values.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    rows = chunk_rows(values[0].numel())
    bad = []
    for start, (chunk,) in zip(range(0, values.shape[0], rows), row_chunks(values, rows=rows), strict=True):
        if not all(math.isfinite(v) for v in torch.stack(list(torch.aminmax(chunk))).tolist()):
            mask = (~torch.isfinite(chunk)).reshape(chunk.shape[0], -1).any(dim=1)
            bad.append(mask.nonzero().flatten().cpu() + start)
    return torch.cat(bad) if bad else torch.zeros(0, dtype=torch.long)


def check_finite_rows(values: Tensor, *, what: str) -> None:
    """Refuse NaN or infinite values, naming how many rows (of ``values.shape[0]``) hold them."""
    bad = non_finite_rows(values)
    if bad.numel():
        raise ValueError(f"{what} hold NaN or infinite values in {bad.numel()} of {values.shape[0]} rows "
                         f"(first rows: {bad[:5].tolist()})")


def check_fraction(name: str, value: Any, *, detector: str) -> float:
    """A fraction strictly inside ``(0, 1)`` (a percentile of the activations, a sparsity), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"detector {detector!r}: {name} must be a fraction in (0, 1), got {value!r}")
    return float(value)


def check_positive_int(name: str, value: Any, *, detector: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"detector {detector!r}: {name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_non_negative(name: str, value: Any, *, detector: str, positive: bool = False) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0 or (positive and value == 0)):
        raise ValueError(f"detector {detector!r}: {name} must be a {'positive' if positive else 'non-negative'} "
                         f"finite number, got {value!r}")
    return float(value)


def check_width(values: Tensor, width: int, *, what: str, of: str) -> None:
    """``values`` is ``(N, width)``: the width the detector was fitted on."""
    if values.ndim != 2 or values.shape[1] != width:
        raise ValueError(f"{what} must be (N, {width}) like {of}, got {tuple(values.shape)}")


def class_counts(targets: Tensor, *, classes: int | None = None, detector: str) -> Tensor:
    """Fit samples per class ``0..K-1`` (``K = max + 1`` unless given), refusing a class without one."""
    k = int(targets.max()) + 1 if classes is None else classes
    if int(targets.max()) >= k:
        raise ValueError(f"detector {detector!r}: fit targets go up to {int(targets.max())}, the model has {k} "
                         "known classes")
    counts = torch.bincount(targets.reshape(-1).long(), minlength=k)
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"detector {detector!r}: class {empty[0]} has no fit sample (classes without one: "
                         f"{empty[:10]}{' ...' if len(empty) > 10 else ''} of 0..{k - 1}); every known class needs "
                         "fit samples")
    return counts


# --------------------------------------------------------------------------------------------------
# factorisations whose result does not depend on the process's threads


@contextmanager
def thread_independent() -> Iterator[None]:
    """Run the enclosed torch CPU operations on one intra-op thread, restoring the count afterwards.

    For the LAPACK calls of a fit or a score (``eigh``, Cholesky, the pseudo-inverse, triangular solves and
    inverses): MKL's results of these change in the last bits with its number of threads (measured on this
    project's CPU build, 1 thread against 2 to 8: ViM's eigenvectors differ by up to 8.6e-13, a 256-wide
    Cholesky factor by 5.7e-14), and Lightning gives each of N processes of a CPU run 1/N of the cores (the
    fitted detectors fit on the gathered outputs, on the CPU). Run on one thread, the fitted state and the
    scores of 2 processes are those of 1 bit for bit. These calls are ``O(D³)`` on a ``D × D`` matrix
    (measured on one core of a 2-core machine at D = 2048: eigh 2.6 s, Cholesky 0.2 s); the ``N``-sized work
    around them (the Gram matrix, the matrix products) stays on every thread: its results, partitioned over the
    output only, do not depend on the count (measured, and asserted by
    ``tests/metrics/detectors/test_base.py``)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------------
# streamed first and second moments


def feature_mean(features: Tensor) -> Tensor:
    """``(D,)`` float64 mean of ``(N, D)`` features, summed chunk by chunk in float64 (:func:`float64_sums`: no float64
    copy of a chunk): DICE's mean activation, NCI's and fDBD's training mean. Measured on 1,280,000 × 2048 float32
    features (2 cores): 1.5 s, as long as pytorch-ood's float32 ``mean(dim=0)`` (1.4 s), where a float64 copy of
    each chunk took 8.6 s."""
    total = torch.zeros(features.shape[1], dtype=torch.float64, device=features.device)
    for (chunk,) in row_chunks(features):
        total += float64_sums(chunk, 0).to(total.device)
    return total / features.shape[0]


def _add_gram(gram: Tensor, rows: Tensor) -> None:
    """``gram += rowsᵀ rows`` (float64). On the CPU BLAS's ``dsyrk`` fills the upper triangle only (half the
    work of a matrix product; :func:`_symmetric` mirrors it at the end), elsewhere a matrix product."""
    if gram.device.type == "cpu":
        from scipy.linalg.blas import dsyrk

        target = gram.numpy()  # the Fortran-ordered view of a transposed contiguous tensor: updated in place
        out = dsyrk(1.0, rows.numpy().T, beta=1.0, c=target, trans=0, lower=0, overwrite_c=True)
        if not np.shares_memory(out, target):  # pragma: no cover - f2py copies only a misaligned array
            target[...] = out
    else:
        gram.addmm_(rows.T, rows)


def _new_gram(dim: int, device: torch.device) -> Tensor:
    # on the CPU, the transpose of a contiguous matrix: a Fortran-ordered array for dsyrk, no copy
    return torch.zeros(dim, dim, dtype=torch.float64, device=device).T if device.type == "cpu" else \
        torch.zeros(dim, dim, dtype=torch.float64, device=device)


def _symmetric(gram: Tensor) -> Tensor:
    if gram.device.type != "cpu":
        return (gram + gram.T).mul_(0.5).contiguous()
    upper = torch.triu(gram)
    return (upper + torch.triu(gram, diagonal=1).T).contiguous()


@dataclass(frozen=True)
class Moments:
    """Streamed first and second moments of fit features, float64, about a shift ``s``.

    Attributes:
        counts: ``(K,)`` samples per class (one class when no targets were given).
        sums: ``(K, D)`` ``Σ_{i∈c} (x_i - s)``.
        gram: ``(D, D)`` ``Σ_i (x_i - s)(x_i - s)ᵀ`` over all samples.
        shift: ``(D,)`` the shift ``s``.
    """

    counts: Tensor
    sums: Tensor
    gram: Tensor
    shift: Tensor

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def class_means(self) -> Tensor:
        return self.shift + self.sums / self.counts[:, None]

    def mean(self) -> Tensor:
        return self.shift + self.sums.sum(dim=0) / self.total

    def within_scatter(self) -> Tensor:
        """``Σ_c Σ_{i∈c} (x_i - μ_c)(x_i - μ_c)ᵀ = gram - Σ_c n_c (μ_c - s)(μ_c - s)ᵀ`` (unnormalised)."""
        scaled = self.sums / self.counts.sqrt()[:, None]
        return _symmetric_difference(self.gram, scaled)

    def total_scatter(self) -> Tensor:
        """``Σ_i (x_i - m)(x_i - m)ᵀ = gram - N (m - s)(m - s)ᵀ`` about the overall mean ``m``."""
        scaled = self.sums.sum(dim=0, keepdim=True) / math.sqrt(self.total)
        return _symmetric_difference(self.gram, scaled)


def _symmetric_difference(gram: Tensor, rows: Tensor) -> Tensor:
    out = gram - rows.T @ rows
    return (out + out.T).mul_(0.5)


def _identity(values: Tensor) -> Tensor:
    return values


def streamed_moments(features: Tensor, targets: Tensor | None = None, *, classes: int = 1,
                     shift: Tensor | None = None, transform: Callable[[Tensor], Tensor] | None = None) -> Moments:
    """Class sums and the Gram matrix of ``features - shift`` in one pass of :func:`row_chunks`.

    Each chunk is cast to float64 and shifted into one reused ``chunk × D`` buffer; its Gram matrix is
    added with ``dsyrk`` (CPU) and its class sums with ``index_add_``. The shift defaults to the mean of the
    first chunk, a provisional centre that keeps the scatters' differences (:meth:`Moments.within_scatter`)
    free of cancellation: the Gram matrix about a point near the data, minus a small correction.
    Memory: ``O(D² + K·D + chunk·D)``.

    Args:
        features: ``(N, D)``, any floating dtype.
        targets: ``(N,)`` classes ``0..classes-1`` (``None``: one class).
        shift: ``(D,)`` the point to take the moments about (ViM's origin ``u``).
        transform: a row-wise map applied to each chunk before its moments (Mahalanobis++'s unit normalisation):
            the moments of ``transform(features)`` without an ``N × D`` transformed copy; ``None``: the identity.
    """
    n, dim = features.shape
    device = features.device
    rows = chunk_rows(dim)
    if transform is None:
        transform = _identity
    if shift is None:
        shift = transform(features[:rows]).to(torch.float64).mean(dim=0)
    shift = shift.to(device=device, dtype=torch.float64)
    gram = _new_gram(dim, device)
    sums = torch.zeros(classes, dim, dtype=torch.float64, device=device)
    counts = torch.zeros(classes, dtype=torch.float64, device=device)
    pieces = (features,) if targets is None else (features, targets)
    buffer = torch.empty(min(rows, n), dim, dtype=torch.float64, device=device)  # reused: no page faults per chunk
    for chunk in row_chunks(*pieces, rows=rows):
        centred = buffer[:chunk[0].shape[0]]
        centred.copy_(transform(chunk[0])).sub_(shift)  # 4x faster than a mixed-dtype subtraction
        _add_gram(gram, centred)
        if targets is None:
            sums[0] += centred.sum(dim=0)
            counts[0] += centred.shape[0]
        else:
            labels = chunk[1].to(device=device, dtype=torch.long)
            sums.index_add_(0, labels, centred)
            counts += torch.bincount(labels, minlength=classes).to(torch.float64)
    return Moments(counts=counts, sums=sums, gram=_symmetric(gram), shift=shift)


# --------------------------------------------------------------------------------------------------
# exact quantiles of large tensors, without sorting them


_DIGIT = 16  # bits per pass of the radix selection: 65536 bins


def _sortable_keys(values: Tensor) -> Tensor:
    """Integers with the order of the floats: the IEEE bits, the magnitude bits flipped for negatives."""
    bits = values.view(torch.int32 if values.dtype == torch.float32 else torch.int64)
    flip = 0x7FFFFFFF if values.dtype == torch.float32 else 0x7FFFFFFFFFFFFFFF
    return torch.where(bits < 0, bits ^ flip, bits)


def _key_to_float(key: int, dtype: torch.dtype) -> float:
    if dtype == torch.float32:
        bits = key ^ 0x7FFFFFFF if key < 0 else key
        return float(np.array(bits, dtype=np.int32).view(np.float32))
    bits = key ^ 0x7FFFFFFFFFFFFFFF if key < 0 else key
    return float(np.array(bits, dtype=np.int64).view(np.float64))


SAMPLE_EVERY = 1024
"""The bracketing sample of :func:`order_statistics`: one element in this many, at seeded random positions."""

BRACKET_ELEMENTS = 1 << 24
"""The most elements :func:`order_statistics` keeps between its bracket's bounds (64 MiB of float32)."""

BRACKET_MARGIN = 4.0
"""The standard deviations of the sample's rank that :func:`order_statistics`'s bounds leave on either side."""


def order_statistics(chunks: Callable[[], Iterable[Tensor]], ranks: Iterable[int], *,
                     dtype: torch.dtype) -> dict[int, float]:
    """The values of rank ``r`` (0-based, ascending) of all elements the ``chunks`` yield, exactly.

    First a bracketed selection (Floyd & Rivest's idea): a pass draws a sample of one element in
    :data:`SAMPLE_EVERY` (seeded positions: the same every time), whose order statistics around the ranks' share
    give bounds ``lo <= hi`` that hold the ranks with ~4 standard deviations to spare; a second pass counts the
    elements below ``lo``, equal to ``lo``, equal to ``hi`` and above ``hi`` and keeps those strictly between
    (about ``80·√N`` of ``N``: 2M of 655M), where the ranks then lie, found exactly by ``kthvalue``. Where they do not
    (a sample that misses, more than :data:`BRACKET_ELEMENTS` between the bounds, elements that compare with
    nothing: NaN), the radix selection decides: on the floats' order-preserving integer keys, each pass counts the
    next 16 bits of the keys that share the already selected higher bits (``bincount`` into 65536 bins) and keeps
    the bin that holds the rank; float32 takes 2 passes, float64 4 (one more per rank whose bins part). Both give
    the same values (a zero's sign aside: the radix orders -0 before +0, comparisons do not), in a few compared
    passes against the radix's key transforms and counts: measured on 320,000 × 2048 float32 activations (2 cores),
    1.8-2.4 s for a percentile against 25 s for the radix alone and 12.6 s for ``np.percentile`` of a flattened
    copy.
    Memory: one chunk's temporaries, the sample (``N / 1024``) and the bracket.

    Args:
        chunks: called once per pass; yields 1-D float tensors of ``dtype`` (float32 or float64), the same
            elements on every call.
        ranks: the wanted ranks.
        dtype: the chunks' dtype.
    """
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"order statistics of float32 or float64 values, got {dtype}")
    ranks = sorted({int(r) for r in ranks})
    found = _bracketed_order_statistics(chunks, ranks) if ranks else {}
    return found if found is not None else _radix_order_statistics(chunks, ranks, dtype=dtype)


def _bracketed_order_statistics(chunks: Callable[[], Iterable[Tensor]], ranks: list[int]) -> dict[int, float] | None:
    """:func:`order_statistics` by a sampled bracket, or ``None`` where the bracket does not hold the ranks."""
    generator = torch.Generator().manual_seed(0)
    samples, total = [], 0
    for chunk in chunks():
        n = chunk.numel()
        if n:
            positions = torch.randint(n, (-(-n // SAMPLE_EVERY),), generator=generator).to(chunk.device)
            samples.append(chunk.reshape(-1)[positions].cpu())
            total += n
    if not total or ranks[-1] >= total:
        return None
    sample = torch.sort(torch.cat(samples)).values
    m = sample.numel()

    def bound(rank: int, side: int) -> float:
        share = rank / max(total - 1, 1)
        margin = BRACKET_MARGIN * (math.sqrt(m * share * (1 - share)) + 0.5)
        index = math.floor(share * (m - 1) + side * margin)
        return (-math.inf if side < 0 else math.inf) if not 0 <= index < m else float(sample[index])

    lo, hi = bound(ranks[0], -1), bound(ranks[-1], 1)
    below = at_lo = at_hi = above = 0
    inside, kept = [], 0
    for chunk in chunks():
        values = chunk.reshape(-1)  # count_nonzero: 5x faster than a boolean sum (an int64 cast)
        below += int(torch.count_nonzero(values < lo))
        above += int(torch.count_nonzero(values > hi))
        at_lo += int(torch.count_nonzero(values == lo))
        if hi != lo:
            at_hi += int(torch.count_nonzero(values == hi))
            between = values[(values > lo) & (values < hi)]
            kept += between.numel()
            if kept > BRACKET_ELEMENTS:
                return None
            inside.append(between)
    if below + at_lo + kept + at_hi + above != total:  # NaN: compares with nothing
        return None
    middle = torch.cat(inside) if inside else None
    found = {}
    for rank in ranks:
        r = rank - below
        if r < 0:
            return None
        if r < at_lo:
            found[rank] = lo
        elif r < at_lo + kept:
            found[rank] = float(torch.kthvalue(middle.cpu(), r - at_lo + 1).values)
        elif r < at_lo + kept + at_hi:
            found[rank] = hi
        else:
            return None
    return found


def _radix_order_statistics(chunks: Callable[[], Iterable[Tensor]], ranks: Iterable[int], *,
                            dtype: torch.dtype) -> dict[int, float]:
    """:func:`order_statistics` by a radix selection (see there)."""
    levels = (32 if dtype == torch.float32 else 64) // _DIGIT
    # per rank: the selected key prefix (None before the first pass) and the rank left within it
    state: dict[int, tuple[int | None, int]] = {int(r): (None, int(r)) for r in ranks}
    for level in range(levels):
        shift = _DIGIT * (levels - 1 - level)
        prefixes = sorted({prefix for prefix, _ in state.values()}, key=lambda p: -1 if p is None else p)
        counts = {prefix: None for prefix in prefixes}
        for chunk in chunks():
            high = _sortable_keys(chunk.reshape(-1)) >> shift
            for prefix in prefixes:
                if prefix is None:  # the top 16 bits, signed: shifted into 0..65535
                    digits = high + (1 << (_DIGIT - 1))
                else:
                    digits = high[(high >> _DIGIT) == prefix] & 0xFFFF
                digit_counts = torch.bincount(digits.long(), minlength=1 << _DIGIT)
                counts[prefix] = digit_counts if counts[prefix] is None else counts[prefix] + digit_counts
        for rank, (prefix, left) in state.items():
            cumulative = counts[prefix].cumsum(0)
            digit = int(torch.searchsorted(cumulative, torch.tensor(left, device=cumulative.device), right=True))
            left -= int(cumulative[digit - 1]) if digit > 0 else 0
            state[rank] = (digit - (1 << (_DIGIT - 1)) if prefix is None else (prefix << _DIGIT) + digit, left)
    return {rank: _key_to_float(prefix, dtype) for rank, (prefix, _) in state.items()}


def linear_quantile(chunks: Callable[[], Iterable[Tensor]], count: int, fraction: float, *,
                    dtype: torch.dtype) -> float:
    """The ``fraction`` quantile of ``count`` values with linear interpolation, as ``np.quantile`` and
    ``torch.quantile`` compute it (Hyndman & Fan's 7th method), exactly and without sorting.

    The virtual index ``h = (count - 1)·fraction``; the value is ``x_(⌊h⌋) + (h - ⌊h⌋)(x_(⌊h⌋+1) - x_(⌊h⌋))``,
    rounded as numpy's ``_lerp`` does (``b - (b - a)(1 - t)`` for ``t >= 0.5``) in the values' dtype; the
    two order statistics come from :func:`order_statistics`. ``np.percentile(a, q)`` is
    ``fraction = np.true_divide(q, 100)``.
    """
    if count < 1:
        raise ValueError("the quantile of no values")
    virtual = np.float64(count - 1) * np.float64(fraction)
    below = int(np.floor(virtual))
    if virtual >= count - 1:
        below = above = count - 1
    elif virtual < 0:
        below = above = 0
    else:
        above = below + 1
    gamma = float(virtual - np.float64(below))
    values = order_statistics(chunks, {below, above}, dtype=dtype)
    scalar = np.float32 if dtype == torch.float32 else np.float64
    a, b = scalar(values[below]), scalar(values[above])
    difference = b - a
    return float(b - difference * (1 - gamma) if gamma >= 0.5 else a + difference * gamma)
