"""Exact float32 thresholds of monotone step functions, found by bisection over float32 values.

A quantizer ``f`` (Quant, BipolarQuant, Trunc, possibly after a Relu or Clip) evaluated in float32 is a
non-decreasing step function of its float32 input with finitely many output values ``y_0 < y_1 < ... < y_N`` per
channel. A MultiThreshold reproduces it exactly on *every* float32 input when its thresholds are

    T[c, m] = min { x float32 : f_c(x) >= y_m }          (m = 1 .. N)

because then ``x >= T[c, m]  <=>  f_c(x) >= y_m`` and the count of passed thresholds is the index of ``f_c(x)``. This
module finds those minima by bisection over the float32 values themselves: the floats are mapped to integers that
preserve their order (:func:`float32_to_key`; -0.0 and +0.0 share one key, as ``>=`` cannot tell them apart), so
"the least float with a property" is "the least integer with a property", found in at most 33 halvings. ``f`` is
evaluated by the op kernels of :mod:`custom_ops` themselves, vectorized over (channel, level), so ties, rounding
modes and float32 division are exactly what the executor computes. A real-arithmetic estimate of each threshold,
when given, narrows the initial bracket (it is verified, never trusted).

The results are then *checked* (:func:`check_thresholds`): at every threshold and at the float just below it, the
kernel's output must be the table entry the MultiThreshold's count selects. Together with monotonicity this proves
the MultiThreshold (followed by the table's affine map) equal to ``f`` on all non-NaN float32 inputs.

NaN inputs are outside this contract: a quantizer maps NaN to NaN, a MultiThreshold to its lowest level.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["float32_to_key", "key_to_float32", "KEY_NEG_INF", "KEY_POS_INF", "least_float32_reaching",
           "check_thresholds", "row_index", "StepFunction"]

#: keys of -inf and +inf (every non-NaN float32 has a key in between)
KEY_POS_INF = 0x7F800000
KEY_NEG_INF = -KEY_POS_INF

#: ``f(x) -> y`` on a (channels, k) float32 array, one row per channel
StepFunction = Callable[[np.ndarray], np.ndarray]


def float32_to_key(x: np.ndarray) -> np.ndarray:
    """int64 keys that order float32 values as ``<`` does: non-negative floats map to their bit pattern, negative
    ones to minus the pattern of their magnitude, so -0.0 and +0.0 both map to 0. NaN has no meaningful key."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(bits >= 0, bits, -(bits & 0x7FFFFFFF))


def key_to_float32(key: np.ndarray) -> np.ndarray:
    """The float32 values of ``key`` (inverse of :func:`float32_to_key`; key 0 is +0.0)."""
    key = np.asarray(key, dtype=np.int64)
    bits = np.where(key >= 0, key, (-key) | 0x80000000).astype(np.uint32)
    return bits.view(np.float32)


def row_index(table: np.ndarray, y: np.ndarray) -> np.ndarray:
    """For each row c, the number of entries of the sorted row ``table[c]`` that are <= ``y[c, j]`` (minus one):
    the index of ``y`` in its row when ``y`` is a table entry. Rows are searched at once by offsetting each row's
    keys by a multiple of a span larger than the whole key range."""
    span = np.int64(1) << 33
    rows = np.arange(table.shape[0], dtype=np.int64)[:, None] * span
    flat = (float32_to_key(table) + rows).ravel()
    idx = np.searchsorted(flat, (float32_to_key(y) + rows).ravel(), side="right").reshape(y.shape)
    return idx - 1 - np.arange(table.shape[0])[:, None] * table.shape[1]


def _quiet(f: StepFunction) -> StepFunction:
    """``f`` with numpy's overflow and invalid-value warnings silenced (huge inputs over tiny scales overflow to
    inf, as they do in the kernels)."""

    def g(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return f(x)

    return g


def _bisect(f: StepFunction, target: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Least key in (lo, hi] whose float reaches ``target`` (f(x) >= target, compared by key), assuming the float of
    ``lo`` does not and that of ``hi`` does (``hi`` may be one past +inf, meaning "never")."""
    target_key = float32_to_key(target)
    lo, hi = lo.copy(), hi.copy()
    while True:
        open_ = hi - lo > 1
        if not open_.any():
            return hi
        mid = np.where(open_, lo + (hi - lo) // 2, hi)
        mid = np.clip(mid, KEY_NEG_INF, KEY_POS_INF)
        reached = float32_to_key(f(key_to_float32(mid))) >= target_key
        hi = np.where(open_ & reached, mid, hi)
        lo = np.where(open_ & ~reached, mid, lo)


def least_float32_reaching(f: StepFunction, table: np.ndarray, estimate: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Thresholds ``T[c, m-1] = min {x : f(x)[c] >= table[c, m]}`` for m = 1 .. N (``table`` is (C, N + 1), each row
    strictly increasing; ``f`` maps a (C, k) float32 array to its (C, k) outputs, row c by channel c's function).

    ``estimate`` (C, N), optional: real-arithmetic guesses; a bracket of a few float32 steps around each is tried
    first and kept only where it provably brackets the threshold. Returns ``(thresholds, reachable)``: float32
    thresholds (C, N), and a bool array that is False where even +inf does not reach the level (the threshold is
    then +inf and meaningless)."""
    f = _quiet(f)
    channels, levels = table.shape[0], table.shape[1] - 1
    target = np.ascontiguousarray(table[:, 1:], dtype=np.float32)
    lo = np.full((channels, levels), KEY_NEG_INF - 1, dtype=np.int64)
    hi = np.full((channels, levels), KEY_POS_INF + 1, dtype=np.int64)
    if estimate is not None and levels:
        est = np.asarray(estimate, dtype=np.float64)
        width = np.abs(est) * 2.0 ** -10 + np.finfo(np.float32).tiny
        with np.errstate(over="ignore", invalid="ignore"):
            lo_x = np.nan_to_num((est - width).astype(np.float32), nan=-np.inf)
            hi_x = np.nan_to_num((est + width).astype(np.float32), nan=np.inf)
        lo_k, hi_k = float32_to_key(lo_x), float32_to_key(hi_x)
        target_key = float32_to_key(target)
        below = float32_to_key(f(lo_x)) < target_key
        above = float32_to_key(f(hi_x)) >= target_key
        ok = below & above & (lo_k < hi_k)
        lo = np.where(ok, lo_k, lo)
        hi = np.where(ok, hi_k, hi)
    keys = _bisect(f, target, lo, hi) if levels else hi
    reachable = keys <= KEY_POS_INF
    return key_to_float32(np.minimum(keys, KEY_POS_INF)).reshape(channels, levels), reachable


def check_thresholds(f: StepFunction, table: np.ndarray, thresholds: np.ndarray) -> str | None:
    """None if the MultiThreshold with ``thresholds``, followed by the map count -> ``table[c, count]``, equals ``f``
    on every non-NaN float32 input; otherwise a description of the first failed condition (a sign that the table,
    i.e. the converted chain's arithmetic, and the kernel disagree).

    Conditions checked: ``f(-inf)`` is ``table[c, 0]`` and ``f(+inf)`` is ``table[c, N]``; ``f(-0.0)`` equals
    ``f(+0.0)`` up to the sign of zero (the comparison ``x >= T`` cannot tell them apart); and for every level m,
    ``f(T[c, m-1])`` is a table entry of index >= m while ``f`` at the float just below is one of index < m. As ``f``
    is non-decreasing, every input between two consecutive thresholds then has the level the count gives."""
    f = _quiet(f)
    ends = np.broadcast_to(np.array([-np.inf, -0.0, 0.0, np.inf], dtype=np.float32), (table.shape[0], 4))
    f_ends = f(np.ascontiguousarray(ends))
    idx_ends = row_index(table, f_ends)
    if not np.all(_is_member(table, f_ends, idx_ends)):
        return "f(-inf), f(0) or f(+inf) is not one of the levels"
    if not np.all((idx_ends[:, 0] == 0) & (idx_ends[:, 3] == table.shape[1] - 1)):
        return "f(-inf) is not the lowest level or f(+inf) not the highest"
    if not np.all(float32_to_key(f_ends[:, 1]) == float32_to_key(f_ends[:, 2])):
        return "f(-0.0) differs from f(+0.0)"
    if thresholds.size == 0:
        return None
    levels = np.arange(1, thresholds.shape[1] + 1)[None, :]
    at = f(thresholds)
    below_x = np.nextafter(thresholds, np.float32(-np.inf), dtype=np.float32)
    below = f(below_x)
    idx_at, idx_below = row_index(table, at), row_index(table, below)
    member_at = _is_member(table, at, idx_at)
    member_below = _is_member(table, below, idx_below) | (thresholds == -np.inf)
    bad = ~(member_at & member_below & (idx_at >= levels) & ((idx_below < levels) | (thresholds == -np.inf)))
    if bad.any():
        c, m = np.argwhere(bad)[0]
        return (f"channel {c}, level {m + 1}: f({thresholds[c, m]!r}) = {at[c, m]!r}, "
                f"f({below_x[c, m]!r}) = {below[c, m]!r}, levels {table[c, max(m - 1, 0):m + 2].tolist()}")
    return None


def _is_member(table: np.ndarray, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
    safe = np.clip(idx, 0, table.shape[1] - 1)
    picked = np.take_along_axis(table, safe, axis=1)
    return (idx >= 0) & (float32_to_key(picked) == float32_to_key(y))
