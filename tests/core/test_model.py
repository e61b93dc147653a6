"""The core model class: loading, queries, annotations, edits, saving."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite import DataType, GraphError, Model, ModelLoadError
from finnlite.core.compat import make_model, ort_session
from tests.core.fixtures import chain_model, fork_join_model
from tests.zoo import ZOO_MODELS, zoo_model_path


def test_helper_model_runs_in_onnxruntime():
    proto = chain_model(3)
    assert proto.ir_version <= 10
    sess = ort_session(proto)
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, ((x + 1.0) * 1.1) + 1.2, rtol=1e-6)


def test_load_from_every_source(tmp_path):
    proto = chain_model(3)
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    from qonnx.core.modelwrapper import ModelWrapper

    for source in (str(path), path, proto.SerializeToString(), proto, ModelWrapper(proto)):
        m = Model(source)
        assert [n.op_type for n in m.graph] == ["Add", "Mul", "Add"]
    assert Model(path).path == str(path)


def test_source_proto_is_not_modified():
    proto = chain_model(3)
    proto.graph.input.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, [8]))
    before = proto.SerializeToString()
    m = Model(proto)
    assert m.input_names == ["x"]  # the initializer listed as input is dropped
    m.set_initializer("c0", np.zeros(8, np.float32))
    assert proto.SerializeToString() == before


def test_producer_consumers_fork_join():
    m = Model(fork_join_model())
    relu = m.find_producer("a")
    assert relu.name == "relu"
    assert sorted(n.name for n in m.find_consumers("a")) == ["add", "mul"]
    assert m.find_consumer("a") is None and m.find_consumer("b").name == "join"
    assert m.is_fork_node(relu) and not m.is_fork_node(m.get_node_from_name("mul"))
    assert m.is_join_node(m.get_node_from_name("join")) and not m.is_join_node(relu)
    assert m.find_producer("x") is None and m.find_producer("nonexistent") is None
    assert [n.name for n in m.get_nodes_by_op_type("Add")] == ["add", "join"]
    assert m.find_direct_successors(relu) and m.find_direct_predecessors(relu) == []


def test_shapes_and_initializers():
    m = Model(chain_model(2))
    assert m.get_tensor_shape("x") == (1, 8)
    m.infer_shapes(only_missing=False)
    assert m.get_tensor_shape("t0") == (1, 8)
    np.testing.assert_array_equal(m.get_initializer("c0"), np.full(8, 1.0, np.float32))
    assert m.get_initializer("t0") is None
    m.set_initializer("c0", np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(m.get_initializer("c0"), np.arange(8, dtype=np.float32))
    v = m.add_initializer(np.ones(3, np.int64), "k")
    assert m.get_tensor_shape(v.name) == (3,)
    with pytest.raises(GraphError, match="t0"):
        m.set_initializer("t0", np.ones(1, np.float32))


def test_set_initializer_freezes_the_array_and_what_it_views():
    from finnlite.core.model import is_frozen

    m = Model(chain_model(2))
    base = np.arange(16, dtype=np.float32)
    view = base[::2]
    m.set_initializer("c0", view)
    assert m.get_initializer("c0") is view and is_frozen(view)
    with pytest.raises(ValueError, match="read-only"):
        base[0] = 5.0  # the memory the initializer views cannot be edited either
    with pytest.raises(ValueError, match="read-only"):
        m.get_initializer("c0")[0] = 5.0
    np.testing.assert_array_equal(m.get_initializer("c0"), np.arange(0, 16, 2, dtype=np.float32))
    assert not is_frozen(np.arange(3)) and not is_frozen(np.arange(3)[1:])
    assert is_frozen(np.frombuffer(b"\0" * 8, np.float32))


def test_datatype_and_layout_annotations_interoperate_with_qonnx(tmp_path):
    m = Model(chain_model(2))
    assert m.get_tensor_datatype("x") == DataType["FLOAT32"] and not m.has_tensor_datatype("x")
    m.set_tensor_datatype("x", DataType["UINT8"])
    m.set_tensor_datatype("c0", "INT4")
    m.set_tensor_layout("x", ["N", "C"])
    assert m.get_tensor_datatype("x") == DataType["UINT8"] and m.get_tensor_layout("x") == ["N", "C"]
    path = tmp_path / "ann.onnx"
    m.save(path)
    qm = Model(path).to_qonnx()  # qonnx reads our annotations
    assert qm.get_tensor_datatype("x") == DataType["UINT8"]
    assert qm.get_tensor_datatype("c0") == DataType["INT4"]
    assert qm.get_tensor_layout("x") == ["N", "C"]
    qm.set_tensor_datatype("y", DataType["INT8"])  # and we read qonnx's
    assert Model(qm).get_tensor_datatype("y") == DataType["INT8"]
    m.set_tensor_datatype("x", None)
    assert not m.has_tensor_datatype("x")


def test_unique_names_and_topological_sort():
    m = Model(fork_join_model())
    m.give_unique_node_names()
    assert [n.name for n in m.graph] == ["Relu_0", "Mul_0", "Add_0", "Add_1"]
    nodes = list(m.graph)
    m.graph.remove(nodes[0])
    m.graph.append(nodes[0])  # Relu now last: not sorted
    m.topological_sort()
    assert next(iter(m.graph)).op_type == "Relu"
    m.give_unique_tensor_names()
    names = m.get_all_tensor_names()
    assert len(names) == len(set(names)) and "x" in names and "y" in names
    assert m.make_new_valueinfo_name() not in names


def test_replace_uses_keeps_graph_output_name():
    m = Model(chain_model(3))
    last = m.find_producer("y")
    m.bypass_node(last)
    assert m.output_names == ["y"] and m.find_producer("y").op_type == "Mul"
    m.cleanup()
    assert len(m) == 2 and "c2" not in m.graph.initializers


def _interface_model(nodes, outputs):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, 4]) for o in outputs])
    return make_model(graph, custom_opset=None)


def test_replace_uses_graph_output_by_graph_input_keeps_both_names():
    m = Model(_interface_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], ["y"]))
    m.set_tensor_datatype("x", "INT4")
    relu = m.find_producer("y")
    m.replace_uses(relu.outputs[0], m.value("x"))
    m.remove_node(relu)
    m.cleanup()
    assert m.input_names == ["x"] and m.output_names == ["y"]
    assert [n.op_type for n in m.graph] == ["Identity"] and m.find_producer("y").inputs[0] is m.value("x")
    assert m.get_tensor_datatype("y") == DataType["INT4"]
    m.check_graph()
    x = np.arange(4, dtype=np.float32).reshape(1, 4) - 2
    (y,) = ort_session(m.to_proto()).run(None, {"x": x})
    np.testing.assert_array_equal(y, x)


def test_replace_uses_graph_output_by_another_graph_output_keeps_both_names():
    nodes = [helper.make_node("Relu", ["x"], ["y1"], name="relu"), helper.make_node("Abs", ["y1"], ["y2"], name="abs")]
    m = Model(_interface_model(nodes, ["y1", "y2"]))
    ab = m.find_producer("y2")
    m.replace_uses(ab.outputs[0], m.value("y1"))
    m.remove_node(ab)
    assert m.input_names == ["x"] and m.output_names == ["y1", "y2"]
    assert m.find_producer("y1").op_type == "Relu" and m.find_producer("y2").op_type == "Identity"
    m.check_graph()
    x = np.arange(4, dtype=np.float32).reshape(1, 4) - 2
    y1, y2 = ort_session(m.to_proto()).run(None, {"x": x})
    np.testing.assert_array_equal(y1, np.maximum(x, 0))
    np.testing.assert_array_equal(y2, np.maximum(x, 0))


def test_cleanup_folds_constants_and_removes_dead_nodes():
    c = numpy_helper.from_array(np.array([4.0], np.float32), "c")
    nodes = [helper.make_node("Sqrt", ["c"], ["s"], name="sqrt"),
             helper.make_node("Mul", ["x", "s"], ["y"], name="mul"),
             helper.make_node("Relu", ["x"], ["dead"], name="dead")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializer=[c])
    m = Model(make_model(graph, custom_opset=None))
    assert m.cleanup()
    assert [n.op_type for n in m.graph] == ["Mul"]
    (s,) = [v for v in m.graph.node(0).inputs if v.name != "x"]
    np.testing.assert_array_equal(s.const_value.numpy(), [2.0])
    assert "c" not in m.graph.initializers
    assert not m.cleanup()


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_round_trip(name, tmp_path):
    path = zoo_model_path(name)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    m = Model(path)
    hist = m.op_histogram()
    assert sum(hist.values()) == len(m) > 0
    assert not any(v.name in m.graph.initializers for v in m.graph.inputs)
    out = tmp_path / f"{name}.onnx"
    m.save(out)
    onnx.checker.check_model(str(out))
    m2 = Model(out)

    def summary(model):
        nodes = [(n.op_type, n.domain, [v.name if v else "" for v in n.inputs], [v.name for v in n.outputs],
                  sorted((k, repr(a.value)) for k, a in n.attributes.items())) for n in model.graph]
        inits = {k: v.const_value.numpy().tobytes() for k, v in model.graph.initializers.items()}
        anns = {v.name: model.get_tensor_datatype(v.name) for n in model.graph for v in n.outputs}
        return nodes, inits, anns

    assert summary(m) == summary(m2)
    assert m2.op_histogram() == hist
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # input untouched


def test_external_data_round_trip(tmp_path):
    proto = chain_model(2, width=4096)
    m = Model(proto)
    m.set_tensor_datatype("c0", "INT8")
    out = tmp_path / "ext.onnx"
    m.save(out, external_data=True)
    assert (tmp_path / "ext.onnx.data").is_file()
    assert out.stat().st_size < 4096  # the weights are outside
    m2 = Model(out)
    np.testing.assert_array_equal(m2.get_initializer("c0"), m.get_initializer("c0"))
    assert m2.get_tensor_datatype("c0") == DataType["INT8"]
    # also readable by onnx itself
    loaded = onnx.load(str(out))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), m.get_initializer("c0"))


def _external_model(tmp_path, location: str, length: int | None = None):
    proto = chain_model(1, width=1024)
    t = proto.graph.initializer[0]
    data = t.raw_data if t.raw_data else np.asarray(numpy_helper.to_array(t)).tobytes()
    (tmp_path / "w.bin").write_bytes(data)
    t.ClearField("raw_data")
    del t.float_data[:]
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(length or len(data)))):
        e = t.external_data.add()
        e.key, e.value = k, v
    path = tmp_path / "model.onnx"
    path.write_bytes(proto.SerializeToString())
    return path, len(data)


def test_external_data_errors(tmp_path):
    path, n = _external_model(tmp_path, "w.bin")
    assert Model(path).get_initializer("c0").shape == (1024,)
    path, n = _external_model(tmp_path, "../../etc/passwd")
    with pytest.raises(ModelLoadError, match="outside the model's folder.*|.*c0"):
        Model(path)
    path, n = _external_model(tmp_path, "missing.bin")
    with pytest.raises(ModelLoadError, match="missing"):
        Model(path)
    path, n = _external_model(tmp_path, "w.bin", length=10**6)
    with pytest.raises(ModelLoadError, match="truncated"):
        Model(path)


def test_bad_files(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file") as e:
        Model(tmp_path / "nope.onnx")
    assert "nope.onnx" in str(e.value)
    with pytest.raises(ModelLoadError, match="directory"):
        Model(tmp_path)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        Model(empty)
    data = chain_model(3).SerializeToString()
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="trunc.onnx"):
        Model(trunc)
    text = tmp_path / "text.onnx"
    text.write_text("this is not a model at all\n")
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        Model(text)
    tensor = tmp_path / "tensor.onnx"
    tensor.write_bytes(numpy_helper.from_array(np.ones(3, np.float32), "t").SerializeToString())
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        Model(tensor)


def test_bad_graphs():
    n1 = helper.make_node("Add", ["x", "b"], ["a"], name="n1")
    n2 = helper.make_node("Relu", ["a"], ["b"], name="n2")
    g = helper.make_graph([n1, n2], "cyc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    with pytest.raises(GraphError, match="cycle"):
        Model(make_model(g, custom_opset=None))
    n3 = helper.make_node("Add", ["x", "ghost"], ["y"], name="n3")
    g = helper.make_graph([n3], "dangling", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(GraphError, match="n3.*ghost"):
        Model(make_model(g, custom_opset=None))
    d1 = helper.make_node("Relu", ["x"], ["y"], name="d1")
    d2 = helper.make_node("Neg", ["x"], ["y"], name="d2")
    g = helper.make_graph([d1, d2], "dup", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(GraphError, match="more than once"):
        Model(make_model(g, custom_opset=None))


def test_save_is_atomic_and_checks_folder(tmp_path):
    m = Model(chain_model(2))
    with pytest.raises(ModelLoadError, match="folder does not exist"):
        m.save(tmp_path / "missing" / "m.onnx")
    m.save(tmp_path / "m.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no temporary files left


def test_saved_files_get_the_permissions_a_plain_write_gives(tmp_path):
    """Not mkstemp's owner-only 0600: a new file gets 0666 less the umask, a replaced one keeps its mode, for the
    streamed save, the proto save (external data) and write_atomic."""
    import os
    import stat

    from finnlite.core.io import write_atomic

    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    m = Model(chain_model(2))
    old = os.umask(0o027)
    try:
        m.save(tmp_path / "m.onnx")
        m.save(tmp_path / "e.onnx", external_data=True)
        write_atomic(tmp_path / "w.bin", lambda fh: fh.write(b"x"))
        assert {mode(tmp_path / n) for n in ("m.onnx", "e.onnx", "e.onnx.data", "w.bin")} == {0o640}
        os.chmod(tmp_path / "m.onnx", 0o604)
        m.save(tmp_path / "m.onnx")
        assert mode(tmp_path / "m.onnx") == 0o604
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.onnx", "e.onnx.data", "m.onnx", "w.bin"]


def test_to_qonnx_and_back():
    m = Model(chain_model(2))
    qm = m.to_qonnx()
    assert [n.op_type for n in qm.graph.node] == ["Add", "Mul"]
    assert [n.op_type for n in Model(qm).graph] == ["Add", "Mul"]


def test_make_node_names_unique_names_the_unnamed_and_suffixes_repeats():
    proto = chain_model(5)
    names = ["", "n", "n", "", "n_0"]
    for node, name in zip(proto.graph.node, names):
        node.name = name
    model = Model(proto)
    assert model.make_node_names_unique()
    got = [n.name for n in model.graph]
    assert got[1] == "n" and got[4] == "n_0"  # unique names stay
    assert len(set(got)) == 5 and got[0] == "Add_0" and got[3] == "Mul_0" and got[2] == "n_1"
    assert not model.make_node_names_unique()  # nothing left to do
    ort_session(model.to_proto())  # onnxruntime accepts the graph now
