"""Thresholds on large integer accumulators: exact up to 2^31, never rounded, proved per pass without false alarms.

* ``RealThresholds.integer_thresholds`` takes ceilings exactly (float64 with an error bound, Fractions where it does
  not decide) for accumulators up to 2^31, and refuses an integer threshold float32 cannot hold
  (``ThresholdPrecisionError``): FINN stores thresholds as float32 tensors, and a rounded one moves the threshold for
  an exact integer accumulator.
* The absorbing rules decline (a ``Miss``) where the new thresholds would need such an integer; the model stays what
  the original computes.
* A scale absorbed into the thresholds of an accumulator near 2^19 is proved per pass against the real thresholds of
  the MultiThreshold it replaces, not against their float32 form (onnxruntime's quantize_static ResNet-18 stopped
  so: "from integer input -130700 to -130699 the thresholds change the level by 1, the MultiThreshold before the
  pass by 0"), and a threshold off by one there is still caught.
* 8-bit activations on 512-channel 3×3 convolutions (accumulators near 2^19, INT26 ranges) stream to an integer
  model equal to the original's float64 execution.
"""

from __future__ import annotations

from fractions import Fraction

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from finnlite import Model, PassManager, Stage
from finnlite.core.compat import QONNX_DOMAIN, make_model
from streamline.absorb import AbsorbMulIntoMultiThreshold
from streamline.pipeline import default_stages, streamline_model
from streamline.real_thresholds import RealThresholds, ThresholdPrecisionError
from tests.verify.graphs import GraphBuilder, const
from verify import PassVerificationError, ReferenceData, VerificationHook, final_check
from finnlite.float_report import float_report
from tests.verify.verified_run import verified_run

SEEDS = range(20)


# -- exact ceilings up to 2^31 ---------------------------------------------------------------------------------
def _ceil(r: Fraction, strict: bool) -> int:
    return (r.numerator // r.denominator) + 1 if strict else -((-r.numerator) // r.denominator)


@pytest.mark.parametrize("seed", range(8))
def test_integer_thresholds_are_exact_ceilings_up_to_2_31(seed: int) -> None:
    """R = 256·n ± 2^-30 (scaled by a float32 scale): float64 cannot tell R from 256·n near 2^31 (its step there
    is 2^-21); the ceilings must be the exact ones. 256·n is a float32 number (the float32 step there is 2^8),
    256·n + 1 is not: that threshold is refused, not rounded."""
    rng = np.random.default_rng(seed)
    s = Fraction(float(np.float32(rng.uniform(0.01, 2.0))))
    n = rng.integers(2**22, 2**23 - 1, size=6)  # 256·n between 2^30 and 2^31
    tiny = Fraction(1, 2**30)
    base = np.array([[float(s * int(k) * 256) for k in n]])  # exact in float64 (24 + 31 bits)
    assert all(Fraction(b) == s * int(k) * 256 for b, k in zip(base[0], n))
    for delta, strict, up in [(-tiny, False, False), (Fraction(0), False, False), (tiny, False, True),
                              (Fraction(0), True, True), (-tiny, True, False)]:
        rt = RealThresholds(base, np.full(base.shape, strict), alpha=[s], beta=[-delta * s])
        expected = [_ceil(int(k) * 256 + delta, strict) for k in n]
        assert expected == [int(k) * 256 + int(up) for k in n]
        if up:  # 256·n + 1 > 2^24: no float32 holds it
            with pytest.raises(ThresholdPrecisionError, match="is not a float32 number"):
                rt.integer_thresholds()
        else:
            got = rt.integer_thresholds()
            assert got.dtype == np.float32 and [int(v) for v in got[0]] == expected


@pytest.mark.parametrize("seed", range(4))
def test_counts_against_real_thresholds_are_exact_at_float64_points(seed: int) -> None:
    """``count_passed`` (how the per-pass proofs count an old MultiThreshold's levels at float64 points) against
    Fractions, at points on, one float64 step below and above each real threshold near 2^30."""
    rng = np.random.default_rng(seed)
    s = Fraction(float(np.float32(rng.uniform(0.01, 2.0))))
    n = np.sort(rng.integers(2**22, 2**23 - 1, size=5))
    base = np.array([[float(s * int(k) * 256) for k in n]] * 2)
    strict = np.array([[False] * 5, [True] * 5])
    rt = RealThresholds(base, strict, alpha=[s, s], beta=[0, Fraction(1, 2**31)])
    real = rt.real
    points = []
    for r in real[0]:
        f = float(r)
        points += [f, np.nextafter(f, -np.inf), np.nextafter(f, np.inf)]
    x = np.array([points, points], np.float64)
    expected = [[sum(1 for r, st in zip(real[c], strict[c]) if (Fraction(v) > r if st else Fraction(v) >= r))
                 for v in x[c]] for c in range(2)]
    assert rt.count_passed(x).tolist() == expected


@pytest.mark.parametrize("seed", range(6))
def test_counts_by_binary_search_equal_counting_every_threshold(seed: int) -> None:
    """``count_passed`` searches sorted estimates: unsorted and repeated thresholds, ±∞ ones, one row broadcast to
    three channels, points on, just beside and far from the thresholds, and NaN (passes none) — against a count
    of every threshold in Fractions."""
    rng = np.random.default_rng(seed)
    s = Fraction(float(np.float32(rng.uniform(0.01, 2.0))))
    ks = rng.integers(-300, 300, size=40)
    ks[:6] = ks[6:12]  # repeated thresholds
    base = np.array([[float(s * int(k)) + 0.5 * float(s) for k in ks]])
    base[0, 12], base[0, 13] = -np.inf, np.inf
    strict = rng.random((1, 40)) < 0.5
    beta = Fraction(int(rng.integers(-5, 5)), 3)
    rt = RealThresholds(base, strict, alpha=[s], beta=[beta])
    real = rt.real[0]
    pts = [float(r) for r in real if r not in (np.inf, -np.inf)]
    pts = pts + [np.nextafter(p, np.inf) for p in pts] + [np.nextafter(p, -np.inf) for p in pts]
    pts += list(rng.uniform(-400, 400, 50)) + [np.nan, np.inf, -np.inf]
    x = np.array([pts, pts[::-1], pts], np.float64)

    def passes(v: float, r: Any, st: bool) -> bool:
        if np.isnan(v):
            return False
        if r in (np.inf, -np.inf) or v in (np.inf, -np.inf):
            return v > r if st else v >= r
        return Fraction(v) > r if st else Fraction(v) >= r
    expected = [[sum(passes(v, r, bool(st)) for r, st in zip(real, strict[0])) for v in row] for row in x]
    assert rt.count_passed(x).tolist() == expected


def test_thresholds_beyond_the_range_are_clipped_to_float32_numbers() -> None:
    """Clipped to an accumulator range [−2^25, 2^25 − 1], thresholds beyond it become −2^25 and 2^25: exact."""
    rt = RealThresholds(np.array([[-3.0e9, -1.5, 7.25, 4.0e9]]), np.zeros((1, 4), bool))
    got = rt.integer_thresholds(-(2.0**25), 2.0**25 - 1)
    assert got.tolist() == [[-(2.0**25), -1.0, 8.0, 2.0**25]]


# -- the absorbing rule declines -------------------------------------------------------------------------------
def _scale_quant_model(a: np.ndarray, s: float, datatype: str, channels: int = 4) -> Model:
    """x (integer, ``datatype``) → Mul(a, per channel) → Quant(8 bits, signed, scale s) → y."""
    g = GraphBuilder()
    g.input("x", [1, channels, 4, 4], datatype=datatype)
    g.init("a", np.asarray(a, np.float32).reshape(1, channels, 1, 1))
    g.node("Mul", ["x", "a"], ["z"], "mul0")
    g.quant("z", "y", "q0", np.float32(s), 8, True)
    g.output("y", [1, channels, 4, 4])
    return g.model()


def test_absorbing_a_scale_declines_where_a_threshold_needs_more_than_float32() -> None:
    """Accumulators of INT32 scaled so that the quantizer's levels switch near 2^28: the exact thresholds are odd
    integers there, which float32 cannot hold. AbsorbMulIntoMultiThreshold declines with a Miss saying so; the
    model (its MultiThreshold on the float Mul output) computes what the original computes."""
    a = np.array([1.0, 0.75, 1.25, 0.5], np.float32) * np.float32(1e-3)
    model = _scale_quant_model(a, 2**28 * 1e-3 / 100, "INT32")
    ref = ReferenceData.random(model, n=4, seed=1)
    result = streamline_model(model)
    assert any(m.rule == "AbsorbMulIntoMultiThreshold" and "would not be exact" in m.reason
               for m in result.report.misses), [str(m) for m in result.report.misses]
    assert "Mul" in model.op_histogram()
    final = final_check(ref, model)
    assert final.ok, final.summary()


def test_absorbing_a_power_of_two_scale_keeps_thresholds_float32_numbers() -> None:
    """A power-of-two scale puts the thresholds of the same accumulators on multiples of a power of two: float32
    numbers, so the scale is absorbed and the model is integer up to its output dequantization."""
    a = np.full(4, 2.0**-10, np.float32)
    model = _scale_quant_model(a, 2.0**18 * 2.0**-10 / 64, "INT32")
    ref = ReferenceData.random(model, n=4, seed=1)
    result = streamline_model(model)
    assert not any(m.rule == "AbsorbMulIntoMultiThreshold" for m in result.report.misses)
    assert float_report(model, result.report).integer_only
    assert final_check(ref, model).ok


# -- per-pass proofs of a scale absorbed into thresholds of accumulators near 2^19 -----------------------------
def _probe(model: Model, rng: np.random.Generator, channels: int) -> ReferenceData:
    """Accumulators concentrated near 0 (t-distributed, scale 2·10^4): the quantizer's thresholds reach ±4·10^5,
    so the per-pass proof extrapolates far from the samples."""
    x = np.round(rng.standard_t(3, size=(2, 1, channels, 8, 8)) * 2e4).clip(-2**19, 2**19 - 1)
    return ReferenceData(model, {"x": x.astype(np.float32)})


def _accumulator_model(rng: np.random.Generator, channels: int = 16, two_scales: bool = False) -> Model:
    """x (INT20) → Mul(a) (→ Mul(a2): collapsed, the product's exact value differs from its float32 rounding) →
    an 8-bit quantizer whose thresholds reach ±4·10^5 accumulator steps."""
    g = GraphBuilder()
    g.input("x", [1, channels, 8, 8], datatype="INT20")
    a = rng.uniform(0.05, 0.5, size=(1, channels, 1, 1)).astype(np.float32)
    g.init("a", a)
    if two_scales:
        a2 = np.float32(rng.uniform(0.9, 1.1))
        g.init("a2", a2)
        g.node("Mul", ["x", "a"], ["z0"], "mul0")
        g.node("Mul", ["z0", "a2"], ["z"], "mul1")
        a = a * a2
    else:
        g.node("Mul", ["x", "a"], ["z"], "mul0")
    g.quant("z", "y", "q0", np.float32(4e5 * float(a.mean()) / 127 * rng.uniform(0.8, 1.2)), 8, True)
    g.output("y", [1, channels, 8, 8])
    return g.model()


@pytest.mark.parametrize("two_scales", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_scale_absorbed_at_accumulators_near_2_19_is_proved(seed: int, two_scales: bool) -> None:
    """Also where two scales were collapsed first: the Mul's float32 constant then rounds its exact product (the
    pool corpus models: a point between the two, near a threshold, was taken for a fault)."""
    rng = np.random.default_rng(seed)
    model = _accumulator_model(rng, two_scales=two_scales)
    stages = [s for s in default_stages() if s.name in ("tidy", "convert", "streamline")]
    hook = VerificationHook(_probe(model, rng, 16))
    PassManager(stages, [hook]).run(model)
    assert any(r.pass_name == "AbsorbMulIntoMultiThreshold" for r in hook.records)


class _FaultyAbsorbMul(AbsorbMulIntoMultiThreshold):
    """AbsorbMulIntoMultiThreshold with one threshold moved by one: the first one between 10^5 and 5·10^5 (beyond
    every probe sample, inside INT20); ``moved`` records its channel."""

    name = "FaultyAbsorbMul"
    moved: list[int] = []

    def rewrite(self, model, match):
        super().rewrite(model, match)
        node = match.node
        t = const(model, node.inputs[1]).copy()
        c, k = np.argwhere((np.abs(t) > 1e5) & (np.abs(t) < 5e5))[0]
        t[c, k] += 1.0
        self.moved.append(int(c))
        node.replace_input_with(1, model.add_initializer(t))


@pytest.mark.parametrize("seed", range(4))
def test_a_threshold_off_by_one_near_2_19_is_caught(seed: int) -> None:
    from streamline.datatypes import InferDataTypes

    rng = np.random.default_rng(seed)
    model = _accumulator_model(rng)
    ref = _probe(model, rng, 16)
    PassManager([s for s in default_stages() if s.name in ("tidy", "convert")], [VerificationHook(ref)]).run(model)
    _FaultyAbsorbMul.moved = []
    with pytest.raises(PassVerificationError, match=r"channel \d+: from integer input") as info:
        PassManager([Stage("s", [InferDataTypes, _FaultyAbsorbMul])], [VerificationHook(ref)]).run(model)
    assert f"channel {_FaultyAbsorbMul.moved[0]}:" in str(info.value)


# -- 8-bit activations on 512-channel 3x3 convolutions ----------------------------------------------------------
def wide_conv_model(seed: int, channels: int = 512, size: int = 6, out_channels: int = 64) -> Model:
    """An 8-bit input quantizer, a 3×3 convolution of ``channels`` channels with 8-bit per-channel weights,
    BatchNorm (random statistics), ReLU and an 8-bit quantizer, then a second 3×3 convolution to
    ``out_channels`` with BatchNorm and a signed 8-bit quantizer: accumulators of 4608 products of 8-bit numbers."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    def quant(x, out, s, signed, narrow=0):
        nodes.append(helper.make_node("Quant", [x, init(out + "_s", s), init(out + "_z", 0.0), init(out + "_b", 8.0)],
                                      [out], name=out + "_q", domain=QONNX_DOMAIN, signed=int(signed),
                                      narrow=int(narrow), rounding_mode="ROUND"))
        return out

    def layer(i, x, cin, cout, signed):
        w = rng.normal(0, 1, (cout, cin, 3, 3)).astype(np.float32)
        ws = (np.abs(w).reshape(cout, -1).max(1) / 127).astype(np.float32).reshape(cout, 1, 1, 1)
        wq = quant(init(f"w{i}", w), f"wq{i}", ws, True, 1)
        nodes.append(helper.make_node("Conv", [x, wq], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1],
                                      kernel_shape=[3, 3]))
        std = np.sqrt(cin * 9) * 0.5 * float(ws.mean()) * 127 / 2
        bn = [rng.uniform(0.5, 1.5, cout), rng.normal(0, 0.3, cout), rng.normal(0, 0.5, cout) * std,
              rng.uniform(0.2, 2.2, cout) * std**2]
        nodes.append(helper.make_node("BatchNormalization", [f"c{i}"] + [init(f"bn{i}_{k}", v) for k, v in
                                                                          enumerate(bn)], [f"bn{i}"], name=f"bn{i}"))
        y = f"bn{i}"
        if not signed:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"], name=f"relu{i}"))
            y = f"r{i}"
        return quant(y, f"a{i}", np.float32(rng.uniform(0.5, 1.5) * 3.0 / 256), signed)

    x = quant("x", "xq", np.float32(1 / 255), False)
    y = layer(1, layer(0, x, channels, channels, False), channels, out_channels, True)
    graph = helper.make_graph(nodes, "wide_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, channels, size, size])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, out_channels, size, size])],
                              initializer=inits)
    return Model(make_model(graph))


@pytest.mark.parametrize("seed", range(3))
def test_8bit_activations_on_512_channel_convolutions_stream_exactly(seed: int) -> None:
    model = wide_conv_model(seed)
    ref = ReferenceData.random(model, n=8, seed=seed, low=0.0, high=1.0)
    run = verified_run(model, default_stages(), ref)
    assert run.final.ok, run.final.summary()
    assert float_report(model, run.report).integer_only
    widths = [model.get_tensor_datatype(n.outputs[0].name).bitwidth() for n in model.get_nodes_by_op_type("MatMul")]
    assert widths and min(widths) >= 20, widths  # accumulators beyond 2^19


def _least_float64(r: Any, strict: bool) -> float:
    """The least float64 ``≥ r`` (``> r`` if strict), from Fractions."""
    if r in (np.inf, -np.inf):  # x > −∞ from the least finite float64 on
        return float(np.nextafter(-np.inf, 0)) if strict and r == -np.inf else float(r)

    def passes(f: float) -> bool:
        return Fraction(f) > r if strict else Fraction(f) >= r
    f = float(r)
    while not passes(f):
        f = float(np.nextafter(f, np.inf))
    while passes(float(np.nextafter(f, -np.inf))):
        f = float(np.nextafter(f, -np.inf))
    return f


@pytest.mark.parametrize("seed", range(8))
def test_float64_thresholds_by_double_double_are_the_least_float64(seed: int) -> None:
    """``float_thresholds(float64)`` decides most thresholds in double-double arithmetic: per-channel α that are
    products of float32 scales (and their inverses), rational β, quantizer switching points as the base, both
    strictnesses, ±∞ — each equal to the least float64 ≥ R (> R if strict) computed from Fractions."""
    rng = np.random.default_rng(seed)
    rows, steps = 6, 30
    f32 = lambda lo, hi: Fraction(float(np.float32(rng.uniform(lo, hi))))  # noqa: E731
    alpha = [f32(0.001, 3) * f32(0.001, 3) * (f32(0.1, 9) if c % 2 else 1 / f32(0.1, 9)) for c in range(rows)]
    beta = [f32(-5, 5) * f32(0.01, 1) + Fraction(int(rng.integers(-9, 9)), 7) for _ in range(rows)]
    s = np.array([float(np.float32(x)) for x in rng.uniform(0.001, 2, rows)])[:, None]
    base = s * (np.arange(steps)[None, :] - 127.5)
    base[0, 0], base[1, -1] = -np.inf, np.inf
    strict = rng.random((rows, steps)) < 0.5
    rt = RealThresholds(base, strict, alpha=alpha, beta=beta)
    decided, _ = rt._float64_decided()
    assert decided.mean() > 0.9  # the fast path is what is tested
    real = rt.real
    expected = [[_least_float64(real[c, m], bool(strict[c, m])) for m in range(steps)] for c in range(rows)]
    assert rt.float_thresholds(np.float64).tolist() == expected


def test_float64_thresholds_on_float64_numbers_follow_strictness() -> None:
    """Thresholds that are float64 numbers although α is not a power of two (R = base/3 with base a multiple of
    3, β = 0; and R = 0): the double-double sum cannot tell them from their neighbours and they are decided
    exactly — ``R`` itself, or the next float64 up where strict."""
    base = np.array([[0.0, 3.0, -6.0, 3.0 * 2.0 ** 40, 0.75]] * 2)
    strict = np.array([[False] * 5, [True] * 5])
    rt = RealThresholds(base, strict, alpha=[Fraction(3), Fraction(3)], beta=[0, 0])
    got = rt.float_thresholds(np.float64)
    r = [0.0, 1.0, -2.0, 2.0 ** 40, 0.25]
    assert got[0].tolist() == r
    assert got[1].tolist() == [float(np.nextafter(x, np.inf)) for x in r]


@pytest.mark.parametrize("sign", [1, -1])
def test_float64_thresholds_a_hair_from_a_float64_number(sign: int) -> None:
    """R = (3 − β)/3 = 1 ∓ 2^-200/3: closer to 1 than double-double arithmetic can tell, so decided exactly: 1 just
    above R, the next float64 up just below it."""
    rt = RealThresholds(np.array([[3.0, 3.0]]), np.array([[False, True]]), alpha=[Fraction(3)],
                        beta=[Fraction(sign, 2**200)])
    want = 1.0 if sign > 0 else float(np.nextafter(1.0, 2.0))
    assert rt.float_thresholds(np.float64).tolist() == [[want, want]]
