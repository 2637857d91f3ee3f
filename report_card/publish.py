"""The card to Weights & Biases: its leaderboard (every value with its interval and share of firsts), its
sections' tables and images, in one run."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

from evaluation_engine.outputs import slug
from evaluation_engine.runner import TrainerOptions, evaluation_logger
from report_card.page import image_path


def log_card(card: dict[str, Any], options: TrainerOptions, *, folder: str | Path) -> None:
    """The card's leaderboard, tables and images to one W&B run (nothing where W&B is disabled).

    Args:
        card: the report (:mod:`report_card.page`'s schema).
        options: the W&B mode, project and folder.
        folder: the card's output folder, which the images' relative paths are relative to (as on the page,
            whatever the current folder); an image missing there is left out with a warning naming it.
    """
    from pytorch_lightning.loggers import WandbLogger

    with evaluation_logger(options, name="report-card") as logger:  # the card's own run, finished at the end
        if not isinstance(logger, WandbLogger):
            return
        columns = ["model", "kappa"] + [f"{c['key']}{suffix}" for c in card["leaderboard"]["columns"]
                                        for suffix in ("", " low", " high", " share_first")]
        data = []
        for row in card["leaderboard"]["rows"]:
            values: list[Any] = [row["model"], row["kappa"]]
            for column in card["leaderboard"]["columns"]:
                cell = row["cells"].get(column["key"]) or {}
                values += [cell.get("value"), cell.get("low"), cell.get("high"), cell.get("share_first")]
            data.append(values)
        if any(row.get("fit_overlap") for row in card["leaderboard"]["rows"]):  # the page's † rows, said
            columns.append("fit overlap")
            for values, row in zip(data, card["leaderboard"]["rows"], strict=True):
                values.append(row.get("fit_overlap", ""))
        logger.log_table(key="report/leaderboard", columns=columns, data=data)
        keys: set[str] = set()
        for section in card["sections"]:
            for table in section["tables"]:
                logger.log_table(key=table_key(section["method"], table["title"]), columns=table["columns"],
                                 data=[[flat(row.get(c)) for c in table["columns"]] for row in table["rows"]])
            for image in section["images"]:
                file = image_path(image["path"], folder)
                if file.is_file():
                    key = base = table_key(section["method"], image["title"])
                    copy = 1
                    while key in keys:  # two images of one title stay two images
                        copy += 1
                        key = f"{base}_{copy}"
                    keys.add(key)
                    logger.log_image(key=key, images=[str(file)])
                else:
                    warnings.warn(f"the card's image {image['title']!r} ({file}) does not exist: not logged to W&B",
                                  UserWarning, stacklevel=2)


KEY_LENGTH = 64
"""The longest W&B key the card logs: W&B names a table's artifact ``run-<id>-<key>`` and refuses names over 128
characters."""


def table_key(method: str, title: str) -> str:
    """``report/<method>/<title's slug>``, a long title cut to :data:`KEY_LENGTH` characters with 8 hex digits of its
    sha256 (two long titles that share their start stay two keys)."""
    key = f"report/{method}/{slug(title)}"
    if len(key) <= KEY_LENGTH:
        return key
    return f"{key[:KEY_LENGTH - 9]}-{hashlib.sha256(title.encode()).hexdigest()[:8]}"


def flat(value: Any) -> Any:
    """A W&B cell: a Cell as "value [low, high]", numbers as they are."""
    if isinstance(value, dict):
        if value.get("low") is None:
            return value.get("value")
        return f"{value['value']:.4f} [{value['low']:.4f}, {value['high']:.4f}]"
    return value


__all__ = ["KEY_LENGTH", "flat", "log_card", "table_key"]
