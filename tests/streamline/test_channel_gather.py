"""Channel permutations (streamline.channel_gather): a shuffle collapses to one Gather, moves past channel-wise ops
and vanishes into the next channel-mixing layer's weights; each checked by the oracle over several seeds."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from streamline.channel_gather import (AbsorbChannelGatherIntoWeights, CollapseDataMovement,
                                       MoveChannelGatherPastChannelwise, single_axis_gather)
from tests.streamline.rulecheck import apply, compare, graph_model

SEEDS = range(4)


def _ints(rng, shape, lo=-8, hi=7):
    return rng.integers(lo, hi + 1, size=shape).astype(np.float64)


def _shuffle_nodes(x: str, y: str, n: int, c: int, g: int, h: int, w: int) -> tuple[list, dict]:
    """ShuffleNet's shuffle as torchvision writes it: view (n, g, c/g, h, w), transpose 1 and 2, view back."""
    nodes = [helper.make_node("Reshape", [x, "s5"], ["r5"], name="split"),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4], name="swap"),
             helper.make_node("Reshape", ["t5", "s4"], [y], name="merge")]
    return nodes, {"s5": np.array([n, g, c // g, h, w], np.int64), "s4": np.array([n, c, h, w], np.int64)}


@pytest.mark.parametrize("groups", [2, 4])
def test_a_channel_shuffle_is_one_gather(groups):
    nodes, inits = _shuffle_nodes("x", "y", 2, 8, groups, 3, 3)
    proto = graph_model(nodes, {"x": [2, 8, 3, 3]}, {"y": [2, 8, 3, 3]}, inits)
    m = apply(proto, [CollapseDataMovement])
    assert [n.op_type for n in m.graph] == ["Gather"]
    compare(proto, m, {"x": _ints(np.random.default_rng(groups), (2, 8, 3, 3))})


def test_a_chain_that_undoes_itself_goes_and_other_chains_stay():
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 3, 1], name="t1"),
             helper.make_node("Reshape", ["a", "s"], ["b"], name="r"),
             helper.make_node("Reshape", ["b", "s2"], ["c"], name="r2"),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 3, 1, 2], name="t2")]
    inits = {"s": np.array([1, 12, 5], np.int64), "s2": np.array([1, 3, 4, 5], np.int64)}
    proto = graph_model(nodes, {"x": [1, 5, 3, 4]}, {"y": [1, 5, 3, 4]}, inits)
    m = apply(proto, [CollapseDataMovement])
    assert [n.op_type for n in m.graph] in ([], ["Identity"])
    compare(proto, m, {"x": _ints(np.random.default_rng(0), (1, 5, 3, 4))})
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 3, 1], name="t1"),
             helper.make_node("Reshape", ["a", "s"], ["y"], name="r")]
    proto = graph_model(nodes, {"x": [1, 5, 3, 4]}, {"y": [1, 12, 5]}, {"s": np.array([1, 12, 5], np.int64)})
    m = apply(proto, [CollapseDataMovement])
    assert [n.op_type for n in m.graph] == ["Transpose", "Reshape"]  # not one axis: a real layout change


def test_single_axis_gather_reads_the_map():
    src = np.arange(24).reshape(2, 3, 4)[:, [2, 0, 1], :].ravel().reshape(2, 3, 4)
    axis, idx = single_axis_gather(src, [2, 3, 4])
    assert axis == 1 and list(idx) == [2, 0, 1]
    assert single_axis_gather(np.arange(24).reshape(2, 3, 4).transpose(0, 1, 2)[:, ::-1, ::-1].copy(),
                              [2, 3, 4]) is None


@pytest.mark.parametrize("op,attrs", [("Conv", dict(group=6, pads=[1, 1, 1, 1])),
                                      ("MaxPool", dict(kernel_shape=[2, 2])),
                                      ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
                                      ("GlobalAveragePool", {})])
def test_a_channel_gather_passes_channelwise_ops(op, attrs):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        perm = rng.permutation(6)
        inits = {"idx": perm.astype(np.int64)}
        inputs = ["g"]
        if op == "Conv":
            inits["w"] = rng.integers(-3, 4, size=(6, 1, 3, 3)).astype(np.float32)
            inputs.append("w")
        nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=1, name="gather"),
                 helper.make_node(op, inputs, ["y"], name="op", **attrs)]
        proto = graph_model(nodes, {"x": [1, 6, 4, 4]}, {}, inits)
        proto.graph.output.append(helper.make_tensor_value_info("y", 1, None))
        m = apply(proto, [MoveChannelGatherPastChannelwise])
        assert [n.op_type for n in m.graph] == [op, "Gather"]
        compare(proto, m, {"x": _ints(rng, (1, 6, 4, 4))}, rtol=1e-6)


@pytest.mark.parametrize("op,group,idx", [("Conv", 1, "perm"), ("Conv", 2, "perm"), ("Conv", 1, "repeat"),
                                          ("MatMul", 1, "perm"), ("MatMul", 1, "repeat")])
def test_a_channel_gather_vanishes_into_the_next_layer(op, group, idx):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        c = 6
        indices = rng.permutation(c) if idx == "perm" else rng.integers(0, c, size=c + 2)
        k = len(indices)
        if op == "Conv":
            w = rng.integers(-3, 4, size=(4, k // group, 3, 3)).astype(np.float32)
            nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=1, name="gather"),
                     helper.make_node("Conv", ["g", "w"], ["y"], group=group, pads=[1, 1, 1, 1], name="conv")]
            shape = [1, c, 5, 5]
        else:
            w = rng.integers(-3, 4, size=(k, 3)).astype(np.float32)
            nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=-1, name="gather"),
                     helper.make_node("MatMul", ["g", "w"], ["y"], name="mm")]
            shape = [2, c]
        proto = graph_model(nodes, {"x": shape}, {}, {"idx": indices.astype(np.int64), "w": w})
        proto.graph.output.append(helper.make_tensor_value_info("y", 1, None))
        m = apply(proto, [AbsorbChannelGatherIntoWeights])
        assert [n.op_type for n in m.graph] == [op]
        if op == "Conv":
            assert all(a.value == 1 for k2, a in m.graph.node(0).attributes.items() if k2 == "group")
        compare(proto, m, {"x": _ints(rng, shape)})


def test_a_depthwise_conv_is_passed_not_absorbed_into():
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=1, name="gather"),
             helper.make_node("Conv", ["g", "w"], ["y"], group=4, name="dw")]
    proto = graph_model(nodes, {"x": [1, 4, 3, 3]}, {}, {"idx": np.array([1, 0, 3, 2], np.int64),
                                                         "w": rng.integers(-3, 4, (4, 1, 2, 2)).astype(np.float32)})
    proto.graph.output.append(helper.make_tensor_value_info("y", 1, None))
    m = apply(proto, [AbsorbChannelGatherIntoWeights])
    assert [n.op_type for n in m.graph] == ["Gather", "Conv"]
