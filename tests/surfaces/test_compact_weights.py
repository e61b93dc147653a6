"""Depthwise weights stay compact through a whole verified run: the pipeline, per-pass verification, the final check,
the report's extras and the save never make the dense block-sparse matrix (finnlite.core.tensors), and the file holds
exactly what the dense matrix gives."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import finnlite.core.tensors as tensors
from finnlite import Model
from finnlite.build import streamline
from finnlite.core.compat import QONNX_DOMAIN, make_model
from finnlite.core.tensors import DepthwiseWeight
from tests.zoo import require_zoo, zoo_model_path


def _mobilenet_block(c: int = 8, hw: int = 10, seed: int = 0) -> onnx.ModelProto:
    """A Brevitas-style QONNX graph: 8-bit input quantizer, a 3x3 conv, then a depthwise 3x3 (stride 2) and a
    pointwise 1x1 conv, each with 4-bit weights, BatchNorm, ReLU and a 4-bit activation quantizer."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def quant(x, out, scale, bits, signed):
        nodes.append(helper.make_node("Quant", [x, const(f"{out}_s", scale), const(f"{out}_z", 0.0),
                                                const(f"{out}_b", bits)], [out], domain=QONNX_DOMAIN,
                                      signed=int(signed), narrow=int(signed), rounding_mode="ROUND"))
        return out

    def layer(x, name, shape, group=1, strides=(1, 1), pads=(1, 1, 1, 1)):
        w = quant(const(f"{name}_w", rng.normal(0, 0.3, size=shape)), f"{name}_wq", 0.1, 4, True)
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}_conv"], group=group, strides=list(strides),
                                      pads=list(pads)))
        cout = shape[0]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}_conv", const(f"{name}_g", rng.uniform(0.5, 2, cout)),
                                                             const(f"{name}_beta", rng.normal(0, 0.5, cout)),
                                                             const(f"{name}_m", rng.normal(0, 0.5, cout)),
                                                             const(f"{name}_v", rng.uniform(0.5, 2, cout))],
                                      [f"{name}_bn"]))
        nodes.append(helper.make_node("Relu", [f"{name}_bn"], [f"{name}_relu"]))
        return quant(f"{name}_relu", f"{name}_act", 1 / 8, 4, False)

    x = quant("x", "x_q", 1 / 64, 8, True)
    x = layer(x, "stem", (c, 3, 3, 3))
    x = layer(x, "dw", (c, 1, 3, 3), group=c, strides=(2, 2))
    x = layer(x, "pw", (c, c, 1, 1), pads=(0, 0, 0, 0))
    out = hw // 2
    graph = helper.make_graph(nodes, "mobilenet_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      [1, 3, hw, hw])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, out, out])], inits)
    return make_model(graph)


def _count_dense(monkeypatch) -> list:
    made: list = []
    real = tensors._dense_tensor
    monkeypatch.setattr(tensors, "_dense_tensor", lambda kernel: made.append(kernel.shape) or real(kernel))
    return made


@pytest.mark.parametrize("verify", ["each", "final"])
def test_a_verified_run_keeps_depthwise_weights_compact(verify, monkeypatch, tmp_path):
    made = _count_dense(monkeypatch)
    proto = _mobilenet_block()
    model = Model(proto)
    report = streamline(model, verify=verify, input_range=(-2.0, 2.0), samples=4)
    assert report.error is None and report.verification.final.ok
    dw = [v.const_value for v in model.graph.initializers.values() if isinstance(v.const_value, DepthwiseWeight)]
    assert len(dw) == 1 and dw[0].channels == 8
    assert report.cost_after is not None
    model.save(tmp_path / "out.onnx")
    assert made == []  # nothing above needed the dense matrix
    # the file holds the dense matrix FINN reads, and the saved model computes what the original does
    saved = onnx.load(str(tmp_path / "out.onnx"))
    name = next(n for n, v in model.graph.initializers.items() if v.const_value is dw[0])
    dense = numpy_helper.to_array(next(t for t in saved.graph.initializer if t.name == name))
    np.testing.assert_array_equal(dense, tensors.depthwise_matrix(dw[0].kernel))
    from verify import ReferenceData, final_check

    reference = ReferenceData.random(Model(proto), n=4, seed=1, low=-2.0, high=2.0)
    assert final_check(reference, Model(tmp_path / "out.onnx")).ok


@pytest.mark.zoo
@pytest.mark.slow
def test_mobilenet_never_makes_a_dense_depthwise_matrix(monkeypatch, tmp_path):
    """MobileNet-v1's 13 depthwise weights are 100 MB dense (5.7 times the file): the CLI's default run (per-pass
    verification, final check, report extras) and the save never make them."""
    require_zoo()
    made = _count_dense(monkeypatch)
    model = Model(zoo_model_path("mobilenet_v1_4b"))
    report = streamline(model, input_range=(-2.5, 2.5))
    assert report.error is None and report.verification.final.ok
    assert sum(isinstance(v.const_value, DepthwiseWeight) for v in model.graph.initializers.values()) == 13
    model.save(tmp_path / "out.onnx")
    assert made == []
