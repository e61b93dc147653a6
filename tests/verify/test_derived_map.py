"""The accumulator's map read from a MultiThreshold's real thresholds (verify.derived_map), and its use where the
samples do not determine the map (verify.proofs.apply_derived): the scale and bias absorbed in front of the node
come back exactly, with the sign of a negated count; a record that is not on the quantizer's input gives nothing;
a map that does not reproduce the samples is not used."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from custom_ops.quant import quant
from streamline.real_thresholds import RealThresholds, quant_real_thresholds, set_real_thresholds
from verify.derived_map import derived_maps
from verify.proofs import apply_derived, fit_affine

C = 3
SCALE = np.array([0.5, 0.25, 0.75])


def levels(x: np.ndarray) -> np.ndarray:
    """A 2-bit unsigned quantizer with one scale per channel (rows of ``x``), in float64."""
    return quant(x, SCALE[:, None], 0.0, 2, False, False)


def signed(x: np.ndarray) -> np.ndarray:
    """A 2-bit signed quantizer (levels −2..1), as :func:`levels`."""
    return quant(x, SCALE[:, None], 0.0, 2, True, False)


def relu_signed(x: np.ndarray) -> np.ndarray:
    """:func:`signed` with a Relu right before it."""
    return signed(np.maximum(x, 0.0))


def node_with(rt: RealThresholds | None) -> ir.Node:
    node = ir.Node("qonnx.custom_op.general", "MultiThreshold", [], name="mt")
    if rt is not None:
        set_real_thresholds(node, rt)
    return node


def absorbed(mul: np.ndarray, add: np.ndarray) -> RealThresholds:
    """The quantizer's thresholds after absorbing ``Add(add)`` and then ``Mul(mul)`` in front: on ``a`` with
    ``z = mul·a + add``."""
    return quant_real_thresholds(SCALE, np.zeros(C), 2, False, False).shifted(add).scaled(mul)


def test_the_absorbed_scale_and_bias_come_back() -> None:
    mul, add = np.array([0.125, 3.0, 0.01]), np.array([-1.5, 0.25, 7.0])
    maps = derived_maps(node_with(absorbed(mul, add)), C, levels, SCALE)
    assert len(maps) == 1 and maps[0].ok.all()
    np.testing.assert_allclose(maps[0].slope, mul, rtol=1e-15)
    np.testing.assert_allclose(maps[0].bias, add, rtol=1e-15)


def test_a_negated_count_gives_the_negative_map() -> None:
    """A negative factor absorbed: the thresholds count from above, on the node's input ``y`` with
    ``z = mul·(−y) + add``."""
    mul, add = np.array([0.5, 2.0, 1.0]), np.array([0.0, 1.0, -2.0])
    maps = derived_maps(node_with(absorbed(mul, add).negated()), C, levels, SCALE)
    assert len(maps) == 1 and maps[0].ok.all()  # an unsigned quantizer is not symmetric: one sign only
    np.testing.assert_allclose(maps[0].slope, -mul, rtol=1e-15)
    np.testing.assert_allclose(maps[0].bias, add, rtol=1e-15)


def test_a_relu_composed_record_is_the_quantizers_only_with_the_relu_before_it() -> None:
    """A Relu right before a signed quantizer, then a bias absorbed in front of it: the thresholds 0 passes are −∞
    in the record, and the quantizer through the Relu jumps only at the others. The same bias absorbed before the
    Relu (``z = Relu(a) + b``: the record's map is affine in ``a`` only where the Relu passes it) gives nothing
    against the quantizer without a Relu in front."""
    bias = np.array([0.0, 0.5, -1.0])
    rt = quant_real_thresholds(SCALE, np.zeros(C), 2, True, False).relu_composed().shifted(bias)
    assert np.isinf(rt.base).any() and np.isfinite(rt.base).any(axis=1).all()
    maps = derived_maps(node_with(rt), C, relu_signed, SCALE)
    assert len(maps) == 1 and maps[0].ok.all()
    np.testing.assert_allclose(maps[0].bias, bias)
    before = quant_real_thresholds(SCALE, np.zeros(C), 2, True, False).shifted(bias).relu_composed()
    assert all(not m.ok.any() for m in derived_maps(node_with(before), C, signed, SCALE))


def test_a_record_in_another_normalization_gives_nothing() -> None:
    """The same real thresholds ``R`` written with ``base`` and α three times as large: ``α·a + β`` is then not the
    quantizer's input, and its ``base`` are not the quantizer's switching points."""
    rt = absorbed(np.ones(C), np.zeros(C))
    scaled = RealThresholds(3 * rt.base, rt.strict, 3 * rt.alpha, 3 * rt.beta)
    assert all(not m.ok.any() for m in derived_maps(node_with(scaled), C, levels, SCALE))
    assert derived_maps(node_with(None), C, levels, SCALE) == []


def test_the_derived_map_fills_only_channels_the_samples_leave_open() -> None:
    """Channel 0's accumulator varies (fitted), channel 1's is constant and the record reproduces it (derived),
    channel 2's is constant and the record does not reproduce it (left unfitted)."""
    mul, add = np.array([0.5, 0.25, 0.75]), np.array([1.0, -2.0, 0.5])
    maps = derived_maps(node_with(absorbed(mul, add)), C, levels, SCALE)
    a3 = np.zeros((4, C, 5))
    a3[:, 0] = np.arange(20).reshape(4, 5)
    a3[:, 1], a3[:, 2] = 7.0, -3.0
    z3 = mul[None, :, None] * a3 + add[None, :, None]
    z3[:, 2] += 0.5 * mul[2]  # half an accumulator step off
    fit = fit_affine(a3, z3)
    assert fit.ok.tolist() == [True, False, False]
    apply_derived(fit, maps, a3, z3, False, 0.05, -100.0, 100.0)
    assert fit.ok.tolist() == [True, True, False]
    assert fit.slope[1] == mul[1] and fit.bias[1] == add[1] and 0 < fit.resid[1] < 1e-9
