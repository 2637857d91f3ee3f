"""Independent numpy implementations written directly from the papers' formulas.

They loop over thresholds and samples the slow, obvious way; the library's vectorised code is
tested against them.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from sklearn.metrics import roc_auc_score


def split_background(probs: np.ndarray, background: bool) -> np.ndarray:
    return probs[:, :-1] if background else probs


def oscr_reference(probs, target, unknown_label=-2, background=False):
    """One pass over the data per distinct threshold, as in the authors' evaluation loop."""
    probs = split_background(np.asarray(probs, dtype=np.float64), background)
    target = np.asarray(target)
    known = target >= 0
    unknown = target == unknown_label
    known_probs = probs[known]
    y = target[known]
    target_score = known_probs[np.arange(len(y)), y]
    correct = np.argmax(known_probs, axis=1) == y
    unknown_score = probs[unknown].max(axis=1)
    thresholds = np.unique(np.concatenate([target_score, unknown_score]))[::-1]
    fpr, ccr = [], []
    for theta in thresholds:
        ccr.append(np.sum(correct & (target_score > theta)) / len(y))
        fpr.append(np.sum(unknown_score > theta) / len(unknown_score))
    return np.array(fpr), np.array(ccr), thresholds


def ccr_at_fpr_reference(probs, target, fpr_targets, unknown_label=-2, background=False):
    fpr, ccr, _ = oscr_reference(probs, target, unknown_label, background)
    return np.array([max(c for f, c in zip(fpr, ccr, strict=True) if f <= t) for t in fpr_targets])


def authors_oscr_reference(probs, target, unknown_label=-2, background=False):
    """The authors' ``calculate_oscr``: thresholds at the distinct known target scores but the largest."""
    probs = split_background(np.asarray(probs, dtype=np.float64), background)
    target = np.asarray(target)
    known = target >= 0
    unknown = target == unknown_label
    gt = target[known]
    pred = np.argmax(probs, axis=1)[known]
    max_score = np.max(probs, axis=1)[unknown]
    target_score = probs[known][np.arange(len(gt)), gt]
    thresholds = np.unique(target_score)[:-1]
    ccr, fpr = [], []
    for tau in thresholds:
        ccr.append(np.sum((pred == gt) & (target_score > tau)) / len(gt))
        fpr.append(np.sum(max_score > tau) / len(max_score))
    return np.array(fpr, dtype=np.float64), np.array(ccr, dtype=np.float64), thresholds


def authors_ccr_at_fpr_reference(probs, target, fpr_targets, unknown_label=-2, background=False):
    """The authors' table: the nearest FPR point (np.argmin: first among ties), NaN for their "—"."""
    fpr, ccr, _ = authors_oscr_reference(probs, target, unknown_label, background)
    values = []
    for t in fpr_targets:
        if len(fpr) == 0:
            values.append(np.nan)
            continue
        idx = np.argmin(np.abs(fpr - t))
        values.append(np.nan if abs(fpr[idx] - t) / t >= 0.1 else ccr[idx])
    return np.array(values, dtype=np.float64)


def gamma_reference(probs, target, negative_label=-1, background=False):
    probs = np.asarray(probs, dtype=np.float64)
    target = np.asarray(target)
    known_probs = split_background(probs, background)
    num_known = known_probs.shape[1]
    plus = [known_probs[i, target[i]] for i in range(len(target)) if target[i] >= 0]
    if background:
        minus = [1.0 - known_probs[i].max() for i in range(len(target)) if target[i] == negative_label]
    else:
        minus = [1.0 + 1.0 / num_known - known_probs[i].max() for i in range(len(target)) if target[i] == negative_label]
    gamma_plus, gamma_minus = float(np.mean(plus)), float(np.mean(minus))
    return gamma_plus, gamma_minus, (gamma_plus + gamma_minus) / 2


def random_open_set_data(rng: np.random.Generator, n: int, k: int, background: bool = False, decimals: int = 2):
    """Softmax probabilities rounded to few decimals (many ties) with known/negative/unknown labels."""
    logits = rng.normal(size=(n, k + int(background))) * 2
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    probs = np.round(probs, decimals)
    target = rng.integers(-2, k, size=n)
    # make sure every group is present
    target[:3] = [0, -1, -2]
    return probs.astype(np.float32), target.astype(np.int64)


def severity_reference(class_scores, group_size, num_levels=11):
    """The paper's procedure, written out: sort ascending, all windows of G, pick 11 window starts."""
    scores = [float(s) for s in class_scores]
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    num_windows = len(scores) - group_size + 1
    windows = [order[j:j + group_size] for j in range(num_windows)]
    means = [sum(scores[c] for c in window) / group_size for window in windows]
    starts = [int(i * 0.1 * num_windows) if num_levels == 11 else int(i / (num_levels - 1) * num_windows)
              for i in range(num_levels)]
    starts[-1] -= 1
    return [windows[s] for s in starts], [means[s] for s in starts]


def severity_reference_exact(class_scores, group_size, num_levels):
    """The same procedure with exact rational percentiles: ``q_i = Fraction(i, L - 1)``, start ``floor(q_i · W)``."""
    scores = [float(s) for s in class_scores]
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    num_windows = len(scores) - group_size + 1
    windows = [order[j:j + group_size] for j in range(num_windows)]
    means = [sum(scores[c] for c in window) / group_size for window in windows]
    starts = [math.floor(Fraction(i, num_levels - 1) * num_windows) for i in range(num_levels)]
    starts[-1] -= 1
    return [windows[s] for s in starts], [means[s] for s in starts]


def sklearn_auroc(id_scores, ood_scores):
    labels = np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))]
    return roc_auc_score(labels, np.r_[id_scores, ood_scores])


def expanded(values, counts):
    return np.repeat(np.asarray(values), np.asarray(counts), axis=0)
