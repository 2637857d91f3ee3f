"""C-OOD severity construction and the one-pass κ cache, each side by side with a reference in the same run.

1. Severity construction from cached scores for 21,000 OOD classes x 200 images (150 estimation, 50 test)
   and 50,000 ID scores, G = 1000: per-class means, sort, sliding window, 11 groups and the AUROC of all
   11 levels. Ours (``metrics.class_mean_scores`` + ``severity_levels`` + ``severity_table``) against
   (a) a straightforward implementation of the paper's procedure (a loop over classes for the means, a loop
   over the windows, scikit-learn's ``roc_auc_score`` per level) and (b) one ``torch.sort`` of all scores.
2. Five logit-based κ on the Fashion-MNIST severity data with the demo's small CNN on the CPU: one cached
   forward pass shared by the five κ (``callbacks.SeverityAUROC``) against five separate passes.

    python -m benchmarks.severity_benchmark [--tiny] [--write] [--classes 21000] [--group 1000]
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from sklearn.metrics import roc_auc_score

from benchmarks.common import benchmark_parser, best_time, finish, machine, parse, quiet, table
from callbacks import SeverityAUROC
from datamodules.severity import FashionSeverityData
from datamodules.transforms import ModelInput, TensorPipeline
from evaluation_engine.options import DetectorOptions
from evaluation_engine.runner import Runner
from lightning_modules import OpenSetClassifier
from lightning_modules.scoring import ScoringModel
from metrics import class_mean_scores, severity_levels, severity_table

SECTION = "C-OOD severity construction and the κ cache"
LOGIT_KAPPAS = ["softmax", "max_logit", "entropy", "energy", "pood:EnergyBased"]


def logit_kappas() -> list:
    """The four logit-based κ of the registry plus a fifth of pytorch-ood by name (its energy)."""
    return DetectorOptions(kappa=list(LOGIT_KAPPAS)).detector_classes


def construction_data(classes: int, seed: int = 0, id_images: int = 50_000) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    class_level = torch.rand(classes, generator=generator)
    est_classes = torch.arange(classes).repeat_interleave(150)
    test_classes = torch.arange(classes).repeat_interleave(50)
    return {
        "est_scores": class_level[est_classes] + 0.2 * torch.rand(est_classes.numel(), generator=generator),
        "est_classes": est_classes,
        "test_scores": class_level[test_classes] + 0.2 * torch.rand(test_classes.numel(), generator=generator),
        "test_classes": test_classes,
        "id_scores": 0.6 + 0.4 * torch.rand(id_images, generator=generator),
        "id_correct": torch.rand(id_images, generator=generator) < 0.8,
    }


def ours(data: dict[str, torch.Tensor], group: int) -> list[float]:
    means = class_mean_scores(data["est_scores"], data["est_classes"])
    groups, _ = severity_levels(means, group)
    rows = severity_table(id_scores=data["id_scores"], id_correct=data["id_correct"], ood_scores=data["test_scores"],
                          ood_classes=data["test_classes"], groups=groups, model_name="m", kappa_name="k")
    return [r["ood-auroc"] for r in rows]


def straightforward(data: dict[str, np.ndarray], group: int) -> list[float]:
    """The paper's procedure written the obvious way."""
    est_scores, est_classes = data["est_scores"], data["est_classes"]
    order = np.argsort(est_classes, kind="stable")
    per_class = np.split(est_scores[order], np.flatnonzero(np.diff(est_classes[order])) + 1)
    means = np.array([chunk.mean() for chunk in per_class])
    sorted_classes = np.argsort(means, kind="stable")
    num_windows = len(means) - group + 1
    window_means = [means[sorted_classes[j:j + group]].mean() for j in range(num_windows)]
    starts = [int(i * 0.1 * num_windows) for i in range(11)]
    starts[-1] -= 1
    assert len(window_means) == num_windows
    aurocs = []
    for start in starts:
        members = np.isin(data["test_classes"], sorted_classes[start:start + group])
        labels = np.r_[np.ones(len(data["id_scores"])), np.zeros(members.sum())]
        aurocs.append(roc_auc_score(labels, np.r_[data["id_scores"], data["test_scores"][members]]))
    return aurocs


def construction(classes: int, group: int, id_images: int) -> dict[str, Any]:
    """Ours, the straightforward procedure and one sort, timed; the 11 AUROCs of both checked equal."""
    data = construction_data(classes, id_images=id_images)
    numpy_data = {k: v.numpy() for k, v in data.items()}
    all_scores = torch.cat([data["est_scores"], data["test_scores"], data["id_scores"]])
    t_ours = best_time(lambda: ours(data, group))
    t_sort = best_time(lambda: torch.sort(all_scores))
    start = time.perf_counter()
    reference = straightforward(numpy_data, group)
    t_ref = time.perf_counter() - start
    difference = float(np.max(np.abs(np.asarray(ours(data, group)) - np.asarray(reference))))
    if not difference <= 1e-12:
        raise AssertionError(f"the 11 AUROCs of the two implementations differ by {difference}")
    print(f"construction: ours {t_ours:.3f}s, straightforward {t_ref:.2f}s, one sort {t_sort:.3f}s", flush=True)
    return {"classes": classes, "group": group, "id_images": id_images, "scores": all_scores.numel(),
            "ours_s": t_ours, "straightforward_s": t_ref, "sort_s": t_sort, "auroc_difference": difference}


def kappa_passes(*, estimation: int, test: int) -> dict[str, Any]:
    """The five κ through one ``SeverityAUROC`` (one cached pass per set) and through five, one κ each."""
    pl.seed_everything(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1)
        scoring = ScoringModel(model, model_input=ModelInput(TensorPipeline(28, 1), size=(28, 28), channels=1),
                               name="demo")
        data = FashionSeverityData(estimation=estimation, test=test)
        data.setup()

        def run(kappas: list, cache: str) -> int:
            severity = SeverityAUROC(data=data, kappas=kappas, every_n_epochs=0, cache_dir=cache,
                                     output_dir=str(Path(tmp) / "out"))
            severity.evaluate(Runner.local(), scoring)
            return severity.model_passes

        start = time.perf_counter()
        kappas = logit_kappas()
        shared_passes = run(kappas, str(Path(tmp) / "shared"))
        t_shared = time.perf_counter() - start
        start = time.perf_counter()
        separate_passes = sum(run([k], str(Path(tmp) / f"separate-{i}")) for i, k in enumerate(kappas))
        t_separate = time.perf_counter() - start
        images = {name: len(data[name]) for name in ("id_test", "ood_estimation", "ood_test")}
    print(f"5 kappas: one cached pass {t_shared:.2f}s ({shared_passes} passes), separate {t_separate:.2f}s "
          f"({separate_passes} passes)", flush=True)
    return {"shared_passes": shared_passes, "shared_s": t_shared, "separate_passes": separate_passes,
            "separate_s": t_separate, "images": images}


def markdown(built: dict[str, Any], passes: dict[str, Any]) -> str:
    t_ours, t_ref, t_sort = built["ours_s"], built["straightforward_s"], built["sort_s"]
    images = passes["images"]
    return "\n".join([
        f"Severity construction from cached scores: {built['classes']:,} OOD classes x 200 images (150 estimation "
        f"+ 50 test), {built['id_images']:,} ID scores, G = {built['group']}, 11 levels (per-class means, sort, "
        f"sliding window, groups, AUROC per level); {built['scores']:,} scores in all. Best of 3 for ours and the "
        "sort. The 11 AUROCs of both implementations "
        + ("are identical." if built["auroc_difference"] == 0 else f"agree to {built['auroc_difference']:.0e}."),
        "",
        table(["implementation", "time (s)", "relative to ours"], [
            ("ours (`class_mean_scores` + `severity_levels` + `severity_table`)", f"{t_ours:.3f}", "1.0x"),
            ("straightforward paper procedure (numpy loops + scikit-learn AUROC)", f"{t_ref:.2f}",
             f"{t_ref / t_ours:.1f}x"),
            (f"one `torch.sort` of all {built['scores']:,} scores", f"{t_sort:.3f}", f"{t_sort / t_ours:.2f}x"),
        ]),
        "",
        f"Five logit-based κ ({', '.join(LOGIT_KAPPAS)}) on the Fashion-MNIST severity data "
        f"({images['id_test']:,} ID, {images['ood_estimation']:,} OOD estimation and {images['ood_test']:,} OOD test "
        "images) with the demo's small CNN, on the CPU, the whole `SeverityAUROC` (passes, groups, tables, files):",
        "",
        table(["mode", "model passes", "wall time (s)"], [
            ("one cached forward pass per set, shared by the 5 κ", passes["shared_passes"], f"{passes['shared_s']:.2f}"),
            ("5 separate runs (one per κ, no shared cache)", passes["separate_passes"], f"{passes['separate_s']:.2f}"),
        ]),
        "",
        f"Machine: {machine()}.",
    ])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the tables and, with ``--write``, put them in RESULTS.md.

    Returns:
        ``construction`` and ``kappa_passes``: the measurements of the two parts.
    """
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--classes", type=int, help="OOD classes of the construction (default 21,000)")
    parser.add_argument("--group", type=int, help="G, classes per severity level (default 1000)")
    args = parse(parser, argv)
    classes, group = args.classes or (300 if args.tiny else 21_000), args.group or (20 if args.tiny else 1000)
    built = construction(classes, group, id_images=2_000 if args.tiny else 50_000)
    with quiet():
        passes = kappa_passes(estimation=20 if args.tiny else 100, test=10 if args.tiny else 50)
    finish(args, SECTION, markdown(built, passes), script="benchmarks.severity_benchmark")
    return {"construction": built, "kappa_passes": passes}


if __name__ == "__main__":
    main()
