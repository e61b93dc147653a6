"""A float gate (squeeze-excitation without a quantized sigmoid): the integer-only report names the gate, the
product and the change."""

from __future__ import annotations

import numpy as np
from onnx import helper

from finnlite import Model
from finnlite.build import streamline
from tests.streamline.rulecheck import graph_model

QONNX = "qonnx.custom_op.general"


def _se(gate_quantized: bool):
    t = np.array([[0.5, 1.5, 2.5]], np.float32)
    nodes = [helper.make_node("MultiThreshold", ["x", "t"], ["q"], domain=QONNX, name="act", out_dtype="UINT2"),
             helper.make_node("ReduceMean", ["q", "axes"], ["m"], keepdims=1, name="squeeze"),
             helper.make_node("Conv", ["m", "w"], ["e"], name="excite"),
             helper.make_node("Mul", ["e", "s"], ["es"], name="excite_scale"),
             helper.make_node("Sigmoid", ["es"], ["g"], name="gate")]
    last = "g"
    if gate_quantized:
        nodes.append(helper.make_node("MultiThreshold", ["g", "tg"], ["gq"], domain=QONNX, name="gate_q",
                                      out_dtype="UINT2"))
        last = "gq"
    nodes.append(helper.make_node("Mul", ["q", last], ["y"], name="product"))
    rng = np.random.default_rng(0)
    return graph_model(nodes, {"x": [1, 4, 3, 3]}, {"y": [1, 4, 3, 3]},
                       {"t": t, "axes": np.array([2, 3], np.int64), "s": np.float32(0.125),
                        "w": rng.integers(-3, 4, (4, 4, 1, 1)).astype(np.float32),
                        "tg": np.array([[0.25, 0.5, 0.75]], np.float32)})


def test_a_float_gate_is_named_with_its_product_and_the_change():
    model = Model(_se(False))
    model.set_tensor_datatype("x", "INT4")
    report = streamline(model, verify="off", extras=False).float_nodes
    causes = [n for n in report.nodes if n.cause]
    assert causes and "Sigmoid 'gate' is a float gate" in causes[0].cause
    assert "Mul 'product'" in causes[0].cause and "QuantSigmoid" in causes[0].cause
    assert "float gate" in report.text()


def test_a_quantized_gate_leaves_an_integer_product():
    model = Model(_se(True))
    model.set_tensor_datatype("x", "INT4")
    report = streamline(model, verify="off", extras=False).float_nodes
    assert not [n for n in report.nodes if "float gate" in n.cause]
