"""What made a generator, as every generated set's ``info.json`` records it: its training hyper-parameters and
steps (:func:`training_record`, from its checkpoint) and the ensemble members it was trained against
(:func:`member_records`: paths, resolved paths and digests, so a detector sharing a member is found by either)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_modules.generated.generators import RegularisedGenerator
from lightning_modules.nets.ensemble import member_paths
from openset_common.artefacts import file_sha256

# the generator's training hyper-parameters every info.json records (None where a kind has no such option)
TRAINING_RECORD = ("channels", "image_size", "lambda_adversarial", "lambda_l1", "l1_target", "lambda_perceptual",
                   "lambda_semantic", "discriminator", "pairing", "regularise_every", "adversarial_loss", "lr", "betas",
                   "dropout", "base_width", "latent_dim", "architecture", "conditional_classes", "lpips_net",
                   "lpips_random_backbone", "training_seed")


def member_records(members: str | Sequence[str] | None) -> list[dict[str, Any]]:
    """``[{"path", "resolved", "sha256"}]`` of an ensemble's member checkpoints (a list or a members file):
    what the generator was trained against, compared with a detector's members by resolved path or digest
    (``sha256`` is ``None`` for a member file that no longer exists)."""
    if not members:
        return []
    records = []
    for path in member_paths(members):
        resolved = Path(path).resolve()
        records.append({"path": str(path), "resolved": str(resolved),
                        "sha256": file_sha256(resolved) if resolved.is_file() else None})
    return records


def training_record(checkpoint: dict[str, Any], module: RegularisedGenerator) -> dict[str, Any]:
    """What made the generator, from its checkpoint: every training hyper-parameter of :data:`TRAINING_RECORD`
    and the training steps (one step = a discriminator and a generator update; Lightning's ``global_step``
    counts both)."""
    hparams = dict(module.hparams)
    record = {key: hparams.get(key) for key in TRAINING_RECORD}
    if isinstance(record["betas"], tuple):
        record["betas"] = list(record["betas"])
    optimizer_steps = int(checkpoint.get("global_step", 0))
    record.update(training_steps=optimizer_steps // 2, optimizer_steps=optimizer_steps,
                  epochs=int(checkpoint.get("epoch", 0)))
    return record


