"""MaxPoolNHWC: ONNX MaxPool over an NHWC image (FINN's layout after lowering).

Input ``x`` of shape ``(N, H, W, C)``. Attributes (qonnx's, with the meaning of ONNX MaxPool's): ``kernel_shape``
[kh, kw], ``strides`` [sh, sw], ``pads`` [top, left, bottom, right] (all required, as in qonnx) and ``ceil_mode``
(0/1, default 0). Each output element is the maximum of its window; padded positions take no part (they act as
-inf), and padding must be smaller than the kernel along its axis, as ONNX requires.

Output size along an axis, as ONNX and onnxruntime define it (qonnx runs the op through onnxruntime)::

    floor((H + top + bottom - kh) / sh) + 1               ceil_mode = 0
    ceil((H + top + bottom - kh) / sh) + 1                ceil_mode = 1, less one if the last window would start
                                                          beyond the top padding and the image (in the bottom pad)

Two corner cases follow numpy, not onnxruntime (whose result there depends on its code path): a NaN in a window
propagates, and a window of only -inf and padding gives -inf (onnxruntime may give the lowest finite float).

Output datatype: the input's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import Shape, flag_attr, ints_attr, known_int, sliding_windows
from custom_ops.registry import register
from finnlite.core.datatypes import BaseDataType, DataType


def pool_output_dim(size: int, kernel: int, stride: int, pad_begin: int = 0, pad_end: int = 0,
                    ceil_mode: bool = False) -> int:
    """The output size of a pooling along one axis (module docstring)."""
    span = size + pad_begin + pad_end - kernel
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def _lowest(dtype: np.dtype) -> float | int:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def maxpool_nhwc(x: np.ndarray, kernel_shape: Sequence[int], strides: Sequence[int],
                 pads: Sequence[int] = (0, 0, 0, 0), ceil_mode: bool = False) -> np.ndarray:
    """Max pooling of the NHWC image ``x`` (module docstring)."""
    x = np.asarray(x)
    top, left, bottom, right = pads
    out_h = pool_output_dim(x.shape[1], kernel_shape[0], strides[0], top, bottom, ceil_mode)
    out_w = pool_output_dim(x.shape[2], kernel_shape[1], strides[1], left, right, ceil_mode)
    # pad so that every window lies inside: the given padding, and in ceil mode what the last window overhangs
    bottom = max(bottom, (out_h - 1) * strides[0] + kernel_shape[0] - x.shape[1] - top)
    right = max(right, (out_w - 1) * strides[1] + kernel_shape[1] - x.shape[2] - left)
    if top or left or bottom or right:
        x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), mode="constant",
                   constant_values=_lowest(x.dtype))
    windows = sliding_windows(x, kernel_shape, axes=(1, 2), strides=strides)[:, :out_h, :out_w]
    return windows.max(axis=(-2, -1))


@register
class MaxPoolNHWC(CustomOp):
    """Max pooling in NHWC layout (module docstring)."""

    op_type = "MaxPoolNHWC"
    attr_spec = {
        "kernel_shape": ("ints", True, []),
        "pads": ("ints", True, []),
        "strides": ("ints", True, []),
        "ceil_mode": ("i", False, 0),
    }
    num_inputs = (1, 1)

    def validate_attrs(self) -> None:
        self.kernel_shape = ints_attr(self, "kernel_shape", 2, 1)
        self.strides = ints_attr(self, "strides", 2, 1)
        self.pads = ints_attr(self, "pads", 4, 0)
        self.ceil_mode = flag_attr(self, "ceil_mode")
        top, left, bottom, right = self.pads
        kh, kw = self.kernel_shape
        if max(top, bottom) >= kh or max(left, right) >= kw:
            raise self.fail(f"padding {self.pads} must be smaller than the kernel {self.kernel_shape}")

    def output_shape(self, shape: Sequence) -> tuple:
        """The output shape for the NHWC input ``shape`` (symbolic or unknown dimensions stay unknown)."""
        if len(shape) != 4:
            raise self.fail(f"the input must be NHWC (rank 4), got shape {tuple(shape)}")
        n, h, w, c = shape
        top, left, bottom, right = self.pads
        out = [n]
        for name, size, k, s, pb, pe in (("H", h, self.kernel_shape[0], self.strides[0], top, bottom),
                                         ("W", w, self.kernel_shape[1], self.strides[1], left, right)):
            size = known_int(size)
            if size is None:
                out.append(None)
                continue
            dim = pool_output_dim(size, k, s, pb, pe, self.ceil_mode)
            if dim < 1:
                raise self.fail(f"the kernel {k} does not fit input {name} {size} with padding {pb}+{pe}")
            out.append(dim)
        out.append(c)
        return tuple(out)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.check_num_inputs(len(inputs))
        x = np.asarray(inputs[0])
        self.output_shape(x.shape)
        return [maxpool_nhwc(x, self.kernel_shape, self.strides, self.pads, self.ceil_mode)]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        return [None if shapes[0] is None else self.output_shape(shapes[0])]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.check_num_inputs(len(dtypes))
        return [dtypes[0] if dtypes[0] is not None else DataType["FLOAT32"]]
