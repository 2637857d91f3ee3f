"""The import-direction rule of DESIGN.md §2: files -> datamodules -> lightning_modules -> callbacks -> metrics.

``metrics`` imports nothing of the other packages; ``datamodules`` never imports a model, a callback or a
metric; ``lightning_modules`` never imports a callback; ``common`` imports nothing of the project. Every
package may import ``common``.
"""

import ast

import pytest

from tests.conftest import ROOT

PROJECT = {"metrics", "datamodules", "lightning_modules", "callbacks", "common", "train", "evaluate", "benchmarks"}
FORBIDDEN = {
    "common": PROJECT - {"common"},
    "metrics": PROJECT - {"metrics", "common"},
    "datamodules": {"lightning_modules", "callbacks", "metrics", "train", "evaluate", "benchmarks"},
    "lightning_modules": {"callbacks", "train", "evaluate", "benchmarks"},
    "callbacks": {"train", "evaluate", "benchmarks"},
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
    return [ROOT / "common.py"] if package == "common" else sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_follow_the_data_flow(package):
    violations = {str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[package])
                  for path in files_of(package)}
    assert {path: found for path, found in violations.items() if found} == {}


def test_the_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from callbacks.severity import slug\n    import lightning_modules.scoring\n")
    assert imported_packages(bad) == {"callbacks", "lightning_modules"}
