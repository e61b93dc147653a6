"""One vocabulary of small graph edits shared by the passes: the rank of a value, annotating a value, adding a
constant, the standard ONNX domains, and a value taking over another's consumers and name.

Nothing here decides a rewrite; the passes in :mod:`streamline` do. The annotation format is
:class:`finnlite.core.model.Model`'s (``finn_datatype`` / ``tensor_layout`` under ``quant_parameter_tensor_names``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Sequence

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import BaseDataType, parse_datatype
from finnlite.core.ops import QONNX_DOMAIN, STANDARD_DOMAINS, is_standard_domain
from finnlite.core.shapes import const_array
from finnlite.core.tensors import DepthwiseWeight

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["STANDARD_DOMAINS", "add_constant", "annotate", "channel_order", "clip_bounds", "ensure_custom_domain",
           "is_standard_domain", "name_or_op", "rank_of", "reorder_channels", "set_channel_order", "sole_producer",
           "take_over", "zero_padded"]

_QA_KEY = "quant_parameter_tensor_names"  # where Model keeps annotations (see finnlite.core.model)
_DT_KEY = "finn_datatype"
_LAYOUT_KEY = "tensor_layout"
#: a MultiThreshold's channels relative to the original quantizer's (node metadata)
_ORDER_KEY = "finnlite.channel_order"


def name_or_op(node: ir.Node) -> str:
    """A node's name, or its op type for an unnamed node (for messages)."""
    return node.name or node.op_type


def sole_producer(node: ir.Node, index: int, ops: Sequence[str]) -> ir.Node | None:
    """The producer of input ``index`` of ``node`` if it is a standard-domain op in ``ops`` whose output feeds only
    ``node`` (one use, not a graph output), else None: a node a rule may rewrite together with ``node``."""
    v = node.inputs[index] if index < len(node.inputs) else None
    if v is None:
        return None
    prod = v.producer()
    if prod is None or prod.op_type not in ops or not is_standard_domain(prod.domain):
        return None
    if len(v.uses()) != 1 or v.is_graph_output():
        return None
    return prod


def ensure_custom_domain(model: "Model") -> None:
    """Import the qonnx custom-op domain (version 1) if the model does not yet."""
    model.graph.opset_imports.setdefault(QONNX_DOMAIN, 1)


def rank_of(v: ir.Value | None, *, constants: bool = True) -> int | None:
    """The rank of ``v`` if its shape is known (with ``constants``: else the rank of its constant value, if it has
    one); None for a missing value or an unknown rank."""
    if v is None:
        return None
    if v.shape is not None:
        return len(v.shape)
    if not constants:
        return None
    arr = const_array(v)
    return None if arr is None else arr.ndim


def zero_padded(node: ir.Node) -> bool:
    """True if convolution or pooling ``node`` pads its input: a nonzero ``pads`` entry, or an ``auto_pad`` other
    than NOTSET and VALID."""
    pads = node.attributes.get("pads")
    auto_pad = node.attributes.get("auto_pad")
    return (pads is not None and any(int(p) != 0 for p in pads.value)) or (
        auto_pad is not None and auto_pad.value not in ("NOTSET", "VALID"))


def annotate(v: ir.Value, datatype: BaseDataType | str | None = None, layout: Sequence[str] | None = None) -> None:
    """Set the ``finn_datatype`` and/or ``tensor_layout`` annotation of ``v`` directly (also on a value that no
    node produces yet, which :meth:`Model.set_tensor_datatype` cannot find by name)."""
    ann = dict(v.meta.get(_QA_KEY) or {})
    if datatype is not None:
        ann[_DT_KEY] = parse_datatype(datatype).name
    if layout is not None:
        ann[_LAYOUT_KEY] = str([str(x) for x in layout])
    v.meta[_QA_KEY] = ann


def set_channel_order(node: ir.Node, order: Sequence[int] | None) -> None:
    """Record on MultiThreshold ``node`` that its channel ``j`` thresholds channel ``order[j]`` of the original
    model's quantizer it replaces (the channels were reordered: an NHWC flatten's features, a channel shuffle moved
    past it); None removes the record. Stored as arithmetic runs ``[start, step, count]`` (an NHWC flatten is one
    run per pixel) in the node's ``finnlite.channel_order`` metadata; the final check reads it."""
    if order is None:
        node.metadata_props.pop(_ORDER_KEY, None)
        return
    runs: list[list[int]] = []
    for c in (int(c) for c in order):
        if runs and runs[-1][2] == 1:
            runs[-1][1], runs[-1][2] = c - runs[-1][0], 2
        elif runs and runs[-1][0] + runs[-1][1] * runs[-1][2] == c:
            runs[-1][2] += 1
        else:
            runs.append([c, 1, 1])
    node.metadata_props[_ORDER_KEY] = json.dumps(runs)


def channel_order(node: ir.Node) -> np.ndarray | None:
    """The channel order recorded by :func:`set_channel_order` on ``node``, or None."""
    text = node.metadata_props.get(_ORDER_KEY)
    if not text:
        return None
    runs = json.loads(text)
    return np.concatenate([start + step * np.arange(count) for start, step, count in runs]).astype(np.int64)


def reorder_channels(node: ir.Node, new_to_old: Sequence[int]) -> None:
    """Record that MultiThreshold ``node``'s channel ``j`` is now its former channel ``new_to_old[j]`` (composed with
    any order recorded before)."""
    idx = np.asarray(new_to_old, dtype=np.int64)
    old = channel_order(node)
    order = idx if old is None else old[idx]
    set_channel_order(node, None if np.array_equal(order, np.arange(order.size)) else order)


def add_constant(model: "Model", array: np.ndarray | DepthwiseWeight, prefix: str,
                 datatype: BaseDataType | str | None = None) -> ir.Value:
    """A new initializer (name ``prefix`` made unique) holding ``array`` with its shape and element type (a
    non-contiguous array is copied to a contiguous one; a :class:`~finnlite.core.tensors.DepthwiseWeight` is kept
    compact), annotated with ``datatype`` if given."""
    if not isinstance(array, DepthwiseWeight):
        array = np.asarray(array)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
    v = model.add_initializer(array, prefix=prefix)
    if datatype is not None:
        annotate(v, datatype)
    return v


def take_over(model: "Model", old: ir.Value, new: ir.Value, old_suffix: str = "replaced") -> None:
    """Make every consumer of ``old`` (and the graph output, if it is one) read ``new``, and give ``new`` the name
    of ``old`` (which gets a fresh one, ``<name>_<old_suffix>_<k>``), so that tensor names downstream do not
    change."""
    name = old.name
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name = model.make_new_valueinfo_name(f"{name}_{old_suffix}")
    new.name = name
    model.index_value(new)


def clip_bounds(node: ir.Node) -> tuple[np.ndarray | None, np.ndarray | None] | None:
    """The ``(min, max)`` bounds of a Clip as 0-d arrays of their own type (inputs from opset 11, float32
    attributes before; None for an absent bound), or None if a bound is not a constant scalar."""
    bounds: list[np.ndarray | None] = []
    for index, name in ((1, "min"), (2, "max")):
        v = node.inputs[index] if index < len(node.inputs) else None
        if v is not None:
            arr = const_array(v)
            if arr is None or arr.size != 1:
                return None
            bounds.append(np.asarray(arr).reshape(()))
        elif name in node.attributes:
            bounds.append(np.asarray(np.float32(node.attributes[name].value)))
        else:
            bounds.append(None)
    return bounds[0], bounds[1]
