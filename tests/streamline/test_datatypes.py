"""Range-based datatype inference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite import DataType, Model
from finnlite.core.compat import QONNX_DOMAIN, make_model
from streamline.datatypes import InferDataTypes, Range, infer_ranges
from verify.annotations import check_annotations


def _model():
    thr = numpy_helper.from_array(np.array([[-1.0, 0.0, 1.0]], np.float32), "thr")
    w = numpy_helper.from_array(np.array([[1, -2], [3, 0], [-1, 1]], np.float32), "W")
    k = numpy_helper.from_array(np.array([0.5], np.float32), "k")
    nodes = [helper.make_node("MultiThreshold", ["x", "thr"], ["a"], domain=QONNX_DOMAIN, out_dtype="INT2",
                              out_bias=-1.0, name="mt"),
             helper.make_node("MatMul", ["a", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "m"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "k"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                              initializer=[thr, w, k])
    return Model(make_model(graph))


def test_ranges_and_annotations():
    m = _model()
    r = infer_ranges(m)
    assert r["a"] == Range(-1, 2, True)
    # column 0: weights 1, 3, -1 -> max 2*4 + (-1)(-1) = 9, min -1*4 + 2*(-1) = -6
    assert (r["m"].lo, r["m"].hi) == (-6.0, 9.0)
    assert (r["s"].lo, r["s"].hi) == (-12.0, 18.0)
    assert r["m"].integer and r["s"].integer and not r["y"].integer
    InferDataTypes().apply(m)
    assert m.get_tensor_datatype("a") == DataType["INT3"]  # -1..2 needs 3 signed bits
    assert m.get_tensor_datatype("m").is_integer() and m.get_tensor_datatype("s").is_integer()
    assert m.get_tensor_datatype("y") == DataType["FLOAT32"]


def test_bipolar_range():
    assert Range.of_array(np.array([-1.0, 1.0, 1.0])).datatype() == DataType["BIPOLAR"]
    assert Range.of_array(np.array([0.0, 1.0])).datatype() == DataType["BINARY"]
    assert Range.of_array(np.array([0.5])).datatype() == DataType["FLOAT32"]


def test_the_range_cache_does_not_keep_replaced_weights_alive():
    """InferDataTypes caches weight ranges on the model, keyed by tensor: a weight a later pass replaces is freed
    then, not at the next InferDataTypes run (the cache holds its tensors weakly)."""
    import gc
    import weakref

    from finnlite import Model
    from streamline.datatypes import InferDataTypes, infer_ranges
    from tests.core.fixtures import chain_model

    model = Model(chain_model(2))
    w = np.arange(1 << 14, dtype=np.float32).reshape(128, 128)
    x = model.graph.inputs[0]
    import onnx_ir as ir

    model.set_tensor_shape(x.name, [1, 128])
    model.set_tensor_datatype(x.name, "UINT2")  # a known input range: the MatMul's range depends on the weight
    out = ir.Value(name="mm")
    model.graph.append(ir.Node("", "MatMul", [x, model.set_initializer("w", w)], outputs=[out], name="mm"))
    model.graph.outputs.append(out)
    ref = weakref.ref(w)
    del w
    InferDataTypes().apply(model)
    before = infer_ranges(model)["mm"]
    model.set_initializer("w", np.ones((128, 128), np.float32))
    gc.collect()
    assert ref() is None
    assert infer_ranges(model)["mm"] != before  # and the new weight's range is computed, not the old one's


# -- the tightest annotations FINN reads (issue 26) -----------------------------------------------------------------
def _weights_model(w: np.ndarray, thr: np.ndarray | None = None) -> Model:
    """x (UINT2) → MatMul(W, annotated INT8) → MultiThreshold(T, annotated INT16) → y."""
    thr = np.array([[0.0, 4.0]], np.float32) if thr is None else thr
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("MultiThreshold", ["m", "T"], ["y"], domain=QONNX_DOMAIN, out_dtype="UINT2",
                              name="mt")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[1]])],
                              initializer=[numpy_helper.from_array(w.astype(np.float32), "W"),
                                           numpy_helper.from_array(thr, "T")])
    m = Model(make_model(graph))
    m.set_tensor_datatype("x", "UINT2")
    m.set_tensor_datatype("W", "INT8")
    m.set_tensor_datatype("T", "INT16")
    return m


@pytest.mark.parametrize("w,expected", [
    ([[-3, 1], [2, 3]], "INT3"),      # a quantizer's 8 bits are an upper bound: the values need 3
    ([[-4, 0], [3, 1]], "INT3"),      # -4 and 3 both fit INT3
    ([[0, 1], [2, 3]], "UINT2"),      # non-negative: unsigned
    ([[1, 0], [0, 1]], "BINARY"),
    ([[-1, 1], [1, -1]], "BIPOLAR"),  # ±1 without 0
    ([[-1, 0], [1, 1]], "INT2"),      # ternary: TERNARY has INT2's two bits, INT2 is what FINN uses
    ([[-7, 7], [0, 1]], "INT4"),      # a narrow range still needs 4 bits
])
def test_weights_narrow_to_their_values(w: list, expected: str) -> None:
    m = _weights_model(np.array(w, np.float32))
    InferDataTypes().apply(m)
    assert m.get_tensor_datatype("W") == DataType[expected]
    assert m.get_tensor_datatype("T") == DataType["INT16"]  # thresholds keep the union with their input's type
    assert m.get_tensor_datatype("x") == DataType["UINT2"]  # graph inputs are claims from outside
    assert check_annotations(m) == []


def test_float_weights_stay_float() -> None:
    m = _weights_model(np.array([[0.5, 1.0], [2.0, 3.0]], np.float32))
    m.set_tensor_datatype("W", "FLOAT32")
    InferDataTypes().apply(m)
    assert m.get_tensor_datatype("W") == DataType["FLOAT32"]
    assert m.get_tensor_datatype("m") == DataType["FLOAT32"]


def _mt_model(n: int, **attrs: float | str) -> Model:
    thr = np.arange(n, dtype=np.float32)[None, :]
    node = helper.make_node("MultiThreshold", ["x", "T"], ["y"], domain=QONNX_DOMAIN, name="mt", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                              initializer=[numpy_helper.from_array(thr, "T")])
    return Model(make_model(graph))


@pytest.mark.parametrize("n,attrs,expected", [
    (15, dict(out_dtype="UINT4", out_bias=-8.0), "INT4"),            # a false claim (an absorbed bias) corrected
    (15, dict(out_dtype="INT8"), "UINT4"),                           # a loose one narrowed
    (5, dict(out_dtype="UINT4"), "UINT3"),                           # 6 levels: 3 bits
    (1, dict(out_dtype="INT2", out_scale=2.0, out_bias=-1.0), "BIPOLAR"),
    (1, dict(out_dtype="UINT2"), "BINARY"),
    (2, dict(out_dtype="INT4", out_bias=-1.0), "INT2"),              # Sign: {-1, 0, 1}
    (3, dict(out_dtype="UINT4", out_scale=-1.0, out_bias=3.0), "UINT2"),  # negative scale: 3..0
])
def test_multithreshold_out_dtype_from_its_levels(n: int, attrs: dict, expected: str) -> None:
    m = _mt_model(n, **attrs)
    InferDataTypes().apply(m)
    node = next(iter(m.graph))
    assert node.attributes["out_dtype"].value == expected
    assert m.get_tensor_datatype("y") == DataType[expected]  # what qonnx's InferDataTypes would annotate
    assert check_annotations(m) == []


def test_non_integer_levels_leave_out_dtype() -> None:
    m = _mt_model(3, out_dtype="UINT2", out_scale=0.5)
    InferDataTypes().apply(m)
    assert next(iter(m.graph)).attributes["out_dtype"].value == "UINT2"
    assert m.get_tensor_datatype("y") == DataType["FLOAT32"]


def _qonnx(w: np.ndarray, post: str) -> "onnx.ModelProto":
    """x → Quant(UINT4, scale 1) → Add(-8) → [post] → MatMul(Quant(w, INT8, scale 0.5)) → y: a bias absorbed into
    the activation's MultiThreshold (out_bias -8), and an 8-bit weight quantizer whose integers need fewer bits."""
    from tests.streamline.convert_helpers import graph_model, init, quant_node

    nodes = [quant_node(["x", "one", "zero", "four"], "q", signed=0, name="qx"),
             helper.make_node("Add", ["q", "minus8"], ["a"], name="add"),
             helper.make_node(post, ["a"], ["r"], name="post"),
             quant_node(["W", "half", "zero", "eight"], "wq", name="qw"),
             helper.make_node("MatMul", ["r", "wq"], ["y"], name="mm")]
    inits = [init("one", np.float32(1)), init("half", np.float32(0.5)), init("zero", np.float32(0)),
             init("four", np.float32(4)), init("eight", np.float32(8)), init("minus8", np.float32(-8)),
             init("W", w.astype(np.float32))]
    return graph_model(nodes, {"x": [4, 3]}, {"y": [4, 2]}, inits)


@pytest.mark.parametrize("post", ["Relu", "Identity"])
def test_pipeline_annotations_are_tight_and_true(post: str) -> None:
    """End to end: the streamlined model's weight annotation is the values' (INT3, not the quantizer's INT8), the
    MultiThreshold's out_dtype holds its levels after the absorbed Add(-8), the verifier finds no false claim, and
    the model computes what the original computes (executor, every input level of the input quantizer)."""
    from custom_ops.executor import Executor
    from streamline.pipeline import streamline_model

    w = np.array([[1.5, -1.0], [0.5, 1.0], [-1.0, 0.0]], np.float32)  # integers 3, -2, 1, 2, -2, 0
    proto = _qonnx(w, post)
    m = Model(proto)
    streamline_model(m)
    mm = next(n for n in m.graph if n.op_type == "MatMul")
    assert m.get_tensor_datatype(mm.inputs[1].name) == DataType["INT3"]
    for node in m.graph:
        if node.op_type == "MultiThreshold":
            assert node.attributes["out_dtype"].value == m.get_tensor_datatype(node.outputs[0].name).name
    assert check_annotations(m) == []
    x = np.arange(-1, 17, 0.5, dtype=np.float32).reshape(-1, 3)  # below, every level and tie, above
    x = np.concatenate([x, x[::-1, ::-1]])
    for rows in (x[i:i + 4] for i in range(0, len(x), 4)):
        expected = Executor(Model(proto)).run({"x": rows})["y"]
        np.testing.assert_array_equal(Executor(m).run({"x": rows})["y"], expected)
