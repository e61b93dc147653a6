"""A global sum in FINN's lowered-pooling form (streamline/finn_pool.py): exact, and only where it applies."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from finnlite import Model
from finnlite.core.passes import PassManager, Stage
from streamline.finn_pool import LowerGlobalSum
from tests.streamline.rulecheck import compare, graph_model

RNG = np.random.default_rng(0)
SHAPE = (2, 3, 5, 6)  # N, H, W, C


def _model(axes, keepdims=1, layout=("N", "H", "W", "C"), datatype="INT4"):
    out = list(np.zeros(SHAPE).sum(axis=tuple(axes), keepdims=bool(keepdims)).shape)
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=keepdims, name="sum"),
             helper.make_node("Mul", ["s", "k"], ["y"], name="scale")]
    proto = graph_model(nodes, {"x": SHAPE}, {"y": out},
                        {"axes": np.array(axes, np.int64), "k": np.float32(0.25)})
    model = Model(proto)
    model.set_tensor_datatype("x", datatype)
    if layout is not None:
        model.set_tensor_layout("x", list(layout))
    model.infer_shapes()
    return proto, model


def _run(model: Model) -> Model:
    PassManager([Stage("s", [LowerGlobalSum])]).run(model)
    return model


@pytest.mark.parametrize("axes", [[1, 2], [-3, -2]])
def test_spatial_sum_becomes_im2col_reshape_sum(axes):
    """ReduceSum over H, W of an integer NHWC tensor → Im2Col (the whole map, depthwise) → Reshape [N,1,1,HW,C] →
    ReduceSum over the window axis: the same integers, the output shape kept."""
    proto, model = _model(axes)
    _run(model)
    assert [n.op_type for n in model.graph] == ["Im2Col", "Reshape", "ReduceSum", "Mul"]
    im2col, reshape, total = list(model.graph)[:3]
    assert list(im2col.attributes["kernel_size"].value) == [3, 5] and im2col.attributes["depthwise"].value == 1
    assert reshape.inputs[1].const_value.numpy().tolist() == [2, 1, 1, 15, 6]
    assert total.inputs[1].const_value.numpy().tolist() == [3] and total.attributes["keepdims"].value == 0
    assert list(model.get_tensor_shape(total.outputs[0].name)) == [2, 1, 1, 6]
    x = RNG.integers(-8, 8, size=SHAPE).astype(np.float64)
    compare(proto, model, {"x": x})


@pytest.mark.parametrize("axes,keepdims,layout,datatype", [
    ([1, 2], 0, ("N", "H", "W", "C"), "INT4"),   # the reduced dims dropped
    ([1], 1, ("N", "H", "W", "C"), "INT4"),      # one spatial axis
    ([1, 2], 1, None, "INT4"),                   # no NHWC layout annotation
    ([1, 2], 1, ("N", "H", "W", "C"), "FLOAT32"),  # not an integer tensor
])
def test_other_sums_are_left_alone(axes, keepdims, layout, datatype):
    """Not a spatial sum of an integer NHWC tensor keeping its dims: no rewrite (FINN's Pool takes only that)."""
    _, model = _model(axes, keepdims, layout, datatype)
    _run(model)
    assert [n.op_type for n in model.graph] == ["ReduceSum", "Mul"]
