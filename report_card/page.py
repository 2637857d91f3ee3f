"""The per-model OOD report card: one self-contained HTML page, its Markdown twin and the report itself.

The report (``report.json``, built by the evaluation) is a dict::

    {"title", "created", "command", "level", "resamples", "seed", "versions": {package: version},
     "models": [{"name", "source", "sha256"}], "data": [{"name", "role", "fingerprint", "samples"}],
     "leaderboard": {"columns": [{"key", "title", "method", "higher_is_better", "description"}],
                     "rows": [{"model", "kappa", "cells": {key: Cell}, "fit_overlap" (when marked)}]},
     "sections": [{"method", "title", "text", "tables": [{"title", "columns", "rows"}],
                   "images": [{"title", "path", "caption"}]}],
     "notes": [str]}

with ``Cell = {"value", "low", "high", "best", "significant", "share_first", "unit"}``: the estimate and its
``level`` interval (percentile bootstrap over ``unit``, or the AUROC interval), whether the row is the best of
its column, whether it is worse than the best row simultaneously over the column (``metrics.worse_than_best``:
the chance of any false mark in a column is at most 1 - level) and ``share_first``, the share of resamples in
which the row ranks first (not a probability of being the best: it favours the observed leader). A key
missing from ``cells`` was not measured and shows as "—". A Cell (and its row) of a detector fitted on images of
the data it was measured on (allowed by ``--allow-fit-overlap``) carries ``fit_overlap``, the note of its method's
tables: the page marks it with :data:`FIT_OVERLAP_MARK` and says why under the leaderboard.

:func:`render_html` makes a page that a browser opens offline: no script, style, font or image from anywhere
else (images are inlined as ``data:`` URIs), every string of the report escaped, tables sortable by a small
inline script (click a header: ascending by value, again: descending; "—" always last).
:func:`render_markdown` renders the same content as Markdown; :func:`write_page` writes ``index.html``,
``report.md`` and ``report.json`` atomically through the report layer.
"""

from __future__ import annotations

import base64
import html
import math
import mimetypes
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluation_engine.outputs import write_json
from openset_common.artefacts import atomic_write_text

MISSING = "—"
SIGNIFICANT_MARK = "▼"
FIT_OVERLAP_MARK = "†"
FIT_OVERLAP_TEXT = (f"{FIT_OVERLAP_MARK} = the detector was fitted on a fit set that holds images of the data this "
                    "number was measured on (run with --allow-fit-overlap): it scored images it was fitted on, so "
                    "the number is optimistic, and the best and ▼ marks of its column compare the other rows with it")


# -- numbers ----------------------------------------------------------------------------------------------


def is_cell(value: Any) -> bool:
    """Whether ``value`` is a Cell (a mapping with a ``value``), as opposed to a plain number or string."""
    return isinstance(value, Mapping) and "value" in value


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer_like(numbers: Sequence[Any]) -> bool:
    """Integers, or integral floats of which one is above 1 (ranks such as MinRank); 0.0 and 1.0 alone are
    AUROC-like and keep their decimals."""
    finite = [n for n in numbers if _finite(n)]
    if not finite:
        return False
    if all(isinstance(n, int) for n in finite):
        return True
    return all(float(n).is_integer() for n in finite) and any(abs(n) > 1 for n in finite)


def _number(value: Any, *, integer: bool, digits: int) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return MISSING if value is None else str(value)
    if math.isnan(value):
        return MISSING
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{value:.0f}" if integer else f"{value:.{digits}f}"


def format_cell(value: Any, *, integer: bool | None = None, digits: int = 3) -> str:
    """A Cell, number or string as the page shows it.

    A Cell is ``"0.858 [0.841, 0.874]"`` (its value alone when it has no interval); integers (and integral
    floats above 1, such as MinRank) are written without decimals, other floats with ``digits`` decimals;
    None, NaN and a Cell without a value are "—". ``integer`` forces one way or the other.

    Examples:
        >>> format_cell({"value": 0.8581, "low": 0.8412, "high": 0.874})
        '0.858 [0.841, 0.874]'
        >>> format_cell({"value": 3.0, "low": 1.0, "high": 7.0}), format_cell(12), format_cell(float("nan"))
        ('3 [1, 7]', '12', '—')
    """
    if is_cell(value):
        numbers = [value.get(k) for k in ("value", "low", "high")]
        whole = _integer_like(numbers) if integer is None else integer
        estimate = _number(numbers[0], integer=whole, digits=digits)
        if estimate == MISSING or not (_finite(numbers[1]) and _finite(numbers[2])):
            return estimate
        low, high = (_number(n, integer=whole, digits=digits) for n in numbers[1:])
        return f"{estimate} [{low}, {high}]"
    if isinstance(value, Mapping):
        raise TypeError(f"a Cell needs a 'value' key, got the keys {sorted(value)}")
    if value is None or isinstance(value, (str, bool)):
        return MISSING if value is None else str(value)
    if isinstance(value, (int, float)):
        return _number(value, integer=_integer_like([value]) if integer is None else integer, digits=digits)
    raise TypeError(f"cannot format {value!r} (a {type(value).__name__}) as a cell")


def sort_value(value: Any) -> float | None:
    """The number a table sorts by: a Cell's value or the number itself; None for strings and missing values."""
    number = value.get("value") if is_cell(value) else value
    if isinstance(number, bool) or not isinstance(number, (int, float)) or math.isnan(number):
        return None
    return float(number)


def _percent(level: Any) -> str:
    return f"{float(level) * 100:g}%" if _finite(level) else "the report's"


def _method_title(column: Mapping[str, Any]) -> str:
    """A leaderboard column's method, as the card names it (``method_title``; the method's id in a card of before)."""
    return str(column.get("method_title") or column.get("method", ""))


def _units(rows: Iterable[Mapping[str, Any]], key: str) -> list[str]:
    """The resampling units of a leaderboard column, in order of appearance."""
    units: list[str] = []
    for row in rows:
        cell = row.get("cells", {}).get(key)
        if is_cell(cell) and cell.get("unit") and cell["unit"] not in units:
            units.append(str(cell["unit"]))
    return units


# -- HTML -------------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


STYLE = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d8dde6; --head: #eef1f6; --best: #e7f4ea; --accent: #2456a6;
        --warn: #b3261e; }
* { box-sizing: border-box; }
body { margin: 0; background: #f7f8fa; color: var(--fg); font: 16px/1.5 system-ui, -apple-system, "Segoe UI",
       Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 92rem; margin: 0 auto; padding: 1.5rem 1.25rem 3rem; background: #fff; min-height: 100vh;
       box-shadow: 0 0 0 1px var(--line); }
h1 { font-size: 1.7rem; margin: 0.2rem 0 0.3rem; }
h2 { font-size: 1.3rem; margin: 2.2rem 0 0.6rem; padding-bottom: 0.25rem; border-bottom: 2px solid var(--line); }
h3 { font-size: 1.05rem; margin: 1.4rem 0 0.4rem; }
p { margin: 0.5rem 0; max-width: 62rem; }
.meta { color: var(--muted); font-size: 0.9rem; }
nav.toc { font-size: 0.92rem; margin: 0.8rem 0 0; display: flex; flex-wrap: wrap; gap: 0.15rem 1rem; }
nav.toc a { color: var(--accent); text-decoration: none; white-space: nowrap; }
nav.toc a:hover { text-decoration: underline; }
.how { background: #f2f5fb; border-left: 4px solid var(--accent); padding: 0.6rem 1rem; margin: 1rem 0;
       font-size: 0.95rem; }
.table-wrap { overflow-x: auto; margin: 0.5rem 0 1rem; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border: 1px solid var(--line); padding: 0.3rem 0.55rem; text-align: left; vertical-align: top; }
thead th { background: var(--head); font-weight: 600; }
thead tr.groups th { text-align: center; font-size: 0.8rem; color: var(--muted); text-transform: uppercase;
                     letter-spacing: 0.04em; }
th.sortable { cursor: pointer; user-select: none; white-space: nowrap; }
th.sortable:hover { background: #e1e7f0; }
table.leaderboard { font-size: 0.8rem; }
table.leaderboard th, table.leaderboard td { padding: 0.25rem 0.35rem; }
table.leaderboard thead th.sortable { white-space: normal; min-width: 5rem; }
table.leaderboard th.sortable:not([aria-sort])::after { content: none; }
table.leaderboard .ci { font-size: 0.74em; }
/* the model and κ columns stay in view while the leaderboard scrolls sideways inside its frame (the page never
   scrolls sideways): fixed widths, so the second column knows where the first ends */
table.leaderboard { border-collapse: separate; border-spacing: 0; border-top: 1px solid var(--line);
                    border-left: 1px solid var(--line); }
table.leaderboard th, table.leaderboard td { border-width: 0 1px 1px 0; }
table.leaderboard .frozen { position: sticky; z-index: 1; background: #fff; }
table.leaderboard thead .frozen { background: var(--head); z-index: 2; }
table.leaderboard tbody tr:nth-child(even) td.frozen { background: #fafbfc; }
table.leaderboard .frozen.first { left: 0; width: 8.5rem; min-width: 8.5rem; max-width: 8.5rem;
                                  overflow-wrap: anywhere; }
table.leaderboard .frozen.second { left: 8.5rem; width: 9.5rem; min-width: 9.5rem; max-width: 9.5rem;
                                   overflow-wrap: anywhere; box-shadow: inset -2px 0 0 var(--line); }
table.leaderboard .frozen.both { left: 0; width: 18rem; min-width: 18rem; }
th.sortable::after { content: " \\2195"; color: #9aa3b2; font-size: 0.8em; }
th[aria-sort="ascending"]::after { content: " \\25B2"; color: var(--accent); }
th[aria-sort="descending"]::after { content: " \\25BC"; color: var(--accent); }
.dir { color: var(--muted); font-weight: 400; font-size: 0.8em; }
td.num { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
         font-variant-numeric: tabular-nums; white-space: nowrap; text-align: right; }
td.best { background: var(--best); }
td.num .v { display: inline-block; vertical-align: top; }
.ci { display: block; font-size: 0.8em; color: var(--muted); }
td.best .v { font-weight: 700; }
td.best .ci { font-weight: 400; }
.sig { color: var(--warn); margin-left: 0.2rem; font-size: 0.85em; }
.fit-overlap { color: var(--warn); margin-left: 0.2rem; font-weight: 700; }
p.fit-overlap-note, ul.fit-overlap-note { font-size: 0.85rem; color: var(--muted); margin: 0.3rem 0; }
sup.pf { color: var(--muted); margin-left: 0.25rem; font-size: 0.7em; }
td.missing { color: #9aa3b2; text-align: center; }
tbody tr:nth-child(even) td:not(.best) { background: #fafbfc; }
td.model { font-weight: 600; }
dl.columns { display: grid; grid-template-columns: max-content 1fr; gap: 0.2rem 1rem; font-size: 0.88rem;
             margin: 0.4rem 0 1rem; }
dl.columns dt { font-weight: 600; }
dl.columns dd { margin: 0; color: var(--muted); }
figure { margin: 1rem 0; display: inline-block; vertical-align: top; max-width: 100%; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); display: block; }
figcaption { font-size: 0.88rem; color: var(--muted); max-width: 40rem; margin-top: 0.3rem; }
.missing-image { border: 1px dashed var(--warn); color: var(--warn); padding: 1rem; background: #fdf3f2; }
pre { background: #f2f4f7; border: 1px solid var(--line); padding: 0.6rem 0.8rem; overflow-x: auto;
      font-size: 0.85rem; white-space: pre-wrap; word-break: break-all; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
              font-size: 0.88em; }
ul.notes li { margin: 0.25rem 0; }
"""

# Sorts a table by the clicked header: numbers by data-value, strings alphabetically, missing values last in
# both directions. No external code: the page must work offline and from file://.
SCRIPT = """
(function () {
  "use strict";
  function key(cell) {
    if (!cell) { return null; }
    var raw = cell.getAttribute("data-value");
    if (raw !== null && raw !== "") { return Number(raw); }
    var text = cell.textContent.trim();
    return (text === "" || text === "\\u2014") ? null : text;
  }
  function sortBy(table, header) {
    var column = Number(header.getAttribute("data-col"));
    var body = table.tBodies[0];
    var descending = header.getAttribute("aria-sort") === "ascending";
    var rows = Array.prototype.slice.call(body.rows);
    var numeric = rows.every(function (row) {
      var k = key(row.cells[column]);
      return k === null || typeof k === "number";
    });
    rows.sort(function (a, b) {
      var x = key(a.cells[column]), y = key(b.cells[column]);
      if (x === null || y === null) { return (x === null) - (y === null); }
      var order = numeric ? x - y : String(x).localeCompare(String(y));
      return descending ? -order : order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    table.querySelectorAll("th[aria-sort]").forEach(function (th) { th.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", descending ? "descending" : "ascending");
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th.sortable").forEach(function (header) {
      header.addEventListener("click", function () { sortBy(table, header); });
      header.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortBy(table, header); }
      });
    });
  });
})();
"""


def _anchor(text: str, taken: set[str]) -> str:
    """A unique, valid id from a method name (``open_set``, ``open_set-2`` for a second section of it)."""
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "section"
    if not base[0].isalpha():
        base = f"s-{base}"
    anchor, n = base, 1
    while anchor in taken:
        n += 1
        anchor = f"{base}-{n}"
    taken.add(anchor)
    return anchor


def _sortable_header(title: str, column: int, *, extra: str = "", tooltip: str = "", css: str = "") -> str:
    tip = f' title="{_e(tooltip)}"' if tooltip else ""
    return (f'<th scope="col" class="sortable{" " + css if css else ""}" data-col="{column}" tabindex="0"{tip}>'
            f"{_e(title)}{extra}</th>")


def _cell_html(value: Any, *, level: Any, resamples: Any) -> str:
    """One <td>: the formatted value in ``span.v``, the mark "worse than the best" and the share of resamples ranked first beside it."""
    text = format_cell(value)
    number = sort_value(value)
    data = "" if number is None else f' data-value="{number!r}"' if math.isfinite(number) else \
        f' data-value="{"" if number > 0 else "-"}Infinity"'
    if text == MISSING:
        return f'<td class="num missing"{data} title="not measured">{MISSING}</td>'
    classes = ["num"] if number is not None else []
    extra, tips = "", []
    if is_cell(value):
        if value.get("best"):
            classes.append("best")
            tips.append("best of the column")
        if value.get("significant"):
            extra += f'<span class="sig" aria-label="significantly worse than the best">{SIGNIFICANT_MARK}</span>'
            tips.append("worse than the best row (simultaneously over the column)")
        if _finite(value.get("low")) and _finite(value.get("high")):
            unit = f" of {value['unit']}" if value.get("unit") else ""
            tips.append(f"{_percent(level)} interval, {resamples} resamples{unit}")
        share = value.get("share_first")
        if _finite(share):
            extra += f'<sup class="pf">{share:.2f}</sup>'
            tips.append(f"ranks first in {share:.0%} of the resamples")
        if value.get("fit_overlap"):
            extra += f'<span class="fit-overlap" aria-label="fitted on its test data">{FIT_OVERLAP_MARK}</span>'
            tips.append(f"{value['fit_overlap']}: fitted on images it was measured on")
    cls = f' class="{" ".join(classes)}"' if classes else ""
    tip = f' title="{_e("; ".join(tips))}"' if tips else ""
    # the interval on a line of its own under the estimate (a narrower column); the text stays format_cell's
    estimate, bracket, interval = text.partition(" [")
    shown = f'{_e(estimate)}<span class="ci"> [{_e(interval)}</span>' if bracket else _e(text)
    return f'<td{cls}{data}{tip}><span class="v">{shown}</span>{extra}</td>'


def _leaderboard_html(report: Mapping[str, Any]) -> list[str]:
    board = report.get("leaderboard") or {}
    columns = list(board.get("columns", []))
    rows = list(board.get("rows", []))
    level, resamples = report.get("level"), report.get("resamples")
    out = ['<div class="table-wrap"><table id="leaderboard" class="sortable leaderboard">', "<thead>"]
    groups: list[tuple[str, int]] = []
    for column in columns:
        if groups and groups[-1][0] == column.get("method"):
            groups[-1] = (groups[-1][0], groups[-1][1] + 1)
        else:
            groups.append((column.get("method", ""), 1))
    # each group under its short name (the card's ``group``), its method's title as the tip
    shown = {c.get("method", ""): (str(c.get("group") or c.get("method", "")), _method_title(c)) for c in columns}
    out.append('<tr class="groups"><th colspan="2" class="frozen both"></th>' + "".join(
        f'<th colspan="{span}" title="{_e(shown[method][1])}">{_e(shown[method][0])}</th>'
        for method, span in groups) + "</tr>")
    header = [_sortable_header("Model", 0, css="frozen first"),
              _sortable_header("κ", 1, tooltip="confidence function", css="frozen second")]
    for i, column in enumerate(columns, start=2):
        better = column.get("higher_is_better", True)
        arrow = f' <span class="dir">{"↑" if better else "↓"}</span>'
        tip = f"{column.get('description', '')} ({'higher' if better else 'lower'} is better)".strip()
        header.append(_sortable_header(column.get("title", column.get("key", "")), i, extra=arrow, tooltip=tip))
    out += ["<tr>" + "".join(header) + "</tr>", "</thead>", "<tbody>"]
    for row in rows:
        cells = row.get("cells", {})
        tds = [f'<td class="model frozen first">{_e(row.get("model"))}</td>',
               f'<td class="frozen second">{_e(row.get("kappa"))}</td>']
        tds += [_cell_html(cells.get(c.get("key")), level=level, resamples=resamples) for c in columns]
        out.append(f'<tr data-model="{_e(row.get("model"))}" data-kappa="{_e(row.get("kappa"))}">'
                   + "".join(tds) + "</tr>")
    out += ["</tbody></table></div>"]
    marked = fit_overlap_lines(rows)
    if marked:
        out.append(f'<p class="fit-overlap-note">{_e(FIT_OVERLAP_TEXT)}:</p><ul class="fit-overlap-note">'
                   + "".join(f"<li>{_e(line)}</li>" for line in marked) + "</ul>")
    if columns:
        out.append('<dl class="columns">')
        for column in columns:
            units = _units(rows, column.get("key"))
            better = "higher" if column.get("higher_is_better", True) else "lower"
            unit = f" Resampled: {'; '.join(units)}." if units else ""
            out.append(f"<dt>{_e(column.get('title', column.get('key')))}</dt>"
                       f"<dd>{_e(_method_title(column))}: {_e(column.get('description', ''))} "
                       f"({better} is better).{_e(unit)}</dd>")
        out.append("</dl>")
    return out


def fit_overlap_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per leaderboard row marked :data:`FIT_OVERLAP_MARK`: ``model / κ: its note``."""
    return [f"{row.get('model')} / {row.get('kappa')}: {row['fit_overlap']}" for row in rows if row.get("fit_overlap")]


def _paragraphs(text: str | None) -> list[str]:
    blocks = re.split(r"\n\s*\n", (text or "").strip())
    return [f"<p>{_e(' '.join(block.split()))}</p>" for block in blocks if block.strip()]


def _table_html(table: Mapping[str, Any], *, level: Any, resamples: Any) -> list[str]:
    columns = [str(c) for c in table.get("columns", [])]
    out = [f"<h3>{_e(table.get('title', ''))}</h3>"] if table.get("title") else []
    out.append('<div class="table-wrap"><table class="sortable"><thead><tr>'
               + "".join(_sortable_header(c, i) for i, c in enumerate(columns)) + "</tr></thead><tbody>")
    for row in table.get("rows", []):
        tds = []
        for column in columns:
            value = row.get(column)
            if isinstance(value, str):
                tds.append(f"<td>{_e(value)}</td>")
            else:
                tds.append(_cell_html(value, level=level, resamples=resamples))
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody></table></div>")
    return out


def image_path(path: str | Path, folder: str | Path) -> Path:
    """An image's file: absolute as given, else relative to the report folder."""
    path = Path(path)
    return path if path.is_absolute() else Path(folder) / path


def data_uri(path: Path) -> str:
    """``data:<mime>;base64,...`` of a file (PNG, JPEG, SVG, ...)."""
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _figure_html(image: Mapping[str, Any], folder: Path) -> str:
    title, caption = image.get("title", ""), image.get("caption", "")
    figcaption = f"<figcaption><strong>{_e(title)}</strong>{'. ' if title and caption else ''}{_e(caption)}</figcaption>"
    file = image_path(image.get("path", ""), folder)
    try:
        uri = data_uri(file) if image.get("path") else None
    except OSError as error:
        uri, reason = None, error.strerror or type(error).__name__
    else:
        reason = "no path given"
    if uri is None:
        return (f'<figure class="missing"><p class="missing-image">Image not available: '
                f'<code>{_e(image.get("path", ""))}</code> ({_e(reason)}).</p>{figcaption}</figure>')
    return f'<figure><img src="{uri}" alt="{_e(title or caption)}">{figcaption}</figure>'


def _key_value_table(rows: Sequence[Sequence[Any]], columns: Sequence[str], *, mono: Sequence[int] = ()) -> str:
    head = "".join(f'<th scope="col">{_e(c)}</th>' for c in columns)
    mono_class = ' class="mono"'
    body = "".join("<tr>" + "".join(
        f'<td{mono_class if i in mono else ""}>{_e(MISSING if v is None else v)}</td>'
        for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def how_to_read(report: Mapping[str, Any], *, sortable: bool = True) -> str:
    """The short paragraph that explains the marks of the tables."""
    level = _percent(report.get("level"))
    comparison = (report.get("comparison") or {}).get("method", "a simultaneous comparison of the column's rows")
    return (f"Each number comes with its {level} interval in brackets: a percentile bootstrap over "
            f"{report.get('resamples', '?')} resamples (seed {report.get('seed', '?')}) of the unit given under the "
            f"table, or the AUROC interval where a column says so. The intervals cover the sampling of the test data "
            f"for one trained model, not training variance (a model of several seeds adds it). Bold = the best row "
            f"of its column; {SIGNIFICANT_MARK} = worse than the best row, simultaneously over the rows of the column "
            f"measured on the same units ({comparison}): the chance that any {SIGNIFICANT_MARK} of a column is false "
            f"is at most 1 − {level}; marks of different columns are separate families (not controlled across "
            f"columns). The small grey number = the share of resamples in which the row ranks first: not a "
            f"probability of being the best (it favours the observed leader); {MISSING}: not measured."
            + (" Click a column's header to sort by it, again to reverse." if sortable else ""))


def render_html(report: Mapping[str, Any], folder: str | Path) -> str:
    """The report as one self-contained HTML5 page (images read from ``folder`` and inlined)."""
    folder = Path(folder)
    title = report.get("title") or "OOD report card"
    sections = list(report.get("sections", []))
    taken = {"how-to-read", "results", "leaderboard", "provenance", "notes"}
    anchors = [_anchor(str(s.get("method", "section")), taken) for s in sections]
    level, resamples = report.get("level"), report.get("resamples")
    meta = " · ".join(f"{label} {_e(value)}" for label, value in (
        ("created", report.get("created")), ("level", _percent(level)), ("resamples", resamples),
        ("seed", report.get("seed"))) if value is not None)
    toc = ['<a href="#results">Leaderboard</a>']
    toc += [f'<a href="#{a}">{_e(s.get("title") or s.get("method", ""))}</a>'
            for a, s in zip(anchors, sections, strict=True)]
    toc.append('<a href="#provenance">Models, data, versions</a>')
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{_e(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>", "<main>",
           f"<header><h1>{_e(title)}</h1><p class=\"meta\">{meta}</p>",
           f'<nav class="toc">{"".join(toc)}</nav></header>',
           f'<p id="how-to-read" class="how"><strong>How to read this page.</strong> {_e(how_to_read(report))}</p>',
           '<section id="results"><h2>Leaderboard</h2>', *_leaderboard_html(report), "</section>"]
    for anchor, section in zip(anchors, sections, strict=True):
        out.append(f'<section id="{anchor}" data-method="{_e(section.get("method"))}">')
        out.append(f"<h2>{_e(section.get('title') or section.get('method', ''))}</h2>")
        out += _paragraphs(section.get("text"))
        for table in section.get("tables", []):
            out += _table_html(table, level=level, resamples=resamples)
        out += [_figure_html(image, folder) for image in section.get("images", [])]
        out.append("</section>")
    out.append('<section id="provenance"><h2>Models, data, versions</h2>')
    models = report.get("models", [])
    if models:
        out += ["<h3>Models</h3>", _key_value_table(
            [(m.get("name"), m.get("source"), m.get("sha256")) for m in models], ("model", "source", "sha256"),
            mono=(2,))]
    data = report.get("data", [])
    if data:
        out += ["<h3>Data</h3>", _key_value_table(
            [(d.get("name"), d.get("role"), d.get("fingerprint"), d.get("samples")) for d in data],
            ("data set", "role", "fingerprint", "samples"), mono=(2,))]
    versions = report.get("versions", {})
    if versions:
        out += ["<h3>Versions</h3>", _key_value_table(sorted(versions.items()), ("package", "version"), mono=(1,))]
    if report.get("command"):
        out += ["<h3>Command</h3>", f"<pre><code>{_e(report['command'])}</code></pre>"]
    out.append("</section>")
    notes = report.get("notes", [])
    if notes:
        out += ['<section id="notes"><h2>Notes</h2><ul class="notes">',
                *[f"<li>{_e(note)}</li>" for note in notes], "</ul></section>"]
    out += ["</main>", f"<script>{SCRIPT}</script>", "</body>", "</html>"]
    return "\n".join(out) + "\n"


# -- Markdown ---------------------------------------------------------------------------------------------


def _md(value: Any) -> str:
    """Text safe in a Markdown table cell: no raw HTML, no column break, one line."""
    text = html.escape("" if value is None else str(value), quote=False)
    return " ".join(text.replace("|", "\\|").split())


def _md_cell(value: Any) -> str:
    text = format_cell(value)
    if text == MISSING or not is_cell(value):
        return _md(text)
    out = f"**{text}**" if value.get("best") else text
    if value.get("significant"):
        out += f" {SIGNIFICANT_MARK}"
    if _finite(value.get("share_first")):
        out += f" <sup>{value['share_first']:.2f}</sup>"
    if value.get("fit_overlap"):
        out += f" {FIT_OVERLAP_MARK}"
    return out


def _md_table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return (["| " + " | ".join(_md(c) for c in columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def render_markdown(report: Mapping[str, Any]) -> str:
    """The page's content as Markdown: leaderboard, sections with their tables (images as relative links),
    models, data, versions, command and notes."""
    board = report.get("leaderboard") or {}
    columns = list(board.get("columns", []))
    rows = list(board.get("rows", []))
    out = [f"# {_md(report.get('title') or 'OOD report card')}", ""]
    meta = [f"{k} {report[k]}" for k in ("created", "resamples", "seed") if report.get(k) is not None]
    if meta:
        out += [" · ".join(_md(m) for m in meta), ""]
    out += [f"**How to read this report.** {_md(how_to_read(report, sortable=False))}", "", "## Leaderboard", ""]
    out += _md_table(["model", "κ", *[c.get("title", c.get("key", "")) + (" ↑" if c.get("higher_is_better", True)
                                                                         else " ↓") for c in columns]],
                     ([_md(r.get("model")), _md(r.get("kappa")),
                       *[_md_cell(r.get("cells", {}).get(c.get("key"))) for c in columns]] for r in rows))
    out.append("")
    marked = fit_overlap_lines(rows)
    if marked:
        out += [f"{_md(FIT_OVERLAP_TEXT)}:", "", *[f"- {_md(line)}" for line in marked], ""]
    for column in columns:
        units = _units(rows, column.get("key"))
        unit = f" Resampled: {'; '.join(units)}." if units else ""
        out.append(f"- **{_md(column.get('title', column.get('key')))}** ({_md(_method_title(column))})"
                   f": {_md(column.get('description', ''))}{_md(unit)}")
    for section in report.get("sections", []):
        out += ["", f"## {_md(section.get('title') or section.get('method', ''))}", ""]
        for block in re.split(r"\n\s*\n", (section.get("text") or "").strip()):
            if block.strip():
                out += [_md(block), ""]
        for table in section.get("tables", []):
            names = [str(c) for c in table.get("columns", [])]
            if table.get("title"):
                out += [f"### {_md(table['title'])}", ""]
            out += _md_table(names, ([_md(v) if isinstance(v, str) else _md_cell(v)
                                      for v in (row.get(c) for c in names)] for row in table.get("rows", [])))
            out.append("")
        for image in section.get("images", []):
            path = str(image.get("path", "")).replace(" ", "%20").replace(")", "%29")
            out += [f"![{_md(image.get('title', ''))}]({path})", ""]
            if image.get("caption"):
                out += [f"*{_md(image.get('title', ''))}*. {_md(image['caption'])}", ""]
    out += ["", "## Models, data, versions", ""]
    if report.get("models"):
        out += _md_table(["model", "source", "sha256"], ([_md(m.get("name")), _md(m.get("source")),
                                                          _md(m.get("sha256") or MISSING)]
                                                         for m in report["models"])) + [""]
    if report.get("data"):
        out += _md_table(["data set", "role", "fingerprint", "samples"],
                         ([_md(d.get("name")), _md(d.get("role")), _md(d.get("fingerprint")), _md(d.get("samples"))]
                          for d in report["data"])) + [""]
    if report.get("versions"):
        out += _md_table(["package", "version"], ([_md(k), _md(v)] for k, v in sorted(report["versions"].items())))
        out.append("")
    if report.get("command"):
        out += ["```", str(report["command"]).replace("```", "` ` `"), "```", ""]
    if report.get("notes"):
        out += ["## Notes", "", *[f"- {_md(note)}" for note in report["notes"]], ""]
    return "\n".join(out).rstrip() + "\n"


# -- files ------------------------------------------------------------------------------------------------


def write_page(report: Mapping[str, Any], folder: str | Path) -> dict[str, Path]:
    """``index.html``, ``report.md`` and ``report.json`` in ``folder``, each written atomically; the paths by
    kind (``html``, ``markdown``, ``json``)."""
    folder = Path(folder)
    return {
        "json": write_json(folder / "report.json", report),
        "markdown": atomic_write_text(folder / "report.md", render_markdown(report)),
        "html": atomic_write_text(folder / "index.html", render_html(report, folder)),
    }
