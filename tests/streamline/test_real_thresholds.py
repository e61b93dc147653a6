"""Real thresholds: the exact switching points of quantizers, and their algebra."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from custom_ops.multithreshold import multithreshold
from custom_ops.quant import ROUNDING_MODES, min_int, quant
from streamline.real_thresholds import RealThresholds, fractions_of, quant_real_thresholds, relu_composed

MODES = sorted(ROUNDING_MODES)


def _count(rt: RealThresholds, x: np.ndarray) -> np.ndarray:
    """Exact count of passed thresholds per element of a (C, k) array of Fractions."""
    out = np.zeros(x.shape, dtype=np.int64)
    for c in range(x.shape[0]):
        row = c if rt.shape[0] > 1 else 0
        for j in range(x.shape[1]):
            out[c, j] = sum(1 for r, s in zip(rt.real[row], rt.strict[row])
                            if (x[c, j] > r if s else x[c, j] >= r))
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bits,signed,narrow", [(1, True, False), (1, False, False), (2, True, True), (3, True, False),
                                                (4, False, False), (4, False, True), (5, True, True)])
def test_quant_thresholds_match_the_kernel_at_every_switching_point(mode, bits, signed, narrow):
    rng = np.random.default_rng(bits)
    scale = np.float32(rng.uniform(0.01, 2.0))
    zero = np.float32(rng.integers(-1, 2) if not (bits == 1 and signed) else 0)
    rt = quant_real_thresholds(scale, zero, bits, signed, narrow, mode)
    qmin = -1 if (bits == 1 and signed) else min_int(signed, narrow, bits)
    # probe every threshold exactly (x/s is then exact in float64, so the kernel sees the tie itself) and a little
    # below and above it (far enough that float64 division cannot round across)
    probes = []
    for r in rt.real[0]:
        f = float(r)
        assert Fraction(f) == r  # s·(t − z) is exact in float64
        eps = abs(f) * 1e-9 + 1e-12
        probes += [f - eps, f, f + eps]
    probes += [-1e6, 1e6, 0.0, -0.0]
    x = np.array(probes, dtype=np.float64)
    q = quant(x, np.float64(scale), np.float64(zero), bits, signed, narrow, mode)
    levels = np.round(q / np.float64(scale) + np.float64(zero)).astype(np.int64)
    if bits == 1 and signed:
        expected_count = (levels > 0).astype(np.int64)
    else:
        expected_count = levels - qmin
    got = _count(rt, fractions_of(x)[None, :])[0]
    np.testing.assert_array_equal(got, expected_count)


def test_per_channel_rows_and_algebra():
    scale = np.array([0.5, 0.25, 2.0], np.float32)
    rt = quant_real_thresholds(scale, 0.0, 2, False, False)
    assert rt.shape == (3, 3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 50)) * 3
    a = np.array([1.5, 0.75, 3.0])
    b = np.array([0.25, -1.0, 0.5])
    # thresholds on x for MT(a·x + b): shift by b, then scale by a
    moved = rt.shifted(b).scaled(a)
    y = fractions_of(x) * fractions_of(a)[:, None] + fractions_of(b)[:, None]
    np.testing.assert_array_equal(_count(moved, fractions_of(x)), _count(rt, y))
    # a negative factor: count from above
    neg = rt.negated().scaled(np.array([2.0]))
    y = fractions_of(x) * Fraction(-2)
    np.testing.assert_array_equal(3 - _count(neg, fractions_of(x)), _count(rt, y))


def test_materialized_thresholds_on_integers_and_floats():
    rt = quant_real_thresholds(np.float32(0.3), 0.0, 3, True, False)  # levels at 0.3·(k − ½)
    ints = np.arange(-10, 11, dtype=np.float32)[None, :]
    t_int = rt.integer_thresholds()
    np.testing.assert_array_equal(multithreshold(ints, t_int, channel_axis=0)[0],
                                  _count(rt, fractions_of(ints))[0])
    floats = np.linspace(-2, 2, 4001, dtype=np.float32)
    edges = rt.float_thresholds()[0]
    floats = np.concatenate([floats, edges, np.nextafter(edges, np.float32(-np.inf))])[None, :]
    np.testing.assert_array_equal(multithreshold(floats, rt.float_thresholds(), channel_axis=0)[0],
                                  _count(rt, fractions_of(floats))[0])
    assert RealThresholds.from_json(rt.to_json()).real.tolist() == rt.real.tolist()
    clipped = rt.integer_thresholds(lo=-1, hi=1)
    assert clipped.min() >= -1 and clipped.max() <= 2


def test_relu_composition():
    rt = quant_real_thresholds(np.float32(0.5), np.float32(1.0), 3, False, False)  # some thresholds below zero
    composed = relu_composed(rt)
    x = np.linspace(-3, 3, 121)
    relu = np.maximum(x, 0)
    np.testing.assert_array_equal(_count(composed, fractions_of(x)[None, :]),
                                  _count(rt, fractions_of(relu)[None, :]))


def test_exact_sums_are_exact_for_any_exponent_span():
    from fractions import Fraction

    from streamline.real_thresholds import exact_sums

    rng = np.random.default_rng(3)
    for _ in range(100):
        shape = (3, 4, int(rng.integers(1, 12)))
        w = (rng.normal(size=shape) * 10.0 ** rng.integers(-12, 12, size=shape)).astype(np.float32)
        w[rng.random(shape) < 0.2] = 0
        got = exact_sums(w, 2)
        for o in range(3):
            for i in range(4):
                assert got[o, i] == sum((Fraction(float(v)) for v in w[o, i]), Fraction(0))


def test_per_channel_constants_keep_one_shared_row_of_base_thresholds():
    """A per-tensor quantizer's thresholds absorbing per-channel constants keep one row of base thresholds (C times
    smaller, in memory and in the node's metadata) and mean what the expanded form means."""
    rt = quant_real_thresholds(np.float32(0.375), 0.0, 4, True, False)
    a = np.array([1.5, 0.75, 3.0, 0.5])
    b = np.array([0.25, -1.0, 0.5, 2.0])
    moved = rt.shifted(b).scaled(a)
    expanded = rt.broadcast_channels(4).shifted(b).scaled(a)
    assert moved.base.shape == (1, 15) and moved.shape == (4, 15) == expanded.shape
    assert moved.real.tolist() == expanded.real.tolist()
    np.testing.assert_array_equal(moved.integer_thresholds(), expanded.integer_thresholds())
    np.testing.assert_array_equal(moved.float_thresholds(), expanded.float_thresholds())
    assert len(moved.to_json()) < len(expanded.to_json()) / 2
    assert RealThresholds.from_json(moved.to_json()).real.tolist() == moved.real.tolist()
    perm = np.array([2, 0, 3, 1])
    assert moved.rows(perm).real.tolist() == expanded.real[perm].tolist()
    assert moved.negated().real.tolist() == expanded.negated().real.tolist()


def test_parsed_thresholds_live_as_long_as_their_node():
    """Thresholds read from a node's metadata text are parsed once per node, and a version the node no longer
    carries is not kept alive by a cache keyed by its text."""
    import gc
    import weakref

    import onnx_ir as ir

    from streamline.real_thresholds import META_KEY, get_real_thresholds

    node = ir.Node("qonnx.custom_op.general", "MultiThreshold", [], name="mt")
    first = quant_real_thresholds(np.array([0.5, 0.25], np.float32), 0.0, 2, False, False)
    node.metadata_props[META_KEY] = first.to_json()  # as a loaded model carries it
    parsed = get_real_thresholds(node)
    assert parsed is get_real_thresholds(node) and parsed.real.tolist() == first.real.tolist()
    gone = weakref.ref(parsed)
    node.metadata_props[META_KEY] = first.shifted(np.array([1.0, 2.0])).to_json()
    del parsed
    assert get_real_thresholds(node).real.tolist() == first.shifted(np.array([1.0, 2.0])).real.tolist()
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("seed", range(8))
def test_power_of_two_rows_materialize_exactly_without_fractions(seed):
    """Rows whose α is a power of two and whose α, β are float64 numbers (fixed-point scales) are computed in
    float64 without the Fraction fallback; the result must be the exact one on ties and near-ties too: integer
    thresholds ⌈R⌉ / ⌊R⌋ + 1 and the least float32 ≥ R (> R), against Fractions, rows mixed with general ones."""
    from streamline.real_thresholds import least_float

    rng = np.random.default_rng(seed)
    rows, steps = 6, 9
    # switching points s·(k − ½) with power-of-two s, some landing exactly on integers and float32 values
    base = (2.0 ** rng.integers(-6, 3, (rows, 1))) * (np.arange(steps) - 4 + 0.5)[None, :]
    strict = rng.random((rows, steps)) < 0.5
    alpha = [Fraction(2) ** int(e) for e in rng.integers(-6, 8, rows)]
    beta = [Fraction(int(n), 2 ** int(d)) for n, d in zip(rng.integers(-2**12, 2**12, rows), rng.integers(0, 20, rows))]
    alpha[1] = Fraction(3, 7)          # a general row: the Fraction fallback
    beta[2] = Fraction(1, 3)           # β not a float64 number
    rt = RealThresholds(base, strict, alpha, beta)
    assert list(rt._exact_rows()) == [True, False, False, True, True, True]
    real = rt.real
    got_int = rt.integer_thresholds()
    got_f32 = rt.float_thresholds()
    import math
    for c, m in np.ndindex(real.shape):
        r, s = real[c, m], bool(strict[c, m])
        want = math.floor(r) + 1 if s else math.ceil(r)
        assert got_int[c, m] == want, (c, m, r, s)
        assert got_f32[c, m] == least_float(r.numerator, r.denominator, s), (c, m, r, s)


def test_real_thresholds_count_only_where_the_stored_ones_encode_them():
    """``encoded_real_thresholds``: a node's real thresholds are what it means while its stored thresholds are
    their float32 form; a rewrite that changed the stored ones (and not the metadata) is judged by what it stored."""
    import onnx_ir as ir

    from streamline.real_thresholds import encoded_real_thresholds, set_real_thresholds

    rt = RealThresholds(np.array([[0.5, 1.5, 2.5], [-1.0, 0.25, 3.0]]), np.zeros((2, 3), bool),
                        alpha=[Fraction(3, 7), Fraction(1, 3)], beta=[Fraction(1, 5), 0])
    node = ir.Node("qonnx.custom_op.general", "MultiThreshold", inputs=[])
    assert encoded_real_thresholds(node, rt.float_thresholds()) is None  # no metadata
    set_real_thresholds(node, rt)
    stored = rt.float_thresholds()
    assert encoded_real_thresholds(node, stored) is not None
    assert encoded_real_thresholds(node, np.nextafter(stored, np.float32(np.inf))) is not None  # a step: a near-tie
    assert encoded_real_thresholds(node, stored + 3) is None
    assert encoded_real_thresholds(node, stored[:, :2]) is None


@pytest.mark.parametrize("seed", range(10))
def test_quantizer_switching_points_are_exact_for_any_scale(seed: int) -> None:
    """s·(k − ½ − z) exactly, whether float64 holds it (float32 scales, integer zero points) or not (float64
    scales, fractional zero points: the affine form)."""
    rng = np.random.default_rng(seed)
    for single, zfrac in [(True, 1.0), (False, 1.0), (False, 0.37), (True, 0.37)]:
        s = rng.uniform(0.001, 2, int(rng.integers(1, 6)))
        s = s.astype(np.float32).astype(np.float64) if single else s
        z = np.round(rng.uniform(-3, 3, s.size)) * zfrac
        signed = bool(rng.integers(2))
        real = quant_real_thresholds(s, z, 4, signed, False).real
        qmin = -8 if signed else 0
        want = [[Fraction(float(s[c])) * (qmin + m + 1 - Fraction(1, 2) - Fraction(float(z[c])))
                 for m in range(real.shape[1])] for c in range(s.size)]
        assert np.broadcast_to(real, (s.size, real.shape[1])).tolist() == want
