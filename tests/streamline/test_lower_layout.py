"""NCHW → NHWC: MakeMaxPoolNHWC, ConvertToNHWC (one Transpose left, at the input) and FINN's local Transpose rules,
each checked exactly with the executor on random integer inputs."""

from __future__ import annotations

import numpy as np
import pytest

from finnlite.core.passes import fingerprint
from finnlite.core.shapes import const_array
from streamline.layout import AbsorbConsecutiveTransposes, AbsorbTransposeIntoMultiThreshold, ConvertToNHWC
from streamline.lower_conv import LowerConvsToMatMul
from streamline.lower_pool import MakeMaxPoolNHWC
from streamline.real_thresholds import RealThresholds, fractions_of, get_real_thresholds, set_real_thresholds
from tests.streamline.test_lower_common import (GraphBuilder, assert_exact, assert_transposes_only_at_input,
                                                int_weights, op_types, run_passes, sorted_thresholds)

RNG = np.random.default_rng(11)
LAYOUT = [LowerConvsToMatMul, MakeMaxPoolNHWC, ConvertToNHWC]


def _x(shape, lo=0, hi=15):
    return {"x": RNG.integers(lo, hi + 1, size=shape).astype(np.float32)}


def _attrs(node):
    return {k: a.value for k, a in node.attributes.items()}


@pytest.mark.parametrize("kernel,strides,pads,ceil_mode", [
    ((2, 2), (2, 2), (0, 0, 0, 0), 0), ((3, 3), (2, 2), (1, 1, 1, 1), 0), ((3, 2), (1, 2), (1, 0, 1, 1), 0),
    ((3, 3), (2, 2), (0, 0, 0, 0), 1)])
def test_make_maxpool_nhwc(kernel, strides, pads, ceil_mode):
    g = GraphBuilder()
    y = g.node("MaxPool", ["x"], kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
               ceil_mode=ceil_mode)
    model = g.build({"x": (1, 3, 7, 8)}, [y], {"x": "INT4"})
    before, after, _ = run_passes(model, [MakeMaxPoolNHWC], _x((1, 3, 7, 8), -8, 7))
    assert_exact(before, after)
    pool = model.get_nodes_by_op_type("MaxPoolNHWC")[0]
    assert list(_attrs(pool)["pads"]) == list(pads) and _attrs(pool)["ceil_mode"] == ceil_mode
    assert model.get_tensor_layout(pool.inputs[0].name) == list("NHWC")
    assert model.get_tensor_datatype(pool.outputs[0].name).name == "INT4"
    assert "MaxPool" not in op_types(model)


def _block_model(flatten_consumer="matmul"):
    """conv → MT → depthwise conv → MT → residual Add → MaxPool → per-channel Mul, Add → Concat(axis 1) with a conv
    branch → QuantAvgPool2d → Flatten (H·W = 4) → [Add per feature → MT per feature] → MatMul."""
    g = GraphBuilder()
    c = 4
    a = g.mt(g.node("Conv", ["x", g.const(int_weights(RNG, (c, 3, 3, 3)))], pads=[1, 1, 1, 1]),
             sorted_thresholds(RNG, c, 3, -30, 30), "UINT2")
    b = g.mt(g.node("Conv", [a, g.const(int_weights(RNG, (c, 1, 3, 3)))], pads=[1, 1, 1, 1], group=c),
             sorted_thresholds(RNG, 1, 3, -6, 6), "UINT2")
    s = g.node("Add", [a, b])
    p = g.node("MaxPool", [s], kernel_shape=[2, 2], strides=[2, 2])
    p = g.node("Mul", [p, g.const(RNG.integers(1, 4, size=(1, c, 1, 1)).astype(np.float32))])
    p = g.node("Add", [p, g.const(RNG.integers(-2, 3, size=(c, 1, 1)).astype(np.float32))])
    br = g.mt(g.node("Conv", [p, g.const(int_weights(RNG, (2, c, 1, 1)))]), sorted_thresholds(RNG, 2, 3, -8, 8))
    cat = g.node("Concat", [p, br], axis=1)
    avg = g.node("QuantAvgPool2d", [cat], custom=True, kernel=2, stride=2, ibits=5, obits=5, signed=1)
    f = g.node("Flatten", [avg])
    feats = (c + 2) * 2 * 2
    if flatten_consumer == "matmul":
        f = g.node("Add", [f, g.const(RNG.integers(-3, 4, size=(1, feats)).astype(np.float32))])
        f = g.mt(f, sorted_thresholds(RNG, feats, 3, -20, 20), "UINT2")
        y = g.node("MatMul", [f, g.const(int_weights(RNG, (feats, 5)))])
        outs = [y]
    else:
        outs = [f]
    model = g.build({"x": (1, 3, 8, 8)}, outs, {"x": "UINT4"})
    return model


def test_convert_to_nhwc_block_exact_with_one_transpose():
    model = _block_model()
    mt2d = [n for n in model.get_nodes_by_op_type("MultiThreshold") if len(n.inputs[0].shape) == 2][0]
    t = const_array(mt2d.inputs[1])
    set_real_thresholds(mt2d, RealThresholds(fractions_of(t - 0.5), np.zeros(t.shape, bool)))
    before, after, report = run_passes(model, LAYOUT, _x((1, 3, 8, 8)))
    assert_exact(before, after)
    assert_transposes_only_at_input(model)
    assert len(model.get_nodes_by_op_type("Transpose")) == 1
    assert not [m for m in report.misses if m.rule == "ConvertToNHWC"]
    for n in model.get_nodes_by_op_type("MultiThreshold"):
        if len(n.inputs[0].shape) == 4:
            assert _attrs(n)["data_layout"] == "NHWC"
            assert model.get_tensor_layout(n.outputs[0].name) == list("NHWC")
    assert _attrs(model.get_nodes_by_op_type("QuantAvgPool2d")[0])["data_layout"] == "NHWC"
    assert _attrs(model.get_nodes_by_op_type("Concat")[0])["axis"] == 3
    # the per-feature rows moved with the features, the exact thresholds with them
    mt2d = [n for n in model.get_nodes_by_op_type("MultiThreshold") if len(n.inputs[0].shape) == 2][0]
    rt = get_real_thresholds(mt2d)
    np.testing.assert_array_equal(rt.integer_thresholds(), const_array(mt2d.inputs[1]))
    assert model.get_tensor_layout(mt2d.outputs[0].name) == ["N", "C"]


def test_flatten_to_graph_output_falls_back_to_a_transpose():
    model = _block_model(flatten_consumer="output")
    before, after, report = run_passes(model, LAYOUT, _x((1, 3, 8, 8)))
    assert_exact(before, after)
    misses = [m for m in report.misses if m.rule == "ConvertToNHWC"]
    assert misses and "original order" in misses[0].reason
    assert len(model.get_nodes_by_op_type("Transpose")) == 2


def test_4d_graph_output_keeps_its_layout_and_name():
    g = GraphBuilder()
    y = g.mt(g.node("Conv", ["x", g.const(int_weights(RNG, (3, 2, 3, 3)))], pads=[1, 1, 1, 1]),
             sorted_thresholds(RNG, 3, 3, -10, 10), out="y")
    model = g.build({"x": (1, 2, 5, 5)}, [y], {"x": "UINT2"})
    before, after, _ = run_passes(model, LAYOUT, _x((1, 2, 5, 5), 0, 3))
    assert_exact(before, after)
    assert model.output_names == ["y"]
    assert model.get_tensor_layout("y") == list("NCHW")


def test_input_read_by_two_convs_gets_one_transpose():
    g = GraphBuilder()
    a = g.node("Conv", ["x", g.const(int_weights(RNG, (3, 2, 3, 3)))], pads=[1, 1, 1, 1])
    b = g.node("Conv", ["x", g.const(int_weights(RNG, (3, 2, 1, 1)))])
    y = g.node("MatMul", [g.node("Flatten", [g.node("Add", [a, b])]), g.const(int_weights(RNG, (48, 2)))])
    model = g.build({"x": (1, 2, 4, 4)}, [y], {"x": "UINT2"})
    before, after, _ = run_passes(model, LAYOUT, _x((1, 2, 4, 4), 0, 3))
    assert_exact(before, after)
    assert_transposes_only_at_input(model)
    assert len(model.get_nodes_by_op_type("Transpose")) == 1


def test_convert_to_nhwc_is_idempotent():
    model = _block_model()
    run_passes(model, LAYOUT, _x((1, 3, 8, 8)))
    fp = fingerprint(model)
    assert not ConvertToNHWC().apply(model)
    assert fingerprint(model) == fp


def test_graph_without_4d_tensors_is_left_alone():
    g = GraphBuilder()
    y = g.node("MatMul", [g.node("Flatten", ["x"]), g.const(int_weights(RNG, (16, 3)))])
    model = g.build({"x": (1, 1, 4, 4)}, [y])
    assert not ConvertToNHWC().apply(model)
    assert "Transpose" not in op_types(model)


def test_unlowered_grouped_conv_gets_transposes_around_it():
    g = GraphBuilder()
    a = g.node("Conv", ["x", g.const(int_weights(RNG, (4, 2, 3, 3)))], pads=[1, 1, 1, 1])
    b = g.node("Conv", [a, g.const(int_weights(RNG, (4, 2, 3, 3)))], pads=[1, 1, 1, 1], group=2)
    y = g.node("MatMul", [g.node("Flatten", [b]), g.const(int_weights(RNG, (64, 2)))])
    model = g.build({"x": (1, 2, 4, 4)}, [y], {"x": "UINT2"})
    passes = [LowerConvsToMatMul(dense_grouped=False), MakeMaxPoolNHWC, ConvertToNHWC]
    before, after, report = run_passes(model, passes, _x((1, 2, 4, 4), 0, 3))
    assert_exact(before, after)
    assert "Conv" in op_types(model)
    assert any(m.rule == "ConvertToNHWC" and "Conv" in m.reason for m in report.misses)


def test_absorb_transpose_into_multithreshold_and_consecutive_transposes():
    g = GraphBuilder()
    t = g.node("Transpose", ["x"], perm=[0, 3, 1, 2])  # x is NHWC
    m = g.mt(t, sorted_thresholds(RNG, 3, 2, -5, 5))
    y = g.node("Transpose", [m], perm=[0, 2, 3, 1], out="y")
    model = g.build({"x": (1, 4, 5, 3)}, [y], {"x": "INT4"})
    mt = model.get_nodes_by_op_type("MultiThreshold")[0]
    set_real_thresholds(mt, RealThresholds(fractions_of(const_array(mt.inputs[1])), np.zeros((3, 2), bool)))
    before, after, _ = run_passes(model, [AbsorbTransposeIntoMultiThreshold, AbsorbConsecutiveTransposes],
                                  _x((1, 4, 5, 3), -8, 7))
    assert_exact(before, after)
    assert op_types(model) == ["MultiThreshold"]
    mt = model.get_nodes_by_op_type("MultiThreshold")[0]
    assert _attrs(mt)["data_layout"] == "NHWC" and get_real_thresholds(mt) is not None
    assert model.output_names == ["y"]


def test_consecutive_transposes_cancel_on_matching_fork_branches_only():
    g = GraphBuilder()
    t = g.node("Transpose", [g.node("Relu", ["x"])], perm=[0, 2, 3, 1])
    a = g.node("Transpose", [t], perm=[0, 3, 1, 2])
    b = g.node("Transpose", [t], perm=[0, 2, 1, 3])
    y = g.node("Add", [a, g.node("Transpose", [b], perm=[0, 3, 2, 1])])
    model = g.build({"x": (1, 2, 3, 4)}, [y])
    inputs = {"x": RNG.normal(size=(1, 2, 3, 4)).astype(np.float32)}
    before, after, _ = run_passes(model, [AbsorbConsecutiveTransposes], inputs)
    assert_exact(before, after)
    assert len(model.get_nodes_by_op_type("Transpose")) == 3


def test_reshape_flatten_with_spatial_extent_permutes_the_classifier_rows():
    g = GraphBuilder()
    a = g.mt(g.node("Conv", ["x", g.const(int_weights(RNG, (3, 2, 3, 3)))], pads=[1, 1, 1, 1]),
             sorted_thresholds(RNG, 3, 3, -10, 10))
    w = int_weights(RNG, (3 * 5 * 4, 4))
    y = g.node("MatMul", [g.node("Reshape", [a, g.const(np.array([1, -1], np.int64))]), g.const(w, "Wfc")])
    model = g.build({"x": (1, 2, 5, 4)}, [y], {"x": "UINT2"})
    before, after, _ = run_passes(model, LAYOUT, _x((1, 2, 5, 4), 0, 3))
    assert_exact(before, after)
    assert_transposes_only_at_input(model)
    fc = model.get_nodes_by_op_type("MatMul")[-1]
    w_new = const_array(fc.inputs[1])
    # row (h·W + w)·C + c of the NHWC weight is row c·H·W + h·W + w of the NCHW one
    np.testing.assert_array_equal(w_new, w.reshape(3, 5, 4, 4).transpose(1, 2, 0, 3).reshape(60, 4))
