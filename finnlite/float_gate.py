"""Why a gated product stays float: the gate is not quantized (for the integer-only report).

A squeeze-excitation block multiplies feature maps by a gate, ``x · σ(z)``. With the gate quantized (Brevitas
``QuantSigmoid``), both factors are integers times a scale and the product is an integer product (FINN's
``ElementwiseMul``) times one scale (:class:`streamline.reorder.MoveMulPastEltwiseMul`). With a float ``Sigmoid``
(or any unquantized nonlinearity) the product is a real-valued function of the features: no rule can make it
integer, and the float region starts at the last integer tensor before the gate (the excitation layer's output
scale and bias, which no thresholds absorb).

:func:`float_gate_cause` recognises that on the final graph — from a float node, forward through float
elementwise and data-movement ops, a nonlinearity is reached whose output is one factor of a Mul of two computed
tensors — and says which gate, which product, and what to change.
"""

from __future__ import annotations

import onnx_ir as ir

from finnlite.core.shapes import const_array
from finnlite.core.traverse import node_label

__all__ = ["float_gate_cause"]

#: unquantized gates (the functions squeeze-excitation and attention use)
_GATES = ("Sigmoid", "HardSigmoid", "Tanh", "Softmax", "HardSwish")
#: ops between the layer's float output and the gate, and between the gate and the product
_THROUGH = ("Mul", "Add", "Reshape", "Flatten", "Unsqueeze", "Squeeze", "Transpose", "Identity", "Expand")


def _product(gate: ir.Node) -> ir.Node | None:
    """The Mul of two computed tensors the gate's output reaches through data movement, or None."""
    value = gate.outputs[0]
    for _ in range(8):
        uses = list(value.uses())
        if len(uses) != 1:
            return None
        n = uses[0].node
        computed = [v for v in n.inputs if v is not None and const_array(v) is None]
        if n.op_type == "Mul" and len(computed) == 2:
            return n
        if n.op_type not in _THROUGH[2:]:
            return None
        value = n.outputs[0]
    return None


def float_gate_cause(node: ir.Node) -> str | None:
    """Why float ``node`` (the start of a float region) cannot become integer, with what to change, if its output
    reaches an unquantized gate of a product (module docstring); else None."""
    value = node.outputs[0] if node.outputs else None
    seen = 0
    while value is not None and seen < 8:
        seen += 1
        uses = list(value.uses())
        if len(uses) != 1:
            return None
        n = uses[0].node
        if n.op_type in _GATES:
            product = _product(n)
            if product is None:
                return None
            return (f"the {n.op_type} '{node_label(n)}' is a float gate: Mul '{node_label(product)}' multiplies the "
                    f"features by it, a real-valued factor no rule can make integer, so it stays float from here to "
                    f"the next quantizer; change: quantize the gate (Brevitas QuantSigmoid, or a QuantIdentity right "
                    f"after the {n.op_type}), and the product becomes an integer one (FINN's ElementwiseMul)")
        if n.op_type not in _THROUGH:
            return None
        value = n.outputs[0]
    return None
