"""Im2Col: the sliding windows of a 2D convolution over an NHWC image, one window per output pixel.

Input ``x`` of shape ``(N, H, W, C)``. Attributes (qonnx's): ``kernel_size`` [kh, kw] and ``stride`` [sh, sw]
(required), ``input_shape`` (required, the NHWC shape as a string such as ``"(1, 8, 8, 3)"``), ``pad_amount``
[top, left, bottom, right] (default zeros), ``pad_value`` (default 0, an integer), ``dilations`` [dh, dw] (default
[1, 1]) and ``depthwise`` (0/1, a hint for FINN's hardware mapping that does not change the result).

The image is padded with ``pad_value``, and for output pixel ``(i, j)`` the window elements
``xp[n, i*sh + a*dh, j*sw + b*dw, c]`` are laid out in (a, b, c) order along the last axis, so the output has shape
``(N, OH, OW, kh*kw*C)`` with ``OH = floor((H + top + bottom - dh*(kh - 1) - 1) / sh) + 1`` (likewise ``OW``).
That is the order a (kh, kw, C, out) reshape of a convolution's weights expects. As in qonnx, a spatial dimension
of size 1 admits only a kernel of 1 and no padding along it. Each sample of a batch is treated on its own (qonnx's
kernel interleaves the samples of a batch larger than 1; for batch 1 the two agree).

Output datatype: the input's (qonnx); where padding is inserted the input datatype must hold ``pad_value``.
Shape inference uses the input's shape where known, else the ``input_shape`` attribute (as qonnx does).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import Shape, flag_attr, int_attr, ints_attr, known_int, parse_shape_string, sliding_windows
from custom_ops.registry import register
from finnlite.core.datatypes import BaseDataType, DataType


def conv_output_dim(size: int, kernel: int, stride: int, total_pad: int = 0, dilation: int = 1) -> int:
    """The output size of a convolution along one axis (``total_pad`` counts both sides)."""
    return (size + total_pad - dilation * (kernel - 1) - 1) // stride + 1


def im2col_nhwc(x: np.ndarray, kernel_size: Sequence[int], stride: Sequence[int],
                pad_amount: Sequence[int] = (0, 0, 0, 0), pad_value: float = 0,
                dilations: Sequence[int] = (1, 1)) -> np.ndarray:
    """The Im2Col of the NHWC image ``x`` (module docstring)."""
    x = np.asarray(x)
    top, left, bottom, right = pad_amount
    if any(pad_amount):
        x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), mode="constant", constant_values=pad_value)
    windows = sliding_windows(x, kernel_size, axes=(1, 2), strides=stride, dilations=dilations)
    n, oh, ow, c, kh, kw = windows.shape
    return windows.transpose(0, 1, 2, 4, 5, 3).reshape(n, oh, ow, kh * kw * c)


@register
class Im2Col(CustomOp):
    """Convolution windows of an NHWC image (module docstring)."""

    op_type = "Im2Col"
    attr_spec = {
        "stride": ("ints", True, []),
        "kernel_size": ("ints", True, []),
        "input_shape": ("s", True, ""),
        "pad_amount": ("ints", False, [0, 0, 0, 0]),
        "pad_value": ("i", False, 0),
        "depthwise": ("i", False, 0),
        "dilations": ("ints", False, [1, 1]),
    }
    num_inputs = (1, 1)

    def validate_attrs(self) -> None:
        self.kernel_size = ints_attr(self, "kernel_size", 2, 1)
        self.stride = ints_attr(self, "stride", 2, 1)
        self.dilations = ints_attr(self, "dilations", 2, 1)
        self.pad_amount = ints_attr(self, "pad_amount", 4, 0)
        self.pad_value = int_attr(self, "pad_value", -(1 << 63))
        flag_attr(self, "depthwise")
        self.input_shape = parse_shape_string(self, self.attrs["input_shape"], "input_shape")
        if len(self.input_shape) != 4:
            raise self.fail(f"attribute 'input_shape' must be an NHWC shape, got {self.attrs['input_shape']!r}")

    def output_shape(self, shape: Sequence) -> tuple:
        """The output shape for the NHWC input ``shape`` (symbolic or unknown dimensions stay unknown)."""
        if len(shape) != 4:
            raise self.fail(f"the input must be NHWC (rank 4), got shape {tuple(shape)}")
        n, h, w, c = shape
        for name, actual, expected in zip("HWC", (h, w, c), self.input_shape[1:]):
            if known_int(actual) is not None and actual != expected:
                raise self.fail(f"input {name} is {actual}, attribute input_shape says {self.input_shape}")
        (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.stride, self.dilations
        top, left, bottom, right = self.pad_amount
        out = [n]
        for name, size, k, s, pad, d in (("H", h, kh, sh, top + bottom, dh), ("W", w, kw, sw, left + right, dw)):
            size = known_int(size)
            if size is None:
                out.append(None)
                continue
            if size == 1 and (k != 1 or pad != 0):
                raise self.fail(f"input {name} is 1, which admits only a kernel of 1 and no padding along it")
            dim = conv_output_dim(size, k, s, pad, d)
            if dim < 1:
                raise self.fail(f"the kernel does not fit: input {name} {size} with padding {pad}, kernel {k}, "
                                f"dilation {d}")
            out.append(dim)
        k_c = known_int(c)
        out.append(None if k_c is None else kh * kw * k_c)
        return tuple(out)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.check_num_inputs(len(inputs))
        x = np.asarray(inputs[0])
        self.output_shape(x.shape)
        return [im2col_nhwc(x, self.kernel_size, self.stride, self.pad_amount, self.pad_value, self.dilations)]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        shape = shapes[0] if shapes[0] is not None else self.input_shape
        return [self.output_shape(shape)]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.check_num_inputs(len(dtypes))
        dt = dtypes[0]
        if dt is not None and any(self.pad_amount) and not dt.allowed(self.pad_value):
            raise self.fail(f"the input datatype {dt.name} cannot hold the pad value {self.pad_value}")
        return [dt if dt is not None else DataType["FLOAT32"]]
