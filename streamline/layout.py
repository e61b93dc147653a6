"""NCHW → NHWC for the whole graph, and FINN's local Transpose rules.

After LowerConvsToMatMul and MakeMaxPoolNHWC the graph is NCHW with NHWC islands (Im2Col, MatMul, MaxPoolNHWC)
wrapped in Transposes. FINN's default flow then moves Transposes locally and leaves some two dozen of them inside
a MobileNet or ResNet. :class:`ConvertToNHWC` instead rewrites the whole graph in one walk so that the only
Transpose left is one NCHW→NHWC at the graph input (:mod:`streamline.layout_walk` holds the per-op rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from finnlite.core.graphutil import take_over
from finnlite.core.passes import PassResult, Rule, Transformation, register_pass
from finnlite.core.shapes import const_array
from streamline.lower_common import (TO_NCHW, attr, copy_annotations, identity, is_op, new_value, shape_of, then,
                                     transpose_perm)
from streamline.layout_walk import LayoutWalk

if TYPE_CHECKING:
    from finnlite.core.model import Model


def _is_transpose(node: ir.Node | None, perm: tuple[int, ...] | None = None) -> bool:
    if not is_op(node, "Transpose", custom=False):
        return False
    if perm is None:
        return True
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else len(perm)
    return transpose_perm(node, rank) == perm


@register_pass(group="lower")
class ConvertToNHWC(Transformation):
    """Convert the graph to NHWC with at most one Transpose, NCHW→NHWC right after each 4-D NCHW graph input.

    qonnx's name for the job: ConvertToChannelsLastAndClean (:attr:`aliases`).

    Pattern: the whole graph, once it has a 4-D tensor (a graph without any keeps its layout). Algebra: every
    tensor ``t`` of the NCHW graph is represented by a tensor ``u = t.transpose(p)`` with a known permutation ``p``
    (NHWC is ``p = (0, 2, 3, 1)``); a graph input gets its ``u`` from one inserted Transpose. Walking the nodes in
    topological order (see :class:`streamline.layout_walk.LayoutWalk` for each op's rule):

    * a Transpose ``q`` of ``t`` is removed: its output ``t.transpose(q)`` is represented by the same ``u``, with the
      permutation "``q⁻¹``, then ``p``" (so the Transposes that LowerConvsToMatMul and MakeMaxPoolNHWC put around
      their NHWC ops vanish); a Transpose that reads a graph input is kept;
    * elementwise ops (Add, Mul, Relu, Quant, ...) act on ``u``; constant operands are transposed the same way
      (a per-channel ``[1, C, 1, 1]`` becomes ``[1, 1, 1, C]``); MultiThreshold and QuantAvgPool2d get the
      permuted ``data_layout`` (NHWC), their thresholds unchanged; Concat's axis follows the channel axis; a MatMul
      that keeps the last axis last acts on ``u`` directly;
    * a flatten (Flatten, or a Reshape to ``[N, F]``) of a permuted tensor with H·W > 1 orders its features
      differently; the following MatMul's weight rows are permuted instead of transposing back (per-feature
      constants and MultiThreshold rows on the way are permuted likewise, the exact real thresholds with them),
      provided every path from the flatten ends in such a MatMul — else the flatten reads a Transpose back;
    * anything else (an op that needs NCHW, such as a Conv that was not lowered) gets a Transpose back to the
      original layout, recorded as a miss; so do graph outputs, which keep their original layout.

    The result is the same function of the graph inputs (data movement only; no value changes). Every tensor of
    rank 4 or 2 that the walk touches is annotated with its ``tensor_layout``; new tensors copy the datatype of the
    tensor they permute."""

    aliases = ("ConvertToChannelsLastAndClean",)

    def run(self, model: "Model", declined: frozenset[str] = frozenset()) -> PassResult:
        model.infer_shapes(only_missing=True)
        if not any(o.shape is not None and len(o.shape) == 4 for n in model.graph for o in n.outputs):
            return PassResult(False, 0)
        walk = LayoutWalk(model, self.name)
        walk.insert_input_transposes()
        walk.run()
        return PassResult(walk.edits > 0, walk.edits, tuple(walk.misses))


@dataclass(frozen=True, slots=True, eq=False)
class TransposeBeforeThresholds:
    """A Transpose to NCHW (``transpose``) read only by MultiThreshold ``mt``; ``shape``: the Transpose's static
    input shape."""

    transpose: ir.Node
    mt: ir.Node
    shape: tuple[int, ...]


@register_pass(group="lower")
class AbsorbTransposeIntoMultiThreshold(Rule):
    """Transpose(NHWC→NCHW) → MultiThreshold   ⇒   MultiThreshold(data_layout=NHWC) → Transpose(NHWC→NCHW).

    Pattern: a Transpose with perm (0, 3, 1, 2) whose only consumer is a MultiThreshold in NCHW layout (explicit or
    the rank-4 default). Algebra: thresholding is elementwise with thresholds chosen by channel, so thresholding the
    NHWC tensor along its last axis and transposing gives the same tensor; the thresholds (and exact real
    thresholds) are unchanged. FINN's rule of the same name; the moved Transpose can then meet the next one
    (AbsorbConsecutiveTransposes)."""

    op_types = ("Transpose",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not _is_transpose(node, TO_NCHW):
            return None
        out = node.outputs[0]
        if out.is_graph_output() or len(out.uses()) != 1:
            return None
        mt = next(iter(out.uses())).node
        if not is_op(mt, "MultiThreshold", custom=True) or mt.inputs[0] is not out:
            return None
        if str(attr(mt, "data_layout", "") or "NCHW") != "NCHW":
            return self.miss(mt, "the MultiThreshold is not in NCHW layout")
        shape = shape_of(model, node.inputs[0])
        if shape is None:
            return self.miss(node, "the Transpose input has no static shape")
        return TransposeBeforeThresholds(node, mt, tuple(shape))

    def rewrite(self, model: "Model", match: TransposeBeforeThresholds) -> None:
        tr, mt, shape = match.transpose, match.mt, match.shape
        y = mt.outputs[0]
        name = mt.name or "MultiThreshold"
        mid = new_value(model, f"{name}_nhwc", shape, None, ["N", "H", "W", "C"])
        copy_annotations(model, y, mid)
        attrs = [a for k, a in mt.attributes.items() if k != "data_layout"]
        new_mt = ir.Node(mt.domain, mt.op_type, [tr.inputs[0], mt.inputs[1]],
                         attributes=attrs + [ir.AttrString("data_layout", "NHWC")], outputs=[mid], name=mt.name)
        new_mt.metadata_props.update(mt.metadata_props)
        y_new = new_value(model, f"{name}_out", shape_of(model, y), None, ["N", "C", "H", "W"])
        copy_annotations(model, y, y_new)
        new_tr = ir.Node("", "Transpose", [mid], attributes=[ir.AttrInt64s("perm", list(TO_NCHW))],
                         outputs=[y_new], name=tr.name)
        model.graph.insert_after(mt, [new_mt, new_tr])
        take_over(model, y, y_new)
        model.remove_node(mt)
        model.remove_node(tr)


@register_pass(group="lower")
class AbsorbConsecutiveTransposes(Rule):
    """Transpose(p) → Transpose(q)   ⇒   nothing, where q undoes p.

    Pattern: a Transpose followed by Transposes; each consumer Transpose whose perm composes with the first to the
    identity is bypassed (its consumers read the first one's input), and the first is removed once nothing reads
    it. FINN's rule requires every consumer to be such a Transpose; this one also cancels the matching branches of a
    fork. Condition: a bypassed output that is a graph output is kept unless the source can take over its name
    (the source is not a graph input or another graph output). Algebra: ``x.transpose(p).transpose(q) = x`` when
    ``q = p⁻¹``."""

    op_types = ("Transpose",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        src = node.inputs[0]
        if src is None or const_array(src) is not None or node.inputs[0].shape is None:
            return None
        rank = len(node.inputs[0].shape)
        p = transpose_perm(node, rank)
        undo = [u.node for u in node.outputs[0].uses()
                if _is_transpose(u.node) and then(p, transpose_perm(u.node, rank)) == identity(rank)]
        undo = list(dict.fromkeys(undo))
        if src.is_graph_input() or src.is_graph_output():
            undo = [t for t in undo if not t.outputs[0].is_graph_output()]
        return (node, undo) if undo else None

    def rewrite(self, model: "Model", match: Any) -> None:
        node, undo = match
        src = node.inputs[0]
        for t in undo:
            out = t.outputs[0]
            if out.is_graph_output():
                take_over(model, out, src)
            else:
                out.replace_all_uses_with(src)
            model.remove_node(t)
        if not node.outputs[0].uses() and not node.outputs[0].is_graph_output():
            model.remove_node(node)

