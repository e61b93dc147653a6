"""Quant / IntQuant against qonnx's int_quant and IntQuant op: values bit for bit, datatypes, shapes, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from qonnx.custom_op.general import intquant as qi

from custom_ops.quant import ROUNDING_MODES, max_int, min_int, quant, rounding_function

MODES = list(ROUNDING_MODES)
F32 = np.float32


def edge_values(bits: int, signed: bool, narrow: bool) -> np.ndarray:
    """Inputs (in units of the scale) at every tie and bound of the quantizer, and the specials."""
    lo = min_int(signed, narrow, bits) if bits > 1 or not signed else -1
    hi = max_int(signed, narrow, bits) if bits > 1 or not signed else 1
    ints = np.arange(lo - 2, hi + 3, dtype=np.float64) if hi - lo < 64 else np.array([lo - 1, lo, hi, hi + 1.0])
    ties = np.concatenate([ints + 0.5, ints - 0.5])
    near = np.concatenate([np.nextafter(ties.astype(F32), F32(np.inf)), np.nextafter(ties.astype(F32), F32(-np.inf))])
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 0.49999997, -0.49999997, 1e30, -1e30])
    return np.concatenate([ints, ties, near, specials]).astype(F32)


def reference(x, scale, zeropoint, bits, signed, narrow, mode):
    return qi.int_quant(x, np.asarray(scale), np.asarray(zeropoint), np.asarray(bits, dtype=F32),
                        signed, narrow, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("signed", [0, 1])
@pytest.mark.parametrize("narrow", [0, 1])
def test_bitwidths_1_to_16_random_and_edges(h, mode, signed, narrow):
    rng = np.random.default_rng(MODES.index(mode) * 4 + signed * 2 + narrow)
    for bits in range(1, 17):
        span = 2.0 ** bits
        x_rand = (rng.standard_normal(64) * span).astype(F32)
        for scale in (F32(1.0), F32(0.25), F32(rng.uniform(0.003, 3.0))):
            x = np.concatenate([x_rand * scale, edge_values(bits, bool(signed), bool(narrow)) * scale])
            expected = reference(x, scale, F32(0), bits, signed, narrow, mode)
            h.same_bits(quant(x, np.asarray(scale), np.asarray(F32(0)), np.asarray(bits, dtype=F32),
                              bool(signed), bool(narrow), mode), expected)


@pytest.mark.parametrize("mode", MODES)
def test_per_channel_scale_and_zeropoint_broadcast(h, mode):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 3, 4, 5)) * 4).astype(F32)
    x.flat[:8] = [0.5, -0.5, 1.5, 2.5, -0.0, 127.5, -128.5, 3.5]
    for scale_shape in [(1, 3, 1, 1), (3, 1, 1), (5,), (1,), ()]:
        scale = rng.uniform(0.05, 1.0, scale_shape).astype(F32)
        zp = rng.integers(0, 5, scale_shape).astype(F32)
        for signed, narrow, bits in [(0, 0, 8), (1, 1, 4), (1, 0, 3), (0, 1, 2)]:
            expected = reference(x, scale, zp, bits, signed, narrow, mode)
            h.same_bits(quant(x, scale, zp, np.asarray(bits, dtype=F32), bool(signed), bool(narrow), mode),
                        expected)


def test_one_bit_signed_is_bipolar_one_bit_unsigned_is_binary(h):
    x = np.array([-3.0, -0.5, -0.0, 0.0, 0.2, 0.5, 0.7, 2.0, np.nan], dtype=F32)
    bipolar = quant(x, np.asarray(F32(1)), np.asarray(F32(0)), 1, True, True, "FLOOR")
    h.same_bits(bipolar, np.array([-1, -1, 1, 1, 1, 1, 1, 1, -1], dtype=F32))
    binary = quant(x[:-1], np.asarray(F32(1)), np.asarray(F32(0)), 1, False, False, "ROUND")
    h.same_bits(binary, np.array([0, 0, 0, 0, 0, 0, 1, 1], dtype=F32))
    for mode in MODES:
        h.same_bits(quant(x, np.asarray(F32(1)), np.asarray(F32(0)), 1, True, False, mode),
                    reference(x, F32(1), F32(0), 1, 1, 0, mode))


def test_rounding_modes_at_ties():
    v = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -1.2, 1.7], dtype=F32)
    expected = {
        "ROUND": [-2, -2, -0, 0, 2, 2, -1, 2], "HALF_EVEN": [-2, -2, -0, 0, 2, 2, -1, 2],
        "CEIL": [-2, -1, -0, 1, 2, 3, -1, 2], "FLOOR": [-3, -2, -1, 0, 1, 2, -2, 1],
        "UP": [-3, -2, -1, 1, 2, 3, -2, 2], "DOWN": [-2, -1, -0, 0, 1, 2, -1, 1],
        "HALF_UP": [-3, -2, -1, 1, 2, 3, -1, 2], "HALF_DOWN": [-2, -1, -0, 0, 1, 2, -1, 2],
    }
    assert set(expected) == set(MODES)
    for mode, want in expected.items():
        np.testing.assert_array_equal(rounding_function(mode)(v), np.array(want, dtype=F32), err_msg=mode)
        np.testing.assert_array_equal(rounding_function(mode.lower())(v), qi.resolve_rounding_mode(mode)(v))


def test_min_max_int_match_qonnx():
    for bits in range(1, 33):
        for signed in (False, True):
            for narrow in (False, True):
                b = np.asarray(bits, dtype=np.int64)
                assert min_int(signed, narrow, bits) == qi.min_int(signed, narrow, b)
                assert max_int(signed, narrow, bits) == qi.max_int(signed, narrow, b)
    assert (min_int(True, False, 8), max_int(True, False, 8)) == (-128, 127)
    assert (min_int(True, True, 8), max_int(False, True, 8)) == (-127, 254)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=hnp.arrays(F32, st.integers(1, 40), elements=st.floats(-300, 300, width=32)),
       scale=st.floats(0.0009765625, 8, width=32), zp=st.integers(0, 3), bits=st.integers(1, 9),
       signed=st.booleans(), narrow=st.booleans(), mode=st.sampled_from(MODES))
def test_property_matches_qonnx(h, x, scale, zp, bits, signed, narrow, mode):
    h.same_bits(quant(x, np.asarray(F32(scale)), np.asarray(F32(zp)), np.asarray(bits, dtype=F32), signed,
                           narrow, mode),
                     reference(x, F32(scale), F32(zp), bits, int(signed), int(narrow), mode))


# -- the op --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["Quant", "IntQuant"])
@pytest.mark.parametrize("domain", ["qonnx.custom_op.general", "finn.custom_op.general", "onnx.brevitas"])
def test_op_execute_matches_qonnx_op(h, op_type, domain):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1, 4, 3, 3)) * 3).astype(F32)
    params = [np.full((1, 4, 1, 1), 0.375, F32), np.zeros((), F32), np.asarray(4.0, F32)]
    proto = h.node(op_type, 4, domain=domain, signed=1, narrow=0, rounding_mode="half_up")
    ref_proto = h.node("IntQuant", 4, signed=1, narrow=0, rounding_mode="half_up")
    out = h.ours(proto).execute([x, *params])
    assert len(out) == 1
    h.same_bits(out[0], h.qonnx_run(ref_proto, [x, *params]))


def test_op_output_dtype(h):
    proto = h.node("Quant", 4, signed=0, narrow=0)
    op = h.ours(proto)
    x64 = np.linspace(-2, 2, 11)
    params = [np.asarray(0.5, np.float64), np.asarray(0.0), np.asarray(3.0)]
    out = op.execute([x64, *params])[0]
    h.same_bits(out, qi.int_quant(x64, *params, 0, 0, "ROUND"))
    # float32 input with float64 parameters: computed as qonnx does, cast to float32 as qonnx does
    out32 = op.execute([x64.astype(F32), *params])[0]
    h.same_bits(out32, h.qonnx_run(proto, [x64.astype(F32), *params]))


@pytest.mark.parametrize("signed,bits,scale,zp,expected", [
    (1, 4, 1.0, 0.0, "INT4"), (0, 8, 1.0, 0.0, "UINT8"), (1, 1, 1.0, 0.0, "BIPOLAR"), (0, 1, 1.0, 0.0, "BINARY"),
    (1, 4, 0.5, 0.0, "SCALEDINT<4>"), (0, 3, [1.0, 0.25], 0.0, "SCALEDINT<3>"), (1, 16, 1.0, 0.0, "INT16"),
    (1, 4, 1.0, 1.0, "FLOAT32"), (1, 4, 1.0, [0.0, 1.0], "FLOAT32"),
])
def test_datatype_matches_qonnx(h, signed, bits, scale, zp, expected):
    proto = h.node("Quant", 4, signed=signed, narrow=0)
    values = [None, np.asarray(scale, F32), np.asarray(zp, F32), np.asarray(bits, F32)]
    inputs = [(1, 2), *values[1:]]
    assert h.qonnx_datatype(proto, inputs, {1: values[1], 2: values[2], 3: values[3]}) == expected
    assert h.ours(proto).infer_datatypes([None] * 4, values)[0].name == expected


def test_datatype_unknown_or_nonscalar_parameters_is_float32(h):
    proto = h.node("Quant", 4, signed=1, narrow=0)
    one, zero, four = np.asarray(1.0, F32), np.asarray(0.0, F32), np.asarray(4.0, F32)
    # qonnx asserts a 0-d bitwidth and known parameters, else FLOAT32
    cases = [([None, one, zero, np.asarray([4.0], F32)], {1: one, 2: zero, 3: np.asarray([4.0], F32)}),
             ([None, None, zero, four], {2: zero, 3: four})]
    for values, inits in cases:
        inputs = [(2,)] + [v if v is not None else (1,) for v in values[1:]]
        assert h.qonnx_datatype(proto, inputs, inits) == "FLOAT32"
        assert h.ours(proto).infer_datatypes([None] * 4, values)[0].name == "FLOAT32"


def test_shape_inference(h):
    op = h.ours(h.node("Quant", 4, signed=1, narrow=0))
    assert op.infer_shapes([(2, 3, 4, 4), (1, 3, 1, 1), (), ()], [None] * 4) == [(2, 3, 4, 4)]
    assert op.infer_shapes([("N", 3, 8), (3, 1), (), ()], [None] * 4) == [("N", 3, 8)]
    assert op.infer_shapes([None, (), (), ()], [None] * 4) == [None]
    h.raises_naming_node(lambda: op.infer_shapes([(2, 3), (4,), (), ()], [None] * 4), "scale", "broadcast")
    h.raises_naming_node(lambda: op.infer_shapes([(3,), (1, 3), (), ()], [None] * 4), "more dimensions")


@pytest.mark.parametrize("index,value,fragments", [
    (3, np.asarray(0.0, F32), ("bitwidth", "at least 1")),
    (3, np.asarray(-2.0, F32), ("bitwidth", "at least 1")),
    (3, np.asarray(2.5, F32), ("bitwidth", "integer")),
    (3, np.asarray(np.nan, F32), ("bitwidth", "integer")),
    (3, np.asarray([4.0, 4.0], F32), ("bitwidth", "single value")),
    (1, np.asarray(0.0, F32), ("scale", "> 0")),
    (1, np.asarray([0.5, -0.5], F32), ("scale", "> 0")),
    (1, np.asarray(np.nan, F32), ("scale", "finite")),
    (1, np.asarray(np.inf, F32), ("scale", "finite")),
    (2, np.asarray(np.inf, F32), ("zero-point", "finite")),
])
def test_bad_inputs_raise_naming_node(h, index, value, fragments):
    op = h.ours(h.node("Quant", 4, name="q_act", signed=1, narrow=0))
    inputs = [np.zeros(2, F32), np.asarray(1.0, F32), np.asarray(0.0, F32), np.asarray(4.0, F32)]
    inputs[index] = value
    h.raises_naming_node(lambda: op.execute(inputs), *fragments, node_name="q_act")
    values = [None, *inputs[1:]]
    h.raises_naming_node(lambda: op.infer_datatypes([None] * 4, values), *fragments, node_name="q_act")


@pytest.mark.parametrize("attrs,fragments", [
    ({"signed": 1, "narrow": 0, "rounding_mode": "NEAREST"}, ("rounding mode", "NEAREST")),
    ({"signed": 2, "narrow": 0}, ("signed", "0 or 1")),
    ({"signed": 1, "narrow": -1}, ("narrow", "0 or 1")),
    ({"signed": 1, "narrow": 0, "bias": 1}, ("unknown attribute", "bias")),
    ({"narrow": 0}, ("signed", "missing")),
])
def test_bad_attributes_raise_naming_node(h, attrs, fragments):
    h.raises_naming_node(lambda: h.ours(h.node("Quant", 4, name="q_w", **attrs)), *fragments, node_name="q_w")


def test_wrong_number_of_inputs(h):
    op = h.ours(h.node("Quant", 3, signed=1, narrow=0))
    h.raises_naming_node(lambda: op.execute([np.zeros(2, F32)] * 3), "4 inputs", "got 3")
    h.raises_naming_node(lambda: op.infer_shapes([(2,)] * 5, [None] * 5), "4 inputs", "got 5")


def test_unknown_rounding_mode_in_function():
    with pytest.raises(ValueError, match="rounding mode"):
        rounding_function("STOCHASTIC")
    with pytest.raises(ValueError, match="bitwidth"):
        quant(np.zeros(2, F32), 1.0, 0.0, 0, True, False)


@pytest.mark.parametrize("scale_shape,zp", [((6, 1, 1), 0.0), ((1, 5, 1), 1.0), ((), 0.0)])
@pytest.mark.parametrize("mode", ["ROUND", "HALF_UP", "FLOOR"])
def test_quant_by_row_blocks_is_quant(scale_shape, zp, mode):
    """``quant_rows`` (the cost analysis quantizes weights with it) computes blocks of rows: bit for bit what
    ``quant`` computes on the whole array, whatever the scale broadcasts along."""
    from custom_ops.quant import quant, quant_rows

    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 5, 4)).astype(np.float32) * 3
    scale = np.exp(rng.uniform(-3, 0, size=scale_shape)).astype(np.float32)
    whole = quant(x, scale, np.float32(zp), np.float32(4), True, False, mode)
    rows = quant_rows(x, scale, np.float32(zp), np.float32(4), True, False, mode, block=7)  # one row (20) a block
    assert rows.dtype == whole.dtype and rows.shape == whole.shape
    np.testing.assert_array_equal(rows.view(np.int32), whole.view(np.int32))
