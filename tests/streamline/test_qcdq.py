"""QCDQ / QDQ import (streamline.convert_qcdq.QCDQToQuant): small chains built in code, constant weights, models
quantized by onnxruntime's ``quantize_static`` (QDQ format), and the zoo converted with qonnx's ``QuantToQCDQ``.

Every converted model is compared with onnxruntime's execution of the QDQ original (graph optimizations off):
bit for bit for lone quantizers (ties included), and after streamlining integer-only with the final check exact
on integer tensors and the outputs within one output step of onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import Model, PassManager, Stage
from finnlite.core.errors import FinnliteError, OpError
from streamline.convert_qcdq import QCDQToQuant, standard_range
from streamline.pipeline import streamline_model
from tests.streamline.qcdq_helpers import model_of, ort_runner, qdq_nodes, samples, streamline_and_check
from tests.zoo import ZOO_MODELS, manifest, zoo_model_path

SHAPE = [2, 4, 3, 3]
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15)}


def _quantizer(qtype: str, zero, *, axis=None, clip=None, scale=None) -> onnx.ModelProto:
    scale = np.float32(0.0371) if scale is None else scale
    nodes, inits = qdq_nodes("x", "y", scale, zero, qtype, axis=axis, clip=clip, prefix="act")
    return model_of(nodes, inits, {"x": SHAPE}, {"y": SHAPE})


def _hard_inputs(scale, zero, qtype: str, seed: int = 0) -> np.ndarray:
    """Per channel: the ties (k + ½)·s of every level, their float32 neighbours, and random values over the range
    and beyond; (N, C, 3, 3) with N a multiple of the declared batch."""
    rng = np.random.default_rng(seed)
    lo, hi = RANGES[qtype]
    channels = SHAPE[1]
    s = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (channels,))
    z = np.broadcast_to(np.asarray(zero).reshape(-1), (channels,)).astype(np.int64)
    values = []
    for c in range(channels):
        ties = ((np.arange(lo - z[c] - 2, hi - z[c] + 3) + 0.5) * s[c]).astype(np.float32)
        wide = rng.uniform((lo - z[c] - 4) * s[c], (hi - z[c] + 4) * s[c], size=200).astype(np.float32)
        values.append(np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)),
                                      np.nextafter(ties, np.float32(-np.inf)), wide]))
    per = 9 * SHAPE[0]
    n = -(-max(v.size for v in values) // per) * per
    x = np.stack([np.resize(v, n) for v in values])  # (C, n)
    return np.ascontiguousarray(x.reshape(channels, -1, 3, 3).transpose(1, 0, 2, 3))


def _run_alone(proto: onnx.ModelProto) -> Model:
    m = Model(proto)
    m.infer_shapes()
    PassManager([Stage("qcdq", [QCDQToQuant])]).run(m)
    return m


def _quant_nodes(m: Model) -> list[tuple[int, int, int]]:
    out = []
    for n in m.graph:
        if n.op_type == "Quant":
            bits = int(m.get_initializer(n.inputs[3].name))
            out.append((bits, n.attributes["signed"].value, n.attributes["narrow"].value))
    return out


# (type, zero-point, axis, clip, expected Quant (bits, signed, narrow), a Clip in front of it)
CASES = [
    ("int8", 0, None, None, (8, 1, 0), False),
    ("int8", 0, None, (-127, 127), (8, 1, 1), False),
    ("int8", 0, None, (-8, 7), (4, 1, 0), False),
    ("uint8", 0, None, (0, 15), (4, 0, 0), False),
    ("uint8", 0, None, (None, 254), (8, 0, 1), False),
    ("uint8", 128, None, None, (8, 1, 0), False),
    ("int8", -128, None, None, (8, 0, 0), False),
    ("int8", 13, None, None, (9, 1, 0), True),
    ("int8", 22, None, None, (9, 1, 0), True),
    ("uint8", 3, None, (0, 200), (9, 1, 0), True),
    ("int8", 0, None, (-3, 5), (4, 1, 0), True),
    ("int4", 0, None, None, (4, 1, 0), False),
    ("uint4", 0, None, None, (4, 0, 0), False),
    ("uint4", 5, None, None, (5, 1, 0), True),
    ("int8", [0, 0, 0, 0], 1, None, (8, 1, 0), False),
    ("uint8", [128] * 4, 1, None, (8, 1, 0), False),
    ("int4", [0] * 4, 1, None, (4, 1, 0), False),
    ("int8", [0] * 4, 1, (-127, 127), (8, 1, 1), False),
]
PER_AXIS_SCALE = np.array([0.0371, 0.5, 0.0029, 1.25], np.float32)


@pytest.mark.parametrize("qtype,zero,axis,clip,expected,clipped", CASES,
                         ids=[f"{c[0]}-z{c[1] if c[2] is None else 'axis'}-clip{c[3]}" for c in CASES])
def test_lone_quantizer_is_bit_exact(qtype, zero, axis, clip, expected, clipped) -> None:
    scale = PER_AXIS_SCALE if axis is not None else np.float32(0.0371)
    proto = _quantizer(qtype, zero, axis=axis, clip=clip, scale=scale)
    x = _hard_inputs(scale, zero, qtype)
    run = ort_runner(proto)
    want = np.concatenate([run({"x": x[i:i + 2]})["y"] for i in range(0, x.shape[0], 2)])
    m = _run_alone(proto)
    hist = m.op_histogram()
    assert "QuantizeLinear" not in hist and "DequantizeLinear" not in hist, hist
    assert _quant_nodes(m) == [expected]
    assert ("Clip" in hist) == clipped, hist
    got = Executor(m).run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)
    # the whole pipeline: one MultiThreshold (+ Mul) whose thresholds follow the real-number semantics (DESIGN.md),
    # so its levels equal those of the float64 execution of the original on every input, ties included
    full = Model(proto)
    streamline_model(full)
    assert set(full.op_histogram()) <= {"MultiThreshold", "Mul", "Transpose"}, full.op_histogram()
    s = np.asarray(scale, np.float64).reshape([-1, 1, 1] if np.ndim(scale) else [])
    want64 = Executor(proto, dtype=np.float64).run({"x": x.astype(np.float64)})["y"]
    got = Executor(full).run({"x": x})["y"]
    np.testing.assert_array_equal(np.round(got / s), np.round(want64 / s))
    differs = np.round(want / s) != np.round(want64 / s)  # float32 near-ties of the original itself
    np.testing.assert_array_equal(got[~differs], want[~differs])


@pytest.mark.parametrize("qtype,zero", [("int4", 0), ("uint4", 5)])
def test_int4_chain_under_per_pass_verification(qtype, zero) -> None:
    """onnxruntime cannot hand a 4-bit tensor to numpy: the reference leaves them out, and the checks still run."""
    proto = _quantizer(qtype, zero)
    out = streamline_and_check(proto, samples(proto, 8, seed=4, lo=-0.5, hi=0.5))
    assert out.integer_only and not out.unexplained, (out.float_nodes, out.unexplained)


def test_standard_ranges() -> None:
    assert standard_range(-128, 127) == (8, True, False)
    assert standard_range(-127, 127) == (8, True, True)
    assert standard_range(0, 254) == (8, False, True)
    assert standard_range(0, 1) == (1, False, False)
    assert standard_range(-1, 1) == (2, True, True)
    for lo, hi in ((-1, 0), (0, 0), (-3, 5), (-141, 114), (1, 7)):
        assert standard_range(lo, hi) is None


# -- errors ------------------------------------------------------------------------------------------------------
def _per_axis_asymmetric() -> onnx.ModelProto:
    return _quantizer("int8", [13] * 4, axis=1, scale=PER_AXIS_SCALE)


def _per_axis_mixed_zero() -> onnx.ModelProto:
    return _quantizer("int8", [0, 0, 3, 0], axis=1, scale=PER_AXIS_SCALE)


def _requantize() -> onnx.ModelProto:
    nodes, inits = qdq_nodes("x", "y", 0.0371, 0, "int8", prefix="act", dq_scale=0.05)
    return model_of(nodes, inits, {"x": SHAPE}, {"y": SHAPE})


def _empty_clip() -> onnx.ModelProto:
    return _quantizer("int8", 0, clip=(10, 5))


def _scale_input() -> onnx.ModelProto:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="act_q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="act_dq")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE),
                                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
                              initializer=[helper.make_tensor("z", TensorProto.INT8, [], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _float8() -> onnx.ModelProto:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="act_q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="act_dq")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
                              initializer=[numpy_helper.from_array(np.array(0.5, np.float32), "s"),
                                           helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("build,message", [
    (_per_axis_asymmetric, r"integer range \[-141, 114\].*per-axis scale"),
    (_per_axis_mixed_zero, r"different integer ranges per channel"),
    (_requantize, r"QuantizeLinear 'act_q'.*different scales"),
    (_empty_clip, r"Clip 'act_clip'.*empty integer range"),
    (_scale_input, r"scale is not a constant"),
    (_float8, r"FLOAT8E4M3FN is not an integer type"),
], ids=["per-axis-asymmetric", "per-axis-mixed-zero-points", "requantization", "empty-clip", "scale-input",
        "float8"])
def test_unconvertible_chains_raise_naming_the_node(build, message) -> None:
    model = Model(build())
    with pytest.raises(OpError, match=message) as info:
        streamline_model(model)
    assert "node 'act_" in str(info.value) and "\n" not in str(info.value)


def test_integer_graph_input_is_left_alone() -> None:
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["y"], name="dq")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("q", TensorProto.INT8, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              initializer=[numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    m = Model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    PassManager([Stage("qcdq", [QCDQToQuant])]).run(m)
    assert m.op_histogram() == {"DequantizeLinear": 1}


# -- constant weights and small networks ----------------------------------------------------------------------------
def _mlp(weight_form: str, act: tuple[str, int]) -> onnx.ModelProto:
    """x → QDQ → MatMul(W) → QDQ → Relu → QDQ → MatMul(W2) → QDQ → y, with W given as ``weight_form``: "dq" an int8
    initializer → DequantizeLinear (per column), "qcdq" a float weight → QuantizeLinear → Clip(narrow) →
    DequantizeLinear with Constant parameters (qonnx's QuantToQCDQ)."""
    rng = np.random.default_rng(3)
    qtype, z = act
    nodes, inits = [], []

    def add(chain):
        nodes.extend(chain[0])
        inits.extend(chain[1])

    add(qdq_nodes("x", "xq", 0.02, z, qtype, prefix="in"))
    w_int = rng.integers(-127, 128, size=(16, 8)).astype(np.int8)
    w_scale = rng.uniform(0.005, 0.02, size=8).astype(np.float32)
    if weight_form == "dq":
        inits += [numpy_helper.from_array(w_int, "w1_int"), numpy_helper.from_array(w_scale, "w1_scale"),
                  numpy_helper.from_array(np.zeros(8, np.int8), "w1_zero")]
        nodes.append(helper.make_node("DequantizeLinear", ["w1_int", "w1_scale", "w1_zero"], ["w1"], name="w1_dq",
                                      axis=1))
    else:
        w_float = (w_int.astype(np.float32) * w_scale).astype(np.float32)
        inits.append(numpy_helper.from_array(w_float, "w1_float"))
        for name, arr in (("w1_s", w_scale), ("w1_z", np.zeros(8, np.int8)), ("w1_lo", np.array(-127, np.int8)),
                          ("w1_hi", np.array(127, np.int8))):
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name)))
        nodes += [helper.make_node("QuantizeLinear", ["w1_float", "w1_s", "w1_z"], ["w1_q"], name="w1_q", axis=1),
                  helper.make_node("Clip", ["w1_q", "w1_lo", "w1_hi"], ["w1_c"], name="w1_clip"),
                  helper.make_node("DequantizeLinear", ["w1_c", "w1_s", "w1_z"], ["w1"], name="w1_dq", axis=1)]
    nodes.append(helper.make_node("MatMul", ["xq", "w1"], ["h"], name="mm1"))
    add(qdq_nodes("h", "hq", 0.05, z, qtype, prefix="h"))
    nodes.append(helper.make_node("Relu", ["hq"], ["r"], name="relu"))
    add(qdq_nodes("r", "rq", 0.03, 0, "uint8", prefix="r"))
    w2 = rng.integers(-8, 8, size=(8, 4)).astype(np.int8)
    inits += [numpy_helper.from_array(w2, "w2_int"), numpy_helper.from_array(np.float32(0.1), "w2_scale")]
    nodes.append(helper.make_node("DequantizeLinear", ["w2_int", "w2_scale"], ["w2"], name="w2_dq"))
    nodes.append(helper.make_node("MatMul", ["rq", "w2"], ["o"], name="mm2"))
    add(qdq_nodes("o", "y", 0.07, z, qtype, prefix="out"))
    return model_of(nodes, inits, {"x": [1, 16]}, {"y": [1, 4]})


@pytest.mark.parametrize("weight_form", ["dq", "qcdq"])
@pytest.mark.parametrize("act", [("int8", 0), ("int8", 13), ("uint8", 128)], ids=["int8", "int8-z13", "uint8-z128"])
def test_constant_weight_qdq_streamlines_integer_only(weight_form, act) -> None:
    proto = _mlp(weight_form, act)
    out = streamline_and_check(proto, samples(proto, 32, seed=1, lo=-2.0, hi=2.0))
    assert out.integer_only, out.float_nodes
    assert out.max_steps <= 1.0 and not out.unexplained, (out.exact, out.max_steps, out.unexplained)
    weights = {out.model.get_tensor_datatype(n.inputs[1].name).name for n in out.model.graph
               if n.op_type == "MatMul"}
    assert weights == {"INT8"} or weights == {"INT8", "INT4"}, weights


# -- onnxruntime's quantize_static ----------------------------------------------------------------------------------
def _float_mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 12)).astype(np.float32) * 0.3, "W1"),
             numpy_helper.from_array(rng.standard_normal(12).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array(rng.standard_normal((12, 5)).astype(np.float32) * 0.3, "W2"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32) * 0.1, "b2")]
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["a"], name="fc1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu1"),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="fc2")]
    return model_of(nodes, inits, {"x": [1, 16]}, {"y": [1, 5]})


def _float_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.3, "C1"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32) * 0.1, "cb1"),
             numpy_helper.from_array(rng.standard_normal((8, 6, 3, 3)).astype(np.float32) * 0.2, "C2"),
             numpy_helper.from_array(rng.standard_normal((8 * 2 * 2, 4)).astype(np.float32) * 0.2, "W"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["x", "C1", "cb1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "C2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Reshape", ["r2", "flat"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "W"], ["y"], name="fc")]
    return model_of(nodes, inits, {"x": [1, 3, 8, 8]}, {"y": [1, 4]})


def _quantize_static(proto: onnx.ModelProto, tmp_path, per_channel: bool, activation: str) -> onnx.ModelProto:
    pytest.importorskip("sympy", reason="onnxruntime's quantize_static needs sympy (not a finnlite dependency)")
    quantization = pytest.importorskip("onnxruntime.quantization")
    src, dst = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(proto, src)
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(7)

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter([{"x": rng.uniform(-1, 1, size=shape).astype(np.float32)} for _ in range(16)])

        def get_next(self):
            return next(self.data, None)

    quantization.quantize_static(str(src), str(dst), Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=per_channel, activation_type=getattr(quantization.QuantType, activation),
                                 weight_type=quantization.QuantType.QInt8)
    q = onnx.load(dst)
    q.ir_version = min(q.ir_version, 10)
    return q


@pytest.mark.parametrize("activation", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("build", [_float_mlp, _float_cnn], ids=["mlp", "cnn"])
def test_onnxruntime_quantize_static_qdq(build, per_channel, activation, tmp_path) -> None:
    proto = _quantize_static(build(), tmp_path, per_channel, activation)
    ops = {n.op_type for n in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    out = streamline_and_check(proto, samples(proto, 32, seed=2))
    print(f"{build.__name__} {activation} per_channel={per_channel}: {out.nodes_before} -> {out.nodes_after} "
          f"nodes, {out.exact}/{out.samples} bit-exact, max {out.max_steps:.3g} output steps")
    assert out.integer_only, out.float_nodes
    assert out.max_steps <= 1.0, out.max_steps
    assert not out.unexplained, (out.exact, out.unexplained)


def test_brevitas_export_onnx_qcdq() -> None:
    """A small CNN exported by Brevitas' export_onnx_qcdq (tests/streamline/data/make_brevitas_qcdq.py)."""
    proto = onnx.load(str(Path(__file__).parent / "data" / "brevitas_qcdq.onnx"))
    proto.ir_version = min(proto.ir_version, 10)
    assert {"QuantizeLinear", "Clip", "DequantizeLinear"} <= {n.op_type for n in proto.graph.node}
    out = streamline_and_check(proto, samples(proto, 32, seed=3, lo=-2.0, hi=2.0))
    assert out.integer_only, out.float_nodes
    # the output is the float Gemm of dequantized tensors: equal up to the float32 rounding of its sums
    assert out.max_rel <= 1e-5, out.max_rel


# -- the zoo through qonnx's QuantToQCDQ ----------------------------------------------------------------------------
def zoo_qcdq(name: str) -> onnx.ModelProto:
    """Zoo model ``name`` converted by qonnx's QuantToQCDQ, without the graph inputs it leaves unread (qonnx keeps
    the graph-input entries of the initializers it removes)."""
    qcdq = pytest.importorskip("qonnx.transformation.qonnx_to_qcdq")
    from qonnx.core.modelwrapper import ModelWrapper

    m = ModelWrapper(str(zoo_model_path(name))).transform(qcdq.QuantToQCDQ()).model
    used = {i for n in m.graph.node for i in n.input}
    keep = [i for i in m.graph.input if i.name in used]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.ir_version = min(m.ir_version, 10)
    return m


@pytest.mark.zoo
@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_through_quant_to_qcdq(name: str) -> None:
    proto = zoo_qcdq(name)
    lo, hi = manifest()[name]["input_range"]
    standard = all(not n.domain for n in proto.graph.node)
    out = streamline_and_check(proto, samples(proto, 32, seed=0, lo=lo, hi=hi), ort_reference=standard)
    ops = {n.op_type for n in proto.graph.node}
    print(f"{name}: QCDQ {'(standard ops only)' if standard else '(with qonnx ops)'} {out.nodes_before} nodes -> "
          f"{out.nodes_after}; integer-only {out.integer_only}; "
          + (f"{out.exact}/{out.samples} bit-exact vs onnxruntime, max {out.max_steps:.3g} steps"
             if standard else "exact vs the oracle"))
    assert out.integer_only, out.float_nodes
    if "QuantizeLinear" in ops:
        assert "Quant" not in out.model.op_histogram()
    if standard:
        assert out.max_steps <= 1.0 and not out.unexplained, (out.exact, out.max_steps, out.unexplained)


def test_cli_reports_an_unconvertible_chain(tmp_path, capsys) -> None:
    from finnlite.cli import main

    path = tmp_path / "bad.onnx"
    onnx.save(_per_axis_asymmetric(), path)
    code = main(["streamline", str(path), "-o", str(tmp_path / "out.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and "act_dq" in err and "Traceback" not in err, err
    assert isinstance(OpError("x"), FinnliteError)
