"""float64 mode takes the integers of a quantizer of the model's float32 constants (a weight quantizer) from float32.

A quantized weight is a parameter of the model: its integers are what float32 arithmetic makes of the float32
weight and scale (Brevitas, qonnx and the convert stage all compute them so); its value is those integers times
the scale, exactly (as in real arithmetic: a float32 product would round it). The weight and scale below are a
real case (ProxylessNAS, issue 24): ``fl32(w / s)`` is exactly 5.5 (half to even: 6) while the quotient is
5.49999997 (5), so a float64 evaluation of the quantizer would run a network with another weight.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from custom_ops.executor import Executor
from custom_ops.plan import FEED_ELEMENTS
from tests.custom_ops.test_executor import Q, build

F32 = np.float32
W_TIE, S_W = F32(0.020022338), F32(0.0036404252)


def test_the_weight_is_a_float32_tie() -> None:
    assert W_TIE / S_W == F32(5.5) and np.round(W_TIE / S_W) == 6
    assert np.round(np.float64(W_TIE) / np.float64(S_W)) == 5


def weight_model(k: int) -> tuple:
    """y = x @ Quant(w, s_w) with w [k, 1] whose element 0 is the tie and the others small random weights; an
    activation Quant on x (a data-dependent value: float64 mode keeps computing it in double)."""
    rng = np.random.default_rng(1)
    w = (rng.integers(-7, 8, size=(k, 1)) * S_W).astype(F32)
    w[0, 0] = W_TIE
    nodes = [helper.make_node("Quant", ["w", "s_w", "z", "b4"], ["wq"], domain=Q, name="weight_quant", signed=1,
                              narrow=0),
             helper.make_node("Quant", ["x", "s_x", "z", "b8"], ["xq"], domain=Q, name="act_quant", signed=1,
                              narrow=0),
             helper.make_node("MatMul", ["xq", "wq"], ["y"], name="mm")]
    inits = {"w": w, "s_w": np.array(S_W), "z": np.array(0.0, F32), "b4": np.array(4, F32),
             "b8": np.array(8, F32), "s_x": np.array(0.1, F32)}
    return build(nodes, {"x": (1, k)}, ["y", "wq"], inits), w


@pytest.mark.parametrize("k", [8, FEED_ELEMENTS])
def test_float64_mode_quantizes_weights_in_float32(k: int) -> None:
    model, w = weight_model(k)
    q = np.round(np.clip(w / S_W, -8, 7))  # numpy in float32: the model's arithmetic for its integers
    assert q[0, 0] == 6
    exact = q.astype(np.float64) * np.float64(S_W)  # their value: exact in float64
    assert exact[0, 0] != np.float64(F32(6) * S_W)  # (the float32 product is rounded)
    x = np.zeros((1, k), F32)
    x[0, 0] = F32(0.35)  # x / 0.1 is 3.5 in float32, 3.4999999 in float64: the activation stays float64
    ex = Executor(model, dtype=np.float64)
    got = ex.run({"x": x}, return_all=True)
    assert got["wq"].dtype == np.float64
    np.testing.assert_array_equal(got["wq"], exact)
    assert got["xq"][0, 0] == 3 * np.float64(F32(0.1))  # the activation: real arithmetic (3.4999999 → 3)
    assert got["y"][0, 0] == got["xq"][0, 0] * got["wq"][0, 0]
    assert Executor(model).run({"x": x})["y"][0, 0] == F32(4 * F32(0.1)) * F32(6 * S_W)
