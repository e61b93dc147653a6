"""The output dequantization before the layout ops that end the graph, the form FINN's hand-off keeps.

A network that ends in a global pool without a classifier after it (SqueezeNet: a 1×1 Conv, ReLU and global
average pool) leaves ``pool → Flatten → Mul(scale) → output``. finn-plus 1.6.1's ``step_convert_to_hw`` makes the
Mul an ``ElementwiseMul`` and then removes the Flatten between two HW layers (``RemoveCNVtoFCFlatten``) without
changing the Mul's expected shape, and fails (``Input shape mismatch: ElementwiseMul ... Expected [1, 10], got
[1, 1, 1, 10]``). :class:`MoveOutputScaleBeforeLayout` moves the final Mul/Add in front of the layout ops, which
then end the graph in software, where FINN leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import take_over
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["MoveOutputScaleBeforeLayout"]

_LAYOUT = ("Flatten", "Reshape", "Squeeze", "Unsqueeze")


@dataclass(frozen=True, slots=True, eq=False)
class ConstantAfterLayout:
    """A Mul/Add (``node``, its constant at input ``const_index``) at the graph output after ``layout``, and the
    constant as it reads before the layout op (``constant``)."""

    node: ir.Node
    const_index: int
    layout: ir.Node
    constant: np.ndarray


@register_pass(group="finalize")
class MoveOutputScaleBeforeLayout(Rule):
    """L(x) → Mul/Add(·, c) → graph output  ⇒  Mul/Add(x, c') → L → graph output, for a layout op L (Flatten,
    Reshape, Squeeze, Unsqueeze) that keeps the element order.

    Algebra: L moves no element, so an elementwise op with a scalar constant commutes with it; a constant of one
    value per element of the last axis (``[C]``, ``[1, C]``) commutes when L maps ``[N, 1, …, 1, C]`` to ``[N, C]``
    (c' is c reshaped to ``[1, …, 1, C]``). Exact, op for op; checked under the default tolerance because
    onnxruntime may fuse the moved Mul/Add into the MatMul before it (a different float32 rounding). Conditions: L's only consumer is the Mul/Add, whose output
    is a graph output (directly, or through one more Mul/Add, moved first)."""

    op_types = ("Mul", "Add")

    def match(self, model: "Model", node: ir.Node) -> Any:
        y = node.outputs[0]
        if not y.is_graph_output() and not (len(y.uses()) == 1 and next(iter(y.uses())).node.op_type in ("Mul", "Add")
                                            and next(iter(y.uses())).node.outputs[0].is_graph_output()):
            return None
        if len(node.inputs) != 2:
            return None
        ci = 1 if const_array(node.inputs[1]) is not None else 0 if const_array(node.inputs[0]) is not None else None
        if ci is None:
            return None
        x = node.inputs[1 - ci]
        layout = x.producer()
        if layout is None or layout.op_type not in _LAYOUT or len(x.uses()) != 1 or x.is_graph_output():
            return None
        c = const_array(node.inputs[ci])
        if c.size == 1:
            return ConstantAfterLayout(node, ci, layout, c.reshape(()))
        src, out = layout.inputs[0].shape, x.shape
        if src is None or out is None or len(out) != 2 or any(not isinstance(d, int) for d in list(src) + list(out)):
            return self.miss(node, "a per-element constant cannot pass a layout op of unknown shapes")
        if len(src) < 2 or any(d != 1 for d in src[1:-1]) or src[-1] != out[-1] or c.size != out[-1] or (
                c.ndim > 2 or c.ndim == 2 and c.shape[0] != 1):
            return self.miss(node, f"the constant does not follow the {layout.op_type}'s last axis")
        return ConstantAfterLayout(node, ci, layout, c.reshape((1,) * (len(src) - 1) + (c.size,)))

    def rewrite(self, model: "Model", match: ConstantAfterLayout) -> None:
        node, ci, layout, c = match.node, match.const_index, match.layout, match.constant
        y, out, src = node.outputs[0], layout.outputs[0], layout.inputs[0]
        k = model.add_initializer(np.asarray(c, dtype=const_array(node.inputs[ci]).dtype), prefix=f"{node.name}_c")
        moved = ir.Node(node.domain, node.op_type, [src, k], attributes=list(node.attributes.values()),
                        outputs=[model.make_value_like(src)], name=node.name)
        for key, val in node.metadata_props.items():
            moved.metadata_props[key] = val
        model.graph.insert_before(layout, moved)
        layout.replace_input_with(0, moved.outputs[0])
        take_over(model, y, out)  # the layout op ends the chain now, under the Mul/Add's output name
        model.remove_node(node)
        for v in (moved.outputs[0], out):  # float now (InferDataTypes, after this pass, sees them afresh)
            ann = dict(v.meta.get("quant_parameter_tensor_names") or {})
            ann.pop("finn_datatype", None)
            v.meta["quant_parameter_tensor_names"] = ann
