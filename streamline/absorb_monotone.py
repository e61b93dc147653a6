"""Monotone activations in front of a MultiThreshold: Tanh, Sigmoid, LeakyRelu, PRelu, HardSigmoid, Clip.

Brevitas' QuantTanh / QuantSigmoid, and a float LeakyReLU / PReLU / Hardsigmoid followed by a quantizer, export the
float activation ``f`` and then a quantizer (a ReLU6 or a hard tanh exports a Clip), which the convert stage makes a MultiThreshold on ``f(x)``. For a
non-decreasing ``f`` the thresholds move through it: ``f(x) ≥ R ⇔ x ≥ f⁻¹(R)`` where ``f`` is strictly increasing
(strictness kept), and where ``f`` is flat (a saturation, or outside its range) a threshold is passed by every ``x``
(−∞) or by none (+∞). The MultiThreshold then reads ``x`` and absorbs the BatchNorm and scales before it as usual.

Exactness: the piecewise-linear ``f`` (LeakyRelu, PRelu, HardSigmoid) have rational inverses, computed exactly with
Fractions and then rounded to the nearest float64 (the thresholds' base values are float64): exact for power-of-two
slopes (LeakyReLU(0.125), HardSigmoid's 1/6 is not). ``atanh`` and ``logit`` of a rational threshold are irrational,
so no finite representation is exact; they are computed in float64. Either way the threshold is within 2^-52 of the
real one (relative), so only inputs that close to a threshold can be decided differently from real arithmetic — the
float64 execution of the original rounds its own ``f`` at that level too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import clip_bounds, sole_producer
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.absorb import absorb_channel_vector, real_thresholds_of, set_channel_axis, store_thresholds
from streamline.real_thresholds import RealThresholds

_OPS = ("Tanh", "Sigmoid", "LeakyRelu", "PRelu", "HardSigmoid", "Clip")


def _float_attr(node: ir.Node, name: str, default: float) -> Fraction:
    a = node.attributes.get(name)
    return Fraction(float(np.float32(a.value if a is not None else default)))


def _inverse(op: str, params: tuple, r: Fraction, strict: bool) -> tuple[float, bool]:
    """``(t, strict')`` with ``f(x) ≥ r ⇔ x ≥ t`` (``>`` where strict'), ``t`` = ±inf for always / never."""
    if op in ("Tanh", "Sigmoid"):
        lo, hi = (-1, 1) if op == "Tanh" else (0, 1)
        if r <= lo:  # f > lo everywhere: a threshold r ≤ lo is always passed, strict or not
            return -math.inf, False
        if r >= hi:  # f < hi everywhere: never
            return math.inf, False
        v = float(r)
        t = math.atanh(v) if op == "Tanh" else math.log(v / (1.0 - v))
        return t, strict
    if op in ("LeakyRelu", "PRelu"):
        (slope,) = params
        return float(r if r >= 0 else r / slope), strict
    alpha, beta = params  # HardSigmoid: clip(alpha·x + beta, 0, 1)
    if r < 0 or (r == 0 and not strict):
        return -math.inf, False
    if r > 1 or (r == 1 and strict):
        return math.inf, False
    return float((r - beta) / alpha), strict


def _clip_bounds(node: ir.Node) -> tuple[float | None, float | None] | None:
    """``(lo, hi)`` of a Clip as floats (None for an absent bound), or None if a bound is not a constant scalar."""
    bounds = clip_bounds(node)
    return None if bounds is None else tuple(None if b is None else float(b) for b in bounds)  # type: ignore


@dataclass(frozen=True, slots=True, eq=False)
class MonotoneBeforeThresholds:
    """A monotone activation ``act`` read only by MultiThreshold ``node``: a Clip with its ``bounds``, or a function
    with its ``slopes`` (LeakyRelu, PRelu: one, or one per channel along the thresholds' ``axis``)."""

    node: ir.Node
    act: ir.Node
    slopes: np.ndarray | None = None
    axis: int | None = None
    bounds: tuple[float | None, float | None] | None = None


@register_pass(group="absorb")
class AbsorbMonotoneIntoMultiThreshold(Rule):
    """MultiThreshold(f(x)) → MultiThreshold(x) with thresholds f⁻¹(R), f ∈ {Tanh, Sigmoid, LeakyRelu, PRelu,
    HardSigmoid}; MultiThreshold(Clip(x, lo, hi)) → thresholds that lo passes become −∞, those hi does not +∞.

    Algebra: f is non-decreasing, so ``f(x) ≥ R ⇔ x ≥ f⁻¹(R)`` where it is strictly increasing and the threshold
    is constantly passed or not where it is flat (module docstring; precision of f⁻¹ there too). Conditions: the
    activation feeds only the MultiThreshold; LeakyRelu's alpha, PRelu's slope (a constant, scalar or per channel of
    the MultiThreshold's channel axis) and HardSigmoid's alpha are positive; Clip's bounds are constant scalars (a
    Clip is exact: the identity between its bounds)."""

    op_types = ("MultiThreshold",)

    def match(self, model: Any, node: ir.Node) -> Any:
        act = next((p for op in _OPS if (p := sole_producer(node, 0, (op,))) is not None), None)
        if act is None:
            return None
        op, axis, slopes = act.op_type, None, None
        if op == "Clip":
            bounds = _clip_bounds(act)
            if bounds is None:
                return self.miss(node, "the Clip bounds are not constant scalars")
            return MonotoneBeforeThresholds(node, act, bounds=bounds)
        if op == "LeakyRelu":
            slopes = np.array([_float_attr(act, "alpha", 0.01)], dtype=object)
        elif op == "PRelu":
            arr = const_array(act.inputs[1]) if len(act.inputs) > 1 else None
            if arr is None:
                return self.miss(node, "the PRelu slope is not a constant")
            axis, slopes = absorb_channel_vector(model, node, np.asarray([Fraction(float(v)) for v in arr.ravel()],
                                                                         dtype=object).reshape(arr.shape))
            if slopes is None:
                return self.miss(node, "the PRelu slope varies along a non-channel axis")
        elif op == "HardSigmoid" and _float_attr(act, "alpha", 0.2) <= 0:
            return self.miss(node, "HardSigmoid with a non-positive alpha is not increasing")
        if slopes is not None and any(s <= 0 for s in slopes):
            return self.miss(node, f"{op} with a non-positive slope is not increasing")
        return MonotoneBeforeThresholds(node, act, slopes, axis)

    def rewrite(self, model: Any, match: MonotoneBeforeThresholds) -> None:
        node, act, slopes, axis = match.node, match.act, match.slopes, match.axis
        rt = real_thresholds_of(model, node)
        if match.bounds is not None:  # a Clip
            node.replace_input_with(0, act.inputs[0])
            model.remove_node(act)
            store_thresholds(model, node, rt.clip_composed(*match.bounds))
            return
        rows = max(rt.shape[0], 1 if slopes is None else len(slopes))
        real = rt.broadcast_channels(rows).real if rows != rt.shape[0] else rt.real
        strict = rt.broadcast_channels(rows).strict if rows != rt.shape[0] else rt._full().strict
        base = np.empty(real.shape, dtype=np.float64)
        new_strict = np.zeros(real.shape, dtype=bool)
        hs = (_float_attr(act, "alpha", 0.2), _float_attr(act, "beta", 0.5))
        for c, m in np.ndindex(real.shape):
            r = real[c, m]
            if not isinstance(r, Fraction):  # ±inf stays
                base[c, m], new_strict[c, m] = float(r), False
                continue
            params = hs if act.op_type == "HardSigmoid" else (slopes[c if len(slopes) > 1 else 0],) \
                if slopes is not None else ()
            base[c, m], new_strict[c, m] = _inverse(act.op_type, params, r, bool(strict[c, m]))
        if axis is not None and slopes is not None and len(slopes) > 1:
            set_channel_axis(node, axis)
        node.replace_input_with(0, act.inputs[0])
        model.remove_node(act)
        store_thresholds(model, node, RealThresholds(base, new_strict))


MONOTONE_PASSES = [AbsorbMonotoneIntoMultiThreshold]
