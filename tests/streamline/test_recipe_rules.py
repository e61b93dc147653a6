"""The rules issue 33's recipes needed besides the op table: products of two quantized tensors (squeeze-excitation),
two-scale inputs of a MatMul (an image and a side vector), signed levels before a padded MaxPool (an Inception
branch), signs through a Concat; each on its smallest graph, over several seeds, checked by the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite import Model, PassManager, Stage
from streamline.absorb import ABSORB_PASSES, AbsorbSignIntoWeights
from streamline.collapse import COLLAPSE_PASSES
from streamline.datatypes import InferDataTypes
from streamline.join_conv import IntegerConvInputScales
from streamline.pool_sign import ShiftSignedLevelsPastPaddedMaxPool
from streamline.real_thresholds import RealThresholds, fractions_of, set_real_thresholds
from streamline.reorder import REORDER_PASSES, MoveMulPastEltwiseMul
from tests.streamline.rulecheck import apply, compare, graph_model

SEEDS = range(4)
QONNX = "qonnx.custom_op.general"


def _ints(rng, shape, lo=-8, hi=7):
    return rng.integers(lo, hi + 1, size=shape).astype(np.float64)


@pytest.mark.parametrize("a,b,shapes", [
    (0.25, 0.5, ([2, 3, 4, 4], [2, 3, 1, 1])),
    ("channel", -0.375, ([2, 3, 4, 4], [2, 3, 1, 1])),
    (0.125, "channel", ([2, 3, 4, 4], [1, 3, 4, 4])),
    (-2.0, None, ([2, 5], [2, 5])),
])
def test_factors_of_a_product_move_past_it(a, b, shapes):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)

        def const(v):
            return (rng.uniform(-2, 2, (1, 3, 1, 1)).astype(np.float32) if v == "channel" else np.float32(v))

        nodes = [helper.make_node("Mul", ["x", "ka"], ["xa"], name="sa")]
        inits = {"ka": const(a)}
        right = "z"
        if b is not None:
            nodes.append(helper.make_node("Mul", ["z", "kb"], ["zb"], name="sb"))
            inits["kb"] = const(b)
            right = "zb"
        nodes.append(helper.make_node("Mul", ["xa", right], ["y"], name="gate"))
        proto = graph_model(nodes, {"x": shapes[0], "z": shapes[1]}, {}, inits)
        proto.graph.output.append(helper.make_tensor_value_info("y", 1, None))
        m = apply(proto, [MoveMulPastEltwiseMul] + COLLAPSE_PASSES)
        ops = [n.op_type for n in m.graph]
        assert ops == ["Mul", "Mul"], ops  # the product of the raw tensors, then one constant factor
        assert all(v.const_value is None for v in m.graph.node(0).inputs)
        compare(proto, m, {"x": _ints(rng, shapes[0]), "z": _ints(rng, shapes[1], 0, 15)})


def _mt_after(node_out: str, rng, rows: int, steps: int = 5, lo: int = -40, hi: int = 40):
    t = np.sort(rng.integers(lo, hi, size=(rows, steps)), axis=1).astype(np.float32) + 0.5
    return t, helper.make_node("MultiThreshold", [node_out, "t"], ["y"], domain=QONNX, name="mt", out_dtype="UINT3")


def _with_real_thresholds(proto, names=("mt",)) -> Model:
    m = Model(proto)
    m.infer_shapes()
    for name in names:
        node = m.get_node_from_name(name)
        t = node.inputs[1].const_value.numpy()
        set_real_thresholds(node, RealThresholds(fractions_of(t), np.zeros(t.shape, bool)))
    return m


@pytest.mark.parametrize("s1,s2", [(0.25, 0.375), (0.5, 0.125), (0.75, -0.5)])
def test_a_matmul_over_features_of_two_scales_takes_integer_multipliers(s1, s2):
    """A flatten of an image (scale s1) concatenated with a side vector (scale s2) into a MatMul read by thresholds:
    per output feature, integers (p, q) on the two groups of weight rows, proven on the integer box."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        scale = np.array([s1] * 6 + [s2] * 3, np.float32).reshape(1, 9)
        w = rng.integers(-3, 4, size=(9, 4)).astype(np.float32)
        t, mt = _mt_after("mm", rng, 4)
        nodes = [helper.make_node("Mul", ["x", "s"], ["xs"], name="scale"),
                 helper.make_node("MatMul", ["xs", "w"], ["mm"], name="fc"), mt]
        proto = graph_model(nodes, {"x": [1, 9]}, {"y": [1, 4]}, {"s": scale, "w": w, "t": t})
        m = _with_real_thresholds(proto)
        m.set_tensor_datatype("x", "INT4")
        PassManager([Stage("s", [InferDataTypes, IntegerConvInputScales], fixpoint=True)]).run(m)
        assert [n.op_type for n in m.graph] == ["MatMul", "MultiThreshold"]
        for _ in range(4):
            compare(proto, m, {"x": _ints(rng, (8, 9))})


@pytest.mark.parametrize("bits,fork", [(2, False), (3, True), (4, True)])
def test_signed_levels_start_at_zero_before_a_padded_max_pool(bits, fork):
    """FINN pads a max pool with zeros: the signed levels −2^(b−1) … become 0 …, the bias an Add after the pool (and
    before the MultiThreshold's other consumers)."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        n = 2 ** bits - 1
        t = np.sort(rng.integers(-20, 20, size=(3, n)), axis=1).astype(np.float32)
        nodes = [helper.make_node("MultiThreshold", ["x", "t"], ["q"], domain=QONNX, name="mt",
                                  out_dtype=f"INT{bits}", out_bias=float(-(2 ** (bits - 1)))),
                 helper.make_node("MaxPool", ["q"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="pool")]
        outputs = {"y": [1, 3, 4, 4]}
        if fork:
            nodes.append(helper.make_node("Relu", ["q"], ["r"], name="other"))
            outputs["r"] = [1, 3, 4, 4]
        proto = graph_model(nodes, {"x": [1, 3, 4, 4]}, outputs, {"t": t})
        m = _with_real_thresholds(proto)
        PassManager([Stage("s", [ShiftSignedLevelsPastPaddedMaxPool])]).run(m)
        mt = m.get_node_from_name("mt")
        assert mt.attributes["out_bias"].value == 0.0 and mt.attributes["out_dtype"].value.startswith("UINT")
        pool = next(n for n in m.graph if n.op_type == "MaxPool")
        assert pool.inputs[0] is mt.outputs[0]
        assert next(iter(pool.outputs[0].uses())).node.op_type == "Add"
        compare(proto, m, {"x": _ints(rng, (1, 3, 4, 4), -25, 25)})


def test_signs_of_a_concat_go_into_each_branch():
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        w1 = rng.integers(-3, 4, size=(2, 3, 1, 1)).astype(np.float32)
        w2 = rng.integers(-3, 4, size=(3, 3, 1, 1)).astype(np.float32)
        a = (rng.uniform(0.2, 2, 5) * rng.choice([-1, 1], 5)).astype(np.float32).reshape(1, 5, 1, 1)
        a[0, 0] = -abs(a[0, 0])
        nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="b1"),
                 helper.make_node("Conv", ["x", "w2"], ["c2"], name="b2"),
                 helper.make_node("Concat", ["c1", "c2"], ["c"], axis=1, name="cat"),
                 helper.make_node("Mul", ["c", "a"], ["y"], name="bn")]
        proto = graph_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5, 4, 4]}, {"w1": w1, "w2": w2, "a": a})
        m = apply(proto, [AbsorbSignIntoWeights])
        k = next(n for n in m.graph if n.op_type == "Mul").inputs[1].const_value.numpy()
        assert np.all(k > 0)
        compare(proto, m, {"x": _ints(rng, (1, 3, 4, 4))})


def test_the_recipes_rules_reach_a_fixpoint_together():
    """Gate, shift and signs in one streamlining round set: no two of them undo each other."""
    rng = np.random.default_rng(9)
    t = np.sort(rng.integers(-20, 20, size=(1, 7)), axis=1).astype(np.float32)
    nodes = [helper.make_node("MultiThreshold", ["x", "t"], ["q"], domain=QONNX, name="mt", out_dtype="INT3",
                              out_bias=-4.0),
             helper.make_node("MaxPool", ["q"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="pool"),
             helper.make_node("Mul", ["p", "s"], ["ps"], name="scale"),
             helper.make_node("Mul", ["ps", "g"], ["y"], name="gate")]
    proto = graph_model(nodes, {"x": [1, 2, 3, 3], "g": [1, 2, 1, 1]}, {"y": [1, 2, 3, 3]},
                        {"t": t, "s": np.float32(0.5)})
    m = _with_real_thresholds(proto)
    PassManager([Stage("s", [InferDataTypes, *COLLAPSE_PASSES, *REORDER_PASSES, *ABSORB_PASSES,
                             ShiftSignedLevelsPastPaddedMaxPool], fixpoint=True)]).run(m)
    compare(proto, m, {"x": _ints(rng, (1, 2, 3, 3), -25, 25), "g": _ints(rng, (1, 2, 1, 1), 0, 3)})
