"""Quantized biases (Brevitas' Int32Bias/Int16Bias, onnxruntime's int32 QDQ biases): folded to their exact value.

A bias quantizer ``Quant(b, s_b, 0, 32)`` (or ``DequantizeLinear(q_b, s_b)``) computes the constant ``q_b·s_b``,
which float32 rounds; float64 execution of the original (the reference) adds the exact product. FoldQuantWeights
folds it, with ConvBiasToAdd's Reshape, into a constant Add whose exact value is recorded, so that the thresholds
it meets are those of the real-number semantics. Checked: graphs built here (Conv with a padded border and the
Reshape, Gemm, a Relu before the quantizer, per-tensor and per-channel weight scales, negative biases, signed and
unsigned outputs, QONNX and QDQ) through the default pipeline against float64 execution of the original, over
many seeds; and a bias whose float32 rounding lands exactly on a rounding tie of the output quantizer.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from onnx import helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import Model
from streamline.exact import EXACT_KEY, exact_value
from streamline.pipeline import streamline_model
from tests.streamline.convert_helpers import graph_model, init, quant_node
from tests.streamline.qcdq_helpers import model_of, qdq_nodes
from verify import ReferenceData, final_check
from finnlite.float_report import float_report


def _bias_model(kind: str, seed: int, per_channel: bool, wbits: int, obits: int, relu: bool, signed_out: bool):
    """x → Quant(8) → Conv (3×3, pad 1) or Gemm with a quantized weight and an Int32-quantized bias whose scale is
    fl32(s_in·s_w) → [Relu] → Quant(obits) → y."""
    rng = np.random.default_rng(seed)
    cin, cout = 3, 5
    s_in = np.float32(rng.uniform(0.005, 0.02))
    if kind == "conv":
        w = rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32)
        s_w = np.asarray(rng.uniform(0.01, 0.05, (cout, 1, 1, 1)) if per_channel else rng.uniform(0.01, 0.05),
                         np.float32)
        x_shape, y_shape = [1, cin, 6, 6], [1, cout, 6, 6]
    else:
        w = rng.normal(0, 0.3, (cin * 4, cout)).astype(np.float32)
        s_w = np.asarray(rng.uniform(0.01, 0.05, (1, cout)) if per_channel else rng.uniform(0.01, 0.05), np.float32)
        x_shape, y_shape = [1, cin * 4], [1, cout]
    s_b = (s_in * s_w.reshape(-1)).astype(np.float32) if per_channel else np.float32(s_in * s_w)
    b = rng.normal(0, 1.0, cout).astype(np.float32)
    s_out = np.float32(rng.uniform(0.02, 0.2))
    inits = [init("s_in", s_in), init("z", np.float32(0)), init("b8", np.float32(8)), init("w", w),
             init("s_w", s_w), init("bw", np.float32(wbits)), init("bias", b), init("s_b", s_b),
             init("b32", np.float32(32)), init("s_out", s_out), init("bo", np.float32(obits))]
    nodes = [quant_node(["x", "s_in", "z", "b8"], "xq", name="qin"),
             quant_node(["w", "s_w", "z", "bw"], "wq", narrow=1, name="qw"),
             quant_node(["bias", "s_b", "z", "b32"], "bq", name="qb")]
    if kind == "conv":
        nodes.append(helper.make_node("Conv", ["xq", "wq", "bq"], ["acc"], pads=[1, 1, 1, 1], name="conv"))
    else:
        nodes.append(helper.make_node("Gemm", ["xq", "wq", "bq"], ["acc"], name="gemm"))
    src = "acc"
    if relu:
        nodes.append(helper.make_node("Relu", ["acc"], ["r"], name="relu"))
        src = "r"
    nodes.append(quant_node([src, "s_out", "z", "bo"], "y", signed=int(signed_out), name="qout"))
    return graph_model(nodes, {"x": x_shape}, {"y": y_shape}, inits)


CASES = [(kind, pc, wbits, obits, relu, signed)
         for kind, pc, wbits, obits, relu, signed in [
             ("conv", False, 8, 8, False, True), ("conv", True, 4, 4, True, False), ("conv", True, 8, 4, False, True),
             ("gemm", False, 4, 8, True, False), ("gemm", True, 8, 8, False, True), ("gemm", True, 2, 3, True, True)]]


@pytest.mark.parametrize("kind,per_channel,wbits,obits,relu,signed", CASES)
@pytest.mark.parametrize("seed", range(6))
def test_quantized_bias_streamlines_to_integers_and_agrees_with_float64(kind, per_channel, wbits, obits, relu,
                                                                        signed, seed):
    proto = _bias_model(kind, seed, per_channel, wbits, obits, relu, signed)
    model = Model(proto)
    ref = ReferenceData.random(model, n=24, seed=seed, low=-2.5, high=2.5)
    result = streamline_model(model)
    report = float_report(model, result.report)
    assert report.integer_only, report.text()
    assert "Reshape" not in model.op_histogram()
    final = final_check(ref, model)
    assert final.ok, final.summary()


def test_folded_bias_records_its_exact_value():
    """After the convert stage the bias is a constant of the Add (the Reshape folded) with (q − z)·s recorded
    exactly where float32 rounds it."""
    from finnlite import PassManager, Stage
    from streamline.convert import convert
    from streamline.tidy import TIDY_PASSES

    proto = _bias_model("conv", 3, True, 8, 8, False, True)
    model = Model(proto)
    PassManager([Stage("tidy", TIDY_PASSES)]).run(model)
    convert(model)
    adds = [n for n in model.graph if n.op_type == "Add"]
    assert len(adds) == 1 and "Reshape" not in model.op_histogram()
    add = adds[0]
    c = next(v for v in add.inputs if v.const_value is not None)
    assert c.const_value.numpy().shape == (1, 5, 1, 1)
    exact = exact_value(add, c.const_value.numpy()).ravel()
    arrays = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    q = np.round(arrays["bias"] / arrays["s_b"])
    want = [Fraction(int(qi)) * Fraction(float(si)) for qi, si in zip(q, arrays["s_b"])]
    assert list(exact) == want
    assert EXACT_KEY in add.metadata_props  # float32 rounds at least one of these products


def _tie_model(qdq: bool):
    """x (4 inputs, scale 1) → MatMul with weights 1 → + bias 3·fl32(1/6) = ½ + 1.49e-8 → Quant(scale 1) → y.

    Float32 rounds the bias to ½: every accumulator lands on a rounding tie, which goes to the even neighbour;
    the bias's real value (float64 execution) is above ½, so every accumulator rounds up."""
    s_b = np.float32(1 / 6)
    if qdq:
        nodes, inits = qdq_nodes("x", "xq", np.float32(1), np.int8(0), "int8", prefix="in")
        wn, wi = qdq_nodes("w", "wq", np.float32(1), np.int8(0), "int8", prefix="w")
        bn = [helper.make_node("DequantizeLinear", ["bias_q", "bias_s", "bias_z"], ["bq"], name="bias_dq")]
        bi = [helper.make_tensor("bias_q", 6, [1], [3]), helper.make_tensor("bias_s", 1, [], [float(s_b)]),
              helper.make_tensor("bias_z", 6, [], [0])]
        on, oi = qdq_nodes("acc", "y", np.float32(1), np.int8(0), "int8", prefix="out")
        mm = [helper.make_node("MatMul", ["xq", "wq"], ["mm"], name="mm"),
              helper.make_node("Add", ["mm", "bq"], ["acc"], name="add")]
        inits += wi + bi + oi + [init("w", np.ones((4, 1), np.float32))]
        return model_of(nodes + wn + bn + mm + on, inits, {"x": [1, 4]}, {"y": [1, 1]})
    inits = [init("one", np.float32(1)), init("z", np.float32(0)), init("b8", np.float32(8)),
             init("w", np.ones((4, 1), np.float32)), init("bias", np.float32([0.5])), init("s_b", s_b),
             init("b32", np.float32(32))]
    nodes = [quant_node(["x", "one", "z", "b8"], "xq", name="qin"),
             quant_node(["w", "one", "z", "b8"], "wq", name="qw"),
             quant_node(["bias", "s_b", "z", "b32"], "bq", name="qb"),
             helper.make_node("MatMul", ["xq", "wq"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "bq"], ["acc"], name="add"),
             quant_node(["acc", "one", "z", "b8"], "y", name="qout")]
    return graph_model(nodes, {"x": [1, 4]}, {"y": [1, 1]}, inits)


@pytest.mark.parametrize("qdq", [False, True], ids=["qonnx", "qdq"])
def test_bias_rounded_onto_a_tie_follows_the_exact_value(qdq: bool):
    proto = _tie_model(qdq)
    x = np.array([[a, b, 0, 0] for a in range(-6, 7) for b in range(-3, 4)], np.float32)
    model = Model(proto)
    streamline_model(model)
    want = Executor(proto, dtype=np.float64).run({"x": x.astype(np.float64)})["y"]
    got = Executor(model).run({"x": x})["y"]
    acc = x.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(want, acc + 1)  # the reference: ½ + 1.49e-8 rounds up
    np.testing.assert_array_equal(got, want)
    f32 = Executor(proto).run({"x": x})["y"]
    assert np.any(f32 != want), "float32 execution should round some ties to even (else the test shows nothing)"


def _qdq_bias_conv(seed: int, per_channel: bool, asym: bool):
    """onnxruntime's QDQ form: uint8/int8 input, int8 weights (per channel or per tensor), an int32 bias with scale
    fl32(s_in·s_w), Conv, Q/DQ of the output."""
    rng = np.random.default_rng(seed)
    cin, cout = 3, 4
    s_in = np.float32(rng.uniform(0.005, 0.02))
    z_in = np.uint8(rng.integers(100, 150)) if asym else np.int8(0)
    s_w = (rng.uniform(0.002, 0.01, cout) if per_channel else np.array(rng.uniform(0.002, 0.01))).astype(np.float32)
    w = rng.integers(-127, 128, (cout, cin, 3, 3)).astype(np.int8)
    bias = rng.integers(-20000, 20000, cout).astype(np.int32)
    s_b = (s_in * (s_w if per_channel else np.full(cout, s_w))).astype(np.float32)
    nodes, inits = qdq_nodes("x", "xq", s_in, z_in, "uint8" if asym else "int8", prefix="in")
    axis = {"axis": 0} if per_channel else {}
    nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wq"], name="w_dq", **axis),
              helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["bq"], name="b_dq", axis=0),
              helper.make_node("Conv", ["xq", "wq", "bq"], ["acc"], pads=[1, 1, 1, 1], name="conv")]
    zw = np.zeros(s_w.shape, np.int8)
    inits += [helper.make_tensor("w_q", 3, list(w.shape), w.ravel().tolist()),
              helper.make_tensor("w_s", 1, list(s_w.shape), s_w.ravel().tolist()),
              helper.make_tensor("w_z", 3, list(zw.shape), zw.ravel().tolist()),
              helper.make_tensor("b_q", 6, [cout], bias.tolist()),
              helper.make_tensor("b_s", 1, [cout], s_b.tolist()),
              helper.make_tensor("b_z", 6, [cout], [0] * cout)]
    on, oi = qdq_nodes("acc", "y", np.float32(rng.uniform(0.05, 0.2)), np.uint8(128) if asym else np.int8(0),
                       "uint8" if asym else "int8", prefix="out")
    return model_of(nodes + on, inits + oi, {"x": [1, cin, 5, 5]}, {"y": [1, cout, 5, 5]})


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("asym", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_qdq_int32_bias_is_exact(per_channel: bool, asym: bool, seed: int):
    proto = _qdq_bias_conv(seed, per_channel, asym)
    model = Model(proto)
    ref = ReferenceData.random(model, n=24, seed=seed, low=-2.0, high=2.0)
    result = streamline_model(model)
    report = float_report(model, result.report)
    assert report.integer_only, report.text()
    final = final_check(ref, model)
    assert final.ok, final.summary()
