"""Global-pool outputs squeezed to [N, C] before the classifier's MatMul.

A global pool followed by a classifier that is a 1×1 Conv (or a MatMul on the pooled tensor) leaves, after lowering
to NHWC, ``MatMul([N, 1, 1, C], W[C, K]) → [N, 1, 1, K]`` and per-channel Mul/Add on that 4-D tensor. FINN rejects
such a layer (``Input shape mismatch: ElementwiseMul ... Expected [1, 64], got [1, 1, 1, 64]``): its fully connected
and elementwise layers take [N, C]. :class:`SqueezeGlobalPoolOutput` reshapes the pool's output to [N, C], which
makes the MatMul and the elementwise chain after it 2-D, and restores the original shape where the chain ends
(unless a Flatten or Reshape ends it, which then receives the same values in the same order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from finnlite.core.passes import Transformation, register_pass
from finnlite.core.shapes import const_array, const_shape
from finnlite.core.policies import tolerance

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["SqueezeGlobalPoolOutput", "GLOBAL_POOLS"]

#: ops whose [N, 1, ..., 1, C] output is a global pool's
GLOBAL_POOLS = ("QuantAvgPool2d", "GlobalAveragePool", "GlobalMaxPool", "AveragePool", "MaxPool", "MaxPoolNHWC")
_ELEMENTWISE = ("Mul", "Add", "MultiThreshold")


def _pooled(model: "Model", node: ir.Node) -> tuple[int, int] | None:
    """(N, C) if ``node`` is a MatMul with a 2-D constant weight reading a global pool's [N, 1, …, 1, C] output."""
    x = node.inputs[0]
    shape = model.get_tensor_shape(x.name) if x is not None else None
    w = const_shape(node.inputs[1]) if len(node.inputs) > 1 else None
    if shape is None or len(shape) < 3 or w is None or len(w) != 2 or None in shape:
        return None
    if any(d != 1 for d in shape[1:-1]) or shape[-1] != w[0]:
        return None
    p = x.producer()
    if p is None or p.op_type not in GLOBAL_POOLS:
        return None
    return shape[0], shape[-1]


def _chain(model: "Model", start: ir.Value, k: int) -> list[ir.Node] | None:
    """The single-consumer Mul/Add (constant operand of size 1 or ``k``) and channels-last MultiThreshold nodes
    after ``start``; None if a constant is not one of those."""
    nodes, cur = [], start
    while len(cur.uses()) == 1 and not cur.is_graph_output():
        node = next(iter(cur.uses())).node
        if node.op_type not in _ELEMENTWISE or node.inputs[0] is not cur:
            break
        if node.op_type == "MultiThreshold":
            layout = node.attributes.get("data_layout")
            if layout is not None and not str(layout.value).endswith("C"):
                break
        elif const_array(node.inputs[1]) is None or const_array(node.inputs[1]).size not in (1, k):
            return None
        nodes.append(node)
        cur = node.outputs[0]
    return nodes


@tolerance(rtol=1e-6, rtol_max=1e-6)
@register_pass(group="finalize")
class SqueezeGlobalPoolOutput(Transformation):
    """MatMul(pool → [N, 1, …, 1, C], W) → op… ⇒ MatMul(Reshape(pool, [N, C]), W) → op… [→ Reshape back].

    Pattern: a MatMul with a constant [C, K] weight reading a global pool's output whose middle dims are all 1,
    followed by single-consumer Mul/Add with a scalar or per-channel (K values) constant and channels-last
    MultiThresholds. Algebra: the reshape keeps the values and their order, so the MatMul and the elementwise ops
    compute the same numbers on [N, C] and [N, K]; their per-channel constants become [K]. Where the chain ends in
    anything but a Flatten/Reshape (a graph output, another op), a Reshape restores the 4-D shape there.
    Integer tensors stay bit-exact; a float tail (the output's scale and bias) may differ in the last bit, since
    onnxruntime fuses a 2-D MatMul with the following Add into a Gemm, which rounds once less."""

    def apply(self, model: "Model") -> bool:
        if not any(n.op_type == "MatMul" and _pooled(model, n) for n in model.graph):
            return False
        # lowering leaves constant subgraphs (a bias through Reshape and Transpose): fold them into initializers
        changed = model.cleanup(fold_constants=True)
        for node in list(model.graph):
            if node.op_type != "MatMul" or node.graph is not model.graph:
                continue
            nc = _pooled(model, node)
            if nc is None:
                continue
            k = const_shape(node.inputs[1])[1]
            chain = _chain(model, node.outputs[0], k)
            if chain is None:
                continue
            self._rewrite(model, node, nc, k, chain)
            changed = True
        return changed

    def _rewrite(self, model: "Model", mm: ir.Node, nc: tuple[int, int], k: int, chain: list[ir.Node]) -> None:
        n, c = nc
        x = mm.inputs[0]
        old_shape = list(model.get_tensor_shape(mm.outputs[0].name) or [n] + [1] * (len(model.get_tensor_shape(
            x.name)) - 2) + [k])
        target = model.add_initializer(np.array([n, c], np.int64), prefix=f"{mm.name}_squeeze_shape")
        squeezed = model.make_value_like(x, prefix=f"{x.name}_squeezed")
        squeezed.shape = ir.Shape([n, c])
        model.graph.insert_before(mm, ir.Node("", "Reshape", [x, target], outputs=[squeezed],
                                              name=f"{mm.name}_squeeze"))
        mm.replace_input_with(0, squeezed)
        if model.has_tensor_datatype(x.name):
            model.set_tensor_datatype(squeezed.name, model.get_tensor_datatype(x.name))
        model.set_tensor_layout(squeezed.name, ["N", "C"])
        for node in [mm, *chain]:
            out = node.outputs[0]
            out.shape = ir.Shape([n, k])
            if not out.is_graph_output():  # a new name for a new shape: the verifier compares tensors by name
                out.name = model.make_new_valueinfo_name(f"{out.name}_2d")
                model.index_value(out)
            if model.get_tensor_layout(out.name) is not None:
                model.set_tensor_layout(out.name, ["N", "C"])
            if "data_layout" in node.attributes:  # a channels-last MultiThreshold: channels now on axis 1
                node.attributes["data_layout"] = ir.AttrString("data_layout", "NC")
            if node.op_type in ("Mul", "Add"):
                arr = const_array(node.inputs[1])
                if arr.ndim > 1:
                    node.replace_input_with(1, model.add_initializer(arr.reshape(-1).copy(),
                                                                     prefix=f"{node.name}_param"))
        end = (chain[-1] if chain else mm).outputs[0]
        users = [u.node for u in end.uses()]
        if not end.is_graph_output() and users and all(u.op_type in ("Flatten", "Reshape") for u in users):
            return
        restored = model.make_value_like(end, prefix=f"{end.name}_unsqueezed")
        restored.shape = ir.Shape(old_shape)
        shape = model.add_initializer(np.array(old_shape, np.int64), prefix=f"{mm.name}_unsqueeze_shape")
        model.replace_uses(end, restored)
        model.graph.insert_after(end.producer(), ir.Node("", "Reshape", [end, shape], outputs=[restored],
                                                         name=f"{mm.name}_unsqueeze"))
        if model.has_tensor_datatype(end.name):
            model.set_tensor_datatype(restored.name, model.get_tensor_datatype(end.name))
