"""MultiThreshold against qonnx's multithreshold function and MultiThreshold op."""

from __future__ import annotations

import numpy as np
import pytest
from qonnx.custom_op.general.multithreshold import multithreshold as q_multithreshold

from custom_ops.multithreshold import channel_axis_of, multithreshold

F32 = np.float32


def thresholds_for(rng, channels: int, steps: int) -> np.ndarray:
    t = np.sort(rng.integers(-8, 8, (channels, steps)).astype(F32) + rng.choice([0, 0.5], (channels, steps)), axis=1)
    return t.astype(F32)


def input_hitting(rng, shape, thresholds) -> np.ndarray:
    """Random values, many exactly equal to a threshold, plus NaN and signed zeros."""
    x = rng.uniform(-10, 10, shape).astype(F32)
    flat = x.reshape(-1)
    picks = rng.choice(thresholds.ravel(), flat.size // 2)
    flat[: picks.size] = picks
    flat[-3:] = [np.nan, -0.0, 0.0]
    return x


@pytest.mark.parametrize("shape,layout,axis", [
    ((2, 5), "", 1), ((2, 5), "NC", 1), ((2, 4, 5), "", 2), ((2, 5, 4), "NCW", 1), ((2, 4, 5), "NWC", 2),
    ((2, 5, 3, 3), "", 1), ((2, 5, 3, 3), "NCHW", 1), ((2, 3, 3, 5), "NHWC", 3), ((1, 5, 2, 2, 2), "", 1),
])
@pytest.mark.parametrize("per_channel", [True, False])
def test_op_matches_qonnx_op(h, shape, layout, axis, per_channel):
    rng = np.random.default_rng(len(shape) * 10 + axis)
    thresholds = thresholds_for(rng, 5 if per_channel else 1, 7)
    x = input_hitting(rng, shape, thresholds)
    attrs = {"out_dtype": "UINT3", "data_layout": layout} if layout else {"out_dtype": "UINT3"}
    proto = h.node("MultiThreshold", 2, **attrs)
    op = h.ours(proto)
    assert op.channel_axis(len(shape)) == axis
    h.same_bits(op.execute([x, thresholds])[0], h.qonnx_run(proto, [x, thresholds]))


@pytest.mark.parametrize("out_scale,out_bias", [(1.0, 0.0), (2.0, -4.0), (-1.0, 7.0), (0.5, -0.25), (0.1, 0.3)])
def test_scale_and_bias_bit_identical(h, out_scale, out_bias):
    rng = np.random.default_rng(5)
    thresholds = thresholds_for(rng, 4, 15)
    x = input_hitting(rng, (3, 4, 2, 2), thresholds)
    proto = h.node("MultiThreshold", 2, out_dtype="INT4", out_scale=out_scale, out_bias=out_bias)
    h.same_bits(h.ours(proto).execute([x, thresholds])[0], h.qonnx_run(proto, [x, thresholds]))


def test_function_matches_qonnx_function(h):
    rng = np.random.default_rng(6)
    t = thresholds_for(rng, 6, 3)
    x = input_hitting(rng, (2, 6, 4), t)
    h.same_bits(multithreshold(x, t, 1.0, 0.0, channel_axis=1), q_multithreshold(x, t))
    xl = np.moveaxis(x, 1, -1).copy()
    h.same_bits(multithreshold(xl, t, 3.0, 1.0, channel_axis=-1), q_multithreshold(xl, t, 3.0, 1.0, True))
    # unsorted thresholds are counted all the same, no thresholds at all count nothing
    shuffled = rng.permuted(t, axis=1)
    h.same_bits(multithreshold(x, shuffled), q_multithreshold(x, shuffled))
    h.same_bits(multithreshold(x, np.zeros((6, 0), F32)), np.zeros_like(x))



@pytest.mark.parametrize("shape,steps", [((1, 56, 56, 64), 15), ((2, 7, 7, 96), 15), ((1, 9, 9, 48), 255),
                                         ((3, 1000), 3)])
def test_channels_last_blocks_of_rows(h, shape, steps):
    # with the channels last the thresholds are repeated over blocks of rows (as many as divide the row count)
    rng = np.random.default_rng(9)
    t = thresholds_for(rng, shape[-1], steps)
    x = input_hitting(rng, shape, t)
    h.same_bits(multithreshold(x, t, 0.5, -1.0, channel_axis=-1), q_multithreshold(x, t, 0.5, -1.0, True))

def test_ties_count_and_nan_thresholds():
    t = np.array([[-1.0, 0.0, 0.0, 2.5, np.nan]], F32)
    x = np.array([[-1.0, -1.5, -0.0, 0.0, 2.5, 2.4999998, np.nan, np.inf]], F32)
    np.testing.assert_array_equal(multithreshold(x, t), [[1, 0, 3, 3, 4, 3, 0, 4]])


@pytest.mark.parametrize("steps", [255, 256, 300])
def test_counts_at_the_limits_of_the_byte_counter(h, steps):
    # up to 255 steps the hits are counted in a uint8, from 256 in a uint16: all hit and none hit included
    rng = np.random.default_rng(8)
    t = thresholds_for(rng, 3, steps)
    x = input_hitting(rng, (2, 3, 7, 5), t)
    x[0, :, 0, 0], x[0, :, 0, 1] = np.inf, -np.inf
    got = multithreshold(x, t, 2.0, 1.0)
    h.same_bits(got, q_multithreshold(x, t, 2.0, 1.0))
    assert got[0, 0, 0, 0] == 2.0 * steps + 1.0 and got[0, 0, 0, 1] == 1.0


def test_channel_axis_defaults():
    assert [channel_axis_of("", n) for n in (2, 3, 4, 5)] == [1, 2, 1, 1]
    assert channel_axis_of("NHWC", 4) == 3 and channel_axis_of("NCW", 3) == 1 and channel_axis_of("NHW", 3) == 1


@pytest.mark.parametrize("attrs,expected", [
    ({"out_dtype": "UINT4"}, "UINT4"), ({"out_dtype": "INT2", "out_bias": -2.0}, "INT2"),
    ({"out_dtype": "BIPOLAR", "out_scale": 2.0, "out_bias": -1.0}, "BIPOLAR"),
    ({"out_dtype": "UINT4", "out_scale": 0.5}, "FLOAT32"), ({"out_dtype": "INT4", "out_bias": -0.5}, "FLOAT32"),
])
def test_datatype_matches_qonnx(h, attrs, expected):
    proto = h.node("MultiThreshold", 2, **attrs)
    t = np.zeros((1, 3), F32)
    assert h.qonnx_datatype(proto, [(1, 4), t], {1: t}) == expected
    assert h.ours(proto).infer_datatypes([None, None], [None, t])[0].name == expected


def test_shape_inference(h):
    op = h.ours(h.node("MultiThreshold", 2, out_dtype="UINT2", data_layout="NHWC"))
    assert op.infer_shapes([("N", 4, 4, 8), (8, 3)], [None, None]) == [("N", 4, 4, 8)]
    assert op.infer_shapes([(1, 4, 4, 8), (1, 3)], [None, None]) == [(1, 4, 4, 8)]
    assert op.infer_shapes([None, (8, 3)], [None, None]) == [None]
    h.raises_naming_node(lambda: op.infer_shapes([(1, 4, 4, 8), (4, 3)], [None, None]), "4 rows", "8 channels")


@pytest.mark.parametrize("attrs,fragments", [
    ({"out_dtype": "UINT77X"}, ("out_dtype", "UINT77X")),
    ({}, ("out_dtype", "missing")),
    ({"out_dtype": "UINT2", "data_layout": "NCHC"}, ("data_layout",)),
    ({"out_dtype": "UINT2", "data_layout": "N,C"}, ("data_layout",)),
    ({"out_dtype": "UINT2", "out_scale": float("nan")}, ("out_scale", "finite")),
    ({"out_dtype": "UINT2", "out_bias": float("inf")}, ("out_bias", "finite")),
    ({"out_dtype": "UINT2", "axis": 1}, ("unknown attribute", "axis")),
])
def test_bad_attributes(h, attrs, fragments):
    h.raises_naming_node(lambda: h.ours(h.node("MultiThreshold", 2, name="mt", **attrs)), *fragments,
                         node_name="mt")


def test_bad_inputs(h):
    op = h.ours(h.node("MultiThreshold", 2, name="mt", out_dtype="UINT2"))
    x = np.zeros((2, 3, 4, 4), F32)
    h.raises_naming_node(lambda: op.execute([x, np.zeros((2, 3), F32)]), "2 rows", "3 channels", node_name="mt")
    h.raises_naming_node(lambda: op.execute([x, np.zeros(3, F32)]), "(channels, steps)", node_name="mt")
    h.raises_naming_node(lambda: op.execute([np.zeros(3, F32), np.zeros((1, 3), F32)]), "rank 1", node_name="mt")
    h.raises_naming_node(lambda: op.execute([x]), "2 inputs", node_name="mt")
    nhwc = h.ours(h.node("MultiThreshold", 2, name="mt", out_dtype="UINT2", data_layout="NHWC"))
    h.raises_naming_node(lambda: nhwc.execute([np.zeros((2, 3), F32), np.zeros((1, 3), F32)]), "axis 3",
                         node_name="mt")


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_strict_check_of_infinite_thresholds(h):
    """Equal infinite thresholds (steps no input reaches) are sorted, and checking them warns of nothing; a row that
    goes down is named."""
    op = h.ours(h.node("MultiThreshold", 2, name="mt", out_dtype="UINT2"))
    x = np.zeros((1, 2), F32)
    op.validate_strict([x, np.array([[-np.inf, -np.inf, 1], [0, np.inf, np.inf]], F32)])
    h.raises_naming_node(lambda: op.validate_strict([x, np.array([[0, 1, 2], [np.inf, 0, 1]], F32)]),
                         "not sorted in row 1", node_name="mt")


@pytest.mark.parametrize("shape,axis,channels", [((2, 3, 4, 5), 1, 3), ((2, 4, 5, 3), 3, 3), ((1, 1, 40), 1, 1),
                                                  ((3, 7), 1, 7), ((2, 6, 5), 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_many_steps_search_the_rows_with_the_loops_result(shape, axis, channels, dtype):
    """From 256 steps on the kernel counts by a binary search per row: the same counts as qonnx's comparisons
    (ties, NaN inputs, NaN and infinite thresholds, unsorted rows, float32 thresholds against float64 inputs)."""
    from custom_ops.multithreshold import _SEARCH_STEPS, multithreshold_rows

    rng = np.random.default_rng(shape[-1] + channels)
    steps = _SEARCH_STEPS + 5
    t = rng.uniform(-50, 50, (channels, steps)).astype(F32)
    t[:, :3] = [np.nan, np.inf, -np.inf]
    x = rng.uniform(-60, 60, shape)
    flat = x.reshape(-1)
    flat[: flat.size // 3] = rng.choice(t[np.isfinite(t)], flat.size // 3)  # exact ties
    if dtype != np.int32:
        flat[-1] = np.nan
    x = x.astype(dtype)
    for scale, bias in ((1.0, 0.0), (-2.0, 5.0)):
        got = multithreshold(x, t, scale, bias, channel_axis=axis)
        expected = q_multithreshold(np.moveaxis(x, axis, 1) if axis != 1 else x, t, scale, bias)
        np.testing.assert_array_equal(got, np.moveaxis(expected, 1, axis) if axis != 1 else expected)
        assert got.dtype == expected.dtype
    rows = np.moveaxis(x, axis, 0).reshape(shape[axis], -1).astype(np.float64)
    if channels == shape[axis]:
        np.testing.assert_array_equal(multithreshold_rows(rows, t), multithreshold(rows, t, channel_axis=0))


@pytest.mark.parametrize("rows,steps,queries", [(5, 15, 30), (3, 255, 7), (4, 1, 9), (2, 0, 3), (3, 16, 5000)])
@pytest.mark.parametrize("right", [True, False])
def test_the_row_search_is_numpys_searchsorted_row_by_row(rows, steps, queries, right):
    """search_sorted_rows (all short rows at once, long rows one call each) gives numpy's searchsorted of each
    row: ties, repeated and infinite values, NaN thresholds sorted last."""
    from custom_ops.multithreshold import search_sorted_rows

    rng = np.random.default_rng(rows * 1000 + steps + queries)
    t = rng.integers(-8, 8, (rows, steps)).astype(np.float64)
    t[rng.random(t.shape) < 0.1] = np.inf
    t[rng.random(t.shape) < 0.1] = -np.inf
    t[rng.random(t.shape) < 0.1] = np.nan
    t = np.sort(t, axis=1)
    q = rng.integers(-10, 10, (rows, queries)).astype(np.float64)
    q[rng.random(q.shape) < 0.05] = np.inf
    q[rng.random(q.shape) < 0.05] = -np.inf
    side = "right" if right else "left"
    expected = np.stack([np.searchsorted(t[c], q[c], side=side) for c in range(rows)])
    np.testing.assert_array_equal(search_sorted_rows(t, q, right), expected)
