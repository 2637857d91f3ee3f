"""OSCR + CCR@FPR at N = 1e5, 1e6, 1e7 test samples, side by side with two references in the same run.

(a) the authors' evaluation loop: one pass over the data per distinct threshold (quadratic; run in full
    where it finishes in reasonable time, otherwise timed on a sample of thresholds and extrapolated);
(b) one ``torch.sort`` of N float32 values, the floor for any exact ranking metric.

Target: within 3x of one sort at 1e7.

    python -m benchmarks.oscr_benchmark [--tiny] [--write] [--sizes 1e5 1e6 1e7] [--classes 10]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.common import benchmark_parser, best_time, finish, machine, parse, table
from metrics import DEFAULT_FPR_TARGETS, ccr_from_curve, oscr_curve

SECTION = "OSCR and CCR@FPR"
FULL_LOOP_LIMIT = 100_000  # the authors' loop is run in full up to this many samples


def authors_loop(probs: np.ndarray, target: np.ndarray, thresholds: np.ndarray | None = None) -> tuple[list, list]:
    """CCR and FPR with one pass over the data per threshold, as the authors' evaluation code does."""
    known = target >= 0
    unknown = target == -2
    target_score = probs[known, target[known]]
    correct = probs[known].argmax(axis=1) == target[known]
    unknown_score = probs[unknown].max(axis=1)
    if thresholds is None:
        thresholds = np.unique(np.concatenate([target_score, unknown_score]))
    ccr, fpr = [], []
    for theta in thresholds:
        ccr.append(np.sum(correct & (target_score > theta)) / known.sum())
        fpr.append(np.sum(unknown_score > theta) / unknown.sum())
    return ccr, fpr


def make_data(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, k, generator=generator) * 3, dim=1)
    target = torch.randint(-2, k, (n,), generator=generator)
    target[target == -1] = -2  # known vs unknown only
    return probs, target


def run(sizes: list[int], classes: int, *, full_loop_limit: int = FULL_LOOP_LIMIT) -> list[dict[str, Any]]:
    """One row per N: ``n``, ``distinct`` thresholds, ``ours_s``, ``sort_s``, ``loop_s`` and ``loop_full`` (whether
    the authors' loop ran over every threshold, its curve then checked equal to ours point for point)."""
    rows = []
    for n in sizes:
        probs, target = make_data(n, classes)

        def ours(probs: torch.Tensor = probs, target: torch.Tensor = target) -> None:
            fpr, ccr, _ = oscr_curve(probs, target, unknown_label=-2)
            ccr_from_curve(fpr, ccr, DEFAULT_FPR_TARGETS)

        values = torch.rand(n, generator=torch.Generator().manual_seed(1))
        t_ours = best_time(ours)
        t_sort = best_time(lambda v=values: torch.sort(v))
        probs_np, target_np = probs.numpy(), target.numpy()
        known = target_np >= 0
        distinct = np.unique(np.concatenate([probs_np[known, target_np[known]], probs_np[target_np == -2].max(axis=1)]))
        full = n <= full_loop_limit
        if full:
            start = time.perf_counter()
            ref_ccr, ref_fpr = authors_loop(probs_np, target_np)
            t_loop = time.perf_counter() - start
            fpr, ccr, _ = oscr_curve(probs, target, unknown_label=-2)
            if not (np.array_equal(np.asarray(ref_ccr)[::-1], ccr.numpy())
                    and np.array_equal(np.asarray(ref_fpr)[::-1], fpr.numpy())):
                raise AssertionError(f"N={n}: the authors' loop and oscr_curve give different curves")
        else:
            sample = distinct[np.linspace(0, len(distinct) - 1, 50).astype(int)]
            start = time.perf_counter()
            authors_loop(probs_np, target_np, sample)
            t_loop = (time.perf_counter() - start) / len(sample) * len(distinct)
        rows.append({"n": n, "distinct": len(distinct), "ours_s": t_ours, "sort_s": t_sort, "loop_s": t_loop,
                     "loop_full": full})
        print(f"N={n:.0e}: ours {t_ours:.3f}s, one sort {t_sort:.3f}s ({t_ours / t_sort:.2f}x), authors' loop "
              f"{t_loop:.1f}s ({'full' if full else 'estimated'})", flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], classes: int, full_loop_limit: int) -> str:
    return "\n".join([
        f"OSCR curve + CCR at FPR {{1e-3, 1e-2, 1e-1, 1}} on N test samples (K = {classes} known classes, half of "
        "the samples unknown), `metrics.oscr_curve` + `metrics.ccr_from_curve`, against (a) the authors' loop with "
        f"one pass over the data per distinct threshold (numpy; run in full up to N = {full_loop_limit:.0e}, where its curve is "
        "checked equal to ours point for point, else timed on 50 thresholds and extrapolated) and (b) one "
        f"`torch.sort` of N float32 values, all in the same run. Best of 3 (ours, sort). Machine: {machine()}.",
        "",
        table(["N", "distinct thresholds", "ours (s)", "one sort (s)", "ours / sort", "authors' loop (s)",
               "loop / ours"],
              [(f"{r['n']:.0e}", f"{r['distinct']:,}", f"{r['ours_s']:.3f}", f"{r['sort_s']:.3f}",
                f"{r['ours_s'] / r['sort_s']:.2f}x",
                f"{r['loop_s']:.2f}" if r["loop_full"] else f"~{r['loop_s']:,.0f} (extrapolated)",
                f"{r['loop_s'] / r['ours_s']:,.0f}x") for r in rows]),
    ])


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the benchmark, print the table and, with ``--write``, put it in RESULTS.md; returns the rows."""
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--sizes", type=float, nargs="+", help="test-set sizes N (default 1e5 1e6 1e7)")
    parser.add_argument("--classes", type=int, default=10)
    args = parse(parser, argv)
    sizes = args.sizes or ([1e3, 2e4] if args.tiny else [1e5, 1e6, 1e7])
    limit = 5_000 if args.tiny else FULL_LOOP_LIMIT  # a tiny run also takes the extrapolating branch
    rows = run([int(s) for s in sizes], args.classes, full_loop_limit=limit)
    finish(args, SECTION, markdown(rows, args.classes, limit), script="benchmarks.oscr_benchmark")
    return rows


if __name__ == "__main__":
    main()
