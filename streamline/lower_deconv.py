"""Lowering transposed convolutions to FINN's form: zero insertion, sliding windows, a matrix product.

FINN maps a transposed convolution (FINN's ``InferPixelPaddingDeconv``) to ``FMPadding_Pixel`` (zeros between the
input's pixels), a sliding-window generator over that image (``Im2Col`` → ConvolutionInputGenerator, with
``FMPadding`` for its border) and a matrix-vector unit (``MatMul`` → MVAU) with the kernel flipped and its input
and output channels swapped. :class:`LowerConvTransposeToMatMul` writes that form; the Transposes it puts around
it are removed by :class:`~streamline.layout.ConvertToNHWC` like those of a lowered Conv.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.fmpadding_pixel import pixel_padded_dim
from custom_ops.im2col import conv_output_dim
from custom_ops.registry import HW_DOMAIN, QONNX_DOMAIN
from finnlite.core.graphutil import add_constant, ensure_custom_domain, is_standard_domain, take_over
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.lower_common import (TO_NCHW, TO_NHWC, annotated_or_values, attr,
                                     fitting_datatype, new_value, shape_of)
from streamline.lower_conv import NCHW, NHWC, conv_weight_matrix

if TYPE_CHECKING:
    from finnlite.core.model import Model


def deconv_as_conv(w: np.ndarray, pads: list[int], kernel: list[int], dilations: list[int],
                   output_padding: list[int]) -> tuple[np.ndarray, list[int]]:
    """The convolution a transposed convolution is, after zero insertion: its weight ``[Cout, Cin, kh, kw]``
    (``w [Cin, Cout, kh, kw]`` flipped spatially, channels swapped) and its pads ``[top, left, bottom, right]``:
    ``d·(k − 1) − pad_begin`` before and ``d·(k − 1) − pad_end + output_padding`` after each spatial axis."""
    conv_w = np.ascontiguousarray(np.flip(w, axis=(2, 3)).transpose(1, 0, 2, 3))
    n = len(kernel)
    begin = [d * (k - 1) - pads[i] for i, (k, d) in enumerate(zip(kernel, dilations))]
    end = [d * (k - 1) - pads[i + n] + output_padding[i] for i, (k, d) in enumerate(zip(kernel, dilations))]
    return conv_w, begin + end


@dataclass(frozen=True, slots=True, eq=False)
class DeconvMatch:
    """A ConvTranspose ``node`` with its ``weight``, the convolution it is after zero insertion (``conv_weight``,
    ``pads``), its static input and output shapes, ``strides``, ``dilations``, the spatial size after zero insertion
    (``inserted``) and the input datatype ``dt`` (None if not annotated)."""

    node: ir.Node
    weight: np.ndarray
    conv_weight: np.ndarray
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    strides: list[int]
    dilations: list[int]
    pads: list[int]
    inserted: list[int]
    dt: Any


@register_pass(group="lower")
class LowerConvTransposeToMatMul(Rule):
    """ConvTranspose(x, W)  →  Transpose → FMPadding_Pixel → Im2Col → MatMul(·, W') → Transpose.

    Pattern: a 2-D ConvTranspose (4-D input, constant weight ``[Cin, Cout, kh, kw]``, group 1 as in FINN) without a
    bias input (the tidy stage's ConvBiasToAdd moves it to an Add), explicit pads, no ``output_shape``. Algebra:
    ``y[o, i, j] = Σ_{c,a,b} x[c, h, w]·W[c, o, a, b]`` over ``i = h·s − p + a·d``; inserting ``s − 1`` zeros between
    the pixels (``FMPadding_Pixel``) and padding the result by ``d·(k − 1) − p`` before and ``d·(k − 1) − p + op``
    after (Im2Col's ``pad_amount``, ``pad_value`` 0) turns it into the stride-1 convolution with the kernel flipped
    and the channels swapped (:func:`deconv_as_conv`), lowered as any Conv (:mod:`streamline.lower_conv`). Exact on
    integers as a Conv is. Conditions: pads at most ``d·(k − 1)`` (the convolution's pads are not negative); the
    input's datatype holds 0 (integers do, BIPOLAR not). With stride 1 no zeros are inserted; a 1×1 kernel without
    padding needs no Im2Col. FINN's InferPixelPaddingDeconv."""

    op_types = ("ConvTranspose",)
    aliases = ("InferPixelPaddingDeconv",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain):
            return None
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            return self.miss(node, "the ConvTranspose has a bias input (ConvBiasToAdd moves it to an Add)")
        w = const_array(node.inputs[1])
        if w is None or w.ndim != 4:
            return self.miss(node, "only 2-D transposed convolutions with a constant weight are lowered")
        if int(attr(node, "group", 1)) != 1:
            return self.miss(node, "a grouped transposed convolution has no FINN layer (FINN: group 1 only)")
        if attr(node, "output_shape", None) or str(attr(node, "auto_pad", "NOTSET")) not in ("NOTSET", ""):
            return self.miss(node, "output_shape and auto_pad are not supported (explicit pads are)")
        x_shape, y_shape = shape_of(model, node.inputs[0]), shape_of(model, node.outputs[0])
        if x_shape is None or y_shape is None or len(x_shape) != 4:
            return self.miss(node, "the input or output shape is not static and 4-D")
        dt = model.get_tensor_datatype(node.inputs[0].name) if model.has_tensor_datatype(node.inputs[0].name) \
            else None
        if dt is not None and not dt.allowed(0):
            return self.miss(node, f"the input datatype {dt.name} cannot hold the inserted zeros")
        kernel = list(w.shape[2:])
        strides = [int(s) for s in attr(node, "strides", [1, 1])]
        dilations = [int(d) for d in attr(node, "dilations", [1, 1])]
        pads = [int(p) for p in attr(node, "pads", [0, 0, 0, 0])]
        out_pad = [int(p) for p in attr(node, "output_padding", [0, 0])]
        conv_w, conv_pads = deconv_as_conv(w, pads, kernel, dilations, out_pad)
        if any(p < 0 for p in conv_pads):
            return self.miss(node, "pads larger than the dilated kernel (a cropping deconvolution)")
        inserted = [pixel_padded_dim(s, st) for s, st in zip(x_shape[2:], strides)]
        for size, k, before, after in zip(inserted, kernel, conv_pads[:2], conv_pads[2:]):
            if size == 1 and (k != 1 or before or after):
                return self.miss(node, "Im2Col admits only a kernel of 1 and no padding along a spatial size of 1")
        expected = [conv_output_dim(s, k, 1, p0 + p1, d) for s, k, p0, p1, d in
                    zip(inserted, kernel, conv_pads[:2], conv_pads[2:], dilations)]
        if list(y_shape) != [x_shape[0], w.shape[1], *expected]:
            return self.miss(node, f"output shape {y_shape} does not match the attributes")
        return DeconvMatch(node, w, conv_w, tuple(x_shape), tuple(y_shape), strides, dilations, conv_pads, inserted,
                           dt)

    def rewrite(self, model: "Model", match: DeconvMatch) -> None:
        node, w, conv_w, dt = match.node, match.weight, match.conv_weight, match.dt
        strides, dilations, pads = match.strides, match.dilations, match.pads
        (n, c, h, wd), (_, cout, oh, ow), (ph, pw) = match.x_shape, match.y_shape, match.inserted
        ensure_custom_domain(model)
        model.graph.opset_imports.setdefault(HW_DOMAIN, 1)
        x, y = node.inputs[0], node.outputs[0]
        name = node.name or "ConvTranspose"
        x_nhwc = new_value(model, f"{name}_in_nhwc", (n, h, wd, c), dt, NHWC)
        nodes = [ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", list(TO_NHWC))],
                         outputs=[x_nhwc], name=f"{name}_transpose_in")]
        cur = x_nhwc
        if strides != [1, 1]:
            cur = new_value(model, f"{name}_pixel_padded", (n, ph, pw, c), dt, NHWC)
            nodes.append(ir.Node(HW_DOMAIN, "FMPadding_Pixel", [x_nhwc], attributes=[
                ir.AttrInt64s("ImgDim", [h, wd]), ir.AttrInt64s("Stride", strides), ir.AttrInt64("NumChannels", c),
                ir.AttrString("inputDataType", dt.name if dt is not None else "FLOAT32"),
                ir.AttrInt64("SIMD", 1), ir.AttrInt64("numInputVectors", 1),
                ir.AttrString("backend", "fpgadataflow")], outputs=[cur], name=f"{name}_pixel_padding"))
        kh, kw = conv_w.shape[2:]
        if (kh, kw) != (1, 1) or any(pads):
            cols = new_value(model, f"{name}_im2col", (n, oh, ow, kh * kw * c), dt, NHWC)
            nodes.append(ir.Node(QONNX_DOMAIN, "Im2Col", [cur], attributes=[
                ir.AttrInt64s("stride", [1, 1]), ir.AttrInt64s("kernel_size", [kh, kw]),
                ir.AttrString("input_shape", f"({n}, {ph}, {pw}, {c})"), ir.AttrInt64s("pad_amount", pads),
                ir.AttrInt64("pad_value", 0), ir.AttrInt64("depthwise", 0), ir.AttrInt64s("dilations", dilations)],
                outputs=[cols], name=f"{name}_im2col"))
            cur = cols
        matrix = conv_weight_matrix(conv_w, 1)
        w_dt = fitting_datatype(annotated_or_values(model, node.inputs[1], w), matrix)
        w_val = add_constant(model, matrix, f"{name}_W", w_dt)
        out_dt = model.get_tensor_datatype(y.name) if model.has_tensor_datatype(y.name) else None
        mm_out = new_value(model, f"{name}_out_nhwc", (n, oh, ow, cout), out_dt, NHWC)
        nodes.append(ir.Node("", "MatMul", [cur, w_val], outputs=[mm_out], name=f"{name}_matmul"))
        y_new = new_value(model, f"{name}_out", (n, cout, oh, ow), out_dt, NCHW)
        nodes.append(ir.Node("", "Transpose", [mm_out], attributes=[ir.AttrInt64s("perm", list(TO_NCHW))],
                             outputs=[y_new], name=f"{name}_transpose_out"))
        model.graph.insert_after(node, nodes)
        take_over(model, y, y_new)
        weight = node.inputs[1]
        model.remove_node(node)
        model.drop_if_unused(weight)
