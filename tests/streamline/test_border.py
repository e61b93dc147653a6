"""streamline.border: the border of a zero-padded first Conv that reads a preprocessed UINT8 input, as an integer
per-position Add and integer thresholds. The construction is checked by brute force over integers (ties and strict
thresholds included); the rule on small first layers (strides, asymmetric pads, 5×5, depthwise, one mean) against
the original with the same preprocessing, every pass verified, on 64 UINT8 inputs."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import pytest

from finnlite import Model
from finnlite.build import streamline
from streamline.border import border_plan
from streamline.preprocess import Preprocessing
from tests.streamline.convert_helpers import graph_model, init, quant_node

MEAN = (0.485, 0.456, 0.406)


def _passes(a: int, d: Fraction, e: Fraction, strict: bool) -> bool:
    return a + d > e if strict else a + d >= e


@pytest.mark.parametrize("seed", range(40))
def test_plan_agrees_with_the_real_thresholds_on_every_integer(seed: int) -> None:
    rng = np.random.default_rng(seed)
    den = int(rng.choice([1, 2, 8, 255, 1000]))
    frac = lambda: Fraction(int(rng.integers(-40 * den, 40 * den)), den)  # noqa: E731
    d = [frac() for _ in range(int(rng.integers(1, 10)))]
    e = sorted(frac() for _ in range(int(rng.integers(1, 16))))
    if seed % 3 == 0:  # exact ties between a border bias and a threshold (fractional parts equal)
        e[0] = d[-1] + int(rng.integers(-3, 4))
    strict = [bool(v) for v in rng.integers(0, 2, len(e))]
    e_in: list = list(e)
    if seed % 5 == 0:
        e_in[-1] = math.inf
    big_l, t, dint = border_plan(e_in, strict, d)
    assert 1 <= big_l <= len(d)
    for a in range(-120, 121):
        for g, dg in enumerate(d):
            for k, ek in enumerate(e_in):
                want = False if ek == math.inf else _passes(a, dg, ek, strict[k])
                assert (big_l * a + dint[g] >= t[k]) == want, (a, g, k)


def test_one_pattern_needs_no_scale() -> None:
    big_l, t, dint = border_plan([Fraction(7, 3), Fraction(9, 2)], [False, True], [Fraction(1, 5)])
    assert big_l == 1 and [v - dint[0] for v in t] == [3, 5]  # ⌈7/3 − 1/5⌉, ⌊9/2 − 1/5⌋ + 1


def _first_layer(kernel: int, stride: int, pads: list[int], group: int, ws: float = 0.005, size: int = 9
                 ) -> onnx.ModelProto:
    """x[1,3,size,size] → Conv(Quant(W) 8-bit, pads, stride, group) → Mul/Add (BatchNorm-like) → Relu →
    Quant(4-bit unsigned) → Conv 1x1 → Quant → y."""
    rng = np.random.default_rng(kernel * 100 + stride * 10 + group + sum(pads))
    oc = 6 if group == 1 else 3
    nodes = [quant_node(["w1", "ws1", "z0", "b8"], "w1q", narrow=1, name="wq1"),
             onnx.helper.make_node("Conv", ["x", "w1q"], ["c1"], name="conv1", pads=pads, strides=[stride] * 2,
                                   kernel_shape=[kernel] * 2, group=group),
             onnx.helper.make_node("Mul", ["c1", "bn_a"], ["m1"], name="bn_mul"),
             onnx.helper.make_node("Add", ["m1", "bn_b"], ["h1"], name="bn_add"),
             onnx.helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
             quant_node(["r1", "as1", "z0", "b4"], "a1", signed=0, name="aq1"),
             quant_node(["w2", "ws2", "z0", "b4"], "w2q", name="wq2"),
             onnx.helper.make_node("Conv", ["a1", "w2q"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             quant_node(["c2", "as2", "z0", "b4"], "y", name="aq2")]
    out = (size + pads[0] + pads[2] - kernel) // stride + 1, (size + pads[1] + pads[3] - kernel) // stride + 1
    inits = [init("w1", rng.standard_normal((oc, 3 // group, kernel, kernel)).astype(np.float32)),
             init("ws1", rng.uniform(0.5 * ws, 1.5 * ws, size=(oc, 1, 1, 1)).astype(np.float32)),
             init("bn_a", rng.uniform(0.5, 1.5, size=(1, oc, 1, 1)).astype(np.float32)),
             init("bn_b", rng.uniform(-0.5, 0.5, size=(1, oc, 1, 1)).astype(np.float32)),
             init("w2", rng.standard_normal((4, oc, 1, 1)).astype(np.float32)),
             init("ws2", np.float32(0.125)), init("z0", np.float32(0)), init("b4", np.float32(4)),
             init("b8", np.float32(8)), init("as1", np.float32(0.0625)), init("as2", np.float32(0.25))]
    return graph_model(nodes, {"x": [1, 3, size, size]}, {"y": [1, 4, *out]}, inits)


CASES = {"3x3_pad1": (3, 1, [1, 1, 1, 1], 1), "3x3_stride2": (3, 2, [1, 1, 1, 1], 1),
         "asymmetric": (3, 1, [1, 0, 2, 1], 1), "5x5_pad2": (5, 1, [2, 2, 2, 2], 1, 0.03),
         "depthwise": (3, 1, [1, 1, 1, 1], 3)}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mean", [MEAN, (0.5,)], ids=["per_channel_mean", "one_mean"])
def test_padded_first_layer_is_integer_and_exact(case: str, mean: tuple[float, ...]) -> None:
    model = Model(_first_layer(*CASES[case]))
    report = streamline(model, verify="each", samples=64, preprocessing=Preprocessing("UINT8", 1 / 255, mean,
                                                                                       (0.226,)), extras=False)
    report.raise_for_errors()
    assert report.verification.final.ok and report.verification.final.samples == 64
    assert report.float_nodes.integer_only, report.float_nodes.text()
    adds = [n for n in model.graph if n.op_type == "Add" and n.name.endswith("_border_add")]
    assert len(adds) == 1
    first = next(n for n in model.graph if n.op_type == "MatMul")
    assert model.get_tensor_datatype(first.inputs[0].name).name == "UINT8"
    assert adds[0].inputs[0].producer() is first and adds[0].outputs[0].uses()[0].node.op_type == "MultiThreshold"


def test_beyond_float32_integers_the_border_stays_a_float_add() -> None:
    """8-bit weights near full scale in a 5×5 kernel: L·a + d would exceed 2^24 (not exact in float32, FINN's
    Python execution included), so the rule declines and MoveAddPastPaddedConv moves the mean past the Conv as a
    float per-position Add (the first MatMul still reads UINT8)."""
    model = Model(_first_layer(5, 1, [2, 2, 2, 2], 1, ws=0.003))
    report = streamline(model, verify="final", samples=16, extras=False,
                        preprocessing=Preprocessing("UINT8", 1 / 255, MEAN, (0.226,)))
    report.raise_for_errors()
    assert not any(n.name.endswith("_border_add") for n in model.graph)
    assert [n.op_type for n in model.graph if n.name.endswith("_past_conv")] == ["Add"]
    assert not report.float_nodes.integer_only
