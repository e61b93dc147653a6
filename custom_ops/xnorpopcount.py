"""XnorPopcountMatMul: the matrix product of binary operands as XNOR and popcount, as in FINN's binarized layers.

Inputs ``a`` of shape ``(..., K)`` and ``w`` of shape ``(K, N)``, both with values in {0, 1} (BINARY, standing for
bipolar -1/+1). Each output element counts the positions where the two operands agree::

    y[..., n] = #{k : a[..., k] == w[k, n]} = ((2a - 1) @ (2w - 1) + K) / 2

bit-identical to qonnx's kernel, which computes it in that form. Here it is computed, with the same identity
expanded, as ``2·(a @ w) − rowsum(a) + (K − colsum(w))``: no bipolar copies of ``a`` (the im2col matrix of a binary
convolution, the largest tensor of its run) or of ``w``, and no rounding, since every partial sum is an integer of
magnitude at most 2K. With K over 2^23 (float32 integers stop being exact past 2^24) qonnx's own order is used.
Output shape: the matmul's, ``(..., N)``. Output datatype, as qonnx infers it: UINT32; both inputs must be BINARY
where their datatype is known (qonnx asserts this).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import Shape, known_int, shape_of
from custom_ops.registry import register
from finnlite.core.blockwise import all_in
from finnlite.core.datatypes import BaseDataType, DataType


#: above this K, integer partial sums (up to 2K) may round in float32: qonnx's operation order then
EXACT_K = 1 << 23


def xnorpopcount_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The number of agreeing positions of binary ``a`` (..., K) and ``w`` (K, N), see module docstring; the
    dtype is that of qonnx's result (``2.0·a − 1`` matmul ``2.0·w − 1``)."""
    a, w = np.asarray(a), np.asarray(w)
    k = a.shape[-1]
    if k > EXACT_K:
        return (np.matmul(2.0 * a - 1.0, 2.0 * w - 1.0) + k) * 0.5
    dtype = np.result_type((2.0 * a.reshape(-1)[:1]).dtype, (2.0 * w.reshape(-1)[:1]).dtype)  # qonnx's
    a = a.astype(dtype, copy=False)
    out = np.matmul(a, w.astype(dtype, copy=False))
    out *= 2.0
    out -= a.sum(axis=-1, dtype=dtype)[..., None]
    out += (k - w.sum(axis=0, dtype=np.float64)).astype(dtype)
    return out


@register
class XnorPopcountMatMul(CustomOp):
    """XNOR-popcount matrix product of binary operands (module docstring)."""

    op_type = "XnorPopcountMatMul"
    attr_spec = {}
    num_inputs = (2, 2)

    def _check_shapes(self, a_shape: tuple | None, w_shape: tuple | None) -> None:
        if a_shape is not None and len(a_shape) < 1:
            raise self.fail("the first input must have at least one dimension")
        if w_shape is None:
            return
        if len(w_shape) != 2:
            raise self.fail(f"the second input must be a (K, N) matrix, got shape {tuple(w_shape)}")
        if a_shape is not None:
            ka, kw = known_int(a_shape[-1]), known_int(w_shape[0])
            if ka is not None and kw is not None and ka != kw:
                raise self.fail(f"inner dimensions differ: {tuple(a_shape)} @ {tuple(w_shape)}")

    def validate_inputs(self, inputs: Sequence[np.ndarray | None]) -> None:
        self.check_num_inputs(len(inputs))
        self._check_shapes(shape_of(inputs[0]), shape_of(inputs[1]))
        for value, which in zip(inputs, ("first", "second")):
            if value is not None and not all_in(value, 0, 1):
                raise self.fail(f"the {which} input must be binary (values 0 and 1)")

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.validate_inputs(inputs)
        return [np.asarray(xnorpopcount_matmul(inputs[0], inputs[1]))]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        a_shape, w_shape = shapes
        self._check_shapes(a_shape, w_shape)
        if a_shape is None or w_shape is None:
            return [None]
        return [tuple(a_shape[:-1]) + (w_shape[1],)]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.check_num_inputs(len(dtypes))
        for dt, which in zip(dtypes, ("first", "second")):
            if dt is not None and dt != DataType["BINARY"]:
                raise self.fail(f"the {which} input must be BINARY, its datatype is {dt.name}")
        return [DataType["UINT32"]]
