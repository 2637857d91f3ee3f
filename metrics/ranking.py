"""Rank agreement between benchmarks (Mukhoti et al.'s second finding, made a number).

``kendall_tau(a, b)``: Kendall's τ-b (ties counted as in scipy.stats.kendalltau) between two score lists over
the same detectors, e.g. each (model, κ)'s AUROC on a generated near-OOD set and on a real OOD set: 1 when
both benchmarks rank the detectors alike, -1 when they rank them in reverse, NaN when either has no variance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(τ-b, two-sided p-value)`` of two equally long score lists (scipy's implementation)."""
    from scipy.stats import kendalltau

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"kendall_tau needs two score lists of one length, got shapes {a.shape} and {b.shape}")
    if a.size < 2:
        raise ValueError(f"kendall_tau needs at least 2 detectors, got {a.size}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("kendall_tau got NaN or infinite scores")
    result = kendalltau(a, b)
    return float(result.statistic), float(result.pvalue)


def rank_agreement(rows: Sequence[Mapping[str, Any]], *, generated: Sequence[str], real: Sequence[str],
                   score: str = "auroc") -> list[dict[str, Any]]:
    """Kendall's τ between the detectors' rankings on each generated set and each real set.

    Args:
        rows: one row per (detector, set) with ``model``, ``confidence function``, ``set`` and ``score``.
        generated, real: the set names to compare, each generated set with each real one.

    Returns:
        One row per pair with at least two detectors in common: ``generated``, ``real``, ``detectors``,
        ``kendall tau``, ``p-value``.
    """
    by_set: dict[str, dict[tuple[str, str], float]] = {}
    for row in rows:
        by_set.setdefault(row["set"], {})[(row["model"], row["confidence function"])] = row[score]
    agreement = []
    for name in generated:
        for other in real:
            pairs = sorted(set(by_set.get(name, {})) & set(by_set.get(other, {})))
            if len(pairs) >= 2:
                tau, p_value = kendall_tau([by_set[name][d] for d in pairs], [by_set[other][d] for d in pairs])
                agreement.append({"generated": name, "real": other, "detectors": len(pairs), "kendall tau": tau,
                                  "p-value": p_value})
    return agreement
