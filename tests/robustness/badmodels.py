"""A small valid QONNX model with named nodes and tensors, and the ways to break it, for the bad-input tests.

:func:`good_model` is ``x[1, 8] → Quant 'in_quant' → MatMul 'fc1' (weight Quant 'w1_quant') → Relu 'relu1' →
Quant 'act_quant' → MatMul 'fc2' (weight Quant 'w2_quant') → y[1, 4]``. Every breaker takes the (copied) proto
and edits it in place, so that each test names exactly one problem.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from finnlite.core.compat import QONNX_DOMAIN, make_model

IN_FEATURES, HIDDEN, OUT_FEATURES = 8, 6, 4


def _const(name: str, value: np.ndarray | float, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _quant(name: str, x: str, out: str, prefix: str, scale: np.ndarray | float, bits: float, signed: bool,
           narrow: bool, inits: list[onnx.TensorProto]) -> onnx.NodeProto:
    inits += [_const(f"{prefix}_scale", scale), _const(f"{prefix}_zeropt", 0.0), _const(f"{prefix}_bits", bits)]
    return helper.make_node("Quant", [x, f"{prefix}_scale", f"{prefix}_zeropt", f"{prefix}_bits"], [out], name=name,
                            domain=QONNX_DOMAIN, signed=int(signed), narrow=int(narrow), rounding_mode="ROUND")


def good_model(seed: int = 0) -> onnx.ModelProto:
    """The valid model that every bad-input case starts from (module docstring)."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    w1 = rng.normal(size=(IN_FEATURES, HIDDEN))
    w2 = rng.normal(size=(HIDDEN, OUT_FEATURES))
    inits += [_const("w1", w1), _const("w2", w2)]
    nodes = [
        _quant("in_quant", "x", "x_q", "in", 2.0 ** -4, 8, True, False, inits),
        _quant("w1_quant", "w1", "w1_q", "w1q", (np.abs(w1).max(axis=0) / 3).astype(np.float32), 3, True, True,
               inits),
        helper.make_node("MatMul", ["x_q", "w1_q"], ["h1"], name="fc1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        _quant("act_quant", "r1", "a1", "act", 0.25, 4, False, False, inits),
        _quant("w2_quant", "w2", "w2_q", "w2q", 0.5, 4, True, True, inits),
        helper.make_node("MatMul", ["a1", "w2_q"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(nodes, "good", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, IN_FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, OUT_FEATURES])],
                              initializer=inits)
    model = make_model(graph)
    onnx.checker.check_model(model)
    return model


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    """The node called ``name``."""
    return next(n for n in model.graph.node if n.name == name)


def set_init(model: onnx.ModelProto, name: str, value: np.ndarray | float, dtype: type = np.float32) -> None:
    """Replace initializer ``name`` with ``value``."""
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            model.graph.initializer[i].CopyFrom(_const(name, value, dtype))
            return
    raise KeyError(name)


def set_attr(model: onnx.ModelProto, node_name: str, key: str, value: object) -> None:
    """Set (or replace) attribute ``key`` of node ``node_name``."""
    n = node(model, node_name)
    kept = [a for a in n.attribute if a.name != key]
    del n.attribute[:]
    n.attribute.extend(kept + [helper.make_attribute(key, value)])


def multithreshold_model(thresholds: np.ndarray, channels: int | None = None) -> onnx.ModelProto:
    """``x[1, C] → MultiThreshold 'mt' → y`` with the given ``(rows, N)`` thresholds (C = rows by default)."""
    rows, n = thresholds.shape
    c = rows if channels is None else channels
    mt = helper.make_node("MultiThreshold", ["x", "thresh"], ["y"], name="mt", domain=QONNX_DOMAIN,
                          out_dtype=f"UINT{max(1, int(np.ceil(np.log2(n + 1))))}")
    graph = helper.make_graph([mt], "mt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c])],
                              initializer=[_const("thresh", thresholds)])
    return make_model(graph)
