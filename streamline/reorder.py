"""The reorder rules: move scales (Mul) and biases (Add) forward, past linear ops, forks and joins.

The rules that need only what an op *is* — data movement, a linear or selection op with its channel map — read
the op table (:mod:`streamline.algebra`) and live in :mod:`streamline.move`; the rules here need more of an op
(a weighted sum of a bias, a fork, a join of branches). Every rule moves an elementwise ``Mul(x, a)`` or
``Add(x, b)`` with a constant operand from before a node to after it, transforming the constant exactly
(Fractions; see :mod:`streamline.exact`). Moving forward until a MultiThreshold absorbs them (or the graph output
is reached) is what makes the interior integer-only. Each rule's docstring gives its algebra and the conditions
under which it is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.base import attrs_of
from finnlite.core.graphutil import is_standard_domain, rank_of, zero_padded
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array, const_shape
from streamline.exact import (LinearInput, channel_vector, const_operand, linear_input, set_exact, shaped_for_axis,
                              to_float32)
from streamline.move import (MoveAddPastAveraging, MoveDataMovementPastElementwise, MoveLinearPastDataMovement,
                             MoveMulPastLinear)
from streamline.real_thresholds import exact_sums, fractions_of

if TYPE_CHECKING:
    from finnlite.core.model import Model


@dataclass(frozen=True, slots=True, eq=False)
class BiasBeforeLinear:
    """A bias Add (``add``) before a MatMul or Conv ``node``; ``bias``: its constant as one value per input channel
    (or one for all); for a Conv, its ``weight`` and the input's ``rank``."""

    node: ir.Node
    add: LinearInput
    bias: np.ndarray
    weight: np.ndarray | None = None
    rank: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class ScaleBeforeRelu:
    """A positive scale (``mul``, its exact constant ``scale``) before a ``relu``, directly or followed by a bias
    ``add`` whose constant divided by the scale is ``shifted``."""

    relu: ir.Node
    mul: LinearInput
    scale: np.ndarray
    add: LinearInput | None = None
    shifted: np.ndarray | None = None


@dataclass(frozen=True, slots=True, eq=False)
class AtInput:
    """A Mul/Add (``lin``) feeding input ``index`` of ``node``, moved past ``node`` with its constant as it is."""

    node: ir.Node
    index: int
    lin: LinearInput


@dataclass(frozen=True, slots=True, eq=False)
class ScalesAtJoin:
    """Scales (Muls, ``left`` and ``right``; None: a branch without one, scale 1) on both inputs of an Add ``node``:
    equal (``scale``; ``ratio`` None), or ``scale`` on the left and ``scale·ratio`` on the right."""

    node: ir.Node
    left: LinearInput | None
    right: LinearInput | None
    scale: Fraction | np.ndarray
    ratio: Fraction | None = None


def _move_after(model: Any, lin: LinearInput, node: ir.Node, index: int, new_exact: np.ndarray) -> ir.Node:
    """Rewire input ``index`` of ``node`` to read the computed input of ``lin`` (whose node is removed) and put a new
    Mul/Add of ``lin``'s kind with the exact constant ``new_exact`` after ``node``'s output. Returns the new node."""
    old = lin.node
    node.replace_input_with(index, lin.data)
    model.remove_node(old)
    y = node.outputs[0]
    new_out = model.make_value_like(y)
    model.replace_uses(y, new_out)
    k = model.add_initializer(to_float32(new_exact), prefix=f"{old.name}_c")
    new = ir.Node("", old.op_type, [y, k], outputs=[new_out], name=old.name)
    set_exact(new, np.asarray(new_exact, dtype=object))
    model.graph.insert_after(node, new)
    return new


@register_pass(group="reorder")
class MoveAddPastMatMul(Rule):
    """MatMul(Add(x, b), W) → Add(MatMul(x, W), b·W) for a constant W and b a scalar or one value per row of W.

    Algebra: (x + b)·W = x·W + b·W, with b·W computed exactly. Condition: the Add feeds only the MatMul."""

    op_types = ("MatMul",)
    aliases = ("MoveScalarAddPastMatMul",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = linear_input(node, 0, ("Add",))
        if lin is None:
            return None
        w_shape = const_shape(node.inputs[1])  # not the values: a depthwise weight would be made dense
        if w_shape is None or len(w_shape) != 2:
            return None
        rank = rank_of(node.inputs[0], constants=False)
        vec = channel_vector(lin.exact(), rank, rank - 1) if rank else None
        if vec is None:
            return self.miss(node, "the Add before the MatMul varies along a non-feature axis")
        return BiasBeforeLinear(node, lin, vec)

    def rewrite(self, model: "Model", match: BiasBeforeLinear) -> None:
        node, vec = match.node, match.bias
        w = const_array(node.inputs[1])
        k = w.shape[0]
        b = np.array([vec[0]] * k if len(vec) == 1 else list(vec), dtype=object)
        wf = fractions_of(w)
        bw = np.array([sum(b[i] * wf[i, n] for i in range(k)) for n in range(w.shape[1])], dtype=object)
        _move_after(model, match.add, node, 0, bw.reshape(1, -1) if rank_of(node.outputs[0], constants=False) else bw)


@register_pass(group="reorder")
class MoveAddPastConv(Rule):
    """Conv(Add(x, b), W) → Add(Conv(x, W), c) with c_o = Σ_{i,k} W[o, i, k]·b_i, for an unpadded Conv.

    Algebra: linearity. Condition: no padding — a padded border would see 0 instead of b, so the result would
    differ there; b scalar or per input channel; the Add feeds only the Conv."""

    op_types = ("Conv",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = linear_input(node, 0, ("Add",))
        w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        if lin is None or w is None:
            return None
        if zero_padded(node):
            return self.miss(node, "an Add cannot pass a padded Conv (the border would change)")
        rank = rank_of(node.inputs[0], constants=False)
        vec = channel_vector(lin.exact(), rank, 1) if rank else None
        if vec is None:
            return self.miss(node, "the Add before the Conv varies along a spatial axis")
        return BiasBeforeLinear(node, lin, vec, w, rank)

    def rewrite(self, model: "Model", match: BiasBeforeLinear) -> None:
        node, vec, w = match.node, match.bias, match.weight
        group = int(attrs_of(node).get("group", 1))
        out_ch, in_per_group = w.shape[0], w.shape[1]
        per_group_out = out_ch // group
        wsum = exact_sums(w.reshape(out_ch, in_per_group, -1), axis=2)  # exact: float32 sums can round
        c = np.empty(out_ch, dtype=object)
        for o in range(out_ch):
            g = o // per_group_out
            c[o] = sum(wsum[o, i] * vec[0 if len(vec) == 1 else g * in_per_group + i] for i in range(in_per_group))
        _move_after(model, match.add, node, 0, shaped_for_axis(c, match.rank, 1))


@register_pass(group="reorder")
class MoveMulPastRelu(Rule):
    """Relu(Mul(x, a)) → Mul(Relu(x), a); Relu(Add(Mul(x, a), b)) → Mul(Relu(Add(x, b/a)), a); for a > 0 (scalar
    or per channel).

    Algebra: max(a·x, 0) = a·max(x, 0) and max(a·x + b, 0) = a·max(x + b/a, 0) for a > 0, with b/a exact. The
    second form is the canonical affine chain (Mul then Add) in front of a Relu that no quantizer reads directly
    (a Relu before a pooling or a join): the scale moves on, and the Add left before the Relu is on the integer
    grid of x where b/a is an integer (a quantized bias, whose scale is the accumulator's). Conditions: the Mul
    (and the Add) feed only this chain; b broadcasts against a; for the second form, something other than
    MultiThresholds reads the Relu (those absorb the chain as it is)."""

    op_types = ("Relu",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = linear_input(node, 0, ("Mul",))
        add = None
        if lin is None:
            add = linear_input(node, 0, ("Add",))
            lin = linear_input(add.node, 1 - add.const_index, ("Mul",)) if add is not None else None
            uses = node.outputs[0].uses()
            if lin is None or uses and all(u.node.op_type == "MultiThreshold" for u in uses):
                return None  # a quantizer reading the Relu absorbs the chain as it is
        vec = lin.exact()
        if any(v <= 0 for v in vec.ravel()):
            return self.miss(node, "a non-positive scale cannot pass Relu")
        if add is None:
            return ScaleBeforeRelu(node, lin, vec)
        b = add.exact()
        try:
            shifted = np.asarray(b / vec, dtype=object)  # numpy broadcasting of the two exact constants
        except ValueError:
            return self.miss(node, "the Add's and the Mul's constants do not broadcast")
        return ScaleBeforeRelu(node, lin, vec, add, shifted)

    def rewrite(self, model: "Model", match: ScaleBeforeRelu) -> None:
        node, vec, shifted = match.relu, match.scale, match.shifted
        if match.add is None:
            _move_after(model, match.mul, node, 0, vec)
            return
        # Relu(Add(Mul(x, a), b)) → Relu(Add(x, b/a)), the Mul after the Relu
        add, lin = match.add.node, match.mul.node
        k = model.add_initializer(to_float32(shifted), prefix=f"{add.name}_c")
        new_add = ir.Node("", "Add", [match.mul.data, k], outputs=[model.make_value_like(add.outputs[0])],
                          name=add.name)
        set_exact(new_add, shifted)
        model.graph.insert_before(node, new_add)
        node.replace_input_with(0, new_add.outputs[0])
        model.remove_node(add)
        y = node.outputs[0]
        out = model.make_value_like(y)
        model.replace_uses(y, out)
        kmul = model.add_initializer(to_float32(vec), prefix=f"{lin.name}_c")
        new_mul = ir.Node("", "Mul", [y, kmul], outputs=[out], name=lin.name)
        set_exact(new_mul, np.asarray(vec, dtype=object))
        model.graph.insert_after(node, new_mul)
        model.remove_node(lin)


@register_pass(group="reorder")
class MoveLinearPastFork(Rule):
    """A Mul/Add with a constant whose output feeds several nodes → one copy per consumer (FINN: the same name).

    Algebra: none; each branch computes the same value. Lets each copy move on along its own branch. Condition:
    the output is not a graph output."""

    op_types = ("Mul", "Add")
    aliases = ("MoveAddPastFork", "MoveMulPastFork")

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain) or const_operand(node) is None:
            return None
        y = node.outputs[0]
        uses = list(y.uses())
        if len(uses) < 2 or y.is_graph_output():
            return None
        return node, uses

    def rewrite(self, model: "Model", match: Any) -> None:
        node, uses = match
        y = node.outputs[0]
        copies = []
        for k, use in enumerate(uses[1:], start=1):
            copy = ir.Node("", node.op_type, list(node.inputs), outputs=[model.make_value_like(y)],
                           name=f"{node.name}_fork{k}")
            for key, val in node.metadata_props.items():
                copy.metadata_props[key] = val
            copies.append(copy)
            use.node.replace_input_with(use.idx, copy.outputs[0])
        model.graph.insert_after(node, copies)


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and all(x == y for x, y in zip(a.ravel(), b.ravel()))


@register_pass(group="reorder")
class MoveLinearPastEltwiseAdd(Rule):
    """Add(Mul(x, a), Mul(y, a)) → Mul(Add(x, y), a); Add(Add(x, b), Add(y, c)) → Add(Add(x, y), b + c);
    Add(Add(x, b), y) → Add(Add(x, y), b).

    Algebra: distributivity, with equal scales on both branches (FINN: MoveLinearPastEltwiseAdd). Unequal scales
    s1, s2 with s2/s1 = p/q for small integers become s1/q · (q·x + p·y), the integer factors as Mul nodes (FINN
    maps them to integer ElementwiseMul layers). Conditions: both branch ops feed only this Add."""

    op_types = ("Add",)
    #: the largest integer factor used to equalize unequal scales
    max_factor = 256

    def match(self, model: "Model", node: ir.Node) -> Any:
        if const_operand(node) is not None or len(node.inputs) != 2:
            return None
        sides = [linear_input(node, i, ("Mul", "Add")) for i in (0, 1)]
        if all(s is None for s in sides):
            return None
        for lin in sides:  # let CollapseRepeated* merge a chain of the same op first (Add after Mul is canonical)
            if lin is not None and linear_input(lin.node, 1 - lin.const_index, (lin.node.op_type,)) is not None:
                return None
        for side, lin in enumerate(sides):
            if lin is not None and lin.node.op_type == "Add":
                return AtInput(node, side, lin)
        scales = [lin.exact() if lin is not None else np.array(Fraction(1), dtype=object) for lin in sides]
        if all(s is not None for s in sides) and _equal(scales[0], scales[1]):
            return ScalesAtJoin(node, sides[0], sides[1], scales[0])
        a, b = scales
        if all(x.size == 1 and Fraction(x.ravel()[0]).denominator == 1 for x in (a, b)):
            return None  # integer factors on both branches: already integer arithmetic
        if a.size == 1 and b.size == 1 and a.ravel()[0] > 0 and b.ravel()[0] > 0:
            ratio = Fraction(b.ravel()[0]) / Fraction(a.ravel()[0])
            if ratio.numerator <= self.max_factor and ratio.denominator <= self.max_factor:
                return ScalesAtJoin(node, sides[0], sides[1], a.ravel()[0], ratio)
        return self.miss(node, "the branches' scales differ and their ratio is not a small fraction")

    def rewrite(self, model: "Model", match: AtInput | ScalesAtJoin) -> None:
        if isinstance(match, AtInput):
            _move_after(model, match.lin, match.node, match.index, match.lin.exact())
        elif match.ratio is None:
            node = match.node
            assert match.left is not None and match.right is not None
            node.replace_input_with(1, match.right.data)
            model.remove_node(match.right.node)
            _move_after(model, match.left, node, 0, match.scale)
        else:
            self._integer_multipliers(model, match)

    @staticmethod
    def _integer_multipliers(model: "Model", match: ScalesAtJoin) -> None:
        """s1·x + s2·y with s2/s1 = p/q → Mul(Add(q·x, p·y), s1/q), the integer factors as Mul nodes."""
        node, ratio = match.node, match.ratio
        assert ratio is not None
        q, p = ratio.denominator, ratio.numerator
        for idx, (lin, factor) in enumerate(((match.left, q), (match.right, p))):
            src = lin.data if lin is not None else node.inputs[idx]
            if factor == 1:
                node.replace_input_with(idx, src)
            else:
                k = model.add_initializer(np.array(float(factor), np.float32), prefix=f"{node.name}_int")
                mul = ir.Node("", "Mul", [src, k], outputs=[model.make_value_like(src)], name=f"{node.name}_int{idx}")
                model.graph.insert_before(node, mul)
                node.replace_input_with(idx, mul.outputs[0])
            if lin is not None:
                model.remove_node(lin.node)
        y = node.outputs[0]
        out = model.make_value_like(y)
        model.replace_uses(y, out)
        scale = np.array(match.scale / q, dtype=object)
        k = model.add_initializer(to_float32(scale), prefix=f"{node.name}_s")
        new = ir.Node("", "Mul", [y, k], outputs=[out], name=f"{node.name}_scale")
        model.graph.insert_after(node, new)
        set_exact(new, scale)


@register_pass(group="reorder")
class MoveMulPastEltwiseMul(Rule):
    """Mul(Mul(x, a), y) → Mul(Mul(x, y), a) for a constant a and a computed y (either input of the product).

    Algebra: products commute and associate, broadcasting included: every output element is a·x·y with the
    elements of a, x and y its broadcast picks. So a gated product of two quantized tensors (squeeze-excitation:
    features times a quantized sigmoid gate) becomes the integer product of their levels (FINN's ElementwiseMul)
    times the product of their scales, which moves on into the next thresholds. Conditions: the inner Mul feeds only
    the product; the product has two computed inputs."""

    op_types = ("Mul",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain) or len(node.inputs) != 2 or const_operand(node) is not None:
            return None
        if any(v is None or const_array(v) is not None for v in node.inputs):
            return None
        for side in (0, 1):
            lin = linear_input(node, side, ("Mul",))
            if lin is not None:
                return AtInput(node, side, lin)
        return None

    def rewrite(self, model: "Model", match: AtInput) -> None:
        _move_after(model, match.lin, match.node, match.index, match.lin.exact())


#: The reorder rules, in the order a round applies them (with the table-driven ones of streamline.move).
REORDER_PASSES = [MoveLinearPastFork, MoveMulPastLinear, MoveAddPastMatMul, MoveAddPastConv, MoveAddPastAveraging,
                  MoveMulPastRelu, MoveLinearPastDataMovement, MoveLinearPastEltwiseAdd, MoveMulPastEltwiseMul,
                  MoveDataMovementPastElementwise]
