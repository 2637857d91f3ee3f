"""DDP with uneven and empty ranks: 2 gloo processes equal 1 process, and nothing hangs (tests/ddp_scenarios.py)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import child_env

pytestmark = pytest.mark.ddp



def run_scenario(tmp_path, devices: int) -> dict:
    env = child_env(WANDB_MODE="disabled")
    out = tmp_path / f"{devices}.json"
    # a hang (a rank skipping a collective) ends in the timeout instead of blocking the suite
    result = subprocess.run([sys.executable, "-m", "tests.ddp_scenarios", "--devices", str(devices), "--out", str(out)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(out.read_text())


def test_rank_without_batches_and_fewer_samples_than_ranks(tmp_path):
    one = run_scenario(tmp_path, 1)
    two = run_scenario(tmp_path, 2)
    assert two == one
    metrics = one["metrics"]
    # gamma, the loss, the OSCR callback's CCR/AUROC on negatives, and severity from a 1-image ID split
    for key in ("val/gamma", "val/loss", "val/negatives/ccr@fpr=0.1", "val/negatives/auroc",
                "val/severity/softmax/mean_auroc", "val/severity/entropy/hardest_auroc"):
        assert key in metrics, key
    assert one["passes"] == 3
