"""The reorder rules: move scales (Mul) and biases (Add) forward, past linear ops, forks and joins.

Every rule moves an elementwise ``Mul(x, a)`` or ``Add(x, b)`` with a constant operand from before a node to after
it, transforming the constant exactly (Fractions; see :mod:`streamline.exact`). Moving forward until a
MultiThreshold absorbs them (or the graph output is reached) is what makes the interior integer-only. Each rule's
docstring gives its algebra and the conditions under which it is exact.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import is_standard_domain, rank_of, zero_padded
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array, const_shape
from streamline.exact import channel_vector, const_operand, exact_value, set_exact, shaped_for_axis, to_float32
from streamline.real_thresholds import exact_sums, fractions_of

if TYPE_CHECKING:
    from finnlite.core.model import Model


def _linear_input(node: ir.Node, index: int, ops: tuple[str, ...]) -> Any:
    """``(lin, ci, value)`` if input ``index`` of ``node`` is produced by a Mul/Add in ``ops`` with a constant
    operand, feeding only ``node``."""
    v = node.inputs[index] if index < len(node.inputs) else None
    if v is None:
        return None
    lin = v.producer()
    if lin is None or lin.op_type not in ops or not is_standard_domain(lin.domain):
        return None
    if len(v.uses()) != 1 or v.is_graph_output():
        return None
    c = const_operand(lin)
    if c is None:
        return None
    return lin, c[0], c[1]


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


def _scalar(vec: np.ndarray | None) -> bool:
    return vec is not None and len(vec) == 1


@register_pass(group="reorder")
class MoveScalarMulPastMatMul(Rule):
    """MatMul(Mul(x, a), W) → Mul(MatMul(x, W), a) for a scalar a and a constant W.

    Algebra: (a·x)·W = a·(x·W). Condition: the Mul feeds only the MatMul."""

    op_types = ("MatMul",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Mul",))
        if lin is None or const_array(node.inputs[1]) is None:
            return None
        vec = exact_value(lin[0], lin[2]).ravel()
        if len(vec) != 1:
            return self.miss(node, "the Mul before the MatMul is not a scalar (a per-feature scale cannot pass "
                                   "integer weights)")
        return node, lin, vec

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), vec = match
        _move_after(model, lin, ci, node, 0, np.array(vec[0], dtype=object))


@register_pass(group="reorder")
class MoveAddPastMatMul(Rule):
    """MatMul(Add(x, b), W) → Add(MatMul(x, W), b·W) for a constant W and b a scalar or one value per row of W.

    Algebra: (x + b)·W = x·W + b·W, with b·W computed exactly. Condition: the Add feeds only the MatMul."""

    op_types = ("MatMul",)
    aliases = ("MoveScalarAddPastMatMul",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Add",))
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


def _conv_attrs(node: ir.Node) -> dict[str, Any]:
    return {k: a.value for k, a in node.attributes.items()}


def _is_depthwise(node: ir.Node, w: np.ndarray) -> bool:
    group = int(_conv_attrs(node).get("group", 1))
    return group > 1 and w.shape[1] == 1 and w.shape[0] == group


@register_pass(group="reorder")
class MoveMulPastConv(Rule):
    """Conv(Mul(x, a), W) → Mul(Conv(x, W), a) for a scalar a, or a per-channel a before a depthwise Conv.

    Algebra: convolution is linear, and zero padding stays zero under scaling, so Conv(a·x) = a·Conv(x); a
    depthwise Conv maps channel c to channel c only, so a per-channel a passes too (FINN: MoveScalarMulPastConv,
    MoveMulPastDWConv). Condition: the Mul feeds only the Conv; W is constant."""

    op_types = ("Conv",)
    aliases = ("MoveScalarMulPastConv", "MoveMulPastDWConv")

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Mul",))
        w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        if lin is None or w is None:
            return None
        rank = rank_of(node.inputs[0], constants=False)
        vec = channel_vector(exact_value(lin[0], lin[2]), rank, 1) if rank else None
        if vec is None:
            return self.miss(node, "the Mul before the Conv varies along a spatial axis")
        if len(vec) > 1 and not _is_depthwise(node, w):
            return self.miss(node, "a per-channel Mul cannot pass a non-depthwise Conv with integer weights")
        return node, lin, vec, rank

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), vec, rank = match
        _move_after(model, lin, ci, node, 0, shaped_for_axis(vec, rank, 1))


@register_pass(group="reorder")
class MoveAddPastConv(Rule):
    """Conv(Add(x, b), W) → Add(Conv(x, W), c) with c_o = Σ_{i,k} W[o, i, k]·b_i, for an unpadded Conv.

    Algebra: linearity. Condition: no padding — a padded border would see 0 instead of b, so the result would
    differ there; b scalar or per input channel; the Add feeds only the Conv."""

    op_types = ("Conv",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Add",))
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
        group = int(_conv_attrs(node).get("group", 1))
        out_ch, in_per_group = w.shape[0], w.shape[1]
        per_group_out = out_ch // group
        wsum = exact_sums(w.reshape(out_ch, in_per_group, -1), axis=2)  # exact: float32 sums can round
        c = np.empty(out_ch, dtype=object)
        for o in range(out_ch):
            g = o // per_group_out
            c[o] = sum(wsum[o, i] * vec[0 if len(vec) == 1 else g * in_per_group + i] for i in range(in_per_group))
        _move_after(model, lin, ci, node, 0, shaped_for_axis(c, rank, 1))


@register_pass(group="reorder")
class MoveLinearPastMaxPool(Rule):
    """MaxPool(Mul(x, a)) → Mul(MaxPool(x), a) for a ≥ 0; MaxPool(Add(x, b)) → Add(MaxPool(x), b).

    Algebra: max is monotone, so max(a·x) = a·max(x) for a > 0 (and 0 = 0·max(x) for a = 0) and max(x + b) =
    max(x) + b; a and b scalar or per channel (axis 1). A negative factor would turn max into min: left in place
    (:class:`streamline.pool_sign.AbsorbChannelSignIntoMultiThreshold` moves such signs into the weights)."""

    op_types = ("MaxPool",)
    aliases = ("MoveMulPastMaxPool",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Mul", "Add"))
        if lin is None or len(node.outputs) > 1 and node.outputs[1].uses():
            return None
        rank = rank_of(node.inputs[0], constants=False)
        vec = channel_vector(exact_value(lin[0], lin[2]), rank, 1) if rank else None
        if vec is None:
            return self.miss(node, f"the {lin[0].op_type} before MaxPool varies along a spatial axis")
        if lin[0].op_type == "Mul" and any(v < 0 for v in vec):
            return self.miss(node, "a negative scale cannot pass MaxPool")
        return node, lin, vec, rank

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), vec, rank = match
        _move_after(model, lin, ci, node, 0, shaped_for_axis(vec, rank, 1))


@register_pass(group="reorder")
class MoveLinearPastAveragePool(Rule):
    """AveragePool(Mul(x, a)) → Mul(AveragePool(x), a); AveragePool(Add(x, b)) → Add(AveragePool(x), b).

    Algebra: an average is linear and averages a constant to itself. Condition for Add: no padding counted in
    the average (count_include_pad with pads would mix in zeros)."""

    op_types = ("AveragePool", "GlobalAveragePool")

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Mul", "Add"))
        if lin is None:
            return None
        attrs = _conv_attrs(node)
        if lin[0].op_type == "Add" and zero_padded(node) and int(attrs.get("count_include_pad", 0)):
            return self.miss(node, "an Add cannot pass an AveragePool that counts padding")
        rank = rank_of(node.inputs[0], constants=False)
        vec = channel_vector(exact_value(lin[0], lin[2]), rank, 1) if rank else None
        if vec is None:
            return self.miss(node, f"the {lin[0].op_type} before AveragePool varies along a spatial axis")
        return node, lin, vec, rank

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), vec, rank = match
        _move_after(model, lin, ci, node, 0, shaped_for_axis(vec, rank, 1))


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
        lin = _linear_input(node, 0, ("Mul",))
        add = None
        if lin is None:
            add = _linear_input(node, 0, ("Add",))
            lin = _linear_input(add[0], 1 - add[1], ("Mul",)) if add is not None else None
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
class MoveScalarLinearPastInvariants(Rule):
    """Reshape/Flatten/Transpose/Squeeze/Unsqueeze/Identity(op(x, c)) → op(Reshape…(x), c) for a scalar c, and for
    a Transpose also a per-axis c (permuted). Algebra: these ops only move elements (FINN: the same name)."""

    op_types = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity")

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Mul", "Add"))
        if lin is None:
            return None
        val = exact_value(lin[0], lin[2])
        if val.size == 1:
            return node, lin, np.asarray(val.ravel()[0], dtype=object)
        if node.op_type == "Transpose" and "perm" in node.attributes:
            rank = rank_of(node.inputs[0], constants=False)
            if rank is None:
                return None
            full = val.reshape((1,) * (rank - val.ndim) + val.shape)
            return node, lin, np.transpose(full, list(node.attributes["perm"].value))
        out_rank = rank_of(node.outputs[0], constants=False)
        in_shape = node.inputs[0].shape
        if node.op_type in ("Reshape", "Flatten") and out_rank == 2 and in_shape is not None and len(in_shape) == 4:
            vec = channel_vector(val, 4, 1)
            if vec is not None and in_shape[2] == 1 and in_shape[3] == 1:  # [N, C, 1, 1] → [N, C]
                return node, lin, vec.reshape(1, -1)
        return self.miss(node, f"a non-scalar {lin[0].op_type} cannot pass {node.op_type} here")

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), new = match
        _move_after(model, lin, ci, node, 0, new)


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
        sides = [_linear_input(node, i, ("Mul", "Add")) for i in (0, 1)]
        if all(s is None for s in sides):
            return None
        for lin in sides:  # let CollapseRepeated* merge a chain of the same op first (Add after Mul is canonical)
            if lin is not None and _linear_input(lin[0], 1 - lin[1], (lin[0].op_type,)) is not None:
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
class MoveLinearPastConcat(Rule):
    """Concat(Mul(x1, a1), …, Mul(xn, an); axis=1) → Mul(Concat(x1, …, xn), [a1 … an]) with per-channel vectors
    (likewise for Add). Algebra: each channel keeps its own factor. Conditions: every input is such a Mul (Add)
    with a scalar or per-channel constant, each feeding only the Concat; the channel counts are known. Equal factors
    on every channel (one quantizer shared by the inputs) give a scalar, which can then pass a Conv."""

    op_types = ("Concat",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        axis = int(node.attributes["axis"].value) if "axis" in node.attributes else 0
        rank = rank_of(node.outputs[0], constants=False)
        if rank is None or axis % rank != 1:
            return None
        lins = [_linear_input(node, i, ("Mul", "Add")) for i in range(len(node.inputs))]
        if any(x is None for x in lins) or len({x[0].op_type for x in lins}) != 1:
            return None
        vecs = []
        for i, (lin, ci, val) in enumerate(lins):
            vec = channel_vector(exact_value(lin, val), rank, 1)
            ch = node.inputs[i].shape[1] if node.inputs[i].shape is not None else None
            if vec is None or not isinstance(ch, int):
                return self.miss(node, "a Concat input's constant varies along a spatial axis")
            vecs.append(np.array([vec[0]] * ch if len(vec) == 1 else list(vec), dtype=object))
        vec = np.concatenate(vecs)
        if all(v == vec[0] for v in vec):  # one quantizer on every input (equal scales): the factor stays scalar
            vec = vec[:1]
        return node, lins, vec, rank

    def rewrite(self, model: "Model", match: Any) -> None:
        node, lins, vec, rank = match
        for i, (lin, ci, _) in enumerate(lins[1:], start=1):
            node.replace_input_with(i, lin.inputs[1 - ci])
            model.remove_node(lin)
        lin, ci, _ = lins[0]
        _move_after(model, lin, ci, node, 0, shaped_for_axis(vec, rank, 1))


@register_pass(group="reorder")
class MoveLinearPastPad(Rule):
    """Pad(Mul(x, a), v) → Mul(Pad(x, v/a), a); Pad(Add(x, b), v) → Add(Pad(x, v − b), b) (constant mode).

    Algebra: the border of the result must stay v: a·(v/a) = v and (v − b) + b = v. Conditions: constant mode, a
    scalar constant (a per-channel one would need a per-channel pad value), a ≠ 0, the new pad value exact in
    float32; the Mul/Add feeds only the Pad. With v = 0 a Mul passes unchanged; FINN's rule that moved a Mul past
    a Pad with a non-zero fill value changed the border."""

    op_types = ("Pad",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = _linear_input(node, 0, ("Mul", "Add"))
        if lin is None:
            return None
        mode = node.attributes["mode"].value if "mode" in node.attributes else "constant"
        if mode != "constant":
            return self.miss(node, f"a linear op cannot pass a Pad in {mode} mode")
        val = exact_value(lin[0], lin[2])
        if val.size != 1:
            return self.miss(node, f"a non-scalar {lin[0].op_type} cannot pass a Pad (the fill value is scalar)")
        a = val.ravel()[0]
        fill = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if len(node.inputs) > 2 and node.inputs[2] is not None and fill is None:
            return self.miss(node, "the pad value is not a constant")
        v = Fraction(float(np.asarray(fill).ravel()[0])) if fill is not None else Fraction(0)
        if lin[0].op_type == "Mul":
            if a == 0:
                return self.miss(node, "a zero scale cannot pass a Pad")
            new_v = v / a
        else:
            new_v = v - a
        if Fraction(float(np.float32(float(new_v)))) != new_v:
            return self.miss(node, "the moved pad value is not exact in float32")
        return node, lin, new_v, val

    def rewrite(self, model: "Model", match: Any) -> None:
        node, (lin, ci, _), new_v, val = match
        if new_v != 0 or len(node.inputs) > 2:
            k = model.add_initializer(np.array(float(new_v), np.float32), prefix=f"{node.name}_fill")
            if len(node.inputs) > 2:
                node.replace_input_with(2, k)
            else:
                while len(node.inputs) < 2:
                    node.resize_inputs(len(node.inputs) + 1)
                node.resize_inputs(3)
                node.replace_input_with(2, k)
        _move_after(model, lin, ci, node, 0, val)


#: The reorder rules, in the order a round applies them.
REORDER_PASSES = [MoveLinearPastFork, MoveScalarMulPastMatMul, MoveAddPastMatMul, MoveMulPastConv, MoveAddPastConv,
                  MoveLinearPastMaxPool, MoveLinearPastAveragePool, MoveMulPastRelu, MoveScalarLinearPastInvariants,
                  MoveLinearPastPad,
                  MoveLinearPastEltwiseAdd, MoveLinearPastConcat]
