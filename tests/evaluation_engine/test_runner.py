"""Where an evaluation runs (:mod:`evaluation_engine.runner`): the processes Fabric launches, the precision a launched
run scores in and names in its cache keys, the modules it lends its device, and a Trainer's processes during
training."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from evaluation_engine.runner import Runner, TrainerOptions


def test_a_launched_run_calls_the_evaluation_once_and_returns_its_value() -> None:
    seen = []

    def evaluation(runner: Runner) -> float:
        seen.append((runner.global_rank, runner.world_size, runner.is_global_zero, runner.stage, runner.precision))
        return runner.broadcast(2.5)

    options = TrainerOptions(accelerator="cpu", devices=1, wandb_mode="disabled")
    assert Runner.launch(options, evaluation, name="test") == 2.5
    assert seen == [(0, 1, True, "test", "32-true")]
    with pytest.raises(ValueError, match="the trainer options are not valid here"):
        Runner.launch(TrainerOptions(accelerator="cpu", devices=1, precision="33-true", wandb_mode="disabled"),
                      evaluation, name="test")


def test_the_precision_a_run_names_is_the_one_it_runs() -> None:
    """On a CPU, Fabric runs 16-mixed as bf16-mixed: the cache keys must say bf16-mixed, or a later fp16 run on a
    GPU would reuse bf16 results."""
    with pytest.warns(UserWarning, match="AMP with fp16 is not supported on CPU"):
        assert Runner.local("16-mixed").precision == "bf16-mixed"
    assert Runner.local().precision == "32-true"


def test_a_true_precision_converts_the_modules_for_the_block_and_restores_them() -> None:
    """``64-true`` scores in float64 (weights and inputs), as a Trainer's set-up converted its module; afterwards
    every parameter and buffer is back in its dtype (a float64 buffer stays float64) and every submodule in the
    mode it had (a part kept in eval mode while the model trains stays so)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    model.register_buffer("mean", torch.zeros(2, dtype=torch.float64))
    model.train()
    model[1].eval()
    weights = model[0].weight.detach().clone()
    runner = Runner.local("64-true")
    with runner.on_device(model), runner.forward_context():
        assert model[0].weight.dtype == torch.float64 and not model.training and not model[0].training
        inputs = torch.rand(4, 3)
        assert inputs.dtype == torch.float64 and model(inputs).dtype == torch.float64
    assert [p.dtype for p in model.parameters()] == [torch.float32] * 4
    assert model[1].running_mean.dtype == torch.float32 and model.mean.dtype == torch.float64
    assert (model.training, model[0].training, model[1].training) == (True, True, False)
    assert torch.equal(model[0].weight, weights)
    with Runner.local().on_device(model):  # 32-true: nothing converted
        assert model[0].weight.dtype == torch.float32


def test_a_trainer_s_runner_is_its_processes_and_logs_through_the_module() -> None:
    """Inside a Trainer's validation the stage is ``val``, numbers are logged through the module (``ModelCheckpoint``
    monitors them; a NaN too, so a monitored key never goes missing), and nothing is converted."""
    found = {}

    class Probe(pl.Callback):
        def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            runner = Runner.of(trainer)
            found.update(stage=runner.stage, rank=runner.global_rank, world=runner.world_size,
                         precision=runner.precision)
            runner.log_metrics({"val/probe": 0.25, "val/undefined": float("nan")}, pl_module)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def validation_step(self, batch, batch_idx):
            return None

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(2, 2)), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[Probe()], enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.validate(Tiny(), dataloaders=loader, verbose=False)
    assert found == {"stage": "val", "rank": 0, "world": 1, "precision": "32-true"}
    assert trainer.callback_metrics["val/probe"].item() == 0.25
    assert torch.isnan(trainer.callback_metrics["val/undefined"])
