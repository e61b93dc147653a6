"""Example QONNX models that finnlite builds with its own code (no Brevitas needed).

:func:`build_tfc` makes a Brevitas-style TFC MLP: an input quantizer, then per layer a Gemm whose weight goes
through a weight ``Quant`` (per-output-channel scales), a BatchNormalization, a ReLU (or none, HardTanh-style for
signed activations) and an activation ``Quant``; a final Gemm gives the logits. Weights, scales and BatchNorm
statistics are random but seeded, so that thresholds are per-channel and non-trivial, as in a trained network.
:func:`build_mlp` makes the same with any number of layers (for the scaling benchmark).

Run ``python -m finnlite.examples build-tfc OUT.onnx`` to write one.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from finnlite.compat import QONNX_DOMAIN, make_model


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, value: np.ndarray | float, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def const_int64(self, value: Sequence[int], prefix: str = "shape") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
        return name

    def node(self, op: str, inputs: Sequence[str], domain: str = "", **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.name(op), domain=domain, **attrs))
        return out

    def quant(self, x: str, scale: np.ndarray | float, bits: int, signed: bool, narrow: bool = False,
              zeropoint: float = 0.0, rounding_mode: str = "ROUND") -> str:
        return self.node("Quant", [x, self.const(scale, "scale"), self.const(zeropoint, "zeropt"),
                                   self.const(float(bits), "bitwidth")], domain=QONNX_DOMAIN,
                         signed=int(signed), narrow=int(narrow), rounding_mode=rounding_mode)


def build_mlp(n_layers: int = 3, width: int = 64, in_features: int = 784, n_classes: int = 10, wbits: int = 2,
              abits: int = 2, signed_act: bool = False, seed: int = 0) -> onnx.ModelProto:
    """A Brevitas-style quantized MLP with ``n_layers`` hidden layers of ``width`` units (see module docstring).

    The input is ``[1, 1, 28, 28]`` (flattened to ``in_features``) in [0, 1]; activations are ``abits``-bit unsigned
    after a ReLU, or signed and narrow without one when ``signed_act``; weights are ``wbits``-bit signed narrow
    with per-output-channel scales."""
    b = _Builder(seed)
    rng = b.rng
    side = int(round(np.sqrt(in_features)))
    in_shape = [1, 1, side, side] if side * side == in_features else [1, in_features]
    x = b.node("Reshape", ["x", b.const_int64([1, -1])])
    x = b.quant(x, 1.0 / 255, 8, signed=False)
    fan_in = in_features
    for layer in range(n_layers + 1):
        last = layer == n_layers
        units = n_classes if last else width
        w = rng.normal(0, 1.0 / np.sqrt(fan_in), size=(units, fan_in)).astype(np.float32)
        qmax = 2 ** (wbits - 1) - 1
        w_scale = (np.abs(w).max(axis=1, keepdims=True) / qmax).astype(np.float32)
        wq = b.quant(b.const(w, "weight"), w_scale, wbits, signed=True, narrow=True)
        x = b.node("Gemm", [x, wq], transB=1)
        if last:
            break
        gamma = rng.uniform(0.5, 1.5, units).astype(np.float32)
        beta = rng.normal(0, 0.3, units).astype(np.float32)
        mean = rng.normal(0, 0.3, units).astype(np.float32)
        var = rng.uniform(0.5, 2.0, units).astype(np.float32)
        x = b.node("BatchNormalization", [x, b.const(gamma, "bn_w"), b.const(beta, "bn_b"), b.const(mean, "bn_mean"),
                                          b.const(var, "bn_var")], epsilon=1e-5)
        if signed_act:
            x = b.quant(x, 2.0 ** -(abits - 1), abits, signed=True, narrow=True)
        else:
            x = b.node("Relu", [x])
            x = b.quant(x, np.float32(rng.uniform(0.2, 0.6)), abits, signed=False)
        fan_in = units
    graph = helper.make_graph(b.nodes, f"mlp_{n_layers}x{width}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, n_classes])],
                              initializer=b.inits)
    model = make_model(graph)
    onnx.checker.check_model(model)
    return model


def build_tfc(wbits: int = 2, abits: int = 2, seed: int = 0) -> onnx.ModelProto:
    """The bundled example: a TFC (3 x 64 units) MLP with ``wbits``-bit weights and ``abits``-bit activations."""
    return build_mlp(3, 64, wbits=wbits, abits=abits, seed=seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finnlite.examples", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build-tfc", help="write the example TFC MLP")
    p.add_argument("output")
    p.add_argument("--wbits", type=int, default=2)
    p.add_argument("--abits", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from pathlib import Path

    from finnlite.io import save_proto

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    save_proto(build_tfc(args.wbits, args.abits, args.seed), args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
