"""BipolarQuant: 1-bit bipolar quantization, as exported by Brevitas and executed by qonnx.

Inputs ``x, scale`` (the scale broadcasts against ``x``), no attributes::

    y = scale * (+1 if x >= 0 else -1)

so ``-0.0`` maps to ``+scale`` and NaN to ``-scale``, as in qonnx. The kernel performs qonnx's operations on the
same dtypes (bit-identical in float32). The op's output is float32, or float64 for a float64 input.

Output datatype, as qonnx infers it: BIPOLAR for a constant all-one scale, FLOAT32 otherwise.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import Shape, check_broadcast, check_scale, float_output, shape_of
from custom_ops.registry import register
from finnlite.core.datatypes import BaseDataType, DataType


def bipolar_quant(x: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """``scale * sign(x)`` with the sign of zero taken as +1 (module docstring), in numpy's dtype promotion."""
    x = np.asarray(x)
    one = np.ones(x.shape, dtype=x.dtype)
    return np.asarray(np.where(x >= 0.0, one, -one) * scale)


@register
class BipolarQuant(CustomOp):
    """1-bit bipolar quantization (module docstring)."""

    op_type = "BipolarQuant"
    attr_spec = {}
    num_inputs = (2, 2)

    def validate_inputs(self, inputs: Sequence[np.ndarray | None]) -> None:
        self.check_num_inputs(len(inputs))
        check_scale(self, inputs[1], "scale")
        check_broadcast(self, shape_of(inputs[0]), shape_of(inputs[1]), "scale")

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.validate_inputs(inputs)
        x, scale = (np.asarray(v) for v in inputs)
        return [float_output(x, bipolar_quant(x, scale))]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        check_broadcast(self, shapes[0], shapes[1], "scale")
        return [None if shapes[0] is None else tuple(shapes[0])]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.validate_inputs(values)
        scale = values[1]
        if scale is not None and np.all(np.asarray(scale) == 1):
            return [DataType["BIPOLAR"]]
        return [DataType["FLOAT32"]]
