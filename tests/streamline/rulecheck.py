"""A small harness for rule tests: build a graph, apply passes, compare with the oracle."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import Model, PassManager, Stage
from finnlite.core.compat import make_model


def graph_model(nodes: list[onnx.NodeProto], inputs: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]],
                inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in outputs.items()],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return make_model(graph)


def apply(proto: onnx.ModelProto, passes: list, fixpoint: bool = True, annotate: dict | None = None) -> Model:
    """Load ``proto``, annotate input datatypes, run ``passes`` (to a fixpoint) and return the model."""
    m = Model(proto)
    for name, dt in (annotate or {}).items():
        m.set_tensor_datatype(name, dt)
    m.infer_shapes()
    PassManager([Stage("s", passes, fixpoint=fixpoint)]).run(m)
    return m


def compare(proto: onnx.ModelProto, model: Model, inputs: dict[str, np.ndarray], rtol: float = 1e-6) -> None:
    """The transformed model equals the original: run both in float64 (exact integer outputs where the original's
    are integers, else relative ``rtol``) and check the float32 run of the transformed model is close too."""
    ref = Executor(proto, dtype=np.float64).run(inputs)
    got64 = Executor(model, dtype=np.float64).run(inputs)
    got32 = Executor(model).run({k: v.astype(np.float32) for k, v in inputs.items()})
    for k in ref:
        r = ref[k]
        if np.array_equal(r, np.round(r)):
            np.testing.assert_array_equal(got64[k], r, err_msg=f"output {k} (float64)")
        else:
            np.testing.assert_allclose(got64[k], r, rtol=rtol, atol=rtol, err_msg=f"output {k} (float64)")
        np.testing.assert_allclose(got32[k], r, rtol=1e-4, atol=1e-4, err_msg=f"output {k} (float32)")
