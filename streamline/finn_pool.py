"""A global sum in the lowered-pooling form FINN converts to a HW layer.

A float global average between quantizers becomes an integer ``ReduceSum`` over the spatial axes of an NHWC
tensor (:mod:`streamline.reduce`). finn-plus' ``step_convert_to_hw`` has no HW layer for that node: it converts a
``ReduceSum`` only in its lowered-pooling form ``Im2Col → Reshape → ReduceSum(axes=[-2])`` (``InferPoolFromReduce``:
a depthwise ``ConvolutionInputGenerator`` and an accumulating ``Pool``), and the node otherwise stays in software
between HW layers, which ``step_create_dataflow_partition`` rejects. :class:`LowerGlobalSum` writes it in that form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.registry import QONNX_DOMAIN
from finnlite.core.datatypes import is_integer_type
from finnlite.core.passes import Rule, register_pass
from finnlite.core.graphutil import add_constant, ensure_custom_domain
from streamline.lower_common import new_value, shape_of
from streamline.reduce import keepdims, reduce_axes

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["LowerGlobalSum"]

_NHWC = ["N", "H", "W", "C"]


@register_pass(group="finalize")
class LowerGlobalSum(Rule):
    """ReduceSum(x[N, H, W, C], axes=[1, 2], keepdims=1) → ReduceSum(Reshape(Im2Col(x), [N, 1, 1, H·W, C]), [3]).

    Pattern: a ReduceSum over the two spatial axes of an NHWC tensor (``tensor_layout`` annotation) of static
    shape and integer datatype, keeping the reduced dims. Algebra: ``Im2Col`` with a kernel of H×W, stride 1, no
    padding and ``depthwise=1`` lays out the one window as [N, 1, 1, H·W·C] with the channel fastest, so the
    Reshape to [N, 1, 1, H·W, C] puts pixel p, channel c at [.., p, c], and the sum over axis 3 (keepdims 0) is
    [N, 1, 1, C], the same sums as before, of the same integers (exact in float32 as the original sum was)."""

    op_types = ("ReduceSum",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        x = node.inputs[0]
        if x is None or model.get_tensor_layout(x.name) != _NHWC:
            return None
        shape = shape_of(model, x)
        if shape is None or len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape):
            return self.miss(node, "the input's shape is not static")
        if reduce_axes(node) != [1, 2] or not keepdims(node):
            return None
        if not model.has_tensor_datatype(x.name) or not is_integer_type(model.get_tensor_datatype(x.name)):
            return self.miss(node, "the input is not an integer tensor")
        return node, shape

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (n, h, w, c) = match
        ensure_custom_domain(model)
        x, name = node.inputs[0], node.name or "ReduceSum"
        dt = model.get_tensor_datatype(x.name)
        cols = new_value(model, f"{name}_im2col", (n, 1, 1, h * w * c), dt, _NHWC)
        windows = new_value(model, f"{name}_windows", (n, 1, 1, h * w, c), dt)
        im2col = ir.Node(QONNX_DOMAIN, "Im2Col", [x], attributes=[
            ir.AttrInt64s("stride", [1, 1]), ir.AttrInt64s("kernel_size", [h, w]),
            ir.AttrString("input_shape", f"({n}, {h}, {w}, {c})"), ir.AttrInt64s("pad_amount", [0, 0, 0, 0]),
            ir.AttrInt64("pad_value", 0), ir.AttrInt64("depthwise", 1), ir.AttrInt64s("dilations", [1, 1])],
            outputs=[cols], name=f"{name}_im2col")
        shape = add_constant(model, np.array([n, 1, 1, h * w, c], np.int64), f"{name}_windows_shape")
        reshape = ir.Node("", "Reshape", [cols, shape], outputs=[windows], name=f"{name}_windows")
        model.graph.insert_before(node, [im2col, reshape])
        node.replace_input_with(0, windows)  # the ReduceSum itself now sums the window axis
        node.attributes["keepdims"] = ir.AttrInt64("keepdims", 0)
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            old_axes = node.inputs[1]
            node.replace_input_with(1, add_constant(model, np.array([3], np.int64), f"{name}_window_axis"))
            model.drop_if_unused(old_axes)
        else:  # before opset 13: the axes are an attribute
            node.attributes["axes"] = ir.AttrInt64s("axes", [3])
