"""Memory: a Model does not keep constants it no longer uses (nor, through them, the loaded ModelProto) alive."""

from __future__ import annotations

import gc
import weakref

import numpy as np
from onnx import TensorProto, helper

from finnlite import Model, PassManager, Stage, Transformation
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


def _with_large_initializer(nodes: int, name: str) -> tuple[Model, weakref.ref]:
    """A chain model with an extra (unused) 256 KB initializer ``name``, and a weak reference to its array."""
    model = Model(chain_model(nodes))
    big = np.arange(1 << 16, dtype=np.float32)
    model.set_initializer(name, big)
    assert model.value(name) is not None
    return model, weakref.ref(big)


def test_cleanup_releases_removed_constants_and_lookups_are_unchanged():
    model, ref = _with_large_initializer(3, "unused_weight")
    before = model.make_new_valueinfo_name("t")
    assert model.cleanup(fold_constants=False)
    gc.collect()
    assert ref() is None  # neither the graph nor the name index holds the array
    assert model.value("unused_weight") is None and not model.is_initializer("unused_weight")
    assert "unused_weight" not in model.get_all_tensor_names()
    # fresh names go on as before: removed names stay taken until the index is rebuilt
    assert model.make_new_valueinfo_name("t") != before
    assert model.value("c0") is not None and model.get_initializer("c0") is not None


def test_constants_read_from_a_proto_do_not_view_it():
    """No constant left in the graph may keep the loaded ModelProto (and so every weight) alive: after detaching,
    small initializers and Constant values have protos of their own, and large weights are frozen numpy arrays."""
    import onnx_ir as ir
    from onnx import numpy_helper

    from finnlite.compat import make_model
    from finnlite.model import DETACH_ELEMENTS, detach_tensors, is_frozen

    big = np.arange(DETACH_ELEMENTS + 1, dtype=np.float32)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([3.0], np.float32))),
             helper.make_node("Add", ["x", "small"], ["a"]), helper.make_node("Mul", ["a", "k"], ["b"]),
             helper.make_node("Add", ["b", "big"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [big.size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [big.size])],
                              [numpy_helper.from_array(np.array([2.0], np.float32), "small"),
                               numpy_helper.from_array(big, "big")])
    graph.initializer[1].doc_string = "the weight"
    proto = make_model(graph, custom_opset=None)
    model = ir.serde.deserialize_model(proto)
    detach_tensors(model)
    inits = model.graph.initializers
    const = next(n for n in model.graph if n.op_type == "Constant").attributes["value"].value
    weight = inits["big"].const_value
    assert isinstance(weight, ir.Tensor) and is_frozen(weight.numpy()) and weight.numpy() is weight.numpy()
    assert weight.name == "big" and weight.doc_string == "the weight" and weight.dtype == ir.DataType.FLOAT
    # change the source message: nothing read from it follows
    proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([5.0], np.float32), "small"))
    proto.graph.initializer[1].CopyFrom(numpy_helper.from_array(big * 7, "big"))
    proto.graph.node[0].attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([9.0], np.float32)))
    assert inits["small"].const_value.numpy().tolist() == [2.0]
    assert const.numpy().tolist() == [3.0]
    np.testing.assert_array_equal(weight.numpy(), big)


def test_a_loaded_model_frees_the_message_it_was_read_from(tmp_path):
    """After loading, no tensor of the model refers to the parsed ModelProto: its weights are arrays of their own."""
    import onnx_ir as ir

    path = tmp_path / "m.onnx"
    Model(chain_model(3)).save(path)
    model = Model(path)
    model.set_initializer("w_big", np.ones(1 << 16, np.float32))
    model.save(path)
    loaded = Model(path)
    tensors = [v.const_value for v in loaded.graph.initializers.values()]
    assert not any(isinstance(t, ir.serde.TensorProtoTensor) and t.size > 1 << 14 for t in tensors)
    assert isinstance(loaded.graph.initializers["w_big"].const_value, ir.Tensor)


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


def test_a_rule_frees_each_weight_it_replaces_before_the_pass_ends():
    """A rewrite that replaces a node's weight leaves it unused: Rule.apply removes it at once (as the next
    cleanup would), so a pass over every layer holds one layer twice at a time, not the whole network."""
    import onnx_ir as ir

    from finnlite.passes import Rule

    model = Model(chain_model(1))
    x = model.graph.inputs[0]
    w1, w2 = np.ones((8, 8), np.float32), np.full((8, 8), 2.0, np.float32)
    model.set_initializer("w1", w1)
    model.set_initializer("w2", w2)
    h = ir.Value(name="h")
    y = ir.Value(name="y2")
    model.graph.append(ir.Node("", "MatMul", [x, model.value("w1")], outputs=[h], name="mm1"))
    model.graph.append(ir.Node("", "MatMul", [h, model.value("w2")], outputs=[y], name="mm2"))
    model.graph.outputs.append(y)
    weak = {"w1": weakref.ref(w1), "w2": weakref.ref(w2)}
    del w1, w2

    class Negate(Rule):
        op_types = ("MatMul",)

        def match(self, model, node):
            return node

        def rewrite(self, model, node):
            old = node.inputs[1]
            node.replace_input_with(1, model.add_initializer(-model.get_initializer(old.name), prefix="neg"))

    freed = []

    def after(rule, model, node):
        gc.collect()
        freed.append(sorted(name for name, ref in weak.items() if ref() is None))

    rule = Negate()
    rule.on_rewrite = after
    assert rule.apply(model)
    assert freed == [["w1"], ["w1", "w2"]]
    assert not model.is_initializer("w1") and model.value("w1") is None


def test_del_initializer_frees_the_array_and_lookups_stay_right():
    model, ref = _with_large_initializer(2, "spare")
    model.del_initializer("spare")
    gc.collect()
    assert ref() is None and model.value("spare") is None and model.get_initializer("spare") is None
    assert model.value("c0") is not None


def test_executor_protos_leave_node_metadata_out_and_the_model_as_it_was():
    """``to_proto_without(..., node_metadata=False)`` (the verifier's executors never read node metadata: exact
    thresholds are megabytes of it) serializes the nodes without their ``metadata_props`` and leaves the model's
    metadata as it was, down to the very text objects."""
    from finnlite.io import to_proto_without

    model = Model(chain_model(3))
    text = "x" * 1000
    node = next(iter(model.graph))
    node.metadata_props["finnlite.real_thresholds"] = text
    node.metadata_props["other"] = "kept"
    plain = to_proto_without(model.ir, ["c1"])
    lean = to_proto_without(model.ir, ["c1"], node_metadata=False)
    assert {p.key for p in plain.graph.node[0].metadata_props} == {"finnlite.real_thresholds", "other"}
    assert not any(n.metadata_props for n in lean.graph.node)
    assert [t.name for t in lean.graph.initializer] == [t.name for t in plain.graph.initializer] == ["c0", "c2"]
    assert list(node.metadata_props) == ["finnlite.real_thresholds", "other"]
    assert node.metadata_props["finnlite.real_thresholds"] is text and node.metadata_props["other"] == "kept"


def test_the_name_index_keeps_no_removed_node_alive():
    """A node a rewrite removed (with its metadata: exact thresholds are megabytes) and an initializer it dropped
    are freed when the graph lets go of them, before the name index is rebuilt; lookups are unchanged."""
    model = Model(chain_model(4))
    assert model.value("t1") is not None  # the index is built and holds t1, the output of n1
    node = next(n for n in model.graph if n.name == "n1")
    node.metadata_props["finnlite.real_thresholds"] = "x" * 10_000
    weight = model.get_initializer("c1")
    gone_node, gone_weight = weakref.ref(node), weakref.ref(weight)
    model.bypass_node(node)
    model.del_initializer("c1")
    del node, weight
    gc.collect()
    assert gone_node() is None and gone_weight() is None
    assert model.value("t1") is None and model.value("c1") is None and model.value("t2") is not None
    assert "t1" not in model.get_all_tensor_names() and model.make_new_valueinfo_name("t1") != "t1"


class _Reweigh(Transformation):
    """Replaces the initializer ``w`` by a fresh array of ``size`` float32 elements (as a pass replacing a
    weight does) and notes that it ran in ``log``."""

    def __init__(self, size: int, log: list[str]) -> None:
        super().__init__()
        self.size, self.log = size, log

    def apply(self, model: Model) -> bool:
        model.set_initializer("w", np.zeros(self.size, np.float32))
        self.log.append("pass")
        return True


def test_heap_is_trimmed_after_passes_that_wrote_a_megabyte_of_weights(monkeypatch):
    """The pass manager gives freed heap pages back once passes have set TRIM_AFTER_BYTES of new initializers
    since its last trim of that model (the weights they replaced are free), not after every pass; and at the end
    of each stage."""
    import finnlite.passes as passes

    log: list[str] = []
    monkeypatch.setattr(passes, "trim_heap", lambda: log.append("trim") or True)
    model = Model(chain_model(2))
    assert model.initializer_bytes_set == 0
    quarter = passes.TRIM_AFTER_BYTES // 16  # float32 elements: a quarter of the threshold in bytes
    manager = PassManager([Stage("s", [_Reweigh(quarter, log) for _ in range(6)])])
    manager.run(model)
    assert model.initializer_bytes_set == 6 * quarter * 4
    assert log == ["pass"] * 4 + ["trim"] + ["pass"] * 2 + ["trim"]  # after the fourth; at the stage's end
    log.clear()
    manager.run(model)  # counts on from its last trim of this model: two quarters were left over
    assert log == ["pass"] * 2 + ["trim"] + ["pass"] * 4 + ["trim"] + ["trim"]
    log.clear()
    PassManager([Stage("s", [_Reweigh(1, log)] * 2)]).run(Model(chain_model(2)))  # small weights: stage end only
    assert log == ["pass", "pass", "trim"]
