"""The fitted detectors at ImageNet scale: fit and score time and peak memory of ours (``metrics.detectors``)
against pytorch-ood 0.4.0 on the same synthetic 2048-d float32 features, in one run, beside one matrix
product of the same shapes.

- Mahalanobis and ViM fit on N = 1.28M samples of K = 1000 classes (the ImageNet training set); pytorch-ood's
  ViM holds the features, their logits, a centred copy and its projection at once (~31 GB at 1.28M), more
  than the machine's 24 GiB, so it fits on ``--pood-fit`` = 320k samples (the first rows), and ours fits on
  both sizes;
- KNN (``knn_imagenet``, k = 10) fits on 12.8k samples (1%);
- each scores 50k ID + 100k OOD samples. pytorch-ood's Mahalanobis loops over the K classes with a
  ``(rows × D)(D × D)`` product each, so it is timed on ``--pood-score-rows`` rows and extrapolated linearly.

The reference "one matrix product of the same shapes": for a fit the Gram matrix ``XᵀX`` of the fit features
(timed on 65536 rows, extrapolated linearly), for scoring ``(150k × 2048)(2048 × 2048)`` (Mahalanobis, ViM) and
``(150k × 2048)(2048 × 12.8k)`` (KNN), in float64 (ours computes in float64) and float32 (pytorch-ood's).
Peak memory is the largest resident set size above the one before the case, sampled every 5 ms.

Goal: no slower than pytorch-ood, and within 2x of one matrix product of the same shapes (float64) where the
detector is one.

    python -m benchmarks.detectors_benchmark [--tiny] [--write] [--fit 1280000] [--pood-fit 320000]
        [--knn-fit 12800] [--id 50000] [--ood 100000] [--classes 1000] [--dim 2048] [--pood-score-rows 512]
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from benchmarks.common import benchmark_parser, finish, load_average, machine, parse, table
from metrics.detectors import build_detector
from metrics.detectors.vim import principal_dimension

SECTION = "Fitted detectors at ImageNet scale"
GOAL = 2.0  # ours / one float64 matrix product of the same shapes
GENERATION_ROWS = 16384
AGREEMENT = 1e-2  # ours against pytorch-ood (float32): a bug shows far above its rounding


# --------------------------------------------------------------------------------------------------
# synthetic features


def class_means(classes: int, dim: int, seed: int = 0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(classes, dim, generator=generator) * 1.5


def make_features(n: int, means: Tensor, seed: int, *, shifted: bool = False) -> tuple[Tensor, Tensor]:
    """``n`` float32 rows, ReLU of the class mean plus unit noise (``shifted``: of noise alone), generated
    in chunks into one tensor (no second copy); balanced targets."""
    classes, dim = means.shape
    generator = torch.Generator().manual_seed(seed)
    features = torch.empty(n, dim)
    targets = torch.arange(n) % classes
    for start in range(0, n, GENERATION_ROWS):
        rows = slice(start, min(start + GENERATION_ROWS, n))
        noise = torch.randn(rows.stop - start, dim, generator=generator)
        centre = 0.3 if shifted else means[targets[rows]]
        features[rows] = torch.relu_(noise.add_(centre))
    return features, targets


def make_head(means: Tensor) -> tuple[Tensor, Tensor]:
    """A head that reads the classes off the synthetic features: the centred class means."""
    weight = (means - means.mean(dim=0)) / means.shape[1] ** 0.5
    return weight.contiguous(), torch.zeros(means.shape[0])


# --------------------------------------------------------------------------------------------------
# measuring


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # not Linux
        return None


def measure(fn: Callable[[], Any]) -> tuple[float, float | None, Any]:
    """Seconds, peak resident memory above the start (MiB; ``None`` without /proc) and the value of one call."""
    gc.collect()
    start = _rss()
    peak = [start or 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss() or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.perf_counter()
    try:
        value = fn()
    finally:
        seconds = time.perf_counter() - began
        done.set()
        sampler.join()
    end = _rss()
    if start is None or end is None:
        return seconds, None, value
    return seconds, (max(peak[0], end) - start) / 2**20, value


def matmul_seconds(left: Tensor, right: Tensor, *, dtype: torch.dtype, rows: int | None = None) -> float:
    """One ``left @ right`` in ``dtype`` (the cast not timed); on the first ``rows`` rows of ``left`` when
    given, extrapolated linearly to all of them."""
    part = left if rows is None or rows >= left.shape[0] else left[:rows]
    a, b = part.to(dtype), right.to(dtype)
    began = time.perf_counter()
    _ = a @ b
    seconds = time.perf_counter() - began
    return seconds * left.shape[0] / part.shape[0]


def gram_seconds(features: Tensor, *, dtype: torch.dtype, rows: int) -> float:
    """``XᵀX`` of the fit features, timed on ``rows`` rows and extrapolated to all of them."""
    part = features[:rows].to(dtype)
    began = time.perf_counter()
    _ = part.T @ part
    return (time.perf_counter() - began) * features.shape[0] / part.shape[0]


def vim_in_float64(features: Tensor, targets: Tensor, test: Tensor, head: tuple[Tensor, Tensor]) -> float:
    """Ours against pytorch-ood's ViM run in float64 (its ``.float()`` casts made ``.double()``), both fitted on
    ``features``: pytorch-ood's float32 eigenvectors are what differ, where the spectrum has no gap at d."""
    import pytorch_ood.detector as pood

    weight, bias = (t.double() for t in head)
    ours = build_detector("vim").fit({"features": features, "targets": targets}, head=head).score({"features": test})
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with mock.patch.object(torch.Tensor, "float", torch.Tensor.double):
            theirs = pood.ViM(None, d=principal_dimension(None, features.shape[1]), w=weight, b=bias) \
                .fit_features(features.double(), targets).predict_features(test.double())
    finally:
        torch.set_default_dtype(old)
    return relative_difference(ours, theirs)


def relative_difference(ours: Tensor, theirs: Tensor) -> float:
    """``max |ours + theirs| / max |theirs|`` (pytorch-ood's score is the outlier score, ours its negation)."""
    theirs = torch.as_tensor(theirs).double()
    return float((ours + theirs).abs().max() / theirs.abs().max().clamp(min=1e-300))


# --------------------------------------------------------------------------------------------------
# the cases


def run(fit: int, pood_fit: int, knn_fit: int, n_id: int, n_ood: int, classes: int, dim: int,
        pood_score_rows: int, gram_rows: int, check_rows: int) -> dict[str, Any]:
    import pytorch_ood.detector as pood

    out: dict[str, Any] = {"fit": fit, "pood_fit": pood_fit, "knn_fit": knn_fit, "id": n_id, "ood": n_ood,
                           "classes": classes, "dim": dim, "pood_score_rows": pood_score_rows,
                           "load_start": load_average(), "rows": []}
    means = class_means(classes, dim)
    seconds, _, (features, targets) = measure(lambda: make_features(fit, means, seed=1))
    out["generate_s"] = seconds
    test = torch.cat([make_features(n_id, means, seed=2)[0], make_features(n_ood, means, seed=3, shifted=True)[0]])
    weight, bias = make_head(means)
    head = (weight, bias)
    scored = {"features": test, "logits": test @ weight.T + bias}
    _ = torch.randn(512, dim) @ torch.randn(dim, dim)  # wake the BLAS threads
    print(f"features: {fit:,} x {dim} float32 for the fits ({features.nbytes / 2**30:.1f} GiB, generated in "
          f"{seconds:.0f} s), {n_id:,} + {n_ood:,} to score", flush=True)

    def add(**row: Any) -> None:
        out["rows"].append(row)
        parts = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
        print(f"  {parts}", flush=True)

    gram = {dtype: {n: gram_seconds(features[:n], dtype=dtype, rows=min(gram_rows, n)) for n in {fit, pood_fit}}
            for dtype in (torch.float64, torch.float32)}

    # ---------------------------------------------------------------- Mahalanobis
    mahalanobis: Any = None
    for n in (fit, pood_fit):
        subset = {"features": features[:n], "targets": targets[:n]}
        seconds, peak, detector = measure(lambda s=subset: build_detector("mahalanobis").fit(s))
        row = dict(detector="mahalanobis", phase="fit", rows=n, ours_s=seconds, ours_peak_mib=peak,
                   reference_f64_s=gram[torch.float64][n], reference_f32_s=gram[torch.float32][n],
                   reference="XᵀX")
        if n == fit:
            mahalanobis = detector
            seconds, peak, theirs = measure(lambda: pood.Mahalanobis(None).fit_features(features, targets))
            row.update(pood_rows=fit, pood_s=seconds, pood_peak_mib=peak)
        add(**row)
        del detector
        if fit == pood_fit:
            break
    square = weight.new_empty(dim, dim).normal_()
    score_reference = {dtype: matmul_seconds(test, square, dtype=dtype) for dtype in (torch.float64, torch.float32)}
    seconds, peak, ours = measure(lambda: mahalanobis.score(scored))
    part = test[:pood_score_rows]
    pood_seconds, pood_peak, their_scores = measure(lambda: theirs.predict_features(part))
    add(detector="mahalanobis", phase="score", rows=test.shape[0], ours_s=seconds, ours_peak_mib=peak,
        pood_rows=part.shape[0], pood_s=pood_seconds * test.shape[0] / part.shape[0], pood_peak_mib=pood_peak,
        pood_extrapolated=part.shape[0] < test.shape[0], difference=relative_difference(ours[:part.shape[0]], their_scores),
        reference="(N × D)(D × D)", reference_f64_s=score_reference[torch.float64],
        reference_f32_s=score_reference[torch.float32])
    mahalanobis = theirs = None  # free them before ViM
    gc.collect()

    # ---------------------------------------------------------------- ViM
    vim_at: dict[int, Any] = {}
    for n in (fit, pood_fit):
        subset = {"features": features[:n], "targets": targets[:n]}
        seconds, peak, detector = measure(lambda s=subset: build_detector("vim").fit(s, head=head))
        vim_at[n] = detector
        row = dict(detector="vim", phase="fit", rows=n, ours_s=seconds, ours_peak_mib=peak,
                   reference="XᵀX", reference_f64_s=gram[torch.float64][n], reference_f32_s=gram[torch.float32][n])
        if n != pood_fit:  # pytorch-ood keeps features, logits, the centred copy and its projection (float32)
            row["pood_note"] = (f"run on {_size(pood_fit)} only: it holds the features, their logits, a centred "
                                f"copy and its projection at once, ~{4 * n * (3 * dim + classes) / 1e9:.3g} GB at "
                                f"{_size(n)}")
        else:
            seconds, peak, theirs = measure(lambda s=subset: pood.ViM(
                None, d=principal_dimension(None, dim), w=weight, b=bias).fit_features(s["features"], s["targets"]))
            row.update(pood_rows=n, pood_s=seconds, pood_peak_mib=peak)
        add(**row)
        if fit == pood_fit:
            break
    seconds, peak, ours = measure(lambda: vim_at[fit].score(scored))
    same_size = vim_at[pood_fit].score(scored)
    pood_seconds, pood_peak, their_scores = measure(lambda: theirs.predict_features(test))
    add(detector="vim", phase="score", rows=test.shape[0], ours_s=seconds, ours_peak_mib=peak, pood_rows=test.shape[0],
        pood_s=pood_seconds, pood_peak_mib=pood_peak, difference_f32=relative_difference(same_size, their_scores),
        difference=vim_in_float64(features[:check_rows], targets[:check_rows], test[:check_rows], head),
        reference="(N × D)(D × D)", reference_f64_s=score_reference[torch.float64],
        reference_f32_s=score_reference[torch.float32])
    out["check_rows"] = check_rows
    vim_at.clear()
    theirs = same_size = None
    gc.collect()

    # ---------------------------------------------------------------- KNN on 1%
    bank = {"features": features[:knn_fit], "targets": targets[:knn_fit]}
    seconds, peak, detector = measure(lambda: build_detector("knn_imagenet").fit(bank))
    pood_seconds, pood_peak, theirs = measure(lambda: pood.KNN(None, k=detector.k).fit_features(
        bank["features"], bank["targets"]))
    add(detector="knn_imagenet", phase="fit", rows=knn_fit, ours_s=seconds, ours_peak_mib=peak, pood_rows=knn_fit,
        pood_s=pood_seconds, pood_peak_mib=pood_peak)
    seconds, peak, ours = measure(lambda: detector.score(scored))
    pood_seconds, pood_peak, their_scores = measure(lambda: theirs.predict_features(test))
    add(detector="knn_imagenet", phase="score", rows=test.shape[0], ours_s=seconds, ours_peak_mib=peak,
        pood_rows=test.shape[0], pood_s=pood_seconds, pood_peak_mib=pood_peak,
        difference=relative_difference(ours, their_scores), reference=f"(N × D)(D × {knn_fit:,})",
        reference_f64_s=matmul_seconds(test, bank["features"].T, dtype=torch.float64, rows=32768),
        reference_f32_s=matmul_seconds(test, bank["features"].T, dtype=torch.float32, rows=32768))
    for row in out["rows"]:
        if row.get("difference", 0.0) > AGREEMENT:
            raise AssertionError(f"ours and pytorch-ood differ by {row['difference']:.3g} (relative): {row}")
    out["load"] = load_average()
    return out


# --------------------------------------------------------------------------------------------------
# the table


def _size(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k" if n >= 1000 else str(n)


def _seconds(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def markdown(r: dict[str, Any]) -> str:
    lines = []
    for row in r["rows"]:
        pood_s = row.get("pood_s")
        if pood_s is None:
            pood_cell, versus = f"— ({row['pood_note']})" if "pood_note" in row else "—", "—"
        else:
            rows = "" if row.get("pood_rows") == row["rows"] else f" at {_size(row['pood_rows'])}"
            if row.get("pood_extrapolated"):
                rows = f", from {row['pood_rows']:,} rows"
            pood_cell = f"{'~' if row.get('pood_extrapolated') else ''}{_seconds(pood_s)}{rows}"
            versus = f"{pood_s / row['ours_s']:.1f}x" if row.get("pood_rows") == row["rows"] or \
                row.get("pood_extrapolated") else "—"
        reference = row.get("reference")
        if reference is None:
            ref_cell, ratio = "—", "—"
        else:
            ref_cell = f"{_seconds(row['reference_f64_s'])} / {_seconds(row['reference_f32_s'])}"
            ratio = f"{row['ours_s'] / row['reference_f64_s']:.2f}x"
        lines.append((row["detector"], row["phase"], _size(row["rows"]), _seconds(row["ours_s"]),
                      _mib(row.get("ours_peak_mib")), pood_cell, _mib(row.get("pood_peak_mib")), versus,
                      reference or "—", ref_cell, ratio,
                      f"{row['difference']:.1e}" + (f" ({row['difference_f32']:.1e} in float32)"
                                                    if "difference_f32" in row else "") if "difference" in row else "—"))
    header = ["detector", "phase", "N", "ours (s)", "ours: peak memory", "pytorch-ood (s)", "pytorch-ood: peak memory",
              "pytorch-ood / ours", "one matrix product", "its time f64 / f32 (s)", "ours / f64 product",
              "max relative difference"]
    return "\n".join([
        f"Synthetic float32 features, D = {r['dim']}, K = {r['classes']} classes (ReLU of class mean + unit noise; "
        f"OOD: ReLU of noise), generated in {r['generate_s']:.0f} s; fits on {r['fit']:,} samples (pytorch-ood's ViM "
        f"on the first {r['pood_fit']:,}), KNN on {r['knn_fit']:,}; {r['id']:,} ID + {r['ood']:,} OOD samples scored. "
        f"One run of each case (wall-clock s). Peak memory: the resident set above the one before the case "
        f"(the features themselves, {r['fit'] * r['dim'] * 4 / 2**30:.1f} GiB, not counted). \"max relative "
        "difference\": max |ours - pytorch-ood| / max |pytorch-ood| of the scores (Mahalanobis: on the rows "
        f"pytorch-ood scored; ViM: against pytorch-ood run in float64, both fitted on the first {r['check_rows']:,} "
        f"rows, and in parentheses against its float32 fit on {_size(r['pood_fit'])}). Machine: {machine()}; load "
        f"{r['load_start']} at the start and {r['load']} at the end.",
        "",
        table(header, lines),
    ])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and, with ``--write``, put it in RESULTS.md; returns the numbers."""
    parser = benchmark_parser(__doc__, section=SECTION)
    parser.add_argument("--fit", type=int, help="fit samples of Mahalanobis and ViM (default 1280000)")
    parser.add_argument("--pood-fit", type=int, help="fit samples of pytorch-ood's ViM (default 320000)")
    parser.add_argument("--knn-fit", type=int, help="fit samples of KNN (default 12800)")
    parser.add_argument("--id", type=int, help="ID samples scored (default 50000)")
    parser.add_argument("--ood", type=int, help="OOD samples scored (default 100000)")
    parser.add_argument("--classes", type=int, help="classes K (default 1000)")
    parser.add_argument("--dim", type=int, help="feature dimension D (default 2048)")
    parser.add_argument("--pood-score-rows", type=int, help="rows pytorch-ood's Mahalanobis scores (default 512)")
    args = parse(parser, argv)
    tiny = args.tiny
    fit = args.fit or (3000 if tiny else 1_280_000)
    result = run(fit=fit, pood_fit=min(fit, args.pood_fit or (fit // 2 if tiny else 320_000)),
                 knn_fit=args.knn_fit or (400 if tiny else 12_800), n_id=args.id or (300 if tiny else 50_000),
                 n_ood=args.ood or (600 if tiny else 100_000), classes=args.classes or (10 if tiny else 1000),
                 dim=args.dim or (64 if tiny else 2048), pood_score_rows=args.pood_score_rows or (100 if tiny else 512),
                 gram_rows=1000 if tiny else 65536, check_rows=1000 if tiny else 16384)
    finish(args, SECTION, markdown(result), script="benchmarks.detectors_benchmark")
    return result


if __name__ == "__main__":
    main()
