"""Vectors of exact rationals over one shared denominator: ``v[i] = num[i] / den``.

The per-channel factors of real thresholds are products and sums of float scales (dyadic rationals) and a few
other rationals such as the ``1/n`` of an average. As :class:`fractions.Fraction` objects every channel pays for a
gcd and a Python-level call on each operation; over one shared denominator a product or a sum is integer
arithmetic on whole numpy object arrays of Python ints, and the common factor is taken out once per operation with
one gcd over the vector. Values are exact whatever their size; conversion to float64 is correctly rounded (Python's
integer true division is).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np


class RationalVector:
    """A 1-D vector of exact rationals ``num[i] / den`` (``num`` an object array of Python ints, ``den > 0``), kept
    in lowest terms as a whole (no common factor of ``den`` and every ``num[i]``)."""

    __slots__ = ("num", "den")

    def __init__(self, num: np.ndarray, den: int) -> None:
        g = math.gcd(den, *num.tolist())
        if g > 1:
            num, den = num // g, den // g
        self.num, self.den = num, den

    @staticmethod
    def of(value: Any) -> "RationalVector":
        """The exact values of a scalar or a sequence of ints, floats or Fractions (flattened); a float that is not
        finite raises, as ``Fraction`` does."""
        if isinstance(value, RationalVector):
            return value
        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            return _from_floats(arr.astype(np.float64).ravel())
        if arr.dtype.kind in "iub":
            return RationalVector(_ints(arr.ravel().tolist()), 1)
        pairs = [_ratio(x) for x in arr.ravel().tolist()]
        den = math.lcm(*(d for _, d in pairs)) if pairs else 1
        return RationalVector(_ints([n * (den // d) for n, d in pairs]), den)

    def __len__(self) -> int:
        return self.num.size

    @property
    def size(self) -> int:
        return self.num.size

    def __mul__(self, other: Any) -> "RationalVector":
        o = RationalVector.of(other)
        return RationalVector(self.num * o.num, self.den * o.den)

    __rmul__ = __mul__

    def __add__(self, other: Any) -> "RationalVector":
        o = RationalVector.of(other)
        if o.den == self.den:
            return RationalVector(self.num + o.num, self.den)
        den = math.lcm(self.den, o.den)
        return RationalVector(self.num * (den // self.den) + o.num * (den // o.den), den)

    def __neg__(self) -> "RationalVector":
        return RationalVector(-self.num, self.den)

    def fraction(self, i: int) -> Fraction:
        return Fraction(int(self.num[i]), self.den)

    def fractions(self) -> np.ndarray:
        """The values as an object array of Fractions."""
        out = np.empty(self.size, dtype=object)
        out[:] = [Fraction(n, self.den) for n in self.num.tolist()]
        return out

    def floats(self) -> np.ndarray:
        """The values correctly rounded to float64 (OverflowError beyond float64's range)."""
        den = self.den
        if den & (den - 1) == 0:  # a power of two: float(n), correctly rounded, scaled exactly
            try:
                out = np.ldexp(self.num.astype(np.float64), -(den.bit_length() - 1))
            except OverflowError:
                out = None
            if out is not None:
                tiny = np.flatnonzero((np.abs(out) <= 2.0 ** -1022) & (self.num != 0))  # subnormal: rounded twice
                for i in tiny.tolist():
                    out[i] = self.num[i] / den
                return out
        return np.array([n / den for n in self.num.tolist()], dtype=np.float64).reshape(self.num.shape)

    def sign(self) -> np.ndarray:
        """−1, 0 or 1 per value, as int64."""
        return (self.num > 0).astype(np.int64) - (self.num < 0).astype(np.int64)

    def repeat(self, n: int) -> "RationalVector":
        """Every value ``n`` times (a single value: ``n`` of it)."""
        return RationalVector(np.repeat(self.num, n), self.den)

    def resize(self, n: int) -> "RationalVector":
        """The values repeated cyclically to length ``n`` (``numpy.resize``)."""
        return RationalVector(np.resize(self.num, n), self.den)

    def take(self, index: Any) -> "RationalVector":
        return RationalVector(self.num[np.asarray(index)], self.den)

    def where(self, mask: np.ndarray, value: int) -> "RationalVector":
        """The values with the integer ``value`` where ``mask`` is true."""
        num = self.num.copy()
        num[np.asarray(mask, dtype=bool)] = value * self.den
        return RationalVector(num, self.den)

    def equals_floats(self, floats: np.ndarray) -> np.ndarray:
        """Per value, whether it is exactly the float64 ``floats[i]`` (finite)."""
        out = np.zeros(self.size, dtype=bool)
        for i, (n, f) in enumerate(zip(self.num.tolist(), np.asarray(floats, np.float64).tolist())):
            if math.isfinite(f):
                fn, fd = f.as_integer_ratio()
                out[i] = fn * self.den == n * fd
        return out


def _ints(values: list[int]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [int(v) for v in values]
    return out


def _ratio(x: Any) -> tuple[int, int]:
    if isinstance(x, (int, Fraction)):
        return x.as_integer_ratio()
    if isinstance(x, np.integer):
        return int(x), 1
    return float(x).as_integer_ratio()


def _from_floats(a: np.ndarray) -> RationalVector:
    """Exact values of float64 numbers: ``a = m·2^e`` with an integer ``m`` of at most 53 bits, put over the
    denominator ``2^-min(e)``."""
    if not np.isfinite(a).all():
        bad = float(a[~np.isfinite(a)][0])
        raise (ValueError if math.isnan(bad) else OverflowError)(f"cannot convert {bad} to an exact rational")
    mant, exp = np.frexp(a)
    m = (mant * 2.0 ** 53).astype(np.int64)
    e = exp.astype(np.int64) - 53
    low = int(e[m != 0].min()) if (m != 0).any() else 0
    num = _ints(m.tolist()) << (e - low).clip(0).astype(object)
    if low >= 0:
        return RationalVector(num << low, 1)
    return RationalVector(num, 1 << -low)
