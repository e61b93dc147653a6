"""final_check's executor of the streamlined model: large weights handed over as the model's own arrays."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from custom_ops.plan import FEED_ELEMENTS as _FEED_ELEMENTS
from custom_ops.subgraph import executor_with_outputs as _executor
from finnlite import Model
from finnlite.core.compat import make_model
from verify import ReferenceData, final_check


def _with_outputs(model: Model, names: list[str]) -> onnx.ModelProto:
    """``model`` as a proto with ``names`` added to its graph outputs (the plain way, to compare with)."""
    proto = model.to_proto()
    have = {o.name for o in proto.graph.output}
    for name in names:
        if name not in have:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    return proto


def _matmul_model() -> Model:
    k = 512
    n = _FEED_ELEMENTS // k + 1  # a weight above the threshold, and a small bias below it
    rng = np.random.default_rng(0)
    w = rng.integers(-3, 4, size=(k, n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(rng.normal(size=n).astype(np.float32), "b")])
    model = Model(make_model(graph, custom_opset=None))
    model.set_initializer("w", w)  # numpy-backed, as the pipeline's weights are
    return model


def test_executor_reads_the_models_arrays_and_leaves_the_model_unchanged():
    model = _matmul_model()
    before = {name: v.const_value for name, v in model.graph.initializers.items()}
    writeable = {name: model.get_initializer(name).flags.writeable for name in before}
    proto_before = model.to_proto().SerializeToString()
    x = {"x": np.random.default_rng(1).normal(size=(3, 512)).astype(np.float32)}
    for dtype in (np.float32, np.float64):
        ex = _executor(model, ["h"], dtype)
        full = Executor(_with_outputs(model, ["h"]), dtype=dtype)
        got, want = ex.run(x, return_all=True), full.run(x, return_all=True)
        assert set(got) == set(want)
        for name in want:
            assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
    # the weight is not copied (float32) and the model is as it was
    assert np.shares_memory(_executor(model, [])._constants["w"], model.get_initializer("w"))
    assert {name: v.const_value for name, v in model.graph.initializers.items()} == before
    assert model.to_proto().SerializeToString() == proto_before
    assert {name: model.get_initializer(name).flags.writeable for name in before} == writeable


def test_final_check_of_a_model_with_large_weights():
    model = _matmul_model()
    reference = ReferenceData.random(model, n=3, seed=0)
    assert final_check(reference, model).ok
