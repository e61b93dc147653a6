"""Small helpers shared by the lowering passes: permutations, layouts, new values and annotations copied (adding a
constant, annotating a value and a value taking over another are in :mod:`finnlite.core.graphutil`).

Nothing here decides a rewrite; :mod:`streamline.lower_conv`, :mod:`streamline.layout`, :mod:`streamline.xnor`,
:mod:`streamline.round_thresholds` and :mod:`streamline.topk` do.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import onnx_ir as ir

from custom_ops.registry import is_custom_domain
from finnlite.core.blockwise import all_blocks, all_integral
from finnlite.core.datatypes import BaseDataType, DataType, datatype_of_values, is_integer_type, smallest_int_type
from finnlite.core.graphutil import annotate
from finnlite.core.shapes import const_array, infer_node_shapes

if TYPE_CHECKING:
    from finnlite.core.model import Model

Perm = tuple[int, ...]

#: NCHW → NHWC and back, as Transpose ``perm`` attributes
TO_NHWC: Perm = (0, 2, 3, 1)
TO_NCHW: Perm = (0, 3, 1, 2)

_QA_KEY = "quant_parameter_tensor_names"  # where Model keeps annotations (see finnlite.core.model)
_DT_KEY = "finn_datatype"
_LAYOUT_KEY = "tensor_layout"
_SPARSITY_KEY = "tensor_sparsity"


# -- permutations -----------------------------------------------------------------------------------------------
def identity(rank: int) -> Perm:
    return tuple(range(rank))


def inverse(perm: Sequence[int]) -> Perm:
    """The permutation undoing ``perm``: ``x.transpose(perm).transpose(inverse(perm)) == x``."""
    return tuple(int(i) for i in np.argsort(perm))


def then(first: Sequence[int], second: Sequence[int]) -> Perm:
    """The single permutation of ``x.transpose(first).transpose(second)``."""
    return tuple(first[i] for i in second)


def transpose_perm(node: ir.Node, rank: int) -> Perm:
    """The ``perm`` of a Transpose node (ONNX's default reverses the axes)."""
    attr = node.attributes.get("perm")
    return tuple(int(i) for i in attr.value) if attr is not None else tuple(range(rank - 1, -1, -1))


def permute_layout(layout: Sequence[str], perm: Sequence[int]) -> list[str]:
    """The axis names of ``x.transpose(perm)`` for an ``x`` with axis names ``layout``."""
    return [layout[i] for i in perm]


# -- nodes and attributes ------------------------------------------------------------------------------------------
def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (lists of ints as lists), or ``default``."""
    a = node.attributes.get(name)
    if a is None:
        return default
    value = a.value
    if isinstance(value, (tuple, list)) or (hasattr(value, "__iter__") and not isinstance(value, (str, bytes))):
        return list(value)
    return value


def set_attr(node: ir.Node, value: ir.Attr) -> None:
    """Set (or replace) one attribute of ``node``."""
    node.attributes[value.name] = value


def is_op(node: ir.Node | None, *op_types: str, custom: bool | None = None) -> bool:
    """True if ``node`` is one of ``op_types`` (in a custom-op domain if ``custom``, in the standard one if
    ``custom`` is False, in either if None)."""
    if node is None or node.op_type not in op_types:
        return False
    if custom is None:
        return True
    return is_custom_domain(node.domain) == custom


def shape_of(model: "Model", v: ir.Value) -> tuple[int, ...] | None:
    """The static shape of ``v`` (inferring its producer's output shapes if unknown), or None if not static."""
    if v.shape is None and v.const_value is None:
        prod = v.producer()
        if prod is not None:
            try:
                infer_node_shapes(prod, dict(model.graph.opset_imports))
            except Exception:  # a node that cannot be inferred leaves the shape unknown
                return None
    shape = model.get_tensor_shape(v.name) if v.name else None
    if shape is None or any(d is None for d in shape):
        return None
    return tuple(int(d) for d in shape)


def new_value(model: "Model", prefix: str, shape: Sequence[int] | None, datatype: BaseDataType | str | None,
              layout: Sequence[str] | None = None) -> ir.Value:
    """A new float32 value (to be a node output) with shape and ``finn_datatype``/``tensor_layout`` annotations."""
    v = model.make_value(prefix, shape=shape)
    annotate(v, datatype, layout)
    return v


def copy_annotations(model: "Model", src: ir.Value, dst: ir.Value, *, layout: bool = False) -> None:
    """Give ``dst`` the ``finn_datatype`` of ``src`` (and its ``tensor_layout`` if ``layout``)."""
    ann = src.meta.get(_QA_KEY) or {}
    keys = (_DT_KEY, _LAYOUT_KEY) if layout else (_DT_KEY,)
    if any(k in ann for k in keys):
        new = dict(dst.meta.get(_QA_KEY) or {})
        new.update({k: ann[k] for k in keys if k in ann})
        dst.meta[_QA_KEY] = new


# -- datatypes ------------------------------------------------------------------------------------------------------
def annotated_or_values(model: "Model", v: ir.Value, values: np.ndarray | None = None) -> BaseDataType:
    """The ``finn_datatype`` of ``v`` if annotated, else the narrowest datatype of its constant ``values``."""
    if v.name and model.has_tensor_datatype(v.name):
        return model.get_tensor_datatype(v.name)
    if values is None:
        values = const_array(v)
    return datatype_of_values(values) if values is not None else DataType["FLOAT32"]


def fitting_datatype(dt: BaseDataType, values: np.ndarray) -> BaseDataType:
    """``dt`` if it allows every one of ``values``, else the narrowest datatype that does (widened honestly)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return dt
    if is_integer_type(dt) and _all_allowed(dt, arr):
        return dt
    if not is_integer_type(dt) and not np.array_equal(arr, np.round(arr)):
        return dt
    return datatype_of_values(arr)


def _all_allowed(dt: BaseDataType, arr: np.ndarray) -> bool:
    """Vectorized ``all(dt.allowed(x) for x in arr)`` for an integer datatype: finite integers within its range
    (and no 0 for BIPOLAR)."""
    lo, hi = float(arr.min()), float(arr.max())
    if not (dt.min() <= lo and hi <= dt.max()) or not all_integral(arr):
        return False
    return dt.name != "BIPOLAR" or all_blocks(arr, lambda b: b.all())


def union_datatype(dt: BaseDataType, lo: float, hi: float) -> BaseDataType:
    """The narrowest integer datatype holding both ``dt``'s range and ``[lo, hi]`` (FLOAT32 for a float ``dt``)."""
    if not is_integer_type(dt):
        return DataType["FLOAT32"]
    if dt.name != "BIPOLAR" and dt.min() <= lo and hi <= dt.max():
        return dt
    return smallest_int_type(min(lo, dt.min()), max(hi, dt.max()))


# -- annotations FINN reads besides datatype and layout -------------------------------------------------------------
def set_tensor_sparsity(v: ir.Value, sparsity: dict[str, Any]) -> None:
    """Annotate ``v`` with qonnx's ``tensor_sparsity`` (FINN's mark of a depthwise convolution's weight matrix)."""
    ann = dict(v.meta.get(_QA_KEY) or {})
    ann[_SPARSITY_KEY] = str(sparsity)
    v.meta[_QA_KEY] = ann


def get_tensor_sparsity(v: ir.Value) -> dict[str, Any] | None:
    """The ``tensor_sparsity`` annotation of ``v``, or None."""
    ann = v.meta.get(_QA_KEY) or {}
    text = ann.get(_SPARSITY_KEY)
    return ast.literal_eval(text) if text else None
