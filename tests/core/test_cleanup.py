"""Cleanup (:mod:`finnlite.core.cleanup`): constant subgraphs of any size folded with onnxruntime's kernels, custom ops
never folded. Graphs are authored with onnx_ir's tape."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN, ort_session

FINN_DOMAIN = "finn.custom_op.general"


def _model(build, x_shape=(1, 4)) -> Model:
    """A model ``y = build(tape, x)`` on a float input ``x``; constants are initializers made with ``tape.const``."""
    tape = ir.tape.Tape()
    count = iter(range(1000))
    tape.const = lambda a: tape.initializer(ir.tensor(np.asarray(a), name=f"c{next(count)}"))
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(x_shape))
    y = build(tape, x)
    y.name = "y"
    for i, node in enumerate(tape.nodes):
        node.name = f"n{i}"
        for k, v in enumerate(node.outputs):
            v.name = v.name if v is y else f"t{i}_{k}"
    graph = ir.Graph([x], [y], nodes=tape.nodes, initializers=tape.initializers,
                     opset_imports={"": 17, QONNX_DOMAIN: 1, FINN_DOMAIN: 1})
    return Model(ir.Model(graph, ir_version=8))


def _ops(m: Model) -> list[str]:
    return [n.op_type for n in m.graph]


def test_weight_subgraph_of_any_size_folds_and_custom_ops_stay():
    """A Transpose/Reshape/Cast of a 589 824-element constant (over onnxscript's default size limits) is a constant;
    the Quant, Trunc, BipolarQuant and MultiThreshold reading constants stay, and so do their inputs."""
    w = np.random.default_rng(0).standard_normal((256, 256, 3, 3)).astype(np.float32)

    def build(t, x):
        wt = t.op("Cast", [t.op("Reshape", [t.op("Transpose", [t.const(w)], {"perm": [1, 0, 2, 3]}),
                                              t.const(np.array([256, -1], np.int64))])], {"to": ir.DataType.FLOAT})
        s, z, b = t.const(np.float32(0.1)), t.const(np.float32(0)), t.const(np.float32(4))
        q = t.op("Quant", [wt, s, z, b], {"signed": 1, "narrow": 0, "rounding_mode": "ROUND"}, domain=QONNX_DOMAIN)
        tr = t.op("Trunc", [q, s, z, b, t.const(np.float32(2))], {"rounding_mode": "FLOOR"}, domain=QONNX_DOMAIN)
        bq = t.op("BipolarQuant", [tr, s], domain=QONNX_DOMAIN)
        mt = t.op("MultiThreshold", [bq, t.const(np.zeros((256, 1), np.float32))], domain=FINN_DOMAIN)
        return t.op("MatMul", [t.op("Reshape", [x, t.const(np.array([1, -1], np.int64))]), mt])

    m = _model(build, (1, 256))
    assert m.cleanup()
    assert _ops(m) == ["Quant", "Trunc", "BipolarQuant", "MultiThreshold", "Reshape", "MatMul"]
    quant = m.graph.node(0)
    np.testing.assert_array_equal(quant.inputs[0].const_value.numpy(), w.transpose(1, 0, 2, 3).reshape(256, -1))
    assert all(v.is_initializer() for n in list(m.graph)[:4] for v in n.inputs[1:])
    assert not quant.inputs[0].metadata_props and not m.cleanup()


@pytest.mark.parametrize("op, args", [("Log", [960.0]), ("Pow", [1.0001, 0.5]), ("Exp", [0.3]), ("Tanh", [0.7]),
                                      ("Sigmoid", [-1.3])])
def test_inexact_ops_fold_to_onnxruntimes_bits(op, args):
    """The ops onnx's reference evaluator (onnxscript's folder) computes differently from onnxruntime fold to
    onnxruntime's value, the one the original model computes, also through ops after them (Div, Ceil: the bit width
    of a Trunc)."""
    def build(t, x):
        v = t.op(op, [t.const(np.array(a, np.float32)) for a in args])
        return t.op("Mul", [x, t.op("Ceil", [t.op("Div", [v, t.const(np.float32(0.6931472))])])])

    m = _model(build)
    x = np.linspace(-2, 2, 4, dtype=np.float32).reshape(1, 4)
    (expected,) = ort_session(m.to_proto()).run(None, {"x": x})
    m.cleanup()
    assert _ops(m) == ["Mul"]
    (got,) = ort_session(m.to_proto()).run(None, {"x": x})
    np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32))
