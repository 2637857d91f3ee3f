"""Confidence intervals at N = 1e6 scores (half ID, half OOD): DeLong and the vectorised bootstrap against
per-resample references, in the same run.

(a) ``auroc_interval(method="delong")`` against one ``metrics.auroc`` call (goal: within 3x);
(b) ``bootstrap_auroc`` with B = 1000 against torchmetrics' ``BootStrapper(BinaryAUROC())`` and a loop of
    sklearn ``roc_auc_score`` calls on the same resamples (goal: >= 20x faster than either);
(c) ``bootstrap_open_set`` (exact convention, unknowns only, K = 10) with B = 1000 against a loop of
    ``metrics.ccr_at_fpr`` on the expanded resamples (goal: >= 15x), and its cost with the authors'
    convention as well (timed on 32 resamples, extrapolated).
The per-resample references are timed on fewer resamples (100 for (b), 20 for (c)) and extrapolated
linearly to B (their per-resample cost is constant); wall-clock and CPU seconds are both reported, with the
load of the machine at the start and the end of the run.

    python -m benchmarks.intervals_benchmark [--tiny] [--write] [--size 1e6] [--resamples 1000]
        [--reference-resamples 100]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    benchmark_parser,
    best_time,
    finish,
    load_average,
    machine,
    open_set_data,
    parse,
    table,
)
from metrics import (
    auroc,
    auroc_interval,
    bootstrap_auroc,
    bootstrap_open_set,
    ccr_at_fpr,
    resample_weights,
)
from metrics.auroc import _AUROCPlan
from metrics.resampling import BLOCK_ROWS, _block_generator, _RowStream

SECTION = "Confidence intervals"
FPR_TARGETS = (1e-3, 1e-2, 1e-1, 1.0)


def make_scores(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 scores in [0, 1] (BinaryAUROC reads others as logits); float32 rand has ties at this N."""
    generator = torch.Generator().manual_seed(seed)
    id_scores = torch.rand(n // 2, generator=generator) ** 0.7
    ood_scores = torch.rand(n - n // 2, generator=generator)
    return id_scores, ood_scores


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def timed_cpu(fn: Any) -> tuple[float, float, Any]:
    """Wall-clock and CPU seconds (all threads of this process) of one call, and its value."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, value


def weight_rows(n: int, rows: int, stratum: int) -> None:
    """The bootstrap's own weight generation: one row at a time into a reused uint8 buffer."""
    stream, buffer = _RowStream(n, 0, stratum), np.empty((1, n), dtype=np.uint8)
    for _ in range(rows):
        stream.counts(1, buffer)


BOOTSTRAPPER_CHUNK = 25  # torchmetrics keeps one metric copy (all N scores) per bootstrap: 25 at a time


def run(n: int, resamples: int, reference_resamples: int, ccr_resamples: int, classes: int) -> dict[str, Any]:
    id_scores, ood_scores = make_scores(n)
    out: dict[str, Any] = {"n": n, "resamples": resamples, "reference_resamples": reference_resamples,
                           "ccr_resamples": ccr_resamples, "classes": classes, "load_start": load_average(),
                           "distinct": int(torch.unique(torch.cat([id_scores, ood_scores])).numel())}
    # (a) DeLong against one AUROC
    out["auroc_s"] = best_time(lambda: auroc(id_scores, ood_scores))
    out["delong_s"] = best_time(lambda: auroc_interval(id_scores, ood_scores, method="delong"))
    print(f"(a) auroc {out['auroc_s']:.3f}s, DeLong interval {out['delong_s']:.3f}s", flush=True)

    # (b) the bootstrap of the AUROC
    rows = min(resamples, 4 * BLOCK_ROWS)
    out["weights_s"], _ = timed(lambda: [weight_rows(m, rows, s) for s, m in
                                         ((0, id_scores.numel()), (1, ood_scores.numel()))])
    out["weights_s"] *= resamples / rows
    poisson = _block_generator(0, 0, 0)
    out["poisson_s"], _ = timed(lambda: [poisson.poisson(1.0, m) for _ in range(rows)
                                         for m in (id_scores.numel(), ood_scores.numel())])
    out["poisson_s"] *= resamples / rows
    out["plan_s"], _ = timed(lambda: _AUROCPlan(id_scores, ood_scores))
    out["bootstrap_s"], out["bootstrap_cpu_s"], replicates = timed_cpu(
        lambda: bootstrap_auroc(id_scores, ood_scores, resamples, 0))
    print(f"(b) bootstrap_auroc B={resamples}: {out['bootstrap_s']:.2f}s wall, {out['bootstrap_cpu_s']:.2f}s CPU "
          f"(weights alone ~{out['weights_s']:.2f}s, Poisson(1) weights would take ~{out['poisson_s']:.2f}s, "
          f"the sorts {out['plan_s']:.2f}s)", flush=True)

    from sklearn.metrics import roc_auc_score
    from torchmetrics.classification import BinaryAUROC
    from torchmetrics.wrappers import BootStrapper

    scores = torch.cat([id_scores, ood_scores])
    labels = torch.cat([torch.ones(id_scores.numel(), dtype=torch.long), torch.zeros(ood_scores.numel(), dtype=torch.long)])

    def bootstrapper() -> None:
        for start in range(0, reference_resamples, BOOTSTRAPPER_CHUNK):
            booter = BootStrapper(BinaryAUROC(), num_bootstraps=min(BOOTSTRAPPER_CHUNK, reference_resamples - start),
                                  sampling_strategy="multinomial")
            booter.update(scores, labels)
            booter.compute()
            del booter

    wall, cpu, _ = timed_cpu(bootstrapper)
    out["bootstrapper_s"], out["bootstrapper_cpu_s"] = (t * resamples / reference_resamples for t in (wall, cpu))
    w_id = resample_weights(id_scores.numel(), reference_resamples, 0, stratum=0).numpy()
    w_ood = resample_weights(ood_scores.numel(), reference_resamples, 0, stratum=1).numpy()
    scores_np, labels_np = scores.numpy(), labels.numpy()
    wall, cpu, sklearn_values = timed_cpu(lambda: [
        roc_auc_score(labels_np, scores_np, sample_weight=np.r_[w_id[b], w_ood[b]]) for b in range(reference_resamples)])
    out["sklearn_s"], out["sklearn_cpu_s"] = (t * resamples / reference_resamples for t in (wall, cpu))
    out["max_difference"] = float(np.abs(np.asarray(sklearn_values) - replicates[:reference_resamples].numpy()).max())
    if out["max_difference"] > 1e-12:
        raise AssertionError(f"bootstrap_auroc and sklearn differ by {out['max_difference']:.3g} on the same resamples")
    print(f"    BootStrapper ~{out['bootstrapper_s']:.1f}s wall / {out['bootstrapper_cpu_s']:.1f}s CPU, sklearn loop "
          f"~{out['sklearn_s']:.1f}s / {out['sklearn_cpu_s']:.1f}s CPU (extrapolated from {reference_resamples}); "
          f"max |ours - sklearn| = {out['max_difference']:.1e}", flush=True)

    # (c) the bootstrap of CCR@FPR
    probs, target = open_set_data(n, classes)
    out["open_set_s"], out["open_set_cpu_s"], _ = timed_cpu(
        lambda: bootstrap_open_set(probs, target, fpr_targets=FPR_TARGETS, resamples=resamples, seed=0))
    known_rows, unknown_rows = (target >= 0).nonzero().squeeze(1), (target == -2).nonzero().squeeze(1)
    known_w = resample_weights(known_rows.numel(), ccr_resamples, 0, stratum=0)
    unknown_w = resample_weights(unknown_rows.numel(), ccr_resamples, 0, stratum=2)

    def ccr_loop() -> None:
        for b in range(ccr_resamples):
            rows = torch.cat([known_rows.repeat_interleave(known_w[b].long()),
                              unknown_rows.repeat_interleave(unknown_w[b].long())])
            ccr_at_fpr(probs[rows], target[rows], FPR_TARGETS)

    wall, cpu, _ = timed_cpu(ccr_loop)
    out["ccr_loop_s"], out["ccr_loop_cpu_s"] = (t * resamples / ccr_resamples for t in (wall, cpu))
    # the authors' convention too (numpy rows, like the exact one), on a few resamples: the set-up (one
    # resample) plus the per-resample cost of the others, extrapolated to B
    authors_rows = min(resamples, 2 * BLOCK_ROWS)

    def authors(rows: int) -> tuple[float, float, Any]:
        return timed_cpu(lambda: bootstrap_open_set(probs, target, fpr_targets=FPR_TARGETS[1:],
                                                    conventions=("exact", "authors"), resamples=rows))

    setup, few = authors(1)[:2], authors(authors_rows)[:2]
    out["authors_rows"] = authors_rows
    out["authors_s"], out["authors_cpu_s"] = (
        one + (many - one) * (resamples - 1) / max(authors_rows - 1, 1) for one, many in zip(setup, few, strict=True))
    print(f"(c) bootstrap_open_set B={resamples}: {out['open_set_s']:.2f}s wall / {out['open_set_cpu_s']:.2f}s CPU "
          f"({1e3 * out['open_set_s'] / resamples:.1f} ms per resample), ccr_at_fpr loop ~{out['ccr_loop_s']:.1f}s / "
          f"{out['ccr_loop_cpu_s']:.1f}s CPU ({1e3 * out['ccr_loop_s'] / resamples:.0f} ms per resample); with the "
          f"authors' convention too ~{out['authors_s']:.1f}s / {out['authors_cpu_s']:.1f}s CPU (from {authors_rows})",
          flush=True)
    out["load"] = load_average()
    return out


def markdown(r: dict[str, Any]) -> str:
    b, ref, ccr = r["resamples"], r["reference_resamples"], r["ccr_resamples"]

    def seconds(wall: str) -> str:
        return f"{r[wall]:.2f} ({r[wall[:-2] + '_cpu_s']:.2f})"

    def extrapolated(wall: str, count: int) -> str:
        return f"~{r[wall]:.0f} (~{r[wall[:-2] + '_cpu_s']:.0f}), from {count}"

    def times(wall: str) -> str:
        cpu = wall[:-2] + "_cpu_s"
        return f"{r[wall] / r['bootstrap_s']:.0f}x ({r[cpu] / r['bootstrap_cpu_s']:.0f}x)"

    return "\n".join([
        f"N = {r['n']:.0e} float32 scores in [0, 1] (half ID, half OOD, {r['distinct']:,} distinct values, so some "
        f"ties), B = {b} resamples, one run each (ours). The per-resample references are timed on fewer resamples "
        f"({ref} for (b), {ccr} for (c)) and extrapolated linearly to B (their per-resample cost is constant; running "
        f"them in full would take many minutes). Seconds are wall-clock, with the CPU seconds of the process "
        f"(all its threads) in parentheses. sklearn gets the same resamples as ours (multinomial counts as "
        f"`sample_weight`) and agrees to {r['max_difference']:.1e}; torchmetrics' `BootStrapper(BinaryAUROC(), "
        f"sampling_strategy=\"multinomial\")` draws its own (unstratified) resamples and keeps a copy of the metric "
        f"and of all N scores per resample (run {BOOTSTRAPPER_CHUNK} bootstraps at a time). The machine is shared "
        f"(2 cores; load {r['load_start']} at the start and {r['load']} at the end of the run), so timings are noisy; "
        f"ours and the references ran in the same run. Machine: {machine()}.",
        "",
        table(["case", "ours (s)", "reference", "reference (s)", "reference / ours", "goal"], [
            ("(a) `auroc_interval(method=\"delong\")`", f"{r['delong_s']:.3f}", "one `metrics.auroc`",
             f"{r['auroc_s']:.3f}", f"ours = {r['delong_s'] / r['auroc_s']:.2f}x one AUROC", "<= 3x"),
            (f"(b) `bootstrap_auroc`, B = {b}", seconds("bootstrap_s"), "torchmetrics BootStrapper",
             extrapolated("bootstrapper_s", ref), times("bootstrapper_s"), ">= 20x"),
            (f"(b) `bootstrap_auroc`, B = {b}", seconds("bootstrap_s"), "sklearn `roc_auc_score` loop",
             extrapolated("sklearn_s", ref), times("sklearn_s"), ">= 20x"),
            (f"(c) `bootstrap_open_set` (exact, unknowns, K = {r['classes']}), B = {b}", seconds("open_set_s"),
             "`metrics.ccr_at_fpr` loop", extrapolated("ccr_loop_s", ccr),
             f"{r['ccr_loop_s'] / r['open_set_s']:.0f}x ({r['ccr_loop_cpu_s'] / r['open_set_cpu_s']:.0f}x)", ">= 15x"),
        ]),
        "",
        f"Of (b), the two sorts and searches shared by all resamples take {r['plan_s']:.2f} s, and drawing the "
        f"multinomial weights (numpy PCG64 integers, one generator per block of {BLOCK_ROWS} resamples, counted "
        f"row by row into a reused uint8 buffer) ~{r['weights_s']:.1f} s for both sides; Poisson(1) weights from "
        f"numpy would take ~{r['poisson_s']:.1f} s to draw alone (both extrapolated from {min(b, 4 * BLOCK_ROWS)} "
        "rows), so multinomial counts are kept. The rest is the numpy AUROC of each row (the OOD counts in sorted "
        "order, their cumulative sum, one read of it in the order of the ID samples' places).",
        "",
        f"(c) takes {1e3 * r['open_set_s'] / b:.1f} ms per resample ({1e3 * r['bootstrap_s'] / b:.1f} ms for (b)), "
        f"the loop {1e3 * r['ccr_loop_s'] / b:.0f} ms: per row the same uint8 counts and threads as (b) (strata "
        "knowns / unknowns), then in numpy the correct knowns' and the unknowns' counts in their sorted orders "
        "(one sort each, shared by all resamples) and their cumulative sums, `np.searchsorted` of the largest "
        "unknown count that fits each FPR target, the correct count read there, and the AUROC of (b); it "
        "returns every scalar of `open_set_report` (accuracy, CCR@FPR, AUROC). With `conventions=(\"exact\", "
        f"\"authors\")` (targets {', '.join(f'{t:g}' for t in FPR_TARGETS[1:])}; the authors' nearest-point rule: "
        f"per target one pass over the FPR at every distinct known score) it would take ~{r['authors_s']:.0f} s "
        f"(~{r['authors_cpu_s']:.0f} s CPU) for B = {b} (its set-up, timed with one resample, plus the others' cost, "
        f"extrapolated from {r['authors_rows']} resamples).",
    ])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and, with ``--write``, put it in RESULTS.md; returns the numbers."""
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--size", type=float, help="number of scores N (default 1e6)")
    parser.add_argument("--resamples", type=int, help="bootstrap resamples B (default 1000)")
    parser.add_argument("--reference-resamples", type=int, help="resamples of the (b) references (default 100)")
    parser.add_argument("--classes", type=int, default=10)
    args = parse(parser, argv)
    n = int(args.size or (2_000 if args.tiny else 1e6))
    resamples = args.resamples or (20 if args.tiny else 1000)
    reference = min(resamples, args.reference_resamples or (3 if args.tiny else 100))
    result = run(n, resamples, reference, min(resamples, 3 if args.tiny else 20), args.classes)
    finish(args, SECTION, markdown(result), script="benchmarks.intervals_benchmark")
    return result


if __name__ == "__main__":
    main()
