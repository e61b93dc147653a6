"""The collapse rules: canonical forms and merging of consecutive elementwise constants.

After these rules an affine chain between two non-elementwise nodes is at most one Mul followed by one Add, whose
exact constants (see :mod:`streamline.exact`) are the exact products and sums of what was merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import is_standard_domain, rank_of
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.exact import LinearInput, const_operand, exact_value, new_const_node, set_exact, to_float32
from streamline.real_thresholds import RealThresholds, set_real_thresholds

if TYPE_CHECKING:
    from finnlite.core.model import Model


def _single_use(v: ir.Value) -> bool:
    return len(v.uses()) == 1 and not v.is_graph_output()


@dataclass(frozen=True, slots=True, eq=False)
class BatchNormParams:
    """An inference BatchNorm (``node``) with constant ``gamma``, ``beta``, ``mean`` and ``var``."""

    node: ir.Node
    gamma: np.ndarray
    beta: np.ndarray
    mean: np.ndarray
    var: np.ndarray


@register_pass(group="collapse")
class BatchNormToAffine(Rule):
    """BatchNormalization(x, γ, β, μ, σ²) → Add(Mul(x, A), B) with A = γ / √(σ² + ε), B = β − μ·A.

    Pattern: an inference-mode BatchNormalization with constant parameters. Algebra: per channel (axis 1),
    (x − μ)/√(σ²+ε)·γ + β = A·x + B. A and B are evaluated in float64 (as the float64 reference evaluates the
    BatchNorm) and recorded exactly on the new nodes; the float32 initializers are their roundings."""

    op_types = ("BatchNormalization",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        params = [const_array(v) for v in node.inputs[1:5]]
        if len(params) != 4 or any(p is None for p in params):
            return self.miss(node, "BatchNorm parameters are not constant")
        if len(node.outputs) > 1 and any(o.uses() for o in node.outputs[1:]):
            return self.miss(node, "training-mode BatchNorm outputs are used")
        if rank_of(node.inputs[0], constants=False) is None:
            return self.miss(node, "input rank unknown")
        return BatchNormParams(node, *params)

    def rewrite(self, model: "Model", match: BatchNormParams) -> None:
        node, gamma, beta, mean, var = match.node, match.gamma, match.beta, match.mean, match.var
        eps = float(node.attributes["epsilon"].value) if "epsilon" in node.attributes else 1e-5
        g, b, mu, v = (np.asarray(p, dtype=np.float64).ravel() for p in (gamma, beta, mean, var))
        a = g / np.sqrt(v + np.float64(np.float32(eps)))
        bias = b - mu * a
        rank = rank_of(node.inputs[0], constants=False)
        y = node.outputs[0]
        mul = new_const_node(model, "Mul", node.inputs[0], a, rank, 1, y, f"{node.name}_mul")
        add = new_const_node(model, "Add", mul.outputs[0], bias, rank, 1, y, f"{node.name}_add")
        model.graph.insert_after(node, [mul, add])
        model.replace_uses(y, add.outputs[0])
        model.remove_node(node)


@register_pass(group="collapse")
class ConvertDivToMul(Rule):
    """Div(x, c) → Mul(x, 1/c) for a constant c without zeros (the exact reciprocal is recorded)."""

    op_types = ("Div",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        c = const_array(node.inputs[1])
        if c is None or const_array(node.inputs[0]) is not None:
            return self.miss(node, "divisor is not a constant")
        if np.any(c == 0) or not np.all(np.isfinite(c)):
            return self.miss(node, "divisor has a zero or non-finite value")
        return node, c

    def rewrite(self, model: "Model", match: Any) -> None:
        node, c = match
        exact = exact_value(node, c)
        recip = np.empty(exact.shape, dtype=object)
        for idx in np.ndindex(exact.shape):
            recip[idx] = 1 / exact[idx]
        k = model.add_initializer(to_float32(recip), prefix=f"{node.name}_recip")
        mul = ir.Node("", "Mul", [node.inputs[0], k], outputs=[model.make_value_like(node.outputs[0])],
                      name=f"{node.name}_mul")
        set_exact(mul, recip)
        model.graph.insert_after(node, mul)
        model.replace_uses(node.outputs[0], mul.outputs[0])
        model.remove_node(node)


@dataclass(frozen=True, slots=True, eq=False)
class ConstChain:
    """``outer(inner(x, b), a)``: two elementwise ops with constant operands, ``inner`` feeding only ``outer``."""

    outer: LinearInput
    inner: LinearInput


class _CollapseRepeated(Rule):
    """Shared by CollapseRepeatedMul/Add: op(op(x, a), b) → op(x, a ∘ b)."""

    op: str = ""

    def match(self, model: "Model", node: ir.Node) -> Any:
        outer = const_operand(node)
        if outer is None:
            return None
        x = node.inputs[1 - outer[0]]
        inner_node = x.producer()
        if inner_node is None or inner_node.op_type != self.op or not is_standard_domain(inner_node.domain):
            return None
        inner = const_operand(inner_node)
        if inner is None:
            return self.miss(node, f"the preceding {self.op} has no constant operand")
        if not _single_use(x):
            return self.miss(node, f"the preceding {self.op} output is forked")
        return ConstChain(LinearInput(node, *outer), LinearInput(inner_node, *inner))

    def rewrite(self, model: "Model", match: ConstChain) -> None:
        node, inner_node = match.outer.node, match.inner.node
        a, b = match.inner.exact(), match.outer.exact()
        combined = a * b if self.op == "Mul" else a + b
        combined = np.asarray(combined, dtype=object)
        k = model.add_initializer(to_float32(combined), prefix=f"{node.name}_c")
        new = ir.Node("", self.op, [match.inner.data, k], outputs=[model.make_value_like(node.outputs[0])],
                      name=node.name)
        set_exact(new, combined)
        model.graph.insert_after(node, new)
        model.replace_uses(node.outputs[0], new.outputs[0])
        model.remove_node(node)
        model.remove_node(inner_node)


@register_pass(group="collapse")
class CollapseRepeatedMul(_CollapseRepeated):
    """Mul(Mul(x, a), b) → Mul(x, a·b) for constants a, b (the inner Mul not forked). Exact product recorded."""

    op_types = ("Mul",)
    op = "Mul"


@register_pass(group="collapse")
class CollapseRepeatedAdd(_CollapseRepeated):
    """Add(Add(x, a), b) → Add(x, a + b) for constants a, b (the inner Add not forked). Exact sum recorded."""

    op_types = ("Add",)
    op = "Add"


@register_pass(group="collapse")
class MoveAddPastMul(Rule):
    """Mul(Add(x, b), a) → Add(Mul(x, a), a·b) for constants a, b (the Add not forked).

    Algebra: (x + b)·a = x·a + a·b. Brings affine chains to the canonical form Mul then Add."""

    op_types = ("Mul",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        mul = const_operand(node)
        if mul is None:
            return None
        x = node.inputs[1 - mul[0]]
        add_node = x.producer()
        if add_node is None or add_node.op_type != "Add":
            return None
        add = const_operand(add_node)
        if add is None:
            return None
        if not _single_use(x):
            return self.miss(node, "the preceding Add is forked")
        return ConstChain(LinearInput(node, *mul), LinearInput(add_node, *add))

    def rewrite(self, model: "Model", match: ConstChain) -> None:
        node, add_node = match.outer.node, match.inner.node
        a, b = match.outer.exact(), match.inner.exact()
        ab = np.asarray(a * b, dtype=object)
        y = node.outputs[0]
        k_mul = model.add_initializer(np.asarray(match.outer.value), prefix=f"{node.name}_c")
        new_mul = ir.Node("", "Mul", [match.inner.data, k_mul], outputs=[model.make_value_like(y)],
                          name=node.name)
        set_exact(new_mul, a)
        k_add = model.add_initializer(to_float32(ab), prefix=f"{add_node.name}_c")
        new_add = ir.Node("", "Add", [new_mul.outputs[0], k_add], outputs=[model.make_value_like(y)],
                          name=add_node.name)
        set_exact(new_add, ab)
        model.graph.insert_after(node, [new_mul, new_add])
        model.replace_uses(y, new_add.outputs[0])
        model.remove_node(node)
        model.remove_node(add_node)


@register_pass(group="collapse")
class ConvertSignToThreshold(Rule):
    """Sign(x) → MultiThreshold(x, [0, 0⁺]) with out_bias −1.

    Algebra: Sign(x) = [x ≥ 0] + [x > 0] − 1 ∈ {−1, 0, 1}: two thresholds at 0, the second strict."""

    op_types = ("Sign",)
    aliases = ("ConvertSignToThres",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        return node

    def rewrite(self, model: "Model", node: ir.Node) -> None:
        from streamline.absorb import materialize  # absorb owns threshold materialization

        rt = RealThresholds(np.array([[Fraction(0), Fraction(0)]], dtype=object), np.array([[False, True]]))
        thr = model.add_initializer(np.zeros((1, 2), np.float32), prefix=f"{node.name}_thr")
        rank = rank_of(node.inputs[0], constants=False)
        layout = "NCHW" if rank == 4 else ("NC" if rank == 2 else "")
        mt = ir.Node("qonnx.custom_op.general", "MultiThreshold", [node.inputs[0], thr],
                     attributes=[ir.AttrString("out_dtype", "INT2"), ir.AttrFloat32("out_bias", -1.0),
                                 ir.AttrString("data_layout", layout)],
                     outputs=[model.make_value_like(node.outputs[0])], name=f"{node.name}_mt")
        set_real_thresholds(mt, rt)
        model.graph.insert_after(node, mt)
        model.replace_uses(node.outputs[0], mt.outputs[0])
        model.remove_node(node)
        materialize(model, mt)


@register_pass(group="collapse")
class CollapseRepeatedTranspose(Rule):
    """Transpose(Transpose(x, p), q) → Transpose(x, p∘q), or x itself when the composition is the identity."""

    op_types = ("Transpose",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        inner = node.inputs[0].producer()
        if inner is None or inner.op_type != "Transpose" or not _single_use(node.inputs[0]):
            return None
        if "perm" not in inner.attributes or "perm" not in node.attributes:
            return self.miss(node, "Transpose without an explicit perm")
        return node, inner

    def rewrite(self, model: "Model", match: Any) -> None:
        node, inner = match
        p, q = list(inner.attributes["perm"].value), list(node.attributes["perm"].value)
        perm = [p[i] for i in q]
        x = inner.inputs[0]
        if perm == sorted(perm):
            model.replace_uses(node.outputs[0], x)
        else:
            new = ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", perm)],
                          outputs=[model.make_value_like(node.outputs[0])], name=node.name)
            model.graph.insert_after(node, new)
            model.replace_uses(node.outputs[0], new.outputs[0])
        model.remove_node(node)
        model.remove_node(inner)


@register_pass(group="collapse")
class CollapseRepeatedReshape(Rule):
    """Reshape(Reshape(x, s1), s2) → Reshape(x, s2) when s2 is constant and has no 0 (copy-a-dim) entries."""

    op_types = ("Reshape",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        inner = node.inputs[0].producer()
        if inner is None or inner.op_type not in ("Reshape", "Flatten") or not _single_use(node.inputs[0]):
            return None
        shape = const_array(node.inputs[1])
        if shape is None or np.any(shape == 0):
            return self.miss(node, "outer shape is not constant or copies a dimension")
        return node, inner

    def rewrite(self, model: "Model", match: Any) -> None:
        node, inner = match
        node.replace_input_with(0, inner.inputs[0])
        model.remove_node(inner)


#: The collapse rules, in the order a round applies them.
COLLAPSE_PASSES = [BatchNormToAffine, ConvertDivToMul, CollapseRepeatedMul, CollapseRepeatedAdd, MoveAddPastMul,
                   ConvertSignToThreshold, CollapseRepeatedTranspose, CollapseRepeatedReshape]
