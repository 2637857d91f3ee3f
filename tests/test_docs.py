"""The documentation site (``mkdocs.yml``, ``docs/``): the extending page's examples run as written; the
detectors page is generated from the registry (its defaults are the code's, a detector added to the registry
gets its row); and, in the ``docs`` tier, ``mkdocs build --strict`` builds it with no network into pages that
open from the disk, every internal link of which resolves to a file (and its anchor to an id there)."""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote, urlsplit

import pytest
import torch

from metrics import KAPPAS
from metrics.detectors import ASHB, ASHP, ASHS, DETECTORS
from tests.conftest import ROOT, child_env

EXTENDING = (ROOT / "docs" / "extending.md").read_text()


def example(name: str) -> str:
    """The ``# example: <name>`` block of docs/extending.md."""
    return re.search(rf"```python\n# example: {name}\n(.*?)```", EXTENDING, flags=re.S).group(1)


def hooks() -> ModuleType:
    """docs/hooks.py, the site's MkDocs hooks, as a module."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def registry_kept() -> Iterator[None]:
    """Whatever a test adds to the detector registry or the data catalog's real OOD sets is gone after it."""
    from datamodules import catalog
    from metrics.detectors import registry

    kept = [(table, dict(table)) for table in (registry._REGISTRY, catalog.REAL_OOD)]
    yield
    for table, entries in kept:
        table.clear()
        table.update(entries)


def test_the_detector_example_fits_scores_and_joins_the_registry(registry_kept, capsys):
    namespace: dict = {}
    exec(compile(example("detector"), "docs/extending.md", "exec"), namespace)
    assert "centre_distance" in KAPPAS and KAPPAS["centre_distance"].detector.arguments() == {"scale": 1.0}
    detector = namespace["detector"]
    # the example's own data, drawn again from its seed: the score is -scale * |x - mean of the fit features|
    generator = torch.Generator().manual_seed(0)
    fit = torch.randn(200, 8, generator=generator).double()
    torch.randint(0, 4, (200,), generator=generator)
    test = (torch.randn(5, 8, generator=generator) + 3).double()  # the example adds 3 in float32
    expected = -2.0 * torch.linalg.vector_norm(test - fit.mean(dim=0), dim=1)
    torch.testing.assert_close(namespace["scores"], expected, rtol=0, atol=1e-12)
    assert detector.fitted and detector.hyperparameters() == {"scale": 2.0}
    assert "{'scale': 1.0}" in capsys.readouterr().out


def test_the_dataset_example_registers_a_real_ood_set_by_name(registry_kept, capsys):
    from datamodules.catalog import real_ood_set

    namespace: dict = {}
    exec(compile(example("dataset"), "docs/extending.md", "exec"), namespace)
    ood = real_ood_set("noise:7")
    assert len(ood) == 7 and all(int(ood[i][1]) == -2 for i in range(7))
    expected = torch.randint(0, 256, (7, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ood[3][0], expected[3].float() / 255)
    assert capsys.readouterr().out.strip() == "50 torch.Size([1, 28, 28]) -2"


def detector_rows(markdown: str) -> dict[str, list[str]]:
    """``name -> cells`` of the generated table."""
    rows = {}
    for line in markdown.splitlines():
        found = re.match(r"\| \[`([^`]+)`\]\(#[^)]+\) \|(.*)\|$", line)
        if found:
            rows[found.group(1)] = [cell.strip() for cell in found.group(2).split(" | ")]
    return rows


def test_the_detectors_page_is_the_registry_with_the_codes_defaults():
    rows = detector_rows(hooks().detectors_markdown())
    assert list(rows) == list(KAPPAS)
    for cls in (ASHS, ASHP, ASHB):  # ASH-P's 0.60 is the code's (the README's table said 0.90)
        default = inspect.signature(cls.__init__).parameters["percentile"].default
        assert rows[cls.name][3] == f"`percentile` = {default!r}"
    assert rows["ash_p"][3] == "`percentile` = 0.6"
    for name, cls in DETECTORS.items():
        reads = rows[name][1]
        assert reads == " + ".join(hooks().READS[key] for key in sorted(cls.inputs)), name
        split = "validation" if cls.fit_split == "val" else "training"
        assert (f"in-distribution {split} images" in rows[name][2]) == cls.fit_data, name
    assert rows["knn_imagenet"][2].endswith("(default cap: fraction 0.01)")
    assert rows["odin"][3] == "`temperature` = 2.0, `epsilon` = 1e-05, `image_space` = False"
    assert rows["relative_mahalanobis"][0].startswith("Ren, ") and rows["mahalanobis"][0].startswith("Lee, ")


def test_the_detectors_page_follows_a_detector_added_to_the_registry(registry_kept):
    namespace: dict = {}
    exec(compile(example("detector"), "docs/extending.md", "exec"), namespace)
    rows = detector_rows(hooks().detectors_markdown())
    assert rows["centre_distance"][1:4] == ["features", "in-distribution training images", "`scale` = 1.0"]
    assert rows["centre_distance"][4].startswith("The negative Euclidean distance of the features")


# -- the built site (the docs tier) ------------------------------------------------------------------------------

class Links(HTMLParser):
    """The ``href``/``src`` targets and the element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("href", "src") and value:
                self.targets.append(value)
            if key == "id" and value:
                self.ids.add(value)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as ``make docs`` builds it (strict), with every proxy pointing at a closed port: a build that
    reached for the network would fail."""
    folder = tmp_path_factory.mktemp("site")
    closed = "http://127.0.0.1:9"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)], cwd=ROOT,
        env=child_env(HTTP_PROXY=closed, HTTPS_PROXY=closed, http_proxy=closed, https_proxy=closed,
                      NO_MKDOCS_2_WARNING="1"),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


@pytest.mark.docs
def test_the_site_builds_strictly_into_pages_that_open_from_the_disk(site):
    pages = sorted(site.rglob("*.html"))
    for page in ("index", "getting-started", "journey", "cli", "python", "report-card", "detectors", "data",
                 "extending", "architecture", "methods/open-set", "methods/severity", "methods/generated",
                 "methods/evg", "methods/ood", "reference/metrics", "reference/metrics.detectors"):
        assert site / f"{page}.html" in pages, page
    for page in pages:  # file URLs: links name files, and nothing is fetched from another host
        parser = Links()
        parser.feed(page.read_text())
        remote = [t for t in parser.targets if urlsplit(t).scheme in ("http", "https") and
                  re.search(r"\.(css|js|woff2?|ttf|png|svg)(\?|$)", t)]
        assert not remote, (page, remote)
    # the generated detectors page and the API reference are in the built pages, with the code's values
    detectors = (site / "detectors.html").read_text()
    for name in KAPPAS:
        assert f'id="{name}"' in detectors, name
    assert "<code>percentile</code> = 0.6" in detectors
    assert 'id="metrics.detectors.ASH"' in (site / "reference/metrics.detectors.html").read_text()


@pytest.mark.docs
def test_every_internal_link_of_the_site_resolves(site):
    ids: dict[Path, set[str]] = {}
    parsed: dict[Path, Links] = {}
    for page in site.rglob("*.html"):
        if page.name == "404.html":  # a web server's error page, with root-absolute links: no file URL reaches it
            continue
        parsed[page] = Links()
        parsed[page].feed(page.read_text())
        ids[page] = parsed[page].ids
    broken, checked = [], 0
    for page, parser in parsed.items():
        for target in parser.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or target.startswith(("mailto:", "javascript:")):
                continue
            path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            checked += 1
            if not path.is_file():
                broken.append((page.relative_to(site), target))
            elif parts.fragment and path.suffix == ".html" and unquote(parts.fragment) not in ids[path]:
                broken.append((page.relative_to(site), target))
    assert checked > 500 and not broken, broken[:20]
