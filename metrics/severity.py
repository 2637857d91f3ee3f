"""Model-tailored C-OOD severity levels (Galil, Dabbah, El-Yaniv, ICLR 2023, §3; DESIGN.md §5.2).

For a (model, κ) pair, each OOD class ȳ gets the severity score ``s(ȳ) = mean κ over its estimation
images``: a class the model is confident on is hard to detect. The classes are sorted by ``s`` ascending,
a sliding window of ``G = |Y_ID|`` classes gives ``M - G + 1`` windows, and for ``q = 0, 0.1, ..., 1``
the window starting at ``int(q · (M - G + 1))`` (the last start minus 1; computed exactly as
``floor(i · (M - G + 1) / (L - 1))``, :func:`level_starts`) is severity level ``i``:
level 0 is the easiest group, level 10 the hardest. Each level is evaluated on the ID test set plus the
test images of its G classes.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from metrics._validation import check_scores
from metrics.auroc import auroc

TABLE_COLUMNS = (
    "severity level", "percentile", "ood-auroc", "ood_avg_conf", "id-acc", "id-auroc", "id_avg_conf",
    "model name", "confidence function", "model name - confidence function",
)


def level_percentiles(num_levels: int = 11) -> list[float]:
    """``q_i = i · (1 / (num_levels - 1))``: 0, 0.1, 0.2, 0.30000000000000004, ... for 11 levels."""
    if num_levels < 2:
        raise ValueError(f"num_levels must be at least 2, got {num_levels}")
    step = 1.0 / (num_levels - 1)
    return [i * step for i in range(num_levels)]


def level_starts(num_windows: int, num_levels: int = 11) -> list[int]:
    """Window start of each level: ``floor(i · W / (L - 1))`` for ``i = 0 .. L - 1``, the last minus 1.

    The paper's ``int(q · W)`` with ``q = i / (L - 1)``, in integer arithmetic: a floating-point ``q`` can
    land just below an integer (``49 · (1/49) = 0.9999999999999999``) and pick the window before the one
    meant, which for the last level is not the hardest window. For 11 levels the floats of the published
    percentiles (0.1, 0.2, 0.30000000000000004, ...) are never below ``i / 10``, so both rules agree.

    Args:
        num_windows: ``W = M - G + 1``, the number of sliding windows.
        num_levels: ``L``, at least 2.

    Returns:
        ``L`` window starts in ``0 .. W - 1``, non-decreasing; the last is ``W - 1`` (the hardest window).
    """
    if num_levels < 2:
        raise ValueError(f"num_levels must be at least 2, got {num_levels}")
    if num_windows < 1:
        raise ValueError(f"num_windows must be positive, got {num_windows}")
    starts = [i * num_windows // (num_levels - 1) for i in range(num_levels)]
    starts[-1] -= 1
    return starts


def check_num_levels(num_levels: int, num_classes: int, group_size: int, *, data: str = "the severity data") -> int:
    """Refuse more severity levels than the data have distinct windows: the sorted OOD classes give
    ``W = M - G + 1`` sliding windows of ``G`` classes, and more levels than windows only repeat windows (each
    repeat costs its AUROC, its intervals and its rows, and tells nothing new). Returns ``W``.

    Args:
        num_levels: ``L``, the levels asked for.
        num_classes: ``M``, the OOD pool's classes.
        group_size: ``G``, the classes per level (the ID classes).
        data: what the error calls the data.

    Raises:
        ValueError: ``M < G`` (no window at all) or ``L > W``, naming ``L``, ``M``, ``G`` and ``W`` and the option.
    """
    windows = num_classes - group_size + 1
    if windows < 1:
        raise ValueError(f"severity levels need at least as many OOD classes as the group size: M = {num_classes} < "
                         f"G = {group_size} ({data}: M OOD pool classes, G ID classes)")
    if num_levels > windows:
        raise ValueError(f"num_levels = {num_levels} asks for more severity levels than {data} has distinct ones: "
                         f"M − G + 1 = {num_classes} − {group_size} + 1 = {windows} windows ({num_classes} OOD pool "
                         f"classes, groups of G = {group_size} ID classes), so {num_levels - windows} "
                         f"level{'s' if num_levels - windows > 1 else ''} would repeat a window; give num_levels "
                         f"(--num-levels) {windows} or fewer")
    return windows


PAPER_LEVELS = 11  # Galil et al.'s q = 0, 0.1, ..., 1


def resolve_num_levels(num_levels: int | None, num_classes: int, group_size: int, *,
                       data: str = "the severity data") -> int:
    """The number of severity levels ``L`` of a benchmark: ``num_levels`` when given (refused when the data have
    fewer windows, :func:`check_num_levels`); else the paper's :data:`PAPER_LEVELS`, capped at the data's
    ``W = M - G + 1`` windows with a warning that names both (a small pool: 5 OOD classes against 3 ID classes
    give 3 distinct levels, not 11 of which 8 repeat).

    Raises:
        ValueError: ``num_levels`` given and above ``W``, or fewer than 2 windows (a pool of ``M <= G`` classes
            has a single group: no severity levels to tell apart), naming ``M``, ``G`` and ``W``.
    """
    if num_levels is not None:
        check_num_levels(num_levels, num_classes, group_size, data=data)
        return num_levels
    windows = check_num_levels(1, num_classes, group_size, data=data)
    if windows < 2:
        raise ValueError(f"{data} has {num_classes} OOD pool classes and G = {group_size} ID classes: M − G + 1 = "
                         f"{windows} window, a single group of OOD classes and no severity levels to tell apart; "
                         f"severity levels need at least G + 1 = {group_size + 1} OOD classes")
    if windows < PAPER_LEVELS:
        warnings.warn(f"{data} has M − G + 1 = {num_classes} − {group_size} + 1 = {windows} distinct windows, fewer "
                      f"than the paper's {PAPER_LEVELS} severity levels: {windows} levels (give --num-levels to "
                      "choose fewer)", UserWarning, stacklevel=2)
    return min(PAPER_LEVELS, windows)


def class_mean_scores(scores: Tensor, classes: Tensor, num_classes: int | None = None) -> Tensor:
    """Mean score per class (float64): ``(N,)`` scores and class ids ``0..M-1`` -> ``(M,)``.

    Raises:
        ValueError: if a class id in ``0..num_classes-1`` has no sample.
    """
    scores = check_scores(scores, name="scores").double()
    classes = torch.as_tensor(classes, device=scores.device).long()
    if classes.shape != scores.shape:
        raise ValueError(f"classes must have shape {tuple(scores.shape)}, got {tuple(classes.shape)}")
    if classes.numel() and int(classes.min()) < 0:
        raise ValueError(f"class ids must be non-negative, got {int(classes.min())}")
    num_classes = num_classes if num_classes is not None else int(classes.max()) + 1
    counts = torch.bincount(classes, minlength=num_classes)
    if counts.numel() > num_classes:
        raise ValueError(f"class id {int(classes.max())} is out of range for {num_classes} classes")
    if (counts == 0).any():
        empty = (counts == 0).nonzero().flatten()[:10].tolist()
        raise ValueError(f"classes {empty} have no estimation sample")
    sums = torch.zeros(num_classes, dtype=torch.float64, device=scores.device).index_add_(0, classes, scores)
    return sums / counts


def severity_levels(class_scores: Tensor, group_size: int, num_levels: int = 11) -> tuple[Tensor, Tensor]:
    """Severity groups of the paper.

    Args:
        class_scores: ``(M,)`` severity score ``s`` of each OOD class (mean κ over its estimation images).
        group_size: ``G``, the number of classes per level (``|Y_ID|``: 1000 for ImageNet).
        num_levels: number of levels (11 in the paper).

    Returns:
        ``(groups, level_scores)``: ``groups`` ``(num_levels, G)`` int64 class indices of each level in
        ascending score order, and ``level_scores`` ``(num_levels,)`` float64, the mean ``s`` of each group.
        Sorting is stable, so tied classes keep their index order.

    Raises:
        ValueError: if ``M < G``. More levels than the ``M - G + 1`` windows repeat windows, as the paper's rule
            gives them; the benchmark refuses or caps them before any pass (:func:`resolve_num_levels`).
    """
    scores = check_scores(class_scores, name="class_scores").double()
    num_classes = scores.numel()
    if group_size < 1:
        raise ValueError(f"group_size must be positive, got {group_size}")
    if num_classes < group_size:
        raise ValueError(
            f"severity levels need at least as many OOD classes as the group size: M = {num_classes} < G = {group_size}"
        )
    sorted_scores, order = torch.sort(scores, stable=True)
    # Sliding-window means of width G from a cumulative sum: window j covers sorted classes j .. j+G-1.
    cumulative = torch.cat([sorted_scores.new_zeros(1), torch.cumsum(sorted_scores, dim=0)])
    window_means = (cumulative[group_size:] - cumulative[:-group_size]) / group_size
    starts = level_starts(num_classes - group_size + 1, num_levels)
    offsets = torch.arange(group_size, device=order.device)
    groups = torch.stack([order[start + offsets] for start in starts])
    return groups, window_means[torch.tensor(starts, device=window_means.device)]


def severity_table(
    *,
    id_scores: Tensor,
    id_correct: Tensor,
    ood_scores: Tensor,
    ood_classes: Tensor,
    groups: Tensor,
    model_name: str,
    kappa_name: str,
) -> list[dict[str, Any]]:
    """One row per severity level with the columns of the paper's published tables.

    Args:
        id_scores: ``(N_id,)`` κ on the in-distribution test set.
        id_correct: ``(N_id,)`` whether the model classified each ID sample correctly.
        ood_scores: ``(N_ood,)`` κ on the OOD test images of every pool class.
        ood_classes: ``(N_ood,)`` pool class id of each OOD test image.
        groups: ``(L, G)`` class ids of each level (:func:`severity_levels`).

    Returns:
        rows with ``TABLE_COLUMNS``: ood-auroc (ID positive), mean κ on the level's OOD images, ID accuracy,
        ID AUROC (correct vs. incorrect ID predictions), mean κ on ID.
    """
    id_scores = check_scores(id_scores, name="id_scores").double()
    ood_scores = check_scores(ood_scores, name="ood_scores").double()
    id_correct = torch.as_tensor(id_correct, device=id_scores.device).bool()
    ood_classes = torch.as_tensor(ood_classes, device=ood_scores.device).long()
    id_accuracy = float(id_correct.double().mean())
    if id_correct.all() or not id_correct.any():
        id_auroc = float("nan")  # undefined without both correct and incorrect predictions
    else:
        id_auroc = auroc(id_scores[id_correct], id_scores[~id_correct])
    id_mean = float(id_scores.mean())
    rows = []
    for level, (percentile, group) in enumerate(zip(level_percentiles(groups.shape[0]), groups, strict=True)):
        members = torch.isin(ood_classes, group.to(ood_classes.device))
        if not members.any():
            raise ValueError(f"severity level {level} has no OOD test image")
        level_scores = ood_scores[members]
        rows.append({
            "severity level": level,
            "percentile": percentile,
            "ood-auroc": auroc(id_scores, level_scores),
            "ood_avg_conf": float(level_scores.mean()),
            "id-acc": id_accuracy,
            "id-auroc": id_auroc,
            "id_avg_conf": id_mean,
            "model name": model_name,
            "confidence function": kappa_name,
            "model name - confidence function": f"{model_name}-{kappa_name}",
        })
    return rows
