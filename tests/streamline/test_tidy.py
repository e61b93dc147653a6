"""The tidy stage: every rewrite is exact in float32, checked with the executor on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import Model, PassManager, Stage
from finnlite.core.compat import QONNX_DOMAIN, make_model
from streamline.tidy import TIDY_PASSES, ConvBiasToAdd, GemmToMatMul, SubToAdd
from tests.zoo import ZOO_MODELS, random_input, zoo_model_path

RNG = np.random.default_rng(0)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _run_both(proto, passes, inputs):
    ref = Executor(proto).run(inputs)
    m = Model(proto)
    PassManager([Stage("tidy", passes)]).run(m)
    out = Executor(m).run(inputs)
    return m, ref, out


def _gemm_model(trans_a=0, trans_b=1, alpha=1.0, beta=1.0, bias=True, quant_weight=True):
    w = RNG.normal(size=(6, 5)).astype(np.float32)  # [N, K] for transB
    if not trans_b:
        w = w.T.copy()
    inits = [_init("W", w)]
    nodes = []
    wname = "W"
    if quant_weight:
        scale = np.abs(RNG.normal(size=(6, 1) if trans_b else (1, 6))).astype(np.float32) / 4
        inits += [_init("s", scale), _init("z", np.float32(0)), _init("b", np.float32(4))]
        nodes.append(helper.make_node("Quant", ["W", "s", "z", "b"], ["Wq"], domain=QONNX_DOMAIN, signed=1,
                                      narrow=1, rounding_mode="ROUND", name="wq"))
        wname = "Wq"
    ins = ["x", wname]
    if bias:
        inits.append(_init("C", RNG.normal(size=(6,)).astype(np.float32)))
        ins.append("C")
    nodes.append(helper.make_node("Gemm", ins, ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta,
                                  name="gemm"))
    xshape = [5, 3] if trans_a else [3, 5]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6])], initializer=inits)
    return make_model(graph), xshape


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta,bias,quant", [
    (0, 1, 1.0, 1.0, False, True), (0, 1, 1.0, 1.0, True, True), (0, 0, 1.0, 1.0, True, False),
    (1, 1, 1.0, 1.0, True, False), (0, 1, 0.5, 2.0, True, True), (0, 1, 1.0, 1.0, True, False)])
def test_gemm_to_matmul(trans_a, trans_b, alpha, beta, bias, quant):
    proto, xshape = _gemm_model(trans_a, trans_b, alpha, beta, bias, quant)
    x = RNG.normal(size=xshape).astype(np.float32)
    m, ref, out = _run_both(proto, [GemmToMatMul], {"x": x})
    assert "Gemm" not in m.op_histogram() and m.op_histogram()["MatMul"] == 1
    if alpha == 1.0 and not bias:
        np.testing.assert_array_equal(out["y"], ref["y"])
    else:
        np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-6, atol=1e-6)
    mm = m.get_nodes_by_op_type("MatMul")[0]
    weight_producer = mm.inputs[1].producer()
    if trans_b:  # the weight was transposed at its source: no Transpose node, [K, N] weight
        assert weight_producer is None or weight_producer.op_type != "Transpose"
        w = m.get_initializer(mm.inputs[1].name) if weight_producer is None else \
            m.get_initializer(weight_producer.inputs[0].name)
        assert w.shape == (5, 6)


def test_conv_bias_to_add_and_sub_to_add():
    w = RNG.normal(size=(4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Sub", ["c", "k"], ["y"], name="sub")]
    inits = [_init("W", w), _init("B", RNG.normal(size=(4,)).astype(np.float32)),
             _init("k", RNG.normal(size=(1, 4, 1, 1)).astype(np.float32))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 6, 6])],
                              initializer=inits)
    x = RNG.normal(size=(2, 3, 6, 6)).astype(np.float32)
    m, ref, out = _run_both(make_model(graph), [ConvBiasToAdd, SubToAdd], {"x": x})
    assert m.op_histogram() == {"Add": 2, "Conv": 1}
    assert len(m.get_nodes_by_op_type("Conv")[0].inputs) == 2
    np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_tidy_on_zoo_is_exact(name):
    path = zoo_model_path(name)
    x = random_input(name, seed=1)
    ref = Executor(path).run({Model(path).input_names[0]: x})
    m = Model(path)
    PassManager([Stage("tidy", TIDY_PASSES)]).run(m)
    hist = m.op_histogram()
    assert "Gemm" not in hist and "Sub" not in hist
    assert all(n.outputs[0].shape is not None for n in m.graph)
    out = Executor(m).run({m.input_names[0]: x})
    gemm_bias = any(n.op_type == "Gemm" and len(n.inputs) > 2 for n in Model(path).graph)
    for k in ref:
        if gemm_bias:  # only the final Gemm's bias add may round differently (see GemmToMatMul)
            np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(out[k], ref[k])


def test_unnamed_nodes_streamline_with_per_pass_verification_to_a_model_onnxruntime_loads():
    """Rewrites name their nodes after the node they replace: two unnamed BatchNorms used to become two nodes
    named '_mul', which onnxruntime refuses (the per-pass check failed). Tidy names unnamed nodes first and the
    finalize stage makes every name unique (onnxruntime and FINN need unique names)."""
    from finnlite.build import streamline

    rng = np.random.default_rng(0)
    inits, nodes = {}, []
    x = "x"
    for i in range(2):
        for k, v in (("g", rng.uniform(0.5, 2, 4)), ("b", rng.normal(size=4)), ("m", rng.normal(size=4)),
                     ("v", rng.uniform(0.5, 2, 4))):
            inits[f"{k}{i}"] = v.astype(np.float32)
        nodes.append(helper.make_node("BatchNormalization", [x, f"g{i}", f"b{i}", f"m{i}", f"v{i}"], [f"bn{i}"]))
        inits.update({f"s{i}": np.float32(0.25), f"z{i}": np.float32(0), f"w{i}": np.float32(4)})
        nodes.append(helper.make_node("Quant", [f"bn{i}", f"s{i}", f"z{i}", f"w{i}"], [f"q{i}"], domain=QONNX_DOMAIN,
                                      signed=1, narrow=0, rounding_mode="ROUND"))
        x = f"q{i}"
    graph = helper.make_graph(nodes, "unnamed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4, 2, 2])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = Model(make_model(graph))
    report = streamline(model, verify="each", input_range=(-3.0, 3.0), extras=False)
    assert report.error is None, report.error
    names = [n.name for n in model.graph]
    assert all(names) and len(set(names)) == len(names)


@pytest.mark.parametrize("perm,scale_shape,bipolar", [
    ([1, 0], (6, 1), False), ([1, 0], (1,), False), ([1, 0], (6, 1), True),
    ([0, 2, 1], (3, 1, 1), False), ([2, 0, 1], (1, 1, 5), False), (None, (6, 1), False)])
def test_fold_transpose_into_quant_init(perm, scale_shape, bipolar):
    """The TorchScript exporter's Linear without bias: weight quantizer → Transpose → MatMul. The Transpose moves
    into the quantizer's constant inputs (per-channel scale and zero point transposed alike; None: the default
    reversed perm) and the result is bit-identical."""
    from streamline.tidy import FoldTransposeIntoQuantInit

    wshape = (6, 5) if perm is None or len(perm) == 2 else (3, 6, 5)
    w = RNG.normal(size=wshape).astype(np.float32)
    scale = (np.abs(RNG.normal(size=scale_shape)) / 4 + 0.01).astype(np.float32)
    inits = [_init("W", w), _init("s", scale)]
    if bipolar:
        nodes = [helper.make_node("BipolarQuant", ["W", "s"], ["Wq"], domain=QONNX_DOMAIN, name="wq")]
    else:
        zero = np.round(RNG.uniform(-2, 2, size=scale_shape)).astype(np.float32)
        inits += [_init("z", zero), _init("b", np.float32(4))]
        nodes = [helper.make_node("Quant", ["W", "s", "z", "b"], ["Wq"], domain=QONNX_DOMAIN, signed=1,
                                  narrow=0, rounding_mode="ROUND", name="wq")]
    t_attrs = {} if perm is None else {"perm": perm}
    nodes.append(helper.make_node("Transpose", ["Wq"], ["Wt"], name="t", **t_attrs))
    wt_shape = list(np.transpose(w, perm).shape)
    xshape = wt_shape[:-2] + [2, wt_shape[-2]]
    nodes.append(helper.make_node("MatMul", ["x", "Wt"], ["y"], name="mm"))
    yshape = wt_shape[:-2] + [2, wt_shape[-1]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, yshape)], initializer=inits)
    x = RNG.normal(size=xshape).astype(np.float32)
    m, ref, out = _run_both(make_model(graph), [FoldTransposeIntoQuantInit], {"x": x})
    assert "Transpose" not in m.op_histogram()
    assert m.get_nodes_by_op_type("MatMul")[0].inputs[1].producer().op_type == ("BipolarQuant" if bipolar else "Quant")
    np.testing.assert_array_equal(out["y"], ref["y"])


def test_fold_transpose_into_quant_init_leaves_a_shared_weight():
    """A quantized weight read by the Transpose and by another node stays (the rule records why)."""
    from streamline.tidy import FoldTransposeIntoQuantInit

    inits = [_init("W", RNG.normal(size=(4, 4)).astype(np.float32)), _init("s", np.float32(0.25))]
    nodes = [helper.make_node("BipolarQuant", ["W", "s"], ["Wq"], domain=QONNX_DOMAIN, name="wq"),
             helper.make_node("Transpose", ["Wq"], ["Wt"], perm=[1, 0], name="t"),
             helper.make_node("MatMul", ["x", "Wt"], ["a"], name="mm1"),
             helper.make_node("MatMul", ["a", "Wq"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], initializer=inits)
    rule = FoldTransposeIntoQuantInit()
    m = Model(make_model(graph))
    result = rule.run(m)
    assert not result.changed
    assert [miss.reason for miss in result.misses] == ["the quantized weight has another consumer"]
