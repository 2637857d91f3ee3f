"""KL matching: the KL divergence of a sample's softmax to the nearest class-typical softmax.

Hendrycks, Basart, Mazeika, Zou, Kwon, Mostajabi, Steinhardt, Song, *Scaling Out-of-Distribution Detection for
Real-World Settings*, ICML 2022 (its "KL matching"). With ``p(x) = softmax(logits(x))`` over the known classes and
``ŷ(x) = argmax_c p_c(x)``, fitted on in-distribution samples without their labels:

    d_c      = mean of p(x') over the fit samples x' that the model predicts as c   (for every predicted class c)
    score(x) = -min_c KL(p(x) ‖ d_c),     KL(p ‖ d) = Σ_j p_j log(p_j / d_j)

(higher = more in-distribution; pytorch-ood's ``KLMatching`` returns the divergence). The minimum runs over the
classes predicted for at least one fit sample (pytorch-ood's rule; OpenOOD's ``kl_matching_postprocessor.py``
gives a class predicted for none the one-hot posterior, whose divergence is infinite for every ``p`` that is not
exactly one-hot at that class: the same minimum but where a softmax underflows to an exact one-hot).
``0 log 0 = 0``; a ``d_j`` that underflowed to 0 enters as the lowest float64 (pytorch-ood's rule: a finite, huge
divergence for ``p_j > 0``).
A background-class model's softmax is over its known logits.

Fit split: the paper's ``d_c`` is an expectation over in-distribution validation samples ``x' ~ X_val`` (the
formula pytorch-ood's docstring gives too), and OpenOOD fits it on ``id_loader_dict['val']``: ``fit_split =
"val"``, the engine's ID validation set where the data have one. No hyperparameters.

Reference: pytorch-ood 0.4.0's ``KLMatching`` (run in float64), and a numpy transcription of OpenOOD's
postprocessor (``scipy.stats.entropy(p, d_c)``, ``pairwise_distances_argmin_min``) in
``tests/metrics/detectors/test_klm.py``: the largest difference measured on the tests' data (logits of 300 × 32
features, ties included) is 6·10⁻¹⁶ absolute against pytorch-ood and 7·10⁻¹⁶ against OpenOOD's form (the
divergence as ``Σ p log p - Σ p log d``, one matrix product per chunk, against a sum of ``p log(p/d)``).

Precision (:mod:`metrics.detectors.base`): the fit, the softmax and its entropy are float64; the divergences' product
``p · log d_cᵀ`` (and the entropy's subtraction) runs in the logits' precision, float32 for float32 logits (there a
``d_j = 0`` enters as float32's lowest value, still a finite, huge divergence), float64 for float64 ones.

Memory: fit ``O(K² + chunk·K)`` (the class sums of the softmax); score ``O(K² + chunk·K)``, chunk =
``min(CHUNK_ROWS, CHUNK_ELEMENTS / K)`` rows (K = 1000: 8 MiB of typical posteriors, 128 MiB float64 temporaries per
chunk). Measured (CPU, float32 logits, K = 1000, N = 200,000): the fit peaks 386 MiB above the logits, the same at
any N (streamed); scoring 651 MiB above the fitted state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import Buffers, Detector, chunk_rows, product_dtype, row_chunks
from metrics.detectors.registry import register_detector


@register_detector
class KLMatching(Detector):
    """KL matching score, ``-min_c KL(p(x) ‖ d_c)`` (see the module docstring).

    Buffers: ``typical`` ``(P, K)`` float64, the mean softmax ``d_c`` of each of the ``P`` classes predicted for
    at least one fit sample, and ``typical_classes`` ``(P,)`` int64, those classes.
    """

    name = "klm"
    paper = "Hendrycks et al., ICML 2022"
    inputs = frozenset({"logits"})
    fit_data = True
    fit_split = "val"
    refuse_non_finite = True
    fitted_buffers = ("typical", "typical_classes")

    def _fit(self, data: dict[str, Tensor]) -> None:
        logits = data["logits"]
        if logits.ndim != 2:
            raise ValueError(f"detector {self.name!r}: fit logits must be (N, C), got {tuple(logits.shape)}")
        classes = self.known_logits(logits[:1]).shape[1]
        sums = torch.zeros(classes, classes, dtype=torch.float64, device=logits.device)
        counts = torch.zeros(classes, dtype=torch.long, device=logits.device)
        for (chunk,) in row_chunks(logits, rows=chunk_rows(classes)):
            p = torch.softmax(self.known_logits(chunk), dim=1)
            predicted = p.argmax(dim=1)
            sums.index_add_(0, predicted, p)
            counts += torch.bincount(predicted, minlength=classes)
        seen = (counts > 0).nonzero().flatten()
        self.register_buffer("typical", sums[seen] / counts[seen, None].to(torch.float64))
        self.register_buffer("typical_classes", seen)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        logits = outputs["logits"]
        classes = self.typical.shape[1]
        self.check_known_width(logits, classes)
        dtype = product_dtype(logits)  # the product's precision: the logits' (metrics.detectors.base, Precision)
        floor = torch.finfo(dtype).min  # the lowest float of the product's dtype: finite there
        log_typical = torch.where(self.typical > 0, self.typical.log(), torch.full_like(self.typical, floor)).to(dtype)
        scores, buffers = [], Buffers(logits.device)
        for (chunk,) in row_chunks(logits, rows=chunk_rows(max(classes, self.typical.shape[0]))):
            known = buffers.float64(chunk[:, :-1] if self.background else chunk, "known logits")
            shape = tuple(known.shape)
            log_p = torch.log_softmax(known, dim=1, out=buffers.take("log p", shape, torch.float64))
            p = torch.exp(log_p, out=buffers.take("p", shape, torch.float64))
            # p = 0 only where log p is finite: 0·x = 0
            negative_entropy = torch.mul(p, log_p, out=buffers.take("p log p", shape, torch.float64)).sum(
                dim=1, keepdim=True)
            if dtype != torch.float64:
                p = buffers.take("p in the product's precision", shape, dtype).copy_(p)
            divergence = torch.addmm(negative_entropy.to(dtype), p, log_typical.T, alpha=-1, out=buffers.take(
                "divergence", (shape[0], log_typical.shape[0]), dtype))
            # the minimum of the float32 divergences is that of their float64 casts
            scores.append(-divergence.min(dim=1).values.to(torch.float64))
        return torch.cat(scores) if scores else logits.new_zeros(0, dtype=torch.float64)
