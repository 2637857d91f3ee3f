"""C-OOD severity construction and the one-pass κ cache, each side by side with a reference in the same run.

1. Severity construction from cached scores for 21,000 OOD classes x 200 images (150 estimation, 50 test)
   and 50,000 ID scores, G = 1000: per-class means, sort, sliding window, 11 groups and the AUROC of all
   11 levels. Ours (``metrics.class_mean_scores`` + ``severity_levels`` + ``severity_table``) against
   (a) a straightforward implementation of the paper's procedure (a loop over classes for the means, a loop
   over the windows, scikit-learn's ``roc_auc_score`` per level) and (b) one ``torch.sort`` of all scores.
2. Five logit-based κ on the Fashion-MNIST severity data with the demo's small CNN on the CPU: one cached
   forward pass shared by the five κ (``callbacks.SeverityAUROC``) against five separate passes.

    python -m benchmarks.severity_benchmark
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from sklearn.metrics import roc_auc_score

from benchmarks.common import best_time, machine, write_section
from metrics import class_mean_scores, severity_levels, severity_table

LOGIT_KAPPAS = ["softmax", "max_logit", "entropy", "energy", "energy_t2"]


def logit_kappas() -> list:
    """The four logit-based κ of metrics.KAPPAS plus a fifth through the pytorch-ood adapter (energy, T = 2)."""
    from pytorch_ood.detector import EnergyBased

    from metrics import KAPPAS, from_pytorch_ood

    return [KAPPAS[name] for name in LOGIT_KAPPAS[:4]] + [
        from_pytorch_ood(EnergyBased(model=None, t=2.0), name="energy_t2", kind="logits")
    ]


def construction_data(classes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    class_level = torch.rand(classes, generator=generator)
    est_classes = torch.arange(classes).repeat_interleave(150)
    test_classes = torch.arange(classes).repeat_interleave(50)
    return {
        "est_scores": class_level[est_classes] + 0.2 * torch.rand(est_classes.numel(), generator=generator),
        "est_classes": est_classes,
        "test_scores": class_level[test_classes] + 0.2 * torch.rand(test_classes.numel(), generator=generator),
        "test_classes": test_classes,
        "id_scores": 0.6 + 0.4 * torch.rand(50_000, generator=generator),
        "id_correct": torch.rand(50_000, generator=generator) < 0.8,
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


def construction(classes: int, group: int) -> str:
    data = construction_data(classes)
    numpy_data = {k: v.numpy() for k, v in data.items()}
    all_scores = torch.cat([data["est_scores"], data["test_scores"], data["id_scores"]])
    t_ours = best_time(lambda: ours(data, group))
    t_sort = best_time(lambda: torch.sort(all_scores))
    start = time.perf_counter()
    reference = straightforward(numpy_data, group)
    t_ref = time.perf_counter() - start
    np.testing.assert_allclose(ours(data, group), reference, atol=1e-12)
    print(f"construction: ours {t_ours:.3f}s, straightforward {t_ref:.2f}s, one sort {t_sort:.3f}s", flush=True)
    return "\n".join([
        f"Severity construction from cached scores: {classes:,} OOD classes x 200 images (150 estimation + 50 "
        f"test), 50,000 ID scores, G = {group}, 11 levels (per-class means, sort, sliding window, groups, AUROC "
        f"per level). {all_scores.numel():,} scores in all. Best of 3 for ours and the sort.",
        "",
        "| implementation | time (s) | relative to ours |",
        "|---|---|---|",
        f"| ours (`class_mean_scores` + `severity_levels` + `severity_table`) | {t_ours:.3f} | 1.0x |",
        f"| straightforward paper procedure (numpy loops + scikit-learn AUROC) | {t_ref:.2f} | {t_ref / t_ours:.1f}x |",
        f"| one `torch.sort` of all {all_scores.numel():,} scores | {t_sort:.3f} | {t_sort / t_ours:.2f}x |",
        "",
        "The 11 AUROCs of both implementations agree to 1e-12.",
    ])


def kappa_passes() -> str:
    from callbacks import SeverityAUROC
    from callbacks.run import launch_loader
    from datamodules.severity import FashionSeverityData
    from datamodules.transforms import ModelInput, TensorPipeline
    from lightning_modules import OpenSetClassifier
    from lightning_modules.scoring import ScoringModel

    pl.seed_everything(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = OpenSetClassifier(num_classes=4, backbone="small_cnn", in_channels=1)
        scoring = ScoringModel(model, model_input=ModelInput(TensorPipeline(28, 1), size=(28, 28), channels=1),
                               name="demo")
        data = FashionSeverityData(estimation=100, test=50)
        data.setup()

        def run(kappas: list, cache: str) -> int:
            severity = SeverityAUROC(data=data, kappas=kappas, every_n_epochs=0, cache_dir=cache,
                                     output_dir=str(Path(tmp) / "out"))
            bench_trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[severity],
                                       limit_test_batches=1, enable_progress_bar=False, enable_model_summary=False)
            bench_trainer.test(scoring, dataloaders=launch_loader(), verbose=False)
            return severity.model_passes

        start = time.perf_counter()
        kappas = logit_kappas()
        shared_calls = run(kappas, str(Path(tmp) / "shared"))
        t_shared = time.perf_counter() - start
        start = time.perf_counter()
        separate_calls = sum(run([k], str(Path(tmp) / f"separate-{i}")) for i, k in enumerate(kappas))
        t_separate = time.perf_counter() - start
    print(f"5 kappas: one cached pass {t_shared:.2f}s ({shared_calls} passes), separate {t_separate:.2f}s "
          f"({separate_calls} passes)", flush=True)
    return "\n".join([
        f"Five logit-based κ ({', '.join(LOGIT_KAPPAS)}) on the Fashion-MNIST "
        "severity data (4,000 ID + 16 x 150 OOD images) with the demo's small CNN, on the CPU, full benchmark "
        "(passes, groups, tables, files):",
        "",
        "| mode | model passes | wall time (s) |",
        "|---|---|---|",
        f"| one cached forward pass shared by the 5 κ | {shared_calls} | {t_shared:.2f} |",
        f"| 5 separate passes (one per κ, no shared cache) | {separate_calls} | {t_separate:.2f} |",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=21_000)
    parser.add_argument("--group", type=int, default=1000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    body = (construction(args.classes, args.group) + "\n\n" + kappa_passes()
            + f"\n\nMachine: {machine()}.")
    if not args.no_write:
        write_section("C-OOD severity construction and the κ cache", body)
    print(body)


if __name__ == "__main__":
    main()
