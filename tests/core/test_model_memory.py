"""Memory: a Model does not keep constants it no longer uses (nor, through them, the loaded ModelProto) alive."""

from __future__ import annotations

import gc
import weakref

import numpy as np
from onnx import TensorProto, helper

from finnlite import Model
from tests.core.fixtures import chain_model


def test_initializer_inputs_leave_no_reference_behind():
    """An exporter that lists weights as graph inputs: after they are dropped from the inputs, onnx_ir's reference
    counts of the inputs hold no entry for them (such an entry kept the value, its constant and the whole loaded
    proto alive)."""
    proto = chain_model(3)
    for init in proto.graph.initializer:
        proto.graph.input.append(helper.make_tensor_value_info(init.name, TensorProto.FLOAT, [8]))
    model = Model(proto)
    assert model.input_names == ["x"]
    counter = model.graph.inputs._ref_counter
    assert all(n > 0 for n in counter.values()) and {v.name for v in counter} == {"x"}


def test_cleanup_releases_removed_constants_and_lookups_are_unchanged():
    model = Model(chain_model(3))
    big = np.arange(1 << 16, dtype=np.float32)
    ref = weakref.ref(big)
    model.set_initializer("unused_weight", big)
    del big
    assert model.value("unused_weight") is not None
    before = model.make_new_valueinfo_name("t")
    assert model.cleanup(fold_constants=False)
    gc.collect()
    assert ref() is None  # neither the graph nor the name index holds the array
    assert model.value("unused_weight") is None and not model.is_initializer("unused_weight")
    assert "unused_weight" not in model.get_all_tensor_names()
    # fresh names go on as before: removed names stay taken until the index is rebuilt
    assert model.make_new_valueinfo_name("t") != before
    assert model.value("c0") is not None and model.get_initializer("c0") is not None


def test_small_constants_read_from_a_proto_do_not_view_it():
    """A small constant left in the graph must not keep the loaded ModelProto (and so every weight) alive: after
    detaching, small initializers and Constant values have protos of their own; large weights stay views."""
    import onnx_ir as ir
    from onnx import numpy_helper

    from finnlite.compat import make_model
    from finnlite.model import DETACH_ELEMENTS, detach_tensors

    big = np.ones((DETACH_ELEMENTS + 1,), np.float32)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([3.0], np.float32))),
             helper.make_node("Add", ["x", "small"], ["a"]), helper.make_node("Mul", ["a", "k"], ["b"]),
             helper.make_node("Add", ["b", "big"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [big.size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [big.size])],
                              [numpy_helper.from_array(np.array([2.0], np.float32), "small"),
                               numpy_helper.from_array(big, "big")])
    proto = make_model(graph, custom_opset=None)
    model = ir.serde.deserialize_model(proto)
    detach_tensors(model)
    inits = model.graph.initializers
    const = next(n for n in model.graph if n.op_type == "Constant").attributes["value"].value
    # change the source message: views follow it, detached copies do not
    proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([5.0], np.float32), "small"))
    proto.graph.initializer[1].CopyFrom(numpy_helper.from_array(big * 7, "big"))
    proto.graph.node[0].attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([9.0], np.float32)))
    assert inits["small"].const_value.numpy().tolist() == [2.0]
    assert const.numpy().tolist() == [3.0]
    assert inits["big"].const_value.numpy()[0] == 7.0


def test_streamed_save_writes_the_bytes_of_the_serialized_model(tmp_path):
    """Model.save streams the initializers one by one; the file holds exactly what serializing the whole model
    gives, for every kind of tensor (numpy-backed, read from a proto, strings, metadata, doc strings)."""
    from onnx import numpy_helper

    from finnlite.compat import make_model

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Add", ["x", "a"], ["t"]), helper.make_node("Mul", ["t", "b"], ["y"]),
             helper.make_node("Identity", ["s"], ["s_out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 300]),
                               helper.make_tensor_value_info("s_out", TensorProto.STRING, [2])],
                              [numpy_helper.from_array(rng.normal(size=(4, 300)).astype(np.float32), "a"),
                               helper.make_tensor("b", TensorProto.FLOAT, [1], [2.0]),  # float_data, not raw
                               helper.make_tensor("s", TensorProto.STRING, [2], [b"ab", b"c"])],
                              doc_string="a graph")
    model = Model(make_model(graph, custom_opset=None, doc_string="a model"))
    model.set_initializer("w16", rng.normal(size=(70000,)).astype(np.float16))  # numpy-backed, large
    model.set_initializer("i64", np.arange(5, dtype=np.int64))
    model.set_initializer("empty", np.zeros((0, 3), np.float32))
    model.graph.initializers["w16"].const_value.doc_string = "half"
    model.graph.initializers["i64"].const_value.metadata_props["k"] = "v"
    for name in ("w16", "i64", "empty"):
        model.graph.outputs.append(model.graph.initializers[name])
    expected = model.to_proto().SerializeToString()
    model.save(tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").read_bytes() == expected
    import onnx

    loaded = onnx.load(str(tmp_path / "m.onnx"))
    assert [t.name for t in loaded.graph.initializer] == ["a", "b", "s", "w16", "i64", "empty"]


def test_streamed_save_falls_back_when_a_size_is_mispredicted(tmp_path, monkeypatch):
    from finnlite import io as model_io

    model = Model(chain_model(3))
    expected = model.to_proto().SerializeToString()
    monkeypatch.setattr(model_io, "_array_parts", lambda tensor: None)
    real = model_io.ir.serde.serialize_tensor
    calls = []

    def lying(tensor):  # the size pass sees one size, the writing pass another
        calls.append(tensor)
        proto = real(tensor)
        if len(calls) == 1:
            proto.doc_string = "x"
        return proto

    monkeypatch.setattr(model_io.ir.serde, "serialize_tensor", lying)
    model.save(tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").read_bytes() == expected
