"""RationalVector: exact arithmetic over a shared denominator, checked against Fractions element by element."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from streamline.rationals import RationalVector
from streamline.real_thresholds import RealThresholds


def _floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """float64 values over a wide exponent range, with zeros, negatives, float32 values and subnormals."""
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    x[rng.random(n) < 0.1] = 0.0
    single = rng.random(n) < 0.3
    x[single] = x[single].astype(np.float32)
    if n > 3:
        x[0] = 5e-324
    return x


@pytest.mark.parametrize("seed", range(20))
def test_arithmetic_matches_fractions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    a, b = _floats(rng, n), rng.standard_normal(n).astype(np.float32).astype(np.float64)
    third = [Fraction(int(k), int(d)) for k, d in zip(rng.integers(-50, 50, n), rng.integers(1, 30, n))]
    fa, fb = [Fraction(v) for v in a], [Fraction(v) for v in b]
    ra, rb, rc = RationalVector.of(a), RationalVector.of(b), RationalVector.of(third)
    for got, want in [(ra, fa), (ra * rb, [x * y for x, y in zip(fa, fb)]),
                      (ra + rb * rc, [x + y * z for x, y, z in zip(fa, fb, third)]),
                      (-(rc + ra), [-(z + x) for z, x in zip(third, fa)]),
                      (rc * Fraction(3, 7) + 2, [z * Fraction(3, 7) + 2 for z in third]),
                      (ra.take([n - 1, 0]), [fa[-1], fa[0]]), (rc.resize(2 * n), third * 2)]:
        assert list(got.fractions()) == want
        np.testing.assert_array_equal(got.floats(), [float(w) for w in want])  # correctly rounded
        np.testing.assert_array_equal(got.sign(), [(w > 0) - (w < 0) for w in want])
        assert math.gcd(got.den, *got.num.tolist()) == 1


def test_scalars_broadcast_and_floats_compare_exactly() -> None:
    v = RationalVector.of([Fraction(1, 3), 0.5, 2])
    assert list((v * 3).fractions()) == [1, Fraction(3, 2), 6]
    assert list((RationalVector.of(Fraction(1, 2)) + v).fractions()) == [Fraction(5, 6), 1, Fraction(5, 2)]
    np.testing.assert_array_equal(v.equals_floats(np.array([1 / 3, 0.5, 2.0])), [False, True, True])
    assert list(v.where(np.array([True, False, False]), 7).fractions()) == [7, Fraction(1, 2), 2]
    assert list(RationalVector.of(np.array([3, -4], dtype=np.int64)).fractions()) == [3, -4]


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_floats_have_no_exact_value(bad: float) -> None:
    with pytest.raises((OverflowError, ValueError)):
        RationalVector.of(np.array([1.0, bad]))


def test_real_thresholds_read_both_encodings() -> None:
    rt = RealThresholds(np.array([[0.5, 1.5], [2.0, 3.0]]), np.array([[False, True], [True, False]]),
                        [Fraction(3, 7), 2.0 ** -40], [Fraction(1, 5), -3])
    again = RealThresholds.from_json(rt.to_json())
    assert again.real.tolist() == rt.real.tolist()
    data = json.loads(rt.to_json())  # the older encoding: [numerator, denominator] per value
    data["alpha"] = [[a.numerator, a.denominator] for a in rt.alpha.fractions()]
    data["beta"] = [[b.numerator, b.denominator] for b in rt.beta.fractions()]
    assert RealThresholds.from_json(json.dumps(data)).real.tolist() == rt.real.tolist()
