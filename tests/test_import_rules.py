"""The import rules of DESIGN.md §2: the data flow files -> datamodules -> lightning_modules -> evaluation_engine
-> callbacks -> evaluation_methods -> report_card, all on metrics, and no import circle between the project's modules.

``metrics`` imports nothing of the other packages; ``datamodules`` never imports a model, the engine, a callback
or a metric; ``lightning_modules`` never imports the engine or anything above it; the ``engine`` (scoring passes,
intervals, outputs) never a callback, a method or the report card; a ``callback`` never a method's command or the
card; a ``method`` never the card; ``openset_common`` imports nothing of the project. Every package may import
``openset_common``. Imports inside functions count: a lazy import that dodges a circle is still one. And
``callbacks/`` holds Lightning callbacks only (:func:`test_callbacks_holds_only_lightning_callbacks`).
"""

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROJECT = {"metrics", "datamodules", "lightning_modules", "evaluation_engine", "callbacks", "evaluation_methods", "report_card", "openset_common",
           "train", "evaluate", "benchmarks"}
LIBRARY = ("metrics", "datamodules", "lightning_modules", "evaluation_engine", "callbacks", "evaluation_methods", "report_card", "openset_common")
ENTRY = {"train", "evaluate", "benchmarks"}
FORBIDDEN = {
    "openset_common": PROJECT - {"openset_common"},
    "metrics": PROJECT - {"metrics", "openset_common"},
    "datamodules": {"lightning_modules", "evaluation_engine", "callbacks", "evaluation_methods", "report_card", "metrics", *ENTRY},
    "lightning_modules": {"evaluation_engine", "callbacks", "evaluation_methods", "report_card", *ENTRY},
    "evaluation_engine": {"callbacks", "evaluation_methods", "report_card", *ENTRY},
    "callbacks": {"evaluation_methods", "report_card", *ENTRY},
    "evaluation_methods": {"report_card", *ENTRY},
    "report_card": ENTRY,
}


def imported_packages(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):  # also imports inside functions
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & PROJECT


def files_of(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in it). ``from package.module import name`` is an edge
    to ``package.module.name`` when that is a module, else to ``package.module``; a package's ``__init__`` is
    the module of the package's name."""
    modules = {module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                           for alias in node.names]
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each listed once, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_follow_the_data_flow(package):
    violations = {str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[package])
                  for path in files_of(package)}
    assert {path: found for path, found in violations.items() if found} == {}


def test_the_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from callbacks.severity import slug\n    import lightning_modules.scoring\n")
    assert imported_packages(bad) == {"callbacks", "lightning_modules"}


def test_no_import_circle_between_the_projects_modules():
    paths = [p for package in LIBRARY for p in files_of(package)] + [ROOT / "train.py", ROOT / "evaluate.py"]
    assert import_circles(module_graph(paths)) == []


def test_a_circle_through_a_lazy_import_is_found(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import g\n\ndef f():\n    return g()\n")
    (package / "b.py").write_text("def g():\n    from pkg import a  # dodges the circle at import time\n    return a\n")
    (package / "c.py").write_text("from pkg.a import f\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    graph = module_graph(sorted(package.glob("*.py")))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert import_circles({"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}) == [["pkg.a", "pkg.b"]]
    assert import_circles(module_graph(sorted(package.glob("*.py")))) == [["pkg.a", "pkg.b"]]


def test_callbacks_holds_only_lightning_callbacks():
    """Every class defined in ``callbacks/`` is a method's evaluation: a ``pl.Callback`` or a class with the public
    ``evaluate(runner, ...)`` every method's evaluation has (EvG's report, which runs in no Trainer); the commands are
    in ``evaluation_methods/``, the engine in ``evaluation_engine/``, the card in ``report_card/``. Helper functions
    and constants may stay beside their callback."""
    import importlib
    import inspect

    import pytorch_lightning as pl

    found = {}
    for path in files_of("callbacks"):
        module = importlib.import_module(module_name(path))
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__ and not issubclass(value, pl.Callback) \
                    and not callable(getattr(value, "evaluate", None)):
                found[f"{module.__name__}.{name}"] = value
    assert sorted(found) == []
