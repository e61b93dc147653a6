"""MoveOutputScaleBeforeLayout: the final Mul/Add before the layout ops that end the graph (FINN's hand-off)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite import Model
from streamline.finn_tail import MoveOutputScaleBeforeLayout
from tests.streamline.rulecheck import apply, graph_model
from custom_ops.executor import Executor


def _same(proto, model, x):
    want = Executor(proto).run({"x": x})
    got = Executor(model).run({"x": x})
    for k in want:
        assert got[k].shape == want[k].shape
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("layout", ["Flatten", "Reshape"])
def test_mul_and_add_move_before_the_final_flatten(seed, per_channel, layout):
    rng = np.random.default_rng(seed)
    c = 5
    a = (rng.normal(0, 1, (1, c)) if per_channel else np.array(rng.normal())).astype(np.float32)  # negative too
    b = (rng.normal(0, 1, (c,)) if per_channel else np.array(rng.normal())).astype(np.float32)
    first = (helper.make_node("Flatten", ["x"], ["f"], axis=1, name="flat") if layout == "Flatten" else
             helper.make_node("Reshape", ["x", "shape"], ["f"], name="flat"))
    nodes = [first, helper.make_node("Mul", ["f", "a"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]
    inits = {"a": a, "b": b, "shape": np.array([1, c], np.int64)}
    proto = graph_model(nodes, {"x": [1, 1, 1, c]}, {"y": [1, c]}, inits)
    m = apply(proto, [MoveOutputScaleBeforeLayout])
    assert [n.op_type for n in m.graph] == ["Mul", "Add", layout]
    assert m.output_names == ["y"]
    _same(proto, m, rng.integers(-50, 50, (1, 1, 1, c)).astype(np.float32))


def test_stays_where_the_constant_does_not_follow_the_last_axis_or_the_layout_op_forks():
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1, name="flat"),
             helper.make_node("Mul", ["f", "a"], ["y"], name="mul")]
    proto = graph_model(nodes, {"x": [1, 2, 1, 3]}, {"y": [1, 6]}, {"a": np.arange(6, dtype=np.float32)})
    rule = MoveOutputScaleBeforeLayout()
    result = rule.run(Model(proto))
    assert not result.changed and result.misses
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1, name="flat"),
             helper.make_node("Mul", ["f", "a"], ["y"], name="mul"),
             helper.make_node("Relu", ["f"], ["z"], name="other")]
    proto = graph_model(nodes, {"x": [1, 1, 1, 3]}, {"y": [1, 3], "z": [1, 3]}, {"a": np.float32(0.5)})
    assert not MoveOutputScaleBeforeLayout().apply(Model(proto))
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1, name="flat"),
             helper.make_node("Mul", ["f", "a"], ["m"], name="mul"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]
    proto = graph_model(nodes, {"x": [1, 1, 1, 3]}, {"y": [1, 3]}, {"a": np.float32(0.5)})
    assert not MoveOutputScaleBeforeLayout().apply(Model(proto))  # not the output dequantization
