"""Graph cleanup: dead nodes, unused initializers, and constant folding of standard ops.

Folding evaluates a standard-domain node whose inputs are all constants with onnxruntime (the same kernels the
executor uses) and replaces it by an initializer. Custom ops (Quant and friends) are never folded here: weight
quantizers are folded deliberately by the convert stage, which annotates the result with its datatype.

Why not onnxscript's optimizer (``onnxscript.optimizer.fold_constants``, onnx_ir's ``RemoveUnusedNodesPass``):

* inexact: its evaluator is onnx's numpy reference, which differs from onnxruntime in the last bit for Log, Exp,
  Pow(x, 0.5), Tanh, Sigmoid and Erf; TorchScript exports compute BatchNorm's √(σ²+ε) with a Pow and a Trunc's bit
  width with a Log. It is exact on data movement, Cast and + − × ÷ √, so it could fold those only, onnxruntime the
  rest;
* slower for that: its folding call costs more per node than the one here, importing onnxscript is slow, and
  ``RemoveUnusedNodesPass`` looks up every node's schema in every streamlining round;
* it leaves custom domains alone (no evaluator for them), as this module does; its default size limits (inputs over
  8192 elements) would leave a Reshape of a conv weight unfolded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from finnlite.core.compat import make_model, ort_session
from finnlite.core.errors import GraphError
from finnlite.core.ops import is_standard_domain
from finnlite.core.shapes import const_array

if TYPE_CHECKING:
    from finnlite.core.model import Model

#: ops that must not be folded even with constant inputs
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def remove_dead_nodes(model: "Model") -> int:
    """Remove nodes none of whose outputs is used or a graph output; returns how many."""
    removed = 0
    work = list(model.graph)
    while work:
        node = work.pop()
        if node.graph is not model.graph:
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        preds = model.find_direct_predecessors(node)
        model.graph.remove(node, safe=True)
        removed += 1
        work.extend(preds)
    return removed


def remove_unused_initializers(model: "Model") -> int:
    """Remove initializers that nothing reads and that are not graph outputs; returns how many."""
    unused = [name for name, v in model.graph.initializers.items() if not v.uses() and not v.is_graph_output()]
    for name in unused:
        model.del_initializer(name)
    return len(unused)


def _evaluate(node: ir.Node, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    proto = ir.serde.serialize_node(node)
    names = [v.name if v is not None else "" for v in node.inputs]
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for n, a in zip(names, inputs) if n and a is not None]
    outputs = [onnx.ValueInfoProto(name=o.name) for o in node.outputs]
    graph = helper.make_graph([proto], "fold", graph_inputs, outputs)
    sess = ort_session(make_model(graph, opset=opset, custom_opset=None))
    feed = {n: a for n, a in zip(names, inputs) if n and a is not None}
    return sess.run(None, feed)


def fold_node(model: "Model", node: ir.Node) -> list[ir.Value]:
    """Replace the standard-op ``node`` by initializers if all its inputs are constants (and it is foldable);
    returns the new initializers (empty if it did not fold)."""
    if not is_standard_domain(node.domain) or node.op_type in _NO_FOLD or not node.inputs:
        return []
    if any(o.is_graph_output() for o in node.outputs):
        return []
    inputs = [const_array(v) for v in node.inputs]
    if any(a is None for v, a in zip(node.inputs, inputs) if v is not None):
        return []
    if node.op_type == "Constant":
        arr = const_array(node.outputs[0])
        if arr is None:
            return []
        results = [arr]
    else:
        try:
            results = _evaluate(node, inputs, model.opset_version("") or 20)
        except Exception as exc:  # onnxruntime failures carry long messages; keep one line
            raise GraphError(f"cannot fold constant {node.op_type}: {str(exc).splitlines()[0]}",
                             node=node.name) from None
    news = []
    for out, arr in zip(node.outputs, results):
        new = model.add_initializer(np.asarray(arr), prefix=out.name or "folded")
        out.replace_all_uses_with(new)
        news.append(new)
    model.graph.remove(node, safe=True)
    return news


def fold_constants(model: "Model") -> int:
    """Replace standard-op nodes with all-constant inputs by initializers; returns how many were folded."""
    return sum(bool(fold_node(model, node)) for node in list(model.graph))


def cleanup(model: "Model", *, fold: bool = True) -> bool:
    """Fold constants (if ``fold``), then remove dead nodes and unused initializers. True if anything changed."""
    changed = 0
    if fold:
        changed += fold_constants(model)
    changed += remove_dead_nodes(model)
    changed += remove_unused_initializers(model)
    return changed > 0
