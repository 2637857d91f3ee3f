"""OSCR + CCR@FPR at N = 1e5, 1e6, 1e7 test samples, side by side with two references in the same run.

(a) the authors' evaluation loop: one pass over the data per distinct threshold (quadratic; run in full
    where it finishes in reasonable time, otherwise timed on a sample of thresholds and extrapolated);
(b) one ``torch.sort`` of N float32 values, the floor for any exact ranking metric.

Ours is the public ``metrics.oscr_curve`` + ``metrics.ccr_from_curve``, input validation included (the
validation alone, ``check_probs_and_target``, is timed too and shown as its share of ours).

Goal: within 1.5x of one sort at 1e7, with validation on.

    python -m benchmarks.oscr_benchmark [--tiny] [--write] [--sizes 1e5 1e6 1e7] [--classes 10]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.common import alternate, benchmark_parser, finish, machine, open_set_data, parse, table
from metrics import DEFAULT_FPR_TARGETS, ccr_from_curve, oscr_curve
from metrics._validation import check_probs_and_target

SECTION = "OSCR and CCR@FPR"
FULL_LOOP_LIMIT = 100_000  # the authors' loop is run in full up to this many samples
GOAL = 1.5  # ours / one sort at the largest N, validation on
REPEAT = 3


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


def _seconds(fn: Any) -> Any:
    def timed() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return timed


def run(sizes: list[int], classes: int, *, full_loop_limit: int = FULL_LOOP_LIMIT) -> list[dict[str, Any]]:
    """One row per N: ``n``, ``distinct`` thresholds, ``ours_s``, ``validation_s`` (the input checks alone, part
    of ours), ``sort_s``, ``loop_s`` and ``loop_full`` (whether the authors' loop ran over every threshold, its
    curve then checked equal to ours point for point). Ours, its validation and the sort run in alternating
    rounds (best of ``REPEAT``), so a slow phase of a shared machine falls on all three alike."""
    rows = []
    for n in sizes:
        probs, target = open_set_data(n, classes)

        def ours(probs: torch.Tensor = probs, target: torch.Tensor = target) -> None:
            fpr, ccr, _ = oscr_curve(probs, target, unknown_label=-2)
            ccr_from_curve(fpr, ccr, DEFAULT_FPR_TARGETS)

        values = torch.rand(n, generator=torch.Generator().manual_seed(1))
        seconds = alternate({
            "ours": _seconds(ours),
            "validation": _seconds(lambda p=probs, t=target: check_probs_and_target(p, t, background=False)),
            "sort": _seconds(lambda v=values: torch.sort(v)),
        }, repeat=REPEAT)
        t_ours, t_validation, t_sort = (min(seconds[name]) for name in ("ours", "validation", "sort"))
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
        rows.append({"n": n, "distinct": len(distinct), "ours_s": t_ours, "validation_s": t_validation,
                     "sort_s": t_sort, "loop_s": t_loop, "loop_full": full})
        print(f"N={n:.0e}: ours {t_ours:.3f}s (validation {t_validation:.3f}s, {t_validation / t_ours:.0%}), one sort "
              f"{t_sort:.3f}s ({t_ours / t_sort:.2f}x), authors' loop {t_loop:.1f}s "
              f"({'full' if full else 'estimated'})", flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], classes: int, full_loop_limit: int) -> str:
    largest = max(rows, key=lambda r: r["n"])
    ratio = largest["ours_s"] / largest["sort_s"]
    return "\n".join([
        f"OSCR curve + CCR at FPR {{1e-3, 1e-2, 1e-1, 1}} on N test samples (K = {classes} known classes, half of "
        "the samples unknown), `metrics.oscr_curve` + `metrics.ccr_from_curve` with their input validation, against "
        "(a) the authors' loop with one pass over the data per distinct threshold (numpy; run in full up to "
        f"N = {full_loop_limit:.0e}, where its curve is checked equal to ours point for point, else timed on 50 "
        "thresholds and extrapolated) and (b) one `torch.sort` of N float32 values, all in the same run. "
        "\"validation\" is `check_probs_and_target` alone (finiteness, range, row sums, labels), part of ours. "
        f"Best of {REPEAT} alternating rounds (ours, validation, sort). Machine: {machine()}.",
        "",
        table(["N", "distinct thresholds", "ours (s)", "validation (s)", "validation / ours", "one sort (s)",
               "ours / sort", "authors' loop (s)", "loop / ours"],
              [(f"{r['n']:.0e}", f"{r['distinct']:,}", f"{r['ours_s']:.3f}", f"{r['validation_s']:.3f}",
                f"{r['validation_s'] / r['ours_s']:.0%}", f"{r['sort_s']:.3f}",
                f"{r['ours_s'] / r['sort_s']:.2f}x",
                f"{r['loop_s']:.2f}" if r["loop_full"] else f"~{r['loop_s']:,.0f} (extrapolated)",
                f"{r['loop_s'] / r['ours_s']:,.0f}x") for r in rows]),
        "",
        f"Goal: within {GOAL}x of one sort at 1e7 with validation on: "
        + (f"{ratio:.2f}x, {'met' if ratio <= GOAL else 'missed'}." if largest["n"] >= 10**7
           else "not measured in this run (largest N below 1e7)."),
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
