"""The card to Weights & Biases: its leaderboard (every value with its interval and share of firsts), its
sections' tables and images, in one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evaluation_engine.outputs import slug
from evaluation_engine.run import TrainerOptions, make_logger


def log_card(card: dict[str, Any], options: TrainerOptions) -> None:
    """The card's leaderboard, tables and images to one W&B run (nothing where W&B is disabled)."""
    from pytorch_lightning.loggers import WandbLogger

    logger = make_logger(options, name="report-card")
    if not isinstance(logger, WandbLogger):
        return
    columns = ["model", "kappa"] + [f"{c['key']}{suffix}" for c in card["leaderboard"]["columns"]
                                    for suffix in ("", " low", " high", " share_first")]
    data = []
    for row in card["leaderboard"]["rows"]:
        values: list[Any] = [row["model"], row["kappa"]]
        for column in card["leaderboard"]["columns"]:
            found = row["cells"].get(column["key"]) or {}
            values += [found.get("value"), found.get("low"), found.get("high"), found.get("share_first")]
        data.append(values)
    logger.log_table(key="report/leaderboard", columns=columns, data=data)
    for section in card["sections"]:
        for table in section["tables"]:
            logger.log_table(key=f"report/{section['method']}/{slug(table['title'])}", columns=table["columns"],
                             data=[[flat(row.get(c)) for c in table["columns"]] for row in table["rows"]])
        for image in section["images"]:
            if Path(image["path"]).is_file():
                logger.log_image(key=f"report/{section['method']}/{slug(image['title'])}", images=[image["path"]])
    logger.experiment.finish()


def flat(value: Any) -> Any:
    """A W&B cell: a Cell as "value [low, high]", numbers as they are."""
    if isinstance(value, dict):
        if value.get("low") is None:
            return value.get("value")
        return f"{value['value']:.4f} [{value['low']:.4f}, {value['high']:.4f}]"
    return value


__all__ = ["flat", "log_card"]
