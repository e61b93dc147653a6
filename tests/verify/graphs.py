"""Small graphs built in code, and rewrite helpers, for the verify tests."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN, make_model

F32 = TensorProto.FLOAT


class GraphBuilder:
    """Collects nodes, initializers and annotations; :meth:`model` returns a :class:`finnlite.Model`."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []
        self.datatypes: dict[str, str] = {}

    def input(self, name: str, shape: Sequence[int], datatype: str | None = None) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, F32, list(shape)))
        if datatype:
            self.datatypes[name] = datatype
        return name

    def output(self, name: str, shape: Sequence[int] | None = None) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, F32, list(shape) if shape else None))
        return name

    def init(self, name: str, value: Any, dtype: Any = np.float32) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, *, domain: str = "",
             datatype: str | None = None, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, domain=domain, **attrs))
        if datatype:
            self.datatypes[outputs[0]] = datatype
        return outputs[0]

    def quant(self, x: str, out: str, name: str, scale: Any, bits: int, signed: bool, *, zeropt: float = 0.0,
              rounding_mode: str = "ROUND", datatype: str | None = None) -> str:
        s = self.init(f"{name}_scale", scale)
        z = self.init(f"{name}_zeropt", zeropt)
        b = self.init(f"{name}_bits", float(bits))
        return self.node("Quant", [x, s, z, b], [out], name, domain=QONNX_DOMAIN, signed=int(signed), narrow=0,
                         rounding_mode=rounding_mode, datatype=datatype)

    def multithreshold(self, x: str, out: str, name: str, thresholds: Any, out_dtype: str, *,
                       out_scale: float = 1.0, annotate: bool = True) -> str:
        t = self.init(f"{name}_thresholds", thresholds)
        return self.node("MultiThreshold", [x, t], [out], name, domain=QONNX_DOMAIN, out_dtype=out_dtype,
                         out_scale=out_scale, datatype=out_dtype if annotate and out_scale == 1.0 else None)

    def proto(self) -> Any:
        graph = helper.make_graph(self.nodes, "test", self.inputs, self.outputs, initializer=self.inits)
        return make_model(graph)

    def model(self) -> Model:
        m = Model(self.proto())
        for name, dt in self.datatypes.items():
            m.set_tensor_datatype(name, dt)
        return m


# -- graphs ----------------------------------------------------------------------------------------------------
def _w(*shape: int) -> np.ndarray:
    """Deterministic random weights of ``shape`` in [-1, 1) (seeded by the shape, so independent of call order)."""
    seed = 0
    for d in shape:
        seed = seed * 131 + d
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


def add_relu() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 8]), g.input("y", [1, 8])
    g.node("Add", ["x", "y"], ["s"], "add0")
    g.node("Relu", ["s"], ["out"], "relu0")
    g.output("out", [1, 8])
    return g.model()


def int_multithreshold() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 4, 4, 4], datatype="UINT4")
    thresholds = np.tile(np.arange(1, 16, dtype=np.float32), (4, 1))
    g.multithreshold("x", "out", "mt0", thresholds, "UINT4")
    g.output("out", [1, 4, 4, 4])
    return g.model()


def matmul_bias_relu() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.init("W", _w(8, 8)), g.init("b", _w(8))
    g.node("MatMul", ["x", "W"], ["m"], "mm0")
    g.node("Add", ["m", "b"], ["z"], "bias0")
    g.node("Relu", ["z"], ["out"], "relu0")
    g.output("out", [1, 8])
    return g.model()


def mul_multithreshold(a: Any, op: str = "Mul") -> Model:
    g = GraphBuilder()
    g.input("x", [1, 4, 2, 2])
    g.init("a", a)
    g.node(op, ["x", "a"], ["m"], "mul0")
    g.multithreshold("m", "out", "mt0", np.tile(np.linspace(-1, 1, 7, dtype=np.float32), (4, 1)), "UINT3")
    g.output("out", [1, 4, 2, 2])
    return g.model()


def channel_mul_relu() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 4, 4, 4])
    g.init("c", np.array([0.5, 1.0, 2.0, 3.0], np.float32).reshape(1, 4, 1, 1))
    g.node("Mul", ["x", "c"], ["m"], "mul0")
    g.node("Relu", ["m"], ["out"], "relu0")
    g.output("out", [1, 4, 4, 4])
    return g.model()


def mul_pad(fill: float) -> Model:
    g = GraphBuilder()
    g.input("x", [1, 2, 3, 3])
    g.init("a", np.float32(2.0))
    g.init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1]), dtype=np.int64)
    g.init("fill", np.float32(fill))
    g.node("Mul", ["x", "a"], ["m"], "mul0")
    g.node("Pad", ["m", "pads", "fill"], ["out"], "pad0", mode="constant")
    g.output("out", [1, 2, 5, 5])
    return g.model()


def mul_add() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.init("a", np.float32(3.0)), g.init("b", _w(8))
    g.node("Mul", ["x", "a"], ["m"], "mul0")
    g.node("Add", ["m", "b"], ["out"], "add0")
    g.output("out", [1, 8])
    return g.model()


def add_conv() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 2, 4, 4])
    g.init("b", np.array([0.5, -0.25], np.float32).reshape(1, 2, 1, 1)), g.init("W", _w(3, 2, 3, 3))
    g.node("Add", ["x", "b"], ["a"], "add0")
    g.node("Conv", ["a", "W"], ["out"], "conv0", pads=[1, 1, 1, 1])
    g.output("out", [1, 3, 4, 4])
    return g.model()


def two_transposes() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 3, 3, 3])
    g.node("Transpose", ["x"], ["t0"], "tr0", perm=[0, 2, 1, 3])
    g.node("Transpose", ["t0"], ["t1"], "tr1", perm=[0, 1, 3, 2])
    g.node("Relu", ["t1"], ["out"], "relu0")
    g.output("out", [1, 3, 3, 3])
    return g.model()


def mul_matmul() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.init("a", np.linspace(0.5, 2.0, 8, dtype=np.float32)), g.init("W", _w(8, 8))
    g.node("Mul", ["x", "a"], ["m"], "mul0")
    g.node("MatMul", ["m", "W"], ["out"], "mm0")
    g.output("out", [1, 8])
    return g.model()


def two_ops(op: str) -> Model:
    g = GraphBuilder()
    g.input("x", [1, 8])
    g.init("a", np.float32(0.75)), g.init("b", np.float32(1.5))
    g.node(op, ["x", "a"], ["t"], f"{op.lower()}0")
    g.node(op, ["t", "b"], ["out"], f"{op.lower()}1")
    g.output("out", [1, 8])
    return g.model()


def quant_graph(bits: int = 3, signed: bool = False, relu: bool = False) -> Model:
    g = GraphBuilder()
    g.input("x", [1, 16])
    src = "x"
    if relu:
        src = g.node("Relu", ["x"], ["r"], "relu0")
    g.quant(src, "out", "q0", 0.25, bits, signed)
    g.output("out", [1, 16])
    return g.model()


def mul_maxpool() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 2, 4, 4])
    g.init("a", np.float32(-1.5))
    g.node("Mul", ["x", "a"], ["m"], "mul0")
    g.node("MaxPool", ["m"], ["out"], "pool0", kernel_shape=[2, 2], strides=[2, 2])
    g.output("out", [1, 2, 2, 2])
    return g.model()


def sub_graph() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 8]), g.input("y", [1, 8])
    g.node("Sub", ["x", "y"], ["out"], "sub0")
    g.output("out", [1, 8])
    return g.model()


def transpose_reshape() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 2, 3, 4])
    g.init("shape", np.array([1, -1]), dtype=np.int64)
    g.node("Transpose", ["x"], ["t"], "tr0", perm=[0, 2, 3, 1])
    g.node("Reshape", ["t", "shape"], ["out"], "flat0")
    g.output("out", [1, 24])
    return g.model()


def batchnorm() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 3, 2, 2])
    for name, value in (("gamma", [1.0, 0.5, 2.0]), ("beta", [0.1, -0.2, 0.3]), ("mean", [0.0, 0.5, -0.5]),
                        ("var", [0.05, 0.2, 0.5])):
        g.init(name, np.array(value, np.float32))
    g.node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["out"], "bn0", epsilon=0.1)
    g.output("out", [1, 3, 2, 2])
    return g.model()


def gemm() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 4])
    g.init("W", _w(4, 4)), g.init("C", _w(4))
    g.node("Gemm", ["x", "W", "C"], ["out"], "gemm0", transB=1)
    g.output("out", [1, 4])
    return g.model()


def clip_graph() -> Model:
    g = GraphBuilder()
    g.input("x", [1, 16])
    g.init("lo", np.float32(0.0)), g.init("hi", np.float32(6.0))
    g.node("Clip", ["x", "lo", "hi"], ["out"], "clip0")
    g.output("out", [1, 16])
    return g.model()


def numpy_weight_matmul() -> Model:
    m = matmul_bias_relu()
    # a writable numpy-backed initializer, set through onnx_ir (Model.set_initializer would freeze the array)
    m.graph.initializers["W"].const_value = ir.tensor(np.array(m.get_initializer("W")), name="W")
    assert m.get_initializer("W").flags.writeable
    return m


# -- rewrite helpers -----------------------------------------------------------------------------------------
def const(model: Model, v: ir.Value | None) -> np.ndarray | None:
    """The constant value of ``v`` (an initializer), or None."""
    if v is None:
        return None
    if v.const_value is not None:
        return v.const_value.numpy()
    return model.get_initializer(v.name)


def new_node(model: Model, op: str, inputs: Sequence[ir.Value], name: str, anchor: ir.Node, *, domain: str = "",
             attrs: Sequence[ir.Attr] = (), after: bool = False) -> ir.Value:
    """Insert a node before (or after) ``anchor`` with one fresh output; returns the output."""
    out = model.make_value(name)
    node = ir.Node(domain, op, list(inputs), attributes=list(attrs), outputs=[out], name=name)
    if after:
        model.graph.insert_after(anchor, node)
    else:
        model.graph.insert_before(anchor, node)
    return out


def take_over(model: Model, old: ir.Value, new: ir.Value) -> None:
    """Make every consumer of ``old`` read ``new``, and give ``new`` the name of ``old`` (tensors keep their names
    across rewrites, so the verifier can match them)."""
    name = old.name
    was_output = old.is_graph_output()
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name = model.make_new_valueinfo_name(name + "_replaced")
    new.name = name
    if was_output:
        model.index_value(new)
    model._reindex()  # noqa: SLF001


def float32_thresholds(scale: float, bits: int) -> np.ndarray:
    """The exact float32 thresholds of an unsigned ``bits``-bit ROUND Quant with float32 ``scale`` and zero point
    0: for each level m the least float32 x with round(fl32(x / s)) >= m (found by bisection over float32 bit
    patterns, as the convert stage does)."""
    s = np.float32(scale)
    qmax = 2**bits - 1

    def level(x: np.float32) -> float:
        return float(np.clip(np.round(np.float32(x) / s), 0, qmax))

    def key(x: float) -> int:  # monotone integer key of a float32
        i = int(np.array(x, np.float32).view(np.int32))
        return i if i >= 0 else -(i & 0x7FFFFFFF)

    def from_key(k: int) -> np.float32:
        i = k if k >= 0 else (-k) | -0x80000000
        return np.array(i, np.int32).view(np.float32)[()]

    out = []
    for m in range(1, qmax + 1):
        lo, hi = key(float((m - 1) * s)), key(float((m + 1) * s))
        while lo < hi:
            mid = (lo + hi) // 2
            if level(from_key(mid)) >= m:
                hi = mid
            else:
                lo = mid + 1
        out.append(from_key(lo))
    return np.array(out, np.float32)[None, :]
