"""Lowering convolutions to FINN's Im2Col + MatMul form.

FINN maps a convolution to a sliding-window generator (``ConvolutionInputGenerator``, from an ``Im2Col`` node in
NHWC layout, with ``FMPadding`` for its ``pad_amount``) followed by a matrix-vector unit (``MVAU``, from a
``MatMul`` whose weight is a ``[K, N]`` integer initializer) or, for a depthwise convolution, a vector-vector unit
(``VVAU``, from a ``MatMul`` whose weight carries the ``tensor_sparsity`` annotation ``{"dw": {"kernel_shape":
[kh, kw]}}`` and is the block-sparse ``[kh·kw·C, C]`` matrix FINN folds back into ``[C, 1, kh, kw]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.im2col import conv_output_dim
from custom_ops.registry import QONNX_DOMAIN
from finnlite.core.datatypes import is_integer_type
from finnlite.core.graphutil import (add_constant, channel_order, ensure_custom_domain, is_standard_domain,
                                     set_channel_order, take_over)
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from finnlite.core.tensors import DepthwiseWeight, depthwise_matrix
from streamline.lower_common import (TO_NCHW, TO_NHWC, annotated_or_values, attr, fitting_datatype, new_value,
                                     set_tensor_sparsity, shape_of, union_datatype)

if TYPE_CHECKING:
    from finnlite.core.model import Model

NHWC = ["N", "H", "W", "C"]
NCHW = ["N", "C", "H", "W"]


def conv_weight_matrix(w: np.ndarray, group: int) -> np.ndarray:
    """The ``[kh·kw·Cin, Cout]`` MatMul weight of a Conv weight ``w`` of shape ``[Cout, Cin/group, kh, kw]``.

    Row ``(a·kw + b)·Cin + c`` holds the weights of input channel ``c`` at kernel position ``(a, b)``: the order in
    which :class:`custom_ops.im2col.Im2Col` lays out a window (and finn-hlslib's sliding window generator streams
    it). With ``group > 1`` the weight is first made dense and block-diagonal (zero where an output channel does not
    see an input channel); for a depthwise convolution that is the block-sparse matrix FINN's VVAU expects."""
    cout, cin_g, kh, kw = w.shape
    if group == 1:
        return np.ascontiguousarray(w.transpose(2, 3, 1, 0)).reshape(kh * kw * cin_g, cout)  # one copy
    # written straight into the [kh, kw, Cin, Cout] layout: no dense [Cout, Cin, kh, kw] copy to transpose
    og, cin = cout // group, cin_g * group
    if cin_g == 1 and og == 1:  # depthwise: channel c feeds output c only
        return depthwise_matrix(w[:, 0])
    mat = np.zeros((kh, kw, cin, cout), dtype=w.dtype)
    for g in range(group):
        mat[:, :, g * cin_g:(g + 1) * cin_g, g * og:(g + 1) * og] = w[g * og:(g + 1) * og].transpose(2, 3, 1, 0)
    return mat.reshape(kh * kw * cin, cout)


def explicit_pads(auto_pad: str, pads: list[int], in_hw: tuple[int, int], kernel: list[int], strides: list[int],
                  dilations: list[int]) -> list[int] | None:
    """``[top, left, bottom, right]`` for a Conv's ``auto_pad``/``pads`` (None for an unknown ``auto_pad``)."""
    if auto_pad in ("NOTSET", ""):
        return list(pads) if pads else [0, 0, 0, 0]
    if auto_pad == "VALID":
        return [0, 0, 0, 0]
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return None
    begin, end = [], []
    for size, k, s, d in zip(in_hw, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin + end


@dataclass(frozen=True, slots=True, eq=False)
class _ConvMatch:
    node: ir.Node
    weight: np.ndarray
    group: int
    depthwise: bool
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int]


@register_pass(group="lower")
class LowerConvsToMatMul(Rule):
    """Conv(x, W)  →  Transpose(NCHW→NHWC) → Im2Col → MatMul(·, W') → Transpose(NHWC→NCHW).

    Pattern: a 2-D Conv (4-D input, constant 4-D weight ``[Cout, Cin/g, kh, kw]``) without a bias input (the tidy
    stage's ConvBiasToAdd moves a bias to an Add). Conditions: static shapes; ``group`` is 1, or the convolution is
    depthwise (``group == Cin == Cout``), or ``dense_grouped`` is set (the default: any other grouping — groups 2
    or 4, a channel multiplier — becomes one MatMul with a block-diagonal weight, zero where an output channel does
    not see an input channel, which FINN's MVAU computes as any dense layer; FINN has no grouped layer; with
    ``dense_grouped=False`` such a Conv stays and the miss is recorded); along a spatial dimension of size 1 only a
    kernel of 1 and no padding (Im2Col's limit).

    Algebra: ``y[n, o, i, j] = Σ_{a,b,c} xp[n, c, i·sh + a·dh, j·sw + b·dw] · W[o, c, a, b]`` with ``xp`` the
    zero-padded input. Im2Col (``pad_amount`` = the Conv's pads, ``pad_value`` 0) lays the window of output pixel
    (i, j) out in (a, b, c) order, so the product with ``W'[(a·kw + b)·Cin + c, o] = W[o, c, a, b]``
    (:func:`conv_weight_matrix`) is ``y`` in NHWC; the Transposes keep the NCHW interface (ConvertToNHWC removes
    them). Exact on integer values whose partial sums stay below 2^24 (float32 adds them exactly in any order). A 1×1
    convolution with stride 1 and no padding needs no Im2Col. A depthwise convolution gets ``Im2Col(depthwise=1)``,
    the block-sparse weight and its ``tensor_sparsity`` annotation, as FINN's InferVectorVectorActivation requires;
    the block-sparse weight is a :class:`~finnlite.core.tensors.DepthwiseWeight` (its kernel in memory, the dense matrix
    wherever it is read).

    Annotations: the weight keeps its ``finn_datatype`` (widened if the zeros of a sparse matrix do not fit it,
    e.g. BIPOLAR); Im2Col's output has the input's datatype (with 0 added when padding), the MatMul output the
    Conv output's; every new 4-D tensor has its ``tensor_layout``."""

    op_types = ("Conv",)

    def __init__(self, dense_grouped: bool = True, max_rewrites: int | None = None) -> None:
        super().__init__(max_rewrites)
        self.dense_grouped = dense_grouped

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain):
            return None
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            return self.miss(node, "the Conv has a bias input (ConvBiasToAdd moves it to an Add)")
        w = const_array(node.inputs[1])
        if w is None:
            return self.miss(node, "the weight is not a constant")
        if w.ndim != 4:
            return self.miss(node, f"only 2-D convolutions are lowered (weight of rank {w.ndim})")
        x_shape, y_shape = shape_of(model, node.inputs[0]), shape_of(model, node.outputs[0])
        if x_shape is None or y_shape is None or len(x_shape) != 4:
            return self.miss(node, "the input or output shape is not static and 4-D")
        cout, cin_g, kh, kw = w.shape
        cin = x_shape[1]
        group = int(attr(node, "group", 1))
        depthwise = group > 1 and group == cin == cout and cin_g == 1
        if group > 1 and not depthwise and not self.dense_grouped:
            return self.miss(node, f"grouped convolution (group={group}) has no FINN layer and dense_grouped is "
                                   "off (it lowers it to a block-diagonal MatMul)")
        kernel = [int(k) for k in attr(node, "kernel_shape", [kh, kw])]
        strides = [int(s) for s in attr(node, "strides", [1, 1])]
        dilations = [int(d) for d in attr(node, "dilations", [1, 1])]
        pads = explicit_pads(str(attr(node, "auto_pad", "NOTSET")), attr(node, "pads", []), x_shape[2:], kernel,
                             strides, dilations)
        if pads is None or len(pads) != 4 or kernel != [kh, kw]:
            return self.miss(node, "unsupported auto_pad or kernel_shape")
        for size, k, before, after in zip(x_shape[2:], kernel, pads[:2], pads[2:]):
            if size == 1 and (k != 1 or before or after):
                return self.miss(node, "Im2Col admits only a kernel of 1 and no padding along a spatial size of 1")
        expected = [conv_output_dim(s, k, st, p0 + p1, d) for s, k, st, p0, p1, d in
                    zip(x_shape[2:], kernel, strides, pads[:2], pads[2:], dilations)]
        if list(y_shape) != [x_shape[0], cout, *expected]:
            return self.miss(node, f"output shape {y_shape} does not match the Conv's attributes")
        return _ConvMatch(node, w, group, depthwise, x_shape, y_shape, kernel, strides, dilations, pads)

    def rewrite(self, model: "Model", m: _ConvMatch) -> None:
        ensure_custom_domain(model)
        node, (n, c, h, w), (_, cout, oh, ow) = m.node, m.x_shape, m.y_shape
        x, y = node.inputs[0], node.outputs[0]
        name = node.name or "Conv"
        in_dt = model.get_tensor_datatype(x.name) if model.has_tensor_datatype(x.name) else None
        x_nhwc = new_value(model, f"{name}_in_nhwc", (n, h, w, c), in_dt, NHWC)
        nodes = [ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", list(TO_NHWC))], outputs=[x_nhwc],
                         name=f"{name}_transpose_in")]
        mm_in = x_nhwc
        kh, kw = m.kernel
        if (kh, kw) != (1, 1) or any(m.pads) or m.strides != [1, 1]:
            cols_dt = in_dt
            if in_dt is not None and any(m.pads) and is_integer_type(in_dt) and not in_dt.allowed(0):
                cols_dt = union_datatype(in_dt, 0, 0)
            mm_in = new_value(model, f"{name}_im2col", (n, oh, ow, kh * kw * c), cols_dt, NHWC)
            nodes.append(ir.Node(QONNX_DOMAIN, "Im2Col", [x_nhwc], attributes=[
                ir.AttrInt64s("stride", m.strides), ir.AttrInt64s("kernel_size", m.kernel),
                ir.AttrString("input_shape", f"({n}, {h}, {w}, {c})"), ir.AttrInt64s("pad_amount", m.pads),
                ir.AttrInt64("pad_value", 0), ir.AttrInt64("depthwise", int(m.depthwise)),
                ir.AttrInt64s("dilations", m.dilations)], outputs=[mm_in], name=f"{name}_im2col"))
        if m.depthwise:  # the block-sparse matrix, held as its kernel (finnlite.core.tensors)
            w_mat: Any = DepthwiseWeight(m.weight[:, 0])
            values = w_mat.element_values()
        else:
            w_mat = values = conv_weight_matrix(m.weight, m.group)
        w_dt = fitting_datatype(annotated_or_values(model, node.inputs[1], m.weight), values)
        w_val = add_constant(model, w_mat, f"{name}_W", w_dt)
        if m.depthwise:
            set_tensor_sparsity(w_val, {"dw": {"kernel_shape": [kh, kw]}})
        out_dt = model.get_tensor_datatype(y.name) if model.has_tensor_datatype(y.name) else None
        mm_out = new_value(model, f"{name}_out_nhwc", (n, oh, ow, cout), out_dt, NHWC)
        matmul = ir.Node("", "MatMul", [mm_in, w_val], outputs=[mm_out], name=f"{name}_matmul")
        set_channel_order(matmul, channel_order(node))  # a depthwise layer's kernels reordered by a channel shuffle
        nodes.append(matmul)
        y_new = new_value(model, f"{name}_out", (n, cout, oh, ow), out_dt, NCHW)
        nodes.append(ir.Node("", "Transpose", [mm_out], attributes=[ir.AttrInt64s("perm", list(TO_NCHW))],
                             outputs=[y_new], name=f"{name}_transpose_out"))
        model.graph.insert_after(node, nodes)
        take_over(model, y, y_new)
        weight = node.inputs[1]
        model.remove_node(node)
        model.drop_if_unused(weight)
