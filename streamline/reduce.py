"""Global averages as integer sums: GlobalAveragePool / ReduceMean → ReduceSum and a scale.

A float global average pool between quantizers (``AdaptiveAvgPool2d(1)`` or ``x.mean((2, 3))`` before a
requantizer, the head of a ResNet) averages integers: the average is the integer window sum times 1/N. Once the
sum is a ReduceSum of an integer tensor and 1/N a Mul, the Mul moves on into the next MultiThreshold like any
scale, and the sum stays integer. ReduceSum keeps the reduced axes in its ``axes`` input (opset 13 and later) or
attribute (before), which the NHWC conversion renumbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import is_integer_type
from finnlite.core.graphutil import is_standard_domain
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.exact import const_operand, exact_value, set_exact, to_float32

if TYPE_CHECKING:
    from finnlite.core.model import Model


def reduce_axes(node: ir.Node) -> list[int] | None:
    """The axes a GlobalAveragePool / ReduceMean / ReduceSum reduces (normalized to ≥ 0), None if unknown. An
    empty or absent ``axes`` means every axis (unless ``noop_with_empty_axes``: then None)."""
    rank = len(node.inputs[0].shape) if node.inputs[0] is not None and node.inputs[0].shape is not None else None
    if rank is None:
        return None
    if node.op_type == "GlobalAveragePool":
        return list(range(2, rank))
    if "axes" in node.attributes:
        axes = [int(a) for a in node.attributes["axes"].value]
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = const_array(node.inputs[1])
        if arr is None:
            return None
        axes = [int(a) for a in np.asarray(arr).ravel()]
    else:
        axes = []
    if not axes:
        noop = node.attributes.get("noop_with_empty_axes")
        return None if noop is not None and int(noop.value) else list(range(rank))
    return sorted({a % rank for a in axes})


def _count(node: ir.Node, axes: list[int]) -> int | None:
    shape = node.inputs[0].shape
    dims = [shape[a] for a in axes]
    return int(np.prod(dims)) if all(isinstance(d, int) for d in dims) else None


def keepdims(node: ir.Node) -> bool:
    """Whether reduction ``node`` keeps the reduced axes (GlobalAveragePool always does; ``keepdims`` defaults to 1)."""
    if node.op_type == "GlobalAveragePool":
        return True
    k = node.attributes.get("keepdims")
    return True if k is None else bool(int(k.value))


@dataclass(frozen=True, slots=True, eq=False)
class AverageAsSum:
    """An average (``node``) over ``axes`` of ``count`` integer elements."""

    node: ir.Node
    axes: list[int]
    count: int


@register_pass(group="reorder")
class GlobalAverageToReduceSum(Rule):
    """GlobalAveragePool(x) / ReduceMean(x, A) → Mul(ReduceSum(x, A), 1/N) for an integer x.

    Algebra: a mean over N = ∏_{a∈A} dim_a elements is their sum times 1/N (1/N kept exactly). Conditions: x carries
    an integer datatype annotation (so the sum is an integer tensor: the rewrite serves only there); the axes and
    their sizes are known. keepdims and the axes are those of the original (GlobalAveragePool: the spatial axes,
    kept)."""

    op_types = ("GlobalAveragePool", "ReduceMean")

    def match(self, model: "Model", node: ir.Node) -> Any:
        x = node.inputs[0]
        if x is None or not model.has_tensor_datatype(x.name) or not is_integer_type(
                model.get_tensor_datatype(x.name)):
            return None
        axes = reduce_axes(node)
        if axes is None:
            return self.miss(node, "the reduced axes are unknown")
        n = _count(node, axes)
        if n is None:
            return self.miss(node, "the reduced axes have unknown sizes")
        return AverageAsSum(node, axes, n)

    def rewrite(self, model: "Model", match: AverageAsSum) -> None:
        node, axes, n = match.node, match.axes, match.count
        y = node.outputs[0]
        opset = model.graph.opset_imports.get("", 13)
        sums = model.make_value_like(y, f"{node.name}_sum")
        attrs = [ir.AttrInt64("keepdims", int(keepdims(node)))]
        inputs = [node.inputs[0]]
        if opset >= 13:
            inputs.append(model.add_initializer(np.asarray(axes, np.int64), prefix=f"{node.name}_axes"))
        else:
            attrs.append(ir.AttrInt64s("axes", axes))
        red = ir.Node("", "ReduceSum", inputs, attributes=attrs, outputs=[sums], name=f"{node.name}_ReduceSum")
        out = model.make_value_like(y)
        model.replace_uses(y, out)
        k = model.add_initializer(to_float32(np.asarray(Fraction(1, n), dtype=object)), prefix=f"{node.name}_inv")
        mul = ir.Node("", "Mul", [sums, k], outputs=[out], name=f"{node.name}_Mul")
        set_exact(mul, np.asarray(Fraction(1, n), dtype=object))
        model.graph.insert_after(node, [red, mul])
        model.remove_node(node)


#: the reduction rules, in the order a round applies them
REDUCE_PASSES = [GlobalAverageToReduceSum]
