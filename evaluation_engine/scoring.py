"""The scoring pass of the evaluation engine: sharded model passes over a data set, gathered exactly, kept
for the run and cached on disk (DESIGN.md §2).

:class:`ScoringPasses` is what every post-hoc evaluation (severity, the generated benchmarks, EvG) asks for
logits, features and model-based κ scores; the sections below are its parts.

:func:`sharded_outputs` runs a step function over a data set in the processes of a
:class:`evaluation_engine.runner.Runner` (launched by Fabric, or a running Trainer's): rank ``r`` of ``W``
takes the samples ``r, r+W, r+2W, ...`` (no padding, so shards are uneven and a rank may have none), and
every output is gathered from all ranks through :class:`metrics.IndexedPredictions`, which drops nothing
and orders the samples by dataset index. Every rank joins every gather, also a rank without a batch, so
the result is identical on 1 and N processes and no rank waits for another that skipped a collective.

:class:`PredictionCache` keeps those results on disk per key (model weights, data files, transform,
precision, κ and its parameters; built by the caller with :func:`common.digest`). Global rank zero decides
hit or miss and broadcasts the payload, so every rank takes the same decision (a rank that cannot read
the file, or reads it a moment later, cannot diverge into a different collective). Files are written
atomically; a file whose key, type, content or shape does not match is rejected with a warning and
recomputed, never used.
"""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_only, rank_zero_warn
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from datamodules.batch import Batch, Sample, collate_samples, unpack_batch
from datamodules.device_decode import DECODERS, collate_encoded, device_decoding
from datamodules.evaluation import EvaluationSet, TransformedSet, fit_folder_set
from datamodules.images import balanced_choice, check_choice
from datamodules.overlap import (
    FitOverlapError,
    Overlap,
    SetImages,
    find_overlap,
    overlap_message,
    overlap_note,
)
from datamodules.transforms import ModelInput
from evaluation_engine.options import FIT_CAPS, check_fit_options
from evaluation_engine.outputs import slug
from evaluation_engine.runner import Runner
from lightning_modules.scoring import classification_head, forward_outputs, has_features, shares_features_pass
from metrics import IndexedPredictions, check_kappa, kappa_scores, pairs_with
from metrics.detectors import Detector
from openset_common.artefacts import atomic_write_bytes, digest, tensors_fingerprint
from openset_common.resources import hardware, measure


def pass_hardware(runner: Runner, device: torch.device) -> str:
    """Where a pass ran: the device's hardware (:func:`openset_common.resources.hardware`), times the processes."""
    name = hardware(device)
    return name if runner.world_size == 1 else f"{runner.world_size} x {name}"


def shard_indices(num_samples: int, rank: int, world_size: int) -> list[int]:
    """The dataset indices of one rank: ``rank, rank + W, ...`` (no padding; possibly none)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} processes")
    return list(range(rank, num_samples, world_size))


def sharded_outputs(
    runner: Runner,
    dataset: Dataset,
    step: Callable[[Tensor], dict[str, Tensor]],
    *,
    keys: Sequence[str],
    batch_size: int,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    name: str = "the data set",
    decoder: Callable[[Any], tuple[Tensor, Tensor, Tensor, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """``{key: gathered values, "targets": labels}`` of ``step(images)`` over a data set, on every rank.

    Args:
        runner: where the pass runs (:class:`evaluation_engine.runner.Runner`: its rank, world size and precision).
        dataset: yields :class:`datamodules.batch.Sample`.
        step: images ``(B, ...)`` on ``device`` -> ``{key: (B, ...) tensor}`` for every key of ``keys``.
        keys: the step's output keys, the same on every rank (a rank without data never calls ``step``).
        batch_size, num_workers: of this rank's data loader.
        name: how errors call the data set.
        decoder: a batch of the loader (``dataset`` yields JPEG bytes) -> ``(images on device, targets, indices,
            skipped)``: the device decoding of :mod:`datamodules.device_decode` (``None``: ``dataset`` yields
            the model's inputs, decoded in the workers).

    Raises:
        ValueError: when the images of one batch differ in size (a model input without a fixed size).
        RuntimeError: when the gathered samples are not exactly the data set (images skipped as unreadable).
    """
    shard = shard_indices(len(dataset), runner.global_rank, runner.world_size)
    loader = DataLoader(Subset(dataset, shard), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=SizeCheckedCollate(name) if decoder is None else collate_encoded)
    stores = {key: IndexedPredictions().to(device) for key in keys}
    for batch in loader:
        # indices: of the full data set (Subset keeps them)
        images, targets, indices, _ = unpack_batch(batch) if decoder is None else decoder(batch)
        if images.numel() == 0:
            continue
        with runner.forward_context():
            outputs = step(images.to(device))
        for key in keys:
            stores[key].update(outputs[key].float(), targets.to(device), indices.to(device))
    result: dict[str, Tensor] = {}
    for key in keys:  # the same order on every rank: each compute() is a collective
        values, targets = stores[key].gather()
        result[key] = values.cpu()
        result["targets"] = targets.cpu()
    if result["targets"].shape[0] != len(dataset):
        raise RuntimeError(
            f"predictions cover {result['targets'].shape[0]} of {len(dataset)} samples (unreadable images skipped?)"
        )
    return result


class SizeCheckedCollate:
    """:func:`collate_samples` that names the set and the sizes when a batch holds images of several sizes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, samples: list[Sample]) -> Batch:
        shapes = sorted({tuple(s.image.shape) for s in samples if s.image is not None})
        if len(shapes) > 1:
            raise ValueError(f"{self.name} holds images of several sizes {shapes}, and the model's input transform "
                             "does not bring them to one: give the model an input of a fixed size")
        return collate_samples(samples)


class PredictionCache:
    """Cached model outputs in ``directory``: ``<name>-<key prefix>.pt`` holding ``{"key", "meta", "tensors"}``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.meta: dict[str, dict[str, Any]] = {}  # per key loaded: the entry's meta (the set, the pass's cost)

    def path(self, name: str, key: str) -> Path:
        return self.directory / f"{name}-{key[:16]}.pt"

    def load(self, name: str, key: str, *, rows: int) -> dict[str, Tensor] | None:
        """The cached tensors, or ``None`` when absent or rejected (unreadable, other key, wrong type or shape)."""
        path = self.path(name, key)
        if not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a truncated or foreign file
            return self._reject(path, f"unreadable ({type(error).__name__}: {error})")
        if not isinstance(payload, dict):
            return self._reject(path, f"it holds a {type(payload).__name__}, not a cache entry")
        if payload.get("key") != key:
            return self._reject(path, "its key does not match this model, data and confidence function")
        tensors = payload.get("tensors")
        if not isinstance(tensors, dict) or not tensors:
            return self._reject(path, f"its 'tensors' is a {type(tensors).__name__}, not a dict of tensors")
        wrong_type = sorted(k for k, v in tensors.items() if not isinstance(v, Tensor) or v.ndim == 0)
        if wrong_type or "targets" not in tensors:
            return self._reject(path, f"entries {wrong_type or ['targets (missing)']} are not per-sample tensors")
        wrong = {k: tuple(v.shape) for k, v in tensors.items() if v.shape[0] != rows}
        if wrong:
            return self._reject(path, f"expected {rows} rows, found shapes {wrong}")
        meta = payload.get("meta")
        self.meta[key] = dict(meta) if isinstance(meta, dict) else {}
        return tensors

    def load_on_rank_zero(self, runner: Runner, name: str, key: str, *, rows: int
                          ) -> tuple[dict[str, Tensor] | None, dict[str, Any]]:
        """:meth:`load` on global rank zero, broadcast to every rank: one decision for all; with the entry's meta."""
        payload = (self.load(name, key, rows=rows), self.meta.pop(key, {})) if runner.is_global_zero else None
        tensors, meta = runner.broadcast(payload, src=0)
        return tensors, meta

    @staticmethod
    def _reject(path: Path, reason: str) -> None:
        warnings.warn(f"rejecting prediction cache {path}: {reason}; recomputing", RuntimeWarning, stacklevel=3)
        return None

    def save(self, name: str, key: str, tensors: dict[str, Tensor], meta: dict[str, Any]) -> Path:
        buffer = io.BytesIO()
        torch.save({"key": key, "meta": meta, "tensors": {k: v.contiguous() for k, v in tensors.items()}}, buffer)
        return atomic_write_bytes(self.path(name, key), buffer.getvalue())


# --------------------------------------------------------------------------------------------------
# The scoring pass of the evaluation engine


def model_input_of(runner: Runner, pl_module: pl.LightningModule) -> ModelInput:
    """How the module takes images: its own ``model_input`` (a :class:`ScoringModel`), else the training
    datamodule's (a model being trained); never nothing."""
    own = getattr(pl_module, "model_input", None)
    if isinstance(own, ModelInput):
        return own
    datamodule = runner.datamodule
    factory = getattr(datamodule, "model_input", None)
    if callable(factory):
        return factory()
    raise ValueError(f"{type(pl_module).__name__} has no model_input and its datamodule "
                     f"{type(datamodule).__name__} none either: the evaluation does not know how the model takes "
                     "images (give a ScoringModel with its ModelInput)")


def module_device(module: nn.Module) -> torch.device:
    """Where a module's weights are (the CPU for a module without any)."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def memory_format(module: nn.Module) -> str:
    """``channels_last`` when the module's first 4-d weight is in that layout (EvG's CPU speed-up), else
    ``contiguous``: the two give results that differ in the last bits, so a pass records which."""
    for parameter in module.parameters():
        if parameter.ndim == 4:
            return "channels_last" if parameter.is_contiguous(memory_format=torch.channels_last) and not \
                parameter.is_contiguous() else "contiguous"
    return "contiguous"


class ScoringPasses:
    """The scoring passes of one run, shared by every evaluation in it (DESIGN.md §2).

    One sharded, exactly gathered pass per (model, data set) gives the logits (and the features, when a κ
    needs them) of every sample, the model's own input transform applied (:func:`model_input_of`); a
    model-based κ (ODIN, MC dropout) gets its own pass per parameter set. Each pass is computed once per run
    (kept in memory, whichever method asks for it) and, with ``cache_dir``, cached on disk under one key:
    the weights, the data set's fingerprint, the input transform, the precision, the memory format (and the
    κ and its parameters for a model-based pass). ``passes`` counts what was actually run; ``log`` holds one
    entry per request (model, set, role, fingerprint, samples, pass kind, and whether it was ``run``, found in
    ``memory`` or in the ``cache``): what a report states about its data, and what a test counts.

    Args:
        cache_dir: the on-disk cache (``None``: none; during training the weights change every epoch).
        memo: keep passes in memory for the run (off while the weights change).
        decode: ``"cpu"`` (the loader's workers decode and transform each image) or ``"device"`` (the workers
            read the bytes, each batch is decoded and transformed on the model's device:
            :mod:`datamodules.device_decode`; sets and inputs it does not apply to stay on the CPU path). Its
            outputs are cached apart from the CPU path's (they differ by up to 1/255 per input pixel).
    """

    def __init__(self, cache_dir: str | Path | None = None, *, memo: bool = True, decode: str = "cpu") -> None:
        self.cache = PredictionCache(cache_dir) if cache_dir is not None else None
        self.memo = memo
        self.decode = check_choice("decode", decode, DECODERS)
        self._kept: dict[str, dict[str, Tensor]] = {}
        self._seconds: dict[str, tuple[float | None, str | None]] = {}  # per kept pass: its time when it ran, where
        self._costs: dict[tuple[str, str, str], dict[str, Any]] = {}  # (model, κ, parameters) -> what it cost
        self._fingerprints: dict[int, tuple[tuple, str]] = {}
        self.passes = 0  # passes run (neither in memory nor in the cache)
        self.requests = 0
        self.log: list[dict[str, Any]] = []
        self._detectors: dict[str, Detector] = {}
        self._detectors_by_kappa: dict[tuple[int, str, str], Detector] = {}  # (model, κ, parameters) -> last fit
        self._heads_checked: set[int] = set()
        self._fits: list[dict[str, Any]] = []  # the fit log (fits) as written when each detector was fitted
        # fit sets against the data they are tested on (check_fit_overlap), by fingerprints: each set's identities
        # (also kept in cache_dir) and each pair's overlap computed once per run (an allowed one says so,
        # Overlap.allowed); per fit set the allow of its last check, for the sets scores() checks after it
        self._images: dict[str, SetImages] = {}
        self._overlaps: dict[tuple[str, str], Overlap] = {}
        self._allowed: dict[str, bool] = {}
        self._fitted_on: dict[str, tuple[EvaluationSet, EvaluationSet]] = {}  # fit log key -> (fit set, its cap)

    def clear(self) -> None:
        self._kept.clear()
        self._seconds.clear()
        self._fingerprints.clear()
        self._detectors.clear()
        self._detectors_by_kappa.clear()
        self._heads_checked.clear()  # the overlaps stay: they depend on the data, not the weights

    def _weights(self, pl_module: nn.Module) -> str:
        """The weights fingerprint, recomputed only when a parameter changed (its version counter)."""
        versions = tuple((p.data_ptr(), p._version) for p in pl_module.parameters())
        known = self._fingerprints.get(id(pl_module))
        if known is None or known[0] != versions:
            own = getattr(pl_module, "fingerprint", None)
            known = (versions, own() if callable(own) else tensors_fingerprint(
                {**dict(pl_module.named_parameters()), **dict(pl_module.named_buffers())}))
            self._fingerprints[id(pl_module)] = known
        return known[1]

    def _key(self, runner: Runner, pl_module: nn.Module, evaluation_set: EvaluationSet, model_input: ModelInput,
             part: dict[str, Any]) -> str:
        return digest({"model": self._weights(pl_module), "data": evaluation_set.fingerprint(),
                       "input": model_input.key(), "precision": runner.precision,
                       "memory_format": memory_format(pl_module), **part})

    def per_sample_pass(self, runner: Runner, module: nn.Module, evaluation_set: EvaluationSet, *,
                        model_input: ModelInput, name: str, part: dict[str, Any],
                        step: Callable[[Tensor], dict[str, Tensor]], keys: list[str], batch_size: int = 256,
                        num_workers: int = 0) -> dict[str, Tensor]:
        """A pass of any per-sample ``step`` (e.g. the LPIPS to the nearest reference image) under the same rules:
        sharded, gathered, kept, cached under ``module``'s weights, the set, ``model_input`` and ``part``."""
        return self._run(runner, module, evaluation_set, name=name, part=part, step=step, keys=keys,
                         batch_size=batch_size, num_workers=num_workers, model_input=model_input)

    def _run(self, runner: Runner, pl_module: nn.Module, evaluation_set: EvaluationSet, *,
             name: str, part: dict[str, Any], step: Callable[[Tensor], dict[str, Tensor]], keys: list[str],
             batch_size: int, num_workers: int, covers: Callable[[dict[str, Tensor]], bool] | None = None,
             model_input: ModelInput | None = None) -> dict[str, Tensor]:
        self.requests += 1
        model_input = model_input or model_input_of(runner, pl_module)
        on_device = (device_decoding(evaluation_set.dataset, model_input, module_device(pl_module))
                     if self.decode == "device" else None)
        if on_device is not None:
            part = {**part, "decode": "device"}
        key = self._key(runner, pl_module, evaluation_set, model_input, part)
        entry = {"model": getattr(pl_module, "display_name", type(pl_module).__name__), "set": evaluation_set.name,
                 "role": evaluation_set.role, "fingerprint": evaluation_set.fingerprint(),
                 "samples": len(evaluation_set), "pass": name, "key": key, "source": "memory"}
        self.log.append(entry)
        kept = self._kept.get(key) if self.memo else None
        if kept is not None and (covers is None or covers(kept)):
            entry["seconds"], entry["hardware"] = self._seconds.get(key, (None, None))
            return kept
        entry["source"] = "cache"
        outputs = None
        if self.cache is not None:
            outputs, meta = self.cache.load_on_rank_zero(runner, name, key if runner.is_global_zero else "",
                                                         rows=len(evaluation_set))
            if outputs is not None and covers is not None and not covers(outputs):
                outputs = None
        if outputs is not None:  # what the pass cost when it ran, and where
            entry.update({k: v for k, v in meta.items() if k in ("seconds", "hardware")})
        if outputs is None:
            dataset = (TransformedSet(evaluation_set.dataset, model_input.transform()) if on_device is None
                       else on_device[0])
            device = module_device(pl_module)
            began = time.perf_counter()
            outputs = sharded_outputs(runner, dataset, step, keys=keys, batch_size=batch_size, num_workers=num_workers,
                                      device=device, name=evaluation_set.name,
                                      decoder=None if on_device is None else on_device[1])
            # the pass of every process (they end together: the last gather is a collective)
            entry.update({"seconds": time.perf_counter() - began, "hardware": pass_hardware(runner, device)})
            self.passes += 1
            entry["source"] = "run"
            if not torch.equal(outputs["targets"], evaluation_set.labels()):
                raise RuntimeError(f"gathered targets of {evaluation_set.name} do not match the data set order")
            bad = [k for k in keys if not torch.isfinite(outputs[k]).all()]
            if bad:
                raise ValueError(f"{getattr(pl_module, 'display_name', type(pl_module).__name__)} gave NaN or "
                                 f"infinite {bad} on {evaluation_set.name}; nothing of it is cached")
            if self.cache is not None and runner.is_global_zero:
                self.cache.save(name, key, outputs, {"set": evaluation_set.name, **part, "seconds": entry["seconds"],
                                                     "hardware": entry["hardware"]})
        if self.memo:
            self._kept[key] = outputs
            self._seconds[key] = (entry.get("seconds"), entry.get("hardware"))
        return outputs

    def outputs(self, runner: Runner, pl_module: pl.LightningModule, evaluation_set: EvaluationSet, *,
                features: bool = False, batch_size: int = 256, num_workers: int = 0,
                model_input: ModelInput | None = None) -> dict[str, Tensor]:
        """``{"logits", "targets"[, "features"]}`` of every sample of a set, on every rank (a collective);
        ``model_input``: how the images reach the model (default: the module's own, :func:`model_input_of`)."""
        model_name = getattr(pl_module, "display_name", type(pl_module).__name__)
        name = slug(f"{model_name}-{evaluation_set.name}-logits")
        keys = ["logits", "features"] if features else ["logits"]
        return self._run(runner, pl_module, evaluation_set, name=name, part={"outputs": "logits"},
                         step=lambda images: forward_outputs(pl_module, images, features=features), keys=keys,
                         batch_size=batch_size, num_workers=num_workers, model_input=model_input,
                         covers=(lambda kept_outputs: "features" in kept_outputs) if features else None)

    def image_outputs(self, runner: Runner, pl_module: pl.LightningModule, evaluation_set: EvaluationSet,
                      kappa: type[Detector], parameters: dict[str, Any], *, background: bool, batch_size: int = 256,
                      num_workers: int = 0) -> dict[str, Tensor]:
        """A ``model`` detector's own pass over a set (:meth:`metrics.detectors.Detector.image_outputs`: ODIN's and
        MC dropout's scores, AdaSCALE's perturbed-feature statistic), with a backward where it needs input gradients
        (run outside inference mode): sharded, gathered exactly, kept and cached like every pass, under the κ and
        the hyperparameters the pass depends on (:meth:`Detector.pass_parameters`)."""
        model_name = getattr(pl_module, "display_name", type(pl_module).__name__)
        name = slug(f"{model_name}-{evaluation_set.name}-{kappa.pass_name or kappa.name}")
        scorer = kappa(background=background, **parameters)
        keys = list(kappa.pass_keys())
        with torch.inference_mode(False):  # the head's copy too: an inference tensor cannot be saved for backward
            if kappa.needs_head:  # a pass through the head (AdaSCALE's gradient of the predicted logit)
                scorer._store_head(*classification_head(pl_module))
            outputs = self._run(
                runner, pl_module, evaluation_set, name=name,
                part={"kappa": kappa.pass_name or kappa.name, "parameters": scorer.pass_parameters(),
                      "background": background},
                step=lambda images: scorer.image_outputs(pl_module, images), keys=keys,
                batch_size=batch_size, num_workers=num_workers)
        return {key: outputs[key] for key in keys}

    def scores(self, runner: Runner, pl_module: pl.LightningModule, evaluation_set: EvaluationSet, kappa: type[Detector],
               parameters: dict[str, Any], *, features: bool = False, batch_size: int = 256, num_workers: int = 0
               ) -> Tensor:
        """κ of every sample of a set (:func:`metrics.kappa_scores` on the pass)."""
        background = bool(getattr(pl_module, "background_class", False))
        detector = self._detectors_by_kappa.get((id(pl_module), kappa.name, digest(parameters))) \
            if kappa.needs_fit else None
        fitted_on = self._fitted_on_of(detector)
        if fitted_on is not None:  # before the pass: a set the callback did not check against the fit set
            fit_set = fitted_on[0]
            self.check_fit_overlap(fit_set, [evaluation_set], allow=self._allowed.get(fit_set.fingerprint(), False))
        seconds: list[float | None] = []
        hardware: set[str] = set()
        outputs: dict[str, Tensor] = {}
        if kappa.kind != "model" or kappa.inputs - {"model"}:  # the shared pass: logits (and features)
            outputs.update(self.outputs(runner, pl_module, evaluation_set, features=features or kappa.reads_features,
                                        batch_size=batch_size, num_workers=num_workers))
            seconds.append(self.log[-1].get("seconds"))
            hardware.add(self.log[-1].get("hardware") or "")
            if kappa.needs_head:
                self.check_head(pl_module, outputs)
        if kappa.needs_fit and detector is None:
            raise ValueError(f"confidence function {kappa.name!r} of {getattr(pl_module, 'display_name', '')} "
                             "is not fitted: call ScoringPasses.fitted_detector with a fit set first")
        if kappa.kind == "model":  # its own pass; both through the one dispatch, which refuses non-finite scores
            outputs.update(self.image_outputs(runner, pl_module, evaluation_set, kappa, parameters,
                                              background=background, batch_size=batch_size, num_workers=num_workers))
            seconds.append(self.log[-1].get("seconds"))
            hardware.add(self.log[-1].get("hardware") or "")
        began = time.perf_counter()
        scores = kappa_scores(kappa, outputs, background=background, parameters=parameters, detector=detector,
                              data=evaluation_set.name)
        self._add_cost(pl_module, kappa, parameters, samples=len(evaluation_set),
                       seconds=[*seconds, time.perf_counter() - began], hardware=hardware - {""})
        return scores

    # -- what each detector costs ------------------------------------------------------------------

    def pass_cost(self) -> tuple[float | None, str | None]:
        """The seconds and hardware of the pass last asked for (the log's last entry): what a method that scores
        the outputs itself (:meth:`score_outputs`) charges a detector for it."""
        entry = self.log[-1] if self.log else {}
        return entry.get("seconds"), entry.get("hardware")

    def score_outputs(self, pl_module: nn.Module, kappa: type[Detector], parameters: dict[str, Any],
                      outputs: dict[str, Tensor], *, passes: Sequence[tuple[float | None, str | None]],
                      background: bool, detector: Detector | None = None, data: str | None = None) -> Tensor:
        """:func:`metrics.kappa_scores` on outputs a method holds (the severity benchmark's), its cost recorded as
        :meth:`scores` records it: ``passes``, the (seconds, hardware) of the passes that gave the outputs it reads
        (:meth:`pass_cost` after each)."""
        began = time.perf_counter()
        scores = kappa_scores(kappa, outputs, background=background, parameters=parameters, detector=detector,
                              data=data)
        self._add_cost(pl_module, kappa, parameters, samples=int(scores.shape[0]),
                       seconds=[*(s for s, _ in passes), time.perf_counter() - began],
                       hardware={h for _, h in passes if h})
        return scores

    def _cost(self, pl_module: nn.Module, kappa: type[Detector], parameters: dict[str, Any]) -> dict[str, Any]:
        model_name = getattr(pl_module, "display_name", type(pl_module).__name__)
        key = (model_name, kappa.name, digest(parameters))
        if key not in self._costs:
            forward, backward = kappa(**parameters).passes_per_image()
            # the shared pass of a detector of the features runs the network once for both where its forward is the
            # composition of the two (timm's, this project's classifiers), else a second time for the features
            # (lightning_modules.scoring.forward_outputs)
            forward += int(kappa.reads_features and not shares_features_pass(pl_module))
            self._costs[key] = {"model": model_name, "κ": kappa.name, "parameters": dict(parameters),
                                "fit seconds": None, "fit peak bytes": None, "fit samples": 0, "fit sets": [],
                                "fit hardware": None,
                                "scored samples": 0, "score seconds": 0.0, "timed": True, "hardware": set(),
                                "forward passes": forward, "backward passes": backward}
        return self._costs[key]

    def _add_cost(self, pl_module: nn.Module, kappa: type[Detector], parameters: dict[str, Any], *, samples: int,
                  seconds: Sequence[float | None], hardware: set[str]) -> None:
        cost = self._cost(pl_module, kappa, parameters)
        cost["scored samples"] += samples
        if any(s is None for s in seconds):  # a pass found in a cache written before passes were timed
            cost["timed"] = False
        else:
            cost["score seconds"] += float(sum(seconds))  # type: ignore[arg-type]
        cost["hardware"] |= hardware

    def costs(self) -> list[dict[str, Any]]:
        """What every (model, κ) of the run cost, on the hardware it ran on (the card's cost table):

        - ``fit seconds``, ``fit peak bytes``, ``fit samples``, ``fit sets``: :meth:`Detector.fit` on the gathered
          fit outputs and, for a detector with its own pass (AdaSCALE, NAC), that pass over the fit images (the shared
          fit pass, used by every detector fitted on the set, is not in it), its peak memory above the start
          (:func:`openset_common.resources.measure`); a detector fitted twice (on the OOD benchmark's ID
          validation set and on the training images of another section) adds both;
        - ``images/s``: the samples it scored over the seconds of everything scoring them took -- the shared
          forward pass (each detector is charged the whole pass, as if it ran alone), its own forward and
          backward passes, and its scoring -- summed over the sets; a pass taken from the cache counts the seconds
          it took when it ran (recorded with it), ``None`` where a cache entry predates that;
        - ``forward passes``, ``backward passes``: of the network per scored image, all told
          (:meth:`Detector.passes_per_image`, and one more forward where the shared pass gives the features of a
          model that computes them apart from its logits: :func:`lightning_modules.scoring.shares_features_pass`).
        """
        rows = []
        for cost in self._costs.values():
            seconds = cost["score seconds"]
            rate = cost["scored samples"] / seconds if cost["timed"] and seconds > 0 else None
            rows.append({**{k: v for k, v in cost.items() if k not in ("hardware", "timed")}, "images/s": rate,
                         "hardware": "; ".join(sorted(cost["hardware"])) or None})
        return rows

    def check_head(self, pl_module: nn.Module, outputs: dict[str, Tensor]) -> None:
        """:func:`check_head` on a pass's outputs, once per model: a detector that reads only the head (ASH,
        SCALE) has no fit pass to check it on."""
        if id(pl_module) not in self._heads_checked:
            check_head(classification_head(pl_module), outputs,
                       model=getattr(pl_module, "display_name", type(pl_module).__name__))
            self._heads_checked.add(id(pl_module))

    # -- fit sets and the data they are tested on ------------------------------------------------

    @property
    def fits(self) -> list[dict[str, Any]]:
        """The fit log: one entry per fitted detector (model, κ, parameters, fit set, samples, fingerprint, state,
        key) with ``overlaps``, the allowed overlaps of its fit set with the run's sets (:meth:`_fit_overlaps`),
        derived when read, so that a set a later section checks is in it too."""
        return [{**entry, "overlaps": self._fit_overlaps(*self._fitted_on[entry["key"]])
                 if entry["key"] in self._fitted_on else []} for entry in self._fits]

    def _images_of(self, evaluation_set: EvaluationSet) -> SetImages:
        """A set's :class:`SetImages`, once per run; with ``cache_dir``, its file identities saved by an earlier
        run (keyed by the set's fingerprint and real roots) are taken, not recomputed."""
        fingerprint = evaluation_set.fingerprint()
        if fingerprint not in self._images:
            images = SetImages(evaluation_set)
            if self.cache is not None and images.files.size:
                images.load(self._identities_path(images, fingerprint), images.cache_key(fingerprint))
            self._images[fingerprint] = images
        return self._images[fingerprint]

    def _identities_path(self, images: SetImages, fingerprint: str) -> Path:
        return self.cache.directory / f"identities-{slug(images.name)}-{images.cache_key(fingerprint)[:16]}.npz"  # type: ignore[union-attr]

    def overlap(self, fit_set: EvaluationSet, evaluation_set: EvaluationSet) -> Overlap:
        """:func:`datamodules.overlap.find_overlap` of a fit set and an evaluation set, computed once per run for
        each pair (by their fingerprints); each set's file identities and digests are computed once too, and kept
        in ``cache_dir`` (global rank zero writes them) for the next run. A pair that could not be compared in full
        (:attr:`Overlap.not_compared`) is warned about, naming both sets."""
        key = (fit_set.fingerprint(), evaluation_set.fingerprint())
        if key not in self._overlaps:
            images = [self._images_of(s) for s in (fit_set, evaluation_set)]
            self._overlaps[key] = overlap = find_overlap(*images)
            if self.cache is not None and rank_zero_only.rank == 0:
                for identities, fingerprint in zip(images, key, strict=True):
                    if identities.changed:
                        identities.save(self._identities_path(identities, fingerprint), identities.cache_key(fingerprint))
            if overlap.not_compared:
                rank_zero_warn(overlap.not_compared_warning(), category=RuntimeWarning)
        return self._overlaps[key]

    def check_fit_overlap(self, fit_set: EvaluationSet | None, evaluation_sets: Iterable[EvaluationSet], *,
                          allow: bool = False, what: str = "fit set") -> list[Overlap]:
        """Refuse a fit set that holds images of the data the run evaluates on: compared with every evaluation
        set (by file identity and by content, :mod:`datamodules.overlap`) before the first pass. Every callback
        calls it with its fit set and all its sets (ID test, OOD sets, severity pools, generated sets, EvG's OOD
        set its seeds come from); a fit set of another purpose (an ID validation fit, a tuning set) calls it with
        its own ``what``. :meth:`scores` checks a fitted detector's fit set against any set it scores that was
        not checked here.

        Args:
            fit_set: the fit set (``None``: nothing to check).
            evaluation_sets: the run's sets (an :class:`EvaluationData` or a sequence); sets of role ``fit`` are
                left out.
            allow: run anyway (``--allow-fit-overlap``): the overlaps are then warned about, marked allowed, and
                in the fit log (``fits``, :meth:`fit_notes`) of every detector fitted on the set, whose tables say so.
            what: how the error calls the set.

        Returns:
            The overlaps found (only with ``allow``; each with its count, positions and first pairs).

        Raises:
            FitOverlapError: an overlap without ``allow``, naming the count, the first pairs, both sets and the fix.
        """
        if fit_set is None:
            return []
        overlaps = [o for o in (self.overlap(fit_set, s) for s in evaluation_sets if s.role != "fit" and s is not fit_set)
                    if o.count]
        if overlaps and not allow:
            raise FitOverlapError(overlap_message(overlaps, what=what))
        self._allowed[fit_set.fingerprint()] = allow  # the caller's, for the sets scores() checks after it
        for overlap in overlaps:
            if not overlap.allowed:  # warned once, when first allowed
                overlap.allowed = True
                rank_zero_warn(f"{overlap_note(overlap, what=what)}: {overlap.summary()}; every table of the "
                               "detectors fitted on it says so", category=RuntimeWarning)
        return overlaps

    def _fitted_on_of(self, detector: Detector | None) -> tuple[EvaluationSet, EvaluationSet] | None:
        """The fit set and capped fit set a detector of the run was fitted on (``None``: none, or not fitted here)."""
        if detector is None:
            return None
        key = next((key for key, fitted in self._detectors.items() if fitted is detector), None)
        return self._fitted_on.get(key) if key is not None else None

    def fit_notes(self, detector: Detector | None, sets: Iterable[EvaluationSet] | None = None) -> str:
        """What a table says about a detector whose fit set overlaps data of the run (allowed): ``fit set 'fit'
        overlaps id_test: 40 of its 40 images are id_test images (allowed by --allow-fit-overlap)``, one per
        overlapping set among ``sets`` (the table's; ``None``: all of the run), counted within the images its
        cap kept; ``""`` when there is none."""
        fitted_on = self._fitted_on_of(detector)
        return "; ".join(o["note"] for o in self._fit_overlaps(*fitted_on, sets=sets)) if fitted_on else ""

    def _fit_overlaps(self, fit_set: EvaluationSet, subset: EvaluationSet, sets: Iterable[EvaluationSet] | None = None
                      ) -> list[dict[str, Any]]:
        """The allowed overlaps of the fit set (with ``sets`` only, when given), counted within the images a cap
        keeps: the fit log's ``overlaps``."""
        indices = None if subset is fit_set else [int(i) for i in subset.dataset.indices]  # type: ignore[attr-defined]
        wanted = None if sets is None else {s.fingerprint() for s in sets}
        fingerprint = fit_set.fingerprint()
        entries = []
        for (fit, other), overlap in self._overlaps.items():
            if fit != fingerprint or not overlap.allowed or (wanted is not None and other not in wanted):
                continue
            count = overlap.within(indices)
            entries.append({"set": overlap.other, "role": overlap.other_role, "images": count, "of": len(subset),
                            "set images": overlap.other_images,
                            "note": overlap_note(overlap, count=count, of=len(subset), fit=subset.name)})
        return entries

    def fitted_detector(self, runner: Runner, pl_module: pl.LightningModule, kappa: type[Detector],
                        parameters: dict[str, Any],
               fit_set: EvaluationSet | None, *, fit: dict[str, Any] | None = None, batch_size: int = 256,
               num_workers: int = 0) -> Detector:
        """The κ's detector for this model, fitted: the fit pass (:meth:`outputs` over the capped fit set,
        sharded, gathered exactly, kept and cached like every pass) then :meth:`Detector.fit` on the gathered
        outputs, the same on every rank (so 2 processes give what 1 gives). The fitted detector is kept for the
        run under the weights, the κ and its parameters, the fit set's fingerprint and the cap; :meth:`scores`
        uses it. A κ that needs no fit gets its plain detector.

        Args:
            fit_set: in-distribution training images (role ``fit``, labels ``0..K-1``); ``None`` is an error
                for a detector that needs fit data.
            fit: the cap (:func:`check_fit_options`), over the detector's ``default_fit``.
        """
        background = bool(getattr(pl_module, "background_class", False))
        model_name = getattr(pl_module, "display_name", type(pl_module).__name__)
        if not kappa.needs_fit:
            return kappa(background=background, **parameters)
        given = check_fit_options(kappa.name, dict(fit or {}))
        defaults = kappa.default_fit
        if set(FIT_CAPS) & set(given):  # the user's cap replaces the detector's default cap
            defaults = {k: v for k, v in defaults.items() if k not in FIT_CAPS}
        options = check_fit_options(kappa.name, {**defaults, **given})
        if kappa.fit_data and fit_set is None:
            raise ValueError(f"detector {kappa.name!r} fits on in-distribution training images and {model_name} has "
                             "none: give the fit data (fit_data: a folder of <class>/ image folders, e.g. "
                             "ILSVRC2012/train; a checkpoint of train.py brings its training split)")
        subset = fit_subset(fit_set, options) if kappa.fit_data else None
        key = digest({"model": self._weights(pl_module), "kappa": kappa.name, "parameters": parameters,
                      "fit": subset.fingerprint() if subset is not None else None, "options": options,
                      "background": background})
        detector = self._detectors.get(key)
        if detector is None:
            detector = kappa(background=background, **parameters)
            head = classification_head(pl_module) if kappa.needs_head else None
            data: dict[str, Tensor] = {}
            own_pass: float | None = 0.0
            if subset is not None:  # every check that needs no pass, before it
                try:
                    detector.check_fit_size(len(subset), int(subset.labels().unique().numel()))
                except ValueError as error:
                    if subset is fit_set:
                        raise
                    raise ValueError(f"{error} ({cap_origin(kappa, given, options, fit_set, subset)})") from None
                known = (head[0].shape[0] - int(background)) if head is not None else \
                    len(getattr(pl_module, "classes", None) or []) or None
                # a validation split's detector (VRA, AdaSCALE, KL matching) reads no class statistic: its labels must
                # be the model's classes, not every class present
                every_class = kappa.fit_split == "train"
                if known is not None:
                    check_fit_labels(subset, model=model_name, num_classes=known, cap=options, kappa=kappa.name,
                                     every_class=every_class)
                width = head[0].shape[0] if head is not None else None
                fit_outputs = dict(self.outputs(runner, pl_module, subset, features=kappa.reads_features,
                                                batch_size=batch_size, num_workers=num_workers))
                if kappa.kind == "model":  # its own pass over the fit images too (AdaSCALE's perturbed features)
                    fit_outputs.update(self.image_outputs(runner, pl_module, subset, kappa, parameters,
                                                          background=background, batch_size=batch_size,
                                                          num_workers=num_workers))
                    own_pass = self.log[-1].get("seconds")  # its own: part of its fit's cost
                num_classes = fit_outputs["logits"].shape[-1] - int(background) if width is None else width - int(background)
                check_fit_labels(subset, model=model_name, num_classes=num_classes, cap=options, kappa=kappa.name,
                                 every_class=every_class)
                data = {k: fit_outputs[k] for k in ("logits", "features", "targets", *kappa.pass_keys())
                        if k in fit_outputs}
                if head is not None and "features" in data:
                    check_head(head, data, model=model_name)
            # where the fit computes: the gathered outputs' device (the CPU), not the model's
            device = next((t.device for t in data.values()), torch.device("cpu"))
            measured = measure(lambda: detector.fit(data, head=head), device=device)
            cost = self._cost(pl_module, kappa, parameters)
            extra = own_pass if kappa.kind == "model" and subset is not None else 0.0
            if cost["fit seconds"] is None or extra is None:  # a second fit (another section's fit set) adds up
                cost["fit seconds"] = None if extra is None else measured.seconds + extra
            else:
                cost["fit seconds"] += measured.seconds + extra
            peaks = [p for p in (cost["fit peak bytes"], measured.peak_bytes) if p is not None]
            cost.update({"fit peak bytes": max(peaks) if peaks else None,
                         "fit samples": cost["fit samples"] + (len(subset) if subset is not None else 0),
                         "fit hardware": hardware(device)})
            if subset is not None:
                cost["fit sets"].append(subset.name)
            self._detectors[key] = detector
            self._fits.append({"model": model_name, "kappa": kappa.name, "parameters": dict(parameters),
                               "fit set": subset.name if subset is not None else None,
                               "fit split": kappa.fit_split, "fit set role": subset.role if subset is not None else None,
                               "samples": len(subset) if subset is not None else 0,
                               "fingerprint": subset.fingerprint() if subset is not None else None,
                               "state": detector.state_fingerprint(), "key": key})
        if subset is not None:
            self._fitted_on[key] = (fit_set, subset)  # type: ignore[assignment]
        self._detectors_by_kappa[(id(pl_module), kappa.name, digest(parameters))] = detector
        return detector

    def fitted_states(self) -> dict[str, dict[str, Any]]:
        """Every fitted detector of the run: its log entry and its ``state_dict`` (what a run's outputs keep)."""
        return {entry["key"]: {**entry, "state_dict": self._detectors[entry["key"]].state_dict()}
                for entry in self.fits if entry["key"] in self._detectors}


FIT_OVERLAP = "fit overlap"  # the column of every table a detector fitted on an overlapping fit set shapes


def overlap_columns(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """``columns`` and, when a row carries a note about an allowed fit overlap (:meth:`ScoringPasses.fit_notes`),
    the :data:`FIT_OVERLAP` column: a table shaped by such a detector says so in every row it writes."""
    return (*columns, FIT_OVERLAP) if any(row.get(FIT_OVERLAP) for row in rows) else tuple(columns)


def fit_subset(fit_set: EvaluationSet, options: dict[str, Any]) -> EvaluationSet:
    """The fit images a detector's ``fit`` option keeps (:func:`check_fit_options`): a seeded, class-balanced
    choice (:func:`datamodules.images.balanced_choice`) of ``fraction`` of the set, ``per_class`` images of
    each class (all of a smaller class) or ``images`` in all (NAC's 1,000: one per class of ImageNet-1K, 100 per
    class of CIFAR-10), in dataset order; the whole set without a cap. Its fingerprint is the set's and the indices,
    so another cap is another pass."""
    labels = fit_set.labels()
    seed = int(options.get("seed", 0))
    if "fraction" in options:
        count = max(1, round(float(options["fraction"]) * len(labels)))
        if count >= len(labels):
            return fit_set
        chosen = balanced_choice(labels, count, seed)
    elif "per_class" in options:
        per_class = int(options["per_class"])
        counts = torch.bincount(labels[labels >= 0])
        count = int(counts.clamp(max=per_class).sum())
        if count >= len(labels):
            return fit_set
        chosen = balanced_choice(labels, count, seed)  # round r takes one image of each class with r left
    elif "images" in options:
        count = int(options["images"])
        if count >= len(labels):
            return fit_set
        chosen = balanced_choice(labels, count, seed)
    else:
        return fit_set
    indices = chosen.sort().values.tolist()
    cap = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
    return EvaluationSet(f"{fit_set.name}[{cap}]", "fit", Subset(fit_set.dataset, indices), info=dict(fit_set.info))


def cap_origin(kappa: type[Detector], given: dict[str, Any], options: dict[str, Any], fit_set: EvaluationSet,
               subset: EvaluationSet) -> str:
    """Where a capped fit set's size comes from, for an error about it: the detector's default cap or the user's,
    and the options that change it (``knn_imagenet`` keeps 1% by default: 1 of 96 images)."""
    cap = {k: v for k, v in options.items() if k in FIT_CAPS}
    whose = "the cap given" if set(FIT_CAPS) & set(given) else f"{kappa.name}'s default fit cap"
    return (f"{whose} {cap} keeps {len(subset)} of the {len(fit_set)} images of the fit set {fit_set.name!r}; change it "
            f"with --fit-arg {kappa.name}.fraction=F (0 < F <= 1; 1 keeps them all), --fit-arg "
            f"{kappa.name}.per_class=N or --fit-arg {kappa.name}.images=N (fit: {{{kappa.name}: {{per_class: N}}}} "
            "in YAML and Python), or fit on more images")


def check_head(head: tuple[Tensor, Tensor | None], data: dict[str, Tensor], *, model: str) -> None:
    """Refuse a head that does not map the pass's features to its logits (a model whose last ``Linear`` is not
    its classifier on those features): ReAct, ASH, DICE and ViM would score another network."""
    weight, bias = head
    rows = slice(0, min(256, data["features"].shape[0]))
    features, logits = data["features"][rows].double(), data["logits"][rows].double()
    if features.shape[1] != weight.shape[1]:
        raise ValueError(f"{model}: its classification head takes {weight.shape[1]} features, its penultimate layer "
                         f"gives {features.shape[1]}: the head does not map its penultimate features to its logits; "
                         "detectors that read the head cannot score it")
    made = features @ weight.double().cpu().T + (0 if bias is None else bias.double().cpu())
    # relative to the logits' size: bf16 passes round the logits by ~0.5%, a wrong head is off by O(1)
    relative = float((made - logits).norm() / logits.norm().clamp(min=1e-12)) if made.shape == logits.shape else 1.0
    if relative > 2e-2:
        difference = float((made - logits).abs().max()) if made.shape == logits.shape else float("nan")
        raise ValueError(f"{model}: its classification head does not map its penultimate features to its logits "
                         f"(shapes {tuple(made.shape)} vs {tuple(logits.shape)}, largest difference {difference:.3g}); "
                         "detectors that read the head cannot score it")


def check_fit_labels(fit_set: EvaluationSet, *, model: str, num_classes: int, cap: dict[str, Any] | None = None,
                     kappa: str | None = None, every_class: bool = True) -> None:
    """Refuse a fit set whose labels are not the model's known classes ``0..K-1``, every class present (unless
    ``every_class`` is false: a validation split's detector reads no class statistic)."""
    labels = fit_set.labels()
    outside = sorted({int(v) for v in labels[(labels < 0) | (labels >= num_classes)].unique()})
    present = set(labels.unique().tolist())
    absent = [c for c in range(num_classes) if c not in present] if every_class else []
    if absent and not outside and cap and set(FIT_CAPS) & set(cap):
        raise ValueError(f"fit set {fit_set.name}: the cap {cap} keeps {len(labels)} images, too few for {model}'s "
                         f"{num_classes} known classes ({absent[:10]} get none): raise it"
                         + (f" (--fit-arg {kappa}.fraction=F, {kappa}.per_class=N or {kappa}.images=N)" if kappa else ""))
    if outside or absent:
        raise ValueError(f"fit set {fit_set.name} ({len(labels)} images) is not {model}'s in-distribution training data: "
                         + (f"labels {outside} are not among its {num_classes} known classes; " if outside else "")
                         + (f"its known classes {absent} have no image" if absent else ""))


def default_fit_set(datamodule: Any, data: Any = None) -> EvaluationSet | None:
    """The fit set of fitted detectors when none is given: a training datamodule's training split (its known
    classes, raw images), else the evaluation data's own ``fit_set()``, else ``None``."""
    make = getattr(datamodule, "evaluation_set", None)
    if callable(make):
        return make("train", role="fit", known_only=True, name="fit")
    own = getattr(data, "fit_set", None)
    return own() if callable(own) else None


def command_fit_set(scoring: Any, fit_data: str | None, kappas: Sequence[type[Detector]]) -> EvaluationSet | None:
    """The fit set of a command's model: ``fit_data`` (``<folder>/<class>/*`` with the model's classes), else a
    checkpoint's training split, else ``None``; nothing is read when no κ fits on data."""
    if not any(k.fit_data for k in kappas):
        return None
    if fit_data is not None:
        return fit_folder_set(fit_data, getattr(scoring, "classes", None))
    if getattr(scoring, "ensemble", False) or not callable(getattr(scoring, "training_datamodule", None)):
        return None
    datamodule = scoring.training_datamodule()  # kept by the built model: its checkpoint is not read again
    return default_fit_set(datamodule) if datamodule is not None else None


def check_detectors(kappas: Sequence[type[Detector]], pl_module: nn.Module, fit_set: EvaluationSet | None) -> None:
    """Refuse, before any pass, a κ the model or the data cannot serve: no fit set, no features, no head, a model
    the κ cannot run (:meth:`metrics.detectors.Detector.check_model`: MC dropout without dropout)."""
    name = getattr(pl_module, "display_name", type(pl_module).__name__)
    for kappa in kappas:
        kappa.check_model(pl_module)
        if not kappa.needs_fit and not kappa.reads_features:
            continue
        if kappa.fit_data and fit_set is None:
            raise ValueError(f"detector {kappa.name!r} fits on in-distribution training images and {name} has none: "
                             "give fit_data (a folder of <class>/ image folders with the model's classes, e.g. "
                             "ILSVRC2012/train); a checkpoint of train.py brings its training split")
        if kappa.reads_features and not has_features(pl_module):
            raise ValueError(f"detector {kappa.name!r} reads penultimate features and {name} "
                             f"({type(getattr(pl_module, 'network', pl_module)).__name__}) has no feature hook "
                             "(timm's forward_features/forward_head, a classifier of train.py, or a features() method)")
        if kappa.needs_head:
            classification_head(pl_module)  # raises, naming the model, when it has none


FITTED_TENSOR_LIMIT = 64 * 2**20
"""Bytes above which a fitted tensor (KNN's bank of fit features) is recorded by shape and sha256 in
``fitted_detectors.pt`` instead of written: the state is refitted from the cached fit pass in seconds, a copy of
an ImageNet feature bank (21 GB at 1.28M x 2048 float64) is not worth the disk."""


def write_fitted(out: Path, passes: ScoringPasses, detectors: Sequence[Detector]) -> Path | None:
    """``fitted_detectors.pt``: the fitted state (``state_dict``) and fit log entry of each detector of a
    report, written atomically; nothing when none was fitted. Tensors over :data:`FITTED_TENSOR_LIMIT` bytes
    are listed under ``left_out`` (shape, dtype, sha256) instead; ``state`` fingerprints the whole state."""
    wanted = {id(d) for d in detectors if d.needs_fit}
    states = {key: entry for key, entry in passes.fitted_states().items() if id(passes._detectors[key]) in wanted}
    if not states:
        return None
    for entry in states.values():
        large = {name: tensor for name, tensor in entry["state_dict"].items()
                 if isinstance(tensor, Tensor) and tensor.numel() * tensor.element_size() > FITTED_TENSOR_LIMIT}
        entry["left_out"] = {name: {"shape": list(t.shape), "dtype": str(t.dtype),
                                    "sha256": tensors_fingerprint({name: t})} for name, t in large.items()}
        entry["state_dict"] = {k: v for k, v in entry["state_dict"].items() if k not in large}
    buffer = io.BytesIO()
    torch.save(states, buffer)
    return atomic_write_bytes(Path(out) / "fitted_detectors.pt", buffer.getvalue())


def detector_pairs(models: Sequence[nn.Module], kappas: Sequence[type[Detector]]) -> list[tuple[nn.Module, type[Detector]]]:
    """The (model, κ) detectors of a command that evaluates several models: each κ with the models it applies
    to (ensemble κ with ensembles, the others with single models, :func:`metrics.pairs_with`), checked by
    :func:`metrics.check_kappa`. A κ that pairs with no model, or a model without κ, is refused, naming them:
    when the run starts, never as an empty table."""
    def name(model: nn.Module) -> str:
        return getattr(model, "display_name", type(model).__name__)

    pairs = [(m, k) for m in models for k in kappas if pairs_with(k, ensemble=bool(getattr(m, "ensemble", False)))]
    unpaired = [k.name for k in kappas if not any(k is kappa for _, kappa in pairs)]
    idle = [name(m) for m in models if not any(m is model for model, _ in pairs)]
    if unpaired or idle:
        raise ValueError("the models and confidence functions do not pair: "
                         + (f"{unpaired} pair with none of the models {[name(m) for m in models]}; " if unpaired else "")
                         + (f"the models {idle} have no confidence function among {[k.name for k in kappas]}; "
                            if idle else "")
                         + "ensemble_* κ need ensemble:<members> models, the others single models")
    for model, kappa in pairs:
        check_kappa(kappa, model=name(model), ensemble=bool(getattr(model, "ensemble", False)),
                    background=bool(getattr(model, "background_class", False)))
    return pairs
