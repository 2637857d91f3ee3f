"""The report card in a real browser: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver (the two come from one source package, so their versions always match; nothing is downloaded).

The page of the fixture report (tests/report_card/test_page.py) loads without a console error, a page
error or a request beyond file:// and data:; its leaderboard shows report.json's rows, cell for cell; a click
on a header sorts the rows by value (again: reversed; "—" last); a full-page screenshot is not blank. The
screenshot is kept under pytest's tmp folder and, when ``REPORT_SCREENSHOT`` names a file (or a folder), copied
there for a human to look at.

Without Chromium, chromedriver or Selenium the tier skips, unless ``REQUIRE_BROWSER=1`` (``make test-all``,
CI), where it fails: CI cannot skip it silently.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from report_card.page import MISSING, format_cell, write_page
from tests.report_card import test_page as fixtures

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1280, 900  # a laptop screen


def executable(variable: str, *names: str) -> str | None:
    """``$variable`` if set (a path or a name on the PATH), else the first of ``names`` on the PATH."""
    candidates = (os.environ[variable],) if os.environ.get(variable) else names
    return next((path for path in map(shutil.which, candidates) if path), None)


def required() -> bool:
    return os.environ.get("REQUIRE_BROWSER", "") not in ("", "0")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = executable("CHROMIUM", "chromium", "chromium-browser")
    chromedriver = executable("CHROMEDRIVER", "chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    missing = [what for what, found in (("chromium", chromium), ("chromedriver", chromedriver),
                                        ("the selenium package", webdriver)) if not found]
    if missing:
        message = (f"the browser tier needs {', '.join(missing)}: `make test-all` installs Debian's chromium and "
                   f"chromium-driver, `pip install -e '.[dev]'` selenium")
        if required():
            pytest.fail(f"REQUIRE_BROWSER is set, but {message}")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={WIDTH},{HEIGHT}", "--force-device-scale-factor=1", "--hide-scrollbars",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking",
                     "--disable-component-update", "--lang=en-GB",
                     f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(argument)
    # the console (and uncaught errors) and the network requests of the page
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(60)
    # errors that reach window.onerror or go unhandled as rejections, recorded before any script of the page runs
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        window.__pageErrors = [];
        window.addEventListener("error", function (e) { window.__pageErrors.push(String(e.message)); });
        window.addEventListener("unhandledrejection", function (e) { window.__pageErrors.push(String(e.reason)); });
    """})
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def card(tmp_path_factory) -> tuple[dict[str, Any], Path]:
    """The fixture report written as a report folder; the report as read back from its report.json."""
    folder = tmp_path_factory.mktemp("card")
    report = fixtures.make_report(folder)
    report["leaderboard"]["rows"][1]["cells"]["near_ood"]["value"] = None  # JSON has no NaN
    paths = write_page(report, folder)
    return json.loads(paths["json"].read_text()), paths["html"]


def load(driver, page: Path) -> None:
    driver.get(page.as_uri())
    if driver.execute_script("return document.readyState") != "complete":
        raise AssertionError("the page did not finish loading")


ROWS_JS = """
return Array.from(document.querySelectorAll("#leaderboard tbody tr")).map(function (tr) {
  return {model: tr.getAttribute("data-model"), kappa: tr.getAttribute("data-kappa"),
          first: [tr.cells[0].textContent, tr.cells[1].textContent],
          cells: Array.from(tr.cells).slice(2).map(function (td) {
            var v = td.querySelector(".v") || td;
            return {text: v.textContent.trim(), weight: getComputedStyle(v).fontWeight,
                    mark: td.querySelector(".sig") !== null && td.querySelector(".sig").offsetWidth > 0};
          })};
});
"""


def shown_order(driver, table: str = "#leaderboard") -> list[tuple[str, str]]:
    return [(r["model"], r["kappa"]) for r in driver.execute_script(ROWS_JS.replace("#leaderboard", table))]


def test_the_page_loads_without_errors_or_requests_beyond_the_file(browser, card):
    _, page = card
    browser.get_log("browser"), browser.get_log("performance")  # start from empty logs
    load(browser, page)
    console = [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]
    assert console == []
    assert browser.execute_script("return window.__pageErrors") == []
    requested = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requested if m["method"] == "Network.requestWillBeSent"]
    assert urls and all(url.startswith(("file://", "data:")) for url in urls), urls
    assert browser.title == card[0]["title"]
    images = browser.execute_script(
        "return Array.from(document.images).map(function (i) { return [i.complete, i.naturalWidth]; })")
    assert images == [[True, 96], [True, 96]]  # both inlined PNGs decoded


def test_the_leaderboard_shows_report_json_cell_for_cell(browser, card):
    report, page = card
    load(browser, page)
    shown = browser.execute_script(ROWS_JS)
    rows = report["leaderboard"]["rows"]
    keys = [c["key"] for c in report["leaderboard"]["columns"]]
    assert len(shown) == len(rows)
    for got, want in zip(shown, rows, strict=True):
        assert (got["model"], got["kappa"]) == (want["model"], want["kappa"])
        assert got["first"] == [want["model"], want["kappa"]]  # the model name with "<script>" as plain text
        assert [c["text"] for c in got["cells"]] == [format_cell(want["cells"][k]) if k in want["cells"] else MISSING
                                                     for k in keys]
        for c, k in zip(got["cells"], keys, strict=True):
            source = want["cells"].get(k) or {}
            assert (c["weight"] == "700") == bool(source.get("best")), (want["model"], k, c)
            assert c["mark"] == bool(source.get("significant")), (want["model"], k, c)


def expected_order(rows: list[dict[str, Any]], key: str, *, descending: bool = False) -> list[tuple[str, str]]:
    """Rows by a column's value (stable), the missing ones last either way."""
    def value(row):
        cell = row["cells"].get(key)
        return None if cell is None or cell["value"] is None else cell["value"]
    present = sorted((r for r in rows if value(r) is not None), key=value, reverse=descending)
    return [(r["model"], r["kappa"]) for r in present + [r for r in rows if value(r) is None]]


def click_header(driver, table: str, title: str) -> str | None:
    from selenium.webdriver.common.by import By

    header = next(th for th in driver.find_elements(By.CSS_SELECTOR, f"{table} thead th.sortable")
                  if th.text.split(" ↑")[0].split(" ↓")[0] == title)
    header.click()
    return header.get_attribute("aria-sort")


def test_clicking_a_header_sorts_the_rows_by_value(browser, card):
    report, page = card
    rows = report["leaderboard"]["rows"]
    load(browser, page)
    assert shown_order(browser) == [(r["model"], r["kappa"]) for r in rows]
    # OSCR: one row has no value; it stays last in both directions
    assert click_header(browser, "#leaderboard", "OSCR") == "ascending"
    assert shown_order(browser) == expected_order(rows, "oscr")
    assert click_header(browser, "#leaderboard", "OSCR") == "descending"
    assert shown_order(browser) == expected_order(rows, "oscr", descending=True)
    assert shown_order(browser)[-1] == (fixtures.EVIL, "energy")
    # MinRank: 3, 5, 9, 12 sorted as numbers, not as strings ("12" < "3")
    assert click_header(browser, "#leaderboard", "MinRank") == "ascending"
    assert shown_order(browser) == expected_order(rows, "min_rank")
    assert [r["cells"][4]["text"] for r in browser.execute_script(ROWS_JS)] == \
        ["3 [1, 7]", "5 [2, 9]", "9 [4, 15]", "12 [8, 19]"]
    # κ: strings alphabetically, ties in their previous order (a stable sort)
    assert click_header(browser, "#leaderboard", "κ") == "ascending"
    assert [k for _, k in shown_order(browser)] == ["energy", "energy", "softmax", "softmax"]
    # a section's table sorts the same way: NaN ("—") last
    assert click_header(browser, "#severity table.sortable", "energy") == "ascending"
    levels = browser.execute_script("""return Array.from(document.querySelectorAll(
        "#severity table.sortable tbody tr")).map(function (tr) { return tr.cells[0].textContent; });""")
    assert levels == ["10", "0", "5"]


def test_a_screenshot_of_the_page_is_not_blank(browser, card, tmp_path):
    _, page = card
    load(browser, page)
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": WIDTH, "height": min(size["height"], 8000), "scale": 1}})
    path = tmp_path / "report_page.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    target = os.environ.get("REPORT_SCREENSHOT")
    if target:
        target_path = Path(target)
        if target_path.is_dir() or target.endswith(os.sep):
            target_path = target_path / path.name
        target_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target_path)
    pixels = np.asarray(Image.open(path).convert("RGB"))
    assert pixels.shape[1] == WIDTH and pixels.shape[0] >= HEIGHT
    colours = len(Image.open(path).convert("RGB").getcolors(maxcolors=1 << 24))
    not_white = (pixels < 235).any(axis=-1).mean()
    assert colours > 100 and pixels.std() > 10 and 0.02 < not_white < 0.9, (colours, pixels.std(), not_white)
    top = pixels[:HEIGHT]  # what a reader sees first: the title, how to read it and the leaderboard
    assert (top < 235).any(axis=-1).mean() > 0.02



def test_at_1366_px_the_leaderboard_scrolls_in_its_frame_with_model_and_kappa_frozen(browser, tmp_path):
    """A leaderboard of 24 columns (wider than a 1366 px laptop window): the page itself never scrolls sideways;
    the table scrolls inside its frame, and the model and κ columns stay at its left edge, side by side."""
    report = fixtures.make_report(tmp_path)
    report["leaderboard"]["rows"][1]["cells"]["near_ood"]["value"] = None
    extra = [{**column, "key": f"{column['key']}_{copy}", "title": f"{column['title']} {copy}"}
             for copy in range(1, 5) for column in report["leaderboard"]["columns"][:5]]
    for row in report["leaderboard"]["rows"]:
        row["cells"].update({c["key"]: row["cells"].get(c["key"].rsplit("_", 1)[0]) for c in extra})
    report["leaderboard"]["columns"] += extra
    # a card of every method: its table of contents is wider than the window on one line
    report["sections"] += [{"method": f"method_{i}", "title": f"A method with a long name, number {i} (Author et al.)",
                            "text": "", "tables": [], "images": []} for i in range(6)]
    page = write_page(report, tmp_path)["html"]
    browser.set_window_size(1366, 768)
    try:
        load(browser, page)
        geometry = browser.execute_script("""
            var frame = document.querySelector("#leaderboard").parentElement;
            var before = [frame.scrollWidth, frame.clientWidth, document.documentElement.scrollWidth,
                          document.documentElement.clientWidth];
            frame.scrollLeft = frame.scrollWidth;
            var row = document.querySelector("#leaderboard tbody tr");
            var model = row.cells[0].getBoundingClientRect(), kappa = row.cells[1].getBoundingClientRect();
            var last = row.cells[row.cells.length - 1].getBoundingClientRect();
            var box = frame.getBoundingClientRect();
            var hit = document.elementFromPoint(model.left + 5, model.top + model.height / 2);
            return {before: before, scrolled: frame.scrollLeft, frame: [box.left, box.right], model: [model.left,
                    model.right], kappa: [kappa.left, kappa.right], last: [last.left, last.right],
                    hit: hit === row.cells[0] || row.cells[0].contains(hit)};""")
    finally:
        browser.set_window_size(WIDTH, HEIGHT)
    frame_width, frame_client, page_width, window_width = geometry["before"]
    assert frame_width > frame_client + 500  # the table is wider than its frame: it scrolls there
    assert page_width <= window_width  # and the page does not
    assert geometry["scrolled"] > 500
    assert abs(geometry["model"][0] - geometry["frame"][0]) <= 2  # frozen at the frame's left edge
    assert abs(geometry["kappa"][0] - geometry["model"][1]) <= 2  # κ right after it
    assert geometry["hit"]  # drawn above the cells scrolled under it
    assert geometry["last"][1] <= geometry["frame"][1] + 2  # the last column scrolled into view
