"""SqueezeGlobalPoolOutput: a global pool followed by a 1×1-Conv classifier leaves no [N, 1, 1, C] MatMul input,
and no [N, 1, 1, K] elementwise op after it, once streamlined (FINN: "Input shape mismatch: ElementwiseMul ...
Expected [1, 64], got [1, 1, 1, 64]")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from finnlite import Model
from finnlite.build import streamline
from tests.streamline.convert_helpers import graph_model, init, quant_node
from tests.zoo import zoo_model_path


def _net(flatten: bool) -> onnx.ModelProto:
    """x[1,3,6,6] → Quant → Conv(Quant W, 3×3) → Quant(unsigned) → global pool → Conv 1×1 (Quant W, bias) →
    [Flatten] → y."""
    rng = np.random.default_rng(9)
    nodes = [quant_node(["x", "s_in", "z0", "b8"], "xq", name="in_q"),
             quant_node(["w1", "ws1", "z0", "b4"], "w1q", name="wq1"),
             helper.make_node("Conv", ["xq", "w1q"], ["c1"], name="conv1", kernel_shape=[3, 3]),
             quant_node(["c1", "as1", "z0", "b4"], "a1", signed=0, name="aq1"),
             helper.make_node("MaxPool", ["a1"], ["p"], name="pool", kernel_shape=[4, 4]),
             quant_node(["w2", "ws2", "z0", "b4"], "w2q", name="wq2"),
             helper.make_node("Conv", ["p", "w2q", "bias"], ["c2"], name="classifier", kernel_shape=[1, 1])]
    out_shape = [1, 5, 1, 1]
    if flatten:
        nodes.append(helper.make_node("Flatten", ["c2"], ["y"], name="flatten", axis=1))
        out_shape = [1, 5]
    else:
        nodes[-1].output[0] = "y"
    inits = [init("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
             init("ws1", rng.uniform(0.05, 0.2, size=(8, 1, 1, 1)).astype(np.float32)),
             init("w2", rng.standard_normal((5, 8, 1, 1)).astype(np.float32)),
             init("ws2", rng.uniform(0.05, 0.2, size=(5, 1, 1, 1)).astype(np.float32)),
             init("bias", rng.standard_normal(5).astype(np.float32)),
             init("s_in", np.float32(1 / 64)), init("z0", np.float32(0)), init("b8", np.float32(8)),
             init("b4", np.float32(4)), init("as1", np.float32(0.5))]
    return graph_model(nodes, {"x": [1, 3, 6, 6]}, {"y": out_shape}, inits)


def _classifier_chain(model: Model) -> list:
    mm = [n for n in model.graph if n.op_type == "MatMul"][-1]
    chain, cur = [mm], mm.outputs[0]
    while len(cur.uses()) == 1 and next(iter(cur.uses())).node.op_type in ("Mul", "Add"):
        node = next(iter(cur.uses())).node
        chain.append(node)
        cur = node.outputs[0]
    return chain


@pytest.mark.parametrize("flatten", [True, False], ids=["flatten", "conv-output"])
def test_classifier_after_global_pool_is_two_dimensional(flatten: bool) -> None:
    proto = _net(flatten)
    model = Model(proto)
    report = streamline(model, verify="each", samples=16, extras=False)
    report.raise_for_errors()
    assert report.float_nodes.integer_only, report.float_nodes.text()
    for node in _classifier_chain(model):  # the MatMul and the Mul/Add right after it
        for v in (node.inputs[0], node.outputs[0]):
            assert len(model.get_tensor_shape(v.name)) == 2, (node.name, v.name, model.get_tensor_shape(v.name))
    assert model.get_tensor_shape("y") == ((1, 5) if flatten else (1, 5, 1, 1))
    assert any(p.name == "SqueezeGlobalPoolOutput" and p.changed for p in report.passes)


def test_flattened_classifier_is_left_alone() -> None:
    """A Reshape before the classifier (the zoo's form) already gives [N, C]: nothing to do."""
    proto = _net(True)
    graph = proto.graph
    for node in graph.node:
        if node.name == "classifier":  # classifier as Reshape → MatMul on the pooled tensor
            node.CopyFrom(helper.make_node("Reshape", ["p", "flat"], ["pf"], name="flatten_pool"))
    graph.node.append(helper.make_node("Transpose", ["w2q"], ["w2t"], name="w2_t", perm=[1, 0, 2, 3]))
    graph.node.append(helper.make_node("Reshape", ["w2t", "flat_w"], ["w2m"], name="w2_flat"))
    graph.node.append(helper.make_node("MatMul", ["pf", "w2m"], ["c2"], name="fc"))
    graph.initializer.extend([numpy_helper.from_array(np.array([1, -1], np.int64), "flat"),
                              numpy_helper.from_array(np.array([8, 5], np.int64), "flat_w")])
    model = Model(proto)
    model.topological_sort()
    report = streamline(model, verify="final", samples=8, extras=False)
    report.raise_for_errors()
    assert not any(n.name.endswith("_squeeze") for n in model.graph)


def test_activation_after_the_classifier_gets_a_two_dimensional_layout() -> None:
    """A quantized activation after the classifier becomes a channels-last MultiThreshold in the squeezed chain: its
    data_layout must follow the [N, K] tensor (found by the fuzzer: 'NHWC puts the channels on axis 3')."""
    proto = _net(False)
    proto.graph.node[-1].output[0] = "c2"
    proto.graph.node.append(quant_node(["c2", "as1", "z0", "b4"], "y", signed=0, name="aq2"))
    model = Model(proto)
    report = streamline(model, verify="each", samples=16, extras=False)
    report.raise_for_errors()
    assert any(p.name == "SqueezeGlobalPoolOutput" and p.changed for p in report.passes)
    mts = [n for n in model.graph
           if n.op_type == "MultiThreshold" and len(model.get_tensor_shape(n.inputs[0].name)) == 2]
    assert mts and all(n.attributes["data_layout"].value == "NC" for n in mts if "data_layout" in n.attributes)


@pytest.mark.zoo
@pytest.mark.slow
def test_mobilenet_with_a_conv_classifier() -> None:
    """mobilenet_v1_4b with its Reshape + Gemm classifier replaced by a 1×1 Conv and a Flatten."""
    m = onnx.load(zoo_model_path("mobilenet_v1_4b"))
    inits = {t.name: t for t in m.graph.initializer}
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    view = next(n for n in m.graph.node if n.output[0] == gemm.input[0])
    wq = next(n for n in m.graph.node if n.output[0] == gemm.input[1])
    w = inits[wq.input[0]]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w).reshape(tuple(w.dims) + (1, 1)), w.name))
    drop = {gemm.input[1], gemm.input[2], view.output[0], gemm.output[0], w.name}
    keep = [v for v in m.graph.value_info if v.name not in drop]
    del m.graph.value_info[:]
    m.graph.value_info.extend(keep)
    keep = [v for v in m.graph.input if v.name != w.name]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    index = list(m.graph.node).index(gemm)
    m.graph.node.remove(gemm)
    m.graph.node.insert(index, helper.make_node("Conv", [view.input[0], gemm.input[1], gemm.input[2]], ["cls"],
                                                name="classifier", kernel_shape=[1, 1]))
    m.graph.node.insert(index + 1, helper.make_node("Flatten", ["cls"], [gemm.output[0]], name="flatten"))
    m.graph.node.remove(view)
    model = Model(m)
    report = streamline(model, verify="each", samples=2, extras=False)
    report.raise_for_errors()
    assert report.float_nodes.integer_only, report.float_nodes.text()
    for node in _classifier_chain(model):
        assert len(model.get_tensor_shape(node.inputs[0].name)) == 2, node.name
