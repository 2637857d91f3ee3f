"""Where a card's numbers come from: the versions, the models' files, the data of the passes; and the mark of
a card whose run has not finished (stale)."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from openset_common.artefacts import atomic_write_text, file_sha256


def mark_stale(folder: Path) -> None:
    """Mark the card a previous run left in ``folder`` as stale while a new one runs (a run killed midway leaves
    the mark): a banner at the top of ``index.html``, a first line in ``report.md``, ``"stale"`` in
    ``report.json``. A finished run writes all three anew."""
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    text = (f"STALE: a report card run over this folder started at {started} and has not finished; the numbers "
            "below are from an earlier run.")
    page = folder / "index.html"
    if page.is_file():
        content = page.read_text()
        if STALE_MARK not in content:
            content = content.replace("<body>", f'<body>\n<p class="stale" {STALE_MARK} style="background:#fdd;'
                                      f'padding:.5em;font-weight:bold">{text}</p>', 1)
            atomic_write_text(page, content)
    markdown = folder / "report.md"
    if markdown.is_file() and not markdown.read_text().startswith("**STALE"):
        atomic_write_text(markdown, f"**{text}**\n\n" + markdown.read_text())
    payload = folder / "report.json"
    if payload.is_file():
        try:
            report_json = json.loads(payload.read_text())
        except ValueError:
            report_json = None
        if isinstance(report_json, dict):
            report_json["stale"] = text
            atomic_write_text(payload, json.dumps(report_json, indent=2) + "\n")


STALE_MARK = 'data-stale="true"'


def model_sha256(spec: str) -> str | None:
    path = Path(spec.removeprefix("ensemble:"))
    return file_sha256(path) if path.is_file() else None


def versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("openset-bench", "torch", "torchvision", "pytorch-lightning", "torchmetrics", "timm", "numpy",
                    "scikit-learn", "wandb"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def data_sets(log: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The data sets of a run's passes (its log), each once: name, role, fingerprint, samples."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in log:
        seen.setdefault(entry["fingerprint"], {"name": entry["set"], "role": entry["role"],
                                               "fingerprint": entry["fingerprint"], "samples": entry["samples"]})
    return list(seen.values())


def fit_overlap_notes(fits: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per fitted detector of the run whose fit set overlaps data it was evaluated on (allowed by
    ``--allow-fit-overlap``; the fit log's ``overlaps``, :meth:`ScoringPasses.fitted`): ``model / κ: fit set
    'fit' overlaps id_test: 40 of its 40 images are id_test images (allowed by --allow-fit-overlap)``."""
    lines = {f"Warning: {fit['model']} / {fit['kappa']}: {overlap['note']}; its numbers are of images it was "
             "fitted on.": None for fit in fits for overlap in fit.get("overlaps", [])}
    return list(lines)


def fit_split_notes(fits: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per detector that its paper fits on ID validation images (``fit_split = "val"``: VRA, AdaSCALE, KL
    matching) and that a section fitted on other images (the training split: sections without a validation set)."""
    lines = {f"{fit['model']} / {fit['kappa']}: fitted on ID validation images by its paper; fitted here on "
             f"{fit['fit set']} (no ID validation set in that section).": None for fit in fits
             if fit.get("fit split") == "val" and fit.get("fit set role") not in ("id_val", None)}
    return list(lines)


__all__ = ["STALE_MARK", "data_sets", "fit_overlap_notes", "fit_split_notes", "mark_stale", "model_sha256", "versions"]
