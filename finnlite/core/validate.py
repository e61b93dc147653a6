"""Pre-flight validation of an input model, before any pass touches it.

:func:`validate_model` finds what would otherwise surface in the middle of the pipeline, or not at all (a pass
that cannot read a node leaves it alone, and the output would silently keep a broken quantizer):

* the graph's structure (:meth:`finnlite.Model.check_graph`: dangling inputs, double producers, cycles);
* every ``finn_datatype`` annotation names a datatype;
* every node's op is known: a standard ONNX op of its opset, or a registered QONNX/FINN custom op whose
  attributes are valid;
* every custom op's constant inputs are valid for a model given as input (:meth:`custom_ops.base.CustomOp.
  validate_strict`: Quant scales finite and > 0, bit widths single integers ≥ 1, zero-points in the integer
  range, MultiThreshold rows sorted; no constant input holds NaN);
* shapes: each node's output shapes are inferred from its inputs (custom ops included, which checks that scales
  broadcast and thresholds match the channels) and compared with the shapes the file declares for them.

Every problem raises the :class:`finnlite.core.errors.FinnliteError` subclass that describes it, with a one-line
message naming the file, the node and the tensor. Validation does not change the model, except that output shapes
the file leaves undeclared are filled in by inference (as the tidy stage would do anyway).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
import onnx_ir as ir
from onnx import defs

from finnlite.core.ops import is_custom_domain, is_standard_domain, make_op
from finnlite.core.datatypes import parse_datatype
from finnlite.core.errors import DataTypeError, FinnliteError, GraphError, OpError
from finnlite.core.graphutil import name_or_op
from finnlite.core.model import Model, iter_values
from finnlite.core.shapes import const_array, infer_node_shapes

__all__ = ["validate_model"]

_DT_KEY = "finn_datatype"


@functools.cache
def _onnx_domains() -> frozenset[str]:
    """The domains onnx has schemas for (ai.onnx.ml, ai.onnx.preview.training, ...)."""
    return frozenset(s.domain for s in defs.get_all_schemas_with_history())


def validate_model(model: Model) -> None:
    """Check ``model`` as an input to the pipeline (module docstring); raise on the first problem."""
    try:
        model.check_graph()
        _check_annotations(model)
        model.topological_sort()
        opsets = dict(model.graph.opset_imports)
        for node in model.graph:
            _check_node(node, opsets)
    except FinnliteError as exc:
        if exc.file is not None or model.path is None:
            raise
        raise type(exc)(exc.message, file=model.path, node=exc.node, tensor=exc.tensor) from None


def _check_annotations(model: Model) -> None:
    for v in iter_values(model):
        ann = v.meta.get("quant_parameter_tensor_names")
        if ann and _DT_KEY in ann:
            try:
                parse_datatype(ann[_DT_KEY])
            except DataTypeError:
                raise DataTypeError(f"the finn_datatype annotation '{ann[_DT_KEY]}' is not a datatype",
                                    tensor=v.name) from None


def _check_node(node: ir.Node, opsets: dict[str, int]) -> None:
    domain = node.domain
    if is_custom_domain(domain):
        op = make_op(node, opsets.get(domain))  # unknown op type or bad attributes: OpError naming the node
        values = [const_array(v) for v in node.inputs]
        op.validate_strict(values)
        for v, arr in zip(node.inputs, values):
            if arr is not None and arr.dtype.kind == "f" and np.isnan(arr).any():
                raise OpError(f"{node.op_type}: the constant input holds NaN", node=name_or_op(node), tensor=v.name)
    elif not is_standard_domain(domain) and domain not in _onnx_domains():
        raise OpError(f"unknown op domain '{domain}' for op '{node.op_type}' (finnlite runs the ONNX domains and "
                      f"the QONNX/FINN custom ops)", node=name_or_op(node))
    _check_shapes(node, opsets)


def _known(shape: Sequence[Any] | None) -> tuple[Any, ...] | None:
    if shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in shape)


def _text(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + (",)" if len(shape) == 1 else ")")


def _check_shapes(node: ir.Node, opsets: dict[str, int]) -> None:
    """Infer the node's output shapes and compare them with the declared ones; keep the declared shapes."""
    declared = [(out.shape, out.dtype) for out in node.outputs]
    for out in node.outputs:
        out.shape = None
    try:
        infer_node_shapes(node, opsets)
    finally:
        inferred = [(_known(out.shape), out.dtype) for out in node.outputs]
        for out, (shape, dtype) in zip(node.outputs, declared):
            if shape is not None:
                out.shape = shape
            if dtype is not None:
                out.dtype = dtype
    for out, (shape, dtype), (got, got_dtype) in zip(node.outputs, declared, inferred):
        want = _known(shape)
        if want is not None and got is not None and (
                len(want) != len(got) or any(a is not None and b is not None and a != b for a, b in zip(want, got))):
            raise GraphError(f"the declared shape {_text(want)} contradicts the shape {_text(got)} inferred from "
                             f"the {node.op_type}'s inputs", node=name_or_op(node), tensor=out.name)
        if dtype is not None and got_dtype is not None and dtype != got_dtype and not is_custom_domain(node.domain):
            raise GraphError(f"the declared element type {dtype.name} contradicts the type {got_dtype.name} "
                             f"inferred from the {node.op_type}'s inputs", node=name_or_op(node), tensor=out.name)
