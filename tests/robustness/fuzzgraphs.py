"""Random Brevitas-style QONNX graphs for the fuzz test, drawn with hypothesis and built in code.

A graph is an input quantizer followed by a few *blocks*, chosen at random:

* ``layer`` — a quantized MatMul/Gemm (MLP) or Conv (grouped or depthwise, with padding and stride) whose weight goes
  through a Quant (1..8 bits, signed or not, narrow or not, per-tensor or per-output-channel scales, powers of two
  or arbitrary), an optional BatchNormalization (random gamma of either sign), an activation (ReLU, HardTanh as
  Clip, an Identity node, or none) and an activation Quant (1..8 bits, signed or not, narrow or not, per-tensor or
  per-channel scale);
* ``maxpool`` — a MaxPool (conv graphs);
* ``residual`` — a fork into a layer and a skip branch (identity or another layer) joined by an Add, with equal or
  unequal scales on the two branches, then re-quantized;
* ``concat`` — a fork into two branches concatenated along the channels, optionally re-quantized.

The graph ends with a layer whose activation quantizer may be left out (a float output, as a classifier's logits);
in a conv graph it may follow a Flatten or Reshape (a CNN's classifier head).
Everything stays tiny (batch ≤ 3, ≤ 8 channels, ≤ 6×6 pixels), so that a graph streamlines and runs in tens of ms.
Weights, BatchNorm statistics and arbitrary weight-scale factors come from a numpy generator seeded by a drawn
integer (see :meth:`_Builder.scales` for why); the structure, bit widths, signs and the other scales are drawn
directly, so that hypothesis shrinks a failure to the fewest, simplest blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from finnlite.core.compat import QONNX_DOMAIN, make_model

Draw = Callable[[st.SearchStrategy[Any]], Any]

MAX_CHANNELS = 8
#: metadata keys under which a saved graph keeps what its replay needs
SEED_KEY, RANGE_KEY, DESCRIPTION_KEY = "fuzz_input_seed", "fuzz_input_range", "fuzz_description"


@dataclass
class Tensor:
    """A tensor of the graph being built: its name, shape (NCHW or NC) and, for a quantizer's output, the scale
    (0-d, or one per channel)."""

    name: str
    shape: tuple[int, ...]
    scale: np.ndarray | None = None

    @property
    def channels(self) -> int:
        return self.shape[1]

    @property
    def conv(self) -> bool:
        return len(self.shape) == 4


@dataclass
class FuzzGraph:
    """A drawn graph: the model, the seed and range of its reference inputs, and what it is made of."""

    proto: onnx.ModelProto
    input_seed: int
    input_range: tuple[float, float]
    blocks: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return f"FuzzGraph(input_seed={self.input_seed}, blocks=[\n  " + ",\n  ".join(self.blocks) + "])"

    def with_metadata(self) -> onnx.ModelProto:
        """The model with the input seed, range and description in its metadata (to save and replay it)."""
        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        lo, hi = self.input_range
        for key, value in ((SEED_KEY, str(self.input_seed)), (RANGE_KEY, f"{lo},{hi}"),
                           (DESCRIPTION_KEY, "; ".join(self.blocks))):
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        return proto


def from_saved(proto: onnx.ModelProto) -> FuzzGraph:
    """The :class:`FuzzGraph` of a model saved with :meth:`FuzzGraph.with_metadata`."""
    meta = {p.key: p.value for p in proto.metadata_props}
    lo, hi = (float(v) for v in meta[RANGE_KEY].split(","))
    return FuzzGraph(proto, int(meta[SEED_KEY]), (lo, hi), meta.get(DESCRIPTION_KEY, "").split("; "))


class _Builder:
    """Collects nodes and initializers with fresh names; ``rng`` draws weights and BatchNorm statistics."""

    def __init__(self, draw: Draw, rng: np.random.Generator) -> None:
        self.draw, self.rng = draw, rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.blocks: list[str] = []
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, value: Any, prefix: str, dtype: Any = np.float32) -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: list[str], prefix: str, domain: str = "", **attrs: Any) -> str:
        out = self.fresh(f"{prefix}_out")
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh(prefix), domain=domain, **attrs))
        return out

    # -- drawn parameters ----------------------------------------------------------------------------------------
    def scales(self, count: int, base: float, per_channel_ok: bool = True, weights: bool = False) -> np.ndarray:
        """One scale (a 0-d array) or ``count`` of them, each a power of two or an arbitrary float32 near ``base``.

        For ``weights`` (``base`` = max|w| / qmax) an arbitrary scale is ``base`` times a factor from the seeded
        generator, not a drawn one: hypothesis favours round factors such as 2, which would put the largest weight
        exactly on a rounding tie (max|w| / s = qmax / 2), where float32 and real arithmetic legitimately disagree
        (a weight is quantized once, in float32, when the convert stage folds it)."""
        per_channel = per_channel_ok and count > 1 and self.draw(st.booleans())
        n = count if per_channel else 1
        if self.draw(st.booleans()):
            exps = self.draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n))
            values = np.float32(base) * np.exp2(np.asarray(exps, np.float32))
            values = np.exp2(np.round(np.log2(values)))  # exact powers of two
        elif weights:
            values = self.rng.uniform(0.5, 2.0, n) * base
        else:
            values = np.asarray(self.draw(st.lists(st.floats(0.25, 4.0, width=32), min_size=n, max_size=n)),
                                np.float32) * np.float32(base)
        values = values.astype(np.float32)
        return values if per_channel else values.reshape(())

    def quant(self, x: Tensor, scale: np.ndarray, bits: int, signed: bool, narrow: bool, prefix: str,
              channel_axis: int = 1) -> Tensor:
        """Quant(x) with ``scale`` (0-d or one per channel along ``channel_axis``)."""
        shaped = scale
        if scale.ndim:
            shape = [1] * len(x.shape)
            shape[channel_axis] = scale.size
            shaped = scale.reshape(shape)
        out = self.node("Quant", [x.name, self.const(shaped, f"{prefix}_scale"), self.const(0.0, f"{prefix}_zeropt"),
                                  self.const(float(bits), f"{prefix}_bits")],
                        prefix, domain=QONNX_DOMAIN, signed=int(signed), narrow=int(narrow), rounding_mode="ROUND")
        return Tensor(out, x.shape, scale)

    def act_quant(self, x: Tensor, act: str, tag: str, scale: np.ndarray | None = None) -> tuple[Tensor, str]:
        """The activation quantizer after ``act`` (relu: unsigned; hardtanh / none: signed), with a drawn scale or
        the given one."""
        bits = self.draw(st.integers(1, 8))
        signed = act != "relu" and (bits > 1 or self.draw(st.booleans()))
        narrow = self.draw(st.booleans()) if bits > 1 else False
        levels = 2 ** (bits - 1) if signed else 2 ** bits - 1
        if scale is None:
            scale = self.scales(x.channels, 2.0 / max(levels, 1))
        q = self.quant(x, scale, bits, signed, narrow, f"{tag}_q")
        kind = "per-channel" if scale.ndim else "per-tensor"
        return q, f"{'INT' if signed else 'UINT'}{bits}{' narrow' if narrow else ''} {kind}"

    # -- blocks ----------------------------------------------------------------------------------------------------
    def weight_layer(self, x: Tensor, cout: int, tag: str, same_spatial: bool = False) -> tuple[Tensor, str]:
        """A quantized MatMul/Gemm or Conv from ``x`` to ``cout`` channels (a depthwise Conv keeps ``x``'s)."""
        bits = self.draw(st.integers(1, 8))
        signed = bits == 1 or self.draw(st.integers(0, 4)) > 0
        narrow = self.draw(st.booleans()) if bits > 1 else False
        qmax = 2 ** (bits - 1) - 1 if signed and bits > 1 else (1 if bits == 1 else 2 ** bits - 1)
        cin = x.channels
        if x.conv:
            depthwise = cin > 1 and self.draw(st.integers(0, 3)) == 0
            cout = cin if depthwise else cout
            group = cin if depthwise else 1
            if same_spatial:  # 1x1, or 3x3 with padding 1
                k = self.draw(st.sampled_from([1, 3]))
            else:
                k = self.draw(st.integers(1, min(3, *x.shape[2:])))
            pad = (k - 1) // 2 if same_spatial else self.draw(st.integers(0, k - 1))
            stride = 1 if same_spatial else self.draw(st.integers(1, 2))
            w_shape = (cout, cin // group, k, k)
            fan_in = cin // group * k * k
        else:
            gemm = self.draw(st.booleans())
            w_shape = (cout, cin) if gemm else (cin, cout)
            fan_in = cin
        w = self.rng.normal(0, 1 / np.sqrt(fan_in), w_shape).astype(np.float32)
        if not signed:
            w = np.abs(w)
        w_axis = 1 if not x.conv and not gemm else 0
        scale = self.scales(cout, float(np.abs(w).max()) / qmax, weights=True)
        wq = self.quant(Tensor(self.const(w, f"{tag}_w"), w_shape), scale, bits, signed, narrow, f"{tag}_wq",
                        channel_axis=w_axis)
        desc = f"{'INT' if signed else 'UINT'}{bits}{' narrow' if narrow else ''} weights " \
               f"{'per-channel' if scale.ndim else 'per-tensor'}"
        if x.conv:
            out = self.node("Conv", [x.name, wq.name], f"{tag}_conv", kernel_shape=[k, k], pads=[pad] * 4,
                            strides=[stride] * 2, group=group)
            h, w_ = ((d + 2 * pad - k) // stride + 1 for d in x.shape[2:])
            return Tensor(out, (x.shape[0], cout, h, w_)), \
                f"{'dw' if depthwise else ''}conv{k}x{k}/s{stride}/p{pad} {cin}->{cout}, {desc}"
        if gemm:
            out = self.node("Gemm", [x.name, wq.name], f"{tag}_gemm", transB=1)
        else:
            out = self.node("MatMul", [x.name, wq.name], f"{tag}_matmul")
        return Tensor(out, (x.shape[0], cout)), f"{'gemm' if gemm else 'matmul'} {cin}->{cout}, {desc}"

    def batchnorm(self, x: Tensor, tag: str) -> Tensor:
        c = x.channels
        gamma = self.rng.uniform(0.3, 1.5, c) * self.rng.choice([-1.0, 1.0], c, p=[0.3, 0.7])
        params = [gamma, self.rng.normal(0, 0.3, c), self.rng.normal(0, 0.3, c), self.rng.uniform(0.3, 2.0, c)]
        names = [self.const(p, f"{tag}_bn{i}") for i, p in enumerate(params)]
        return Tensor(self.node("BatchNormalization", [x.name, *names], f"{tag}_bn", epsilon=1e-5), x.shape)

    def layer(self, x: Tensor, cout: int, tag: str, quantize: bool = True, same_spatial: bool = False,
              act_scale: np.ndarray | None = None) -> tuple[Tensor, str]:
        """weight layer → [BatchNorm] → [ReLU | HardTanh] → [activation Quant] (with ``act_scale`` if given)."""
        y, desc = self.weight_layer(x, cout, tag, same_spatial)
        if self.draw(st.booleans()):
            y = self.batchnorm(y, tag)
            desc += ", bn"
        if not quantize:
            return y, desc + ", float out"
        act = self.draw(st.sampled_from(["relu", "hardtanh", "identity", "none"]))
        if act == "relu":
            y = Tensor(self.node("Relu", [y.name], f"{tag}_relu"), y.shape)
        elif act == "identity":
            y = Tensor(self.node("Identity", [y.name], f"{tag}_identity"), y.shape)
        elif act == "hardtanh":
            bound = self.draw(st.sampled_from([0.5, 1.0, 2.0]))
            y = Tensor(self.node("Clip", [y.name, self.const(-bound, f"{tag}_lo"), self.const(bound, f"{tag}_hi")],
                                 f"{tag}_hardtanh"), y.shape)
        y, qdesc = self.act_quant(y, act, tag, act_scale)
        return y, f"{desc}, {act}, act {qdesc}"

    def maxpool(self, x: Tensor, tag: str) -> tuple[Tensor, str]:
        k = self.draw(st.integers(1, min(3, *x.shape[2:])))
        stride = self.draw(st.integers(1, min(2, k)))
        out = self.node("MaxPool", [x.name], f"{tag}_maxpool", kernel_shape=[k, k], strides=[stride, stride])
        h, w = ((d - k) // stride + 1 for d in x.shape[2:])
        return Tensor(out, (*x.shape[:2], h, w), x.scale), f"maxpool{k}x{k}/s{stride}"

    def flatten(self, x: Tensor, tag: str) -> tuple[Tensor, str]:
        """[N, C, H, W] → [N, C·H·W] by a Flatten or a Reshape (a CNN's classifier head follows)."""
        features = int(np.prod(x.shape[1:]))
        if self.draw(st.booleans()):
            out = self.node("Flatten", [x.name], f"{tag}_flatten", axis=1)
            kind = "flatten"
        else:
            out = self.node("Reshape", [x.name, self.const([x.shape[0], -1], f"{tag}_shape", np.int64)],
                            f"{tag}_reshape")
            kind = "reshape"
        scale = x.scale if x.scale is not None and x.scale.ndim == 0 else None
        return Tensor(out, (x.shape[0], features), scale), f"{kind} to {features} features"

    def residual(self, x: Tensor, tag: str) -> tuple[Tensor, str]:
        """x → layer ─┐
           x → skip  ─┴→ Add → [ReLU] → Quant (skip: x itself or a second layer), the two branches with equal or
        with unequal scales."""
        equal = self.draw(st.booleans())
        if self.draw(st.booleans()):
            b, db = x, "identity"
            a, da = self.layer(x, x.channels, f"{tag}a", same_spatial=True, act_scale=x.scale if equal else None)
        else:
            a, da = self.layer(x, x.channels, f"{tag}a", same_spatial=True)
            b, db = self.layer(x, x.channels, f"{tag}b", same_spatial=True, act_scale=a.scale if equal else None)
        same = a.scale is not None and b.scale is not None and np.array_equal(a.scale, b.scale)
        da += ", equal scales" if same else ""
        y = Tensor(self.node("Add", [a.name, b.name], f"{tag}_add"), x.shape)
        act = self.draw(st.sampled_from(["relu", "none"]))
        if act == "relu":
            y = Tensor(self.node("Relu", [y.name], f"{tag}_relu"), y.shape)
        y, dq = self.act_quant(y, act, f"{tag}_join")
        return y, f"residual[{da} | {db}] add, {act}, act {dq}"

    def concat(self, x: Tensor, tag: str) -> tuple[Tensor, str]:
        """x → branch a ─┐
           x → branch b ─┴→ Concat(channels) → [Quant] (a branch is a layer or x itself)."""
        room = MAX_CHANNELS - x.channels
        ca = self.draw(st.integers(1, max(1, min(4, room))))
        a, da = self.layer(x, ca, f"{tag}a", same_spatial=True)
        if self.draw(st.booleans()) and x.channels + ca <= MAX_CHANNELS:
            b, db = x, "identity"
        else:
            b, db = self.layer(x, self.draw(st.integers(1, 4)), f"{tag}b", same_spatial=True)
        shape = (x.shape[0], a.channels + b.channels, *x.shape[2:])
        y = Tensor(self.node("Concat", [a.name, b.name], f"{tag}_concat", axis=1), shape)
        if self.draw(st.booleans()):
            y, dq = self.act_quant(y, "none", f"{tag}_cat")
            return y, f"concat[{da} | {db}], act {dq}"
        return y, f"concat[{da} | {db}]"


@st.composite
def fuzz_graphs(draw: Draw, max_blocks: int = 3) -> FuzzGraph:
    """A random QONNX graph (module docstring)."""
    b = _Builder(draw, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    conv = draw(st.booleans())
    batch = draw(st.integers(1, 3))
    if conv:
        shape: tuple[int, ...] = (batch, draw(st.integers(1, 4)), draw(st.integers(2, 6)), draw(st.integers(2, 6)))
    else:
        shape = (batch, draw(st.integers(1, 8)))
    x = Tensor("x", shape)
    in_bits = draw(st.integers(2, 8))
    in_signed = draw(st.booleans())
    in_narrow = draw(st.booleans())
    levels = 2 ** (in_bits - 1) if in_signed else 2 ** in_bits - 1
    y = b.quant(x, b.scales(1, 1.0 / levels, per_channel_ok=False), in_bits, in_signed, in_narrow, "inq")
    b.blocks.append(f"input {shape}, INT{in_bits}" if in_signed else f"input {shape}, UINT{in_bits}")
    kinds = ["layer", "residual", "concat"] + (["maxpool"] if conv else [])
    for i in range(draw(st.integers(0, max_blocks))):
        kind = draw(st.sampled_from(kinds))
        tag = f"b{i}"
        if kind == "maxpool" and min(y.shape[2:]) >= 2:
            y, desc = b.maxpool(y, tag)
        elif kind == "residual":
            y, desc = b.residual(y, tag)
        elif kind == "concat" and y.channels < MAX_CHANNELS:
            y, desc = b.concat(y, tag)
        else:
            y, desc = b.layer(y, draw(st.integers(1, MAX_CHANNELS)), tag)
        b.blocks.append(desc)
    if conv and draw(st.booleans()):
        y, desc = b.flatten(y, "head")
        b.blocks.append(desc)
    y, desc = b.layer(y, draw(st.integers(1, MAX_CHANNELS)), "out", quantize=draw(st.booleans()))
    b.blocks.append(desc)
    graph = helper.make_graph(b.nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(y.name, TensorProto.FLOAT, list(y.shape))],
                              initializer=b.inits)
    model = make_model(graph)
    onnx.checker.check_model(model, full_check=True)
    low = -draw(st.sampled_from([1.0, 2.0])) if in_signed else 0.0
    return FuzzGraph(model, draw(st.integers(0, 2**16)), (low, draw(st.sampled_from([1.0, 2.0]))), b.blocks)
