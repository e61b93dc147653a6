"""FMPadding_Pixel: FINN's zero insertion between the pixels of an NHWC image (the input of a transposed
convolution lowered as FINN lowers it).

Input ``x`` of shape ``(N, H, W, C)``. Attributes (FINN's HW layer, domain ``finn.custom_op.fpgadataflow``):
``ImgDim`` [H, W] and ``Stride`` [sh, sw] (required), ``NumChannels`` C (required), ``inputDataType`` (required, a
datatype name), ``SIMD`` and ``numInputVectors`` (defaults 1; parallelism, no effect on the result), ``backend``
and ``preferred_impl_style`` (FINN's). The output has shape ``(N, H + (H − 1)(sh − 1), W + (W − 1)(sw − 1), C)``:
pixel ``(h, w)`` of the input at ``(h·sh, w·sw)``, zeros elsewhere. A transposed convolution with stride s is the
convolution (stride 1) of that image with the flipped kernel: FINN maps this node to its ``FMPadding_Pixel``
layer, the convolution to a sliding window and a matrix-vector unit.

Output datatype: the input's, which must hold 0.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import Shape, known_int, ints_attr
from custom_ops.registry import HW_DOMAIN, register
from finnlite.core.datatypes import BaseDataType, DataType


def pixel_padded_dim(size: int, stride: int) -> int:
    """The output size along one axis: ``size`` pixels with ``stride − 1`` zeros between neighbours."""
    return size + (size - 1) * (stride - 1)


@register
class FMPadding_Pixel(CustomOp):  # noqa: N801 - FINN's name
    """Zeros between the pixels of an NHWC image (module docstring)."""

    op_type = "FMPadding_Pixel"
    domains = (HW_DOMAIN,)
    attr_spec = {
        "ImgDim": ("ints", True, []),
        "Stride": ("ints", True, []),
        "NumChannels": ("i", True, 0),
        "inputDataType": ("s", True, ""),
        "SIMD": ("i", False, 1),
        "numInputVectors": ("i", False, 1),
        "backend": ("s", False, "fpgadataflow"),
        "preferred_impl_style": ("s", False, ""),
    }

    def validate_attrs(self) -> None:
        self.img_dim = ints_attr(self, "ImgDim", 2, 1)
        self.stride = ints_attr(self, "Stride", 2, 1)

    def output_shape(self, shape: Sequence) -> tuple:
        if len(shape) != 4:
            raise self.fail(f"the input must be NHWC (rank 4), got shape {tuple(shape)}")
        n, h, w, c = shape
        for name, actual, expected in zip("HW", (h, w), self.img_dim):
            if known_int(actual) is not None and actual != expected:
                raise self.fail(f"input {name} is {actual}, attribute ImgDim says {self.img_dim}")
        return (n, pixel_padded_dim(self.img_dim[0], self.stride[0]), pixel_padded_dim(self.img_dim[1], self.stride[1]),
                c)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.check_num_inputs(len(inputs))
        x = np.asarray(inputs[0])
        out = np.zeros(self.output_shape(x.shape), dtype=x.dtype)
        out[:, ::self.stride[0], ::self.stride[1], :] = x
        return [out]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        shape = shapes[0] if shapes[0] is not None else (None, *self.img_dim, self.attrs["NumChannels"])
        return [self.output_shape(shape)]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.check_num_inputs(len(dtypes))
        dt = dtypes[0]
        if dt is not None and not dt.allowed(0):
            raise self.fail(f"the input datatype {dt.name} cannot hold the inserted zeros")
        return [dt if dt is not None else DataType["FLOAT32"]]
