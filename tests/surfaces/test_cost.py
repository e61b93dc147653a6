"""The inference cost, against qonnx's inference-cost tool, and on streamlined models."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite import Model
from finnlite.core.compat import make_model
from finnlite.cost import datatype_histogram, format_count, inference_cost
from finnlite.examples import build_tfc
from streamline.pipeline import streamline_model
from tests.zoo import zoo_model_path

_KEYS = ("op_mac_", "mem_w_", "mem_o_", "total_")


def _qonnx_cost(model: Any) -> dict[str, float]:
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.util.inference_cost import inference_cost as qonnx_inference_cost

    from finnlite.core.compat import fix_ir_version

    proto = model.to_proto() if isinstance(model, Model) else model
    result = qonnx_inference_cost(ModelWrapper(fix_ir_version(proto)))["total_cost"]
    return {k: v for k, v in result.items() if k.startswith(_KEYS)}


def _ours(model: Any) -> dict[str, float]:
    return {k: v for k, v in inference_cost(model).to_dict().items() if k.startswith(_KEYS)}


def _conv_gemm_graph() -> Model:
    """Depthwise conv (group 3, with a zero weight), a dense conv, then a Gemm with transB and a dynamic MatMul."""
    rng = np.random.default_rng(0)
    dw = rng.normal(size=(3, 1, 3, 3)).astype(np.float32)
    dw[0, 0, 0, 0] = 0.0
    inits = [numpy_helper.from_array(dw, "dw"), numpy_helper.from_array(rng.normal(size=(4, 3, 1, 1))
                                                                       .astype(np.float32), "pw"),
             numpy_helper.from_array(rng.normal(size=(5, 4 * 6 * 6)).astype(np.float32), "fc"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "dw"], ["a"], "dwconv", group=3, kernel_shape=[3, 3], pads=[0, 0, 0, 0]),
             helper.make_node("Conv", ["a", "pw"], ["b"], "pwconv", kernel_shape=[1, 1]),
             helper.make_node("Reshape", ["b", "shape"], ["c"], "flatten"),
             helper.make_node("Gemm", ["c", "fc"], ["d"], "fc", transB=1),
             helper.make_node("MatMul", ["d", "e"], ["y"], "dynamic")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                           helper.make_tensor_value_info("e", TensorProto.FLOAT, [5, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], initializer=inits)
    return Model(make_model(graph))


def test_agrees_with_qonnx_on_convs_gemm_and_matmul() -> None:
    model = _conv_gemm_graph()
    ours = _ours(model)
    assert ours == pytest.approx(_qonnx_cost(model))
    # depthwise: (3 channels · 9 taps − 1 zero weight) per output pixel, 36 pixels
    layers = {c.node: c for c in inference_cost(model).layers}
    assert layers["dwconv"].macs == pytest.approx(36 * 27 * 26 / 27)
    assert layers["dynamic"].weight_elems == 0 and layers["dynamic"].macs == 10
    dense = inference_cost(model, discount_sparsity=False)
    assert {c.node: c.macs for c in dense.layers}["dwconv"] == 36 * 27


def test_agrees_with_qonnx_on_the_example() -> None:
    model = Model(build_tfc())
    ours, theirs = _ours(model), _qonnx_cost(model)
    assert ours == pytest.approx(theirs)
    assert ours["op_mac_SCALEDINT<8>_SCALEDINT<2>"] == 4473 and ours["total_bops"] == 78620


def test_streamlined_models_cost_the_same_macs_in_integers() -> None:
    model = Model(build_tfc())
    before = inference_cost(model)
    streamline_model(model)
    after = inference_cost(model)
    assert after.total_macs == before.total_macs == 6236
    assert after.total_mem_w_bits == before.total_mem_w_bits  # INT2 weights, as SCALEDINT<2> before
    assert {k for k in after.macs_by_type()} == {("UINT8", "INT2"), ("UINT2", "INT2")}
    assert after.total_bops == 8 * 2 * 4473 + 2 * 2 * 1763
    assert after.unsupported == []
    text = after.text()
    assert text.startswith("MACs 6.24 k, bit-operations 78.6 k") and "UINT8 x INT2: 4.47 k MACs" in text
    hist = datatype_histogram(model)
    assert hist["weights"]["INT2"] == 4 and hist["activations"]["UINT2"] == 3


def test_unsupported_ops_are_listed() -> None:
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"], "t")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    cost = inference_cost(Model(make_model(graph)))
    assert cost.unsupported == ["Tanh"] and cost.total_macs == 0 and "not counted" in cost.text()


def test_format_count() -> None:
    assert format_count(999) == "999 " and format_count(6236) == "6.24 k" and format_count(1.5e9) == "1.5 G"


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["cnv_1w1a", "tfc_2w2a"])
def test_zoo_agrees_with_qonnx_and_survives_streamlining(name: str) -> None:
    model = Model(zoo_model_path(name))
    ours = _ours(model)
    assert ours == pytest.approx(_qonnx_cost(model))
    streamline_model(model)
    after = inference_cost(model)
    # XNOR-popcount layers (cnv_1w1a) encode -1 as 0: their zeros are not sparsity
    assert after.total_macs == pytest.approx(ours["total_macs"])
    assert all(dt != "FLOAT32" for _, dt in after.macs_by_type())


def test_cost_analysis_holds_no_quantized_copy_of_the_weights():
    """The cost of a model with weight quantizers needs each quantized weight's shape and density once: they are
    quantized by blocks of rows and not remembered, so the analysis's peak stays well below one more copy of the
    weights (it held every quantized weight, and five temporaries of the largest, before)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    layers, width = 3, 1024
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = rng.normal(size=(width, width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.float32(0.05), f"s{i}"),
                  numpy_helper.from_array(np.float32(0), f"z{i}"), numpy_helper.from_array(np.float32(4), f"b{i}")]
        nodes += [helper.make_node("Quant", [f"w{i}", f"s{i}", f"z{i}", f"b{i}"], [f"wq{i}"],
                                   domain="qonnx.custom_op.general", signed=1, narrow=1),
                  helper.make_node("MatMul", [x, f"wq{i}"], [f"y{i}"])]
        x = f"y{i}"
    shapes = [helper.make_tensor_value_info(f"wq{i}", TensorProto.FLOAT, [width, width]) for i in range(layers)]
    shapes += [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, width]) for i in range(layers - 1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])], inits,
                              value_info=shapes)
    model = Model(make_model(graph))
    weight_bytes = layers * width * width * 4
    tracemalloc.start()
    try:
        cost = inference_cost(model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cost.total_macs > 0.9 * layers * width * width
    assert peak < weight_bytes, f"{peak / 1e6:.1f} MB for {weight_bytes / 1e6:.1f} MB of weights"
