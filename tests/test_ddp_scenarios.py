"""DDP with uneven and empty ranks: 2 gloo processes equal 1 process, and nothing hangs (tests/ddp_scenarios.py)."""

import json
import os
import subprocess
import sys

from tests.conftest import ROOT

DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")


def run_scenario(tmp_path, devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    env.update({"PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"})
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
