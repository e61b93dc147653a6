"""Shape inference that knows the custom ops.

Nodes are visited once in topological order. A standard op is inferred by onnx's per-node inference
(``onnx.shape_inference.infer_node_outputs``) from its inputs' types and its small constant inputs; a custom op by
its :class:`custom_ops.base.CustomOp`. The cost is linear in the number of nodes, and with ``only_missing`` a node
whose outputs already have a shape is skipped, so a local rewrite needs no whole-graph re-inference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import defs, helper, shape_inference

from finnlite.core.errors import GraphError, OpError
from finnlite.core.ops import is_custom_domain, is_standard_domain, make_op

if TYPE_CHECKING:
    from finnlite.core.model import Model

#: constant inputs up to this many elements are handed to onnx's inference (Reshape shapes, Slice starts, ...)
_MAX_CONST_ELEMS = 4096


def const_array(v: ir.Value | None) -> np.ndarray | None:
    """The constant value of ``v`` (an initializer or the output of a ``Constant`` node), else None."""
    if v is None:
        return None
    if v.const_value is not None:
        return v.const_value.numpy()
    prod = v.producer()
    if prod is not None and prod.op_type == "Constant" and is_standard_domain(prod.domain):
        attr = prod.attributes.get("value")
        if attr is not None:
            return attr.value.numpy()
    return None


def const_shape(v: ir.Value | None) -> tuple[int, ...] | None:
    """The shape of ``v``'s constant value (see :func:`const_array`), read without its data; None if ``v`` is not
    a constant."""
    if v is None:
        return None
    if v.const_value is not None:
        return tuple(int(d) for d in v.const_value.shape)
    prod = v.producer()
    if prod is not None and prod.op_type == "Constant" and is_standard_domain(prod.domain):
        attr = prod.attributes.get("value")
        if attr is not None:
            return tuple(int(d) for d in attr.value.shape)
    return None


def _shape_of(v: ir.Value) -> tuple | None:
    if v.shape is not None:
        return tuple(d if isinstance(d, int) else (str(d) if d is not None and str(d) else None) for d in v.shape)
    if v.const_value is not None:
        return tuple(v.const_value.shape)
    return None


def _type_proto(v: ir.Value) -> onnx.TypeProto:
    elem = int(v.dtype) if v.dtype is not None else onnx.TensorProto.FLOAT
    return helper.make_tensor_type_proto(elem, _shape_of(v))


def _set_from_type(v: ir.Value, tp: onnx.TypeProto) -> None:
    if not tp.HasField("tensor_type"):
        return
    tt = tp.tensor_type
    if tt.elem_type:
        v.dtype = ir.DataType(tt.elem_type)
    if tt.HasField("shape"):
        dims: list[Any] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        v.shape = ir.Shape(dims)


def _infer_standard(node: ir.Node, opsets: dict[str, int]) -> None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = node.version or opsets.get(domain, 20)
    try:
        schema = defs.get_schema(node.op_type, version, domain)
    except defs.SchemaError:
        raise OpError(f"unknown op type '{node.op_type}' in domain '{domain or 'ai.onnx'}' (opset {version})",
                      node=node.name) from None
    proto = ir.serde.serialize_node(node)
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    for v in node.inputs:
        if v is None or not v.name:
            continue
        types[v.name] = _type_proto(v)
        arr = const_array(v)
        if arr is not None and arr.size <= _MAX_CONST_ELEMS:
            data[v.name] = onnx.numpy_helper.from_array(np.asarray(arr), v.name)
    try:
        result = shape_inference.infer_node_outputs(schema, proto, types, data)
    except Exception as exc:  # onnx raises InferenceError, ValidationError, RuntimeError
        msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise GraphError(f"shape inference failed for {node.op_type}: {msg}", node=node.name) from None
    for out in node.outputs:
        if out.name in result:
            _set_from_type(out, result[out.name])


def _infer_custom(node: ir.Node, opsets: dict[str, int]) -> None:
    op = make_op(node, opsets.get(node.domain))
    shapes = [None if v is None else _shape_of(v) for v in node.inputs]
    values = [const_array(v) for v in node.inputs]
    out_shapes = op.infer_shapes(shapes, values)
    for out, shape in zip(node.outputs, out_shapes):
        if shape is not None:
            out.shape = ir.Shape(list(shape))
        if out.dtype is None:
            out.dtype = ir.DataType.FLOAT


def infer_node_shapes(node: ir.Node, opsets: dict[str, int]) -> None:
    """Infer the output shapes and element types of one node from its inputs."""
    if is_custom_domain(node.domain):
        _infer_custom(node, opsets)
    else:
        _infer_standard(node, opsets)


def infer_shapes(model: "Model", *, only_missing: bool = True) -> None:
    """Infer the shape of every node output of ``model`` (see module docstring)."""
    model.topological_sort()
    opsets = dict(model.graph.opset_imports)
    for node in model.graph:
        if only_missing and all(o.shape is not None and o.dtype is not None for o in node.outputs):
            continue
        infer_node_shapes(node, opsets)
