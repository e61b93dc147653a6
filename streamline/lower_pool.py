"""Lowering MaxPool to FINN's NHWC pooling op.

FINN maps ``MaxPoolNHWC`` to ``StreamingMaxPool`` (kernel equal to stride) or to ``Im2Col`` + ``Pool`` (kernel at
least the stride, padding allowed); both read NHWC data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx_ir as ir

from custom_ops.maxpoolnhwc import pool_output_dim
from custom_ops.registry import QONNX_DOMAIN
from finnlite.core.graphutil import is_standard_domain, take_over
from finnlite.core.passes import Miss, Rule, register_pass
from streamline.lower_common import TO_NCHW, TO_NHWC, attr, ensure_custom_domain, new_value, shape_of

if TYPE_CHECKING:
    from finnlite.core.model import Model

NHWC = ["N", "H", "W", "C"]
NCHW = ["N", "C", "H", "W"]


@dataclass(frozen=True)
class MaxPoolMatch:
    """A match of MakeMaxPoolNHWC: the MaxPool ``node``, its input's static NCHW ``shape`` and its attributes."""

    node: ir.Node
    shape: tuple[int, int, int, int]
    kernel: list[int]
    strides: list[int]
    pads: list[int]
    ceil_mode: int


@register_pass(group="lower")
class MakeMaxPoolNHWC(Rule):
    """MaxPool(x)  →  Transpose(NCHW→NHWC) → MaxPoolNHWC → Transpose(NHWC→NCHW).

    Pattern: a 2-D MaxPool (4-D input with a static shape) whose Indices output is unused. Conditions: dilations 1
    (MaxPoolNHWC has none), ``auto_pad`` NOTSET or VALID, padding smaller than the kernel (as ONNX requires).
    Algebra: max pooling acts on each channel's H×W plane alone, so pooling the NHWC transpose with the same
    kernel, strides, pads and ceil_mode and transposing back gives the same tensor, padded positions taking no part
    in either. FINN's rule of this name swaps a MaxPool with an adjacent Transpose; here the Transposes are always
    inserted and ConvertToNHWC (or AbsorbConsecutiveTransposes) removes them, which has the same end result and
    also covers a MaxPool with no Transpose next to it. The pooled tensors keep the input's ``finn_datatype``."""

    op_types = ("MaxPool",)
    pure_layout = True  # moves data only: verified by a structural proof (verify.layout_proof)

    def match(self, model: "Model", node: ir.Node) -> MaxPoolMatch | Miss | None:
        if not is_standard_domain(node.domain):
            return None
        if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
            return self.miss(node, "the Indices output is used")
        x_shape = shape_of(model, node.inputs[0])
        if x_shape is None or len(x_shape) != 4:
            return self.miss(node, "the input shape is not static and 4-D")
        kernel = [int(k) for k in attr(node, "kernel_shape", [])]
        if len(kernel) != 2:
            return self.miss(node, "kernel_shape is not 2-D")
        if any(int(d) != 1 for d in attr(node, "dilations", [1, 1])):
            return self.miss(node, "dilated max pooling has no NHWC op")
        if str(attr(node, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID", ""):
            return self.miss(node, "auto_pad SAME_* is not supported")
        pads = [int(p) for p in attr(node, "pads", [0, 0, 0, 0])]
        if str(attr(node, "auto_pad", "NOTSET")) == "VALID":
            pads = [0, 0, 0, 0]
        if max(pads[0], pads[2]) >= kernel[0] or max(pads[1], pads[3]) >= kernel[1]:
            return self.miss(node, "padding is not smaller than the kernel")
        strides = [int(s) for s in attr(node, "strides", [1, 1])]
        return MaxPoolMatch(node, x_shape, kernel, strides, pads, int(attr(node, "ceil_mode", 0)))

    def rewrite(self, model: "Model", match: MaxPoolMatch) -> None:
        node, (n, c, h, w), kernel, strides, pads = match.node, match.shape, match.kernel, match.strides, match.pads
        ceil_mode = match.ceil_mode
        ensure_custom_domain(model)
        x, y = node.inputs[0], node.outputs[0]
        name = node.name or "MaxPool"
        oh = pool_output_dim(h, kernel[0], strides[0], pads[0], pads[2], bool(ceil_mode))
        ow = pool_output_dim(w, kernel[1], strides[1], pads[1], pads[3], bool(ceil_mode))
        dt = model.get_tensor_datatype(x.name) if model.has_tensor_datatype(x.name) else None
        x_nhwc = new_value(model, f"{name}_in_nhwc", (n, h, w, c), dt, NHWC)
        y_nhwc = new_value(model, f"{name}_out_nhwc", (n, oh, ow, c), dt, NHWC)
        y_new = new_value(model, f"{name}_out", (n, c, oh, ow), dt, NCHW)
        nodes = [
            ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", list(TO_NHWC))], outputs=[x_nhwc],
                    name=f"{name}_transpose_in"),
            ir.Node(QONNX_DOMAIN, "MaxPoolNHWC", [x_nhwc], attributes=[
                ir.AttrInt64s("kernel_shape", kernel), ir.AttrInt64s("strides", strides), ir.AttrInt64s("pads", pads),
                ir.AttrInt64("ceil_mode", ceil_mode)], outputs=[y_nhwc], name=f"{name}_nhwc"),
            ir.Node("", "Transpose", [y_nhwc], attributes=[ir.AttrInt64s("perm", list(TO_NCHW))], outputs=[y_new],
                    name=f"{name}_transpose_out"),
        ]
        model.graph.insert_after(node, nodes)
        take_over(model, y, y_new)
        model.remove_node(node)
