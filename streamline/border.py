"""The border of a zero-padded first Conv that reads a shifted integer input, made integer and exact.

With input preprocessing (:mod:`streamline.preprocess`) the first Conv reads ``s·x + b`` for the integer input
``x`` (UINT8 pixels), ``s > 0`` the input scale and ``b`` minus the per-channel mean. Zero padding of ``s·x + b`` is
padding of ``x`` with the value ``p = −b/s`` per channel, which is not an integer (``255·0.485``), and FINN's
padding layers (``FMPadding``, ``ConvolutionInputGenerator``) pad with zero only. So
``Conv(pad₀(s·x + b)) = s·(Conv(pad₀(x)) + D)`` with ``D[o, h, w] = Σ_{c, taps inside} W[o, c, k]·b_c/s``: a bias
that is the same at every interior position and differs along the border, one value per *border pattern* (which
taps fall inside the image: 9 for a 3×3 kernel with padding 1, 4 with stride 2). A per-position bias cannot become
per-channel thresholds, and it is not an integer.

:class:`AbsorbBorderIntoThresholds` makes it both. For the integer accumulator ``a = Conv(pad₀(x), W)`` the next
thresholds ask ``a + D_g ≥ e_k`` (``e = R/s``, ``R`` the exact real thresholds). Order the fractional parts of
every ``D_g`` and ``e_k`` of one output channel on ``[0, 1)`` (a non-strict ``e`` before an equal ``D``, a strict
one after it), number them from 0, stepping the number each time a ``D`` is followed by an ``e``; with ``L`` one more
than the last number and ``pos`` each point's number, ``T_k = L·⌊e_k⌋ + pos(e_k)`` and ``d_g = L·⌊D_g⌋ + pos(D_g)``
give, for every integer ``a``: ``a + D_g ≥ e_k ⇔ L·a + d_g ≥ T_k`` (both sides reduce to ``A ≥ 0`` or ``A ≥ 1`` for
the integer ``A = a + ⌊D_g⌋ − ⌊e_k⌋``, chosen by the same order). So the Conv takes the weights ``L·W`` (``L`` per
output channel, at most the number of border patterns, 1 without a border), an integer per-position ``Add(d)`` follows
it (FINN: an integer ElementwiseAdd layer) and the thresholds are the integers ``T``. The rewrite re-checks
``⌈(T_k − d_g)/L⌉`` against the exact per-position thresholds with Fractions before it edits anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.base import attrs_of
from finnlite.core.graphutil import sole_producer, zero_padded
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.absorb import materialize, mt_channel_axis, real_thresholds_of
from streamline.exact import channel_vector, linear_input
from streamline.preprocess import integer_input_scale
from streamline.real_thresholds import RealThresholds, set_real_thresholds

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["AbsorbBorderIntoThresholds", "border_plan"]

#: integers up to this magnitude are exact in float32 (the executor's MatMul/Add and FINN's Python execution)
_EXACT_F32 = 2 ** 24


def _inside_taps(conv: ir.Node, kernel: tuple[int, ...], in_shape: tuple[int, ...]) -> np.ndarray:
    """``M[tap, *out]``: 1 where the kernel tap falls inside the image at that output position, else 0 (the Conv's
    geometry applied to one channel of ones with one one-hot kernel per tap)."""
    import onnx

    from custom_ops.float64_ops import conv as conv64

    taps = int(np.prod(kernel))
    eye = np.eye(taps, dtype=np.float64).reshape((taps, 1) + tuple(kernel))
    attrs = [ir.serde.serialize_attribute(a) for k, a in conv.attributes.items() if k != "group"]
    proto = onnx.helper.make_node("Conv", ["x", "w"], ["y"], name=conv.name)
    proto.attribute.extend(attrs)
    ones = np.ones((1, 1) + tuple(in_shape[2:]), np.float64)
    return conv64(proto, [ones, eye])[0][0]


def border_plan(e: list[Fraction | float], strict: list[bool], d: list[Fraction]) -> tuple[int, list, list[int]]:
    """``(L, T, d_int)`` for one output channel (module docstring): ``e`` the thresholds on ``a + D`` (±inf allowed),
    ``d`` the exact biases ``D_g`` of the border patterns. The circle of fractional parts is cut before the point
    that gives the least ``L`` (subtracting one constant from every ``e`` and ``D`` changes no comparison; a point
    before the cut counts its integer part one less)."""
    points = []  # (fractional part, order at equal fractional parts, kind, index, integer part)
    for k, (ek, st) in enumerate(zip(e, strict)):
        if isinstance(ek, Fraction):
            points.append((ek - math.floor(ek), 2 if st else 0, "e", k, math.floor(ek)))
    for g, dg in enumerate(d):
        points.append((dg - math.floor(dg), 1, "d", g, math.floor(dg)))
    points.sort(key=lambda p: (p[0], p[1]))
    best = None
    for start in [0] + [i for i, p in enumerate(points) if p[2] == "e"]:
        pos, prev, where = 0, None, {}
        for i in list(range(start, len(points))) + list(range(start)):
            _, _, kind, idx, whole = points[i]
            if kind == "e" and prev == "d":
                pos += 1
            where[(kind, idx)] = (pos, whole - (1 if i < start else 0))
            prev = kind
        if best is None or pos + 1 < best[0]:
            best = (pos + 1, where)
    big_l, where = best
    t = [big_l * where[("e", k)][1] + where[("e", k)][0] if isinstance(ek, Fraction) else ek
         for k, ek in enumerate(e)]
    dint = [big_l * where[("d", g)][1] + where[("d", g)][0] for g in range(len(d))]
    return big_l, t, dint


def _exact_threshold(v: Fraction, strict: bool) -> int:
    return math.floor(v) + 1 if strict else math.ceil(v)


@dataclass(frozen=True, slots=True, eq=False)
class BorderPlan:
    """The integer form of a padded Conv's border: per output channel the weight factor ``L`` (``scale``), the
    integer per-position ``bias`` after the Conv, and the integer ``thresholds``."""

    scale: np.ndarray
    bias: np.ndarray
    thresholds: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class BorderMatch:
    """A MultiThreshold (``node``) after a zero-padded ``conv`` reading ``Add(s·x, b)`` (``add``; the scalar
    ``muls`` making ``s``, and the integer tensor ``x``), and the ``plan`` of its integer form."""

    node: ir.Node
    conv: ir.Node
    add: ir.Node
    muls: tuple[ir.Node, ...]
    x: ir.Value
    plan: BorderPlan


@register_pass(group="absorb")
class AbsorbBorderIntoThresholds(Rule):
    """MultiThreshold(Conv(pad₀(Add(s·x, b)), W), R) → MultiThreshold(Add(Conv(pad₀(x), L·W), d), T).

    Algebra and construction in the module docstring: exact for every integer ``x``. Conditions: ``x`` an
    integer-annotated tensor, possibly through single-use scalar Muls whose product ``s`` is positive; ``b`` a
    scalar or per-channel constant; the Conv zero-padded with constant integer weights, feeding only the
    MultiThreshold, whose channel axis is 1; known shapes; every integer the rewrite makes (``L·a + d`` over the
    input's range, the thresholds) within 2^24."""

    op_types = ("MultiThreshold",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        conv = sole_producer(node, 0, ("Conv",))
        if conv is None or len(conv.inputs) != 2 or not zero_padded(conv):
            return None
        lin = linear_input(conv, 0, ("Add",))
        w = const_array(conv.inputs[1])
        if lin is None or w is None:
            return None
        add = lin.node
        src = integer_input_scale(model, lin.data)
        if src is None:
            return None
        x, s, muls = src
        if s <= 0:
            return self.miss(node, "the input scale before the padded Conv is not positive")
        if not np.array_equal(w, np.round(w)):
            return self.miss(node, "the padded Conv's weights are not integers")
        in_shape = model.get_tensor_shape(conv.inputs[0].name)
        out_shape = model.get_tensor_shape(conv.outputs[0].name)
        if in_shape is None or out_shape is None or any(not isinstance(v, int) for v in (*in_shape, *out_shape)):
            return self.miss(node, "unknown shapes")
        if mt_channel_axis(node) != 1:
            return self.miss(node, "the thresholds' channel axis is not the Conv's")
        vec = channel_vector(lin.exact(), len(in_shape), 1)
        if vec is None:
            return self.miss(node, "the Add before the padded Conv varies along a spatial axis")
        plan = self._plan(model, node, conv, w, in_shape, [Fraction(v) / s for v in vec], s, x)
        if isinstance(plan, str):
            return self.miss(node, plan)
        return BorderMatch(node, conv, add, tuple(muls), x, plan)

    def _plan(self, model: Any, node: ir.Node, conv: ir.Node, w: np.ndarray, in_shape: tuple[int, ...],
              p: list[Fraction], s: Fraction, x: ir.Value) -> BorderPlan | str:
        """The integer form, or why there is none."""
        mask = _inside_taps(conv, tuple(w.shape[2:]), in_shape)  # taps, *out
        out_spatial = mask.shape[1:]
        patterns, index = np.unique(mask.reshape(mask.shape[0], -1).T, axis=0, return_inverse=True)
        index = index.reshape(-1)
        o, cg = w.shape[0], w.shape[1]
        groups = int(attrs_of(conv).get("group", 1))
        c = in_shape[1]
        p = p * c if len(p) == 1 else p
        # S[o, c_local, g]: the integer sum of W[o, c_local, tap] over the taps inside in pattern g
        sums = np.einsum("ock,gk->ocg", w.reshape(o, cg, -1).astype(np.float64), patterns)
        rt = real_thresholds_of(model, node)
        if rt.shape[0] not in (1, o):
            return f"{rt.shape[0]} threshold rows for a Conv with {o} output channels"
        full = rt.broadcast_channels(o)._full()
        real, strict = full.real, full.strict
        interior = int(np.bincount(index).argmax())
        dt = model.get_tensor_datatype(x.name)
        lo, hi = float(dt.min()), float(dt.max())
        scale, table, thresholds = [], np.zeros((o, len(patterns)), np.float64), []
        for oc in range(o):
            first = (oc // (o // groups)) * cg  # the group's first input channel
            d = [sum((p[first + ci] * int(sums[oc, ci, g]) for ci in range(cg)), Fraction(0))
                 for g in range(len(patterns))]
            e = [v / s if isinstance(v, Fraction) else float(v) for v in real[oc]]
            big_l, t, dint = border_plan(e, list(strict[oc]), d)
            shift = dint[interior]
            dint = [v - shift for v in dint]
            t = [v - shift if isinstance(v, int) else v for v in t]
            for g in range(len(patterns)):  # the exact per-position thresholds, recomputed independently
                for k, ek in enumerate(e):
                    if isinstance(ek, Fraction) and -((dint[g] - t[k]) // big_l) != _exact_threshold(
                            ek - d[g], bool(strict[oc][k])):
                        raise AssertionError(f"{self.name}: border plan is wrong at channel {oc}, pattern {g}")
            pos_w, neg_w = float(w[oc][w[oc] > 0].sum()), float(w[oc][w[oc] < 0].sum())
            acc = max(abs(pos_w * lo + neg_w * hi), abs(pos_w * hi + neg_w * lo))
            span = big_l * acc + max(abs(v) for v in dint)
            finite = [abs(v) for v in t if isinstance(v, int)]
            if span >= _EXACT_F32 or (finite and max(finite) >= _EXACT_F32):
                return f"the integer border form of output channel {oc} needs integers beyond 2^24 (L={big_l})"
            scale.append(big_l)
            table[oc] = dint
            thresholds.append(t)
        bias = table[:, index].reshape((1, o) + tuple(out_spatial))
        return BorderPlan(np.array(scale, np.float64), bias, np.array(thresholds, np.float64))

    def rewrite(self, model: "Model", match: BorderMatch) -> None:
        node, conv, x = match.node, match.conv, match.x
        scale, bias, thresholds = match.plan.scale, match.plan.bias, match.plan.thresholds
        w = const_array(conv.inputs[1]).astype(np.float64)
        wl = (w * scale.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        y = conv.outputs[0]
        acc, out = model.make_value_like(y, prefix=f"{conv.name}_border_acc"), model.make_value_like(y)
        wv = model.add_initializer(wl, prefix=f"{conv.name}_W_border")
        new_conv = ir.Node(conv.domain, "Conv", [x, wv], attributes=list(conv.attributes.values()),
                           outputs=[acc], name=conv.name)
        c = model.add_initializer(bias.astype(np.float32), prefix=f"{conv.name}_border")
        new_add = ir.Node("", "Add", [acc, c], outputs=[out], name=f"{conv.name}_border_add")
        model.graph.insert_after(conv, [new_conv, new_add])
        node.replace_input_with(0, out)
        model.remove_node(conv)
        model.remove_node(match.add)
        for m in match.muls:
            model.remove_node(m)
        set_real_thresholds(node, RealThresholds(thresholds, np.zeros(thresholds.shape, bool)))
        materialize(model, node)
