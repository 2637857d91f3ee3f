"""ShiftGenerator and NearOODGenerator (DESIGN.md §5.3): each regulariser pushes the way the objective says,
the discriminator never sees the regularisers, no step does work twice or trains a frozen scorer, the plain
GAN, and deterministic fixed samples.

Every LPIPS here uses a random AlexNet backbone, asked for by name (``lpips_random_backbone=True``): these
machines hold no ImageNet weights, and the tests need a fixed differentiable function of the images, not a
perceptual one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from datamodules import FashionMNISTOpenSetDataModule
from lightning_modules.generated.generators import (
    FIXED_SAMPLES,
    NearOODGenerator,
    RegularisedGenerator,
    ShiftGenerator,
)
from tests.conftest import train_demo_checkpoint
from tests.lightning_modules.nets.test_ensemble import MEAN, SIZE, STD, by_hand, train_normalising_member

# the random LPIPS backbone is asked for by name in every test: its warning says nothing new here
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:LPIPS\\(alex, RANDOM backbone")]

KINDS = ("shift", "near_ood")
BATCH = 8



@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three demo classifiers from different seeds, trained long enough to disagree (MI > 0)."""
    root = tmp_path_factory.mktemp("members")
    return [str(train_demo_checkpoint(root / f"m{seed}", "eos", steps=20, seed=seed)) for seed in range(3)]


def tiny_data() -> FashionMNISTOpenSetDataModule:
    return FashionMNISTOpenSetDataModule(train_negatives="exclude", image_size=32, max_train_per_class=8,
                                         batch_size=BATCH)


@pytest.fixture(scope="module")
def real() -> Tensor:
    """A fixed batch of 32 px in-distribution images ``(8, 1, 32, 32)``, two of each known class."""
    data = tiny_data()
    data.setup("fit")
    by_class: dict[int, list[Tensor]] = {}
    for i in range(len(data.train_set)):
        sample = data.train_set[i]
        by_class.setdefault(int(sample.target), []).append(sample.image)
    return torch.stack([image for images in by_class.values() for image in images[:2]])


def make(kind: str, ensemble: list[str] | str | None = None, **kwargs: Any) -> RegularisedGenerator:
    """A tiny generator; the LPIPS backbone is random, asked for by name (no ImageNet weights here)."""
    # the test members train for a few steps, below any quality bar: allowed by name (tested on its own)
    kwargs = {"ensemble": ensemble, "lpips_net": "alex", "lpips_random_backbone": True, "base_width": 8,
              "allow_weak_ensemble": True, **kwargs}
    if kind == "shift":
        return ShiftGenerator(**kwargs)
    return NearOODGenerator(latent_dim=16, **kwargs)


def fit(module: pl.LightningModule, steps: int = 1, callbacks: list[pl.Callback] | None = None) -> pl.Trainer:
    """``steps`` training steps (each a D and a G optimiser step, so ``global_step == 2 * steps``)."""
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2 * steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=callbacks or [])
    trainer.fit(module, datamodule=tiny_data())
    assert trainer.global_step == 2 * steps
    return trainer


def optimise_generator(loss: Callable[[], Tensor], module: RegularisedGenerator, steps: int = 15) -> None:
    """A few generator-only Adam steps on one fixed batch."""
    optimizer = torch.optim.Adam(module.generator.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()


def copy_networks(source: RegularisedGenerator, target: RegularisedGenerator) -> None:
    target.generator.load_state_dict(source.generator.state_dict())
    target.discriminator.load_state_dict(source.discriminator.state_dict())


# -- 1. the direction of each regulariser ----------------------------------------------------------------

def test_shift_lpips_term_pushes_the_shift_away_from_its_source(real: Tensor) -> None:
    torch.manual_seed(0)
    # only -λ_p LPIPS(x, G(x)): no adversarial, L1 or MI term; no dropout, so G is one fixed function
    module = make("shift", lambda_adversarial=0.0, lambda_l1=0.0, lambda_perceptual=1.0, lambda_semantic=0.0,
                  dropout=0.0)

    def lpips() -> Tensor:
        with torch.no_grad():
            return module.perceptual(real, module.generator(real)).mean()

    before = lpips()
    loss, terms = module.generator_step_loss(real, module.generator(real))
    assert set(terms) == {"g_adversarial", "lpips"}
    torch.testing.assert_close(terms["lpips"], before)
    torch.testing.assert_close(loss, -before)  # the shift maximises LPIPS: its loss is minus it
    optimise_generator(lambda: module.generator_step_loss(real, module.generator(real))[0], module)
    after = lpips()
    assert after > 1.5 * before, (before, after)


def test_near_ood_lpips_term_pulls_samples_towards_their_real_images(
    real: Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    module = make("near_ood", lambda_adversarial=0.0, lambda_perceptual=1.0, lambda_semantic=0.0)
    # pairing="random" draws new pairs at every call: fix them, so that before and after compare the same pairs
    monkeypatch.setattr(module, "paired_real", lambda fake, batch: batch)
    z = torch.randn(BATCH, module.latent_dim)

    def lpips() -> Tensor:
        with torch.no_grad():
            return module.perceptual(module(z), real).mean()

    before = lpips()
    loss, terms = module.generator_step_loss(real, module(z), None)
    assert set(terms) == {"g_adversarial", "lpips"}
    torch.testing.assert_close(loss, before)
    optimise_generator(lambda: module.generator_step_loss(real, module(z), None)[0], module)
    after = lpips()
    assert after < 0.7 * before, (before, after)


def test_shift_mi_term_keeps_the_ensemble_agreeing(real: Tensor, members: list[str]) -> None:
    torch.manual_seed(0)
    module = make("shift", members, lambda_adversarial=0.0, lambda_l1=0.0, lambda_perceptual=0.0,
                  lambda_semantic=1.0, dropout=0.0)
    assert module.perceptual is None

    def mi() -> Tensor:
        with torch.no_grad():
            return module.mutual_information(module.generator(real)).mean()

    before = mi()
    assert before > 5e-3  # the members disagree, so there is MI to remove and the test can fail
    loss, terms = module.generator_step_loss(real, module.generator(real))
    assert set(terms) == {"g_adversarial", "mi"}
    torch.testing.assert_close(loss.double(), before)
    optimise_generator(lambda: module.generator_step_loss(real, module.generator(real))[0], module)
    after = mi()
    assert after < 0.5 * before, (before, after)


def test_near_ood_mi_term_makes_the_ensemble_disagree(real: Tensor, members: list[str]) -> None:
    torch.manual_seed(0)
    module = make("near_ood", members, lambda_adversarial=0.0, lambda_perceptual=0.0, lambda_semantic=1.0)
    z = torch.randn(BATCH, module.latent_dim)

    def mi() -> Tensor:
        with torch.no_grad():
            return module.mutual_information(module(z)).mean()

    before = mi()
    assert before > 5e-3
    loss, terms = module.generator_step_loss(real, module(z), None)
    assert set(terms) == {"g_adversarial", "mi"}
    torch.testing.assert_close(loss.double(), -before)
    optimise_generator(lambda: module.generator_step_loss(real, module(z), None)[0], module)
    after = mi()
    assert after > 1.3 * before, (before, after)


# -- 2. the discriminator never sees the regularisers ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_discriminator_loss_and_update_do_not_depend_on_the_regulariser_weights(
    kind: str, real: Tensor, members: list[str]
) -> None:
    torch.manual_seed(0)
    plain = make(kind, lambda_perceptual=0.0, lambda_semantic=0.0)
    regularised = make(kind, members, lambda_perceptual=100.0, lambda_semantic=100.0)
    # the scorers are built before the networks and draw from the same RNG: copy the weights over
    copy_networks(plain, regularised)
    fake = plain.generator(real) if kind == "shift" else plain(torch.randn(BATCH, plain.latent_dim))
    d_args = (real, fake) if kind == "shift" else (real, None, fake, None)
    g_args = (real, fake) if kind == "shift" else (real, fake, None)
    assert torch.equal(plain.discriminator_step_loss(*d_args), regularised.discriminator_step_loss(*d_args))
    # while the generator's loss does see them
    assert not torch.equal(plain.generator_step_loss(*g_args)[0], regularised.generator_step_loss(*g_args)[0])

    for module in (plain, regularised):  # one training step each: a D step on the same fake, then a G step
        pl.seed_everything(0)
        fit(module, steps=1)
    for name, value in plain.discriminator.state_dict().items():
        assert torch.equal(value, regularised.discriminator.state_dict()[name]), name
    changed = [name for name, value in plain.generator.named_parameters()
               if not torch.equal(value, dict(regularised.generator.named_parameters())[name])]
    assert len(changed) == len(list(plain.generator.parameters()))


# -- 3. no wasted work: G once, D on a detached fake, frozen scorers, lean checkpoints ---------------------

class Recorder(pl.Callback):
    """Counts generator calls and records whether each discriminator input carries a graph, during training."""

    def __init__(self) -> None:
        self.generator_calls = 0
        self.discriminator_inputs: list[bool] = []
        self.handles: list[Any] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        def count(module: nn.Module, args: Any, output: Any) -> None:
            self.generator_calls += 1

        def record(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.discriminator_inputs.append(any(a.requires_grad for a in args if isinstance(a, Tensor)))

        self.handles = [pl_module.generator.register_forward_hook(count),
                        pl_module.discriminator.register_forward_pre_hook(record)]

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("kind", KINDS)
def test_one_generator_pass_a_detached_fake_and_frozen_scorers(
    kind: str, real: Tensor, members: list[str], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    module = make(kind, members)
    assert module.perceptual is not None and module.ensemble is not None
    frozen_ensemble = {name: value.clone() for name, value in module.ensemble.named_buffers()}
    recorder = Recorder()
    trainer = fit(module, steps=1, callbacks=[recorder])
    assert recorder.generator_calls == 1
    # D's step: real, then the detached fake; G's step: the fake with its graph (the only D input with one)
    assert recorder.discriminator_inputs == [False, False, True]

    # backpropagating the D loss reaches no generator parameter
    module.zero_grad(set_to_none=True)
    fake = module.generator(real) if kind == "shift" else module(torch.randn(BATCH, module.latent_dim))
    assert fake.requires_grad
    loss_d = (module.discriminator_step_loss(real, fake) if kind == "shift"
              else module.discriminator_step_loss(real, None, fake, None))
    loss_d.backward()
    assert all(p.grad is None for p in module.generator.parameters())
    assert all(p.grad is not None for p in module.discriminator.parameters())

    # the optimisers hold exactly the two networks; the scorers have neither gradients nor state
    generator_ids = {id(p) for p in module.generator.parameters()}
    discriminator_ids = {id(p) for p in module.discriminator.parameters()}
    for optimizers in (trainer.optimizers, module.configure_optimizers()):
        assert [{id(p) for group in o.param_groups for p in group["params"]} for o in optimizers] == [
            generator_ids, discriminator_ids]
    assert all(set(map(id, o.state)) <= generator_ids | discriminator_ids for o in trainer.optimizers)
    lpips_parameters = list(module.perceptual.parameters())
    assert lpips_parameters and {id(p) for p in module.parameters()} == (
        generator_ids | discriminator_ids | {id(p) for p in lpips_parameters})
    assert all(not p.requires_grad and p.grad is None for p in lpips_parameters)
    assert list(module.ensemble.parameters()) == []
    assert all(not b.requires_grad and b.grad is None for b in module.ensemble.buffers())
    assert not module.perceptual.training
    # the ensemble stayed frozen: unchanged weights and batch-norm statistics, and per-image outputs
    # (running statistics, not batch statistics: an image's logits do not depend on its batch)
    for name, value in frozen_ensemble.items():
        assert torch.equal(getattr(module.ensemble, name), value), name
    with torch.no_grad():  # a batch of 2 and one of 8 through the members: equal to float32 rounding (batch
        # statistics would move them by far more), which depends on the CPU's convolution kernels
        torch.testing.assert_close(module.ensemble(real[:2]), module.ensemble(real)[:, :2], rtol=1e-4, atol=1e-5)

    # the checkpoint holds the two networks only, and restores the generator (scorers rebuilt from hparams)
    path = tmp_path / "generator.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["state_dict"]
    assert state and all(k.startswith(("generator.", "discriminator.")) for k in state)
    restored = type(module).load_from_checkpoint(path)
    assert restored.ensemble is not None and restored.ensemble.paths == members
    module.eval()
    restored.eval()
    with torch.no_grad():
        source = real if kind == "shift" else torch.randn(BATCH, module.latent_dim)
        torch.testing.assert_close(restored.generator(source), module.generator(source), rtol=0, atol=0)
        torch.testing.assert_close(restored.ensemble(real), module.ensemble(real), rtol=0, atol=0)


# -- 4. the plain GAN and the refusals ---------------------------------------------------------------------

def test_plain_gan_loads_no_scorer_and_trains() -> None:
    torch.manual_seed(0)
    module = NearOODGenerator(lambda_perceptual=0, lambda_semantic=0, base_width=8, latent_dim=16)
    assert module.perceptual is None and module.ensemble is None
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = fit(module, steps=2)
    logged = {k.removesuffix("_step").removesuffix("_epoch") for k in trainer.callback_metrics}
    assert logged == {"train/d_loss", "train/g_adversarial", "train/g_loss"}
    assert all(torch.isfinite(v) for v in trainer.callback_metrics.values())
    # with no regulariser the generator's loss is the adversarial term alone
    torch.testing.assert_close(trainer.callback_metrics["train/g_loss_step"],
                               trainer.callback_metrics["train/g_adversarial_step"])
    for name, parameter in module.named_parameters():
        assert not torch.equal(parameter, before[name]), name


@pytest.mark.parametrize("cls", [ShiftGenerator, NearOODGenerator])
def test_semantic_weight_without_an_ensemble_is_refused(cls: type[RegularisedGenerator]) -> None:
    with pytest.raises(ValueError, match="lambda_semantic > 0 needs the ensemble's member checkpoints"):
        cls(lambda_perceptual=0, lambda_semantic=0.5, base_width=8)


@pytest.mark.parametrize(("cls", "weight"), [
    (ShiftGenerator, "lambda_adversarial"), (ShiftGenerator, "lambda_l1"), (ShiftGenerator, "lambda_perceptual"),
    (ShiftGenerator, "lambda_semantic"), (NearOODGenerator, "lambda_adversarial"),
    (NearOODGenerator, "lambda_perceptual"), (NearOODGenerator, "lambda_semantic"),
])
def test_negative_weights_are_refused(cls: type[RegularisedGenerator], weight: str) -> None:
    kwargs = {"lambda_perceptual": 0.0, "lambda_semantic": 0.0, "base_width": 8, weight: -0.5}
    with pytest.raises(ValueError, match=f"{weight}=-0.5"):
        cls(**kwargs)


def test_members_file_gives_the_same_ensemble(real: Tensor, members: list[str], tmp_path: Path) -> None:
    listing = tmp_path / "ensemble.txt"
    listing.write_text("".join(f"{path}\n" for path in members))
    from_file = make("shift", str(listing), lambda_perceptual=0.0)
    from_list = make("shift", members, lambda_perceptual=0.0)
    assert from_file.ensemble is not None and from_file.ensemble.paths == members
    assert from_file.ensemble.num_members == 3
    with torch.no_grad():
        mi = from_file.mutual_information(real)
        torch.testing.assert_close(mi, from_list.mutual_information(real), rtol=0, atol=0)
    assert (mi > 0).all()


# -- 5. fixed samples ---------------------------------------------------------------------------------------

def test_shift_fixed_samples_interleave_the_first_sources_with_their_shifts(real: Tensor) -> None:
    torch.manual_seed(0)
    module = make("shift", lambda_perceptual=0.0, lambda_semantic=0.0)
    with pytest.raises(RuntimeError, match="no fixed source images yet"):
        module.fixed_samples()
    fit(module, steps=1)  # the sources are taken from the training set at fit start
    assert module.generator.training
    first = module.fixed_samples()
    torch.manual_seed(123)  # dropout is off for the samples: the global RNG does not matter
    second = module.fixed_samples()
    assert first.shape == (FIXED_SAMPLES // 2, 1, 32, 32)
    assert torch.equal(first, second)
    assert module.generator.training  # the mode is restored
    data = tiny_data()
    data.setup("fit")
    sources = torch.stack([data.train_set[i].image for i in range(FIXED_SAMPLES // 4)])
    assert torch.equal(first[0::2], sources)
    module.generator.eval()
    with torch.no_grad():
        assert torch.equal(first[1::2], module.generator(sources))


def test_near_ood_fixed_samples_are_the_same_noise_every_time() -> None:
    torch.manual_seed(0)
    module = make("near_ood", lambda_perceptual=0.0, lambda_semantic=0.0)
    torch.manual_seed(1)
    other = make("near_ood", lambda_perceptual=0.0, lambda_semantic=0.0)
    # the noise comes from its own seeded generator: equal across instances (and ranks, and resumes)
    assert torch.equal(module.fixed_noise, other.fixed_noise)
    assert "fixed_noise" not in module.state_dict()
    module.train()
    first = module.fixed_samples()
    torch.manual_seed(123)
    second = module.fixed_samples()
    assert first.shape == (FIXED_SAMPLES, 1, 32, 32)
    assert torch.equal(first, second)
    assert 0 <= first.min() and first.max() <= 1
    assert module.generator.training
    copy_networks(module, other)
    assert torch.equal(other.fixed_samples(), first)


# -- 6. the data the networks and the ensemble see ------------------------------------------------------------

@pytest.fixture(scope="module")
def normalising_members(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two classifiers whose datamodule normalised their 16 px RGB images (mean/std unlike ImageNet's)."""
    root = tmp_path_factory.mktemp("normalising")
    return [train_normalising_member(root / f"m{seed}", seed=seed) for seed in range(2)]


def mutual_information_by_hand(logits: np.ndarray) -> np.ndarray:
    """``H(mean_m p_m) - mean_m H(p_m)`` in float64 NumPy, from ``(M, N, C)`` logits."""
    logits = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    entropy = lambda p: -(p * np.log(np.clip(p, 1e-300, None))).sum(axis=-1)  # noqa: E731
    return entropy(probs.mean(axis=0)) - entropy(probs).mean(axis=0)


@pytest.mark.parametrize("kind", KINDS)
def test_mi_sees_generated_images_as_the_members_saw_theirs(kind: str, normalising_members: list[Path]) -> None:
    """32 px generated RGB images in [0, 1] reach the members resized to their 16 px and normalised with their
    datamodule's mean and std, as :meth:`DeepEnsemble.unit_logits` documents: checked against the members'
    own networks on images prepared by hand."""
    module = make(kind, [str(p) for p in normalising_members], channels=3, lambda_perceptual=0.0)
    torch.manual_seed(0)
    images = torch.rand(6, 3, 32, 32)
    resized = F.interpolate(images, size=(SIZE, SIZE), mode="bilinear", align_corners=False, antialias=True)
    expected_logits = by_hand(normalising_members, resized)
    with torch.no_grad():
        logits = module.ensemble_logits(images)
        # the members' own networks by hand run other kernels (contiguous, member by member) than the ensemble's
        # (channels-last members): equal to float32 rounding, whose size depends on the CPU
        torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-5)
        mi = module.mutual_information(images)
        unnormalised = mutual_information_by_hand(module.ensemble(resized).double().numpy())
    # MI, a difference of two entropies, from the logits the module itself computed (float32 against float64)
    np.testing.assert_allclose(mi.numpy(), mutual_information_by_hand(logits.double().numpy()), rtol=1e-4, atol=1e-6)
    assert not np.allclose(mi.numpy(), unnormalised, rtol=1e-2)  # without the normalisation MI would differ


@pytest.mark.parametrize("kind", KINDS)
def test_a_datamodule_of_normalised_images_is_refused(kind: str, tmp_path: Path) -> None:
    from datamodules import ClassFolderDataModule
    from tests.conftest import make_imagenet_folder

    classes = ["n01440764", "n01443537", "n01484850"]
    make_imagenet_folder(tmp_path / "folders", classes, train=5, val=1)
    data = ClassFolderDataModule(root=str(tmp_path / "folders"), known=classes[:2], negative=classes[2:],
                                 protocol_dir=str(tmp_path / "protocols"), train_negatives="exclude", batch_size=4,
                                 num_workers=0, resize_size=32, crop_size=32, normalize=True, mean=MEAN, std=STD,
                                 pin_memory=False)
    module = make(kind, channels=3, lambda_perceptual=0.0, lambda_semantic=0.0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    with pytest.raises(ValueError, match=r"ClassFolderDataModule serves normalised images \(normalize=True, "
                                         r"mean=\(0.2, 0.5, 0.7\), std=\(0.25, 0.5, 0.125\)\).*take images in \[0, 1\]"):
        trainer.fit(module, datamodule=data)
    assert trainer.global_step == 0  # refused at setup, before any step


# -- 7. each step's own randomness; the schedule over the run; the nearest pairing ---------------------------

def expected_latents(seed: int, rank: int, step: int, count: int, dim: int) -> Tensor:
    """The z of a training step, from the documented seed: 64 bits of ``SeedSequence([seed, rank, step])``."""
    state = int(np.random.SeedSequence([seed, rank, step]).generate_state(1, dtype=np.uint64)[0])
    return torch.randn(count, dim, generator=torch.Generator().manual_seed(state))


class GeneratorInputs(pl.Callback):
    """Records the generator's first input at every training step."""

    def __init__(self) -> None:
        self.inputs: list[Tensor] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.handle = pl_module.generator.register_forward_pre_hook(
            lambda module, args: self.inputs.append(args[0].detach().clone()))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.handle.remove()


def test_training_noise_comes_from_seed_rank_and_step_and_leaves_the_global_generator_alone() -> None:
    module = make("near_ood", lambda_perceptual=0.0, lambda_semantic=0.0, training_seed=7)
    recorder = GeneratorInputs()
    pl.seed_everything(0)
    fit(module, steps=3, callbacks=[recorder])
    assert len(recorder.inputs) == 3
    for step, z in enumerate(recorder.inputs):
        torch.testing.assert_close(z, expected_latents(7, 0, step, BATCH, module.latent_dim), rtol=0, atol=0)
    # the step's draws come from the run's seed (PL_GLOBAL_SEED when no seed is given) and leave the global
    # generator where it was: after the block, its next draw is the one a fresh seed_everything(123) gives
    unseeded = make("near_ood", lambda_perceptual=0.0, lambda_semantic=0.0)
    pl.seed_everything(123)
    with unseeded.step_randomness(2):
        assert os.environ["PL_GLOBAL_SEED"] == "123"
        drawn = torch.randn(BATCH, unseeded.latent_dim)
    torch.testing.assert_close(drawn, expected_latents(123, 0, 2, BATCH, unseeded.latent_dim), rtol=0, atol=0)
    after = torch.rand(3)
    pl.seed_everything(123)
    torch.testing.assert_close(after, torch.rand(3), rtol=0, atol=0)
    with pytest.raises(ValueError, match="seed must be >= 0 .* got -1"):
        make("near_ood", lambda_perceptual=0.0, lambda_semantic=0.0, training_seed=-1)


def test_lazy_regularisation_counts_training_steps_over_the_run() -> None:
    """k = 3 over 6 steps of 4-batch epochs regularises steps 0 and 3: the schedule does not restart with each
    epoch (by batch index it would regularise steps 0, 3 and 4)."""
    module = make("near_ood", lambda_perceptual=0.0, lambda_semantic=0.0, regularise_every=3)
    weights: list[float] = []
    schedule = module.regularisation_weight
    module.regularisation_weight = lambda step: weights.append(schedule(step)) or weights[-1]  # type: ignore[method-assign]
    trainer = fit(module, steps=6)
    assert trainer.num_training_batches == 4  # so the 6 steps span two epochs
    assert weights == [3.0, 0.0, 0.0, 3.0, 0.0, 0.0]


def test_nearest_pairing_takes_each_samples_perceptually_nearest_real_image(real: Tensor) -> None:
    torch.manual_seed(0)
    module = make("near_ood", pairing="nearest", lambda_semantic=0.0)
    # "samples" that each resemble one real image: blends of a real image with noise
    sources = torch.tensor([5, 0, 3, 7, 2])
    fake = 0.7 * real[sources] + 0.3 * torch.rand(5, *real.shape[1:])
    with torch.no_grad():
        paired = module.paired_real(fake, real)
        # brute force: every (sample, real image) pair through LPIPS's own forward
        distances = torch.stack([module.perceptual(fake, r.expand_as(fake)) for r in real], dim=1)
    assert torch.equal(paired, real[distances.argmin(dim=1)])
    assert len({int(i) for i in distances.argmin(dim=1)}) > 1  # not one image for all: the test can fail


@pytest.mark.parametrize("kind", ["shift", "near_ood"])
def test_hyper_parameters_merge_with_the_datamodules_under_a_logger(kind: str, tmp_path: Path) -> None:
    """With a logger, Lightning merges the module's and the datamodule's hyper-parameters and refuses a key
    both hold with different values: the training noise's seed is ``training_seed``, not the datamodules'
    ``seed`` (which a demo run once failed on)."""
    from pytorch_lightning.loggers import CSVLogger

    module = make(kind, lambda_perceptual=0.0, lambda_semantic=0.0, training_seed=11)
    data = FashionMNISTOpenSetDataModule(train_negatives="exclude", image_size=32, max_train_per_class=8,
                                         batch_size=BATCH, seed=5)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=CSVLogger(tmp_path), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    assert module.noise_seed == 11 and data.hparams["seed"] == 5
    logged = (Path(trainer.logger.log_dir) / "hparams.yaml").read_text()
    assert "training_seed: 11" in logged and "seed: 5" in logged
