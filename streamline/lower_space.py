"""DepthToSpace and SpaceToDepth as the Reshape–Transpose–Reshape chains they are.

A sub-pixel convolution (ESPCN's ``PixelShuffle``) ends in a DepthToSpace, which FINN has no layer for; written as
a Reshape, a Transpose and a Reshape it is data movement the NHWC conversion folds into the layout
(:mod:`streamline.layout_reshape`): at a graph output into the one Transpose back to NCHW, elsewhere one
Reshape–Transpose–Reshape on the NHWC stream, which FINN's ``InferShuffle`` maps to its ``Shuffle`` layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import add_constant, is_standard_domain, take_over
from finnlite.core.passes import Rule, register_pass
from streamline.lower_common import attr, copy_annotations, new_value, shape_of

if TYPE_CHECKING:
    from finnlite.core.model import Model


def space_depth_chain(op: str, shape: tuple[int, int, int, int], block: int, mode: str
                      ) -> tuple[list[int], list[int], list[int]]:
    """``(first shape, perm, final shape)`` of the Reshape–Transpose–Reshape equal to DepthToSpace (mode DCR or
    CRD) or SpaceToDepth with ``block`` on an NCHW tensor of ``shape`` (the ONNX definitions)."""
    n, c, h, w = shape
    b = block
    if op == "DepthToSpace":
        out_c = c // (b * b)
        if mode == "CRD":
            return [n, out_c, b, b, h, w], [0, 1, 4, 2, 5, 3], [n, out_c, h * b, w * b]
        return [n, b, b, out_c, h, w], [0, 3, 4, 1, 5, 2], [n, out_c, h * b, w * b]
    return [n, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4], [n, c * b * b, h // b, w // b]


@dataclass(frozen=True, slots=True, eq=False)
class SpaceDepthSteps:
    """A DepthToSpace/SpaceToDepth ``node`` as its three steps: Reshape to ``first``, Transpose by ``perm``,
    Reshape to ``final``."""

    node: ir.Node
    first: list[int]
    perm: list[int]
    final: list[int]


@register_pass(group="lower")
class LowerDepthToSpace(Rule):
    """DepthToSpace / SpaceToDepth(x) → Reshape(Transpose(Reshape(x, s₁), p), s₂).

    Pattern: a DepthToSpace (DCR or CRD) or SpaceToDepth of a 4-D tensor with a static shape. Algebra: the ONNX
    definitions of both ops are these three steps (:func:`space_depth_chain`); only data moves, so the tensors keep
    their datatype."""

    op_types = ("DepthToSpace", "SpaceToDepth")

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain):
            return None
        shape = shape_of(model, node.inputs[0])
        if shape is None or len(shape) != 4:
            return self.miss(node, "the input shape is not static and 4-D")
        block = int(attr(node, "blocksize", 0))
        if block < 1:
            return self.miss(node, "no blocksize")
        mode = str(attr(node, "mode", "DCR") or "DCR")
        return SpaceDepthSteps(node, *space_depth_chain(node.op_type, shape, block, mode))

    def rewrite(self, model: "Model", match: SpaceDepthSteps) -> None:
        node, first, perm, final = match.node, match.first, match.perm, match.final
        x, y = node.inputs[0], node.outputs[0]
        name = node.name or node.op_type
        s1 = add_constant(model, np.asarray(first, np.int64), f"{name}_split")
        s2 = add_constant(model, np.asarray(final, np.int64), f"{name}_merge")
        a = new_value(model, f"{name}_split", first, None)
        b = new_value(model, f"{name}_moved", [first[i] for i in perm], None)
        out = new_value(model, f"{name}_out", final, None)
        for v in (a, b, out):
            copy_annotations(model, x, v)
        nodes = [ir.Node("", "Reshape", [x, s1], outputs=[a], name=f"{name}_split"),
                 ir.Node("", "Transpose", [a], attributes=[ir.AttrInt64s("perm", perm)], outputs=[b],
                         name=f"{name}_transpose"),
                 ir.Node("", "Reshape", [b, s2], outputs=[out], name=f"{name}_merge")]
        model.graph.insert_after(node, nodes)
        take_over(model, y, out)
        model.remove_node(node)
