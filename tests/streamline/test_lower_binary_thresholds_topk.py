"""ConvertBipolarMatMulToXnorPopcount, RoundAndClipThresholds and AbsorbScalarMulAddIntoTopK, each checked
exactly with the executor (thresholds on every integer of the input's range)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from finnlite.core.shapes import const_array
from streamline.datatypes import InferDataTypes
from streamline.layout import ConvertToNHWC
from streamline.lower_conv import LowerConvsToMatMul
from streamline.real_thresholds import RealThresholds, fractions_of, get_real_thresholds, set_real_thresholds
from streamline.round_thresholds import RoundAndClipThresholds
from streamline.topk import AbsorbScalarMulAddIntoTopK, strictly_increasing
from streamline.xnor import ConvertBipolarMatMulToXnorPopcount
from tests.streamline.test_lower_common import GraphBuilder, assert_exact, int_weights, op_types, run_passes

RNG = np.random.default_rng(5)


def _bipolar(shape):
    return RNG.choice([-1.0, 1.0], size=shape).astype(np.float32)


def _bipolar_mt(g, x, channels):
    """A bipolar MultiThreshold (out_scale 2, out_bias −1) of the integer input x."""
    return g.mt(x, np.zeros((channels, 1), np.float32), "BIPOLAR", out_scale=2.0, out_bias=-1.0)


# -- XNOR-popcount ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_threshold", [True, False])
def test_bipolar_matmul_to_xnor_popcount(with_threshold):
    g = GraphBuilder()
    k, n = 12, 5
    a = _bipolar_mt(g, "x", k)
    y = g.node("MatMul", [a, g.const(_bipolar((k, n)))])
    if with_threshold:
        t = np.sort(RNG.uniform(-14, 14, size=(n, 3)), axis=1).astype(np.float32)
        y = g.mt(y, t, "UINT2")
        mt_after = g.nodes[-1].name
    model = g.build({"x": (3, k)}, [y], {"x": "INT4"})
    if with_threshold:
        mt = model.get_node_from_name(mt_after)
        set_real_thresholds(mt, RealThresholds(fractions_of(const_array(mt.inputs[1])), np.zeros((n, 3), bool)))
    inputs = {"x": RNG.integers(-8, 8, size=(3, k)).astype(np.float32)}
    before, after, _ = run_passes(model, [InferDataTypes, ConvertBipolarMatMulToXnorPopcount], inputs)
    assert_exact(before, after)
    ops = op_types(model)
    assert "XnorPopcountMatMul" in ops and "MatMul" not in ops
    xnor = model.get_nodes_by_op_type("XnorPopcountMatMul")[0]
    assert model.get_tensor_datatype(xnor.inputs[0].name).name == "BINARY"
    assert model.get_tensor_datatype(xnor.inputs[1].name).name == "BINARY"
    assert set(np.unique(const_array(xnor.inputs[1]))) <= {0.0, 1.0}
    if with_threshold:
        assert "Mul" not in ops and "Add" not in ops  # the fix-up 2p − K went into the thresholds
        mt = model.get_node_from_name(mt_after)
        t_new = const_array(mt.inputs[1])
        assert t_new.min() >= 0 and t_new.max() <= k + 1
        # the exact thresholds followed: on the popcount p, level m is reached iff 2p − K ≥ R
        rt = get_real_thresholds(mt)
        np.testing.assert_array_equal(rt.integer_thresholds(0, k), t_new)
    else:
        assert ops.count("Mul") == 1 and ops.count("Add") == 1


def test_xnor_after_lowered_conv_without_padding():
    g = GraphBuilder()
    a = _bipolar_mt(g, "x", 3)
    y = g.node("Conv", [a, g.const(_bipolar((4, 3, 3, 3)))])
    y = g.node("MatMul", [g.node("Flatten", [y]), g.const(int_weights(RNG, (4 * 3 * 3, 2)))])
    model = g.build({"x": (1, 3, 5, 5)}, [y], {"x": "INT3"})
    inputs = {"x": RNG.integers(-4, 4, size=(1, 3, 5, 5)).astype(np.float32)}
    before, after, _ = run_passes(model, [LowerConvsToMatMul, ConvertToNHWC, InferDataTypes,
                                          ConvertBipolarMatMulToXnorPopcount], inputs)
    assert_exact(before, after)
    assert len(model.get_nodes_by_op_type("XnorPopcountMatMul")) == 1


def test_xnor_misses_padding_and_forks():
    g = GraphBuilder()
    a = _bipolar_mt(g, "x", 3)
    y = g.node("Conv", [a, g.const(_bipolar((4, 3, 3, 3)))], pads=[1, 1, 1, 1])
    b = _bipolar_mt(g, "z", 6)
    z = g.node("Add", [g.node("MatMul", [b, g.const(_bipolar((6, 2)))]), g.node("ReduceSum", [b], keepdims=1)])
    model = g.build({"x": (1, 3, 5, 5), "z": (1, 6)}, [y, z], {"x": "INT3", "z": "INT3"})
    LowerConvsToMatMul().apply(model)
    ConvertToNHWC().apply(model)
    InferDataTypes().apply(model)
    rule = ConvertBipolarMatMulToXnorPopcount()
    result = rule.run(model)
    assert not result.changed
    assert "XnorPopcountMatMul" not in op_types(model)
    assert "other consumers" in " ".join(m.reason for m in result.misses)
    # a padded Im2Col adds zeros; even under a (wrong) BIPOLAR annotation the rule does not apply
    model.set_tensor_datatype(model.get_nodes_by_op_type("Im2Col")[0].outputs[0].name, "BIPOLAR")
    result = rule.run(model)
    assert not result.changed
    assert any("padding Im2Col" in m.reason for m in result.misses)


# -- thresholds ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("in_dt,lo,hi", [("UINT4", 0, 15), ("INT5", -16, 15), ("BIPOLAR", -1, 1)])
def test_round_and_clip_thresholds_exact_on_every_input(in_dt, lo, hi):
    g = GraphBuilder()
    t = RNG.uniform(lo - 6, hi + 6, size=(4, 7))
    t[0, 0] = hi + 0.5  # above the maximum: must never be passed (FINN's clip to max would count x = max)
    t[1, 0] = lo - 3.0
    t = np.sort(t, axis=1).astype(np.float32)
    y = g.mt("x", t, "UINT3")
    model = g.build({"x": (1, 4, 2, (hi - lo + 1))}, [y], {"x": in_dt})
    values = np.arange(lo, hi + 1, dtype=np.float32)
    if in_dt == "BIPOLAR":
        values = np.array([-1, 1], np.float32)
        model = g.build({"x": (1, 4, 2, 2)}, [y], {"x": in_dt})
    x = np.broadcast_to(values, (1, 4, 2, values.size)).astype(np.float32)
    before, after, _ = run_passes(model, [RoundAndClipThresholds], {"x": x})
    assert_exact(before, after)
    mt = model.get_nodes_by_op_type("MultiThreshold")[0]
    t_new = const_array(mt.inputs[1])
    assert np.array_equal(t_new, np.round(t_new)) and t_new.min() >= lo and t_new.max() <= hi + 1
    assert np.all(np.diff(t_new, axis=1) >= 0)
    tdt = model.get_tensor_datatype(mt.inputs[1].name)
    assert all(tdt.allowed(v) for v in np.unique(t_new)) and tdt.allowed(lo)
    if in_dt == "UINT4":
        assert tdt.name == "UINT5"  # one bit wider for max + 1 = 16, instead of FINN's overflow


def test_round_and_clip_uses_exact_real_thresholds():
    """A float32 threshold one ulp above an integer (from a float32 near-tie) rounds up to the next integer; the
    node's exact real threshold says the integer itself."""
    g = GraphBuilder()
    t = np.array([[np.nextafter(np.float32(3), np.float32(4)), 7.5]], np.float32)
    y = g.mt("x", t, "UINT2")
    model = g.build({"x": (1, 1, 4, 4)}, [y], {"x": "UINT4"})
    mt = model.get_nodes_by_op_type("MultiThreshold")[0]
    real = np.array([[Fraction(3), Fraction(15, 2)]], dtype=object)
    set_real_thresholds(mt, RealThresholds(real, np.zeros((1, 2), bool)))
    assert RoundAndClipThresholds().apply(model)
    np.testing.assert_array_equal(const_array(mt.inputs[1]), [[3.0, 8.0]])
    assert get_real_thresholds(mt) is not None


def test_round_and_clip_leaves_float_inputs_and_shared_thresholds():
    g = GraphBuilder()
    t = g.const(np.array([[0.5, 1.5]], np.float32), "T")
    a = g.node("MultiThreshold", ["x", t], custom=True, out_dtype="UINT2")
    b = g.node("MultiThreshold", ["z", t], custom=True, out_dtype="UINT2")
    model = g.build({"x": (1, 1, 2, 2), "z": (1, 1, 2, 2)}, [a, b], {"x": "UINT2"})
    assert RoundAndClipThresholds().apply(model)
    np.testing.assert_array_equal(model.get_initializer("T"), [[0.5, 1.5]])  # z is float: its node keeps T
    mt_x = [n for n in model.get_nodes_by_op_type("MultiThreshold") if n.inputs[0].name == "x"][0]
    np.testing.assert_array_equal(const_array(mt_x.inputs[1]), [[1.0, 2.0]])
    assert not RoundAndClipThresholds().apply(model)


# -- TopK ------------------------------------------------------------------------------------------------------------
def _topk_model(scale, bias, use_values=False, in_dt="INT8"):
    g = GraphBuilder()
    y = g.node("MatMul", ["x", g.const(int_weights(RNG, (6, 10)))])
    y = g.node("Mul", [y, g.const(np.array(scale, np.float32))])
    y = g.node("Add", [y, g.const(np.array([bias], np.float32))])
    values, idx = g.node("TopK", [y, g.const(np.array([3], np.int64))], outputs=2)
    model = g.build({"x": (4, 6)}, [idx, values] if use_values else [idx], {"x": in_dt})
    InferDataTypes().apply(model)
    return model


def test_absorb_scalar_mul_add_into_topk():
    model = _topk_model(0.0123, -3.7)
    x = RNG.integers(-128, 128, size=(4, 6)).astype(np.float32)
    x[0, :] = x[1, :]  # ties survive
    before, after, _ = run_passes(model, [AbsorbScalarMulAddIntoTopK], {"x": x})
    assert_exact(before, after)
    assert op_types(model) == ["MatMul", "TopK"]
    topk = model.get_nodes_by_op_type("TopK")[0]
    assert model.get_tensor_datatype(topk.inputs[0].name).is_integer()


@pytest.mark.parametrize("scale,use_values,reason", [(-0.5, False, None), (0.5, True, "values output is used")])
def test_topk_conditions(scale, use_values, reason):
    model = _topk_model(scale, 1.0, use_values)
    rule = AbsorbScalarMulAddIntoTopK()
    result = rule.run(model)
    assert not result.changed
    assert "Mul" in op_types(model)
    if reason:
        assert any(reason in m.reason for m in result.misses)


def test_strictly_increasing_catches_float32_merges():
    assert strictly_increasing([("Mul", np.float32(0.1)), ("Add", np.float32(5.0))], -1000, 1000)
    assert not strictly_increasing([("Add", np.float32(2.0**26))], 0, 10)  # x + 2^26 rounds neighbours together
