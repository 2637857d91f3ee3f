import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import evaluate
import train
from evaluation_engine.scoring import ScoringPasses
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def best_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("run")
    argv, sys.argv = sys.argv, ["train.py"]
    try:
        with contextlib.chdir(directory):
            train.main(["fit", "--config", str(ROOT / "configs/demo/fashion_mnist_eos.yaml"), "--trainer.max_epochs=1",
                        "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                        "--data.init_args.max_train_per_class=40"])
    finally:
        sys.argv = argv
    return directory / "runs/demo/checkpoints/best.ckpt"


def oscr_reference(probs: np.ndarray, target: np.ndarray, *, fpr: float) -> tuple[float, float]:
    """CCR at ``fpr`` against the unknowns and the AUROC of knowns vs unknowns, from the papers' formulas.

    Args:
        probs: ``(N, K)`` softmax probabilities.
        target: ``(N,)`` labels: ``0..K-1`` known, ``-1`` negative (left out here), ``-2`` unknown.
        fpr: the largest FPR against the unknowns.

    Returns:
        ``(CCR, AUROC)``: CCR(t) = |{known x: argmax = y, P_y(x) > t}| / |known| at the threshold t whose
        FPR(t) = |{unknown x: max_c P_c(x) > t}| / |unknown| is at most ``fpr`` (the largest such CCR); the
        AUROC of max_c P_c, knowns positive (sklearn).
    """
    known, unknown = target >= 0, target == -2
    correct = probs[known].argmax(axis=1) == target[known]
    known_target, unknown_max = probs[known, target[known]], probs[unknown].max(axis=1)
    thresholds = np.unique(np.r_[known_target, unknown_max])
    rates = (unknown_max[None, :] > thresholds[:, None]).mean(axis=1)
    ccr = (correct[None, :] & (known_target[None, :] > thresholds[:, None])).mean(axis=1)
    labels = np.r_[np.ones(known.sum()), np.zeros(unknown.sum())]
    return float(ccr[rates <= fpr].max()), float(roc_auc_score(labels, np.r_[probs[known].max(axis=1), unknown_max]))


@pytest.mark.slow
def test_oscr_report_next_to_the_checkpoint(best_checkpoint, tmp_path, capsys, monkeypatch):
    recorded = record_outputs(monkeypatch)
    report = evaluate.main(["oscr", "--model", str(best_checkpoint), "--log-dir", str(tmp_path), "--accelerator", "cpu"])
    directory = best_checkpoint.parent / "best-oscr"
    assert f"Open-set report written to {directory}" in capsys.readouterr().out
    saved = json.loads((directory / "metrics.json").read_text())
    assert saved["checkpoint"] == str(best_checkpoint)
    assert saved["counts"] == {"known": 4000, "negatives": 3000, "unknowns": 3000, "skipped_images": 0}
    assert set(saved["files"]) == {"oscr_negatives", "oscr_unknowns", "oscr_curves", "score_histograms"}
    # the headline numbers, in the file and in what the command returns, are those of the formulas applied to
    # the per-sample outputs of the test set's scoring pass (every test image once, in dataset order)
    assert recorded["logits"].shape[0] == 10000 and torch.equal(recorded["targets"], recorded["labels"])
    ccr, area = oscr_reference(recorded["probs"].double().numpy(), recorded["targets"].numpy(), fpr=0.1)
    for scalars in (saved["scalars"], report["scalars"]):
        assert scalars["unknowns/ccr@fpr=0.1"] == pytest.approx(ccr, abs=1e-12)
        assert scalars["unknowns/auroc"] == pytest.approx(area, abs=1e-9)
    assert 0 <= saved["scalars"]["unknowns/ccr@fpr=0.1"] <= saved["scalars"]["unknowns/ccr@fpr=1"] <= 1
    assert list(tmp_path.glob("wandb/offline-run-*"))  # logged to W&B, offline


def record_outputs(monkeypatch) -> dict[str, torch.Tensor]:
    """Record what the scoring pass of the test set hands the metrics (``logits``, their softmax ``probs``,
    ``targets``, in dataset order); after the run the dict holds them as ``(N, C)`` tables."""
    from evaluation_engine.scoring import ScoringPasses

    outputs = ScoringPasses.outputs
    recorded: dict[str, torch.Tensor] = {}

    def recording(self, runner, model, evaluation_set, **kwargs):
        out = outputs(self, runner, model, evaluation_set, **kwargs)
        recorded.update(logits=out["logits"], probs=torch.softmax(out["logits"].float(), dim=1),
                        targets=out["targets"], labels=evaluation_set.labels())
        return out

    recording.original = outputs  # type: ignore[attr-defined]
    monkeypatch.setattr(ScoringPasses, "outputs", recording)
    return recorded


def replay_outputs(monkeypatch, recorded: dict[str, torch.Tensor]) -> None:
    """The test set's pass still runs the network, its logits are checked against the recorded ones to float32
    tolerance, and the metrics get the recorded logits instead."""
    from evaluation_engine.scoring import ScoringPasses

    outputs = getattr(ScoringPasses.outputs, "original", ScoringPasses.outputs)  # not the recorder

    def replaying(self, runner, model, evaluation_set, **kwargs):
        out = outputs(self, runner, model, evaluation_set, **kwargs)
        assert torch.equal(out["targets"], recorded["targets"])
        torch.testing.assert_close(out["logits"], recorded["logits"], rtol=1e-4, atol=1e-5)
        return {**out, "logits": recorded["logits"]}

    monkeypatch.setattr(ScoringPasses, "outputs", replaying)


@pytest.mark.slow
def test_results_do_not_depend_on_the_batch_size(best_checkpoint, tmp_path, monkeypatch):
    # Another batch size puts other images together through the network, and a convolution's float32 result
    # may then differ in the last bits (the CPU's kernels, their blocking); on some CPUs that flips near-ties in
    # the OSCR and AUROC. What must not depend on the batch size is the accumulation over batches (no
    # per-batch averaging, no sample lost or counted twice): the later runs replay the first run's per-sample
    # outputs, their own network outputs checked against them to float32 tolerance, and equal it exactly.
    common = ["oscr", "--model", str(best_checkpoint), "--wandb-mode", "disabled", "--no-plots", "--accelerator", "cpu"]
    recorded = record_outputs(monkeypatch)
    first = evaluate.main([*common, "--output-dir", str(tmp_path / "a")])
    assert recorded["logits"].shape[0] == 10000
    replay_outputs(monkeypatch, recorded)
    second = evaluate.main([*common, "--output-dir", str(tmp_path / "b"), "--data-arg", "batch_size=37"])
    assert first["scalars"] == second["scalars"]
    # the spellings of before still work for one release, and say so
    with pytest.warns(FutureWarning, match="--ckpt is deprecated.*use --model"):
        old = evaluate.main(["oscr", "--ckpt", str(best_checkpoint), "--wandb-mode", "disabled", "--no-plots",
                             "--accelerator", "cpu", "--output-dir", str(tmp_path / "c"), "--data", "batch_size=37"])
    assert old["scalars"] == first["scalars"]


def test_bad_checkpoints_are_explained(tmp_path, best_checkpoint):
    with pytest.raises(SystemExit, match="does not exist"):
        evaluate.main(["oscr", "--model", str(tmp_path / "none.ckpt")])
    stripped = torch.load(best_checkpoint, weights_only=False)
    del stripped["datamodule_class"]
    torch.save(stripped, tmp_path / "stripped.ckpt")
    with pytest.raises(SystemExit, match="has no 'datamodule_class'"):
        evaluate.main(["oscr", "--model", str(tmp_path / "stripped.ckpt")])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        evaluate.main(["oscr", "--model", str(best_checkpoint), "--data-arg", "batch_size"])
    with pytest.raises(SystemExit, match=r"has no arguments \['batchsize'\]"):
        evaluate.main(["oscr", "--model", str(best_checkpoint), "--data-arg", "batchsize=3"])
    # a checkpoint of this project on data of other classes: refused by name, not evaluated by count
    with pytest.raises(SystemExit, match=r"trained on other classes"):
        evaluate.main(["oscr", "--model", str(best_checkpoint), "--data-arg", "known=[2,3,4,6]",
                       "--data-arg", "negative=[0,1,5]", "--data-arg", "unknown=[7,8,9]", "--wandb-mode", "disabled"])


def test_oscr_refuses_a_generator_checkpoint_up_front(tmp_path):
    import shutil

    generator = shutil.copy(ROOT / "tests/data/legacy/near_ood.ckpt", tmp_path / "near_ood.ckpt")
    with pytest.raises(SystemExit, match=r"^evaluate.py oscr: checkpoint .*near_ood\.ckpt holds a "
                                         r"lightning_modules\.generators\.NearOODGenerator, but a "
                                         r"lightning_modules\.open_set_classifier\.OpenSetClassifier is expected here: "
                                         r"scoring needs a classifier of train\.py"):
        evaluate.main(["oscr", "--model", str(generator), "--wandb-mode", "disabled", "--accelerator", "cpu"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["near_ood.ckpt"]  # no report folder, no log
    for name in ("timm:resnet18", "torchvision:resnet18", f"ensemble:{generator}"):  # not "checkpoint ... does not exist"
        with pytest.raises(SystemExit, match=rf"^evaluate.py oscr: oscr needs a checkpoint of train.py .*got the model "
                                             rf"name '{name.split(':')[0]}:"):
            evaluate.main(["oscr", "--model", name, "--wandb-mode", "disabled"])


def test_oscr_checks_its_default_folder_before_the_test_pass(best_checkpoint, tmp_path, monkeypatch):
    import os
    import shutil


    locked = tmp_path / "locked"
    locked.mkdir()
    checkpoint = shutil.copy(best_checkpoint, locked / "best.ckpt")
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(locked))  # read-only, as for a non-root user
    monkeypatch.setattr(ScoringPasses, "outputs", lambda *args, **kwargs: pytest.fail("the test pass ran"))
    with pytest.raises(SystemExit, match=r"^evaluate.py oscr: the report goes to .*locked/best-oscr, but "
                                         r".*locked cannot be written"):
        evaluate.main(["oscr", "--model", str(checkpoint), "--wandb-mode", "disabled", "--accelerator", "cpu"])


def parse_error(argv: list[str], capsys) -> str:
    """What the command line says of a bad option (jsonargparse's message on stderr, exit code 2)."""
    with pytest.raises(SystemExit) as raised:
        evaluate.main(argv)
    assert raised.value.code == 2
    return capsys.readouterr().err


def test_options_and_configs_are_checked_by_type(tmp_path, capsys):
    assert 'Parser key "num_levels"' in parse_error(["severity", "--model", "timm:x", "--num-levels", "3.5"], capsys)
    assert 'Expected a <class \'int\'>' in parse_error(["evg", "--model", "m.ckpt", "--chains", "ten"], capsys)
    (tmp_path / "scalar.yaml").write_text("model: [m.ckpt]\nkappa: softmax\n")  # a scalar where a list is expected
    assert 'Parser key "kappa"' in parse_error(["generated", "--config", str(tmp_path / "scalar.yaml")], capsys)
    (tmp_path / "typo.yaml").write_text("modle: x\n")
    assert "modle" in parse_error(["generated", "--config", str(tmp_path / "typo.yaml")], capsys)
    assert "unrecognized arguments" in parse_error(["oscr", "--model", "m.ckpt", "--fpt", "0.1"], capsys)
    assert "Expected a typing.Literal['exact', 'authors']. Got value: mine" in parse_error(
        ["oscr", "--model", "m.ckpt", "--ccr-convention", "mine"], capsys)
    assert "evg" in parse_error(["nonsense"], capsys)


def test_trainer_options_lightning_refuses_are_named_not_raised(tmp_path, best_checkpoint):
    with pytest.raises(SystemExit, match="devices must be a positive number of devices.*got 0"):
        evaluate.main(["oscr", "--model", str(best_checkpoint), "--devices", "0"])
    with pytest.raises(SystemExit, match=r"^evaluate.py oscr: .*'foo' is invalid"):
        evaluate.main(["oscr", "--model", str(best_checkpoint), "--precision", "foo", "--wandb-mode", "disabled"])
    with pytest.raises(SystemExit, match=r"^evaluate.py oscr: .*invalid strategy name.*nonsense"):
        evaluate.main(["oscr", "--model", str(best_checkpoint), "--strategy", "nonsense", "--wandb-mode", "disabled"])
    if not torch.cuda.is_available():  # Lightning's MisconfigurationException, as one line
        with pytest.raises(SystemExit, match=r"^evaluate.py oscr: the trainer options are not valid here: .*gpu"):
            evaluate.main(["oscr", "--model", str(best_checkpoint), "--accelerator", "gpu", "--wandb-mode", "disabled"])


def test_every_command_is_listed_with_a_whole_clause(capsys):
    parse_error([], capsys)
    assert evaluate.summary(evaluate.COMMANDS["oscr"]) == (
        "the open-set test report (Palechor et al.) of a checkpoint of train.py")
    assert evaluate.summary(evaluate.COMMANDS["evg"]) == "EvG, the outliers each detector trusts most (Yoon et al.)"
    for cls in evaluate.COMMANDS.values():
        assert "``" not in evaluate.summary(cls) and not evaluate.summary(cls).endswith((" a", " the", " in"))


def test_print_config_gives_a_config_that_parses_back(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        evaluate.main(["severity", "--model", "timm:resnet50", "--kappa", "softmax", "odin", "--kappa-arg",
                       "odin.temperature=1000", "--data-arg", "estimation=20", "--devices", "2", "--print_config"])
    assert raised.value.code == 0
    printed = capsys.readouterr().out
    assert "kappa_args:\n  odin:\n    temperature: 1000" in printed and "devices: 2" in printed
    (tmp_path / "config.yaml").write_text(printed)
    command, evaluation = evaluate.parse(["severity", "--config", str(tmp_path / "config.yaml")])
    assert command == "severity" and evaluation.kappa == ["softmax", "odin"]
    assert evaluation.kappa_args == {"odin": {"temperature": 1000}} and evaluation.data_args == {"estimation": 20}
    assert evaluation.options.devices == 2


def test_kappa_arguments_are_checked_before_any_pass(demo_checkpoint, tmp_path):
    with pytest.raises(SystemExit, match=r"detector .odin.: temperature must be a positive finite number, got 0"):
        evaluate.main(["severity", "--model", str(demo_checkpoint), "--data", "fashion", "--kappa", "odin",
                       "--kappa-arg", "odin.temperature=0", "--output-dir", str(tmp_path), "--wandb-mode", "disabled"])
    with pytest.raises(SystemExit, match=r"'odin' has no hyperparameter 'temprature'; it takes \['epsilon', 'image_space', 'temperature'\]"):
        evaluate.main(["severity", "--model", str(demo_checkpoint), "--kappa", "odin", "--kappa-arg",
                       "odin.temprature=3", "--output-dir", str(tmp_path), "--wandb-mode", "disabled"])
    with pytest.raises(SystemExit, match="KIND.NAME=VALUE"):
        evaluate.main(["severity", "--model", str(demo_checkpoint), "--kappa-arg", "temperature=3"])


def test_severity_tables_have_the_published_columns_and_plot_together(tmp_path, demo_checkpoint):
    from importlib import resources

    from metrics import TABLE_COLUMNS

    published = resources.files("datamodules").joinpath("data/galil_resnet50_softmax_severity.csv")
    assert published.read_text().splitlines()[0].split(",") == list(TABLE_COLUMNS)
    tables = evaluate.main(["severity", "--model", str(demo_checkpoint), "--data", "fashion", "--data-arg", "estimation=20",
                            "--data-arg", "test=10", "--kappa", "softmax", "max_logit", "--cache-dir", str(tmp_path / "c"),
                            "--output-dir", str(tmp_path / "out"), "--accelerator", "cpu", "--devices", "1",
                            "--wandb-mode", "disabled", "--no-progress-bar"])
    ours = (tmp_path / "out" / "severity.csv").read_text().splitlines()
    # the paper's columns as they are, then the interval of each level's AUROC (classes within the level resampled),
    # then the field's other detector metrics with theirs (on the same resamples)
    detection = ["fpr@95tpr", "aupr-in", "aupr-out", "fpr@95tpr low", "fpr@95tpr high", "aupr-in low", "aupr-in high",
                 "aupr-out low", "aupr-out high"]
    assert ours[0].split(",") == [*TABLE_COLUMNS, "ood-auroc low", "ood-auroc high", "empty resamples", *detection]
    assert len(ours) == 1 + 2 * 11
    for row in tables["softmax"]:
        assert 0 <= row["ood-auroc low"] <= row["ood-auroc high"] <= 1
        for metric in ("fpr@95tpr", "aupr-in", "aupr-out"):
            assert 0 <= row[f"{metric} low"] <= row[f"{metric} high"] <= 1 and 0 <= row[metric] <= 1, metric
    summary = (tmp_path / "out" / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 2 and summary[0].startswith("model name,confidence function,mean auroc,mean auroc low")
    assert [row["percentile"] for row in tables["softmax"]] == [
        float(line.split(",")[1]) for line in published.read_text().splitlines()[1:]]
    figure = evaluate.main(["severity-plot", str(tmp_path / "out" / "severity.csv"), str(published),
                            "--output", str(tmp_path / "all.png")])
    assert figure == tmp_path / "all.png" and figure.stat().st_size > 10_000
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="not a severity table"):
        evaluate.main(["severity-plot", str(tmp_path / "bad.csv"), "--output", str(tmp_path / "x.png")])


@pytest.mark.slow
def test_background_checkpoint_through_oscr_in_both_conventions(bg_checkpoint, tmp_path, capsys, monkeypatch):
    import numpy as np

    from datamodules import FashionMNISTOpenSetDataModule
    from lightning_modules.checkpoint import load_module
    from tests.metrics.reference import authors_ccr_at_fpr_reference, ccr_at_fpr_reference, gamma_reference

    recorded = record_outputs(monkeypatch)
    report = evaluate.main(["oscr", "--ckpt", str(bg_checkpoint), "--output-dir", str(tmp_path), "--wandb-mode",
                            "disabled", "--no-plots", "--accelerator", "cpu", "--ccr-convention", "exact", "authors"])
    assert "authors = authors_ccr@fpr" in capsys.readouterr().out
    data = FashionMNISTOpenSetDataModule(train_negatives="background")
    data.setup("test")
    model = load_module(bg_checkpoint).eval()
    with torch.no_grad():  # all test images in one batch: the command's batches of 128 agree to float32 rounding
        logits = model(data.test_set.images.float() / 255)
    # the references score the probabilities the command scored (a flipped near-tie between these float32
    # numbers and the recomputed ones would move a CCR by 1/N): those of this model on the test set, in order
    assert torch.equal(recorded["targets"], data.test_set.labels)
    torch.testing.assert_close(recorded["logits"], logits, rtol=1e-4, atol=1e-5)
    probs = recorded["probs"].numpy()
    target = data.test_set.labels.numpy()
    assert report["background_class"] is True and probs.shape[1] == 5
    targets = [1e-3, 1e-2, 1e-1, 1.0]
    scalars = report["scalars"]
    for group, label in (("negatives", -1), ("unknowns", -2)):
        exact = ccr_at_fpr_reference(probs, target, targets, label, background=True)
        np.testing.assert_allclose([scalars[f"{group}/ccr@fpr={t:g}"] for t in targets], exact, atol=1e-12)
        authors = authors_ccr_at_fpr_reference(probs, target, targets, label, background=True)
        np.testing.assert_allclose([scalars[f"{group}/authors_ccr@fpr={t:g}"] for t in targets], authors, atol=1e-12)
    keep = target >= -1
    assert scalars["gamma"] == pytest.approx(gamma_reference(probs[keep], target[keep], background=True)[2], abs=1e-6)
    assert report["ccr_conventions"] == ["exact", "authors"]


@pytest.mark.slow
def test_generated_benchmark_config_runs(tmp_path, tmp_path_factory, demo_checkpoint):
    """configs/evaluate/fashion_generated.yaml: every key is an option of `evaluate.py generated`, and the run
    works with its paths pointed at tiny sets (the demo writes the real ones)."""
    from tests.test_generate import CLI, generate, train_generators

    config = str(ROOT / "configs/evaluate/fashion_generated.yaml")
    _, parsed = evaluate.parse(["generated", "--config", config])
    assert parsed.model == ["runs/demo/checkpoints/best.ckpt", "ensemble:runs/demo/ensemble/ensemble.txt",
                            "ensemble:runs/demo/ensemble_independent/ensemble.txt"]
    assert parsed.ensemble == ["runs/demo/ensemble_independent/ensemble.txt"] and parsed.label_filter is True
    assert parsed.real_ood == ["unknown=fashion:unknown", "digits=digits"] and parsed.data == "fashion"
    assert parsed.lpips_random_backbone is True  # the demo's random LPIPS backbone, asked for by name
    paths = train_generators(str(tmp_path_factory.getbasetemp() / "generators"))  # the session's, if trained
    members = ",".join(str(p) for p in paths["members"])
    sets = {kind: generate(paths[kind], tmp_path / kind, "--num", "6") for kind in ("shift", "near_ood")}
    result = evaluate.main(["generated", "--config", config, "--model", str(demo_checkpoint), f"ensemble:{members}",
                            "--near-ood", str(sets["near_ood"]), "--shift", str(sets["shift"]), "--ensemble", members,
                            "--allow-weak-ensemble", "--reference", "4", "--output-dir", str(tmp_path / "report"),
                            "--cache-dir", str(tmp_path / "cache"), *CLI])
    kinds = {row["set"]: row["kind"] for row in result["detectors"]}
    assert kinds == {"id_test": "id", "near_ood:near_ood": "near_ood", "shift:shift": "shift",
                     "shift:shift (label kept)": "shift", "real:unknown": "real_ood", "real:digits": "real_ood"}
    assert {row["confidence function"] for row in result["detectors"]} == {
        "softmax", "max_logit", "entropy", "ensemble_mi", "ensemble_softmax"}
    assert [row["real"] for row in result["agreement"]] == ["real:unknown", "real:digits"]
    assert (tmp_path / "report" / "sets.md").read_text().startswith("LPIPS: LPIPS(alex, RANDOM backbone")
    # a κ that pairs with none of the models: refused before any pass, not an empty table
    with pytest.raises(SystemExit, match=r"\['ensemble_mi'\] pair with none of the models"):
        evaluate.main(["generated", "--config", config, "--model", str(demo_checkpoint), "--kappa", "softmax",
                       "ensemble_mi", "--near-ood", str(sets["near_ood"]), "--output-dir", str(tmp_path / "x"),
                       "--cache-dir", str(tmp_path / "cache"), *CLI])


def test_each_commands_own_spellings_are_declared_on_its_class() -> None:
    # severity-plot: the leading values are its tables
    assert evaluate.normalise("severity-plot", ["a.csv", "b.csv", "--output", "all.png"]) == [
        "--tables", '["a.csv", "b.csv"]', "--output", "all.png"]
    # oscr and generate: --data KEY=VALUE of before is --data-arg, with a warning
    for command in ("oscr", "generate"):
        with pytest.warns(evaluate.DeprecatedOption, match="use --data-arg KEY=VALUE"):
            assert evaluate.normalise(command, ["--data", "root=/data/x"]) == ["--data_args.root", "/data/x"]
    # but severity's --data names its data (no old spelling there)
    assert evaluate.normalise("severity", ["--data", "fashion"]) == ["--data", "fashion"]
    # generated: --image-size is ignored, saying why; other commands do not know it
    with pytest.warns(evaluate.DeprecatedOption, match="--image-size is no longer needed by generated"):
        assert evaluate.normalise("generated", ["--image-size", "64", "--kappa", "softmax"]) == [
            "--kappa", '["softmax"]']
    assert evaluate.normalise("evg", ["--image-size", "64"]) == ["--image_size", "64"]


@pytest.mark.parametrize(("environment", "expected"), [("disabled", "disabled"), ("offline", "offline"),
                                                       ("dryrun", "offline"), ("online", "online"), ("run", "online"),
                                                       (None, "offline")])
def test_the_wandb_mode_follows_the_environment_unless_given(monkeypatch, environment, expected):
    from evaluation_engine.runner import TrainerOptions, make_logger

    if environment is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", environment)
    assert TrainerOptions().wandb_mode == expected
    _, evaluation = evaluate.parse(["severity", "--model", "timm:x"])
    assert evaluation.options.wandb_mode == expected
    # an option given wins over the environment, on the command line and from Python
    _, evaluation = evaluate.parse(["severity", "--model", "timm:x", "--wandb-mode", "offline"])
    assert evaluation.options.wandb_mode == "offline" == TrainerOptions(wandb_mode="offline").wandb_mode
    if expected == "disabled":
        assert make_logger(TrainerOptions(), name="x") is False
        online = make_logger(TrainerOptions(wandb_mode="online"), name="x")
        assert online._wandb_init["mode"] == "online"  # wandb.init would read WANDB_MODE=disabled otherwise


def test_a_wandb_mode_w_and_b_does_not_know_is_named(monkeypatch):
    from evaluation_engine.runner import TrainerOptions

    monkeypatch.setenv("WANDB_MODE", "ofline")
    with pytest.raises(ValueError, match=r"the environment's WANDB_MODE='ofline' is not a W&B mode .*'dryrun'"):
        TrainerOptions()
    assert TrainerOptions(wandb_mode="disabled").wandb_mode == "disabled"  # not read where the option is given
    with pytest.raises(ValueError, match=r"wandb_mode must be one of \['offline', 'online', 'disabled'\], got 'on'"):
        TrainerOptions(wandb_mode="on")


def test_each_evaluation_finishes_the_wandb_run_it_started_and_leaves_the_users_open(tmp_path, monkeypatch):
    """Lightning's logger writes into any W&B run still open in the process: an evaluation that left its run open
    made the next command from Python (and the card's own run) log into it."""
    import wandb

    from evaluation_engine.runner import TrainerOptions, evaluation_logger

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")  # Lightning's offline logger sets it to dryrun: restored after
    options = TrainerOptions(wandb_mode="offline", log_dir=str(tmp_path), wandb_project="runs")
    ids = []
    for name in ("first", "second"):
        with evaluation_logger(options, name=name) as logger:
            logger.log_metrics({"x": 1.0})
            ids.append(logger.experiment.id)
        assert wandb.run is None
    assert ids[0] != ids[1] and len(list(tmp_path.glob("wandb/offline-run-*"))) == 2
    mine = wandb.init(mode="offline", dir=str(tmp_path), project="mine")
    try:
        with evaluation_logger(options, name="third") as logger:
            logger.log_metrics({"x": 2.0})
        assert wandb.run is mine  # the user's run stays open
    finally:
        mine.finish()


def test_oscr_leaves_an_unreadable_test_image_out_and_counts_it(tmp_path: Path, monkeypatch) -> None:
    """A user's class folders with one corrupt test image: refused by default (naming the file), and under
    ``on_bad_image: skip`` left out of the test set before the scoring pass, named in a warning and counted in
    ``counts.skipped_images``; the other images are scored (every count one lower than the files)."""
    from tests.conftest import make_imagenet_folder
    from tests.test_train import folders_args

    root = make_imagenet_folder(tmp_path / "mine", ["cat", "dog", "fox", "owl"], train=5, val=2)
    train.run(folders_args(root, tmp_path / "csv", "--data.init_args.negative=[fox]", "--data.init_args.unknown=[owl]",
                           f"--checkpoint_dir={tmp_path / 'run'}"))
    checkpoint = next((tmp_path / "run").glob("*.ckpt"))
    corrupt = sorted((root / "val" / "owl").iterdir())[0]
    corrupt.write_bytes(b"not a JPEG")
    common = ["oscr", "--model", str(checkpoint), "--wandb-mode", "disabled", "--no-plots", "--accelerator", "cpu"]
    with pytest.raises(SystemExit, match=rf"{corrupt.name}"):
        evaluate.main([*common, "--output-dir", str(tmp_path / "refused")])
    with pytest.warns(RuntimeWarning, match=rf"skipping 1 unreadable image\(s\) of 8: \[.*{corrupt.name}"):
        report = evaluate.main([*common, "--output-dir", str(tmp_path / "skipped"), "--data-arg", "on_bad_image=skip"])
    assert report["counts"] == {"known": 4, "negatives": 2, "unknowns": 1, "skipped_images": 1}
    assert json.loads((tmp_path / "skipped" / "metrics.json").read_text())["counts"] == report["counts"]
    # --data-arg changes the test images' transform, as it changed the test loop's: the pass takes the datamodule's
    sizes = []
    outputs = ScoringPasses.outputs

    def recording(self, runner, model, evaluation_set, **kwargs):
        sizes.append(kwargs["model_input"].size)
        return outputs(self, runner, model, evaluation_set, **kwargs)

    monkeypatch.setattr(ScoringPasses, "outputs", recording)
    evaluate.main([*common, "--output-dir", str(tmp_path / "resized"), "--data-arg", "on_bad_image=skip",
                   "--data-arg", "resize_size=30", "--data-arg", "crop_size=28"])
    assert sizes == [(28, 28)]
