"""Structural checks (networkx) and datatype consistency."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite import GraphError, Model
from finnlite.core.compat import make_model
from tests.verify.graphs import GraphBuilder, add_relu, int_multithreshold, quant_graph
from verify import ReferenceData
from tests.verify.structure import check_datatypes, check_structure


def _vi(name: str):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])


def _proto(nodes, inits=(), outputs=("y",)):
    graph = helper.make_graph(nodes, "g", [_vi("x")], [_vi(o) for o in outputs], initializer=list(inits))
    return make_model(graph, custom_opset=None)


def test_clean_models_pass() -> None:
    assert check_structure(add_relu()).ok
    assert check_structure(int_multithreshold()).ok
    report = check_structure(quant_graph())
    assert report.ok, report.text()


def test_cycle_is_named() -> None:
    proto = _proto([helper.make_node("Add", ["x", "c"], ["a"], name="n1"),
                    helper.make_node("Relu", ["a"], ["c"], name="n2"),
                    helper.make_node("Relu", ["a"], ["y"], name="n3")])
    for model in (proto, Model(proto, check=False)):
        report = check_structure(model)
        (issue,) = report.of_kind("cycle")
        assert "'n1' -> 'n2' -> 'n1'" in issue.message or "'n2' -> 'n1' -> 'n2'" in issue.message
        with pytest.raises(GraphError, match="cycle"):
            report.raise_if_any()


def test_tensor_produced_twice() -> None:
    proto = _proto([helper.make_node("Relu", ["x"], ["a"], name="r1"),
                    helper.make_node("Neg", ["x"], ["a"], name="r2"),
                    helper.make_node("Relu", ["a"], ["y"], name="r3")])
    (issue,) = check_structure(proto).of_kind("multiple_producers")
    assert issue.tensor == "a" and "'r1', 'r2'" in issue.message


def test_unsorted_dangling_and_unproduced() -> None:
    proto = _proto([helper.make_node("Relu", ["a"], ["y"], name="late"),
                    helper.make_node("Neg", ["x"], ["a"], name="early"),
                    helper.make_node("Add", ["x", "ghost"], ["z"], name="reads_ghost")], outputs=("y", "z", "w"))
    report = check_structure(proto)
    assert report.of_kind("unsorted")[0].node == "late"
    assert report.of_kind("dangling_input")[0].tensor == "ghost"
    assert report.of_kind("unproduced_output")[0].tensor == "w"


def test_unreachable_dead_and_dangling_initializer() -> None:
    c = numpy_helper.from_array(np.ones([1, 4], np.float32), "c")
    unused = numpy_helper.from_array(np.ones([3], np.float32), "unused")
    proto = _proto([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                    helper.make_node("Neg", ["c"], ["k"], name="const_neg"),
                    helper.make_node("Add", ["a", "k"], ["y"], name="add"),
                    helper.make_node("RandomNormal", [], ["r"], name="noise", shape=[1, 4]),
                    helper.make_node("Sigmoid", ["x"], ["dead"], name="sigmoid")], inits=[c, unused])
    report = check_structure(proto)
    assert {i.node for i in report.of_kind("constant")} == {"const_neg"}
    assert {i.node for i in report.of_kind("unreachable")} == {"noise"}
    assert {i.node for i in report.of_kind("dead")} == {"noise", "sigmoid"}
    assert [i.tensor for i in report.of_kind("dangling_initializer")] == ["unused"]
    assert "constant" not in check_structure(proto, allow_constants=True).kinds()
    assert "[dead] node 'sigmoid'" in report.text()


def test_datatype_violations_are_found() -> None:
    g = GraphBuilder()
    g.input("x", [1, 4, 4, 4], datatype="UINT4")
    g.multithreshold("x", "m", "mt0", np.tile(np.arange(1, 16, dtype=np.float32), (4, 1)), "UINT4")
    g.init("half", np.float32(0.5))
    g.node("Mul", ["m", "half"], ["out"], "mul0", datatype="INT4")
    g.output("out", [1, 4, 4, 4])
    model = g.model()
    ref = ReferenceData.random(model, n=2, low=0, high=15)
    (issue,) = check_datatypes(model, ref).issues
    assert issue.kind == "datatype" and issue.tensor == "out" and issue.node == "mul0"
    assert "annotated INT4" in issue.message
    model.set_tensor_datatype("m", "UINT2")
    kinds = {(i.tensor, i.kind) for i in check_datatypes(model, ref).issues}
    assert kinds == {("out", "datatype"), ("m", "datatype")}
    model.set_tensor_datatype("m", "UINT4")
    model.set_tensor_datatype("out", None)
    assert check_datatypes(model, ref.sample(0)).ok
