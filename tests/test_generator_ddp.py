"""The generators under 2-process CPU DDP (tests/generator_scenarios.py): the ranks end with identical
networks, and a resume from ``last.ckpt`` continues from the saved step and weights; the ranks draw their own
randomness (latent noise, dropout masks: real data parallelism, not N copies of one batch of fakes), and the
frozen ensemble and LPIPS are neither broadcast at start-up nor re-broadcast every step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import child_env, train_demo_checkpoint

pytestmark = [pytest.mark.ddp, pytest.mark.usefixtures("one_thread")]




@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("members")
    return [str(train_demo_checkpoint(root / f"m{seed}", "eos", steps=2, seed=seed)) for seed in range(2)]


def run_scenario(kind: str, members: list[str], out: Path, *, steps: int, resume: Path | None = None
                 ) -> list[dict[str, Any]]:
    """Run the scenario on 2 gloo processes; return what each rank saved."""
    env = child_env(WANDB_MODE="disabled")
    command = [sys.executable, "-m", "tests.generator_scenarios", "--kind", kind, "--devices", "2",
               "--steps", str(steps), "--members", *members, "--out", str(out)]
    if resume is not None:
        command += ["--resume", str(resume)]
    out.parent.mkdir(parents=True, exist_ok=True)
    # a hang (a rank skipping a collective) ends in the timeout instead of blocking the suite
    result = subprocess.run(command, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    return [torch.load(out.with_suffix(f".rank{rank}.pt"), weights_only=False) for rank in range(2)]


def parameters(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trained parameters, without the batch-norm running statistics.

    Under DDP the statistics are not averaged: DDP broadcasts rank 0's buffers at the start of each forward,
    then every rank updates them with its own batch, so after the last step they legitimately differ
    between ranks. The parameters are updated with all-reduced gradients and must be equal.
    """
    return {k: v for k, v in weights.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def assert_equal(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name, value in left.items():
        assert torch.equal(value, right[name]), name


def assert_trained(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> None:
    """Both networks moved (the run did train them)."""
    changed = {k.split(".")[0] for k, v in after.items() if not torch.equal(v, before[k])}
    assert changed == {"generator", "discriminator"}


def expected_latents(seed: int, rank: int, step: int, count: int, dim: int) -> torch.Tensor:
    """The z of a training step from the documented seed: 64 bits of ``SeedSequence([seed, rank, step])``."""
    state = int(np.random.SeedSequence([seed, rank, step]).generate_state(1, dtype=np.uint64)[0])
    return torch.randn(count, dim, generator=torch.Generator().manual_seed(state))


def assert_own_randomness(ranks: list[dict[str, Any]], kind: str, steps: list[int]) -> None:
    """Each rank drew its own randomness at every step; the frozen scorers were kept out of DDP's broadcasts."""
    for rank, saved in enumerate(ranks):
        assert saved["steps"] == steps and len(saved["draws"]) == len(steps)
        if kind == "near_ood":  # z of rank r at step t: from the seed (seed_everything(0), r, t), nothing else
            for step, z in zip(steps, saved["draws"], strict=True):
                expected = expected_latents(0, rank, step, saved["batch_size"], saved["latent_dim"])
                torch.testing.assert_close(z, expected, rtol=0, atol=0)
        # DDP ignores every parameter and buffer of the ensemble and LPIPS, and broadcasts only the networks'
        assert saved["frozen"] and set(saved["frozen"]) <= set(saved["ddp_ignored"])
        assert any(name.startswith("ensemble.") for name in saved["frozen"])
        assert saved["ddp_broadcast_buffers"] and saved["ddp_broadcast"]  # the networks' batch-norm statistics
        assert all(name.startswith(("generator.", "discriminator.")) for name in saved["ddp_broadcast"])
    for first, second in zip(ranks[0]["draws"], ranks[1]["draws"], strict=True):
        assert first.shape == second.shape and not torch.equal(first, second)  # other z / other dropout masks


def train_on_two_ranks(kind: str, members: list[str], directory: Path) -> dict[str, torch.Tensor]:
    """2 training steps on 2 ranks: the ranks agree; returns rank 0's final weights (those checkpointed)."""
    first = run_scenario(kind, members, directory / "result.pt", steps=2)
    for rank in first:  # 2 training steps, each a D and a G optimiser step
        assert (rank["start_global_step"], rank["global_step"]) == (0, 4)
    assert_own_randomness(first, kind, steps=[0, 1])
    # the same initial networks on both ranks, and the same trained parameters
    assert_equal(first[0]["start_weights"], first[1]["start_weights"])
    trained = parameters(first[0]["weights"])
    assert_equal(trained, parameters(first[1]["weights"]))
    assert_trained(trained, first[0]["start_weights"])
    return first[0]["weights"]


# the same Lightning machinery as the shift generator's run below; two more process start-ups (about 40 s)
def test_near_ood_ranks_draw_their_own_noise_and_agree(members: list[str], tmp_path: Path) -> None:
    train_on_two_ranks("near_ood", members, tmp_path)


def test_shift_ranks_agree_and_a_resume_continues_from_the_checkpoint(members: list[str], tmp_path: Path) -> None:
    weights = train_on_two_ranks("shift", members, tmp_path / "first")
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=False)
    assert saved["global_step"] == 4
    assert set(saved["state_dict"]) == set(weights)  # the two networks only: no LPIPS, no ensemble
    assert_equal(saved["state_dict"], weights)  # rank 0 writes the checkpoint

    resumed = run_scenario("shift", members, tmp_path / "resumed" / "result.pt", steps=3, resume=last)
    for rank in resumed:  # one more training step from the saved one, starting from the saved weights
        assert (rank["start_global_step"], rank["global_step"]) == (4, 6)
        assert_equal(rank["start_weights"], saved["state_dict"])
    assert_own_randomness(resumed, "shift", steps=[2])  # the resumed step draws as step 2, not as step 0
    assert_equal(parameters(resumed[0]["weights"]), parameters(resumed[1]["weights"]))
    assert_trained(parameters(resumed[0]["weights"]), saved["state_dict"])
