"""Shared pieces of the convert stage: reading quantizer parameters, channel axes, and small graph edits.

Nothing here decides a rewrite; the passes in :mod:`streamline.convert_weights`, :mod:`streamline.convert_acts`
and :mod:`streamline.convert_trunc` do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import onnx_ir as ir

from custom_ops.registry import is_custom_domain, make_op
from finnlite.core.datatypes import BaseDataType, DataType
from finnlite.core.errors import FinnliteError
from finnlite.core.graphutil import add_constant, annotate, take_over
from finnlite.core.shapes import const_array

if TYPE_CHECKING:
    from finnlite.core.model import Model

QUANT_OPS = ("Quant", "IntQuant")
#: the default limit on quantizer bit widths converted to thresholds (2^b - 1 thresholds per channel): a 16-bit
#: output quantizer (MelGAN's audio) is one row of 65535 thresholds, still a small tensor
DEFAULT_MAX_THRESHOLD_BITS = 16
#: the limit on all the thresholds of one quantizer (channels × steps): 2^20 float32 values, 4 MB
MAX_THRESHOLDS = 1 << 20


class Unsupported(Exception):
    """A condition of a conversion failed; the message is the reason recorded with ``Rule.miss``."""


class BitLimit(Unsupported):
    """A quantizer is wider than the configured ``max_threshold_bits`` (logged as a warning as well)."""


def check_threshold_count(bits: int, channels: int, max_bits: int, what: str = "quantizer") -> None:
    """:class:`BitLimit` if a ``bits``-bit quantizer over ``channels`` channels needs more than
    :data:`MAX_THRESHOLDS` thresholds (a wide per-channel quantizer)."""
    n = channels * (2 ** bits - 1)
    if n > MAX_THRESHOLDS:
        raise BitLimit(f"{bits}-bit {what} with {channels} channels needs {n} thresholds, over the limit of "
                       f"{MAX_THRESHOLDS} (2^20; max_threshold_bits={max_bits})")


def is_custom(node: ir.Node, *op_types: str) -> bool:
    """True if ``node`` is one of ``op_types`` in a QONNX/FINN custom-op domain."""
    return node.op_type in op_types and is_custom_domain(node.domain)


def custom_op(node: ir.Node) -> Any:
    """The validated custom-op instance of ``node`` (its attributes parsed); :class:`Unsupported` if invalid."""
    try:
        return make_op(node)
    except FinnliteError as exc:
        raise Unsupported(f"invalid node: {exc.message}") from None


def const_input(node: ir.Node, index: int, what: str, *, float32: bool = True) -> np.ndarray:
    """The constant value of input ``index`` of ``node``; :class:`Unsupported` if absent or not a constant, or (with
    ``float32``) not stored as float32 (the kernels would then compute in another precision than the graph's
    Mul/Add nodes)."""
    v = node.inputs[index] if index < len(node.inputs) else None
    arr = const_array(v)
    if arr is None:
        raise Unsupported(f"the {what} is not a constant")
    if float32 and arr.dtype != np.float32:
        raise Unsupported(f"the {what} is stored as {arr.dtype}, not float32")
    if not np.all(np.isfinite(arr)):
        raise Unsupported(f"the {what} is not finite")
    return arr


def positive_scale(arr: np.ndarray, what: str = "scale") -> np.ndarray:
    """``arr`` if it is non-empty and > 0 everywhere; :class:`Unsupported` otherwise."""
    if arr.size == 0 or not np.all(arr > 0):
        raise Unsupported(f"the {what} is not strictly positive")
    return arr


def scalar_int(arr: np.ndarray, what: str) -> int:
    """A single integer-valued element as an int; :class:`Unsupported` otherwise."""
    if arr.size != 1 or float(arr.reshape(-1)[0]) != int(arr.reshape(-1)[0]):
        raise Unsupported(f"the {what} is not a single integer")
    return int(arr.reshape(-1)[0])


# -- channel axes ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Channels:
    """How parameters broadcast against a tensor of rank ``rank``: constant along every axis but ``axis`` (None:
    per tensor), with ``count`` distinct positions along it."""

    axis: int | None
    count: int
    rank: int | None

    def column(self, param: np.ndarray) -> np.ndarray:
        """``param`` as a (count, 1) array: its value for each position along the axis (dtype kept)."""
        param = np.asarray(param)
        if self.axis is None:
            return np.broadcast_to(param.reshape(-1)[:1], (1,)).reshape(1, 1).copy()
        assert self.rank is not None
        full = param.reshape((1,) * (self.rank - param.ndim) + param.shape)
        along = np.moveaxis(full, self.axis, 0).reshape(full.shape[self.axis], -1)[:, :1]
        return np.broadcast_to(along, (self.count, 1)).copy()

    def shaped(self, per_channel: np.ndarray) -> np.ndarray:
        """A (count,) or (count, 1) array of per-channel values reshaped to broadcast along the axis of a tensor of
        rank ``rank`` (a 0-d array when per tensor)."""
        flat = np.asarray(per_channel).reshape(-1)
        if self.axis is None:
            return flat[:1].reshape(())
        assert self.rank is not None
        shape = [1] * self.rank
        shape[self.axis] = flat.size
        return flat.reshape(shape)


def channels_of(params: Sequence[np.ndarray], rank: int | None) -> Channels:
    """The single axis along which ``params`` vary when broadcast against a tensor of rank ``rank``;
    :class:`Unsupported` if they vary along several axes, have more dimensions than the tensor, or need an
    unknown rank."""
    if all(np.asarray(p).size == 1 for p in params):
        return Channels(None, 1, rank)
    if rank is None:
        raise Unsupported("per-channel parameters on a tensor of unknown rank")
    axes: dict[int, int] = {}
    for p in params:
        p = np.asarray(p)
        if p.ndim > rank:
            raise Unsupported(f"a parameter of shape {p.shape} has more dimensions than the tensor (rank {rank})")
        for i, d in enumerate(p.shape):
            if d != 1:
                axis = rank - p.ndim + i
                if axes.setdefault(axis, d) != d:
                    raise Unsupported("parameters of different sizes along one axis")
    if len(axes) > 1:
        raise Unsupported(f"parameters vary along several axes {sorted(axes)}; a MultiThreshold has one channel axis")
    (axis, count), = axes.items()
    return Channels(axis, count, rank)


def layout_for(axis: int, rank: int) -> str:
    """A ``data_layout`` string of length ``rank`` with the channel letter C at ``axis`` (NCHW, NHWC, NC, NCW, NWC
    for the usual cases)."""
    known = {(2, 1): "NC", (3, 1): "NCW", (3, 2): "NWC", (4, 1): "NCHW", (4, 3): "NHWC", (5, 1): "NCDHW",
             (5, 4): "NDHWC"}
    if (rank, axis) in known:
        return known[(rank, axis)]
    letters = [ch for ch in "NDHWABEFGIJKLMOPQRSTUVXYZ"][: rank - 1]
    letters.insert(axis, "C")
    return "".join(letters)


# -- graph edits ------------------------------------------------------------------------------------------------
def append_binary(model: "Model", value: ir.Value, op_type: str, const: np.ndarray, *, name: str,
                  datatype: BaseDataType | str = "FLOAT32") -> tuple[ir.Node, ir.Value]:
    """Insert ``op_type(value, const)`` right after the producer of ``value`` and make every former consumer of
    ``value`` read its result, which takes over ``value``'s name. Returns the node and its output."""
    c = add_constant(model, np.asarray(const, dtype=np.float32), prefix=f"{name}_param", datatype="FLOAT32")
    out = model.make_value_like(value, prefix=f"{name}_out")
    take_over(model, value, out, old_suffix=f"before_{op_type.lower()}")
    node = ir.Node("", op_type, [value, c], outputs=[out], name=name)
    producer = value.producer()
    if producer is not None:
        model.graph.insert_after(producer, node)
    else:
        model.graph.insert_before(next(iter(model.graph)), node)
    annotate(out, datatype)
    return node, out


def drop_unused(model: "Model", values: Sequence[ir.Value | None]) -> None:
    """Remove those of ``values`` that are initializers nothing reads any more (and not graph outputs), and the
    producers of the others if they became dead, so that a rewrite does not leave the float originals behind."""
    for v in values:
        if v is None or v.uses() or v.is_graph_output():
            continue
        if v.is_initializer():
            model.drop_if_unused(v)
            continue
        p = v.producer()
        if p is not None and p.graph is model.graph and not any(o.uses() or o.is_graph_output() for o in p.outputs):
            inputs = list(p.inputs)
            model.remove_node(p)
            drop_unused(model, inputs)


FLOAT32 = DataType["FLOAT32"]
