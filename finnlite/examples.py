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
import itertools
import sys
from typing import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass

from finnlite.core.compat import OPSET, QONNX_DOMAIN, fix_ir_version


def build_mlp(n_layers: int = 3, width: int = 64, in_features: int = 784, n_classes: int = 10, wbits: int = 2,
              abits: int = 2, signed_act: bool = False, seed: int = 0) -> onnx.ModelProto:
    """A Brevitas-style quantized MLP with ``n_layers`` hidden layers of ``width`` units (see module docstring).

    The input is ``[1, 1, 28, 28]`` (flattened to ``in_features``) in [0, 1]; activations are ``abits``-bit unsigned
    after a ReLU, or signed and narrow without one when ``signed_act``; weights are ``wbits``-bit signed narrow
    with per-output-channel scales. Written with onnx_ir's tape; its NameFixPass names the nodes and tensors."""
    rng, tape, count = np.random.default_rng(seed), ir.tape.Tape(), itertools.count(1)

    def const(value: object, prefix: str, dtype: type = np.float32) -> ir.Value:
        return tape.initializer(ir.tensor(np.asarray(value, dtype), name=f"{prefix}_{next(count)}"))

    def quant(x: ir.Value, scale: object, bits: int, signed: bool, narrow: bool = False) -> ir.Value:
        return tape.op("Quant", [x, const(scale, "scale"), const(0.0, "zeropt"), const(float(bits), "bitwidth")],
                       {"signed": int(signed), "narrow": int(narrow), "rounding_mode": "ROUND"}, domain=QONNX_DOMAIN)

    side = int(round(np.sqrt(in_features)))
    x_in = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT),
                    shape=ir.Shape([1, 1, side, side] if side * side == in_features else [1, in_features]))
    x = quant(tape.op("Reshape", [x_in, const([1, -1], "shape", np.int64)]), 1.0 / 255, 8, signed=False)
    fan_in = in_features
    for layer in range(n_layers + 1):
        units = n_classes if layer == n_layers else width
        w = rng.normal(0, 1.0 / np.sqrt(fan_in), size=(units, fan_in)).astype(np.float32)
        w_scale = np.abs(w).max(axis=1, keepdims=True) / (2 ** (wbits - 1) - 1)
        x = tape.op("Gemm", [x, quant(const(w, "weight"), w_scale, wbits, signed=True, narrow=True)], {"transB": 1})
        if layer == n_layers:
            break
        gamma, beta = rng.uniform(0.5, 1.5, units), rng.normal(0, 0.3, units)
        mean, var = rng.normal(0, 0.3, units), rng.uniform(0.5, 2.0, units)
        x = tape.op("BatchNormalization", [x, const(gamma, "bn_w"), const(beta, "bn_b"), const(mean, "bn_mean"),
                                           const(var, "bn_var")], {"epsilon": 1e-5})
        if signed_act:
            x = quant(x, 2.0 ** -(abits - 1), abits, signed=True, narrow=True)
        else:
            x = quant(tape.op("Relu", [x]), rng.uniform(0.2, 0.6), abits, signed=False)
        fan_in = units
    x.dtype, x.shape = ir.DataType.FLOAT, ir.Shape([1, n_classes])
    graph = ir.Graph([x_in], [x], nodes=tape.nodes, initializers=tape.initializers, name=f"mlp_{n_layers}x{width}",
                     opset_imports={"": OPSET, QONNX_DOMAIN: 1})
    model = ir.Model(graph, ir_version=10, producer_name="finnlite")
    NameFixPass()(model)
    proto = fix_ir_version(ir.serde.serialize_model(model))
    onnx.checker.check_model(proto)
    return proto


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

    from finnlite.core.io import save_proto

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    save_proto(build_tfc(args.wbits, args.abits, args.seed), args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
