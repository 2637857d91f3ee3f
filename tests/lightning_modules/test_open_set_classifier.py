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
    assert result["val/gamma"] == pytest.approx(expected[2].item(), abs=1e-6)
    assert result["val/gamma_plus"] == pytest.approx(expected[0].item(), abs=1e-6)
    assert result["val/gamma_minus"] == pytest.approx(expected[1].item(), abs=1e-6)


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
