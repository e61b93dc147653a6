"""The forms Brevitas' layerwise PTQ leaves between quantizers: a float ReLU of a layer's output read by a MaxPool,
a Concat or a join, the canonical ``Add(Mul(x, a), b)`` chain on both sides of a residual Add.

Rules: :class:`streamline.monotone_movement.MoveMonotonePastDataMovement` (a ReLU/Clip after the data movement
that follows it), :class:`streamline.reorder.MoveMulPastRelu` (its affine form, ``Relu(a·x + b) = a·Relu(x + b/a)``)
and :class:`streamline.reorder.MoveLinearPastEltwiseAdd` on canonical chains. Each is checked with the oracle on
random inputs over seeds (integer and float inputs, per-channel and negative constants, forks) and, end to end,
through the default pipeline against float64 execution of the original, with the MultiThreshold proofs of the
final check (a Relu behind a MaxPool in the original: :mod:`verify.proofs`).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from custom_ops.executor import Executor
from finnlite import Model
from streamline.absorb import ABSORB_PASSES
from streamline.collapse import COLLAPSE_PASSES
from streamline.exact import exact_value
from streamline.monotone_movement import MoveMonotonePastDataMovement
from streamline.pipeline import streamline_model
from streamline.real_thresholds import fractions_of
from streamline.reorder import REORDER_PASSES, MoveMulPastRelu
from tests.streamline.convert_helpers import graph_model as qgraph, init, quant_node
from tests.streamline.rulecheck import apply, compare, graph_model
from verify import ReferenceData, final_check
from finnlite.float_report import float_report


def _x(rng, shape, integer: bool):
    return (rng.integers(-20, 21, shape) if integer else rng.normal(0, 3, shape)).astype(np.float64)


def _bitwise(proto, model, inputs):
    """The rewritten model computes the same float32 values as the original (the rule moves no arithmetic)."""
    want = Executor(proto).run({k: v.astype(np.float32) for k, v in inputs.items()})
    got = Executor(model).run({k: v.astype(np.float32) for k, v in inputs.items()})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


MOVERS = {
    "maxpool": ([helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="d")],
                [1, 3, 4, 4], [1, 3, 2, 2]),
    "maxpool_padded": ([helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                         name="d")], [1, 3, 4, 4], [1, 3, 4, 4]),
    "transpose": ([helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1], name="d")],
                  [1, 3, 4, 4], [1, 4, 4, 3]),
    "flatten": ([helper.make_node("Flatten", ["r"], ["y"], axis=1, name="d")], [1, 3, 4, 4], [1, 48]),
    "depth_to_space": ([helper.make_node("DepthToSpace", ["r"], ["y"], blocksize=2, mode="CRD", name="d")],
                       [1, 4, 2, 2], [1, 1, 4, 4]),
}


@pytest.mark.parametrize("act", ["Relu", "Clip"])
@pytest.mark.parametrize("mover", sorted(MOVERS))
@pytest.mark.parametrize("seed", range(4))
def test_monotone_activation_moves_after_data_movement(act, mover, seed):
    rng = np.random.default_rng(seed)
    nodes, xs, ys = MOVERS[mover]
    inits = {}
    if act == "Clip":
        lo, hi = sorted(rng.normal(0, 2, 2).astype(np.float32))
        inits = {"lo": lo, "hi": hi}
        first = helper.make_node("Clip", ["x", "lo", "hi"], ["r"], name="act")
    else:
        first = helper.make_node("Relu", ["x"], ["r"], name="act")
    proto = graph_model([first] + nodes, {"x": xs}, {"y": ys}, inits)
    m = apply(proto, [MoveMonotonePastDataMovement])
    assert [n.op_type for n in m.graph] == [nodes[0].op_type, act]
    for integer in (True, False):
        _bitwise(proto, m, {"x": _x(rng, xs, integer)})


@pytest.mark.parametrize("seed", range(4))
def test_concat_of_one_activation_moves_and_of_two_stays(seed):
    rng = np.random.default_rng(seed)
    for same in (True, False):
        second = (helper.make_node("Relu", ["b"], ["rb"], name="rb") if same else
                  helper.make_node("Clip", ["b", "lo", "hi"], ["rb"], name="rb"))
        nodes = [helper.make_node("Relu", ["a"], ["ra"], name="ra"), second,
                 helper.make_node("Concat", ["ra", "rb"], ["y"], axis=1, name="cat")]
        proto = graph_model(nodes, {"a": [1, 2, 3, 3], "b": [1, 3, 3, 3]}, {"y": [1, 5, 3, 3]},
                            {"lo": np.float32(0), "hi": np.float32(6)})
        m = apply(proto, [MoveMonotonePastDataMovement])
        ops = [n.op_type for n in m.graph]
        assert ops == (["Concat", "Relu"] if same else ["Relu", "Clip", "Concat"]), ops
        inputs = {"a": _x(rng, [1, 2, 3, 3], False), "b": _x(rng, [1, 3, 3, 3], False)}
        _bitwise(proto, m, inputs)


def test_forked_activation_and_used_indices_stay():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="act"),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Flatten", ["r"], ["z"], name="flat")]
    proto = graph_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 2, 2], "z": [1, 32]}, {})
    m = apply(proto, [MoveMonotonePastDataMovement])
    assert [n.op_type for n in m.graph] == ["Relu", "MaxPool", "Flatten"]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="act"),
             helper.make_node("MaxPool", ["r"], ["y", "idx"], kernel_shape=[2, 2], strides=[2, 2], name="pool")]
    proto = graph_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 2, 2], "idx": [1, 2, 2, 2]}, {})
    m = apply(proto, [MoveMonotonePastDataMovement])
    assert [n.op_type for n in m.graph] == ["Relu", "MaxPool"]


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_affine_chain_moves_its_scale_past_relu(per_channel, seed):
    """Relu(Add(Mul(x, a), b)) read by a MaxPool → Mul(Relu(Add(x, b/a)), a); exact in real arithmetic."""
    rng = np.random.default_rng(seed)
    c = 3
    a = (rng.uniform(0.01, 2, (1, c, 1, 1)) if per_channel else np.array(rng.uniform(0.01, 2))).astype(np.float32)
    b = rng.normal(0, 2, (1, c, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="mul"),
             helper.make_node("Add", ["xa", "b"], ["xb"], name="add"),
             helper.make_node("Relu", ["xb"], ["r"], name="relu"),
             helper.make_node("AveragePool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool")]
    proto = graph_model(nodes, {"x": [1, c, 4, 4]}, {"y": [1, c, 2, 2]}, {"a": a, "b": b})
    m = apply(proto, [MoveMulPastRelu], fixpoint=False)
    assert [n.op_type for n in m.graph][:3] == ["Add", "Relu", "Mul"]
    add = next(iter(m.graph))
    exact = exact_value(add, add.inputs[1].const_value.numpy())  # b/a exactly; the float32 constant rounds it
    np.testing.assert_array_equal(exact, fractions_of(b) / fractions_of(a))
    compare(proto, m, {"x": _x(rng, [1, c, 4, 4], True)})
    compare(proto, m, {"x": _x(rng, [1, c, 4, 4], False)})


def test_affine_chain_with_a_negative_scale_stays_and_a_quantizer_absorbs_it_as_is():
    a = np.array([[[[0.5]], [[-0.25]]]], np.float32)
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"], name="mul"),
             helper.make_node("Add", ["xa", "b"], ["xb"], name="add"),
             helper.make_node("Relu", ["xb"], ["y"], name="relu")]
    proto = graph_model(nodes, {"x": [1, 2, 2, 2]}, {"y": [1, 2, 2, 2]}, {"a": a, "b": np.float32(0.5)})
    rule = MoveMulPastRelu()
    m = Model(proto)
    result = rule.run(m)
    assert not result.changed and any("non-positive" in x.reason for x in result.misses)


@pytest.mark.parametrize("ratio", [1, 2, 0.25])
@pytest.mark.parametrize("seed", range(4))
def test_join_of_canonical_chains(ratio, seed):
    """Add(Add(Mul(p, s1), b1), Add(Mul(q, s2), b2)) with s2/s1 a small ratio: the biases move past the join and
    the scales meet (equal, or integer multipliers), exactly."""
    rng = np.random.default_rng(seed)
    s1 = np.float32(2.0 ** -rng.integers(3, 8))
    s2 = np.float32(s1 * ratio)
    nodes = [helper.make_node("Mul", ["p", "s1"], ["ps"], name="m1"),
             helper.make_node("Add", ["ps", "b1"], ["pb"], name="a1"),
             helper.make_node("Mul", ["q", "s2"], ["qs"], name="m2"),
             helper.make_node("Add", ["qs", "b2"], ["qb"], name="a2"),
             helper.make_node("Add", ["pb", "qb"], ["y"], name="join")]
    inits = {"s1": s1, "s2": s2, "b1": rng.normal(0, 1, (1, 3, 1, 1)).astype(np.float32),
             "b2": rng.normal(0, 1, (1, 3, 1, 1)).astype(np.float32)}
    proto = graph_model(nodes, {"p": [1, 3, 2, 2], "q": [1, 3, 2, 2]}, {"y": [1, 3, 2, 2]}, inits)
    m = apply(proto, COLLAPSE_PASSES + REORDER_PASSES + ABSORB_PASSES,
              annotate={"p": "INT8", "q": "INT8"})
    join = next(n for n in m.graph if n.name == "join" or n.name.startswith("join"))
    assert all(v.producer() is None or v.producer().op_type == "Mul" and v.producer().inputs[1].const_value
               is not None and float(v.producer().inputs[1].const_value.numpy()) in (1.0, 2.0, 4.0)
               for v in join.inputs if v is not None), [n.op_type for n in m.graph]
    assert [n.op_type for n in m.graph][-2:] == ["Mul", "Add"]
    compare(proto, m, {"p": _x(rng, [1, 3, 2, 2], True), "q": _x(rng, [1, 3, 2, 2], True)})


def _layerwise_model(seed: int, concat: bool, po2: bool):
    """What layerwise PTQ exports: Quant(x) → Conv + Int32 bias → Relu → [Concat with a second such branch] →
    MaxPool → Quant (the next layer's input quantizer) → Conv → Quant(out)."""
    rng = np.random.default_rng(seed)

    def scale(lo, hi, shape=()):
        v = rng.uniform(lo, hi, shape)
        return np.asarray(2.0 ** np.round(np.log2(v)) if po2 else v, np.float32)

    s_in = scale(0.01, 0.03)
    inits = [init("s_in", s_in), init("z", np.float32(0)), init("b8", np.float32(8)), init("b32", np.float32(32)),
             init("b4", np.float32(4))]
    nodes = [quant_node(["x", "s_in", "z", "b8"], "xq", name="qin")]
    outs = []
    for k in range(2 if concat else 1):
        s_w = scale(0.01, 0.05, (4, 1, 1, 1))
        inits += [init(f"w{k}", rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)), init(f"sw{k}", s_w),
                  init(f"bias{k}", rng.normal(0, 0.5, 4).astype(np.float32)),
                  init(f"sb{k}", (s_in * s_w.ravel()).astype(np.float32))]
        nodes += [quant_node([f"w{k}", f"sw{k}", "z", "b8"], f"wq{k}", narrow=1, name=f"qw{k}"),
                  quant_node([f"bias{k}", f"sb{k}", "z", "b32"], f"bq{k}", name=f"qb{k}"),
                  helper.make_node("Conv", ["xq", f"wq{k}", f"bq{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}")]
        outs.append(f"r{k}")
    if concat:
        nodes.append(helper.make_node("Concat", outs, ["cat"], axis=1, name="cat"))
    nodes.append(helper.make_node("MaxPool", ["cat" if concat else outs[0]], ["mp"], kernel_shape=[2, 2],
                                  strides=[2, 2], name="pool"))
    ch = 8 if concat else 4
    inits += [init("s_mid", scale(0.02, 0.1)), init("w2", rng.normal(0, 0.3, (2, ch, 1, 1)).astype(np.float32)),
              init("sw2", scale(0.01, 0.05)), init("s_out", scale(0.05, 0.2))]
    nodes += [quant_node(["mp", "s_mid", "z", "b8"], "mq", signed=1, name="qmid"),
              quant_node(["w2", "sw2", "z", "b8"], "w2q", narrow=1, name="qw2"),
              helper.make_node("Conv", ["mq", "w2q"], ["c2"], name="conv2"),
              quant_node(["c2", "s_out", "z", "b4"], "y", name="qout")]
    return qgraph(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 2, 3, 3]}, inits)


@pytest.mark.parametrize("concat", [False, True])
@pytest.mark.parametrize("po2", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_layerwise_relu_before_pooling_streamlines_exactly(concat, po2, seed):
    model = Model(_layerwise_model(seed, concat, po2))
    ref = ReferenceData.random(model, n=16, seed=seed, low=-2.0, high=2.0)
    result = streamline_model(model)
    report = float_report(model, result.report)
    assert report.integer_only, report.text()
    final = final_check(ref, model)
    assert final.ok, final.summary()
    assert "Relu" not in model.op_histogram()


def test_the_proof_sees_a_wrong_threshold_behind_the_relu():
    """The MultiThreshold that absorbed the moved Relu is proved against the original's Quant(MaxPool(Relu(·)))
    (fitted where the Relu passes, checked through it everywhere): a threshold moved by one is found."""
    model = Model(_layerwise_model(1, False, False))
    ref = ReferenceData.random(model, n=16, seed=1, low=-2.0, high=2.0)
    streamline_model(model)
    mt = next(n for n in model.graph if n.op_type == "MultiThreshold" and "qmid" in n.name)
    t = mt.inputs[1].const_value.numpy().copy()
    c, k = 1, t.shape[1] // 2 + 3
    t[c if t.shape[0] > 1 else 0, k] += 1
    mt.replace_input_with(1, model.add_initializer(t.astype(np.float32), prefix="bad_thr"))
    final = final_check(ref, model)
    assert any("qmid" in i.quantizer for i in final.proof_issues), final.summary()


def _residual_float_model(seed: int, po2: bool):
    """Layerwise ResNet form: Quant(x) → two Convs with Int32 biases (scales s_in·s_w1, s_in·s_w2) → Relu of the
    first → residual Add of the two float outputs → Relu → GlobalAveragePool → output (no quantizer after it)."""
    rng = np.random.default_rng(seed)

    def scale(lo, hi):
        v = rng.uniform(lo, hi)
        return np.float32(2.0 ** np.round(np.log2(v)) if po2 else v)

    s_in = scale(0.01, 0.03)
    inits = [init("s_in", s_in), init("z", np.float32(0)), init("b8", np.float32(8)), init("b32", np.float32(32))]
    nodes = [quant_node(["x", "s_in", "z", "b8"], "xq", name="qin")]
    for k in range(2):
        s_w = scale(0.01, 0.05)
        inits += [init(f"w{k}", rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)), init(f"sw{k}", s_w),
                  init(f"bias{k}", rng.normal(0, 0.5, 4).astype(np.float32)), init(f"sb{k}", np.float32(s_in * s_w))]
        nodes += [quant_node([f"w{k}", f"sw{k}", "z", "b8"], f"wq{k}", narrow=1, name=f"qw{k}"),
                  quant_node([f"bias{k}", f"sb{k}", "z", "b32"], f"bq{k}", name=f"qb{k}"),
                  helper.make_node("Conv", ["xq", f"wq{k}", f"bq{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}")]
    nodes += [helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
              helper.make_node("Add", ["r0", "c1"], ["sum"], name="residual"),
              helper.make_node("Relu", ["sum"], ["r1"], name="relu1"),
              helper.make_node("GlobalAveragePool", ["r1"], ["y"], name="gap")]
    return qgraph(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 4, 1, 1]}, inits)


@pytest.mark.parametrize("seed", range(3))
def test_unrelated_scales_and_off_grid_biases_are_named_with_the_change(seed):
    """Float scales: the off-grid stem bias and the residual join of unrelated scales, read by a Relu and a pool
    (no quantizer), stay float and the report says where, why and what to change; power-of-two scales make the
    same graph integer-only. Both agree with float64 execution of the original."""
    for po2 in (False, True):
        model = Model(_residual_float_model(seed, po2))
        ref = ReferenceData.random(model, n=8, seed=seed, low=-2.0, high=2.0)
        result = streamline_model(model)
        text = float_report(model, result.report).text()
        final = final_check(ref, model)
        assert final.ok, final.summary()
        if po2:
            assert float_report(model, result.report).integer_only, text
            continue
        nodes = float_report(model, result.report).nodes
        roots = [n for n in nodes if not n.float_inputs]
        assert roots and all(n.cause for n in roots), text  # every float region starts at a named cause
        assert any("joins two branches" in n.cause and "change:" in n.cause for n in nodes), text
