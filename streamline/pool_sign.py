"""Signs in front of a MaxPool: per-channel scales of mixed sign go into the thresholds and the weights; signed
levels before a padded MaxPool start at 0 (:class:`ShiftSignedLevelsPastPaddedMaxPool`).

A quantizer followed by a BatchNorm with negative gammas (or any per-channel factor of mixed sign) puts
``Mul(a)`` with some ``a_c < 0`` between a MultiThreshold and a MaxPool. ``max(a_c·y) = a_c·min(y)`` there, so the
factor cannot pass the MaxPool (:class:`streamline.move.MoveMulPastLinear` takes ``a ≥ 0``), and a
per-channel sign cannot be a MultiThreshold's ``out_scale`` (one value per node).
:class:`AbsorbChannelSignIntoMultiThreshold` moves the sign of each negative channel back through the MultiThreshold into the weights of
the Conv before it, leaving ``|a|``, which then passes the MaxPool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import is_integer_type, smallest_int_type
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.absorb import materialize, mt_channel_axis, real_thresholds_of, set_channel_axis
from streamline.datatypes import Range
from streamline.exact import channel_vector, const_operand, exact_value, set_exact, shaped_for_axis, to_float32
from streamline.rationals import RationalVector
from streamline.real_thresholds import RealThresholds, set_real_thresholds

__all__ = ["AbsorbChannelSignIntoMultiThreshold", "ShiftSignedLevelsPastPaddedMaxPool", "flip_rows"]


def flip_rows(rt: RealThresholds, flip: np.ndarray, out_bias: int) -> tuple[RealThresholds, int]:
    """Thresholds and out_bias ``B`` on ``u = σ·v`` (σ_c = −1 where ``flip``) giving ``σ_c·(count_c(v) + b)``.

    A flipped row counts from above (:meth:`RealThresholds.negated`): ``count_c(v) = N − count⁻_c(u)``, so
    ``−(count_c(v) + b) = count⁻_c(u) − N − b``. The rows then differ in their offset (``b`` or ``−N − b``): with
    ``B`` the smaller, each row gets ``off_c = offset_c − B`` thresholds at −∞ (always passed) in front and
    ``max(off) − off_c`` at +∞ (never passed) behind, so that every row has the same length."""
    channels, n = len(flip), rt.shape[1]
    full = rt.broadcast_channels(channels)
    alpha, beta = full.alpha.resize(channels), full.beta.resize(channels)
    full = RealThresholds(full.base, full.strict, alpha, beta)
    neg = full.negated()
    offsets = np.where(flip, -n - out_bias, out_bias)
    low = int(offsets.min())
    off = offsets - low
    pad = int(off.max())
    base = np.empty((channels, n + pad))
    strict = np.zeros((channels, n + pad), dtype=bool)
    for c in range(channels):
        src = neg if flip[c] else full
        k = int(off[c])
        base[c] = np.concatenate([np.full(k, -np.inf), src.base[c], np.full(pad - k, np.inf)])
        strict[c, k:k + n] = src.strict[c]
    new_beta = RationalVector(np.where(flip, -beta.num, beta.num), beta.den)
    return RealThresholds(base, strict, alpha, new_beta), low


@dataclass(frozen=True, slots=True, eq=False)
class SignBeforeMaxPool:
    """A per-channel Mul (``node``, its constant at input ``const_index``, exactly ``scale`` per channel, rank
    ``rank``) of mixed sign before a MaxPool, reading MultiThreshold ``mt`` (integer ``out_bias``, input datatype
    ``dt``) after ``conv`` with integer weights ``weight``."""

    node: ir.Node
    const_index: int
    mt: ir.Node
    conv: ir.Node
    weight: np.ndarray
    scale: np.ndarray
    out_bias: int
    dt: Any
    rank: int


@dataclass(frozen=True, slots=True, eq=False)
class SignedLevels:
    """A padded MaxPool (``node``) reading MultiThreshold ``mt`` whose levels start at ``out_bias`` < 0."""

    node: ir.Node
    mt: ir.Node
    out_bias: float


@register_pass(group="absorb")
class AbsorbChannelSignIntoMultiThreshold(Rule):
    """MaxPool(Mul(MultiThreshold(Conv(x, W); R, b), a)) with per-channel a of mixed sign
    ⇒ MaxPool(Mul(MultiThreshold(Conv(x, W·σ); R', B), |a|)), σ = sign(a) (then |a| passes the MaxPool).

    Algebra: negating output channel c of W negates the accumulator, u_c = −v_c; the MultiThreshold's level of v_c
    is N − (its count from above on u_c), so a_c·(count_c(v) + b) = |a_c|·(count⁻_c(u) − N − b) (:func:`flip_rows`
    pads the rows to one out_bias B). Conditions: the Mul feeds only a MaxPool, a varies along the channel axis
    only; the MultiThreshold has out_scale 1 and an integer out_bias, an integer input and feeds only the Mul; the
    Conv has constant integer weights and no bias and feeds only the MultiThreshold (neither is a graph output).
    The weight datatype is widened when needed (INT4 −8 becomes 8), the accumulator's to its negation's range."""

    op_types = ("Mul",)

    def match(self, model: Any, node: ir.Node) -> Any:
        c = const_operand(node)
        uses = list(node.outputs[0].uses())
        if c is None or len(uses) != 1 or uses[0].node.op_type != "MaxPool":
            return None
        mt = node.inputs[1 - c[0]].producer()
        if mt is None or mt.op_type != "MultiThreshold" or len(mt.outputs[0].uses()) != 1 \
                or mt.outputs[0].is_graph_output():
            return None
        rank = len(node.outputs[0].shape) if node.outputs[0].shape is not None else None
        vec = channel_vector(exact_value(node, c[1]), rank, 1) if rank else None
        if vec is None or len(vec) == 1 or not any(v < 0 for v in vec):
            return None
        conv = mt.inputs[0].producer()
        w = const_array(conv.inputs[1]) if conv is not None and conv.op_type == "Conv" else None
        scale = mt.attributes["out_scale"].value if "out_scale" in mt.attributes else 1.0
        bias = mt.attributes["out_bias"].value if "out_bias" in mt.attributes else 0.0
        dt = model.get_tensor_datatype(mt.inputs[0].name)
        if w is None or not np.array_equal(w, np.round(w)) or len(mt.inputs[0].uses()) != 1 or len(conv.inputs) > 2 \
                or mt.inputs[0].is_graph_output():
            return self.miss(node, "the MultiThreshold before the sign does not read a Conv with integer weights")
        per_channel_elsewhere = mt_channel_axis(mt) != 1 and real_thresholds_of(model, mt).shape[0] > 1
        if scale != 1.0 or bias != round(bias) or not is_integer_type(dt) or per_channel_elsewhere:
            return self.miss(node, "the MultiThreshold before the sign needs out_scale 1, an integer out_bias and "
                                   "an integer NCHW input")
        return SignBeforeMaxPool(node, c[0], mt, conv, w, vec, int(bias), dt, rank)

    def rewrite(self, model: Any, match: SignBeforeMaxPool) -> None:
        node, mt, conv, w, vec, dt = match.node, match.mt, match.conv, match.weight, match.scale, match.dt
        flip = np.array([v < 0 for v in vec])
        new_w = (w * np.where(flip, -1.0, 1.0).reshape([-1] + [1] * (w.ndim - 1))).astype(w.dtype)
        wv = model.add_initializer(new_w, prefix=f"{conv.inputs[1].name}_signed")
        model.set_tensor_datatype(wv.name, Range.of_array(new_w).datatype())
        conv.replace_input_with(1, wv)
        lo, hi = float(dt.min()), float(dt.max())
        model.set_tensor_datatype(mt.inputs[0].name, smallest_int_type(min(lo, -hi), max(hi, -lo)))
        rt, out_bias = flip_rows(real_thresholds_of(model, mt), flip, match.out_bias)
        set_channel_axis(mt, 1)
        set_real_thresholds(mt, rt)
        materialize(model, mt)
        out_dt = smallest_int_type(out_bias, out_bias + rt.shape[1])
        mt.attributes["out_bias"] = ir.AttrFloat32("out_bias", float(out_bias))
        mt.attributes["out_dtype"] = ir.AttrString("out_dtype", out_dt.name)
        model.set_tensor_datatype(mt.outputs[0].name, out_dt)
        absval = shaped_for_axis(np.array([abs(v) for v in vec], dtype=object), match.rank, 1)
        node.replace_input_with(match.const_index, model.add_initializer(to_float32(absval), prefix=f"{node.name}_abs"))
        set_exact(node, absval)


@register_pass(group="absorb")
class ShiftSignedLevelsPastPaddedMaxPool(Rule):
    """MaxPool(MultiThreshold(x; out_bias b < 0)) with padding ⇒ Add(MaxPool(MultiThreshold(x; out_bias 0)), b).

    FINN pads a max pool's input with zeros (its sliding window has no other fill), which is −∞ for the maximum only
    when 0 is the least level: a signed quantizer's levels (−8 … 7) would see the zeros win at the border. Algebra:
    the maximum of ``u + b`` over a window is ``max(u) + b``, and ONNX's padding (−∞) is never chosen in either;
    with the MultiThreshold's out_bias 0 its levels ``u`` are 0 … N, so FINN's zero padding is never greater than a
    real element of the window. The other consumers of the MultiThreshold read ``u + b`` through an Add of their
    own; the Adds move on into the next layers and thresholds like any bias. Conditions: out_scale 1 and an integer
    out_bias below 0; some padding; the MaxPool's Indices output unused."""

    op_types = ("MaxPool",)

    def match(self, model: Any, node: ir.Node) -> Any:
        if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
            return None
        pads = node.attributes["pads"].value if "pads" in node.attributes else ()
        auto_pad = node.attributes["auto_pad"].value if "auto_pad" in node.attributes else "NOTSET"
        if not any(pads) and auto_pad in ("NOTSET", "VALID"):
            return None
        x = node.inputs[0]
        mt = x.producer() if x is not None else None
        if mt is None or mt.op_type != "MultiThreshold" or x.is_graph_output():
            return None
        scale = mt.attributes["out_scale"].value if "out_scale" in mt.attributes else 1.0
        bias = mt.attributes["out_bias"].value if "out_bias" in mt.attributes else 0.0
        if bias >= 0:
            return None
        if scale != 1.0 or bias != round(bias):
            return self.miss(node, "the signed levels before the padded MaxPool need out_scale 1 and an integer "
                                   "out_bias to start at 0")
        return SignedLevels(node, mt, float(bias))

    def rewrite(self, model: Any, match: SignedLevels) -> None:
        node, mt, bias = match.node, match.mt, match.out_bias
        u = mt.outputs[0]
        n = const_array(mt.inputs[1]).shape[-1]
        mt.attributes["out_bias"] = ir.AttrFloat32("out_bias", 0.0)
        out_dt = smallest_int_type(0, n)
        mt.attributes["out_dtype"] = ir.AttrString("out_dtype", out_dt.name)
        model.set_tensor_datatype(u.name, out_dt)
        others = [use for use in u.uses() if use.node is not node]
        k = model.add_initializer(np.array(bias, np.float32), prefix=f"{mt.name}_levels")
        if others or u.is_graph_output():
            shifted = model.make_value_like(u)
            add = ir.Node("", "Add", [u, k], outputs=[shifted], name=f"{mt.name}_signed")
            model.graph.insert_after(mt, add)
            for use in others:
                use.node.replace_input_with(use.idx, shifted)
            if u.is_graph_output():
                model.replace_uses(u, shifted)
                node.replace_input_with(0, mt.outputs[0])
        y = node.outputs[0]
        out = model.make_value_like(y)
        model.replace_uses(y, out)
        model.graph.insert_after(node, ir.Node("", "Add", [y, k], outputs=[out], name=f"{node.name}_signed"))
