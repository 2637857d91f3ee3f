"""The OpenOOD v1.5 benchmark's metrics at ImageNet-1K's list sizes (ID test 45,000; near-OOD SSB-hard 49,000 and
NINCO 5,879; far-OOD iNaturalist 10,000, Textures 5,160, OpenImage-O 15,869), 12 synthetic detectors, one run:

(a) the per-set metrics alone (AUROC, FPR@95, AUPR-In, AUPR-Out): ours (``metrics.openood_metrics``, and
    ``metrics.fpr_at_tpr`` in the conventions ``"id"`` and ``"ood"``) against OpenOOD's ``compute_all_metrics``
    loop (re-implemented here from its code: sklearn's ``roc_curve`` and two ``precision_recall_curve``) and
    pytorch-ood's ``OODMetrics``, with the largest difference between them where the definitions agree;
(b) the whole table of every detector (``metrics.benchmark_table``: 7 metrics per set and the near / far / all
    means, 1,000-resample intervals over one shared resample, the AUROC's by logit DeLong); goal < 60 s.

Half the detectors give coarse scores (two decimals: many ties, like a softmax probability in percent), half
continuous float32 scores (almost no ties: the most work for the curves).

    python -m benchmarks.ood_metrics_benchmark [--tiny] [--write] [--resamples 1000] [--detectors 12]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn import metrics as sk

from benchmarks.common import benchmark_parser, finish, load_average, machine, parse, table
from evaluation_engine.intervals import Intervals
from metrics import ResampleCache, benchmark_table, fpr_at_tpr, openood_metrics

SECTION = "OOD benchmark metrics (OpenOOD v1.5)"
ID_SIZE = 45_000
SETS = {"ssb_hard": 49_000, "ninco": 5_879, "inaturalist": 10_000, "textures": 5_160, "openimage_o": 15_869}
GROUPS = {"ssb_hard": "near", "ninco": "near", "inaturalist": "far", "textures": "far", "openimage_o": "far"}
SHIFTS = {"ssb_hard": 0.6, "ninco": 0.8, "inaturalist": 1.6, "textures": 1.3, "openimage_o": 1.2}
GOAL_S = 60.0


def make_data(detectors: int, scale: float, seed: int = 0) -> dict[str, Any]:
    """ID correctness (one classifier) and every detector's scores. Detector ``k`` separates ID from set ``s`` by
    ``d_k · shift_s`` (d_k from 1.2 to 2.4) and follows the images' easiness on ID (so that the misclassified
    images score lower); even ``k`` rounds its scores to two decimals (ties), odd ``k`` keeps float32."""
    rng = np.random.default_rng(seed)
    n_id = max(20, round(ID_SIZE * scale))
    sizes = {name: max(10, round(size * scale)) for name, size in SETS.items()}
    easiness = rng.normal(size=n_id)
    correct = rng.random(n_id) < 1 / (1 + np.exp(-(1.3 + 1.5 * easiness)))
    scores = []
    for k in range(detectors):
        d = 1.2 + 1.2 * k / max(1, detectors - 1)
        id_scores = 0.5 * easiness + rng.normal(size=n_id) + d
        sets = {name: rng.normal(size=size) + d - d * SHIFTS[name] for name, size in sizes.items()}

        def finish_scores(x: np.ndarray, k: int = k) -> torch.Tensor:
            return torch.from_numpy(np.round(x, 2) if k % 2 == 0 else x).float()

        scores.append((finish_scores(id_scores), {name: finish_scores(x) for name, x in sets.items()}))
    return {"correct": torch.from_numpy(correct), "scores": scores, "n_id": n_id, "sizes": sizes}


def compute_all_metrics(conf: np.ndarray, label: np.ndarray) -> list[float]:
    """OpenOOD v1.5's ``compute_all_metrics`` (``openood/evaluators/metrics.py``), metrics only, written here from
    its code: OOD (label -1) positive with ``-conf`` for the ROC (sklearn's default ``drop_intermediate=True``)
    and the AUPR-Out, ID positive with ``conf`` for the AUPR-In; FPR at the first ROC point with TPR >= 0.95."""
    ood_indicator = np.zeros_like(label)
    ood_indicator[label == -1] = 1
    fpr_list, tpr_list, _ = sk.roc_curve(ood_indicator, -conf)
    fpr = fpr_list[np.argmax(tpr_list >= 0.95)]
    precision_in, recall_in, _ = sk.precision_recall_curve(1 - ood_indicator, conf)
    precision_out, recall_out, _ = sk.precision_recall_curve(ood_indicator, -conf)
    return [float(fpr), float(sk.auc(fpr_list, tpr_list)), float(sk.auc(recall_in, precision_in)),
            float(sk.auc(recall_out, precision_out))]


def metrics_alone(data: dict[str, Any]) -> dict[str, Any]:
    """(a): every (detector, set) by the three implementations, timed apart, and their differences; torch on one
    thread, as sklearn and numpy run (on a shared machine torch's thread pool waits for busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _metrics_alone(data)
    finally:
        torch.set_num_threads(threads)


def _metrics_alone(data: dict[str, Any]) -> dict[str, Any]:
    from pytorch_ood.metrics import OODMetrics

    pairs = [(k, name, id_scores, ood) for k, (id_scores, sets) in enumerate(data["scores"])
             for name, ood in sets.items()]
    start = time.perf_counter()
    mine = [openood_metrics(i, o) for _, _, i, o in pairs]
    ours_s = time.perf_counter() - start
    # the other conventions, untimed: the FPR of the papers (ID positive) and pytorch-ood's (every threshold)
    ours = [(m, fpr_at_tpr(i, o), fpr_at_tpr(i, o, convention="ood")) for m, (_, _, i, o) in zip(mine, pairs,
                                                                                              strict=True)]
    start = time.perf_counter()
    openood = []
    for _, _, i, o in pairs:
        conf = np.r_[i.numpy(), o.numpy()]
        label = np.r_[np.zeros(i.numel(), dtype=np.int64), -np.ones(o.numel(), dtype=np.int64)]
        openood.append(compute_all_metrics(conf, label))
    openood_s = time.perf_counter() - start
    start = time.perf_counter()
    theirs = []
    for _, _, i, o in pairs:
        metric = OODMetrics()
        metric.update(-torch.cat([i, o]), torch.cat([torch.zeros(i.numel()), -torch.ones(o.numel())]).long())
        theirs.append(metric.compute())
    pytorch_ood_s = time.perf_counter() - start

    difference = {"auroc openood": 0.0, "aupr openood": 0.0, "auroc pytorch-ood": 0.0, "aupr pytorch-ood": 0.0,
                  "fpr openood": 0.0, "fpr pytorch-ood": 0.0}
    dropped = 0
    for (mine, _, fpr_ood), (fpr, area, area_in, area_out), other in zip(ours, openood, theirs, strict=True):
        difference["auroc openood"] = max(difference["auroc openood"], abs(mine["auroc"] - area))
        difference["aupr openood"] = max(difference["aupr openood"], abs(mine["aupr-in"] - area_in),
                                         abs(mine["aupr-out"] - area_out))
        difference["fpr openood"] = max(difference["fpr openood"], abs(mine["fpr@95tpr-openood"] - fpr))
        difference["auroc pytorch-ood"] = max(difference["auroc pytorch-ood"], abs(mine["auroc"] - other["AUROC"]))
        difference["aupr pytorch-ood"] = max(difference["aupr pytorch-ood"], abs(mine["aupr-in"] - other["AUPR-IN"]),
                                             abs(mine["aupr-out"] - other["AUPR-OUT"]))
        difference["fpr pytorch-ood"] = max(difference["fpr pytorch-ood"], abs(fpr_ood - other["FPR95TPR"]))
        dropped += mine["fpr@95tpr-openood"] != fpr_ood
    if difference["fpr openood"] != 0.0:
        raise AssertionError(f"fpr_at_tpr(convention='openood') and OpenOOD's loop differ by {difference['fpr openood']}")
    if max(difference["auroc openood"], difference["aupr openood"]) > 1e-9:
        raise AssertionError(f"ours and OpenOOD's loop differ: {difference}")
    id_positive = [fpr_id for _, fpr_id, _ in ours]
    ood_positive = [mine["fpr@95tpr-openood"] for mine, _, _ in ours]
    return {"pairs": len(pairs), "ours_s": ours_s, "openood_s": openood_s, "pytorch_ood_s": pytorch_ood_s,
            "difference": difference, "dropped": dropped,
            "fpr_gap": float(np.mean(np.abs(np.array(id_positive) - np.array(ood_positive))))}


def whole_tables(data: dict[str, Any], resamples: int) -> dict[str, Any]:
    """(b): every detector's table over one shared resample (one cache: the resamples are drawn once)."""
    intervals = Intervals(resamples=resamples, seed=0)
    cache = ResampleCache(resamples, 0)
    start = time.perf_counter()
    cache.counts(data["n_id"], 0)
    for position, size in enumerate(data["sizes"].values()):
        cache.counts(size, 1 + position)
    weights_s = time.perf_counter() - start
    seconds, cpu, tables = [], [], []
    for id_scores, sets in data["scores"]:
        begun, begun_cpu = time.perf_counter(), time.process_time()
        tables.append(benchmark_table(id_scores, data["correct"], sets, GROUPS, intervals=intervals, cache=cache))
        seconds.append(time.perf_counter() - begun)
        cpu.append(time.process_time() - begun_cpu)
    distinct = [int(torch.unique(torch.cat([i, *s.values()])).numel()) for i, s in data["scores"]]
    return {"weights_s": weights_s, "seconds": seconds, "cpu": cpu, "total_s": weights_s + sum(seconds),
            "tables": tables, "distinct": distinct, "resamples": resamples}


def run(detectors: int, resamples: int, scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {"load_start": load_average(), "detectors": detectors}
    data = make_data(detectors, scale)
    out["n_id"], out["sizes"] = data["n_id"], data["sizes"]
    out["accuracy"] = float(data["correct"].double().mean())
    out["alone"] = metrics_alone(data)
    a = out["alone"]
    print(f"(a) {a['pairs']} (detector, set) pairs: ours {a['ours_s']:.2f} s, OpenOOD's loop {a['openood_s']:.2f} s, "
          f"pytorch-ood {a['pytorch_ood_s']:.2f} s; differences {a['difference']}", flush=True)
    out["tables"] = whole_tables(data, resamples)
    b = out["tables"]
    print(f"(b) {detectors} tables, B = {resamples}: {b['total_s']:.1f} s (weights {b['weights_s']:.2f} s; per "
          f"detector {min(b['seconds']):.2f}-{max(b['seconds']):.2f} s)", flush=True)
    out["load"] = load_average()
    return out


def markdown(r: dict[str, Any]) -> str:
    a, b = r["alone"], r["tables"]
    sizes = ", ".join(f"{name} {size:,}" for name, size in r["sizes"].items())
    coarse = [s for k, s in enumerate(b["seconds"]) if k % 2 == 0]
    fine = [s for k, s in enumerate(b["seconds"]) if k % 2 == 1]
    coarse_cpu = [s for k, s in enumerate(b["cpu"]) if k % 2 == 0]
    fine_cpu = [s for k, s in enumerate(b["cpu"]) if k % 2 == 1]
    d = a["difference"]
    first = b["tables"][0]
    rows = [[row["set"], row["group"], *(f"{row[m]:.4f} [{row[m + ' low']:.4f}, {row[m + ' high']:.4f}]"
                                          for m in ("auroc", "fpr@95tpr", "fpr@95tpr-openood", "augrc"))]
            for row in first.rows]
    return "\n".join([
        f"ID {r['n_id']:,} images (accuracy {r['accuracy']:.3f}), OOD sets {sizes}; {r['detectors']} synthetic "
        f"detectors, even ones with scores rounded to two decimals ({min(b['distinct'][::2]):,}-"
        f"{max(b['distinct'][::2]):,} distinct values over all images), odd ones float32 "
        f"({min(b['distinct'][1::2] or [0]):,}-{max(b['distinct'][1::2] or [0]):,} distinct). One run; the machine "
        f"is shared (2 cores; load {r['load_start']} at the start, {r['load']} at the end). Machine: {machine()}.",
        "",
        f"**(a) The metrics alone**, {a['pairs']} (detector, set) pairs (AUROC, FPR@95, AUPR-In, AUPR-Out each; "
        "every implementation on one thread):",
        "",
        table(["implementation", "seconds", "largest difference to ours"], [
            ("ours: `openood_metrics`", f"{a['ours_s']:.2f}", "—"),
            ("OpenOOD's `compute_all_metrics` loop (sklearn)", f"{a['openood_s']:.2f}",
             f"FPR@95 (OpenOOD's) {d['fpr openood']:.1e}, AUROC {d['auroc openood']:.1e}, AUPR "
             f"{d['aupr openood']:.1e}"),
            ("pytorch-ood `OODMetrics`", f"{a['pytorch_ood_s']:.2f}",
             f"FPR95TPR vs `convention=\"ood\"` {d['fpr pytorch-ood']:.1e}, AUROC {d['auroc pytorch-ood']:.1e}, "
             f"AUPR {d['aupr pytorch-ood']:.1e}"),
        ]),
        "",
        f"OpenOOD's FPR@95 (its dropped ROC points) differs from every-threshold one (\"ood\", pytorch-ood) in "
        f"{a['dropped']} of {a['pairs']} pairs; the FPR@95 with ID positive (the project's default) differs from "
        f"OpenOOD's by {a['fpr_gap']:.4f} on average.",
        "",
        f"**(b) The whole table**, {r['detectors']} detectors, B = {b['resamples']} resamples (`benchmark_table` "
        "with one `ResampleCache`):",
        "",
        table(["step", "seconds (CPU seconds)"], [
            ("drawing the resamples (ID once, each set once; shared by every detector)", f"{b['weights_s']:.2f}"),
            (f"one detector's table, coarse scores (median of {len(coarse)})",
             f"{np.median(coarse):.2f} ({np.median(coarse_cpu):.2f})"),
            (f"one detector's table, float32 scores (median of {len(fine)})",
             f"{np.median(fine):.2f} ({np.median(fine_cpu):.2f})" if fine else "—"),
            (f"all {r['detectors']} tables, resamples included (goal < {GOAL_S:.0f} s)",
             f"{b['total_s']:.1f} ({sum(b['cpu']):.1f} + the resamples)"),
        ]),
        "",
        "The first detector's table (AUROC, FPR@95 with ID and with OOD positive, AUGRC; estimate [95% interval]):",
        "",
        table(["set", "group", "auroc", "fpr@95tpr", "fpr@95tpr-openood", "augrc"], rows),
    ])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the tables and, with ``--write``, put them in RESULTS.md; returns the numbers."""
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--resamples", type=int, help="bootstrap resamples (default 1000; --tiny 20)")
    parser.add_argument("--detectors", type=int, help="synthetic detectors (default 12; --tiny 3)")
    args = parse(parser, argv)
    resamples = args.resamples or (20 if args.tiny else 1000)
    detectors = args.detectors or (3 if args.tiny else 12)
    result = run(detectors, resamples, 0.02 if args.tiny else 1.0)
    finish(args, SECTION, markdown(result), script="benchmarks.ood_metrics_benchmark")
    return result


if __name__ == "__main__":
    main()
