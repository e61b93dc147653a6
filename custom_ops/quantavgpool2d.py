"""QuantAvgPool2d: Brevitas' quantized average pooling, a window sum followed by a right shift.

Input ``x``: integers (stored as floats) in ``NCHW`` or ``NHWC`` layout (attribute ``data_layout``, default
``NCHW``). Attributes (qonnx's, all but the layout required): ``kernel`` k and ``stride`` s (square, no padding),
``ibits`` and ``obits`` (input and output bitwidths), ``signed`` (0/1)::

    y = floor(round(sum of the k x k window) / 2^shift)     shift = max(0, accumulator_bits - obits)

where ``accumulator_bits`` is the bit length of ``(2^ibits - 1) * k^2`` (qonnx's formula, used for signed inputs
too) and the division is an arithmetic right shift. qonnx obtains the sum as onnxruntime's float32 average times
``k^2``, rounded; on integer inputs that equals the exact sum computed here. The output is float32, of spatial size
``floor((H - k) / s) + 1`` (likewise W).

Output datatype, as qonnx infers it: INT<obits> if signed else UINT<obits>; ``obits`` must lie in 2..32.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import Shape, flag_attr, int_attr, known_int, sliding_windows
from custom_ops.registry import register
from finnlite.core.datatypes import BaseDataType, DataType

_SPATIAL_AXES = {"NCHW": (2, 3), "NHWC": (1, 2)}


def avgpool_shift(kernel: int, ibits: int, obits: int) -> int:
    """The right shift that brings the window sum of ``kernel``² ``ibits``-bit values to ``obits`` bits."""
    accumulator_bits = ((2 ** ibits - 1) * kernel * kernel).bit_length()
    return max(accumulator_bits - obits, 0)


def quant_avgpool2d(x: np.ndarray, kernel: int, stride: int, ibits: int, obits: int,
                    data_layout: str = "NCHW") -> np.ndarray:
    """QuantAvgPool2d of ``x`` (module docstring), as float32."""
    x = np.asarray(x)
    axes = _SPATIAL_AXES[data_layout]
    windows = sliding_windows(x, (kernel, kernel), axes=axes, strides=(stride, stride))
    sums = np.round(windows.sum(axis=(-2, -1), dtype=np.float64))
    shifted = np.right_shift(sums.astype(np.int64), avgpool_shift(kernel, ibits, obits))
    return shifted.astype(np.float32)


@register
class QuantAvgPool2d(CustomOp):
    """Quantized average pooling (module docstring)."""

    op_type = "QuantAvgPool2d"
    attr_spec = {
        "stride": ("i", True, 1),
        "kernel": ("i", True, 1),
        "ibits": ("i", True, 1),
        "obits": ("i", True, 1),
        "signed": ("i", True, 0),
        "data_layout": ("s", False, "NCHW"),
    }
    num_inputs = (1, 1)

    def validate_attrs(self) -> None:
        self.kernel = int_attr(self, "kernel", 1)
        self.stride = int_attr(self, "stride", 1)
        self.ibits = int_attr(self, "ibits", 1)
        self.obits = int_attr(self, "obits", 1)
        self.signed = flag_attr(self, "signed")
        self.data_layout = self.attrs["data_layout"]
        if self.data_layout not in _SPATIAL_AXES:
            raise self.fail(f"attribute 'data_layout' must be 'NCHW' or 'NHWC', got {self.data_layout!r}")

    def output_shape(self, shape: Sequence) -> tuple:
        """The output shape for the input ``shape`` (symbolic or unknown dimensions stay unknown)."""
        if len(shape) != 4:
            raise self.fail(f"the input must be {self.data_layout} (rank 4), got shape {tuple(shape)}")
        out = list(shape)
        for axis in _SPATIAL_AXES[self.data_layout]:
            size = known_int(shape[axis])
            if size is None:
                out[axis] = None
            elif size < self.kernel:
                raise self.fail(f"the kernel {self.kernel} is larger than the input's spatial size {size}")
            else:
                out[axis] = (size - self.kernel) // self.stride + 1
        return tuple(out)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.check_num_inputs(len(inputs))
        x = np.asarray(inputs[0])
        self.output_shape(x.shape)
        return [quant_avgpool2d(x, self.kernel, self.stride, self.ibits, self.obits, self.data_layout)]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        return [None if shapes[0] is None else self.output_shape(shapes[0])]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.check_num_inputs(len(dtypes))
        if not 2 <= self.obits <= 32:
            raise self.fail(f"no output datatype for obits {self.obits} (qonnx supports 2 to 32)")
        return [DataType[f"{'INT' if self.signed else 'UINT'}{self.obits}"]]
