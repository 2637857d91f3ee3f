"""SeverityAUROC: the C-OOD severity benchmark as a callback, on fixed models (evaluate.py) and during training."""

import csv

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from sklearn.metrics import roc_auc_score

import evaluate
from callbacks import SeverityAUROC
from datamodules import FashionMNISTOpenSetDataModule
from datamodules.severity import FashionSeverityData
from datamodules.transforms import ModelInput, TensorPipeline
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import PredictionCache
from lightning_modules import OpenSetClassifier
from lightning_modules.scoring import ScoringModel
from metrics import KAPPAS, resolve_detector


def small_data(**kwargs) -> FashionSeverityData:
    return FashionSeverityData(estimation=20, test=10, batch_size=500, **kwargs)


def run_severity(scoring, kappas, tmp_path, data=None, precision="32-true", **kwargs) -> SeverityAUROC:
    """What `evaluate.py severity` does: the callback's evaluation of a fixed model, in this process."""
    data = data or small_data()
    callback = SeverityAUROC(data=data, kappas=kappas, every_n_epochs=0, cache_dir=str(tmp_path / "cache"),
                             output_dir=str(tmp_path / "out"), **kwargs)
    callback.evaluate(Runner.local(precision), scoring)
    return callback


@pytest.mark.slow
def test_second_kappa_does_not_run_the_model(demo_checkpoint, tmp_path):
    scoring = ScoringModel(str(demo_checkpoint))
    first = run_severity(scoring, ["softmax"], tmp_path)
    assert first.model_passes == 3  # estimation, test and ID images: one pass each
    batches = scoring.forward_calls
    loads = []
    original = PredictionCache.load

    def counting_load(self, *args, **kwargs):
        loads.append(args[0])
        return original(self, *args, **kwargs)

    PredictionCache.load = counting_load
    try:
        second = run_severity(scoring, ["max_logit", "entropy", "energy"], tmp_path)
    finally:
        PredictionCache.load = original
    assert second.model_passes == 0 and scoring.forward_calls == batches + 1  # + the one-image width probe
    assert len(loads) == 3  # each split is read from disk once, whatever the number of kappas
    assert set(second.tables) == {"max_logit", "entropy", "energy"}
    # a fresh process (a new model object with the same weights) reuses the cache too
    assert run_severity(ScoringModel(str(demo_checkpoint)), ["softmax"], tmp_path).model_passes == 0


# A forward of a whole split at once and the benchmark's batched pass put other images together through the
# network: their float32 logits agree only to the convolutions' rounding, which depends on the CPU's kernels
# (vector width, oneDNN blocking). Numbers derived from the logits (AUROC, accuracy) are therefore recomputed
# from the logits the benchmark itself scored (its cache), where a near-tie cannot flip; the recomputation
# only checks that those are this model's logits of these images, in data set order.
LOGITS_RTOL, LOGITS_ATOL = 1e-4, 1e-5


def _cached_logits(tmp_path, model_name):
    """The logits of each split as the benchmark's pass cached them (``<cache>/<model>-<split>-logits-*.pt``)."""
    found = {}
    for split in ("id_test", "ood_estimation", "ood_test"):
        (path,) = (tmp_path / "cache").glob(f"{model_name}-{split}-logits-*.pt")
        found[split] = torch.load(path, weights_only=True)["tensors"]["logits"]
    return found


def _scores_by_split(scoring, data, transform):
    data.setup()
    out = {}
    for split in ("id_test", "ood_estimation", "ood_test"):
        dataset = data[split].dataset
        images = torch.stack([dataset[i].image for i in range(len(dataset))])
        with torch.no_grad():
            out[split] = transform(scoring.network(images))
    return out


def _expected_aurocs(scores, data, group_size, num_classes):
    est_classes, test_classes = data["ood_estimation"].labels().numpy(), data["ood_test"].labels().numpy()
    class_scores = np.array([scores["ood_estimation"][est_classes == c].mean() for c in range(num_classes)])
    order = np.argsort(class_scores, kind="stable")
    windows = num_classes - group_size + 1
    starts = [int(i * 0.1 * windows) for i in range(11)]
    starts[-1] -= 1
    expected = []
    for start in starts:
        members = np.isin(test_classes, order[start:start + group_size])
        n_id = len(scores["id_test"])
        expected.append(roc_auc_score(np.r_[np.ones(n_id), np.zeros(members.sum())],
                                      np.r_[scores["id_test"], scores["ood_test"][members]]))
    return expected


def test_table_equals_an_independent_computation(demo_checkpoint, tmp_path):
    data = small_data()
    scoring = ScoringModel(str(demo_checkpoint))
    tables = run_severity(scoring, ["entropy"], tmp_path, data=data).tables
    logits = _cached_logits(tmp_path, "demo-best")
    recomputed = _scores_by_split(scoring, data, lambda z: z)
    for split in logits:  # the cache holds this model's logits, in data set order
        torch.testing.assert_close(logits[split], recomputed[split], rtol=LOGITS_RTOL, atol=LOGITS_ATOL)
    # grouping and AUROC recomputed here from the paper's procedure (numpy, scikit-learn), from the kappa of
    # the float32 logits the benchmark scored (the kappa itself is tested against numpy in
    # tests/metrics/detectors/test_confidence.py)
    scores = {s: KAPPAS["entropy"](z).double().numpy() for s, z in logits.items()}
    expected = _expected_aurocs(scores, data, group_size=4, num_classes=16)
    rows = list(csv.DictReader(open(tmp_path / "out" / "demo-best_entropy_n11.csv")))
    assert [int(r["severity level"]) for r in rows] == list(range(11))
    np.testing.assert_allclose([float(r["ood-auroc"]) for r in rows], expected, atol=1e-12)
    correct = logits["id_test"].argmax(1).numpy() == data["id_test"].labels().numpy()
    assert float(rows[0]["id-acc"]) == pytest.approx(correct.mean())
    assert tables["entropy"][0]["model name - confidence function"] == "demo-best-entropy"


def test_background_class_model_keeps_its_rejection_signal(bg_checkpoint, tmp_path):
    """Softmax over K+1 and the background column dropped afterwards (DESIGN §3), as OSCR does."""
    data = small_data()
    scoring = ScoringModel(str(bg_checkpoint))
    assert scoring.background_class
    tables = run_severity(scoring, ["softmax"], tmp_path, data=data).tables
    logits = _cached_logits(tmp_path, "bg-best")  # what the benchmark scored (see LOGITS_RTOL)
    recomputed = _scores_by_split(scoring, data, lambda z: z)
    for split in logits:
        torch.testing.assert_close(logits[split], recomputed[split], rtol=LOGITS_RTOL, atol=LOGITS_ATOL)
    assert logits["id_test"].shape[1] == 5
    right = {s: torch.softmax(z, 1)[:, :4].max(1).values.double().numpy() for s, z in logits.items()}
    expected = _expected_aurocs(right, data, group_size=4, num_classes=16)
    np.testing.assert_allclose([r["ood-auroc"] for r in tables["softmax"]], expected, atol=1e-12)
    # the old, wrong way (background logit dropped before the softmax) gives other numbers
    renormalised = {s: torch.softmax(z[:, :4], 1).max(1).values.double().numpy() for s, z in logits.items()}
    wrong = _expected_aurocs(renormalised, data, group_size=4, num_classes=16)
    assert not np.allclose(expected, wrong, atol=1e-3)
    # ID accuracy: argmax over the known classes only
    known_correct = logits["id_test"][:, :4].argmax(1).numpy() == data["id_test"].labels().numpy()
    assert tables["softmax"][0]["id-acc"] == pytest.approx(known_correct.mean())


def test_a_model_of_other_classes_or_another_width_is_refused(demo_checkpoint, tmp_path):
    three_known = small_data(known=[0, 1, 7], negative=[2, 3])
    with pytest.raises(ValueError, match=r"trained on other classes .* only in the model \(Bag\)"):
        run_severity(ScoringModel(str(demo_checkpoint)), ["softmax"], tmp_path, data=three_known)
    # a module whose classes are not known: its logit count is checked, from one image, before any pass
    network = ScoringModel(str(demo_checkpoint)).network
    unnamed = ScoringModel(network, model_input=ModelInput(TensorPipeline(28, 1)), name="unnamed")
    with pytest.raises(ValueError, match="outputs 4 logits but the severity data has 3 ID classes"):
        run_severity(unnamed, ["softmax"], tmp_path, data=three_known)
    assert unnamed.forward_calls == 1


def test_more_levels_than_windows_are_refused_before_any_pass(demo_checkpoint, tmp_path):
    # the demo's pool: 6 unknown Fashion classes and 10 digits (M = 16), G = 4 ID classes: 13 distinct windows
    data = small_data()
    data.setup()
    windows = len(data.ood_classes) - len(data.classes) + 1
    scoring = ScoringModel(str(demo_checkpoint))
    with pytest.raises(ValueError, match=rf"num_levels = {windows + 1} asks for more severity levels than "
                                         rf"FashionSeverityData has distinct ones: M − G \+ 1 = 16 − 4 \+ 1 = 13 windows .* "
                                         rf"1 level would repeat a window; give num_levels \(--num-levels\) 13 or fewer"):
        run_severity(scoring, ["softmax"], tmp_path, data=data, num_levels=windows + 1)
    assert scoring.forward_calls == 0 and not (tmp_path / "cache").exists()  # no pass, not even the width check
    # the command refuses it as well, before its passes
    with pytest.raises(SystemExit, match=r"num_levels = 1000 asks for more severity levels .* 13 windows"):
        evaluate.main(["severity", "--model", str(demo_checkpoint), "--data", "fashion", "--num-levels", "1000",
                       "--data-arg", "estimation=20", "--data-arg", "test=10", "--cache-dir", str(tmp_path / "cache"),
                       "--output-dir", str(tmp_path / "out"), "--wandb-mode", "disabled"])
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_corrupted_or_mismatched_cache_is_rejected(demo_checkpoint, tmp_path):
    scoring = ScoringModel(str(demo_checkpoint))
    reference = run_severity(scoring, ["softmax"], tmp_path).tables["softmax"]
    cache_files = sorted((tmp_path / "cache").glob("*.pt"))
    assert len(cache_files) == 3
    id_file = next(f for f in cache_files if "-id_test-" in f.name)
    payload = torch.load(id_file, weights_only=True)
    id_file.write_bytes(id_file.read_bytes()[:100])  # truncated
    with pytest.warns(RuntimeWarning, match="rejecting prediction cache .*unreadable"):
        again = run_severity(scoring, ["softmax"], tmp_path)
    assert again.tables["softmax"] == reference and again.model_passes == 1
    # a file under the expected name but with another key (written for other data/model) is rejected too
    torch.save({**payload, "key": "0" * 64}, id_file)
    with pytest.warns(RuntimeWarning, match="key does not match"):
        assert run_severity(scoring, ["softmax"], tmp_path).model_passes == 1
    # payloads of the wrong type: not a dict, tensors not a dict, entries not tensors
    cache = PredictionCache(tmp_path / "cache")
    name, key = id_file.name.rsplit("-", 1)[0], torch.load(id_file, weights_only=True)["key"]
    assert cache.load(name, key, rows=4000) is not None
    for bad, message in ((torch.zeros(3), "holds a Tensor"), ({"key": key, "tensors": [1, 2]}, "not a dict of tensors"),
                         ({"key": key, "tensors": {"targets": torch.zeros(4000), "logits": 3}}, "not per-sample")):
        torch.save(bad, id_file)
        with pytest.warns(RuntimeWarning, match=message):
            assert cache.load(name, key, rows=4000) is None
    torch.save(payload, id_file)
    with pytest.warns(RuntimeWarning, match="expected 10 rows"):
        assert cache.load(name, key, rows=10) is None


@pytest.mark.slow
def test_other_weights_precision_or_kappa_arguments_do_not_reuse_the_cache(demo_checkpoint, tmp_path):
    first = ScoringModel(str(demo_checkpoint))
    run_severity(first, ["softmax", "odin"], tmp_path)
    changed = ScoringModel(str(demo_checkpoint))
    with torch.no_grad():
        changed.network.network.logits.weight.mul_(1.01)
    assert run_severity(changed, ["softmax"], tmp_path).model_passes == 3
    assert run_severity(first, ["softmax"], tmp_path, precision="bf16-mixed").model_passes == 3
    # ODIN with another temperature: its own passes again, the logits still cached
    again = run_severity(first, ["odin"], tmp_path, kappa_args={"odin": {"temperature": 1000.0}})
    assert again.model_passes == 3
    assert run_severity(first, ["odin"], tmp_path, kappa_args={"odin": {"temperature": 1000.0}}).model_passes == 0
    with pytest.raises(ValueError, match="has no hyperparameter 'temprature'"):
        SeverityAUROC(kappas=["odin"], kappa_args={"odin": {"temprature": 3}})


@pytest.mark.slow
def test_model_based_kappas_run_in_inference_mode_and_are_cached(demo_checkpoint, tmp_path):
    scoring = ScoringModel(str(demo_checkpoint))
    run = run_severity(scoring, ["odin", "softmax"], tmp_path)  # trainer.test uses inference mode: ODIN still runs
    assert run.model_passes == 6  # logits + ODIN scores, 3 splits each
    assert all(0 <= r["ood-auroc"] <= 1 for r in run.tables["odin"])
    assert run.tables["odin"] != run.tables["softmax"]
    rerun = run_severity(scoring, ["odin"], tmp_path)
    assert rerun.tables["odin"] == run.tables["odin"] and rerun.model_passes == 0


@pytest.mark.slow
def test_every_kappa_runs_through_the_benchmark(demo_checkpoint, tmp_path):
    # mc_dropout needs dropout: the demo CNN has none, so it must say so clearly
    # she and openmax need every class predicted correctly at least once on the fit set (ghost: twice), which 5
    # training steps do not give (each refuses such a fit, naming the class: their own tests)
    names = [n for n in KAPPAS if n not in ("mc_dropout", "she", "ghost", "openmax")
             and resolve_detector(n).kind != "ensemble"]
    # the fitted detectors fit on the checkpoint's own training split, which the model brings (knn_imagenet's and
    # nnguide's 1% of its images would be one image: k = 10 is refused, so they get a cap of their own); NAC's
    # default layers are a ResNet's, the demo CNN's are its blocks' activations and its pooling
    assert set(run_severity(ScoringModel(str(demo_checkpoint)), names, tmp_path,
                            fit={"knn_imagenet": {"per_class": 20}, "nnguide": {"per_class": 20}},
                            kappa_args={"nac": {"layers": "features.11,features.6,features.2", "alpha": 100.0,
                                                "bins": 50, "o_star": 5}}).tables) == set(names)
    with pytest.raises(ValueError, match="no dropout"):
        run_severity(ScoringModel(str(demo_checkpoint)), ["mc_dropout"], tmp_path)
    with pytest.raises(ValueError, match="needs an ensemble"):
        run_severity(ScoringModel(str(demo_checkpoint)), ["ensemble_mi"], tmp_path)


def test_levels_table_marks_training_negatives(demo_checkpoint, tmp_path):
    run_severity(ScoringModel(str(demo_checkpoint)), ["softmax"], tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "out" / "levels_demo-best_softmax.csv")))
    roles = {r["class"]: r["seen in training"] for r in rows}
    assert {c for c, role in roles.items() if role == "as a negative"} <= {
        "fashion: Pullover", "fashion: Dress", "fashion: Sandal"}
    assert roles.get("fashion: Coat", "no") == "no" and roles.get("digit 3", "no") == "no"
    assert len(rows) == 11 * 4


def test_during_training_every_epoch_with_nothing_cached_across_epochs(tmp_path):
    pl.seed_everything(0)
    data = FashionMNISTOpenSetDataModule(max_train_per_class=40, batch_size=64)
    model = OpenSetClassifier(num_classes=4, loss="eos", backbone="small_cnn", in_channels=1)
    severity = SeverityAUROC(kappas=["softmax", "entropy"], every_n_epochs=1, cache_dir=str(tmp_path / "cache"),
                             data_args={"estimation": 20, "test": 10})
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/severity/softmax/mean_auroc",
                                              mode="max", filename="best")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, callbacks=[severity, checkpoint],
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=data)
    assert severity.model_passes == 6  # 3 splits x 2 epochs: the weights changed, so the cache never hits
    history = list(csv.DictReader(open(tmp_path / "ckpt" / "severity-val" / "history.csv")))
    assert len(history) == 2 * 2 * 11
    means = {e: np.mean([float(h["ood-auroc"]) for h in history if h["epoch"] == str(e)
                         and h["confidence function"] == "softmax"]) for e in (0, 1)}
    assert trainer.callback_metrics["val/severity/softmax/mean_auroc"].item() == pytest.approx(means[1], abs=1e-6)
    hardest = [float(h["ood-auroc"]) for h in history if h["epoch"] == "1" and h["confidence function"] == "entropy"][-1]
    assert trainer.callback_metrics["val/severity/entropy/hardest_auroc"].item() == pytest.approx(hardest, abs=1e-6)
    assert checkpoint.best_model_score.item() == pytest.approx(max(means.values()), abs=1e-6)
    assert (tmp_path / "ckpt" / "severity-val" / "auroc_by_level_softmax.png").is_file()
    # the pool of a model trained on the demo: its negatives marked, official test images only
    assert severity.data.ood_class_role(0) == "as a negative" and severity.data.known == [0, 1, 7, 8]


def test_a_resumed_run_continues_one_history(tmp_path):
    """``fit --ckpt_path last.ckpt`` continues the severity history (file and W&B chart), in the same folder."""

    def fit(epochs: int, resume=None) -> SeverityAUROC:
        pl.seed_everything(0)
        severity = SeverityAUROC(kappas=["softmax"], every_n_epochs=1, data_args={"estimation": 5, "test": 5},
                                 plots=False)
        checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                             callbacks=[severity, checkpoint], enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0)
        trainer.fit(OpenSetClassifier(num_classes=4, loss="eos", backbone="small_cnn", in_channels=1),
                    datamodule=FashionMNISTOpenSetDataModule(max_train_per_class=20, batch_size=64), ckpt_path=resume)
        return severity

    first = fit(1)
    assert [h["epoch"] for h in first.history] == [0] * 11
    resumed = fit(2, resume=tmp_path / "ckpt" / "last.ckpt")
    assert sorted({h["epoch"] for h in resumed.history}) == [0, 1]
    assert resumed.history[:11] == first.history  # the first epoch's levels, as they were
    assert list(resumed._runs("softmax")) == ["epoch 0", "epoch 1"]  # the W&B chart's lines
    written = list(csv.DictReader(open(tmp_path / "ckpt" / "severity-val" / "history.csv")))
    assert sorted({int(row["epoch"]) for row in written}) == [0, 1] and len(written) == 22
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.ckpt", "severity-val"]  # one folder


def test_intervals_resample_the_pool_classes_by_identity(demo_checkpoint, tmp_path):
    """Every level of every κ reads one draw of the pool's classes, keyed by pool index (the bug: each level drew
    its own classes by their sorted position, so a class had other weights in two rows' levels)."""
    from evaluation_engine.intervals import Intervals
    from evaluation_engine.outputs import read_replicates
    from metrics import cluster_weights, resample_weights, severity_levels, weighted_auroc
    from metrics.severity import class_mean_scores

    data = small_data()
    callback = run_severity(ScoringModel(str(demo_checkpoint)), ["softmax", "entropy"], tmp_path, data=data,
                            intervals=Intervals(resamples=300, seed=2))
    logits = _cached_logits(tmp_path, "demo-best")
    replicates = read_replicates(tmp_path / "out")
    test_classes = data["ood_test"].labels()
    id_weights = resample_weights(len(logits["id_test"]), 300, 2, stratum=0)
    class_weights = cluster_weights(test_classes, 300, 2, stratum=1, num_units=16)
    assert torch.equal(class_weights, resample_weights(16, 300, 2, stratum=1)[:, test_classes])
    groups_of = {}
    for kappa in ("softmax", "entropy"):
        scores = {s: KAPPAS[kappa](z) for s, z in logits.items()}
        estimation = class_mean_scores(scores["ood_estimation"], data["ood_estimation"].labels(), 16)
        groups, _ = severity_levels(estimation, 4, 11)
        groups_of[kappa] = groups
        rows = list(csv.DictReader(open(tmp_path / "out" / f"demo-best_{kappa}_n11.csv")))
        per_level = []
        for level, group in enumerate(groups):
            members = torch.isin(test_classes, group)
            expected = weighted_auroc(scores["id_test"], scores["ood_test"][members], id_weights,
                                      class_weights[:, members])
            found = replicates[f"{kappa}/level_{level:02d}"]
            assert torch.equal(torch.isnan(found), torch.isnan(expected))
            torch.testing.assert_close(found[~torch.isnan(found)], expected[~torch.isnan(expected)], rtol=0, atol=0)
            assert int(rows[level]["empty resamples"]) == int(torch.isnan(expected).sum())
            per_level.append(expected)
        mean = torch.stack(per_level).mean(dim=0)
        summary = next(r for r in callback.summary if r["confidence function"] == kappa)
        assert summary["empty resamples"] == int(torch.isnan(mean).sum())
        assert (summary["mean auroc low"], summary["mean auroc high"]) == pytest.approx(
            tuple(np.quantile(mean[~torch.isnan(mean)].numpy(), [0.025, 0.975])), abs=1e-12)
    # the levels of the two κ differ, and both were read from the one class draw above
    assert any(not torch.equal(a, b) for a, b in zip(groups_of["softmax"], groups_of["entropy"], strict=True))


def test_mc_dropout_on_a_checkpoint_without_dropout_is_refused_before_any_pass(demo_checkpoint, tmp_path):
    """MC dropout on the demo checkpoint (no dropout layer): refused when the benchmark starts, before the logits
    passes of the other κ, with the advice for a checkpoint (not --model-arg, which checkpoints refuse)."""
    scoring = ScoringModel(str(demo_checkpoint))
    with pytest.raises(ValueError, match=r"has no dropout with p > 0, so MC dropout would equal the plain entropy: a "
                                         r"checkpoint's network is the one it trained"):
        run_severity(scoring, ["softmax", "mc_dropout"], tmp_path)
    assert scoring.forward_calls == 0 and not (tmp_path / "cache").exists()


def test_data_or_data_args_is_checked_when_built_and_a_second_setup_keeps_the_data():
    """``data`` and ``data_args`` together are refused when the callback is built; data built from the training
    datamodule's ``severity_data(**data_args)`` are kept by a second set-up (``trainer.fit`` then
    ``trainer.test`` of one callback), not refused as if the user had given both."""
    with pytest.raises(ValueError, match="give either `data` or `data_args`"):
        SeverityAUROC(data=small_data(), data_args={"estimation": 20})
    callback = SeverityAUROC(data_args={"estimation": 20, "test": 10}, kappas=["softmax"], every_n_epochs=0)
    datamodule = FashionMNISTOpenSetDataModule(max_train_per_class=10, batch_size=16)
    model = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1)
    callback.prepare(model, datamodule)
    data = callback.data
    assert len(data["ood_estimation"]) == 20 * len(data.ood_classes)
    callback.prepare(model, datamodule)
    assert callback.data is data
