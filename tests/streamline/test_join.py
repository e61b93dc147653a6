"""IntegerJoinMultipliers: joins of differently scaled integer branches read only by thresholds.

The search (:func:`streamline.join_search.find_multipliers`) is checked against brute force with exact Fractions
on every point of the box and every threshold, and for minimality; the rule is checked in graphs built here, run
through the pipeline's tidy/convert/streamline stages, against float64 execution of the original: exhaustively on
the box of quantized levels (ties included) and on random float inputs.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from onnx import helper

from custom_ops.executor import Executor
from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN
from finnlite.core.datatypes import smallest_int_type
from streamline.join import IntegerJoinMultipliers
from streamline.join_search import JoinMultipliers, find_multipliers, signed_bits
from streamline.pipeline import streamline_model
from streamline.real_thresholds import RealThresholds, quant_real_thresholds
from tests.streamline.rulecheck import graph_model

RNG = np.random.default_rng(23)
LIMIT = IntegerJoinMultipliers.max_multiplier
F32 = lambda x: Fraction(float(np.float32(x)))  # noqa: E731


def _passes(s1: Fraction, s2: Fraction, rt: RealThresholds, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Brute force: which (point, threshold) pairs pass, in exact arithmetic (Python integers after clearing the
    denominators). Shape (points, rows, steps)."""
    real = rt.real
    strict = np.broadcast_to(rt.strict, real.shape)
    ao, bo = a.astype(object), b.astype(object)
    out = np.zeros((a.size,) + real.shape, dtype=bool)
    for idx in np.ndindex(real.shape):
        r = real[idx]
        if not isinstance(r, Fraction):
            out[(slice(None),) + idx] = r < 0  # -inf: passed by every point, +inf by none
            continue
        d = s1.denominator * s2.denominator * r.denominator
        v = ao * int(s1 * d) + bo * int(s2 * d)
        out[(slice(None),) + idx] = (v > int(r * d)) if strict[idx] else (v >= int(r * d))
    return out


def _box(ra, rb):
    pts = np.array(list(itertools.product(range(ra[0], ra[1] + 1), range(rb[0], rb[1] + 1))), dtype=np.int64)
    return pts[:, 0], pts[:, 1]


def _integer_passes(found: JoinMultipliers, k: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = (found.p * a + found.q * b).astype(np.float64)
    return acc[:, None, None] >= found.thresholds[k][None]


def _valid_pair(refs, a, b, p, q) -> bool:
    """Brute force: one integer T' per threshold splits the box like the real thresholds (``refs``: _passes)."""
    acc = p * a + q * b
    for ref in refs:
        for idx in np.ndindex(ref.shape[1:]):
            col = ref[(slice(None),) + idx]
            if col.any() and (~col).any() and acc[~col].max() >= acc[col].min():
                return False
    return True


CASES = [  # (s1, s2, a range, b range, output quantizer (scale, bits, signed, narrow))
    (0.2708162, 0.0740978, (-8, 7), (-32, 31), (0.31, 4, False, False)),  # residual_distinct's scales
    (0.1, 0.1 * np.sqrt(2), (0, 15), (-8, 7), (0.173, 4, True, False)),  # an irrational-like ratio
    (0.75, 0.3, (-7, 7), (0, 15), (0.5, 3, True, True)),  # narrow input, exact ties where b = 0
    (-0.37, 0.11, (0, 15), (-8, 7), (0.2, 4, True, False)),  # a negative scale
    (0.05, -0.9001, (-4, 3), (0, 31), (0.45, 5, False, False)),  # negative, large ratio
    (0.013, 0.0130001, (-128, 127), (-8, 7), (0.1, 8, True, False)),  # nearly equal scales
    (1e-3, 0.6667, (0, 255), (0, 3), (0.05, 4, False, False)),  # very unequal scales
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_search_is_exact_on_the_box_and_minimal(case):
    s1, s2, ra, rb, (so, bits, signed, narrow) = case
    s1, s2 = F32(s1), F32(s2)
    rt = quant_real_thresholds(np.float32(so), 0.0, bits, signed, narrow)
    relu = quant_real_thresholds(np.float32(so * 0.7), 0.0, 3, False, False).relu_composed()  # ±inf rows
    per_channel = RealThresholds(rt.base, rt.strict, [F32(1.5), F32(0.25)], [F32(0.1), F32(-0.3)])
    rts = [rt, relu, per_channel]
    found = find_multipliers(rts, s1, s2, ra, rb, LIMIT)
    assert isinstance(found, JoinMultipliers), found
    a, b = _box(ra, rb)
    refs = [_passes(s1, s2, r, a, b) for r in rts]
    for k, ref in enumerate(refs):  # every point, every threshold, every consumer
        np.testing.assert_array_equal(_integer_passes(found, k, a, b), ref)
    assert np.sign(found.p) == np.sign(s1) and np.sign(found.q) == np.sign(s2)
    # minimal: no pair with smaller magnitudes (both at most, one below) reproduces the thresholds
    for p in range(1, abs(found.p) + 1):
        for q in range(1, abs(found.q) + 1):
            if (p, q) != (abs(found.p), abs(found.q)) and Fraction(q, p) != Fraction(abs(found.q), abs(found.p)):
                assert not _valid_pair(refs, a, b, int(np.sign(s1)) * p, int(np.sign(s2)) * q), (p, q)
    # the exact ratio's integers are never beaten the wrong way: they are valid and at least as large
    ratio = abs(s2 / s1)
    assert abs(found.p) <= ratio.denominator and abs(found.q) <= ratio.numerator


def test_no_16_bit_pair_for_a_near_one_ratio_on_16_bit_inputs():
    """s2/s1 = 1 + 2^-20 on INT16 × INT16 with thresholds on odd integers: a·1 + b·(1 + 2^-20) ≥ 2k − 1 tells
    b ≥ 0 from b < 0 at a + b = 2k − 1, which needs p > 32767."""
    rt = quant_real_thresholds(np.float32(2.0), 0.0, 4, True, False)
    s1, s2 = Fraction(1), F32(1 + 2.0**-20)
    r16 = (-32768, 32767)
    assert "no integer multipliers up to 32767" in find_multipliers([rt], s1, s2, r16, r16, LIMIT)
    wide = find_multipliers([rt], s1, s2, r16, r16, 2**20)
    assert isinstance(wide, JoinMultipliers) and abs(wide.p) > LIMIT and signed_bits(wide.p) == 17


# -- the rule in graphs -----------------------------------------------------------------------------------------
def _quant(inp, out, scale, bits, signed, narrow):
    return helper.make_node("Quant", [inp, scale, "zero", bits], [out], domain=QONNX_DOMAIN, signed=int(signed),
                            narrow=int(narrow), rounding_mode="ROUND", name=f"q_{out}")


def _join_model(s1, s2, qa, qb, outs, n):
    """xa → Quant(qa) [→ Mul(s1/qa scale)] ; xb likewise ; Add → one Quant per entry of ``outs`` (a fork)."""
    nodes, inits = [], {"zero": np.float32(0)}
    for name, s, (sq, bits, signed, narrow) in (("a", s1, qa), ("b", s2, qb)):
        inits[f"s_{name}"], inits[f"bits_{name}"] = np.float32(sq), np.float32(bits)
        nodes.append(_quant(f"x{name}", f"q{name}", f"s_{name}", f"bits_{name}", signed, narrow))
        inits[f"k_{name}"] = np.float32(s / sq)  # the branch's scale: quantizer scale × a (maybe negative) factor
        nodes.append(helper.make_node("Mul", [f"q{name}", f"k_{name}"], [f"m{name}"], name=f"mul_{name}"))
    nodes.append(helper.make_node("Add", ["ma", "mb"], ["sum"], name="join"))
    for i, (so, bits, signed, narrow) in enumerate(outs):
        inits[f"so{i}"], inits[f"bo{i}"] = np.float32(so), np.float32(bits)
        nodes.append(_quant("sum", f"y{i}", f"so{i}", f"bo{i}", signed, narrow))
    return graph_model(nodes, {"xa": [1, n], "xb": [1, n]}, {f"y{i}": [1, n] for i in range(len(outs))}, inits)


def _levels(q):
    sq, bits, signed, narrow = q
    lo = -(2 ** (bits - 1)) + narrow if signed else 0
    hi = 2 ** (bits - 1) - 1 if signed else 2**bits - 1 - narrow
    return lo, hi, sq


def _check(proto, model, inputs, outs):
    ref = Executor(proto, dtype=np.float64).run(inputs)
    got = Executor(model).run({k: v.astype(np.float32) for k, v in inputs.items()})
    for i, (so, *_) in enumerate(outs):
        lr, lg = np.round(ref[f"y{i}"] / np.float32(so)), np.round(got[f"y{i}"] / np.float32(so))
        np.testing.assert_array_equal(lg, lr, err_msg=f"output y{i}")


def _assert_finn_form(m, join):
    """The form FINN's step_convert_to_hw takes: every MultiThreshold has out_scale 1 (FINN's Thresholding and MVAU
    refuse others), and each multiplier other than ±1 is a Mul by an integer scalar k, |k| ≥ 2, on an integer
    branch, feeding the join (FINN: an integer ElementwiseMul layer; −1 is a Sub), typed no wider than k times
    its source's type."""
    for n in m.graph:
        if n.op_type == "MultiThreshold":
            assert n.attributes["out_scale"].value == 1.0 if "out_scale" in n.attributes else True, n.name
    for v in join.inputs:
        mul = v.producer()
        if mul is not None and mul.op_type == "Mul":
            k = np.asarray(m.get_initializer(mul.inputs[1].name))
            assert k.size == 1 and float(k.ravel()[0]).is_integer() and abs(float(k.ravel()[0])) > 1, mul.name
            src = m.get_tensor_datatype(mul.inputs[0].name)
            assert src.is_integer(), mul.name
            ends = sorted(float(k.ravel()[0]) * e for e in (src.min(), src.max()))
            out = m.get_tensor_datatype(v.name)  # FINN sizes the layer from it: k × the source's levels at most
            assert out.is_integer() and out.bitwidth() <= smallest_int_type(*ends).bitwidth(), (mul.name, out)


JOINS = [  # (s1, s2, quantizer a, quantizer b, output quantizers)
    (0.2708162, 0.0740978, (0.2708162, 4, True, False), (0.0740978, 6, True, False), [(0.31, 4, False, False)]),
    (0.11, -0.37, (0.055, 4, False, False), (0.37, 3, True, True), [(0.2, 4, True, False)]),
    (0.75, 0.3, (0.75, 3, True, True), (0.3, 4, False, False), [(0.5, 3, True, False), (0.29, 8, True, False)]),
    (-0.0131, 0.0390001, (0.0131, 8, False, False), (0.0390001, 4, True, False), [(0.1, 5, False, False)]),  # −1, 3
    (-0.1, -0.3, (0.1, 4, False, False), (0.3, 3, True, True), [(0.35, 4, True, False), (0.2, 3, False, False)]),
    (0.1, -0.3, (0.1, 4, True, False), (0.3, 3, True, True), [(0.35, 4, True, False)]),  # 1, −3
]


@pytest.mark.parametrize("join", JOINS, ids=[f"join{i}" for i in range(len(JOINS))])
def test_rule_is_exact_on_the_box_and_on_random_inputs(join):
    s1, s2, qa, qb, outs = join
    (alo, ahi, sa), (blo, bhi, sb) = _levels(qa), _levels(qb)
    a, b = _box((alo, ahi), (blo, bhi))
    proto = _join_model(s1, s2, qa, qb, outs, a.size)
    m = Model(proto)
    streamline_model(m, only=["tidy", "convert", "streamline"])
    join = next(n for n in m.graph if n.op_type in ("Add", "Sub"))
    assert m.get_tensor_datatype(join.outputs[0].name).is_integer(), "the join is integer"
    assert all(n.op_type in ("MultiThreshold", "Add", "Sub", "Mul") for n in m.graph)
    _assert_finn_form(m, join)
    # exhaustive: every pair of levels (exactly on the levels, so the input quantizers are exact)
    _check(proto, m, {"xa": (a * np.float32(sa)).reshape(1, -1), "xb": (b * np.float32(sb)).reshape(1, -1)}, outs)
    for _ in range(3):  # random floats over (and beyond) the input ranges
        xa = RNG.uniform((alo - 2) * sa, (ahi + 2) * sa, size=(1, a.size))
        xb = RNG.uniform((blo - 2) * sb, (bhi + 2) * sb, size=(1, a.size))
        _check(proto, m, {"xa": xa, "xb": xb}, outs)


@pytest.mark.xfail(strict=True, reason="multipliers −1, −1 are equal scales: MoveLinearPastEltwiseAdd moves the −1 "
                   "past the join and AbsorbMulIntoMultiThreshold counts from above (out_scale −1), which FINN refuses")
def test_both_multipliers_minus_one_stay_in_finn_form():
    s1, s2, qa, qb, outs = -0.3, -0.30001, (0.6, 3, True, False), (0.15, 3, False, False), [(0.17, 4, True, False)]
    (alo, ahi, sa), (blo, bhi, sb) = _levels(qa), _levels(qb)
    a, b = _box((alo, ahi), (blo, bhi))
    proto = _join_model(s1, s2, qa, qb, outs, a.size)
    m = Model(proto)
    streamline_model(m, only=["tidy", "convert", "streamline"])
    _check(proto, m, {"xa": (a * np.float32(sa)).reshape(1, -1), "xb": (b * np.float32(sb)).reshape(1, -1)}, outs)
    _assert_finn_form(m, next(n for n in m.graph if n.op_type in ("Add", "Sub")))


def test_join_feeding_a_non_threshold_stays_float_with_the_reason():
    qa, qb = (0.2708162, 4, True, False), (0.0740978, 6, True, False)
    proto = _join_model(0.2708162, 0.0740978, qa, qb, [(0.31, 4, False, False)], 4)
    proto.graph.output.append(helper.make_tensor_value_info("sum", 1, [1, 4]))  # the float sum is read too
    m = Model(proto)
    streamline_model(m, only=["tidy", "convert", "streamline"])
    rule = IntegerJoinMultipliers()
    result = rule.run(m)
    assert any("graph output" in miss.reason for miss in result.misses), result.misses


def test_no_16_bit_pair_leaves_the_join_float_with_the_reason():
    nodes = [helper.make_node("Mul", ["a", "s1"], ["ma"], name="mul_a"),
             helper.make_node("Mul", ["b", "s2"], ["mb"], name="mul_b"),
             helper.make_node("Add", ["ma", "mb"], ["sum"], name="join"),
             _quant("sum", "y0", "so", "bo", True, False)]
    inits = {"s1": np.float32(1), "s2": np.float32(1 + 2.0**-20), "so": np.float32(2), "bo": np.float32(4),
             "zero": np.float32(0)}
    proto = graph_model(nodes, {"a": [1, 8], "b": [1, 8]}, {"y0": [1, 8]}, inits)
    m = Model(proto)
    m.set_tensor_datatype("a", "INT16")
    m.set_tensor_datatype("b", "INT16")
    result = streamline_model(m, only=["tidy", "convert", "streamline"])
    assert any(miss.rule == "IntegerJoinMultipliers" and "no integer multipliers up to 32767" in miss.reason
               for miss in result.report.misses), result.report.misses
    join = next(n for n in m.graph if n.op_type == "Add")
    assert not m.get_tensor_datatype(join.outputs[0].name).is_integer()
    a = np.array([[0, -1, 1, 5, -5, 32767, -32768, 3]], np.float64)
    b = np.array([[0, 1, -1, -4, 4, -32768, 32767, 100]], np.float64)
    ref = Executor(proto, dtype=np.float64).run({"a": a, "b": b})["y0"]
    np.testing.assert_array_equal(Executor(m, dtype=np.float64).run({"a": a, "b": b})["y0"], ref)


# -- a Conv over a Concat of two scales ---------------------------------------------------------------------------
def _concat_conv_model(sa, sb, ca, cb, w, pads, so, n_hw):
    nodes = [helper.make_node("Concat", ["xa", "xb"], ["cat"], axis=1, name="cat"),
             helper.make_node("Mul", ["cat", "v"], ["scaled"], name="scales"),
             helper.make_node("Conv", ["scaled", "W"], ["conv"], pads=pads, name="conv"),
             _quant("conv", "y0", "so", "bo", False, False)]
    v = np.array([sa] * ca + [sb] * cb, np.float32).reshape(1, -1, 1, 1)
    inits = {"v": v, "W": w.astype(np.float32), "so": np.float32(so), "bo": np.float32(4), "zero": np.float32(0)}
    h, wd = n_hw
    oh, ow = (h, wd) if any(pads) else (h - w.shape[2] + 1, wd - w.shape[3] + 1)
    return graph_model(nodes, {"xa": [1, ca, h, wd], "xb": [1, cb, h, wd]}, {"y0": [1, w.shape[0], oh, ow]}, inits)


def _streamlined(proto, types):
    m = Model(proto)
    for k, t in types.items():
        m.set_tensor_datatype(k, t)
    streamline_model(m, only=["tidy", "convert", "streamline"])
    return m


@pytest.mark.parametrize("sa,sb", [(0.3113, 0.0871), (-0.3113, 0.0871), (0.0213, -0.7)])
def test_conv_over_two_scales_is_exact_on_every_pair_of_inputs(sa, sb):
    """1x1 Conv, one channel per scale: the output is sA·wa·a + sB·wb·b, every (a, b) of UINT3 × INT4 at once."""
    a, b = _box((0, 7), (-8, 7))
    w = np.array([3, -2, 1, 2], np.float32).reshape(2, 2, 1, 1)  # two output channels, signs mixed
    proto = _concat_conv_model(sa, sb, 1, 1, w, [0, 0, 0, 0], 0.21, (1, a.size))
    m = _streamlined(proto, {"xa": "UINT3", "xb": "INT4"})
    assert [n.op_type for n in m.graph][:3] == ["Concat", "Conv", "MultiThreshold"], [n.op_type for n in m.graph]
    conv = next(n for n in m.graph if n.op_type == "Conv")
    wi = m.get_initializer(conv.inputs[1].name)
    assert np.array_equal(wi, np.round(wi)) and not np.array_equal(wi, w)
    inputs = {"xa": a.reshape(1, 1, 1, -1).astype(np.float64), "xb": b.reshape(1, 1, 1, -1).astype(np.float64)}
    _check(proto, m, inputs, [(0.21,)])


def test_padded_conv_over_two_scales_on_random_inputs():
    ca, cb = 3, 2
    w = RNG.integers(-3, 4, size=(4, ca + cb, 3, 3)).astype(np.float32)
    proto = _concat_conv_model(0.0537, 0.1291, ca, cb, w, [1, 1, 1, 1], 0.43, (5, 5))
    m = _streamlined(proto, {"xa": "UINT4", "xb": "INT3"})
    assert "Mul" not in [n.op_type for n in m.graph][:3]
    for _ in range(4):
        inputs = {"xa": RNG.integers(0, 16, size=(1, ca, 5, 5)).astype(np.float64),
                  "xb": RNG.integers(-4, 4, size=(1, cb, 5, 5)).astype(np.float64)}
        _check(proto, m, inputs, [(0.43,)])
