"""Range-based datatype inference."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from finnlite import DataType, Model
from finnlite.compat import QONNX_DOMAIN, make_model
from streamline.datatypes import InferDataTypes, Range, infer_ranges


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
