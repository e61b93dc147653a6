"""QuantAvgPool2d against qonnx's QuantAvgPool2d op (which runs ONNX AveragePool in onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

from custom_ops.quantavgpool2d import avgpool_shift

F32 = np.float32

CASES = [
    # layout, (N, C, H, W), kernel, stride, ibits, obits, signed
    ("NCHW", (1, 3, 4, 4), 2, 2, 4, 4, 0),
    ("NCHW", (2, 2, 7, 7), 7, 1, 8, 8, 0),
    ("NCHW", (1, 4, 6, 5), 3, 2, 4, 6, 1),
    ("NHWC", (1, 3, 4, 4), 2, 2, 4, 4, 1),
    ("NHWC", (2, 5, 5, 3), 3, 1, 2, 8, 0),  # shift 0: the sum itself
    ("NHWC", (1, 2, 7, 7), 7, 7, 8, 2, 1),
]


@pytest.mark.parametrize("layout,nchw,kernel,stride,ibits,obits,signed", CASES)
def test_matches_qonnx(h, qonnx_ort, layout, nchw, kernel, stride, ibits, obits, signed):
    rng = np.random.default_rng(sum(nchw) + ibits)
    lo, hi = (-(2 ** (ibits - 1)), 2 ** (ibits - 1)) if signed else (0, 2 ** ibits)
    n, c, hh, ww = nchw
    shape = nchw if layout == "NCHW" else (n, hh, ww, c)
    x = rng.integers(lo, hi, shape).astype(F32)
    proto = h.node("QuantAvgPool2d", 1, kernel=kernel, stride=stride, ibits=ibits, obits=obits, signed=signed,
                   data_layout=layout)
    op = h.ours(proto)
    out = op.execute([x])[0]
    (out_shape,) = op.infer_shapes([shape], [None])
    assert out.shape == out_shape
    h.same_bits(out, h.qonnx_run(proto, [x], out_shape=out_shape))


def test_shift_matches_qonnx(h):
    for kernel, ibits, obits in [(2, 4, 4), (7, 8, 8), (3, 2, 8), (7, 8, 2), (1, 4, 4)]:
        proto = h.node("QuantAvgPool2d", 1, kernel=kernel, stride=1, ibits=ibits, obits=obits, signed=0)
        assert avgpool_shift(kernel, ibits, obits) == h.qonnx_op(proto).get_shifts()


@pytest.mark.parametrize("signed,obits,expected", [(0, 4, "UINT4"), (1, 8, "INT8"), (0, 32, "UINT32")])
def test_datatype_matches_qonnx(h, signed, obits, expected):
    proto = h.node("QuantAvgPool2d", 1, kernel=2, stride=2, ibits=4, obits=obits, signed=signed)
    assert h.qonnx_datatype(proto, [(1, 2, 4, 4)], {}) == expected
    assert h.ours(proto).infer_datatypes([None], [None])[0].name == expected


def test_shapes(h):
    nhwc = h.ours(h.node("QuantAvgPool2d", 1, kernel=3, stride=2, ibits=4, obits=4, signed=0, data_layout="NHWC"))
    assert nhwc.infer_shapes([("N", 7, 8, 16)], [None]) == [("N", 3, 3, 16)]
    nchw = h.ours(h.node("QuantAvgPool2d", 1, kernel=3, stride=2, ibits=4, obits=4, signed=0))
    assert nchw.infer_shapes([(1, 16, 7, "W")], [None]) == [(1, 16, 3, None)]
    assert nchw.infer_shapes([None], [None]) == [None]
    qonnx_shape = h.qonnx_op(h.node("QuantAvgPool2d", 1, kernel=3, stride=2, ibits=4, obits=4, signed=0,
                                    data_layout="NHWC")).make_shape_compatible_op(
        h.qonnx_wrapper(h.node("QuantAvgPool2d", 1), [(1, 7, 8, 16)], {}))
    assert list(qonnx_shape.attribute[-1].ints) == [1, 3, 3, 16]


@pytest.mark.parametrize("attrs,fragments", [
    ({"data_layout": "NWC"}, ("data_layout",)),
    ({"signed": 2}, ("signed", "0 or 1")),
    ({"kernel": 0}, ("kernel", "at least 1")),
    ({"ibits": 0}, ("ibits", "at least 1")),
    ({"pads": [0, 0]}, ("unknown attribute",)),
])
def test_bad_attributes(h, attrs, fragments):
    base = dict(kernel=2, stride=2, ibits=4, obits=4, signed=0)
    base.update(attrs)
    h.raises_naming_node(lambda: h.ours(h.node("QuantAvgPool2d", 1, name="ap", **base)), *fragments,
                         node_name="ap")


def test_bad_obits_and_inputs(h):
    for obits in (1, 33):
        op = h.ours(h.node("QuantAvgPool2d", 1, name="ap", kernel=2, stride=2, ibits=4, obits=obits, signed=0))
        h.raises_naming_node(lambda: op.infer_datatypes([None], [None]), f"obits {obits}", node_name="ap")
    op = h.ours(h.node("QuantAvgPool2d", 1, name="ap", kernel=5, stride=1, ibits=4, obits=4, signed=0))
    h.raises_naming_node(lambda: op.execute([np.zeros((1, 2, 4, 4), F32)]), "kernel 5", node_name="ap")
    h.raises_naming_node(lambda: op.execute([np.zeros((2, 4, 4), F32)]), "rank 4", node_name="ap")
