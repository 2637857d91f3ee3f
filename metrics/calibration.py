"""Expected calibration error (ECE) and its bootstrap (Mukhoti et al.'s generated and shifted sets).

The project's ECE is torchmetrics' ``multiclass_calibration_error`` with ``norm="l1"``: the confidence is the
maximum probability (float32), binned into ``bins`` equal-width bins over ``[0, 1]`` by
``bucketize(confidence, linspace(0, 1, bins + 1), right=True) - 1`` (a confidence of exactly 1.0 falls into an
extra bin of its own, as torchmetrics does), and::

    ECE = Σ_bins |acc_bin - conf_bin| · n_bin / N

:func:`weighted_calibration_error` is the same sum with every bin sum weighted by a row of resampling weights
(:mod:`metrics.resampling`); :func:`bootstrap_accuracy_ece` draws the resamples of the images and returns the
replicates of the top-1 accuracy and of the ECE.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.resampling import _check_resamples, _check_weights, _chunk_rows, _Side


def _ece_rows(weights: Tensor, bins: Tensor, confidence: Tensor, accurate: Tensor, num_bins: int) -> Tensor:
    """Weighted torchmetrics ECE (L1): Σ_bins |acc_b - conf_b| · prop_b, with weighted bin sums."""
    columns = num_bins + 1  # torchmetrics' bucketize(right=True) - 1 puts confidence 1.0 in an extra bin
    one_hot = torch.zeros(bins.numel(), 3 * columns, dtype=torch.float64, device=weights.device)
    index = torch.arange(bins.numel(), device=weights.device)
    one_hot[index, bins] = 1.0
    one_hot[index, columns + bins] = confidence
    one_hot[index, 2 * columns + bins] = accurate
    sums = weights.double() @ one_hot
    count, conf_sum, acc_sum = sums[:, :columns], sums[:, columns:2 * columns], sums[:, 2 * columns:]
    conf_bin = torch.nan_to_num(conf_sum / count)
    acc_bin = torch.nan_to_num(acc_sum / count)
    return ((acc_bin - conf_bin).abs() * (count / count.sum(dim=1, keepdim=True))).sum(dim=1)


def _binned(probs: Tensor | object, targets: Tensor | object, bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Checked input, as ``(confidence, accurate, bin_index)``: the max probability in float32, whether the
    argmax is the target (float64), and each sample's bin (module docstring)."""
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    probs = torch.as_tensor(probs)
    targets = torch.as_tensor(targets)
    if probs.ndim != 2 or not probs.is_floating_point() or probs.shape[0] == 0:
        raise ValueError(f"probs must be a non-empty floating (N, C) tensor, got {tuple(probs.shape)} {probs.dtype}")
    if targets.shape != (probs.shape[0],) or targets.is_floating_point():
        raise ValueError(f"targets must be (N,) = ({probs.shape[0]},) integer labels, got {tuple(targets.shape)} "
                         f"{targets.dtype}")
    if not bool(torch.isfinite(probs).all()) or float(probs.min()) < 0 or float(probs.max()) > 1:
        raise ValueError("probs must be finite probabilities in [0, 1] (apply a softmax to logits first)")
    confidence, prediction = probs.max(dim=1)
    confidence = confidence.float()
    accurate = (prediction == targets).double()
    boundaries = torch.linspace(0, 1, bins + 1, dtype=confidence.dtype, device=confidence.device)
    return confidence, accurate, torch.bucketize(confidence, boundaries, right=True) - 1


def weighted_calibration_error(probs: Tensor, targets: Tensor, weights: Tensor, *, bins: int = 15) -> Tensor:
    """The ECE (module docstring) of every row of weights: row ``b`` counts sample ``i`` ``w_bi`` times.

    Args:
        probs: ``(N, C)`` probabilities (in [0, 1]); targets: ``(N,)`` labels ``0..C-1``.
        weights: ``(B, N)`` non-negative weights, e.g. :func:`metrics.resample_weights` (integer counts).
        bins: the number of equal-width bins.

    Returns:
        ``(B,)`` float64; with integer weights row ``b`` equals torchmetrics'
        ``multiclass_calibration_error(..., norm="l1")`` on the data expanded by row ``b`` to float32 rounding
        (the bin sums are taken in float64); NaN for a row of zero weights.
    """
    confidence, accurate, bin_index = _binned(probs, targets, bins)
    weights = _check_weights(weights, accurate.numel(), name="weights", device=accurate.device)
    step = _chunk_rows(accurate.numel() * 4)
    parts = [_ece_rows(weights[start:start + step], bin_index, confidence.double(), accurate, bins)
             for start in range(0, weights.shape[0], step)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64, device=accurate.device)


def bootstrap_accuracy_ece(
    probs: Tensor, targets: Tensor, *, bins: int = 15, resamples: int = 1000, seed: int = 0
) -> dict[str, Tensor]:
    """Top-1 accuracy and ECE of ``resamples`` bootstrap resamples of the samples (one stratum, 0).

    The ECE is the project's (``callbacks.generated``, module docstring) with every bin sum weighted by the
    resample counts (:func:`weighted_calibration_error`); a row equals torchmetrics on the expanded resample
    to float32 rounding (~1e-7). Resampling unit: the images, independent draws of the generated or shifted
    set.

    Args:
        probs: ``(N, C)`` probabilities (in [0, 1]); targets: ``(N,)`` labels ``0..C-1``.

    Returns:
        ``{"accuracy": (B,), "ece": (B,)}`` float64.
    """
    _check_resamples(resamples, seed, 0)
    confidence, accurate, bin_index = _binned(probs, targets, bins)
    accuracy, ece = [], []
    step = _chunk_rows(accurate.numel() * 4)
    side = _Side(accurate.numel(), seed, 0)
    for start in range(0, resamples, step):
        weights = side.weights(min(step, resamples - start), accurate.device)
        accuracy.append((weights.double() @ accurate) / weights.sum(dim=1, dtype=torch.int64).double())
        ece.append(_ece_rows(weights, bin_index, confidence.double(), accurate, bins))
    return {"accuracy": torch.cat(accuracy), "ece": torch.cat(ece)}


__all__ = ["bootstrap_accuracy_ece", "weighted_calibration_error"]
