"""Reorder rules: scales and biases moved past linear ops, forks and joins, checked with the oracle."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from onnx import helper

from streamline.absorb import ABSORB_PASSES
from streamline.collapse import COLLAPSE_PASSES
from streamline.move import MoveMulPastLinear
from streamline.reorder import REORDER_PASSES, MoveAddPastConv, MoveLinearPastEltwiseAdd
from tests.streamline.rulecheck import apply, compare, graph_model

RNG = np.random.default_rng(1)
ALL = COLLAPSE_PASSES + REORDER_PASSES + ABSORB_PASSES


def _ints(shape, lo=-3, hi=4):
    return RNG.integers(lo, hi, size=shape).astype(np.float64)


def test_scalar_mul_and_add_past_matmul():
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="mul"),
             helper.make_node("Add", ["xa", "b"], ["xb"], name="add"),
             helper.make_node("MatMul", ["xb", "W"], ["y"], name="mm")]
    inits = {"a": np.float32(0.375), "b": np.array([0.5, -1.0, 2.0, 0.25], np.float32),
             "W": RNG.integers(-3, 4, size=(4, 5)).astype(np.float32)}
    proto = graph_model(nodes, {"x": [3, 4]}, {"y": [3, 5]}, inits)
    m = apply(proto, ALL)
    assert [n.op_type for n in m.graph] == ["MatMul", "Mul", "Add"]
    compare(proto, m, {"x": _ints((3, 4))})


def test_per_feature_mul_stays_before_matmul():
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="mul"),
             helper.make_node("MatMul", ["xa", "W"], ["y"], name="mm")]
    proto = graph_model(nodes, {"x": [3, 4]}, {"y": [3, 5]},
                        {"a": np.array([1, 2, 3, 4], np.float32), "W": np.ones((4, 5), np.float32)})
    m = apply(proto, ALL)
    assert [n.op_type for n in m.graph] == ["Mul", "MatMul"]


def test_mul_past_padded_conv_and_depthwise_per_channel():
    c = 4
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="mul"),
             helper.make_node("Conv", ["xa", "Wd"], ["d"], group=c, pads=[1, 1, 1, 1], name="dw"),
             helper.make_node("Mul", ["d", "s"], ["ds"], name="mul2"),
             helper.make_node("Conv", ["ds", "W"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv")]
    inits = {"a": RNG.uniform(0.1, 1, (1, c, 1, 1)).astype(np.float32),
             "Wd": RNG.integers(-3, 4, (c, 1, 3, 3)).astype(np.float32), "s": np.float32(0.5),
             "W": RNG.integers(-3, 4, (6, c, 3, 3)).astype(np.float32)}
    proto = graph_model(nodes, {"x": [2, c, 6, 6]}, {"y": [2, 6, 3, 3]}, inits)
    m = apply(proto, [MoveMulPastLinear] + COLLAPSE_PASSES)
    # the per-channel scale passes the depthwise Conv and stops at the dense one; the scalar passes both
    assert [n.op_type for n in m.graph] == ["Conv", "Mul", "Conv", "Mul"]
    compare(proto, m, {"x": _ints((2, c, 6, 6))})


def test_add_past_conv_only_without_padding():
    c = 3
    for pads, moved in (([0, 0, 0, 0], True), ([1, 1, 1, 1], False)):
        nodes = [helper.make_node("Add", ["x", "b"], ["xb"], name="add"),
                 helper.make_node("Conv", ["xb", "W"], ["y"], pads=pads, name="conv")]
        inits = {"b": RNG.normal(size=(1, c, 1, 1)).astype(np.float32),
                 "W": RNG.integers(-3, 4, (2, c, 3, 3)).astype(np.float32)}
        oshape = [1, 2, 4, 4] if pads[0] == 0 else [1, 2, 6, 6]
        proto = graph_model(nodes, {"x": [1, c, 6, 6]}, {"y": oshape}, inits)
        m = apply(proto, [MoveAddPastConv])
        assert ([n.op_type for n in m.graph] == ["Conv", "Add"]) == moved
        compare(proto, m, {"x": _ints((1, c, 6, 6))})


def test_maxpool_non_negative_only():
    for a, moved in ((np.float32(0.5), True), (np.float32(0.0), True), (np.float32(-0.5), False)):
        nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="mul"),
                 helper.make_node("MaxPool", ["xa"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool")]
        proto = graph_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 2, 2]}, {"a": a})
        m = apply(proto, [MoveMulPastLinear])
        assert ([n.op_type for n in m.graph] == ["MaxPool", "Mul"]) == moved
        compare(proto, m, {"x": RNG.normal(size=(1, 2, 4, 4))})


def test_fork_and_residual_join_with_equal_and_unequal_scales():
    # x -> Mul(s) -> fork: conv branch and identity branch -> Mul scales -> Add
    c = 3
    for s2, expect_float in ((0.25, False), (0.125 * 3, False), (0.3, True)):
        nodes = [helper.make_node("Mul", ["x", "s"], ["xs"], name="in_scale"),
                 helper.make_node("Conv", ["xs", "W"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
                 helper.make_node("Mul", ["conv", "s2"], ["cs"], name="w_scale"),
                 helper.make_node("Add", ["cs", "xs"], ["y"], name="join")]
        inits = {"s": np.float32(0.25), "s2": np.float32(s2),
                 "W": RNG.integers(-3, 4, (c, c, 3, 3)).astype(np.float32)}
        proto = graph_model(nodes, {"x": [1, c, 4, 4]}, {"y": [1, c, 4, 4]}, inits)
        m = apply(proto, ALL)
        ops = [n.op_type for n in m.graph]
        inner_muls = [m.get_initializer(n.inputs[1].name) for n in list(m.graph)[:-1] if n.op_type == "Mul"]
        integer_inner = all(np.array_equal(k, np.round(k)) for k in inner_muls)
        assert (ops[-1] == "Mul") != expect_float, ops
        assert integer_inner != expect_float, ops  # a small scale ratio leaves only integer factors inside
        compare(proto, m, {"x": _ints((1, c, 4, 4))})


def test_concat_of_differently_scaled_branches():
    nodes = [helper.make_node("Mul", ["x1", "a"], ["p"], name="m1"),
             helper.make_node("Mul", ["x2", "b"], ["q"], name="m2"),
             helper.make_node("Concat", ["p", "q"], ["y"], axis=1, name="cat")]
    proto = graph_model(nodes, {"x1": [1, 2, 3, 3], "x2": [1, 3, 3, 3]}, {"y": [1, 5, 3, 3]},
                        {"a": np.float32(0.5), "b": np.array([1, 2, 3], np.float32).reshape(1, 3, 1, 1)})
    m = apply(proto, ALL)
    assert [n.op_type for n in m.graph] == ["Concat", "Mul"]
    compare(proto, m, {"x1": _ints((1, 2, 3, 3)), "x2": _ints((1, 3, 3, 3))})


def test_rules_reach_fixpoint_on_join_rule_alone():
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="add"),
             helper.make_node("Add", ["a", "z"], ["y"], name="join")]
    proto = graph_model(nodes, {"x": [1, 4], "z": [1, 4]}, {"y": [1, 4]}, {"c": np.float32(1.5)})
    m = apply(proto, [MoveLinearPastEltwiseAdd])
    assert [n.op_type for n in m.graph] == ["Add", "Add"] and m.graph.node(1).inputs[1].const_value is not None
    compare(proto, m, {"x": _ints((1, 4)), "z": _ints((1, 4))})


def test_add_past_conv_sums_the_weights_exactly():
    """c_o = Σ W[o, i, k]·b_i with the weight sum taken exactly: in float32, 1e8 + 1 - 1e8 is 0, not 1."""
    from streamline.exact import exact_value

    nodes = [helper.make_node("Add", ["x", "b"], ["xb"], name="add"),
             helper.make_node("Conv", ["xb", "W"], ["y"], name="conv")]
    w = np.array([1e8, 1.0, -1e8], np.float32).reshape(1, 1, 1, 3)
    assert w.sum() == 0  # the float32 sum loses the 1
    proto = graph_model(nodes, {"x": [1, 1, 1, 5]}, {"y": [1, 1, 1, 3]}, {"b": np.float32(0.5), "W": w})
    m = apply(proto, [MoveAddPastConv])
    add = next(n for n in m.graph if n.op_type == "Add")
    const = add.inputs[1].const_value.numpy()
    assert exact_value(add, const).reshape(-1)[0] == Fraction(1, 2)  # exactly Σ w · b = 1 · 0.5


def test_concat_of_equally_scaled_branches_gives_a_scalar_that_passes_a_conv():
    """One quantizer shared by both inputs of a Concat: the factor after the Concat is equal on every channel, so
    it stays a scalar and moves on past the next (non-depthwise) Conv; unequal factors stay per-channel there."""
    from streamline.move import MoveLinearPastDataMovement

    w = RNG.integers(-3, 4, size=(2, 5, 3, 3)).astype(np.float32)
    for b, expected in ((0.375, ["Concat", "Conv", "Mul"]), (0.25, ["Concat", "Mul", "Conv"])):
        nodes = [helper.make_node("Mul", ["x1", "a"], ["p"], name="m1"),
                 helper.make_node("Mul", ["x2", "b"], ["q"], name="m2"),
                 helper.make_node("Concat", ["p", "q"], ["c"], axis=1, name="cat"),
                 helper.make_node("Conv", ["c", "W"], ["y"], pads=[1, 1, 1, 1], name="conv")]
        proto = graph_model(nodes, {"x1": [1, 2, 4, 4], "x2": [1, 3, 4, 4]}, {"y": [1, 2, 4, 4]},
                            {"a": np.float32(0.375), "b": np.full((1, 3, 1, 1), b, np.float32), "W": w})
        m = apply(proto, [MoveLinearPastDataMovement, MoveMulPastLinear])
        assert [n.op_type for n in m.graph] == expected
        compare(proto, m, {"x1": _ints((1, 2, 4, 4)), "x2": _ints((1, 3, 4, 4))})
