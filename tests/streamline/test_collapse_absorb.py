"""Collapse and absorb rules, checked with the oracle on random inputs including ties."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from custom_ops.executor import Executor
from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN
from streamline.absorb import ABSORB_PASSES, MaterializeThresholds
from streamline.collapse import COLLAPSE_PASSES, CollapseRepeatedTranspose
from streamline.datatypes import InferDataTypes
from streamline.real_thresholds import quant_real_thresholds, set_real_thresholds
from streamline.pipeline import streamline_model
from tests.streamline.rulecheck import apply, compare, graph_model

RNG = np.random.default_rng(0)
ALL = COLLAPSE_PASSES + ABSORB_PASSES + [InferDataTypes, MaterializeThresholds]


def _mt(inp, out, thr, out_bias=0.0, dtype="UINT2", layout="NCHW"):
    return helper.make_node("MultiThreshold", [inp, thr], [out], domain=QONNX_DOMAIN, out_dtype=dtype,
                            out_bias=out_bias, data_layout=layout, name=f"mt_{out}")


def test_batchnorm_mul_add_relu_absorbed_into_thresholds():
    c = 4
    gamma = RNG.uniform(-1.5, 1.5, c).astype(np.float32)  # negative factors too
    nodes = [helper.make_node("Mul", ["x", "k"], ["xk"], name="scale"),
             helper.make_node("BatchNormalization", ["xk", "g", "b", "mu", "var"], ["bn"], epsilon=1e-5, name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             _mt("r", "y", "thr")]
    inits = {"k": np.float32(0.125), "g": gamma, "b": RNG.normal(size=c).astype(np.float32),
             "mu": RNG.normal(size=c).astype(np.float32), "var": RNG.uniform(0.5, 2, c).astype(np.float32),
             "thr": np.array([[0.25, 0.75, 1.25]], np.float32)}
    proto = graph_model(nodes, {"x": [2, c, 3, 3]}, {"y": [2, c, 3, 3]}, inits)
    m = apply(proto, ALL, annotate={"x": "INT8"})
    # per-channel signs must go somewhere: here they stay a Mul (no weights to move them into) unless all positive
    assert "BatchNormalization" not in m.op_histogram() and "Relu" not in m.op_histogram()
    x = RNG.integers(-128, 128, size=(2, c, 3, 3)).astype(np.float64)
    compare(proto, m, {"x": x})


def test_conv_weight_signs_and_scales_into_thresholds():
    c_in, c_out = 3, 5
    w = RNG.integers(-7, 8, size=(c_out, c_in, 3, 3)).astype(np.float32)
    scale = RNG.uniform(0.01, 0.1, size=(1, c_out, 1, 1)).astype(np.float32)
    gamma = RNG.uniform(-1.5, 1.5, c_out).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Mul", ["conv", "s"], ["cs"], name="wscale"),
             helper.make_node("BatchNormalization", ["cs", "g", "b", "mu", "var"], ["bn"], name="bn"),
             _mt("bn", "y", "thr")]
    rt = quant_real_thresholds(np.float32(0.3), 0.0, 2, False, False)
    inits = {"W": w, "s": scale, "g": gamma, "b": RNG.normal(size=c_out).astype(np.float32),
             "mu": RNG.normal(size=c_out).astype(np.float32), "var": RNG.uniform(0.5, 2, c_out).astype(np.float32),
             "thr": rt.float_thresholds()}
    proto = graph_model(nodes, {"x": [2, c_in, 5, 5]}, {"y": [2, c_out, 5, 5]}, inits)
    m = apply(proto, ALL, annotate={"x": "UINT4"})
    hist = m.op_histogram()
    assert hist == {"Conv": 1, "MultiThreshold": 1}, hist
    mt = m.get_nodes_by_op_type("MultiThreshold")[0]
    thr = m.get_initializer(mt.inputs[1].name)
    assert np.array_equal(thr, np.round(thr)), "thresholds on an integer accumulator are integers"
    x = RNG.integers(0, 16, size=(2, c_in, 5, 5)).astype(np.float64)
    compare(proto, m, {"x": x})


def test_negative_scalar_mul_reverses_thresholds_exactly_at_ties():
    nodes = [helper.make_node("Mul", ["x", "k"], ["xk"], name="neg"), _mt("xk", "y", "thr", out_bias=-1.0,
                                                                          dtype="INT2", layout="NC")]
    rt = quant_real_thresholds(np.float32(1.0), 0.0, 2, True, True)  # levels at -0.5 (strict), 0.5 (strict)
    proto = graph_model(nodes, {"x": [1, 20]}, {"y": [1, 20]}, {"k": np.float32(-0.5),
                                                                 "thr": rt.float_thresholds()})
    m = apply(proto, ALL, annotate={"x": "INT4"})
    assert m.op_histogram() == {"MultiThreshold": 1}
    x = np.array([np.arange(-8, 8).tolist() + [-1, 1, 0, 0]], dtype=np.float64)  # ±1 → ∓0.5: exact ties
    compare(proto, m, {"x": x})


@pytest.mark.parametrize("op", ["Sign"])
def test_sign_to_threshold(op):
    nodes = [helper.make_node(op, ["x"], ["y"], name="sign")]
    proto = graph_model(nodes, {"x": [1, 8]}, {"y": [1, 8]}, {})
    m = apply(proto, ALL)
    assert m.op_histogram() == {"MultiThreshold": 1}
    x = np.array([[-2.0, -1e-30, -0.0, 0.0, 1e-40, 3.0, -7.5, 1.0]])
    compare(proto, m, {"x": x})


def test_div_and_repeated_mul_add_collapse():
    nodes = [helper.make_node("Div", ["x", "d"], ["a"], name="div"),
             helper.make_node("Add", ["a", "b1"], ["b"], name="add1"),
             helper.make_node("Mul", ["b", "m1"], ["c"], name="mul1"),
             helper.make_node("Mul", ["c", "m2"], ["e"], name="mul2"),
             helper.make_node("Add", ["e", "b2"], ["y"], name="add2")]
    inits = {"d": np.float32(3.0), "b1": np.float32(0.5), "m1": np.array([1.5, -2.0, 0.25], np.float32),
             "m2": np.float32(0.1), "b2": np.array([1.0, 2.0, 3.0], np.float32)}
    proto = graph_model(nodes, {"x": [2, 3]}, {"y": [2, 3]}, inits)
    m = apply(proto, ALL)
    assert m.op_histogram() == {"Mul": 1, "Add": 1}
    compare(proto, m, {"x": RNG.normal(size=(2, 3))}, rtol=1e-6)


@pytest.mark.parametrize("how", ["rule", "pipeline"])
def test_inverse_transposes_between_graph_input_and_output_keep_the_interface(how):
    """x → Transpose(p) → Transpose(p⁻¹) → y with x the graph input and y the graph output: the composition is the
    identity, but neither name may change (an Identity node keeps both)."""
    perm = [0, 2, 3, 1]
    inverse = [perm.index(i) for i in range(4)]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm, name="t1"),
             helper.make_node("Transpose", ["t"], ["y"], perm=inverse, name="t2")]
    proto = graph_model(nodes, {"x": [1, 2, 3, 4]}, {"y": [1, 2, 3, 4]}, {})
    if how == "rule":
        m = apply(proto, [CollapseRepeatedTranspose])
        assert m.op_histogram() == {"Identity": 1}
    else:
        m = Model(proto)
        streamline_model(m)
    assert m.input_names == ["x"] and m.output_names == ["y"]
    m.check_graph()
    x = RNG.normal(size=(1, 2, 3, 4)).astype(np.float32)
    got = Executor(m).run({"x": x})
    assert list(got) == ["y"]
    np.testing.assert_array_equal(got["y"], x)


@pytest.mark.parametrize("negative", [False, True])
def test_per_channel_affine_into_a_per_tensor_multithreshold_of_rank_3(negative):
    """A Conv1d + BatchNorm1d output (N, C, W) before a per-tensor MultiThreshold without a data_layout (qonnx then
    guesses NWC for rank 3): the MultiThreshold takes the channel axis of the per-channel Mul and Add (NCW), with the
    signs of negative factors moved into the Conv1d's weights."""
    from custom_ops.multithreshold import channel_axis_of

    c_in, c_out = 3, 4
    w = RNG.integers(-7, 8, size=(c_out, c_in, 3)).astype(np.float32)
    scale = RNG.uniform(0.01, 0.1, size=(1, c_out, 1)).astype(np.float32)
    if negative:
        scale[0, 1, 0] *= -1
    nodes = [helper.make_node("Conv", ["x", "W"], ["conv"], pads=[1, 1], name="conv"),
             helper.make_node("Mul", ["conv", "s"], ["cs"], name="bn_mul"),
             helper.make_node("Add", ["cs", "b"], ["bn"], name="bn_add"),
             helper.make_node("MultiThreshold", ["bn", "thr"], ["y"], domain=QONNX_DOMAIN, out_dtype="UINT2",
                              name="mt")]
    rt = quant_real_thresholds(np.float32(0.3), 0.0, 2, False, False)
    inits = {"W": w, "s": scale, "b": RNG.normal(size=(1, c_out, 1)).astype(np.float32),
             "thr": rt.float_thresholds()}
    proto = graph_model(nodes, {"x": [2, c_in, 6]}, {"y": [2, c_out, 6]}, inits)
    m = apply(proto, ALL, annotate={"x": "UINT4"})
    assert [n.op_type for n in m.graph] == ["Conv", "MultiThreshold"]
    mt = m.get_nodes_by_op_type("MultiThreshold")[0]
    assert channel_axis_of(mt.attributes["data_layout"].value, 3) == 1
    x = RNG.integers(0, 16, size=(2, c_in, 6)).astype(np.float64)
    compare(proto, m, {"x": x})
