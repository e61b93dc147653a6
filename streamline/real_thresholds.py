"""Real-number thresholds: what a MultiThreshold means, kept exactly while the streamliner rewrites around it.

A MultiThreshold made from a quantizer stores float32 thresholds chosen for float32 inputs (bit-exact with the
original's float32 execution). Once scales and biases are absorbed and its input is an exact integer accumulator,
its thresholds must instead follow the *real-number* semantics of the original graph (DESIGN.md): level ``m`` is
reached when ``x ≥ R[c, m]`` (or ``x > R[c, m]`` where the rounding sends the tie down). The float32 threshold
alone cannot tell ``R`` from its float32 neighbour, and a one-ulp difference shows up on real models, so the exact
``R`` (a rational) and the strictness flag travel with the node in its ``metadata_props`` under
``finnlite.real_thresholds``.

Algebra, with every number an exact :class:`fractions.Fraction` (every float is a dyadic rational):

* ``Add(b)`` before the node: ``x + b ≥ R ⇔ x ≥ R − b``;
* ``Mul(a)``, ``a > 0``: ``a·x ≥ R ⇔ x ≥ R / a``;
* ``Mul(a)``, ``a < 0``: ``a·x ≥ R ⇔ x ≤ R / a``, a count from above: the node's output becomes
  ``N − #{x > R/a}``-style, i.e. strictness flips and the caller negates out_scale and shifts out_bias (one sign
  per node; per-channel mixed signs must be moved into the producer instead).

Materializing for an integer input: ``x ≥ R ⇔ x ≥ ⌈R⌉`` and ``x > R ⇔ x ≥ ⌊R⌋ + 1``; for a float32 input: the least
float32 not below ``R`` (strictly above, for strict thresholds).
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from custom_ops.quant import canonical_rounding_mode, max_int, min_int

META_KEY = "finnlite.real_thresholds"


class RealThresholds:
    """Exact thresholds ``R`` (object array of Fractions, shape (C, N)) and ``strict`` (bool array, same shape)."""

    def __init__(self, real: np.ndarray, strict: np.ndarray) -> None:
        self.real = np.asarray(real, dtype=object)
        self.strict = np.asarray(strict, dtype=bool)
        if self.real.ndim != 2 or self.real.shape != self.strict.shape:
            raise ValueError(f"real thresholds {self.real.shape} and strict flags {self.strict.shape} must be "
                             "matching (channels, steps) arrays")

    @property
    def shape(self) -> tuple[int, int]:
        return self.real.shape  # type: ignore[return-value]

    # -- serialization ---------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"shape": list(self.shape),
                           "real": [f"{f.numerator}/{f.denominator}" for f in self.real.ravel()],
                           "strict": [int(s) for s in self.strict.ravel()]})

    @staticmethod
    def from_json(text: str) -> "RealThresholds":
        data = json.loads(text)
        shape = tuple(data["shape"])
        real = np.empty(len(data["real"]), dtype=object)
        for i, s in enumerate(data["real"]):
            real[i] = Fraction(s)
        return RealThresholds(real.reshape(shape), np.array(data["strict"], dtype=bool).reshape(shape))

    # -- algebra ---------------------------------------------------------------------------------------------
    def broadcast_channels(self, channels: int) -> "RealThresholds":
        """The same thresholds with one row per channel (a single row is repeated)."""
        if self.shape[0] == channels:
            return self
        if self.shape[0] != 1:
            raise ValueError(f"cannot broadcast {self.shape[0]} threshold rows to {channels} channels")
        return RealThresholds(np.repeat(self.real, channels, axis=0), np.repeat(self.strict, channels, axis=0))

    def shifted(self, b: np.ndarray) -> "RealThresholds":
        """Thresholds for the input before ``Add(b)``: ``R − b`` (``b`` scalar or one value per channel)."""
        col = _column(b, self.shape[0])
        t = self.broadcast_channels(col.shape[0]) if col.shape[0] > 1 else self
        return RealThresholds(t.real - col, t.strict.copy())

    def scaled(self, a: np.ndarray) -> "RealThresholds":
        """Thresholds for the input before ``Mul(a)`` with every ``a > 0``: ``R / a``."""
        col = _column(a, self.shape[0])
        if any(v <= 0 for v in col.ravel()):
            raise ValueError("scaled() needs positive factors; use negated() first for negative ones")
        t = self.broadcast_channels(col.shape[0]) if col.shape[0] > 1 else self
        return RealThresholds(t.real / col, t.strict.copy())

    def negated(self) -> "RealThresholds":
        """Thresholds on ``−x`` for thresholds on ``x``, as a count from above: ``x ≥ R ⇔ −x ≤ −R``, so the number of
        passed thresholds of ``x`` is ``N − #{−x ≥' −R}`` where ``≥'`` is the opposite strictness. The rows are
        reversed so that they stay increasing; the caller maps the count ``k`` to ``N − k``."""
        return RealThresholds((-self.real)[:, ::-1], (~self.strict)[:, ::-1])

    # -- materialization --------------------------------------------------------------------------------------
    def integer_thresholds(self, lo: float | None = None, hi: float | None = None) -> np.ndarray:
        """float32 thresholds for an integer input: ``⌈R⌉`` (non-strict) or ``⌊R⌋ + 1`` (strict), clipped to
        ``[lo, hi + 1]`` when the input's range is known (a threshold beyond it is never or always passed)."""
        out = np.empty(self.shape, dtype=np.float64)
        flat_r, flat_s, flat_o = self.real.ravel(), self.strict.ravel(), out.ravel()
        for i, (r, s) in enumerate(zip(flat_r, flat_s)):
            flat_o[i] = math.floor(r) + 1 if s else math.ceil(r)
        out = flat_o.reshape(self.shape)
        if lo is not None and hi is not None:
            out = np.clip(out, lo, hi + 1)
        if np.abs(out).max(initial=0) > 2**24:
            raise ValueError("an integer threshold exceeds 2^24 and is not exact in float32")
        return out.astype(np.float32)

    def float_thresholds(self) -> np.ndarray:
        """float32 thresholds for a float32 input: the least float32 ``x`` with ``x ≥ R`` (``x > R`` if strict)."""
        out = np.empty(self.shape, dtype=np.float32)
        flat_o = out.ravel()
        for i, (r, s) in enumerate(zip(self.real.ravel(), self.strict.ravel())):
            f = np.float32(float(r))
            if Fraction(float(f)) < r or (s and Fraction(float(f)) == r):
                f = np.nextafter(f, np.float32(np.inf), dtype=np.float32)
            while True:  # float(r) may have rounded up by more than needed: step down while still valid
                below = np.nextafter(f, np.float32(-np.inf), dtype=np.float32)
                fb = Fraction(float(below)) if np.isfinite(below) else None
                if fb is not None and (fb > r or (fb == r and not s)):
                    f = below
                else:
                    break
            flat_o[i] = f
        return flat_o.reshape(self.shape)


def _column(v: np.ndarray | float, channels: int) -> np.ndarray:
    arr = np.asarray(v).ravel()
    if arr.size not in (1, channels) and channels != 1:
        raise ValueError(f"a constant of {arr.size} values does not match {channels} threshold rows")
    col = np.empty((arr.size, 1), dtype=object)
    for i, x in enumerate(arr):
        col[i, 0] = Fraction(float(x))
    return col


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
    quantizer is bipolar: one threshold where ``x/s + z`` reaches 0."""
    scales = np.asarray(scale, dtype=np.float64).ravel()
    zeros = np.asarray(zeropoint, dtype=np.float64).ravel()
    rows = max(scales.size, zeros.size)
    if bitwidth == 1 and signed:
        levels = [(Fraction(0), False)]
    else:
        mode = canonical_rounding_mode(rounding_mode)
        qmin, qmax = min_int(signed, narrow, bitwidth), max_int(signed, narrow, bitwidth)
        levels = [_level_condition(k, mode) for k in range(qmin + 1, qmax + 1)]
    real = np.empty((rows, len(levels)), dtype=object)
    strict = np.zeros((rows, len(levels)), dtype=bool)
    for c in range(rows):
        s = Fraction(float(scales[c % scales.size]))
        z = Fraction(float(zeros[c % zeros.size]))
        if s <= 0:
            raise ValueError("quantizer scales must be positive")
        for m, (t, st) in enumerate(levels):
            real[c, m] = s * (t - z)
            strict[c, m] = st
    return RealThresholds(real, strict)


def get_real_thresholds(node: Any) -> RealThresholds | None:
    """The real thresholds stored on an ``onnx_ir`` MultiThreshold node, or None."""
    text = node.metadata_props.get(META_KEY)
    return RealThresholds.from_json(text) if text else None


def set_real_thresholds(node: Any, rt: RealThresholds | None) -> None:
    """Store (or, with None, remove) the real thresholds on an ``onnx_ir`` node."""
    if rt is None:
        node.metadata_props.pop(META_KEY, None)
    else:
        node.metadata_props[META_KEY] = rt.to_json()


def relu_composed(rt: RealThresholds) -> RealThresholds:
    """Thresholds on ``x`` for thresholds on ``Relu(x)``: a threshold at or below zero that ``Relu(x) = 0`` already
    passes (``0 ≥ R``, or ``0 > R`` if strict) is passed by every ``x``; it becomes −∞-like, represented by a very
    low rational; any other threshold is unchanged because ``Relu(x) = x`` above zero."""
    real = rt.real.copy()
    strict = rt.strict.copy()
    for idx in np.ndindex(real.shape):
        r, s = real[idx], strict[idx]
        if r < 0 or (r == 0 and not s):
            real[idx] = Fraction(-(2**64))
            strict[idx] = False
    return RealThresholds(real, strict)


def fractions_of(arr: Sequence[float] | np.ndarray) -> np.ndarray:
    """An object array of exact Fractions of the float values of ``arr``."""
    a = np.asarray(arr, dtype=np.float64)
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = Fraction(float(a[idx]))
    return out
