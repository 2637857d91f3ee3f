"""The report card's page: self-contained (no URL out, images inlined byte for byte), the leaderboard of
report.json row by row with its marks, every string escaped, the Markdown twin and the three files.

:func:`make_report` is the fixture report (two models x two confidence functions, the four methods' sections,
a real PNG, a missing one); the browser tier (tests/test_browser.py) renders the same one.
"""

from __future__ import annotations

import base64
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from report_card.page import MISSING, SIGNIFICANT_MARK, format_cell, render_html, render_markdown, write_page

EVIL = '<script>alert("x")</script> & "co"'
NAN = float("nan")


def cell(value: float | None, low: float | None = None, high: float | None = None, *, best: bool = False,
         significant: bool = False, share_first: float | None = None, unit: str = "images (ID and OOD separately)"):
    return {"value": value, "low": low, "high": high, "best": best, "significant": significant,
            "share_first": share_first, "unit": unit}


def write_png(path: Path, seed: int = 0) -> Path:
    """A small, colourful PNG (a gradient with noise), so a screenshot of the page has something in it."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:48, 0:96]
    pixels = np.stack([x * 2.6, y * 5.3, 255 - x * 2.6], axis=-1) + rng.integers(0, 30, size=(48, 96, 3))
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, format="PNG")
    return path


def make_report(folder: Path) -> dict[str, Any]:
    """The fixture report; its images are written under ``folder`` (one relative, one absolute, one missing)."""
    write_png(folder / "severity_auroc.png", seed=1)
    absolute = write_png(folder / "plots" / "transfer.png", seed=2).resolve()
    columns = [
        {"key": "oscr", "title": "OSCR", "method": "open_set", "higher_is_better": True,
         "description": "area under the OSCR curve, known vs unknown unknowns"},
        {"key": "ccr_fpr", "title": "CCR@FPR 0.1", "method": "open_set", "higher_is_better": True,
         "description": "correct classification rate at a false-positive rate of 0.1"},
        {"key": "worst_auroc", "title": "worst-level AUROC", "method": "severity", "higher_is_better": True,
         "description": "AUROC of the hardest severity level"},
        {"key": "near_ood", "title": "near-OOD AUROC", "method": "generated", "higher_is_better": True,
         "description": "AUROC against the generated near-OOD set"},
        {"key": "min_rank", "title": "MinRank", "method": "evg", "higher_is_better": False,
         "description": "rank of the worst adversarial outlier among the ID images"},
    ]
    # the group and method name each column's method gives the card (evaluation_methods.registry.Method)
    named = {"open_set": ("Open set", "Open set (OSCR)"), "severity": ("Severity", "C-OOD severity levels"),
             "generated": ("Generated", "Generated shift and near-OOD sets"), "evg": ("EvG", "EvG adversarial outliers")}
    for column in columns:
        column["group"], column["method_title"] = named[column["method"]]
    chains = "chains + ID images"
    levels = "classes within the level + ID images"
    rows = [
        {"model": "demo-best", "kappa": "softmax", "cells": {
            "oscr": cell(0.8581, 0.8412, 0.874, best=True, share_first=0.62),
            "ccr_fpr": cell(0.7012, 0.6801, 0.7203, significant=True, share_first=0.1),
            "worst_auroc": cell(0.6123, 0.58, 0.645, share_first=0.31, unit=levels),
            "near_ood": cell(0.9012, 0.889, 0.913, best=True, share_first=0.9),
            "min_rank": cell(3.0, 1.0, 7.0, significant=True, share_first=0.0, unit=chains)}},
        {"model": "demo-best", "kappa": "energy", "cells": {
            "oscr": cell(0.8402, 0.8221, 0.8577, significant=True, share_first=0.2),
            "ccr_fpr": cell(0.7344, 0.7102, 0.7555, best=True, share_first=0.7),
            "worst_auroc": cell(0.6302, 0.601, 0.66, best=True, share_first=0.45, unit=levels),
            "near_ood": cell(NAN, None, None),
            "min_rank": cell(12.0, 8.0, 19.0, best=True, share_first=0.8, unit=chains)}},
        {"model": EVIL, "kappa": "softmax", "cells": {  # no ccr_fpr: not measured
            "oscr": cell(0.8501, 0.8302, 0.8688, share_first=0.18),
            "worst_auroc": cell(0.5902, 0.55, 0.62, significant=True, share_first=0.04, unit=levels),
            "near_ood": cell(0.8755, 0.861, 0.889, significant=True, share_first=0.1),
            "min_rank": cell(5.0, 2.0, 9.0, share_first=0.2, unit=chains)}},
        {"model": EVIL, "kappa": "energy", "cells": {
            "oscr": cell(None, None, None),
            "ccr_fpr": cell(0.7201, 0.6999, 0.7406, share_first=0.2),
            "worst_auroc": cell(0.6002, 0.571, 0.632, share_first=0.2, unit=levels),
            "near_ood": cell(0.8803, 0.866, 0.894, significant=True, share_first=0.0),
            "min_rank": cell(9.0, 4.0, 15.0, share_first=0.0, unit=chains)}},
    ]
    sections = [
        {"method": "open_set", "title": "Open set: OSCR", "text": "Known classes against unknown unknowns.\n\n"
         "The OSCR curve plots the correct classification rate\nagainst the false-positive rate.",
         "tables": [{"title": "CCR at each FPR", "columns": ["model", "kappa", "fpr", "ccr"], "rows": [
             {"model": "demo-best", "kappa": "softmax", "fpr": 0.1, "ccr": cell(0.7012, 0.6801, 0.7203)},
             {"model": EVIL, "kappa": "softmax", "fpr": 0.01, "ccr": None}]}],
         "images": []},
        {"method": "severity", "title": "C-OOD severity levels", "text": "Eleven levels of ImageNet-21k classes.",
         "tables": [{"title": "AUROC per level", "columns": ["level", "softmax", "energy"], "rows": [
             {"level": 0, "softmax": 0.9123, "energy": 0.905},
             {"level": 5, "softmax": 0.7312, "energy": NAN},
             {"level": 10, "softmax": 0.6123, "energy": 0.6302}]}],
         "images": [{"title": "AUROC by severity", "path": "severity_auroc.png", "caption": "one line per κ"}]},
        {"method": "generated", "title": "Generated shift and near-OOD", "text": "Generators <b>not</b> bold.",
         "tables": [], "images": [{"title": "missing grid", "path": "grids/near_ood.png", "caption": "not there"}]},
        {"method": "evg", "title": "EvG adversarial outliers", "text": "MH search over affine variations.",
         "tables": [{"title": "MinRank per variation", "columns": ["variation", "min_rank"], "rows": [
             {"variation": "affine", "min_rank": cell(3.0, 1.0, 7.0, unit=chains)},
             {"variation": "colour", "min_rank": 11}]}],
         "images": [{"title": "transfer", "path": str(absolute), "caption": "MinRank of each sampler"}]},
    ]
    return {
        "title": "OOD report card: demo-best vs <other>", "created": "2026-11-02T10:20:30+00:00",
        "command": "python evaluate.py report --model runs/demo/checkpoints/best.ckpt --kappa softmax energy",
        "level": 0.95, "resamples": 1000, "seed": 0,
        "versions": {"torch": "2.14.1", "pytorch-lightning": "2.6.6"},
        "models": [{"name": "demo-best", "source": "runs/demo/checkpoints/best.ckpt", "sha256": "ab" * 32},
                   {"name": EVIL, "source": "timm:resnet18", "sha256": None}],
        "data": [{"name": "fashion-test", "role": "ID", "fingerprint": "sha256:0123abcd", "samples": 10000},
                 {"name": "digits", "role": "OOD", "fingerprint": "sha256:4567ef01", "samples": 2000}],
        "leaderboard": {"columns": columns, "rows": rows},
        "sections": sections,
        "notes": ["The near-OOD set of κ=energy could not be scored: NaN.", "a & b < c"],
    }


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self, tag: str | None = None):
        for child in self.children:
            if isinstance(child, Node):
                if tag is None or child.tag == tag:
                    yield child
                yield from child.iter(tag)

    def find(self, tag: str, **attrs: str) -> Node | None:
        return next(self.find_all(tag, **attrs), None)

    def find_all(self, tag: str, **attrs: str):
        for node in self.iter(tag):
            if all(attrs[k] in (node.attrs.get(k.rstrip("_")) or "").split() for k in attrs):
                yield node


class Tree(HTMLParser):
    """A small DOM of the page, built with the standard library's parser (void elements closed at once)."""

    VOID = {"meta", "img", "br", "hr", "link", "input", "source"}

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = self.current = Node("#root", {}, None)
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.current)
        self.current.children.append(node)
        if tag not in self.VOID:
            self.current = node

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is None:
            raise AssertionError(f"</{tag}> closes nothing")
        self.current = node.parent

    def handle_data(self, data):
        self.current.children.append(data)


def leaderboard_rows(root: Node) -> list[dict[str, Any]]:
    table = root.find("table", id="leaderboard")
    assert table is not None
    rows = []
    for tr in table.find("tbody").iter("tr"):
        tds = list(tr.iter("td"))
        rows.append({"model": tr.attrs["data-model"], "kappa": tr.attrs["data-kappa"],
                     "first": [tds[0].text(), tds[1].text()],
                     "cells": [{"text": (td.find("span", class_="v") or td).text(),
                                "best": "best" in (td.attrs.get("class") or "").split(),
                                "bold": td.find("span", class_="v") is not None and "best" in td.attrs.get("class", ""),
                                "mark": td.find("span", class_="sig") is not None,
                                "share_first": (td.find("sup", class_="pf") or Node("x", {}, None)).text(),
                                "value": td.attrs.get("data-value")} for td in tds[2:]]})
    return rows


@pytest.fixture
def report(tmp_path) -> dict[str, Any]:
    return make_report(tmp_path)


def test_cells_are_formatted_as_the_page_shows_them():
    assert format_cell(cell(0.8581, 0.8412, 0.874)) == "0.858 [0.841, 0.874]"
    assert format_cell(cell(3.0, 1.0, 7.0)) == "3 [1, 7]"  # MinRank-like: integral, above 1
    assert format_cell(cell(1.0, 1.0, 1.0)) == "1.000 [1.000, 1.000]"  # a perfect AUROC keeps its decimals
    assert format_cell(cell(2.5, 1.0, 4.0)) == "2.500 [1.000, 4.000]"  # one part not integral: all decimals
    assert format_cell(cell(0.5)) == "0.500"  # no interval
    assert format_cell(cell(NAN, 0.1, 0.2)) == format_cell(cell(None)) == MISSING
    assert [format_cell(v) for v in (12, 0, 0.25, 1 / 3, 2.0, 1.0, None, NAN, "shift")] == \
        ["12", "0", "0.250", "0.333", "2", "1.000", MISSING, MISSING, "shift"]
    assert format_cell(float("inf")) == "∞" and format_cell(3.0, integer=False) == "3.000"
    with pytest.raises(TypeError, match="needs a 'value' key"):
        format_cell({"low": 0.1})


def test_the_page_is_self_contained_and_inlines_every_image(report, tmp_path):
    page = render_html(report, tmp_path)
    root = Tree(page).root
    assert page.startswith("<!DOCTYPE html>") and root.find("html").attrs["lang"] == "en"
    links = [(n.tag, k, v) for n in root.iter() for k, v in n.attrs.items() if k in ("src", "href", "srcset")]
    assert links and all(v.startswith(("#", "data:")) for _, _, v in links), links
    assert not any("//" in v or ":" in v for _, _, v in links if not v.startswith("data:"))  # base64 may hold //
    assert not re.search(r"https?:|(src|href)=\"//", page)
    assert not root.find("link") and "@import" not in page and "url(" not in page
    assert all(not s.attrs.get("src") for s in root.iter("script"))  # the one script is inline
    assert {h.attrs["href"][1:] for h in root.iter("a")} <= {n.attrs.get("id") for n in root.iter()}
    images = list(root.iter("img"))
    assert len(images) == 2  # the relative and the absolute one; the third is missing
    for img, path in zip(images, [tmp_path / "severity_auroc.png", tmp_path / "plots" / "transfer.png"], strict=True):
        head, _, payload = img.attrs["src"].partition(",")
        assert head == "data:image/png;base64"
        assert base64.b64decode(payload) == path.read_bytes()
    missing = root.find("section", id="generated").find("figure", class_="missing")
    assert "Image not available" in missing.text() and "grids/near_ood.png" in missing.text()
    assert "not there" in missing.find("figcaption").text()


def test_the_leaderboard_is_report_json_row_by_row(report, tmp_path):
    root = Tree(render_html(report, tmp_path)).root
    rows = leaderboard_rows(root)
    expected = report["leaderboard"]["rows"]
    keys = [c["key"] for c in report["leaderboard"]["columns"]]
    assert [(r["model"], r["kappa"]) for r in rows] == [(r["model"], r["kappa"]) for r in expected]
    assert [r["first"] for r in rows] == [[r["model"], r["kappa"]] for r in expected]
    for row, want in zip(rows, expected, strict=True):
        assert [c["text"] for c in row["cells"]] == [format_cell(want["cells"][k]) if k in want["cells"]
                                                     else MISSING for k in keys]
        for got, key in zip(row["cells"], keys, strict=True):
            source = want["cells"].get(key) or {}
            assert got["bold"] == got["best"] == bool(source.get("best")), (want["model"], key)
            assert got["mark"] == bool(source.get("significant")), (want["model"], key)
            finite = source.get("value") is not None and not math.isnan(source["value"])
            assert got["share_first"] == (f"{source['share_first']:.2f}" if finite else "")
            assert got["value"] == (repr(float(source["value"])) if finite else None)
    # the values themselves, spelt out
    assert [c["text"] for c in rows[0]["cells"]] == ["0.858 [0.841, 0.874]", "0.701 [0.680, 0.720]",
                                                     "0.612 [0.580, 0.645]", "0.901 [0.889, 0.913]", "3 [1, 7]"]
    assert [c["text"] for c in rows[1]["cells"]][3] == [c["text"] for c in rows[2]["cells"]][1] == \
        [c["text"] for c in rows[3]["cells"]][0] == MISSING  # NaN, not measured, None
    assert [c["best"] for c in rows[0]["cells"]] == [True, False, False, True, False]
    assert [c["mark"] for c in rows[0]["cells"]] == [False, True, False, False, True]
    headers = [th.text() for th in root.find("table", id="leaderboard").find("thead").find_all("th", class_="sortable")]
    assert headers == ["Model", "κ", "OSCR ↑", "CCR@FPR 0.1 ↑", "worst-level AUROC ↑", "near-OOD AUROC ↑", "MinRank ↓"]
    groups = [(th.text(), th.attrs["colspan"]) for th in root.find("tr", class_="groups").iter("th")][1:]
    assert groups == [("Open set", "2"), ("Severity", "1"), ("Generated", "1"), ("EvG", "1")]
    how = root.find("p", id="how-to-read").text()
    assert "95% interval" in how and "1000 resamples" in how and SIGNIFICANT_MARK in how and "share of resamples" in how and "simultaneously" in how


def test_sections_provenance_and_every_string_escaped(report, tmp_path):
    page = render_html(report, tmp_path)
    root = Tree(page).root
    assert page.count("<script") == 1  # the sorter; the model name is text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &quot;co&quot;" in page
    assert "<b>not</b>" not in page and "&lt;b&gt;not&lt;/b&gt;" in page
    assert root.find("title").text() == report["title"]
    sections = [s for s in root.iter("section") if s.attrs.get("data-method")]
    assert [s.attrs["id"] for s in sections] == ["open_set", "severity", "generated", "evg"]
    assert [s.find("h2").text() for s in sections] == [s["title"] for s in report["sections"]]
    assert [p.text() for p in sections[0].iter("p")] == [
        "Known classes against unknown unknowns.",
        "The OSCR curve plots the correct classification rate against the false-positive rate."]
    severity = sections[1].find("table", class_="sortable")
    assert [[td.text() for td in tr.iter("td")] for tr in severity.find("tbody").iter("tr")] == \
        [["0", "0.912", "0.905"], ["5", "0.731", MISSING], ["10", "0.612", "0.630"]]
    evg = [[td.text() for td in tr.iter("td")] for tr in sections[3].find("tbody").iter("tr")]
    assert evg == [["affine", "3 [1, 7]"], ["colour", "11"]]
    assert [f.text() for f in sections[1].iter("figcaption")] == ["AUROC by severity. one line per κ"]
    provenance = root.find("section", id="provenance")
    cells = [td.text() for td in provenance.iter("td")]
    assert "ab" * 32 in cells and EVIL in cells and "sha256:4567ef01" in cells and "10000" in cells
    assert provenance.find("pre").text() == report["command"]
    assert [li.text() for li in root.find("section", id="notes").iter("li")] == report["notes"]


def test_markdown_holds_the_same_leaderboard(report):
    text = render_markdown(report)
    lines = text.splitlines()
    start = lines.index("## Leaderboard") + 2
    assert lines[start] == "| model | κ | OSCR ↑ | CCR@FPR 0.1 ↑ | worst-level AUROC ↑ | near-OOD AUROC ↑ | MinRank ↓ |"
    body = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[start + 2:start + 6]]
    assert lines[start + 6] == ""
    evil = "&lt;script&gt;alert(\"x\")&lt;/script&gt; &amp; \"co\""
    assert [r[:2] for r in body] == [["demo-best", "softmax"], ["demo-best", "energy"], [evil, "softmax"],
                                     [evil, "energy"]]
    assert body[0][2:] == ["**0.858 [0.841, 0.874]** <sup>0.62</sup>", "0.701 [0.680, 0.720] ▼ <sup>0.10</sup>",
                           "0.612 [0.580, 0.645] <sup>0.31</sup>", "**0.901 [0.889, 0.913]** <sup>0.90</sup>",
                           "3 [1, 7] ▼ <sup>0.00</sup>"]
    assert body[1][5] == body[2][3] == body[3][2] == MISSING
    assert "<script>" not in text
    assert [line for line in lines if line.startswith("## ")] == [
        "## Leaderboard", "## Open set: OSCR", "## C-OOD severity levels", "## Generated shift and near-OOD",
        "## EvG adversarial outliers", "## Models, data, versions", "## Notes"]
    assert "![AUROC by severity](severity_auroc.png)" in lines and "| 5 | 0.731 | — |" in lines
    assert "&lt;b&gt;not&lt;/b&gt;" in text


def test_write_page_writes_three_files_and_report_json_round_trips(report, tmp_path):
    report["leaderboard"]["rows"][1]["cells"]["near_ood"]["value"] = None  # JSON has no NaN
    report["sections"][1]["tables"][0]["rows"][1]["energy"] = None
    folder = tmp_path / "card"
    paths = write_page(report, folder)
    assert paths == {"json": folder / "report.json", "markdown": folder / "report.md", "html": folder / "index.html"}
    assert sorted(p.name for p in folder.iterdir()) == ["index.html", "report.json", "report.md"]  # atomic
    assert json.loads(paths["json"].read_text()) == report
    assert paths["markdown"].read_text() == render_markdown(report)
    # images relative to the report folder: the page there finds none of tmp_path's relative one
    page = paths["html"].read_text()
    assert page == render_html(report, folder) and page.count("<img ") == 1 and "severity_auroc.png" in page
