import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from sklearn.metrics import roc_auc_score

from callbacks.prediction_cache import PredictionCache, PredictionCollector
from callbacks.severity_benchmark import SeverityBenchmark
from datamodules.severity import FashionSeverityDataModule
from lightning_modules.scoring import ScoringModel
from metrics import KAPPAS
from tests.conftest import ROOT


def small_data() -> FashionSeverityDataModule:
    return FashionSeverityDataModule(estimation=20, test=10, batch_size=64)


def make_trainer(inference_mode: bool = True) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[PredictionCollector()],
                      inference_mode=inference_mode, enable_progress_bar=False, enable_model_summary=False)


def benchmark(scoring, kappas, tmp_path, inference_mode=True, data=None):
    return SeverityBenchmark(scoring, data or small_data(), kappas, make_trainer(inference_mode),
                             cache_dir=tmp_path / "cache", output_dir=tmp_path / "out")


def test_second_kappa_does_not_run_the_model(demo_checkpoint, tmp_path):
    scoring = ScoringModel(str(demo_checkpoint))
    first = benchmark(scoring, ["softmax"], tmp_path)
    first.run()
    assert first.model_calls == 3  # estimation, test and ID images: one pass each
    batches = scoring.forward_calls
    second = benchmark(scoring, ["max_logit", "entropy", "energy"], tmp_path)
    loads = []
    load = second.cache.load
    second.cache.load = lambda *args, **kwargs: loads.append(args[0]) or load(*args, **kwargs)
    tables = second.run()
    assert second.model_calls == 0 and scoring.forward_calls == batches
    assert len(loads) == 3  # each split is read from disk once, whatever the number of kappas
    assert set(tables) == {"max_logit", "entropy", "energy"}
    # a fresh process (a new model object with the same weights) reuses the cache too
    third = benchmark(ScoringModel(str(demo_checkpoint)), ["softmax"], tmp_path)
    third.run()
    assert third.model_calls == 0


def test_table_equals_an_independent_computation(demo_checkpoint, tmp_path):
    data = small_data()
    scoring = ScoringModel(str(demo_checkpoint))
    tables = benchmark(scoring, ["entropy"], tmp_path, data=data).run()
    data.setup()
    cached = {}
    for split in ("id", "ood_estimation", "ood_test"):
        images = torch.stack([data.dataset(split)[i].image for i in range(len(data.dataset(split)))])
        with torch.no_grad():
            direct = scoring(images)
        cached[split] = torch.load(next((tmp_path / "cache").glob(f"demo-best-{split}-*.pt")), weights_only=True)["tensors"]
        torch.testing.assert_close(cached[split]["logits"], direct)  # the cache holds this model's logits
    # grouping and AUROC recomputed here from the cached logits' kappa, written out from the paper
    kappa = {split: KAPPAS["entropy"](c["logits"]).double().numpy() for split, c in cached.items()}
    logits = {split: c["logits"] for split, c in cached.items()}
    est_classes, test_classes = data.targets("ood_estimation").numpy(), data.targets("ood_test").numpy()
    class_scores = np.array([kappa["ood_estimation"][est_classes == c].mean() for c in range(16)])
    order = np.argsort(class_scores, kind="stable")
    starts = [int(i * 0.1 * 13) for i in range(11)]
    starts[-1] -= 1
    rows = list(csv.DictReader(open(tmp_path / "out" / "demo-best_entropy_n11.csv")))
    assert [int(r["severity level"]) for r in rows] == list(range(11))
    for row, start in zip(rows, starts, strict=True):
        members = np.isin(test_classes, order[start:start + 4])
        expected = roc_auc_score(np.r_[np.ones(4000), np.zeros(members.sum())],
                                 np.r_[kappa["id"], kappa["ood_test"][members]])
        assert float(row["ood-auroc"]) == pytest.approx(expected, abs=1e-12)
    correct = logits["id"].argmax(1).numpy() == data.targets("id").numpy()
    assert float(rows[0]["id-acc"]) == pytest.approx(correct.mean())
    assert tables["entropy"][0]["model name - confidence function"] == "demo-best-entropy"


def test_corrupted_or_mismatched_cache_is_rejected(demo_checkpoint, tmp_path):
    scoring = ScoringModel(str(demo_checkpoint))
    reference = benchmark(scoring, ["softmax"], tmp_path).run()["softmax"]
    cache_files = sorted((tmp_path / "cache").glob("*.pt"))
    assert len(cache_files) == 3
    id_file = next(f for f in cache_files if "-id-" in f.name)
    id_file.write_bytes(id_file.read_bytes()[:100])  # truncated
    again = benchmark(scoring, ["softmax"], tmp_path)
    with pytest.warns(RuntimeWarning, match="rejecting prediction cache .*unreadable"):
        assert again.run()["softmax"] == reference
    assert again.model_calls == 1
    # a file under the expected name but with another key (written for other data/model) is rejected too
    payload = torch.load(id_file, weights_only=True)
    payload["key"] = "0" * 64
    torch.save(payload, id_file)
    third = benchmark(scoring, ["softmax"], tmp_path)
    with pytest.warns(RuntimeWarning, match="key does not match"):
        third.run()
    assert third.model_calls == 1
    # wrong number of rows
    cache = PredictionCache(tmp_path / "cache")
    key = torch.load(id_file, weights_only=True)["key"]
    name = id_file.name.rsplit("-", 1)[0]
    assert cache.load(name, key, rows=4000) is not None
    with pytest.warns(RuntimeWarning, match="expected 10 rows"):
        assert cache.load(name, key, rows=10) is None


def test_other_weights_do_not_reuse_the_cache(demo_checkpoint, tmp_path):
    first = ScoringModel(str(demo_checkpoint))
    benchmark(first, ["softmax"], tmp_path).run()
    changed = ScoringModel(str(demo_checkpoint))
    with torch.no_grad():
        changed.network.module.network.logits.weight.mul_(1.01)
    again = benchmark(changed, ["softmax"], tmp_path)
    again.run()
    assert again.model_calls == 3


def test_model_based_kappas_run_and_are_cached(demo_checkpoint, tmp_path):
    scoring = ScoringModel(str(demo_checkpoint))
    with pytest.raises(ValueError, match="inference_mode=False"):
        benchmark(scoring, ["odin"], tmp_path, inference_mode=True)
    run = benchmark(scoring, ["odin", "softmax"], tmp_path, inference_mode=False)
    tables = run.run()
    assert run.model_calls == 6  # logits + ODIN scores, 3 splits each
    assert all(0 <= r["ood-auroc"] <= 1 for r in tables["odin"])
    rerun = benchmark(scoring, ["odin"], tmp_path, inference_mode=False)
    assert rerun.run()["odin"] == tables["odin"] and rerun.model_calls == 0


def test_every_kappa_runs_through_the_benchmark(demo_checkpoint, tmp_path):
    # mc_dropout needs dropout layers: the demo CNN has none, so it must say so clearly
    names = [n for n in KAPPAS if n != "mc_dropout"]
    tables = benchmark(ScoringModel(str(demo_checkpoint)), names, tmp_path, inference_mode=False).run()
    assert set(tables) == set(names)
    with pytest.raises(ValueError, match="no dropout layer"):
        benchmark(ScoringModel(str(demo_checkpoint)), ["mc_dropout"], tmp_path, inference_mode=False).run()


def run_severity(tmp_path, checkpoint, output, devices):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT)
    args = [sys.executable, str(ROOT / "evaluate.py"), "severity", "--model", str(checkpoint), "--data", "fashion",
            "--data-arg", "estimation=20", "--data-arg", "test=10", "--kappa", "softmax", "entropy",
            "--cache-dir", str(tmp_path / f"cache{devices}"), "--output-dir", str(tmp_path / output),
            "--accelerator", "cpu", "--devices", str(devices), "--wandb-mode", "disabled", "--no-progress-bar"]
    if devices > 1:
        args += ["--strategy", "ddp"]
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_ddp_two_processes_give_the_same_table(demo_checkpoint, tmp_path):
    run_severity(tmp_path, demo_checkpoint, "one", 1)
    out = run_severity(tmp_path, demo_checkpoint, "two", 2)
    assert "3 model passes" in out
    for name in ("severity.csv", "demo-best_softmax_n11.csv", "levels_demo-best_entropy.csv"):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()
    # the 2-process cache holds each sample once, in dataset order
    id_cache = next((tmp_path / "cache2").glob("demo-best-id-*.pt"))
    tensors = torch.load(id_cache, weights_only=True)["tensors"]
    assert tensors["logits"].shape == (4000, 4)
    assert json.dumps(tensors["targets"].tolist()) == json.dumps(FashionSeverityDataModule().targets("id").tolist())
