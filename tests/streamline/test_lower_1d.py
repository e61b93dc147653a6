"""Conv1d networks lowered as 2-D ones (streamline/lower_1d.py), checked against the original with the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite import Model
from streamline.lower_1d import Change3DTo4DTensors
from tests.streamline.convert_helpers import graph_model, init, quant_node
from tests.streamline.rulecheck import compare
from tests.streamline.rulecheck import graph_model as float_graph

RNG = np.random.default_rng(0)


def _vgg_like(pads: int, stride: int, dilation: int, pool: str) -> object:
    """x (N, 2, 32) → 8-bit Quant → Conv1d(4-bit weights) → BatchNorm1d → Relu → 4-bit Quant → pool → flatten →
    linear."""
    c, w = 6, 32
    conv_out = (w + 2 * pads - dilation * 2 - 1) // stride + 1
    pooled = conv_out // 2
    inits = [init("s0", np.float32(1 / 64)), init("z", np.float32(0)), init("b8", np.float32(8)),
             init("b4", np.float32(4)), init("W", RNG.normal(size=(c, 2, 3)).astype(np.float32)),
             init("ws", np.float32(0.1)), init("s1", np.float32(0.173)),
             init("g", RNG.uniform(-1.5, 1.5, c).astype(np.float32)), init("be", RNG.normal(size=c).astype(np.float32)),
             init("mu", RNG.normal(size=c).astype(np.float32)), init("var", RNG.uniform(0.5, 2, c).astype(np.float32)),
             init("F", RNG.normal(size=(c * pooled, 5)).astype(np.float32))]
    pool_node = helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2], strides=[2], name="pool") \
        if pool == "max" else helper.make_node("Identity", ["a"], ["p"], name="pool")
    if pool != "max":
        pooled = conv_out
        inits[-1] = init("F", RNG.normal(size=(c * pooled, 5)).astype(np.float32))
    nodes = [quant_node(["x", "s0", "z", "b8"], "xq", name="inq"),
             quant_node(["W", "ws", "z", "b4"], "Wq", narrow=1, name="wq"),
             helper.make_node("Conv", ["xq", "Wq"], ["c"], pads=[pads, pads], strides=[stride],
                              dilations=[dilation], name="conv"),
             helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             quant_node(["r", "s1", "z", "b4"], "a", signed=0, name="act"),
             pool_node,
             helper.make_node("Flatten", ["p"], ["f"], axis=1, name="flat"),
             quant_node(["F", "ws", "z", "b4"], "Fq", narrow=1, name="fq"),
             helper.make_node("MatMul", ["f", "Fq"], ["y"], name="fc")]
    return graph_model(nodes, {"x": [2, 2, w]}, {"y": [2, 5]}, inits)


@pytest.mark.parametrize("pads,stride,dilation,pool", [(1, 1, 1, "max"), (0, 2, 1, "none"), (2, 1, 2, "max")])
def test_conv1d_network_is_lowered_to_im2col_matmul_and_maxpool_nhwc(pads, stride, dilation, pool):
    """The default pipeline: no Conv or MaxPool left (Im2Col + MatMul, MaxPoolNHWC), integer-only, at most one
    Transpose, per-pass checks pass and the result agrees with float64 execution of the original."""
    from finnlite.build import streamline
    from verify import ReferenceData, final_check

    model = Model(_vgg_like(pads, stride, dilation, pool))
    reference = ReferenceData.random(model, n=16, seed=2, low=-2.0, high=2.0)
    report = streamline(model, verify="each", extras=False)
    assert report.error is None, report.error
    assert report.float_nodes.integer_only, report.float_nodes.text()
    hist = model.op_histogram()
    assert "Conv" not in hist and "MaxPool" not in hist and hist["Im2Col"] == 1, hist
    assert hist.get("MaxPoolNHWC", 0) == (pool == "max") and hist.get("Transpose", 0) <= 1, hist
    assert model.graph.inputs[0].shape is not None and len(model.graph.inputs[0].shape) == 3  # interface kept
    final = final_check(reference, model)
    assert final.ok, final.summary()


def test_the_pass_alone_is_exact_on_a_float_conv1d_with_per_channel_constants():
    """Conv1d → Mul(per channel, shape (C, 1)) → Add(shape (1, C, 1)) → MaxPool1d → Flatten: the 4-D form computes
    the same values."""
    c = 3
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 2], strides=[2], name="conv"),
             helper.make_node("Mul", ["c", "m"], ["cm"], name="mul"),
             helper.make_node("Add", ["cm", "b"], ["cb"], name="add"),
             helper.make_node("MaxPool", ["cb"], ["p"], kernel_shape=[3], strides=[1], pads=[1, 1], name="pool"),
             helper.make_node("Flatten", ["p"], ["y"], axis=1, name="flat")]
    proto = float_graph(nodes, {"x": [2, 2, 11]}, {"y": [2, c * 7]},
                        {"W": RNG.normal(size=(c, 2, 4)).astype(np.float32),
                         "m": RNG.normal(size=(c, 1)).astype(np.float32),
                         "b": RNG.normal(size=(1, c, 1)).astype(np.float32)})
    m = Model(proto)
    m.infer_shapes()
    assert Change3DTo4DTensors().apply(m)
    assert [n.op_type for n in m.graph][0] == "Reshape" and m.graph.inputs[0].shape == proto_shape(proto)
    compare(proto, m, {"x": RNG.normal(size=(2, 2, 11))}, rtol=1e-5)


def proto_shape(proto) -> list[int]:
    return [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]


def test_a_3d_matmul_keeps_the_graph_as_it_is():
    """Token-wise 3-D MatMul (N, T, C) has no 2-D form here: nothing changes and the reason is recorded."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t"], name="tok"),
             helper.make_node("Flatten", ["t"], ["y"], axis=1, name="flat")]
    proto = float_graph(nodes, {"x": [2, 4, 3]}, {"y": [2, 20]}, {"W": RNG.normal(size=(3, 5)).astype(np.float32)})
    m = Model(proto)
    m.infer_shapes()
    rule = Change3DTo4DTensors()
    result = rule.run(m)
    assert not result.changed
    assert [x.reason for x in result.misses] == ["MatMul has no 4-D form here"]
