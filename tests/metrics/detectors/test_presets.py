"""OpenOOD v1.5's presets and automatic parameter search (:mod:`metrics.detectors.presets`): the search's order
and tie rule against OpenOOD's logic, its AUROCs against sklearn, the presets' unit conversions against OpenOOD's
formulas (written here from its code), every preset building its detector, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from metrics.detectors import build_detector, detectors, resolve_detector
from metrics.detectors.perturbation import odin
from metrics.detectors.presets import (
    BENCHMARK_SEARCH_GRIDS,
    BENCHMARKS,
    INPUT_STD,
    PRESETS,
    SEARCH_GRIDS,
    Preset,
    grid_combinations,
    preset_entry,
    preset_parameters,
    search_grid,
    tune,
)
from metrics.detectors.shaping import kept_count
from tests.metrics.detectors.helpers import fit_data, fitted, generator, make_features, make_head


# ------------------------------------------------------------------------- OpenOOD's search, from its logic
def openood_recursive_generator(lists: list[list], n: int) -> list[list]:
    """``Evaluator.recursive_generator``: the combinations, the last list outermost."""
    if n == 1:
        return [[x] for x in lists[0]]
    return [y + [x] for x in lists[n - 1] for y in openood_recursive_generator(lists, n - 1)]


def openood_choice(aurocs: list[float]) -> int:
    """``Evaluator.hyperparam_search``'s rule: ``if auroc > max_auroc`` from ``max_auroc = 0``."""
    best, chosen = 0.0, None
    for i, value in enumerate(aurocs):
        if value > best:
            chosen, best = i, value
    return chosen


# hand-computed AUROCs (ID positive, ties ½): pairs (id, ood) won / all
HAND = {
    "low": (([1.0, 2.0], [2.0, 3.0]), (0 + 0.5 + 0 + 0) / 4),               # 1<2, 1<3, 2=2, 2<3 -> 0.125
    "mid": (([1.0, 3.0], [2.0, 2.0]), (0 + 0 + 1 + 1) / 4),                 # 0.5
    "high": (([2.0, 3.0, 3.0], [1.0, 3.0]), (1 + 0 + 1 + 0.5 + 1 + 0.5) / 6),  # 4/6
}


def test_search_takes_the_first_best_in_openoods_order_among_ties() -> None:
    grid = {"gamma": [0.01, 0.1, 0.5], "M": [10, 50]}
    # the best AUROC twice: (0.1, 10) is 2nd in OpenOOD's order (gamma fastest), (0.01, 50) 2nd in itertools'
    table = {(0.01, 10): "low", (0.1, 10): "high", (0.5, 10): "mid", (0.01, 50): "high", (0.1, 50): "mid",
             (0.5, 50): "low"}
    calls = []

    def score_fn(parameters: dict) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(parameters)
        (id_scores, ood_scores), _ = HAND[table[parameters["gamma"], parameters["M"]]]
        return torch.tensor(id_scores), torch.tensor(ood_scores)

    result = tune("gen", grid, score_fn)
    theirs = openood_recursive_generator([grid["gamma"], grid["M"]], 2)
    assert [[c["gamma"], c["M"]] for c in result.combinations] == theirs == [[c["gamma"], c["M"]] for c in calls]
    assert list(result.aurocs) == [HAND[table[tuple(c)]][1] for c in theirs]
    assert result.index == openood_choice(list(result.aurocs)) == 1
    assert result.parameters == {"gamma": 0.1, "M": 10} and result.auroc == pytest.approx(4 / 6)
    assert result.grid == {"gamma": (0.01, 0.1, 0.5), "M": (10, 50)}
    # in itertools.product's order the first best would be the other one: the order decides the choice
    product_order = [(g, m) for g in grid["gamma"] for m in grid["M"]]
    assert next(c for c in product_order if table[c] == "high") == (0.01, 50)


def test_grid_combinations_follow_the_recursive_generator_for_three_parameters() -> None:
    grid = {"a": [1, 2], "b": ["x", "y", "z"], "c": [True, False]}
    ours = [list(c.values()) for c in grid_combinations(grid)]
    assert ours == openood_recursive_generator(list(grid.values()), 3)
    assert grid_combinations({}) == [{}]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_aurocs_are_sklearns_and_the_choice_the_first_maximum_on_random_scores_with_ties(seed) -> None:
    g = generator(seed)
    grid = {"percentile": list(SEARCH_GRIDS["react"]["percentile"])}
    # coarse integer scores: ties within and across sides, and equal AUROCs across combinations
    draws = {p: (torch.randint(0, 4, (30,), generator=g).double(), torch.randint(0, 3, (20,), generator=g).double())
             for p in grid["percentile"]}
    draws[grid["percentile"][3]] = draws[grid["percentile"][1]]  # a guaranteed tie of two AUROCs
    result = tune("react", grid, lambda parameters: draws[parameters["percentile"]])
    expected = [roc_auc_score(np.r_[np.ones(30), np.zeros(20)], np.r_[i.numpy(), o.numpy()])
                for i, o in (draws[p] for p in grid["percentile"])]
    np.testing.assert_allclose(result.aurocs, expected, rtol=0, atol=1e-12)
    assert result.index == int(np.argmax(expected))  # numpy's argmax: the first maximum


def test_search_of_vim_where_d_exceeds_the_width_keeps_the_first() -> None:
    """ViM's grid [256, 1000] on 512-wide features: the project's d = 1000 >= D is D // 2 = 256, the same detector,
    so the two tie and the first, 256, is chosen (OpenOOD's 1000 there has an empty residual)."""
    g = generator(3)
    width, classes = 512, 4
    weight, bias = torch.randn(classes, width, generator=g, dtype=torch.float64) / 20, torch.zeros(classes,
                                                                                                  dtype=torch.float64)
    train = torch.relu(torch.randn(700, width, generator=g, dtype=torch.float64))
    targets = torch.arange(700) % classes
    id_val = torch.relu(torch.randn(60, width, generator=g, dtype=torch.float64))
    ood_val = torch.relu(torch.randn(40, width, generator=g, dtype=torch.float64) * 1.3)

    def score_fn(parameters):
        detector = build_detector("vim", **parameters).fit({"features": train, "targets": targets},
                                                            head=(weight, bias))
        return detector.score({"features": id_val}), detector.score({"features": ood_val})

    result = tune("vim", None, score_fn)
    assert result.grid == SEARCH_GRIDS["vim"] and result.aurocs[0] == result.aurocs[1]
    assert result.parameters == {"d": 256}


def test_search_checks_its_grid_and_scores_before_and_while_scoring() -> None:
    calls = []

    def score_fn(parameters):
        calls.append(parameters)
        return torch.tensor([1.0, 2.0]), torch.tensor([0.0])

    with pytest.raises(ValueError, match=r"tune 'react': the grid's 'clip' is not a hyperparameter .* \['percentile'\]"):
        tune("react", {"clip": [1.0]}, score_fn)
    with pytest.raises(ValueError, match=r"combination \{'percentile': 90\} is invalid: .*fraction in \(0, 1\)"):
        tune("react", {"percentile": [0.85, 90]}, score_fn)  # OpenOOD's unit, refused before any scoring
    with pytest.raises(ValueError, match="the grid's 'k' needs a non-empty list of values, got \\[\\]"):
        tune("knn", {"k": []}, score_fn)
    with pytest.raises(ValueError, match="no OpenOOD search grid for detector 'dice'; OpenOOD searches"):
        tune("dice", None, score_fn)
    with pytest.raises(ValueError, match="unknown detector 'nope'"):
        tune("nope", {}, score_fn)
    assert calls == []
    with pytest.raises(ValueError, match=r"score_fn\(\{'k': 50\}\) must return \(id_val_scores, ood_val_scores\)"):
        tune("knn", {"k": [50]}, lambda parameters: torch.zeros(3))
    with pytest.raises(ValueError, match=r"the scores of \{'k': 100\}: ood_scores is empty"):
        tune("knn", {"k": [50, 100]}, lambda p: (torch.ones(2), torch.zeros(1 if p["k"] == 50 else 0)))


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_default_grids_are_valid_and_search_what_openood_searches(benchmark) -> None:
    searched = {name for name, entry in PRESETS[benchmark].items() if entry.searched}
    assert set(SEARCH_GRIDS) >= searched and set(SEARCH_GRIDS) - searched <= {"nac"}  # no NAC on imagenet200
    assert set(BENCHMARK_SEARCH_GRIDS) <= set(SEARCH_GRIDS)
    for name in searched:
        grid = search_grid(name, benchmark)
        cls = resolve_detector(name)
        for combination in grid_combinations(grid):
            built = build_detector(name, **combination)
            assert {k: getattr(built, k) for k in combination} == combination, (name, combination)
        # each preset's value is one of its grid's (OpenOOD's postprocessor_args are the sweep's start)
        parameters = PRESETS[benchmark][name].parameters
        for key, values in grid.items():  # a key "a,b" searches pairs jointly (AdaSCALE's percentile ranges)
            assert tuple(parameters[k] for k in key.split(",")) in (values if "," in key else
                                                                    [(v,) for v in values]), (name, key)
        assert {k for key in grid for k in key.split(",")} <= set(cls.hyperparameter_defaults())


NAC_SWEEPS = {  # the fork's postprocessor_sweep per benchmark, per layer: O, M, sig_alpha (method: one value)
    "cifar10": {"avgpool": ([10, 50], [50], [100]), "layer3": ([100], [50, 500], [1000, 5000]),
                "layer2": ([5, 10], [50], [0.001]), "layer1": ([5, 10, 50, 100], [50, 500], [0.001, 0.005])},
    "cifar100": {"avgpool": ([50], [50, 500], [1, 50]), "layer3": ([500], [50, 500, 1000], [10, 50, 100]),
                 "layer2": ([100, 500], [50, 500], [1]), "layer1": ([5, 50], [50], [0.005])},
    "imagenet1k": {"avgpool": ([10, 50, 500], [50, 500], [3000]), "layer3": ([100, 500], [50, 500], [50, 100, 300]),
                   "layer2": ([50, 500], [500], [0.01]), "layer1": ([5000], [500, 1000], [0.1, 1])},
}


@pytest.mark.parametrize("benchmark", sorted(NAC_SWEEPS))
def test_nac_grid_is_the_authors_sweep_in_their_search_order(benchmark) -> None:
    """The fork's ``args_dict`` (``{layer}_{O, M, sig_alpha, method}`` per layer in the file's order) through its
    ``recursive_generator`` and ``set_hyperparam`` (four values per layer): the same combinations, in order."""
    sweep = NAC_SWEEPS[benchmark]
    lists = [values for layer in sweep for values in (*sweep[layer], ["sigmoid(o*g_kl)"])]
    expected = []
    for combination in openood_recursive_generator(lists, len(lists)):
        per_layer = [combination[i:i + 4] for i in range(0, len(combination), 4)]  # O, M, sig_alpha, method
        expected.append({"o_star": tuple(o for o, _, _, _ in per_layer), "bins": tuple(m for _, m, _, _ in per_layer),
                         "alpha": tuple(float(a) for _, _, a, _ in per_layer)})
    combinations = grid_combinations(search_grid("nac", benchmark))
    assert combinations == expected and len(combinations) == {"cifar10": 256, "cifar100": 288, "imagenet1k": 576}[
        benchmark]
    entry = preset_entry("openood", benchmark, "nac")
    assert entry.searched and entry.fit_split == "id_train" and entry.openood_name == "nac"
    assert entry.parameters["layers"] == ("avgpool", "layer3", "layer2", "layer1")
    # the search runs on the same pass: the grid leaves the layers alone
    assert all("layers" not in c for c in combinations)
    if benchmark == "imagenet1k":  # the detector's defaults are the ImageNet-1K file's values
        default, preset = build_detector("nac"), build_detector("nac", **preset_parameters("openood", benchmark, "nac"))
        assert [(d.layers, d.layer_alpha, d.layer_bins, d.layer_o_star) for d in (default, preset)] == \
            [(preset.layers, preset.alpha, preset.bins, preset.o_star)] * 2
        assert search_grid("nac") is SEARCH_GRIDS["nac"] == search_grid("nac", "imagenet1k")
    with pytest.raises(ValueError, match="no nac_imagenet200.yml"):
        preset_entry("openood", "imagenet200", "nac")


def test_tune_searches_nac_over_its_benchmarks_grid() -> None:
    seen = []

    def score_fn(parameters):
        seen.append(parameters)
        best = parameters["o_star"] == (50, 100, 10, 100)  # a combination of CIFAR-10's grid only
        return torch.tensor([2.0 if best else 1.0]), torch.tensor([1.5])

    result = tune("nac", None, score_fn, benchmark="cifar10")
    assert len(seen) == 256 and result.parameters["o_star"] == (50, 100, 10, 100) and result.auroc == 1.0
    assert len(tune("nac", None, lambda p: (torch.ones(1), torch.zeros(1)), benchmark="fashion").combinations) == 576
    # a joint key of the default grids is searched as its parts (AdaSCALE's percentile pairs too)
    def adascale(parameters):  # the pair [70, 95] separates, the others tie
        best = (parameters["p_min"], parameters["p_max"]) == (70.0, 95.0)
        return torch.tensor([2.0 if best else 1.0]), torch.tensor([1.5])

    searched = tune("adascale_a", None, adascale)
    assert len(searched.combinations) == 36 and searched.auroc == 1.0
    assert (searched.parameters["p_min"], searched.parameters["p_max"]) == (70.0, 95.0)


# ------------------------------------------------------------------------- the presets
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_every_openood_preset_builds_its_detector_with_its_values(benchmark) -> None:
    registered = detectors()
    for name, entry in PRESETS[benchmark].items():
        assert name == entry.detector and name in registered
        parameters = preset_parameters("openood", benchmark, name)
        built = build_detector(name, **parameters)
        assert {k: getattr(built, k) for k in parameters} == parameters
        assert built.hyperparameters() == {**type(built).hyperparameter_defaults(), **parameters}
        # the fit hint: a split where the detector fits on data, none where it does not
        assert (entry.fit_split is not None) == type(built).fit_data, name
        assert entry.openood_name and entry.source.startswith("configs/postprocessors/")


def test_paper_preset_is_the_projects_defaults_for_every_registered_detector() -> None:
    for name in detectors():
        parameters = preset_parameters("paper", "imagenet1k", name)
        assert build_detector(name, **parameters).hyperparameters() == build_detector(name).hyperparameters()
        assert preset_entry("paper", "cifar10", name).openood_name is None


def test_preset_parameters_are_a_copy() -> None:
    parameters = preset_parameters("openood", "cifar10", "gen")
    parameters["gamma"] = 5.0
    assert preset_parameters("openood", "cifar10", "gen")["gamma"] != 5.0
    with pytest.raises(TypeError):
        PRESETS["cifar10"]["gen"].parameters["gamma"] = 5.0  # type: ignore[index]


OPENOOD_WIDTHS = (512, 2048, 768, 3024)
"""The pooled feature widths of OpenOOD v1.5's networks: ResNet-18 (CIFAR, ImageNet-200), ResNet-50, ViT-B/16 and
Swin-T, RegNet-Y-16GF."""


@pytest.mark.parametrize("percentile", sorted({*range(65, 100, 5), 99}))
def test_converted_percentile_keeps_what_openoods_ash_and_scale_keep(percentile) -> None:
    """OpenOOD's ``k = n - int(np.round(n * percentile / 100.0))`` equals the project's kept count at
    ``percentile / 100`` for OpenOOD's networks' widths, and for every width up to 4096 but where ``n · percentile /
    100`` is a half-integer, which OpenOOD rounds to even and the float ``n · 0.7`` may put below (percentile 70:
    n = 45, 85, 165, ...: one activation more kept here)."""
    p = percentile / 100
    differ = [n for n in range(1, 4097) if kept_count(n, p) != n - int(np.round(n * percentile / 100.0))]
    assert all(n * percentile % 100 == 50 for n in differ), differ
    assert not set(differ) & set(OPENOOD_WIDTHS)
    assert (len(differ), differ[:3]) == ((39, [45, 85, 165]) if percentile == 70 else (0, []))


def openood_energy_of_shaped(features: np.ndarray, head, percentile: float, variant: str) -> np.ndarray:
    """OpenOOD's ``ash_b`` / ``scale`` (openood/networks/ash_net.py, scale_net.py) on pooled features, then the
    energy of the linear head, in numpy."""
    n = features.shape[1]
    k = n - int(np.round(n * percentile / 100.0))
    s1 = features.sum(axis=1)
    order = np.argsort(-features, axis=1, kind="stable")[:, :k]
    kept = np.take_along_axis(features, order, axis=1)
    if variant == "ash_b":
        shaped = np.zeros_like(features)
        np.put_along_axis(shaped, order, (s1 / k)[:, None], axis=1)
    else:
        shaped = features * np.exp(s1 / kept.sum(axis=1))[:, None]
    logits = shaped @ head[0].numpy().T + head[1].numpy()
    top = logits.max(axis=1)
    return top + np.log(np.exp(logits - top[:, None]).sum(axis=1))


@pytest.mark.parametrize("name", ["ash_b", "scale"])
def test_ash_and_scale_presets_score_as_openoods_shaping(name) -> None:
    head = make_head()
    # ASH-B keeps tied values at different positions differently: continuous features there; SCALE depends only
    # on the kept sum, so it gets ties
    features, _ = make_features(50, seed=4, grid=None if name == "ash_b" else 0.5)
    detector = fitted(name, {}, head, **preset_parameters("openood", "imagenet1k", name))
    percentile = {"ash_b": 90, "scale": 85}[name]  # OpenOOD's ash.yml / scale.yml values
    np.testing.assert_allclose(detector.score({"features": features}).numpy(),
                               openood_energy_of_shaped(features.numpy(), head, percentile, name), rtol=1e-12)


@pytest.mark.parametrize("percentile", [85, 90, 95, 99])
def test_react_clip_at_the_converted_percentile_is_openoods_on_the_id_val_features(percentile) -> None:
    head = make_head()
    val, targets = make_features(120, seed=8, grid=0.25)  # ties
    entry = preset_entry("openood", "cifar100", "react")
    assert entry.fit_split == "id_val"
    detector = fitted("react", fit_data(val, targets, head), head, percentile=percentile / 100)
    assert float(detector.threshold) == np.percentile(val.numpy().flatten(), percentile)  # OpenOOD's set_hyperparam


@pytest.mark.parametrize(("high", "low"), [(85, 1), (90, 10), (95, 5), (99, 15)])
def test_vra_clips_at_the_converted_percentiles_are_openoods_on_the_id_val_features(high, low) -> None:
    head = make_head()
    val, targets = make_features(120, seed=8, grid=0.25)  # ties
    entry = preset_entry("openood", "imagenet1k", "vra")
    assert entry.fit_split == "id_val" and entry.searched
    assert entry.parameters == {"upper_percentile": 0.9, "lower_percentile": 0.1}
    detector = fitted("vra", fit_data(val, targets, head), head, upper_percentile=high / 100, lower_percentile=low / 100)
    flat = val.numpy().flatten()  # VRAPostprocessor.set_hyperparam: np.percentile of the flattened activations
    assert float(detector.upper_threshold) == np.percentile(flat, high)
    assert float(detector.lower_threshold) == np.percentile(flat, low)


def test_fit_splits_of_the_new_presets_are_openoods_and_the_paper_preset_follows_the_detector() -> None:
    splits = {name: preset_entry("openood", "cifar10", name).fit_split for name in ("nci", "fdbd", "gradnorm", "vra")}
    assert splits == {"nci": "id_train", "fdbd": "id_train", "gradnorm": None, "vra": "id_val"}
    assert preset_entry("paper", "cifar10", "vra").fit_split == "id_val"  # VRA's fit_split is "val"
    assert preset_entry("paper", "cifar10", "nci").fit_split == "id_train"
    assert preset_entry("paper", "cifar10", "gradnorm").fit_split is None
    assert preset_parameters("openood", "cifar100", "fdbd") == {"distance_to_mean": True}
    assert preset_parameters("openood", "cifar100", "nci") == {"alpha": 0.0001}
    assert preset_parameters("openood", "cifar100", "gradnorm") == {"temperature": 1.0}
    assert not preset_entry("openood", "cifar100", "gradnorm").searched


def test_dice_preset_masks_as_openoods_percentile_of_the_contributions() -> None:
    head = make_head()
    train, targets = make_features(200, seed=9, grid=0.5)
    detector = fitted("dice", fit_data(train, targets, head), head, **preset_parameters("openood", "cifar10", "dice"))
    contributions = train.numpy().mean(axis=0)[None, :] * head[0].numpy()
    threshold = np.percentile(contributions, 90)  # dice.yml p: 90, dice_postprocessor.calculate_mask
    np.testing.assert_allclose(float(detector.threshold), threshold, rtol=1e-12)
    np.testing.assert_array_equal(detector.masked_weight.numpy(), head[0].numpy() * (contributions > threshold))


def test_nnguide_klm_and_openmax_presets_score_as_openoods_postprocessors() -> None:
    """nnguide.yml's K 100 on its 1% bank (the detector's default fit cap), KL matching fitted on ID val, OpenMax's
    hard-coded tail 20, alpha 3 and Euclidean distance: each scores as OpenOOD's postprocessor (written in numpy in
    the detectors' tests) with these values."""
    from tests.metrics.detectors.test_klm import klm_logits, openood_klm
    from tests.metrics.detectors.test_nnguide import openood_nnguide
    from tests.metrics.detectors.test_openmax import authors_openmax, openmax_data

    entries = {name: preset_entry("openood", "imagenet1k", name) for name in ("nnguide", "klm", "openmax")}
    assert {name: (dict(e.parameters), e.fit_split, e.searched) for name, e in entries.items()} == {
        "nnguide": ({"k": 100}, "id_train", False), "klm": ({}, "id_val", False),
        "openmax": ({"tailsize": 20, "alpha": 3, "euclidean_weight": 1.0, "cosine_weight": 0.0}, "id_train", False)}
    assert resolve_detector("nnguide").default_fit == {"fraction": 0.01}  # nnguide.yml's alpha
    assert resolve_detector("klm").fit_split == "val"  # the detector declares what its preset says
    head = make_head()
    features, targets = make_features(seed=4, grid=0.5)
    test, _ = make_features(40, seed=5)
    detector = fitted("nnguide", fit_data(features, targets, head), head, **preset_parameters("openood", "imagenet1k",
                                                                                              "nnguide"))
    theirs = openood_nnguide(features.numpy(), (features @ head[0].T + head[1]).numpy(), test.numpy(),
                             (test @ head[0].T + head[1]).numpy(), 100)
    np.testing.assert_allclose(detector.score({"features": test, "logits": test @ head[0].T + head[1]}).numpy(),
                               theirs, rtol=1e-8)
    val, val_targets, scored = klm_logits(0.5)
    detector = build_detector("klm", **preset_parameters("openood", "cifar10", "klm"))
    detector.fit({"logits": val, "targets": val_targets})
    np.testing.assert_allclose(detector.score({"logits": scored}).numpy(), openood_klm(val.numpy(), scored.numpy()),
                               rtol=0, atol=1e-13)
    data = openmax_data(None, seed=3)
    detector = build_detector("openmax", **preset_parameters("openood", "cifar100", "openmax"))
    detector.fit({"logits": data["logits"], "targets": data["targets"]})
    theirs = authors_openmax(data["logits"].numpy(), data["targets"].numpy(), data["test"].numpy(), tailsize=20,
                             alpha=3, euclidean=1.0, cosine=0.0)
    np.testing.assert_allclose(detector.score({"logits": data["test"]}).numpy(), theirs, rtol=1e-10)


@pytest.mark.parametrize("m", [10, 50, 100, 1000])
def test_gen_preset_ranks_as_openoods_sum_over_the_m_largest(m) -> None:
    g = generator(11)
    logits = torch.round(torch.randn(40, 200, generator=g, dtype=torch.float64) * 3)  # ties
    parameters = {**preset_parameters("openood", "imagenet200", "gen"), "M": m}
    ours = build_detector("gen", **parameters).score({"logits": logits}).numpy()
    p = torch.softmax(logits, dim=1).numpy()
    top = np.sort(p, axis=1)[:, -m:]  # gen_postprocessor.generalized_entropy: probs sorted, [:, -M:]
    theirs = -(top ** 0.1 * (1 - top) ** 0.1).sum(axis=1)
    np.testing.assert_allclose(ours * min(m, 200), theirs, rtol=1e-12)


class Normalised(nn.Module):
    """A linear classifier of [0, 1] images that normalises inside itself; it records its inputs."""

    def __init__(self, mean: tuple, std: tuple) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float64)[None, :, None, None])
        self.register_buffer("std", torch.tensor(std, dtype=torch.float64)[None, :, None, None])
        self.linear = nn.Linear(3 * 4 * 4, 5).double()
        torch.nn.init.normal_(self.linear.weight, generator=generator(12))
        self.inputs: list[torch.Tensor] = []

    def head(self, normalised: torch.Tensor) -> torch.Tensor:
        return self.linear(normalised.flatten(1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.inputs.append(images.detach().clone())
        return self.head((images - self.mean) / self.std)


@pytest.mark.parametrize("benchmark", ["cifar10", "imagenet1k"])
def test_odin_epsilon_is_openoods_noise_for_a_model_of_01_images(benchmark) -> None:
    """OpenOOD's ODINPostprocessor on the normalised input (its gradient's sign divided by the benchmark's std,
    ``noise`` times that subtracted) perturbs the image exactly as the project's ODIN with ``epsilon = noise`` on
    the [0, 1] image."""
    parameters = preset_parameters("openood", benchmark, "odin")
    temperature, noise, std = parameters["temperature"], 0.0014, INPUT_STD[benchmark]
    model = Normalised((0.5, 0.4, 0.3), std)
    images = torch.rand(6, 3, 4, 4, generator=generator(13), dtype=torch.float64)
    ours = odin(model, images, **parameters)
    perturbed = model.inputs[-1]
    # OpenOOD's postprocess, on the normalised data it is given
    data = ((images - model.mean) / model.std).requires_grad_(True)
    output = model.head(data)
    loss = nn.CrossEntropyLoss()(output / temperature, output.detach().argmax(dim=1))
    loss.backward()
    gradient = (torch.ge(data.grad, 0).double() - 0.5) * 2
    gradient = gradient / model.std
    theirs_input = data.detach() - noise * gradient
    torch.testing.assert_close((perturbed - model.mean) / model.std, theirs_input, rtol=0, atol=1e-12)
    logits = model.head(theirs_input).detach() / temperature
    theirs = torch.softmax(logits, dim=1).max(dim=1).values
    torch.testing.assert_close(ours.double(), theirs, rtol=0, atol=1e-6)
    # epsilon in the normalised input's units would be another step: the test can tell them apart
    wrong = data.detach() - (noise / model.std.mean()) * torch.sign(data.grad)
    assert (wrong - theirs_input).abs().max() > 1e-5


# ------------------------------------------------------------------------- errors
def test_preset_errors_name_the_valid_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown preset 'pytorch_ood'; choose from \['openood', 'paper'\]"):
        preset_parameters("pytorch_ood", "cifar10", "knn")
    with pytest.raises(ValueError, match=r"unknown benchmark 'imagenet' \(OpenOOD's 'imagenet' is 'imagenet1k' here\)"
                                         r"; the presets are for \['cifar10', 'cifar100', 'imagenet200', 'imagenet1k'\]"):
        preset_parameters("openood", "imagenet", "knn")
    with pytest.raises(ValueError, match="unknown benchmark 'svhn'; the presets are for"):
        preset_parameters("paper", "svhn", "knn")
    with pytest.raises(ValueError, match=r"no detector 'ash': OpenOOD's 'ash' is the project's 'ash_b'; it has "
                                         r"\['adascale_a', 'adascale_l', 'ash_b', 'dice', "):
        preset_parameters("openood", "cifar10", "ash")
    with pytest.raises(ValueError, match="no detector 'mds': OpenOOD's 'mds' is the project's 'mahalanobis'"):
        preset_parameters("openood", "cifar10", "mds")
    with pytest.raises(ValueError, match=r"no detector 'mc_dropout' \(OpenOOD v1.5 has no counterpart of it\); it has "
                                         r"\[.*'she', 'softmax', 'vim'"):
        preset_parameters("openood", "cifar100", "mc_dropout")
    with pytest.raises(ValueError, match=r"no detector 'gram' \(OpenOOD's 'gram': no project detector"):
        preset_parameters("openood", "cifar100", "gram")
    with pytest.raises(ValueError, match=r"preset 'paper' has no detector 'msp'; it has the registered detectors "
                                         r"\['adascale_a', "):
        preset_parameters("paper", "cifar10", "msp")
    with pytest.raises(ValueError, match=r"fit_split 'train'; choose from \('id_train', 'id_val'\)"):
        Preset("knn", {"k": 5}, "here", fit_split="train")
