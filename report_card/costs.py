"""The card's cost section: what each detector of the run cost next to how well it detects.

From the run's :meth:`evaluation_engine.scoring.ScoringPasses.costs`, measured in this run on the hardware it ran
on (named in every row): the fit's time and peak memory above its start, the images per second of the whole
scoring (the shared forward pass, the detector's own passes and its scoring, over every set the card scored with
it), and the forward and backward passes of the network per image. The figure puts a headline AUROC of the
leaderboard against images per second, one point per (model, κ), with its interval as the error bar.

What the numbers are good for: a ratio between the detectors of one run, measured side by side on one machine
(a detector 10x slower than another here is about 10x slower elsewhere where both are bound by the same work).
What they are not: an absolute time on other hardware (a GPU moves the fit's linear algebra and the passes by
different factors), or a time of a pass taken from the cache of an earlier run on other hardware (the row then
names both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluation_methods.registry import Figure, Section, Table
from metrics.detectors import resolve_detector


def defaults(kappa: str) -> dict[str, Any]:
    """A detector's default hyperparameters (``{}`` for one the registry cannot resolve any more)."""
    try:
        return resolve_detector(kappa).hyperparameter_defaults()
    except ValueError:
        return {}

PREFERRED = ("ood_near_auroc", "ood_far_auroc")
"""The headline of the accuracy–cost figure, the first of these the leaderboard has, else its first AUROC column,
else its first column."""

COLUMNS = ["model", "κ", "parameters", "fit (s)", "fit peak memory (MiB)", "fit images", "images/s",
           "scored images", "passes per image", "measured on"]

TEXT = ("What each detector cost in this run, measured on the hardware named in its row. Fit: its fit on the "
        "gathered fit outputs and, for a detector with its own pass (AdaSCALE, NAC), that pass over the fit images (the "
        "shared fit pass, used by every detector fitted on the set, not counted), its peak memory above the start. "
        "One row per parameter set: a search (--tune) adds its candidates, which scored the validation sets only. "
        "Images/s: the images it scored over the seconds of everything that scored them -- "
        "the shared forward pass (each detector charged the whole pass, as if it ran alone), its own forward and "
        "backward passes, its scoring. Passes per image: the network's forward and backward passes for one "
        "score. Good for: a ratio between the detectors of this run. Not for: an absolute time on other hardware.")


def _number(value: Any, digits: int = 3) -> Any:
    if value is None:
        return None
    return float(f"{float(value):.{digits}g}")


def headline_column(columns: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The leaderboard column the figure plots (:data:`PREFERRED`, else the first AUROC; ``None``: no AUROC, no
    figure)."""
    by_key = {c["key"]: c for c in columns}
    for key in PREFERRED:
        if key in by_key:
            return by_key[key]
    return next((c for c in columns if "auroc" in c["key"] and c.get("higher_is_better", True)), None)


def cost_rows(costs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The cost table's rows (:data:`COLUMNS`), one per (model, κ) and parameter set, in the run's order."""
    rows = []
    for cost in costs:
        peak = cost.get("fit peak bytes")
        given = {k: v for k, v in cost["parameters"].items() if v != defaults(cost["κ"]).get(k, v)}
        rows.append({
            "model": cost["model"], "κ": cost["κ"],
            "parameters": ", ".join(f"{k}={v}" for k, v in given.items()) or "defaults",
            "fit (s)": _number(cost.get("fit seconds")),
            "fit peak memory (MiB)": None if peak is None else _number(max(peak, 0) / 2**20),
            "fit images": cost.get("fit samples") or None, "images/s": _number(cost.get("images/s")),
            "scored images": cost.get("scored samples"),
            "passes per image": f"{cost['forward passes']} forward"
                                + (f", {cost['backward passes']} backward" if cost["backward passes"] else ""),
            "measured on": cost.get("hardware")})
    return rows


def figure_points(rows: Sequence[Mapping[str, Any]], leaderboard: Mapping[str, Any], column: Mapping[str, Any]
                  ) -> list[dict[str, Any]]:
    """The accuracy-cost figure's points: per leaderboard row, its cell of ``column`` (value and interval) and the
    images per second of its (model, κ)'s cost row that scored the most images -- the parameters it reports (a
    search's candidates scored only the validation sets)."""
    rate: dict[tuple[str, str], Any] = {}
    for row in sorted(rows, key=lambda r: r.get("scored images") or 0):
        rate[(row["model"], row["κ"])] = row["images/s"]
    points = []
    for row in leaderboard.get("rows", []):
        cell = row["cells"].get(column["key"]) or {}
        points.append({"model": row["model"], "κ": row["kappa"], "images/s": rate.get((row["model"], row["kappa"])),
                       "value": cell.get("value"), "low": cell.get("low"), "high": cell.get("high")})
    return points


def cost_section(costs: Sequence[Mapping[str, Any]], leaderboard: Mapping[str, Any], *, output_dir: Path,
                 plots: bool) -> Section | None:
    """The card's section "What each detector costs": the table and the accuracy–cost figure (``None``: nothing
    was scored)."""
    rows = cost_rows(costs)
    if not rows:
        return None
    section = Section("cost", "What each detector costs", TEXT, tables=[Table("cost per detector, this run",
                                                                              list(COLUMNS), rows)])
    column = headline_column(leaderboard.get("columns", []))
    if plots and column is not None:
        points = figure_points(rows, leaderboard, column)
        if any(p["images/s"] and p["value"] is not None for p in points):
            from evaluation_engine.plots import plot_accuracy_cost

            path = plot_accuracy_cost(points, output_dir / "cost" / "accuracy_cost.png", metric=column["title"],
                                      title=f"{column['title']} against images per second")
            section.figures.append(Figure(
                "accuracy against cost", path,
                f"{column['title']} (the leaderboard's, with its interval) against the images per second of the whole "
                "scoring in this run, one point per detector: a ratio between detectors of this run, not an absolute "
                "speed elsewhere"))
    return section
