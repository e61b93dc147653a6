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

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.base import attrs_of
from finnlite.core.graphutil import is_standard_domain, rank_of, zero_padded
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array, const_shape
from streamline.exact import (channel_vector, const_operand, exact_value, linear_input, set_exact, shaped_for_axis,
                              to_float32)
from streamline.move import (MoveAddPastAveraging, MoveDataMovementPastElementwise, MoveLinearPastDataMovement,
                             MoveMulPastLinear)
from streamline.real_thresholds import exact_sums, fractions_of

if TYPE_CHECKING:
    from finnlite.core.model import Model


def _move_after(model: Any, lin: ir.Node, ci: int, node: ir.Node, index: int,
                new_exact: np.ndarray) -> ir.Node:
    """Rewire input ``index`` of ``node`` to read the input of ``lin`` (which is removed) and put a new Mul/Add of
    ``lin``'s kind with the exact constant ``new_exact`` after ``node``'s output. Returns the new node."""
    node.replace_input_with(index, lin.inputs[1 - ci])
    model.remove_node(lin)
    y = node.outputs[0]
    new_out = model.make_value_like(y)
    model.replace_uses(y, new_out)
    k = model.add_initializer(to_float32(new_exact), prefix=f"{lin.name}_c")
    new = ir.Node("", lin.op_type, [y, k], outputs=[new_out], name=lin.name)
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
        vec = channel_vector(exact_value(lin[0], lin[2]), rank, rank - 1) if rank else None
        if vec is None:
            return self.miss(node, "the Add before the MatMul varies along a non-feature axis")
        return node, lin, vec

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), vec = match
        w = const_array(node.inputs[1])
        k = w.shape[0]
        b = np.array([vec[0]] * k if len(vec) == 1 else list(vec), dtype=object)
        wf = fractions_of(w)
        bw = np.array([sum(b[i] * wf[i, n] for i in range(k)) for n in range(w.shape[1])], dtype=object)
        _move_after(model, lin, ci, node, 0, bw.reshape(1, -1) if rank_of(node.outputs[0], constants=False) else bw)


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
        vec = channel_vector(exact_value(lin[0], lin[2]), rank, 1) if rank else None
        if vec is None:
            return self.miss(node, "the Add before the Conv varies along a spatial axis")
        return node, lin, vec, w, rank

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), vec, w, rank = match
        group = int(attrs_of(node).get("group", 1))
        out_ch, in_per_group = w.shape[0], w.shape[1]
        per_group_out = out_ch // group
        wsum = exact_sums(w.reshape(out_ch, in_per_group, -1), axis=2)  # exact: float32 sums can round
        c = np.empty(out_ch, dtype=object)
        for o in range(out_ch):
            g = o // per_group_out
            c[o] = sum(wsum[o, i] * vec[0 if len(vec) == 1 else g * in_per_group + i] for i in range(in_per_group))
        _move_after(model, lin, ci, node, 0, shaped_for_axis(c, rank, 1))


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
            lin = linear_input(add[0], 1 - add[1], ("Mul",)) if add is not None else None
            uses = node.outputs[0].uses()
            if lin is None or uses and all(u.node.op_type == "MultiThreshold" for u in uses):
                return None  # a quantizer reading the Relu absorbs the chain as it is
        vec = exact_value(lin[0], lin[2])
        if any(v <= 0 for v in vec.ravel()):
            return self.miss(node, "a non-positive scale cannot pass Relu")
        if add is None:
            return node, lin, vec, None
        b = exact_value(add[0], add[2])
        try:
            shifted = np.asarray(b / vec, dtype=object)  # numpy broadcasting of the two exact constants
        except ValueError:
            return self.miss(node, "the Add's and the Mul's constants do not broadcast")
        return node, lin, vec, (add, shifted)

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), vec, shift = match
        if shift is None:
            _move_after(model, lin, ci, node, 0, vec)
            return
        (add, _, _), shifted = shift  # Relu(Add(Mul(x, a), b)) → Relu(Add(x, b/a)), the Mul after the Relu
        k = model.add_initializer(to_float32(shifted), prefix=f"{add.name}_c")
        new_add = ir.Node("", "Add", [lin.inputs[1 - ci], k], outputs=[model.make_value_like(add.outputs[0])],
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
            if lin is not None and linear_input(lin[0], 1 - lin[1], (lin[0].op_type,)) is not None:
                return None
        for side, lin in enumerate(sides):
            if lin is not None and lin[0].op_type == "Add":
                return node, "add", side, lin
        scales = [exact_value(lin[0], lin[2]) if lin is not None else np.array(Fraction(1), dtype=object)
                  for lin in sides]
        if all(s is not None for s in sides) and _equal(scales[0], scales[1]):
            return node, "mul", sides[0], sides[1], scales[0]
        a, b = scales
        if all(x.size == 1 and Fraction(x.ravel()[0]).denominator == 1 for x in (a, b)):
            return None  # integer factors on both branches: already integer arithmetic
        if a.size == 1 and b.size == 1 and a.ravel()[0] > 0 and b.ravel()[0] > 0:
            ratio = Fraction(b.ravel()[0]) / Fraction(a.ravel()[0])
            if ratio.numerator <= self.max_factor and ratio.denominator <= self.max_factor:
                return node, "ratio", sides[0], sides[1], (a.ravel()[0], ratio)
        return self.miss(node, "the branches' scales differ and their ratio is not a small fraction")

    def rewrite(self, model: "Model", match: Any) -> None:
        node, kind = match[0], match[1]
        if kind == "mul":
            _, _, (l, lci, _), (r, rci, _), a = match
            node.replace_input_with(1, r.inputs[1 - rci])
            model.remove_node(r)
            _move_after(model, l, lci, node, 0, a)
        elif kind == "ratio":
            _, _, left, right, (s1, ratio) = match
            q, p = ratio.denominator, ratio.numerator
            for idx, (lin, factor) in enumerate(((left, q), (right, p))):
                src = lin[0].inputs[1 - lin[1]] if lin is not None else node.inputs[idx]
                if factor == 1:
                    node.replace_input_with(idx, src)
                else:
                    k = model.add_initializer(np.array(float(factor), np.float32), prefix=f"{node.name}_int")
                    mul = ir.Node("", "Mul", [src, k], outputs=[model.make_value_like(src)],
                                  name=f"{node.name}_int{idx}")
                    model.graph.insert_before(node, mul)
                    node.replace_input_with(idx, mul.outputs[0])
                if lin is not None:
                    model.remove_node(lin[0])
            y = node.outputs[0]
            out = model.make_value_like(y)
            model.replace_uses(y, out)
            k = model.add_initializer(to_float32(np.array(s1 / q, dtype=object)), prefix=f"{node.name}_s")
            new = ir.Node("", "Mul", [y, k], outputs=[out], name=f"{node.name}_scale")
            model.graph.insert_after(node, new)
            set_exact(new, np.array(s1 / q, dtype=object))
        else:
            _, _, side, (lin, ci, val) = match
            _move_after(model, lin, ci, node, side, exact_value(lin, val))


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
                return node, side, lin
        return None

    def rewrite(self, model: "Model", match: Any) -> None:
        node, side, (lin, ci, val) = match
        _move_after(model, lin, ci, node, side, exact_value(lin, val))


#: The reorder rules, in the order a round applies them (with the table-driven ones of streamline.move).
REORDER_PASSES = [MoveLinearPastFork, MoveMulPastLinear, MoveAddPastMatMul, MoveAddPastConv, MoveAddPastAveraging,
                  MoveMulPastRelu, MoveLinearPastDataMovement, MoveLinearPastEltwiseAdd, MoveMulPastEltwiseMul,
                  MoveDataMovementPastElementwise]
