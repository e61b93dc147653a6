"""The tidy stage: shapes, constants and canonical forms before conversion.

The rewrites here compute the same values as the original in float32 (so that the convert stage can be compared
bit for bit with the original), with one exception: a Gemm with a bias input C, whose onnxruntime kernel adds C
inside its accumulation, so MatMul + Add may differ from it in the last bit (relative 1e-7). Scalings that would round differently (Div → Mul
by a reciprocal, BatchNorm → Mul + Add) are left to the streamlining stages, which are checked against exact
arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.passes import Rule, Transformation, register_pass
from finnlite.core.shapes import const_array
from streamline.convert_qcdq import QCDQToQuant

if TYPE_CHECKING:
    from finnlite.core.model import Model

_QUANT_OPS = ("Quant", "IntQuant", "BipolarQuant")


@register_pass(group="tidy")
class InferShapes(Transformation):
    """Infer the shape of every tensor that has none (custom ops included). Changes no node."""

    def apply(self, model: Any) -> bool:
        model.infer_shapes(only_missing=True)
        return False


@register_pass(group="tidy")
class MakeNodeNamesUnique(Transformation):
    """Name unnamed nodes ``<OpType>_<k>`` and make repeated node names unique with a suffix; unique names stay
    (:meth:`finnlite.Model.make_node_names_unique`; qonnx's GiveUniqueNodeNames renames every node instead). Run
    first, so that the nodes rewrites derive from distinct names get distinct names, and last, so that the result
    loads in onnxruntime and FINN. Changes names only."""

    aliases = ("GiveUniqueNodeNames",)

    def apply(self, model: Any) -> bool:
        return model.make_node_names_unique()


@register_pass(group="tidy")
class FoldConstants(Transformation):
    """Fold standard ops whose inputs are all constant into initializers; drop dead nodes and unused initializers.

    Custom ops (weight quantizers among them) are never folded here: the convert stage folds them deliberately."""

    def apply(self, model: Any) -> bool:
        return model.cleanup(fold_constants=True)


def _transpose_2d(arr: np.ndarray) -> np.ndarray:
    """Transpose a constant that broadcasts against a 2-D tensor (scalars and 1-element arrays stay)."""
    if arr.size == 1:
        return arr
    return np.atleast_2d(arr).T.copy()


def _transposed_weight(model: Any, w: ir.Value) -> ir.Value | None:
    """A [K, N] version of the [N, K] weight ``w`` without a Transpose node, if possible: a constant is transposed,
    and so is a weight quantizer's constant input together with its per-channel parameters (a quantizer is
    elementwise, so transposing its inputs transposes its output exactly)."""
    arr = const_array(w)
    if arr is not None:
        return model.add_initializer(arr.T.copy(), prefix=f"{w.name}_T")
    q = w.producer()
    if q is None or q.op_type not in _QUANT_OPS or len(w.uses()) != 1 or w.is_graph_output():
        return None
    params = [const_array(v) for v in q.inputs]
    if any(p is None or p.ndim > 2 for p in params):
        return None
    out = model.make_value(f"{w.name}_T")
    new_inputs = [model.add_initializer(params[0].T.copy(), prefix=f"{q.inputs[0].name}_T")]
    for v, p in zip(q.inputs[1:], params[1:]):
        new_inputs.append(v if p.size == 1 else model.add_initializer(_transpose_2d(p), prefix=f"{v.name}_T"))
    node = ir.Node(q.domain, q.op_type, new_inputs, attributes=list(q.attributes.values()), outputs=[out],
                   name=f"{q.name}_T")
    model.graph.insert_after(q, node)
    return out


def _transpose_node(model: Any, anchor: ir.Node, x: ir.Value) -> ir.Value:
    out = model.make_value(f"{x.name}_T")
    node = ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", [1, 0])], outputs=[out],
                   name=f"{anchor.name}_transpose")
    model.graph.insert_before(anchor, node)
    return out


@register_pass(group="tidy")
class GemmToMatMul(Rule):
    """Gemm(A, B, C; alpha, beta, transA, transB) → MatMul(A', B') [· alpha] [+ beta·C].

    Pattern: any Gemm. Algebra: Gemm = alpha·op(A)·op(B) + beta·C with op the optional transpose. A transposed
    constant B (or a weight quantizer of a constant, with its per-channel parameters) is transposed in place so that
    MatMul weights are [K, N] as FINN expects; otherwise a Transpose node is inserted. The Mul (alpha ≠ 1) and Add
    (C present) follow the MatMul. Without C and with alpha = 1 the result is bit-identical to the Gemm's; with C it
    may differ in the last bit, as onnxruntime's Gemm adds C inside its accumulation."""

    op_types = ("Gemm",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
            return self.miss(node, "Gemm without two inputs")
        return node

    def rewrite(self, model: "Model", node: ir.Node) -> None:
        attrs = {k: a.value for k, a in node.attributes.items()}
        a, b = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if attrs.get("transA", 0):
            a = _transpose_node(model, node, a)
        if attrs.get("transB", 0):
            b = _transposed_weight(model, b) or _transpose_node(model, node, b)
        y = node.outputs[0]
        mm_out = model.make_value(f"{node.name}_mm", dtype=None)
        new_nodes = [ir.Node("", "MatMul", [a, b], outputs=[mm_out], name=f"{node.name}_MatMul")]
        cur = mm_out
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        if alpha != 1.0:
            out = model.make_value(f"{node.name}_alpha")
            k = model.add_initializer(np.array(alpha, np.float32), prefix=f"{node.name}_alpha")
            new_nodes.append(ir.Node("", "Mul", [cur, k], outputs=[out], name=f"{node.name}_Mul"))
            cur = out
        if c is not None:
            if beta != 1.0:
                cb = const_array(c)
                if cb is not None:
                    c = model.add_initializer((cb * np.float32(beta)).astype(np.float32), prefix=f"{c.name}_beta")
                else:
                    out = model.make_value(f"{node.name}_beta")
                    k = model.add_initializer(np.array(beta, np.float32), prefix=f"{node.name}_beta")
                    new_nodes.append(ir.Node("", "Mul", [c, k], outputs=[out], name=f"{node.name}_MulC"))
                    c = out
            out = model.make_value(f"{node.name}_bias")
            new_nodes.append(ir.Node("", "Add", [cur, c], outputs=[out], name=f"{node.name}_Add"))
            cur = out
        model.graph.insert_after(node, new_nodes)
        if y.shape is not None:
            cur.shape = y.shape
        if y.dtype is not None:
            cur.dtype = y.dtype  # a value with a shape and no element type is not serialized as qonnx wants it
        model.replace_uses(y, cur)
        model.remove_node(node)


@register_pass(group="tidy")
class ConvBiasToAdd(Rule):
    """Conv(x, W, b) → Add(Conv(x, W), b reshaped to [1, C, 1, ...]).

    Pattern: a Conv with a third (bias) input. Algebra: the bias is added to every output position of its channel,
    which is an Add broadcast along the channel axis 1. A bias given by a quantizer keeps its quantizer; the
    constant shape [C] becomes [1, C, 1, 1] through a Reshape of the quantizer's output (folded later when the
    quantizer is)."""

    op_types = ("Conv", "ConvTranspose")
    aliases = ("ExtractBiasFromConv",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if len(node.inputs) < 3 or node.inputs[2] is None:
            return None
        return node

    def rewrite(self, model: "Model", node: ir.Node) -> None:
        bias = node.inputs[2]
        y = node.outputs[0]
        rank = len(y.shape) if y.shape is not None else 4
        arr = const_array(bias)
        pre: list[ir.Node] = []
        if arr is not None:
            b = model.add_initializer(arr.reshape([1, -1] + [1] * (rank - 2)), prefix=f"{bias.name}_b")
        else:
            shape = model.add_initializer(np.array([1, -1] + [1] * (rank - 2), np.int64), prefix="bias_shape")
            b = model.make_value(f"{bias.name}_b")
            pre.append(ir.Node("", "Reshape", [bias, shape], outputs=[b], name=f"{node.name}_bias_reshape"))
        conv_out = model.make_value_like(y, f"{node.name}_nobias")
        new_conv = ir.Node(node.domain, node.op_type, list(node.inputs[:2]), attributes=list(node.attributes.values()),
                           outputs=[conv_out], name=node.name)
        add_out = model.make_value_like(y, f"{node.name}_bias")
        add = ir.Node("", "Add", [conv_out, b], outputs=[add_out], name=f"{node.name}_bias_add")
        model.graph.insert_after(node, pre + [new_conv, add])
        model.replace_uses(y, add_out)
        model.remove_node(node)


@register_pass(group="tidy")
class SubToAdd(Rule):
    """Sub(x, c) → Add(x, −c) for a constant c.

    Exact: negation is exact in floating point and x − c = x + (−c) in IEEE arithmetic."""

    op_types = ("Sub",)
    aliases = ("ConvertSubToAdd",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        c = const_array(node.inputs[1])
        if c is None:
            return self.miss(node, "subtrahend is not a constant")
        return node, c

    def rewrite(self, model: "Model", match: Any) -> None:
        node, c = match
        neg = model.add_initializer(np.negative(c), prefix=f"{node.inputs[1].name}_neg")
        add = ir.Node("", "Add", [node.inputs[0], neg], outputs=[model.make_value_like(node.outputs[0])],
                      name=f"{node.name}_Add")
        model.graph.insert_after(node, add)
        model.replace_uses(node.outputs[0], add.outputs[0])
        model.remove_node(node)


@dataclass(frozen=True, slots=True, eq=False)
class TransposedQuantWeight:
    """A Transpose (``node``, permutation ``perm``) of the output of weight quantizer ``quant`` whose inputs are the
    constants ``params`` (the weight first)."""

    node: ir.Node
    quant: ir.Node
    params: tuple[np.ndarray, ...]
    perm: list[int]


@register_pass(group="tidy")
class FoldTransposeIntoQuantInit(Rule):
    """Transpose(Quant(W, s, z, b), perm) → Quant(Wᵀ, sᵀ, zᵀ, b) for a weight quantizer (qonnx's name).

    Pattern: a Transpose whose input is the only use of a Quant/BipolarQuant output, all of whose inputs are
    constants (the TorchScript exporter's Linear without bias: weight quantizer → Transpose → MatMul). Algebra: a
    quantizer is elementwise, so transposing its inputs transposes its output exactly: the constant W is transposed
    by ``perm``, and every parameter of more than one element is broadcast to W's rank (leading 1s, as numpy
    broadcasting does) and transposed by the same ``perm``; scalars and the bit width stay. The weight quantizer then
    feeds its consumer directly and is folded by the convert stage."""

    op_types = ("Transpose",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        w = node.inputs[0]
        q = w.producer() if w is not None else None
        if q is None or q.op_type not in _QUANT_OPS:
            return None
        if len(w.uses()) != 1 or w.is_graph_output():
            return self.miss(node, "the quantized weight has another consumer")
        params = [const_array(v) if v is not None else None for v in q.inputs]
        if any(p is None for p in params):
            return self.miss(node, "the quantizer has a non-constant input")
        rank = params[0].ndim
        perm_attr = node.attributes.get("perm")
        perm = list(perm_attr.value) if perm_attr is not None else list(reversed(range(rank)))
        if sorted(perm) != list(range(rank)) or any(p.ndim > rank for p in params[1:]):
            return self.miss(node, "perm or parameter ranks do not fit the weight")
        return TransposedQuantWeight(node, q, tuple(params), perm)

    def rewrite(self, model: "Model", match: TransposedQuantWeight) -> None:
        node, q, params, perm = match.node, match.quant, match.params, match.perm
        rank = len(perm)
        inputs = [model.add_initializer(np.transpose(params[0], perm).copy(), prefix=f"{q.inputs[0].name}_T")]
        for i, (v, p) in enumerate(zip(q.inputs[1:], params[1:]), start=1):
            if p.size == 1 or (q.op_type != "BipolarQuant" and i == 3):  # scalars and the bit width stay
                inputs.append(v)
                continue
            full = p.reshape((1,) * (rank - p.ndim) + p.shape)
            inputs.append(model.add_initializer(np.transpose(full, perm).copy(), prefix=f"{v.name}_T"))
        out = node.outputs[0]
        new = ir.Node(q.domain, q.op_type, inputs, attributes=list(q.attributes.values()),
                      outputs=[model.make_value_like(out, f"{out.name}_q")], name=f"{q.name}_T")
        model.graph.insert_before(node, new)
        model.replace_uses(out, new.outputs[0])
        model.remove_node(node)
        model.remove_node(q)


#: The tidy stage, in order.
#: QCDQToQuant comes before constant folding, which would fold weight QDQ chains into plain float weights.
TIDY_PASSES = [MakeNodeNamesUnique, InferShapes, QCDQToQuant, FoldConstants, FoldTransposeIntoQuantInit, GemmToMatMul,
               ConvBiasToAdd, SubToAdd, FoldConstants, InferShapes]
