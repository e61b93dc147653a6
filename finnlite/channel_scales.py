"""Why a per-channel scale stays float: it reaches a layer that mixes channels (for the integer-only report).

A Mul by one real factor per channel (``s_c``, from an activation quantizer with ``scaling_per_output_channel``)
on an integer tensor ``x`` moves through everything that keeps channels apart — MaxPool (``s_c > 0``), a depthwise
Conv, Relu — and is absorbed by the next MultiThreshold (thresholds ``T[c] / s_c``). A layer that *mixes*
channels computes ``y_o = Σ_c W[c, o]·s_c·x_c``; with integer weights ``W`` that is an integer times one common
scale only when the ``s_c`` are equal (or, for two distinct values, after integer multipliers proven by
``IntegerConvInputScales``). Otherwise the weights would have to carry the real factors ``s_c``: no exact integer
form of practical width exists, and the Mul and everything after it up to the next quantizer stay float.

:func:`channel_scale_cause` recognises that situation on the final graph — the float Mul's constant has several
distinct values along one axis, and following its output through channel-preserving ops (pooling, data
movement, Im2Col) reaches a channel-mixing MatMul/Conv/Gemm — and says which layer, which quantizer and what the
user can change.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from finnlite.core.shapes import const_array
from finnlite.core.traverse import node_label

__all__ = ["channel_scale_cause"]

#: ops a per-channel scale travels through on its way to the layer that reads it (channels kept apart)
_THROUGH = ("MaxPool", "MaxPoolNHWC", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity",
            "Im2Col", "Pad", "Relu")
_MIXERS = ("MatMul", "Conv", "Gemm")


def _channel_factors(node: ir.Node) -> np.ndarray | None:
    """The Mul's constant when it holds several distinct values along exactly one axis, else None."""
    for i in (1, 0):
        c = const_array(node.inputs[i]) if len(node.inputs) == 2 else None
        if c is not None and node.inputs[1 - i] is not None and const_array(node.inputs[1 - i]) is None:
            if sum(d > 1 for d in c.shape) == 1 and len(np.unique(c)) > 1:
                return c.ravel()
            return None
    return None


def _mixes_channels(node: ir.Node, came_through: list[ir.Node]) -> bool:
    if node.op_type == "Conv":
        group = node.attributes["group"].value if "group" in node.attributes else 1
        w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        return w is not None and not (group > 1 and w.shape[1] == 1)
    if node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and const_array(node.inputs[1]) is not None:
        im2col = next((n for n in reversed(came_through) if n.op_type == "Im2Col"), None)
        return im2col is None or not (im2col.attributes["depthwise"].value if "depthwise" in im2col.attributes
                                      else 0)
    return False


def _mixer(node: ir.Node) -> tuple[ir.Node, list[ir.Node]] | None:
    """The channel-mixing layer the Mul's output reaches through channel-preserving ops, and the ops between."""
    path: list[ir.Node] = []
    value = node.outputs[0]
    while True:
        uses = list(value.uses())
        if len(uses) != 1 or uses[0].idx != 0:
            return None
        nxt = uses[0].node
        if nxt.op_type in _MIXERS:
            return (nxt, path) if _mixes_channels(nxt, path) else None
        if nxt.op_type not in _THROUGH:
            return None
        path.append(nxt)
        value = nxt.outputs[0]


def _quantizer(node: ir.Node) -> ir.Node | None:
    """The MultiThreshold (the activation quantizer) the Mul's data input comes from, through pooling/movement."""
    v = next((x for x in node.inputs if x is not None and const_array(x) is None), None)
    while v is not None and (p := v.producer()) is not None:
        if p.op_type == "MultiThreshold":
            return p
        if p.op_type not in _THROUGH:
            return None
        v = p.inputs[0]
    return None


def channel_scale_cause(node: ir.Node) -> str | None:
    """Why the float Mul ``node`` cannot become integer, with what to change, if it is a per-channel scale that
    reaches a channel-mixing layer (module docstring); else None."""
    if node.op_type != "Mul":
        return None
    factors = _channel_factors(node)
    found = _mixer(node) if factors is not None else None
    if found is None:
        return None
    mixer, path = found
    quant = _quantizer(node)
    src = f" of the activation quantizer now MultiThreshold '{node_label(quant)}'" if quant is not None else ""
    via = f" via {', '.join(n.op_type for n in path)}" if path else ""
    lo, hi = float(np.min(factors)), float(np.max(factors))
    return (f"{len(np.unique(factors))} distinct per-channel scales ({lo:.3g} … {hi:.3g}){src} reach the "
            f"channel-mixing {mixer.op_type} '{node_label(mixer)}'{via}: Σ_c W[c, o]·s_c·x_c with integer W is "
            f"exact in integers only when the s_c are equal (or two, before a Conv: IntegerConvInputScales), so it "
            f"stays float up to the next quantizer or output; change: per-tensor scaling on that quantizer "
            f"(Brevitas scaling_per_output_channel=False), or a per-tensor requantizer (e.g. QuantIdentity) "
            f"before '{node_label(mixer)}'")
