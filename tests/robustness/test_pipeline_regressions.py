"""Minimal graphs for the pipeline bugs the fuzzer found, each checked as the fuzz test checks a graph.

* Conv → BatchNorm at the graph output (a float output, no activation quantizer): the BatchNorm becomes a
  per-channel Mul/Add carrying its exact constant (``finnlite.exact``); lowering to NHWC permuted the float32
  constant but not the exact one, and the restreamline stage then moved the Mul/Add past the output Transpose with
  the stale NCHW-shaped exact value: wrong values (1×1 kernels) or a broadcast failure in onnxruntime (larger
  kernels). Fixed in ``streamline/layout_walk.py`` (the exact constant is permuted with the float32 one).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite.core.compat import QONNX_DOMAIN, make_model
from tests.robustness.fuzzgraphs import FuzzGraph
from tests.robustness.test_fuzz import check_streamlined


def conv_bn_output(k: int, pad: int, depthwise: bool, channels: int = 2, spatial: int = 2) -> onnx.ModelProto:
    """``x → Quant(UINT2) → Conv(k×k, Quant(INT1) weights) → BatchNormalization → y`` (float output)."""
    rng = np.random.default_rng(0)
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: object) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    group = channels if depthwise else 1
    w = rng.normal(size=(channels, channels // group, k, k))
    nodes = [
        helper.make_node("Quant", ["x", const("s0", 1 / 3), const("z0", 0.0), const("b0", 2.0)], ["xq"], name="inq",
                         domain=QONNX_DOMAIN, signed=0, narrow=0),
        helper.make_node("Quant", [const("w", w), const("ws", float(np.abs(w).max())), const("wz", 0.0),
                                   const("wb", 1.0)], ["wq"], name="wq", domain=QONNX_DOMAIN, signed=1, narrow=0),
        helper.make_node("Conv", ["xq", "wq"], ["c"], name="conv", kernel_shape=[k, k], pads=[pad] * 4, group=group),
        helper.make_node("BatchNormalization", ["c", const("g", rng.uniform(0.5, 1.5, channels)),
                                                const("b", rng.normal(size=channels)),
                                                const("m", rng.normal(size=channels)),
                                                const("v", rng.uniform(0.5, 2.0, channels))], ["y"], name="bn"),
    ]
    out = spatial + 2 * pad - k + 1
    graph = helper.make_graph(nodes, "conv_bn_output",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, spatial, spatial])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, out, out])],
                              initializer=inits)
    return make_model(graph)


@pytest.mark.parametrize("k,pad", [(1, 0), (2, 1), (3, 1)])
@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_batchnorm_at_the_output(k: int, pad: int, depthwise: bool) -> None:
    proto = conv_bn_output(k, pad, depthwise)
    model = check_streamlined(FuzzGraph(proto, input_seed=0, input_range=(0.0, 1.0)))
    assert "BatchNormalization" not in model.op_histogram()
