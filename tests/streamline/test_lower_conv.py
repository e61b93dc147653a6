"""LowerConvsToMatMul: exact on random integer inputs for padding, stride, dilation, non-square kernels and
images, 1×1 and depthwise convolutions, with the Im2Col/MatMul form FINN's hardware conversion reads."""

from __future__ import annotations

import numpy as np
import pytest

from custom_ops.im2col import conv_output_dim
from finnlite.core.shapes import const_array
from streamline.lower import LOWER_PASSES
from streamline.lower_common import get_tensor_sparsity
from streamline.lower_conv import LowerConvsToMatMul
from tests.streamline.test_lower_common import (GraphBuilder, assert_exact, assert_transposes_only_at_input,
                                                int_weights, op_types, run_passes)

RNG = np.random.default_rng(7)

# (cin, cout, (h, w), kernel, strides, pads [t, l, b, r], dilations, group)
CASES = {
    "3x3_pad1": (3, 4, (6, 6), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "3x3_stride2_pad1": (3, 5, (7, 7), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "dilation2": (2, 3, (8, 7), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),
    "nonsquare_kernel": (3, 4, (5, 6), (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), 1),
    "nonsquare_stride_asym_pad": (2, 3, (7, 9), (3, 2), (2, 1), (1, 0, 0, 1), (1, 1), 1),
    "1x1": (4, 6, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1_stride2": (4, 6, (6, 6), (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "depthwise_3x3": (4, 4, (6, 6), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),
    "depthwise_stride2": (3, 3, (7, 7), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 3),
    "width_1_image": (2, 3, (5, 1), (3, 1), (1, 1), (1, 0, 1, 0), (1, 1), 1),
}


def conv_model(cin, cout, hw, kernel, strides, pads, dilations, group, in_dt="UINT4", flatten=False):
    g = GraphBuilder()
    w = int_weights(RNG, (cout, cin // group, *kernel))
    y = g.node("Conv", ["x", g.const(w, "W")], kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
               dilations=list(dilations), group=group)
    if flatten:
        oh, ow = (conv_output_dim(s, k, st, p0 + p1, d) for s, k, st, p0, p1, d in
                  zip(hw, kernel, strides, pads[:2], pads[2:], dilations))
        y = g.node("MatMul", [g.node("Flatten", [y]), g.const(int_weights(RNG, (cout * oh * ow, 3)))])
    model = g.build({"x": (1, cin, *hw)}, [y], {"x": in_dt, "W": "INT3"})
    return model, w


def _random_input(model, lo=0, hi=15):
    shape = model.get_tensor_shape("x")
    return {"x": RNG.integers(lo, hi + 1, size=shape).astype(np.float32)}


@pytest.mark.parametrize("case", list(CASES))
def test_lower_conv_exact_and_finn_form(case):
    cin, cout, hw, kernel, strides, pads, dilations, group = CASES[case]
    model, w = conv_model(cin, cout, hw, kernel, strides, pads, dilations, group)
    before, after, _ = run_passes(model, [LowerConvsToMatMul], _random_input(model))
    assert_exact(before, after)
    assert "Conv" not in op_types(model)
    mm = model.get_nodes_by_op_type("MatMul")[0]
    wmat = const_array(mm.inputs[1])
    assert wmat.shape == (kernel[0] * kernel[1] * cin, cout)  # [K, N], rows in Im2Col's (kh, kw, C) order
    assert model.get_tensor_datatype(mm.inputs[1].name).name == "INT3"
    assert model.get_tensor_layout(mm.outputs[0].name) == list("NHWC")
    im2cols = model.get_nodes_by_op_type("Im2Col")
    pointwise = kernel == (1, 1) and strides == (1, 1) and not any(pads)
    assert len(im2cols) == (0 if pointwise else 1)
    if im2cols:
        i2c = im2cols[0]
        attrs = {k: a.value for k, a in i2c.attributes.items()}
        assert list(attrs["pad_amount"]) == list(pads) and attrs["pad_value"] == 0
        assert list(attrs["stride"]) == list(strides) and list(attrs["kernel_size"]) == list(kernel)
        assert list(attrs["dilations"]) == list(dilations)
        assert attrs["depthwise"] == int(group > 1)
        assert model.get_tensor_layout(i2c.inputs[0].name) == list("NHWC")
        assert model.get_tensor_datatype(i2c.outputs[0].name).name == "UINT4"
    if group > 1:
        # FINN's InferVectorVectorActivation: sparsity annotation, and the dense [C, 1, kh, kw] weight is recovered
        # from the [kh·kw·C, C] matrix by taking the diagonal blocks
        assert get_tensor_sparsity(mm.inputs[1]) == {"dw": {"kernel_shape": list(kernel)}}
        folded = wmat.T.reshape(cout, kernel[0], kernel[1], cin).transpose(0, 3, 1, 2)
        recovered = np.stack([folded[c, c] for c in range(cout)])[:, None]
        np.testing.assert_array_equal(recovered, w)
    else:
        assert get_tensor_sparsity(mm.inputs[1]) is None


@pytest.mark.parametrize("case", ["3x3_stride2_pad1", "depthwise_3x3", "1x1", "dilation2"])
def test_lower_stage_leaves_no_transpose_inside(case):
    model, _ = conv_model(*CASES[case], flatten=True)
    before, after, _ = run_passes(model, LOWER_PASSES, _random_input(model))
    assert_exact(before, after)
    assert_transposes_only_at_input(model)
    assert "Conv" not in op_types(model)


def test_auto_pad_same_upper():
    g = GraphBuilder()
    y = g.node("Conv", ["x", g.const(int_weights(RNG, (3, 2, 3, 3)))], kernel_shape=[3, 3], strides=[2, 2],
               auto_pad="SAME_UPPER")
    model = g.build({"x": (1, 2, 6, 5)}, [y], {"x": "UINT3"})
    before, after, _ = run_passes(model, [LowerConvsToMatMul], _random_input(model, 0, 7))
    assert_exact(before, after)
    assert "Conv" not in op_types(model)


def test_grouped_conv_is_lowered_dense_unless_told_not():
    model, _ = conv_model(4, 6, (5, 5), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2)
    inputs = _random_input(model)
    rule = LowerConvsToMatMul(dense_grouped=False)
    result = rule.run(model)
    assert not result.changed
    assert any("grouped convolution" in m.reason for m in result.misses)
    assert "Conv" in op_types(model)
    before, after, _ = run_passes(model, [LowerConvsToMatMul], inputs)
    assert_exact(before, after)
    assert "Conv" not in op_types(model)


def test_channel_multiplier_is_grouped_not_depthwise():
    model, _ = conv_model(2, 4, (5, 5), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2)
    before, after, _ = run_passes(model, [LowerConvsToMatMul(dense_grouped=True)], _random_input(model))
    assert_exact(before, after)
    mm = model.get_nodes_by_op_type("MatMul")[0]
    assert get_tensor_sparsity(mm.inputs[1]) is None
    assert {k: a.value for k, a in model.get_nodes_by_op_type("Im2Col")[0].attributes.items()}["depthwise"] == 0


def test_conv_with_bias_or_unsupported_padding_is_a_miss():
    g = GraphBuilder()
    a = g.node("Conv", ["x", g.const(int_weights(RNG, (2, 2, 3, 3))), g.const(np.ones(2, np.float32))],
               pads=[1, 1, 1, 1])
    b = g.node("Conv", ["z", g.const(int_weights(RNG, (2, 2, 3, 3)))], pads=[1, 1, 1, 1])  # H = 1 with kernel 3
    model = g.build({"x": (1, 2, 4, 4), "z": (1, 2, 1, 4)}, [a, b])
    rule = LowerConvsToMatMul()
    result = rule.run(model)
    assert not result.changed
    reasons = " ".join(m.reason for m in result.misses)
    assert "bias" in reasons and "spatial size of 1" in reasons


def test_bipolar_input_padding_widens_the_im2col_datatype():
    model, _ = conv_model(2, 3, (4, 4), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, in_dt="BIPOLAR")
    inputs = {"x": RNG.choice([-1.0, 1.0], size=(1, 2, 4, 4)).astype(np.float32)}
    before, after, _ = run_passes(model, [LowerConvsToMatMul], inputs)
    assert_exact(before, after)
    i2c = model.get_nodes_by_op_type("Im2Col")[0]
    assert model.get_tensor_datatype(i2c.outputs[0].name).name == "INT2"
