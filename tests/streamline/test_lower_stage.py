"""The whole lower stage (LOWER_PASSES) on small ResNet- and MobileNet-like graphs: exact with our executor and with
qonnx's, and in the form FINN's hardware conversion (step_convert_to_hw) reads."""

from __future__ import annotations

import numpy as np
import pytest

from finnlite.core.datatypes import is_integer_type
from finnlite.core.shapes import const_array
from streamline.lower import LOWER_PASSES
from streamline.lower_common import get_tensor_sparsity
from tests.qonnx_ref import qonnx_execute
from tests.verify.structure import check_datatypes, check_structure
from tests.streamline.test_lower_common import (GraphBuilder, assert_exact, assert_transposes_only_at_input,
                                                int_weights, op_types, run_passes)

RNG = np.random.default_rng(3)


def _float_thresholds(channels, steps, lo, hi):
    return np.sort(RNG.uniform(lo, hi, size=(channels, steps)), axis=1).astype(np.float32)


def _network(kind: str):
    g = GraphBuilder()
    c = 6
    a = g.mt(g.node("Conv", ["x", g.const(int_weights(RNG, (c, 3, 3, 3)))], pads=[1, 1, 1, 1]),
             _float_thresholds(c, 3, -200, 200), "UINT2")
    if kind == "resnet":
        b = g.mt(g.node("Conv", [a, g.const(int_weights(RNG, (c, c, 3, 3)))], pads=[1, 1, 1, 1]),
                 _float_thresholds(c, 3, -40, 40), "UINT2")
        b = g.node("Conv", [b, g.const(int_weights(RNG, (c, c, 1, 1)))])
        s = g.mt(g.node("Add", [b, a]), _float_thresholds(c, 3, -15, 15), "UINT2")
        p = g.node("MaxPool", [s], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])  # 4x4
    else:  # mobilenet: depthwise 3x3 stride 2, pointwise 1x1, quantized average pooling
        d = g.mt(g.node("Conv", [a, g.const(int_weights(RNG, (c, 1, 3, 3)))], pads=[1, 1, 1, 1], strides=[2, 2],
                        group=c), _float_thresholds(c, 3, -10, 10), "UINT2")
        e = g.mt(g.node("Conv", [d, g.const(int_weights(RNG, (c, c, 1, 1)))]), _float_thresholds(1, 3, -10, 10),
                 "UINT2")
        p = g.node("QuantAvgPool2d", [e], custom=True, kernel=2, stride=1, ibits=2, obits=4, signed=0)  # 3x3
    f = g.node("Flatten", [p])
    y = g.node("MatMul", [f, g.const(int_weights(RNG, (c * (16 if kind == "resnet" else 9), 10)))])
    y = g.node("Add", [g.node("Mul", [y, g.const(np.array(0.037, np.float32))]), g.const(np.float32(0.25))])
    _, idx = g.node("TopK", [y, g.const(np.array([1], np.int64))], outputs=2)
    return g.build({"x": (1, 3, 8, 8)}, [idx], {"x": "UINT8"})


@pytest.mark.parametrize("kind", ["resnet", "mobilenet"])
def test_lower_stage_end_to_end(kind):
    model = _network(kind)
    x = {"x": RNG.integers(0, 256, size=(1, 3, 8, 8)).astype(np.float32)}
    before, after, report = run_passes(model, LOWER_PASSES, x)
    assert_exact(before, after)
    assert_exact(before, qonnx_execute(model, x))  # qonnx's kernels read the lowered form the same way
    assert not report.misses, report.misses
    assert check_structure(model).ok, check_structure(model).issues  # no replaced constant left behind
    assert check_datatypes(model, x).ok  # every integer annotation holds on the data

    ops = op_types(model)
    assert not {"Conv", "MaxPool", "Mul"} & set(ops)
    assert_transposes_only_at_input(model)
    assert ops.count("Transpose") == 1
    # MVAU / VVAU: [K, N] integer weight initializers; depthwise weights carry the sparsity annotation
    for mm in model.get_nodes_by_op_type("MatMul"):
        w = model.get_initializer(mm.inputs[1].name)
        assert w is not None and w.ndim == 2
        assert is_integer_type(model.get_tensor_datatype(mm.inputs[1].name))
        assert is_integer_type(model.get_tensor_datatype(mm.inputs[0].name))
    if kind == "mobilenet":
        assert sum(get_tensor_sparsity(mm.inputs[1]) is not None for mm in model.get_nodes_by_op_type("MatMul")) == 1
        assert model.get_nodes_by_op_type("QuantAvgPool2d")[0].attributes["data_layout"].value == "NHWC"
    else:
        assert model.get_tensor_layout(model.get_nodes_by_op_type("Add")[0].outputs[0].name) == list("NHWC")
    # ConvolutionInputGenerator: NHWC integer input, zero padding
    for i2c in model.get_nodes_by_op_type("Im2Col"):
        assert model.get_tensor_layout(i2c.inputs[0].name) == list("NHWC")
        assert is_integer_type(model.get_tensor_datatype(i2c.inputs[0].name))
        assert i2c.attributes["pad_value"].value == 0
    # Thresholding: NHWC, integer thresholds within the input range (+1), rows 1 or C, a threshold datatype
    for mt in model.get_nodes_by_op_type("MultiThreshold"):
        assert mt.attributes["data_layout"].value == "NHWC"
        t = const_array(mt.inputs[1])
        idt = model.get_tensor_datatype(mt.inputs[0].name)
        assert np.array_equal(t, np.round(t)) and t.min() >= idt.min() and t.max() <= idt.max() + 1
        assert t.shape[0] in (1, mt.inputs[0].shape[-1])
        assert model.has_tensor_datatype(mt.inputs[1].name)
    # LabelSelect: TopK reads the integer classifier output directly
    topk = model.get_nodes_by_op_type("TopK")[0]
    assert topk.inputs[0].producer().op_type == "MatMul"
    assert is_integer_type(model.get_tensor_datatype(topk.inputs[0].name))
