"""A detector's own pass through the model (AdaSCALE's perturbed features, ODIN's scores) in the engine: run with
a backward, sharded and cached like every pass, shared by the detectors that run the same pass, read by the fit
and the score; and what each detector costs (:meth:`ScoringPasses.costs`)."""

from __future__ import annotations

import pytest
import torch

from datamodules.evaluation import EvaluationSet, TensorImageDataset
from datamodules.transforms import ModelInput, TensorPipeline
from evaluation_engine.scoring import ScoringPasses
from lightning_modules.scoring import ScoringModel
from metrics.detectors import DETECTORS, build_detector
from metrics.detectors.adascale import STATISTIC
from metrics.detectors.nac import STATES as NAC_STATES
from metrics.detectors.nac import WIDTHS as NAC_WIDTHS
from tests.evaluation_engine.test_scoring import fake_runner
from tests.metrics.detectors.test_adascale import Net


def model() -> ScoringModel:
    return ScoringModel(Net(classes=3).eval(), model_input=ModelInput(TensorPipeline(6, 3)), name="net")


def image_set(name: str, role: str, n: int, seed: int) -> EvaluationSet:
    generator = torch.Generator().manual_seed(seed)
    return EvaluationSet(name, role, TensorImageDataset(torch.rand(n, 3, 6, 6, generator=generator),
                                                        torch.arange(n) % 3 if role != "ood" else torch.full((n,), -2)))


def test_adascale_runs_its_own_pass_once_for_a_and_l_and_scores_what_the_detector_scores(tmp_path) -> None:
    runner, scoring = fake_runner(0, 1), model()
    validation, test = image_set("id_val", "fit", 24, 1), image_set("ood", "ood", 10, 2)
    passes = ScoringPasses(tmp_path)
    fitted = {name: passes.fitted_detector(runner, scoring, DETECTORS[name], DETECTORS[name].arguments(), validation,
                                           batch_size=7) for name in ("adascale_a", "adascale_l")}
    scores = {name: passes.scores(runner, scoring, test, DETECTORS[name], DETECTORS[name].arguments(), batch_size=7)
              for name in fitted}
    # the shared pass and one AdaSCALE pass per set: 4 passes for two detectors on two sets
    assert passes.passes == 4
    kinds = [(entry["set"], entry["pass"].rsplit("-", 1)[-1], entry["source"]) for entry in passes.log]
    assert ("ood", "adascale", "run") in kinds and ("ood", "adascale", "memory") in kinds
    # the same numbers by hand: the detector's own pass on the images, fitted on the validation images
    net = scoring.network
    for name, detector in fitted.items():
        by_hand = build_detector(name)
        by_hand._store_head(net.fc.weight.detach(), net.fc.bias.detach())
        with torch.no_grad():
            fit_features = net.features(validation.dataset.images)
            test_features = net.features(test.dataset.images)
        by_hand.fit({"features": fit_features, "targets": validation.labels(),
                     STATISTIC: by_hand.image_outputs(net, validation.dataset.images)[STATISTIC]},
                    head=(net.fc.weight.detach(), net.fc.bias.detach()))
        expected = by_hand.score({"features": test_features,
                                  STATISTIC: by_hand.image_outputs(net, test.dataset.images)[STATISTIC]})
        torch.testing.assert_close(scores[name], expected.float().double(), rtol=1e-5, atol=1e-6)
        assert torch.equal(detector.fit_statistics, detector.fit_statistics.sort().values)
    # a second run takes every pass from the cache: nothing runs, the same scores
    again = ScoringPasses(tmp_path)
    for name in fitted:
        again.fitted_detector(runner, scoring, DETECTORS[name], DETECTORS[name].arguments(), validation, batch_size=7)
        assert torch.equal(again.scores(runner, scoring, test, DETECTORS[name], DETECTORS[name].arguments(),
                                        batch_size=7), scores[name])
    assert again.passes == 0
    # another percentile range is another fit, not another pass (OpenOOD's search over it reruns no backward)
    wider = DETECTORS["adascale_a"].arguments(p_min=60.0, p_max=95.0)
    again.fitted_detector(runner, scoring, DETECTORS["adascale_a"], wider, validation, batch_size=7)
    assert not torch.equal(again.scores(runner, scoring, test, DETECTORS["adascale_a"], wider, batch_size=7),
                           scores["adascale_a"])
    assert again.passes == 0


def test_costs_name_fit_time_memory_throughput_and_extra_passes(tmp_path) -> None:
    runner, scoring = fake_runner(0, 1), model()
    fit, test = image_set("fit", "fit", 30, 3), image_set("id_test", "id_test", 12, 4)
    passes = ScoringPasses()
    for name in ("softmax", "mahalanobis", "odin", "adascale_a"):
        kappa = DETECTORS[name]
        parameters = kappa.arguments(**({"shrinkage": 0.5} if name == "mahalanobis" else {}))
        passes.fitted_detector(runner, scoring, kappa, parameters, fit, batch_size=5)
        passes.scores(runner, scoring, test, kappa, parameters, batch_size=5)
        passes.scores(runner, scoring, fit, kappa, parameters, batch_size=5) if name == "softmax" else None
    costs = {row["κ"]: row for row in passes.costs()}
    assert list(costs) == ["softmax", "mahalanobis", "odin", "adascale_a"]
    assert costs["softmax"]["scored samples"] == 42 and costs["mahalanobis"]["scored samples"] == 12
    assert costs["softmax"]["fit seconds"] is None and costs["softmax"]["fit samples"] == 0
    assert costs["mahalanobis"]["fit samples"] == 30 and costs["mahalanobis"]["fit seconds"] > 0
    assert costs["adascale_a"]["fit samples"] == 30
    assert {k: (v["forward passes"], v["backward passes"]) for k, v in costs.items()} == {
        "softmax": (1, 0), "mahalanobis": (2, 0), "odin": (2, 1), "adascale_a": (4, 1)}
    for row in costs.values():
        assert row["images/s"] > 0 and "cores" in row["hardware"]
    # softmax: the samples over its two shared passes (the first two run) and its scoring, never faster than the passes
    first = [e["seconds"] for e in passes.log if e["source"] == "run"][:2]
    assert 0 < costs["softmax"]["images/s"] <= 42 / sum(first)
    # a timm model gives its logits and features in one run of the network: Mahalanobis then costs 1 forward pass
    timm = ScoringModel("timm:test_resnet", pretrained=False, model_input=ModelInput(TensorPipeline(6, 3)),
                        model_args={"num_classes": 3})
    kappa = DETECTORS["mahalanobis"]
    passes.fitted_detector(runner, timm, kappa, kappa.arguments(shrinkage=0.5), fit, batch_size=5)
    passes.scores(runner, timm, test, kappa, kappa.arguments(shrinkage=0.5), batch_size=5)
    row = next(r for r in passes.costs() if r["model"] == timm.display_name)
    assert (row["forward passes"], row["backward passes"], row["scored samples"]) == (1, 0, 12)


def _adascale_on(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """AdaSCALE and NAC fitted and scored through the engine on ``world_size`` gloo ranks (one image per batch: a
    batch's composition then cannot change a sample's bits), their own passes sharded and gathered."""
    torch.manual_seed(0)
    runner, scoring = fake_runner(rank, world_size), model()
    validation, test = image_set("id_val", "fit", 9, 1), image_set("ood", "ood", 7, 2)
    passes = ScoringPasses()
    kappa = DETECTORS["adascale_l"]
    detector = passes.fitted_detector(runner, scoring, kappa, kappa.arguments(), validation, batch_size=1)
    nac = DETECTORS["nac"]
    parameters = nac.arguments(layers="conv", alpha=300.0, bins=20, o_star=2)
    counts = passes.fitted_detector(runner, scoring, nac, parameters, validation, fit={"fraction": 1.0},
                                    batch_size=1).counts
    return {"statistics": detector.fit_statistics,
            "scores": passes.scores(runner, scoring, test, kappa, kappa.arguments(), batch_size=1),
            "nac counts": counts, "nac scores": passes.scores(runner, scoring, test, nac, parameters, batch_size=1)}


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
def test_the_backward_pass_sharded_over_two_processes_equals_one_process() -> None:
    from tests.distributed import run_distributed

    single = _adascale_on(0, 1)
    for per_rank in run_distributed(_adascale_on):  # 9 and 7 images over 2 ranks: uneven shards
        assert per_rank.keys() == single.keys()
        for key, value in single.items():  # AdaSCALE's and NAC's backward passes alike
            assert torch.equal(per_rank[key], value), key


def test_nac_runs_its_own_pass_once_per_set_and_scores_what_the_detector_scores(tmp_path) -> None:
    """NAC's pass (the layers' outputs and their KL gradients, one backward) runs once per set and is cached under
    its layers only: another sigmoid steepness, bin count or O* is another fit from the same pass (the authors'
    search reruns no backward). No shared pass: NAC reads nothing else."""
    runner, scoring = fake_runner(0, 1), model()
    fit, test = image_set("fit", "fit", 24, 1), image_set("ood", "ood", 10, 2)
    kappa = DETECTORS["nac"]
    parameters = kappa.arguments(layers="conv", alpha=300.0, bins=20, o_star=2)
    passes = ScoringPasses(tmp_path)
    detector = passes.fitted_detector(runner, scoring, kappa, parameters, fit, fit={"fraction": 1.0}, batch_size=7)
    scores = passes.scores(runner, scoring, test, kappa, parameters, batch_size=7)
    # the fit set's shared pass (its logits check the labels) and NAC's own pass over each set
    assert passes.passes == 3
    kinds = [(entry["set"], entry["pass"].rsplit("-", 1)[-1], entry["source"]) for entry in passes.log]
    assert ("ood", "nac", "run") in kinds and not any(k[:2] == ("ood", "logits") for k in kinds)
    # by hand: the detector's own pass in the engine's batches of 7, rounded to float32 as the engine keeps it
    net = scoring.network
    by_hand = build_detector("nac", **parameters)

    def pass_of(images: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = [by_hand.image_outputs(net, chunk) for chunk in images.split(7)]
        return {key: torch.cat([p[key] for p in parts]).float() for key in (NAC_STATES, NAC_WIDTHS)}

    by_hand.fit({**pass_of(fit.dataset.images), "targets": fit.labels()})
    assert torch.equal(detector.counts, by_hand.counts)
    expected = by_hand.score(pass_of(test.dataset.images))
    assert torch.equal(scores, expected.double()) and len(set(scores.tolist())) > 3
    costs = {row["κ"]: row for row in passes.costs()}
    assert (costs["nac"]["forward passes"], costs["nac"]["backward passes"]) == (1, 1)
    # a second run takes every pass from the cache; other bins and coverage counts are another fit, not another pass
    again = ScoringPasses(tmp_path)
    again.fitted_detector(runner, scoring, kappa, parameters, fit, fit={"fraction": 1.0}, batch_size=7)
    assert torch.equal(again.scores(runner, scoring, test, kappa, parameters, batch_size=7), scores)
    other = kappa.arguments(layers="conv", alpha=100.0, bins=50, o_star=3)
    again.fitted_detector(runner, scoring, kappa, other, fit, fit={"fraction": 1.0}, batch_size=7)
    assert not torch.equal(again.scores(runner, scoring, test, kappa, other, batch_size=7), scores)
    assert again.passes == 0
    # the default cap: the authors' 1,000 class-balanced images (all 24 here), and a smaller one by --fit-arg
    again.fitted_detector(runner, scoring, kappa, parameters, fit, batch_size=7)
    assert again.fits[-1]["samples"] == 24
    again.fitted_detector(runner, scoring, kappa, parameters, fit, fit={"images": 6}, batch_size=7)
    assert again.fits[-1]["samples"] == 6
