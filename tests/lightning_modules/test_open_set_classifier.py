import pytest
import pytorch_lightning as pl
import torch

from datamodules import FashionMNISTOpenSetDataModule
from lightning_modules import OpenSetClassifier
from metrics import gamma


def small_model(loss: str = "eos", **kwargs) -> OpenSetClassifier:
    return OpenSetClassifier(num_classes=4, loss=loss, backbone="small_cnn", in_channels=1, **kwargs)


def trainer(**kwargs) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


# The tests below recompute the validation outputs in one batch of the whole split, the validation loop in
# batches of 16: through a convolution the two agree to float32 rounding only, which depends on the CPU's
# kernels. γ is a mean of probabilities (no near-tie can flip it), so those differences of ~1e-7 per
# probability move it by about as much; a real error (a batch dropped or counted twice, a mean of per-batch
# means, the wrong column) moves it by 1e-3 or more.
GAMMA_TOLERANCE = 1e-5


def test_validation_gamma_equals_the_metric_on_all_outputs():
    torch.manual_seed(0)
    data = FashionMNISTOpenSetDataModule(max_train_per_class=30, batch_size=16)
    model = small_model()
    result = trainer().validate(model, datamodule=data)[0]
    model.eval()
    with torch.no_grad():
        images = torch.stack([data.val_set[i].image for i in range(len(data.val_set))])
        probs = torch.softmax(model(images), dim=1)
    expected = gamma(probs, data.val_set.labels)
    assert result["val/gamma"] == pytest.approx(expected[2].item(), abs=GAMMA_TOLERANCE)
    assert result["val/gamma_plus"] == pytest.approx(expected[0].item(), abs=GAMMA_TOLERANCE)
    assert result["val/gamma_minus"] == pytest.approx(expected[1].item(), abs=GAMMA_TOLERANCE)


@pytest.mark.parametrize(("loss", "negatives"), [("softmax", "include"), ("eos", "exclude"), ("bg", "include")])
def test_loss_and_data_must_agree(loss, negatives):
    data = FashionMNISTOpenSetDataModule(max_train_per_class=10, train_negatives=negatives)
    with pytest.raises(ValueError, match=f"loss '{loss}' needs the datamodule's train_negatives"):
        trainer(fast_dev_run=True).fit(small_model(loss), datamodule=data)


def test_background_weights_come_from_the_training_counts():
    data = FashionMNISTOpenSetDataModule(max_train_per_class=10, train_negatives="background")
    model = small_model("bg")
    trainer(fast_dev_run=True).fit(model, datamodule=data)
    # 8 training images per class (80 %), 24 negatives: w_c = 56 / (N_c * 5)
    torch.testing.assert_close(model.criterion.weight, torch.tensor([56 / 40] * 4 + [56 / 120]))
    restored = OpenSetClassifier(**model.hparams)
    restored.load_state_dict(model.state_dict())
    torch.testing.assert_close(restored.criterion.weight, model.criterion.weight)


def test_training_step_uses_the_eos_loss():
    torch.manual_seed(1)
    model = small_model()
    images, targets = torch.rand(6, 1, 28, 28), torch.tensor([0, 1, 2, 3, -1, -1])
    model.log = lambda *args, **kwargs: None  # no trainer attached
    loss = model.training_step((images, targets), 0)
    logits = model(images)
    log_s = torch.log_softmax(logits, dim=1)
    expected = torch.cat([-log_s[:4].gather(1, targets[:4, None]).squeeze(1), -log_s[4:].sum(1) / 4]).mean()
    torch.testing.assert_close(loss, expected)


def test_bad_arguments():
    with pytest.raises(ValueError, match="loss must be one of"):
        small_model("openmax")
    with pytest.raises(ValueError, match="at least 2"):
        OpenSetClassifier(num_classes=1, backbone="small_cnn")


def test_background_gamma_is_over_k_plus_one_with_the_background_column_dropped():
    torch.manual_seed(0)
    data = FashionMNISTOpenSetDataModule(max_train_per_class=30, batch_size=16, train_negatives="background")
    model = small_model("bg")
    result = trainer().validate(model, datamodule=data)[0]
    model.eval()
    with torch.no_grad():
        images = torch.stack([data.val_set[i].image for i in range(len(data.val_set))])
        probs = torch.softmax(model(images).double(), dim=1)
    labels = data.val_set.labels
    assert probs.shape[1] == 5
    known, negative = labels >= 0, labels == -1
    # written out from the paper: gamma+ = mean S_y, gamma- = mean (1 - max_{c<K} S_c), softmax over K+1
    plus = probs[known].gather(1, labels[known][:, None]).mean()
    minus = (1 - probs[negative][:, :4].max(1).values).mean()
    assert result["val/gamma_plus"] == pytest.approx(plus.item(), abs=GAMMA_TOLERANCE)
    assert result["val/gamma_minus"] == pytest.approx(minus.item(), abs=GAMMA_TOLERANCE)
    assert result["val/gamma"] == pytest.approx((plus + minus).item() / 2, abs=GAMMA_TOLERANCE)


class NoNegativesInValidation(FashionMNISTOpenSetDataModule):
    def setup(self, stage=None):
        super().setup(stage)
        if self.val_set is not None:
            keep = self.val_set.labels >= 0
            self.val_set.images, self.val_set.labels = self.val_set.images[keep], self.val_set.labels[keep]


def test_validation_split_without_negatives_fails_before_training():
    model = small_model()
    with pytest.raises(ValueError, match="validation split .* holds no negatives"):
        trainer(max_epochs=1).fit(model, datamodule=NoNegativesInValidation(max_train_per_class=10))
    assert model.global_step == 0


def test_nan_gamma_never_becomes_a_checkpoint(tmp_path):
    # the full split holds both sides, but the validation batches seen do not (sorted: knowns first)
    class KnownsFirst(FashionMNISTOpenSetDataModule):
        def setup(self, stage=None):
            super().setup(stage)
            if self.val_set is not None:
                order = torch.argsort(self.val_set.labels, descending=True, stable=True)
                self.val_set.images, self.val_set.labels = self.val_set.images[order], self.val_set.labels[order]

    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val/gamma", mode="max", filename="best")
    run = pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[checkpoint], max_epochs=1,
                     limit_val_batches=1, num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="val/gamma is undefined: the validation batches hold no negatives"):
        run.fit(small_model(), datamodule=KnownsFirst(max_train_per_class=10, batch_size=8))
    assert not (tmp_path / "best.ckpt").exists()


def test_multiple_validation_dataloaders_with_overlapping_indices():
    """Two dataloaders over different data with the same indices 0..N-1: each gets its own gamma."""
    from torch.utils.data import DataLoader

    from datamodules.batch import collate_samples
    from datamodules.images import TensorImageDataset

    torch.manual_seed(0)
    data = FashionMNISTOpenSetDataModule(max_train_per_class=20)
    data.setup("fit")
    first = data.val_set
    second = TensorImageDataset(torch.flip(first.images, dims=[3]), first.labels.flip(0))  # other images and order
    loaders = [DataLoader(d, batch_size=16, collate_fn=collate_samples) for d in (first, second)]
    model = small_model()
    result = trainer().validate(model, dataloaders=loaders)
    model.eval()
    for dataset, logged, suffix in ((first, result[0], ""), (second, result[1], "/dataloader_idx_1")):
        with torch.no_grad():
            probs = torch.softmax(model(dataset.images.float() / 255), dim=1)
        expected = gamma(probs, dataset.labels)[2].item()
        assert logged[f"val/gamma{suffix}"] == pytest.approx(expected, abs=GAMMA_TOLERANCE)
    assert result[0]["val/gamma"] != pytest.approx(result[1]["val/gamma/dataloader_idx_1"], abs=1e-6)
