"""Lowering MaxPool and AveragePool to FINN's NHWC pooling forms.

FINN maps ``MaxPoolNHWC`` to ``StreamingMaxPool`` (kernel equal to stride) or to ``Im2Col`` + ``Pool`` (kernel at
least the stride, padding allowed); both read NHWC data. An average of integers becomes FINN's lowered pooling,
``Im2Col → Reshape → ReduceSum`` (an accumulating ``Pool``), and a scale (:class:`LowerAveragePool`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.maxpoolnhwc import pool_output_dim
from custom_ops.registry import QONNX_DOMAIN
from finnlite.core.datatypes import is_integer_type
from finnlite.core.graphutil import add_constant, ensure_custom_domain, is_standard_domain, take_over
from finnlite.core.passes import Miss, Rule, register_pass
from streamline.exact import set_exact
from streamline.lower_common import TO_NCHW, TO_NHWC, attr, new_value, shape_of

if TYPE_CHECKING:
    from finnlite.core.model import Model

NHWC = ["N", "H", "W", "C"]
NCHW = ["N", "C", "H", "W"]


@dataclass(frozen=True, slots=True, eq=False)
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


@dataclass(frozen=True, slots=True, eq=False)
class PoolWindows:
    """A 2-D pool ``node`` of an integer tensor (datatype ``dt``) with the static input ``shape`` and its
    ``kernel``, ``strides`` and explicit ``pads``."""

    node: ir.Node
    shape: tuple[int, ...]
    kernel: list[int]
    strides: list[int]
    pads: list[int]
    dt: Any


@register_pass(group="lower")
class LowerAveragePool(Rule):
    """AveragePool(x)  →  Transpose → Im2Col → Reshape → ReduceSum → Mul(1/(kh·kw)) → Transpose, for an integer x.

    Pattern: a 2-D AveragePool of a 4-D integer tensor (datatype annotation) with a static shape: a float average
    between quantizers with a kernel smaller than the map. Algebra: the average of a window is its sum times
    ``1/(kh·kw)`` when every window has ``kh·kw`` elements — no padding, or padding counted (``count_include_pad``,
    the zeros then sum as zeros); ``Im2Col`` (``depthwise=1``, the pads with ``pad_value`` 0) lays out each window
    as ``[kh·kw, C]`` with the channel fastest, the Reshape exposes that axis and ``ReduceSum`` adds it: integer sums,
    exact in float32 as the original's were. The Mul is a scale like any other, moved on into the next thresholds
    by the restreamline stage. This is FINN's lowered pooling (``Im2Col → Reshape → ReduceSum(axes=[-2])``), which
    its ``InferPoolFromReduce`` maps to a sliding window and an accumulating ``Pool``. Conditions: ``ceil_mode`` 0,
    dilations 1, explicit pads or VALID; with pads, ``count_include_pad`` (else the border's divisors differ)."""

    op_types = ("AveragePool",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain):
            return None
        x = node.inputs[0]
        dt = model.get_tensor_datatype(x.name) if model.has_tensor_datatype(x.name) else None
        if dt is None or not is_integer_type(dt):
            return None  # a float average stays one (a float input layer)
        shape = shape_of(model, x)
        if shape is None or len(shape) != 4:
            return self.miss(node, "the input shape is not static and 4-D")
        kernel = [int(k) for k in attr(node, "kernel_shape", [])]
        strides = [int(s) for s in attr(node, "strides", [1, 1])]
        auto_pad = str(attr(node, "auto_pad", "NOTSET") or "NOTSET")
        pads = [0, 0, 0, 0] if auto_pad == "VALID" else [int(p) for p in attr(node, "pads", [0, 0, 0, 0])]
        if len(kernel) != 2 or int(attr(node, "ceil_mode", 0)) or auto_pad not in ("NOTSET", "VALID") or \
                any(int(d) != 1 for d in attr(node, "dilations", [1, 1])):
            return self.miss(node, "only 2-D average pools without ceil_mode, auto_pad SAME or dilations are lowered")
        if any(pads) and not int(attr(node, "count_include_pad", 0)):
            return self.miss(node, "a padded average that does not count the padding divides the border by fewer "
                                   "elements: not one scale")
        if any(pads) and not dt.allowed(0):
            return self.miss(node, f"the input datatype {dt.name} cannot hold the zero padding")
        return PoolWindows(node, tuple(shape), kernel, strides, pads, dt)

    def rewrite(self, model: "Model", match: PoolWindows) -> None:
        node, kernel, strides, pads, dt = match.node, match.kernel, match.strides, match.pads, match.dt
        n, c, h, w = match.shape
        ensure_custom_domain(model)
        x, y = node.inputs[0], node.outputs[0]
        name = node.name or "AveragePool"
        kh, kw = kernel
        oh = pool_output_dim(h, kh, strides[0], pads[0], pads[2], False)
        ow = pool_output_dim(w, kw, strides[1], pads[1], pads[3], False)
        cols_dt = dt if dt.allowed(0) or not any(pads) else None
        x_nhwc = new_value(model, f"{name}_in_nhwc", (n, h, w, c), dt, NHWC)
        cols = new_value(model, f"{name}_im2col", (n, oh, ow, kh * kw * c), cols_dt, NHWC)
        windows = new_value(model, f"{name}_windows", (n, oh, ow, kh * kw, c), cols_dt)
        sums = new_value(model, f"{name}_sum_nhwc", (n, oh, ow, c), None, NHWC)
        avg = new_value(model, f"{name}_avg_nhwc", (n, oh, ow, c), None, NHWC)
        y_new = new_value(model, f"{name}_out", (n, c, oh, ow), None, NCHW)
        shape = add_constant(model, np.array([n, oh, ow, kh * kw, c], np.int64), f"{name}_windows_shape")
        axis = add_constant(model, np.array([3], np.int64), f"{name}_window_axis")
        scale = Fraction(1, kh * kw)
        k = add_constant(model, np.array(float(scale), np.float32), f"{name}_scale")
        mul = ir.Node("", "Mul", [sums, k], outputs=[avg], name=f"{name}_scale")
        set_exact(mul, np.array(scale, dtype=object))
        nodes = [
            ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", list(TO_NHWC))], outputs=[x_nhwc],
                    name=f"{name}_transpose_in"),
            ir.Node(QONNX_DOMAIN, "Im2Col", [x_nhwc], attributes=[
                ir.AttrInt64s("stride", strides), ir.AttrInt64s("kernel_size", kernel),
                ir.AttrString("input_shape", f"({n}, {h}, {w}, {c})"), ir.AttrInt64s("pad_amount", pads),
                ir.AttrInt64("pad_value", 0), ir.AttrInt64("depthwise", 1), ir.AttrInt64s("dilations", [1, 1])],
                outputs=[cols], name=f"{name}_im2col"),
            ir.Node("", "Reshape", [cols, shape], outputs=[windows], name=f"{name}_windows"),
            ir.Node("", "ReduceSum", [windows, axis], attributes=[ir.AttrInt64("keepdims", 0)], outputs=[sums],
                    name=f"{name}_sum"),
            mul,
            ir.Node("", "Transpose", [avg], attributes=[ir.AttrInt64s("perm", list(TO_NCHW))], outputs=[y_new],
                    name=f"{name}_transpose_out"),
        ]
        model.graph.insert_after(node, nodes)
        take_over(model, y, y_new)
        model.remove_node(node)
