"""The report layer of the evaluation engine: output folders, the table writers, W&B and metric names.

Every evaluation writes through these, so every table of the project is made one way:

- :func:`output_dir`: the folder a report goes to (the one given, else the method's default), checked before
  anything heavy runs (:func:`check_output_dir`: an existing folder that would be overwritten, a file in the
  way, a folder that cannot be written);
- :func:`write_csv`, :func:`write_markdown`, :func:`write_json`: atomic (a half-written table is never left
  where a later run would trust it); :func:`markdown_table` and :func:`rows_to_csv` render the same rows;
- :func:`log_table`, :func:`log_images`, :func:`log_scalars`: the same to every W&B logger of the trainer,
  on global rank zero;
- :func:`metric_key`: stage-prefixed keys with one spelling per metric: ``val/…`` (during training),
  ``test/severity/…``, ``test/generated/…``, ``predict/evg/…``; metric names ``auroc``, ``worst_auroc``,
  ``min_rank``, ``accuracy``, ``ece``;
- :func:`write_replicates`: the bootstrap replicates every method keeps next to its tables (``replicates.pt``;
  the intervals' options are :class:`evaluation_engine.intervals.Intervals`), from which the report card
  compares detectors.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import WandbLogger
from torch import Tensor

from evaluation_engine.intervals import Intervals
from openset_common.artefacts import atomic_write_bytes, atomic_write_text, check_writable_folder

if TYPE_CHECKING:
    from evaluation_engine.runner import Runner

METHODS = ("open_set", "severity", "generated", "evg", "ood")


def slug(text: str) -> str:
    """A file-name-safe form of a name (``demo-best/softmax`` -> ``demo-best_softmax``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def metric_key(stage: str, method: str, *parts: str) -> str:
    """``<stage>/<method>/<part>/...``, e.g. ``test/generated/demo-best/softmax/near_ood:shift/auroc``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return "/".join((stage, method, *parts))


# -- intervals --------------------------------------------------------------------------------------------


REPLICATES_FILE = "replicates.pt"


def write_replicates(folder: str | Path, replicates: Mapping[str, Tensor], intervals: Intervals,
                     units: Mapping[str, Any] | None = None) -> Path:
    """``<folder>/replicates.pt``: per reported number its ``(B,)`` bootstrap replicates, with the options and
    ``units``: per replicate key (or ``"*"`` for every key) the identity of the units it resampled (data
    fingerprints), which the report card compares rows by (only rows resampled over the same units are
    paired)."""
    buffer = io.BytesIO()
    torch.save({"level": intervals.level, "resamples": intervals.resamples, "seed": intervals.seed,
                "replicates": {key: value.detach().double().cpu() for key, value in replicates.items()},
                "units": dict(units or {})}, buffer)
    return atomic_write_bytes(Path(folder) / REPLICATES_FILE, buffer.getvalue())


def _read_payload(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / REPLICATES_FILE
    if not path.is_file():
        return {}
    return torch.load(path, map_location="cpu", weights_only=True)


def read_replicates(folder: str | Path) -> dict[str, Tensor]:
    """The replicates a method wrote in ``folder`` (empty when it wrote none)."""
    return dict(_read_payload(folder).get("replicates", {}))


def read_units(folder: str | Path) -> dict[str, str]:
    """Per replicate key (``"*"``: every key) the identity of the units its replicates resampled (empty when the
    method wrote none)."""
    return {str(k): str(v) for k, v in _read_payload(folder).get("units", {}).items()}


# -- folders ----------------------------------------------------------------------------------------------


def check_output_dir(path: str | Path, *, overwrite: bool = True, what: str = "the report") -> Path:
    """Refuse, before anything heavy runs, a folder the report could not be written to: a file in the way
    (of the folder or of a parent), an existing folder when ``overwrite`` is off, a folder that cannot be
    written. Creates nothing."""
    path = Path(path)
    if path.is_dir() and not overwrite:
        raise FileExistsError(f"{what} would go to {path}, which exists; choose another folder or pass --overwrite")
    return check_writable_folder(path, what=what)


# Neither helper asks for ``trainer.log_dir``: under DDP it is a collective (a broadcast), and reports are
# written by global rank zero alone, so asking for it there would hang the other ranks.


def default_report_dir(trainer: pl.Trainer | None, suffix: str, checkpoint: str | None = None) -> Path:
    """Next to the tested checkpoint (``<dir>/<stem>-<suffix>``: the trainer's ``ckpt_path``, else ``checkpoint``, the
    one a built model under test came from), else in the trainer's root folder (the working folder without one)."""
    tested = getattr(trainer, "ckpt_path", None) or checkpoint
    if tested:
        return Path(tested).parent / f"{Path(tested).stem}-{suffix}"
    return Path(trainer.default_root_dir if trainer is not None else Path.cwd()) / suffix


def training_report_dir(trainer: pl.Trainer, suffix: str) -> Path:
    """During training: the checkpoint folder's ``<suffix>/`` (the same folder after a resume)."""
    folder = getattr(trainer.checkpoint_callback, "dirpath", None)
    return Path(folder or trainer.default_root_dir) / suffix


# -- tables -----------------------------------------------------------------------------------------------


def rows_to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return ""
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    return atomic_write_text(path, rows_to_csv(rows, columns))


def write_markdown(path: str | Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *,
                   preamble: str = "") -> Path:
    return atomic_write_text(path, (preamble.rstrip() + "\n\n" if preamble else "") + markdown_table(rows, columns))


def write_json(path: str | Path, payload: Any) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=2, default=_json_default) + "\n")


def write_tables(folder: str | Path, stem: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *,
                 preamble: str = "") -> tuple[Path, Path]:
    """``<stem>.csv`` and ``<stem>.md`` of the same rows."""
    folder = Path(folder)
    return (write_csv(folder / f"{stem}.csv", rows, columns),
            write_markdown(folder / f"{stem}.md", rows, columns, preamble=preamble))


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


# -- W&B --------------------------------------------------------------------------------------------------


def wandb_loggers(runner: Runner) -> list[WandbLogger]:
    """The run's W&B loggers on global rank zero (none on the other ranks)."""
    return [logger for logger in runner.loggers if isinstance(logger, WandbLogger)]


def table_cell(value: Any) -> Any:
    """A W&B table cell: numbers as floats, missing values as None (a column keeps one type)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return str(value)
    return float(value) if isinstance(value, (int, float)) else str(value)


def log_table(runner: Runner, key: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    for logger in wandb_loggers(runner):
        logger.log_table(key=key, columns=list(columns), data=[[table_cell(row.get(c)) for c in columns]
                                                               for row in rows])


def log_images(runner: Runner, images: Mapping[str, str | Path], **kwargs: Any) -> None:
    for logger in wandb_loggers(runner):
        for key, path in images.items():
            logger.log_image(key=key, images=[str(path)], **kwargs)
