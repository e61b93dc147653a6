"""finnlite.core.clone: the verifier's structural copies are the same graph, share the tensors, and are independent."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite import Model
from finnlite.core.clone import clone_model
from finnlite.core.compat import make_model
from tests.verify.graphs import GraphBuilder
from tests.zoo import ZOO_MODELS, require_zoo, zoo_model_path


def _annotated() -> Model:
    """Quant -> MultiThreshold -> Add with a fork: annotations, shapes, node metadata, a constant output."""
    g = GraphBuilder()
    x = g.input("x", [1, 4], datatype="INT8")
    q = g.quant(x, "q", "quant0", np.float32(0.5), 4, True, datatype="INT4")
    t = g.multithreshold(q, "t", "mt0", np.sort(np.random.default_rng(0).normal(size=(4, 3)), axis=1), "UINT2")
    g.node("Add", [t, q], [g.output("y", [1, 4])], "add0")
    g.node("Mul", [t, g.init("two", np.float32(2.0))], [g.output("z", [1, 4])], "mul0", datatype="UINT3")
    m = g.model()
    m.ir.graph.node("mt0").metadata_props["finnlite.note"] = "kept"
    m.ir.graph.metadata_props["graph.note"] = "g"
    return m


def _same(a: Model, b: Model) -> bool:
    return a.to_proto().SerializeToString(deterministic=True) == b.to_proto().SerializeToString(deterministic=True)


def test_clone_is_the_same_model_and_shares_tensors() -> None:
    m = _annotated()
    c = clone_model(m)
    assert _same(m, c)
    assert c.get_tensor_datatype("q").name == "INT4" and c.get_tensor_datatype("z").name == "UINT3"
    assert c.ir.graph.node("mt0").metadata_props["finnlite.note"] == "kept"
    for name, v in m.ir.graph.initializers.items():
        copy = c.ir.graph.initializers[name]
        assert copy is not v and copy.const_value is v.const_value
    frozen = m.ir.graph.outputs[0].shape
    assert frozen.frozen and c.ir.graph.outputs[0].shape is frozen  # a frozen shape cannot change: shared
    assert {id(n) for n in m.ir.graph}.isdisjoint(id(n) for n in c.ir.graph)
    # the copy's nodes are wired among themselves: no value of the original is read or written
    originals = {id(v) for n in m.ir.graph for v in list(n.inputs) + list(n.outputs)}
    originals |= {id(v) for v in m.ir.graph.initializers.values()} | {id(v) for v in m.ir.graph.inputs}
    assert all(id(v) not in originals for n in c.ir.graph for v in list(n.inputs) + list(n.outputs))


def test_edits_of_either_side_do_not_reach_the_other() -> None:
    m = _annotated()
    m.ir.graph.node("add0").outputs[0].shape = ir.Shape([1, 4])  # an editable shape (read ones are frozen)
    c = clone_model(m)
    before = m.to_proto().SerializeToString(deterministic=True)
    add = c.ir.graph.node("add0")
    add.replace_input_with(1, add.inputs[0])  # rewire
    c.ir.graph.node("mt0").attributes["out_scale"] = ir.AttrFloat32("out_scale", 3.0)
    c.ir.graph.node("mt0").metadata_props["finnlite.note"] = "changed"
    c.set_tensor_datatype("q", c.get_tensor_datatype("t"))
    c.ir.graph.node("add0").outputs[0].shape[1] = 7  # an in-place shape edit
    c.ir.graph.node("mul0").outputs[0].name = "renamed"
    assert m.to_proto().SerializeToString(deterministic=True) == before
    c2 = clone_model(m)
    m.ir.graph.node("add0").outputs[0].shape[1] = 5
    m.set_tensor_datatype("t", m.get_tensor_datatype("q"))
    assert c2.get_tensor_shape("y") == (1, 4) and c2.get_tensor_datatype("t").name == "UINT2"


def test_a_copy_shares_parsed_real_thresholds_until_its_text_changes() -> None:
    """The thresholds parsed from a node's metadata text are the copy's too (no second parse); a new text on
    either side is parsed for that side alone."""
    from streamline.real_thresholds import META_KEY, get_real_thresholds, quant_real_thresholds

    m = _annotated()
    rt = quant_real_thresholds(np.array([0.5, 0.25, 1.0, 2.0], np.float32), 0.0, 2, False, False)
    m.ir.graph.node("mt0").metadata_props[META_KEY] = rt.to_json()
    parsed = get_real_thresholds(m.ir.graph.node("mt0"))
    c = clone_model(m)
    assert get_real_thresholds(c.ir.graph.node("mt0")) is parsed
    shifted = rt.shifted(np.array([1.0, 2.0, 3.0, 4.0]))
    c.ir.graph.node("mt0").metadata_props[META_KEY] = shifted.to_json()
    assert get_real_thresholds(c.ir.graph.node("mt0")).real.tolist() == shifted.real.tolist()
    assert get_real_thresholds(m.ir.graph.node("mt0")) is parsed


def test_dangling_input_is_shared_not_an_error() -> None:
    m = _annotated()
    ghost = ir.Value(name="ghost")
    m.ir.graph.node("add0").replace_input_with(1, ghost)
    c = clone_model(m)
    assert c.ir.graph.node("add0").inputs[1] is ghost


def test_subgraphs_are_copied_too() -> None:
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if0")],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                    helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [numpy_helper.from_array(np.ones(2, np.float32), "w")])
    m = Model(make_model(graph))
    c = clone_model(m)
    assert _same(m, c)
    sub, copy = (next(iter(mm.ir.graph.node("if0").attributes["then_branch"].value)) for mm in (m, c))
    assert sub is not copy


@pytest.mark.parametrize("name", [n for n in ZOO_MODELS if n != "mobilenet_v1_4b"])
def test_zoo_models_clone_as_onnx_ir_does(name: str) -> None:
    require_zoo()
    m = Model(zoo_model_path(name))
    theirs = Model(ir.Model(m.ir.graph.clone(), ir_version=m.ir.ir_version,
                            producer_name=m.ir.producer_name, producer_version=m.ir.producer_version,
                            domain=m.ir.domain, model_version=m.ir.model_version, doc_string=m.ir.doc_string,
                            metadata_props=dict(m.ir.metadata_props)), check=False)
    assert _same(clone_model(m), theirs)
