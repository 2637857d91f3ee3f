"""train.py: every YAML in configs/ runs (fast_dev_run on tiny data), resume, and DDP equals 1 process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import wandb

import train
from datamodules.protocols import imagenet_protocol
from tests.conftest import DISTRIBUTED_ENV, ROOT, child_env

CONFIGS = ROOT / "configs"
IMAGENET_BASE = ["trainer/default.yaml", "protocol/p2.yaml", "model/resnet50.yaml", "loss/eos.yaml"]


def composition(config: str) -> list[str]:
    """The configs a YAML is run with: each ImageNet part with the defaults of the other concerns."""
    concern = config.split("/")[0]
    if concern == "demo" or config in STANDALONE:
        return [config]
    if config == "ensemble/imagenet_p1.yaml":  # members of a P1 protocol training
        return [*IMAGENET_BASE[:3], config]
    if concern == "severity":  # added after a whole protocol training configuration
        protocol = f"protocol/{Path(config).stem}.yaml"
        return [IMAGENET_BASE[0], protocol, *IMAGENET_BASE[2:], config]
    if concern == "trainer" and config != "trainer/default.yaml":
        return ["trainer/default.yaml", config, *IMAGENET_BASE[1:]]
    index = {"trainer": 0, "protocol": 1, "model": 2, "loss": 3}[concern]
    return [config if i == index else part for i, part in enumerate(IMAGENET_BASE)]


ALL_CONFIGS = sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml") if p.parent.name != "evaluate")
# configs/evaluate/ holds evaluate.py options (tests/test_evaluate.py runs them); these train on their own
STANDALONE = {"ensemble/fashion_mnist.yaml", "generators/fashion_shift.yaml", "generators/fashion_near_ood.yaml",
              "generators/imagenet_p1_shift.yaml", "generators/imagenet_p1_near_ood.yaml", "generators/digits_gan.yaml",
              "generators/ood_gan.yaml"}




@pytest.fixture(autouse=True)
def _isolated_run(monkeypatch):
    # LightningCLI(args=...) warns when pytest's own command line is in sys.argv
    monkeypatch.setattr(sys, "argv", ["train.py"])
    for name in DISTRIBUTED_ENV:  # a single-process DDP run leaves these behind
        monkeypatch.delenv(name, raising=False)
    yield
    wandb.finish()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_every_config_is_covered():
    assert {c.split("/")[0] for c in ALL_CONFIGS} <= {"demo", "trainer", "protocol", "model", "loss", "severity",
                                                      "ensemble", "generators"}
    assert {c for c in ALL_CONFIGS if c.startswith(("ensemble/", "generators/"))} <= STANDALONE | {
        "ensemble/imagenet_p1.yaml"}
    assert {c for c in ALL_CONFIGS if c.startswith("severity/")} == {f"severity/p{n}.yaml" for n in (1, 2, 3)}
    assert len(ALL_CONFIGS) >= 13


def config_args(parts: list[str]) -> list[str]:
    return [arg for part in parts for arg in ("--config", str(CONFIGS / part))]


def imagenet_overrides(root: Path, protocol_dir: Path) -> list[str]:
    return [
        f"--data.init_args.root={root}", f"--data.init_args.protocol_dir={protocol_dir}",
        "--data.init_args.num_workers=0", "--data.init_args.batch_size=4", "--data.init_args.pin_memory=false",
    ]


DEMO_FAST = ["--data.init_args.max_train_per_class=40", "--trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def members_file(tmp_path_factory):
    """Two demo classifiers listed in a members file, as `train.py ensemble` writes it."""
    from tests.conftest import train_demo_checkpoint

    root = tmp_path_factory.mktemp("members")
    paths = [train_demo_checkpoint(root / f"m{i}", "softmax", steps=2, seed=i) for i in range(2)]
    (root / "ensemble.txt").write_text("".join(f"{p}\n" for p in paths))
    return root / "ensemble.txt"


GENERATOR_FAST = ["--model.init_args.lpips_random_backbone=true",  # no ImageNet LPIPS weights here: by name
                  "--model.init_args.base_width=8", "--trainer.logger=false"]


@pytest.mark.sweep
@pytest.mark.parametrize("config", ALL_CONFIGS)
def test_fast_dev_run(config, tiny_imagenet, tmp_path, monkeypatch, members_file):
    monkeypatch.chdir(tmp_path)
    parts = composition(config)
    config_files = [arg for part in parts for arg in ("--config", str(CONFIGS / part))]
    if config.startswith("severity/"):
        # the tiny folder has 5 train images per class (ILSVRC2012: ~1300): 3 for estimation; evaluate at once
        small = (CONFIGS / config).read_text().replace("estimation: 150", "estimation: 3")
        (tmp_path / "severity.yaml").write_text(small.replace("every_n_epochs: 5", "every_n_epochs: 1"))
        config_files[-1] = str(tmp_path / "severity.yaml")
    args = ["fit", *config_files, "--trainer.fast_dev_run=true", "--trainer.accelerator=cpu"]
    if config.startswith("demo/") or config == "ensemble/fashion_mnist.yaml":
        args += DEMO_FAST
    elif config == "generators/digits_gan.yaml":
        args += ["--trainer.enable_progress_bar=false", "--model.init_args.base_width=8", "--trainer.logger=false"]
    elif config == "generators/ood_gan.yaml":  # the GAN of an OOD image folder: here the tiny ImageNet's val/
        args += ["--trainer.enable_progress_bar=false", "--model.init_args.base_width=8", "--trainer.logger=false",
                 f"--data.init_args.ood={tiny_imagenet / 'val'}", "--data.init_args.num_workers=0"]
    elif config.startswith("generators/fashion"):
        args += [*DEMO_FAST, *GENERATOR_FAST, f"--model.init_args.ensemble={members_file}",
                 "--model.init_args.allow_weak_ensemble=true"]  # members of 2 steps: below any quality bar
    elif config.startswith("generators/imagenet"):
        # the P1 members would be ImageNet classifiers: the ensemble term is checked by the Fashion configs
        args += [*imagenet_overrides(tiny_imagenet, tmp_path / "protocols"), *GENERATOR_FAST,
                 "--model.init_args.ensemble=null", "--model.init_args.lambda_semantic=0", "--trainer.devices=1",
                 "--trainer.strategy=auto", "--data.init_args.resize_size=72", "--data.init_args.crop_size=64",
                 "--model.init_args.image_size=64"]  # the smallest size of the ResNet (SNGAN) pair
    else:
        args += imagenet_overrides(tiny_imagenet, tmp_path / "protocols")
    if config == "protocol/folders.yaml":  # the tiny ImageNet's class folders as a user's own: P2's roles
        p2 = imagenet_protocol(2)
        args += [f"--data.init_args.known=[{','.join(p2.known)}]", f"--data.init_args.negative=[{','.join(p2.negative)}]",
                 f"--data.init_args.unknown=[{','.join(p2.unknown)}]"]
    if config.startswith("severity/"):
        args += ["--model.init_args.backbone=small_cnn", "--data.init_args.resize_size=36",
                 "--data.init_args.crop_size=32"]
    if config == "ensemble/imagenet_p1.yaml":  # 8 GPUs in the config; one CPU process here
        args += ["--trainer.devices=1"]
    if config == "trainer/gpu.yaml":  # keep its DDP strategy and bf16 precision, on one CPU process
        args += ["--trainer.devices=1"]
    cli = train.main(args)
    model, data = cli.model, cli.datamodule
    if config == "generators/ood_gan.yaml":
        assert cli.trainer.state.finished and cli.trainer.global_step == 2 and model.num_classes == 0
        assert data.train_set[0].image.shape == (3, 64, 64) and len(data.train_set) == len(list((tiny_imagenet / "val")
                                                                                                .rglob("*.JPEG")))
        return
    if config == "generators/digits_gan.yaml":  # EvG's GAN-latent variation model: the plain GAN on the OOD set
        metrics = set(cli.trainer.callback_metrics)
        assert cli.trainer.state.finished and cli.trainer.global_step == 2 and type(model).__name__ == "NearOODGenerator"
        assert (model.lambda_perceptual, model.lambda_semantic) == (0.0, 0.0)
        assert model.ensemble is None and model.perceptual is None and model.num_classes == 0
        assert {"train/d_loss", "train/g_adversarial", "train/g_loss"} <= metrics and "train/lpips" not in metrics
        assert len(data.train_set) == 1797 and data.train_set[0].image.shape == (1, 32, 32)
        assert float(data.train_set[0].image.max()) <= 1.0 and int(data.train_set[0].target) == -2
        return
    if config.startswith("generators/"):  # one discriminator and one generator step, every loss term logged
        assert cli.trainer.state.finished and cli.trainer.global_step == 2
        assert {"train/d_loss", "train/g_adversarial", "train/lpips", "train/g_loss"} <= set(cli.trainer.callback_metrics)
        assert type(model).__name__ == ("ShiftGenerator" if "shift" in config else "NearOODGenerator")
        assert data.train_negatives == "exclude" and model.hparams.get("conditional_classes", 0) == 0
        if "fashion" in config:
            assert "train/mi" in cli.trainer.callback_metrics and model.ensemble.num_members == 2
        return
    assert cli.trainer.state.finished and cli.trainer.global_step == 1
    assert model.num_classes == data.num_classes
    assert data.train_negatives == model.train_negatives  # linked from the loss
    loss = model.loss_name
    assert data.train_negatives == {"softmax": "exclude", "bg": "background", "eos": "include"}[loss]
    assert model.network.logits.out_features == data.num_classes + (loss == "bg")
    if loss == "bg":  # BG weights from the training counts: 4 per known class, 4 x 31 negatives
        torch.testing.assert_close(model.criterion.weight, torch.tensor([(4 * 61) / (c * 31) for c in [4] * 30 + [124]]))
    assert "val/gamma" in cli.trainer.callback_metrics
    if config.startswith("severity/"):
        severity = next(c for c in cli.trainer.callbacks if type(c).__name__ == "SeverityAUROC")
        protocol = imagenet_protocol(int(Path(config).stem[1]))
        assert severity.data.group_size == len(protocol.known) and severity.data.ood_classes == protocol.unknown
        assert {"val/severity/softmax/mean_auroc", "val/severity/entropy/hardest_auroc"} <= set(cli.trainer.callback_metrics)


def test_test_subcommand_writes_report(tiny_imagenet, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["test", *config_args(composition("loss/bg.yaml")), "--trainer.accelerator=cpu", "--trainer.logger=false",
            "--model.init_args.backbone=small_cnn", "--data.init_args.resize_size=36", "--data.init_args.crop_size=32",
            "--trainer.enable_progress_bar=false", *imagenet_overrides(tiny_imagenet, tmp_path / "protocols")]
    cli = train.main(args)
    metrics = cli.trainer.callback_metrics
    assert {"test/unknowns/ccr@fpr=1", "test/negatives/auroc", "test/closed_set_accuracy"} <= set(metrics)
    evaluation = next(c for c in cli.trainer.callbacks if type(c).__name__ == "OpenSetEvaluation")
    assert evaluation.report["counts"] == {"known": 60, "negatives": 62, "unknowns": 110, "skipped_images": 0}
    assert json.loads((evaluation.report_path / "metrics.json").read_text())["scalars"] == pytest.approx(
        {k.removeprefix("test/"): v.item() for k, v in metrics.items() if k.startswith("test/")}
    )


def folders_args(root: Path, protocol_dir: Path, *extra: str) -> list[str]:
    """``train.py fit`` of the class folders config on ``root`` (a small CNN at 32 px, one CPU process)."""
    return ["fit", *config_args(["trainer/default.yaml", "protocol/folders.yaml", "loss/eos.yaml"]),
            "--model.class_path=lightning_modules.OpenSetClassifier", "--model.init_args.backbone=small_cnn",
            f"--data.init_args.root={root}", f"--data.init_args.protocol_dir={protocol_dir}",
            "--data.init_args.num_workers=0", "--data.init_args.resize_size=36", "--data.init_args.crop_size=32",
            "--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.max_epochs=1",
            "--trainer.enable_progress_bar=false", *extra]


def test_class_folders_bad_input_is_a_clear_error(tmp_path, monkeypatch):
    """One known class: the classes found, not jsonargparse's union traceback; a class of text files: the
    folder and its ignored files, not a training on 0 images (also under on_bad_image: skip)."""
    from tests.conftest import make_imagenet_folder

    monkeypatch.chdir(tmp_path)
    one = make_imagenet_folder(tmp_path / "one", ["cat", "fox", "owl"], train=5, val=2)
    with pytest.raises(SystemExit, match=r"^train\.py fit: class folders .*one: an open-set protocol needs at least 2 "
                                         r"known classes, found 1: \['cat'\] .*negative \['fox'\], unknown \['owl'\]\)$"):
        train.run(folders_args(one, tmp_path / "csv", "--data.init_args.negative=[fox]", "--data.init_args.unknown=[owl]"))
    text = make_imagenet_folder(tmp_path / "text", ["cat", "dog", "fox"], train=5, val=2)
    for path in (text / "train" / "dog").iterdir():
        path.rename(path.with_suffix(".txt"))
    with pytest.warns(UserWarning, match="ignored 5 files"), \
            pytest.raises(SystemExit, match=r"^train\.py fit: 1 class folders under .*text hold fewer than 2 images .*"
                                            r"train/dog \(0 images; 5 other files ignored: dog_1\.txt"):
        train.run(folders_args(text, tmp_path / "csv", "--data.init_args.negative=[fox]",
                               "--data.init_args.on_bad_image=skip"))
    assert not list(tmp_path.rglob("*.ckpt")) and not (tmp_path / "csv").exists()


def test_resume_continues_the_same_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["fit", "--config", str(CONFIGS / "demo/fashion_mnist_eos.yaml"), *DEMO_FAST]
    first = train.main([*base, "--trainer.max_epochs=1"])
    steps_per_epoch = first.trainer.global_step
    wandb.finish()  # the process of a real run ends here
    last = tmp_path / "runs/demo/checkpoints/last.ckpt"
    after_first = torch.load(last, weights_only=False)
    run_id = after_first["logger_version"]
    assert isinstance(run_id, str) and steps_per_epoch == 2  # 224 training images, batch 128
    assert after_first["global_step"] == 2
    second = train.main([*base, "--trainer.max_epochs=2", f"--ckpt_path={last}",
                         "--trainer.callbacks+=tests.test_train.BatchCounter"])
    counter = next(c for c in second.trainer.callbacks if isinstance(c, BatchCounter))
    assert counter.batches == steps_per_epoch  # one more epoch, not two from scratch
    assert second.trainer.global_step == 2 * steps_per_epoch
    assert second.trainer.current_epoch == 2
    resumed = torch.load(last, weights_only=False)
    assert resumed["global_step"] == 4
    assert resumed["logger_version"] == run_id
    assert second.trainer.logger.version == run_id
    runs = sorted(p.name for p in (tmp_path / "runs/demo/wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(run_id) for r in runs)


def test_the_environments_wandb_mode_decides_over_a_configs_offline(tmp_path, monkeypatch):
    """WANDB_MODE=disabled (or online) in the environment wins over the configs' ``offline: true`` (Lightning's
    offline logger would set WANDB_MODE to dryrun); ``offline`` given on the command line wins over both."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pl.Trainer, "fit", lambda self, *args, **kwargs: None)  # the logger as built, no run
    base = ["fit", "--config", str(CONFIGS / "demo/fashion_mnist_eos.yaml")]
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert train.main(base).trainer.logger._offline is False  # wandb.init reads WANDB_MODE=disabled itself
    assert train.main([*base, "--trainer.logger.init_args.offline=true"]).trainer.logger._offline is True
    for environment, offline in (("online", False), ("run", False), ("offline", True), ("dryrun", True)):
        monkeypatch.setenv("WANDB_MODE", environment)
        loggers = [{"class_path": "pytorch_lightning.loggers.WandbLogger", "init_args": {"offline": True}}]
        train.follow_wandb_environment(loggers, [])
        assert loggers[0]["init_args"]["offline"] is offline, environment
    monkeypatch.delenv("WANDB_MODE")
    loggers = [{"class_path": "pytorch_lightning.loggers.WandbLogger", "init_args": {"offline": True}}]
    train.follow_wandb_environment(loggers, [])
    assert loggers[0]["init_args"]["offline"] is True  # no environment: the config's


class BatchCounter(pl.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.batches += 1


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = child_env(WANDB_MODE="offline", WANDB_SILENT="true")
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise AssertionError(f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


@pytest.mark.ddp
def test_ddp_two_processes_equal_one_process(tmp_path, monkeypatch):
    """Train with 2 gloo processes: gamma from 2 processes equals gamma of 1 process (the open-set report of
    the checkpoint on 2 processes: tests/test_ddp.py).

    The claim is about the metric (per-sample values gathered, the sampler's padding dropped), so both runs
    give every image the same arithmetic: one image per batch and one thread per process. With batches, the
    2 processes' shards put other images together through the convolutions than 1 process does, and their
    float32 outputs may then differ in the last bits on some CPUs (oneDNN's blocking, the vector width)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the training processes' threads (child_env passes it on)
    config = str(CONFIGS / "demo/fashion_mnist_eos.yaml")
    small = ["--data.init_args.max_train_per_class=60", "--trainer.max_epochs=1", "--trainer.logger=false",
             "--trainer.enable_progress_bar=false", "--data.init_args.batch_size=1"]
    run_script(str(ROOT / "train.py"), "fit", "--config", config, *small, "--trainer.devices=2",
               "--trainer.strategy=ddp", cwd=tmp_path)
    best = tmp_path / "runs/demo/checkpoints/best.ckpt"
    checkpoint = torch.load(best, weights_only=False)
    ddp_gamma = next(v["best_model_score"] for k, v in checkpoint["callbacks"].items() if k.startswith("ModelCheckpoint"))
    # gamma of the validation set: logged by the 2-process training, recomputed by 1 process
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = train.main(["validate", "--config", config, *small, f"--ckpt_path={best}"])
    finally:
        torch.set_num_threads(threads)
    assert single.trainer.callback_metrics["val/gamma"].item() == ddp_gamma.item()


class Killed(Exception):
    pass


class SampleLog(pl.Callback):
    """The dataset indices of every training batch, in order, as (epoch, step, indices); and, with ``stop_at``,
    a kill just after the checkpoint of that global step was written (a run that dies mid-epoch)."""

    last: SampleLog | None = None

    def __init__(self, stop_at: int = -1, record: str | None = None) -> None:
        self.stop_at, self.record = stop_at, record
        self.batches: list[tuple[int, int, list[int]]] = []
        SampleLog.last = self

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.batches.append((trainer.current_epoch, trainer.global_step, batch.indices.tolist()))
        if self.record is not None:  # a process of a DDP run: each rank its own lines, written as they come
            with open(f"{self.record}.rank{trainer.global_rank}.jsonl", "a") as handle:
                handle.write(json.dumps(self.batches[-1]) + "\n")

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.stop_at:
            raise Killed(f"killed before step {self.stop_at + 1}")  # the checkpoints written so far stay


def steps_checkpoint(every: int) -> list[str]:
    return ["--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.every_n_train_steps={every}",
            "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename={step}"]


@pytest.mark.parametrize("stop_at", [pytest.param(3, marks=pytest.mark.slow), pytest.param(6, marks=pytest.mark.slow), 9])
# mid-epoch 0, its last batch, mid-epoch 1 (6 batches an epoch); the default tier runs the last
def test_training_resumes_mid_epoch_from_shards(stop_at, tmp_path, monkeypatch):
    """A run on a shard set killed mid-epoch and resumed from its step checkpoint (``fit --ckpt_path``) trains on
    the samples the uninterrupted run trains on, in the same order: none repeated, none skipped (the
    loader's state, its sampler's permutation and the batches taken, is in the checkpoint), with 2 workers."""
    from datamodules.shards import folder_rows, write_shards
    from tests.conftest import make_imagenet_folder

    monkeypatch.chdir(tmp_path)
    folder = make_imagenet_folder(tmp_path / "folder", ["cat", "dog", "fox", "owl"], train=13, val=2)
    shards = write_shards(folder, folder_rows(folder), tmp_path / "shards", source={"kind": "folder"}, workers=1,
                          part_size=20, log=lambda message: None)

    def fit(name: str, *extra: str) -> list[tuple[int, int, list[int]]]:
        cli = train.main(folders_args(Path(shards.root), tmp_path / "csv", "--data.init_args.negative=[fox]",
                                      "--data.init_args.unknown=[owl]", "--data.init_args.batch_size=6",
                                      "--data.init_args.num_workers=2", "--trainer.max_epochs=2",
                                      f"--checkpoint_dir={tmp_path / name}", *steps_checkpoint(1), *extra))
        assert len(cli.datamodule.train_set) == 31  # cat, dog and fox less the validation images, 6 a batch
        return SampleLog.last.batches

    whole = fit("whole", "--trainer.callbacks+=tests.test_train.SampleLog")
    assert [step for _, step, _ in whole] == list(range(1, 13))
    for epoch in (0, 1):  # each epoch takes every training image once, in its own shuffled order
        taken = [i for e, _, indices in whole if e == epoch for i in indices]
        assert sorted(taken) == list(range(31))
    assert [i for _, _, b in whole[:6] for i in b] != [i for _, _, b in whole[6:] for i in b]
    with pytest.raises(Killed):
        fit("killed", "--trainer.callbacks+=tests.test_train.SampleLog", f"--trainer.callbacks.stop_at={stop_at}")
    assert SampleLog.last.batches == whole[:stop_at]
    resumed = fit("resumed", "--trainer.callbacks+=tests.test_train.SampleLog",
                  f"--ckpt_path={tmp_path / 'killed' / f'step={stop_at}.ckpt'}")
    assert resumed == whole[stop_at:]


@pytest.mark.ddp
def test_two_processes_resume_mid_epoch(tmp_path, monkeypatch):
    """Under DDP (2 gloo processes, DistributedSampler): a run killed mid-epoch and resumed from its step checkpoint
    gives each rank the batches the uninterrupted 2-process run gave it (rank 0's saved loader state restores
    both ranks: the same permutation, the same number of batches taken), and the ranks' shards cover every
    training image once an epoch."""
    from tests.conftest import make_imagenet_folder

    monkeypatch.chdir(tmp_path)
    folder = make_imagenet_folder(tmp_path / "folder", ["cat", "dog", "fox", "owl"], train=13, val=2)

    def fit(name: str, *extra: str, killed: bool = False) -> list[list[tuple[int, int, list[int]]]]:
        command = [sys.executable, str(ROOT / "train.py"), *folders_args(
            folder, tmp_path / "csv", "--data.init_args.negative=[fox]", "--data.init_args.unknown=[owl]",
            "--data.init_args.batch_size=4", "--data.init_args.num_workers=1", "--trainer.max_epochs=2",
            "--trainer.devices=2", "--trainer.strategy=ddp", f"--checkpoint_dir={tmp_path / name}",
            *steps_checkpoint(1), "--trainer.callbacks+=tests.test_train.SampleLog",
            f"--trainer.callbacks.record={tmp_path / name}", *extra)]
        result = subprocess.run(command, cwd=tmp_path, env=child_env(OMP_NUM_THREADS="1"), capture_output=True,
                                text=True, timeout=300)
        assert (result.returncode != 0 and "killed before step" in result.stderr) if killed \
            else result.returncode == 0, result.stderr[-4000:]
        return [[tuple(json.loads(line)) for line in (tmp_path / f"{name}.rank{rank}.jsonl").read_text().splitlines()]
                for rank in (0, 1)]

    whole = fit("whole")
    assert [len(rank) for rank in whole] == [8, 8]  # 31 images over 2 ranks: 16 each (one padded), 4 a batch
    for epoch in (0, 1):
        taken = {i for rank in whole for e, _, indices in rank if e == epoch for i in indices}
        assert taken == set(range(31))
    killed = fit("killed", "--trainer.callbacks.stop_at=6", killed=True)
    assert killed == [rank[:6] for rank in whole]
    resumed = fit("resumed", f"--ckpt_path={tmp_path / 'killed' / 'step=6.ckpt'}")
    assert resumed == [rank[6:] for rank in whole]
