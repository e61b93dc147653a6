"""The executor's fast path (custom ops lowered to standard ops inside onnxruntime) against the reference kernels,
bit for bit, for every lowered op and mode: ties, clip bounds, signed zeros, NaN/inf, per-channel parameters,
narrow ranges, 1-bit quantizers, old opsets, float64; and the cases that must fall back to the kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops import make_op
from custom_ops.executor import Executor
from custom_ops.quant import ROUNDING_MODES, max_int, min_int
from finnlite.core.compat import make_model

F32 = np.float32
MODES = [m for m in ROUNDING_MODES if m != "DOWN"]  # DOWN runs its kernel (see test_rounding_mode_down_...)
DOMAIN = "qonnx.custom_op.general"


def one_node_model(op_type: str, x_shape: tuple, params: list[np.ndarray | None], opset: int = 20,
                   custom_opset: int = 2, x_dtype: Any = F32, **attrs: Any):
    """A model with one custom node: input ``x`` (a graph input) and ``params`` as initializers (None: a further
    graph input named p<i>)."""
    names = ["x"] + [f"p{i}" for i in range(len(params))]
    node = helper.make_node(op_type, names, ["y"], name="node0", domain=DOMAIN, **attrs)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_dtype))
    inputs = [helper.make_tensor_value_info("x", elem, list(x_shape))]
    inits = []
    for i, p in enumerate(params):
        if p is None:
            inputs.append(helper.make_tensor_value_info(f"p{i}", TensorProto.FLOAT, None))
        else:
            inits.append(numpy_helper.from_array(np.asarray(p), f"p{i}"))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", elem, None)], inits)
    return make_model(graph, opset=opset, custom_opset=custom_opset), node


def check_lowered(h, model, node, x: np.ndarray, params: list[np.ndarray], dtype: Any = F32,
                  opset_version: int | None = None) -> np.ndarray:
    """Run ``model`` through the executor (asserting the node was lowered, not run as a kernel) and compare with
    the node's kernel, bit for bit."""
    ex = Executor(model, dtype=dtype)
    assert "0 run as kernels" in ex.describe(), ex.describe()
    got = ex.run({"x": x})["y"]
    arrays = [x.astype(dtype)] + [np.asarray(p).astype(dtype) for p in params]
    expected = make_op(node, opset_version).execute(arrays)[0]
    h.same_bits(got, expected)
    return got


def edge_inputs(bits: int, signed: bool, narrow: bool, scale: np.ndarray, rng: np.random.Generator,
                shape: tuple) -> np.ndarray:
    """Random values over the quantizer's range and beyond, with the ties, their float32 neighbours, the bounds
    and the specials (±0, NaN, ±inf) written over the first elements; in units of ``scale``."""
    lo = min_int(signed, narrow, bits) if bits > 1 or not signed else -1
    hi = max_int(signed, narrow, bits) if bits > 1 or not signed else 1
    ints = np.arange(lo - 2, hi + 3, dtype=np.float64) if hi - lo < 40 else np.array([lo - 1, lo, hi, hi + 1.0])
    ties = np.concatenate([ints + 0.5, ints - 0.5]).astype(F32)
    near = np.concatenate([np.nextafter(ties, F32(np.inf)), np.nextafter(ties, F32(-np.inf))])
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 0.49999997, -0.49999997, 1e-45, -1e-45, 1e30],
                        dtype=F32)
    edges = np.concatenate([ints.astype(F32), ties, near, specials])
    units = (rng.standard_normal(shape) * (hi - lo + 4) / 2).astype(F32)
    flat = units.reshape(-1)
    flat[:min(edges.size, flat.size)] = edges[:flat.size]
    return (units * scale).astype(F32)


# -- Quant ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("signed,narrow", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_quant_lowering_matches_kernel(h, mode, signed, narrow):
    rng = np.random.default_rng(MODES.index(mode) * 4 + signed * 2 + narrow)
    shape = (2, 3, 5, 7)
    cases = [  # (bits, scale, zero point)
        (1, np.array(0.5, F32), np.array(0.0, F32)),
        (2, np.array(1.0, F32), np.array(0.0, F32)),
        (4, rng.uniform(0.01, 2.0, (1, 3, 1, 1)).astype(F32), np.array(0.0, F32)),
        (8, np.array(0.0371, F32), np.array(3.0, F32)),
        (3, rng.uniform(0.1, 1.0, (7,)).astype(F32), rng.integers(-2, 3, (1, 3, 1, 1)).astype(F32)),
        (5, np.array(0.25, F32), np.array(-0.0, F32)),
        (16, np.array(2.0 ** -8, F32), np.array(0.0, F32)),
    ]
    for bits, scale, zeropt in cases:
        x = edge_inputs(bits, bool(signed), bool(narrow), scale, rng, shape)
        params = [scale, zeropt, np.array(bits, F32)]
        model, node = one_node_model("Quant", shape, params, signed=signed, narrow=narrow, rounding_mode=mode)
        check_lowered(h, model, node, x, params)


def test_quant_lowering_leaves_out_the_sub_of_a_zero_zero_point_only(h):
    scale, bits = np.array(0.5, F32), np.array(4, F32)
    x = np.array([[-0.0, 0.0, -0.2, 0.2, 1.25, -7.0]], F32)
    for zeropt, has_sub in ((np.array(0.0, F32), False), (np.array(-0.0, F32), True), (np.array(1.0, F32), True)):
        model, node = one_node_model("Quant", x.shape, [scale, zeropt, bits], signed=1, narrow=0)
        ex = Executor(model)
        region = ex._plan(batched=False, return_all=False).steps[0]
        assert any(n.op_type == "Sub" for n in region.nodes) == has_sub
        check_lowered(h, model, node, x, [scale, zeropt, bits])


def test_intquant_alias_is_lowered(h):
    x = np.linspace(-3, 3, 25, dtype=F32).reshape(1, 25)
    params = [np.array(0.25, F32), np.array(0.0, F32), np.array(3, F32)]
    model, node = one_node_model("IntQuant", x.shape, params, signed=1, narrow=1)
    check_lowered(h, model, node, x, params)


@pytest.mark.parametrize("opset", [11, 12, 13])
def test_quant_and_bipolar_lowering_in_old_opsets(h, opset):
    x = np.array([[-1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, np.nan, np.inf, -np.inf]], F32)
    for bits in (1, 4):
        params = [np.array(0.5, F32), np.array(0.0, F32), np.array(bits, F32)]
        model, node = one_node_model("Quant", x.shape, params, opset=opset, signed=1, narrow=0)
        check_lowered(h, model, node, x, params)
    model, node = one_node_model("BipolarQuant", x.shape, [np.array(2.0, F32)], opset=opset)
    check_lowered(h, model, node, x, [np.array(2.0, F32)])


# -- BipolarQuant ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [np.array(1.0, F32), np.array(0.3, F32),
                                   np.arange(1, 4, dtype=F32).reshape(1, 3, 1) * F32(0.7)])
def test_bipolar_quant_lowering_matches_kernel(h, scale):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 8)).astype(F32)
    x.flat[:6] = [0.0, -0.0, np.nan, np.inf, -np.inf, -1e-45]
    model, node = one_node_model("BipolarQuant", x.shape, [scale])
    check_lowered(h, model, node, x, [scale])


# -- MultiThreshold -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,layout,axis", [
    ((2, 4, 3, 3), "", 1), ((2, 3, 3, 4), "NHWC", 3), ((2, 4, 3, 3), "NCHW", 1), ((5, 4), "", 1),
    ((2, 6, 4), "", 2), ((2, 4, 6), "NCW", 1), ((2, 4, 2, 2, 2), "", 1)])
@pytest.mark.parametrize("out_scale,out_bias", [(1.0, 0.0), (1.0, -2.0), (0.5, 0.0), (-1.0, 3.0), (0.37, -1.5)])
def test_multithreshold_lowering_matches_kernel(h, shape, layout, axis, out_scale, out_bias):
    rng = np.random.default_rng(len(shape) + axis)
    channels = shape[axis]
    thresholds = np.sort(rng.integers(-6, 7, (channels, 7)).astype(F32), axis=1)
    thresholds[0] = thresholds[0][::-1]  # an unsorted row is counted all the same
    x = rng.integers(-8, 9, shape).astype(F32) + rng.choice(F32([0.0, 0.5, -0.25]), shape)
    x.flat[:5] = [np.nan, np.inf, -np.inf, -0.0, thresholds.flat[3]]
    attrs = dict(out_dtype="INT4", out_scale=out_scale, out_bias=out_bias)
    if layout:
        attrs["data_layout"] = layout
    model, node = one_node_model("MultiThreshold", shape, [thresholds], **attrs)
    check_lowered(h, model, node, x, [thresholds])


@pytest.mark.parametrize("opset", [11, 12, 13, 20])
def test_multithreshold_lowering_global_thresholds_and_old_opsets(h, opset):
    rng = np.random.default_rng(opset)
    thresholds = np.array([[-1.0, 0.0, 0.5, 2.0]], F32)
    x = rng.choice(F32([-2.0, -1.0, -0.0, 0.0, 0.5, 0.49999997, 2.0, np.nan]), (3, 5, 2, 2))
    model, node = one_node_model("MultiThreshold", x.shape, [thresholds], opset=opset, out_dtype="UINT3")
    check_lowered(h, model, node, x, [thresholds])


def test_large_multithreshold_runs_its_kernel(h):
    from custom_ops.lowering import MT_KERNEL_COMPARISONS

    rng = np.random.default_rng(3)
    thresholds = np.sort(rng.normal(size=(8, 15)), axis=1).astype(F32)
    side = int(np.ceil(np.sqrt(MT_KERNEL_COMPARISONS / (8 * 15))))  # just over the limit
    x = rng.normal(size=(1, 8, side, side)).astype(F32)
    model, node = one_node_model("MultiThreshold", x.shape, [thresholds], out_dtype="UINT4", out_scale=0.5)
    ex = Executor(model)
    assert "1 run as kernels" in ex.describe() and "the numpy kernel is faster" in ex.describe()
    h.same_bits(ex.run({"x": x})["y"], make_op(node).execute([x, thresholds])[0])
    small = x[:, :, : side // 2, : side // 2].copy()
    model, node = one_node_model("MultiThreshold", small.shape, [thresholds], out_dtype="UINT4", out_scale=0.5)
    check_lowered(h, model, node, small, [thresholds])


def test_multithreshold_with_unknown_channel_count_runs_its_kernel(h):
    thresholds = np.array([[0.0], [1.0]], F32)
    model, node = one_node_model("MultiThreshold", ("N", "C"), [thresholds], out_dtype="BINARY")
    ex = Executor(model)
    assert "1 run as kernels" in ex.describe() and "channel count" in ex.describe()
    x = np.array([[0.5, 0.5], [1.5, -1.0]], F32)
    h.same_bits(ex.run({"x": x})["y"], make_op(node).execute([x, thresholds])[0])


# -- Trunc ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("signed,narrow", [(0, 0), (1, 0), (1, 1)])
def test_trunc_v2_lowering_matches_kernel(h, mode, signed, narrow):
    rng = np.random.default_rng(MODES.index(mode) + 10 * signed + 20 * narrow)
    shape = (2, 3, 4, 4)
    for scale, zeropt, out_scale, in_bits, out_bits in [
            (np.array(0.0013605442, F32), np.array(0.0, F32), np.array(0.08707483, F32), 10, 4),
            (np.array(0.25, F32), np.array(0.0, F32), np.array(2.0, F32), 8, 4),
            (np.array(0.5, F32), np.array(4.0, F32), np.array(4.0, F32), 8, 5),
            (rng.uniform(0.1, 1, (1, 3, 1, 1)).astype(F32), np.array(0.0, F32), np.array(1.0, F32), 8, 3)]:
        x = (rng.integers(-(2 ** in_bits), 2 ** in_bits, shape) * scale).astype(F32)
        x.flat[:4] = [-0.0, 0.0, np.nan, float(scale.flat[0]) * 2.5]
        params = [scale, zeropt, np.array(in_bits, F32), out_scale, np.array(out_bits, F32)]
        model, node = one_node_model("Trunc", shape, params, rounding_mode=mode, signed=signed, narrow=narrow)
        check_lowered(h, model, node, x, params, opset_version=2)


@pytest.mark.parametrize("mode", ["FLOOR", "ROUND", "CEIL", "HALF_UP"])
def test_trunc_v1_lowering_matches_kernel(h, mode):
    rng = np.random.default_rng(1)
    scale, zeropt = np.array(0.125, F32), np.array(0.0, F32)
    x = (rng.integers(-512, 512, (3, 40)) * scale).astype(F32)
    x.flat[:3] = [-0.0, np.nan, -np.inf]
    params = [scale, zeropt, np.array(10, F32), np.array(4, F32)]
    model, node = one_node_model("Trunc", x.shape, params, custom_opset=1, rounding_mode=mode)
    check_lowered(h, model, node, x, params, opset_version=1)


# -- falling back, float64 ------------------------------------------------------------------------------------
def test_rounding_mode_down_runs_the_kernel_and_keeps_signed_zeros(h):
    x = np.array([[-0.3, -0.7, 0.3, -0.0, -1.2, 0.0, np.nan]], F32)
    params = [np.array(1.0, F32), np.array(0.0, F32), np.array(4, F32)]
    model, node = one_node_model("Quant", x.shape, params, signed=1, narrow=0, rounding_mode="DOWN")
    ex = Executor(model)
    assert "1 run as kernels" in ex.describe() and "DOWN" in ex.describe()
    got = ex.run({"x": x})["y"]
    h.same_bits(got, make_op(node).execute([x] + params)[0])
    assert np.signbit(got[0, :2]).all()


def test_dynamic_bitwidth_and_mixed_dtypes_run_the_kernel(h):
    x = np.linspace(-4, 4, 33, dtype=F32).reshape(1, 33)
    # the bitwidth is a graph input: not lowerable
    model, node = one_node_model("Quant", x.shape, [np.array(0.5, F32), np.array(0.0, F32), None],
                                 signed=1, narrow=0)
    ex = Executor(model)
    assert "1 run as kernels" in ex.describe() and "bitwidth is not a constant" in ex.describe()
    bits = np.array(3, F32)
    h.same_bits(ex.run({"x": x, "p2": bits})["y"],
                make_op(node).execute([x, np.array(0.5, F32), np.array(0.0, F32), bits])[0])
    # a float64 scale in a float32 model: numpy promotes, so the kernel runs
    params = [np.array(0.3, np.float64), np.array(0.0, F32), np.array(4, F32)]
    model, node = one_node_model("Quant", x.shape, params, signed=1, narrow=0)
    ex = Executor(model)
    assert "1 run as kernels" in ex.describe()
    h.same_bits(ex.run({"x": x})["y"], make_op(node).execute([x] + params)[0])


def test_lower_false_runs_every_custom_node_as_kernel(h):
    x = np.linspace(-2, 2, 9, dtype=F32).reshape(1, 9)
    params = [np.array(0.5, F32), np.array(0.0, F32), np.array(3, F32)]
    model, node = one_node_model("Quant", x.shape, params, signed=1, narrow=0)
    ex = Executor(model, lower=False)
    assert "lowering disabled" in ex.describe()
    h.same_bits(ex.run({"x": x})["y"], Executor(model).run({"x": x})["y"])


def test_float64_lowering_matches_float64_kernel(h):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 4))
    x.flat[:3] = [0.5 * 0.1, 2.5 * 0.1, -0.0]
    for mode in ("ROUND", "HALF_UP", "CEIL"):
        params = [np.array(0.1, F32), np.array(0.0, F32), np.array(4, F32)]
        model, node = one_node_model("Quant", x.shape, params, signed=1, narrow=0, rounding_mode=mode)
        got = check_lowered(h, model, node, x, params, dtype=np.float64)
        assert got.dtype == np.float64
    thresholds = np.sort(rng.standard_normal((3, 5)), axis=1).astype(F32)
    model, node = one_node_model("MultiThreshold", x.shape, [thresholds], out_dtype="UINT3", out_scale=0.5)
    check_lowered(h, model, node, x, [thresholds], dtype=np.float64)


IM2COL_CASES = [
    dict(shape=(1, 8, 8, 3), kernel_size=[3, 3], stride=[1, 1], pad_amount=[1, 1, 1, 1]),
    dict(shape=(1, 9, 7, 2), kernel_size=[3, 2], stride=[2, 1], pad_amount=[0, 1, 2, 0], pad_value=-3),
    dict(shape=(1, 11, 10, 4), kernel_size=[3, 3], stride=[2, 3], dilations=[2, 1], pad_amount=[2, 1, 1, 2]),
    dict(shape=(1, 6, 6, 5), kernel_size=[1, 1], stride=[1, 1]),
    dict(shape=(1, 6, 6, 5), kernel_size=[1, 1], stride=[2, 2]),
    dict(shape=(1, 1, 12, 3), kernel_size=[1, 3], stride=[1, 1], pad_amount=[0, 1, 0, 1], depthwise=1),
    dict(shape=(1, 5, 5, 1), kernel_size=[5, 5], stride=[1, 1]),
    dict(shape=(1, 7, 7, 2), kernel_size=[2, 2], stride=[3, 3], pad_amount=[0, 0, 1, 1], pad_value=7),
]


@pytest.mark.parametrize("case", IM2COL_CASES, ids=[str(i) for i in range(len(IM2COL_CASES))])
def test_im2col_lowering_matches_the_kernel(h, case):
    case = dict(case)
    shape = case.pop("shape")
    attrs = {"input_shape": str(tuple(shape)), **case}
    model, node = one_node_model("Im2Col", shape, [], **attrs)
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(F32)
    x.reshape(-1)[:3] = [-0.0, np.nan, np.inf]
    check_lowered(h, model, node, x, [])
    batch = rng.normal(size=(3,) + shape[1:]).astype(F32)  # a batch runs as one vectorized session too
    ex = Executor(model, batch_mode="vectorized")
    got = ex.run({"x": batch})["y"]
    for i in range(3):
        h.same_bits(got[i:i + 1], make_op(node).execute([batch[i:i + 1]])[0])


def test_im2col_of_a_non_float_input_runs_its_kernel():
    model, node = one_node_model("Im2Col", (1, 4, 4, 2), [], x_dtype=np.int32, kernel_size=[2, 2], stride=[1, 1],
                                 input_shape="(1, 4, 4, 2)", pad_amount=[1, 1, 1, 1], pad_value=2)
    ex = Executor(model)
    assert "1 run as kernels" in ex.describe()
    x = np.arange(32, dtype=np.int32).reshape(1, 4, 4, 2)
    assert np.array_equal(ex.run({"x": x})["y"], make_op(node).execute([x])[0])
