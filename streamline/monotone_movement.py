"""A monotone activation moves after the data movement that follows it, towards the quantizer that absorbs it.

Brevitas' layerwise PTQ quantizes only the inputs of its layers, so a float ReLU of a layer's output can be read by
a MaxPool, a Concat (SqueezeNet's fire modules) or a reshape before the next layer's input quantizer. The
MultiThreshold absorbs a ReLU only when it reads it directly (:class:`streamline.absorb.AbsorbReluIntoMultiThreshold`);
this rule brings the ReLU there, so that the scale and bias before it can move on too.

The data-movement ops here (``DATA_MOVEMENT``) are the ones whose every output element is one element of their data
input(s), plus MaxPool, a monotone selection; ``ACTIVATIONS`` are the elementwise monotone ops (those applying
one monotone function to every element).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from finnlite.core.graphutil import clip_bounds, is_standard_domain
from finnlite.core.passes import Rule, register_pass
from finnlite.core.policies import equality
from finnlite.core.shapes import const_array

#: elementwise non-decreasing activations that apply one function to every element
ACTIVATIONS = ("Relu", "Clip")
#: ops whose every output element is an element of their data input (data movement), or the max of some (MaxPool)
DATA_MOVEMENT = ("MaxPool", "MaxPoolNHWC", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity",
                 "Slice", "DepthToSpace", "SpaceToDepth", "Gather", "Concat", "Resize")


def _activation(v: ir.Value | None) -> ir.Node | None:
    """The activation producing ``v`` if it is one of ``ACTIVATIONS`` feeding only this use."""
    if v is None or v.is_graph_output() or len(v.uses()) != 1:
        return None
    act = v.producer()
    if act is None or act.op_type not in ACTIVATIONS or not is_standard_domain(act.domain):
        return None
    if act.op_type == "Clip" and clip_bounds(act) is None:
        return None
    return act


def _signature(act: ir.Node) -> tuple:
    """What makes two activations the same function: the op and (for Clip) its bounds."""
    if act.op_type == "Clip":
        lo, hi = clip_bounds(act)
        return ("Clip", None if lo is None else float(lo), None if hi is None else float(hi))
    return (act.op_type,)


def _only_data_input(node: ir.Node) -> bool:
    """The node's inputs after the first are constants (shapes, axes, indices, scales) and its extra outputs unused."""
    if any(v is not None and const_array(v) is None for v in node.inputs[1:]):
        return False
    return not any(o.uses() or o.is_graph_output() for o in node.outputs[1:])


@equality
@register_pass(group="reorder")
class MoveMonotonePastDataMovement(Rule):
    """D(f(x)) → f(D(x)) for an elementwise non-decreasing f (Relu, Clip with constant bounds) and a data-movement
    or max-pooling D; Concat(f(x1), …, f(xn)) → f(Concat(x1, …, xn)) for one f on every input.

    Algebra: each output element of D is one input element, ``D(f(x))_i = f(x_m(i)) = f(D(x))_i``; a max of
    f-values is f of the max because f does not decrease, ``max_j f(x_j) = f(max_j x_j)`` (exact: no arithmetic is
    moved). Conditions: f feeds only D; D's other inputs are constants (shape, axes, indices) and its other outputs
    unused (MaxPool's indices); a Resize in nearest mode; for a Concat every input is the same f. Not Pad: a fill
    value v moves only where f(v) = v."""

    op_types = DATA_MOVEMENT

    def match(self, model: Any, node: ir.Node) -> Any:
        if node.op_type == "MaxPoolNHWC" and is_standard_domain(node.domain):
            return None
        if node.op_type != "MaxPoolNHWC" and not is_standard_domain(node.domain):
            return None
        if node.op_type == "Concat":
            acts = [_activation(v) for v in node.inputs]
            if not acts or any(a is None for a in acts):
                return None
            if len({_signature(a) for a in acts}) != 1:
                return self.miss(node, "the Concat's inputs come from different activations")
            return node, acts
        act = _activation(node.inputs[0] if node.inputs else None)
        if act is None:
            return None
        if not _only_data_input(node):
            return self.miss(node, f"the {node.op_type} has a non-constant parameter or a used second output")
        mode = node.attributes["mode"].value if "mode" in node.attributes else "nearest"
        if node.op_type == "Resize" and mode != "nearest":
            return self.miss(node, f"a Resize in {mode} mode interpolates: it is not data movement")
        return node, [act]

    def rewrite(self, model: Any, match: Any) -> None:
        node, acts = match
        first = acts[0]
        op, params, attrs = first.op_type, list(first.inputs[1:]), list(first.attributes.values())
        name = first.name if len(acts) == 1 else f"{first.name}_moved"
        for i, act in enumerate(acts):
            node.replace_input_with(i, act.inputs[0])
        for act in acts:
            model.remove_node(act)
        y = node.outputs[0]
        out = model.make_value_like(y)
        model.replace_uses(y, out)
        model.graph.insert_after(node, ir.Node("", op, [y, *params], attributes=attrs, outputs=[out], name=name))
