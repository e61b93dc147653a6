"""A weight whose quantizer lands on a float32 rounding tie, streamlined and checked against the original.

``fl32(w / s)`` is exactly 5.5 (half to even: 6, what Brevitas, qonnx and the convert stage compute) while the
quotient is 5.49999997 (5): a weight of ProxylessNAS (issue 24). The streamlined model holds 6; the final check
must compare it with float64 execution of the *same* network, with the weight quantized in float32, and accept it.
Before the fix float64 execution re-quantized the weight in double precision (5) and the final check reported the
streamlined model wrong by ``a`` output steps for every input level ``a`` on that weight.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN, make_model
from streamline.pipeline import streamline_model
from verify import ReferenceData, final_check

F32 = np.float32
W_TIE, S_W = F32(0.020022338), F32(0.0036404252)
K, N = 6, 3


def tie_model() -> Model:
    """x [1, K] → Quant(UINT4, s=1) → MatMul(Quant(w, s_w, INT4)) → Quant(INT12, s = s_w) → y [1, N]; the
    weight of input 0 and output 0 is the tie, the others are integers times s_w."""
    rng = np.random.default_rng(0)
    w = (rng.integers(-7, 8, size=(K, N)) * S_W).astype(F32)
    w[0, 0] = W_TIE
    inits = {"w": w, "s_w": np.array(S_W), "z": np.array(0.0, F32), "b4": np.array(4.0, F32),
             "s_x": np.array(1.0, F32), "s_y": np.array(S_W), "b12": np.array(12.0, F32)}
    nodes = [helper.make_node("Quant", ["x", "s_x", "z", "b4"], ["xq"], domain=QONNX_DOMAIN, name="act_quant",
                              signed=0, narrow=0, rounding_mode="ROUND"),
             helper.make_node("Quant", ["w", "s_w", "z", "b4"], ["wq"], domain=QONNX_DOMAIN, name="weight_quant",
                              signed=1, narrow=0, rounding_mode="ROUND"),
             helper.make_node("MatMul", ["xq", "wq"], ["acc"], name="mm"),
             helper.make_node("Quant", ["acc", "s_y", "z", "b12"], ["y"], domain=QONNX_DOMAIN, name="out_quant",
                              signed=1, narrow=0, rounding_mode="ROUND")]
    graph = helper.make_graph(nodes, "weight_tie",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return Model(make_model(graph, opset=13))


def test_streamlined_weight_tie_agrees_with_float64_execution() -> None:
    model = tie_model()
    x = np.random.default_rng(1).uniform(1.6, 15.4, size=(16, K)).astype(F32)  # input 0 at levels 2..15
    ref = ReferenceData(model, x)
    streamline_model(model)
    final = final_check(ref, model)
    assert final.ok, final.summary()
    final.raise_for_errors()
    # the check can fail: float64 execution of the original runs the float32 weight (6 x 5 levels of input 0)
    levels = np.round(ref.outputs(np.float64)["y"][:, 0] / np.float64(S_W))
    xq = np.round(x)
    w_int = np.round(np.asarray(ref.original().get_initializer("w"), np.float32) / S_W)  # as stored: float32
    assert w_int[0, 0] == 6
    np.testing.assert_array_equal(levels, xq @ w_int[:, 0])
