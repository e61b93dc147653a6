"""XnorPopcountMatMul against qonnx's xnorpopcountmatmul and op."""

from __future__ import annotations

import numpy as np
import pytest
from qonnx.custom_op.general.xnorpopcount import xnorpopcountmatmul as q_xnor

from custom_ops.xnorpopcount import xnorpopcount_matmul
from finnlite.core.datatypes import DataType

F32 = np.float32


@pytest.mark.parametrize("a_shape,w_shape", [((4, 9), (9, 3)), ((2, 5, 16), (16, 7)), ((9,), (9, 2)),
                                             ((1, 1), (1, 1))])
def test_matches_qonnx(h, a_shape, w_shape):
    rng = np.random.default_rng(sum(a_shape))
    a = rng.integers(0, 2, a_shape).astype(F32)
    w = rng.integers(0, 2, w_shape).astype(F32)
    proto = h.node("XnorPopcountMatMul", 2)
    op = h.ours(proto)
    out = op.execute([a, w])[0]
    h.same_bits(out, h.qonnx_run(proto, [a, w]))
    h.same_bits(xnorpopcount_matmul(a, w), q_xnor(a, w))
    assert op.infer_shapes([a_shape, w_shape], [None, w])[0] == out.shape
    # the count of agreeing positions, computed directly
    agree = (a[..., :, None] == w).sum(axis=-2)
    np.testing.assert_array_equal(out, agree)


@pytest.mark.parametrize("a_dtype,w_dtype", [(np.float32, np.float32), (np.float64, np.float32),
                                             (np.float32, np.float64), (np.uint8, np.float32), (bool, np.int64),
                                             (np.int8, np.float16)])
def test_dtypes_and_large_k_match_qonnx(a_dtype, w_dtype):
    """The expanded form gives qonnx's values and dtype for every operand dtype, also for a long inner dimension
    (the im2col matrix of a binary 3x3 convolution over 256 channels) and for all-agreeing/none-agreeing columns."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2, (3, 50, 2304)).astype(a_dtype)
    w = rng.integers(0, 2, (2304, 6)).astype(w_dtype)
    w[:, 0], w[:, 1] = 0, 1
    a[0, 0] = 0
    a[0, 1] = 1
    ours, theirs = xnorpopcount_matmul(a, w), q_xnor(a, w)
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours.view(np.uint8), theirs.view(np.uint8))
    assert ours[0, 0, 0] == 2304 and ours[0, 1, 0] == 0


def test_beyond_exact_k_uses_qonnx_order(monkeypatch):
    """Past EXACT_K the kernel computes in qonnx's operation order (made small here to reach that branch)."""
    import custom_ops.xnorpopcount as xp

    rng = np.random.default_rng(3)
    a = rng.integers(0, 2, (4, 40)).astype(F32)
    w = rng.integers(0, 2, (40, 5)).astype(F32)
    monkeypatch.setattr(xp, "EXACT_K", 16)
    calls = []
    real = np.matmul
    monkeypatch.setattr(xp.np, "matmul", lambda x, y: calls.append(x.copy()) or real(x, y))
    np.testing.assert_array_equal(xp.xnorpopcount_matmul(a, w), q_xnor(a, w))
    assert np.array_equal(calls[0], 2 * a - 1)  # the bipolar copy of a, as qonnx makes it


def test_datatype(h):
    proto = h.node("XnorPopcountMatMul", 2, name="xp")
    op = h.ours(proto)
    w = np.ones((3, 2), F32)
    assert h.qonnx_datatype(proto, [(1, 3), w], {1: w}, {0: "BINARY", 1: "BINARY"}) == "UINT32"
    assert op.infer_datatypes([DataType["BINARY"], DataType["BINARY"]], [None, w])[0].name == "UINT32"
    assert op.infer_datatypes([None, None], [None, None])[0].name == "UINT32"
    h.raises_naming_node(lambda: op.infer_datatypes([DataType["BIPOLAR"], DataType["BINARY"]], [None, None]),
                         "first input must be BINARY", node_name="xp")


def test_errors(h):
    op = h.ours(h.node("XnorPopcountMatMul", 2, name="xp"))
    a = np.ones((2, 3), F32)
    h.raises_naming_node(lambda: op.execute([a, np.ones((4, 2), F32)]), "inner dimensions", node_name="xp")
    h.raises_naming_node(lambda: op.execute([a, np.ones((1, 3, 2), F32)]), "(K, N)", node_name="xp")
    h.raises_naming_node(lambda: op.execute([a * -1, np.ones((3, 2), F32)]), "first input must be binary",
                         node_name="xp")
    h.raises_naming_node(lambda: op.execute([a, np.full((3, 2), 0.5, F32)]), "second input must be binary",
                         node_name="xp")
    big = np.ones((3, 70_000), F32)  # checked block by block: the bad element is in the second block
    big[2, 5] = 2.0
    h.raises_naming_node(lambda: op.execute([big, np.ones((70_000, 2), F32)]), "first input must be binary",
                         node_name="xp")
    h.raises_naming_node(lambda: op.infer_shapes([(2, 3), (2, 2)], [None, None]), "inner", node_name="xp")
    h.raises_naming_node(lambda: h.ours(h.node("XnorPopcountMatMul", 2, name="xp", k=1)), "unknown attribute",
                         node_name="xp")
