"""Global averages as integer sums (streamline/reduce.py), through absorption, datatypes and the NHWC conversion."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite import Model
from streamline.absorb import ABSORB_PASSES, MaterializeThresholds
from streamline.collapse import COLLAPSE_PASSES
from streamline.datatypes import InferDataTypes
from streamline.real_thresholds import quant_real_thresholds
from streamline.move import MoveAddPastAveraging, MoveMulPastLinear
from streamline.reduce import REDUCE_PASSES, GlobalAverageToReduceSum
from streamline.reorder import REORDER_PASSES
from tests.streamline.convert_helpers import init, quant_node
from tests.streamline.convert_helpers import graph_model as qgraph_model
from tests.streamline.rulecheck import apply, compare, graph_model

RNG = np.random.default_rng(0)
ALL = [InferDataTypes, *COLLAPSE_PASSES, *REORDER_PASSES, *REDUCE_PASSES, *ABSORB_PASSES, InferDataTypes,
       MaterializeThresholds]


def _mt(inp: str, out: str, thr: str):
    return helper.make_node("MultiThreshold", [inp, thr], [out], domain="qonnx.custom_op.general",
                            out_dtype="INT4", out_bias=-8.0, name="mt")


@pytest.mark.parametrize("op,keepdims", [("GlobalAveragePool", 1), ("ReduceMean", 1), ("ReduceMean", 0)])
def test_scaled_global_average_becomes_an_integer_sum_before_the_thresholds(op, keepdims):
    """Mul(q, s) → average over H, W (7x7: 1/49 is not a float32 number) → MultiThreshold: the scale moves past
    the average, the average becomes ReduceSum · 1/49 and both factors end in the thresholds, exactly."""
    c = 3
    attrs = {} if op == "GlobalAveragePool" else {"keepdims": keepdims}
    ins = ["xs"] if op == "GlobalAveragePool" else ["xs", "axes"]
    out_shape = [2, c, 1, 1] if keepdims else [2, c]
    nodes = [helper.make_node("Mul", ["x", "s"], ["xs"], name="scale"),
             helper.make_node(op, ins, ["avg"], name="avg", **attrs),
             _mt("avg", "y", "thr")]
    rt = quant_real_thresholds(np.float32(0.05), 0.0, 4, True, False)
    inits = {"s": np.float32(0.1443), "axes": np.array([2, 3], np.int64), "thr": rt.float_thresholds()}
    if op == "GlobalAveragePool":
        del inits["axes"]
    proto = graph_model(nodes, {"x": [2, c, 7, 7]}, {"y": out_shape}, inits)
    m = apply(proto, ALL, annotate={"x": "UINT4"})
    assert [n.op_type for n in m.graph] == ["ReduceSum", "MultiThreshold"]
    assert m.get_tensor_datatype(m.graph.node(0).outputs[0].name).name == "UINT10"  # 49 · 15 = 735
    for _ in range(3):
        compare(proto, m, {"x": RNG.integers(0, 16, size=(2, c, 7, 7)).astype(np.float64)})


def test_per_channel_add_passes_a_sum_times_n_and_a_mean_unchanged():
    """ReduceSum(x + b) = ReduceSum(x) + N·b and ReduceMean(x + b) = ReduceMean(x) + b for a per-channel b; a b
    that varies along a reduced axis stays (the rule says why)."""
    c = 4
    b = RNG.normal(size=(1, c, 1, 1)).astype(np.float32)
    for op in ("ReduceSum", "ReduceMean"):
        nodes = [helper.make_node("Add", ["x", "b"], ["xb"], name="bias"),
                 helper.make_node(op, ["xb", "axes"], ["y"], keepdims=1, name="red")]
        proto = graph_model(nodes, {"x": [2, c, 3, 5]}, {"y": [2, c, 1, 1]},
                            {"b": b, "axes": np.array([2, 3], np.int64)})
        m = apply(proto, [MoveMulPastLinear, MoveAddPastAveraging])
        assert [n.op_type for n in m.graph] == [op, "Add"]
        compare(proto, m, {"x": RNG.normal(size=(2, c, 3, 5))}, rtol=1e-5)
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"], name="scale"),
             helper.make_node("ReduceSum", ["xw", "axes"], ["y"], keepdims=1, name="red")]
    proto = graph_model(nodes, {"x": [2, c, 3, 5]}, {"y": [2, c, 1, 1]},
                        {"w": RNG.normal(size=(1, 1, 1, 5)).astype(np.float32), "axes": np.array([2, 3], np.int64)})
    rule, m = MoveMulPastLinear(), Model(proto)
    m.infer_shapes()
    result = rule.run(m)
    assert not result.changed
    assert [x.reason for x in result.misses] == ["the Mul's constant varies along a reduced axis"]


def test_a_float_average_is_left_alone():
    """Only an integer input makes the sum worth having: a float one stays an average."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")]
    proto = graph_model(nodes, {"x": [1, 2, 3, 3]}, {"y": [1, 2, 1, 1]}, {})
    assert not GlobalAverageToReduceSum().apply(Model(proto))


@pytest.mark.parametrize("head", ["GlobalAveragePool", "ReduceMean_keep", "ReduceMean_drop"])
def test_resnet_head_float_average_before_a_requantizer_streamlines_to_integers_with_one_transpose(head):
    """conv → ReLU quantizer → float global average → 8-bit requantizer → flatten → linear: the default pipeline
    leaves no float node but the output dequantization and one Transpose (the input's), and agrees with float64
    execution of the original."""
    from finnlite.build import streamline
    from verify import ReferenceData, final_check

    c = 4
    inits = [init("s0", np.float32(1 / 64)), init("z", np.float32(0)), init("b8", np.float32(8)),
             init("b4", np.float32(4)), init("W", RNG.normal(size=(c, 3, 3, 3)).astype(np.float32)),
             init("ws", np.float32(0.1)), init("s1", np.float32(0.173)), init("s2", np.float32(0.0191)),
             init("F", RNG.normal(size=(c, 5)).astype(np.float32)), init("axes", np.array([2, 3], np.int64)),
             init("shape", np.array([2, c], np.int64))]
    nodes = [quant_node(["x", "s0", "z", "b8"], "xq", name="inq"),
             quant_node(["W", "ws", "z", "b4"], "Wq", narrow=1, name="wq"),
             helper.make_node("Conv", ["xq", "Wq"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             quant_node(["r", "s1", "z", "b4"], "a", signed=0, name="act")]
    if head == "GlobalAveragePool":
        nodes.append(helper.make_node("GlobalAveragePool", ["a"], ["g"], name="gap"))
    else:
        nodes.append(helper.make_node("ReduceMean", ["a", "axes"], ["g"], name="mean",
                                      keepdims=int(head.endswith("keep"))))
    nodes += [quant_node(["g", "s2", "z", "b8"], "gq", name="req"),
              helper.make_node("Reshape", ["gq", "shape"], ["f"], name="flat"),
              quant_node(["F", "ws", "z", "b4"], "Fq", narrow=1, name="fq"),
              helper.make_node("MatMul", ["f", "Fq"], ["y"], name="fc")]
    proto = qgraph_model(nodes, {"x": [2, 3, 6, 6]}, {"y": [2, 5]}, inits)
    model = Model(proto)
    reference = ReferenceData.random(model, n=16, seed=1, low=-2.0, high=2.0)
    report = streamline(model, verify="each", extras=False)
    assert report.error is None, report.error
    assert report.float_nodes.integer_only, report.float_nodes.text()
    hist = model.op_histogram()
    assert hist.get("Transpose", 0) <= 1 and "ReduceSum" in hist and "ReduceMean" not in hist, hist
    final = final_check(reference, model)
    assert final.ok, final.summary()
