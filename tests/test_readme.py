"""The README's commands and code as written: the Python example runs, and every ``evaluate.py`` command it
documents parses with today's options (no deprecated spelling). The ImageNet journey itself runs in
tests/test_journey.py."""

from __future__ import annotations

import re
import shlex
import shutil
import warnings

import pytest

import evaluate
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def commands(program: str) -> list[str]:
    """Every ``python <program> ...`` command of the README's bash blocks, continuation lines joined."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        found += [line.strip() for line in joined.splitlines() if line.strip().startswith(f"python {program} ")]
    return found


def test_every_documented_evaluate_command_parses():
    documented = commands("evaluate.py")
    assert len(documented) >= 8
    seen = set()
    for command in documented:
        argv = shlex.split(command)[2:]
        with warnings.catch_warnings():
            warnings.simplefilter("error", evaluate.DeprecatedOption)  # the README uses today's spellings
            name, evaluation = evaluate.parse(argv)
        seen.add(name)
        assert type(evaluation).command == name, command
    assert seen == set(evaluate.COMMANDS)


def test_the_python_example_runs(demo_checkpoint, tmp_path, monkeypatch, capsys):
    code = re.search(r"## Evaluating from Python.*?```python\n(.*?)```", README, flags=re.S).group(1)
    (tmp_path / "runs/demo/checkpoints").mkdir(parents=True)
    shutil.copy(demo_checkpoint, tmp_path / "runs/demo/checkpoints/best.ckpt")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # the README's own example, as written
    tables = namespace["tables"]
    assert set(tables) == {"softmax", "energy"} and len(tables["energy"]) == 11
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == str([round(row["ood-auroc"], 3) for row in tables["energy"]])
    assert (tmp_path / "runs/notebook/severity/severity.csv").is_file()
    assert all(0 <= row["ood-auroc"] <= 1 for row in tables["softmax"])
    with pytest.raises(ValueError, match="needs its model_input"):
        namespace["ScoringModel"](namespace["model"].network)  # a module of your own needs its input
