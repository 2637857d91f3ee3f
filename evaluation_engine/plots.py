"""Figures of the evaluation reports (matplotlib, no display needed)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from openset_common.artefacts import atomic_write_bytes  # noqa: E402

COLOURS = {"negatives": "tab:orange", "unknowns": "tab:red", "known_target": "tab:blue"}


def save_figure(figure: plt.Figure, path: str | Path) -> Path:
    """Render to PNG in memory, then write atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    return atomic_write_bytes(path, buffer.getvalue())


def plot_oscr_curves(
    curves: Mapping[str, tuple[Tensor, Tensor, Tensor]],
    path: str | Path,
    *,
    fpr_targets: Sequence[float] = (),
    title: str = "OSCR",
) -> Path:
    """CCR against FPR on a logarithmic FPR axis, one curve per group (points with FPR = 0 are off-axis)."""
    figure, axis = plt.subplots(figsize=(5.5, 4))
    smallest = 1.0
    for group, (fpr, ccr, _) in curves.items():
        fpr_np, ccr_np = fpr.cpu().numpy(), ccr.cpu().numpy()
        shown = fpr_np > 0
        if shown.any():
            smallest = min(smallest, float(fpr_np[shown].min()))
        axis.step(fpr_np[shown], ccr_np[shown], where="post", label=group, color=COLOURS.get(group))
    for target in fpr_targets:
        axis.axvline(target, color="grey", linewidth=0.5, linestyle=":")
    axis.set_xscale("log")
    axis.set_xlim(min(smallest, *(t for t in fpr_targets if t > 0), 1.0) / 1.5, 1.05)
    axis.set_ylim(0, 1.0)
    axis.set_xlabel("False Positive Rate (log)")
    axis.set_ylabel("Correct Classification Rate")
    axis.set_title(title)
    axis.grid(True, which="major", alpha=0.3)
    axis.legend(loc="lower right")
    return save_figure(figure, path)


def plot_score_histograms(scores: Mapping[str, Tensor], path: str | Path, *, bins: int = 50, title: str = "") -> Path:
    """Histograms of the known samples' true-class score and of each negative group's max score."""
    figure, axis = plt.subplots(figsize=(5.5, 4))
    edges = np.linspace(0.0, 1.0, bins + 1)
    labels = {"known_target": "known: $S_y$", "negatives_max": "negatives: max $S_c$", "unknowns_max": "unknowns: max $S_c$"}
    for name, values in scores.items():
        colour = COLOURS.get(name.removesuffix("_max"))
        axis.hist(values.cpu().double().numpy(), bins=edges, alpha=0.5, density=True, label=labels.get(name, name), color=colour)
    axis.set_xlabel("score")
    axis.set_ylabel("density")
    axis.set_title(title or "Score distributions")
    axis.legend(loc="upper center")
    return save_figure(figure, path)


def plot_severity(tables: Mapping[str, Sequence[Mapping[str, float]]], path: str | Path, *, title: str = "") -> Path:
    """OOD AUROC against severity level, one line per (model, κ) table; rows with ``ood-auroc low`` and
    ``ood-auroc high`` get their interval as a band."""
    figure, axis = plt.subplots(figsize=(6, 4) if len(tables) <= 6 else (8, 4.5))
    # more lines than the default 10-colour cycle (a card of many detectors): 20 colours and varied markers, so no
    # two lines look alike
    colours = plt.get_cmap("tab10" if len(tables) <= 10 else "tab20").colors
    for number, (label, rows) in enumerate(tables.items()):
        levels = [r["severity level"] for r in rows]
        (line,) = axis.plot(levels, [r["ood-auroc"] for r in rows], marker="o" if len(tables) <= 10 else "osD^v<>"[number % 7],
                            color=colours[number % len(colours)], label=label)
        if rows and all(r.get("ood-auroc low") is not None and r.get("ood-auroc high") is not None for r in rows):
            axis.fill_between(levels, [r["ood-auroc low"] for r in rows], [r["ood-auroc high"] for r in rows],
                              color=line.get_color(), alpha=0.15, linewidth=0)
    axis.set_xlabel("severity level (0 = easiest)")
    axis.set_ylabel("OOD AUROC")
    axis.set_title(title or "C-OOD detection by severity")
    axis.grid(True, alpha=0.3)
    if len(tables) <= 6:
        axis.legend(fontsize="small")
    else:  # beside the axes: over them it hides the lines
        axis.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_figure(figure, path)


def plot_set_bars(rows: Sequence[Mapping[str, object]], path: str | Path, *, metric: str = "auroc",
                  title: str = "") -> Path:
    """One group of bars per set (rows' ``set``), one bar per (model, κ) (rows' ``model`` and ``κ``), each with its
    interval (``<metric> low`` / ``<metric> high``) as an error bar; rows without the metric are left out."""
    rows = [r for r in rows if r.get(metric) is not None]
    sets = list(dict.fromkeys(str(r["set"]) for r in rows))
    detectors = list(dict.fromkeys(f"{r['model']} / {r['κ']}" for r in rows))
    width = 0.8 / max(1, len(detectors))
    figure, axis = plt.subplots(figsize=(max(6.0, 0.45 * len(sets) * max(1, len(detectors)) ** 0.5 + 3), 4.5))
    colours = plt.get_cmap("tab10" if len(detectors) <= 10 else "tab20").colors
    for number, detector in enumerate(detectors):
        mine = {str(r["set"]): r for r in rows if f"{r['model']} / {r['κ']}" == detector}
        xs = [i + (number - (len(detectors) - 1) / 2) * width for i, name in enumerate(sets) if name in mine]
        values = [float(mine[name][metric]) for name in sets if name in mine]  # type: ignore[arg-type]
        low = [v - float(mine[n].get(f"{metric} low") if mine[n].get(f"{metric} low") is not None else v)  # type: ignore[arg-type]
               for v, n in zip(values, [s for s in sets if s in mine], strict=True)]
        high = [float(mine[n].get(f"{metric} high") if mine[n].get(f"{metric} high") is not None else v) - v  # type: ignore[arg-type]
                for v, n in zip(values, [s for s in sets if s in mine], strict=True)]
        axis.bar(xs, values, width=width, yerr=[low, high], capsize=2, color=colours[number % len(colours)],
                 label=detector, error_kw={"linewidth": 0.8})
    axis.set_xticks(range(len(sets)))
    axis.set_xticklabels(sets, rotation=45, ha="right", fontsize="small")
    axis.set_ylabel(metric.upper() if metric == "auroc" else metric)
    axis.set_ylim(0, 1.02)
    axis.axhline(0.5, color="grey", linewidth=0.6, linestyle=":")
    axis.set_title(title or f"{metric} per set")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_figure(figure, path)


def plot_image_rows(rows: Mapping[str, Tensor], path: str | Path, *, title: str = "") -> Path:
    """One row of images per name (``(N, C, H, W)`` in ``[0, 1]``), the name at the row's left: a look at the sets
    (the OOD unit tests)."""
    columns = max(images.shape[0] for images in rows.values())
    figure, axes = plt.subplots(len(rows), columns, figsize=(1.0 * columns + 2.2, 1.0 * len(rows) + 0.4),
                                squeeze=False)
    for row, (name, images) in zip(axes, rows.items(), strict=True):
        for column, axis in enumerate(row):
            axis.set_xticks([])
            axis.set_yticks([])
            for spine in axis.spines.values():  # a thin frame: a white image stays visible on the page
                spine.set_visible(column < images.shape[0])
                spine.set_color("0.6")
                spine.set_linewidth(0.5)
            if column < images.shape[0]:
                image = images[column].detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy()
                axis.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0, vmax=1,
                            interpolation="nearest")
        row[0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize="small")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return save_figure(figure, path)


def save_image_grid(images: Tensor, path: str | Path, *, columns: int = 8, padding: int = 2) -> Path:
    """A grid of ``(N, C, H, W)`` images in ``[0, 1]`` as one PNG (grey-scale stays grey), written atomically."""
    from PIL import Image
    from torchvision.utils import make_grid

    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"expected a non-empty batch of images (N, C, H, W), got shape {tuple(images.shape)}")
    grid = make_grid(images.detach().float().clamp(0, 1).cpu(), nrow=columns, padding=padding, pad_value=1.0)
    array = (grid * 255).round().to(dtype=torch.uint8).permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(array[..., 0] if images.shape[1] == 1 else array).save(buffer, format="PNG")
    return atomic_write_bytes(path, buffer.getvalue())


def plot_energy_traces(traces: Mapping[str, tuple[Tensor, Tensor, Tensor]], path: str | Path, *, title: str = ""
                       ) -> Path:
    """Per sampler ``(steps (T,), current energy (T, chains), running minimum (T, chains))``: the mean over
    chains of both against the step (detector calls), one line style each."""
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for index, (name, (steps, current, best)) in enumerate(traces.items()):
        colour = f"C{index}"
        axis.plot(steps.numpy(), current.double().mean(dim=1).numpy(), color=colour, alpha=0.5, label=f"{name} (current)")
        axis.plot(steps.numpy(), best.double().mean(dim=1).numpy(), color=colour, label=f"{name} (lowest so far)")
    axis.set_xlabel("step (detector calls)")
    axis.set_ylabel("mean energy over chains (lower = trusted more)")
    axis.set_title(title)
    axis.legend(fontsize="small")
    axis.grid(alpha=0.3)
    return save_figure(figure, path)


def plot_heatmap(values: np.ndarray, rows: Sequence[str], columns: Sequence[str], path: str | Path, *,
                 title: str = "", row_label: str = "", column_label: str = "", value_format: str = "{:.3f}") -> Path:
    """A matrix of numbers as a heat-map with the values written in the cells (NaN cells left blank)."""
    figure, axis = plt.subplots(figsize=(1.4 + 1.1 * len(columns), 1.2 + 0.6 * len(rows)))
    image = axis.imshow(values, cmap="viridis", vmin=np.nanmin(values) if np.isfinite(values).any() else 0,
                        vmax=np.nanmax(values) if np.isfinite(values).any() else 1)
    axis.set_xticks(range(len(columns)), labels=list(columns), rotation=30, ha="right", fontsize="small")
    axis.set_yticks(range(len(rows)), labels=list(rows), fontsize="small")
    for i in range(len(rows)):
        for j in range(len(columns)):
            if np.isfinite(values[i, j]):
                axis.text(j, i, value_format.format(values[i, j]), ha="center", va="center", color="white",
                          fontsize="small")
    axis.set_xlabel(column_label)
    axis.set_ylabel(row_label)
    axis.set_title(title, fontsize="medium")
    figure.colorbar(image, ax=axis)
    return save_figure(figure, path)


def plot_accuracy_cost(points: Sequence[Mapping[str, object]], path: str | Path, *, metric: str,
                       title: str = "") -> Path:
    """A headline metric against images per second, one labelled point per (model, κ) (``points``: ``model``,
    ``κ``, ``images/s``, ``value``, ``low``, ``high``), its interval as a vertical error bar; images/s on a log axis
    (detectors differ by orders of magnitude). Points without both numbers are left out."""
    points = [p for p in points if p.get("images/s") and p.get("value") is not None]
    models = list(dict.fromkeys(str(p["model"]) for p in points))
    markers = "osD^vP*X"
    figure, axis = plt.subplots(figsize=(7.5, 4.8))
    colours = plt.get_cmap("tab10").colors
    for number, model in enumerate(models):
        mine = [p for p in points if str(p["model"]) == model]
        xs = [float(p["images/s"]) for p in mine]  # type: ignore[arg-type]
        ys = [float(p["value"]) for p in mine]  # type: ignore[arg-type]
        below = [y - float(p["low"]) if p.get("low") is not None else 0.0 for y, p in zip(ys, mine, strict=True)]  # type: ignore[arg-type]
        above = [float(p["high"]) - y if p.get("high") is not None else 0.0 for y, p in zip(ys, mine, strict=True)]  # type: ignore[arg-type]
        axis.errorbar(xs, ys, yerr=[below, above], fmt=markers[number % len(markers)], color=colours[number % 10],
                      capsize=2, markersize=5, linewidth=0.8, label=model)
        for x, y, p in zip(xs, ys, mine, strict=True):
            axis.annotate(str(p["κ"]), (x, y), xytext=(4, 3), textcoords="offset points", fontsize="x-small")
    axis.set_xscale("log")
    axis.set_xlabel("images per second of the whole scoring (this run's hardware; a ratio between detectors)")
    axis.set_ylabel(metric)
    axis.set_title(title or f"{metric} against throughput")
    axis.grid(True, which="both", alpha=0.3)
    if len(models) > 1:
        axis.legend(fontsize="x-small")
    return save_figure(figure, path)
