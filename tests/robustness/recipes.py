"""The two recipes of the reproducers (the repro folder's README), built in code with random parameters.

* :func:`cifar_resnet` — a CIFAR-style ResNet: an 8-bit signed input quantizer, a 3×3 stem with 8-bit weights,
  stages of basic blocks (3×3 convolutions with 4-bit weights, BatchNorm, ReLU, 4-bit quantizers; a 1×1 stride-2
  downsample shortcut with BatchNorm where the shape changes) whose residual Add joins two summands with *distinct*
  signed quantizers, a float global average pool before an 8-bit requantizer and a classifier with 8-bit weights.
  BatchNorm statistics are random as in the README (running mean ~ N(0, 0.5²), running variance ~ U(0.2, 2.2),
  gamma ~ U(0.5, 1.5), beta ~ N(0, 0.3²)). ``tie=True`` plants the reproducer's pattern: one output channel of a
  block's first convolution whose quantized weights are all 0, so that its pre-activation is the BatchNorm's
  constant on every position of every sample, chosen so that the next quantizer's ``x/s`` is exactly a
  half-integer in float32 but not in real arithmetic (float32 rounds it to the even level, real arithmetic to the
  other): a float32 near-tie on every sample.
* :func:`proxyless_net` — the ProxylessNAS pattern: no input quantizer (the first convolution, stride 2 with 8-bit
  weights, reads the float image, whose realistic range is [-2.5, 2.5]), BatchNorm, ReLU and a 4-bit quantizer;
  a depthwise 3×3 and a pointwise 1×1 convolution with 4-bit weights; a linear (signed) bottleneck quantizer; a float
  global average pool, an 8-bit requantizer and a classifier with 8-bit weights.
  :func:`float_layer_tie_sample` makes an input on which the *streamlined* model's float first layer meets a near-tie
  of its own (its float32 accumulator rounds across a threshold that the exact one does not reach).

Every weight goes through a Quant node (Brevitas' per-channel scales ``max|w| / qmax``); everything is small (8×8
or 16×16 images, at most 16 channels) so that a model streamlines and is checked in a fraction of a second.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from finnlite import Model
from finnlite.core.compat import QONNX_DOMAIN, make_model


class _Net:
    """Nodes and initializers of a graph being built, with a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def init(self, prefix: str, value: Any) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], prefix: str, **attrs: Any) -> str:
        out = self.name(prefix)
        domain = QONNX_DOMAIN if op == "Quant" else ""
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", domain=domain, **attrs))
        return out

    def quant(self, x: str, scale: Any, bits: int, signed: bool, narrow: bool = False) -> str:
        ins = [x, self.init("s", scale), self.init("z", 0.0), self.init("b", float(bits))]
        return self.node("Quant", ins, "q", signed=int(signed), narrow=int(narrow), rounding_mode="ROUND")

    def weight(self, shape: tuple[int, ...], bits: int, dead: int | None = None) -> str:
        """A quantized weight (per output channel scales max|w| / qmax, narrow range); output channel ``dead`` gets
        float weights that all round to 0."""
        w = self.rng.uniform(-1, 1, size=shape).astype(np.float32) / np.sqrt(np.prod(shape[1:]))
        qmax = 2 ** (bits - 1) - 1
        scale = (np.abs(w).reshape(shape[0], -1).max(axis=1) / qmax).astype(np.float32)
        if dead is not None:
            scale[dead] = np.float32(np.median(scale))
            w[dead] = self.rng.uniform(-0.4, 0.4, size=shape[1:]).astype(np.float32) * scale[dead]
        return self.quant(self.init("w", w), scale.reshape((-1,) + (1,) * (len(shape) - 1)), bits, True, True)

    def bn(self, x: str, channels: int, tie: tuple[int, float] | None = None) -> str:
        """BatchNorm with the README's random statistics; ``tie = (channel, beta)`` sets that channel's mean to 0
        and its beta (so that BN(0) = beta exactly)."""
        gamma = self.rng.uniform(0.5, 1.5, channels)
        beta = self.rng.normal(0, 0.3, channels)
        mean = self.rng.normal(0, 0.5, channels)
        var = self.rng.uniform(0.2, 2.2, channels)
        if tie is not None:
            mean[tie[0]], beta[tie[0]] = 0.0, tie[1]
        params = [self.init("bn", p) for p in (gamma, beta, mean, var)]
        return self.node("BatchNormalization", [x] + params, "bn", epsilon=1e-5)

    def conv(self, x: str, cin: int, cout: int, k: int, bits: int, stride: int = 1, group: int = 1,
             dead: int | None = None) -> str:
        w = self.weight((cout, cin // group, k, k), bits, dead)
        return self.node("Conv", [x, w], "conv", kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride],
                         group=group)

    def model(self, x_shape: list[int], out: str, out_shape: list[int]) -> Model:
        graph = helper.make_graph(self.nodes, "recipe", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                       x_shape)],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
                                  initializer=self.inits)
        return Model(make_model(graph))


def tie_scale_and_beta(rng: np.random.Generator) -> tuple[np.float32, float]:
    """A quantizer scale ``s`` in [0.1, 0.4] and a float32 ``beta > 0`` with ``fl32(beta / s)`` exactly ``k + ½``
    while the real quotient is not, on the side that rounds away from float32's even level: a float32 near-tie of a
    ROUND quantizer of scale ``s`` (not every scale has one near a half-integer: another is drawn)."""
    for _ in range(1000):
        scale = np.float32(rng.uniform(0.1, 0.4))
        s = Fraction(float(scale))
        for k in range(6):
            b = np.float32(float((k + Fraction(1, 2)) * s))
            for step in sorted(range(-8, 9), key=abs):
                cand = b
                for _ in range(abs(step)):
                    cand = np.nextafter(cand, np.float32(np.inf if step > 0 else -np.inf))
                real = Fraction(float(cand)) / s
                if np.float32(cand) / scale != np.float32(k + 0.5) or real == k + Fraction(1, 2):
                    continue
                float32_level = k if k % 2 == 0 else k + 1  # half to even
                real_level = k if real < k + Fraction(1, 2) else k + 1
                if real_level != float32_level:
                    return scale, float(cand)
    raise RuntimeError("no float32 near-tie found")


def cifar_resnet(seed: int, widths: tuple[int, ...] = (4, 8, 16), blocks: int = 2, size: int = 8,
                 tie: bool = True, classes: int = 10) -> Model:
    """The CIFAR ResNet recipe (module docstring)."""
    net = _Net(seed)
    rng = net.rng
    x = net.quant("x", np.float32(1 / 127), 8, True)
    y = net.quant(net.node("Relu", [net.bn(net.conv(x, 3, widths[0], 3, 8), widths[0])], "relu"),
                  np.float32(rng.uniform(0.1, 0.4)), 4, False)
    cin = widths[0]
    tie_block = (1, 0) if tie else None
    for stage, width in enumerate(widths):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            planted = (stage, block) == tie_block
            dead = int(rng.integers(0, width)) if planted else None
            s1 = np.float32(rng.uniform(0.1, 0.4))
            bn_tie = None
            if planted:
                s1, beta = tie_scale_and_beta(rng)
                bn_tie = (dead, beta)
            h = net.conv(y, cin, width, 3, 4, stride, dead=dead)
            h = net.quant(net.node("Relu", [net.bn(h, width, bn_tie)], "relu"), s1, 4, False)
            h = net.bn(net.conv(h, width, width, 3, 4), width)
            short = y if stride == 1 and cin == width else net.bn(net.conv(y, cin, width, 1, 4, stride), width)
            main_q = net.quant(h, np.float32(rng.uniform(0.1, 0.3)), 4, True)
            short_q = net.quant(short, np.float32(rng.uniform(0.1, 0.3)), 4, True)  # a distinct quantizer
            y = net.quant(net.node("Relu", [net.node("Add", [main_q, short_q], "add")], "relu"),
                          np.float32(rng.uniform(0.1, 0.4)), 4, False)
            cin = width
    pooled = net.quant(net.node("GlobalAveragePool", [y], "pool"), np.float32(rng.uniform(0.01, 0.05)), 8, False)
    flat = net.node("Flatten", [pooled], "flat", axis=1)
    w = net.weight((classes, cin), 8)
    out = net.node("Gemm", [flat, w, net.init("bias", rng.normal(0, 0.1, classes))], "fc", transB=1)
    return net.model([1, 3, size, size], out, [1, classes])


def proxyless_net(seed: int, size: int = 16, width: int = 8, expand: int = 16, classes: int = 10) -> Model:
    """The ProxylessNAS pattern (module docstring)."""
    net = _Net(seed)
    rng = net.rng
    act = lambda h, c: net.quant(net.node("Relu", [net.bn(h, c)], "relu"),  # noqa: E731
                                 np.float32(rng.uniform(0.1, 0.4)), 4, False)
    y = act(net.conv("x", 3, width, 3, 8, stride=2), width)
    y = act(net.conv(y, width, width, 3, 4, group=width), width)
    y = net.quant(net.bn(net.conv(y, width, expand, 1, 4), expand), np.float32(rng.uniform(0.1, 0.3)), 4, True)
    pooled = net.quant(net.node("GlobalAveragePool", [y], "pool"), np.float32(rng.uniform(0.01, 0.05)), 8, True)
    flat = net.node("Flatten", [pooled], "flat", axis=1)
    out = net.node("MatMul", [flat, net.weight((expand, classes), 8)], "fc")
    return net.model([1, 3, size, size], out, [1, classes])


def float_layer_tie_sample(model: Model, x: np.ndarray, rng: np.random.Generator, tries: int = 200
                           ) -> np.ndarray | None:
    """An input near ``x`` on which the first MultiThreshold of the streamlined ``model`` (on its float first layer,
    ``Im2Col → MatMul`` of the float input) gives another level in float32 than in float64 execution of what it
    means (:class:`verify.real64.Real64`), or None. One accumulator ``acc[p, c]`` is put on one of its real
    thresholds ``R`` by solving for one input element of its window, then that element is moved float32 step by
    float32 step around the solution until the float32 sum and the exact one fall on two sides."""
    import onnx_ir as ir

    from custom_ops.executor import Executor
    from custom_ops.registry import make_op
    from finnlite.core.datatypes import is_integer_type
    from finnlite.core.shapes import const_array
    from streamline.real_thresholds import get_real_thresholds
    from verify.real64 import Real64

    mt = next((n for n in model.graph if n.op_type == "MultiThreshold"
               and not is_integer_type(model.get_tensor_datatype(n.inputs[0].name))), None)
    mm = mt.inputs[0].producer() if mt is not None else None
    if mm is None or mm.op_type != "MatMul" or get_real_thresholds(mt) is None:
        return None
    im2col = mm.inputs[0].producer()
    w = const_array(mm.inputs[1])
    if im2col is None or im2col.op_type != "Im2Col" or w is None:
        return None
    real = Real64(model)
    name = model.graph.inputs[0].name
    thresholds = np.asarray(get_real_thresholds(mt).real, dtype=object)
    # which input element each window entry reads (index + 1; 0 for padding)
    feeding = im2col.inputs[0].name
    ids = real.values({name: np.arange(1, x.size + 1, dtype=np.float32).reshape(x.shape)}, [feeding])[feeding]
    index = make_op(ir.serde.serialize_node(im2col)).execute([ids])[0].reshape(-1, w.shape[0])
    ex = Executor(model.to_proto())
    acc_name, out = mt.inputs[0].name, mt.outputs[0].name
    base = np.array(x, np.float32)
    acc = real.values({name: base}, [acc_name])[acc_name].reshape(-1, w.shape[1])
    for _ in range(tries):
        p, c = int(rng.integers(0, acc.shape[0])), int(rng.integers(0, acc.shape[1]))
        row = [t for t in thresholds[c if thresholds.shape[0] > 1 else 0] if isinstance(t, Fraction)]
        ks = [k for k in range(w.shape[0]) if w[k, c] != 0 and index[p, k] > 0]
        if not row or not ks:
            continue
        k = ks[int(rng.integers(0, len(ks)))]
        src = int(index[p, k]) - 1
        for target in sorted(row, key=lambda t: abs(float(t) - acc[p, c]))[:3]:
            v0 = np.float32(base.reshape(-1)[src] + (float(target) - acc[p, c]) / float(w[k, c]))
            if not -2.5 <= float(v0) <= 2.5:
                continue
            for step in sorted(range(-40, 41), key=abs):
                v = v0
                for _ in range(abs(step)):
                    v = np.nextafter(v, np.float32(np.inf if step > 0 else -np.inf))
                trial = base.copy()
                trial.reshape(-1)[src] = v
                got = ex.run({name: trial}, return_all=True)[out]
                if not np.array_equal(np.asarray(got, np.float64), real.values({name: trial}, [out])[out]):
                    return trial
    return None
