"""Builders and checks shared by the convert-stage tests: one-quantizer models, inputs that hit every tie, and a
comparison that is bitwise up to the sign of zero."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from custom_ops.executor import Executor
from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN, make_model
from streamline.convert import convert
from streamline.thresholds import float32_to_key

ROUNDING_MODES = ("ROUND", "HALF_EVEN", "CEIL", "FLOOR", "UP", "DOWN", "HALF_UP", "HALF_DOWN")


def init(name: str, arr: Any) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def vinfo(name: str, shape: Sequence[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None if shape is None else list(shape))


def quant_node(inputs: list[str], output: str, signed: int = 1, narrow: int = 0, mode: str = "ROUND",
               name: str = "quant", op: str = "Quant") -> onnx.NodeProto:
    if op == "BipolarQuant":
        return helper.make_node(op, inputs[:2], [output], domain=QONNX_DOMAIN, name=name)
    return helper.make_node(op, inputs, [output], domain=QONNX_DOMAIN, signed=signed, narrow=narrow,
                            rounding_mode=mode, name=name)


def graph_model(nodes: list[onnx.NodeProto], inputs: dict[str, Sequence[int]], outputs: dict[str, Any],
                inits: list[onnx.TensorProto], opset_custom: int = 2) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [vinfo(k, v) for k, v in inputs.items()],
                              [vinfo(k, v) for k, v in outputs.items()], initializer=inits)
    return make_model(graph, custom_opset=opset_custom)


def act_quant_model(x_shape: Sequence[int], scale: np.ndarray, zeropt: np.ndarray, bits: int, signed: int = 1,
                    narrow: int = 0, mode: str = "ROUND", pre: list[onnx.NodeProto] | None = None,
                    pre_inits: list[onnx.TensorProto] | None = None, op: str = "Quant") -> onnx.ModelProto:
    """x → [pre nodes, reading x and producing 'p'] → quantizer → y."""
    pre = pre or []
    src = "p" if pre else "x"
    inits = [init("s", np.asarray(scale, np.float32)), init("z", np.asarray(zeropt, np.float32)),
             init("b", np.float32(bits))] + list(pre_inits or [])
    nodes = pre + [quant_node([src, "s", "z", "b"], "y", signed, narrow, mode, op=op)]
    return graph_model(nodes, {"x": x_shape}, {"y": x_shape}, inits)


def converted(proto: onnx.ModelProto, **options: Any) -> tuple[Model, Any]:
    """The model converted by the convert stage (a fresh Model), and the pass manager's report."""
    m = Model(proto)
    report = convert(m, **options)
    return m, report


def run(model: Any, inputs: dict[str, np.ndarray], dtype: Any = np.float32, **kwargs: Any) -> dict[str, np.ndarray]:
    return Executor(model, dtype=dtype).run(inputs, **kwargs)


def assert_same(actual: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Equal bit for bit except that -0.0 and +0.0 count as equal (the only difference the conversion allows:
    a quantizer rounds inputs just below zero to -0.0, a MultiThreshold chain gives +0.0)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    same = float32_to_key(actual) == float32_to_key(expected)
    same |= np.isnan(actual) & np.isnan(expected)
    if not same.all():
        bad = np.argwhere(~same)[:5]
        raise AssertionError(f"{what}: {(~same).sum()} of {same.size} elements differ, e.g. at {bad.tolist()}: "
                             f"{actual[tuple(bad.T)].tolist()} vs {expected[tuple(bad.T)].tolist()}")


def op_types(model: Model) -> list[str]:
    return [n.op_type for n in model.graph]


def nudge(x: np.ndarray, steps: int) -> np.ndarray:
    """``x`` moved by ``steps`` float32 units in the last place (negative: downwards)."""
    x = np.asarray(x, dtype=np.float32)
    direction = np.float32(np.inf if steps > 0 else -np.inf)
    for _ in range(abs(steps)):
        x = np.nextafter(x, direction, dtype=np.float32)
    return x


def tie_values(scale_c: np.ndarray, zeropt_c: np.ndarray, lo: int, hi: int, extra: np.ndarray | None = None,
               rng: np.random.Generator | None = None) -> np.ndarray:
    """Per channel (rows), inputs that exercise every decision of a quantizer with levels ``lo..hi``: the exact
    float32 points nearest to (k + ½ − z)·s and (k − z)·s for every k around the range (ties for the nearest
    rounding modes, integer boundaries for the directed ones, the clip bounds), three float32 neighbours on each
    side, the float32 inputs whose float32 quotient x/s is exactly k + ½ where one exists, ``extra`` values and
    their neighbours (the thresholds), ±0.0, ±inf, huge and tiny values and random ones. Shape (C, L)."""
    rng = rng or np.random.default_rng(0)
    s = np.asarray(scale_c, np.float64).reshape(-1, 1)
    z = np.asarray(zeropt_c, np.float64).reshape(-1, 1)
    ks = np.arange(lo - 2, hi + 3, dtype=np.float64)[None, :]
    centers = np.concatenate([(ks + 0.5 - z) * s, (ks - z) * s], axis=1).astype(np.float32)
    cols = [centers]
    for d in (-3, -2, -1, 1, 2, 3):
        cols.append(nudge(centers, d))
    # float32 x with fl32(x / s) == k + 0.5 exactly, searched among the neighbours of the tie point
    s32 = np.asarray(scale_c, np.float32).reshape(-1, 1)
    near = np.stack([nudge(centers, d) for d in range(-4, 5)], axis=-1)
    with np.errstate(all="ignore"):
        q = near / s32[..., None]
        exact = np.where(q - np.floor(q) == 0.5, near, np.float32(0.0))
    cols.append(exact.reshape(exact.shape[0], -1))
    if extra is not None:
        e = np.asarray(extra, np.float32)
        e = np.broadcast_to(e, (s.shape[0], e.shape[-1]))
        e = np.where(np.isfinite(e), e, np.float32(0.0))
        cols += [e, nudge(e, -1), nudge(e, 1), nudge(e, -2), nudge(e, 2)]
    special = np.array([0.0, -0.0, np.inf, -np.inf, 3e38, -3e38, 1e-45, -1e-45, 1e-38, -1e-38], np.float32)
    cols.append(np.broadcast_to(special, (s.shape[0], special.size)))
    cols.append((rng.normal(size=(s.shape[0], 64)) * s * (hi - lo + 2)).astype(np.float32))
    return np.ascontiguousarray(np.concatenate(cols, axis=1), dtype=np.float32)


def place(values: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    """Lay a (C, L) array out as a rank-``rank`` tensor with C on ``axis`` (per tensor: C must be 1, L on the last
    axis) and L on the last axis (or the one before it when C is last); leading dims are 1."""
    c, n = values.shape
    if axis is None:
        return values.reshape((1,) * (rank - 1) + (c * n,))
    shape = [1] * rank
    shape[axis] = c
    other = rank - 1 if axis != rank - 1 else rank - 2
    shape[other] = n
    moved = values if axis < other else values.T
    return np.ascontiguousarray(moved.reshape(shape))


def thresholds_of(model: Model) -> list[np.ndarray]:
    """The threshold arrays of every MultiThreshold node."""
    return [model.get_initializer(n.inputs[1].name) for n in model.graph if n.op_type == "MultiThreshold"]
