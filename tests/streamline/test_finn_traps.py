"""The streamlining traps seen in FINN, each with a test (issue 5)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from streamline.absorb import ABSORB_PASSES
from streamline.collapse import COLLAPSE_PASSES
from streamline.layout import ConvertToNHWC
from streamline.move import MoveLinearPastDataMovement
from streamline.reorder import REORDER_PASSES, MoveLinearPastEltwiseAdd
from tests.streamline.rulecheck import apply, compare, graph_model

RNG = np.random.default_rng(7)


def _pad(fill: float | None, op: str = "Mul", k: float | list = 0.5):
    inputs = ["xs", "pads"] + (["fill"] if fill is not None else [])
    nodes = [helper.make_node(op, ["x", "k"], ["xs"], name="lin"),
             helper.make_node("Pad", inputs, ["y"], mode="constant", name="pad")]
    inits = {"k": np.asarray(k, np.float32), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}
    if fill is not None:
        inits["fill"] = np.float32(fill)
    return graph_model(nodes, {"x": [1, 2, 3, 3]}, {"y": [1, 2, 5, 5]}, inits)


def test_mul_past_pad_with_nonzero_fill_keeps_the_border():
    for fill in (None, 0.0, 1.5, -2.0):
        proto = _pad(fill)
        m = apply(proto, [MoveLinearPastDataMovement])
        assert [n.op_type for n in m.graph] == ["Pad", "Mul"]
        x = RNG.normal(size=(1, 2, 3, 3))
        compare(proto, m, {"x": x})
        out = m.graph.node(1).outputs[0].name  # the border of the padded result is still the fill value
        from custom_ops.executor import Executor

        y = Executor(m).run({"x": x.astype(np.float32)})[m.output_names[0]]
        assert np.all(y[:, :, 0, :] == np.float32(fill or 0.0)), out


def test_add_past_pad_shifts_the_fill_value_and_per_channel_stays():
    proto = _pad(1.0, "Add", 0.25)
    m = apply(proto, [MoveLinearPastDataMovement])
    assert [n.op_type for n in m.graph] == ["Pad", "Add"]
    compare(proto, m, {"x": RNG.normal(size=(1, 2, 3, 3))})
    proto = _pad(1.0, "Mul", np.array([0.5, 2.0], np.float32).reshape(1, 2, 1, 1))
    m = apply(proto, [MoveLinearPastDataMovement])
    assert [n.op_type for n in m.graph] == ["Mul", "Pad"]  # a per-channel scale cannot pass a scalar fill


def test_per_channel_adds_at_a_join_stay_per_channel():
    b1 = np.array([1.0, -2.0, 3.0], np.float32).reshape(1, 3, 1, 1)
    b2 = np.array([0.5, 0.25, -1.0], np.float32).reshape(1, 3, 1, 1)
    nodes = [helper.make_node("Add", ["x", "b1"], ["p"], name="a1"),
             helper.make_node("Add", ["z", "b2"], ["q"], name="a2"),
             helper.make_node("Add", ["p", "q"], ["y"], name="join")]
    proto = graph_model(nodes, {"x": [1, 3, 2, 2], "z": [1, 3, 2, 2]}, {"y": [1, 3, 2, 2]}, {"b1": b1, "b2": b2})
    m = apply(proto, [MoveLinearPastEltwiseAdd] + COLLAPSE_PASSES)
    assert [n.op_type for n in m.graph] == ["Add", "Add"]
    const = m.get_initializer(m.graph.node(1).inputs[1].name)
    assert const.shape == (1, 3, 1, 1)
    np.testing.assert_array_equal(const.ravel(), (b1 + b2).ravel())
    compare(proto, m, {"x": RNG.normal(size=(1, 3, 2, 2)), "z": RNG.normal(size=(1, 3, 2, 2))})


def test_join_of_mismatched_transposes_is_not_merged():
    nodes = [helper.make_node("Transpose", ["x"], ["p"], perm=[0, 2, 3, 1], name="t1"),
             helper.make_node("Transpose", ["z"], ["q"], perm=[0, 3, 2, 1], name="t2"),
             helper.make_node("Add", ["p", "q"], ["y"], name="join")]
    proto = graph_model(nodes, {"x": [1, 3, 3, 3], "z": [1, 3, 3, 3]}, {"y": [1, 3, 3, 3]}, {})
    m = apply(proto, COLLAPSE_PASSES + REORDER_PASSES + ABSORB_PASSES + [ConvertToNHWC], fixpoint=False)
    x, z = RNG.normal(size=(1, 3, 3, 3)), RNG.normal(size=(1, 3, 3, 3))
    compare(proto, m, {"x": x, "z": z})
