"""A Conv or MatMul over channels of two scales (a Concat of differently quantized branches) read only by thresholds.

:class:`IntegerConvInputScales` splits the layer's sum by scale: per output channel it is ``sA·U + sB·V`` with ``U``
and ``V`` the integer partial sums over the two groups of input channels, each in a finite range known from the
weights. :func:`streamline.join_search.find_multipliers` finds integers ``(p, q)`` per output channel that
reproduce the thresholds on that box, proven by enumeration; ``p`` and ``q`` go into the weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import is_integer_type
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array, const_shape
from streamline.absorb import materialize, real_thresholds_of
from streamline.exact import channel_vector, const_operand, exact_value
from streamline.join_search import find_multipliers, signed_bits
from streamline.real_thresholds import RealThresholds, set_real_thresholds

log = logging.getLogger(__name__)
_CACHE: dict[tuple, Any] = {}


def _partial_range(w: np.ndarray, lo: int, hi: int) -> tuple[int, int]:
    """Range of ``Σ w·x`` for integer ``x ∈ [lo, hi]``."""
    pos, neg = int(np.maximum(w, 0).sum()), int(np.minimum(w, 0).sum())
    return pos * lo + neg * hi, pos * hi + neg * lo


def _as_conv_weight(node: ir.Node, w: np.ndarray | None) -> np.ndarray | None:
    """The weight as ``[output channel, input channel, ...]``: a Conv's as it is, a MatMul's ``[K, N]`` transposed."""
    if w is None:
        return None
    if node.op_type == "MatMul":
        return w.T if w.ndim == 2 else None
    return w if w.ndim >= 3 else None


@dataclass(frozen=True, slots=True, eq=False)
class TwoScaleInput:
    """A Conv/MatMul (``node``) reading ``Mul(x, v)`` (``mul``) with v taking two values over the input channels
    (``group_a``: the channels of the first), its one MultiThreshold ``mt``, and the multipliers found per output
    channel (``found``)."""

    node: ir.Node
    mul: ir.Node
    x: ir.Value
    mt: ir.Node
    group_a: np.ndarray
    found: list


@register_pass(group="reorder")
class IntegerConvInputScales(Rule):
    """Conv(Mul(x, v), W) → MultiThreshold(·, R) with v taking two values sA ≠ sB over the input channels
    ⇒ Conv(x, W') → MultiThreshold(·, T'), W'[o, A] = p_o·W[o, A], W'[o, B] = q_o·W[o, B]; likewise a MatMul with a
    constant ``[K, N]`` weight and v along its last axis (a Flatten of an image concatenated with a side vector).

    Algebra: output channel o computes sA·U_o + sB·V_o with U_o = Σ_A W·x, V_o = Σ_B W·x integers in ranges bounded
    by the weights and x's datatype (0 included for padded Convs); ``p_o·U + q_o·V ≥ T' ⇔ sA·U + sB·V ≥ R`` on that
    box for every threshold of the row, proven by enumeration (:mod:`streamline.join_search`). Conditions: x is an
    integer tensor, W integer, group 1, no bias, the Mul feeds only the Conv, the Conv feeds one MultiThreshold
    only, multipliers within ``max_multiplier`` and the new accumulator within 2^24 (float32 thresholds)."""

    op_types = ("Conv", "MatMul")
    max_multiplier = 2**15 - 1

    def match(self, model: Any, node: ir.Node) -> Any:
        v = node.inputs[0]
        mul = v.producer()
        if (mul is None or mul.op_type != "Mul" or len(v.uses()) != 1 or len(node.inputs) != 2
                or const_operand(mul) is None):
            return None
        if node.op_type == "MatMul" and len(const_shape(node.inputs[1]) or ()) != 2:
            return None
        w = _as_conv_weight(node, const_array(node.inputs[1]))
        ci, val = const_operand(mul)
        rank = len(v.shape) if v.shape is not None else None
        axis = 1 if node.op_type == "Conv" else (rank - 1 if rank else None)
        vec = channel_vector(exact_value(mul, val), rank, axis) if w is not None and axis is not None else None
        if vec is None or vec.size != w.shape[1] or len(set(vec)) != 2:
            return None
        group = node.attributes["group"].value if "group" in node.attributes else 1
        x = mul.inputs[1 - ci]
        dt = model.get_tensor_datatype(x.name)
        uses = list(node.outputs[0].uses())
        if (group != 1 or not is_integer_type(dt) or not np.array_equal(w, np.round(w)) or len(uses) != 1
                or uses[0].node.op_type != "MultiThreshold" or uses[0].idx != 0 or node.outputs[0].is_graph_output()):
            return None
        s_a, s_b = sorted(set(vec))
        group_a = np.array([s == s_a for s in vec])
        pads = node.attributes["pads"].value if "pads" in node.attributes else ()
        lo, hi = int(dt.min()), int(dt.max())
        if any(pads):
            lo, hi = min(lo, 0), max(hi, 0)
        mt = uses[0].node
        rt = real_thresholds_of(model, mt)
        rt = rt.broadcast_channels(w.shape[0])
        key = (s_a, s_b, lo, hi, w.tobytes(), group_a.tobytes(), rt.to_json(), self.max_multiplier)
        if key not in _CACHE:
            _CACHE[key] = self._search(w, group_a, Fraction(s_a), Fraction(s_b), lo, hi, rt)
        found = _CACHE[key]
        if isinstance(found, str):
            return self.miss(node, found)
        return TwoScaleInput(node, mul, x, mt, group_a, found)

    def _search(self, w, group_a, s_a, s_b, lo, hi, rt) -> Any:
        out = []
        for o in range(w.shape[0]):
            ra, rb = _partial_range(w[o, group_a], lo, hi), _partial_range(w[o, ~group_a], lo, hi)
            f = find_multipliers([rt.rows([o])], s_a, s_b, ra, rb, self.max_multiplier)
            if isinstance(f, str):
                return f"output channel {o}: {f}"
            lo_acc, hi_acc = f.output_range
            if max(abs(lo_acc), abs(hi_acc)) > 2**24:
                return f"output channel {o}: the integer accumulator {f.describe()} exceeds 2^24"
            out.append(f)
        return out

    def rewrite(self, model: Any, match: TwoScaleInput) -> None:
        node, mul, x, mt, group_a, found = match.node, match.mul, match.x, match.mt, match.group_a, match.found
        w = np.array(_as_conv_weight(node, const_array(node.inputs[1])), dtype=np.float64)
        for o, f in enumerate(found):
            w[o, group_a] *= f.p
            w[o, ~group_a] *= f.q
        if node.op_type == "MatMul":
            w = w.T
        wv = model.add_initializer(w.astype(np.float32), prefix=f"{node.name}_W")
        y = node.outputs[0]
        conv = ir.Node("", node.op_type, [x, wv], attributes=list(node.attributes.values()),
                       outputs=[model.make_value_like(y)], name=f"{node.name}_int")
        model.graph.insert_before(node, conv)
        model.replace_uses(y, conv.outputs[0])
        model.remove_node(node)
        model.remove_node(mul)
        conv.name = node.name
        t = np.concatenate([f.thresholds[0] for f in found], axis=0)
        set_real_thresholds(mt, RealThresholds(t, np.zeros(t.shape, dtype=bool)))
        materialize(model, mt)
        bits = max(max(signed_bits(f.p), signed_bits(f.q)) for f in found)
        log.info("%s: %s: per-channel multipliers up to %d bits (%s)", self.name, node.name, bits,
                 "; ".join(f"{f.p}, {f.q}" for f in found))
