"""1-D convolutional networks as 2-D ones: FINN's ``Change3DTo4DTensors``.

FINN's hardware layers are 2-D (sliding windows over H×W, NHWC streams). A Conv1d network (RadioML's VGG10:
Conv1d + BatchNorm1d + ReLU + MaxPool1d) computes on ``(N, C, W)`` tensors; appending a spatial axis of size 1,
``(N, C, W, 1)``, makes every such op the 2-D op with a ``(k, 1)`` kernel, which the lowering then handles like any
other (Im2Col + MatMul, MaxPoolNHWC, NHWC). FINN changes the model's input shape for this; here the input keeps its
shape and a Reshape after it appends the axis, and a 3-D output gets a Reshape dropping it (QuartzNet's logits
``(N, classes, T)``), so the model's interface does not change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import add_constant, annotate, is_standard_domain, rank_of, take_over
from finnlite.core.passes import Miss, PassResult, Transformation, register_pass
from finnlite.core.shapes import const_array
from streamline.algebra import MONOTONE
from streamline.exact import EXACT_KEY, exact_value, set_exact
from streamline.lower_common import annotated_or_values, attr, set_attr

if TYPE_CHECKING:
    from finnlite.core.model import Model

_ELEMENTWISE = ("Mul", "Add", "Sub", "Relu", "Identity") + tuple(sorted(MONOTONE))
_SPATIAL = ("Conv", "ConvTranspose", "MaxPool", "AveragePool")
#: custom elementwise ops whose parameters broadcast against the tensor (inputs 1…)
_CUSTOM_ELEMENTWISE = ("Quant", "BipolarQuant", "Trunc")


@register_pass(group="lower")
class Change3DTo4DTensors(Transformation):
    """Every 3-D activation tensor ``(N, C, W)`` → ``(N, C, W, 1)`` (FINN's name).

    Conditions (checked for the whole graph, else nothing changes and the reason is recorded): every node reading
    or writing a 3-D activation tensor is a Conv / ConvTranspose / MaxPool / AveragePool with a 1-D kernel, a
    MultiThreshold with its channels on axis 1 (or one row of thresholds), an elementwise op (Mul, Add, Sub, Relu,
    a monotone function, Quant, Trunc) whose constant operands broadcast against the 3-D tensor, or a Flatten(axis 1)
    / Reshape to 2-D reading it; the 3-D graph inputs and outputs have static shapes. Algebra: with a trailing axis of
    size 1, a ``(k,)`` kernel with pads ``(a, b)``, stride s, dilation d and output padding p is the ``(k, 1)``
    kernel with pads ``(a, 0, b, 0)``, strides ``(s, 1)``, dilations ``(d, 1)``, output padding ``(p, 0)``; a
    constant of shape ``(…, C, 1)`` broadcasts as ``(…, C, 1, 1)``; a flatten of ``(N, C, W, 1)`` lists the
    elements in the order of ``(N, C, W)``; a graph output reads the 4-D tensor through a Reshape to its 3-D
    shape."""

    def run(self, model: "Model", declined: frozenset[str] = frozenset()) -> PassResult:
        const = {name for name in model.graph.initializers}
        three = [v for n in model.graph for v in n.outputs if rank_of(v, constants=False) == 3]
        three += [v for v in model.graph.inputs if rank_of(v, constants=False) == 3 and v.name not in const]
        if not three:
            return PassResult(False)
        reason = self._unsupported(model, three)
        if reason is not None:
            return PassResult(False, misses=(Miss(self.name, reason[0], reason[1]),))
        nodes = {id(u.node): u.node for v in three for u in v.uses()}
        nodes.update({id(v.producer()): v.producer() for v in three if v.producer() is not None})
        for node in nodes.values():
            self._rewrite_node(model, node)
        for v in three:
            if v.is_graph_input():
                self._reshape_input(model, v)
            elif v.is_graph_output():
                self._reshape_output(model, v)
            else:
                v.shape = ir.Shape(list(v.shape) + [1])
        return PassResult(True)

    # -- conditions ------------------------------------------------------------------------------------------------
    def _unsupported(self, model: "Model", three: list[ir.Value]) -> tuple[str, str] | None:
        for v in three:
            if (v.is_graph_input() or v.is_graph_output()) and any(not isinstance(d, int) for d in v.shape):
                return v.name, "a 3-D graph input or output with a symbolic shape"
            users = [u.node for u in v.uses()] + ([v.producer()] if v.producer() is not None else [])
            for node in users:
                why = self._node_reason(node)
                if why is not None:
                    return node.name or node.op_type, why
        return None

    @staticmethod
    def _node_reason(node: ir.Node) -> str | None:
        op = node.op_type
        if op in _SPATIAL and is_standard_domain(node.domain):
            kernel = attr(node, "kernel_shape", None)
            if op in ("Conv", "ConvTranspose"):
                w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
                if w is None or w.ndim != 3 or (len(node.inputs) > 2 and node.inputs[2] is not None):
                    return f"a {op} 1-D without a constant weight, or with a bias input"
                if attr(node, "output_shape", None):
                    return "a ConvTranspose with output_shape"
            if kernel is not None and len(kernel) != 1 or str(attr(node, "auto_pad", "NOTSET")) not in (
                    "NOTSET", "VALID", ""):
                return f"{op} is not 1-D with explicit pads"
            if len(node.outputs) > 1 and node.outputs[1].uses():
                return "MaxPool's Indices output is used"
            return None
        if op == "MultiThreshold":
            t = const_array(node.inputs[1])
            layout = str(attr(node, "data_layout", "") or "")
            if t is None or (t.shape[0] > 1 and layout.find("C") != 1):
                return "a per-channel MultiThreshold whose channels are not on axis 1"
            return None
        if (op in _ELEMENTWISE and is_standard_domain(node.domain)) or (
                op in _CUSTOM_ELEMENTWISE and not is_standard_domain(node.domain)):
            for v in node.inputs:
                arr = const_array(v) if v is not None else None
                if arr is not None and arr.ndim > 3:
                    return f"{op} with a constant that does not broadcast against a 3-D tensor"
            return None
        if op == "Flatten" and int(attr(node, "axis", 1)) == 1:
            return None
        if op == "Reshape" and rank_of(node.outputs[0], constants=False) == 2:
            return None
        return f"{op} has no 4-D form here"

    # -- rewrites --------------------------------------------------------------------------------------------------
    def _rewrite_node(self, model: "Model", node: ir.Node) -> None:
        op = node.op_type
        if op in _SPATIAL:
            pads = [int(p) for p in attr(node, "pads", [0, 0])]
            set_attr(node, ir.AttrInt64s("pads", [pads[0], 0, pads[1], 0]))
            for name in ("kernel_shape", "strides", "dilations", "output_padding"):  # absent ones: 1 (0, the weight's)
                value = attr(node, name, None)
                if value is not None:
                    set_attr(node, ir.AttrInt64s(name, [int(value[0]), 0 if name == "output_padding" else 1]))
            if op in ("Conv", "ConvTranspose"):
                w = const_array(node.inputs[1])
                node.replace_input_with(1, add_constant(model, w[..., None], f"{node.inputs[1].name}_2d",
                                                     annotated_or_values(model, node.inputs[1], w)))
        elif op == "MultiThreshold":
            layout = str(attr(node, "data_layout", "") or "")
            if layout:
                set_attr(node, ir.AttrString("data_layout", "NCHW"))
        elif op in _ELEMENTWISE or op in _CUSTOM_ELEMENTWISE:
            for i, v in enumerate(node.inputs):
                arr = const_array(v) if v is not None else None
                if arr is None or arr.size == 1:
                    continue
                full = arr.reshape((1,) * (3 - arr.ndim) + arr.shape)[..., None]
                node.replace_input_with(i, add_constant(model, full, f"{v.name}_2d",
                                                        annotated_or_values(model, v, arr)))
            if node.metadata_props.get(EXACT_KEY):
                ex = exact_value(node, np.zeros(0))
                if ex.size != 1:
                    set_exact(node, ex.reshape((1,) * (3 - ex.ndim) + ex.shape)[..., None])

    def _reshape_output(self, model: "Model", y: ir.Value) -> None:
        """Graph output ``y`` (N, C, W) becomes a Reshape of the 4-D tensor its producer now writes (which keeps its
        other consumers); the output keeps its name and shape."""
        shape = [int(d) for d in y.shape]
        uses = list(y.uses())
        y3 = model.make_value_like(y)
        k = add_constant(model, np.asarray(shape, np.int64), f"{y.name}_shape3d")
        reshape = ir.Node("", "Reshape", [y, k], outputs=[y3], name=f"{y.name}_to_3d")
        model.graph.insert_after(y.producer(), reshape)
        take_over(model, y, y3, "4d")
        reshape.replace_input_with(0, y)
        for u in uses:
            u.node.replace_input_with(u.idx, y)
        y.shape = ir.Shape(shape + [1])

    def _reshape_input(self, model: "Model", x: ir.Value) -> None:
        shape = [int(d) for d in x.shape] + [1]
        out = model.make_value(f"{x.name}_4d", shape=shape)
        if model.has_tensor_datatype(x.name):
            annotate(out, model.get_tensor_datatype(x.name))  # (not yet in the graph: not found by name)
        uses = list(x.uses())
        k = add_constant(model, np.asarray(shape, np.int64), f"{x.name}_shape4d")
        node = ir.Node("", "Reshape", [x, k], outputs=[out], name=f"{x.name}_to_4d")
        model.graph.insert_before(next(iter(model.graph)), node)
        for u in uses:
            u.node.replace_input_with(u.idx, out)
