"""Real-number thresholds: what a MultiThreshold means, kept exactly while the streamliner rewrites around it.

A MultiThreshold made from a quantizer stores float32 thresholds chosen for float32 inputs (bit-exact with the
original's float32 execution). Once scales and biases are absorbed and its input is an exact integer accumulator,
its thresholds must instead follow the *real-number* semantics of the original graph: level ``m`` is
reached when ``x ≥ R[c, m]`` (or ``x > R[c, m]`` where the rounding sends the tie down). The float32 threshold
alone cannot tell ``R`` from its float32 neighbour, and a one-ulp difference shows up on real models, so the exact
``R`` and the strictness flag travel with the node in its ``metadata_props`` under ``finnlite.real_thresholds``.

Representation (vectorized and exact): ``R[c, m] = (base[c, m] − β[c]) / α[c]`` with ``base`` float64 values that
are exact (a quantizer's switching points ``s·(k − ½ − z)`` are), and per-channel rationals ``α > 0``, ``β``
(:class:`streamline.rationals.RationalVector`; every float is a dyadic rational). Absorbing a constant only updates
α and β:

* ``Add(b)`` before the node: ``x + b ≥ R ⇔ x ≥ R − b``, i.e. ``β ← β + α·b``;
* ``Mul(a)``, ``a > 0``: ``a·x ≥ R ⇔ x ≥ R / a``, i.e. ``α ← α·a``;
* a negative factor: ``x ≥ R ⇔ −x ≤ −R``, a count from above (:meth:`RealThresholds.negated`); the caller negates
  the node's out_scale and shifts its out_bias by out_scale·N;
* a zero factor or a Relu: thresholds that 0 passes become −∞, the others (for a zero factor) +∞.

Materializing: for an integer input ``x ≥ R ⇔ x ≥ ⌈R⌉`` and ``x > R ⇔ x ≥ ⌊R⌋ + 1``; for a float32 input the least
float32 not below ``R`` (strictly above, where strict). Both are computed in float64 with a rigorous error bound
and recomputed exactly with Fractions only where the bound does not decide (exact ties and near-ties).
"""

from __future__ import annotations

import base64
import json
import math
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from custom_ops.multithreshold import search_sorted_rows
from custom_ops.quant import canonical_rounding_mode, max_int, min_int
from streamline.rationals import RationalVector

META_KEY = "finnlite.real_thresholds"
_EPS = 2.0 ** -50  # a generous bound on the relative error of a few float64 operations


def _exact_base(real: Any) -> np.ndarray:
    """float64 values of ``real`` (floats or Fractions), which must be exactly representable."""
    arr = np.asarray(real)
    if arr.dtype != object:
        return arr.astype(np.float64)
    out = np.empty(arr.shape, dtype=np.float64)
    for idx in np.ndindex(arr.shape):
        f = float(arr[idx])
        if math.isfinite(f) and Fraction(f) != arr[idx]:
            raise ValueError(f"threshold {arr[idx]} is not exact in float64; use alpha/beta for rationals")
        out[idx] = f
    return out


class ThresholdPrecisionError(ValueError):
    """An integer threshold that float32, the type FINN stores thresholds in, cannot hold exactly."""


class RealThresholds:
    """Exact thresholds ``(base − β) / α`` (module docstring) with per-threshold strictness."""

    def __init__(self, base: Any, strict: Any, alpha: Any = None, beta: Any = None) -> None:
        self.base = _exact_base(base)
        self.strict = np.asarray(strict, dtype=bool)
        if self.base.ndim != 2 or self.base.shape != self.strict.shape:
            raise ValueError(f"thresholds {self.base.shape} and strict flags {self.strict.shape} must be matching "
                             "(channels, steps) arrays")
        self.alpha = RationalVector.of(1 if alpha is None else alpha)
        self.beta = RationalVector.of(0 if beta is None else beta)
        rows = {self.base.shape[0], self.alpha.size, self.beta.size} - {1}
        if len(rows) > 1:
            raise ValueError(f"row counts {self.base.shape[0]}, {self.alpha.size}, {self.beta.size} disagree")
        if alpha is not None and (self.alpha.sign() <= 0).any():
            raise ValueError("alpha must be positive")

    @property
    def shape(self) -> tuple[int, int]:
        rows = max(self.base.shape[0], self.alpha.size, self.beta.size)
        return rows, self.base.shape[1]

    def _full(self) -> "RealThresholds":
        """The same thresholds with every part expanded to one row per channel."""
        rows = self.shape[0]
        if self.base.shape[0] == self.alpha.size == self.beta.size == rows:
            return self
        rep = lambda a: a if a.shape[0] == rows else np.repeat(a, rows, axis=0)  # noqa: E731
        col = lambda v: v if v.size == rows else v.repeat(rows)  # noqa: E731
        return RealThresholds(rep(self.base), rep(self.strict), col(self.alpha), col(self.beta))

    @property
    def real(self) -> np.ndarray:
        """The exact thresholds as an object array of Fractions (slow; for tests and reports)."""
        full = self._full()
        out = np.empty(full.base.shape, dtype=object)
        for c, m in np.ndindex(out.shape):
            b = full.base[c, m]
            out[c, m] = (Fraction(b) - full.beta.fraction(c)) / full.alpha.fraction(c) if math.isfinite(b) else b
        return out

    # -- serialization ---------------------------------------------------------------------------------------
    def to_json(self) -> str:
        """JSON text: ``base`` as base64 of little-endian float64, ``strict`` as base64 of bytes, α and β each as
        its shared denominator and its numerators."""
        return json.dumps({"shape": list(self.base.shape),
                           "base": base64.b64encode(self.base.astype("<f8").tobytes()).decode("ascii"),
                           "strict": base64.b64encode(self.strict.astype(np.uint8).tobytes()).decode("ascii"),
                           "alpha": {"den": self.alpha.den, "num": self.alpha.num.tolist()},
                           "beta": {"den": self.beta.den, "num": self.beta.num.tolist()}})

    @staticmethod
    def from_json(text: str) -> "RealThresholds":
        return _parse(text)

    # -- algebra ---------------------------------------------------------------------------------------------
    def broadcast_channels(self, channels: int) -> "RealThresholds":
        """The same thresholds with one row per channel (a single row is repeated)."""
        if self.shape[0] == channels:
            return self
        if self.shape[0] != 1:
            raise ValueError(f"cannot broadcast {self.shape[0]} threshold rows to {channels} channels")
        rep = lambda a: np.repeat(a, channels, axis=0)  # noqa: E731
        return RealThresholds(rep(self.base), rep(self.strict), self.alpha.repeat(channels),
                              self.beta.repeat(channels))

    def rows(self, index: Sequence[int] | np.ndarray) -> "RealThresholds":
        """The thresholds of the rows ``index`` (e.g. a permutation of the channels)."""
        idx = np.asarray(index)
        pick = lambda a: a if a.shape[0] == 1 else a[idx]  # noqa: E731 - a single row is every channel's
        col = lambda v: v if v.size == 1 else v.take(idx)  # noqa: E731
        return RealThresholds(pick(self.base), pick(self.strict), col(self.alpha), col(self.beta))

    def _with_rows(self, n: int) -> "RealThresholds":
        """The same thresholds with α and β given per channel for ``n`` channels (for per-channel constants);
        a single row of base thresholds stays one row, shared by every channel (they are C times smaller so)."""
        if n == 1 or self.shape[0] == n:
            return self
        if self.shape[0] != 1:
            raise ValueError(f"cannot broadcast {self.shape[0]} threshold rows to {n} channels")
        return RealThresholds(self.base, self.strict, self.alpha.repeat(n), self.beta.repeat(n))

    def shifted(self, b: Any) -> "RealThresholds":
        """Thresholds for the input before ``Add(b)``: ``R − b`` (``b`` scalar or one value per channel)."""
        col = RationalVector.of(b)
        t = self._with_rows(col.size)
        return RealThresholds(t.base, t.strict, t.alpha, t.beta + t.alpha * col)

    def scaled(self, a: Any) -> "RealThresholds":
        """Thresholds for the input before ``Mul(a)`` with every ``a ≥ 0``: ``R / a``; a zero factor makes each
        threshold constantly passed (if 0 passes it) or never passed."""
        col = RationalVector.of(a)
        signs = col.sign()
        if (signs < 0).any():
            raise ValueError("scaled() needs non-negative factors; use negated() first for negative ones")
        t = self._with_rows(col.size)
        if (signs > 0).all():
            return RealThresholds(t.base, t.strict, t.alpha * col, t.beta)
        t = t._full()
        passed = t._passed_by_zero()
        zero = np.resize(signs == 0, t.shape[0])
        base, strict = t.base.copy(), t.strict.copy()
        base[zero] = np.where(passed[zero], -np.inf, np.inf)
        strict[zero] = False
        alpha = (t.alpha * col.resize(t.shape[0])).where(zero, 1)
        return RealThresholds(base, strict, alpha, t.beta.where(zero, 0))

    def negated(self) -> "RealThresholds":
        """Thresholds on ``−x`` for thresholds on ``x``, as a count from above: ``x ≥ R ⇔ −x ≤ −R``, so the number of
        passed thresholds of ``x`` is ``N − #{−x ≥' −R}`` where ``≥'`` is the opposite strictness. The rows are
        reversed so that they stay increasing; the caller maps the count ``k`` to ``N − k``."""
        return RealThresholds(-self.base[:, ::-1], ~self.strict[:, ::-1], self.alpha, -self.beta)

    def _passed_by(self, value: Fraction) -> np.ndarray:
        """Which thresholds the input ``value`` passes: ``value ≥ R`` (``>`` if strict), i.e. ``base ≤ β + α·value``
        (``<``), decided in float64 and exactly where float64 cannot tell."""
        full = self._full()
        shift = full.beta + full.alpha * value
        shift_f = shift.floats()[:, None]
        diff = full.base - shift_f
        out = np.where(full.strict, diff < 0, diff <= 0)
        unsure = np.isfinite(full.base) & (np.abs(diff) <= _EPS * (np.abs(full.base) + np.abs(shift_f)) + 1e-300)
        for c, m in zip(*np.nonzero(unsure)):
            d = Fraction(float(full.base[c, m])) - shift.fraction(c)
            out[c, m] = d < 0 if full.strict[c, m] else d <= 0
        return out

    def _passed_by_zero(self) -> np.ndarray:
        return self._passed_by(Fraction(0))

    def clip_composed(self, lo: float | None = None, hi: float | None = None) -> "RealThresholds":
        """Thresholds on ``x`` for thresholds on ``clip(x, lo, hi)`` (``Relu`` is ``lo = 0``): a threshold that
        ``lo`` already passes is passed by every ``x`` (−∞), one that ``hi`` does not pass by none (+∞); the others
        are unchanged, because clip is the identity between the bounds."""
        full = self._full()
        base, strict = full.base.copy(), full.strict.copy()
        if hi is not None and np.isfinite(hi):
            never = ~full._passed_by(Fraction(float(hi)))
            base[never], strict[never] = np.inf, False
        if lo is not None and np.isfinite(lo):
            always = full._passed_by(Fraction(float(lo)))
            base[always], strict[always] = -np.inf, False
        return RealThresholds(base, strict, full.alpha, full.beta)

    def relu_composed(self) -> "RealThresholds":
        """Thresholds on ``x`` for thresholds on ``Relu(x)`` (see :meth:`clip_composed`)."""
        return self.clip_composed(0.0, None)

    # -- materialization --------------------------------------------------------------------------------------
    def _floats(self) -> tuple[np.ndarray, np.ndarray]:
        """α and β rounded to float64 (cached)."""
        cached = getattr(self, "_float_ab", None)
        if cached is None:
            cached = (self.alpha.floats(), self.beta.floats())
            self._float_ab = cached
        return cached

    def _approx(self) -> tuple[np.ndarray, np.ndarray, "RealThresholds"]:
        """``(v, err, full)``: the thresholds in float64 and a bound on their error; ``err`` is −∞ where ``v`` is
        exact (:meth:`_exact_rows`), so that no comparison with it asks for the exact computation."""
        full = self._full()
        a, b = full._floats()
        a, b = a[:, None], b[:, None]
        with np.errstate(invalid="ignore", over="ignore"):
            d = full.base - b
            v = d / a
            err = _EPS * (np.abs(full.base) + np.abs(b)) / a + 1e-300
            rows = full._exact_rows()
            if not rows.any():
                return v, err, full
            # exact where α is a power of two and α, β are float64 numbers (power-of-two scales, as in fixed-point
            # quantizers): then only the subtraction can round (TwoSum gives its error) and the division is exact
            # unless it under- or overflows (checked by multiplying back)
            rounding = _two_sum(full.base, -b)[1]
            exact = rows[:, None] & (rounding == 0) & np.isfinite(v) & (v * a == d)
        return v, np.where(exact, -np.inf, err), full

    def _exact_rows(self) -> np.ndarray:
        """Per row: α is a power of two and α, β are exactly their float64 values (cached)."""
        cached = getattr(self, "_exact_ab", None)
        if cached is None:
            a, b = self._floats()
            with np.errstate(invalid="ignore"):
                cached = np.isfinite(a) & np.isfinite(b) & (np.frexp(a)[0] == 0.5)  # float64 α a power of two
            if cached.any():
                cached = cached & self.alpha.equals_floats(a) & self.beta.equals_floats(b)
            self._exact_ab = cached
        return cached

    def _exact(self, full: "RealThresholds", c: int, m: int) -> Fraction:
        return (Fraction(float(full.base[c, m])) - full.beta.fraction(c)) / full.alpha.fraction(c)

    def integer_thresholds(self, lo: float | None = None, hi: float | None = None) -> np.ndarray:
        """float32 thresholds for an integer input: ``⌈R⌉`` (non-strict) or ``⌊R⌋ + 1`` (strict), clipped to
        ``[lo, hi + 1]`` when the input's range is known (a threshold beyond it is never or always passed).

        Exact for accumulators up to 2^31 and beyond: the ceilings come from float64 with a rigorous error bound and
        from Fractions where the bound does not decide. An integer threshold that float32 cannot hold (beyond 2^24,
        not a multiple of its float32 spacing) raises :class:`ThresholdPrecisionError`: rounding it would move the
        threshold for an exact integer accumulator (FINN's hardware), and FINN takes thresholds only as float32
        tensors."""
        v, err, full = self._approx()
        with np.errstate(invalid="ignore"):
            out = np.where(full.strict, np.floor(v) + 1, np.ceil(v))
            unsure = np.isfinite(v) & (np.abs(v - np.round(v)) <= err)
        for c, m in zip(*np.nonzero(unsure)):
            r = self._exact(full, c, m)
            out[c, m] = math.floor(r) + 1 if full.strict[c, m] else math.ceil(r)
        if lo is not None and hi is not None:
            out = np.clip(out, lo, hi + 1)
        with np.errstate(over="ignore", invalid="ignore"):
            held = np.isinf(out) | (out.astype(np.float32).astype(np.float64) == out)
        if not held.all():
            c, m = (int(i) for i in np.argwhere(~held)[0])
            raise ThresholdPrecisionError(
                f"integer threshold {out[c, m]:.0f} (channel {c}, step {m + 1}) is not a float32 number: "
                f"{int((~held).sum())} threshold(s) need more than float32's 24 bits")
        return out.astype(np.float32)

    def float_thresholds(self, dtype: Any = np.float32) -> np.ndarray:
        """Thresholds for a float input of ``dtype`` (float32, or float64 for a float64 execution of what the node
        means): the least ``x`` of that type with ``x ≥ R`` (``x > R`` if strict), so that ``x ≥ T ⇔ x ≥ R`` (``>``)
        for every ``x`` of the type. (Cached: the object does not change.)"""
        ftype = np.dtype(dtype).type
        cache = self.__dict__.setdefault("_float_cache", {})
        if ftype in cache:
            return cache[ftype].copy()
        v, err, full = self._approx()
        with np.errstate(over="ignore", invalid="ignore"):
            f = v.astype(ftype)
            f = np.where(f.astype(np.float64) < v, np.nextafter(f, ftype(np.inf)), f)
            below = np.nextafter(f, ftype(-np.inf))
            f64, b64 = f.astype(np.float64), below.astype(np.float64)
            # f is the least value >= v; decide ≥/> and the rounding of v only where v is within err of f or below
            unsure = np.isfinite(v) & ((np.abs(f64 - v) <= err) | (np.abs(v - b64) <= err))
            out = np.where(full.strict & (f64 == v), np.nextafter(f, ftype(np.inf)), f)
        if ftype is np.float64 and unsure.any():  # float64 estimates cannot place R among float64 numbers
            decided, value = full._float64_decided()
            out = np.where(unsure & decided, value, out)
            unsure &= ~decided
        if unsure.any():
            ratios = full._ratios()
            for c, m in zip(*np.nonzero(unsure)):
                n, d = _ratio_of(full.base[c, m], ratios[c])
                out[c, m] = least_float(n, d, bool(full.strict[c, m]), ftype)
        cache[ftype] = out.astype(ftype)
        return cache[ftype].copy()

    def _float64_decided(self) -> tuple[np.ndarray, np.ndarray]:
        """``(decided, T)``: the least float64 ``T ≥ R`` (``> R`` if strict) wherever double-double arithmetic
        decides it. ``R = (base − β)·(1/α)`` with ``1/α`` and ``β`` per row as unevaluated sums of two float64 numbers
        (:meth:`_double_rows`) is computed as ``rh + rl`` with error-free sums and products, within
        ``ε = 2^-98·(|base| + |β|)·|1/α|`` of the exact value (the rounding errors are below ``2^-101`` of that).
        Where ``rl`` is farther than ``ε`` from 0 (and from the neighbours' gaps), ``R`` is strictly between two
        float64 numbers and ``T`` is the upper one, whatever the strictness; where not (a threshold on or within
        ``ε`` of a float64 number, or values out of the safe range), undecided."""
        ah, al, bh, bl, safe = self._double_rows()
        base = self.base
        with np.errstate(all="ignore"):
            s, e = _two_sum(base, -bh)
            dh, dl = _two_sum(s, e - bl)
            ph, pl = _two_prod(dh, ah)
            rh, rl = _two_sum(ph, pl + (dh * al + dl * ah))
            eps = 2.0 ** -98 * (np.abs(base) + np.abs(bh)) * np.abs(ah)
            up, down = np.nextafter(rh, np.inf), np.nextafter(rh, -np.inf)
            above = (rl - eps > 0) & (rl + eps < up - rh)  # R strictly between rh and the next float64 up
            below = (rl + eps < 0) & (eps - rl < rh - down)  # R strictly between the next float64 down and rh
            fast = safe & (np.abs(base) < 2.0 ** 500) & (np.abs(rh) < 2.0 ** 900) & (np.abs(rh) > 2.0 ** -900)
        return fast & (above | below), np.where(above, up, rh)

    def _double_rows(self) -> tuple[np.ndarray, ...]:
        """Per row, ``1/α ≈ ah + al`` and ``β ≈ bh + bl`` (each part correctly rounded from exact integers, so each
        sum is within ``2^-106`` of its value) as ``[rows, 1]`` arrays, and whether the row is in the safe range."""
        rows = len(self.alpha)
        out = np.zeros((5, rows))
        for i, (p, q, r, t) in enumerate(self._ratios()):
            try:
                ah = q / p
                n, d = ah.as_integer_ratio()
                bh = r / t
                m, e = bh.as_integer_ratio()
                out[:, i] = ah, (q * d - n * p) / (p * d), bh, (r * e - m * t) / (t * e), 1.0
            except (OverflowError, ZeroDivisionError):
                continue
            if not (2.0 ** -500 < abs(ah) < 2.0 ** 500 and abs(bh) < 2.0 ** 500):
                out[4, i] = 0.0
        return (*(x[:, None] for x in out[:4]), out[4][:, None] > 0)

    def count_passed(self, x: np.ndarray) -> np.ndarray:
        """Per element of ``x`` (float64, shape ``[C, M]``: one row per channel), the number of thresholds it
        passes, ``#{k : x ≥ R[c, k]}`` (``>`` where strict), exactly, in ``O(M·log N)`` per row: a binary search in
        the row's sorted float64 estimates counts the thresholds farther below ``x`` than the row's largest error
        bound; only the few within that bound (the candidates) are decided one by one, in float64 where ``x`` is
        farther from ``R`` than the estimate's own bound and by integer arithmetic where it is not. A NaN passes
        none. Every row is searched at once (:func:`custom_ops.multithreshold.search_sorted_rows`)."""
        x = np.asarray(x, np.float64)
        v, err, full = self._approx()
        if v.shape[0] == 1 and x.shape[0] != 1:
            v, err, full = (np.broadcast_to(v, (x.shape[0], v.shape[1])), np.broadcast_to(err, (x.shape[0],
                            v.shape[1])), full.broadcast_channels(x.shape[0]))
        order = np.argsort(v, axis=1, kind="stable")
        sorted_v = np.take_along_axis(v, order, axis=1)
        bound = np.where(np.isfinite(err), err, 0.0).max(axis=1, initial=0.0)[:, None]
        with np.errstate(invalid="ignore"):
            below = search_sorted_rows(sorted_v, x - bound, right=False)  # v < x − bound: R < x, passed
            upto = search_sorted_rows(sorted_v, x + bound, right=True)  # v > x + bound: R > x, not passed
        counts = below.ravel()
        j = np.flatnonzero(upto > below)
        if j.size:
            counts = counts + self._count_candidates(full, x, v, err, order, j, below.ravel()[j],
                                                     (upto - below).ravel()[j])
        counts = counts.reshape(x.shape)
        counts[np.isnan(x)] = 0
        return counts

    def _count_candidates(self, full: "RealThresholds", x: np.ndarray, v: np.ndarray, err: np.ndarray,
                          order: np.ndarray, j: np.ndarray, below: np.ndarray, width: np.ndarray) -> np.ndarray:
        """How many of its candidate thresholds (sorted positions ``below … below + width − 1`` of its row) each
        element ``j`` of ``x`` (flat index) passes: in float64 where it is farther from the estimate than the
        estimate's bound, by integer arithmetic where it is not. Returns the counts of every element, flat."""
        cols = x.shape[1]
        elems = np.repeat(j, width)  # one entry per (element, candidate threshold)
        rows = elems // cols
        start = np.repeat(np.cumsum(width) - width, width)
        ks = order[rows, np.repeat(below, width) + np.arange(elems.size) - start]
        xs, vk, ek, sk = x.ravel()[elems], v[rows, ks], err[rows, ks], full.strict[rows, ks]
        with np.errstate(invalid="ignore"):
            passed = np.where(sk, xs > vk, xs >= vk)
            near = np.isfinite(vk) & np.isfinite(xs) & (np.abs(xs - vk) <= ek)
        if near.any():  # x within the estimate's error of R: decide exactly
            ratios = full._ratios()
            for i in np.flatnonzero(near):
                n, d = _ratio_of(full.base[rows[i], ks[i]], ratios[rows[i]])
                xn, xd = float(xs[i]).as_integer_ratio()
                lhs, rhs = xn * d, n * xd
                passed[i] = lhs > rhs or (lhs == rhs and not sk[i])
        return np.bincount(elems, weights=passed, minlength=x.size).astype(np.int64)

    def _ratios(self) -> list[tuple[int, int, int, int]]:
        """Per row, α = p/q and β = r/t as integers ``(p, q, r, t)`` (cached)."""
        cached = self.__dict__.get("_ratio_rows")
        if cached is None:
            ad, bd = self.alpha.den, self.beta.den
            cached = [(p, ad, r, bd) for p, r in zip(self.alpha.num.tolist(), self.beta.num.tolist())]
            self._ratio_rows = cached
        return cached


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's TwoSum: ``s + e == a + b`` exactly, ``s`` the rounded sum."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's product: ``p + e == a·b`` exactly (no overflow or underflow), ``p`` the rounded product."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's split of float64 ``a`` into two halves of at most 26 significant bits each."""
    c = 134217729.0 * a  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _ratio_of(base: float, ratio: tuple[int, int, int, int]) -> tuple[int, int]:
    """``R = (base − β)/α`` as ``N/D`` with integers, ``D > 0`` (α = p/q, β = r/t): ``(bn·t − r·bd)·q / (bd·t·p)``."""
    p, q, r, t = ratio
    bn, bd = float(base).as_integer_ratio()
    return (bn * t - r * bd) * q, bd * t * p


def least_float(n: int, d: int, strict: bool, ftype: Any = np.float32) -> Any:
    """The least value of the float type ``ftype`` that is ``≥ n/d`` (``> n/d`` if strict; ``d > 0``), found
    exactly: Python's integer division rounds correctly, and each candidate is compared by cross-multiplying."""
    def passes(f: Any) -> bool:
        fn, fd = float(f).as_integer_ratio()
        lhs, rhs = fn * d, n * fd
        return lhs > rhs or (lhs == rhs and not strict)

    if ftype is np.float64:  # Python floats: the same values, without numpy's per-scalar overhead
        try:
            g = n / d
        except OverflowError:
            g = math.inf if n > 0 else -math.inf
        while math.isfinite(g) and not passes(g):
            g = math.nextafter(g, math.inf)
        while math.isfinite(g):
            below = math.nextafter(g, -math.inf)
            if not (math.isfinite(below) and passes(below)):
                break
            g = below
        return np.float64(g)
    try:
        f = ftype(n / d)
    except OverflowError:
        f = ftype(np.inf if n > 0 else -np.inf)
    while np.isfinite(f) and not passes(f):
        f = np.nextafter(f, ftype(np.inf), dtype=ftype)
    while True:
        below = np.nextafter(f, ftype(-np.inf), dtype=ftype)
        if np.isfinite(below) and passes(below):
            f = below
        else:
            return f


def _parse(text: str) -> RealThresholds:
    data = json.loads(text)
    shape = tuple(data["shape"])
    base = np.frombuffer(base64.b64decode(data["base"]), dtype="<f8").astype(np.float64).reshape(shape)
    strict = np.frombuffer(base64.b64decode(data["strict"]), dtype=np.uint8).astype(bool).reshape(shape)
    return RealThresholds(base, strict, _parse_rationals(data["alpha"]), _parse_rationals(data["beta"]))


def _parse_rationals(data: Any) -> RationalVector:
    """α or β as written by :meth:`RealThresholds.to_json`, or as [numerator, denominator] pairs (older files)."""
    if isinstance(data, dict):
        num = np.empty(len(data["num"]), dtype=object)
        num[:] = [int(n) for n in data["num"]]
        return RationalVector(num, int(data["den"]))
    return RationalVector.of([Fraction(n, d) for n, d in data])


def _level_condition(k: int, mode: str) -> tuple[Fraction, bool]:
    """``(t, strict)`` such that ``rounding(v) ≥ k ⇔ v ≥ t`` (or ``v > t`` if strict), for an integer ``k``."""
    half = Fraction(1, 2)
    if mode in ("ROUND", "HALF_EVEN"):
        return k - half, k % 2 != 0
    if mode == "HALF_UP":  # qonnx: sign(v)·floor(|v| + ½), ties away from zero
        return k - half, k - half < 0
    if mode == "HALF_DOWN":  # sign(v)·ceil(|v| − ½), ties towards zero
        return k - half, k - half > 0
    if mode == "CEIL":
        return Fraction(k - 1), True
    if mode == "FLOOR":
        return Fraction(k), False
    if mode in ("ROUND_TO_ZERO", "DOWN"):
        return (Fraction(k), False) if k >= 1 else (Fraction(k - 1), True)
    if mode == "UP":
        return (Fraction(k - 1), True) if k >= 1 else (Fraction(k), False)
    raise ValueError(f"no threshold rule for rounding mode {mode}")


def quant_real_thresholds(scale: np.ndarray, zeropoint: np.ndarray, bitwidth: int, signed: bool, narrow: bool,
                          rounding_mode: str = "ROUND") -> RealThresholds:
    """Real thresholds of ``Quant(x, scale, zeropoint, bitwidth)`` on ``x``: level ``m`` (1..N) of the count is
    ``q ≥ qmin + m``; ``scale`` and ``zeropoint`` are scalars or one value per channel (rows). A 1-bit signed
    quantizer is bipolar: one threshold where ``x/s + z`` reaches 0. The switching points ``s·(t − z)`` are the base
    thresholds where float64 holds them exactly (checked; a float32 scale times a number of at most 18 significant
    bits is), else the thresholds are kept in the affine form ``(t − z)·(1/s)``."""
    scales = np.asarray(scale, dtype=np.float64).ravel()
    zeros = np.asarray(zeropoint, dtype=np.float64).ravel()
    if np.any(scales <= 0):
        raise ValueError("quantizer scales must be positive")
    rows = max(scales.size, zeros.size)
    if bitwidth == 1 and signed:
        levels = [(Fraction(0), False)]
    else:
        mode = canonical_rounding_mode(rounding_mode)
        qmin, qmax = min_int(signed, narrow, bitwidth), max_int(signed, narrow, bitwidth)
        levels = [_level_condition(k, mode) for k in range(qmin + 1, qmax + 1)]
    t = np.array([float(lv[0]) for lv in levels], dtype=np.float64)[None, :]
    strict = np.array([lv[1] for lv in levels], dtype=bool)[None, :]
    s = np.resize(scales, rows)[:, None]
    z = np.resize(zeros, rows)[:, None]
    d = t - z
    base = s * d
    with np.errstate(all="ignore"):  # exact: TwoSum and Dekker's product leave no error, far from under/overflow
        safe = (np.abs(base) >= 2.0 ** -960) | (d == 0)
        safe &= (np.abs(s) < 2.0 ** 990) & (np.abs(d) < 2.0 ** 990)
        exact = bool(safe.all() and not _two_sum(t, -z)[1].any() and not _two_prod(s, d)[1].any())
    if not exact:  # not expected for float32 parameters; fall back to the exact affine form
        return RealThresholds(np.repeat(t, rows, axis=0), np.repeat(strict, rows, axis=0),
                              [Fraction(1) / Fraction(float(x)) for x in s[:, 0]],
                              [Fraction(float(x)) for x in z[:, 0]])
    return RealThresholds(base, np.repeat(strict, rows, axis=0))


#: the key, in a node's in-memory ``meta`` store (never saved), of ``(text, object)``: the object behind the node's
#: metadata text, so that reading back what was just written (or read) costs no parsing. It lives as long as the
#: node, and a structural copy of the node (the verifier's versions) shares it with the text.
_PARSED = "finnlite.real_thresholds"


def get_real_thresholds(node: Any) -> RealThresholds | None:
    """The real thresholds stored on an ``onnx_ir`` MultiThreshold node, or None."""
    text = node.metadata_props.get(META_KEY)
    if not text:
        return None
    hit = node.meta.get(_PARSED)
    if hit is not None and hit[0] is text:
        return hit[1]
    rt = _parse(text)
    node.meta[_PARSED] = (text, rt)
    return rt


def encoded_real_thresholds(node: Any, stored: np.ndarray) -> RealThresholds | None:
    """The real thresholds ``node`` carries, if its ``stored`` thresholds (``[C, N]``) are their float32 form (the
    least float32 ``T ≥ R``, or within two float32 steps of it: a quantizer's conversion is bit-exact with the
    float32 quantizer, which rounds ``x/s``); else None, so that a rewrite that changed the thresholds without their
    metadata is judged by what it stored."""
    rt = get_real_thresholds(node)
    stored = np.asarray(stored)
    if rt is None or stored.ndim != 2 or rt.shape[1] != stored.shape[1] or rt.shape[0] not in (1, stored.shape[0]):
        return None
    try:
        t32 = np.broadcast_to(rt.float_thresholds(np.float32), stored.shape).astype(np.float64)
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    s32 = stored.astype(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        near = np.abs(s32 - t32) <= 2 * np.spacing(np.abs(t32.astype(np.float32))).astype(np.float64)
    return rt if ((s32 == t32) | near).all() else None


def set_real_thresholds(node: Any, rt: RealThresholds | None) -> None:
    """Store (or, with None, remove) the real thresholds on an ``onnx_ir`` node."""
    if rt is None:
        node.metadata_props.pop(META_KEY, None)
        node.meta.pop(_PARSED, None)
    else:
        text = rt.to_json()
        node.metadata_props[META_KEY] = text
        node.meta[_PARSED] = (node.metadata_props[META_KEY], rt)


def relu_composed(rt: RealThresholds) -> RealThresholds:
    """Thresholds on ``x`` for thresholds on ``Relu(x)`` (see :meth:`RealThresholds.relu_composed`)."""
    return rt.relu_composed()


def exact_sums(arr: np.ndarray, axis: int) -> np.ndarray:
    """The exact sums of the float values of ``arr`` along ``axis``, as an object array of Fractions.

    Summing in float64 is exact when, within each sum, every term is a multiple of the smallest term's unit in the
    last place and the total stays below 2**53 of those units: with float32 terms (24-bit significands) that holds
    when the binary exponents of the non-zero terms span at most ``29 - ceil(log2(n))`` for n terms. Those sums are
    taken in float64; any other sum term by term in Fractions."""
    a = np.moveaxis(np.asarray(arr, dtype=np.float64), axis, -1)
    n = a.shape[-1]
    bits = 24 if np.asarray(arr).dtype.itemsize <= 4 else 53
    exps = np.frexp(a)[1].astype(np.int64)
    nonzero = a != 0
    span = (np.max(np.where(nonzero, exps, -4096), axis=-1, initial=-4096)
            - np.min(np.where(nonzero, exps, 4096), axis=-1, initial=4096))
    finite = np.all(np.isfinite(a), axis=-1)
    safe = finite & ((span <= 53 - bits - math.ceil(math.log2(max(n, 1)))) | ~np.any(nonzero, axis=-1))
    out = fractions_of(np.where(safe, a.sum(axis=-1), 0.0))
    for idx in zip(*np.nonzero(~safe)):
        out[idx] = sum((Fraction(float(v)) for v in a[idx]), Fraction(0))
    return out


def fractions_of(arr: Sequence[float] | np.ndarray) -> np.ndarray:
    """An object array of exact Fractions of the float values of ``arr``."""
    a = np.asarray(arr, dtype=np.float64)
    values, where = np.unique(a, return_inverse=True)  # quantized tensors repeat few values: convert each once
    fractions = np.empty(values.size, dtype=object)
    fractions[:] = [Fraction(v) for v in values.tolist()]
    return fractions[where.ravel()].reshape(a.shape)
