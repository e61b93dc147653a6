"""Small models built in code for the core tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from finnlite.core.compat import make_model


def chain_model(n: int = 4, width: int = 8) -> onnx.ModelProto:
    """x -> Add(c0) -> Mul(c1) -> Add(c2) ... (n nodes), shapes [1, width]."""
    nodes, inits = [], []
    prev = "x"
    for i in range(n):
        op = "Add" if i % 2 == 0 else "Mul"
        c = f"c{i}"
        inits.append(numpy_helper.from_array(np.full([width], 1.0 + i / 10, np.float32), c))
        out = f"t{i}" if i < n - 1 else "y"
        nodes.append(helper.make_node(op, [prev, c], [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], initializer=inits)
    return make_model(graph, custom_opset=None)


def fork_join_model() -> onnx.ModelProto:
    """x -> Relu(a) -> {Mul(b, c), Add(d, c)} -> Add(b, d) = y."""
    c = numpy_helper.from_array(np.array([2.0], np.float32), "c")
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Mul", ["a", "c"], ["b"], name="mul"),
             helper.make_node("Add", ["a", "c"], ["d"], name="add"),
             helper.make_node("Add", ["b", "d"], ["y"], name="join")]
    graph = helper.make_graph(nodes, "forkjoin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[c])
    return make_model(graph, custom_opset=None)


def add_chain(n: int, width: int = 8) -> onnx.ModelProto:
    """x -> Add(1) -> Add(1) ... (n Adds) = y."""
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        inits.append(numpy_helper.from_array(np.ones([width], np.float32), f"k{i}"))
        out = "y" if i == n - 1 else f"a{i}"
        nodes.append(helper.make_node("Add", [prev, f"k{i}"], [out], name=f"add{i}"))
        prev = out
    graph = helper.make_graph(nodes, "adds", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], initializer=inits)
    return make_model(graph, custom_opset=None)
