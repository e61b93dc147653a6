"""Integer multipliers for a join read only through thresholds, found by search and proven by enumeration.

A join ``x = s1·a + s2·b`` of two integer tensors ``a ∈ [a_lo, a_hi]``, ``b ∈ [b_lo, b_hi]`` whose float scales
have no small integer ratio is read by thresholds only (``x ≥ R``, or ``x > R``; :mod:`streamline.real_thresholds`).
Each threshold splits the finite box of ``(a, b)`` into the points that pass it and those that do not. Integers
``(p, q)`` *reproduce* the thresholds when, for every threshold, one integer ``T'`` splits the box the same way:
``p·a + q·b ≥ T' ⇔ s1·a + s2·b ≥ R`` on every point of the box. The exact ratio ``q/p = s2/s1`` always does
(floats are dyadic rationals), but its integers are large when the scales are unrelated; a far smaller pair
usually does too, because the box is finite.

The proof is an enumeration, per threshold and per value of the smaller-range input (``u``, the other is ``v``;
signs normalized so that both scales are positive): the points that pass are ``v ≥ L(u)`` with ``L`` the least
integer above the real boundary ``(R − s_u·u)/s_v``, computed exactly (float64 with an error bound, Fractions where
the bound does not decide). A candidate ``(p, q)`` with ``p, q > 0`` reproduces the threshold iff the largest
``p·u + q·v`` of the failing points, ``max_u p·u + q·(L(u) − 1)``, is below the least of the passing ones,
``min_u p·u + q·L(u)``; that least value is ``T'``. Cost: O(thresholds · range(u)) per candidate.

The pairs that reproduce every threshold form an open interval of slopes ``q/p`` around ``s_v/s_u`` (each is a
strict linear separation of two finite point sets), so the simplest fraction in it — the smallest ``p`` and ``q``
at once — is found by descending the Stern–Brocot tree towards ``s_v/s_u``: a candidate that fails lies on the side
of the interval it lies of ``s_v/s_u``. Runs in one direction are searched by doubling and bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from finnlite.core.datatypes import smallest_int_type
from streamline.real_thresholds import RealThresholds

_EPS = 2.0 ** -50  # a generous bound on the relative error of a few float64 operations
#: the most boundary entries (thresholds × values of the enumerated input) the search will hold
MAX_ENTRIES = 1 << 25


@dataclass(frozen=True)
class JoinMultipliers:
    """``p·a + q·b ≥ T'`` reproduces ``s1·a + s2·b ≥ R`` on the box, for every consumer's thresholds.
    ``thresholds[k]`` holds consumer k's ``T'`` (float64 integers; −∞ passed by the whole box, +∞ by none)."""

    p: int
    q: int
    thresholds: list[np.ndarray]
    a_range: tuple[int, int]
    b_range: tuple[int, int]

    @property
    def output_range(self) -> tuple[int, int]:
        """The range of ``p·a + q·b`` over the box."""
        pa = sorted((self.p * self.a_range[0], self.p * self.a_range[1]))
        qb = sorted((self.q * self.b_range[0], self.q * self.b_range[1]))
        return pa[0] + qb[0], pa[1] + qb[1]

    def describe(self) -> str:
        """``p·a + q·b`` with the bit widths: each multiplier's (signed) and the sum's datatype."""
        lo, hi = self.output_range
        return (f"{self.p}·a + {self.q}·b (multipliers {signed_bits(self.p)} and {signed_bits(self.q)} bits, "
                f"sum {smallest_int_type(lo, hi).name})")


def signed_bits(k: int) -> int:
    """Bits of ``k`` as a two's complement integer."""
    return (k if k >= 0 else -k - 1).bit_length() + 1


def _boundaries(rows: Sequence[tuple[Fraction | float, bool]], su: Fraction, sv: Fraction, u: np.ndarray,
                v_lo: int, v_hi: int) -> np.ndarray:
    """``L[k, i]``: the least integer ``v`` with ``su·u[i] + sv·v ≥ R_k`` (``>`` if strict), clipped to
    ``[v_lo, v_hi + 1]`` (``v_hi + 1``: no ``v`` of the range passes). ``su, sv > 0``."""
    rf = np.array([float(r) for r, _ in rows], dtype=np.float64)[:, None]
    strict = np.array([s for _, s in rows], dtype=bool)[:, None]
    suf, svf = float(su), float(sv)
    uf = u.astype(np.float64)[None, :]
    finite = np.isfinite(rf)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.where(finite, (np.where(finite, rf, 0.0) - suf * uf) / svf, 0.0)
        err = _EPS * (np.abs(np.where(finite, rf, 0.0)) + np.abs(suf * uf)) / svf + 1e-300
    v = np.clip(v, v_lo - 2.0, v_hi + 2.0)
    out = np.where(strict, np.floor(v) + 1, np.ceil(v))
    unsure = finite & (np.abs(v - np.round(v)) <= err) & (v > v_lo - 2.0) & (v < v_hi + 2.0)
    for k, i in zip(*np.nonzero(unsure)):
        r, s = rows[k]
        exact = (Fraction(r) - su * int(u[i])) / sv
        out[k, i] = math.floor(exact) + 1 if s else math.ceil(exact)
    out = np.where(finite, out, np.where(rf < 0, v_lo, v_hi + 1))
    return np.clip(out, v_lo, v_hi + 1).astype(np.int64)


def _split(boundary: np.ndarray, u: np.ndarray, v_lo: int, v_hi: int, p: int, q: int) -> np.ndarray | None:
    """``T'`` per threshold row if ``p·u + q·v ≥ T'`` reproduces every row of ``boundary`` (module docstring),
    else None. ``p, q > 0``."""
    big = np.iinfo(np.int64).max
    base = p * u[None, :]
    passing = boundary <= v_hi
    failing = boundary > v_lo
    least_in = np.where(passing, base + q * boundary, big).min(axis=1)
    most_out = np.where(failing, base + q * (boundary - 1), -big).max(axis=1)
    if not np.all(most_out < least_in):
        return None
    t = least_in.astype(np.float64)
    t[~passing.any(axis=1)] = np.inf
    t[~failing.any(axis=1)] = -np.inf
    return t


def _simplest(valid, r: Fraction, limit: int) -> tuple[int, int] | None:
    """The simplest fraction ``q/p`` (numerator and denominator at most ``limit``) for which ``valid(q, p)`` holds,
    where the valid slopes form an interval containing ``r > 0`` (Stern–Brocot descent, module docstring)."""

    seen: dict[tuple[int, int], str] = {}

    def side(q: int, p: int) -> str:
        if (q, p) not in seen:
            seen[(q, p)] = ("big" if max(q, p) > limit else "in" if valid(q, p)
                            else "left" if Fraction(q, p) < r else "right")
        return seen[(q, p)]

    def run(start: tuple[int, int], step: tuple[int, int], away: str) -> tuple[int, str]:
        """The largest k with start + j·step on side ``away`` for j = 1..k, and the side of start + (k+1)·step."""
        node = lambda k: (start[0] + k * step[0], start[1] + k * step[1])  # noqa: E731
        first = side(*node(1))
        if first != away:
            return 0, first
        lo, hi = 1, 2
        while True:  # double until the side changes (or the numbers grow too big)
            s = side(*node(hi))
            if s != away:
                break
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # node(lo) is on ``away``, node(hi) is not
            mid = (lo + hi) // 2
            if side(*node(mid)) == away:
                lo = mid
            else:
                hi = mid
        return lo, side(*node(lo + 1))

    left, right = (0, 1), (1, 0)
    while True:
        k, nxt = run(left, right, "left")
        left = (left[0] + k * right[0], left[1] + k * right[1])
        mediant = (left[0] + right[0], left[1] + right[1])
        if nxt in ("in", "big"):
            return mediant if nxt == "in" else None
        j, nxt = run(right, left, "right")
        right = (right[0] + j * left[0], right[1] + j * left[1])
        mediant = (left[0] + right[0], left[1] + right[1])
        if nxt in ("in", "big"):
            return mediant if nxt == "in" else None


def find_multipliers(consumers: Sequence[RealThresholds], s1: Fraction, s2: Fraction, a_range: tuple[int, int],
                     b_range: tuple[int, int], limit: int) -> JoinMultipliers | str:
    """The smallest integers ``(p, q)``, ``|p|, |q| ≤ limit``, with ``p·a + q·b ≥ T'`` equivalent to
    ``s1·a + s2·b ≥ R`` on the box for every threshold of every consumer; or why there are none."""
    if s1 == 0 or s2 == 0:
        return "a branch's scale is zero"
    swap = (a_range[1] - a_range[0]) > (b_range[1] - b_range[0])
    (su, u_rng), (sv, v_rng) = ((s2, b_range), (s1, a_range)) if swap else ((s1, a_range), (s2, b_range))
    # normalize signs: u' = sign(su)·u, v' = sign(sv)·v, so that both scales are positive
    flip = lambda rng, s: rng if s > 0 else (-rng[1], -rng[0])  # noqa: E731
    (u_lo, u_hi), (v_lo, v_hi) = flip(u_rng, su), flip(v_rng, sv)
    u = np.arange(u_lo, u_hi + 1, dtype=np.int64)
    rows: list[tuple[Fraction | float, bool]] = []
    shapes = []
    for rt in consumers:
        real = rt.real
        strict = np.broadcast_to(rt.strict, real.shape)  # one row of flags may serve per-channel α, β
        shapes.append(real.shape)
        rows.extend((real[idx], bool(strict[idx])) for idx in np.ndindex(real.shape))
    if len(rows) * u.size > MAX_ENTRIES:
        return (f"the box is too large to enumerate ({len(rows)} thresholds × {u.size} values of the smaller "
                f"input > {MAX_ENTRIES})")
    boundary = _boundaries(rows, abs(su), abs(sv), u, v_lo, v_hi)
    found = _simplest(lambda q, p: _split(boundary, u, v_lo, v_hi, p, q) is not None, abs(sv) / abs(su), limit)
    if found is None:
        return (f"no integer multipliers up to {limit} reproduce the thresholds (scale ratio "
                f"{float(s2 / s1):.9g}, a in {list(a_range)}, b in {list(b_range)})")
    qn, pn = found
    t = _split(boundary, u, v_lo, v_hi, pn, qn)
    mu, mv = (pn if su > 0 else -pn), (qn if sv > 0 else -qn)
    p, q = (mv, mu) if swap else (mu, mv)
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(t[at:at + n].reshape(shape))
        at += n
    return JoinMultipliers(p, q, out, tuple(a_range), tuple(b_range))
