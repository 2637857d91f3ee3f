"""The quality bar of a deep ensemble: every member's known-class accuracy on its ID test split.

Mukhoti et al.'s semantic regulariser and the description of generated sets (DESIGN.md §5.3) are only as good
as the ensemble behind them: members near chance disagree on everything, so their mutual information says
nothing about semantic novelty, and their predictions say nothing about whether a shifted image kept its
label. So the ensemble's quality is measured where it is trained and checked wherever it shapes a result:

- ``train.py ensemble`` measures every member's accuracy on the known classes of its datamodule's ID test
  split right after its ``fit`` (the checkpoint it lists, not a selection: ``best.ckpt`` is still chosen by
  the config's monitor), records them next to the members file (:data:`QUALITY_FILE`, ``ensemble.json``:
  per member its path, sha256, seed, accuracy and image count, and the bar stated with ``--min-accuracy``),
  and fails, naming the member, its accuracy and the bar, when one is below a stated bar;
- the generators' MI regulariser (``lambda_semantic > 0``) at ``fit``, and the ensemble that describes
  generated sets (``evaluate.py generate`` and ``generated``), read that record (or, when there is none, or it
  no longer matches the members' files, measure the members on their own ID test split) and refuse an
  ensemble with a member below its bar, unless told (``allow_weak_ensemble``); then every table the ensemble
  shapes says so (:meth:`EnsembleQuality.flag`).

The bar is the one stated at training; when none was stated, the sanity bar :func:`sanity_bar`: chance plus
half the way from chance to perfect, ``(1 + 1/K) / 2`` for ``K`` known classes (0.625 for the demo's 4,
0.504 for ImageNet P1's 116). It only rejects members that learnt little; a researcher states the bar their
task deserves (the demo's config: 0.90 on four easy classes).

The ID test split is used, not validation, because it is the number every table reports as a model's
accuracy (``evaluate.py generated``'s ID test rows) and the split every evaluation command can rebuild from
a checkpoint; the measurement accepts or refuses an ensemble and never selects a checkpoint.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from datamodules.batch import unpack_batch
from lightning_modules.checkpoint import datamodule_from_checkpoint, load_module, read_checkpoint
from lightning_modules.nets.ensemble import member_paths
from lightning_modules.open_set_classifier import OpenSetClassifier
from openset_common.artefacts import atomic_write_text, file_sha256
from openset_common.labels import known_columns

QUALITY_FILE = "ensemble.json"  # next to the members file ensemble.txt
SPLIT = "test"
METRIC = "known-class accuracy on the ID test split"
ALLOW_OPTION = "--allow-weak-ensemble"


class WeakEnsembleError(ValueError):
    """An ensemble with a member below its quality bar, where one is required; the message names the member,
    its accuracy, the bar and how to proceed anyway."""


class WeakEnsembleWarning(UserWarning):
    """A weak ensemble used anyway (``allow_weak_ensemble``); the tables it shapes say so."""


def chance_accuracy(num_classes: int) -> float:
    """``1 / K``: the accuracy of a uniform guess among ``K`` known classes."""
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    return 1.0 / num_classes


def sanity_bar(num_classes: int) -> float:
    """The bar when none was stated: chance plus half the way from chance to 1, ``(1 + 1/K) / 2``."""
    chance = chance_accuracy(num_classes)
    return chance + (1.0 - chance) / 2


def check_bar(min_accuracy: float | None) -> float | None:
    """A stated bar as a float in ``[0, 1]`` (``None``: none stated).

    Raises:
        ValueError: a bar outside ``[0, 1]``.
    """
    if min_accuracy is None:
        return None
    if not 0.0 <= float(min_accuracy) <= 1.0:
        raise ValueError(f"the minimum accuracy is a fraction in [0, 1], got {min_accuracy}")
    return float(min_accuracy)


@dataclass(frozen=True)
class MemberAccuracy:
    """One member's known-class accuracy on its ID test split.

    Attributes:
        path: the member checkpoint (in a record: relative to the record's folder).
        accuracy: the fraction of the split's known-class images whose argmax over the known classes is right.
        images: how many known-class images were scored.
        sha256: the checkpoint's digest when measured (a record is trusted only for the same file).
        seed: the member's training seed, when known.
    """

    path: str
    accuracy: float
    images: int
    sha256: str | None = None
    seed: int | None = None


@dataclass(frozen=True)
class EnsembleQuality:
    """The members' accuracies, the bar they are held to and where the numbers come from.

    Attributes:
        members: one :class:`MemberAccuracy` per member, in the ensemble's order.
        num_classes: ``K``, the known classes (chance is ``1/K``).
        min_accuracy: the bar stated at training (``None``: none; :func:`sanity_bar` applies).
        source: ``"measured"`` or the record the numbers were read from.
        name: how messages and tables name the ensemble (its members file).
    """

    members: tuple[MemberAccuracy, ...]
    num_classes: int
    min_accuracy: float | None = None
    source: str = "measured"
    name: str = "the ensemble"

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("an ensemble's quality needs at least one member")
        check_bar(self.min_accuracy)

    @property
    def bar(self) -> float:
        """The stated bar, else the sanity bar of ``K`` classes."""
        return self.min_accuracy if self.min_accuracy is not None else sanity_bar(self.num_classes)

    @property
    def bar_kind(self) -> str:
        """Which bar :attr:`bar` is, in words (for messages)."""
        if self.min_accuracy is not None:
            return "the bar stated at training (train.py ensemble --min-accuracy)"
        return (f"the sanity bar, chance {chance_accuracy(self.num_classes):.3f} plus half the way to 1, as no bar "
                "was stated (train.py ensemble --min-accuracy)")

    @property
    def below(self) -> tuple[tuple[int, MemberAccuracy], ...]:
        """``(index, member)`` of every member below the bar."""
        return tuple((i, m) for i, m in enumerate(self.members) if m.accuracy < self.bar)

    @property
    def weak(self) -> bool:
        """Whether a member is below the bar."""
        return bool(self.below)

    def summary(self) -> str:
        """``members' ID-test accuracy 0.951-0.972 (5 members, bar 0.900 stated)``."""
        accuracies = [m.accuracy for m in self.members]
        stated = "stated" if self.min_accuracy is not None else "sanity, none stated"
        count = f"{len(accuracies)} member{'s' if len(accuracies) != 1 else ''}"
        return (f"members' ID-test accuracy {min(accuracies):.3f}-{max(accuracies):.3f} ({count}, bar {self.bar:.3f} "
                f"{stated})")

    def flag(self, role: str = "ensemble") -> str:
        """What a table says about a weak ensemble it rests on (``"no"`` when none is weak)."""
        if not self.weak:
            return "no"
        members = ", ".join(f"member {i} {m.accuracy:.3f}" for i, m in self.below)
        return f"{role} {self.name}: {members} < bar {self.bar:.3f}"

    def refusal(self, what: str, *, option: str = ALLOW_OPTION) -> str:
        """The message of a refusal: which member, its accuracy, the bar, and how to proceed anyway."""
        members = "; ".join(f"member {i} ({m.path}) has ID-test accuracy {m.accuracy:.3f} on {m.images} images"
                            for i, m in self.below)
        return (f"{self.name} is below its quality bar for {what}: {members}, below {self.bar:.3f} ({self.bar_kind}; "
                f"accuracies {self.source}). An ensemble near chance makes the mutual information and the predictions "
                f"meaningless: train its members longer (train.py ensemble reports their accuracy), or give {option} "
                "to use it anyway (every table it shapes then says so)")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (checkpoints and ``info.json`` record it); :meth:`from_dict` reads it back."""
        return {"name": self.name, "source": self.source, "num_classes": self.num_classes,
                "min_accuracy": self.min_accuracy, "bar": self.bar, "weak": self.weak,
                "members": [asdict(m) for m in self.members]}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EnsembleQuality:
        """The quality :meth:`as_dict` wrote."""
        return cls(tuple(MemberAccuracy(**m) for m in values["members"]), num_classes=int(values["num_classes"]),
                   min_accuracy=values.get("min_accuracy"), source=str(values.get("source", "recorded")),
                   name=str(values.get("name", "the ensemble")))

    def record(self, folder: str | Path) -> dict[str, Any]:
        """The JSON record of :data:`QUALITY_FILE` in ``folder`` (member paths relative to it)."""
        folder = Path(folder).resolve()
        return {
            "metric": METRIC, "split": SPLIT, "num_classes": self.num_classes,
            "chance": chance_accuracy(self.num_classes), "min_accuracy": self.min_accuracy,
            "sanity_bar": sanity_bar(self.num_classes),
            "members": [{"path": os.path.relpath(Path(m.path).resolve(), folder), "sha256": m.sha256, "seed": m.seed,
                         "accuracy": m.accuracy, "images": m.images} for m in self.members],
        }


def known_class_accuracy(module: torch.nn.Module, datamodule: Any, *, device: torch.device | str | None = None
                         ) -> tuple[float, int]:
    """``(accuracy, images)`` of a classifier on the known-class images of its datamodule's ID test split.

    The images come through the datamodule's own ``test_dataloader`` (its transform and normalisation, as in
    training); the prediction is the argmax over the known classes (a background column is left out). The
    global random state is left as it was (a DataLoader draws its base seed from it even unshuffled), so a
    check before a training run does not change the run's data order.

    Raises:
        ValueError: the split holds no known-class image.
    """
    if getattr(datamodule, "test_set", None) is None:
        datamodule.setup("test")
    device = torch.device(device) if device is not None else next(module.parameters()).device
    background = bool(getattr(module, "background_class", False))
    was_training = module.training
    module.to(device).eval()
    correct, count = 0, 0
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        for batch in datamodule.test_dataloader():
            images, targets, _, _ = unpack_batch(batch)
            known = targets >= 0
            if not bool(known.any()):
                continue
            logits: Tensor = module(images[known].to(device))
            predicted = known_columns(logits.float(), background).argmax(dim=1).cpu()
            correct += int((predicted == targets[known]).sum())
            count += int(known.sum())
    module.train(was_training)
    if count == 0:
        raise ValueError(f"the ID test split of {type(datamodule).__name__} holds no known-class image to measure "
                         "the accuracy on")
    return correct / count, count


# measurements of this process by (resolved path, sha256, data arguments): a file measured once is not measured
# again by the next command of the same process (a report card's sections, a test session)
_MEASURED: dict[tuple[str, str, str], tuple[MemberAccuracy, int]] = {}


def measure_member(path: str | Path, *, data_args: dict[str, Any] | None = None,
                   device: torch.device | str | None = None) -> tuple[MemberAccuracy, int]:
    """``(its accuracy, K)`` of a member checkpoint on its own datamodule's ID test split (``data_args`` change
    that datamodule's arguments, e.g. the data root on another machine). The global random state is left as it
    was (building the module draws its initial weights before the checkpoint's replace them)."""
    sha256 = file_sha256(path)
    key = (str(Path(path).resolve()), sha256, json.dumps(data_args or {}, sort_keys=True, default=str))
    if key not in _MEASURED:
        with torch.random.fork_rng(devices=[]):
            _MEASURED[key] = _measure(path, sha256, data_args, device)
    measured, num_classes = _MEASURED[key]
    return MemberAccuracy(str(path), measured.accuracy, measured.images, sha256=sha256), num_classes


def _measure(path: str | Path, sha256: str, data_args: dict[str, Any] | None, device: torch.device | str | None
             ) -> tuple[MemberAccuracy, int]:
    checkpoint = read_checkpoint(path)
    module = load_module(path, checkpoint, expected=OpenSetClassifier,
                         hint="an ensemble member is a classifier checkpoint of train.py")
    datamodule = datamodule_from_checkpoint(checkpoint, path, data_args)
    accuracy, images = known_class_accuracy(module, datamodule, device=device or "cpu")
    return MemberAccuracy(str(path), accuracy, images, sha256=sha256), int(module.num_classes)


def write_record(members_file: str | Path, quality: EnsembleQuality) -> Path:
    """Write :data:`QUALITY_FILE` next to a members file (atomically: never half written)."""
    folder = Path(members_file).parent
    text = json.dumps(quality.record(folder), indent=2) + "\n"
    return atomic_write_text(folder / QUALITY_FILE, text)


def _members_file(members: str | Path | Sequence[str | Path]) -> Path | None:
    if isinstance(members, (str, Path)):
        members = [members]
    listed = [str(m) for m in members]
    if len(listed) == 1 and not listed[0].endswith(".ckpt") and "," not in listed[0]:
        return Path(listed[0])
    return None


def recorded_quality(members: str | Path | Sequence[str | Path]) -> EnsembleQuality | None:
    """The quality recorded next to a members file, if it describes exactly these member files.

    ``None`` when the members are given as checkpoints rather than a members file, when there is no record, or
    when the record's members differ from the file's or a member's sha256 changed since (a warning says which).
    """
    listing = _members_file(members)
    if listing is None or not (listing.parent / QUALITY_FILE).is_file():
        return None
    record_path = listing.parent / QUALITY_FILE
    try:
        record = json.loads(record_path.read_text())
        entries = record["members"]
        recorded = [str((record_path.parent / e["path"]).resolve()) for e in entries]
        num_classes, min_accuracy = int(record["num_classes"]), check_bar(record.get("min_accuracy"))
    except (ValueError, KeyError, TypeError) as error:
        warnings.warn(f"{record_path} is not a quality record of train.py ensemble ({error}): the members' accuracy "
                      "is measured instead", WeakEnsembleWarning, stacklevel=2)
        return None
    listed = [str(Path(p).resolve()) for p in member_paths(listing)]
    if listed != recorded:
        warnings.warn(f"{record_path} records other members than {listing} lists: their accuracy is measured instead",
                      WeakEnsembleWarning, stacklevel=2)
        return None
    for entry, path in zip(entries, listed, strict=True):
        if not Path(path).is_file() or file_sha256(path) != entry.get("sha256"):
            warnings.warn(f"{record_path}: member {path} changed since its accuracy was recorded: the members' "
                          "accuracy is measured instead", WeakEnsembleWarning, stacklevel=2)
            return None
    return EnsembleQuality(
        tuple(MemberAccuracy(path, float(e["accuracy"]), int(e["images"]), sha256=e.get("sha256"), seed=e.get("seed"))
              for e, path in zip(entries, listed, strict=True)),
        num_classes=num_classes, min_accuracy=min_accuracy, source=f"recorded in {record_path}",
        name=str(listing))


def ensemble_name(members: str | Path | Sequence[str | Path]) -> str:
    """How messages name an ensemble: its members file, or its checkpoints."""
    listing = _members_file(members)
    return str(listing) if listing is not None else "the ensemble of " + ", ".join(member_paths(members))


def ensemble_quality(members: str | Path | Sequence[str | Path], *, data_args: dict[str, Any] | None = None,
                     device: torch.device | str | None = None) -> EnsembleQuality:
    """The recorded quality of an ensemble (:func:`recorded_quality`), else its members measured on their own
    ID test split (:func:`measure_member`; no bar stated)."""
    recorded = recorded_quality(members)
    if recorded is not None:
        return recorded
    measured = [measure_member(p, data_args=data_args, device=device) for p in member_paths(members)]
    return EnsembleQuality(tuple(m for m, _ in measured), num_classes=measured[0][1], name=ensemble_name(members))


def require_quality(quality: EnsembleQuality, *, what: str, allow_weak: bool = False,
                    option: str = ALLOW_OPTION) -> EnsembleQuality:
    """Refuse a weak ensemble, or, with ``allow_weak``, warn and let it through (its tables say so).

    Raises:
        WeakEnsembleError: a member below the bar and not ``allow_weak``; the message names it, its accuracy
            and the bar.
    """
    if quality.weak:
        if not allow_weak:
            raise WeakEnsembleError(quality.refusal(what, option=option))
        warnings.warn(f"{quality.refusal(what, option=option)}. Used anyway ({option})", WeakEnsembleWarning,
                      stacklevel=2)
    return quality


def check_ensemble(members: str | Path | Sequence[str | Path], *, what: str, allow_weak: bool = False,
                   option: str = ALLOW_OPTION, data_args: dict[str, Any] | None = None,
                   device: torch.device | str | None = None) -> EnsembleQuality:
    """:func:`ensemble_quality`, then :func:`require_quality`."""
    return require_quality(ensemble_quality(members, data_args=data_args, device=device), what=what,
                           allow_weak=allow_weak, option=option)
