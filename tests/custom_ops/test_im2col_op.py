"""Im2Col against qonnx's Im2Col op: values, shapes (qonnx's shape op), datatypes and errors."""

from __future__ import annotations

import numpy as np
import pytest

from custom_ops.im2col import conv_output_dim, im2col_nhwc
from finnlite.core.datatypes import DataType

F32 = np.float32

CASES = [
    # (N, H, W, C), kernel, stride, pad [top, left, bottom, right], dilations, pad_value
    ((1, 5, 5, 3), [3, 3], [1, 1], [0, 0, 0, 0], [1, 1], 0),
    ((2, 6, 7, 2), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),
    ((1, 6, 6, 4), [2, 3], [1, 2], [0, 1, 1, 2], [1, 1], -3),
    ((1, 9, 8, 2), [3, 2], [1, 1], [2, 2, 2, 2], [2, 3], 5),
    ((1, 4, 4, 5), [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 0),
    ((1, 1, 10, 3), [1, 3], [1, 2], [0, 1, 0, 1], [1, 1], 0),  # 1D along W (H is a dummy dimension)
    ((1, 8, 1, 2), [4, 1], [2, 1], [1, 0, 2, 0], [1, 1], 1),  # 1D along H
    ((3, 7, 7, 1), [7, 7], [1, 1], [0, 0, 0, 0], [1, 1], 0),  # one window
]


def im2col_node(h, shape, kernel, stride, pad, dil, pad_value, name="ic", depthwise=0):
    return h.node("Im2Col", 1, name=name, kernel_size=kernel, stride=stride, pad_amount=pad, dilations=dil,
                  pad_value=pad_value, input_shape=str(tuple(shape)), depthwise=depthwise)


@pytest.mark.parametrize("shape,kernel,stride,pad,dil,pad_value", CASES)
def test_matches_qonnx(h, shape, kernel, stride, pad, dil, pad_value):
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(-8, 8, shape).astype(F32)
    proto = im2col_node(h, shape, kernel, stride, pad, dil, pad_value)
    op = h.ours(proto)
    out = op.execute([x])[0]
    # qonnx mixes up the samples of a batch larger than 1 (its reshape interleaves them): compare per sample
    for n in range(shape[0]):
        h.same_bits(out[n:n + 1], h.qonnx_run(proto, [x[n:n + 1]], datatypes={0: "INT8"}))
    assert op.infer_shapes([shape], [None]) == [out.shape]
    # qonnx's own shape inference, which assumes batch 1
    qonnx_shape = list(h.qonnx_op(proto).make_shape_compatible_op(None).attribute[-1].ints)
    assert qonnx_shape == [1, *out.shape[1:]]
    assert op.infer_shapes([None], [None]) == [(shape[0], *out.shape[1:])]


def test_layout_of_windows():
    """Element (a, b, c) of the window at output (i, j) is xp[i*s + a*d, j*s + b*d, c]."""
    x = np.arange(2 * 5 * 6 * 3, dtype=F32).reshape(2, 5, 6, 3)
    out = im2col_nhwc(x, [2, 3], [2, 1], [1, 0, 0, 2], pad_value=-1, dilations=[2, 1])
    xp = np.pad(x, ((0, 0), (1, 0), (0, 2), (0, 0)), constant_values=-1)
    assert out.shape == (2, conv_output_dim(5, 2, 2, 1, 2), conv_output_dim(6, 3, 1, 2, 1), 18)
    for n, i, j in [(0, 0, 0), (1, 1, 3), (0, 1, 5)]:
        window = np.stack([xp[n, i * 2 + a * 2, j + b, :] for a in range(2) for b in range(3)])
        np.testing.assert_array_equal(out[n, i, j], window.ravel())


def test_depthwise_does_not_change_values(h):
    x = np.random.default_rng(0).standard_normal((1, 4, 4, 2)).astype(F32)
    plain = h.ours(im2col_node(h, x.shape, [2, 2], [1, 1], [0, 0, 0, 0], [1, 1], 0)).execute([x])[0]
    dw = h.ours(im2col_node(h, x.shape, [2, 2], [1, 1], [0, 0, 0, 0], [1, 1], 0, depthwise=1)).execute([x])[0]
    h.same_bits(plain, dw)


def test_datatypes(h):
    proto = im2col_node(h, (1, 4, 4, 2), [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 0)
    op = h.ours(proto)
    assert h.qonnx_datatype(proto, [(1, 4, 4, 2)], {}, {0: "UINT4"}) == "UINT4"
    assert op.infer_datatypes([DataType["UINT4"]], [None]) == [DataType["UINT4"]]
    assert op.infer_datatypes([None], [None]) == [DataType["FLOAT32"]]
    neg = h.ours(im2col_node(h, (1, 4, 4, 2), [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], -1))
    h.raises_naming_node(lambda: neg.infer_datatypes([DataType["UINT4"]], [None]), "UINT4", "pad value -1",
                         node_name="ic")
    assert neg.infer_datatypes([DataType["INT4"]], [None]) == [DataType["INT4"]]


def test_symbolic_batch(h):
    op = h.ours(im2col_node(h, (1, 6, 6, 3), [3, 3], [1, 1], [0, 0, 0, 0], [1, 1], 0))
    assert op.infer_shapes([("batch", 6, 6, 3)], [None]) == [("batch", 4, 4, 27)]


@pytest.mark.parametrize("attrs,fragments", [
    ({"kernel_size": [3]}, ("kernel_size", "2 entries")),
    ({"stride": [0, 1]}, ("stride", "at least 1")),
    ({"pad_amount": [1, 1]}, ("pad_amount", "4 entries")),
    ({"dilations": [1, -1]}, ("dilations",)),
    ({"input_shape": "(1, x, 4, 4)"}, ("input_shape",)),
    ({"input_shape": "(4, 4, 2)"}, ("input_shape", "NHWC")),
    ({"depthwise": 2}, ("depthwise", "0 or 1")),
    ({"groups": 2}, ("unknown attribute",)),
])
def test_bad_attributes(h, attrs, fragments):
    base = dict(kernel_size=[3, 3], stride=[1, 1], input_shape="(1, 4, 4, 2)")
    base.update(attrs)
    h.raises_naming_node(lambda: h.ours(h.node("Im2Col", 1, name="ic", **base)), *fragments, node_name="ic")


def test_bad_inputs(h):
    op = h.ours(im2col_node(h, (1, 1, 8, 2), [3, 3], [1, 1], [0, 0, 0, 0], [1, 1], 0))
    h.raises_naming_node(lambda: op.execute([np.zeros((1, 1, 8, 2), F32)]), "H is 1", node_name="ic")
    big = h.ours(im2col_node(h, (1, 4, 4, 2), [5, 5], [1, 1], [0, 0, 0, 0], [1, 1], 0))
    h.raises_naming_node(lambda: big.execute([np.zeros((1, 4, 4, 2), F32)]), "does not fit", node_name="ic")
    h.raises_naming_node(lambda: big.execute([np.zeros((4, 4, 2), F32)]), "rank 4", node_name="ic")
    ok = h.ours(im2col_node(h, (1, 4, 4, 2), [3, 3], [1, 1], [0, 0, 0, 0], [1, 1], 0))
    h.raises_naming_node(lambda: ok.infer_shapes([(1, 4, 4, 3)], [None]), "input C is 3", node_name="ic")
