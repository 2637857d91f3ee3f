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

# The papers of the κ whose code names none in its docstrings (the logit scores wrapped or written as one-line
# functions); every other row's paper is read from its detector's docstring.
CITED_ELSEWHERE = {
    "softmax": "Hendrycks & Gimpel, *A Baseline for Detecting Misclassified and Out-of-Distribution Examples*, "
               "ICLR 2017",
    "max_logit": "Hendrycks et al., *Scaling Out-of-Distribution Detection for Real-World Settings*, ICML 2022",
    "entropy": "the predictive entropy (Galil et al.'s C-OOD κ, ICLR 2023)",
    "energy": "Liu, Wang, Owens, Li, *Energy-based Out-of-distribution Detection*, NeurIPS 2020",
    "odin": "Liang, Li, Srikant, *Enhancing the Reliability of Out-of-distribution Image Detection*, ICLR 2018",
    "mc_dropout": "Gal & Ghahramani, *Dropout as a Bayesian Approximation*, ICML 2016",
    "ensemble_mi": "Mukhoti et al., *Raising the Bar on the Evaluation of Out-of-Distribution Detection*",
    "ensemble_softmax": "Mukhoti et al., *Raising the Bar on the Evaluation of Out-of-Distribution Detection*",
    "ensemble_entropy": "Mukhoti et al., *Raising the Bar on the Evaluation of Out-of-Distribution Detection*",
}


def detectors_markdown() -> str:
    """The detectors page's generated part: a table of every κ of :data:`metrics.KAPPAS` (name, paper, what it
    reads, what it fits, its defaults, its score) and a section per κ with its docstring.

    Read from the code alone: the κ's kind, its detector class's declared ``inputs``, ``fit_data`` and
    ``default_fit`` (the engine's default cap of the fit set), the defaults of its keyword arguments
    (``Kappa.parameters()``: the constructor's signature for a detector, the function's for a κ), and the paper
    (``Authors, *Title*, Venue Year``) from the detector's class or module docstring.
    """
    from metrics import KAPPAS

    citation = re.compile(r"([A-Z][^\s,*()]+(?:,? (?:[A-Z][^\s,*()]+|&))*),\s*\*([^*]+)\*,\s*((?:[A-Z][\w-]* )?\d{4})")
    rows, sections = [], []
    for name, kappa in KAPPAS.items():
        cls = kappa.detector_class
        home: Any = cls if cls is not None else kappa.fn
        module = inspect.getmodule(home)
        own_doc = inspect.getdoc(home) or ""
        module_doc = inspect.getdoc(module) or ""
        package_doc = inspect.getdoc(sys.modules.get(home.__module__.rpartition(".")[0])) or ""
        found = None
        if cls is not None:  # a module of two detectors introduces each as **Class** (citation)
            own_part = module_doc[module_doc.find(f"**{cls.__name__}**"):] if f"**{cls.__name__}**" in module_doc else ""
            found = citation.search(own_part) or citation.search(own_doc) or citation.search(module_doc)
        paper = (" ".join(f"{found.group(1)}, *{found.group(2)}*, {found.group(3)}".split()) if found
                 else CITED_ELSEWHERE.get(name, "—"))
        # the κ's line in its module's or package's list ("softmax     max_c softmax(z)_c   (softmax response)",
        # "ash_s, ash_p, ash_b    Djurisic et al. 2023, ...    features + head"): its text without the last
        # column when that one is what it reads; else the first paragraph of its docstring
        listed = re.search(rf"^\s*(?:\w+, )*{re.escape(name)}(?:, \w+)*\s{{2,}}(.+)$", f"{module_doc}\n{package_doc}",
                           flags=re.M)
        summary = " ".join(own_doc.split("\n\n")[0].split())
        if listed:
            columns = re.split(r"\s{2,}", listed.group(1).strip())
            if len(columns) > 1 and not columns[-1].startswith("("):
                columns = columns[:-1]
            summary = " ".join(columns)
        if cls is not None:
            reads = " + ".join(sorted(cls.inputs))
            fit = ("in-distribution training images" if cls.fit_data else "the head only") if cls.needs_fit() else "—"
            cap = ", ".join(f"{key} {value}" for key, value in kappa.default_fit.items())
            fit += f" (default cap: {cap})" if cap else ""
        else:
            reads = {"logits": "logits", "model": "model + images (its own pass)",
                     "ensemble": "member logits (M, N, C)", "features": "features"}[kappa.kind]
            fit = "—"
        defaults = ", ".join(f"`{key}` = {value!r}" for key, value in kappa.parameters().items()) or "—"
        rows.append(f"| [`{name}`](#{name}) | {paper} | {reads} | {fit} | {defaults} | {summary.replace('|', '∣')} |")
        where = f"{home.__module__}.{home.__qualname__}"
        body = [f"### `{name}`", "", f"`{where}`" + (f" (background-class models: {'yes' if kappa.background else 'no'})"), ""]
        if cls is not None:
            body += [module_doc, "", own_doc]
        else:
            # a κ without a docstring (a wrapped pytorch-ood score) is shown by its line of its module's list
            body += [own_doc or (f"    {name}  {' '.join(listed.group(1).split())}" if listed else "")]
        sections.append("\n".join(body))
    table = ["| κ | paper | reads | fit | defaults | score |", "|---|---|---|---|---|---|", *rows]
    return "\n".join([*table, "", "## Every detector", "", *sections]) + "\n"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: the detectors page's marker becomes :func:`detectors_markdown`."""
    return markdown.replace(MARKER, detectors_markdown()) if MARKER in markdown else markdown
