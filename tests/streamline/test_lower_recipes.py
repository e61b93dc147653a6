"""Lowering for issue 33's recipes, each checked exactly by the executor on random integer inputs: transposed
convolutions (FINN's pixel-padding form), DepthToSpace/SpaceToDepth, integer average pools, 1-D networks with 3-D
outputs and ConvTranspose1d, and the NHWC walk's reshapes, Resize, Gather and feature orders through a Concat."""

from __future__ import annotations

import numpy as np
import pytest

from streamline.layout import ConvertToNHWC
from streamline.layout_reshape import reshape_groups, reshape_in_place, reshape_target
from streamline.lower_1d import Change3DTo4DTensors
from streamline.lower_conv import LowerConvsToMatMul
from streamline.lower_deconv import LowerConvTransposeToMatMul
from streamline.lower_pool import LowerAveragePool, MakeMaxPoolNHWC
from streamline.lower_space import LowerDepthToSpace
from tests.streamline.test_lower_common import GraphBuilder, assert_exact, int_weights, op_types, run_passes

RNG = np.random.default_rng(33)
LOWER = [Change3DTo4DTensors, LowerConvsToMatMul, LowerConvTransposeToMatMul, MakeMaxPoolNHWC, LowerAveragePool,
         LowerDepthToSpace, ConvertToNHWC]


def _x(shape, lo=0, hi=15, name="x"):
    return {name: RNG.integers(lo, hi + 1, size=shape).astype(np.float32)}


@pytest.mark.parametrize("w_shape,attrs,x_shape", [
    ((3, 4, 2, 2), dict(strides=[2, 2]), (1, 3, 4, 5)),
    ((3, 2, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), (1, 3, 4, 4)),
    ((2, 3, 3, 2), dict(strides=[3, 1], pads=[0, 1, 2, 0], dilations=[1, 2]), (1, 2, 3, 4)),
    ((4, 2, 1, 1), dict(), (1, 4, 3, 3)),
    ((2, 2, 3, 3), dict(pads=[1, 1, 1, 1]), (1, 2, 4, 4)),
])
def test_conv_transpose_becomes_pixel_padding_im2col_and_matmul(w_shape, attrs, x_shape):
    for _ in range(3):
        g = GraphBuilder()
        y = g.node("ConvTranspose", ["x", g.const(int_weights(RNG, w_shape))], **attrs)
        model = g.build({"x": x_shape}, [y], {"x": "INT4"})
        before, after, _ = run_passes(model, [LowerConvTransposeToMatMul], _x(x_shape, -8, 7))
        assert_exact(before, after)
        ops = op_types(model)
        assert "ConvTranspose" not in ops and "MatMul" in ops
        assert ("FMPadding_Pixel" in ops) == (attrs.get("strides", [1, 1]) != [1, 1])


def test_conv_transpose_that_crops_or_groups_is_a_miss():
    for attrs, w_shape, why in ((dict(strides=[2, 2], pads=[3, 3, 3, 3]), (2, 2, 3, 3), "pads larger"),
                                (dict(group=2), (2, 1, 3, 3), "grouped")):
        g = GraphBuilder()
        y = g.node("ConvTranspose", ["x", g.const(int_weights(RNG, w_shape))], **attrs)
        model = g.build({"x": (1, 2, 6, 6)}, [y], {"x": "INT4"})
        rule = LowerConvTransposeToMatMul()
        result = rule.run(model)
        assert not result.changed
        assert any(why in m.reason for m in result.misses)


def test_a_1d_network_with_a_transposed_conv_and_a_3d_output_lowers():
    """MelGAN's upsampling and QuartzNet's logits: ConvTranspose1d, then a Conv1d, the (N, C, T) output kept."""
    g = GraphBuilder()
    up = g.node("ConvTranspose", ["x", g.const(int_weights(RNG, (3, 4, 16)))], strides=[8], pads=[4, 4])
    mt = g.mt(up, np.sort(RNG.integers(-30, 30, size=(4, 3)), axis=1).astype(np.float32), out_dtype="UINT2",
              data_layout="NCW")
    y = g.node("Conv", [mt, g.const(int_weights(RNG, (2, 4, 3)))], pads=[1, 1], out="y")
    model = g.build({"x": (1, 3, 5)}, [y], {"x": "INT3"})
    before, after, report = run_passes(model, LOWER, _x((1, 3, 5), -4, 3))
    assert_exact(before, after)
    ops = op_types(model)
    assert "ConvTranspose" not in ops and "Conv" not in ops, ops
    assert model.graph.outputs[0].name == "y" and list(model.graph.outputs[0].shape) == [1, 2, 40]
    assert ops.count("Transpose") == 2  # into NWC at the input, back to NCW at the output


@pytest.mark.parametrize("op,attrs,x_shape", [("DepthToSpace", dict(blocksize=2), (1, 8, 2, 3)),
                                               ("DepthToSpace", dict(blocksize=3, mode="CRD"), (1, 18, 2, 2)),
                                               ("SpaceToDepth", dict(blocksize=2), (1, 2, 4, 6))])
def test_depth_to_space_is_reshape_transpose_reshape(op, attrs, x_shape):
    g = GraphBuilder()
    y = g.node(op, ["x"], **attrs)
    model = g.build({"x": x_shape}, [y], {"x": "INT4"})
    before, after, _ = run_passes(model, [LowerDepthToSpace], _x(x_shape, -8, 7))
    assert_exact(before, after)
    assert op_types(model) == ["Reshape", "Transpose", "Reshape"]


def _espcn_tail(block: int):
    """conv → thresholds → DepthToSpace → output: a sub-pixel convolution's end."""
    g = GraphBuilder()
    c = g.node("Conv", ["x", g.const(int_weights(RNG, (2 * block * block, 3, 3, 3)))], pads=[1, 1, 1, 1])
    mt = g.mt(c, np.sort(RNG.integers(-20, 20, size=(1, 3)), axis=1).astype(np.float32))
    y = g.node("DepthToSpace", [mt], blocksize=block, out="y")
    return g.build({"x": (1, 3, 4, 4)}, [y], {"x": "UINT3"})


@pytest.mark.parametrize("block", [2, 3])
def test_depth_to_space_at_the_output_joins_the_way_back_to_nchw(block):
    model = _espcn_tail(block)
    before, after, _ = run_passes(model, LOWER, _x((1, 3, 4, 4), 0, 7))
    assert_exact(before, after)
    assert op_types(model).count("Transpose") == 2  # the input's, and one for both the shuffle and NCHW


def test_a_resize_and_a_gather_stay_in_nhwc():
    g = GraphBuilder()
    c = g.node("Conv", ["x", g.const(int_weights(RNG, (4, 3, 3, 3)))], pads=[1, 1, 1, 1])
    mt = g.mt(c, np.sort(RNG.integers(-20, 20, size=(4, 3)), axis=1).astype(np.float32))
    up = g.node("Resize", [mt, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    sel = g.node("Gather", [up, g.const(np.array([3, 1, 1, 0, 2], np.int64))], axis=1)
    y = g.node("Conv", [sel, g.const(int_weights(RNG, (2, 5, 3, 3)))], pads=[1, 1, 1, 1])
    z = g.node("MatMul", [g.node("Flatten", [y]), g.const(int_weights(RNG, (128, 3)))], out="z")
    model = g.build({"x": (1, 3, 4, 4)}, [z], {"x": "UINT3"})
    before, after, report = run_passes(model, LOWER, _x((1, 3, 4, 4), 0, 7))
    assert_exact(before, after)
    assert op_types(model).count("Transpose") == 1, [m.reason for m in report.misses]
    resize = model.get_nodes_by_op_type("Resize")[0]
    assert list(resize.inputs[2].const_value.numpy()) == [1, 2, 2, 1]


def test_a_gate_reshaped_to_nchw_is_written_nhwc_and_a_concat_keeps_the_feature_order():
    g = GraphBuilder()
    c = g.node("Conv", ["x", g.const(int_weights(RNG, (4, 3, 3, 3)))], pads=[1, 1, 1, 1])
    f = g.mt(c, np.sort(RNG.integers(-20, 20, size=(4, 3)), axis=1).astype(np.float32))
    gate = g.node("Reshape", ["v", g.const(np.array([1, 4, 1, 1], np.int64))])
    prod = g.node("Mul", [f, gate])
    flat = g.node("Flatten", [prod])
    cat = g.node("Concat", [flat, "v"], axis=1)
    z = g.node("MatMul", [cat, g.const(int_weights(RNG, (68, 2)))], out="z")
    model = g.build({"x": (1, 3, 4, 4), "v": (1, 4)}, [z], {"x": "UINT3", "v": "UINT2"})
    inputs = {**_x((1, 3, 4, 4), 0, 7), **_x((1, 4), 0, 3, "v")}
    before, after, report = run_passes(model, LOWER, inputs)
    assert_exact(before, after)
    assert op_types(model).count("Transpose") == 1, [m.reason for m in report.misses]


# -- the reshape algebra ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s_in,s_out", [((2, 6, 4), (2, 3, 2, 4)), ((1, 8, 3, 3), (1, 2, 4, 3, 3)),
                                        ((1, 4, 1, 1), (1, 4)), ((2, 3, 4), (6, 4)), ((6, 4), (4, 6)),
                                        ((1, 4), (1, 4, 1, 1)), ((3, 1, 5), (15,))])
def test_reshapes_of_permuted_tensors(s_in, s_out):
    """For every permutation p: where reshape_in_place says the reshape acts on ``u = t.transpose(p)`` directly,
    it does; reshape_target's Transpose always makes it act in place, with the promised result."""
    import itertools

    t = np.arange(int(np.prod(s_in))).reshape(s_in)
    want = t.reshape(s_out)
    assert reshape_groups(s_in, s_out) is not None
    for p in itertools.permutations(range(len(s_in))):
        u = t.transpose(p)
        q = reshape_in_place(p, s_in, s_out)
        if q is not None:
            np.testing.assert_array_equal(u.reshape([s_out[b] for b in q]), want.transpose(q))
    for desired in itertools.permutations(range(len(s_out))):
        target, q = reshape_target(s_in, s_out, desired)
        np.testing.assert_array_equal(t.transpose(target).reshape([s_out[b] for b in q]), want.transpose(q))


def test_average_pools_become_sums_and_a_scale_or_stay_with_the_reason():
    for attrs, lowered in ((dict(kernel_shape=[2, 2], strides=[2, 2]), True),
                           (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1), True),
                           (dict(kernel_shape=[3, 2], strides=[1, 2]), True),
                           (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), False)):
        g = GraphBuilder()
        y = g.node("AveragePool", ["x"], **attrs)
        model = g.build({"x": (1, 3, 6, 6)}, [y], {"x": "INT4"})
        before, after, report = run_passes(model, [LowerAveragePool, ConvertToNHWC], _x((1, 3, 6, 6), -8, 7))
        np.testing.assert_allclose(after[y], before[y], rtol=1e-6)
        assert ("ReduceSum" in op_types(model)) == lowered
        if not lowered:
            assert any("border" in m.reason for m in report.misses if m.rule == "LowerAveragePool")
