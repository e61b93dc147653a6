"""Why a value stays off the integer grid: an off-grid bias before a non-quantizer, or a join of unrelated scales.

Streamlining keeps a tensor integer while it is an integer accumulator times a scale plus a bias that a quantizer
absorbs. Two things break that where no quantizer reads the result (Brevitas' *layerwise* PTQ quantizes only the
inputs of its layers, so a layer's float output goes through a ReLU to a residual Add, a pooling or the output):

* **an off-grid bias**: ``Add(a, c)`` on an integer tensor ``a`` with a constant ``c`` that is not an integer —
  ``c = b/s``, a bias quantized with the scale ``fl32(s_in·s_w)`` (Int32Bias, onnxruntime) over the accumulator's
  exact scale ``s_in·s_w``: the two differ by a relative ~2^-24 unless the product is exact in float32, as with
  power-of-two scales. Thresholds absorb any real constant; a ReLU, an average or a join after it do not;
* **a join of unrelated scales**: ``s1·a + s2·b`` whose ratio ``s2/s1`` is no ratio of small integers (it always is
  one of integers of up to ~48 bits: products of float32 scales) and whose result is read by something other
  than thresholds (:class:`streamline.join.IntegerJoinMultipliers` proves small multipliers only for those).

:func:`grid_cause` recognises both on the final graph and says which node, why, and what the user can change.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import is_integer_type
from finnlite.core.shapes import const_array
from finnlite.core.traverse import node_label

__all__ = ["grid_cause"]

#: ops a value passes on its way to what reads it (no quantizer among them)
_THROUGH = ("Relu", "Mul", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "MaxPool",
            "MaxPoolNHWC", "Concat")
_CHANGE = ("change: quantize that output (Brevitas' fx backend quantizes every layer's output and requantizes "
           "residual Adds; the layerwise backend quantizes only layer inputs), or use power-of-two scales "
           "(Int8WeightPerTensorFixedPoint/Int8ActPerTensorFixedPoint), whose products are exact")


def _is_int(model: Any, v: ir.Value | None) -> bool:
    return (v is not None and bool(v.name) and model.has_tensor_datatype(v.name)
            and is_integer_type(model.get_tensor_datatype(v.name)))


def _reader(node: ir.Node) -> tuple[ir.Node | None, list[str]]:
    """The first node after ``node`` (through ``_THROUGH`` ops with one reader) that is not one of them, or None for
    a graph output; and the ops passed."""
    path: list[str] = []
    value = node.outputs[0]
    while True:
        uses = [u for u in value.uses()]
        if value.is_graph_output() or not uses:
            return None, path
        if len(uses) > 1:
            others = [u.node for u in uses if u.node.op_type != "MultiThreshold"]
            if not others:
                return uses[0].node, path
            return others[0], path
        nxt = uses[0].node
        if nxt.op_type not in _THROUGH:
            return nxt, path
        path.append(nxt.op_type)
        value = nxt.outputs[0]


def _where(reader: ir.Node | None, path: list[str]) -> str:
    via = f" through {', '.join(path)}" if path else ""
    if reader is None:
        return f"reaches the graph output{via}"
    return f"is read{via} by {reader.op_type} '{node_label(reader)}'"


def _scale(v: ir.Value) -> tuple[ir.Value, Fraction] | None:
    """``(x, s)`` if ``v = Mul(x, s)`` with a scalar constant ``s``, else ``(v, 1)``."""
    p = v.producer()
    if p is not None and p.op_type == "Mul" and len(p.inputs) == 2:
        for i in (0, 1):
            c = const_array(p.inputs[i])
            if c is not None and const_array(p.inputs[1 - i]) is None:
                if c.size != 1:
                    return None
                return p.inputs[1 - i], Fraction(float(c.ravel()[0]))
    return v, Fraction(1)


def _bits(k: int) -> int:
    return abs(k).bit_length()


def grid_cause(model: Any, node: ir.Node) -> str | None:
    """Why the float ``node`` cannot be integer, with what to change (module docstring); None if neither case."""
    if node.op_type == "Mul" and (found := _scale(node.outputs[0])) is not None and _is_int(model, found[0]):
        reader, _ = _reader(node)
        if reader is not None and reader.op_type == "Add" and reader is not node and grid_cause(model, reader):
            return (f"it scales one branch of Add '{node_label(reader)}', which joins unrelated scales or adds an "
                    "off-grid constant (see there)")
        return None
    if node.op_type != "Add" or len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    consts = [const_array(v) for v in node.inputs]
    if sum(c is not None for c in consts) == 1:
        i = 0 if consts[0] is not None else 1
        c, x = consts[i], node.inputs[1 - i]
        if not _is_int(model, x) or np.all(np.asarray(c) == np.round(c)):
            return None
        frac = np.abs(np.asarray(c, np.float64) - np.round(c))
        reader, path = _reader(node)
        if reader is not None and reader.op_type == "MultiThreshold" and not path:
            return None
        return (f"its constant (e.g. {float(np.ravel(c)[int(np.argmax(frac))]):.9g}) is not an integer, so the "
                f"integer '{x.name}' plus it is off the integer grid — a quantized bias whose scale, the float32 "
                f"product fl32(s_in·s_w), is not the accumulator's exact scale s_in·s_w —, and the result "
                f"{_where(reader, path)} before any quantizer: only thresholds absorb such a constant, so it "
                f"stays float up to the next quantizer or output; {_CHANGE}")
    if any(c is not None for c in consts):
        return None
    sides = [_scale(v) for v in node.inputs]
    if any(s is None for s in sides) or sides[0][1] == sides[1][1]:
        return None
    ratio = sides[1][1] / sides[0][1]
    if max(abs(ratio.numerator), ratio.denominator) <= 256:
        return None
    reader, path = _reader(node)
    return (f"it joins two branches scaled by {float(sides[0][1]):.9g} and {float(sides[1][1]):.9g}, whose ratio "
            f"is {abs(ratio.numerator)}/{ratio.denominator} ({_bits(ratio.numerator)}- and "
            f"{_bits(ratio.denominator)}-bit integers), and the sum {_where(reader, path)}, not only by "
            f"quantizers: no integer multipliers of practical width make it exact (IntegerJoinMultipliers proves "
            f"small ones only for joins that thresholds alone read); "
            + _CHANGE.replace("quantize that output", "quantize the join's inputs with one shared quantizer"))
