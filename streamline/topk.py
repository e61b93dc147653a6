"""The classifier's final scale and bias before a TopK, which FINN's LabelSelect layer does without."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import is_integer_type
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.lower_common import is_op

if TYPE_CHECKING:
    from finnlite.core.model import Model

#: the largest integer input range whose image is enumerated to prove the chain strictly increasing
MAX_ENUMERATED = 1 << 22


def _scalar_operand(node: ir.Node) -> tuple[ir.Value, float] | None:
    """(dynamic input, scalar constant) of a binary Mul/Add, or None."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    ca, cb = const_array(a), const_array(b)
    if cb is not None and ca is None and cb.size == 1:
        return a, cb
    if ca is not None and cb is None and ca.size == 1:
        return b, ca
    return None


def strictly_increasing(chain: list[tuple[str, np.ndarray]], lo: int, hi: int) -> bool:
    """True if applying ``chain`` (op type, scalar) in order, in the constants' float arithmetic, maps the integers
    ``lo..hi`` to strictly increasing values (checked on every one of them)."""
    if hi - lo > MAX_ENUMERATED:
        return False
    y = np.arange(lo, hi + 1, dtype=np.float64).astype(np.float32)
    for op, c in chain:
        c = np.asarray(c).reshape(())
        y = (y * c) if op == "Mul" else (y + c)
    return bool(np.all(np.diff(y.astype(np.float64)) > 0))


@dataclass(frozen=True, slots=True, eq=False)
class ChainBeforeTopK:
    """A TopK (``node``) reading a strictly increasing ``chain`` of scalar Muls and Adds (nearest first) of the
    integer tensor ``x``."""

    node: ir.Node
    x: ir.Value
    chain: list[ir.Node]


@register_pass(group="lower")
class AbsorbScalarMulAddIntoTopK(Rule):
    """x → Mul(a) / Add(b) ... → TopK   ⇒   x → TopK, for the indices.

    Pattern: a TopK whose values output is unused (only the indices are), fed by a chain of Mul and Add nodes with
    scalar constants, each read only by the next. Conditions: every Mul factor is positive; the chain's input carries
    an integer datatype with a range of at most 2^22 values, on which the chain, computed in float32 as the graph
    computes it, is checked to be strictly increasing. Algebra: a strictly increasing map keeps the order of any two
    elements and their ties, so TopK selects the same indices (ties are broken by index either way). FINN's rule
    assumes this for any positive scalar; in float32 rounding can merge two values into a tie, hence the check.
    The integer input then feeds FINN's LabelSelect layer."""

    op_types = ("TopK",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_op(node, "TopK", custom=False):
            return None
        values = node.outputs[0]
        if values.uses() or values.is_graph_output():
            return self.miss(node, "the TopK values output is used (they change, the indices do not)")
        chain: list[ir.Node] = []
        ops: list[tuple[str, np.ndarray]] = []
        x = node.inputs[0]
        prod = x.producer()
        while is_op(prod, "Mul", "Add", custom=False) and len(x.uses()) == 1 and not x.is_graph_output():
            operand = _scalar_operand(prod)
            if operand is None or (prod.op_type == "Mul" and float(np.asarray(operand[1]).reshape(())) <= 0):
                break
            chain.append(prod)
            ops.append((prod.op_type, operand[1]))
            x = operand[0]
            prod = x.producer()
        if not chain:
            return None
        dt = model.get_tensor_datatype(x.name)
        if not is_integer_type(dt):
            return self.miss(node, "the input of the Mul/Add chain is not an integer tensor")
        if not strictly_increasing(ops[::-1], int(dt.min()), int(dt.max())):
            return self.miss(node, f"the chain is not provably strictly increasing on {dt.name}")
        return ChainBeforeTopK(node, x, chain)

    def rewrite(self, model: "Model", match: ChainBeforeTopK) -> None:
        node, x, chain = match.node, match.x, match.chain
        node.replace_input_with(0, x)
        for n in chain:
            consts = [v for v in n.inputs if v is not None and v.is_initializer()]
            model.remove_node(n)
            model.drop_if_unused(*consts)
