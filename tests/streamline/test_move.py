"""The table-driven reorder rules (streamline.move): each on its smallest graphs, over several seeds, checked by the
oracle on random inputs (float64 execution of the original and the result must agree; integers exactly)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from onnx import helper

from streamline.move import (MoveAddPastAveraging, MoveDataMovementPastElementwise, MoveLinearPastDataMovement,
                             MoveMulPastLinear)
from streamline.real_thresholds import RealThresholds, fractions_of, set_real_thresholds
from tests.streamline.rulecheck import apply, compare, graph_model

SEEDS = range(4)
QONNX = "qonnx.custom_op.general"


def _const(rng, kind: str, shape: tuple[int, ...], channels_axis: int = 1) -> np.ndarray:
    """A constant of ``kind``: scalar, per-channel (positive), signed per-channel (mixed signs), full."""
    if kind == "scalar":
        return np.float32(rng.choice([0.25, -0.375, 1.5]))
    if kind == "full":
        return rng.normal(size=shape).astype(np.float32)
    c = shape[channels_axis]
    vec = rng.uniform(0.1, 2.0, c).astype(np.float32)
    if kind == "signed":
        vec *= rng.choice([-1, 1], c)
    out = [1] * len(shape)
    out[channels_axis] = c
    return vec.reshape(out)


def _model(nodes, inputs, inits, outputs=("y",)):
    """A graph whose outputs' shapes are left to shape inference."""
    proto = graph_model(nodes, inputs, {}, inits)
    proto.graph.output.extend(helper.make_tensor_value_info(o, 1, None) for o in outputs)
    return proto


def _ints(rng, shape, lo=-8, hi=7):
    return rng.integers(lo, hi + 1, size=shape).astype(np.float64)


# -- MoveLinearPastDataMovement --------------------------------------------------------------------------------------
#: (op, input shape, output shape, attributes, extra constant inputs)
MOVES = [
    ("Transpose", (2, 3, 4, 5), (2, 4, 5, 3), dict(perm=[0, 2, 3, 1]), {}),
    ("Reshape", (2, 3, 4, 5), (2, 60), {}, {"shape": np.array([2, 60], np.int64)}),
    ("Flatten", (2, 3, 4, 5), (2, 60), dict(axis=1), {}),
    ("Unsqueeze", (2, 3, 4), (2, 3, 1, 4), {}, {"axes": np.array([2], np.int64)}),
    ("DepthToSpace", (1, 8, 2, 3), (1, 2, 4, 6), dict(blocksize=2), {}),
    ("DepthToSpace", (1, 8, 2, 3), (1, 2, 4, 6), dict(blocksize=2, mode="CRD"), {}),
    ("SpaceToDepth", (1, 2, 4, 6), (1, 8, 2, 3), dict(blocksize=2), {}),
    ("Resize", (1, 3, 2, 3), (1, 3, 4, 6), dict(mode="nearest"), {"roi": None, "scales": np.array([1, 1, 2, 2],
                                                                                                      np.float32)}),
    ("Slice", (2, 6, 5), (2, 3, 5), {}, {"starts": np.array([5], np.int64), "ends": np.array([0], np.int64),
                                         "axes": np.array([1], np.int64), "steps": np.array([-2], np.int64)}),
    ("Gather", (2, 4, 3), (2, 5, 3), dict(axis=1), {"idx": np.array([3, 0, 0, 2, 1], np.int64)}),
    ("Pad", (1, 3, 3, 3), (1, 3, 5, 6), {}, {"pads": np.array([0, 0, 1, 2, 0, 0, 1, 1], np.int64)}),
    ("Tile", (2, 3, 1), (2, 3, 4), {}, {"reps": np.array([1, 1, 4], np.int64)}),
    ("Expand", (1, 3, 1), (2, 3, 5), {}, {"shape": np.array([2, 3, 5], np.int64)}),
]


def _move_model(op, in_shape, out_shape, attrs, extra, lin, const):
    names = ["xs"] + [("" if v is None else k) for k, v in extra.items()]
    inits = {k: v for k, v in extra.items() if v is not None}
    inits["k"] = np.asarray(const)
    nodes = [helper.make_node(lin, ["x", "k"], ["xs"], name="lin"),
             helper.make_node(op, names, ["y"], name="move", **attrs)]
    return graph_model(nodes, {"x": list(in_shape)}, {"y": list(out_shape)}, inits)


@pytest.mark.parametrize("op,in_shape,out_shape,attrs,extra", MOVES, ids=[f"{m[0]}{i}" for i, m in enumerate(MOVES)])
@pytest.mark.parametrize("lin,kind", [("Mul", "scalar"), ("Mul", "channel"), ("Mul", "signed"), ("Add", "scalar"),
                                      ("Add", "channel"), ("Mul", "full")])
def test_linear_past_data_movement_is_exact(op, in_shape, out_shape, attrs, extra, lin, kind):
    """Whatever moves is exact; a scalar always moves (a non-zero fill excepted); a per-channel constant moves where
    the op keeps channels whole or flattens them to one feature axis, and stays where it would spread over space."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        const = _const(rng, kind, in_shape)
        proto = _move_model(op, in_shape, out_shape, attrs, extra, lin, const)
        m = apply(proto, [MoveLinearPastDataMovement])
        ops = [n.op_type for n in m.graph]
        moved = ops.index(op) < ops.index(lin)
        if kind == "scalar" and not (op == "Pad" and lin == "Add"):
            assert moved, ops
        if kind == "full":
            assert moved, ops  # it varies along every axis before as after
        if kind in ("channel", "signed") and op in ("Transpose", "Flatten", "Resize", "Tile", "Expand", "Unsqueeze"):
            assert moved, ops
        if kind in ("channel", "signed") and op == "SpaceToDepth":
            assert moved, ops  # channel c's pixels become channels c·r² + k: still one factor per channel
        if kind in ("channel", "signed") and op == "DepthToSpace":
            assert not moved, ops  # channels c·r² + k become pixels of channel c: the factor would vary in space
        if op == "Pad" and lin == "Add" and kind == "scalar":
            assert moved  # the fill value moves instead: v − b
        compare(proto, m, {"x": _ints(rng, in_shape)})


@pytest.mark.parametrize("fill", [0.0, 1.5, -2.0])
@pytest.mark.parametrize("lin,const,moves", [("Mul", 0.5, True), ("Mul", 0.0, "fill0"), ("Add", 0.25, True),
                                              ("Mul", "channel", "fill0")])
def test_pad_border_stays_the_fill(fill, lin, const, moves):
    rng = np.random.default_rng(3)
    k = _const(rng, "channel", (1, 2, 3, 3)) if const == "channel" else np.float32(const)
    nodes = [helper.make_node(lin, ["x", "k"], ["xs"], name="lin"),
             helper.make_node("Pad", ["xs", "pads", "fill"], ["y"], mode="constant", name="pad")]
    proto = graph_model(nodes, {"x": [1, 2, 3, 3]}, {"y": [1, 2, 5, 5]},
                        {"k": k, "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "fill": np.float32(fill)})
    m = apply(proto, [MoveLinearPastDataMovement])
    expect = moves is True or (moves == "fill0" and fill == 0.0)
    assert ([n.op_type for n in m.graph] == ["Pad", lin]) == expect
    compare(proto, m, {"x": _ints(rng, (1, 2, 3, 3))})


def test_concat_and_split_move_per_input_and_per_output():
    rng = np.random.default_rng(5)
    a = _const(rng, "signed", (1, 2, 3))
    nodes = [helper.make_node("Mul", ["x1", "a"], ["p"], name="m1"),
             helper.make_node("Mul", ["x2", "b"], ["q"], name="m2"),
             helper.make_node("Concat", ["p", "q"], ["c"], axis=1, name="cat"),
             helper.make_node("Mul", ["c2", "d"], ["cs"], name="m3"),
             helper.make_node("Split", ["cs", "split"], ["y1", "y2"], axis=1, name="split")]
    proto = graph_model(nodes, {"x1": [1, 2, 3], "x2": [1, 4, 3], "c2": [1, 6, 3]},
                        {"c": [1, 6, 3], "y1": [1, 1, 3], "y2": [1, 5, 3]},
                        {"a": a, "b": np.float32(0.375), "d": _const(rng, "channel", (1, 6, 3)),
                         "split": np.array([1, 5], np.int64)})
    m = apply(proto, [MoveLinearPastDataMovement])
    assert [n.op_type for n in m.graph] == ["Concat", "Mul", "Split", "Mul", "Mul"]
    compare(proto, m, {"x1": _ints(rng, (1, 2, 3)), "x2": _ints(rng, (1, 4, 3)), "c2": _ints(rng, (1, 6, 3))})


def test_moved_constants_stay_exact_rationals():
    """A factor that float32 cannot hold (its exact value recorded) moves as that exact value."""
    from streamline.exact import exact_value, set_exact

    nodes = [helper.make_node("Mul", ["x", "k"], ["xs"], name="lin"),
             helper.make_node("Transpose", ["xs"], ["y"], perm=[1, 0], name="t")]
    proto = graph_model(nodes, {"x": [2, 3]}, {"y": [3, 2]}, {"k": np.float32(1 / 3)})
    from finnlite import Model, PassManager, Stage

    m = Model(proto)
    m.infer_shapes()
    set_exact(m.get_node_from_name("lin"), np.array(Fraction(1, 3), dtype=object))
    PassManager([Stage("s", [MoveLinearPastDataMovement], fixpoint=True)]).run(m)
    mul = next(n for n in m.graph if n.op_type == "Mul")
    assert exact_value(mul, mul.inputs[1].const_value.numpy()).ravel()[0] == Fraction(1, 3)


# -- MoveMulPastLinear / MoveAddPastAveraging ------------------------------------------------------------------------
CONVS = [  # (w shape, attrs, constant kind, moves)
    ((6, 3, 3, 3), dict(pads=[1, 1, 1, 1]), "scalar", True),
    ((6, 3, 3, 3), dict(pads=[1, 1, 1, 1]), "channel", False),
    ((6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1]), "signed", True),
    ((6, 3, 1, 1), dict(group=2), "group", True),
    ((6, 3, 1, 1), dict(group=2), "channel", False),
    ((6, 3, 2, 2), dict(dilations=[2, 1]), "scalar", True),
]


@pytest.mark.parametrize("w_shape,attrs,kind,moves", CONVS)
def test_mul_past_conv_by_its_channel_groups(w_shape, attrs, kind, moves):
    cin = w_shape[1] * attrs.get("group", 1)
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        if kind == "group":  # one factor per group of input channels
            g = attrs["group"]
            const = np.repeat(rng.uniform(0.1, 2, g), cin // g).astype(np.float32).reshape(1, cin, 1, 1)
        else:
            const = _const(rng, kind, (1, cin, 5, 5))
        w = rng.integers(-3, 4, size=w_shape).astype(np.float32)
        nodes = [helper.make_node("Mul", ["x", "k"], ["xs"], name="lin"),
                 helper.make_node("Conv", ["xs", "w"], ["y"], name="conv", **attrs)]
        proto = _model(nodes, {"x": [2, cin, 5, 5]}, {"k": const, "w": w})
        m = apply(proto, [MoveMulPastLinear])
        assert ([n.op_type for n in m.graph] == ["Conv", "Mul"]) == moves
        compare(proto, m, {"x": _ints(rng, (2, cin, 5, 5))})


@pytest.mark.parametrize("op,attrs,in_shape,kind,moves", [
    ("ConvTranspose", dict(strides=[2, 2]), (1, 3, 3, 3), "scalar", True),
    ("ConvTranspose", dict(strides=[2, 2]), (1, 3, 3, 3), "channel", False),
    ("MatMul", {}, (2, 4, 3), "rows", True),
    ("MatMul", {}, (2, 4, 3), "features", False),
    ("MaxPool", dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1]), (1, 3, 4, 4), "channel", True),
    ("MaxPool", dict(kernel_shape=[2, 2]), (1, 3, 4, 4), "signed", False),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1), (1, 3, 4, 4), "signed", True),
    ("GlobalAveragePool", {}, (1, 3, 4, 4), "channel", True),
    ("ReduceSum", dict(keepdims=0), (2, 3, 4, 5), "channel", True),
    ("ReduceMax", dict(keepdims=1), (2, 3, 4, 5), "signed", False),
])
def test_mul_past_linear_and_selection_ops(op, attrs, in_shape, kind, moves):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        inits = {}
        inputs = ["xs"]
        if op == "ConvTranspose":
            inits["w"] = rng.integers(-3, 4, size=(3, 2, 3, 3)).astype(np.float32)
            inputs.append("w")
        if op == "MatMul":
            inits["w"] = rng.integers(-3, 4, size=(3, 5)).astype(np.float32)
            inputs.append("w")
        if op.startswith("Reduce"):
            inits["axes"] = np.array([2, 3], np.int64)
            inputs.append("axes")
        if kind == "rows":
            const = rng.uniform(0.1, 2, (2, 4, 1)).astype(np.float32)
        elif kind == "features":
            const = rng.uniform(0.1, 2, (1, 1, 3)).astype(np.float32)
        else:
            const = _const(rng, kind, in_shape)
        inits["k"] = const
        nodes = [helper.make_node("Mul", ["x", "k"], ["xs"], name="lin"),
                 helper.make_node(op, inputs, ["y"], name="op", **attrs)]
        proto = _model(nodes, {"x": list(in_shape)}, inits)
        m = apply(proto, [MoveMulPastLinear])
        assert ([n.op_type for n in m.graph] == [op, "Mul"]) == moves
        compare(proto, m, {"x": _ints(rng, in_shape)})


@pytest.mark.parametrize("op,attrs,moves", [
    ("MaxPool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), True),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]), True),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1), False),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), True),
    ("ReduceMin", dict(keepdims=1), True),
    ("ReduceSum", dict(keepdims=1), True),
    ("ReduceMean", dict(keepdims=0), True),
])
def test_add_past_averages_maxima_and_sums(op, attrs, moves):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        inits = {"b": _const(rng, "signed", (1, 3, 4, 4))}
        inputs = ["xb"]
        if op.startswith("Reduce"):
            inits["axes"] = np.array([2, 3], np.int64)
            inputs.append("axes")
        nodes = [helper.make_node("Add", ["x", "b"], ["xb"], name="lin"),
                 helper.make_node(op, inputs, ["y"], name="op", **attrs)]
        proto = _model(nodes, {"x": [1, 3, 4, 4]}, inits)
        m = apply(proto, [MoveAddPastAveraging])
        assert ([n.op_type for n in m.graph] == [op, "Add"]) == moves
        compare(proto, m, {"x": _ints(rng, (1, 3, 4, 4))}, rtol=1e-6)


# -- MoveDataMovementPastElementwise ---------------------------------------------------------------------------------
def _mt(rng, rows: int, steps: int, **attrs):
    t = np.sort(rng.integers(-12, 12, size=(rows, steps)), axis=1).astype(np.float32)
    return t, helper.make_node("MultiThreshold", ["d", "t"], ["y"], domain=QONNX, name="mt", out_dtype="UINT3",
                               **attrs)


@pytest.mark.parametrize("op,in_shape,out_shape,attrs,extra,rows,moves", [
    ("DepthToSpace", (1, 8, 2, 3), (1, 2, 4, 6), dict(blocksize=2), {}, 2, True),
    ("DepthToSpace", (1, 8, 2, 3), (1, 2, 4, 6), dict(blocksize=2), {}, 1, True),
    ("Transpose", (1, 3, 4, 5), (1, 5, 3, 4), dict(perm=[0, 3, 1, 2]), {}, 5, True),
    ("Gather", (1, 4, 3, 3), (1, 4, 3, 3), dict(axis=1), {"idx": np.array([2, 0, 3, 1], np.int64)}, 4, True),
    ("Gather", (1, 4, 3, 3), (1, 5, 3, 3), dict(axis=1), {"idx": np.array([2, 0, 0, 3, 1], np.int64)}, 5, False),
    ("Resize", (1, 3, 2, 2), (1, 3, 4, 4), dict(mode="nearest"),
     {"roi": None, "scales": np.array([1, 1, 2, 2], np.float32)}, 3, True),
    ("Pad", (1, 3, 2, 2), (1, 3, 4, 4), {}, {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}, 3, False),
    ("Reshape", (1, 3, 2, 2), (1, 12), {}, {"shape": np.array([1, 12], np.int64)}, 1, False),
])
def test_thresholds_go_before_data_movement(op, in_shape, out_shape, attrs, extra, rows, moves):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        t, mt = _mt(rng, rows, 7)
        names = ["xn"] + [("" if v is None else k) for k, v in extra.items()]
        inits = {k: v for k, v in extra.items() if v is not None}
        inits["t"], inits["one"] = t, np.float32(1.0)
        nodes = [helper.make_node("Mul", ["x", "one"], ["xn"], name="computed"),  # (not the graph input itself)
                 helper.make_node(op, names, ["d"], name="move", **attrs), mt]
        proto = graph_model(nodes, {"x": list(in_shape)}, {"y": list(out_shape)}, inits)
        from finnlite import Model, PassManager, Stage

        m = Model(proto)
        m.infer_shapes()
        node = m.get_node_from_name("mt")
        set_real_thresholds(node, RealThresholds(fractions_of(t), np.zeros(t.shape, bool)))
        PassManager([Stage("s", [MoveDataMovementPastElementwise], fixpoint=True)]).run(m)
        assert ([n.op_type for n in m.graph][1:] == ["MultiThreshold", op]) == moves
        compare(proto, m, {"x": _ints(rng, in_shape, -14, 14)})


def test_the_inputs_layout_change_stays_first():
    t = np.array([[0.5, 1.5]], np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["d"], perm=[0, 2, 3, 1], name="move"),
             helper.make_node("MultiThreshold", ["d", "t"], ["y"], domain=QONNX, name="mt", out_dtype="UINT2")]
    proto = graph_model(nodes, {"x": [1, 2, 3, 3]}, {"y": [1, 3, 3, 2]}, {"t": t})
    m = apply(proto, [MoveDataMovementPastElementwise])
    assert [n.op_type for n in m.graph] == ["Transpose", "MultiThreshold"]


def test_monotone_functions_go_before_a_resize():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first"),
             helper.make_node("Resize", ["r", "", "s"], ["d"], mode="nearest", name="up"),
             helper.make_node("Sigmoid", ["d"], ["y"], name="f")]
    proto = graph_model(nodes, {"x": [1, 2, 2, 3]}, {"y": [1, 2, 4, 6]}, {"s": np.array([1, 1, 2, 2], np.float32)})
    m = apply(proto, [MoveDataMovementPastElementwise])
    assert [n.op_type for n in m.graph] == ["Relu", "Sigmoid", "Resize"]
    compare(proto, m, {"x": np.random.default_rng(0).normal(size=(1, 2, 2, 3))})
