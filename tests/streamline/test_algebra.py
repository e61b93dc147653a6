"""The op table (streamline.algebra): declarations, element maps of ir nodes, compressed constants, and how a
constant factor passes a linear or selection op by its mixed axes and channel groups."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from onnx import helper

from finnlite import Model
from streamline.algebra import (MOVEMENT, compress, element_map_of, mixing, movement, through_mixing,
                                varying_axes)
from tests.streamline.rulecheck import graph_model


def _node(op, inputs, shapes, inits=None, **attrs):
    nodes = [helper.make_node(op, inputs, ["y"], name="n", **attrs)]
    proto = graph_model(nodes, shapes, {}, inits or {})
    proto.graph.output.append(helper.make_tensor_value_info("y", 1, None))
    m = Model(proto)
    m.infer_shapes()
    return m, m.get_node_from_name("n")


def test_movement_declarations():
    assert set(MOVEMENT) >= {"Transpose", "Reshape", "DepthToSpace", "Resize", "Concat", "Gather", "Pad"}
    _, resize = _node("Resize", ["x", "", "s"], {"x": [1, 1, 2, 2]}, {"s": np.array([1, 1, 2, 2], np.float32)},
                      mode="linear")
    assert movement(resize) is None  # interpolation is linear, not data movement
    _, nearest = _node("Resize", ["x", "", "s"], {"x": [1, 1, 2, 2]}, {"s": np.array([1, 1, 2, 2], np.float32)},
                       mode="nearest")
    assert movement(nearest) is not None
    _, cat = _node("Concat", ["a", "b"], {"a": [1, 2], "b": [1, 3]}, axis=1)
    assert movement(cat).data is None


def test_element_map_of_an_ir_node_is_the_nodes_own():
    m, node = _node("DepthToSpace", ["x"], {"x": [1, 8, 2, 3]}, blocksize=2)
    emap = element_map_of(m, node)
    x = np.arange(48).reshape(1, 8, 2, 3)
    b = 2
    expected = x.reshape(1, b, b, 2, 2, 3).transpose(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6)
    np.testing.assert_array_equal(emap.gather([x]), expected)


@pytest.mark.parametrize("values,care,expected_shape", [
    (np.ones((2, 3, 4)), None, (1, 1, 1)),
    (np.arange(3).reshape(1, 3, 1) * np.ones((2, 3, 4)), None, (1, 3, 1)),
    (np.arange(24).reshape(2, 3, 4), None, (2, 3, 4)),
])
def test_compress_keeps_the_axes_a_constant_varies_along(values, care, expected_shape):
    out = compress(np.asarray(values, dtype=object), care)
    assert out.shape == expected_shape
    np.testing.assert_array_equal(np.broadcast_to(out, values.shape), values)


def test_compress_fills_positions_it_need_not_care_about():
    v = np.array([[Fraction(1, 2), Fraction(7)], [Fraction(1, 2), Fraction(1, 2)]], dtype=object)
    care = np.array([[True, False], [True, True]])
    out = compress(v, care)
    assert out.shape == (1, 1) and out[0, 0] == Fraction(1, 2)
    assert varying_axes(out) == []
    # conflicting cared-for values: no scalar, and the cared-for values come back
    v2 = v.copy()
    v2[1, 1] = Fraction(3)
    out2 = compress(v2, care)
    assert np.all(np.asarray(np.broadcast_to(out2, v2.shape) == v2, dtype=bool) | ~care)


def test_mixing_and_channel_maps():
    w = np.ones((8, 2, 3, 3), np.float32)
    m, conv = _node("Conv", ["x", "w"], {"x": [1, 4, 5, 5]}, {"w": w}, group=2)
    mix = mixing(conv)
    assert mix.groups == (2, 4, 8) and mix.mixed == frozenset({2, 3})
    per_group = np.array([Fraction(1, 2)] * 2 + [Fraction(3)] * 2, dtype=object).reshape(1, 4, 1, 1)
    out = through_mixing(mix, per_group)
    assert out.shape == (1, 8, 1, 1) and list(out.ravel()) == [Fraction(1, 2)] * 4 + [Fraction(3)] * 4
    assert "channel group" in through_mixing(mix, np.arange(4, dtype=object).reshape(1, 4, 1, 1))
    assert "spatial" in through_mixing(mix, np.ones((1, 1, 5, 1), dtype=object) * np.arange(5).reshape(1, 1, 5, 1))
    _, red = _node("ReduceSum", ["x", "axes"], {"x": [2, 3, 4]}, {"axes": np.array([1], np.int64)}, keepdims=0)
    mix = mixing(red)
    assert mix.dropped == (1,) and mix.gain == 3 and mix.word == "reduced"
    out = through_mixing(mix, np.arange(4, dtype=object).reshape(1, 1, 4))
    assert out.shape == (1, 4)
