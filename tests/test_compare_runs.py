"""``python -m benchmarks.compare_runs``: two output folders compared table by table, every number exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from benchmarks.compare_runs import compare, main


def write_run(root: Path, *, replicate: torch.Tensor, acceptance: float, ccr: str) -> Path:
    (root / "severity").mkdir(parents=True)
    (root / "metrics.csv").write_text(f"metric,value\nccr,{ccr}\nauroc,0.91\n")
    (root / "report.json").write_text(json.dumps({"rows": [{"acceptance": acceptance, "chains": 4}]}))
    torch.save({"replicates": {"mean": replicate}, "level": 0.95}, root / "severity" / "replicates.pt")
    (root / "wandb").mkdir()
    (root / "wandb" / "log.json").write_text(json.dumps({"t": str(root)}))  # ignored by default
    return root


def test_nan_in_both_runs_is_the_same_number_and_any_other_change_differs(tmp_path: Path, capsys) -> None:
    replicate = torch.tensor([0.5, math.nan, 0.25], dtype=torch.float64)
    first = write_run(tmp_path / "a", replicate=replicate, acceptance=math.nan, ccr="0.75")
    same = write_run(tmp_path / "b", replicate=replicate.clone(), acceptance=math.nan, ccr="0.75")
    assert main([str(first), str(same)]) == 0
    assert "3 of 3 files the same, 0 differ" in capsys.readouterr().out

    moved = replicate.clone()
    moved[0] = 0.5 + 2**-40  # one element, one ulp-sized step: exact means exact
    other = write_run(tmp_path / "c", replicate=moved, acceptance=0.0, ccr="0.7500001")
    found = compare(first, other, ignore=["wandb/*"], ignore_keys=set())
    assert found["severity/replicates.pt"] == ["['replicates']['mean']: 1 of 3 elements differ"]
    assert found["report.json"] == [".rows[0].acceptance: nan vs 0.0"]
    assert found["metrics.csv"] == ["row 1, value: '0.75' vs '0.7500001'"]
    assert main([str(first), str(other)]) == 1
    # NaN where the other run has a number differs too
    nan_first = replicate.clone()
    nan_first[0] = math.nan
    (tmp_path / "d").mkdir()
    torch.save({"replicates": {"mean": nan_first}, "level": 0.95}, tmp_path / "d" / "r.pt")
    (tmp_path / "e").mkdir()
    torch.save({"replicates": {"mean": replicate}, "level": 0.95}, tmp_path / "e" / "r.pt")
    assert compare(tmp_path / "d", tmp_path / "e", ignore=[], ignore_keys=set())["r.pt"] == [
        "['replicates']['mean']: 1 of 3 elements differ"]
