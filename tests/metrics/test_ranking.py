"""``metrics.kendall_tau``: Kendall's τ-b between two benchmarks' scores of the same detectors, against hand
computations (concordant, discordant and tied pairs counted by hand) and its input errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from metrics import kendall_tau


def test_identical_order_is_one_with_the_exact_p_value() -> None:
    tau, p_value = kendall_tau([0.5, 0.6, 0.7, 0.9], [0.1, 0.2, 0.3, 0.4])
    assert tau == pytest.approx(1.0, abs=1e-12)
    # exact null distribution of 4 items without ties: 1 of the 4! = 24 orders has τ = 1, two-sided 2/24
    assert p_value == pytest.approx(2 / 24, abs=1e-12)


def test_reversed_order_is_minus_one() -> None:
    tau, p_value = kendall_tau([0.5, 0.6, 0.7, 0.9], [0.4, 0.3, 0.2, 0.1])
    assert tau == pytest.approx(-1.0, abs=1e-12)
    assert p_value == pytest.approx(2 / 24, abs=1e-12)


def test_one_swap_among_four_detectors() -> None:
    # 6 pairs, one discordant (the swapped neighbours): τ = (5 - 1) / 6
    tau, p_value = kendall_tau([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0])
    assert tau == pytest.approx(2 / 3, abs=1e-12)
    # orders with at most 1 inversion: 1 + 3 of 24, two-sided 2 * 4/24
    assert p_value == pytest.approx(1 / 3, abs=1e-12)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # a ties items 2 and 3: C = 5, D = 0, n0 = 6, ties only in a n1 = 1 -> 5 / sqrt(5 * 6)
        ([1.0, 2.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0], 5 / math.sqrt(30)),
        # a ties 1-2, b ties 2-3: C = 4, D = 0, n1 = n2 = 1 -> 4 / sqrt(5 * 5)
        ([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 2.0, 3.0], 4 / 5),
        # a tie, and 2 discordant pairs: pairs (1,2) C, (1,3) D, (1,4) C, (1,5) C, (2,3) tie in a, (2,4) C,
        # (2,5) C, (3,4) C, (3,5) C, (4,5) D -> C = 7, D = 2, n0 = 10, n1 = 1, n2 = 0 -> 5 / sqrt(9 * 10)
        ([1.0, 2.0, 2.0, 4.0, 5.0], [2.0, 3.0, 1.0, 5.0, 4.0], 5 / math.sqrt(90)),
    ],
)
def test_ties_are_counted_as_tau_b(a: list[float], b: list[float], expected: float) -> None:
    tau, p_value = kendall_tau(a, b)
    assert tau == pytest.approx(expected, abs=1e-12)
    assert 0.0 < p_value <= 1.0


def test_no_variance_gives_nan() -> None:
    tau, p_value = kendall_tau([0.7, 0.7, 0.7], [0.1, 0.2, 0.3])
    assert math.isnan(tau) and math.isnan(p_value)


def test_accepts_arrays_and_is_symmetric() -> None:
    a, b = np.array([0.9, 0.2, 0.4, 0.8, 0.5]), np.array([0.7, 0.1, 0.6, 0.3, 0.2])
    assert kendall_tau(a, b) == pytest.approx(kendall_tau(b, a), abs=1e-12)
    # by hand: of the 10 pairs only (3, 4) and (3, 5) are discordant -> (8 - 2) / 10
    assert kendall_tau(a, b)[0] == pytest.approx(0.6, abs=1e-12)


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        ([0.1, 0.2, 0.3], [0.1, 0.2], r"one length.*\(3,\) and \(2,\)"),
        ([[0.1, 0.2], [0.3, 0.4]], [[0.1, 0.2], [0.3, 0.4]], "one length"),
        ([0.1], [0.2], "at least 2 detectors, got 1"),
        ([0.1, float("nan")], [0.2, 0.3], "NaN or infinite"),
        ([0.1, 0.2], [0.2, float("inf")], "NaN or infinite"),
    ],
)
def test_bad_inputs_are_refused(a: list, b: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kendall_tau(a, b)
