"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks:``).

The detectors page (``docs/detectors.md``) holds the marker ``<!-- detectors-table -->``; at build time it becomes
the table of every detector of the registry and one section per detector with its docstring, so that the page
follows the detectors as they change. :func:`detectors_markdown` is the one place that reads the registry: when
the registry changes its form, that function is the one to adapt.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

# the `mkdocs` script does not put the checkout on sys.path (`python -m mkdocs` does): the hook imports the
# checkout's own `metrics`, never an installed copy of another checkout
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = "<!-- detectors-table -->"

READS = {"logits": "logits", "features": "features", "head": "head", "member_logits": "member logits (N, M, C)",
         "model": "model + images (its own pass)"}


def detectors_markdown() -> str:
    """The detectors page's generated part: a table of every detector of the registry
    (:func:`metrics.detectors.detectors`: name, paper, what it reads, what it fits, its defaults, its score) and a
    section per detector with its docstring.

    Read from the code alone: each class's declared ``inputs``, ``fit_data``, ``fit_split``, ``needs_fit`` and
    ``default_fit`` (the engine's default cap of the fit set), its hyperparameters with their defaults (the constructor's keyword-only
    arguments, :meth:`metrics.detectors.Detector.hyperparameter_defaults`), and its paper: the full citation
    (``Authors, *Title*, Venue Year``) of its class or module docstring where one is written, else its ``paper``.
    """
    from metrics.detectors import detectors

    citation = re.compile(r"([A-Z][^\s,*()]+(?:,? (?:[A-Z][^\s,*()]+|&))*),\s*\*([^*]+)\*,\s*((?:[A-Z][\w-]* )?\d{4})")
    rows, sections = [], []
    for name, cls in detectors().items():
        module = inspect.getmodule(cls)
        own_doc = inspect.getdoc(cls) or ""
        module_doc = inspect.getdoc(module) or ""
        own_part = module_doc[module_doc.find(f"**{cls.__name__}**"):] if f"**{cls.__name__}**" in module_doc else ""
        found = citation.search(own_part) or citation.search(own_doc) or citation.search(module_doc)
        paper = (" ".join(f"{found.group(1)}, *{found.group(2)}*, {found.group(3)}".split()) if found
                 else cls.paper or "—")
        # the detector's line in its module's list ("softmax     max_c softmax(z)_c   (softmax response)"): its
        # text without the last column when that one is what it reads; else the first paragraph of its docstring
        listed = re.search(rf"^\s*(?:\w+, )*{re.escape(name)}(?:, \w+)*\s{{2,}}(.+)$", module_doc, flags=re.M)
        summary = " ".join(own_doc.split("\n\n")[0].split())
        if listed:
            columns = re.split(r"\s{2,}", listed.group(1).strip())
            if len(columns) > 1 and not columns[-1].startswith("("):
                columns = columns[:-1]
            summary = " ".join(columns)
        reads = " + ".join(READS.get(key, key) for key in sorted(cls.inputs))
        images = f"in-distribution {'validation' if cls.fit_split == 'val' else 'training'} images"
        fit = (images if cls.fit_data else "the head only") if cls.needs_fit else "—"
        cap = ", ".join(f"{key} {value}" for key, value in cls.default_fit.items())
        fit += f" (default cap: {cap})" if cap else ""
        defaults = ", ".join(f"`{key}` = {value!r}" for key, value in cls.hyperparameter_defaults().items()) or "—"
        rows.append(f"| [`{name}`](#{name}) | {paper} | {reads} | {fit} | {defaults} | {summary.replace('|', '∣')} |")
        where = f"{cls.__module__}.{cls.__qualname__}"
        body = [f"### `{name}`", "", f"`{where}` (background-class models: {'yes' if cls.background_rule else 'no'})",
                "", module_doc, "", own_doc]
        sections.append("\n".join(body))
    table = ["| κ | paper | reads | fit | defaults | score |", "|---|---|---|---|---|---|", *rows]
    return "\n".join([*table, "", "## Every detector", "", *sections]) + "\n"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: the detectors page's marker becomes :func:`detectors_markdown`."""
    return markdown.replace(MARKER, detectors_markdown()) if MARKER in markdown else markdown
