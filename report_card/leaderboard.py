"""The card's leaderboard: the comparison of the rows of each column (best, significantly worse, share of
resamples ranked first), the models of several seeds combined into one row, and the leaderboard as text."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from scipy.stats import t as student_t

from evaluation_engine.intervals import Intervals
from evaluation_methods.registry import Headline, cell, headlines
from metrics import seed_mean, seed_mean_replicates, share_first, worse_than_best

COMPARISON_METHOD = ("studentised bootstrap max-T over all pairs of rows, stepped down (Romano & Wolf 2005), "
                     "metrics.worse_than_best")
SIGNIFICANT_TEXT = ("▼ (significantly worse than the best row of its column) is a simultaneous statement over the "
                    "rows of that column compared on the same units: " + COMPARISON_METHOD + "; the chance that any "
                    "▼ of a column is false is at most 1 − the card's level. Not controlled: marks across columns "
                    "(each column is its own family).")


def compare_column(entries: Sequence[tuple[dict[str, Any], Any]], column: Headline, intervals: Intervals, *,
                   unit: str = "") -> None:
    """Fill each row's cell of one leaderboard column: the value, its interval, ``best``, ``significant`` (worse
    than the best row, simultaneously over the column: :func:`metrics.worse_than_best` over the rows measured
    on the same units as the best row, at the card's level) and ``share_first`` (the share of resamples in
    which the row ranks first, where every row shares the units); ``unit`` says what the column resampled."""
    present = [(row, entry) for row, entry in entries if entry is not None and entry[0] is not None]
    if not present:
        return
    sign = 1.0 if column.higher_is_better else -1.0
    _, best = max(present, key=lambda item: sign * item[1][0])
    tied = {id(row) for row, entry in present if entry[0] == best[0]}  # equal values share the best mark
    # the family: rows measured on the same units as the best row, with replicates over the same resamples
    family = [(row, entry) for row, entry in present
              if _units(entry) == _units(best) and entry[3] is not None and best[3] is not None
              and entry[3].numel() == best[3].numel() and entry[3].numel() > 1]
    worse: dict[int, bool] = {}
    if len(family) > 1:
        flags = worse_than_best(torch.tensor([e[0] for _, e in family], dtype=torch.float64),
                                torch.stack([e[3].double().flatten() for _, e in family]), intervals.level,
                                higher_is_better=column.higher_is_better)
        worse = {id(row): bool(flag) for (row, _), flag in zip(family, flags, strict=True)}
    shares: dict[int, float] = {}
    if len(family) == len(present):
        stacked = torch.stack([e[3].double().flatten() for _, e in family]) if family else torch.empty(0, 0)
        stacked = stacked[:, ~torch.isnan(stacked).any(dim=0)] if family else stacked
        if family and stacked.shape[1]:
            shares = {id(row): float(p) for (row, _), p in zip(
                family, share_first(stacked, higher_is_better=column.higher_is_better), strict=True)}
    for row, (value, low, high, *_) in present:
        row["cells"][column.key] = {"value": value, "low": low, "high": high, "best": id(row) in tied,
                                    "significant": worse.get(id(row), False), "share_first": shares.get(id(row)),
                                    "unit": unit}


def _units(entry: tuple) -> str:
    return entry[4] if len(entry) > 4 else ""


TWO_SEEDS_NOTE = ("2 seeds: the seeds' part of the interval is a Student t on 1 degree of freedom (its {level} "
                  "quantile is {quantile:.1f}; {three:.1f} with 3 seeds), scaled by the spread of two numbers: the "
                  "interval is uninformative (it often spans all of [0, 1]); a third seed makes it usable")


def two_seeds_note(level: float) -> str:
    """Why the interval of a mean over two seeds says little, with the t quantiles at ``level``."""
    tail = (1 + level) / 2
    return TWO_SEEDS_NOTE.format(level=f"{level:.0%}", quantile=float(student_t.ppf(tail, 1)),
                                 three=float(student_t.ppf(tail, 2)))


def _not_combined(names: Sequence[str], entries: Sequence[Any]) -> str | None:
    """Why the seeds' numbers of one (κ, metric) cannot be combined, or ``None`` when they can."""
    lacking = [name for name, e in zip(names, entries, strict=True) if e is None or e[0] is None]
    if lacking:
        return f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no value"
    if any(e[3] is None for e in entries) or len({e[3].numel() for e in entries}) != 1:
        return "the seeds have no bootstrap replicates over the same resamples"
    if len({_units(e) for e in entries}) != 1:
        return ("the seeds were measured on different data (units: "
                + "; ".join(f"{name}: {_units(e) or '?'}" for name, e in zip(names, entries, strict=True)) + ")")
    complete = int(torch.stack([e[3] for e in entries]).isfinite().all(dim=0).sum())
    if complete < 2:
        return f"only {complete} resample(s) in which every seed has a value (2 needed)"
    return None


def seeds_section(cells: dict[tuple[str, str], dict[str, tuple]], rows_order: list[tuple[str, str]],
                  members: Mapping[str, Sequence[str]], intervals: Intervals, *,
                  problems: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Each model of several seeds: its members' headline numbers combined into one row (:func:`metrics.seed_mean`)
    in ``cells`` (the members' own rows leave the leaderboard), and the table of every seed's number.

    ``problems`` gets, per model of several seeds, a line for each (κ, metric) some seed measured but that could
    not be combined and why (a seed without a value, seeds measured on different data, too few resamples)."""
    table = []
    members_of = {name: group for group, names in members.items() for name in names}
    for group, names in members.items():
        for kappa in dict.fromkeys(k for m, k in rows_order if m in names):
            for headline in headlines():
                entries = [cells.get((name, kappa), {}).get(headline.key) for name in names]
                if all(e is None or e[0] is None for e in entries):
                    continue  # no seed measured it: nothing to combine, nothing lost
                why = _not_combined(names, entries)
                if why is not None:
                    if problems is not None:
                        problems.setdefault(group, []).append(f"{kappa} / {headline.title}: {why}")
                    continue
                row = {"model": group, "κ": kappa, "metric": headline.title,
                       **{f"seed {i + 1}": e[0] for i, e in enumerate(entries)}}
                estimates = torch.tensor([e[0] for e in entries], dtype=torch.float64)
                replicates = torch.stack([e[3].double() for e in entries])
                combined = seed_mean(estimates, replicates, intervals.level)
                low, high = combined.low, combined.high
                if headline.proportion:  # AUROC, CCR: within [0, 1]
                    low, high = max(0.0, low), min(1.0, high)
                else:
                    low = max(0.0, low)
                stream = intervals.seed + zlib.crc32(f"{group}|{kappa}|{headline.key}".encode())
                cells.setdefault((group, kappa), {})[headline.key] = (
                    combined.value, low, high, seed_mean_replicates(estimates, replicates, seed=stream),
                    entries[0][4])
                table.append({**row, "mean": cell(combined.value, low, high), "between-seed sd": combined.std,
                              "shared test variance": combined.shared, "dof": combined.dof,
                              "note": "uninformative: t on 1 degree of freedom" if combined.seeds == 2 else ""})
            if (group, kappa) not in rows_order and (group, kappa) in cells:
                first = next(i for i, (m, k) in enumerate(rows_order) if m in names and k == kappa)
                rows_order.insert(first, (group, kappa))
    rows_order[:] = [(m, k) for m, k in rows_order if m not in members_of]
    seeds = max((len(v) for v in members.values()), default=0)
    return {"method": "seeds", "title": "Models of several training seeds", "text": (
        "Each model below is several training runs of one recipe. The leaderboard shows the mean over its seeds "
        "with an interval that combines the sampling of the test data and the seeds: the between-seed variance "
        "over S plus the test-sampling variance the seeds share (the bootstrap covariance of their replicates "
        "over the same resamples); the interval's half-width is the quantile of a Student t on S − 1 degrees "
        "of freedom (the seeds' part, estimated from S numbers) plus a normal (the shared test sampling), a "
        "one-way random-effects model (metrics.seed_mean; Satterthwaite's t under-covers with three seeds). "
        "Each seed's own numbers are in the method sections."
        + ("".join(f"\n\n{group}: " + two_seeds_note(intervals.level) + "." for group, names in members.items()
                   if len(names) == 2))),
        "tables": [{"title": "every seed", "columns": ["model", "κ", "metric", *[f"seed {i + 1}" for i in
                                                                                range(seeds)],
                                                      "mean", "between-seed sd", "shared test variance", "dof",
                                                      "note"],
                    "rows": table}], "images": []}


def leaderboard_text(card: dict[str, Any]) -> str:
    """The leaderboard as plain text for the terminal."""
    columns = card["leaderboard"]["columns"]
    lines = []
    for row in card["leaderboard"]["rows"]:
        parts = []
        for column in columns:
            entry = row["cells"].get(column["key"])
            if entry and entry.get("value") is not None:
                digits = int(column.get("digits", 3))
                interval = (f" [{entry['low']:.{digits}f}, {entry['high']:.{digits}f}]"
                            if entry.get("low") is not None else "")
                mark = " (best)" if entry["best"] else (" (worse)" if entry["significant"] else "")
                mark += " (fitted on its test data)" if entry.get("fit_overlap") else ""
                parts.append(f"{column['method']} {column['title']} {entry['value']:.{digits}f}{interval}{mark}")
        lines.append(f"  {row['model']} / {row['kappa']}: " + "; ".join(parts))
    return "\n".join(lines)


__all__ = ["COMPARISON_METHOD", "SIGNIFICANT_TEXT", "compare_column", "leaderboard_text", "seeds_section",
           "two_seeds_note"]
