"""Trunc versions 1 and 2 against qonnx's trunc_v1/trunc_v2 and its Trunc_v1/Trunc_v2 ops, and the version
selection against qonnx's registry."""

from __future__ import annotations

import numpy as np
import pytest
from qonnx.custom_op.general import trunc as qt

from custom_ops.quant import ROUNDING_MODES
from custom_ops.trunc import Trunc, trunc_v1, trunc_v2, trunc_version

MODES = list(ROUNDING_MODES)
F32 = np.float32


def accumulator(rng, shape, scale, bits=10, signed=True):
    """Integer values times ``scale``, plus a few exact ties of the shifted value."""
    lo = -(2 ** (bits - 1)) if signed else 0
    ints = rng.integers(lo, lo + 2 ** bits, shape).astype(F32)
    ints.flat[:6] = [0, 8, -8, 12, -12, 4][: ints.size] if signed else [0, 8, 12, 4, 20, 28][: ints.size]
    return ints * scale


@pytest.mark.parametrize("mode", MODES)
def test_v1_matches_qonnx(h, mode):
    rng = np.random.default_rng(1)
    for scale, zp, in_bits, out_bits in [(0.5, 0.0, 10, 8), (0.03125, 0.0, 12, 4), (1.0, 2.0, 8, 8),
                                         (0.2, 0.0, 9, 3)]:
        s, z = np.asarray(scale, F32), np.asarray(zp, F32)
        ib, ob = np.asarray(in_bits, F32), np.asarray(out_bits, F32)
        x = accumulator(rng, (2, 3, 4, 4), s, in_bits)
        x.flat[-3:] = [-0.0, 0.3 * scale, -0.7 * scale]
        h.same_bits(trunc_v1(x, s, z, ib, ob, mode), qt.trunc_v1(x, s, z, ib, ob, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("signed,narrow", [(1, 0), (1, 1), (0, 0), (0, 1)])
def test_v2_matches_qonnx(h, mode, signed, narrow):
    rng = np.random.default_rng(2)
    cases = [(0.5, 0.0, 2.0, 10, 8), (0.125, 0.0, 0.125, 8, 8), (0.1, 0.0, 0.8, 12, 4),
             (1.0, 0.0, 3.0, 9, 3),  # output/input scale 3: the shift rounds to 2^2
             (0.25, 1.0, 1.0, 8, 6), (0.25, 0.0, 2.0, 8, 1)]
    for scale, zp, out_scale, in_bits, out_bits in cases:
        s, z, os_ = np.asarray(scale, F32), np.asarray(zp, F32), np.asarray(out_scale, F32)
        ib, ob = np.asarray(in_bits, F32), np.asarray(out_bits, F32)
        x = accumulator(rng, (1, 4, 3, 3), s, in_bits, bool(signed))
        expected = qt.trunc_v2(x, s, z, ib, narrow, signed, os_, ob, mode)
        h.same_bits(trunc_v2(x, s, z, ib, os_, ob, bool(signed), bool(narrow), mode), expected)


def test_v2_per_channel_scales(h):
    rng = np.random.default_rng(3)
    s = np.array([0.5, 0.25, 1.0], F32).reshape(1, 3, 1, 1)
    os_ = np.array([2.0, 2.0, 2.0], F32).reshape(1, 3, 1, 1)
    z, ib, ob = np.asarray(0.0, F32), np.asarray(10.0, F32), np.asarray(6.0, F32)
    x = accumulator(rng, (2, 3, 5, 5), s, 10)
    for mode in MODES:
        h.same_bits(trunc_v2(x, s, z, ib, os_, ob, False, False, mode),
                    qt.trunc_v2(x, s, z, ib, 0, 0, os_, ob, mode))


def v1_inputs():
    x = np.arange(-40, 40, dtype=F32).reshape(1, 2, 40) * F32(0.25)
    return [x, np.asarray(0.25, F32), np.asarray(0.0, F32), np.asarray(8.0, F32), np.asarray(5.0, F32)]


def v2_inputs():
    x = np.arange(0, 80, dtype=F32).reshape(1, 2, 40) * F32(0.25)
    return [x, np.asarray(0.25, F32), np.asarray(0.0, F32), np.asarray(8.0, F32), np.asarray(2.0, F32),
            np.asarray(4.0, F32)]


@pytest.mark.parametrize("opset", [1, 2, 3])
def test_op_matches_qonnx_op_under_each_opset(h, opset):
    """Given the opset, the version is the one qonnx's registry picks, and the results agree."""
    for inputs, attrs in [(v1_inputs(), {"rounding_mode": "FLOOR"}),
                          (v2_inputs(), {"rounding_mode": "ROUND", "signed": 0, "narrow": 0})]:
        proto = h.node("Trunc", len(inputs), **attrs)
        qonnx_version = int(type(h.qonnx_op(proto, opset)).__name__.rsplit("_v", 1)[1])
        if {1: 5, 2: 6}[qonnx_version] != len(inputs):
            continue  # qonnx would read the wrong inputs; ours refuses (test_version_input_count_mismatch)
        op = Trunc(proto.name, attrs, opset_version=opset)
        assert op.version_for(len(inputs)) == qonnx_version
        h.same_bits(op.execute(inputs)[0], h.qonnx_run(proto, inputs, opset=opset))


def test_make_op_picks_version_by_input_count(h):
    v1 = h.ours(h.node("Trunc", 5, rounding_mode="FLOOR"))
    v2 = h.ours(h.node("Trunc", 6, rounding_mode="FLOOR", signed=0))
    assert v1.version_for(5) == 1 and v2.version_for(6) == 2
    h.same_bits(v1.execute(v1_inputs())[0], qt.trunc_v1(*v1_inputs(), "FLOOR"))
    h.same_bits(v2.execute(v2_inputs())[0], qt.trunc_v2(*v2_inputs()[:4], 0, 0, *v2_inputs()[4:], "FLOOR"))


def test_trunc_version_is_since_version():
    assert [trunc_version(v) for v in (None, 1, 2, 3, 20)] == [None, 1, 2, 2, 2]
    with pytest.raises(ValueError):
        trunc_version(0)


def test_version_input_count_mismatch(h):
    op = Trunc("tr", {"rounding_mode": "FLOOR"}, opset_version=1)
    h.raises_naming_node(lambda: op.execute(v2_inputs()), "version 1 takes 5 inputs", node_name="tr")
    op2 = Trunc("tr", {"rounding_mode": "FLOOR"}, opset_version=2)
    h.raises_naming_node(lambda: op2.infer_shapes([(1,)] * 5, [None] * 5), "version 2 takes 6", node_name="tr")
    h.raises_naming_node(lambda: op2.execute(v1_inputs()[:4]), "5 to 6 inputs", node_name="tr")
    h.raises_naming_node(lambda: Trunc("tr", {"rounding_mode": "FLOOR"}, opset_version=0), "opset 0",
                         node_name="tr")


def test_v1_rejects_v2_attributes(h):
    h.raises_naming_node(lambda: Trunc("tr", {"rounding_mode": "FLOOR", "signed": 1}, opset_version=1),
                         "version 2", node_name="tr")
    op = h.ours(h.node("Trunc", 5, name="tr", rounding_mode="FLOOR", narrow=0))
    h.raises_naming_node(lambda: op.execute(v1_inputs()), "'narrow'", "version 2", node_name="tr")


@pytest.mark.parametrize("attrs,fragments", [
    ({}, ("rounding_mode", "missing")),
    ({"rounding_mode": "TRUNCATE"}, ("unknown rounding mode",)),
    ({"rounding_mode": "FLOOR", "signed": 3}, ("signed", "0 or 1")),
    ({"rounding_mode": "FLOOR", "clip": 1}, ("unknown attribute",)),
])
def test_bad_attributes(h, attrs, fragments):
    h.raises_naming_node(lambda: h.ours(h.node("Trunc", 6, name="tr", **attrs)), *fragments, node_name="tr")


@pytest.mark.parametrize("index,value,fragment", [
    (1, 0.0, "scale"), (3, 0.0, "input bitwidth"), (3, 7.5, "input bitwidth"), (4, -1.0, "output scale"),
    (4, np.inf, "output scale"), (5, -3.0, "output bitwidth"), (2, np.nan, "zero-point"),
])
def test_bad_inputs(h, index, value, fragment):
    op = h.ours(h.node("Trunc", 6, name="tr", rounding_mode="FLOOR"))
    inputs = v2_inputs()
    inputs[index] = np.asarray(value, F32)
    h.raises_naming_node(lambda: op.execute(inputs), fragment, node_name="tr")
    h.raises_naming_node(lambda: op.infer_datatypes([None] * 6, [None, *inputs[1:]]), fragment, node_name="tr")


def test_shapes_and_datatypes(h):
    proto = h.node("Trunc", 6, rounding_mode="FLOOR")
    op = h.ours(proto)
    assert op.infer_shapes([(1, 8, 4, 4), (), (), (), (), ()], [None] * 6) == [(1, 8, 4, 4)]
    params = v2_inputs()[1:]
    assert op.infer_datatypes([None] * 6, [None, *params])[0].name == "FLOAT32"
    inits = {i + 1: p for i, p in enumerate(params)}
    assert h.qonnx_datatype(proto, [(1, 8), *params], inits) == "FLOAT32"
