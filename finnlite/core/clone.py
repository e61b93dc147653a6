"""Structural copies of a model: new graph, nodes and values; shared tensors and attributes.

Per-pass verification (:mod:`verify`) copies the model after every pass that changed it, so the copy's cost is
paid in full by the pipeline. :func:`clone_model` builds the same graph as onnx_ir's generic cloner
(``Graph.clone``) directly, without the cloner's per-call wrappers, substitution maps and device-configuration
remapping. A graph with subgraph attributes (If, Loop, Scan) goes through onnx_ir's cloner, which copies the
subgraphs.

What the copy shares with the original: the tensors (initializers and constant values: finnlite replaces them rather
than editing them, and the verifier freezes the writable ones) and the attribute objects (a pass sets a new
``Attr``; it does not edit one), as onnx_ir's cloner does, and frozen shapes (read from a file; they cannot change).
What it copies: every node and value, editable shapes, the ``metadata_props`` of nodes, values and the graph, and
the ``meta`` stores (one level deep: finnlite replaces an annotation dict, it does not edit one in place). A value
that nodes read but nothing defines (a pass left it dangling) stays shared rather than failing the copy: the check
then reports it.
"""

from __future__ import annotations

import onnx_ir as ir

from finnlite.core.model import Model

__all__ = ["clone_model", "clone_graph"]


def _copy_meta(src: ir.Value | ir.Node | ir.Graph, dst: ir.Value | ir.Node | ir.Graph) -> None:
    """``src``'s ``metadata_props`` and ``meta`` entries into ``dst`` (without creating empty stores on ``src``)."""
    props = src.metadata_props
    if props:
        dst.metadata_props.update(props)
    meta = src.meta
    if meta:  # UserDict's update sets key by key in Python; ``dst`` is new, so its plain dict takes them at once
        dst.meta.data.update(meta.data)


def _shape(shape: ir.Shape | None) -> ir.Shape | None:
    """A copy of an editable shape; a frozen one (as read from a file) is shared."""
    return shape if shape is None or shape.frozen else shape.copy()


def _new_value(v: ir.Value) -> ir.Value:
    copy = ir.Value(name=v.name, type=v.type, shape=_shape(v.shape),
                    doc_string=v.doc_string, const_value=v.const_value)
    _copy_meta(v, copy)
    return copy


def clone_graph(graph: ir.Graph) -> ir.Graph:
    """A structural copy of ``graph`` (module docstring)."""
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
           for n in graph for a in n.attributes.values()):
        return graph.clone(allow_outer_scope_values=True)
    values: dict[ir.Value, ir.Value] = {}
    inputs = []
    for v in graph.inputs:
        inputs.append(values.setdefault(v, _new_value(v)))
    initializers = []
    for v in graph.initializers.values():
        initializers.append(values.setdefault(v, _new_value(v)))
    nodes = []
    for node in graph:
        copy = ir.Node(node.domain, node.op_type,
                       [values.get(v, v) if v is not None else None for v in node.inputs],
                       list(node.attributes.values()), overload=node.overload, num_outputs=len(node.outputs),
                       version=node.version, name=node.name, doc_string=node.doc_string)
        _copy_meta(node, copy)
        for out, new in zip(node.outputs, copy.outputs):
            values[out] = new
            new.name = out.name
            new.shape = _shape(out.shape)
            new.type = out.type
            new.const_value = out.const_value
            new.doc_string = out.doc_string
            _copy_meta(out, new)
        nodes.append(copy)
    outputs = [values.get(v, v) for v in graph.outputs]
    clone = ir.Graph(inputs, outputs, nodes=nodes, initializers=initializers, doc_string=graph.doc_string,
                     opset_imports=dict(graph.opset_imports), name=graph.name)
    _copy_meta(graph, clone)
    return clone


def clone_model(model: Model) -> Model:
    """A structural copy of ``model`` (module docstring); its functions are copied by onnx_ir's cloner."""
    src = model.ir
    copy = ir.Model(clone_graph(src.graph), ir_version=src.ir_version, producer_name=src.producer_name,
                    producer_version=src.producer_version, domain=src.domain, model_version=src.model_version,
                    doc_string=src.doc_string, functions=[f.clone() for f in src.functions.values()],
                    metadata_props=dict(src.metadata_props))
    if getattr(src, "device_configurations", None):
        copy.device_configurations = src.device_configurations
    return Model(copy, check=False)
