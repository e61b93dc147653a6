"""Activation quantizers → MultiThreshold: bit-exact against the original on inputs that hit every tie.

Each test builds the smallest graph, converts it with the convert stage and runs original and converted in the
executor (float32). "Bit-exact" means every output element has the same bit pattern, except that -0.0 and +0.0
count as equal (see ``assert_same``).
"""

from __future__ import annotations

import itertools
import logging
import zlib

import numpy as np
import pytest
from onnx import helper

from custom_ops.quant import max_int, min_int
from finnlite.core.datatypes import DataType
from streamline.convert import ConvertQuantActToMultiThreshold, convert_passes
from tests.streamline.convert_helpers import (ROUNDING_MODES, act_quant_model, assert_same, converted, graph_model,
                                              init, op_types, place, quant_node, run, thresholds_of, tie_values)

# the original graphs divide huge test inputs (3e38) by small scales: numpy's overflow warning is expected there
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def _levels(bits: int, signed: int, narrow: int) -> tuple[int, int]:
    if bits == 1 and signed:
        return -1, 1
    return min_int(signed, narrow, bits), max_int(signed, narrow, bits)


def _scales(rng: np.random.Generator, channels: int) -> np.ndarray:
    """Half power-of-two scales (exact ties are common), half arbitrary ones (like Brevitas' 0.0666667)."""
    pow2 = 2.0 ** rng.integers(-8, 2, size=channels)
    other = np.exp(rng.uniform(-5, 1, size=channels))
    return np.where(np.arange(channels) % 2 == 0, pow2, other).astype(np.float32)


def _check_quant(bits: int, signed: int, narrow: int, mode: str, axis: int | None, zp_kind: str, rank: int = 3,
                 channels: int = 4, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    c = channels if axis is not None else 1
    scale = _scales(rng, c)
    if zp_kind == "zero":
        zp = np.zeros(c, np.float32)
    elif zp_kind == "int":
        zp = rng.integers(-2, 3, size=c).astype(np.float32)
    else:
        zp = (rng.integers(-8, 9, size=c) / 4 + 0.25).astype(np.float32)
    lo, hi = _levels(bits, signed, narrow)
    per_shape = [1] * rank
    if axis is not None:
        per_shape[axis] = c
    s_param = scale.reshape(per_shape) if axis is not None else scale.reshape(())
    z_param = zp.reshape(per_shape) if axis is not None and zp_kind != "zero" else zp[:1].reshape(())
    zp_eff = zp if axis is not None and zp_kind != "zero" else np.full(c, zp[0], np.float32)
    x = place(tie_values(scale, zp_eff, lo, hi, rng=rng), rank, axis)
    probe, report = converted(act_quant_model(x.shape, s_param, z_param, bits, signed, narrow, mode))
    if lo == hi:  # unsigned narrow 1-bit: a constant; reported, not converted
        assert op_types(probe) == ["Quant"] and "single-level" in report.misses[0].reason
        return
    assert op_types(probe)[0] == "MultiThreshold" and "Quant" not in op_types(probe), report.misses
    # the thresholds themselves and their neighbours are inputs too
    t = thresholds_of(probe)[0]
    t_rows = np.broadcast_to(t, (c, t.shape[1])) if t.shape[0] == 1 else t
    x = place(tie_values(scale, zp_eff, lo, hi, extra=t_rows, rng=rng), rank, axis)
    proto = act_quant_model(x.shape, s_param, z_param, bits, signed, narrow, mode)
    model, _ = converted(proto)
    want = run(proto, {"x": x})["y"]
    got = run(model, {"x": x})["y"]
    assert_same(got, want, f"{bits}-bit signed={signed} narrow={narrow} {mode} axis={axis} zp={zp_kind}")


_CASES = list(itertools.product(range(1, 9), (0, 1), (0, 1), ROUNDING_MODES))


@pytest.mark.parametrize("bits,signed,narrow,mode", _CASES)
def test_random_quantizer_matches_original(bits, signed, narrow, mode):
    """Every (bit width 1..8, signed, narrow, rounding mode), with a channel axis (none, 1 or 2 of a rank-3
    tensor) and a zero-point (0, integer, fractional; per channel when the scale is) drawn per case."""
    seed = zlib.crc32(f"{bits}{signed}{narrow}{mode}".encode())
    rng = np.random.default_rng(seed)
    axis = [None, 1, 2][int(rng.integers(3))]
    zp_kind = ["zero", "int", "frac"][int(rng.integers(3))]
    _check_quant(bits, signed, narrow, mode, axis, zp_kind, seed=seed)


@pytest.mark.parametrize("axis,zp_kind", list(itertools.product([None, 1, 2], ["zero", "int", "frac"])))
@pytest.mark.parametrize("mode", ["ROUND", "FLOOR", "HALF_UP"])
def test_every_axis_and_zeropoint(axis, zp_kind, mode):
    """Each channel axis with each kind of zero-point, for a signed narrow 3-bit and an unsigned 4-bit quantizer."""
    _check_quant(3, 1, 1, mode, axis, zp_kind, seed=7)
    _check_quant(4, 0, 0, mode, axis, zp_kind, seed=8)


@pytest.mark.parametrize("rank,axis", [(2, 1), (4, 1), (4, 3), (4, None)])
def test_other_ranks_and_layouts(rank, axis):
    """NC, NCHW and NHWC (channels last) per-channel scales, and a per-tensor scale on a 4-D tensor."""
    _check_quant(4, 1, 0, "ROUND", axis, "int", rank=rank, seed=rank)
    _check_quant(2, 0, 0, "ROUND", axis, "frac", rank=rank, seed=rank + 1)


def test_above_eight_bits_converts_with_all_thresholds():
    """A 10-bit quantizer converts (1023 thresholds) and stays exact."""
    _check_quant(10, 1, 0, "ROUND", 1, "zero", channels=2, seed=3)
    _check_quant(10, 0, 0, "ROUND", None, "zero", seed=4)


# -- the traps of FINN's converter --------------------------------------------------------------------------------
def test_trap_round_is_half_to_even():
    """ROUND is half to even: x/s = 0.5, 2.5, -1.5 go to 0, 2, -2. FINN's thresholds at (k + ½)·s would send 0.5
    to 1 and 2.5 to 3."""
    s = np.float32(0.25)
    proto = act_quant_model([1, 8], s, np.float32(0), 4, signed=1)
    model, _ = converted(proto)
    v = np.array([[0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 0.49999997]], np.float32)
    got = run(model, {"x": v * s})["y"]
    np.testing.assert_array_equal(got / s, [[0, 2, 2, 4, 0, -2, -2, 0]])
    assert_same(got, run(proto, {"x": v * s})["y"])
    finn_style = np.floor(v + 0.5)  # (k + 1/2)·s thresholds with >=
    assert np.any(finn_style != got / s)


@pytest.mark.parametrize("mode,expected", [("FLOOR", [0, 0, 1, -1, -1]), ("CEIL", [0, 1, 1, 0, -1]),
                                           ("UP", [0, 1, 1, -1, -1]), ("DOWN", [0, 0, 1, 0, -1])])
def test_trap_rounding_mode_is_honoured(mode, expected):
    """A Quant's rounding_mode decides the levels (FINN's converter ignores it and rounds to nearest)."""
    s = np.float32(0.5)
    v = np.array([[0.0, 0.3, 1.0, -0.7, -1.0]], np.float32)
    proto = act_quant_model([1, 5], s, np.float32(0), 3, signed=1, mode=mode)
    model, _ = converted(proto)
    got = run(model, {"x": v * s})["y"]
    np.testing.assert_array_equal(got / s, [expected])
    assert_same(got, run(proto, {"x": v * s})["y"])


def test_trap_one_bit_unsigned_is_binary():
    """A 1-bit unsigned Quant gives {0, s} (BINARY), not ±s (bipolar, as FINN lowers it)."""
    s = np.float32(0.75)
    proto = act_quant_model([1, 6], s, np.float32(0), 1, signed=0)
    model, _ = converted(proto)
    mt = next(n for n in model.graph if n.op_type == "MultiThreshold")
    assert mt.attributes["out_dtype"].value == "BINARY"
    assert model.get_tensor_datatype(mt.outputs[0].name) == DataType["BINARY"]
    x = np.array([[-1.0, -0.0, 0.2, 0.375, 0.5, 3.0]], np.float32)
    got = run(model, {"x": x})["y"]
    assert set(np.unique(got).tolist()) <= {0.0, 0.75}
    assert_same(got, run(proto, {"x": x})["y"])


def test_one_bit_signed_is_bipolar():
    """A 1-bit signed Quant is bipolar: out_scale 2, out_bias -1, annotated BIPOLAR."""
    proto = act_quant_model([1, 4], np.float32(0.5), np.float32(0), 1, signed=1)
    model, _ = converted(proto)
    mt = next(n for n in model.graph if n.op_type == "MultiThreshold")
    assert mt.attributes["out_scale"].value == 2.0 and mt.attributes["out_bias"].value == -1.0
    assert model.get_tensor_datatype(mt.outputs[0].name) == DataType["BIPOLAR"]
    x = np.array([[-1.0, -0.0, 0.0, 1.0]], np.float32)
    assert_same(run(model, {"x": x})["y"], run(proto, {"x": x})["y"])


@pytest.mark.parametrize("bits,signed,narrow", [(2, 1, 1), (2, 1, 0), (4, 1, 0), (3, 0, 0), (1, 1, 0), (1, 0, 0)])
def test_trap_multithreshold_output_holds_its_annotation(bits, signed, narrow):
    """The MultiThreshold output (bias included, as out_bias) holds exactly the values its annotation allows — FINN
    annotates INTb before adding the bias, so its MultiThreshold holds 0..2^b-1 under INTb."""
    proto = act_quant_model([1, 64], np.float32(0.25), np.float32(0), bits, signed, narrow)
    model, _ = converted(proto)
    mt = next(n for n in model.graph if n.op_type == "MultiThreshold")
    name = mt.outputs[0].name
    dt = model.get_tensor_datatype(name)
    assert mt.attributes["out_dtype"].value == dt.name
    lo, hi = _levels(bits, signed, narrow)
    x = np.linspace(-20, 20, 64, dtype=np.float32).reshape(1, 64)
    values = run(model, {"x": x}, return_all=True)[name]
    assert np.all(dt.allowed(values)), (dt.name, np.unique(values))
    assert values.min() == lo and values.max() == hi
    assert dt == {(2, 1, 1): DataType["INT2"], (2, 1, 0): DataType["INT2"], (4, 1, 0): DataType["INT4"],
                  (3, 0, 0): DataType["UINT3"], (1, 1, 0): DataType["BIPOLAR"],
                  (1, 0, 0): DataType["BINARY"]}[(bits, signed, narrow)]


def test_integer_zero_point_is_in_out_bias_and_annotated():
    """An integer scalar zero-point is folded into out_bias: the MultiThreshold outputs q - z, typed by its range."""
    proto = act_quant_model([1, 32], np.float32(0.5), np.float32(3), 3, signed=0)
    model, _ = converted(proto)
    mt = next(n for n in model.graph if n.op_type == "MultiThreshold")
    assert mt.attributes["out_bias"].value == -3.0
    assert model.get_tensor_datatype(mt.outputs[0].name) == DataType["INT4"]  # -3 .. 4
    assert "Add" not in op_types(model)
    x = np.linspace(-4, 4, 32, dtype=np.float32).reshape(1, 32)
    assert_same(run(model, {"x": x})["y"], run(proto, {"x": x})["y"])


def test_every_produced_tensor_is_annotated():
    """MultiThreshold, Add and Mul outputs and the new initializers all carry a datatype annotation."""
    s = np.array([0.5, 0.25], np.float32).reshape(1, 2, 1)
    z = np.array([0.5, -1.0], np.float32).reshape(1, 2, 1)
    proto = act_quant_model([1, 2, 5], s, z, 4, signed=1)
    model, _ = converted(proto)
    assert [n.op_type for n in model.graph] == ["MultiThreshold", "Add", "Mul"]
    for n in model.graph:
        for v in list(n.outputs) + [v for v in n.inputs if v is not None and v.is_initializer()]:
            assert model.has_tensor_datatype(v.name), v.name
    assert model.get_tensor_datatype(model.graph.node(0).outputs[0].name) == DataType["INT4"]


# -- predecessors --------------------------------------------------------------------------------------------------
def _pre(op_type: str) -> tuple[list, list]:
    c = np.array([0.5, -1.5, 2.0], np.float32).reshape(1, 3, 1)
    if op_type == "BatchNormalization":
        params = {"g": [1.5, -0.7, 0.3], "bb": [0.1, 0.2, -0.3], "mu": [0.05, -0.1, 0.2], "var": [1.2, 0.8, 2.0]}
        inits = [init(k, np.array(v, np.float32)) for k, v in params.items()]
        return [helper.make_node("BatchNormalization", ["x", "g", "bb", "mu", "var"], ["p"], epsilon=1e-5)], inits
    if op_type in ("Add", "Mul"):
        return [helper.make_node(op_type, ["x", "c"], ["p"])], [init("c", c)]
    if op_type in ("Clip", "NarrowClip"):
        lo = -1.3 if op_type == "Clip" else -0.6  # the narrow one cuts off levels: kept as a node
        return [helper.make_node("Clip", ["x", "lo", "hi"], ["p"])], [init("lo", np.float32(lo)),
                                                                      init("hi", np.float32(1.1))]
    return [helper.make_node(op_type, ["x"], ["p"])], []


@pytest.mark.parametrize("op_type,signed,absorbed", [
    ("Relu", 0, True), ("Relu", 1, True), ("Clip", 1, True), ("NarrowClip", 1, False),
    ("BatchNormalization", 1, False),
    ("Add", 1, False), ("Mul", 0, False), ("Sigmoid", 0, False), ("Tanh", 1, False), ("Sin", 1, False)])
def test_any_predecessor(op_type, signed, absorbed):
    """Whatever precedes the quantizer: Relu (absorbed; before a signed quantizer the levels below 0 it makes
    unreachable are dropped, :func:`streamline.convert_acts.narrowed`), Clip (absorbed unless it cuts off levels at
    different counts per channel, as the narrow one here does with per-channel scales),
    BatchNormalization, Add, Mul,
    Sigmoid, Tanh and even a non-monotonic Sin stay nodes, so the MultiThreshold sees the same float32 tensor."""
    pre, inits = _pre(op_type)
    s = np.array([0.125, 0.1, 0.3], np.float32).reshape(1, 3, 1)
    proto = act_quant_model([1, 3, 200], s, np.float32(0), 3, signed, 0, pre=pre, pre_inits=inits)
    model, report = converted(proto)
    ops = op_types(model)
    assert "Quant" not in ops and "MultiThreshold" in ops, report.misses
    assert (op_type.replace("Narrow", "") not in ops) == absorbed, ops
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(1, 3, 200)) * 2).astype(np.float32)
    x[0, :, :60] = (np.arange(60, dtype=np.float32) / 8 - 3.7)  # dense sweep, including exact ties for s = 1/8
    assert_same(run(model, {"x": x})["y"], run(proto, {"x": x})["y"], op_type)


def test_bipolar_quant_activation():
    """BipolarQuant with a per-channel scale: threshold 0.0 (-0.0 counts as >= 0 in both), Mul(s)."""
    s = np.array([0.5, 2.0], np.float32).reshape(1, 2, 1)
    proto = act_quant_model([1, 2, 6], s, np.float32(0), 1, op="BipolarQuant")
    model, _ = converted(proto)
    assert op_types(model) == ["MultiThreshold", "Mul"]
    x = np.array([-1.0, -0.0, 0.0, 1e-45, -1e-45, 3.0] * 2, np.float32).reshape(1, 2, 6)
    assert_same(run(model, {"x": x})["y"], run(proto, {"x": x})["y"])


# -- what is left alone, and said so ----------------------------------------------------------------------------------
def test_dynamic_scale_is_reported_and_left():
    nodes = [quant_node(["x", "s", "z", "b"], "y")]
    proto = graph_model(nodes, {"x": [1, 4], "s": [1]}, {"y": [1, 4]}, [init("z", np.float32(0)),
                                                                         init("b", np.float32(4))])
    model, report = converted(proto)
    assert op_types(model) == ["Quant"]
    assert any(m.rule == "ConvertQuantActToMultiThreshold" and "scale is not a constant" in m.reason
               for m in report.misses)


def test_bit_limit_warns_and_leaves_the_quantizer(caplog):
    proto = act_quant_model([1, 4], np.float32(0.5), np.float32(0), 6)
    with caplog.at_level(logging.WARNING):
        model, report = converted(proto, max_threshold_bits=5)
    assert op_types(model) == ["Quant"]
    assert any("max_threshold_bits=5" in m.reason for m in report.misses)
    assert any("max_threshold_bits" in r.getMessage() for r in caplog.records)
    assert ConvertQuantActToMultiThreshold().max_threshold_bits == 16
    assert convert_passes(max_threshold_bits=16)[2].max_threshold_bits == 16


def test_scale_varying_along_two_axes_is_reported():
    s = np.array([[0.5, 0.25], [1.0, 2.0]], np.float32).reshape(1, 2, 2)
    proto = act_quant_model([1, 2, 2], s, np.float32(0), 4)
    model, report = converted(proto)
    assert op_types(model) == ["Quant"]
    assert any("several axes" in m.reason for m in report.misses)
