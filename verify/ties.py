"""Float32 near-ties: telling a quantizer that rounded one step differently at a tie from a broken rewrite.

A quantizer (Quant, BipolarQuant, MultiThreshold) decides each output level by comparing its input with decision
boundaries: ``x/s + z`` against half-integers for a rounding Quant, ``x`` against the thresholds for a
MultiThreshold, ``x`` against 0 for a bipolar one. When the input lies within float32 rounding of a boundary, two
correct computations of the same real-number value can land on different sides. Such an element is a *near-tie*:

* the two results differ by exactly one quantization step, and
* float64 execution of *both* sides agrees on the level there: the version before the rewrite and the version after
  it, each run as what it means in real arithmetic (:mod:`verify.real64`: exact constants and real thresholds in
  float64, not their float32 roundings), and the original model where it has the tensor. Then both versions compute
  the same real number, and only float32 rounding put it on two sides of a boundary.

A margin (the input's distance to the nearest boundary) never decides: an accumulator one step from an integer
threshold is what a threshold off by one produces, and a float32 input a hair from a float32 threshold is what a
threshold one float32 step off produces. Margins only describe the accepted near-ties. Without float64 evidence a
one-step difference is a real one.

:func:`margin_at` measures the distance to the nearest boundary; :func:`split_near_ties` sorts the differing
elements of a comparison into near-ties and real differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from custom_ops.multithreshold import channel_axis_of
from finnlite.core.shapes import const_array

__all__ = ["NearTie", "Margin", "margin_at", "split_near_ties", "is_bipolar", "QUANTIZER_OPS",
           "DEFAULT_NEAR_TIE_RTOL"]

#: nodes whose output levels are decided by comparisons with boundaries
QUANTIZER_OPS = ("Quant", "IntQuant", "BipolarQuant", "MultiThreshold")
#: the relative distance to a boundary below which a margin counts as near (:meth:`Margin.is_near`); it describes
#: a near-tie but does not decide one (float64 evidence does: :func:`split_near_ties`, which takes the
#: configuration's ``near_tie_rtol`` as ``rtol`` and does not use it)
DEFAULT_NEAR_TIE_RTOL = 1e-4
#: more one-step differences than this in one tensor of one sample are not accepted as near-ties (they are rare)
MAX_NEAR_TIES = 256


@dataclass(frozen=True)
class Margin:
    """Where an input element stands relative to the quantizer's nearest decision boundary.

    ``value`` is the compared quantity (``x/s + z`` for a Quant, ``x`` otherwise), ``boundary`` the nearest
    boundary, ``relative`` their distance relative to the magnitude involved, ``exact`` True when both are
    integers (so float rounding cannot have moved the decision)."""

    value: float
    boundary: float
    relative: float
    exact: bool

    def is_near(self, rtol: float) -> bool:
        """True if a float rounding error of relative size ``rtol`` could have flipped the decision."""
        return not self.exact and self.relative <= rtol


@dataclass(frozen=True)
class NearTie:
    """One element accepted as a float32 near-tie: tensor, sample, index, the two values, the quantizer node and
    its margin (for the description; None when it cannot be measured), and the evidence that decided."""

    tensor: str
    sample: int
    index: tuple[int, ...]
    expected: float
    actual: float
    node: str
    margin: Margin | None
    evidence: str

    def describe(self) -> str:
        where = f"tensor '{self.tensor}' {self.index} (sample {self.sample}, node '{self.node}')"
        text = (f"{where}: {self.expected:.9g} -> {self.actual:.9g}, the level of float64 execution of both sides"
                if self.evidence == "float64" else f"{where}: {self.expected:.9g} -> {self.actual:.9g}")
        m = self.margin
        if m is not None:
            text += f"; input {m.value:.9g} vs boundary {m.boundary:.9g} (relative margin {m.relative:.2e})"
        return text


def is_bipolar(q: Any) -> bool:
    """True for a BipolarQuant, and for a Quant of constant bit width 1 that is signed: qonnx executes it as bipolar
    (levels -1 and +1, boundary 0; :func:`custom_ops.quant.quant_integers`)."""
    if q.op_type == "BipolarQuant":
        return True
    if q.op_type != "Quant" or len(q.inputs) < 4 or q.inputs[3] is None:
        return False
    bits, signed = const_array(q.inputs[3]), q.attributes.get("signed")
    return (bits is not None and np.size(bits) == 1 and float(np.asarray(bits).reshape(-1)[0]) == 1.0
            and (signed is None or bool(signed.value)))


def _integral(v: float) -> bool:
    return bool(np.isfinite(v) and v == np.round(v) and abs(v) < 2**53)


def _relative(value: float, boundary: float, floor: float = 0.0) -> float:
    scale = max(abs(value), abs(boundary), floor)
    return abs(value - boundary) / scale if scale > 0 else 0.0


def margin_at(node: Any, values: Callable[[str], np.ndarray | None], index: tuple[int, ...]) -> Margin | None:
    """The margin of quantizer ``node`` (an ``onnx_ir.Node``) at output element ``index``; ``values(name)`` returns
    a tensor's value (or None). None for other nodes or when an input is unknown."""
    op = node.op_type
    if op not in QUANTIZER_OPS or not node.inputs or node.inputs[0] is None:
        return None
    ins = [values(v.name) if v is not None else None for v in node.inputs]
    x = ins[0]
    if x is None or any(i is None for i in ins[1:2]):
        return None
    x = np.asarray(x)
    try:
        xv = float(x[index])
    except (IndexError, ValueError):
        return None
    if op == "MultiThreshold":
        layout = node.attributes.get("data_layout")
        axis = channel_axis_of(layout.value if layout is not None else "", x.ndim)
        thresholds = np.asarray(ins[1])
        if thresholds.ndim != 2:
            return None
        row = np.asarray(thresholds[0] if thresholds.shape[0] == 1 else thresholds[index[axis]], np.float64)
        if row.size == 0:
            return None
        k = int(np.argmin(np.abs(row - xv)))
        b = float(row[k])
        return Margin(xv, b, _relative(xv, b), _integral(xv) and _integral(b))
    if op == "BipolarQuant":
        scale = float(np.max(np.abs(x))) if x.size else 0.0  # a bipolar boundary is 0: relative to the tensor
        return Margin(xv, 0.0, _relative(xv, 0.0, scale), _integral(xv))
    # Quant / IntQuant: u = x / s + z (in x's own float type, as the quantizer computes it) against half-integers
    # (integers for FLOOR/CEIL-like modes, 0 for a bipolar one)
    if len(ins) < 4 or ins[2] is None or ins[3] is None:
        return None
    ftype = x.dtype.type if x.dtype.kind == "f" else np.float64
    s = ftype(np.broadcast_to(np.asarray(ins[1]), x.shape)[index])
    z = ftype(np.broadcast_to(np.asarray(ins[2]), x.shape)[index])
    bits = float(np.asarray(ins[3]).reshape(-1)[0])
    signed = node.attributes.get("signed")
    with np.errstate(divide="ignore", invalid="ignore"):
        u = float(ftype(x[index]) / s + z)
    if not (np.isfinite(u) and np.isfinite(float(s)) and float(s) != 0 and np.isfinite(xv)):
        return None
    mode_attr = node.attributes.get("rounding_mode")
    mode = str(mode_attr.value).upper() if mode_attr is not None else "ROUND"
    bipolar = bits == 1 and (signed is None or int(signed.value))
    if bipolar:
        b = 0.0
    elif mode in ("ROUND", "HALF_EVEN", "HALF_UP", "HALF_DOWN"):
        b = float(np.floor(u)) + 0.5
    else:
        b = float(np.round(u))
    # the real-number quotient: if computing u rounded nothing, the decision is exact (an exact tie is not a
    # near-tie); otherwise the margin is the real value's distance to the boundary
    real = Fraction(xv) / Fraction(float(s)) + Fraction(float(z))
    exact = real == Fraction(u)
    # a bipolar boundary is 0: relative to the tensor's magnitude (as for BipolarQuant), not to 1
    floor = float(np.max(np.abs(x.astype(np.float64) / float(s)))) if bipolar else 1.0
    return Margin(u, b, float(abs(real - Fraction(b))) / max(abs(float(real)), floor), exact)


def _per_element(step: np.ndarray | float | None, shape: tuple[int, ...], indices: np.ndarray
                 ) -> np.ndarray | None:
    """The magnitude of ``step`` (scalar or broadcasting to ``shape``) at the flat ``indices``; None if it is
    unknown or does not broadcast."""
    if step is None:
        return None
    try:
        return np.broadcast_to(np.abs(np.asarray(step, np.float64)), shape).reshape(-1)[indices]
    except ValueError:
        return None


def split_near_ties(diff_indices: np.ndarray, shape: tuple[int, ...], actual: np.ndarray, expected: np.ndarray, *,
                    tensor: str, sample: int, step: np.ndarray | float | None,
                    quantizers: list[tuple[Any, Callable[[str], np.ndarray | None]]], rtol: float,
                    float64: Callable[[], np.ndarray | None] | None = None,
                    grid_step: np.ndarray | float | None = None,
                    sides64: Callable[[], tuple[np.ndarray | None, np.ndarray | None]] | None = None
                    ) -> tuple[list[NearTie], np.ndarray]:
    """Sort the differing elements (flat ``diff_indices``) of one tensor into near-ties and real differences.

    An element is a near-tie only if it differs by one quantization ``step`` and float64 execution of both sides
    of the comparison gives it the same level, one of the two compared: ``sides64()`` returns the float64 values of
    the tensor in the version before the rewrite and in the version after it (each run as what it means in real
    arithmetic, :mod:`verify.real64`), and ``float64()``, where the original model has the tensor, its float64
    execution of the original, which must agree too. Then the two versions compute the same real-number value and
    the difference is float32 rounding at a decision boundary; without that evidence (no ``sides64``, a run that
    fails, a level the float64 runs do not share) the difference is real. A margin measured in float32 never
    decides: an input a hair from a boundary is what a threshold off by one also produces.

    ``quantizers`` lists (node, value lookup) pairs for the quantizer producing the tensor in each model version
    (after and before the rewrite): their margins describe each accepted near-tie (``rtol`` is not used: see
    :data:`DEFAULT_NEAR_TIE_RTOL`). ``grid_step``: the step of the
    levels of ``expected`` (the quantizer producing the tensor before the rewrite), if known: when one difference
    is not a whole number of these steps, no level of the original is the same there, so it is no near-tie, and
    every difference is returned as real without running anything. Only quantized tensors (``step`` known) can have
    near-ties. Returns the near-ties and the flat indices of the real differences."""
    if diff_indices.size == 0:
        return [], diff_indices
    a = np.asarray(actual).reshape(-1)[diff_indices].astype(np.float64)  # the differences only, not the tensor
    e = np.asarray(expected).reshape(-1)[diff_indices].astype(np.float64)
    if step is None:
        return [], diff_indices  # not a quantized tensor: no level to have rounded differently
    st = _per_element(step, shape, diff_indices)
    if st is None:
        return [], diff_indices
    g = _per_element(grid_step, shape, diff_indices)
    if g is not None:
        # a near-tie gives a level of the original's quantizer, e + k·grid_step: an element whose difference is not
        # a whole number of those steps is no near-tie, and then the tensor differs (found before anything runs: a
        # changed encoding, such as the XNOR rewrite's {-1, 1} -> {0, 1}, differs by one step in every element)
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.where(g > 0, (a - e) / g, 0.0)
        if ((g > 0) & ~(np.abs(k - np.rint(k)) <= 1e-3)).any():
            return [], diff_indices
    one_step = (st > 0) & (np.abs(np.abs(a - e) - st) <= 1e-5 * st)
    if not one_step.all():
        return [], diff_indices[~one_step]  # the tensor differs: the one-step elements need no judging
    if one_step.sum() > MAX_NEAR_TIES or sides64 is None:
        return [], diff_indices
    agree = _float64_agree(diff_indices, shape, a, e, st, sides64, float64)
    if not agree.all():
        return [], diff_indices[~agree]
    ties: list[NearTie] = []
    for k in range(diff_indices.size):
        index = tuple(int(i) for i in np.unravel_index(int(diff_indices[k]), shape)) if shape else ()
        margin, node = None, ""
        for q, lookup in quantizers:
            m = margin_at(q, lookup, index)
            if m is not None and (margin is None or m.relative < margin.relative):
                margin, node = m, q.name or q.op_type
        ties.append(NearTie(tensor, sample, index, float(e[k]), float(a[k]), node, margin, "float64"))
    return ties, diff_indices[:0]


def _float64_agree(diff_indices: np.ndarray, shape: tuple[int, ...], a: np.ndarray, e: np.ndarray, st: np.ndarray,
                   sides64: Callable[[], tuple[np.ndarray | None, np.ndarray | None]],
                   float64: Callable[[], np.ndarray | None] | None) -> np.ndarray:
    """Per differing element: True where float64 execution of the version before, of the version after and (where
    it has the tensor) of the original give the same level, which is ``a`` or ``e`` (within a thousandth of a
    step)."""
    none = np.zeros(diff_indices.shape, bool)
    before, after = sides64()
    if before is None or after is None or np.shape(before) != tuple(shape) or np.shape(after) != tuple(shape):
        return none
    b64 = np.asarray(before, np.float64).reshape(-1)[diff_indices]
    a64 = np.asarray(after, np.float64).reshape(-1)[diff_indices]
    tol = 1e-3 * st
    agree = (np.abs(b64 - a64) <= tol) & ((np.abs(a64 - a) <= tol) | (np.abs(a64 - e) <= tol))
    if agree.any() and float64 is not None:
        ref = float64()
        if ref is not None:
            if np.shape(ref) != tuple(shape):
                return none
            agree &= np.abs(np.asarray(ref, np.float64).reshape(-1)[diff_indices] - a64) <= tol
    return agree


def near_elements(node: Any, values: Callable[[str], np.ndarray | None], rtol: float, limit: int = 4
                  ) -> list[tuple[tuple[int, ...], Margin]]:
    """Up to ``limit`` output elements of quantizer ``node`` whose input lies within relative ``rtol`` of a
    decision boundary (in a comparison that is not between integers), nearest first (vectorized over the whole
    tensor; MultiThreshold, Quant/IntQuant with a rounding mode and BipolarQuant)."""
    if node.op_type not in QUANTIZER_OPS or not node.inputs or node.inputs[0] is None:
        return []
    x = values(node.inputs[0].name)
    if x is None or np.asarray(x).size == 0:
        return []
    x = np.asarray(x, dtype=np.float64)
    if node.op_type == "MultiThreshold":
        t = values(node.inputs[1].name) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if t is None or np.ndim(t) != 2 or np.shape(t)[1] == 0:
            return []
        layout = node.attributes.get("data_layout")
        axis = channel_axis_of(layout.value if layout is not None else "", x.ndim)
        xc = np.moveaxis(x, axis, -1)[..., None]
        t = np.asarray(t, np.float64)
        dist = np.abs(xc - (t if t.shape[0] == xc.shape[-2] else t[:1]))
        k = np.argmin(dist, axis=-1)
        bound = np.take_along_axis(np.broadcast_to(t if t.shape[0] == xc.shape[-2] else t[:1], dist.shape),
                                   k[..., None], axis=-1)[..., 0]
        bound = np.moveaxis(bound, -1, axis)
        scale = np.maximum(np.abs(x), np.abs(bound))
        integral = (x == np.round(x)) & (bound == np.round(bound))
    elif node.op_type == "BipolarQuant":
        bound = np.zeros_like(x)
        scale = np.full_like(x, float(np.max(np.abs(x))))
        integral = x == np.round(x)
    else:
        return [(index, m) for index, m in _quant_candidates(node, values, x, rtol, limit)]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, np.abs(x - bound) / scale, 0.0)
    rel = np.where(integral, np.inf, rel)
    flat = np.flatnonzero(rel.reshape(-1) <= rtol)
    flat = flat[np.argsort(rel.reshape(-1)[flat])][:limit]
    out = []
    for f in flat.tolist():
        index = tuple(int(i) for i in np.unravel_index(f, x.shape))
        out.append((index, Margin(float(x[index]), float(bound[index]), float(rel[index]), False)))
    return out


def _quant_candidates(node: Any, values: Callable[[str], np.ndarray | None], x: np.ndarray, rtol: float,
                      limit: int) -> list[tuple[tuple[int, ...], Margin]]:
    if len(node.inputs) < 4 or any(v is None for v in node.inputs[1:4]):
        return []
    s, z = values(node.inputs[1].name), values(node.inputs[2].name)
    if s is None or z is None:
        return []
    with np.errstate(divide="ignore", invalid="ignore"):
        u = x / np.asarray(s, np.float64) + np.asarray(z, np.float64)
        rel = np.abs(u - (np.floor(u) + 0.5)) / np.maximum(np.abs(u), 1.0)
    flat = np.flatnonzero(np.nan_to_num(rel, nan=np.inf).reshape(-1) <= rtol)
    flat = flat[np.argsort(rel.reshape(-1)[flat])][:limit]
    out = []
    for f in flat.tolist():
        index = tuple(int(i) for i in np.unravel_index(f, np.shape(u)))
        m = margin_at(node, values, index)
        if m is not None and m.is_near(rtol):
            out.append((index, m))
    return out
