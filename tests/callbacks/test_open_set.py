import csv
import json

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from PIL import Image
from scipy.stats import binomtest
from sklearn.metrics import roc_auc_score
from torch.utils.data import DataLoader, TensorDataset

from callbacks import OpenSetEvaluation
from tests.metrics.reference import (
    authors_ccr_at_fpr_reference,
    ccr_at_fpr_reference,
    gamma_reference,
    oscr_reference,
    random_open_set_data,
)


class FixedProbabilities(pl.LightningModule):
    """Returns a fixed table of probabilities, looked up by dataset index."""

    def __init__(self, probs: torch.Tensor, background: bool) -> None:
        super().__init__()
        self.register_buffer("table", probs)
        self.background_class = background
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def test_step(self, batch, batch_idx):
        indices, targets = batch
        return {"probs": self.table[indices], "targets": targets, "indices": indices}


@pytest.mark.parametrize("background", [False, True])
def test_report_matches_independent_reference(tmp_path, background):
    probs, target = random_open_set_data(np.random.default_rng(4), n=240, k=5, background=background)
    model = FixedProbabilities(torch.from_numpy(probs), background)
    loader = DataLoader(TensorDataset(torch.arange(240), torch.from_numpy(target)), batch_size=32)
    evaluation = OpenSetEvaluation(output_dir=str(tmp_path / "report"))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[evaluation], enable_progress_bar=False)
    logged = trainer.test(model, dataloaders=loader)[0]

    report = json.loads((tmp_path / "report" / "metrics.json").read_text())
    scalars = report["scalars"]
    known_probs = probs[:, :-1] if background else probs
    confidence = known_probs.max(axis=1)
    for group, label in (("negatives", -1), ("unknowns", -2)):
        expected = ccr_at_fpr_reference(probs, target, [1e-3, 1e-2, 1e-1, 1.0], unknown_label=label, background=background)
        got = [scalars[f"{group}/ccr@fpr={t}"] for t in ("0.001", "0.01", "0.1", "1")]
        np.testing.assert_array_equal(got, expected)
        members = (target >= 0) | (target == label)
        sk_auroc = roc_auc_score(target[members] >= 0, confidence[members])
        assert scalars[f"{group}/auroc"] == pytest.approx(sk_auroc, abs=1e-12)
        with open(tmp_path / "report" / f"oscr_{group}.csv") as handle:
            rows = list(csv.DictReader(handle))
        ref_fpr, ref_ccr, _ = oscr_reference(probs, target, unknown_label=label, background=background)
        np.testing.assert_array_equal([float(r["fpr"]) for r in rows], ref_fpr)
        np.testing.assert_array_equal([float(r["ccr"]) for r in rows], ref_ccr)
    known = target >= 0
    correct = int(np.sum(known_probs[known].argmax(1) == target[known]))
    assert scalars["closed_set_accuracy"] == pytest.approx(correct / known.sum())
    # a proportion: Wilson's interval (scipy's), not a percentile bootstrap (zero width when every image is right)
    wilson = binomtest(correct, int(known.sum())).proportion_ci(0.95, method="wilson")
    assert report["intervals"]["closed_set_accuracy"] == pytest.approx([wilson.low, wilson.high], abs=1e-12)
    keep = target >= -1
    assert scalars["gamma"] == pytest.approx(gamma_reference(probs[keep], target[keep], background=background)[2], rel=1e-12)
    assert report["counts"] == {
        "known": int(known.sum()), "negatives": int((target == -1).sum()), "unknowns": int((target == -2).sum()),
        "skipped_images": 0,
    }
    assert report["background_class"] is background
    # the same numbers reach the loggers, and the CSV copy holds them too
    assert logged["test/unknowns/auroc"] == pytest.approx(scalars["unknowns/auroc"])
    with open(tmp_path / "report" / "metrics.csv") as handle:
        csv_rows = {r["metric"]: float(r["value"]) for r in csv.DictReader(handle)}
    assert csv_rows == pytest.approx(scalars)
    for figure in ("oscr_curves.png", "score_histograms.png"):
        with Image.open(tmp_path / "report" / figure) as image:
            assert image.format == "PNG" and image.width > 300
    assert not list((tmp_path / "report").glob(".*tmp"))  # no temporary files left


def test_padding_duplicates_are_not_counted(tmp_path):
    # the same sample seen twice (as DistributedSampler pads) must count once
    probs, target = random_open_set_data(np.random.default_rng(8), n=50, k=3)
    model = FixedProbabilities(torch.from_numpy(probs), False)
    indices = torch.cat([torch.arange(50), torch.tensor([0, 1, 2])])
    loader = DataLoader(TensorDataset(indices, torch.from_numpy(target)[indices]), batch_size=16)
    evaluation = OpenSetEvaluation(output_dir=str(tmp_path), plots=False)
    pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[evaluation], enable_progress_bar=False).test(
        model, dataloaders=loader
    )
    expected = ccr_at_fpr_reference(probs, target, [1e-3, 1e-2, 1e-1, 1.0])
    np.testing.assert_array_equal([evaluation.report["scalars"][f"unknowns/ccr@fpr={t}"] for t in ("0.001", "0.01", "0.1", "1")], expected)
    assert sum(evaluation.report["counts"][k] for k in ("known", "negatives", "unknowns")) == 50


class FixedTraining(FixedProbabilities):
    """FixedProbabilities that can be fitted: a dummy loss, validation returning the table's rows."""

    def training_step(self, batch, batch_idx):
        return (self.anchor ** 2).sum()

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return self.test_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_validation_logs_ccr_and_auroc_every_epoch(tmp_path):
    probs, target = random_open_set_data(np.random.default_rng(2), n=200, k=4)
    target[target == -2] = -1  # a validation split: knowns and negatives
    model = FixedTraining(torch.from_numpy(probs), False)
    loader = DataLoader(TensorDataset(torch.arange(200), torch.from_numpy(target)), batch_size=32)
    evaluation = OpenSetEvaluation(every_n_epochs=1, plot_every_n_epochs=2)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[evaluation], max_epochs=2,
                         default_root_dir=tmp_path, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader)
    expected = ccr_at_fpr_reference(probs, target, [1e-3, 1e-2, 1e-1, 1.0], unknown_label=-1)
    known = target >= 0
    confidence = probs.max(axis=1)
    expected_auroc = roc_auc_score(known, confidence)
    assert [h["epoch"] for h in evaluation.history] == [0, 1]
    for entry in evaluation.history:
        np.testing.assert_array_equal([entry[f"negatives/ccr@fpr={t}"] for t in ("0.001", "0.01", "0.1", "1")], expected)
        assert entry["negatives/auroc"] == pytest.approx(expected_auroc, abs=1e-12)
    logged = trainer.callback_metrics
    assert logged["val/negatives/ccr@fpr=0.1"].item() == pytest.approx(expected[2], abs=1e-7)
    assert "val/gamma" not in logged  # gamma is the model's own metric, not re-logged by the callback
    # the curve image every 2nd epoch only
    assert sorted(p.name for p in (tmp_path / "val-oscr").glob("*.png")) == ["epoch_001.png"]


def test_multiple_test_dataloaders_with_overlapping_indices(tmp_path):
    """Two test sets whose dataset indices overlap get a report each, not one merged by index."""
    probs_a, target_a = random_open_set_data(np.random.default_rng(10), n=90, k=3)
    probs_b, target_b = random_open_set_data(np.random.default_rng(11), n=60, k=3)

    class TwoTables(FixedProbabilities):
        def test_step(self, batch, batch_idx, dataloader_idx=0):
            indices, targets = batch
            table = self.table if dataloader_idx == 0 else self.second
            return {"probs": table[indices], "targets": targets, "indices": indices}

    model = TwoTables(torch.from_numpy(probs_a), False)
    model.register_buffer("second", torch.from_numpy(probs_b))
    loaders = [DataLoader(TensorDataset(torch.arange(n), torch.from_numpy(t)), batch_size=16)
               for n, t in ((90, target_a), (60, target_b))]
    evaluation = OpenSetEvaluation(output_dir=str(tmp_path), plots=False, conventions=("exact", "authors"))
    pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[evaluation], enable_progress_bar=False).test(
        model, dataloaders=loaders)
    for index, (probs, target) in enumerate(((probs_a, target_a), (probs_b, target_b))):
        scalars = evaluation.reports[index]["scalars"]
        expected = ccr_at_fpr_reference(probs, target, [1e-3, 1e-2, 1e-1, 1.0])
        np.testing.assert_array_equal([scalars[f"unknowns/ccr@fpr={t}"] for t in ("0.001", "0.01", "0.1", "1")], expected)
        authors = authors_ccr_at_fpr_reference(probs, target, [1e-3, 1e-2, 1e-1, 1.0])
        np.testing.assert_array_equal([scalars[f"unknowns/authors_ccr@fpr={t}"] for t in ("0.001", "0.01", "0.1", "1")],
                                      authors)
        assert evaluation.reports[index]["counts"]["known"] == int((target >= 0).sum())
    second = json.loads((tmp_path / "dataloader_1" / "metrics.json").read_text())
    assert second["scalars"] == pytest.approx(evaluation.reports[1]["scalars"], nan_ok=True)
    assert second["ccr_conventions"] == ["exact", "authors"]
