"""The README and the documentation pages as written: every ``evaluate.py`` command they document parses with
today's options (no deprecated spelling) into an evaluation that holds every value the command line gives; the
Python examples run; the README stays the short front door, its links and picture resolve. The ImageNet journey
itself (``docs/journey.md``) runs in tests/test_journey.py, the site's build in tests/test_docs.py."""

from __future__ import annotations

import csv
import dataclasses
import re
import shlex
import shutil
import warnings
from pathlib import Path, PurePath
from typing import Any

import pytest
import yaml
from PIL import Image

import evaluate
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text() for path in sorted((ROOT / "docs").rglob("*.md"))}
# the packages of this checkout: the objects whose attributes an evaluation's options may be kept in
PROJECT = {path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()} | {"evaluate", "openset_common"}


def commands(program: str) -> list[tuple[str, str]]:
    """``(file, command)`` of every ``python <program> ...`` command of the README's and the docs' bash blocks,
    continuation lines joined."""
    found = []
    for name, text in {"README.md": README, **PAGES}.items():
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            found += [(name, line.strip()) for line in joined.splitlines()
                      if line.strip().startswith(f"python {program} ")]
    return found


def held_values(value: Any, seen: set[int] | None = None) -> set[str]:
    """Every scalar an evaluation holds, as text: its attributes, the fields of its option groups and the items
    of their lists and mappings, walked through the objects of this project (and dataclasses), nothing else."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return set()
    seen.add(id(value))
    if value is None or isinstance(value, (str, int, float, bool, PurePath)):
        return {str(value)}
    if isinstance(value, dict):
        return set().union(*(held_values(k, seen) | held_values(v, seen) for k, v in value.items()))
    if isinstance(value, (list, tuple, set, frozenset)):
        return set().union(*(held_values(v, seen) for v in value))
    if dataclasses.is_dataclass(value) or type(value).__module__.split(".")[0] in PROJECT:
        return set().union(*(held_values(v, seen) for v in vars(value).values())) if hasattr(value, "__dict__") else set()
    return set()


def given_values(argv: list[str]) -> list[str]:
    """The values a command line gives its options (``--kappa softmax energy`` gives two; ``KEY=VALUE`` gives
    VALUE), the files of ``--config`` aside (their keys are read, not kept)."""
    values, option = [], None
    for token in argv[1:]:
        if token.startswith("--"):
            option = token
        elif option != "--config":
            values.append(token)
    return values


def listed_and_held(value: str, held: set[str]) -> bool:
    """A YAML list given as one value (``--data-arg "sets=[a, b]"``): held when every item is."""
    try:
        items = yaml.safe_load(value)
    except yaml.YAMLError:
        return False
    return isinstance(items, list) and bool(items) and all(str(item) in held for item in items)


def test_every_documented_evaluate_command_parses_into_its_options():
    documented = commands("evaluate.py")
    assert len(documented) >= 20 and any(name == "README.md" for name, _ in documented)
    seen = set()
    for page, command in documented:
        argv = shlex.split(command, comments=True)[2:]
        with warnings.catch_warnings():
            warnings.simplefilter("error", evaluate.DeprecatedOption)  # the pages use today's spellings
            name, evaluation = evaluate.parse(argv)
        seen.add(name)
        held = held_values(evaluation)
        lost = [value for value in given_values(argv) if value not in held and value.partition("=")[2] not in held
                and not listed_and_held(value.partition("=")[2], held)]
        assert not lost, f"{page}: {command}\nparsed into an evaluation that does not hold {lost}"
    assert seen == set(evaluate.COMMANDS)


def test_a_value_the_evaluation_does_not_keep_is_noticed():
    """The check above can fail: a command whose ``--output-dir`` the evaluation dropped is caught."""
    argv = ["severity", "--model", "timm:resnet50", "--kappa", "softmax", "--output-dir", "runs/x-severity"]
    _, evaluation = evaluate.parse(argv)
    assert "runs/x-severity" in held_values(evaluation)
    held = {value for value in held_values(evaluation) if value != "runs/x-severity"}
    assert [value for value in given_values(argv) if value not in held] == ["runs/x-severity"]


def test_the_python_example_runs(demo_checkpoint, tmp_path, monkeypatch, capsys):
    code = re.search(r"```python\n(.*?)```", PAGES["docs/python.md"], flags=re.S).group(1)
    (tmp_path / "runs/demo/checkpoints").mkdir(parents=True)
    shutil.copy(demo_checkpoint, tmp_path / "runs/demo/checkpoints/best.ckpt")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/python.md", "exec"), namespace)  # the page's own example, as written
    tables = namespace["tables"]
    assert set(tables) == {"softmax", "energy"} and len(tables["energy"]) == 11
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == str([round(row["ood-auroc"], 3) for row in tables["energy"]])
    assert (tmp_path / "runs/notebook/severity/severity.csv").is_file()
    assert all(0 <= row["ood-auroc"] <= 1 for row in tables["softmax"])
    with pytest.raises(ValueError, match="needs its model_input"):
        namespace["ScoringModel"](namespace["model"].network)  # a module of your own needs its input


@pytest.mark.docs
def test_the_readmes_python_one_liner_returns_the_cards_rows(demo_checkpoint, tmp_path, monkeypatch):
    """The README's one line of Python, as written (a card of one section, about 10 s: the docs tier): its rows
    are the leaderboard of the page it writes, the severity mean and hardest level of the section's table."""
    code = re.search(r"## From Python\n\n```python\n(.*?)```", README, flags=re.S).group(1)
    assert len(code.strip().splitlines()) == 1
    (tmp_path / "runs/demo/checkpoints").mkdir(parents=True)
    shutil.copy(demo_checkpoint, tmp_path / "runs/demo/checkpoints/best.ckpt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    (row,) = namespace["rows"]
    assert (row["model"], row["kappa"]) == ("demo-best", "softmax")
    with (tmp_path / "runs/notebook/card/severity/demo-best/severity.csv").open() as table:
        levels = [float(line["ood-auroc"]) for line in csv.DictReader(table) if line["confidence function"] == "softmax"]
    assert len(levels) == 11
    assert row["cells"]["severity_mean"]["value"] == pytest.approx(sum(levels) / 11, abs=1e-12)
    assert row["cells"]["severity_hardest"]["value"] == pytest.approx(min(levels), abs=1e-12)
    assert (tmp_path / "runs/notebook/card/index.html").is_file()


def test_the_readme_is_the_short_front_door():
    """At most 200 lines, with the four methods and the card in its table, the set-up, demo, test and docs
    commands, and the picture of the card: a PNG under docs/ of a modest size."""
    assert len(README.splitlines()) <= 200
    table = re.search(r"\| method \| paper \|.*?\n\n", README, flags=re.S).group(0)
    for paper in ("Palechor", "Galil", "Mukhoti", "Yoon", "report card"):
        assert paper in table
    for target in ("make setup", "make demo", "make test", "make test-all", "make docs"):
        assert re.search(rf"^{target}\b", README, flags=re.M), target
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert pictures == ["docs/images/report_card.png"]
    picture = ROOT / pictures[0]
    assert picture.stat().st_size < 300_000
    with Image.open(picture) as image:
        assert image.format == "PNG" and image.width >= 800


def test_every_link_of_the_readme_resolves():
    links = [target for target in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in target]
    assert len(links) >= 15
    missing = [target for target in links if not (ROOT / target.partition("#")[0]).is_file()]
    assert not missing
    # every page of the site but the API reference is one link away from the README
    pages = {name for name in PAGES if not name.startswith("docs/reference/")}
    assert pages - {Path(target.partition("#")[0]).as_posix() for target in links} == set()
