"""MaxPoolNHWC against qonnx's MaxPoolNHWC op (which runs ONNX MaxPool in onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

from custom_ops.maxpoolnhwc import pool_output_dim
from finnlite.core.datatypes import DataType

F32 = np.float32

CASES = [
    # (N, H, W, C), kernel, strides, pads [top, left, bottom, right], ceil_mode
    ((1, 4, 4, 3), [2, 2], [2, 2], [0, 0, 0, 0], 0),
    ((2, 7, 6, 2), [3, 3], [2, 2], [1, 1, 1, 1], 0),
    ((1, 5, 5, 4), [2, 2], [2, 2], [0, 0, 0, 0], 1),  # ceil mode adds a partial window
    ((1, 5, 5, 1), [2, 2], [2, 2], [1, 1, 1, 1], 1),  # ceil mode, last window would start in the padding: dropped
    ((1, 6, 6, 1), [3, 3], [2, 2], [1, 1, 1, 1], 1),
    ((1, 5, 7, 2), [3, 2], [1, 2], [1, 0, 2, 1], 0),  # uneven padding
    ((1, 7, 7, 2), [3, 3], [3, 3], [1, 1, 1, 1], 1),
    ((1, 3, 3, 8), [3, 3], [1, 1], [0, 0, 0, 0], 0),
]


@pytest.mark.parametrize("shape,kernel,strides,pads,ceil_mode", CASES)
def test_matches_qonnx(h, qonnx_ort, shape, kernel, strides, pads, ceil_mode):
    rng = np.random.default_rng(sum(shape) + ceil_mode)
    x = rng.standard_normal(shape).astype(F32)
    x.flat[:3] = [-3e38, -0.0, 1e30]  # not -inf: onnxruntime returns -FLT_MAX for a window of -inf and padding
    x = (x - 5.0 * (rng.random(shape) < 0.5)).astype(F32)  # windows with only negative values at the border
    proto = h.node("MaxPoolNHWC", 1, kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil_mode)
    op = h.ours(proto)
    out = op.execute([x])[0]
    (out_shape,) = op.infer_shapes([shape], [None])
    assert out.shape == out_shape
    h.same_bits(out, h.qonnx_run(proto, [x], out_shape=out_shape))


def test_output_dim_rule():
    assert pool_output_dim(5, 2, 2) == 2 and pool_output_dim(5, 2, 2, ceil_mode=True) == 3
    assert pool_output_dim(5, 2, 2, 1, 1, ceil_mode=True) == 3  # 4 by the plain formula, less the padding window
    assert pool_output_dim(6, 3, 2, 1, 1, ceil_mode=True) == 4
    assert pool_output_dim(4, 2, 2, ceil_mode=True) == 2


def test_shapes_datatypes_and_symbolic_dims(h):
    proto = h.node("MaxPoolNHWC", 1, kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    op = h.ours(proto)
    assert op.infer_shapes([("N", 8, 8, "C")], [None]) == [("N", 4, 4, "C")]
    assert op.infer_shapes([(1, None, 8, 3)], [None]) == [(1, None, 4, 3)]
    assert h.qonnx_datatype(proto, [(1, 4, 4, 1)], {}, {0: "INT3"}) == "INT3"
    assert op.infer_datatypes([DataType["INT3"]], [None]) == [DataType["INT3"]]


@pytest.mark.parametrize("attrs,fragments", [
    ({"pads": [2, 0, 0, 0]}, ("padding", "smaller than the kernel")),
    ({"pads": [0, 0]}, ("pads", "4 entries")),
    ({"kernel_shape": [2, 2, 2]}, ("kernel_shape", "2 entries")),
    ({"strides": [0, 2]}, ("strides", "at least 1")),
    ({"ceil_mode": 2}, ("ceil_mode", "0 or 1")),
    ({"dilations": [1, 1]}, ("unknown attribute",)),
])
def test_bad_attributes(h, attrs, fragments):
    base = dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    base.update(attrs)
    h.raises_naming_node(lambda: h.ours(h.node("MaxPoolNHWC", 1, name="mp", **base)), *fragments,
                         node_name="mp")


def test_bad_inputs(h):
    op = h.ours(h.node("MaxPoolNHWC", 1, name="mp", kernel_shape=[3, 3], strides=[1, 1], pads=[0, 0, 0, 0]))
    h.raises_naming_node(lambda: op.execute([np.zeros((1, 2, 5, 1), F32)]), "does not fit", node_name="mp")
    h.raises_naming_node(lambda: op.execute([np.zeros((5, 5, 1), F32)]), "rank 4", node_name="mp")
